"""gpt2lib against Hugging Face transformers, side by side, in one process.

    python benchmarks/compare_transformers.py                  # CPU, float32, 2 threads
    python benchmarks/compare_transformers.py --quick          # fewer repeats, shorter runs
    python benchmarks/compare_transformers.py --checkpoint DIR # real weights instead of random
    python benchmarks/compare_transformers.py --device cuda --dtype bfloat16 --compile

Both models get the same weights (GPT-2 small shapes, random unless --checkpoint). Before any
timing the script checks that greedy generations are identical. Each measurement alternates
the two implementations (and which one goes first) so that drift on a noisy machine hits
both; it reports medians with the spread (min..max) and the ratio gpt2lib / transformers.
On a CPU it also measures how fast memory can be streamed here (the best of a 512 MB sum and
of one row times a 400 MB matrix) and prints the speed limit that puts on batch-1 decoding:
bytes/s / weight bytes per token, and the best ratio to transformers that limit allows.
A JSON record goes to benchmarks/results/ (or --json).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import torch

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "benchmarks"))
sys.path.insert(0, str(REPO / "tests"))  # checkpoints.py writes the hub's exact layout

from checkpoints import write_hub_checkpoint  # noqa: E402

from gpt2lib import GPT2  # noqa: E402
from gpt2lib.generation import generate  # noqa: E402
from gpt2lib.model import from_pretrained  # noqa: E402
from gpt2lib.speed.kernels import measured_routes, use_split_matmul  # noqa: E402
from gpt2lib.speed.measure import decode_bytes_per_token, memory_read_gbps, wall_times  # noqa: E402

# --------------------------------------------------------------------------- set-up


def load_hf(folder: Path, device: str, dtype: torch.dtype):
    from transformers import GPT2LMHeadModel
    from transformers.utils import logging as hf_logging

    hf_logging.set_verbosity_error()  # the hub file's mask buffers are reported as unused
    model = GPT2LMHeadModel.from_pretrained(str(folder), dtype=dtype).to(device).eval()
    model.generation_config.pad_token_id = model.config.eos_token_id
    return model


# --------------------------------------------------------------------------- the workloads


@torch.inference_mode()
def ours_generate(model, prompt, new_tokens, use_cache=True):
    return generate(model, prompt, new_tokens, temperature=0.0, use_cache=use_cache)


@torch.inference_mode()
def hf_loop(model, prompt, new_tokens, use_cache=True):
    """transformers' model called step by step with its own cache: a plain greedy loop."""
    ids = prompt
    out = model(ids, use_cache=use_cache, logits_to_keep=1)
    tokens = [prompt]
    for step in range(new_tokens):
        next_id = out.logits[:, -1, :].argmax(dim=-1, keepdim=True)  # (B, 1)
        tokens.append(next_id)
        if step == new_tokens - 1:
            break
        if use_cache:
            out = model(next_id, cache=out.cache, use_cache=True, logits_to_keep=1)
        else:
            ids = torch.cat(tokens, dim=1)
            out = model(ids, use_cache=False, logits_to_keep=1)
    return torch.cat(tokens, dim=1)


@torch.inference_mode()
def hf_generate(model, prompt, new_tokens, use_cache=True):
    """transformers' own generate(): the loop most users call."""
    return model.generate(
        prompt,
        attention_mask=torch.ones_like(prompt),
        max_new_tokens=new_tokens,
        min_new_tokens=new_tokens,
        do_sample=False,
        use_cache=use_cache,
    )


def ours_generate_unsplit(model, prompt, new_tokens):
    """gpt2lib with the split multiply of chapter 9 turned off: what that lever is worth."""
    with use_split_matmul(False):
        return ours_generate(model, prompt, new_tokens)


@torch.inference_mode()
def ours_prefill(model, prompt):
    """The prompt as generate() runs it: the model's forward into a new cache, then argmax.

    (generate() itself refuses a 1,024-token prompt plus a new token: that is 1,025 positions.)
    """
    from gpt2lib.kvcache import KVCache

    cache = KVCache.for_model(model, prompt.shape[0], prompt.shape[1])
    return model(prompt, kv_cache=cache, last_only=True)[:, -1].argmax(-1)


@torch.inference_mode()
def hf_prefill(model, prompt):
    """The same for transformers: one forward with a new cache, then the argmax."""
    return model(prompt, use_cache=True, logits_to_keep=1).logits[:, -1].argmax(-1)


def cpu_name() -> str:
    """The CPU's model name where Linux tells it (platform.processor() is often empty)."""
    try:
        for line in open("/proc/cpuinfo", encoding="utf-8"):
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def sync(device: str) -> None:
    if device == "cuda":
        torch.cuda.synchronize()
    elif device == "mps":
        torch.mps.synchronize()


def timed_pair(fn_ours, fn_hf, repeats: int, device: str) -> tuple[list[float], list[float]]:
    """Seconds per call for both, alternating which goes first each round; one warm-up each."""
    fn_ours(), fn_hf()
    sync(device)
    ours, hf = [], []
    for r in range(repeats):
        order = [(fn_ours, ours), (fn_hf, hf)]
        for fn, sink in order if r % 2 == 0 else reversed(order):
            sync(device)
            start = time.perf_counter()
            fn()
            sync(device)
            sink.append(time.perf_counter() - start)
    return ours, hf


LOAD_SNIPPET = r"""
import sys, time, json, torch
torch.set_num_threads({threads})
which, folder = sys.argv[1], sys.argv[2]
if which == "gpt2lib":
    from gpt2lib import GPT2
    from gpt2lib.model import from_pretrained
    load = lambda path: from_pretrained(path, device="cpu", model_cls=GPT2)
else:
    from transformers import GPT2LMHeadModel
    from transformers.utils import logging
    logging.set_verbosity_error()
    load = GPT2LMHeadModel.from_pretrained
ids = torch.randint(0, 50257, (1, 8))


def status_kib(field):
    for line in open("/proc/self/status"):
        if line.startswith(field + ":"):
            return int(line.split()[1])


try:  # Linux: reset the peak (VmHWM) so that it counts the loader alone
    open("/proc/self/clear_refs", "w").write("5")
    base = status_kib("VmRSS")
except OSError:  # elsewhere: no memory figure
    base = None
start = time.perf_counter()
model = load(folder).eval()
loaded = time.perf_counter() - start
with torch.inference_mode():  # a forward pass touches every weight (lazy, memory-mapped reads too)
    model(ids)
first_forward = time.perf_counter() - start
peak = status_kib("VmHWM") if base is not None else None
print(json.dumps({{"seconds": first_forward, "load_only_seconds": loaded,
                   "added_mib": None if base is None else (peak - base) / 1024}}))
"""


def measure_loading(folder: Path, repeats: int, threads: int) -> dict:
    """Each load in a fresh process, so peak memory is that loader's alone."""
    snippet = LOAD_SNIPPET.format(threads=threads)
    runs = {"gpt2lib": [], "transformers": []}
    for r in range(repeats):
        order = ["gpt2lib", "transformers"] if r % 2 == 0 else ["transformers", "gpt2lib"]
        for which in order:
            out = subprocess.run(
                [sys.executable, "-c", snippet, which, str(folder)],
                capture_output=True,
                text=True,
                check=True,
                cwd=REPO,
            )
            runs[which].append(json.loads(out.stdout.strip().splitlines()[-1]))
    return runs


# --------------------------------------------------------------------------- report


def summary(seconds: list[float], work: float) -> dict:
    """Median and spread as units of work per second (tokens/s, or 1/s for loading)."""
    rates = sorted(work / s for s in seconds)
    return {
        "median": statistics.median(rates),
        "min": rates[0],
        "max": rates[-1],
        "median_seconds": statistics.median(seconds),
        "runs": len(seconds),
    }


def parse_args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument("--checkpoint", type=Path, help="folder with config.json + model.safetensors")
    p.add_argument("--device", default="cpu")
    p.add_argument("--dtype", default="float32", choices=["float32", "bfloat16", "float16"])
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--repeats", type=int, default=5)
    p.add_argument("--prompt-len", type=int, default=32)
    p.add_argument("--new-tokens", type=int, default=128)
    p.add_argument(
        "--uncached-new-tokens",
        type=int,
        default=32,
        help="new tokens for the no-cache baseline (it is slow: quadratic)",
    )
    p.add_argument("--prefill-len", type=int, default=1024)
    p.add_argument(
        "--compile",
        action="store_true",
        help="gpt2lib's captured CUDA graph for the decode step (GPU)",
    )
    p.add_argument("--quick", action="store_true", help="3 repeats, 32 new tokens: a smoke run")
    p.add_argument("--skip-loading", action="store_true")
    p.add_argument("--skip-tokenizer", action="store_true")
    p.add_argument("--json", type=Path, help="where to write the record")
    args = p.parse_args(argv)
    if args.quick:
        args.repeats, args.new_tokens, args.uncached_new_tokens = 3, 32, 16
    return args


def machine_record(args) -> dict:
    import transformers

    return {
        "platform": platform.platform(),
        "processor": cpu_name(),
        "cpu_count": os.cpu_count(),
        "threads": torch.get_num_threads(),
        "torch": torch.__version__,
        "transformers": transformers.__version__,
        "device": args.device,
        "device_name": torch.cuda.get_device_name(0) if args.device == "cuda" else args.device,
        "dtype": args.dtype,
        "load_average_at_start": load_average(),  # the machine may be shared: how busy it was
    }


def load_average():
    """The 1, 5 and 15 minute load averages (None where the OS does not tell)."""
    try:
        return list(os.getloadavg())
    except (AttributeError, OSError):
        return None


class Bench:
    """The two models, the settings, and what was measured so far (record and table rows)."""

    def __init__(self, args, ours, hf, record):
        self.args, self.ours, self.hf, self.record = args, ours, hf, record
        self.rows = []
        self.gen = torch.Generator().manual_seed(1)
        self.compile = args.compile

    def prompt(self, batch, length=None):
        length = length or self.args.prompt_len
        ids = torch.randint(0, self.ours.config.vocab_size, (batch, length), generator=self.gen)
        return ids.to(self.args.device)

    def generate(self, prompt, n, use_cache=True):
        if self.compile and use_cache:
            with torch.inference_mode():
                return generate(self.ours, prompt, n, temperature=0.0, compile=True)
        return ours_generate(self.ours, prompt, n, use_cache)

    def compare(self, name, fn_ours, fn_hf, work, unit):
        t_ours, t_hf = timed_pair(fn_ours, fn_hf, self.args.repeats, self.args.device)
        s_ours, s_hf = summary(t_ours, work), summary(t_hf, work)
        ratio = s_ours["median"] / s_hf["median"]
        self.record["results"][name] = {
            "unit": unit,
            "gpt2lib": s_ours,
            "transformers": s_hf,
            "ratio": ratio,
        }
        self.rows.append((name, unit, s_ours, s_hf, ratio))
        print(f"  {name}: {s_ours['median']:.1f} vs {s_hf['median']:.1f} {unit} ({ratio:.2f}x)")


def check_identical(bench) -> bool:
    """Greedy generations of both libraries must agree before anything is timed."""
    for batch in (1, 8):
        prompt = bench.prompt(batch)
        a = bench.generate(prompt, bench.args.new_tokens)
        b = hf_loop(bench.hf, prompt, bench.args.new_tokens)
        c = hf_generate(bench.hf, prompt, bench.args.new_tokens)
        same = torch.equal(a.cpu(), b.cpu()) and torch.equal(a.cpu(), c.cpu())
        bench.record["results"][f"greedy_identical_batch{batch}"] = same
        print(f"greedy output identical to transformers, batch {batch}: {same}")
        if not same:
            where = (a.cpu() != c.cpu()).nonzero()
            print(f"  first difference at (row, position) {tuple(where[0].tolist())}")
            print("  refusing to time implementations that disagree")
            return False
    return True


def time_decoding(bench) -> None:
    n = bench.args.new_tokens
    for batch in (1, 8):
        prompt = bench.prompt(batch)
        bench.compare(
            f"decode, KV cache, batch {batch}",
            lambda: bench.generate(prompt, n),
            lambda: hf_loop(bench.hf, prompt, n),
            batch * n,
            "tokens/s",
        )
        if batch == 1:
            bench.compare(
                "decode, KV cache, batch 1 (vs transformers generate())",
                lambda: bench.generate(prompt, n),
                lambda: hf_generate(bench.hf, prompt, n),
                batch * n,
                "tokens/s",
            )
            if bench.args.device == "cpu":
                bench.compare(
                    "decode, KV cache, batch 1, gpt2lib without split matmul",
                    lambda: ours_generate_unsplit(bench.ours, prompt, n),
                    lambda: hf_loop(bench.hf, prompt, n),
                    batch * n,
                    "tokens/s",
                )
    prompt = bench.prompt(1)
    n = bench.args.uncached_new_tokens
    bench.compare(
        "decode, no cache, batch 1",
        lambda: bench.generate(prompt, n, use_cache=False),
        lambda: hf_loop(bench.hf, prompt, n, use_cache=False),
        n,
        "tokens/s",
    )


def best_read_gbps(megabytes: int = 512, repeats: int = 7) -> dict:
    """The fastest this process streams memory, in GB/s, measured two ways (best of `repeats`).

    `sum` of a float32 buffer, and one row times a (n_in, n_out) float32 matrix with torch.mm,
    the multiply that batch-1 decoding does; both far larger than the caches. The best of the
    two is what a decode step could at most reach, so it bounds the tokens/s.
    """
    gen = torch.Generator().manual_seed(0)
    buffer = torch.ones(megabytes * 10**6 // 4)
    n_in = 3072
    matrix = torch.randn(n_in, megabytes * 10**6 // 4 // n_in, generator=gen)  # (3072, n_out)
    row = torch.randn(1, n_in, generator=gen)

    def best(fn, nbytes):
        return nbytes / min(wall_times(fn, repeats)) / 1e9

    found = {
        "sum": best(buffer.sum, buffer.nbytes),
        "one_row_mm": best(lambda: torch.mm(row, matrix), matrix.nbytes),
    }
    found["best"] = max(found.values())
    return found


@torch.inference_mode()
def multiplies_only_seconds(model, repeats: int = 7, clock=time.perf_counter) -> float:
    """Seconds for the multiplies of one batch-1 decode step alone, back to back (best of `repeats`).

    One row times each layer's four weight matrices, then the token table: every weight byte a
    step must read, in the order a step reads it, through torch's own multiply, and nothing
    else (no attention, layer norm, Python). No decoder built on these multiplies can take
    less time per token. (It may come out faster than the memory-speed figure where part of
    the weights still sits in a large last-level cache from the step before.)
    """
    C = model.config.n_embd
    matrices = [
        m.weight
        for block in model.h
        for m in (block.attn.c_attn, block.attn.c_proj, block.mlp.c_fc, block.mlp.c_proj)
    ]
    rows = {w.shape[0]: torch.ones(1, w.shape[0], dtype=w.dtype, device=w.device) for w in matrices}
    table = model.wte.weight
    column = torch.ones(C, 1, dtype=table.dtype, device=table.device)

    def step():
        for w in matrices:
            torch.mm(rows[w.shape[0]], w)
        torch.mm(table, column)

    return min(wall_times(step, repeats, clock=clock))


def report_bandwidth(bench) -> None:
    """Batch-1 decoding reads every weight once per token: how close each comes to memory speed."""
    per_token = decode_bytes_per_token(bench.ours)
    decode1 = bench.record["results"]["decode, KV cache, batch 1"]
    achieved = {k: decode1[k]["median"] * per_token / 1e9 for k in ("gpt2lib", "transformers")}
    decode1["weights_gb_per_s"] = achieved
    decode1["weight_bytes_per_token"] = per_token
    line = (
        f"  batch 1 reads the weights at {achieved['gpt2lib']:.1f} GB/s (gpt2lib) and "
        f"{achieved['transformers']:.1f} GB/s (transformers)"
    )
    if bench.args.device == "cpu":
        bandwidth = memory_read_gbps()
        bench.record["machine"]["memory_read_gb_per_s"] = bandwidth
        line += (
            f"; this machine reads {bandwidth:.1f} GB/s ({per_token / 1e6:.0f} MB per "
            f"token: at most {bandwidth * 1e9 / per_token:.0f} tokens/s)"
        )
        streamed = best_read_gbps()
        bench.record["machine"]["best_read_gb_per_s"] = streamed
        stream_limit = streamed["best"] * 1e9 / per_token  # tokens/s at that memory speed
        multiplies = multiplies_only_seconds(bench.ours)
        limit = max(stream_limit, 1 / multiplies)  # the looser of the two: a true upper bound
        hf_rate = decode1["transformers"]["median"]
        decode1["ceiling"] = {
            "gb_per_s": streamed["best"],
            "stream_tokens_per_s": stream_limit,
            "multiplies_only_seconds": multiplies,
            "multiplies_only_tokens_per_s": 1 / multiplies,
            "multiplies_only_gb_per_s": per_token / multiplies / 1e9,
            "tokens_per_s": limit,
            "best_ratio_to_transformers": limit / hf_rate,
            "fraction_reached_by_gpt2lib": decode1["gpt2lib"]["median"] / limit,
            # a small model's weights fit in the caches: then neither figure bounds anything
            "is_a_bound": limit >= max(decode1[k]["max"] for k in ("gpt2lib", "transformers")),
        }
        line += (
            f"\n  ceiling: the fastest stream measured here is {streamed['best']:.1f} GB/s "
            f"(sum {streamed['sum']:.1f}, one-row torch.mm {streamed['one_row_mm']:.1f}): "
            f"{stream_limit:.1f} tokens/s; the step's multiplies alone take "
            f"{multiplies * 1e3:.1f} ms ({per_token / multiplies / 1e9:.1f} GB/s): "
            f"{1 / multiplies:.1f} tokens/s, {hf_rate * multiplies:.2f}x transformers' "
            f"{hf_rate:.1f}. So batch 1 can reach at most "
            f"{limit:.1f} tokens/s, {limit / hf_rate:.2f}x this transformers run; gpt2lib "
            f"reaches {decode1['ceiling']['fraction_reached_by_gpt2lib']:.0%} of it"
        )
        if not decode1["ceiling"]["is_a_bound"]:
            line += " (not a bound here: a run went faster, the weights fit in the CPU's caches)"
    print(line)


def time_prefill(bench) -> None:
    long_prompt = bench.prompt(1, bench.args.prefill_len)
    bench.compare(
        f"prefill, {bench.args.prefill_len} tokens",
        lambda: ours_prefill(bench.ours, long_prompt),
        lambda: hf_prefill(bench.hf, long_prompt),
        bench.args.prefill_len,
        "tokens/s",
    )


def time_loading(bench, folder: Path) -> None:
    runs = measure_loading(folder, max(3, bench.args.repeats // 2), bench.args.threads)
    s_ours = summary([r["seconds"] for r in runs["gpt2lib"]], 1.0)
    s_hf = summary([r["seconds"] for r in runs["transformers"]], 1.0)
    peak = {k: statistics.median(r["added_mib"] or 0.0 for r in v) for k, v in runs.items()}
    ratio = s_ours["median"] / s_hf["median"]
    load_only = {k: statistics.median(r["load_only_seconds"] for r in v) for k, v in runs.items()}
    bench.record["results"]["loading"] = {
        "unit": "loads/s",
        "gpt2lib": s_ours,
        "transformers": s_hf,
        "ratio": ratio,
        "peak_added_mib": peak,
        "load_only_seconds": load_only,
    }
    bench.rows.append(("load 124M safetensors + first forward", "loads/s", s_ours, s_hf, ratio))
    print(
        f"  loading + first forward: {s_ours['median_seconds']:.2f} s vs "
        f"{s_hf['median_seconds']:.2f} s (from_pretrained alone {load_only['gpt2lib']:.2f} s vs "
        f"{load_only['transformers']:.2f} s); peak added memory {peak['gpt2lib']:.0f} MiB vs "
        f"{peak['transformers']:.0f} MiB"
    )


def time_tokenizer(bench) -> None:
    import tokenizer_speed

    tok = tokenizer_speed.measure(tokenizer_speed.english_text(), repeats=3)
    bench.record["results"]["tokenizer"] = tok
    for label, key in (("cold", "bpe_cold_mb_s"), ("warm", "bpe_warm_mb_s")):
        ours = {"median": tok[key], "min": tok[key], "max": tok[key]}
        theirs = {
            "median": tok["tiktoken_mb_s"],
            "min": tok["tiktoken_mb_s"],
            "max": tok["tiktoken_mb_s"],
        }
        bench.rows.append(
            (
                f"tokenizer: teaching BPE ({label} cache) vs tiktoken",
                "MB/s",
                ours,
                theirs,
                tok[key] / tok["tiktoken_mb_s"],
            )
        )


def print_table(record, rows, args) -> None:
    print()
    if "memory_read_gb_per_s" in record["machine"]:
        print(
            f"memory read speed (sum of 256 MB): {record['machine']['memory_read_gb_per_s']:.1f} GB/s"
        )
    print(
        f"{record['machine']['processor']}, {record['machine']['threads']} threads, "
        f"torch {record['machine']['torch']}, transformers {record['machine']['transformers']}, "
        f"{args.device} {args.dtype}, weights: {record['weights']}"
    )
    print(f"| {'measure':<56} | {'unit':<8} | {'gpt2lib':>18} | {'transformers':>18} | ratio |")
    print(f"|{'-' * 58}|{'-' * 10}|{'-' * 20}|{'-' * 20}|-------|")
    for name, unit, a, b, ratio in rows:
        if unit == "loads/s":
            fa, fb, unit = f"{1 / a['median']:.2f} s", f"{1 / b['median']:.2f} s", "time"
        else:
            fa = f"{a['median']:.1f} ({a['min']:.1f}-{a['max']:.1f})"
            fb = f"{b['median']:.1f} ({b['min']:.1f}-{b['max']:.1f})"
        print(f"| {name:<56} | {unit:<8} | {fa:>18} | {fb:>18} | {ratio:4.2f}x |")
    ceiling = record["results"].get("decode, KV cache, batch 1", {}).get("ceiling")
    if ceiling and ceiling["is_a_bound"]:
        hf_rate = ceiling["tokens_per_s"] / ceiling["best_ratio_to_transformers"]
        for name, rate in (
            (
                "decode batch 1 ceiling: memory stream / bytes per token",
                ceiling["stream_tokens_per_s"],
            ),
            (
                "decode batch 1 ceiling: the multiplies alone (torch.mm)",
                ceiling["multiplies_only_tokens_per_s"],
            ),
        ):
            print(
                f"| {name:<56} | {'tokens/s':<8} | {rate:>18.1f} | {'':>18} | "
                f"{rate / hf_rate:4.2f}x |"
            )
        print(
            f"(ceiling rows: the fastest memory stream measured here ({ceiling['gb_per_s']:.1f} "
            f"GB/s) over the weight bytes per token, and one step's multiplies alone, back to "
            f"back ({ceiling['multiplies_only_seconds'] * 1e3:.1f} ms); each ratio is against "
            f"this run's transformers batch-1 rate: the most a decoder could show)"
        )


def main(argv=None) -> int:
    args = parse_args(argv)
    if args.device == "cpu":
        torch.set_num_threads(args.threads)
    dtype = getattr(torch, args.dtype)
    torch.manual_seed(0)
    record = {"machine": machine_record(args), "results": {}}
    with tempfile.TemporaryDirectory() as tmp:
        folder = args.checkpoint
        if folder is None:
            folder = Path(tmp)
            write_hub_checkpoint(folder, n_layer=12, n_head=12, n_embd=768, seed=0)
            record["weights"] = "random (seed 0), GPT-2 small shapes"
        else:
            record["weights"] = str(folder)
        ours = from_pretrained(str(folder), device=args.device, dtype=dtype, model_cls=GPT2)
        bench = Bench(args, ours, load_hf(folder, args.device, dtype), record)
        if args.device == "cpu" and torch.get_num_threads() > 1:
            measured_routes()  # tune first (kept on disk): generate then takes the splits that pay
        if not check_identical(bench):
            return 1
        print("timing (gpt2lib vs transformers, medians):")
        time_decoding(bench)
        report_bandwidth(bench)
        time_prefill(bench)
        if not args.skip_loading and args.device == "cpu":
            time_loading(bench, folder)
    if not args.skip_tokenizer:
        time_tokenizer(bench)
    record["machine"]["load_average_at_end"] = load_average()
    if args.device == "cpu" and torch.get_num_threads() > 1:  # the routes generate chose here
        record["machine"]["split_routes"] = measured_routes()
        print(f"split routes measured here: {record['machine']['split_routes']}")
    print_table(record, bench.rows, args)
    print(
        f"load average (1, 5, 15 min) at the start {record['machine']['load_average_at_start']}, "
        f"at the end {record['machine']['load_average_at_end']}"
    )
    out = args.json or REPO / "benchmarks" / "results" / time.strftime("compare-%Y%m%d-%H%M%S.json")
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(record, indent=2), encoding="utf-8")
    print(f"\nrecord written to {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
