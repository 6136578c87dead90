"""Checks for chapter 9's exercises: temperature, top-k, top-p, attention at an offset, the
KV cache write, the cached forward pass and the split matrix multiply.

Each check runs the learner's answer on small cases, compares it with the right answer and with
known wrong answers (cache position never advanced, positions not offset after the prompt,
temperature applied after softmax, top-k off by one, top-p dropping the token that crosses p,
...), and names the mistake when one of those matches.
"""

from __future__ import annotations

import torch

from gpt2lib.checks._core import (CheckFailed, Mistake, call_learner, close, expect_tensor,
                                  first_mistake, passed)

EX_TEMPERATURE = "Exercise 9.1 (apply_temperature)"
EX_TOP_K = "Exercise 9.2 (top_k_filter)"
EX_TOP_P = "Exercise 9.3 (top_p_filter)"
EX_OFFSET = "Exercise 9.4 (attend_with_offset)"
EX_WRITE = "Exercise 9.5 (write_kv)"
EX_FORWARD = "Exercise 9.6 (cached_forward)"
EX_SPLIT = "Exercise 9.7 (split_matmul)"

NEG_INF = float("-inf")


def _same(got, want, atol=1e-5) -> bool:
    return (isinstance(got, torch.Tensor) and got.shape == want.shape
            and torch.allclose(got.double(), want.double(), atol=atol, rtol=1e-5))


def _tensor_or_fail(exercise, got, what):
    if not isinstance(got, torch.Tensor):
        raise CheckFailed(exercise, f"{what} should be a torch.Tensor, got {type(got).__name__}")
    return got


# --------------------------------------------------------------------------- 9.5 write_kv


def check_write_kv(write_kv) -> None:
    """write_kv(k_buf, v_buf, k, v, start) -> (keys so far, values so far)."""
    ex = EX_WRITE
    gen = torch.Generator().manual_seed(0)
    B, nh, max_len, hd = 2, 3, 8, 4
    k_buf, v_buf = torch.zeros(B, nh, max_len, hd), torch.zeros(B, nh, max_len, hd)
    k1, v1 = torch.randn(B, nh, 3, hd, generator=gen), torch.randn(B, nh, 3, hd, generator=gen)
    k2, v2 = torch.randn(B, nh, 2, hd, generator=gen), torch.randn(B, nh, 2, hd, generator=gen)

    result = call_learner(ex, write_kv, k_buf, v_buf, k1, v1, 0)
    if not isinstance(result, (tuple, list)) or len(result) != 2:
        raise CheckFailed(ex, "return two tensors: (keys so far, values so far)")
    result = call_learner(ex, write_kv, k_buf, v_buf, k2, v2, 3)  # 3 tokens already cached
    keys, values = (_tensor_or_fail(ex, t, "each returned item") for t in result)
    want_k, want_v = torch.cat([k1, k2], 2), torch.cat([v1, v2], 2)  # (B, nh, 5, hd)

    if _same(keys, want_v) and _same(values, want_k):
        raise CheckFailed(ex, "keys and values are swapped: return (keys, values)")
    if keys.shape[2] == max_len:
        raise CheckFailed(ex, f"you returned the whole buffer ({max_len} positions) but only "
                              f"start + T = 5 are filled: attention would also see the empty "
                              "slots. Return k_buf[:, :, :start + T]")
    if keys.shape[2] == 2:
        raise CheckFailed(ex, "you returned only the new keys and values: the cached past must "
                              "come too, (B, nh, start + T, hd)")
    if torch.equal(k_buf[:, :, :2], k2) and not torch.equal(k_buf[:, :, 3:5], k2):
        raise CheckFailed(ex, "the new keys went to positions 0.. instead of start..: the cache "
                              "position is not used, so every step overwrites the first tokens")
    if not torch.equal(k_buf[:, :, 3:5], k2) or not torch.equal(v_buf[:, :, 3:5], v2):
        if (_same(keys, want_k) and _same(values, want_v)) or not bool(k_buf.any()):
            raise CheckFailed(ex, "the returned tensors are right, but the new keys/values were "
                                  "not written into k_buf / v_buf: the next step will not find "
                                  "them. Assign into the buffers (k_buf[:, :, start:end] = k)")
        raise CheckFailed(ex, "k_buf[:, :, start:start + T] should hold the new keys after the "
                              "call (and v_buf the values)")
    if not (_same(keys, want_k) and _same(values, want_v)):
        raise CheckFailed(ex, f"expected keys/values of shape {tuple(want_k.shape)} holding the "
                              f"3 cached then the 2 new tokens; got {tuple(keys.shape)}")

    # In a real model: cached greedy decoding must equal the uncached one.
    from gpt2lib.config import GPT2Config
    from gpt2lib.generation import generate, sample_next
    from gpt2lib.kvcache import KVCache
    from gpt2lib.model import GPT2

    torch.manual_seed(0)
    model = GPT2(GPT2Config(n_layer=2, n_head=2, n_embd=16, n_positions=32, vocab_size=50)).eval()
    idx = torch.randint(0, 50, (2, 4), generator=gen)
    with torch.no_grad():
        cache = KVCache.for_model(model, 2, 12, write=write_kv)
        seq, logits = idx, model(idx, kv_cache=cache)[:, -1]
        for _ in range(8):
            token = sample_next(logits, temperature=0)[:, None]
            seq = torch.cat([seq, token], 1)
            logits = model(token, kv_cache=cache)[:, -1]
        want = generate(model, idx, 8, temperature=0, use_cache=False)
    if not torch.equal(seq[:, :12], want):
        raise CheckFailed(ex, "on its own cases it looks right, but a model using it decodes "
                              "differently from the uncached model")
    passed(ex, "cached greedy decoding equals the uncached model")


# --------------------------------------------------------------------------- 9.6 cached_forward


def _forward_variant(model, idx, cache, offset=True, advance=True, use_cache=True, ln_f=True):
    T = idx.shape[1]
    past = cache.length
    pos = torch.arange(past if offset else 0, (past if offset else 0) + T, device=idx.device)
    x = model.wte(idx) + model.wpe(pos)
    for i, block in enumerate(model.h):
        x = block(x, kv_cache=cache.layers[i]) if use_cache else block(x)
    if advance:
        cache.advance(T)
    return (model.ln_f(x) if ln_f else x) @ model.wte.weight.T


_FORWARD_MISTAKES = [
    (dict(offset=False), "positions restart at 0 at every call: after the prompt, the new "
                         "token sits at position cache.length, so use "
                         "torch.arange(cache.length, cache.length + T)"),
    (dict(use_cache=False), "the blocks never get the cache (block(x, kv_cache=cache.layers[i])):"
                            " each new token only sees itself"),
    (dict(ln_f=False), "the final LayerNorm (model.ln_f) is missing before the readout"),
]


def _run_forward(fn, model, ids, prompt_len, exercise):
    from gpt2lib.kvcache import KVCache

    # room to spare, so that a cache advanced too far still runs and can be diagnosed
    cache = KVCache.for_model(model, ids.shape[0], model.config.n_positions)
    outs = [call_learner(exercise, fn, model, ids[:, :prompt_len], cache)]
    lengths = [cache.length]
    for t in range(prompt_len, ids.shape[1]):
        outs.append(call_learner(exercise, fn, model, ids[:, t:t + 1], cache))
        lengths.append(cache.length)
    return outs, lengths


def check_cached_forward(cached_forward) -> None:
    """cached_forward(model, idx, cache) -> logits (B, T, vocab), one step of cached decoding."""
    ex = EX_FORWARD
    from gpt2lib.config import GPT2Config
    from gpt2lib.kvcache import KVCache
    from gpt2lib.model import GPT2

    torch.manual_seed(0)
    config = GPT2Config(n_layer=2, n_head=2, n_embd=16, n_positions=32, vocab_size=50)
    model = GPT2(config).eval()
    ids = torch.randint(0, 50, (2, 8), generator=torch.Generator().manual_seed(1))
    prompt_len = 5
    with torch.no_grad():
        outs, lengths = _run_forward(cached_forward, model, ids, prompt_len, ex)
        full = model(ids)  # (B, 8, V): what every step must reproduce
    for out in outs:
        _tensor_or_fail(ex, out, "the logits")
    if lengths[0] == 0:
        raise CheckFailed(ex, "cache.length is still 0 after the prompt: call cache.advance(T) "
                              "once after the blocks, or the cache position is never advanced "
                              "and the next token overwrites the prompt's keys")
    if lengths[0] == config.n_layer * prompt_len:
        raise CheckFailed(ex, "cache.length moved once per layer: call cache.advance(T) once, "
                              "after the loop over the blocks")
    if lengths != list(range(prompt_len, ids.shape[1] + 1)):
        raise CheckFailed(ex, f"after each call cache.length should grow by T; it went "
                              f"{lengths}")
    if outs[0].shape != (2, prompt_len, config.vocab_size):
        raise CheckFailed(ex, f"expected logits of shape (B, T, vocab) = "
                              f"{(2, prompt_len, config.vocab_size)}, got {tuple(outs[0].shape)}")
    got = torch.cat(outs, 1)
    if _same(got, full, atol=1e-4):
        passed(ex, "prompt and three decoding steps match the uncached model")
        return
    with torch.no_grad():
        for options, message in _FORWARD_MISTAKES:
            cache = KVCache.for_model(model, 2, 8)
            wrong = [_forward_variant(model, ids[:, :prompt_len], cache, **options)]
            wrong += [_forward_variant(model, ids[:, t:t + 1], cache, **options)
                      for t in range(prompt_len, 8)]
            if _same(got, torch.cat(wrong, 1), atol=1e-4):
                raise CheckFailed(ex, message)
    if _same(outs[0], full[:, :prompt_len], atol=1e-4):
        raise CheckFailed(ex, "the prompt's logits are right but the decoding steps are not: "
                              "check the positions and that each block gets cache.layers[i]")
    raise CheckFailed(ex, "the logits differ from the uncached model's: embed (wte + wpe at the "
                          "right positions), run each block with its layer cache, advance, "
                          "ln_f, then multiply by wte.weight.T")


# --------------------------------------------------------------------------- 9.1 temperature


def check_apply_temperature(apply_temperature) -> None:
    """apply_temperature(logits, temperature) -> logits for softmax."""
    ex = EX_TEMPERATURE
    logits = torch.tensor([[2.0, 1.0, 0.5, -1.0, -3.0], [0.0, 0.3, -0.2, 1.5, 0.1]])
    for t in (0.5, 2.0, 1.0):
        got = _tensor_or_fail(ex, call_learner(ex, apply_temperature, logits.clone(), t),
                              "the result")
        if got.shape != logits.shape:
            raise CheckFailed(ex, f"keep the shape {tuple(logits.shape)}, got {tuple(got.shape)}")
        want = torch.softmax(logits / t, -1)
        if _same(torch.softmax(got, -1), want):
            continue
        probs = torch.softmax(logits, -1)
        if _same(got, want):
            raise CheckFailed(ex, "you returned probabilities; return logits (the caller "
                                  "applies softmax)")
        if _same(got, probs / t) or _same(got, torch.softmax(probs / t, -1)):
            raise CheckFailed(ex, "temperature was applied after softmax: divide the logits "
                                  "by the temperature before softmax")
        if _same(got, logits * t):
            raise CheckFailed(ex, "you multiplied by the temperature: divide by it (a low "
                                  "temperature must sharpen the distribution)")
        if _same(got, logits):
            raise CheckFailed(ex, f"the temperature ({t}) has no effect: divide the logits by it")
        raise CheckFailed(ex, f"softmax of your result at temperature {t} should equal "
                              f"softmax(logits / {t})")
    passed(ex)


# --------------------------------------------------------------------------- 9.2 top-k


def _kept(x):
    return torch.isfinite(x)


def _refuse_bad_fill(exercise, got):
    """A filtered row must still give a valid softmax: only -inf may mark a removed token."""
    if bool(torch.isnan(got).any()):
        raise CheckFailed(exercise, "your result contains NaN: softmax of a row with a NaN is NaN "
                                    "everywhere. Give the removed logits float('-inf')")
    if bool(torch.isposinf(got).any()):
        raise CheckFailed(exercise, "your result contains +inf: softmax of a row with +inf is NaN "
                                    "(inf - inf). Removed logits must be float('-inf'), minus "
                                    "infinity, so that exp gives them exactly 0")


def check_top_k_filter(top_k_filter) -> None:
    """top_k_filter(logits, k) -> logits with all but the k largest per row set to -inf."""
    ex = EX_TOP_K
    gen = torch.Generator().manual_seed(0)
    logits = torch.randn(3, 12, generator=gen) * 3  # no ties
    for k in (1, 3, 7, 12):
        got = _tensor_or_fail(ex, call_learner(ex, top_k_filter, logits.clone(), k), "the result")
        if got.shape != logits.shape:
            raise CheckFailed(ex, f"keep the shape {tuple(logits.shape)}, got {tuple(got.shape)}")
        _refuse_bad_fill(ex, got)
        order = logits.argsort(-1, descending=True)
        want_kept = torch.zeros_like(logits, dtype=torch.bool).scatter(-1, order[:, :k], True)
        if torch.equal(_kept(got), want_kept):
            if not torch.equal(got[want_kept], logits[want_kept]):
                raise CheckFailed(ex, "the kept logits must stay unchanged")
            continue
        counts = _kept(got).sum(-1)
        smallest = torch.zeros_like(want_kept).scatter(-1, order[:, -k:], True)
        if torch.equal(_kept(got), smallest) and k < 12:
            raise CheckFailed(ex, "you kept the k SMALLEST logits: keep the largest "
                                  "(torch.topk gives the largest by default)")
        if bool((counts == 12).all()) and k < 12 and not bool(torch.isinf(got).any()):
            if bool((got == 0).any()):
                raise CheckFailed(ex, "removed logits were set to 0, but exp(0) = 1 is still a "
                                      "probability: set them to float('-inf')")
            raise CheckFailed(ex, f"with k={k} every token was kept: set the others to -inf")
        if bool((counts == k + 1).all()):
            raise CheckFailed(ex, f"off by one: with k={k} you kept {k + 1} tokens per row "
                                  "(values[..., k] is the (k+1)-th largest; use values[..., -1:] "
                                  "of topk(k), or [..., k - 1])")
        if bool((counts == k - 1).all()):
            raise CheckFailed(ex, f"off by one: with k={k} you kept only {k - 1} tokens per row "
                                  "(keep logits >= the k-th largest, not > it)")
        raise CheckFailed(ex, f"with k={k} keep exactly the {k} largest logits of each row "
                              f"(you kept {counts.tolist()})")
    passed(ex)


# --------------------------------------------------------------------------- 9.3 top-p


def _nucleus_mask(probs, p, descending=True, include_crossing=True, scatter_back=True):
    """Which tokens a top-p filter keeps, right (defaults) or with one classic mistake."""
    sorted_probs, order = probs.sort(-1, descending=descending)
    running = sorted_probs.cumsum(-1)
    if include_crossing:
        keep_sorted = (running - sorted_probs) < p  # the mass before the token is still < p
    else:
        keep_sorted = running <= p + 1e-7  # stops before the token that crosses p
    if not scatter_back:
        return keep_sorted
    return torch.zeros_like(keep_sorted).scatter(-1, order, keep_sorted)


_TOP_P_MISTAKES = [
    (dict(include_crossing=False),
     "the token that carries the running total past p is missing: keep it too (drop a token "
     "only when the probability BEFORE it already reaches p), else a small p keeps nothing"),
    (dict(descending=False),
     "you sorted ascending: the nucleus is made of the MOST likely tokens (descending=True)"),
    (dict(descending=False, include_crossing=False),
     "you sorted ascending: the nucleus is made of the MOST likely tokens (descending=True)"),
    (dict(scatter_back=False),
     "the mask is still in sorted order: scatter it back to vocabulary order before using it"),
]


def check_top_p_filter(top_p_filter) -> None:
    """top_p_filter(logits, p) -> logits outside the nucleus set to -inf."""
    ex = EX_TOP_P
    # probabilities in scrambled order: sorted they are 0.4, 0.25, 0.15, 0.1, 0.06, 0.04
    probs = torch.tensor([[0.1, 0.4, 0.04, 0.25, 0.06, 0.15],
                          [0.25, 0.06, 0.15, 0.04, 0.4, 0.1]])
    logits = probs.log()
    ps = (0.3, 0.5, 0.6, 0.7, 0.85, 0.97, 1.0)
    got = {}
    for p in ps:
        out = _tensor_or_fail(ex, call_learner(ex, top_p_filter, logits.clone(), p), "the result")
        if out.shape != logits.shape:
            raise CheckFailed(ex, f"keep the shape {tuple(logits.shape)}, got {tuple(out.shape)}")
        _refuse_bad_fill(ex, out)
        got[p] = out
    if all(torch.equal(_kept(got[p]), _nucleus_mask(probs, p)) for p in ps):
        for p in ps:
            kept = _kept(got[p])
            if not torch.equal(got[p][kept], logits[kept]):
                raise CheckFailed(ex, "the kept logits must stay unchanged")
        passed(ex)
        return
    for options, message in _TOP_P_MISTAKES:
        if all(torch.equal(_kept(got[p]), _nucleus_mask(probs, p, **options)) for p in ps):
            raise CheckFailed(ex, message)
    if all(torch.equal(_kept(got[p]), ~_nucleus_mask(probs, p)) for p in ps if p < 1):
        raise CheckFailed(ex, "the mask is inverted: you kept the tail and dropped the nucleus")
    if any(bool((got[p] == 0).any()) and not bool(torch.isinf(got[p]).any()) for p in ps[:3]):
        raise CheckFailed(ex, "removed logits were set to 0, but exp(0) = 1 is still a "
                              "probability: set them to float('-inf')")
    for p in ps:
        want = _nucleus_mask(probs, p)
        if not torch.equal(_kept(got[p]), want):
            raise CheckFailed(ex, f"with p={p} keep the {want.sum(-1).tolist()} most likely "
                                  f"tokens of each row (the fewest whose probabilities add up "
                                  f"to >= p); you kept {_kept(got[p]).sum(-1).tolist()}")


# --------------------------------------------------------------------------- 9.7 split_matmul


class _BatchedMultiplies(torch.overrides.TorchFunctionMode):
    """Records the batch sizes of the 3-D multiplies (bmm, matmul, @, einsum) run inside it."""

    WATCHED = {torch.bmm, torch.matmul, torch.Tensor.bmm, torch.Tensor.matmul,
               torch.Tensor.__matmul__, torch.baddbmm, torch.einsum}

    def __init__(self):
        super().__init__()
        self.batches = []

    def __torch_function__(self, func, types, args=(), kwargs=None):
        if func in self.WATCHED:
            tensors = [a for a in args if isinstance(a, torch.Tensor)]
            if func is torch.einsum and len(args) > 1:
                tensors = [a for a in args[1:] if isinstance(a, torch.Tensor)]
            if tensors and tensors[0].dim() == 3:
                self.batches.append(tensors[0].shape[0])
        return func(*args, **(kwargs or {}))


def check_split_matmul(split_matmul) -> None:
    """split_matmul(x, weight, parts) -> x @ weight, computed as `parts` slab products."""
    ex = EX_SPLIT
    gen = torch.Generator().manual_seed(0)
    rows, n_in, n_out, parts = 3, 12, 5, 4
    x = torch.randn(rows, n_in, generator=gen)
    weight = torch.randn(n_in, n_out, generator=gen)
    want = x @ weight
    recorder = _BatchedMultiplies()
    with recorder:
        got = _tensor_or_fail(ex, call_learner(ex, split_matmul, x, weight, parts), "the result")
    slab = n_in // parts
    partials = torch.stack([x[:, i * slab:(i + 1) * slab] @ weight[i * slab:(i + 1) * slab]
                            for i in range(parts)])  # (parts, rows, n_out)
    if got.shape == partials.shape and _same(got, partials):
        raise CheckFailed(ex, f"you returned the {parts} partial products, shape "
                              f"{tuple(partials.shape)}; add them up: .sum(dim=0)")
    if got.shape != want.shape:
        if got.shape in ((parts, n_out), (parts, rows)):
            raise CheckFailed(ex, f"the result has shape {tuple(got.shape)}: you summed over "
                                  "the wrong dimension. The partial products are (parts, rows, "
                                  "n_out); sum over dim 0, the slabs")
        raise CheckFailed(ex, f"x @ weight has shape {tuple(want.shape)} (rows, n_out), got "
                              f"{tuple(got.shape)}")
    if _same(got, want / parts):
        raise CheckFailed(ex, "the result is x @ weight divided by parts: you averaged the partial "
                              "products (mean); add them (sum)")
    wrong_x = torch.bmm(x.reshape(parts, rows, slab), weight.view(parts, slab, n_out)).sum(0)
    if _same(got, wrong_x):
        raise CheckFailed(ex, "x's slabs are cut wrongly: x.view(parts, rows, n_in // parts) "
                              "mixes numbers of different rows. Cut each row into slabs, "
                              "x.view(rows, parts, n_in // parts), then move the slab "
                              "dimension first with .transpose(0, 1)")
    interleaved = weight.view(slab, parts, n_out).transpose(0, 1)  # rows i, i + parts, ...
    wrong_w = torch.bmm(x.view(rows, parts, slab).transpose(0, 1), interleaved).sum(0)
    if _same(got, wrong_w):
        raise CheckFailed(ex, "weight's slabs must be blocks of consecutive rows, "
                              "weight.view(parts, n_in // parts, n_out); "
                              "weight.view(n_in // parts, parts, n_out).transpose(0, 1) takes "
                              "every parts-th row instead")
    if not _same(got, want):
        raise CheckFailed(ex, "the result differs from x @ weight: slab i of x (its columns "
                              "i * n_in/parts ...) must meet slab i of weight (the same rows)")
    if parts not in recorder.batches:
        raise CheckFailed(ex, "the numbers are right, but not computed in slabs: the point is "
                              f"one batched multiply of {parts} slabs, torch.bmm of "
                              "(parts, rows, n_in/parts) and (parts, n_in/parts, n_out)")
    x1 = torch.randn(1, 768, generator=gen)  # one row, GPT-2's width, 8 slabs
    w1 = torch.randn(768, 96, generator=gen)
    got1 = _tensor_or_fail(ex, call_learner(ex, split_matmul, x1, w1, 8), "the result")
    if not _same(got1, x1 @ w1, atol=1e-4):
        raise CheckFailed(ex, "right for x of shape (3, 12) in 4 slabs, wrong for one row of "
                              "768 in 8 slabs: use the arguments' shapes, not fixed numbers")
    passed(ex, "the slab products add up to x @ weight, in one batched multiply")


# --------------------------------------------------------------------------- 9.4 offset mask


def _offset_attention(q, k, v, past, keep):
    """Attention of q over k, v with the (T, past + T) boolean mask keep(T, past)."""
    T = q.shape[-2]
    scores = q @ k.transpose(-2, -1) / q.shape[-1] ** 0.5
    scores = scores.masked_fill(~keep(T, past), float("-inf"))
    return scores.softmax(-1) @ v


def _tril(T, past, diagonal):
    return torch.ones(T, past + T, dtype=torch.bool).tril(diagonal=diagonal)


OFFSET_MASK_MISTAKES = [
    Mistake("offset ignored",
            "the offset is ignored: query i sits at position past + i, not i, so it sees keys "
            "0 .. past + i. With tril(diagonal=0) (or is_causal=True) a new token cannot see "
            "most of the cache. Shift the diagonal by past",
            lambda q, k, v, past: _offset_attention(q, k, v, past, lambda T, p: _tril(T, p, 0))),
    Mistake("one too many",
            "off by one: each query also sees the key right after it, its own future. Query i "
            "may look at keys 0 .. past + i, included: tril(diagonal=past), not past + 1",
            lambda q, k, v, past: _offset_attention(q, k, v, past,
                                                    lambda T, p: _tril(T, p, p + 1))),
    Mistake("one too few",
            "off by one: each query misses its own key. Query i may look at keys 0 .. past + i, "
            "included: tril(diagonal=past), not past - 1",
            lambda q, k, v, past: _offset_attention(q, k, v, past,
                                                    lambda T, p: _tril(T, p, p - 1))),
    Mistake("wrong side",
            "the mask is on the wrong side: you hid the past and kept the future. Keep the "
            "lower triangle (keys at or before the query), hide the keys after it",
            lambda q, k, v, past: _offset_attention(q, k, v, past,
                                                    lambda T, p: ~_tril(T, p, p - 1))),
    Mistake("no mask",
            "nothing is masked: a new query may not look at the new tokens after it. Hide the "
            "keys at positions after past + i with -inf before softmax",
            lambda q, k, v, past: _offset_attention(
                q, k, v, past, lambda T, p: torch.ones(T, p + T, dtype=torch.bool))),
]


def check_attend_with_offset(attend_with_offset) -> None:
    """attend_with_offset(q, k, v, past) -> (B, nh, T, hd), causal with the cache's offset."""
    ex = EX_OFFSET
    gen = torch.Generator().manual_seed(0)
    B, nh, hd = 2, 2, 4
    cases = [(4, 3), (1, 5), (3, 0), (1, 0), (2, 1)]  # (T new, past): chunk, decode, prefill
    for T, past in cases:
        q = torch.randn(B, nh, T, hd, generator=gen)
        k = torch.randn(B, nh, past + T, hd, generator=gen)
        v = torch.randn(B, nh, past + T, hd, generator=gen)
        args = (q.clone(), k.clone(), v.clone(), past)
        got = call_learner(ex, attend_with_offset, *args)
        got = expect_tensor(ex, got, (B, nh, T, hd), what="the attention output", finite=False)
        if bool(torch.isnan(got).any()):
            raise CheckFailed(ex, "the output has NaN: some query had every key hidden, so softmax "
                                  "had nothing to share out. That happens when the mask is on "
                                  "the wrong side (masked_fill where a query MAY look): hide the "
                                  "keys after position past + i, keep the rest")
        want = _offset_attention(q, k, v, past, lambda t, p: _tril(t, p, p))
        if close(got, want):
            continue
        mistake = first_mistake(OFFSET_MASK_MISTAKES,
                                lambda m: close(got, m.fn(q, k, v, past)))
        if mistake is not None:
            raise CheckFailed(ex, mistake.message)
        raise CheckFailed(ex, f"with {T} new queries after {past} cached tokens the output "
                              "differs from causal attention at offset past: query i sees keys "
                              "0 .. past + i")
    passed(ex, "new queries see the whole cache and the new keys up to their own position")
