"""Checks for chapter 3's exercises: one causal head, splitting and merging heads, and the
GPT-2 attention module.

Each check runs the learner's answer on small random inputs and compares it with the right
answer and with planted wrong versions (no mask, no 1/sqrt(d), softmax over the wrong
dimension, heads split or merged in the wrong order, ...), so a wrong answer gets a message
that names its mistake.
"""

from __future__ import annotations

import math

import torch
import torch.nn as nn

from gpt2lib.checks._core import CheckFailed, call_learner, passed

EX_HEAD = "Exercise 3.1 (causal_attention)"
EX_SPLIT = "Exercise 3.2 (split_heads)"
EX_MERGE = "Exercise 3.3 (merge_heads)"
EX_MODULE = "Exercise 3.4 (CausalSelfAttention)"

# --------------------------------------------------------------------------- planted mistakes

# One head: what a wrong answer did -> what to tell the learner.
HEAD_MISTAKES = {
    "no_mask": "your output matches attention WITHOUT the causal mask: future tokens leak in. "
    "Set the scores above the diagonal to -inf before the softmax.",
    "no_scale": "your scores are not divided by sqrt(d): divide q @ k^T by math.sqrt(d), where d "
    "is the size of the last dimension of q",
    "divide_by_d": "you divided the scores by d; divide by sqrt(d) (math.sqrt(d))",
    "multiply_by_sqrt_d": "you multiplied the scores by sqrt(d); divide by it instead",
    "softmax_wrong_dim": "your softmax runs over the wrong dimension (over the queries, dim=-2); "
    "each query's weights over the keys must sum to 1: softmax(dim=-1)",
    "mask_after_softmax": "you zeroed the future weights AFTER the softmax, so each row no longer "
    "sums to 1; mask the scores with -inf BEFORE the softmax",
    "mask_with_zero": "you set the masked scores to 0, but exp(0) = 1 still gives the future a "
    "weight; set them to -inf (float('-inf'))",
    "anti_causal_mask": "your mask is upside down: each token sees the future and not the past. "
    "Keep the lower triangle (torch.tril), hide the upper one",
    "keys_times_queries": "you computed k @ q^T, the scores transposed; row i of the scores must "
    "be query i against every key: q @ k.transpose(-2, -1)",
    "scale_by_sqrt_T": "you divided the scores by sqrt(T), the number of tokens; divide by sqrt(d), "
    "where d = q.shape[-1] is the size of each query and key vector",
}

SPLIT_MISTAKES = {
    "view_heads_first": "you reshaped (B, T, C) straight to (B, nh, T, hd): that cuts the "
    "sequence, not each token's features, into heads. Use x.view(B, T, nh, hd).transpose(1, 2)",
    "interleaved": "your heads take every nh-th feature (interleaved); head h must get the "
    "consecutive features h*hd ... (h+1)*hd - 1: view as (B, T, nh, hd), not (B, T, hd, nh)",
}

MERGE_MISTAKES = {
    "no_transpose": "you reshaped (B, nh, T, hd) straight to (B, T, C): that glues together "
    "different time steps of one head. Transpose to (B, T, nh, hd) first, then reshape",
    "interleaved": "your features come out interleaved (feature 0 of every head, then feature 1, "
    "...); GPT-2 puts head 0's hd features first, then head 1's: y.transpose(1, 2) then "
    "reshape(B, T, C)",
}

MODULE_MISTAKES = {
    # (k @ q^T inside the module looks exactly like taking q and k in the wrong order: qkv_order_kqv)
    **{f"attn_{k}": v for k, v in HEAD_MISTAKES.items() if k not in ("anti_causal_mask", "keys_times_queries")},
    **{f"split_{k}": v for k, v in SPLIT_MISTAKES.items()},
    **{f"merge_{k}": v for k, v in MERGE_MISTAKES.items()},
    "qkv_order_kqv": "you took k, q, v from c_attn's output; it holds q, then k, then v "
    "(split(n_embd, dim=2) returns them in that order)",
    "qkv_order_qvk": "you swapped k and v; c_attn's output holds q, then k, then v",
    "qkv_split_wrong_dim": "you split c_attn's output along the wrong dimension; q, k and v are "
    "the three n_embd-wide slices of the last dimension: split(n_embd, dim=2)",
    "no_c_proj": "your output skips c_proj: after merging the heads, apply self.c_proj",
    "shared_qkv": "you used the same slice for q, k and v; c_attn makes three different ones",
    "no_heads": "you ran ONE head over all n_embd features: split q, k and v into n_head heads of "
    "head_dim = n_embd // n_head features each, (B, T, C) -> (B, nh, T, hd), before the attention",
    "scale_by_sqrt_n_embd": "you divided the scores by sqrt(n_embd); each head's scores are divided "
    "by sqrt(head_dim), the size of ONE head's q and k (n_embd // n_head)",
}


def attend(q, k, v, mistake: str | None = None):
    """Causal attention for (..., T, d) tensors, or one of the planted wrong versions."""
    d, T, S = q.shape[-1], q.shape[-2], k.shape[-2]
    scores = q @ k.transpose(-2, -1)  # (..., T, S)
    if mistake == "keys_times_queries":
        scores = k @ q.transpose(-2, -1)  # the same numbers, transposed
    if mistake == "divide_by_d":
        scores = scores / d
    elif mistake == "multiply_by_sqrt_d":
        scores = scores * math.sqrt(d)
    elif mistake == "scale_by_sqrt_T":
        scores = scores / math.sqrt(T)
    elif mistake == "scale_by_sqrt_n_embd":
        scores = scores / math.sqrt(d * q.shape[-3])  # d * nh = n_embd for (B, nh, T, hd)
    elif mistake != "no_scale":
        scores = scores / math.sqrt(d)
    visible = torch.ones(T, S, dtype=torch.bool).tril(diagonal=S - T)  # (T, S)
    if mistake == "anti_causal_mask":
        visible = torch.ones(T, S, dtype=torch.bool).triu(diagonal=S - T)
    if mistake == "mask_with_zero":
        scores = scores.masked_fill(~visible, 0.0)
    elif mistake not in ("no_mask", "mask_after_softmax"):
        scores = scores.masked_fill(~visible, float("-inf"))
    weights = scores.softmax(dim=-2 if mistake == "softmax_wrong_dim" else -1)
    if mistake == "mask_after_softmax":
        weights = weights.masked_fill(~visible, 0.0)
    return weights @ v  # (..., T, d)


def split(x, n_head: int, mistake: str | None = None):
    """(B, T, C) -> (B, nh, T, hd), or a planted wrong version."""
    B, T, C = x.shape
    hd = C // n_head
    if mistake == "view_heads_first":
        return x.reshape(B, n_head, T, hd)
    if mistake == "interleaved":
        return x.reshape(B, T, hd, n_head).permute(0, 3, 1, 2)
    return x.reshape(B, T, n_head, hd).transpose(1, 2)


def merge(y, mistake: str | None = None):
    """(B, nh, T, hd) -> (B, T, C), or a planted wrong version."""
    B, nh, T, hd = y.shape
    if mistake == "no_transpose":
        return y.reshape(B, T, nh * hd)
    if mistake == "interleaved":
        return y.permute(0, 2, 3, 1).reshape(B, T, nh * hd)
    return y.transpose(1, 2).reshape(B, T, nh * hd)


def full_attention(x, w_attn, b_attn, w_proj, b_proj, n_head: int, mistake: str | None = None):
    """GPT-2 attention from its four tensors (weights stored [in, out]); or a wrong version."""
    B, T, C = x.shape
    qkv = x @ w_attn + b_attn  # (B, T, 3C)
    if mistake == "qkv_split_wrong_dim":
        q, k, v = (qkv.reshape(B, T, C, 3)[..., i] for i in range(3))
    else:
        q, k, v = qkv.split(C, dim=2)
    if mistake == "qkv_order_kqv":
        q, k = k, q
    elif mistake == "qkv_order_qvk":
        k, v = v, k
    elif mistake == "shared_qkv":
        k = v = q
    split_mistake = mistake[6:] if mistake and mistake.startswith("split_") else None
    merge_mistake = mistake[6:] if mistake and mistake.startswith("merge_") else None
    attn_mistake = mistake[5:] if mistake and mistake.startswith("attn_") else None
    if mistake == "no_heads":
        y = attend(q, k, v)  # one head of width C: (B, T, C)
    else:
        q, k, v = (split(t, n_head, split_mistake) for t in (q, k, v))  # (B, nh, T, hd)
        if mistake == "scale_by_sqrt_n_embd":
            attn_mistake = mistake
        y = merge(attend(q, k, v, attn_mistake), merge_mistake)  # (B, T, C)
    if mistake == "no_c_proj":
        return y
    return y @ w_proj + b_proj


# --------------------------------------------------------------------------- helpers


def _close(got, want) -> bool:
    return got.shape == want.shape and torch.allclose(got.double(), want.double(), atol=1e-5, rtol=1e-4)


def _as_tensor(exercise: str, got, expected_shape, hints: dict | None = None) -> torch.Tensor:
    if not isinstance(got, torch.Tensor):
        raise CheckFailed(exercise, f"return a torch.Tensor, got {type(got).__name__}")
    if tuple(got.shape) != tuple(expected_shape):
        hint = (hints or {}).get(tuple(got.shape), "")
        raise CheckFailed(
            exercise, f"expected shape {tuple(expected_shape)}, got {tuple(got.shape)}" + (f": {hint}" if hint else "")
        )
    if not got.is_floating_point():
        raise CheckFailed(exercise, f"expected a floating point tensor, got {got.dtype}")
    if torch.isnan(got).any():
        raise CheckFailed(
            exercise,
            "your output contains NaN: some row of scores is entirely -inf, so the softmax divides "
            "0 by 0. Each token must see at least itself: keep the diagonal visible "
            "(torch.tril(..., diagonal=0))",
        )
    return got


def _name_mistake(exercise: str, got, variants: dict, messages: dict) -> None:
    for name, value in variants.items():
        if _close(got, value):
            raise CheckFailed(exercise, messages[name])


def _view_hint(exercise: str, exc: RuntimeError):
    if "view size is not compatible" in str(exc):
        raise CheckFailed(
            exercise,
            "`.view` failed because transpose returns a non-contiguous tensor; use "
            "`.contiguous().view(...)` or `.reshape(...)` after the transpose",
        ) from None
    raise exc


# --------------------------------------------------------------------------- Exercise 3.1


def check_causal_attention(causal_attention) -> None:
    """`causal_attention(q, k, v)`: (B, T, d) each -> (B, T, d), one causal head."""
    gen = torch.Generator().manual_seed(0)
    for B, T, d in ((2, 5, 8), (1, 7, 16)):
        q, k, v = (torch.randn(B, T, d, generator=gen) for _ in range(3))
        got = call_learner(EX_HEAD, causal_attention, q.clone(), k.clone(), v.clone())
        got = _as_tensor(EX_HEAD, got, (B, T, d), {(B, T, T): "that is the shape of the attention "
                         "weights; multiply them by v to get the output"})
        if _close(got, attend(q, k, v)):
            continue
        variants = {name: attend(q, k, v, name) for name in HEAD_MISTAKES}
        _name_mistake(EX_HEAD, got, variants, HEAD_MISTAKES)
        # not a known mistake: say which property fails
        k2, v2 = k.clone(), v.clone()
        k2[:, -1], v2[:, -1] = torch.randn(B, d, generator=gen), torch.randn(B, d, generator=gen)
        changed = call_learner(EX_HEAD, causal_attention, q.clone(), k2, v2)
        if isinstance(changed, torch.Tensor) and not torch.allclose(changed[:, :-1], got[:, :-1], atol=1e-6):
            raise CheckFailed(EX_HEAD, "changing the LAST token's key and value changed the outputs of "
                              "earlier tokens: future tokens leak in; check the causal mask")
        raise CheckFailed(EX_HEAD, f"the shape is right but the values differ from causal attention "
                          f"(for B={B}, T={T}, d={d}): softmax(q @ k^T / sqrt(d) with the future masked) @ v")
    passed(EX_HEAD, "masked, scaled, softmax over the keys")


# --------------------------------------------------------------------------- Exercise 3.2


def check_split_heads(split_heads) -> None:
    """`split_heads(x, n_head)`: (B, T, C) -> (B, n_head, T, C // n_head)."""
    gen = torch.Generator().manual_seed(0)
    for B, T, C, nh in ((2, 5, 12, 3), (1, 4, 12, 2)):
        hd = C // nh
        x = torch.randn(B, T, C, generator=gen)
        try:
            got = call_learner(EX_SPLIT, split_heads, x.clone(), nh)
        except RuntimeError as exc:
            _view_hint(EX_SPLIT, exc)
        hints = {
            (B, T, nh, hd): "that is (B, T, nh, hd); transpose(1, 2) to put the heads before time",
            (B, nh, hd, T): "that is (B, nh, hd, T); swap only dims 1 and 2 of (B, T, nh, hd)",
        }
        got = _as_tensor(EX_SPLIT, got, (B, nh, T, hd), hints)
        if _close(got, split(x, nh)):
            continue
        _name_mistake(EX_SPLIT, got, {m: split(x, nh, m) for m in SPLIT_MISTAKES}, SPLIT_MISTAKES)
        raise CheckFailed(EX_SPLIT, f"the shape is right but the values are not in place (B={B}, T={T}, "
                          f"C={C}, n_head={nh}): out[b, h, t] must be x[b, t, h*hd:(h+1)*hd]")
    passed(EX_SPLIT, "(B, T, C) -> (B, nh, T, hd), each head a consecutive slice of features")


# --------------------------------------------------------------------------- Exercise 3.3


def check_merge_heads(merge_heads) -> None:
    """`merge_heads(y)`: (B, nh, T, hd) -> (B, T, nh * hd), the inverse of split_heads."""
    gen = torch.Generator().manual_seed(0)
    for B, nh, T, hd in ((2, 3, 5, 4), (1, 2, 3, 6)):
        y = torch.randn(B, nh, T, hd, generator=gen)
        try:
            got = call_learner(EX_MERGE, merge_heads, y.clone())
        except RuntimeError as exc:
            _view_hint(EX_MERGE, exc)
        hints = {(B, T, nh, hd): "that is (B, T, nh, hd); reshape the last two dims into one, nh * hd"}
        got = _as_tensor(EX_MERGE, got, (B, T, nh * hd), hints)
        if _close(got, merge(y)):
            continue
        _name_mistake(EX_MERGE, got, {m: merge(y, m) for m in MERGE_MISTAKES}, MERGE_MISTAKES)
        raise CheckFailed(EX_MERGE, "the shape is right but the values are not in place: out[b, t, "
                          "h*hd:(h+1)*hd] must be y[b, h, t]")
    passed(EX_MERGE, "(B, nh, T, hd) -> (B, T, C), heads side by side in order")


# --------------------------------------------------------------------------- Exercise 3.4


def check_causal_self_attention(attention_cls) -> None:
    """`attention_cls(config)` has c_attn (n_embd -> 3 n_embd) and c_proj, both stored [in, out],
    and `forward(x)` maps (B, T, C) -> (B, T, C) like GPT-2's attention."""
    from gpt2lib.config import GPT2Config

    config = GPT2Config(vocab_size=32, n_positions=16, n_embd=12, n_head=3, n_layer=1,
                        embd_pdrop=0.0, attn_pdrop=0.0, resid_pdrop=0.0)
    C = config.n_embd
    module = call_learner(EX_MODULE, attention_cls, config)
    if not isinstance(module, nn.Module):
        raise CheckFailed(EX_MODULE, f"calling it with a config should build an nn.Module, got {type(module).__name__}")
    params = dict(module.named_parameters())
    expected = {"c_attn.weight": (C, 3 * C), "c_attn.bias": (3 * C,), "c_proj.weight": (C, C), "c_proj.bias": (C,)}
    for name, shape in expected.items():
        if name not in params:
            raise CheckFailed(EX_MODULE, f"no parameter named {name}; keep self.c_attn = Conv1D(n_embd, "
                              f"3 * n_embd) and self.c_proj = Conv1D(n_embd, n_embd) (found: {', '.join(params) or 'none'})")
        if tuple(params[name].shape) != shape:
            flipped = " (that is [out, in], like nn.Linear; GPT-2 stores [in, out]: use Conv1D)" \
                if tuple(params[name].shape) == shape[::-1] else ""
            raise CheckFailed(EX_MODULE, f"{name} has shape {tuple(params[name].shape)}, expected {shape}{flipped}")

    gen = torch.Generator().manual_seed(0)
    with torch.no_grad():  # weights large enough that attention is far from uniform
        tensors = {name: torch.randn(shape, generator=gen) * (0.4 if name.endswith("weight") else 0.2)
                   for name, shape in expected.items()}
        for name, value in tensors.items():
            params[name].copy_(value)
    module.eval()
    w_attn, b_attn, w_proj, b_proj = (tensors[n] for n in expected)
    for B, T in ((2, 5), (1, 7)):
        x = torch.randn(B, T, C, generator=gen)
        try:
            with torch.no_grad():
                got = call_learner(EX_MODULE, module, x.clone())
        except RuntimeError as exc:
            _view_hint(EX_MODULE, exc)
        got = _as_tensor(EX_MODULE, got, (B, T, C))
        if _close(got, full_attention(x, w_attn, b_attn, w_proj, b_proj, config.n_head)):
            continue
        variants = {m: full_attention(x, w_attn, b_attn, w_proj, b_proj, config.n_head, m) for m in MODULE_MISTAKES}
        _name_mistake(EX_MODULE, got, variants, MODULE_MISTAKES)
        raise CheckFailed(EX_MODULE, f"the shape is right but the output differs from GPT-2's attention "
                          f"(B={B}, T={T}); go through c_attn -> q, k, v -> heads -> causal attention -> merge -> c_proj")
    passed(EX_MODULE, "matches GPT-2's attention: fused q, k, v, heads, causal mask, c_proj")
