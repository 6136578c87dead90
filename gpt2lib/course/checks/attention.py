"""Checks for chapter 3's exercises: one head with loops and with matrices, the softmax's
saturation, a previous-token head, multi-head attention, GPT-2's attention module (with
split_heads and merge_heads), the module by hand, its FLOPs, and the copy-two-back challenge."""

from __future__ import annotations

import contextlib
import math
import numbers

import torch
import torch.nn as nn
import torch.nn.functional as F

from gpt2lib.course.checks import _core as core

EX_LOOPS = "Exercise 3.1 (attention_with_loops)"
EX_MATRICES = "Exercise 3.2 (causal_attention)"
EX_SATURATION = "Exercise 3.3 (saturation)"
EX_PREVIOUS = "Exercise 3.4 (previous_token_head)"
EX_MULTI = "Exercise 3.5 (multi_head_attention)"
EX_MODULE = "Exercise 3.6 (CausalSelfAttention)"
EX_BY_HAND = "Exercise 3.7 (attention_by_hand)"
EX_COST = "Exercise 3.8 (attention_cost)"
CH_COPY = "Challenge (copy_two_back_head)"

_CHANGED = (
    "your function changed its input tensors in place (masked_fill_, +=, ...): compute new ones"
)


# --------------------------------------------------------------------------- shared pieces
def _call(exercise, fn, *args, **kwargs):
    """core.call_learner, with `.view` on a tensor that is not contiguous explained."""
    return core.call_explaining(exercise, fn, *args, explain=_NOT_CONTIGUOUS, **kwargs)


_NOT_CONTIGUOUS = {
    "view size is not compatible": "`.view` failed: after a transpose (and for slices of a bigger tensor, as in the model) the tensor is not contiguous in memory. Use `.reshape(...)`, or `.contiguous().view(...)`"
}


def _no_nan(exercise: str, got, what: str) -> None:
    if isinstance(got, torch.Tensor) and got.is_floating_point() and bool(torch.isnan(got).any()):
        raise core.CheckFailed(
            exercise,
            f"{what} contains NaN: some row of scores is entirely -inf, so the softmax divides 0 by 0. Each token must see at least itself: keep the diagonal visible (hide only j > i: torch.triu(..., diagonal=1))",
        )


def split(x: torch.Tensor, n_head: int, *, mistake: str = "") -> torch.Tensor:
    """(B, T, C) -> (B, nh, T, hd); `mistake` plants one of SPLIT_MISTAKES (or of the multi-head
    ones) by its name."""
    B, T, C = x.shape
    if mistake == "split_without_transpose":
        return x.reshape(B, n_head, T, C // n_head)
    if mistake == "split_interleaved":
        return x.reshape(B, T, C // n_head, n_head).permute(0, 3, 1, 2)
    swapped = 3 if "transpose_1_3" in mistake else 2  # split_transpose_1_3, and the multi-head one
    return x.reshape(B, T, n_head, C // n_head).transpose(1, swapped)


def merge(y: torch.Tensor, *, mistake: str = "") -> torch.Tensor:
    """(B, nh, T, hd) -> (B, T, C); `mistake` plants one of MERGE_MISTAKES (or of the multi-head
    ones) by its name."""
    if mistake == "merge_without_transpose":
        B, nh, T, hd = y.shape
        return y.reshape(B, T, nh * hd)
    dims = {"merge_interleaved": (0, 2, 3, 1), "transpose_1_3": (0, 3, 2, 1)}.get(mistake)
    return y.permute(dims or (0, 2, 1, 3)).flatten(2)


def attend(q, k, v, *, scale=None, mistake=""):
    """Attention over the last two dims of (..., T, d) tensors: (output, weights). scale: what the
    scores are multiplied by (default 1/sqrt(d)); `mistake` plants a wrong product, mask or
    softmax by its name in the tables below (no_mask, mask_off_by_one, ...)."""
    T, S = q.shape[-2], k.shape[-2]
    keys_first = mistake == "keys_times_queries"
    scores = (k @ q.transpose(-2, -1)) if keys_first else (q @ k.transpose(-2, -1))  # (..., T, S)
    scores = scores * (1 / math.sqrt(q.shape[-1]) if scale is None else scale)
    ones = torch.ones(T, S, dtype=torch.bool)
    visible = ones.tril(diagonal=S - T)  # (T, S)
    if mistake == "mask_with_zero":
        scores = scores.masked_fill(~visible, 0.0)
    elif mistake not in ("no_mask", "mask_after_softmax"):
        hidden = {"mask_off_by_one": ~ones.tril(S - T + 1), "anti_causal_mask": ~ones.triu(S - T)}
        scores = scores.masked_fill(hidden.get(mistake, ~visible), float("-inf"))
    weights = scores.softmax(dim=-2 if mistake == "softmax_over_queries" else -1)
    if mistake == "mask_after_softmax":
        weights = weights.masked_fill(~visible, 0.0)
    return weights @ v, weights


class ListCache:
    """The smallest layer cache that follows chapter 9's protocol: `update(k, v)` returns every
    key and value so far and which keys each new query may see (None while it held nothing)."""

    def __init__(self):
        self.k = self.v = None

    @property
    def position(self) -> int:
        return 0 if self.k is None else self.k.shape[2]

    def update(self, k, v):
        past, T = self.position, k.shape[2]
        self.k = k if self.k is None else torch.cat([self.k, k], dim=2)
        self.v = v if self.v is None else torch.cat([self.v, v], dim=2)
        visible = (
            torch.arange(past + T)[None, :] <= past + torch.arange(T)[:, None]
        )  # j <= past + i
        return self.k, self.v, None if past == 0 else visible


# --------------------------------------------------------------------------- Exercises 3.1, 3.2
OVERFLOW = "your softmax overflows on large scores: math.exp of a score above about 709 is too large for a float. Subtract the row's largest score from every score before exp: the weights stay the same, and every exp is at most 1"


def _one_head(q, k, v, *, mistake=""):
    """Causal attention of one head, (out, weights); `mistake` plants one of ONE_HEAD_MISTAKES by
    its name (softmax_overflows: a loops answer taking exp of the raw scores, which overflows)."""
    if mistake != "softmax_overflows":
        scale = {"no_scale": 1.0, "divide_by_d": 1 / q.shape[-1]}.get(mistake)
        return attend(q, k, v, scale=scale, mistake=mistake)
    T, d = q.shape
    out, weights = torch.zeros(T, v.shape[1]), torch.zeros(T, T)
    for i in range(T):
        exps = [math.exp(float(q[i] @ k[j]) / math.sqrt(d)) for j in range(i + 1)]
        for j in range(i + 1):
            weights[i, j] = exps[j] / sum(exps)
            out[i] += weights[i, j] * v[j]
    return out, weights


# fn(q, k, v) -> (out, weights), for Exercise 3.1 and Exercise 3.2 alike
ONE_HEAD_MISTAKES = core.variants(
    _one_head,
    {
        "no_scale": "your scores are not divided by sqrt(d): divide q[i] . k[j] by math.sqrt(d)",
        "divide_by_d": "you divided the scores by d; divide by sqrt(d)",
        "no_mask": "your output matches attention WITHOUT the causal mask: token i also reads the tokens after it. Only j <= i may be read",
        "mask_off_by_one": "your mask is off by one: each token also sees the NEXT token. Only keys j <= i may be read",
        "mask_with_zero": "you set the masked scores to 0, but exp(0) = 1 still gives the future a weight; set them to -inf (float('-inf'))",
        "mask_after_softmax": "you zeroed the future weights AFTER the softmax, so each row no longer sums to 1; mask the scores with -inf BEFORE the softmax",
        "softmax_over_queries": "your softmax runs over the wrong dimension (over the queries, dim=-2); each query's weights over the keys must sum to 1: softmax(dim=-1)",
        "keys_times_queries": "you computed k @ q^T, the scores transposed; row i of the scores must be query i against every key",
        "softmax_overflows": OVERFLOW,
    },
)


def _check_one_head(exercise, fn, cases, large_case, detail):
    """Run fn(q, k, v) -> (out, weights) on each (leading shape, T, d) case, then on large scores."""
    for large, group in ((False, cases), (True, [large_case])):
        gen = torch.Generator().manual_seed(1)
        tol = dict(atol=1e-3, rtol=1e-3) if large else dict(atol=1e-4, rtol=1e-4)  # near 750
        for lead, T, d in group:
            q, k, v = (torch.randn(*lead, T, d, generator=gen) for _ in range(3))
            if large:  # every score 750 more (a shared first feature): exp overflows without max
                q[..., 0], k[..., 0] = 750 * math.sqrt(d), 1.0
            kept = [t.clone() for t in (q, k, v)]
            try:
                got = core.call_learner(exercise, fn, q, k, v)
            except OverflowError:
                raise core.CheckFailed(exercise, OVERFLOW) from None
            core.require(exercise, all(map(torch.equal, (q, k, v), kept)), _CHANGED)
            out, weights = core.unpack(exercise, got, 2, "two tensors, (out, weights)")
            for value in (out, weights):
                if large and isinstance(value, torch.Tensor) and value.is_floating_point():
                    core.require(exercise, bool(torch.isfinite(value).all()), OVERFLOW)
                _no_nan(exercise, value, "your result")
            what = f"(q, k, v of shape {(*lead, T, d)})"
            out = core.expect_tensor(exercise, out, (*lead, T, d), what=f"your out {what}")
            what_w = f"your weights {what}"
            weights = core.expect_tensor(exercise, weights, (*lead, T, T), what=what_w)
            q, k, v = q.double(), k.double(), v.double()
            want_out, want_w = attend(q, k, v)
            if core.close(out, want_out, **tol) and not core.close(weights, want_w, **tol):
                raise core.CheckFailed(
                    exercise,
                    "out is right, but the weights you return are not the softmax weights that made it (row i: token i's weights over keys 0..i, zeros after)",
                )
            otherwise = f"your out differs from causal attention {what}: weights = softmax over j <= i of q[i] . k[j] / sqrt(d), out[i] = sum of weights[i, j] * v[j]"
            mistakes = ONE_HEAD_MISTAKES[:-1]  # the overflow is caught on large scores, above
            args = (q, k, v)
            core.fail_unless_close(
                exercise, out, want_out, mistakes, args, otherwise, part=0, **tol
            )
    core.passed(exercise, detail)


def check_attention_with_loops(attention_with_loops) -> None:
    """`attention_with_loops(q, k, v)`, (T, d) each -> (out (T, d), weights (T, T)): causal attention
    of one head, also on scores near 750."""
    detail = "scores scaled by 1/sqrt(d), only j <= i, a softmax that survives large scores"
    _check_one_head(EX_LOOPS, attention_with_loops, [((), 4, 3), ((), 6, 5)], ((), 5, 4), detail)


def check_causal_attention(causal_attention) -> None:
    """`causal_attention(q, k, v)`, (..., T, d) each -> (out (..., T, d), weights (..., T, T))."""
    cases = [((), 4, 3), ((2,), 5, 4), ((2, 3), 6, 8)]
    detail = "any batch dimensions, scaled scores, -inf above the diagonal, softmax over the keys"
    _check_one_head(EX_MATRICES, causal_attention, cases, ((2,), 5, 4), detail)


# --------------------------------------------------------------------------- Exercise 3.3
def _saturation(dim, scaled, trials=128, T=16, *, mistake=""):
    """(variance of the scores, average largest weight); `mistake` plants one of
    SATURATION_MISTAKES by its name."""
    qs, ks = torch.randn(trials, T, dim), torch.randn(trials, T, dim)
    scores = qs @ ks.transpose(-2, -1)
    if scaled and mistake != "scaling_ignored":
        scores = scores * (1 / dim if mistake == "scaled_by_d" else 1 / math.sqrt(dim))
    chosen = scores.softmax(dim=-2 if mistake == "softmax_over_queries" else -1)
    if mistake == "largest_score_not_weight":
        chosen = scores
    return scores.var().item(), chosen.max(dim=-1).values.mean().item()


SATURATION_MISTAKES = core.variants(
    _saturation,
    {
        "scaled_by_d": "with scaled=True you divided the scores by dim; divide by sqrt(dim) (the variance of the scaled scores should come out near 1)",
        "largest_score_not_weight": "your second number is the largest SCORE; it should be the largest softmax WEIGHT of a row (softmax over the keys, then max)",
        "softmax_over_queries": "your softmax runs over the queries (dim=-2); each query's row of weights over the keys sums to 1: softmax(dim=-1)",
        "scaling_ignored": "your numbers do not change with `scaled`: divide the scores by sqrt(dim) when scaled is true",
    },
)


def _near(got, want) -> bool:
    """Each number within 15% (plus 0.03) of the one wanted: random draws differ."""
    return all(abs(g - w) <= 0.15 * abs(w) + 0.03 for g, w in zip(got, want))


def check_saturation(saturation) -> None:
    """`saturation(dim, scaled)` -> (variance of the scores, average largest softmax weight), for
    random queries and keys; compared with the course's numbers within a tolerance."""
    for dim in (4, 64, 256):
        for scaled in (False, True):
            got = core.seeded_call(core.call_learner, EX_SATURATION, saturation, dim, scaled)
            got = core.unpack(EX_SATURATION, got, 2, "two numbers, (variance, largest weight)")
            try:
                var, top = (float(g) for g in got)
            except (TypeError, ValueError):
                raise core.CheckFailed(
                    EX_SATURATION, "return two numbers (Python floats, `.item()`)"
                ) from None
            want_var, want_top = core.seeded_call(_saturation, dim, scaled, trials=512)
            if _near((var, top), (want_var, want_top)):
                continue
            core.fail_with(
                EX_SATURATION,
                SATURATION_MISTAKES,
                lambda m: _near((var, top), core.seeded_call(m.fn, dim, scaled)),
                f"for dim={dim}, scaled={scaled} you give variance {var:.4f} and largest weight {top:.4f}; expected about {want_var:.4f} and {want_top:.4f}",
            )
    core.passed(EX_SATURATION, "variances and largest weights as expected")


# --------------------------------------------------------------------------- Exercise 3.4
_BIG = 10.0  # a score gap of 10 after the scaling: e^10 outweighs thousands of other tokens


def previous_token_head_reference(T: int, *, mistake: str = ""):
    """(w_q, w_k), (T, T) each: query i matches key i - 1 with a score gap of 10 after 1/sqrt(T);
    `mistake` plants one of PREVIOUS_TOKEN_MISTAKES by its name."""
    offset = {"reads_itself": 0, "reads_the_future": 1}.get(mistake, -1)
    w_q = torch.diag(torch.ones(T - abs(offset)), diagonal=offset)  # w_q[i, i + offset]
    if mistake == "reads_the_first_token":
        w_q = torch.zeros(T, T).index_fill_(1, torch.tensor([0]), 1.0)
    return (w_q if mistake == "not_peaked" else _BIG * math.sqrt(T) * w_q), torch.eye(T)


# fn(T) -> a wrong (w_q, w_k); the check names them by what the head does, not by the numbers
PREVIOUS_TOKEN_MISTAKES = core.variants(
    previous_token_head_reference,
    {
        "reads_itself": "every token puts its largest weight on ITSELF: query i matches key i. Shift by one, so that row i of w_q lines up with row i - 1 of w_k",
        "reads_the_future": "query i matches key i + 1, a FUTURE token that the causal mask hides, so the weights are spread over the past. Shift the other way: i - 1",
        "not_peaked": "each token's largest weight is on the previous token, but it is below 0.9: the scores are too close together for the softmax. Scale w_q (or w_k) up; remember the scores are divided by sqrt(T), and the gap must beat up to T - 1 other tokens",
        "reads_the_first_token": "every token puts its largest weight on token 0, the first one: query i must match key i - 1, which moves with i",
    },
)


def _previous_token_behaviour(scores, weights) -> str | None:
    """Which planted mistake the head behaves like (None: none of them)."""
    T = weights.shape[0]
    rows = list(range(2, T))  # queries with a real choice (query 1 sees only 0 and 1)
    best = [int(weights[i, : i + 1].argmax()) for i in rows]
    previous = [i - 1 for i in rows]
    if best != previous and all(int(scores[i].argmax()) == i + 1 for i in range(1, T - 1)):
        return "reads_the_future"
    behaviours = {
        tuple(rows): "reads_itself",
        tuple(previous): "not_peaked",
        (0,) * len(rows): "reads_the_first_token",
    }
    return behaviours.get(tuple(best))


def check_previous_token_head(previous_token_head) -> None:
    """`previous_token_head(T)` -> (w_q, w_k), (T, T) each: every token i >= 1 puts >= 0.9 of its
    causal attention weight on token i - 1, with one-hot positions as the input."""
    for T in (4, 7, 12):
        got = core.call_learner(EX_PREVIOUS, previous_token_head, T)
        got = core.unpack(EX_PREVIOUS, got, 2, "two matrices, (w_q, w_k)")
        w_q, w_k = (
            core.expect_tensor(EX_PREVIOUS, m, (T, T), what=f"{name} for T={T}")
            for m, name in zip(got, ("w_q", "w_k"))
        )
        x = torch.eye(T, dtype=torch.float64)  # one-hot positions; scores: before the mask
        weights = attend(x @ w_q, x @ w_k, x, scale=1 / math.sqrt(T))[1]
        scores = (x @ w_q) @ (x @ w_k).T / math.sqrt(T)
        if not bool(torch.isfinite(weights).all()):
            raise core.CheckFailed(
                EX_PREVIOUS,
                f"for T={T} the softmax gives NaN: the scores are too large (or infinite); a gap of about 10 after the scaling is plenty",
            )
        on_previous = weights.diagonal(offset=-1)  # weights[i, i - 1] for i >= 1
        if bool((on_previous >= 0.9).all()):
            continue
        if behaviour := _previous_token_behaviour(scores, weights):
            message = core.named(PREVIOUS_TOKEN_MISTAKES, behaviour).message
            raise core.CheckFailed(EX_PREVIOUS, f"for T={T}: {message}")
        worst = int(on_previous.argmin()) + 1
        raise core.CheckFailed(
            EX_PREVIOUS,
            f"for T={T}, token {worst} puts only {on_previous[worst - 1].item():.4f} of its weight on token {worst - 1} (its largest is on token {int(weights[worst, : worst + 1].argmax())}); row i of w_q dotted with row j of w_k must be large only for j = i - 1",
        )
    core.passed(EX_PREVIOUS, "every token reads the token before it")


# --------------------------------------------------------------------------- Exercise 3.5
TRANSPOSE_1_3 = "you used transpose(1, 3) where transpose(1, 2) belongs: from (B, T, nh, hd) only the T and nh dims swap, giving (B, nh, T, hd); transpose(1, 3) gives (B, hd, nh, T)"
NO_HEADS = "you ran ONE head over all C features: split q, k and v into n_head heads of hd = C // n_head features each, (B, T, C) -> (B, nh, T, hd), before the attention"


def _heads(q, k, v, n_head, *, mistake=""):
    """Multi-head attention from the pieces: (y (B, T, C), weights (B, nh, T, T)); `mistake`
    plants one of MULTI_HEAD_MISTAKES by its name."""
    if mistake == "no_heads":
        return attend(q, k, v)
    C = q.shape[-1]
    hd = C // n_head
    scales = {"no_scale": 1.0, "scale_by_sqrt_C": 1 / math.sqrt(C), "divide_by_hd": 1 / hd}
    scales.update(multiply_by_sqrt_hd=math.sqrt(hd), transpose_1_3=1 / math.sqrt(hd))
    heads = (split(t, n_head, mistake=mistake) for t in (q, k, v))
    y, weights = attend(*heads, scale=scales.get(mistake), mistake=mistake)
    return merge(y, mistake=mistake), weights


# fn(q, k, v, n_head) -> (y, weights) of that wrong answer
MULTI_HEAD_MISTAKES = core.variants(
    _heads,
    {
        "no_mask": "your output matches attention WITHOUT the causal mask: future tokens leak in. Set the scores above the diagonal to -inf before the softmax",
        "no_scale": "your scores are not divided by sqrt(hd): divide each head's q @ k^T by math.sqrt(hd), hd = C // n_head",
        "scale_by_sqrt_C": "you divided the scores by sqrt(C); each head's scores are divided by sqrt(hd), the size of ONE head's q and k (hd = C // n_head)",
        "divide_by_hd": "you divided the scores by hd; divide by sqrt(hd) (math.sqrt(hd))",
        "multiply_by_sqrt_hd": "you multiplied the scores by sqrt(hd); divide by it instead",
        "softmax_over_queries": core.named(ONE_HEAD_MISTAKES, "softmax_over_queries").message,
        "mask_after_softmax": core.named(ONE_HEAD_MISTAKES, "mask_after_softmax").message,
        "mask_with_zero": core.named(ONE_HEAD_MISTAKES, "mask_with_zero").message,
        "mask_off_by_one": "your mask is off by one: each token also sees the NEXT token. Hide every key j > i (torch.triu(..., diagonal=1)); only j <= i stays visible",
        "anti_causal_mask": "your mask is upside down: each token sees the future and not the past. Keep the lower triangle (torch.tril), hide the upper one",
        "keys_times_queries": "you computed k @ q^T, the scores transposed; row i of the scores must be query i against every key: q @ k.transpose(-2, -1)",
        "split_without_transpose": "you reshaped (B, T, C) straight to (B, nh, T, hd): the shape is right but that cuts the sequence, not each token's features, into heads. Use .view(B, T, nh, hd).transpose(1, 2)",
        "split_interleaved": "your heads take every nh-th feature (interleaved); head h must get the consecutive features h*hd ... (h+1)*hd - 1: view as (B, T, nh, hd), not (B, T, hd, nh)",
        "merge_without_transpose": "you reshaped (B, nh, T, hd) straight to (B, T, C): that glues together different time steps of one head. transpose(1, 2) to (B, T, nh, hd) first, then reshape",
        "merge_interleaved": "your features come out interleaved (feature 0 of every head, then feature 1, ...); head 0's hd features come first, then head 1's: y.transpose(1, 2) then reshape(B, T, C)",
        "transpose_1_3": TRANSPOSE_1_3,
        "no_heads": NO_HEADS,
    },
)


def check_multi_head_attention(multi_head_attention) -> None:
    """`multi_head_attention(q, k, v, n_head)`: (B, T, C) each -> (y (B, T, C), weights (B, nh, T, T))."""
    gen = torch.Generator().manual_seed(0)
    for B, T, C, nh in ((2, 5, 12, 3), (1, 7, 16, 2)):
        hd = C // nh
        qkv = torch.randn(B, T, 3 * C, generator=gen)
        q, k, v = qkv.split(C, dim=2)  # slices of one tensor, as in the model: not contiguous
        got = _call(EX_MULTI, multi_head_attention, q, k, v, nh)
        y, weights = core.unpack(EX_MULTI, got, 2, "two tensors, (y, weights)")
        _no_nan(EX_MULTI, y, "your output")
        hint = "that is (B, nh, T, hd): merge the heads back, transpose(1, 2) then reshape(B, T, C)"
        what = f"your y (B={B}, T={T}, C={C}, n_head={nh})"
        y = core.expect_tensor(EX_MULTI, y, (B, T, C), what=what, hints={(B, nh, T, hd): hint})
        _no_nan(EX_MULTI, weights, "your weights")
        output = "that is the shape of the heads' OUTPUT; return the softmax weights, (B, nh, T, T)"
        hints = {(B, hd, nh, nh): TRANSPOSE_1_3, (B, T, T): NO_HEADS, (B, nh, T, hd): output}
        weights = core.expect_tensor(
            EX_MULTI, weights, (B, nh, T, T), what="your weights", hints=hints
        )
        want_y, want_w = _heads(q, k, v, nh)
        if core.close(y, want_y) and not core.close(weights, want_w):
            if torch.allclose(weights.sum(-1), torch.ones(()).double(), atol=1e-5):
                why = "y is right, but the weights you return are not the ones that made it: return the softmax of the masked, scaled scores"
            else:
                why = "y is right, but the rows of your weights do not sum to 1: return the weights after the softmax, not the scores"
            raise core.CheckFailed(EX_MULTI, why)
        otherwise = f"the shapes are right but y differs from causal multi-head attention (B={B}, T={T}, C={C}, n_head={nh}): split into heads, softmax(q @ k^T / sqrt(hd) with the future masked) @ v per head, merge"
        core.fail_unless_close(
            EX_MULTI, y, want_y, MULTI_HEAD_MISTAKES, (q, k, v, nh), otherwise, part=0
        )
    core.passed(EX_MULTI, "heads split, masked, scaled by 1/sqrt(hd), merged in order")


# --------------------------------------------------------------------------- Exercise 3.6
def _gpt2_attention(x, w, n_head, resid_p=0.0, *, mistake=""):
    """GPT-2 attention from its four tensors (weights [in, out]), then resid dropout with resid_p;
    `mistake` plants one of MODULE_MISTAKES by its name."""
    B, T, C = x.shape
    qkv = x @ w["c_attn.weight"] + w["c_attn.bias"]  # (B, T, 3C)
    if mistake == "qkv_split_wrong_dim":
        parts = [qkv.reshape(B, T, C, 3)[..., i] for i in range(3)]
    else:
        parts = list(qkv.split(C, dim=2))
    orders = dict(qkv_order_kqv="kqv", qkv_order_qvk="qvk", qkv_order_vkq="vkq", shared_qkv="qqq")
    q, k, v = (parts["qkv".index(name)] for name in orders.get(mistake, "qkv"))
    y = _heads(q, k, v, n_head, mistake=mistake)[0]  # (B, T, C); no_heads: attend(q, k, v)
    if mistake != "no_c_proj":
        y = y @ w["c_proj.weight"] + w["c_proj.bias"]
    return F.dropout(y, resid_p) if resid_p and mistake != "no_resid_dropout" else y


# fn(x, w, n_head, p) with p the residual dropout of the mode the check runs in (0 in eval)
MODULE_MISTAKES = core.variants(
    _gpt2_attention,
    {
        "qkv_order_kqv": "you took k, q, v from c_attn's output; it holds q, then k, then v (split(n_embd, dim=2) returns them in that order)",
        "qkv_order_qvk": "you swapped k and v; c_attn's output holds q, then k, then v",
        "qkv_order_vkq": "you took v, k, q from c_attn's output; it holds q, then k, then v",
        "qkv_split_wrong_dim": "you split c_attn's output the wrong way; q, k and v are the three n_embd-wide slices of the last dimension: split(n_embd, dim=2)",
        "shared_qkv": "you used the same slice for q, k and v; c_attn makes three different ones",
        "no_c_proj": "your output skips c_proj: after merging the heads, apply self.c_proj",
        "no_heads": NO_HEADS,
        "no_resid_dropout": "in train() mode your output has no residual dropout: return self.resid_dropout(self.c_proj(...)); it acts in training only",
    },
)


def _build(attention_cls, config):
    """The learner's module, its parameters by name and the shapes they must have."""
    module = core.call_learner(EX_MODULE, attention_cls, config)
    if not isinstance(module, nn.Module):
        raise core.CheckFailed(
            EX_MODULE,
            f"calling it with a config should build an nn.Module, got {type(module).__name__}",
        )
    C = config.n_embd
    expected = {
        "c_attn.weight": (C, 3 * C),
        "c_attn.bias": (3 * C,),
        "c_proj.weight": (C, C),
        "c_proj.bias": (C,),
    }
    params = dict(module.named_parameters())
    for name, shape in expected.items():
        if name not in params:
            raise core.CheckFailed(
                EX_MODULE,
                f"no parameter named {name}; keep self.c_attn = Conv1D(n_embd, 3 * n_embd) and self.c_proj = Conv1D(n_embd, n_embd) (found: {', '.join(params) or 'none'})",
            )
        got = tuple(params[name].shape)
        if got != shape:
            flipped = " (that is [out, in], like nn.Linear; GPT-2 stores [in, out]: use Conv1D)"
            raise core.CheckFailed(
                EX_MODULE,
                f"{name} has shape {got}, expected {shape}{flipped if got == shape[::-1] else ''}",
            )
    return module, params, expected


def _run(module, x, **kwargs):
    """module.forward(x, **kwargs), seeded (forward: its signature is the learner's)."""
    return core.seeded_call(_call, EX_MODULE, module.forward, x, **kwargs)


def _hooked(module, x, hook):
    """_run(module, x) with `hook` listening at module.hook_pattern."""
    handle = module.hook_pattern.register_forward_hook(hook)
    try:
        return _run(module, x)
    finally:
        handle.remove()


def check_causal_self_attention(attention_cls) -> None:
    """`attention_cls(config)` has c_attn (n_embd -> 3 n_embd) and c_proj, both stored [in, out];
    `forward(x, kv_cache=None)` maps (B, T, C) -> (B, T, C) like GPT-2's attention, in eval mode,
    in train mode (residual dropout), with a cache of earlier keys and values, and a hook."""
    with torch.random.fork_rng():  # building modules draws random numbers: keep the notebook's
        p = 0.5  # residual dropout in the train-mode run
        config = core.tiny_config(vocab_size=32, n_embd=12, n_head=3, resid_pdrop=p)
        C, nh = config.n_embd, config.n_head
        module, params, expected = _build(attention_cls, config)
        gen = torch.Generator().manual_seed(0)
        w = {  # weights large enough that attention is far from uniform
            name: torch.randn(shape, generator=gen) * (0.4 if name.endswith("weight") else 0.2)
            for name, shape in expected.items()
        }
        with torch.no_grad():
            for name, value in w.items():
                params[name].copy_(value)

        module.eval()
        for B, T in ((2, 5), (1, 7)):
            x = torch.randn(B, T, C, generator=gen)
            got = core.expect_tensor(EX_MODULE, _run(module, x), (B, T, C), what="your output")
            otherwise = f"the shape is right but the output differs from GPT-2's attention (B={B}, T={T}); go through c_attn -> q, k, v -> heads -> causal attention -> merge -> c_proj -> resid_dropout"
            want = _gpt2_attention(x, w, nh)
            core.fail_unless_close(
                EX_MODULE, got, want, MODULE_MISTAKES, (x, w, nh, 0.0), otherwise, rtol=1e-4
            )

        # with a cache, as chapter 9 calls it: 4 tokens, then 2, then 1 give the whole sequence
        x, cache, pieces = torch.randn(2, 7, C, generator=gen), ListCache(), []
        for a, b in ((0, 4), (4, 6), (6, 7)):
            got = _run(module, x[:, a:b], kv_cache=cache)
            what = "your output with a kv_cache"
            pieces.append(core.expect_tensor(EX_MODULE, got, (2, b - a, C), what=what))
        whole = _gpt2_attention(x, w, nh)
        if cache.position != 7 or not core.close(torch.cat(pieces, dim=1), whole, rtol=1e-4):
            raise core.CheckFailed(
                EX_MODULE,
                "fed in pieces through a kv_cache (4 tokens, then 2, then 1), your layer does not give the output of the whole sequence; pass the heads' k and v, (B, nh, T, hd), to kv_cache.update and use the keys, values and mask it returns",
            )

        # train mode: residual dropout after c_proj, drawn with the check's seed or with its own
        module.train()
        x = torch.randn(4, 6, C, generator=gen)
        got = core.expect_tensor(
            EX_MODULE, _run(module, x), tuple(x.shape), what="your output in train() mode"
        )
        if not core.dropout_of(got, _gpt2_attention(x, w, nh), p, rtol=1e-4):
            otherwise = "in eval() mode your layer is right, but in train() mode it is not the layer followed by residual dropout: return self.resid_dropout(self.c_proj(...))"
            want = core.seeded_call(_gpt2_attention, x, w, nh, resid_p=p)
            core.fail_unless_close(
                EX_MODULE, got, want, MODULE_MISTAKES, (x, w, nh, p), otherwise, rtol=1e-4
            )

        # a hook at hook_pattern (chapter 8): the pattern goes through it, the output stays
        module.eval()
        x = torch.randn(2, 5, C, generator=gen)
        if not isinstance(getattr(module, "hook_pattern", None), nn.Module):
            raise core.CheckFailed(
                EX_MODULE,
                "the layer has no hook point `hook_pattern`: keep the given line `self.hook_pattern = HookPoint()` in __init__ (chapter 8 records through it)",
            )
        seen = []
        got = _hooked(module, x, lambda m, a, out: seen.append(out))
        if len(seen) != 1 or not core.close(got, _gpt2_attention(x, w, nh), rtol=1e-4):
            raise core.CheckFailed(
                EX_MODULE,
                "with a hook listening at hook_pattern the layer gives another output than without one: pass attention_pattern(q, k, visible) through self.hook_pattern, then @ v",
            )
        qkv = (x @ w["c_attn.weight"] + w["c_attn.bias"]).split(C, dim=2)
        pattern = attend(*(split(t, nh) for t in qkv))[1]  # (B, nh, T, T)
        if not isinstance(seen[0], torch.Tensor) or not core.close(seen[0], pattern, rtol=1e-4):
            raise core.CheckFailed(
                EX_MODULE,
                "what goes through hook_pattern is not the attention pattern (B, nh, T, T): pass attention_pattern(q, k, visible) through it, with q and k split into heads",
            )
        # a hook that replaces the pattern (chapter 8's ablations): the output must follow it
        got = _hooked(module, x, lambda m, a, out: torch.zeros_like(out))
        if not core.close(got, w["c_proj.bias"].expand_as(got), atol=1e-6):
            raise core.CheckFailed(
                EX_MODULE,
                "a hook that replaces the pattern does not change your output: use what self.hook_pattern(...) returns, times v",
            )
    core.passed(
        EX_MODULE,
        "fused q, k, v, heads, causal mask, c_proj, residual dropout in training only, and the pattern through its hook point",
    )


# split mistakes: fn(x, n_head); merge mistakes: fn(y). The check names them by comparing.
SPLIT_MISTAKES = core.variants(
    split,
    {
        "split_without_transpose": "your split_heads reshapes (B, T, C) straight to (B, nh, T, hd): the shape is right but that cuts the sequence, not each token's features, into heads. View as (B, T, nh, hd), then transpose(1, 2)",
        "split_interleaved": "your split_heads gives head h every nh-th feature (interleaved); head h must get the consecutive features h*hd ... (h+1)*hd - 1: view as (B, T, nh, hd), not (B, T, hd, nh)",
        "split_transpose_1_3": TRANSPOSE_1_3,
    },
)
MERGE_MISTAKES = core.variants(
    merge,
    {
        "merge_without_transpose": "your merge_heads reshapes (B, nh, T, hd) straight to (B, T, C): that glues together different time steps of one head. transpose(1, 2) to (B, T, nh, hd) first",
        "merge_interleaved": "your merge_heads interleaves the heads (feature 0 of every head, then feature 1, ...); head 0's hd features come first, then head 1's",
    },
)


def check_split_merge(split_heads, merge_heads) -> None:
    """`split_heads(x, n_head)`: (B, T, C) -> (B, nh, T, hd), consecutive features per head;
    `merge_heads(y)`: its inverse. Tried on slices of a bigger tensor (not contiguous)."""
    gen = torch.Generator().manual_seed(3)
    for B, T, C, nh in ((2, 5, 12, 3), (1, 4, 8, 4)):
        hd = C // nh
        x = torch.randn(B, T, 3 * C, generator=gen)[..., C : 2 * C]  # as c_attn's split gives
        swapped = "that is (B, T, nh, hd): transpose(1, 2) to put the heads before the time steps"
        hints = {(B, T, nh, hd): swapped, (B, hd, nh, T): TRANSPOSE_1_3}
        got = _call(EX_MODULE, split_heads, x, nh)
        what = f"split_heads(x (B={B}, T={T}, C={C}), {nh})"
        got = core.expect_tensor(EX_MODULE, got, (B, nh, T, hd), what=what, hints=hints)
        otherwise = "split_heads puts the wrong numbers in the heads: head h of token t must hold x[:, t, h*hd:(h+1)*hd]"
        core.fail_unless_close(EX_MODULE, got, split(x, nh), SPLIT_MISTAKES, (x, nh), otherwise)
        heads = split(x, nh).contiguous()  # (B, nh, T, hd) laid out as SDPA returns it
        back = _call(EX_MODULE, merge_heads, heads)
        back = core.expect_tensor(EX_MODULE, back, (B, T, C), what="merge_heads(heads)")
        otherwise = "merge_heads(split_heads(x)) is not x: merge must undo the split exactly"
        core.fail_unless_close(EX_MODULE, back, x, MERGE_MISTAKES, (heads,), otherwise)
    core.passed(
        EX_MODULE + ", split_heads and merge_heads",
        "consecutive features per head, merged back in order",
    )


# --------------------------------------------------------------------------- Exercise 3.7
def attention_by_hand_reference(layer, x: torch.Tensor, *, mistake: str = "") -> torch.Tensor:
    """Exercise 3.7's answer: `layer(x)` of a CausalSelfAttention in eval mode, (B, T, C), written
    out with plain matrix products (c_attn, heads, causal attention, merge, c_proj); `mistake`
    plants one of BY_HAND_MISTAKES by its name (most have another name in 3.5 or 3.6)."""
    w = dict(layer.named_parameters())  # the same computation as Exercise 3.6's reference
    if mistake == "no_biases":
        w = {name: t * 0 if name.endswith("bias") else t for name, t in w.items()}
    same = dict(q_k_swapped="qkv_order_kqv", v_not_last="qkv_order_vkq", one_head="no_heads")
    mistake = "scale_by_sqrt_C" if mistake == "scaled_by_C" else same.get(mistake, mistake)
    return _gpt2_attention(x, w, layer.n_head, mistake=mistake)


BY_HAND_MISTAKES = core.variants(
    attention_by_hand_reference,
    {
        "no_biases": "you left out the biases: c_attn and c_proj are x @ weight + bias",
        "no_c_proj": "you return the merged heads; the layer then mixes them with c_proj (its weight and its bias)",
        "one_head": "you ran one head over all C features; cut q, k and v into layer.n_head heads before the attention, and merge the heads back after it",
        "q_k_swapped": "you took q and k in the wrong order: c_attn's output is q, then k, then v, C features each",
        "v_not_last": "your q, k, v are not the three thirds of c_attn's output in the order q, k, v (the first C features are q, the next C are k, the last C are v)",
        "no_mask": "your attention reads future tokens: each token may only see itself and the tokens before it (the causal mask)",
        "scaled_by_C": "your scores are divided by √C; each head divides by the square root of its own width, hd = C / n_head",
    },
)


@contextlib.contextmanager
def _layer_refused(layer):
    """Calling `layer` or one of its submodules, or SDPA, raises CheckFailed while the block runs
    (without gradients)."""

    def refuse(module, args):
        raise core.CheckFailed(
            EX_BY_HAND,
            "your code calls the layer or one of its submodules (layer(x), layer.c_attn(x), ...), which is not allowed here: use their tensors, layer.c_attn.weight and .bias",
        )

    handles = [m.register_forward_pre_hook(refuse) for m in layer.modules()]
    sdpa = "torch.nn.functional.scaled_dot_product_attention"
    instead = "write the attention out with this chapter's pieces (causal_attention)"
    try:
        with torch.no_grad(), core.forbidding(EX_BY_HAND, sdpa, instead=instead):
            yield
    finally:
        for handle in handles:
            handle.remove()


def check_attention_by_hand(attention_by_hand) -> None:
    """`attention_by_hand(layer, x)` equals `layer(x)` in eval mode, for layers of several widths
    and numbers of heads with weights and biases far from their initial values; SDPA and calling
    the layer refused."""
    from gpt2lib.chapters.attention import CausalSelfAttention

    with torch.random.fork_rng():  # building layers draws random numbers: keep the notebook's
        gen = torch.Generator().manual_seed(5)
        for C, nh, B, T in ((12, 3, 2, 5), (16, 4, 1, 7), (8, 2, 3, 4)):
            config = core.tiny_config(vocab_size=32, n_embd=C, n_head=nh)
            layer = CausalSelfAttention(config).eval()
            with torch.no_grad():  # large weights and biases: attention far from uniform
                for p in layer.parameters():
                    p.copy_(torch.randn(p.shape, generator=gen) * 0.5)
            x = torch.randn(B, T, C, generator=gen)
            kept = x.clone()
            with _layer_refused(layer):
                got = core.call_learner(EX_BY_HAND, attention_by_hand, layer, x)
                core.require(EX_BY_HAND, torch.equal(x, kept), _CHANGED)
                what = f"your output (B={B}, T={T}, C={C})"
                got = core.expect_tensor(EX_BY_HAND, got, (B, T, C), what=what)
                want = attention_by_hand_reference(layer, x)
            otherwise = f"for C={C} with {nh} heads your output differs from the layer's; follow the data: c_attn, q, k, v, heads, causal attention, merge, c_proj"
            core.fail_unless_close(
                EX_BY_HAND, got, want, BY_HAND_MISTAKES, (layer, x), otherwise, rtol=1e-4, atol=1e-4
            )
    core.passed(EX_BY_HAND, "the same numbers as the layer, for three widths and numbers of heads")


# --------------------------------------------------------------------------- Exercise 3.8
def _cost(T, C, n_head, *, mistake=""):
    """The FLOPs of GPT-2 attention; `mistake` plants one of COST_MISTAKES by its name."""
    per_mac = 1 if mistake == "multiply_adds" else 2
    projections = T * C * 3 * C + (0 if mistake == "flops_without_c_proj" else T * C * C)
    mixing = {"flops_without_attention": 0, "flops_half_the_attention": 1}.get(mistake, 2)
    heads = n_head if mistake == "flops_times_heads" else 1
    return per_mac * projections + per_mac * mixing * T * T * C * heads


COST_MISTAKES = core.variants(
    _cost,
    {
        "flops_times_heads": "your FLOPs multiply the attention part by n_head, but each head works on hd = C / n_head features: all heads together cost 2·T·T·C for the scores, as one head of width C would",
        "multiply_adds": "you counted multiply-adds; count 2 FLOPs per multiply-add: an (m, k) @ (k, n) product costs 2·m·k·n",
        "flops_without_c_proj": "your FLOPs leave out c_proj: 2·T·C·C more",
        "flops_without_attention": "your FLOPs count only the projections: the scores q @ k^T and the weighted sum weights @ v cost 2·T·T·C each, summed over the heads",
        "flops_half_the_attention": "your FLOPs count only one of the two attention products: q @ k^T and weights @ v cost 2·T·T·C each",
    },
)


def check_attention_cost(attention_cost) -> None:
    """`attention_cost(T, n_embd, n_head)` -> the FLOPs of one CausalSelfAttention on T tokens,
    a whole number, for three sizes."""
    for T, C, nh in ((16, 64, 4), (100, 48, 3), (7, 768, 12)):
        got = core.call_learner(EX_COST, attention_cost, T, C, nh)
        if isinstance(got, torch.Tensor):
            raise core.CheckFailed(EX_COST, "you return a tensor: return a Python int (.item())")
        if isinstance(got, bool) or not isinstance(got, numbers.Real) or got != int(got):
            raise core.CheckFailed(EX_COST, f"return a whole number of FLOPs, got {got!r}")
        want = _cost(T, C, nh)
        if got != want:
            core.fail_with(
                EX_COST,
                COST_MISTAKES,
                lambda m: m.fn(T, C, nh) == got,
                f"for T={T}, n_embd={C}, n_head={nh} you count {got:,.0f} FLOPs, not {want:,}: c_attn (C -> 3C), c_proj (C -> C), the scores (T x T per head) and weights @ v",
            )
    core.passed(
        EX_COST, f"{_cost(1024, 768, 12):,} FLOPs for GPT-2 small's attention on 1,024 tokens"
    )


# --------------------------------------------------------------------------- Challenge
def check_copy_two_back(copy_two_back_head, goal: float = 0.99) -> None:
    """`copy_two_back_head(V, T)` -> (w_q, w_k, w_v): on random token sequences, the causal
    attention output's largest entry in row i >= 2 is at token i - 2's id, in at least `goal` of
    the rows."""
    gen = torch.Generator().manual_seed(4)
    for V, T in ((5, 8), (10, 16), (3, 12)):
        got = core.call_learner(CH_COPY, copy_two_back_head, V, T)
        got = core.unpack(CH_COPY, got, 3, "three matrices, (w_q, w_k, w_v)")
        where = f"(V={V}, T={T})"
        w_q = core.expect_tensor(CH_COPY, got[0], what=f"w_q {where}")
        d = w_q.shape[-1] if w_q.dim() == 2 else 0
        w_q = core.expect_tensor(CH_COPY, w_q, (V + T, d), what=f"w_q {where}")
        w_k = core.expect_tensor(CH_COPY, got[1], (V + T, d), what=f"w_k {where}, like w_q")
        w_v = core.expect_tensor(CH_COPY, got[2], (V + T, V), what=f"w_v {where}")
        rows, right, offsets = torch.arange(2, T), 0, torch.zeros(T, dtype=torch.long)
        positions = torch.eye(T, dtype=torch.float64)  # one-hot, after each token's one-hot
        for _ in range(100):
            tokens = torch.randint(V, (T,), generator=gen)
            x = torch.cat([F.one_hot(tokens, V).double(), positions], dim=1)  # (T, V + T)
            out, weights = attend(x @ w_q, x @ w_k, x @ w_v)
            finite = bool(torch.isfinite(out).all())
            core.require(CH_COPY, finite, "the output has NaN or inf: the scores are too large")
            right += int((out[2:].argmax(dim=-1) == tokens[rows - 2]).sum())
            offsets += torch.bincount(rows - weights[2:].argmax(dim=-1), minlength=T)[:T]
        accuracy = right / (100 * (T - 2))
        if accuracy < goal:
            raise core.CheckFailed(
                CH_COPY,
                f"for V={V}, T={T}, {accuracy:.4f} of the rows copy token i - 2 (goal {goal}); most rows put their largest weight on token i - {int(offsets.argmax())}",
            )
    core.passed(CH_COPY, "every row copies the token two places back")
