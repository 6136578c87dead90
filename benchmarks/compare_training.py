"""Training speed: gpt2lib's GPT2 against transformers' GPT2LMHeadModel, in one process.

    python benchmarks/compare_training.py                # chapter 7's CPU setting, float32
    python benchmarks/compare_training.py --quick        # a tiny model, a few steps (CI smoke)
    python benchmarks/compare_training.py --device cuda --dtype bfloat16 --batch-size 32
    python benchmarks/compare_training.py --autocast bfloat16   # float32 weights, bf16 matmuls

Both models get the same config, the same weights (ours copied into theirs), the same batches
of Tiny Shakespeare and the same optimizer (AdamW, weight decay on 2-D weights only, gradient
clipping at 1.0). Before timing, one step of each from the same start must give the same
loss. A timed step is forward + loss + backward + clip + optimizer step; the two models take
turns in short rounds, so that a noisy shared machine slows both alike. The script reports
tokens/s (median of the rounds, with min..max), the ratio gpt2lib / transformers of the
medians and of the fastest rounds (on a shared machine, the least disturbed), and the
achieved GFLOP/s against this machine's matrix-multiply peak, which it measures first.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import platform
import statistics
import sys
import time
from pathlib import Path

import torch
import torch.nn.functional as F

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from gpt2lib.chapters.config import GPT2Config
from gpt2lib.chapters.model import GPT2
from gpt2lib.chapters.training import make_optimizer
from gpt2lib.training import get_batch

CHAPTER_SETTING = {"n_layer": 4, "n_embd": 128, "n_head": 4, "n_positions": 128}
QUICK_SETTING = {"n_layer": 2, "n_embd": 64, "n_head": 4, "n_positions": 32}


def sync(device):
    if device.type == "cuda":
        torch.cuda.synchronize()
    elif device.type == "mps":
        torch.mps.synchronize()


def matmul_peak_gflops(device, dtype, size, seconds):
    """Best GFLOP/s of square matrix multiplies of `size` on this device: the machine's peak."""
    a = torch.randn(size, size, device=device, dtype=dtype)
    b = torch.randn(size, size, device=device, dtype=dtype)
    for _ in range(3):
        a @ b
    sync(device)
    best, deadline = 0.0, time.perf_counter() + seconds
    while time.perf_counter() < deadline:
        start = time.perf_counter()
        for _ in range(4):
            a @ b
        sync(device)
        best = max(best, 4 * 2 * size**3 / (time.perf_counter() - start) / 1e9)
    return best


def train_flops_per_step(config, batch_size, block_size):
    """Multiply-add FLOPs of one training step (forward x 3 for forward + backward).

    Per token: 2 * 12 * n_embd^2 per block (q, k, v, attention output, the MLP's two layers),
    2 * 2 * T * n_embd per block for attention scores and their weighted sum (the full T x T,
    as scaled_dot_product_attention computes it), and 2 * n_embd * vocab for the readout.
    """
    C, L, V, T = config.n_embd, config.n_layer, config.vocab_size, block_size
    per_token = L * (2 * 12 * C * C + 2 * 2 * T * C) + 2 * C * V
    return 3 * per_token * batch_size * T


def hf_copy(model, device, dtype):
    """transformers' GPT2LMHeadModel with the same config and weights as our model."""
    from transformers import GPT2Config as HFConfig
    from transformers import GPT2LMHeadModel

    c = model.config
    hf = GPT2LMHeadModel(
        HFConfig(
            n_layer=c.n_layer,
            n_head=c.n_head,
            n_embd=c.n_embd,
            n_positions=c.n_positions,
            vocab_size=c.vocab_size,
            embd_pdrop=c.embd_pdrop,
            attn_pdrop=c.attn_pdrop,
            resid_pdrop=c.resid_pdrop,
            layer_norm_epsilon=c.layer_norm_epsilon,
            activation_function="gelu_new",
        )
    )
    state = {"transformer." + k: v for k, v in model.state_dict().items()}  # same [in, out] layout
    missing, unexpected = hf.load_state_dict(state, strict=False)
    missing = [
        k
        for k in missing
        if not k.endswith((".attn.bias", ".attn.masked_bias")) and k != "lm_head.weight"
    ]
    if missing or unexpected:
        raise RuntimeError(
            f"weights do not map onto transformers' model: missing {missing}, "
            f"unexpected {unexpected}"
        )
    hf.tie_weights()
    return hf.to(device=device, dtype=dtype)


def ours_logits(model, x):
    return model(x)


def hf_logits(model, x):
    return model(x).logits


AUTOCAST = None  # torch.autocast's dtype for the forward pass (--autocast), or None


def step(model, logits_fn, optimizer, x, y):
    optimizer.zero_grad(set_to_none=True)
    context = (
        torch.autocast(x.device.type, dtype=AUTOCAST)
        if AUTOCAST is not None
        else contextlib.nullcontext()
    )
    with context:  # as gpt2lib.scaling's training loop runs it
        logits = logits_fn(model, x)  # (B, T, V)
    loss = F.cross_entropy(logits.flatten(0, 1).float(), y.flatten())
    loss.backward()
    torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
    optimizer.step()
    return loss.detach()


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="tiny model, few steps: a smoke test")
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--dtype", default="float32", choices=["float32", "bfloat16"])
    parser.add_argument(
        "--autocast",
        default=None,
        choices=["bfloat16"],
        help="run both forwards under torch.autocast (mixed precision), "
        "weights and optimizer in --dtype",
    )
    parser.add_argument("--batch-size", type=int, default=None)
    parser.add_argument("--block-size", type=int, default=None)
    parser.add_argument("--steps", type=int, default=None, help="timed steps per round")
    parser.add_argument("--rounds", type=int, default=None)
    parser.add_argument("--threads", type=int, default=None, help="torch CPU threads")
    parser.add_argument("--json", type=Path, default=None, help="write the result here")
    args = parser.parse_args(argv)
    global AUTOCAST
    AUTOCAST = torch.bfloat16 if args.autocast else None

    if args.threads:
        torch.set_num_threads(args.threads)
    device = torch.device(args.device)
    dtype = {"float32": torch.float32, "bfloat16": torch.bfloat16}[args.dtype]
    sizes = QUICK_SETTING if args.quick else CHAPTER_SETTING
    config = GPT2Config(**sizes, embd_pdrop=0.0, attn_pdrop=0.0, resid_pdrop=0.0)
    batch_size = args.batch_size or (4 if args.quick else 8)
    block_size = args.block_size or config.n_positions
    steps = args.steps or (2 if args.quick else 5)
    rounds = args.rounds or (2 if args.quick else 5)

    from gpt2lib.tokenizer import get_encoding

    text = (REPO / "data" / "tinyshakespeare.txt").read_text(encoding="utf-8")
    if args.quick:
        text = text[:50_000]
    ids = torch.tensor(get_encoding().encode_ordinary(text))

    peak = matmul_peak_gflops(
        device, AUTOCAST or dtype, 512 if args.quick else 2048, 0.5 if args.quick else 3.0
    )

    torch.manual_seed(0)
    ours = GPT2(config).to(device=device, dtype=dtype).train()
    theirs = hf_copy(ours, device, dtype).train()
    opt_ours = make_optimizer(ours, 1e-3, 0.1)
    opt_theirs = make_optimizer(theirs, 1e-3, 0.1)

    # the same first step from the same weights must give the same loss
    x, y = get_batch(ids, batch_size, block_size, torch.Generator().manual_seed(0), device)
    loss_ours = float(step(ours, ours_logits, opt_ours, x, y))
    loss_theirs = float(step(theirs, hf_logits, opt_theirs, x, y))
    tolerance = 1e-4 if dtype == torch.float32 and AUTOCAST is None else 2e-2
    same_losses = abs(loss_ours - loss_theirs) <= tolerance * max(1.0, abs(loss_ours))
    if not same_losses:
        raise SystemExit(
            f"the two models disagree before timing: loss {loss_ours:.6f} vs "
            f"{loss_theirs:.6f}; the comparison would not be fair"
        )

    gen = torch.Generator().manual_seed(1)
    batches = [get_batch(ids, batch_size, block_size, gen, device) for _ in range(steps)]
    contenders = {
        "gpt2lib": (ours, ours_logits, opt_ours),
        "transformers": (theirs, hf_logits, opt_theirs),
    }
    for model, fn, opt in contenders.values():  # warm-up: allocator, kernels
        step(model, fn, opt, *batches[0])
    times = {name: [] for name in contenders}
    for r in range(rounds):
        order = list(contenders) if r % 2 == 0 else list(reversed(contenders))
        for name in order:
            model, fn, opt = contenders[name]
            sync(device)
            start = time.perf_counter()
            for xb, yb in batches:
                step(model, fn, opt, xb, yb)
            sync(device)
            times[name].append((time.perf_counter() - start) / steps)

    flops = train_flops_per_step(config, batch_size, block_size)
    tokens = batch_size * block_size
    result = {
        "setting": {
            **sizes,
            "vocab_size": config.vocab_size,
            "batch_size": batch_size,
            "block_size": block_size,
            "dtype": args.dtype,
            "autocast": args.autocast,
            "device": str(device),
            "threads": torch.get_num_threads(),
            "steps_per_round": steps,
            "rounds": rounds,
        },
        "machine": platform.processor() or platform.machine(),
        "torch": torch.__version__,
        "matmul_peak_gflops": round(peak, 1),
        "flops_per_step": flops,
        "first_step_loss": {"gpt2lib": round(loss_ours, 6), "transformers": round(loss_theirs, 6)},
        "same_losses": same_losses,
    }
    for name, seconds in times.items():
        median = statistics.median(seconds)
        result[name] = {
            "seconds_per_step": round(median, 5),
            "tokens_per_s": round(tokens / median, 1),
            "tokens_per_s_range": [
                round(tokens / max(seconds), 1),
                round(tokens / min(seconds), 1),
            ],
            "gflops": round(flops / median / 1e9, 2),
            "fraction_of_peak": round(flops / median / 1e9 / peak, 3),
        }
    ratio = result["gpt2lib"]["tokens_per_s"] / result["transformers"]["tokens_per_s"]
    result["ratio_gpt2lib_over_transformers"] = round(ratio, 3)
    # on a shared machine the fastest round is the one least slowed by other work
    best_ratio = max(times["transformers"]) and min(times["transformers"]) / min(times["gpt2lib"])
    result["ratio_of_fastest_rounds"] = round(best_ratio, 3)

    s = result["setting"]
    print(
        f"training step (forward + backward + clip + AdamW), {s['n_layer']} layers, width "
        f"{s['n_embd']}, batch {batch_size} x {block_size}, {args.dtype}"
        f"{' under ' + args.autocast + ' autocast' if args.autocast else ''} on {device} "
        f"({s['threads']} threads)"
    )
    print(f"first-step loss: gpt2lib {loss_ours:.6f}, transformers {loss_theirs:.6f}")
    print(f"matrix-multiply peak of this machine: {peak:.1f} GFLOP/s")
    for name in contenders:
        r = result[name]
        print(
            f"{name:13} {r['tokens_per_s']:10.1f} tokens/s  (range {r['tokens_per_s_range'][0]:.1f}"
            f"..{r['tokens_per_s_range'][1]:.1f})  {r['gflops']:8.2f} GFLOP/s  "
            f"{100 * r['fraction_of_peak']:5.1f}% of peak"
        )
    print(f"gpt2lib / transformers: {ratio:.2f}x (medians), {best_ratio:.2f}x (fastest rounds)")
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(result, indent=2) + "\n", encoding="utf-8")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
