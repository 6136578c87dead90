"""Checks for chapter 3's exercises: a previous-token head designed by hand, multi-head
attention written without SDPA, and GPT-2's attention module.

Each check runs the learner's answer on small random inputs and compares it with the right
answer and with the planted `Mistake`s below (module-level lists, so the tests cover every
one), so that a wrong answer gets a message that names its mistake.
"""

from __future__ import annotations

import math

import torch
import torch.nn as nn
import torch.nn.functional as F

from gpt2lib.course.checks._core import (
    CheckFailed,
    Mistake,
    call_learner,
    close,
    expect_tensor,
    first_mistake,
    passed,
    seeded_call,
)

EX_PREVIOUS = "Exercise 3.1 (previous_token_head)"
EX_MULTI = "Exercise 3.2 (multi_head_attention)"
EX_MODULE = "Exercise 3.3 (CausalSelfAttention)"

# --------------------------------------------------------------------------- reference pieces


def split(x: torch.Tensor, n_head: int) -> torch.Tensor:
    """(B, T, C) -> (B, nh, T, hd)."""
    B, T, C = x.shape
    return x.reshape(B, T, n_head, C // n_head).transpose(1, 2)


def merge(y: torch.Tensor) -> torch.Tensor:
    """(B, nh, T, hd) -> (B, T, C)."""
    B, nh, T, hd = y.shape
    return y.transpose(1, 2).reshape(B, T, nh * hd)


def attend(q, k, v, *, scale: float | None = None, mask: str = "causal", softmax_dim: int = -1,
           keys_first: bool = False):
    """Attention over the last two dims of (..., T, d) tensors: (output, weights).

    scale: what the scores are multiplied by (default 1/sqrt(d)). mask: "causal" (future scores
    -inf), "none", "zero" (future scores 0), "after_softmax" (future weights zeroed after the
    softmax), "anti" (the past hidden instead). keys_first: k @ q^T instead of q @ k^T.
    The arguments other than the defaults describe known wrong versions.
    """
    T, S = q.shape[-2], k.shape[-2]
    scores = (k @ q.transpose(-2, -1)) if keys_first else (q @ k.transpose(-2, -1))  # (..., T, S)
    scores = scores * (1 / math.sqrt(q.shape[-1]) if scale is None else scale)
    visible = torch.ones(T, S, dtype=torch.bool).tril(diagonal=S - T)  # (T, S)
    if mask == "causal":
        scores = scores.masked_fill(~visible, float("-inf"))
    elif mask == "zero":
        scores = scores.masked_fill(~visible, 0.0)
    elif mask == "anti":
        scores = scores.masked_fill(~torch.ones(T, S, dtype=torch.bool).triu(diagonal=S - T), float("-inf"))
    weights = scores.softmax(dim=softmax_dim)
    if mask == "after_softmax":
        weights = weights.masked_fill(~visible, 0.0)
    return weights @ v, weights


class ListCache:
    """The smallest cache that follows the protocol of chapter 9: `.length` and `.update(k, v)`."""

    def __init__(self):
        self.k = self.v = None

    @property
    def length(self) -> int:
        return 0 if self.k is None else self.k.shape[2]

    def update(self, k, v):
        self.k = k if self.k is None else torch.cat([self.k, k], dim=2)
        self.v = v if self.v is None else torch.cat([self.v, v], dim=2)
        return self.k, self.v


# --------------------------------------------------------------------------- Exercise 3.1

_BIG = 10.0  # a score gap of 10 after the scaling: e^10 outweighs thousands of other tokens


def previous_token_head_reference(T: int):
    """(w_q, w_k), (T, T) each: query i matches key i - 1 with a score gap of 10 after 1/sqrt(T)."""
    w_k = torch.eye(T)
    w_q = _BIG * math.sqrt(T) * torch.diag(torch.ones(T - 1), diagonal=-1)  # w_q[i, i - 1]
    return w_q, w_k


def _shift(T, offset):
    return torch.diag(torch.ones(T - abs(offset)), diagonal=offset)


# fn(T) -> a wrong (w_q, w_k); the check names them by what the head does, not by the numbers
PREVIOUS_TOKEN_MISTAKES = [
    Mistake("reads_itself", "every token puts its largest weight on ITSELF: query i matches key i. "
            "Shift by one, so that row i of w_q lines up with row i - 1 of w_k",
            lambda T: (_BIG * math.sqrt(T) * torch.eye(T), torch.eye(T))),
    Mistake("reads_the_future", "query i matches key i + 1, a FUTURE token that the causal mask hides, so "
            "the weights are spread over the past. Shift the other way: i - 1",
            lambda T: (_BIG * math.sqrt(T) * _shift(T, 1), torch.eye(T))),
    Mistake("not_peaked", "each token's largest weight is on the previous token, but it is below 0.9: the "
            "scores are too close together for the softmax. Scale w_q (or w_k) up; remember the scores "
            "are divided by sqrt(T), and the gap must beat up to T - 1 other tokens",
            lambda T: (_shift(T, -1), torch.eye(T))),
    Mistake("reads_the_first_token", "every token puts its largest weight on token 0, the first one: query "
            "i must match key i - 1, which moves with i",
            lambda T: (_BIG * math.sqrt(T) * torch.zeros(T, T).index_fill_(1, torch.tensor([0]), 1.0), torch.eye(T))),
]


def _head_weights(w_q, w_k):
    T = w_q.shape[0]
    x = torch.eye(T, dtype=torch.float64)
    scores = (x @ w_q) @ (x @ w_k).T / math.sqrt(T)  # (T, T), before the mask
    weights = attend(x @ w_q, x @ w_k, x, scale=1 / math.sqrt(T))[1]
    return scores, weights


def _previous_token_behaviour(scores, weights) -> str | None:
    """Which planted mistake the head behaves like (None: none of them)."""
    T = weights.shape[0]
    rows = range(2, T)  # queries with a real choice (query 1 sees only 0 and 1)
    if not rows:
        return None
    best = [int(weights[i, : i + 1].argmax()) for i in rows]
    if all(int(scores[i].argmax()) == i + 1 for i in range(1, T - 1)) and best != [i - 1 for i in rows]:
        return "reads_the_future"
    if best == list(rows):
        return "reads_itself"
    if best == [i - 1 for i in rows]:
        return "not_peaked"
    if best == [0] * len(best):
        return "reads_the_first_token"
    return None


def check_previous_token_head(previous_token_head) -> None:
    """`previous_token_head(T)` -> (w_q, w_k), (T, T) each: every token i >= 1 puts >= 0.9 of its
    causal attention weight on token i - 1, with one-hot positions as the input."""
    for T in (4, 7, 12):
        got = call_learner(EX_PREVIOUS, previous_token_head, T)
        if not isinstance(got, (tuple, list)) or len(got) != 2:
            raise CheckFailed(EX_PREVIOUS, f"return two matrices, (w_q, w_k); got {type(got).__name__}")
        w_q, w_k = (expect_tensor(EX_PREVIOUS, m, (T, T), what=f"{name} for T={T}") for m, name in zip(got, ("w_q", "w_k")))
        scores, weights = _head_weights(w_q, w_k)
        if not bool(torch.isfinite(weights).all()):
            raise CheckFailed(EX_PREVIOUS, f"for T={T} the softmax gives NaN: the scores are too large (or "
                              "infinite); a gap of about 10 after the scaling is plenty")
        on_previous = weights.diagonal(offset=-1)  # weights[i, i - 1] for i >= 1
        if bool((on_previous >= 0.9).all()):
            continue
        behaviour = _previous_token_behaviour(scores, weights)
        found = first_mistake(PREVIOUS_TOKEN_MISTAKES, lambda m, seen=behaviour: m.name == seen)
        if found:
            raise CheckFailed(EX_PREVIOUS, f"for T={T}: {found.message}")
        worst = int(on_previous.argmin()) + 1
        raise CheckFailed(EX_PREVIOUS, f"for T={T}, token {worst} puts only {on_previous[worst - 1].item():.4f} of "
                          f"its weight on token {worst - 1} (its largest is on token "
                          f"{int(weights[worst, : worst + 1].argmax())}); row i of w_q dotted with row j of "
                          "w_k must be large only for j = i - 1")
    passed(EX_PREVIOUS, "every token reads the token before it")


# --------------------------------------------------------------------------- Exercise 3.2

TRANSPOSE_1_3 = ("you used transpose(1, 3) where transpose(1, 2) belongs: from (B, T, nh, hd) only the "
                 "T and nh dims swap, giving (B, nh, T, hd); transpose(1, 3) gives (B, hd, nh, T)")
NO_HEADS = ("you ran ONE head over all C features: split q, k and v into n_head heads of "
            "hd = C // n_head features each, (B, T, C) -> (B, nh, T, hd), before the attention")


def _heads(q, k, v, n_head, *, split_fn=split, merge_fn=merge, **attend_kw):
    """Multi-head attention from the pieces: (y (B, T, C), weights (B, nh, T, T))."""
    y, weights = attend(split_fn(q, n_head), split_fn(k, n_head), split_fn(v, n_head), **attend_kw)
    return merge_fn(y), weights


def _heads_with(**options):
    """fn(q, k, v, n_head): multi-head attention built by `_heads` with these options, one
    planted mistake."""
    return lambda q, k, v, n_head: _heads(q, k, v, n_head, **options)


def _split_without_transpose(x, n_head):
    B, T, C = x.shape
    return x.reshape(B, n_head, T, C // n_head)


def _split_interleaved(x, n_head):
    B, T, C = x.shape
    return x.reshape(B, T, C // n_head, n_head).permute(0, 3, 1, 2)


def _merge_without_transpose(y):
    B, nh, T, hd = y.shape
    return y.reshape(B, T, nh * hd)


def _merge_interleaved(y):
    B, nh, T, hd = y.shape
    return y.permute(0, 2, 3, 1).reshape(B, T, nh * hd)


def _transpose_1_3(q, k, v, n_head):
    B, T, C = q.shape
    parts = [t.reshape(B, T, n_head, C // n_head).transpose(1, 3) for t in (q, k, v)]  # (B, hd, nh, T)
    y, weights = attend(*parts, scale=1 / math.sqrt(C // n_head))
    return y.transpose(1, 3).reshape(B, T, C), weights


def _scaled_by(factor):
    """A scale computed from q's (B, T, C) shape and n_head, for the wrong-scaling mistakes."""
    return lambda q, k, v, n_head: _heads(q, k, v, n_head, scale=factor(q.shape[-1], q.shape[-1] // n_head))


# fn(q, k, v, n_head) -> (y, weights) of that wrong answer
MULTI_HEAD_MISTAKES = [
    Mistake("no_mask", "your output matches attention WITHOUT the causal mask: future tokens leak in. Set "
            "the scores above the diagonal to -inf before the softmax",
            _heads_with(mask="none")),
    Mistake("no_scale", "your scores are not divided by sqrt(hd): divide each head's q @ k^T by "
            "math.sqrt(hd), hd = C // n_head", _scaled_by(lambda C, hd: 1.0)),
    Mistake("scale_by_sqrt_C", "you divided the scores by sqrt(C); each head's scores are divided by "
            "sqrt(hd), the size of ONE head's q and k (hd = C // n_head)", _scaled_by(lambda C, hd: 1 / math.sqrt(C))),
    Mistake("divide_by_hd", "you divided the scores by hd; divide by sqrt(hd) (math.sqrt(hd))",
            _scaled_by(lambda C, hd: 1 / hd)),
    Mistake("multiply_by_sqrt_hd", "you multiplied the scores by sqrt(hd); divide by it instead",
            _scaled_by(lambda C, hd: math.sqrt(hd))),
    Mistake("softmax_over_queries", "your softmax runs over the wrong dimension (over the queries, dim=-2); "
            "each query's weights over the keys must sum to 1: softmax(dim=-1)",
            _heads_with(softmax_dim=-2)),
    Mistake("mask_after_softmax", "you zeroed the future weights AFTER the softmax, so each row no longer "
            "sums to 1; mask the scores with -inf BEFORE the softmax",
            _heads_with(mask="after_softmax")),
    Mistake("mask_with_zero", "you set the masked scores to 0, but exp(0) = 1 still gives the future a "
            "weight; set them to -inf (float('-inf'))", _heads_with(mask="zero")),
    Mistake("anti_causal_mask", "your mask is upside down: each token sees the future and not the past. "
            "Keep the lower triangle (torch.tril), hide the upper one",
            _heads_with(mask="anti")),
    Mistake("keys_times_queries", "you computed k @ q^T, the scores transposed; row i of the scores must be "
            "query i against every key: q @ k.transpose(-2, -1)",
            _heads_with(keys_first=True)),
    Mistake("split_without_transpose", "you reshaped (B, T, C) straight to (B, nh, T, hd): the shape is right "
            "but that cuts the sequence, not each token's features, into heads. Use "
            ".view(B, T, nh, hd).transpose(1, 2)", _heads_with(split_fn=_split_without_transpose)),
    Mistake("split_interleaved", "your heads take every nh-th feature (interleaved); head h must get the "
            "consecutive features h*hd ... (h+1)*hd - 1: view as (B, T, nh, hd), not (B, T, hd, nh)",
            _heads_with(split_fn=_split_interleaved)),
    Mistake("merge_without_transpose", "you reshaped (B, nh, T, hd) straight to (B, T, C): that glues together "
            "different time steps of one head. transpose(1, 2) to (B, T, nh, hd) first, then reshape",
            _heads_with(merge_fn=_merge_without_transpose)),
    Mistake("merge_interleaved", "your features come out interleaved (feature 0 of every head, then feature "
            "1, ...); head 0's hd features come first, then head 1's: y.transpose(1, 2) then "
            "reshape(B, T, C)", _heads_with(merge_fn=_merge_interleaved)),
    Mistake("transpose_1_3", TRANSPOSE_1_3, _transpose_1_3),
    Mistake("no_heads", NO_HEADS, lambda q, k, v, n: attend(q, k, v)),
]


def _view_hint(exercise: str, exc: RuntimeError):
    if "view size is not compatible" in str(exc):
        raise CheckFailed(
            exercise,
            "`.view` failed: after a transpose (and for slices of a bigger tensor, as in the model) the "
            "tensor is not contiguous in memory. Use `.reshape(...)`, or `.contiguous().view(...)`",
        ) from None
    raise exc


def _no_nan(exercise: str, got, what: str) -> None:
    if isinstance(got, torch.Tensor) and got.is_floating_point() and bool(torch.isnan(got).any()):
        raise CheckFailed(exercise, f"{what} contains NaN: some row of scores is entirely -inf, so the softmax "
                          "divides 0 by 0. Each token must see at least itself: keep the diagonal visible "
                          "(hide only j > i: torch.triu(..., diagonal=1))")


def check_multi_head_attention(multi_head_attention) -> None:
    """`multi_head_attention(q, k, v, n_head)`: (B, T, C) each -> (y (B, T, C), weights (B, nh, T, T))."""
    gen = torch.Generator().manual_seed(0)
    for B, T, C, nh in ((2, 5, 12, 3), (1, 7, 16, 2)):
        hd = C // nh
        qkv = torch.randn(B, T, 3 * C, generator=gen)
        q, k, v = qkv.split(C, dim=2)  # slices of one tensor, as in the model: not contiguous
        try:
            got = call_learner(EX_MULTI, multi_head_attention, q, k, v, nh)
        except RuntimeError as exc:
            _view_hint(EX_MULTI, exc)
        if not isinstance(got, (tuple, list)) or len(got) != 2:
            raise CheckFailed(EX_MULTI, f"return two tensors, (y, weights); got {type(got).__name__}")
        y, weights = got
        _no_nan(EX_MULTI, y, "your output")
        y = expect_tensor(EX_MULTI, y, (B, T, C), what=f"your y (B={B}, T={T}, C={C}, n_head={nh})",
                          hints={(B, nh, T, hd): "that is (B, nh, T, hd): merge the heads back, "
                                 "transpose(1, 2) then reshape(B, T, C)"})
        _no_nan(EX_MULTI, weights, "your weights")
        weights = expect_tensor(EX_MULTI, weights, (B, nh, T, T), what="your weights", hints={
            (B, hd, nh, nh): TRANSPOSE_1_3, (B, T, T): NO_HEADS,
            (B, nh, T, hd): "that is the shape of the heads' OUTPUT; return the softmax weights, (B, nh, T, T)"})
        want_y, want_w = _heads(q, k, v, nh)
        if close(y, want_y) and close(weights, want_w):
            continue
        found = first_mistake(MULTI_HEAD_MISTAKES, lambda m, y=y, q=q, k=k, v=v, nh=nh: close(y, m.fn(q, k, v, nh)[0]))
        if found:
            raise CheckFailed(EX_MULTI, found.message)
        if close(y, want_y):
            if torch.allclose(weights.sum(-1), torch.ones(()).double(), atol=1e-5):
                raise CheckFailed(EX_MULTI, "y is right, but the weights you return are not the ones that "
                                  "made it: return the softmax of the masked, scaled scores")
            raise CheckFailed(EX_MULTI, "y is right, but the rows of your weights do not sum to 1: return "
                              "the weights after the softmax, not the scores")
        raise CheckFailed(EX_MULTI, f"the shapes are right but y differs from causal multi-head attention "
                          f"(B={B}, T={T}, C={C}, n_head={nh}): split into heads, softmax(q @ k^T / sqrt(hd) "
                          "with the future masked) @ v per head, merge")
    passed(EX_MULTI, "heads split, masked, scaled by 1/sqrt(hd), merged in order")


# --------------------------------------------------------------------------- Exercise 3.3


def _gpt2_attention(x, w, n_head, *, order="qkv", split_dim_wrong=False, heads=True, c_proj=True,
                    resid_p=0.0):
    """GPT-2 attention from its four tensors (weights [in, out]), then resid dropout with resid_p.

    The arguments other than the defaults describe known wrong versions."""
    B, T, C = x.shape
    qkv = x @ w["c_attn.weight"] + w["c_attn.bias"]  # (B, T, 3C)
    parts = [qkv.reshape(B, T, C, 3)[..., i] for i in range(3)] if split_dim_wrong else list(qkv.split(C, dim=2))
    q, k, v = (parts["qkv".index(name)] for name in order)
    y = _heads(q, k, v, n_head)[0] if heads else attend(q, k, v)[0]  # (B, T, C)
    if c_proj:
        y = y @ w["c_proj.weight"] + w["c_proj.bias"]
    return F.dropout(y, resid_p) if resid_p else y


# fn(x, weights by parameter name, n_head, resid_p) -> output of that wrong answer; resid_p is
# the residual dropout of the mode the check runs in (0 in eval)
MODULE_MISTAKES = [
    Mistake("qkv_order_kqv", "you took k, q, v from c_attn's output; it holds q, then k, then v "
            "(split(n_embd, dim=2) returns them in that order)",
            lambda x, w, n, p: _gpt2_attention(x, w, n, order="kqv", resid_p=p)),
    Mistake("qkv_order_qvk", "you swapped k and v; c_attn's output holds q, then k, then v",
            lambda x, w, n, p: _gpt2_attention(x, w, n, order="qvk", resid_p=p)),
    Mistake("qkv_order_vkq", "you took v, k, q from c_attn's output; it holds q, then k, then v",
            lambda x, w, n, p: _gpt2_attention(x, w, n, order="vkq", resid_p=p)),
    Mistake("qkv_split_wrong_dim", "you split c_attn's output the wrong way; q, k and v are the three "
            "n_embd-wide slices of the last dimension: split(n_embd, dim=2)",
            lambda x, w, n, p: _gpt2_attention(x, w, n, split_dim_wrong=True, resid_p=p)),
    Mistake("shared_qkv", "you used the same slice for q, k and v; c_attn makes three different ones",
            lambda x, w, n, p: _gpt2_attention(x, w, n, order="qqq", resid_p=p)),
    Mistake("no_c_proj", "your output skips c_proj: after merging the heads, apply self.c_proj",
            lambda x, w, n, p: _gpt2_attention(x, w, n, c_proj=False, resid_p=p)),
    Mistake("no_heads", NO_HEADS, lambda x, w, n, p: _gpt2_attention(x, w, n, heads=False, resid_p=p)),
    Mistake("no_resid_dropout", "in train() mode your output has no residual dropout: return "
            "self.resid_dropout(self.c_proj(...)); it acts in training only",
            lambda x, w, n, p: _gpt2_attention(x, w, n)),
]


def _build(attention_cls, config):
    module = call_learner(EX_MODULE, attention_cls, config)
    if not isinstance(module, nn.Module):
        raise CheckFailed(EX_MODULE, f"calling it with a config should build an nn.Module, got {type(module).__name__}")
    C = config.n_embd
    expected = {"c_attn.weight": (C, 3 * C), "c_attn.bias": (3 * C,), "c_proj.weight": (C, C), "c_proj.bias": (C,)}
    params = dict(module.named_parameters())
    for name, shape in expected.items():
        if name not in params:
            raise CheckFailed(EX_MODULE, f"no parameter named {name}; keep self.c_attn = Conv1D(n_embd, "
                              f"3 * n_embd) and self.c_proj = Conv1D(n_embd, n_embd) (found: {', '.join(params) or 'none'})")
        if tuple(params[name].shape) != shape:
            flipped = " (that is [out, in], like nn.Linear; GPT-2 stores [in, out]: use Conv1D)" \
                if tuple(params[name].shape) == shape[::-1] else ""
            raise CheckFailed(EX_MODULE, f"{name} has shape {tuple(params[name].shape)}, expected {shape}{flipped}")
    return module, params, expected


def _run(module, x, **kwargs):
    try:
        # module.forward: its signature is the learner's (an nn.Module's own call takes anything)
        return seeded_call(call_learner, EX_MODULE, module.forward, x, **kwargs)
    except RuntimeError as exc:
        _view_hint(EX_MODULE, exc)


def check_causal_self_attention(attention_cls) -> None:
    """`attention_cls(config)` has c_attn (n_embd -> 3 n_embd) and c_proj, both stored [in, out];
    `forward(x, kv_cache=None)` maps (B, T, C) -> (B, T, C) like GPT-2's attention, in eval mode,
    in train mode (residual dropout) and with a cache of earlier keys and values."""
    with torch.random.fork_rng():  # building modules draws random numbers: leave the notebook's alone
        _check_causal_self_attention(attention_cls)


def _check_causal_self_attention(attention_cls) -> None:
    from gpt2lib.config import GPT2Config

    p = 0.5  # residual dropout in the train-mode run
    sizes = dict(vocab_size=32, n_positions=16, n_embd=12, n_head=3, n_layer=1, embd_pdrop=0.0, attn_pdrop=0.0)
    config = GPT2Config(**sizes, resid_pdrop=p)
    nh = config.n_head
    module, params, expected = _build(attention_cls, config)
    gen = torch.Generator().manual_seed(0)
    with torch.no_grad():  # weights large enough that attention is far from uniform
        w = {name: torch.randn(shape, generator=gen) * (0.4 if name.endswith("weight") else 0.2)
             for name, shape in expected.items()}
        for name, value in w.items():
            params[name].copy_(value)

    module.eval()
    for B, T in ((2, 5), (1, 7)):
        x = torch.randn(B, T, config.n_embd, generator=gen)
        got = expect_tensor(EX_MODULE, _run(module, x), (B, T, config.n_embd), what="your output")
        if close(got, _gpt2_attention(x, w, nh), rtol=1e-4):
            continue
        found = first_mistake(MODULE_MISTAKES, lambda m, got=got, x=x: close(got, seeded_call(m.fn, x, w, nh, 0.0), rtol=1e-4))
        if found:
            raise CheckFailed(EX_MODULE, found.message)
        raise CheckFailed(EX_MODULE, f"the shape is right but the output differs from GPT-2's attention "
                          f"(B={B}, T={T}); go through c_attn -> q, k, v -> heads -> causal attention -> "
                          "merge -> c_proj -> resid_dropout")

    # with a cache, as chapter 9 calls it: 4 tokens, then 2, then 1 give the whole sequence
    x = torch.randn(2, 7, config.n_embd, generator=gen)
    cache = ListCache()
    pieces = [_run(module, x[:, a:b], kv_cache=cache) for a, b in ((0, 4), (4, 6), (6, 7))]
    pieces = [expect_tensor(EX_MODULE, piece, (2, b - a, config.n_embd), what="your output with a kv_cache")
              for piece, (a, b) in zip(pieces, ((0, 4), (4, 6), (6, 7)))]
    if cache.length != 7 or not close(torch.cat(pieces, dim=1), _gpt2_attention(x, w, nh), rtol=1e-4):
        raise CheckFailed(EX_MODULE, "fed in pieces through a kv_cache (4 tokens, then 2, then 1), your layer "
                          "does not give the output of the whole sequence; pass the heads' k and v, "
                          "(B, nh, T, hd), to kv_cache.update and use what it returns")

    # train mode: residual dropout after c_proj, drawn with the check's seed
    module.train()
    x = torch.randn(4, 6, config.n_embd, generator=gen)
    got = expect_tensor(EX_MODULE, _run(module, x), tuple(x.shape), what="your output in train() mode")
    if close(got, seeded_call(_gpt2_attention, x, w, nh, resid_p=p), rtol=1e-4):
        passed(EX_MODULE, "fused q, k, v, heads, causal mask, c_proj, residual dropout in training only")
        return
    no_dropout = _gpt2_attention(x, w, nh)
    kept = got != 0
    fraction_zeroed = 1 - kept.double().mean().item()
    if 0.3 < fraction_zeroed < 0.7 and close(got[kept], no_dropout[kept] / (1 - p), rtol=1e-4):
        passed(EX_MODULE, "fused q, k, v, heads, causal mask, c_proj, residual dropout in training only")
        return  # dropout drawn another way (its own random numbers): still right
    found = first_mistake(MODULE_MISTAKES, lambda m: close(got, seeded_call(m.fn, x, w, nh, p), rtol=1e-4))
    if found:
        raise CheckFailed(EX_MODULE, found.message)
    raise CheckFailed(EX_MODULE, "in eval() mode your layer is right, but in train() mode it is not the layer "
                      "followed by residual dropout: return self.resid_dropout(self.c_proj(...))")
