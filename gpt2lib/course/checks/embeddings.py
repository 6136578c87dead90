"""Checks for chapter 2's exercises: the one-hot lookup, the gradient of a lookup, cosines between
rows, dropout by hand and measured, GPT2Embeddings, embedding in pieces, and the challenge's table.
"""

from __future__ import annotations

import math

import torch
import torch.nn as nn
import torch.nn.functional as F

from gpt2lib.course.checks import _core as core

EX_ONE_HOT = "Exercise 2.1 (one_hot_embed)"
EX_BACKWARD = "Exercise 2.2 (lookup_backward)"
EX_COSINE = "Exercise 2.3 (cosine_matrix)"
MEAN_ABS = "Exercise 2.3 (mean_abs_cosine)"
EX_DROPOUT = "Exercise 2.4 (dropout)"
EX_MEASURE_DROPOUT = "Exercise 2.4 (measure_dropout)"
EX_MODULE = "Exercise 2.5 (GPT2Embeddings)"
EX_PIECES = "Exercise 2.6 (embed_in_pieces)"
CHALLENGE_TABLE = "Challenge (a position table that knows what is near)"


def _require_float(exercise: str, got, what: str) -> None:
    if isinstance(got, torch.Tensor) and not (got.is_floating_point() or got.is_complex()):
        raise core.CheckFailed(
            exercise,
            f"{what} has dtype {got.dtype}; embeddings are floating point like the table (if you built one-hot vectors, convert them with .to(table.dtype) before the matmul)",
        )


def _unit_rows(t):
    return t / t.norm(dim=1, keepdim=True)


def _uses(ids, V, dtype):
    """How often each id is used, (V, 1)."""
    return torch.bincount(ids.reshape(-1), minlength=V).to(dtype)[:, None]


# --------------------------------------------------------------------------- Exercise 2.1


def _rows(ids, table, *, mistake=""):
    """The table's rows of the ids; `mistake` plants one of ONE_HOT_MISTAKES by its name."""
    shift = {"rows_shifted_down": -1, "rows_shifted_up": 1}.get(mistake, 0)
    return table[(ids + shift) % table.shape[0]]


ONE_HOT_MISTAKES = core.variants(
    _rows,
    {
        "rows_shifted_down": "your rows are shifted by one: the row for id i is row i of the table (ids count from 0, so id 0 is row 0)",
        "rows_shifted_up": "your rows are shifted by one the other way: the row for id i is row i of the table, not row i + 1",
    },
)


def _explain_one_hot_error(exc: RuntimeError, V: int, C: int):
    """Turn the usual errors of a one-hot matmul into a message that names the mistake."""
    text = str(exc)
    if "dtype" in text or "Long" in text or "long" in text:
        why = f"the matmul fails ({text}): F.one_hot returns integers (torch.long) and the table holds floats. Convert the one-hot vectors first: .to(table.dtype) (or .float())."
    elif "num_classes" in text:
        why = f"F.one_hot fails ({text}): num_classes is the vocabulary size, the number of ROWS of the table (table.shape[0] = {V} here), not its width C = {C}."
    elif "size" in text or "shape" in text:
        why = f"the matmul fails ({text}). The one-hot vectors (..., V) go on the left: one_hot @ table, (..., V) @ (V, C) -> (..., C); table @ one_hot does not fit."
    else:
        raise exc
    raise core.CheckFailed(EX_ONE_HOT, why) from None


_LOOKUPS = {"IndexBackward0", "EmbeddingBackward0", "IndexSelectBackward0", "GatherBackward0"}


def _backward_ops(tensor) -> set[str]:
    """The names of the autograd nodes behind `tensor`, e.g. {"MmBackward0", "IndexBackward0"}."""
    names, stack, seen = set(), [tensor.grad_fn], set()
    while stack:
        node = stack.pop()
        if node is not None and id(node) not in seen:
            seen.add(id(node))
            names.add(type(node).__name__)
            stack.extend(next_node for next_node, _ in node.next_functions)
    return names


def check_one_hot_embed(one_hot_embed) -> None:
    """`one_hot_embed(token_ids, table)`: ids of any shape (...), table (V, C) -> (..., C)."""
    V, C = 7, 5
    table = torch.randn(V, C, generator=torch.Generator().manual_seed(0))
    ids = torch.tensor([[0, 3, 6, 3, 1, 2], [5, 4, 4, 0, 6, 2]])  # (B=2, T=6), ids 0 and V - 1
    try:
        got = core.call_learner(EX_ONE_HOT, one_hot_embed, ids, table.clone())
    except RuntimeError as exc:
        _explain_one_hot_error(exc, V, C)
    _require_float(EX_ONE_HOT, got, "your output")
    hint = "one entry per vocabulary id: that is the one-hot matrix itself. Multiply it by the table: (B, T, V) @ (V, C) -> (B, T, C)"
    got = core.expect_tensor(
        EX_ONE_HOT, got, (2, 6, C), what="your output", hints={(2, 6, V): hint}
    )
    otherwise = "the shape is right but the values are not the table rows of the ids: row b, t of the output must equal table[token_ids[b, t]]"
    core.fail_unless_close(EX_ONE_HOT, got, table[ids], ONE_HOT_MISTAKES, (ids, table), otherwise)

    small = torch.tensor([0, 2, 1, 2])  # largest id 2 < V - 1: F.one_hot needs num_classes
    try:
        got = core.call_learner(EX_ONE_HOT, one_hot_embed, small, table.clone())
    except RuntimeError as exc:
        raise core.CheckFailed(
            EX_ONE_HOT,
            f"works when the ids include {V - 1} (the last id) but fails on ids whose largest value is 2 ({exc}). F.one_hot(ids) alone makes vectors only max(ids) + 1 long; pass num_classes=table.shape[0].",
        ) from None
    _require_float(EX_ONE_HOT, got, "your output for 1-D ids")
    if not core.close(got, table[small]):
        shape = tuple(got.shape) if isinstance(got, torch.Tensor) else type(got).__name__
        raise core.CheckFailed(
            EX_ONE_HOT,
            f"for 1-D ids of shape (4,) expected shape (4, {C}) with rows table[ids], got {shape}; make it work for ids of any shape",
        )

    leaf = table.clone().requires_grad_(True)  # training updates exactly the rows used
    out = core.call_learner(EX_ONE_HOT, one_hot_embed, ids, leaf)
    if not isinstance(out, torch.Tensor) or not out.requires_grad:
        raise core.CheckFailed(
            EX_ONE_HOT,
            "no gradient reaches the table through your output; keep the computation in torch (no .detach(), .numpy(), .tolist() or torch.no_grad())",
        )
    if _backward_ops(out) & _LOOKUPS:
        raise core.CheckFailed(
            EX_ONE_HOT,
            "your output reads rows of the table (table[ids], F.embedding, index_select or gather): the exercise asks for one-hot vectors times the table",
        )
    out.sum().backward()
    if leaf.grad is None or not torch.allclose(leaf.grad, _uses(ids, V, table.dtype).expand(V, C)):
        raise core.CheckFailed(
            EX_ONE_HOT, "the gradient reaching the table is not the number of uses of each row"
        )
    core.passed(EX_ONE_HOT, "one-hot @ table picks the same rows as table[ids], gradients included")


# --------------------------------------------------------------------------- Exercise 2.2


def lookup_backward_reference(token_ids, grad_out, vocab_size, *, mistake="") -> torch.Tensor:
    """The table's gradient (V, C): row v is the sum of grad_out over the places where id v is;
    `mistake` plants one of BACKWARD_MISTAKES by its name."""
    C, uses = grad_out.shape[-1], _uses(token_ids, vocab_size, grad_out.dtype)
    ids, g = token_ids.reshape(-1), grad_out.reshape(-1, C)
    grad = torch.zeros(vocab_size, C, dtype=grad_out.dtype)
    if mistake == "repeated_ids_overwritten":
        return grad.index_put((ids,), g)
    if mistake == "counted_uses":
        return uses.expand(vocab_size, C)
    if mistake == "total_to_every_used_row":
        return (uses > 0).to(g.dtype) * g.sum(0)
    grad.index_add_(0, ids, g)
    return grad / uses.clamp(min=1) if mistake == "averaged_uses" else grad


REPEATED_IDS_MESSAGE = "ids used once get the right row, but a repeated id keeps only ONE of its gradients. Uses add up: a token used twice gets the sum of both. Note that `grad[ids] = g` and even `grad[ids] += g` keep one value per repeated index in PyTorch; use grad.index_add_(0, ids, g), a loop with +=, or one_hot.T @ g"

_AUTOGRAD = ("torch.Tensor.backward", "torch.autograd.backward", "torch.autograd.grad")
_NO_AUTOGRAD = "derive the gradient yourself: autograd is blocked while your lookup_backward runs"

BACKWARD_MISTAKES = core.variants(
    lookup_backward_reference,
    {
        "repeated_ids_overwritten": REPEATED_IDS_MESSAGE,
        "averaged_uses": "you averaged the gradients of a repeated id; they add up: a token used 3 times gets the SUM of its 3 gradients",
        "counted_uses": "you returned how often each id is used and ignored grad_out's values; that is the gradient only for the plain sum of the demo. Add up grad_out[b, t] into row token_ids[b, t]",
        "total_to_every_used_row": "every used row got the gradient summed over ALL positions; row v gets only the gradients of the positions where id v stands",
    },
)


def check_lookup_backward(lookup_backward) -> None:
    """`lookup_backward(token_ids, grad_out, vocab_size)`: ids (...), grad_out (..., C) -> (V, C)."""
    gen = torch.Generator().manual_seed(0)
    V, C = 9, 4
    # (B=2, T=5): 1, 3 and 5 repeat, 0, 7, 8 unused; (T=4,): the last id 3 times
    for ids in (torch.tensor([[3, 1, 4, 1, 5], [2, 6, 5, 3, 5]]), torch.tensor([8, 0, 8, 8])):
        grad_out = torch.randn(*ids.shape, C, generator=gen)
        with core.forbidding(EX_BACKWARD, *_AUTOGRAD, instead=_NO_AUTOGRAD):
            got = core.call_learner(EX_BACKWARD, lookup_backward, ids.clone(), grad_out.clone(), V)
        uses, seen = ids.numel(), int(ids.unique().numel())
        hints = {
            (C, V): "that is (C, V), transposed: the gradient has the table's shape, (V, C)",
            (uses, C): "one row per use; add the rows of the same id together into a (V, C) table",
            (seen, C): "one row per id that appears; return all V rows (unused ids get zeros)",
            tuple(grad_out.shape): "that is grad_out's shape; the gradient is (V, C), the table's",
        }
        what = f"your gradient for ids of shape {tuple(ids.shape)}"
        got = core.expect_tensor(EX_BACKWARD, got, (V, C), what=what, hints=hints)
        want = lookup_backward_reference(ids, grad_out, V)
        if core.close(got, want):
            continue
        core.fail_with(
            EX_BACKWARD,
            BACKWARD_MISTAKES,
            lambda m: core.close(got, m.fn(ids, grad_out, V)),
            _backward_diagnosis(got, want, ids, V),
        )
    core.passed(
        EX_BACKWARD,
        "each row gets the sum of the gradients of its uses, unused rows zero: in product form one_hotᵀ @ grad_out, (V, B·T) @ (B·T, C)",
    )


def _backward_diagnosis(got, want, ids, V) -> str:
    """What is wrong with a gradient that no planted mistake explains."""
    counts = torch.bincount(ids.reshape(-1), minlength=V)
    if core.close(got[counts <= 1], want[counts <= 1]):  # single uses right: repeats are wrong
        return REPEATED_IDS_MESSAGE
    if not core.close(got[counts == 0], want[counts == 0]):
        return "rows of ids that never appear must be zero: no use, no gradient"
    return f"for ids of shape {tuple(ids.shape)} the shape is right but the values are not: row v must be the sum of grad_out[b, t] over every place where token_ids[b, t] == v"


# --------------------------------------------------------------------------- Exercise 2.3


def _cosines(t, *, mistake=""):
    """The cosines between the rows of t (N, C); `mistake` plants one of COSINE_MISTAKES by its
    name."""
    if mistake == "table_changed_in_place":
        t /= t.norm(dim=1, keepdim=True)
    if mistake in ("dot_products_not_cosines", "table_changed_in_place"):
        return t @ t.T
    if mistake == "divided_by_squared_norms":
        return (t @ t.T) / torch.outer(t.norm(dim=1), t.norm(dim=1)) ** 2
    unit = _unit_rows(t.T).T if mistake == "normalised_columns" else _unit_rows(t)
    if mistake == "feature_by_feature":
        return unit.T @ unit
    return (unit @ unit.T).abs() if mistake == "absolute_values" else unit @ unit.T


COSINE_MISTAKES = core.variants(
    _cosines,
    {
        "dot_products_not_cosines": "your entries are plain dot products: divide each row by its length (its norm) first, so that every entry is a cosine between -1 and 1",
        "normalised_columns": "you normalised the columns (features), not the rows: each row is one vector, so scale every row to length 1 (norm over dim=1)",
        "feature_by_feature": "your matrix is (C, C), feature against feature: the cosines are between rows, unit @ unit.T, which is (N, N)",
        "divided_by_squared_norms": "you divided by the squared lengths: the cosine is a.b / (|a| |b|), with the norms, not their squares",
        "absolute_values": "your cosines are never negative: keep the sign, opposite vectors have cosine -1",
        # caught by comparing the input before and after, so the last (check_cosine_matrix)
        "table_changed_in_place": "your function changed the table it was given (an in-place division such as table /= ...): compute on a new tensor and leave the input alone",
    },
)


def check_cosine_matrix(cosine_matrix) -> None:
    """cosine_matrix(table (N, C)) -> (N, N) cosines between rows, on tables of two shapes and
    scales, a non-contiguous one among them; the input must be left unchanged."""
    gen = torch.Generator().manual_seed(3)
    cases = [
        torch.randn(5, 7, generator=gen) * 3.0,  # N != C, rows of different lengths
        (torch.randn(4, 6, generator=gen) * 50.0)[:, ::2],  # (4, 3): large, not contiguous
    ]
    for table in cases:
        before = table.clone()
        got = core.call_learner(EX_COSINE, cosine_matrix, table)
        if not torch.equal(table, before):
            raise core.CheckFailed(
                EX_COSINE, core.named(COSINE_MISTAKES, "table_changed_in_place").message
            )
        N, C = table.shape
        hints = {(C, C): core.named(COSINE_MISTAKES, "feature_by_feature").message}
        got = core.expect_tensor(EX_COSINE, got, (N, N), what="your matrix", hints=hints)
        otherwise = f"for a table of shape {(N, C)} the values are wrong: entry [i, j] must be the cosine of rows i and j (1 on the diagonal)"
        mistakes = COSINE_MISTAKES[:-1]  # the last one is caught by comparing the input, above
        want = _cosines(before.double())
        core.fail_unless_close(
            EX_COSINE, got, want, mistakes, (before.double(),), otherwise, atol=1e-4
        )
    core.passed(EX_COSINE, "cosines between rows, any shape, the table left unchanged")


def check_mean_abs_cosine(table, mean_abs_cosine) -> None:
    """The learner's mean |cosine| over pairs of different rows of `table`, a float."""
    if isinstance(mean_abs_cosine, torch.Tensor):
        raise core.CheckFailed(
            MEAN_ABS, "mean_abs_cosine is a tensor: make it a float with .item()"
        )
    if isinstance(mean_abs_cosine, bool) or not isinstance(mean_abs_cosine, (int, float)):
        raise core.CheckFailed(
            MEAN_ABS, f"mean_abs_cosine should be a float, not {mean_abs_cosine!r}"
        )
    cosine = _cosines(table.double())
    different = ~torch.eye(len(table), dtype=torch.bool)
    want = cosine[different].abs().mean().item()
    diagonal = "you averaged the diagonal too: each position with itself has cosine 1; take only pairs of different positions"
    signed = "you averaged the signed cosines, which cancel out: take the absolute values first"
    for value, message in [
        (cosine.abs().mean().item(), diagonal),
        (cosine[different].mean().item(), signed),
    ]:
        if abs(mean_abs_cosine - value) < 1e-4 and abs(value - want) > 1e-4:
            raise core.CheckFailed(MEAN_ABS, message)
    if abs(mean_abs_cosine - want) > 1e-4:
        raise core.CheckFailed(
            MEAN_ABS,
            f"you gave {mean_abs_cosine:.4f}; the mean |cosine| off the diagonal is not that",
        )
    C = table.shape[1]
    core.passed(
        MEAN_ABS,
        f"{want:.4f} over {int(different.sum())} pairs of different positions; random directions in C = {C} dimensions give sqrt(2 / (pi C)) = {math.sqrt(2 / (math.pi * C)):.4f} on average",
    )


# --------------------------------------------------------------------------- Exercise 2.4


def _dropout(x, p, training=True, *, mistake=""):
    """Dropout by hand; `mistake` plants one of DROPOUT_MISTAKES by its name."""
    if not training and mistake != "active_in_eval":
        return x
    keep = torch.rand(x.shape) >= (1 - p if mistake == "drops_one_minus_p" else p)
    factor = {"no_rescale": 1.0, "times_one_minus_p": 1 - p}.get(mistake, 1 / (1 - p))
    factor = 1 / p if mistake == "divide_by_p" else factor
    return x.mul_(keep).mul_(factor) if mistake == "in_place" else x * keep * factor


_TORCH_DROPOUT = ("torch.nn.functional.dropout", "torch.dropout", "torch.nn.Dropout.forward")
_NO_TORCH_DROPOUT = (
    "write dropout yourself, with torch.rand: torch's dropout is blocked in this check"
)

DROPOUT_MISTAKES = core.variants(
    _dropout,
    {
        "no_rescale": "the survivors are not rescaled: zeroing a fraction p lowers the expected value to (1 - p) x; divide the survivors by (1 - p)",
        "times_one_minus_p": "you multiplied the survivors by (1 - p); that lowers the expected value further. Divide by (1 - p) instead",
        "divide_by_p": "you divided the survivors by p; a number survives with probability 1 - p, so divide by (1 - p)",
        "drops_one_minus_p": "you zeroed each number with probability 1 - p (kept it with probability p): p is the probability to DROP",
        # the last two are caught by their own tests in check_dropout
        "active_in_eval": "with training=False your dropout still zeroes numbers; outside training return x unchanged",
        "in_place": "your dropout changed the input tensor in place: return a new tensor (x * mask / (1 - p)), the caller's x must stay as it was",
    },
)


def _same_statistics(got, want) -> bool:
    """The same fraction of zeros (within 0.03) and the same surviving values."""
    if (want == 0).all():
        return bool((got == 0).all())
    zeros = abs((got == 0).double().mean().item() - (want == 0).double().mean().item()) < 0.03
    survivors, wanted = got[got != 0].unique(), want[want != 0].double().unique()
    return zeros and bool(survivors.numel()) and torch.allclose(survivors, wanted)


def check_dropout(dropout) -> None:
    """`dropout(x, p, training)`: in training each number zeroed with probability p and the rest
    divided by 1 - p; outside training x itself. Tried for p = 0.1, 0.5 and 0, on large tensors."""
    for p in (0.1, 0.5, 0.0):
        x = torch.full((64, 256), 2.0)
        with core.forbidding(EX_DROPOUT, *_TORCH_DROPOUT, instead=_NO_TORCH_DROPOUT):
            got = core.seeded_call(core.call_learner, EX_DROPOUT, dropout, x, p, True)
        if not torch.equal(x, torch.full((64, 256), 2.0)):
            raise core.CheckFailed(EX_DROPOUT, core.named(DROPOUT_MISTAKES, "in_place").message)
        got = core.expect_tensor(EX_DROPOUT, got, tuple(x.shape), what=f"your output for p={p}")
        zeroed = (got == 0).double().mean().item()
        survivors = got[got != 0]
        rescaled = survivors.numel() and torch.allclose(
            survivors, torch.tensor(2.0 / (1 - p)).double()
        )
        if abs(zeroed - p) < 0.03 and rescaled:
            continue
        core.fail_with(
            EX_DROPOUT,
            DROPOUT_MISTAKES[:-2],
            lambda m: _same_statistics(got, core.seeded_call(m.fn, x.clone(), p, True)),
            f"for p={p} your dropout zeroes {zeroed:.4f} of the numbers (expected about {p}) and the survivors of 2.0 are not all 2.0 / (1 - p) = {2.0 / (1 - p):.4f}",
        )
    x = torch.randn(8, 16)
    got = core.seeded_call(core.call_learner, EX_DROPOUT, dropout, x, 0.5, False)
    if not isinstance(got, torch.Tensor) or not torch.equal(got, x):
        raise core.CheckFailed(EX_DROPOUT, core.named(DROPOUT_MISTAKES, "active_in_eval").message)
    core.passed(
        EX_DROPOUT, "a fraction p zeroed, the survivors divided by 1 - p, nothing outside training"
    )


def _measure(drop, x, *, mistake=""):
    """(fraction zeroed in train mode, factor of the survivors, eval leaves x unchanged);
    `mistake` plants one of MEASURE_DROPOUT_MISTAKES by its name."""
    y = (drop.eval() if mistake == "measured_in_eval" else drop.train())(x)
    kept = y != 0
    survived = kept.double().mean().item()
    fraction = survived if mistake == "counted_survivors" else 1 - survived
    times = {"factor_with_zeros": y / x, "survivor_values": y[kept]}.get(mistake, y[kept] / x[kept])
    after = (drop.train() if mistake == "eval_in_train_mode" else drop.eval())(x)
    return fraction, times.mean().item(), torch.equal(after, x)


MEASURE_DROPOUT_MISTAKES = core.variants(
    _measure,
    {
        "measured_in_eval": "nothing was zeroed in your train-mode measurement: the module was in eval() mode; switch it with drop.train() before the first call",
        "counted_survivors": "your fraction is the share of numbers that SURVIVED (about 1 - p); measure the share that train mode set to zero",
        "factor_with_zeros": "your factor averages y / x over every number, zeros included (that gives about 1: dropout keeps the mean); average over the survivors only",
        "survivor_values": "your factor is the survivors' values, not what they were multiplied by: divide each survivor by the number of x it came from",
        "eval_in_train_mode": "your eval-mode answer is False: the second call ran in train() mode; switch the module with drop.eval() first",
    },
)


def check_measure_dropout(measure_dropout) -> None:
    """`measure_dropout(drop, x)` -> (fraction zeroed in train mode, factor of the survivors, eval
    leaves x unchanged), on nn.Dropout for p = 0.1 and 0.5 and inputs that are not all ones."""
    gen = torch.Generator().manual_seed(2)
    for p in (0.1, 0.5):
        x = torch.rand(64, 256, generator=gen) + 0.5  # no zeros, not all equal
        got = core.seeded_call(
            core.call_learner, EX_MEASURE_DROPOUT, measure_dropout, nn.Dropout(p), x.clone()
        )
        what = "three things: (fraction zeroed, factor of the survivors, eval unchanged)"
        core.unpack(EX_MEASURE_DROPOUT, got, 3, what)
        if any(isinstance(value, torch.Tensor) for value in got):
            raise core.CheckFailed(
                EX_MEASURE_DROPOUT, "you return tensors: make the numbers floats with .item()"
            )
        try:
            fraction, factor, unchanged = float(got[0]), float(got[1]), bool(got[2])
        except (TypeError, ValueError, RuntimeError):
            raise core.CheckFailed(
                EX_MEASURE_DROPOUT, "return two numbers and a bool (use .item() on tensors)"
            ) from None

        def matches(values):
            f, t, u = values
            return (
                abs(fraction - f) < 0.03
                and abs(factor - t) < 1e-3 * max(1.0, abs(t))
                and unchanged == u
            )

        if matches((p, 1 / (1 - p), True)):
            continue
        core.fail_with(
            EX_MEASURE_DROPOUT,
            MEASURE_DROPOUT_MISTAKES,
            lambda m: matches(core.seeded_call(m.fn, nn.Dropout(p), x.clone())),
            f"for nn.Dropout({p}) you measured {fraction:.4f} zeroed, a factor {factor:.4f} and eval unchanged {unchanged}; expected about {p}, {1 / (1 - p):.4f} and True",
        )
    core.passed(
        EX_MEASURE_DROPOUT,
        "fraction zeroed, the survivors' factor and eval mode, for p = 0.1 and 0.5",
    )


# --------------------------------------------------------------------------- Exercise 2.5


def _pos(m, start, n):
    """The position embeddings of n places from `start`: (n, C)."""
    return m.wpe(torch.arange(start, start + n))


def _embed(m, idx, past, *, mistake=""):
    """What GPT2Embeddings m gives for idx (B, T) after `past` tokens; `mistake` plants one of
    EMBEDDINGS_MISTAKES by its name."""
    B, T = idx.shape
    tok = 0 if mistake == "only_position_embeddings" else m.wte(idx)
    start = past + 1 if mistake == "positions_start_at_past_plus_one" else past
    start = {"ignored_past_length": 0, "past_length_added_twice": 2 * past}.get(mistake, start)
    if mistake == "token_ids_as_positions":
        pos = m.wpe(idx)
    elif mistake == "batch_index_as_position":
        pos = _pos(m, past, B)[:, None, :]
    else:
        pos = 0 if mistake == "no_position_embeddings" else _pos(m, start, T)
    if mistake == "only_position_embeddings":
        pos = pos.expand(B, T, -1)
    if mistake == "no_dropout":
        return tok + pos
    if mistake == "dropout_on_tokens_only":
        return m.drop(tok) + pos
    return F.dropout(tok + pos, m.drop.p) if mistake == "dropout_in_eval" else m.drop(tok + pos)


# fn(reference module in the same mode as the learner's, idx (B, T), past_length) -> wrong output
EMBEDDINGS_MISTAKES = core.variants(
    _embed,
    {
        "positions_start_at_past_plus_one": "your positions start at past_length + 1; the first new token sits at position past_length (0 with no cache): positions past_length .. past_length + T - 1",
        "ignored_past_length": "you ignored past_length: after past_length earlier tokens, the new tokens sit at positions past_length, past_length + 1, ..., not 0, 1, ...",
        "past_length_added_twice": "you added past_length twice: torch.arange(past_length, past_length + T) already starts at past_length",
        "token_ids_as_positions": "you looked up the token ids in the position table; wpe is indexed by where a token sits (past_length, past_length + 1, ...), not by which token it is",
        "no_position_embeddings": "there are no position embeddings in your output: add wpe at the tokens' positions",
        "batch_index_as_position": "you used the batch index as the position; the position is the index along T (dim 1), the same for every sequence in the batch",
        "only_position_embeddings": "your output holds only the position embeddings; add the token embeddings too",
        "no_dropout": "in train() mode your output has no dropout: apply self.drop to the sum of the embeddings (it zeroes a fraction embd_pdrop in training and does nothing after .eval())",
        "dropout_on_tokens_only": "your dropout is applied to the token embeddings only; GPT-2 applies it to the SUM of token and position embeddings: self.drop(tok + pos)",
        "dropout_in_eval": "your dropout is active in eval() mode too. F.dropout(x, p) defaults to training=True: use self.drop (an nn.Dropout follows train()/eval()), or F.dropout(x, p, training=self.training)",
    },
)


def _call_embeddings(module, idx, past=None):
    """The learner's module.forward(idx[, past_length=past]) (forward: its signature is the
    learner's), with its usual errors named."""
    kwargs = {} if past is None else {"past_length": past}
    label = "your forward" + (f" with past_length={past}" if past else "")
    try:
        return core.seeded_call(core.call_learner, EX_MODULE, module.forward, idx, **kwargs)
    except RuntimeError as exc:
        if "must match the size" in str(exc):
            raise core.CheckFailed(
                EX_MODULE,
                f"for idx of shape (B, T) = {tuple(idx.shape)} {label} fails ({exc}). You need one position per token of a sequence: T = idx.shape[1] positions (idx.shape[0] is the batch size B).",
            ) from None
        if "view size is not compatible" in str(exc):
            raise core.CheckFailed(
                EX_MODULE,
                f"{label} fails ({exc}): idx[:, 4:] is not contiguous, so .view refuses it; use .reshape, or index without reshaping",
            ) from None
        raise


def check_gpt2_embeddings(embeddings_cls, position_ids=None) -> None:
    """`position_ids(length, past_length)` (integer positions), then `embeddings_cls(config)` with
    wte, wpe and drop; `forward(idx, past_length=0)` -> (B, T, C), checked in eval mode (values,
    positions after a cache) and in train mode (dropout)."""
    for length, past in [(5, 0), (3, 4), (1, 9)] if position_ids is not None else []:
        got = core.call_learner(EX_MODULE, position_ids, length, past)
        if isinstance(got, torch.Tensor) and got.is_floating_point():
            raise core.CheckFailed(
                EX_MODULE,
                f"position_ids gives {got.dtype} numbers: positions index a table, so they must be integers (torch.arange of ints, or .long())",
            )
        got = core.expect_tensor(EX_MODULE, got, (length,), what=f"position_ids({length}, {past})")
        want = torch.arange(past, past + length)
        if not torch.equal(got.long(), want):
            raise core.CheckFailed(
                EX_MODULE,
                f"position_ids({length}, past_length={past}) gave {got.tolist()}, expected {want.tolist()}",
            )
    with torch.random.fork_rng():  # building modules draws random numbers: leave the notebook's
        _check_gpt2_embeddings(embeddings_cls)


def _check_gpt2_embeddings(embeddings_cls) -> None:
    from gpt2lib.chapters.embeddings import GPT2Embeddings

    V, P, C, p = 11, 16, 6, 0.5  # P > V, so a wrong wpe(idx) still runs
    config = core.tiny_config(vocab_size=V, n_positions=P, n_embd=C, pdrop=p)
    module = core.call_learner(EX_MODULE, embeddings_cls, config)
    if not isinstance(module, nn.Module):
        raise core.CheckFailed(
            EX_MODULE,
            f"calling it with a config should build an nn.Module, got {type(module).__name__}",
        )
    ref, gen = GPT2Embeddings(config), torch.Generator().manual_seed(0)
    for name, shape in (("wte", (V, C)), ("wpe", (P, C))):  # the same random tables in both
        weight = getattr(getattr(module, name, None), "weight", None)
        if not isinstance(weight, torch.Tensor) or tuple(weight.shape) != shape:
            raise core.CheckFailed(
                EX_MODULE,
                f"self.{name} should be an nn.Embedding with a weight of shape {shape}: nn.Embedding(config.vocab_size, config.n_embd) and nn.Embedding(config.n_positions, config.n_embd)",
            )
        with torch.no_grad():
            weight.copy_(getattr(ref, name).weight.copy_(torch.randn(shape, generator=gen)))

    idx = torch.tensor([[3, 0, 10, 7, 7], [1, 9, 2, 4, 8]])  # (B=2, T=5): T != B on purpose
    B, T = idx.shape
    module.eval(), ref.eval()
    hints = {
        (B, T, 2 * C): "twice as wide: token and position embeddings are added, not concatenated"
    }
    # the keyword first (so a missing past_length parameter is named), the default, an offset
    for past in (0, None, 4):
        label = "your forward" + (f" with past_length={past}" if past else "")
        got = core.expect_tensor(
            EX_MODULE,
            _call_embeddings(module, idx, past),
            (B, T, C),
            what=f"the output of {label}",
            hints=hints,
        )
        otherwise = f"in eval() mode, {label} has the right shape but wrong values: out[b, t] must be wte(idx[b, t]) + wpe(past_length + t), then dropout"
        args = (ref, idx, past or 0)
        core.fail_unless_close(
            EX_MODULE, got, core.seeded_call(*args), EMBEDDINGS_MISTAKES, args, otherwise
        )

    # a sequence in two pieces, the second after a cache of 4, gives the vectors of the whole
    pieces = [_call_embeddings(module, idx[:, :4]), _call_embeddings(module, idx[:, 4:], 4)]
    pieces = [
        core.expect_tensor(EX_MODULE, piece, (B, n, C), what="the output for a piece")
        for piece, n in zip(pieces, (4, T - 4))
    ]
    if not core.close(torch.cat(pieces, dim=1), _call_embeddings(module, idx)):
        raise core.CheckFailed(
            EX_MODULE,
            "the sequence fed in two pieces (the second with past_length=4) does not give the vectors of the whole sequence at once",
        )

    # train mode: dropout on the sum, scaled by 1 / (1 - p); a longer batch for a fair count
    module.train()
    idx = torch.randint(0, V, (4, 8), generator=gen)
    got = core.expect_tensor(
        EX_MODULE, _call_embeddings(module, idx, 2), (4, 8, C), what="the output in train() mode"
    )
    if not core.dropout_of(got, core.seeded_call(ref, idx, 2), p):  # ref in eval: no dropout
        otherwise = "in train() mode, your forward has the right shape but wrong values: out[b, t] must be wte(idx[b, t]) + wpe(past_length + t), then dropout"
        ref.train()
        args = (ref, idx, 2)
        core.fail_unless_close(
            EX_MODULE, got, core.seeded_call(*args), EMBEDDINGS_MISTAKES, args, otherwise
        )
    core.passed(
        EX_MODULE, "token + position embeddings, positions after a cache, dropout in training only"
    )


# --------------------------------------------------------------------------- Exercise 2.6


def _pieces(embeddings, idx, n, *, mistake=""):
    """embeddings(idx) computed in pieces of n tokens; `mistake` plants one of PIECES_MISTAKES by
    its name."""
    if mistake == "last_piece_dropped":
        if idx.shape[1] % n == 0:
            return None
        idx = idx[:, : idx.shape[1] // n * n]
    out = []
    for start in range(0, idx.shape[1], n):
        wrong = {"counted_pieces": len(out), "off_by_one": start + 1, "no_past_length": 0}
        past = start + n - 1 if mistake == "end_of_piece" else wrong.get(mistake, start)
        out.append(embeddings(idx[:, start : start + n], past_length=past))
    return torch.cat(out, dim=1)


PIECES_MISTAKES = core.variants(
    _pieces,
    {
        "counted_pieces": "you passed the number of pieces so far as past_length; it is the number of TOKENS before the piece, `start`",
        "off_by_one": "your past_length is one too many: the piece starting at token `start` has exactly `start` tokens before it",
        "no_past_length": "every piece starts again at position 0: pass past_length=start, the tokens before the piece",
        "end_of_piece": "you passed the position of the piece's end; past_length is where it starts (the tokens before it)",
        "last_piece_dropped": "the last, shorter piece is missing: range(0, T, piece_length) already reaches it; keep it",
    },
)


def check_embed_in_pieces(embed_in_pieces) -> None:
    """embed_in_pieces(embeddings, idx, piece_length) equals embeddings(idx), for piece lengths
    that divide T and one that does not, on a batch of two sequences."""
    embeddings = core.seeded_call(_tiny_embeddings)
    idx = torch.randint(0, 13, (2, 11), generator=torch.Generator().manual_seed(1))
    whole = core.seeded_call(embeddings, idx)
    for n in (4, 1, 11, 3):
        got = core.seeded_call(core.call_learner, EX_PIECES, embed_in_pieces, embeddings, idx, n)
        got = core.expect_tensor(EX_PIECES, got, what=f"your output for piece_length={n}")
        if tuple(got.shape) == tuple(whole.shape):
            otherwise = f"for piece_length={n} the pieces do not give the vectors of the whole sequence at once"
        else:
            otherwise = f"for piece_length={n} your output has shape {tuple(got.shape)}, expected {tuple(whole.shape)}: join the pieces along dim 1"
        core.fail_unless_close(
            EX_PIECES, got, whole, PIECES_MISTAKES, (embeddings, idx, n), otherwise
        )
    core.passed(
        EX_PIECES, "the pieces give the whole sequence's vectors, for every piece length tried"
    )


def _tiny_embeddings():
    from gpt2lib.chapters.embeddings import GPT2Embeddings

    torch.manual_seed(0)
    return GPT2Embeddings(core.tiny_config(vocab_size=13, n_embd=6)).eval()


# --------------------------------------------------------------------------- Challenge

TABLE_GOALS = dict(max_cosine=0.999, min_gap=0.3, gap_distance=64)


def position_table_scores(table: torch.Tensor) -> dict:
    """What the challenge measures on a (P, C) table: the largest cosine between two different
    rows, and the mean cosine of neighbours (p, p + 1) minus that of rows 64 apart."""
    unit = _unit_rows(table.detach().double())
    cosine = unit @ unit.T  # (P, P)
    off = cosine - 2 * torch.eye(len(cosine), dtype=cosine.dtype)  # the diagonal out of the max
    d = TABLE_GOALS["gap_distance"]
    near = (unit[1:] * unit[:-1]).sum(-1).mean().item()
    far = (unit[d:] * unit[:-d]).sum(-1).mean().item()
    return {"max_cosine": off.max().item(), "near": near, "far": far, "gap": near - far}


def check_position_table(table) -> dict:
    """The challenge: a (1024, 768) position table with distinct rows whose neighbours are more
    alike than rows 64 apart, by at least 0.3 in mean cosine. Returns the scores."""
    table = core.expect_tensor(CHALLENGE_TABLE, table, (1024, 768), what="your table")
    if bool((table.abs().sum(dim=1) == 0).any()):
        raise core.CheckFailed(
            CHALLENGE_TABLE,
            "a row of your table is all zeros: it has no direction, so its position cannot be told apart by angle",
        )
    s = position_table_scores(table)
    if s["max_cosine"] >= TABLE_GOALS["max_cosine"]:
        raise core.CheckFailed(
            CHALLENGE_TABLE,
            f"two different positions have cosine {s['max_cosine']:.4f} >= {TABLE_GOALS['max_cosine']}: the model could not tell them apart",
        )
    if s["gap"] < TABLE_GOALS["min_gap"]:
        raise core.CheckFailed(
            CHALLENGE_TABLE,
            f"neighbours have mean cosine {s['near']:.4f}, positions 64 apart {s['far']:.4f}: a gap of {s['gap']:.4f}, the goal is {TABLE_GOALS['min_gap']}. Make nearby rows point the same way",
        )
    core.passed(
        CHALLENGE_TABLE,
        f"largest cosine {s['max_cosine']:.4f}, neighbours {s['near']:.4f}, 64 apart {s['far']:.4f}, gap {s['gap']:.4f}",
    )
    return s


MISTAKES_BY_CHECK = {
    check_cosine_matrix: COSINE_MISTAKES,
    check_embed_in_pieces: PIECES_MISTAKES,
    check_dropout: DROPOUT_MISTAKES,
    check_measure_dropout: MEASURE_DROPOUT_MISTAKES,
}
