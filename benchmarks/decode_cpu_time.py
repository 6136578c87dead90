"""Decoding cost in CPU time on one thread: gpt2lib against transformers, for a shared machine.

    python benchmarks/decode_cpu_time.py                 # about 4 minutes on a quiet core
    python benchmarks/decode_cpu_time.py --quick         # a smoke run
    python benchmarks/decode_cpu_time.py --profile       # and torch.profiler's table per library

compare_transformers.py times wall-clock seconds on 2 threads, which is the target of issue 22
but means little while other work shares the cores: a thread that waits for the CPU counts as
busy, and a two-thread multiply stalls whenever one of its threads is descheduled. Here
everything runs on one thread and is timed with that thread's CPU time
(time.thread_time), which leaves out the time the thread was not running. What stays is the
work itself (and the memory it waits for, which other work can still slow down).

It reports, interleaving the two libraries (and which goes first) on the same weights:
- CPU ms per new token at batch 1 and 8 with GPT-2 small's shapes, and their ratio;
- the step's multiplies alone (every weight once, back to back, as in compare_transformers)
  in CPU ms, and which fraction of a step each library spends beyond them;
- the same decode on a narrow model with GPT-2 small's layout (12 layers, 12 heads, 1,000
  tokens, width 96): its multiplies are tiny, so its time per token is the per-step overhead
  of Python, dispatch and the small operations, the part a module swap can still cut;
- the prefill of a long prompt.
Both libraries must produce the same greedy tokens first. A JSON record goes to --json.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

import torch

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "benchmarks"))
sys.path.insert(0, str(REPO / "tests"))

from compare_transformers import (  # noqa: E402
    hf_loop,
    hf_prefill,
    load_average,
    machine_record,
    multiplies_only_seconds,
    ours_generate,
    ours_prefill,
)

from gpt2lib import GPT2, GPT2Config  # noqa: E402


def paired_models(n_embd, vocab_size, seed=0):
    """gpt2lib's GPT2 and transformers' GPT2LMHeadModel with the same weights, in eval mode."""
    from transformers import GPT2Config as HFConfig
    from transformers import GPT2LMHeadModel
    from transformers.utils import logging as hf_logging

    hf_logging.set_verbosity_error()
    sizes = dict(n_layer=12, n_head=12, n_embd=n_embd, vocab_size=vocab_size, n_positions=1024)
    torch.manual_seed(seed)
    ours = GPT2(GPT2Config(**sizes)).eval()
    hf = GPT2LMHeadModel(HFConfig(**sizes, bos_token_id=0, eos_token_id=0)).eval()
    state = {f"transformer.{name}": tensor for name, tensor in ours.state_dict().items()}
    state["lm_head.weight"] = ours.wte.weight
    missing, unexpected = hf.load_state_dict(state, strict=False)
    assert not unexpected and all(".attn.bias" in m or "masked_bias" in m for m in missing), (
        missing,
        unexpected,
    )
    hf.tie_weights()
    return ours, hf


def cpu_seconds(fn):
    began = time.thread_time()
    fn()
    return time.thread_time() - began


def paired_cpu_times(fn_ours, fn_hf, repeats):
    """CPU seconds of each, alternating which one goes first, after one untimed call of each."""
    fn_ours(), fn_hf()
    ours, hf = [], []
    for i in range(repeats):
        pair = [(fn_ours, ours), (fn_hf, hf)]
        for fn, times in pair if i % 2 == 0 else pair[::-1]:
            times.append(cpu_seconds(fn))
    return ours, hf


def summary(seconds, per):
    """Milliseconds per unit of work: median, min and max over the repeats."""
    ms = [s / per * 1e3 for s in seconds]
    return {"median": statistics.median(ms), "min": min(ms), "max": max(ms)}


def parse_args(argv=None):
    p = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument("--repeats", type=int, default=7)
    p.add_argument("--prompt-len", type=int, default=32)
    p.add_argument("--new-tokens", type=int, default=48)
    p.add_argument("--prefill-len", type=int, default=1024)
    p.add_argument("--quick", action="store_true", help="2 repeats, 8 new tokens, prefill of 64")
    p.add_argument(
        "--profile",
        action="store_true",
        help="print torch.profiler's table of one batch-1 decode per library",
    )
    p.add_argument("--json", type=Path, help="where to write the record")
    args = p.parse_args(argv)
    if args.quick:
        args.repeats, args.new_tokens, args.prefill_len = 2, 8, 64
    return args


def main(argv=None) -> int:
    args = parse_args(argv)
    torch.set_num_threads(1)  # thread_time counts this thread only: no worker threads
    args.threads, args.device, args.dtype = 1, "cpu", "float32"
    record = {
        "machine": machine_record(args),
        "clock": "time.thread_time, one thread",
        "results": {},
    }
    results = record["results"]
    gen = torch.Generator().manual_seed(1)
    n = args.new_tokens
    for label, n_embd, vocab in (
        ("GPT-2 small shapes", 768, 50257),
        ("narrow model (per-step overhead)", 96, 1000),
    ):
        ours, hf = paired_models(n_embd, vocab)
        print(f"{label}: 12 layers, 12 heads, width {n_embd}, {vocab} tokens")
        for batch in (1, 8):
            prompt = torch.randint(0, vocab, (batch, args.prompt_len), generator=gen)
            same = torch.equal(ours_generate(ours, prompt, n), hf_loop(hf, prompt, n))
            if not same:
                print("  greedy tokens differ from transformers: refusing to time")
                return 1
            t_ours, t_hf = paired_cpu_times(
                lambda: ours_generate(ours, prompt, n), lambda: hf_loop(hf, prompt, n), args.repeats
            )
            entry = {
                "unit": "CPU ms per new token (each row's)",
                "gpt2lib": summary(t_ours, n),
                "transformers": summary(t_hf, n),
            }
            entry["ratio"] = entry["transformers"]["median"] / entry["gpt2lib"]["median"]
            if n_embd == 768 and batch == 1:
                multiplies = multiplies_only_seconds(ours, clock=time.thread_time) * 1e3
                entry["multiplies_only_ms"] = multiplies
                entry["fraction_of_ceiling"] = {
                    k: multiplies / entry[k]["median"] for k in ("gpt2lib", "transformers")
                }
            results[f"{label}, decode batch {batch}"] = entry
            line = (
                f"  decode, batch {batch}: gpt2lib {entry['gpt2lib']['median']:.2f} "
                f"({entry['gpt2lib']['min']:.2f}-{entry['gpt2lib']['max']:.2f}), "
                f"transformers {entry['transformers']['median']:.2f} "
                f"({entry['transformers']['min']:.2f}-{entry['transformers']['max']:.2f}) "
                f"CPU ms/step: {entry['ratio']:.2f}x"
            )
            if "multiplies_only_ms" in entry:
                line += (
                    f"; the multiplies alone {entry['multiplies_only_ms']:.2f} ms: gpt2lib "
                    f"at {entry['fraction_of_ceiling']['gpt2lib']:.0%} of that ceiling, "
                    f"transformers at {entry['fraction_of_ceiling']['transformers']:.0%}"
                )
            print(line)
        if n_embd == 768 and args.prefill_len:
            long_prompt = torch.randint(0, vocab, (1, args.prefill_len), generator=gen)
            t_ours, t_hf = paired_cpu_times(
                lambda: ours_prefill(ours, long_prompt),
                lambda: hf_prefill(hf, long_prompt),
                max(2, args.repeats // 2),
            )
            entry = {
                "unit": "CPU ms per prompt token",
                "gpt2lib": summary(t_ours, args.prefill_len),
                "transformers": summary(t_hf, args.prefill_len),
            }
            entry["ratio"] = entry["transformers"]["median"] / entry["gpt2lib"]["median"]
            results[f"{label}, prefill {args.prefill_len}"] = entry
            print(
                f"  prefill of {args.prefill_len}: gpt2lib {entry['gpt2lib']['median']:.3f}, "
                f"transformers {entry['transformers']['median']:.3f} CPU ms/token: "
                f"{entry['ratio']:.2f}x"
            )
        if args.profile:
            profile_one_decode(
                ours, hf, torch.randint(0, vocab, (1, args.prompt_len), generator=gen), n
            )
    record["machine"]["load_average_at_end"] = load_average()
    print(
        f"load average (1, 5, 15 min) at the start {record['machine']['load_average_at_start']}, "
        f"at the end {record['machine']['load_average_at_end']}"
    )
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(record, indent=2), encoding="utf-8")
        print(f"record written to {args.json}")
    return 0


def profile_one_decode(ours, hf, prompt, n):
    from torch.profiler import ProfilerActivity, profile

    for name, fn in (
        ("gpt2lib", lambda: ours_generate(ours, prompt, n)),
        ("transformers", lambda: hf_loop(hf, prompt, n)),
    ):
        fn()
        with profile(activities=[ProfilerActivity.CPU]) as prof:
            fn()
        events = prof.key_averages()
        print(
            f"{name}: {sum(e.count for e in events) / n:.0f} aten calls per step "
            "(nested calls counted too)"
        )
        print(events.table(sort_by="self_cpu_time_total", row_limit=15))


if __name__ == "__main__":
    sys.exit(main())
