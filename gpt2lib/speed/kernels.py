"""Matrix kernels for decoding on a CPU (chapter 9, last section): the split multiplies.

It imports nothing from gpt2lib but the one atomic write, and the teaching layers (Conv1D, the
tied readout) never call it. Only the modules `gpt2lib.speed` swaps in do.

A decode step multiplies one row (or a few) by every weight matrix, so its speed is how fast
the matrix library streams the weights. On some CPUs the library runs such a multiply on one
core; the same product cut into slabs, in one `torch.bmm`, spreads over all of them. Which way
is fastest depends on the CPU and the library, so it is measured on this machine, per thread
count, when someone asks (`measure_routes`, or `python -m gpt2lib.speed tune`): for one row and
for a few. The result is kept on disk (`routes_file()`), and a split is used only where it beat
torch's own multiply by 10%. Nothing is measured unasked: without a measurement every multiply
is torch's.

- Conv1D's multiply `x @ W` (W is [n_in, n_out]): "inner" cuts n_in into slabs and sums the
  partial products; "columns" cuts n_out into slabs (each output stays one dot product, with
  no partial sums to add);
- the tied readout `x @ table.T` (table is [V, C]): "blocks" cuts the vocabulary into blocks
  of whole rows; "table" walks the table row by row as `(table @ x.T).T`.
"""

__all__ = [
    "SPLIT_MAX_ROWS",
    "SPLIT_PARTS",
    "column_split_matmul",
    "matmul_bias",
    "known_routes",
    "measure_routes",
    "measured_routes",
    "readout_matmul",
    "routes_file",
    "split_matmul",
    "split_measured_faster",
    "use_split_matmul",
]


import contextlib
import json
import os
import platform
import time
from pathlib import Path

import torch

from gpt2lib.files import atomic_write

SPLIT_MAX_ROWS = 32  # up to this many rows a split can pay on a CPU (chapter 9 plots it)
SPLIT_PARTS = 8  # slabs per multiply: more than the cores, so that none of them waits
_split_enabled = None  # None: the routes measured on this machine (see measured_routes)


def split_matmul(x, weight, parts):
    """x @ weight for x (rows, n_in) and weight (n_in, n_out), computed in `parts` slabs.

    The inner dimension is cut into `parts` slabs of n_in // parts: columns of x, rows of
    weight. One torch.bmm forms all the partial products, (parts, rows, n_out), and their sum
    is x @ weight. `parts` must divide n_in.
    """
    rows, n_in = x.shape
    x_slabs = x.view(rows, parts, n_in // parts).transpose(0, 1)  # (parts, rows, n_in/parts)
    w_slabs = weight.view(parts, n_in // parts, weight.shape[1])  # (parts, n_in/parts, n_out)
    return torch.bmm(x_slabs, w_slabs).sum(dim=0)  # (rows, n_out)


def column_split_matmul(x, weight, parts):
    """x @ weight for x (rows, n_in) and weight (n_in, n_out), in `parts` slabs of columns.

    The output dimension is cut into `parts` slabs of n_out // parts columns of weight (views,
    no copy); one torch.bmm multiplies x by each. No sum: every output is one dot product, as
    in x @ weight. `parts` must divide n_out.
    """
    rows, n_in = x.shape
    n_out = weight.shape[1]
    w_slabs = weight.view(n_in, parts, n_out // parts).transpose(0, 1)  # (parts, n_in, n_out/parts)
    y = torch.bmm(x.expand(parts, rows, n_in), w_slabs)  # (parts, rows, n_out/parts)
    return y.transpose(0, 1).reshape(rows, n_out)  # (rows, n_out)


def _readout_blocks(x, table):
    """x @ table.T in SPLIT_PARTS blocks of whole table rows (one torch.bmm), plus the
    V % SPLIT_PARTS rows left over. No sum is needed."""
    rows = x.shape[0]
    V, C = table.shape
    per_part = V // SPLIT_PARTS
    covered = SPLIT_PARTS * per_part  # tokens inside the blocks
    blocks = table[:covered].view(SPLIT_PARTS, per_part, C)  # (parts, V/parts, C)
    scores = torch.bmm(blocks, x.T.expand(SPLIT_PARTS, C, rows))  # (parts, V/parts, rows)
    scores = scores.view(covered, rows)
    if covered < V:
        scores = torch.cat([scores, table[covered:] @ x.T])  # (V, rows)
    return scores.T.contiguous()  # (rows, V)


_CONV = {
    "torch": lambda x, w: torch.mm(x, w),
    "inner": lambda x, w: split_matmul(x, w, SPLIT_PARTS),
    "columns": lambda x, w: column_split_matmul(x, w, SPLIT_PARTS),
}
_READOUT = {
    "torch": lambda x, t: x @ t.T,
    "table": lambda x, t: torch.mm(t, x.T).T.contiguous(),
    "blocks": _readout_blocks,
}

_measured = {}  # thread count -> the routes measured fastest here, once read or measured
ROUTE_KEYS = ("conv_one", "conv_few", "readout_one", "readout_few")


def routes_file() -> Path:
    """Where the measured routes are kept: $GPT2LIB_CACHE_DIR, else the user's cache folder
    ($XDG_CACHE_HOME or ~/.cache), in gpt2lib/split_routes.json."""
    folder = os.environ.get("GPT2LIB_CACHE_DIR")
    if not folder:
        base = os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache"
        folder = Path(base) / "gpt2lib"
    return Path(folder) / "split_routes.json"


def _machine_key(threads: int) -> str:
    """What a measurement holds for: this processor, this PyTorch, this many threads."""
    return f"{platform.machine()} {platform.processor()} | torch {torch.__version__} | {threads} threads"


def _read_routes_file() -> dict:
    try:
        table = json.loads(routes_file().read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return {}  # none yet, or unreadable: as if never measured
    return table if isinstance(table, dict) else {}


def known_routes(threads: int | None = None) -> dict | None:
    """The routes measured on this machine for `threads` (default: torch's now), from this
    process or from the file; None when they were never measured. Never measures."""
    threads = torch.get_num_threads() if threads is None else threads
    if threads not in _measured:
        routes = _read_routes_file().get(_machine_key(threads))
        if not (isinstance(routes, dict) and set(routes) == set(ROUTE_KEYS)):
            return None
        _measured[threads] = routes
    return _measured[threads]


def _fastest(candidates, args_of, repeats=5):
    """The name of the fastest candidate, timed interleaved (a busy moment hits them all),
    best of `repeats`; a split only where it beats "torch" by 10%."""
    best = {name: float("inf") for name in candidates}
    for _ in range(repeats):
        for name, fn in candidates.items():
            args = args_of()
            began = time.perf_counter()
            for a in args:
                fn(*a)
            best[name] = min(best[name], time.perf_counter() - began)
    winner = min(best, key=best.get)
    return winner if best[winner] < 0.9 * best["torch"] else "torch"


def measure_routes(save: bool = True) -> dict:
    """Measure how this machine multiplies few rows fastest, at torch's thread count now (about
    a second), remember it, and keep it in routes_file() unless save is False:
    {"conv_one", "conv_few", "readout_one", "readout_few"} -> a route name.

    "one" is one row (batch 1), "few" eight (a small batch). Conv1D is timed on the weights
    of four GPT-2 small layers (113 MB) and the readout on a 32,768 × 768 table (100 MB):
    larger than the CPU's caches, as a model's weights are, so that what gets measured is how
    fast each route streams them from memory.
    """
    threads = torch.get_num_threads()
    shapes = [(768, 2304), (768, 768), (768, 3072), (3072, 768)]  # c_attn, c_proj, c_fc, c_proj
    weights = [torch.ones(shape) for _ in range(4) for shape in shapes]
    table = torch.ones(32768, 768)
    routes = {}
    for bucket, rows in (("one", 1), ("few", 8)):
        x = {n_in: torch.ones(rows, n_in) for n_in in (768, 3072)}
        with torch.no_grad():
            routes[f"conv_{bucket}"] = _fastest(
                _CONV, lambda x=x: [(x[w.shape[0]], w) for w in weights]
            )
            routes[f"readout_{bucket}"] = _fastest(_READOUT, lambda x=x: [(x[768], table)])
    _measured[threads] = routes
    if save:
        path = routes_file()
        table_of_routes = {**_read_routes_file(), _machine_key(threads): routes}
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
            atomic_write(path, json.dumps(table_of_routes, indent=2, sort_keys=True) + "\n")
        except OSError:
            pass  # a read-only home: the routes still hold for this process
    return routes


def measured_routes() -> dict:
    """The routes for torch's thread count now: known ones, else measured (and kept) now. For
    callers that ask to be tuned (benchmarks, `python -m gpt2lib.speed tune`)."""
    return known_routes() or measure_routes()


def split_measured_faster() -> bool:
    """Whether a measurement on this machine, at torch's thread count now, found a split that
    beat torch's own multiply (False when none was made: nothing is measured here)."""
    routes = known_routes()
    return routes is not None and any(route != "torch" for route in routes.values())


def _route(kind, x, rows):
    """The route for `rows` rows of x: a split only for few rows of float32 on a CPU with
    several threads (one thread has nothing to spread the slabs over), and only where it was
    measured faster, unless use_split_matmul(True) asks for one."""
    if torch.compiler.is_compiling():  # an eager trick: a compiler plans its own kernels
        return "torch"
    if _split_enabled is False or not (
        rows <= SPLIT_MAX_ROWS
        and x.device.type == "cpu"
        and x.dtype == torch.float32
        and torch.get_num_threads() > 1
    ):
        return "torch"
    routes = known_routes() or dict.fromkeys(ROUTE_KEYS, "torch")  # unmeasured: torch's
    route = routes[f"{kind}_{'one' if rows == 1 else 'few'}"]
    if _split_enabled is True and route == "torch":  # asked for a split: the first one
        return "inner" if kind == "conv" else "blocks"
    return route


def matmul_bias(x, weight, bias):
    """bias + x @ weight for x (rows, n_in) and weight (n_in, n_out): Conv1D's multiply."""
    route = _route("conv", x, x.shape[0])
    cut = {"inner": weight.shape[0], "columns": weight.shape[1]}.get(route)  # the dimension split
    if cut is not None and cut % SPLIT_PARTS == 0:
        return _CONV[route](x, weight) + bias
    return torch.addmm(bias, x, weight)  # bias + x @ weight in one kernel


def readout_matmul(x, table):
    """x @ table.T for x (rows, C) and the token table (V, C): the tied readout's multiply."""
    route = _route("readout", x, x.shape[0])
    if route == "blocks" and table.shape[0] < SPLIT_PARTS:  # too few rows to cut in blocks
        route = "torch"
    return _READOUT[route](x, table)


@contextlib.contextmanager
def use_split_matmul(enabled):
    """Within the `with` block, the swapped-in modules split few-row multiplies (True: the
    route measured here, or the first split where none won), never (False), or where it was
    measured faster on this machine (None, the default)."""
    global _split_enabled
    if enabled is not None and not isinstance(enabled, bool):
        raise TypeError(f"use_split_matmul takes True, False or None, got {enabled!r}")
    before, _split_enabled = _split_enabled, enabled
    try:
        yield
    finally:
        _split_enabled = before
