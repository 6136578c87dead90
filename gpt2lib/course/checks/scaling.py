"""Checks for chapter 11 (scaling up): DDP's gradients, accumulation, ranks' windows, bfloat16,
FLOPs, a run's cost and the recipe's price, a run's throughput and MFU, the token budget."""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
import tempfile
from pathlib import Path

import torch
import torch.nn.functional as F

from gpt2lib.course.checks import _core as core

EX_SHARDS = "Exercise 11.1 (the gradient DDP gives every rank)"
EX_ACCUM = "Exercise 11.2 (fix the accumulation)"
EX_SPLIT = "Exercise 11.3 (which windows each rank reads)"
EX_BF16 = "Exercise 11.4 (round to bfloat16 by hand)"
EX_FLOPS = "Exercise 11.5 (FLOPs per token)"
EX_COST = "Exercise 11.6 (price the recipe)"
EX_SPEED = "Exercise 11.7 (the throughput and MFU of a run)"
CHALLENGE = "Challenge 11 (the most from a token budget)"


def tiny_model(seed=0, n_layer=2, n_embd=16, n_head=2, vocab_size=41, n_positions=8):
    sizes = dict(n_layer=n_layer, n_embd=n_embd, n_head=n_head, vocab_size=vocab_size)
    return core.tiny_gpt2(seed, n_positions=n_positions, **sizes)


def _batch(seed, batch, block, vocab=41):
    g = torch.Generator().manual_seed(seed)
    x = torch.randint(vocab, (batch, block), generator=g)
    return x, torch.randint(vocab, (batch, block), generator=g)


def _grads(model):
    return {n: p.grad.clone() for n, p in model.named_parameters()}


def full_batch_gradients(model, x, y):
    """name -> gradient of the mean loss over the whole batch (the answer DDP must match)."""
    model.zero_grad(set_to_none=True)
    F.cross_entropy(model(x).flatten(0, 1), y.flatten()).backward()
    grads = _grads(model)
    model.zero_grad(set_to_none=True)
    return grads


def _near(got, want, rel=1e-6):
    return all(math.isclose(a, b, rel_tol=rel) for a, b in zip(got, want))


def _hint(hints, got):
    """What a known wrong value shows: hints[value] for the first value `got` is close to, or ""."""
    return next((h for v, h in hints.items() if math.isclose(got, v, rel_tol=1e-6)), "")


def _two(exercise, got, what):
    """The learner's two numbers as a tuple; raises naming `what` unless it is a pair."""
    if not (isinstance(got, (tuple, list)) and len(got) == 2):
        raise core.CheckFailed(exercise, f"return two numbers: {what}")
    return tuple(got)


def _shard_grads(model, x, y, world, *, mistake=""):
    """The shards' gradients averaged, or with the planted mistake `mistake` (SHARD_MISTAKES)."""
    first_only = mistake == "first_shard_only"
    shards = list(zip(x.chunk(world), y.chunk(world)))[: 1 if first_only else world]
    grads = [full_batch_gradients(model, xs, ys) for xs, ys in shards]
    return {n: sum(g[n] for g in grads) / (1 if mistake else world) for n in grads[0]}


SHARD_MISTAKES = core.variants(
    _shard_grads,
    {
        "summed": "your gradients are `world` times too large: DDP averages the ranks' gradients (all-reduce, then divide by the world size), it does not add them",
        "first_shard_only": "your gradients are those of the first shard alone: every rank's shard must count",
    },
)


def _same_grads(got, want):
    if not isinstance(got, dict) or set(got) != set(want):
        return False
    return all(core.close(got[n], want[n], atol=1e-6, rtol=1e-4) for n in want)


def _expect_grads(exercise, got, want, mistakes, wrong_grads, otherwise, where):
    """Unless got's gradients are want's, raise naming the first mistake m whose
    wrong_grads(m) they are (else `otherwise`), and the case (`where`)."""
    if not _same_grads(got, want):
        mistake = core.first_mistake(mistakes, lambda m: _same_grads(got, wrong_grads(m)))
        raise core.CheckFailed(exercise, f"{mistake.message if mistake else otherwise} ({where})")


def check_shard_gradients(fn):
    """`fn(model, x, y, world)` -> {name: gradient}, the average of the `world` shards'."""
    for seed, batch, world in ((0, 8, 2), (1, 6, 3), (2, 4, 4)):
        model = tiny_model(seed)
        x, y = _batch(seed, batch, 8)
        want = full_batch_gradients(model, x, y)
        got = core.call_learner(EX_SHARDS, fn, model, x, y, world)
        if not isinstance(got, dict):
            raise core.CheckFailed(
                EX_SHARDS, f"return a dict name -> gradient tensor, got {type(got).__name__}"
            )
        where = f"batch {batch}, world {world}"
        planted = (SHARD_MISTAKES, lambda m: m.fn(model, x, y, world))
        otherwise = "your averaged gradients differ from the full batch's"
        _expect_grads(EX_SHARDS, got, want, *planted, otherwise, where)
    core.passed(EX_SHARDS, "the average of the shards' gradients is the full batch's gradient")


def _accumulate(model, x, y, micro_steps, *, mistake=""):
    """Accumulated gradients, right, or with the planted mistake `mistake` (ACCUM_MISTAKES)."""
    if mistake not in ("zeroed_each_micro_step", "zero_grad_deleted"):
        model.zero_grad(set_to_none=True)
    for xs, ys in zip(x.chunk(micro_steps), y.chunk(micro_steps)):
        if mistake == "zeroed_each_micro_step":
            model.zero_grad(set_to_none=True)
        loss = F.cross_entropy(model(xs).flatten(0, 1), ys.flatten())
        (loss if mistake == "not_divided" else loss / micro_steps).backward()
    return _grads(model)


def _model_with_stale_grads(seed):
    """tiny_model(seed) whose .grad still holds a gradient from an earlier step."""
    model = tiny_model(seed)
    for name, grad in full_batch_gradients(model, *_batch(seed + 50, 2, 8)).items():
        model.get_parameter(name).grad = grad
    return model


ACCUM_MISTAKES = core.variants(
    _accumulate,
    {
        "not_divided": "your gradients are micro_steps times too large: divide each micro-batch's loss by micro_steps before backward",
        "zeroed_each_micro_step": "only the last micro-batch's gradient is left: the gradients are cleared inside the loop, so the earlier micro-steps are lost",
        "zero_grad_deleted": "your .grad still holds the previous step's gradient added to this one: the zero_grad was deleted, not moved. Clear the gradients once, before the micro-steps",
    },
)


def check_accumulate_gradients(fn):
    """`fn(model, x, y, micro_steps)` leaves in .grad the gradient of the whole batch's loss."""
    for seed, batch, micro in ((0, 8, 2), (3, 6, 3), (4, 4, 1)):
        model = _model_with_stale_grads(seed)
        x, y = _batch(seed, batch, 8)
        want = full_batch_gradients(tiny_model(seed), x, y)
        core.call_learner(EX_ACCUM, fn, model, x, y, micro)
        got = {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}
        where = f"batch {batch}, {micro} micro-steps"
        planted = (ACCUM_MISTAKES, lambda m: m.fn(_model_with_stale_grads(seed), x, y, micro))
        otherwise = "the accumulated .grad differs from the gradient of the whole batch"
        _expect_grads(EX_ACCUM, got, want, *planted, otherwise, where)
    core.passed(EX_ACCUM, ".grad after the micro-steps equals one backward on the whole batch")


def check_micro_batches(fn):
    """`fn(rows, rank, world, batch_size, micro_steps)` -> micro_steps tensors of batch_size rows."""
    for world, batch, micro in ((2, 4, 1), (1, 4, 2), (2, 2, 3), (4, 1, 2)):
        rows = torch.arange(100, 100 + world * batch * micro)  # stand-ins for window starts
        seen = []
        for rank in range(world):
            got = core.call_learner(EX_SPLIT, fn, rows, rank, world, batch, micro)
            if not isinstance(got, (list, tuple)) or len(got) != micro:
                length = len(got) if hasattr(got, "__len__") else "?"
                raise core.CheckFailed(
                    EX_SPLIT,
                    f"return a list of micro_steps={micro} tensors, got {type(got).__name__} of length {length}",
                )
            for k, part in enumerate(got):
                if not isinstance(part, torch.Tensor) or part.shape != (batch,):
                    raise core.CheckFailed(
                        EX_SPLIT,
                        f"world {world}, rank {rank}, micro-step {k}: expected batch_size={batch} rows, got {getattr(part, 'shape', type(part).__name__)}",
                    )
                seen += part.tolist()
        if sorted(seen) != rows.tolist():
            twice = sorted({r for r in seen if seen.count(r) > 1})
            detail = (
                f"rows {twice[:4]} are read more than once" if twice else "some rows are never read"
            )
            raise core.CheckFailed(
                EX_SPLIT,
                f"world {world}, batch {batch}, {micro} micro-steps: {detail}; every row of the step must be read once, by exactly one rank",
            )
    core.passed(EX_SPLIT, "every row read once, equal shares, for four ways of splitting")


BF16_MISTAKES = [
    core.Mistake(
        "uses_to_bfloat16",
        "your function lets PyTorch round (.to(torch.bfloat16), .bfloat16() or .type): this exercise asks for the rounding done by hand, with integer operations on the bits",
        lambda x: x.to(torch.bfloat16).float(),
    ),
]


class _NoBfloat16(torch.overrides.TorchFunctionMode):
    """While active, a conversion to bfloat16 raises with BF16_MISTAKES' message."""

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        to_bf16 = func is torch.Tensor.bfloat16 or (
            func in (torch.Tensor.to, torch.Tensor.type)
            and torch.bfloat16 in (*args[1:], *kwargs.values())
        )
        if to_bf16:
            raise core.CheckFailed(EX_BF16, BF16_MISTAKES[0].message)
        return func(*args, **kwargs)


def check_to_bfloat16(fn):
    """`fn(x)` (float32) -> a new float32 tensor of x's shape: x rounded to bfloat16 by hand."""
    g = torch.Generator().manual_seed(0)
    cases = [
        torch.randn(1000, generator=g) * 10.0 ** torch.randint(-6, 6, (1000,), generator=g),
        torch.tensor(
            [1.0, -2.5, 1 + 2**-8, 1 + 3 * 2**-8, 1 + 2**-7 + 2**-9, 65504.0, 3.0e38, -1e-30, 0.0]
        ),
    ]
    for x in cases:
        before = x.clone()
        with _NoBfloat16():
            got = core.call_learner(EX_BF16, fn, x)
        if not torch.equal(x, before):
            raise core.CheckFailed(
                EX_BF16, "your function changed its input in place; return a new tensor"
            )
        if not isinstance(got, torch.Tensor) or got.dtype != torch.float32 or got.shape != x.shape:
            raise core.CheckFailed(
                EX_BF16,
                "return a float32 tensor of the input's shape (the bfloat16 value, stored in float32)",
            )
        want = x.to(torch.bfloat16).float()
        if torch.equal(got, want):
            continue
        if torch.equal(got, ((x.view(torch.int32) >> 16) << 16).view(torch.float32)):
            raise core.CheckFailed(
                EX_BF16,
                "you cut the low 16 bits off: that rounds toward zero. Round to the nearest (ties to even): add 0x7FFF plus the lowest kept bit before cutting",
            )
        bad = int((got != want).nonzero()[0])
        raise core.CheckFailed(
            EX_BF16,
            f"x = {float(x[bad])!r}: you give {float(got[bad])!r}, bfloat16 is {float(want[bad])!r}",
        )
    core.passed(EX_BF16, "the same values as x.to(torch.bfloat16)")


def _format_error(values, dtype, *, mistake=""):
    """format_error, right, or with the planted mistake `mistake` (a name in FORMAT_MISTAKES)."""
    kept = values.to(dtype).float()
    held = kept.isfinite() & (kept != 0)
    error = (kept - values).abs() if mistake == "absolute" else ((kept - values) / values).abs()
    error = error.max() if mistake == "out of range kept" else error[held].max()
    share = held.float().sum() if mistake == "count not share" else held.float().mean()
    return float(error), float(share)


FORMAT_MISTAKES = core.variants(
    _format_error,
    {
        "out of range kept": "a value the format cannot hold came back as inf (or as 0, an error of 100%) and took the maximum: take the maximum over the values the format holds only (finite and not 0)",
        "absolute": "your error is absolute, |kept - value|, which large values dominate: divide by |value| for the relative error",
        "count not share": "the second number is a count: return the share of the values held, between 0 and 1",
    },
)


def check_format_error(fn):
    """`format_error(values, dtype)` -> (largest relative error where held, share held)."""
    for values in (torch.logspace(-9, 9, 3001), -torch.logspace(-3, 6, 500)):
        for dtype in (torch.bfloat16, torch.float16):
            got = core.call_learner(EX_BF16, fn, values.clone(), dtype)
            got = _two(EX_BF16, got, "the largest relative error and the share of values held")
            got = tuple(float(g) for g in got)
            want = _format_error(values, dtype)
            if _near(got, want, 1e-4):
                continue
            core.fail_with(
                EX_BF16,
                FORMAT_MISTAKES,
                lambda m, v=values, d=dtype: _near(got, m.fn(v, d), 1e-4),
                f"for {dtype} you give {got[0]:.3e} and {got[1]:.4f}, the format's largest relative error and share held are {want[0]:.3e} and {want[1]:.4f}",
            )
    core.passed(EX_BF16, "relative error over the values each format holds, and the share it holds")


def cli(*args, processes=1):
    """Run `python -m gpt2lib ARGS` (under torchrun when processes > 1) and return its output."""
    launcher = [sys.executable]
    if processes > 1:
        launcher += ["-m", "torch.distributed.run", "--standalone", f"--nproc_per_node={processes}"]
    done = subprocess.run(
        [*launcher, "-m", "gpt2lib", *map(str, args)],
        capture_output=True,
        text=True,
        env={**os.environ, "OMP_NUM_THREADS": "1"},
    )
    if done.returncode != 0:
        raise RuntimeError(done.stderr[-2000:])
    return done.stdout


def reference_flops_per_token(config, block_size):
    V, C, L = config.vocab_size, config.n_embd, config.n_layer
    params = V * C + L * (12 * C * C + 13 * C) + 2 * C  # no position table, readout tied
    return params, 6 * params + 12 * L * block_size * C


def check_flops_per_token(fn):
    """`fn(config, block_size)` -> (multiplying parameters, training FLOPs per token)."""
    from gpt2lib.chapters.config import GPT2Config
    from gpt2lib.chapters.model import count_gpt2_parameters

    for sizes in (
        dict(n_layer=2, n_embd=16, n_head=2, vocab_size=41, n_positions=8),
        dict(n_layer=3, n_embd=48, n_head=4, vocab_size=97, n_positions=32),
        dict(n_layer=12, n_embd=768, n_head=12),
    ):
        config = GPT2Config(**sizes)
        block = config.n_positions // 2
        got = core.call_learner(EX_FLOPS, fn, config, block)
        want_params, want_flops = reference_flops_per_token(config, block)
        params, flops = _two(EX_FLOPS, got, "(parameters, FLOPs per token)")
        attention = 4 * config.n_layer * block * config.n_embd  # forward, per token
        readout = config.vocab_size * config.n_embd  # the slip of counting it apart from wte
        with_wpe, apart = count_gpt2_parameters(config), want_params + readout
        forward, no_attention = 2 * want_params + attention, 6 * want_params
        param_hints = {
            with_wpe: ": you counted the position table, which is a lookup, no multiply",
            apart: ": you counted the readout apart from wte, but it is the same matrix",
        }
        flop_hints = {
            no_attention: ": attention's scores and weighted sum are missing",
            forward: ": that is the forward pass only; backward computes two gradients, each as costly as the forward",
            no_attention + attention: ": attention's FLOPs need the backward pass too",
        }
        if params != want_params:
            raise core.CheckFailed(
                EX_FLOPS,
                f"{sizes}: you count {params:,} parameters, the multiplying ones are {want_params:,}{_hint(param_hints, params)}",
            )
        if not math.isclose(flops, want_flops, rel_tol=1e-9):
            raise core.CheckFailed(
                EX_FLOPS,
                f"{sizes}: FLOPs per token {flops:,} should be {want_flops:,}{_hint(flop_hints, flops)}",
            )
    core.passed(
        EX_FLOPS,
        "about 6 FLOPs per parameter per token (2 forward, 4 backward) plus attention's 12 · n_layer · block_size · n_embd, for three sizes",
    )


def reference_run_cost(flops, gpus, peak_flops, mfu, dollars_per_gpu_hour):
    hours = flops / (gpus * peak_flops * mfu) / 3600
    return hours, hours * gpus * dollars_per_gpu_hour


def check_run_cost(fn):
    """`fn(flops, gpus, peak_flops, mfu, dollars_per_gpu_hour)` -> (hours, dollars)."""
    for case in (
        (1e18, 8, 989e12, 0.4, 2.5),
        (3e20, 1, 312e12, 0.5, 1.2),
        (5e21, 64, 989e12, 0.3, 2.0),
    ):
        got = core.call_learner(EX_COST, fn, *case)
        want = reference_run_cost(*case)
        hours, dollars = _two(EX_COST, got, "(hours, dollars)")
        one_gpu, in_turn = want[1] / case[1], want[0] * case[1]  # known wrong dollars and hours
        pay_hints = {one_gpu: ": you pay for one GPU, but all of them are rented for those hours"}
        hour_hints = {in_turn: ": the GPUs work in parallel: divide the work by their number"}
        if not _near(got, want):
            hint = _hint(pay_hints, dollars) or _hint(hour_hints, hours)
            raise core.CheckFailed(
                EX_COST,
                f"for {case}: you give {got}, expected ({want[0]:.4g} h, ${want[1]:.4g}){hint}",
            )
    core.passed(EX_COST, "hours and dollars for three runs")


def check_recipe_price(
    steps,
    total_flops,
    hours,
    dollars,
    tokens=10e9,
    global_tokens=524_288,
    gpus=8,
    peak_flops=989e12,
    mfu=0.4,
    dollars_per_gpu_hour=2.5,
):
    """Exercise 11.7: the recipe's steps, FLOPs, hours and dollars against the reference."""
    from gpt2lib.chapters.config import GPT2Config

    _, per_token = reference_flops_per_token(GPT2Config(), 1024)
    want_steps, want_total = tokens / global_tokens, per_token * tokens
    want_hours, want_dollars = reference_run_cost(
        want_total, gpus, peak_flops, mfu, dollars_per_gpu_hour
    )
    given = {"steps": steps, "total FLOPs": total_flops, "hours": hours, "dollars": dollars}
    for name, got in given.items():
        if not isinstance(got, (int, float)) or isinstance(got, bool) or not math.isfinite(got):
            raise core.CheckFailed(EX_COST, f"{name} should be a number, not {got!r}")
    whole = float(steps).is_integer() and abs(steps - want_steps) < 1  # rounded either way
    hints = {
        (
            "steps",
            tokens / 512,
        ): ": a step takes 512 windows of 1,024 tokens, so divide the tokens by the tokens of a step, not by the windows",
        (
            "total FLOPs",
            per_token * want_steps,
        ): ": that is FLOPs per token times steps; every token of every step costs them",
        (
            "hours",
            want_hours * mfu,
        ): ": the GPUs reach only the MFU share of their peak: divide by it",
        ("hours", want_hours * gpus): ": the work is shared by all the GPUs of the node",
        ("dollars", want_dollars / gpus): ": every GPU of the node is paid for those hours",
    }
    for name, want, message in (
        ("steps", steps if whole else want_steps, "{:,.1f} steps, expected {:,.1f}"),
        ("total FLOPs", want_total, "total {:.3e} FLOPs, expected {:.3e}"),
        ("hours", want_hours, "{:.3g} hours, expected {:.3g}"),
        ("dollars", want_dollars, "${:,.2f}, expected ${:,.2f}"),
    ):
        if not math.isclose(given[name], want, rel_tol=1e-6):
            hint = _hint({v: h for (n, v), h in hints.items() if n == name}, given[name])
            raise core.CheckFailed(EX_COST, message.format(given[name], want) + hint)
    core.passed(
        EX_COST,
        f"{want_steps:,.0f} steps, {want_total:.2e} FLOPs, {want_hours:.2f} hours, ${want_dollars:,.0f}",
    )


def _read_run(folder):
    folder = Path(folder)
    run = json.loads((folder / "run.json").read_text(encoding="utf-8"))
    log = (folder / "log.jsonl").read_text(encoding="utf-8").splitlines()
    return run, [json.loads(line) for line in log if line.strip()]


def _run_speed(folder, *, mistake=""):
    """run_speed, right, or with the planted mistake `mistake` (a name in SPEED_MISTAKES)."""
    run, lines = _read_run(folder)
    steps = lines if mistake == "first step kept" else lines[1:]
    if mistake == "mean of rates":
        tokens_per_s = sum(line["tokens_per_s"] for line in steps) / len(steps)
    else:  # the run's tokens over its seconds
        seconds = sum(run["tokens_per_step"] / line["tokens_per_s"] for line in steps)
        tokens_per_s = run["tokens_per_step"] * len(steps) / seconds
    peak = run["peak_flops_per_device"] * (1 if mistake == "one device" else run["world_size"])
    return tokens_per_s, tokens_per_s * run["flops_per_token"] / peak


SPEED_MISTAKES = core.variants(
    _run_speed,
    {
        "first step kept": "your throughput counts the first step, which also pays for start-up (allocating memory, setting up the processes' communication, compiling): leave it out",
        "mean of rates": "you averaged the steps' tokens per second, but a step twice as long counts no more in that mean than a short one: the run's rate is all its tokens over all its seconds (each step's seconds are its tokens over its rate)",
        "one device": "your MFU compares the FLOPs of every process with the peak of one device: the run had world_size devices, and the peak is theirs together",
    },
)

# (world_size, tokens per step, FLOPs per token, one device's peak, each step's seconds)
_SPEED_RUNS = (
    (1, 256, 1.5e6, 2e10, (4.0, 0.5, 0.25, 1.0)),
    (2, 1024, 3e6, 5e10, (2.5, 0.2, 0.6, 0.2, 1.0)),
)


def _write_run(folder, world, tokens_per_step, flops_token, peak, seconds):
    """A run folder as gpt2lib train writes it, with step times the check chooses."""
    folder.mkdir(parents=True)
    info = {
        "world_size": world,
        "tokens_per_step": tokens_per_step,
        "flops_per_token": flops_token,
        "peak_flops_per_device": peak,
        "peak_source": "given (a check's own numbers)",
    }
    (folder / "run.json").write_text(json.dumps(info, indent=2) + "\n", encoding="utf-8")
    lines = [
        {
            "step": step,
            "loss": 10.0 - step,
            "lr": 1e-3,
            "tokens_per_s": tokens_per_step / t,
            "mfu": flops_token * tokens_per_step / t / (peak * world),
        }
        for step, t in enumerate(seconds)
    ]
    log = "".join(json.dumps(line) + "\n" for line in lines)
    (folder / "log.jsonl").write_text(log, encoding="utf-8")
    return folder


def check_run_speed(fn):
    """`run_speed(folder)` -> (tokens per second, MFU) over every step but the first."""
    with tempfile.TemporaryDirectory() as work:
        for k, (world, *rest) in enumerate(_SPEED_RUNS):
            folder = _write_run(Path(work) / f"run{k}", world, *rest)
            got = core.call_learner(EX_SPEED, fn, folder)
            got = tuple(float(g) for g in _two(EX_SPEED, got, "(tokens per second, MFU)"))
            want = _run_speed(folder)
            if _near(got, want):
                continue
            percent = math.isclose(got[1], 100 * want[1], rel_tol=1e-6)
            core.fail_with(
                EX_SPEED,
                SPEED_MISTAKES,
                lambda m, f=folder: _near(got, m.fn(f)),
                "your MFU is a percentage: return the share, between 0 and 1"
                if percent
                else f"for {world} process(es) with steps of {rest[-1]} s you give {got[0]:,.1f} tokens/s and MFU {got[1]:.4g}; the run's are {want[0]:,.1f} and {want[1]:.4g}",
            )
    core.passed(EX_SPEED, "throughput and MFU of a one-process and a two-process run")


TOKEN_BUDGET = 32 * 8 * 32  # tokens the challenge's run may read: 32 steps x 8 windows x 32
TARGET_VAL_LOSS = 7.2


def check_token_budget_challenge(run_folder):
    """The run in `run_folder` read at most TOKEN_BUDGET tokens and reached the target."""
    run, log = _read_run(run_folder)
    s = run["settings"]
    if (s["n_layer"], s["n_embd"], s["n_head"]) != (2, 32, 2):
        raise core.CheckFailed(CHALLENGE, "keep the model: n_layer=2, n_embd=32, n_head=2")
    tokens = run["tokens_per_step"] * len(log)
    if tokens > TOKEN_BUDGET:
        raise core.CheckFailed(
            CHALLENGE, f"the run read {tokens:,} tokens, over the budget of {TOKEN_BUDGET:,}"
        )
    val = log[-1].get("val_loss")
    if val is None or not val <= TARGET_VAL_LOSS:
        raise core.CheckFailed(
            CHALLENGE,
            f"validation loss {val} after {tokens:,} tokens; the goal is {TARGET_VAL_LOSS} or less",
        )
    core.passed(CHALLENGE, f"validation loss {val:.4f} after {tokens:,} tokens")
