"""Matrix kernels for decoding on a CPU (chapter 9, last section): the split multiply.

A leaf module: it imports nothing from gpt2lib, and the teaching layers (Conv1D, the tied
readout) never call it. Only the decoding engine in `gpt2lib.speed` does.
"""

__all__ = [
    "SPLIT_MAX_ROWS",
    "SPLIT_PARTS",
    "matmul_bias",
    "readout_matmul",
    "split_matmul",
    "split_measured_faster",
    "use_split_matmul",
]


import contextlib
import time

import torch

SPLIT_MAX_ROWS = 32  # up to this many rows the split pays on a CPU (chapter 9 plots it)
SPLIT_PARTS = 8  # slabs per multiply: more than the cores, so that none of them waits
_split_enabled = None  # None: decided by one measurement on this machine (see _split_pays)


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


_measured = {}  # thread count -> whether the split beat torch's one-row multiply here


def split_measured_faster():
    """Whether, on this machine, the split beats torch's own multiply for one row.

    It depends on the CPU's matrix library: where a one-row multiply runs on one core (seen
    on an AMD EPYC) the split was 1.5x faster; where it already uses every core (seen on an
    Intel Xeon) the split was slower. So it is measured once per thread count, on a GPT-2
    small MLP weight (about 30 ms), and the split is used only if it wins by 10%.
    """
    threads = torch.get_num_threads()
    if threads not in _measured:
        gen = torch.Generator().manual_seed(0)
        x, w = torch.randn(1, 768, generator=gen), torch.randn(768, 3072, generator=gen)
        plain, split = [], []
        for _ in range(15):  # interleaved, so that a busy moment hits both
            began = time.perf_counter()
            torch.mm(x, w)
            plain.append(time.perf_counter() - began)
            began = time.perf_counter()
            split_matmul(x, w, SPLIT_PARTS)
            split.append(time.perf_counter() - began)
        _measured[threads] = min(split) < 0.9 * min(plain)
    return _measured[threads]


def _split_pays(x, rows):
    """The split only for few rows of float32 on a CPU with several threads (one thread has
    nothing to spread the slabs over), and only where it was measured faster, unless
    use_split_matmul(True) asks for it."""
    if torch.compiler.is_compiling():  # an eager trick: a compiler plans its own kernels
        return False
    if _split_enabled is False or not (
        rows <= SPLIT_MAX_ROWS
        and x.device.type == "cpu"
        and x.dtype == torch.float32
        and torch.get_num_threads() > 1
    ):
        return False
    return _split_enabled is True or split_measured_faster()


def matmul_bias(x, weight, bias):
    """bias + x @ weight for x (rows, n_in) and weight (n_in, n_out): Conv1D's multiply."""
    if _split_pays(x, x.shape[0]) and weight.shape[0] % SPLIT_PARTS == 0:
        return split_matmul(x, weight, SPLIT_PARTS) + bias
    return torch.addmm(bias, x, weight)  # bias + x @ weight in one kernel


def readout_matmul(x, table):
    """x @ table.T for x (rows, C) and the token table (V, C): the tied readout's multiply.

    Here the table is cut along the vocabulary instead: SPLIT_PARTS blocks of whole rows in
    one torch.bmm, and the V % SPLIT_PARTS rows left over on their own. No sum is needed.
    """
    rows = x.shape[0]
    V, C = table.shape
    if _split_pays(x, rows) and V >= SPLIT_PARTS:
        per_part = V // SPLIT_PARTS
        covered = SPLIT_PARTS * per_part  # tokens inside the blocks
        blocks = table[:covered].view(SPLIT_PARTS, per_part, C)  # (parts, V/parts, C)
        scores = torch.bmm(blocks, x.T.expand(SPLIT_PARTS, C, rows))  # (parts, V/parts, rows)
        scores = scores.view(covered, rows)
        if covered < V:
            scores = torch.cat([scores, table[covered:] @ x.T])  # (V, rows)
        return scores.T.contiguous()  # (rows, V)
    if rows <= 16 and x.device.type == "cpu":  # walking the table row by row beats its transpose
        return torch.mm(table, x.T).T.contiguous()
    return x @ table.T


@contextlib.contextmanager
def use_split_matmul(enabled):
    """Within the `with` block, the decoding engine splits few-row multiplies (True), never
    (False), or where it was measured faster on this machine (None, the default)."""
    global _split_enabled
    if enabled is not None and not isinstance(enabled, bool):
        raise TypeError(f"use_split_matmul takes True, False or None, got {enabled!r}")
    before, _split_enabled = _split_enabled, enabled
    try:
        yield
    finally:
        _split_enabled = before
