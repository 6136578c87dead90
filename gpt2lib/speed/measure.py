"""Measuring helpers shared by chapter 9 and benchmarks/: wall times, memory speed, decoding rate."""

__all__ = [
    "decode_bytes_per_token",
    "decode_rate",
    "last_level_cache_bytes",
    "median_seconds",
    "memory_read_gbps",
    "print_decode_limits",
    "wall_times",
    "weight_multiplies_seconds",
]


import glob
import statistics
import time

import torch

from gpt2lib.chapters.layers import Conv1D
from gpt2lib.generation import generate


def wall_times(fn, repeats=5, warmup=1, sync=None, clock=time.perf_counter):
    """The wall time of each of `repeats` calls of fn(), after `warmup` untimed calls.

    sync: called before each clock read (torch.cuda.synchronize on a GPU, whose work is
    queued and would otherwise not be counted). clock: time.process_time for CPU time.
    """
    if isinstance(repeats, bool) or not isinstance(repeats, int) or repeats < 1:
        raise ValueError(f"repeats must be an int >= 1, got {repeats!r}")
    for _ in range(warmup):
        fn()
    times = []
    for _ in range(repeats):
        if sync is not None:
            sync()
        began = clock()
        fn()
        if sync is not None:
            sync()
        times.append(clock() - began)
    return times


def median_seconds(fn, repeats=5, warmup=1, sync=None, clock=time.perf_counter):
    """Median wall time of fn() over `repeats` calls, after `warmup` untimed calls (see
    wall_times): the typical time, which one slow call on a busy machine does not move."""
    return statistics.median(wall_times(fn, repeats, warmup, sync, clock))


def last_level_cache_bytes():
    """The size of this CPU's largest cache, in bytes (Linux's sysfs), or None if unknown."""
    sizes = []
    for path in glob.glob("/sys/devices/system/cpu/cpu0/cache/index*/size"):
        text = open(path, encoding="utf-8").read().strip().upper()
        scale = {"K": 2**10, "M": 2**20, "G": 2**30}.get(text[-1:], 1)
        digits = text.rstrip("KMG")
        if digits.isdigit():
            sizes.append(int(digits) * scale)
    return max(sizes) if sizes else None


def memory_read_gbps(megabytes=None, repeats=5, device="cpu"):
    """How fast this machine streams memory, in GB/s: the faster of two reads of one float32
    buffer, a sum and one row times the buffer seen as a (3072, n) matrix (the multiply that
    batch-1 decoding does), each the best of `repeats`.

    The buffer must be much larger than the CPU's caches, or the cache's speed is measured:
    by default 4 times the last-level cache, and at least 256 MB.
    """
    device = torch.device(device)
    if megabytes is None:
        cache = last_level_cache_bytes() if device.type == "cpu" else None
        megabytes = max(256, 4 * (cache or 0) // 10**6)
    n_in = 3072
    n_out = max(1, megabytes * 10**6 // 4 // n_in)
    buffer = torch.ones(n_in * n_out, device=device)
    matrix, row = buffer.view(n_in, n_out), torch.ones(1, n_in, device=device)
    sync = torch.cuda.synchronize if device.type == "cuda" else None
    best = min(
        min(wall_times(buffer.sum, repeats, sync=sync)),
        min(wall_times(lambda: torch.mm(row, matrix), repeats, sync=sync)),
    )
    return buffer.nbytes / best / 1e9


def weight_multiplies_seconds(model, repeats=7):
    """The fastest time (best of `repeats`) of a batch-1 decode step's multiplies alone: one
    row times every Conv1D weight, then the token table, with torch.mm, and nothing else.

    A decode step does these and more, so 1 / this time bounds its tokens/s from above, also
    where the weights fit in a cache (then memory_read_gbps does not bound the step).
    """
    weights = [m.weight for m in model.modules() if isinstance(m, Conv1D)]
    table = model.wte.weight
    rows = {w.shape[0]: torch.ones(1, w.shape[0], dtype=w.dtype, device=w.device) for w in weights}
    column = torch.ones(table.shape[1], 1, dtype=table.dtype, device=table.device)
    sync = torch.cuda.synchronize if table.device.type == "cuda" else None

    def step():
        for w in weights:
            torch.mm(rows[w.shape[0]], w)
        torch.mm(table, column)

    with torch.no_grad():
        return min(wall_times(step, repeats, sync=sync))


def decode_bytes_per_token(model):
    """Bytes of weights one decode step reads: every parameter, but one row of `wpe`."""
    total = sum(p.numel() * p.element_size() for p in model.parameters())
    wpe = model.wpe.weight
    return total - wpe.nbytes + wpe[0].nbytes


def decode_rate(model, prompt, new_tokens=32, repeats=3, **generate_kwargs):
    """Tokens per second of cached greedy decoding, the prompt's prefill excluded.

    Times generate() for `new_tokens` and for 1 new token; the difference is the decode steps.
    Keyword arguments go to generate() (compile=True, use_cache=False, ...).
    """
    if new_tokens < 2:
        raise ValueError(f"new_tokens must be >= 2 (one step is the prefill), got {new_tokens}")
    device = prompt.device
    sync = torch.cuda.synchronize if device.type == "cuda" else None
    kwargs = dict(temperature=0, **generate_kwargs)
    one = median_seconds(lambda: generate(model, prompt, 1, **kwargs), repeats, sync=sync)
    many = median_seconds(lambda: generate(model, prompt, new_tokens, **kwargs), repeats, sync=sync)
    return prompt.shape[0] * (new_tokens - 1) / max(many - one, 1e-9)


def print_decode_limits(rate, multiplies, stream_limit, fits, *, per_token, llc, bandwidth):
    """Chapter 9's printout: the decoding rate next to each limit it is compared with.

    rate: tokens/s of cached decoding; multiplies: tokens/s of a step's multiplies alone;
    stream_limit: tokens/s if every weight came from memory; fits: whether the weights fit in
    the last-level cache (llc, bytes; None: unknown), in which case the memory limit does not
    apply. A rate above a limit is printed as such, with the advice to rerun: it means the
    machine's load changed between the timings, never that the limit was beaten.
    """
    print(
        f"weights read per token: {per_token / 1e6:.1f} MB; last-level cache: "
        f"{'unknown' if llc is None else f'{llc / 2**20:.0f} MiB'}\n"
        f"memory stream: {bandwidth:.1f} GB/s -> at most {stream_limit:.0f} tokens/s from memory\n"
        f"the multiplies alone: at most {multiplies:.0f} tokens/s\n"
        f"cached greedy decoding, batch 1: {rate:.1f} tokens/s"
    )
    limits = {"the multiplies alone": multiplies}
    if fits:
        print(
            "the weights fit in the last-level cache, so after the first step they come from "
            "the cache, faster than memory: the memory limit does not apply to this model here"
        )
    else:
        limits["the memory stream"] = stream_limit
    for name, limit in limits.items():
        relation = "within" if rate <= limit else "ABOVE (the load changed between timings: rerun)"
        print(f"  {rate / limit:.0%} of the limit of {name}: {relation} it")
