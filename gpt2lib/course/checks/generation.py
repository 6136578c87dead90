"""Checks for chapter 9's exercises: temperature, top-k, top-p, attention at an offset, the
KV cache write, the cached forward pass and the split matrix multiply.

Each check runs the learner's answer on small cases, compares it with the right answer and with
the planted wrong answers in the module-level `Mistake` lists below (the tests are parametrised
over those lists), and names the mistake when one of them matches. Where a whole family of
wrong answers shows one symptom (a cache length that never grows, k + 1 tokens kept, ...), the
check also looks for the symptom and names it with the same planted mistake's message.
"""

from __future__ import annotations

from typing import ClassVar

import torch

from gpt2lib.course.checks._core import (
    CheckFailed,
    Mistake,
    call_learner,
    close,
    expect_tensor,
    first_mistake,
    named,
    passed,
)

EX_TEMPERATURE = "Exercise 9.1 (apply_temperature)"
EX_TOP_K = "Exercise 9.2 (top_k_filter)"
EX_TOP_P = "Exercise 9.3 (top_p_filter)"
EX_OFFSET = "Exercise 9.4 (attend_with_offset)"
EX_WRITE = "Exercise 9.5 (write_kv)"
EX_FORWARD = "Exercise 9.6 (cached_forward)"
EX_SPLIT = "Exercise 9.7 (split_matmul)"

NEG_INF = float("-inf")


def _tiny_model():
    from gpt2lib.config import GPT2Config
    from gpt2lib.model import GPT2

    torch.manual_seed(0)
    return GPT2(GPT2Config(n_layer=2, n_head=2, n_embd=16, n_positions=32, vocab_size=50)).eval()


# --------------------------------------------------------------------------- 9.5 write_kv


def _store(k_buf, v_buf, k, v, start):
    """Write k, v at positions start .. start + T - 1 of the buffers; -> start + T."""
    end = start + k.shape[2]
    k_buf[:, :, start:end], v_buf[:, :, start:end] = k, v
    return end


def _write_kv_right(k_buf, v_buf, k, v, start):
    end = _store(k_buf, v_buf, k, v, start)
    return k_buf[:, :, :end], v_buf[:, :, :end]


def _write_at_zero(k_buf, v_buf, k, v, start):
    end = start + _store(k_buf, v_buf, k, v, 0)
    return k_buf[:, :, :end], v_buf[:, :, :end]


def _write_kv_swapped(k_buf, v_buf, k, v, start):
    keys, values = _write_kv_right(k_buf, v_buf, k, v, start)
    return values, keys


def _past_and_new_unstored(k_buf, v_buf, k, v, start):
    return torch.cat([k_buf[:, :, :start], k], 2), torch.cat([v_buf[:, :, :start], v], 2)


def _store_then(returned):
    """A write_kv that stores the new tokens right, then returns returned(k_buf, v_buf, k, v)."""
    def write_kv(k_buf, v_buf, k, v, start):
        _store(k_buf, v_buf, k, v, start)
        return returned(k_buf, v_buf, k, v)
    return write_kv


# fn(k_buf, v_buf, k, v, start) -> (keys, values), a wrong write_kv
WRITE_KV_MISTAKES = [
    Mistake("keys and values swapped", "keys and values are swapped: return (keys, values)",
            _write_kv_swapped),
    Mistake("whole buffer", "you returned the whole buffer (all max_len positions), but only "
            "start + T are filled: attention would also see the empty slots. Return "
            "k_buf[:, :, :start + T]", _store_then(lambda k_buf, v_buf, k, v: (k_buf, v_buf))),
    Mistake("only the new tokens", "you returned only the new keys and values: the cached past "
            "must come too, (B, nh, start + T, hd)", _store_then(lambda k_buf, v_buf, k, v: (k, v))),
    Mistake("written at 0", "the new keys went to positions 0.. instead of start..: the cache "
            "position is not used, so every step overwrites the first tokens", _write_at_zero),
    Mistake("not stored", "the returned tensors are right, but the new keys/values were not "
            "written into k_buf / v_buf: the next step will not find them. Assign into the "
            "buffers (k_buf[:, :, start:end] = k)", _past_and_new_unstored),
]


def _write_twice(write_kv, exercise):
    """Two calls on fresh zero buffers: 3 tokens at start 0, then 2 at start 3.

    -> (keys, values) the second call returned, then the buffers k_buf, v_buf after it."""
    gen = torch.Generator().manual_seed(0)
    B, nh, max_len, hd = 2, 3, 8, 4
    k_buf, v_buf = torch.zeros(B, nh, max_len, hd), torch.zeros(B, nh, max_len, hd)
    k1, v1 = torch.randn(B, nh, 3, hd, generator=gen), torch.randn(B, nh, 3, hd, generator=gen)
    k2, v2 = torch.randn(B, nh, 2, hd, generator=gen), torch.randn(B, nh, 2, hd, generator=gen)
    for k, v, start in ((k1, v1, 0), (k2, v2, 3)):  # 3 tokens already cached at the second
        result = call_learner(exercise, write_kv, k_buf, v_buf, k, v, start)
        if not isinstance(result, (tuple, list)) or len(result) != 2:
            raise CheckFailed(exercise, "return two tensors: (keys so far, values so far)")
    keys, values = (expect_tensor(exercise, t, what="each returned item") for t in result)
    return keys, values, k_buf, v_buf


def _same_writes(got, want) -> bool:
    return all(close(a, b) for a, b in zip(got, want))


def _write_kv_symptom(got, want) -> Mistake | None:
    """The planted mistake whose symptom `got` shows, for wrong answers not planted exactly."""
    keys, values, k_buf, v_buf = got
    want_keys, want_values, _, _ = want
    k2, v2 = want_keys[:, :, 3:5], want_values[:, :, 3:5]  # the second call's new tokens
    if close(keys, want_values) and close(values, want_keys):
        return named(WRITE_KV_MISTAKES, "keys and values swapped")
    if keys.shape[2] == k_buf.shape[2]:
        return named(WRITE_KV_MISTAKES, "whole buffer")
    if keys.shape[2] == 2:
        return named(WRITE_KV_MISTAKES, "only the new tokens")
    stored = close(k_buf[:, :, 3:5], k2) and close(v_buf[:, :, 3:5], v2)
    if close(k_buf[:, :, :2], k2) and not close(k_buf[:, :, 3:5], k2):
        return named(WRITE_KV_MISTAKES, "written at 0")
    returned_right = close(keys, want_keys) and close(values, want_values)
    if not stored and (returned_right or not bool(k_buf.any())):
        return named(WRITE_KV_MISTAKES, "not stored")
    return None


def check_write_kv(write_kv) -> None:
    """write_kv(k_buf, v_buf, k, v, start) -> (keys so far, values so far)."""
    ex = EX_WRITE
    got = _write_twice(write_kv, ex)
    want = _write_twice(_write_kv_right, ex)
    if not _same_writes(got, want):
        mistake = first_mistake(WRITE_KV_MISTAKES,
                                lambda m: _same_writes(got, _write_twice(m.fn, ex)))
        mistake = mistake or _write_kv_symptom(got, want)
        if mistake is not None:
            raise CheckFailed(ex, mistake.message)
        if not (close(got[2], want[2]) and close(got[3], want[3])):
            raise CheckFailed(ex, "k_buf[:, :, start:start + T] should hold the new keys after "
                                  "the call (and v_buf the values)")
        raise CheckFailed(ex, f"expected keys/values of shape {tuple(want[0].shape)} holding "
                              f"the 3 cached then the 2 new tokens; got {tuple(got[0].shape)}")

    # In a real model: cached greedy decoding must equal the uncached one.
    from gpt2lib.generation import generate, sample_next
    from gpt2lib.kvcache import KVCache

    model = _tiny_model()
    idx = torch.randint(0, 50, (2, 4), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        cache = KVCache.for_model(model, 2, 12, write=write_kv)
        seq, logits = idx, model(idx, kv_cache=cache)[:, -1]
        for _ in range(8):
            token = sample_next(logits, temperature=0)[:, None]
            seq = torch.cat([seq, token], 1)
            logits = model(token, kv_cache=cache)[:, -1]
        want_seq = generate(model, idx, 8, temperature=0, use_cache=False)
    if not torch.equal(seq[:, :12], want_seq):
        raise CheckFailed(ex, "on its own cases it looks right, but a model using it decodes "
                              "differently from the uncached model")
    passed(ex, "cached greedy decoding equals the uncached model")


# --------------------------------------------------------------------------- 9.6 cached_forward


def _cached_forward(*, offset=True, advance="once", use_cache=True, ln_f=True):
    """cached_forward, right (the defaults) or with one planted mistake.

    offset: positions continue after the cache. advance: "once" after the blocks, "per layer"
    or "never". use_cache: each block gets its layer's cache. ln_f: the final LayerNorm."""
    def cached_forward(model, idx, cache):
        T = idx.shape[1]
        start = cache.length if offset else 0
        x = model.wte(idx) + model.wpe(torch.arange(start, start + T, device=idx.device))
        for i, block in enumerate(model.h):
            x = block(x, kv_cache=cache.layers[i]) if use_cache else block(x)
            if advance == "per layer":
                cache.advance(T)
        if advance == "once":
            cache.advance(T)
        return (model.ln_f(x) if ln_f else x) @ model.wte.weight.T  # (B, T, vocab)
    return cached_forward


# fn(model, idx, cache) -> logits (B, T, vocab), a wrong cached_forward
CACHED_FORWARD_MISTAKES = [
    Mistake("never advanced", "cache.length is still 0 after the prompt: call cache.advance(T) "
            "once after the blocks, or the cache position is never advanced and the next token "
            "overwrites the prompt's keys", _cached_forward(advance="never")),
    Mistake("advanced per layer", "cache.length moved once per layer: call cache.advance(T) "
            "once, after the loop over the blocks", _cached_forward(advance="per layer")),
    Mistake("positions restart", "positions restart at 0 at every call: after the prompt, the "
            "new token sits at position cache.length, so use "
            "torch.arange(cache.length, cache.length + T)", _cached_forward(offset=False)),
    Mistake("no layer cache", "the blocks never get the cache (block(x, kv_cache=cache.layers[i])):"
            " each new token only sees itself", _cached_forward(use_cache=False)),
    Mistake("no final LayerNorm", "the final LayerNorm (model.ln_f) is missing before the readout",
            _cached_forward(ln_f=False)),
]


def _run_forward(fn, model, ids, prompt_len, exercise):
    """The prompt in one call, then one token a call. -> (logits of each call, cache.length
    after each call)."""
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
    model = _tiny_model()
    config = model.config
    ids = torch.randint(0, 50, (2, 8), generator=torch.Generator().manual_seed(1))
    prompt_len = 5
    with torch.no_grad():
        outs, lengths = _run_forward(cached_forward, model, ids, prompt_len, ex)
        full = model(ids)  # (B, 8, V): what every step must reproduce
    outs = [expect_tensor(ex, out, what="the logits") for out in outs]
    if lengths[0] == 0:
        raise CheckFailed(ex, named(CACHED_FORWARD_MISTAKES, "never advanced").message)
    if lengths[0] == config.n_layer * prompt_len:
        raise CheckFailed(ex, named(CACHED_FORWARD_MISTAKES, "advanced per layer").message)
    if lengths != list(range(prompt_len, ids.shape[1] + 1)):
        raise CheckFailed(ex, f"after each call cache.length should grow by T; it went "
                              f"{lengths}")
    if outs[0].shape != (2, prompt_len, config.vocab_size):
        raise CheckFailed(ex, f"expected logits of shape (B, T, vocab) = "
                              f"{(2, prompt_len, config.vocab_size)}, got {tuple(outs[0].shape)}")
    got = torch.cat(outs, 1)
    if close(got, full, atol=1e-4):
        passed(ex, "prompt and three decoding steps match the uncached model")
        return

    def decodes_like(mistake):
        with torch.no_grad():
            wrong, _ = _run_forward(mistake.fn, model, ids, prompt_len, ex)
        return close(got, torch.cat(wrong, 1), atol=1e-4)

    mistake = first_mistake(CACHED_FORWARD_MISTAKES, decodes_like)
    if mistake is not None:
        raise CheckFailed(ex, mistake.message)
    if close(outs[0], full[:, :prompt_len], atol=1e-4):
        raise CheckFailed(ex, "the prompt's logits are right but the decoding steps are not: "
                              "check the positions and that each block gets cache.layers[i]")
    raise CheckFailed(ex, "the logits differ from the uncached model's: embed (wte + wpe at the "
                          "right positions), run each block with its layer cache, advance, "
                          "ln_f, then multiply by wte.weight.T")


# --------------------------------------------------------------------------- 9.1 temperature


# fn(logits, temperature) -> what that wrong apply_temperature returns
TEMPERATURE_MISTAKES = [
    Mistake("probabilities", "you returned probabilities; return logits (the caller applies "
            "softmax)", lambda logits, t: torch.softmax(logits / t, -1)),
    Mistake("after softmax", "temperature was applied after softmax: divide the logits by the "
            "temperature before softmax", lambda logits, t: torch.softmax(logits, -1) / t),
    Mistake("after softmax, softmax again", "temperature was applied after softmax: divide the "
            "logits by the temperature before softmax",
            lambda logits, t: torch.softmax(torch.softmax(logits, -1) / t, -1)),
    Mistake("multiplied", "you multiplied by the temperature: divide by it (a low temperature "
            "must sharpen the distribution)", lambda logits, t: logits * t),
    Mistake("no effect", "the temperature has no effect: divide the logits by it",
            lambda logits, t: logits.clone()),
]


def check_apply_temperature(apply_temperature) -> None:
    """apply_temperature(logits, temperature) -> logits for softmax."""
    ex = EX_TEMPERATURE
    logits = torch.tensor([[2.0, 1.0, 0.5, -1.0, -3.0], [0.0, 0.3, -0.2, 1.5, 0.1]])
    for t in (0.5, 2.0, 1.0):
        got = call_learner(ex, apply_temperature, logits.clone(), t)
        got = expect_tensor(ex, got, tuple(logits.shape), what="your result")
        if close(torch.softmax(got, -1), torch.softmax(logits / t, -1)):
            continue  # any logits with the right softmax are right (a shift changes nothing)
        mistake = first_mistake(TEMPERATURE_MISTAKES,
                                lambda m, got=got, t=t: close(got, m.fn(logits, t)))
        if mistake is not None:
            raise CheckFailed(ex, f"{mistake.message} (temperature {t})")
        raise CheckFailed(ex, f"softmax of your result at temperature {t} should equal "
                              f"softmax(logits / {t})")
    passed(ex)


# --------------------------------------------------------------------------- 9.2 top-k

NAN_FILL = ("your result contains NaN: softmax of a row with a NaN is NaN everywhere. Give the "
            "removed logits float('-inf')")
POSINF_FILL = ("your result contains +inf: softmax of a row with +inf is NaN (inf - inf). Removed "
               "logits must be float('-inf'), minus infinity, so that exp gives them exactly 0")
ZERO_FILL = ("removed logits were set to 0, but exp(0) = 1 is still a probability: set them to "
             "float('-inf')")


def _kept(x):
    return torch.isfinite(x)


def _same_filter(got, wrong) -> bool:
    """Whether two filtered logits keep the same tokens (finite) and put 0 in the same places
    (0 is the one wrong finite fill the checks name; real logits here are never exactly 0)."""
    return torch.equal(_kept(got), _kept(wrong)) and torch.equal(got == 0, wrong == 0)


def _refuse_bad_fill(exercise, got):
    """A filtered row must still give a valid softmax: only -inf may mark a removed token."""
    if bool(torch.isnan(got).any()):
        raise CheckFailed(exercise, NAN_FILL)
    if bool(torch.isposinf(got).any()):
        raise CheckFailed(exercise, POSINF_FILL)


def _filtered(exercise, filter_fn, logits, knob):
    """filter_fn(logits, knob) as float64 logits of logits' shape, NaN and +inf refused."""
    got = call_learner(exercise, filter_fn, logits.clone(), knob)
    got = expect_tensor(exercise, got, tuple(logits.shape), what="your result", finite=False)
    _refuse_bad_fill(exercise, got)
    return got


def _keep_ranked(logits, count, *, largest=True, fill=NEG_INF):
    """logits with all but the `count` largest (or smallest) of each row set to `fill`."""
    order = logits.argsort(-1, descending=largest)
    kept = torch.zeros_like(logits, dtype=torch.bool).scatter(-1, order[..., :max(count, 0)], True)
    return logits.masked_fill(~kept, fill)


# fn(logits, k) -> what that wrong top_k_filter returns
TOP_K_MISTAKES = [
    Mistake("smallest", "you kept the k SMALLEST logits: keep the largest (torch.topk gives the "
            "largest by default)", lambda logits, k: _keep_ranked(logits, k, largest=False)),
    Mistake("zero fill", ZERO_FILL, lambda logits, k: _keep_ranked(logits, k, fill=0.0)),
    Mistake("NaN fill", NAN_FILL, lambda logits, k: _keep_ranked(logits, k, fill=float("nan"))),
    Mistake("+inf fill", POSINF_FILL, lambda logits, k: _keep_ranked(logits, k, fill=float("inf"))),
    Mistake("nothing removed", "every token was kept: set all but the k largest logits to -inf",
            lambda logits, k: logits.clone()),
    Mistake("one too many", "off by one: you kept k + 1 tokens per row (values[..., k] is the "
            "(k+1)-th largest; use values[..., -1:] of topk(k), or [..., k - 1])",
            lambda logits, k: _keep_ranked(logits, k + 1)),
    Mistake("one too few", "off by one: you kept only k - 1 tokens per row (keep logits >= the "
            "k-th largest, not > it)", lambda logits, k: _keep_ranked(logits, k - 1)),
]


def _top_k_symptom(got, logits, k) -> Mistake | None:
    """The planted mistake whose symptom `got` shows, for wrong answers not planted exactly."""
    kept, vocab = _kept(got), logits.shape[-1]
    counts = kept.sum(-1)
    if torch.equal(kept, _kept(_keep_ranked(logits, k, largest=False))) and k < vocab:
        return named(TOP_K_MISTAKES, "smallest")
    if bool((counts == vocab).all()) and k < vocab and not bool(torch.isinf(got).any()):
        return named(TOP_K_MISTAKES, "zero fill" if bool((got == 0).any()) else "nothing removed")
    if bool((counts == k + 1).all()):
        return named(TOP_K_MISTAKES, "one too many")
    if bool((counts == k - 1).all()):
        return named(TOP_K_MISTAKES, "one too few")
    return None


def check_top_k_filter(top_k_filter) -> None:
    """top_k_filter(logits, k) -> logits with all but the k largest per row set to -inf."""
    ex = EX_TOP_K
    gen = torch.Generator().manual_seed(0)
    logits = torch.randn(3, 12, generator=gen) * 3  # no ties
    for k in (1, 3, 7, 12):
        got = _filtered(ex, top_k_filter, logits, k)
        want_kept = _kept(_keep_ranked(logits, k))
        if torch.equal(_kept(got), want_kept):
            if not torch.equal(got[want_kept], logits.double()[want_kept]):
                raise CheckFailed(ex, "the kept logits must stay unchanged")
            continue
        mistake = first_mistake(TOP_K_MISTAKES,
                                lambda m, got=got, k=k: _same_filter(got, m.fn(logits, k)))
        mistake = mistake or _top_k_symptom(got, logits, k)
        if mistake is not None:
            raise CheckFailed(ex, f"with k={k}: {mistake.message}")
        raise CheckFailed(ex, f"with k={k} keep exactly the {k} largest logits of each row "
                              f"(you kept {_kept(got).sum(-1).tolist()})")
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


def _top_p(*, fill=NEG_INF, invert=False, **mask_options):
    """A top_p_filter, right (the defaults) or with one planted mistake (see _nucleus_mask)."""
    def top_p_filter(logits, p):
        keep = _nucleus_mask(torch.softmax(logits, -1), p, **mask_options)
        return logits.masked_fill(keep if invert else ~keep, fill)
    return top_p_filter


_ASCENDING = "you sorted ascending: the nucleus is made of the MOST likely tokens (descending=True)"

# fn(logits, p) -> what that wrong top_p_filter returns
TOP_P_MISTAKES = [
    Mistake("crossing token dropped",
            "the token that carries the running total past p is missing: keep it too (drop a "
            "token only when the probability BEFORE it already reaches p), else a small p keeps "
            "nothing", _top_p(include_crossing=False)),
    Mistake("ascending", _ASCENDING, _top_p(descending=False)),
    Mistake("ascending, crossing token dropped", _ASCENDING,
            _top_p(descending=False, include_crossing=False)),
    Mistake("sorted order", "the mask is still in sorted order: scatter it back to vocabulary "
            "order before using it", _top_p(scatter_back=False)),
    Mistake("inverted", "the mask is inverted: you kept the tail and dropped the nucleus",
            _top_p(invert=True)),
    Mistake("zero fill", ZERO_FILL, _top_p(fill=0.0)),
    Mistake("NaN fill", NAN_FILL, _top_p(fill=float("nan"))),
    Mistake("+inf fill", POSINF_FILL, _top_p(fill=float("inf"))),
]


def check_top_p_filter(top_p_filter) -> None:
    """top_p_filter(logits, p) -> logits outside the nucleus set to -inf."""
    ex = EX_TOP_P
    # probabilities in scrambled order: sorted they are 0.4, 0.25, 0.15, 0.1, 0.06, 0.04
    probs = torch.tensor([[0.1, 0.4, 0.04, 0.25, 0.06, 0.15],
                          [0.25, 0.06, 0.15, 0.04, 0.4, 0.1]])
    logits = probs.log()
    ps = (0.3, 0.5, 0.6, 0.7, 0.85, 0.97, 1.0)
    got = {p: _filtered(ex, top_p_filter, logits, p) for p in ps}
    if all(torch.equal(_kept(got[p]), _nucleus_mask(probs, p)) for p in ps):
        for p in ps:
            kept = _kept(got[p])
            if not torch.equal(got[p][kept], logits.double()[kept]):
                raise CheckFailed(ex, "the kept logits must stay unchanged")
        passed(ex)
        return
    mistake = first_mistake(TOP_P_MISTAKES, lambda m: all(
        _same_filter(got[p], m.fn(logits.clone(), p)) for p in ps))
    if mistake is None and all(torch.equal(_kept(got[p]), ~_nucleus_mask(probs, p))
                               for p in ps if p < 1):
        mistake = named(TOP_P_MISTAKES, "inverted")  # whatever it does at p = 1
    if mistake is None and any(bool((got[p] == 0).any()) and not bool(torch.isinf(got[p]).any())
                               for p in ps[:3]):
        mistake = named(TOP_P_MISTAKES, "zero fill")
    if mistake is not None:
        raise CheckFailed(ex, mistake.message)
    p = next(p for p in ps if not torch.equal(_kept(got[p]), _nucleus_mask(probs, p)))
    raise CheckFailed(ex, f"with p={p} keep the {_nucleus_mask(probs, p).sum(-1).tolist()} most "
                          f"likely tokens of each row (the fewest whose probabilities add up to "
                          f">= p); you kept {_kept(got[p]).sum(-1).tolist()}")


# --------------------------------------------------------------------------- 9.7 split_matmul


class _BatchedMultiplies(torch.overrides.TorchFunctionMode):
    """Records the batch sizes of the 3-D multiplies (bmm, matmul, @, einsum) run inside it."""

    WATCHED: ClassVar[set] = {torch.bmm, torch.matmul, torch.Tensor.bmm, torch.Tensor.matmul,
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


def _x_slabs(x, parts):  # (rows, n_in) -> (parts, rows, n_in / parts): slab i, columns i*slab..
    rows, n_in = x.shape
    return x.view(rows, parts, n_in // parts).transpose(0, 1)


def _x_slabs_untransposed(x, parts):  # the right shape, but mixing numbers of different rows
    rows, n_in = x.shape
    return x.reshape(parts, rows, n_in // parts)


def _weight_slabs(weight, parts):  # (n_in, n_out) -> (parts, n_in / parts, n_out): row blocks
    n_in, n_out = weight.shape
    return weight.view(parts, n_in // parts, n_out)


def _weight_interleaved(weight, parts):  # slab i takes rows i, i + parts, ...
    n_in, n_out = weight.shape
    return weight.view(n_in // parts, parts, n_out).transpose(0, 1)


def _slab_products(x, weight, parts, x_slabs=_x_slabs, weight_slabs=_weight_slabs):
    """(parts, rows, n_out): slab i of x times slab i of weight."""
    return torch.bmm(x_slabs(x, parts), weight_slabs(weight, parts))


def _right_for_small_inputs_only(x, weight, parts):
    """Right for the first case, wrong at GPT-2's width (here: a precision loss there)."""
    out = _slab_products(x, weight, parts).sum(0)
    return out if x.shape[1] <= 12 else out.half().float()


# fn(x, weight, parts) -> what that wrong split_matmul returns
SPLIT_MISTAKES = [
    Mistake("partial products", "you returned the partial products, one per slab, shape "
            "(parts, rows, n_out); add them up: .sum(dim=0)", _slab_products),
    Mistake("summed over the wrong dimension", "you summed over the wrong dimension: the partial "
            "products are (parts, rows, n_out); sum over dim 0, the slabs",
            lambda x, weight, parts: _slab_products(x, weight, parts).sum(1)),
    Mistake("averaged", "the result is x @ weight divided by parts: you averaged the partial "
            "products (mean); add them (sum)",
            lambda x, weight, parts: _slab_products(x, weight, parts).mean(0)),
    Mistake("x cut wrongly", "x's slabs are cut wrongly: x.view(parts, rows, n_in // parts) "
            "mixes numbers of different rows. Cut each row into slabs, "
            "x.view(rows, parts, n_in // parts), then move the slab dimension first with "
            ".transpose(0, 1)", lambda x, weight, parts: _slab_products(
                x, weight, parts, x_slabs=_x_slabs_untransposed).sum(0)),
    Mistake("weight interleaved", "weight's slabs must be blocks of consecutive rows, "
            "weight.view(parts, n_in // parts, n_out); weight.view(n_in // parts, parts, "
            "n_out).transpose(0, 1) takes every parts-th row instead",
            lambda x, weight, parts: _slab_products(
                x, weight, parts, weight_slabs=_weight_interleaved).sum(0)),
    Mistake("not in slabs", "the numbers are right, but not computed in slabs: the point is one "
            "batched multiply of the slabs, torch.bmm of (parts, rows, n_in/parts) and "
            "(parts, n_in/parts, n_out)", lambda x, weight, parts: x @ weight),
    Mistake("fixed sizes", "right for x of shape (3, 12) in 4 slabs, wrong for one row of 768 in "
            "8 slabs: use the arguments' shapes, not fixed numbers", _right_for_small_inputs_only),
]


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
        got = call_learner(ex, split_matmul, x, weight, parts)
    got = expect_tensor(ex, got, what="the result")
    if not close(got, want):
        mistake = first_mistake(SPLIT_MISTAKES, lambda m: close(got, m.fn(x, weight, parts)))
        if mistake is None and tuple(got.shape) in ((parts, n_out), (parts, rows)):
            mistake = named(SPLIT_MISTAKES, "summed over the wrong dimension")
        if mistake is not None:
            raise CheckFailed(ex, mistake.message)
        if got.shape != want.shape:
            raise CheckFailed(ex, f"x @ weight has shape {tuple(want.shape)} (rows, n_out), got "
                                  f"{tuple(got.shape)}")
        raise CheckFailed(ex, "the result differs from x @ weight: slab i of x (its columns "
                              "i * n_in/parts ...) must meet slab i of weight (the same rows)")
    if parts not in recorder.batches:
        raise CheckFailed(ex, named(SPLIT_MISTAKES, "not in slabs").message)
    x1 = torch.randn(1, 768, generator=gen)  # one row, GPT-2's width, 8 slabs
    w1 = torch.randn(768, 96, generator=gen)
    got1 = expect_tensor(ex, call_learner(ex, split_matmul, x1, w1, 8), what="the result")
    if not close(got1, x1 @ w1, atol=1e-4):
        raise CheckFailed(ex, named(SPLIT_MISTAKES, "fixed sizes").message)
    passed(ex, "the slab products add up to x @ weight, in one batched multiply")


# --------------------------------------------------------------------------- 9.4 offset mask


def _attention_masked_by(keep):
    """attend_with_offset computed with the (T, past + T) boolean mask keep(T, past)."""
    def attend(q, k, v, past):
        T = q.shape[-2]
        scores = q @ k.transpose(-2, -1) / q.shape[-1] ** 0.5
        scores = scores.masked_fill(~keep(T, past), float("-inf"))
        return scores.softmax(-1) @ v
    return attend


def _tril(T, past, diagonal):
    return torch.ones(T, past + T, dtype=torch.bool).tril(diagonal=diagonal)


_attend_with_offset_right = _attention_masked_by(lambda T, past: _tril(T, past, past))

# fn(q, k, v, past) -> what that wrong attend_with_offset returns
OFFSET_MASK_MISTAKES = [
    Mistake("offset ignored",
            "the offset is ignored: query i sits at position past + i, not i, so it sees keys "
            "0 .. past + i. With tril(diagonal=0) (or is_causal=True) a new token cannot see "
            "most of the cache. Shift the diagonal by past",
            _attention_masked_by(lambda T, past: _tril(T, past, 0))),
    Mistake("one too many",
            "off by one: each query also sees the key right after it, its own future. Query i "
            "may look at keys 0 .. past + i, included: tril(diagonal=past), not past + 1",
            _attention_masked_by(lambda T, past: _tril(T, past, past + 1))),
    Mistake("one too few",
            "off by one: each query misses its own key. Query i may look at keys 0 .. past + i, "
            "included: tril(diagonal=past), not past - 1",
            _attention_masked_by(lambda T, past: _tril(T, past, past - 1))),
    Mistake("wrong side",
            "the mask is on the wrong side: you hid the past and kept the future. Keep the "
            "lower triangle (keys at or before the query), hide the keys after it",
            _attention_masked_by(lambda T, past: ~_tril(T, past, past - 1))),
    Mistake("no mask",
            "nothing is masked: a new query may not look at the new tokens after it. Hide the "
            "keys at positions after past + i with -inf before softmax",
            _attention_masked_by(lambda T, past: torch.ones(T, past + T, dtype=torch.bool))),
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
        got = call_learner(ex, attend_with_offset, q.clone(), k.clone(), v.clone(), past)
        got = expect_tensor(ex, got, (B, nh, T, hd), what="the attention output", finite=False)
        if bool(torch.isnan(got).any()):
            raise CheckFailed(ex, "the output has NaN: some query had every key hidden, so softmax "
                                  "had nothing to share out. That happens when the mask is on "
                                  "the wrong side (masked_fill where a query MAY look): hide the "
                                  "keys after position past + i, keep the rest")
        if close(got, _attend_with_offset_right(q, k, v, past)):
            continue
        mistake = first_mistake(OFFSET_MASK_MISTAKES,
                                lambda m, got=got, q=q, k=k, v=v, past=past:
                                close(got, m.fn(q, k, v, past)))
        if mistake is not None:
            raise CheckFailed(ex, mistake.message)
        raise CheckFailed(ex, f"with {T} new queries after {past} cached tokens the output "
                              "differs from causal attention at offset past: query i sees keys "
                              "0 .. past + i")
    passed(ex, "new queries see the whole cache and the new keys up to their own position")


# Each check with the planted mistakes it names (the tests run every one through its check).
MISTAKES_BY_CHECK = {
    check_apply_temperature: TEMPERATURE_MISTAKES,
    check_top_k_filter: TOP_K_MISTAKES,
    check_top_p_filter: TOP_P_MISTAKES,
    check_attend_with_offset: OFFSET_MASK_MISTAKES,
    check_write_kv: WRITE_KV_MISTAKES,
    check_cached_forward: CACHED_FORWARD_MISTAKES,
    check_split_matmul: SPLIT_MISTAKES,
}
