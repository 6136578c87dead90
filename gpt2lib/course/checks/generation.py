"""Checks for chapter 9: Exercises 9.1 to 9.11 (sampling filters, the sampling step, attention at
an offset, the KV cache, its decode loop and its costs) and the beam-search challenge."""

from __future__ import annotations

import functools
import math

import torch

from gpt2lib.chapters import decoding
from gpt2lib.chapters.attention import causal_mask
from gpt2lib.chapters.config import GPT2Config
from gpt2lib.course.checks import _core as core
from gpt2lib.generation import generate
from gpt2lib.kvcache import KVCache
from gpt2lib.speed.measure import decode_bytes_per_token

EX_TEMPERATURE = "Exercise 9.1 (apply_temperature)"
EX_TOP_K = "Exercise 9.1 (top_k_filter)"
EX_FILTERS = "Exercise 9.1 (apply_temperature, top_k_filter)"
EX_TOP_P = "Exercise 9.3 (top_p_filter)"
EX_SAMPLE = "Exercise 9.4 (sample_token)"
EX_OFFSET = "Exercise 9.5 (attend_with_offset)"
EX_KV_BYTES = "Exercise 9.6 (kv_bytes_per_token)"
EX_WRITE = "Exercise 9.7 (write_kv)"
EX_CACHE = "Exercise 9.7 (SimpleKVCache)"
EX_GAP = "Exercise 9.8 (cache_gap)"
EX_LOOP = "Exercise 9.9 (generate_cached)"
EX_GAIN = "Exercise 9.10 (cache_gain)"
EX_WEIGHT_BYTES = "Exercise 9.11 (weight_bytes_per_token)"
CHALLENGE = "Challenge (beam search)"

NEG_INF = float("-inf")
IN_PLACE = "your function changed the logits it was given (masked_fill_, div_, or an assignment into them): the caller's logits must stay as they were; build a new tensor"
NAN_FILL = "your result contains NaN: softmax of a row with a NaN is NaN everywhere. Give the removed logits float('-inf')"
POSINF_FILL = "your result contains +inf: softmax of a row with +inf is NaN (inf - inf). Removed logits must be float('-inf'), minus infinity, so that exp gives them exactly 0"
ZERO_FILL = (
    "removed logits were set to 0, but exp(0) = 1 is still a probability: set them to float('-inf')"
)


def _tiny_model(n_layer=2, n_positions=32, **sizes):
    with torch.random.fork_rng():  # the same weights every time; the notebook's RNG untouched
        return core.tiny_gpt2(n_layer=n_layer, n_positions=n_positions, **sizes)


def _byte_counts(exercise, fn, cases):
    """[fn(*case) for case in cases], each of them a number (of bytes)."""
    got = [core.call_learner(exercise, fn, *case) for case in cases]
    for value in got:
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise core.CheckFailed(
                exercise, f"return a number of bytes, got {type(value).__name__}"
            )
    return got


# --------------------------------------------------------------------------- 9.7 write_kv
def _write_kv(k_buf, v_buf, k, v, start, *, mistake=""):
    """write_kv, right, or with the planted mistake `mistake` (a name in WRITE_KV_MISTAKES)."""
    if mistake == "not stored":
        return torch.cat([k_buf[:, :, :start], k], 2), torch.cat([v_buf[:, :, :start], v], 2)
    first, end = 0 if mistake == "written at 0" else start, start + k.shape[2]
    k_buf[:, :, first : first + k.shape[2]], v_buf[:, :, first : first + k.shape[2]] = k, v
    keys, values = k_buf[:, :, :end], v_buf[:, :, :end]
    if mistake == "copies":
        return keys.clone(), values.clone()
    return {
        "keys and values swapped": (values, keys),
        "whole buffer": (k_buf, v_buf),
        "only the new tokens": (k, v),
    }.get(mistake, (keys, values))


WRITE_KV_MISTAKES = core.variants(
    _write_kv,
    {
        "keys and values swapped": "keys and values are swapped: return (keys, values)",
        "whole buffer": "you returned the whole buffer (all max_len positions), but only start + T are filled: attention would also see the empty slots. Return k_buf[:, :, :start + T]",
        "only the new tokens": "you returned only the new keys and values: return the past too, (B, nh, start + T, hd)",
        "written at 0": "the new keys went to positions 0.. instead of start..: the cache position is not used, so every step overwrites the first tokens",
        "not stored": "the returned tensors are right, but the new keys/values were not written into k_buf / v_buf: the next step will not find them. Assign into the buffers (k_buf[:, :, start:end] = k)",
        "copies": "the values are right, but you returned copies of the buffers (clone, cat, contiguous ...): return views, k_buf[:, :, :start + T], so that a step copies nothing",
    },
)


def _write_twice(write_kv, exercise):
    """Two calls on fresh zero buffers, 3 tokens at start 0 then 2 at start 3 -> the second call's
    (keys, values), the buffers k_buf, v_buf after it, and whether those are views of them."""
    gen = torch.Generator().manual_seed(0)
    B, nh, max_len, hd = 2, 3, 8, 4
    k_buf, v_buf = torch.zeros(B, nh, max_len, hd), torch.zeros(B, nh, max_len, hd)
    for T, start in ((3, 0), (2, 3)):  # 3 tokens already cached at the second
        k, v = torch.randn(B, nh, T, hd, generator=gen), torch.randn(B, nh, T, hd, generator=gen)
        result = core.call_learner(exercise, write_kv, k_buf, v_buf, k, v, start)
        if not isinstance(result, (tuple, list)) or len(result) != 2:
            raise core.CheckFailed(exercise, "return two tensors: (keys so far, values so far)")
    views = all(  # views of the buffers share their storage; a copy has its own
        isinstance(t, torch.Tensor) and t.untyped_storage().data_ptr() == buf.data_ptr()
        for t, buf in zip(result, (k_buf, v_buf))
    )
    keys, values = (core.expect_tensor(exercise, t, what="each returned item") for t in result)
    return keys, values, k_buf, v_buf, views


def _same_writes(got, want) -> bool:
    return all(core.close(a, b) for a, b in zip(got[:4], want[:4])) and got[4] == want[4]


def _write_kv_symptom(got, want) -> str | None:
    """The planted mistake whose symptom `got` shows, for wrong answers not planted exactly."""
    keys, values, k_buf, v_buf, views = got
    want_keys, want_values = want[:2]
    k2, v2 = want_keys[:, :, 3:5], want_values[:, :, 3:5]  # the second call's new tokens
    stored = core.close(k_buf[:, :, 3:5], k2) and core.close(v_buf[:, :, 3:5], v2)
    returned_right = core.close(keys, want_keys) and core.close(values, want_values)
    if core.close(keys, want_values) and core.close(values, want_keys):
        return "keys and values swapped"
    if keys.shape[2] == k_buf.shape[2]:
        return "whole buffer"
    if keys.shape[2] == 2:
        return "only the new tokens"
    if core.close(k_buf[:, :, :2], k2) and not core.close(k_buf[:, :, 3:5], k2):
        return "written at 0"
    if not stored and (returned_right or not bool(k_buf.any())):
        return "not stored"
    return "copies" if stored and returned_right and not views else None


def check_kv_cache(write_kv, SimpleKVCache) -> None:
    """Exercise 9.7's two parts, each checked in full before the exercise passes once."""
    with core.one_pass(
        "Exercise 9.7 (write_kv, SimpleKVCache)", "a tiny model's cached logits equal its full pass"
    ):
        check_write_kv(write_kv)
        check_simple_kv_cache(SimpleKVCache)


def check_write_kv(write_kv) -> None:
    """write_kv(k_buf, v_buf, k, v, start), buffers (B, nh, max_len, hd), new k and v
    (B, nh, T, hd) -> (keys, values) so far, each (B, nh, start + T, hd)."""
    ex = EX_WRITE
    got, want = _write_twice(write_kv, ex), _write_twice(_write_kv, ex)
    if not _same_writes(got, want):
        stored = core.close(got[2], want[2]) and core.close(got[3], want[3])
        core.fail_with(
            ex,
            WRITE_KV_MISTAKES,
            lambda m: _same_writes(got, _write_twice(m.fn, ex)),
            f"expected keys/values of shape {tuple(want[0].shape)} holding the 3 cached then the 2 new tokens; got {tuple(got[0].shape)}"
            if stored
            else "k_buf[:, :, start:start + T] should hold the new keys after the call (and v_buf the values)",
            symptom=_write_kv_symptom(got, want),
        )
    model = _tiny_model()  # in a real model, cached greedy decoding must equal the uncached one
    idx = torch.randint(0, 50, (2, 4), generator=torch.Generator().manual_seed(1))
    cache = KVCache.for_model(model, 2, 12, write=write_kv)
    cached = _generate_cached(model, idx, 8, _greedy, cache)
    if not torch.equal(cached, _recomputed(model, idx, 8, _greedy)):
        raise core.CheckFailed(
            ex,
            "on its own cases it looks right, but a model using it decodes differently from the uncached model",
        )
    core.passed(ex, "cached greedy decoding equals the uncached model")


# --------------------------------------------------------------------------- 9.1 temperature
AFTER_SOFTMAX = (
    "temperature was applied after softmax: divide the logits by the temperature before softmax"
)


def _temperature(logits, t, *, mistake=""):
    """apply_temperature, right, or with the planted mistake `mistake` (TEMPERATURE_MISTAKES)."""
    if mistake == "in place":
        return logits.div_(t)
    if mistake == "probabilities":
        return torch.softmax(logits / t, -1)
    if mistake.startswith("after softmax"):
        scaled = torch.softmax(logits, -1) / t
        return torch.softmax(scaled, -1) if mistake == "after softmax, softmax again" else scaled
    return {"multiplied": logits * t, "no effect": logits.clone()}.get(mistake, logits / t)


TEMPERATURE_MISTAKES = core.variants(
    _temperature,
    {
        "probabilities": "you returned probabilities; return logits (the caller applies softmax)",
        "after softmax": AFTER_SOFTMAX,
        "after softmax, softmax again": AFTER_SOFTMAX,
        "multiplied": "you multiplied by the temperature: divide by it, so that a low temperature sharpens",
        "no effect": "the temperature has no effect: divide the logits by it",
        "in place": IN_PLACE,
    },
)


def check_temperature_and_top_k(apply_temperature, top_k_filter) -> None:
    """Exercise 9.1's two functions, each checked in full before the exercise passes."""
    _check_temperature(apply_temperature)
    _check_top_k(top_k_filter)
    core.passed(EX_FILTERS)


def check_apply_temperature(apply_temperature) -> None:
    """Exercise 9.1 with the reference top_k_filter: the temperature alone."""
    check_temperature_and_top_k(apply_temperature, decoding.top_k_filter)


def check_top_k_filter(top_k_filter) -> None:
    """Exercise 9.1 with the reference apply_temperature: top-k alone."""
    check_temperature_and_top_k(decoding.apply_temperature, top_k_filter)


def _filtered(exercise, filter_fn, logits, knob, *, removes=True):
    """filter_fn(logits, knob) as float64 logits of logits' shape, the caller's logits unchanged.
    removes: -inf may mark a removed token, NaN and +inf may not (else all must be finite)."""
    given = logits.clone()
    got = core.call_learner(exercise, filter_fn, given, knob)
    core.require(exercise, torch.equal(given, logits), IN_PLACE)
    got = core.expect_tensor(exercise, got, logits.shape, what="your result", finite=not removes)
    core.require(exercise, not (removes and bool(torch.isnan(got).any())), NAN_FILL)
    core.require(exercise, not (removes and bool(torch.isposinf(got).any())), POSINF_FILL)
    return got


def _check_temperature(apply_temperature) -> None:
    """apply_temperature(logits (B, V), temperature) -> logits (B, V) for softmax."""
    logits = torch.tensor([[2.0, 1.0, 0.5, -1.0, -3.0], [0.0, 0.3, -0.2, 1.5, 0.1]])
    for t in (0.5, 2.0, 1.0):
        got = _filtered(EX_TEMPERATURE, apply_temperature, logits, t, removes=False)
        # any logits with the right softmax are right (a shift changes nothing)
        if not core.close(torch.softmax(got, -1), torch.softmax(logits / t, -1)):
            core.fail_with(
                EX_TEMPERATURE,
                TEMPERATURE_MISTAKES,
                lambda m: core.close(got, m.fn(logits.clone(), t)),
                f"softmax of your result at temperature {t} should equal softmax(logits / {t})",
                suffix=f" (temperature {t})",
            )


# --------------------------------------------------------------------------- 9.2 top-k
_FILLS = {"zero fill": 0.0, "NaN fill": float("nan"), "+inf fill": float("inf")}


def _removed(logits, keep, mistake):
    """logits outside `keep` set to -inf, or as the planted fill or in-place `mistake` does."""
    filled = logits.masked_fill(~keep, _FILLS.get(mistake, NEG_INF))
    return logits.copy_(filled) if mistake == "in place" else filled


def _same_filter(got, wrong) -> bool:
    """Whether two filtered logits keep the same tokens (finite) and put 0 in the same places
    (0 is the one wrong finite fill the checks name; real logits here are never exactly 0)."""
    return torch.equal(torch.isfinite(got), torch.isfinite(wrong)) and torch.equal(
        got == 0, wrong == 0
    )


def _kept_unchanged(exercise, got, logits):
    kept = torch.isfinite(got)
    core.require(
        exercise,
        torch.equal(got[kept], logits.double()[kept]),
        "the kept logits must stay unchanged",
    )


def _top_k(logits, k, *, mistake=""):
    """top_k_filter, right, or with the planted mistake `mistake` (a name in TOP_K_MISTAKES)."""
    if mistake == "nothing removed":
        return logits.clone()
    count = k + {"one too many": 1, "one too few": -1}.get(mistake, 0)
    order = logits.argsort(-1, descending=mistake != "smallest")
    keep = torch.zeros_like(logits, dtype=torch.bool).scatter(-1, order[..., : max(count, 0)], True)
    return _removed(logits, keep, mistake)


TOP_K_MISTAKES = core.variants(
    _top_k,
    {
        "smallest": "you kept the k SMALLEST logits: keep the largest (torch.topk gives those by default)",
        "zero fill": ZERO_FILL,
        "NaN fill": NAN_FILL,
        "+inf fill": POSINF_FILL,
        "nothing removed": "every token was kept: set all but the k largest logits to -inf",
        "one too many": "off by one: you kept k + 1 tokens per row (values[..., k] is the (k+1)-th largest; use values[..., -1:] of topk(k), or [..., k - 1])",
        "one too few": "off by one: you kept only k - 1 tokens per row (keep logits >= the k-th largest, not >)",
        "in place": IN_PLACE,
    },
)


def _top_k_symptom(got, logits, k) -> str | None:
    """The planted mistake whose symptom `got` shows, for wrong answers not planted exactly."""
    kept, vocab = torch.isfinite(got), logits.shape[-1]
    counts = kept.sum(-1)
    if torch.equal(kept, torch.isfinite(_top_k(logits, k, mistake="smallest"))) and k < vocab:
        return "smallest"
    if bool((counts == vocab).all()) and k < vocab and not bool(torch.isinf(got).any()):
        return "zero fill" if bool((got == 0).any()) else "nothing removed"
    if bool((counts == k + 1).all()):
        return "one too many"
    return "one too few" if bool((counts == k - 1).all()) else None


def _check_top_k(top_k_filter) -> None:
    """top_k_filter(logits (B, V), k) -> (B, V), all but the k largest of each row set to -inf."""
    ex = EX_TOP_K
    logits = torch.randn(3, 12, generator=torch.Generator().manual_seed(0)) * 3  # no ties
    for k in (1, 3, 7, 12):
        got = _filtered(ex, top_k_filter, logits, k)
        if torch.equal(torch.isfinite(got), torch.isfinite(_top_k(logits, k))):
            _kept_unchanged(ex, got, logits)
            continue
        core.fail_with(
            ex,
            TOP_K_MISTAKES,
            lambda m: _same_filter(got, m.fn(logits.clone(), k)),
            f"with k={k} keep exactly the {k} largest logits of each row (you kept {torch.isfinite(got).sum(-1).tolist()})",
            symptom=_top_k_symptom(got, logits, k),
            prefix=f"with k={k}: ",
        )


# --------------------------------------------------------------------------- 9.3 top-p
def _nucleus_mask(probs, p, mistake=""):
    """Which tokens top-p keeps, right or with the planted mistake `mistake` (TOP_P_MISTAKES)."""
    sorted_probs, order = probs.sort(-1, descending=not mistake.startswith("ascending"))
    running = sorted_probs.cumsum(-1)
    if mistake.endswith("crossing token dropped"):
        keep_sorted = running <= p + 1e-7  # stops before the token that crosses p
    else:
        keep_sorted = (running - sorted_probs) < p  # the mass before the token is still < p
    if mistake == "sorted order":
        return keep_sorted
    return torch.zeros_like(keep_sorted).scatter(-1, order, keep_sorted)


def _top_p(logits, p, *, mistake=""):
    """top_p_filter, right, or with the planted mistake `mistake` (a name in TOP_P_MISTAKES)."""
    keep = _nucleus_mask(torch.softmax(logits, -1), p, mistake)
    return _removed(logits, ~keep if mistake == "inverted" else keep, mistake)


_ASCENDING = "you sorted ascending: the nucleus is made of the MOST likely tokens (descending=True)"

TOP_P_MISTAKES = core.variants(
    _top_p,
    {
        "crossing token dropped": "the token that carries the running total past p is missing: keep it too (drop a token only when the probability BEFORE it already reaches p), else a small p keeps nothing",
        "ascending": _ASCENDING,
        "ascending, crossing token dropped": _ASCENDING,
        "sorted order": "the mask is still in sorted order: scatter it back to vocabulary order before using it",
        "inverted": "the mask is inverted: you kept the tail and dropped the nucleus",
        "zero fill": ZERO_FILL,
        "NaN fill": NAN_FILL,
        "+inf fill": POSINF_FILL,
        "in place": IN_PLACE,
    },
)


def check_top_p_filter(top_p_filter) -> None:
    """top_p_filter(logits (B, V), p) -> (B, V), the logits outside the nucleus set to -inf."""
    ex = EX_TOP_P
    # probabilities in scrambled order: sorted they are 0.4, 0.25, 0.15, 0.1, 0.06, 0.04
    probs = torch.tensor([[0.1, 0.4, 0.04, 0.25, 0.06, 0.15], [0.25, 0.06, 0.15, 0.04, 0.4, 0.1]])
    logits = probs.log()
    ps = (0.3, 0.5, 0.6, 0.7, 0.85, 0.97, 1.0)
    got = {p: _filtered(ex, top_p_filter, logits, p) for p in ps}
    wrong = [p for p in ps if not torch.equal(torch.isfinite(got[p]), _nucleus_mask(probs, p))]
    if not wrong:
        for p in ps:
            _kept_unchanged(ex, got[p], logits)
        return core.passed(ex)
    symptom = None
    if all(torch.equal(torch.isfinite(got[p]), ~_nucleus_mask(probs, p)) for p in ps if p < 1):
        symptom = "inverted"  # whatever it does at p = 1
    elif any(bool((got[p] == 0).any()) and not bool(got[p].isinf().any()) for p in ps[:3]):
        symptom = "zero fill"
    core.fail_with(
        ex,
        TOP_P_MISTAKES,
        lambda m: all(_same_filter(got[p], m.fn(logits.clone(), p)) for p in ps),
        f"with p={wrong[0]} keep the {_nucleus_mask(probs, wrong[0]).sum(-1).tolist()} most likely tokens of each row (the fewest whose probabilities add up to >= p); you kept {torch.isfinite(got[wrong[0]]).sum(-1).tolist()}",
        symptom=symptom,
    )


# --------------------------------------------------------------------------- 9.5 offset mask
def _attend_with_offset(q, k, v, past, *, mistake=""):
    """attend_with_offset, right, or with the planted mistake `mistake` (OFFSET_MASK_MISTAKES)."""
    T = q.shape[-2]
    shift = {"offset ignored": -past, "one too many": 1, "one too few": -1, "wrong side": -1}
    keep = torch.ones(T, past + T, dtype=torch.bool).tril(diagonal=past + shift.get(mistake, 0))
    keep = {"wrong side": ~keep, "no mask": torch.ones_like(keep)}.get(mistake, keep)
    scores = q @ k.transpose(-2, -1) / q.shape[-1] ** 0.5
    return scores.masked_fill(~keep, float("-inf")).softmax(-1) @ v


OFFSET_MASK_MISTAKES = core.variants(
    _attend_with_offset,
    {
        "offset ignored": "the offset is ignored: query i sits at position past + i, not i, so it sees keys 0 .. past + i. With tril(diagonal=0) (or is_causal=True) a new token cannot see most of the cache. Shift the diagonal by past",
        "one too many": "off by one: each query also sees the key right after it, its own future. Query i may look at keys 0 .. past + i, included: tril(diagonal=past), not past + 1",
        "one too few": "off by one: each query misses its own key. Query i may look at keys 0 .. past + i, included: tril(diagonal=past), not past - 1",
        "wrong side": "the mask is on the wrong side: you hid the past and kept the future. Keep the lower triangle (keys at or before the query), hide the keys after it",
        "no mask": "nothing is masked: a new query may not look at the new tokens after it. Hide the keys at positions after past + i with -inf before softmax",
    },
)


def check_attend_with_offset(attend_with_offset) -> None:
    """attend_with_offset(q (B, nh, T, hd), k and v (B, nh, past + T, hd), past) -> (B, nh, T, hd),
    causal attention with the cache's offset."""
    ex = EX_OFFSET
    gen = torch.Generator().manual_seed(0)
    B, nh, hd = 2, 2, 4
    for T, past in [(4, 3), (1, 5), (3, 0), (1, 0), (2, 1)]:  # chunk, decode, prefill
        q = torch.randn(B, nh, T, hd, generator=gen)
        k, v = (torch.randn(B, nh, past + T, hd, generator=gen) for _ in range(2))
        got = core.call_learner(ex, attend_with_offset, q.clone(), k.clone(), v.clone(), past)
        got = core.expect_tensor(ex, got, (B, nh, T, hd), what="the attention output", finite=False)
        if bool(torch.isnan(got).any()):
            raise core.CheckFailed(
                ex,
                "the output has NaN: some query had every key hidden, so softmax had nothing to share out. That happens when the mask is on the wrong side (masked_fill where a query MAY look): hide the keys after position past + i, keep the rest",
            )
        if not core.close(got, _attend_with_offset(q, k, v, past)):
            core.fail_with(
                ex,
                OFFSET_MASK_MISTAKES,
                lambda m: core.close(got, m.fn(q, k, v, past)),
                f"with {T} new queries after {past} cached tokens the output differs from causal attention at offset past: query i sees keys 0 .. past + i",
            )
    core.passed(ex, "new queries see the whole cache and the new keys up to their own position")


# --------------------------------------------------------------------------- 9.4 sample_token
def _sample_token(logits, temperature=1.0, top_k=None, top_p=None, generator=None, *, mistake=""):
    """sample_token, right, or with the planted mistake `mistake` (a name in SAMPLE_MISTAKES)."""
    if (temperature == 0 and mistake != "no greedy") or mistake == "always greedy":
        return logits.argmax(-1)
    scaled = logits.float()
    if mistake == "top-p before temperature" and top_p is not None:
        scaled, top_p = decoding.top_p_filter(scaled, top_p), None
    if mistake != "temperature ignored":
        scaled = scaled / temperature
    if mistake == "top-p before top-k" and top_p is not None:
        scaled, top_p = decoding.top_p_filter(scaled, top_p), None
    if mistake != "top-k ignored" and top_k is not None:
        scaled = decoding.top_k_filter(scaled, top_k)
    if mistake != "top-p ignored" and top_p is not None:
        scaled = decoding.top_p_filter(scaled, top_p)
    generator = None if mistake == "generator ignored" else generator
    ids = torch.multinomial(torch.softmax(scaled, -1), 1, generator=generator)
    return ids if mistake == "not squeezed" else ids.squeeze(-1)


SAMPLE_MISTAKES = core.variants(
    _sample_token,
    {
        "not squeezed": "your ids have shape (B, 1), torch.multinomial's column: return one id per row, (B,)",
        "no greedy": "with temperature=0 your step fails or gives NaN: logits / 0 is ±inf. Temperature 0 means greedy: return the argmax",
        "generator ignored": "generators seeded alike gave different tokens: pass `generator` to torch.multinomial",
        "always greedy": "you always take the most likely token: at temperature 1 the tokens must be drawn with their probabilities (torch.multinomial of the softmax)",
        "temperature ignored": "temperature has no effect on your draws: divide the logits by it before filtering",
        "top-k ignored": "with top_k=2 you drew tokens outside the 2 most likely: apply top_k_filter when given",
        "top-p ignored": "with top_p=0.6 you drew a token outside the nucleus: apply top_p_filter when given",
        "top-p before temperature": "top-p was applied before the temperature: the nucleus is chosen from the distribution the temperature made, so scale first, then filter",
        "top-p before top-k": "top-p was applied before top-k: the nucleus is chosen from what top-k left (renormalised), so apply top-k first, then top-p",
    },
)


def _draws(exercise, fn, probs, rows=4000, seed=5, fork=True, **settings):
    """fn on `rows` copies of log(probs): (rows,) ids, with a generator seeded `seed`. fork:
    restore torch's global random state afterwards (False: let a sampler that uses it move it)."""
    logits = torch.log(torch.tensor(probs)).expand(rows, -1).contiguous()
    with torch.random.fork_rng(enabled=fork):
        generator = torch.Generator().manual_seed(seed)
        ids = core.call_learner(exercise, fn, logits, generator=generator, **settings)
    hints = {(rows, 1): core.named(SAMPLE_MISTAKES, "not squeezed").message}
    return core.expect_tensor(exercise, ids, (rows,), what="your ids", hints=hints)


def check_sample_token(sample_token) -> None:
    """sample_token(logits (B, V), temperature, top_k, top_p, generator) -> ids (B,)."""
    ex = EX_SAMPLE
    probs = [0.5, 0.3, 0.2]
    _draws(ex, sample_token, probs, temperature=1.0)  # the shape first
    logits = torch.randn(3, 9, generator=torch.Generator().manual_seed(0))
    try:
        greedy = core.call_learner(ex, sample_token, logits.clone(), temperature=0)
    except (RuntimeError, ValueError, ZeroDivisionError):
        raise core.named_failure(ex, SAMPLE_MISTAKES, "no greedy") from None
    greedy = core.expect_tensor(ex, greedy, (3,), what="your greedy ids")
    if not torch.equal(greedy.long(), logits.argmax(-1)):
        raise core.named_failure(ex, SAMPLE_MISTAKES, "no greedy")
    with torch.random.fork_rng():
        again = [_draws(ex, sample_token, probs, 4000, 7, False, temperature=1.0) for _ in range(2)]
    if not torch.equal(again[0], again[1]):
        raise core.named_failure(ex, SAMPLE_MISTAKES, "generator ignored")
    at_2 = [p**0.5 / sum(q**0.5 for q in probs) for p in probs]  # T=2: the nucleus of 0.75 is all
    four, nucleus = [0.4, 0.3, 0.2, 0.1], [4 / 7, 3 / 7, 0, 0]  # top-k 3 first, then top-p 0.75
    # (settings, probabilities given, probabilities the draws must show, mistake when they do not)
    cases = [
        (dict(temperature=1.0), probs, probs, "always greedy"),
        (dict(temperature=0.5), probs, [25 / 38, 9 / 38, 4 / 38], "temperature ignored"),
        (dict(temperature=1.0, top_k=2), probs, [0.625, 0.375, 0.0], "top-k ignored"),
        (dict(temperature=1.0, top_p=0.6), probs, [0.625, 0.375, 0.0], "top-p ignored"),
        (dict(temperature=2.0, top_p=0.75), probs, at_2, "top-p before temperature"),
        (dict(temperature=1.0, top_k=3, top_p=0.75), four, nucleus, "top-p before top-k"),
    ]
    for settings, given, want, name in cases:
        ids = _draws(ex, sample_token, given, **settings).long()
        seen = torch.bincount(ids, minlength=len(given)).double() / ids.numel()
        if (seen - torch.tensor(want, dtype=torch.float64)).abs().max() > 0.04:
            seen, want = [round(f, 3) for f in seen.tolist()], [round(f, 3) for f in want]
            raise core.named_failure(
                ex,
                SAMPLE_MISTAKES,
                name,
                prefix=f"with {settings}: ",
                suffix=f" (you drew {seen}, expected about {want})",
            )
    core.passed(ex, "greedy at 0, repeatable with a generator, and draws in the right proportions")


# --------------------------------------------------------------------------- 9.6 the cache's memory
def _kv_bytes(config, bytes_per_number, *, mistake=""):
    """kv_bytes_per_token, right, or with the planted mistake `mistake` (KV_BYTES_MISTAKES)."""
    C, nh, b = config.n_embd, config.n_head, bytes_per_number
    layers = 1 if mistake == "one layer" else config.n_layer
    width = {"one head": C // nh, "times heads": C * nh}.get(mistake, C)
    size = {"numbers": 1, "bits": 8 * b}.get(mistake, b)
    return layers * (1 if mistake == "keys only" else 2) * width * size


KV_BYTES_MISTAKES = core.variants(
    _kv_bytes,
    {
        "keys only": "you counted the keys only: every layer stores a key AND a value vector per token",
        "one layer": "you counted one layer: each of the n_layer layers has its own cache",
        "one head": "you counted one head's width (n_embd // n_head): a layer stores all n_head heads, n_embd numbers for the keys and n_embd for the values",
        "times heads": "you multiplied by n_head as well: the heads split the n_embd numbers between them, they do not add to them",
        "numbers": "you counted numbers, not bytes: multiply by bytes_per_number",
        "bits": "you counted bits: a byte is 8 bits, and bytes_per_number is in bytes",
    },
)


def check_kv_bytes_per_token(kv_bytes_per_token) -> None:
    """kv_bytes_per_token(config, bytes_per_number) -> bytes for one token of one sequence."""
    cases = [
        (GPT2Config(), 4),
        (GPT2Config(n_layer=3, n_head=2, n_embd=8), 2),
        (GPT2Config(n_layer=24, n_head=16, n_embd=1024), 2),
    ]
    got = _byte_counts(EX_KV_BYTES, kv_bytes_per_token, cases)
    want = [_kv_bytes(*case) for case in cases]
    if got == want:
        return core.passed(
            EX_KV_BYTES,
            f"GPT-2 small in float32: {want[0]:,} bytes ({want[0] // 1024} KiB) a token",
        )
    core.fail_with(
        EX_KV_BYTES,
        KV_BYTES_MISTAKES,
        lambda m: got == [m.fn(*case) for case in cases],
        f"for GPT-2 small in float32 you give {got[0]:,} bytes; count, per token, what every layer stores for its keys and for its values",
    )


# --------------------------------------------------------------------------- 9.7 SimpleKVCache
class _LayerCache:
    def __init__(self, k_buf, v_buf, mistake):
        self.k, self.v, self.position, self.mistake = k_buf, v_buf, 0, mistake

    def update(self, k, v):
        past, T = self.position, k.shape[2]
        keys, values = _write_kv(self.k, self.v, k, v, past)
        if self.mistake == "shuffled prefill" and T > 1:  # see check_cache_gap
            keys, values = keys.flip(2), values.flip(2)
        self.position = past if self.mistake == "position stays" else past + T
        visible = None if past == 0 or self.mistake == "no mask" else causal_mask(T, past)
        return keys, values, visible


def _cache_class(mistake=""):
    """SimpleKVCache, right, or with the planted mistake `mistake` (a name in CACHE_MISTAKES), or
    "shuffled prefill", a cache cache_gap must catch (see check_cache_gap)."""

    class Cache:
        def __init__(self, config, batch_size, max_len, device=None, dtype=torch.float32):
            B, nh, C = batch_size, config.n_head, config.n_embd
            wrong = {"heads last": (B, max_len, nh, C // nh), "full width": (B, nh, max_len, C)}
            shape = wrong.get(mistake, (B, nh, max_len, C // nh))
            dtype = torch.float32 if mistake == "dtype ignored" else dtype
            buffer = functools.partial(torch.zeros, shape, device=device, dtype=dtype)
            pairs = [(buffer(), buffer()) for _ in range(config.n_layer)]
            if mistake == "one buffer for all layers":  # the first layer's pair for every layer
                pairs = pairs[:1] * config.n_layer
            elif mistake == "k and v share":  # one buffer a layer, for its keys and its values
                pairs = [(k, k) for k, _ in pairs]
            self.layers = [_LayerCache(k, v, mistake) for k, v in pairs]

        def __getitem__(self, i):
            return self.layers[i]

        @property
        def position(self):
            return self.layers[0].position

    return Cache


CACHE_MISTAKES = core.planted(
    _cache_class,
    {
        "heads last": "a buffer is (B, n_head, max_len, head_dim), the layout attention's keys have after the transpose; yours has max_len before n_head",
        "full width": "each head stores head_dim = n_embd // n_head numbers per token, not n_embd",
        "dtype ignored": "the buffers ignore `dtype`: a bfloat16 model needs bfloat16 buffers (torch.zeros(shape, device=device, dtype=dtype))",
        "one buffer for all layers": "all layers share one pair of buffers: each layer writes its own keys, so each needs its own buffers (make them inside the loop)",
        "k and v share": "a layer's keys and values share one buffer: the values overwrite the keys; make two",
        "position stays": "update does not move the layer's position on: the next call writes over this one's keys and values; add T to self.position",
        "no mask": "update returns visible=None after the first call too: then attention masks the new queries as if they were the first tokens; with earlier tokens held, return causal_mask(T, past) (chapter 3's), True where a query may see a key",
    },
)


def _cached_logits(model, cache, idx, first, late=0):
    """idx's logits fed through `cache`: its first `first` tokens in one call, then one a call
    (each `late` positions back: cache_gap's planted mistake "misaligned")."""
    T = idx.shape[1]
    with torch.no_grad():
        steps = [model(idx[:, :first], kv_cache=cache)]
        steps += [model(idx[:, t - late : t - late + 1], kv_cache=cache) for t in range(first, T)]
    return torch.cat(steps, dim=1)


def check_simple_kv_cache(cls) -> None:
    """SimpleKVCache(config, batch_size, max_len, device, dtype): its buffers and positions, what
    a layer's update returns, then cached logits against one full pass of a tiny model."""
    ex = EX_CACHE
    config = GPT2Config(n_layer=3, n_head=2, n_embd=8, n_positions=16, vocab_size=11)
    cache = core.call_learner(ex, cls, config, 2, 10)
    layers = getattr(cache, "layers", None)
    if not isinstance(layers, (list, tuple)) or len(layers) != config.n_layer:
        raise core.CheckFailed(
            ex, f"cache.layers should be a list of {config.n_layer} layer caches, one per block"
        )
    nh, hd = config.n_head, config.n_embd // config.n_head
    hints = {
        (2, 10, nh, hd): core.named(CACHE_MISTAKES, "heads last").message,
        (2, nh, 10, config.n_embd): core.named(CACHE_MISTAKES, "full width").message,
    }
    for layer in layers:
        core.expect_tensor(ex, layer.k, (2, nh, 10, hd), what="a layer's key buffer", hints=hints)
        core.expect_tensor(ex, layer.v, (2, nh, 10, hd), what="a layer's value buffer", hints=hints)
    if cache.position != 0:
        raise core.CheckFailed(
            ex, f"a new cache holds no tokens: its position should be 0, not {cache.position}"
        )
    wide = core.call_learner(ex, cls, config, 1, 4, dtype=torch.float64)
    if wide.layers[0].k.dtype != torch.float64:
        raise core.named_failure(ex, CACHE_MISTAKES, "dtype ignored")
    pointers = [t.data_ptr() for layer in layers for t in (layer.k, layer.v)]
    if layers[0].k.data_ptr() == layers[0].v.data_ptr():
        raise core.named_failure(ex, CACHE_MISTAKES, "k and v share")
    if len(set(pointers)) < len(pointers):
        raise core.named_failure(ex, CACHE_MISTAKES, "one buffer for all layers")
    gen = torch.Generator().manual_seed(2)  # one layer's updates: 3 tokens, then 1
    new = [torch.randn(2, nh, T, hd, generator=gen) for T in (3, 1)]
    returned = [core.call_learner(ex, layers[0].update, k, k + 1) for k in new]
    if layers[0].position != 4:
        if layers[0].position in (0, 1, 3) and layers[1].position == 0:
            raise core.named_failure(ex, CACHE_MISTAKES, "position stays")
        raise core.CheckFailed(
            ex, f"after updates of 3 tokens and 1 the layer should hold 4, not {layers[0].position}"
        )
    for got, T, past in zip(returned, (3, 1), (0, 3)):
        if not (isinstance(got, tuple) and len(got) == 3):
            raise core.CheckFailed(ex, "update should return three things: keys, values, visible")
        keys = core.expect_tensor(ex, got[0], (2, nh, past + T, hd), what="the keys")
        if past == 3 and not core.close(keys, torch.cat(new, dim=2)):
            raise core.CheckFailed(
                ex, "the keys update returns are not every key so far, in order (write_kv)"
            )
        if past == 0 and got[2] is not None and not torch.equal(got[2], causal_mask(T, 0)):
            raise core.CheckFailed(ex, "with nothing cached, visible is None (or the plain mask)")
        if past == 3 and (got[2] is None or not torch.equal(got[2], causal_mask(T, past))):
            raise core.named_failure(ex, CACHE_MISTAKES, "no mask")
    model = _tiny_model()
    ids = torch.randint(0, 50, (2, 7), generator=torch.Generator().manual_seed(3))
    with torch.no_grad():
        cache = core.call_learner(ex, cls, model.config, 2, 7)
        if not core.close(_cached_logits(model, cache, ids, 4), model(ids), atol=1e-4):
            raise core.CheckFailed(
                ex,
                "in a model, the cached logits differ from one full pass: check that update writes at the layer's position and returns every key and value so far, with the mask",
            )
    core.passed(
        ex, "buffers, positions, the mask, and a tiny model's cached logits equal its full pass"
    )


# --------------------------------------------------------------------------- 9.8 testing a cache
def _cache_gap(model, cache_cls, idx, prefill, *, mistake=""):
    """cache_gap, right, or with the planted mistake `mistake` (a name in GAP_MISTAKES)."""
    B, T = idx.shape
    late = mistake == "misaligned"  # the prompt's last token fed again before the next one
    cache = cache_cls(model.config, B, T + late, device=idx.device, dtype=torch.float32)
    first = 1 if mistake == "one at a time" else prefill
    with torch.no_grad():
        diff = _cached_logits(model, cache, idx, first, late) - model(idx)
    if mistake == "after the prefill":
        return diff[:, prefill:].abs().max().item() if prefill < T else 0.0
    if mistake == "last of each call":
        return diff[:, [prefill - 1, *range(prefill, T)]].abs().max().item()
    return {"mean": diff.abs().mean(), "signed": diff.max()}.get(mistake, diff.abs().max()).item()


IN_THE_PREFILL = "your gap misses wrong logits inside the prefill: a cache that hands the prefill's keys over in the wrong order passed. Compare the logits at every position, those the prefill call returns too, not only the one-token calls' or each call's last"

GAP_MISTAKES = core.variants(
    _cache_gap,
    {
        "after the prefill": IN_THE_PREFILL,
        "last of each call": IN_THE_PREFILL,
        "one at a time": "you fed every token on its own: the first `prefill` tokens go in one call, as a prompt does, because a cache can be wrong only in a call of several tokens",
        "mean": "that is the mean difference; return the largest absolute difference (a cache wrong at one position would hide in a mean)",
        "signed": "that is the largest signed difference; a logit can be off either way: take the absolute value before the maximum",
        "misaligned": "with a right cache your gap is large: after the prefill, feed the token at the cache's position (the first one not yet fed), not the last prompt token again",
    },
)


def check_cache_gap(cache_gap) -> None:
    """cache_gap(model, cache_cls, idx (B, T), prefill) -> float, the largest absolute difference
    of cached and uncached logits: catches broken caches, passes a right one."""
    ex = EX_GAP
    model = _tiny_model()
    gen = torch.Generator().manual_seed(5)
    caches = {  # right; its position never moves (each call overwrites the first slots); stored
        # right, but a call of several tokens gets its keys and values in reverse order (the
        # prefill's last position, which sees every key, and every later call stay right)
        "right": decoding.SimpleKVCache,
        "stuck": _cache_class("position stays"),
        "shuffled prefill": _cache_class("shuffled prefill"),
    }
    for B, T, prefill in [(1, 6, 3), (2, 7, 4), (2, 5, 1), (1, 5, 5)]:
        idx = torch.randint(0, 50, (B, T), generator=gen)
        for name, cls in caches.items():
            with torch.no_grad():
                got = core.call_learner(ex, cache_gap, model, cls, idx, prefill)
            if isinstance(got, torch.Tensor) and got.numel() == 1:
                raise core.CheckFailed(ex, "return a Python float (tensor.item()), not a tensor")
            if not isinstance(got, (float, int)) or got != got:
                raise core.CheckFailed(
                    ex, f"return one Python float, the largest difference; got {got!r}"
                )
            want = _cache_gap(model, cls, idx, prefill)
            if abs(got - want) <= 1e-6 + 1e-4 * abs(want):
                continue
            if name == "shuffled prefill" and got < 1e-4:
                raise core.named_failure(ex, GAP_MISTAKES, "after the prefill")
            case = f"batch {B}, {T} tokens, prefill {prefill}"
            core.fail_with(
                ex,
                GAP_MISTAKES,
                lambda m: abs(m.fn(model, cls, idx, prefill) - got) <= 1e-6 + 1e-4 * abs(got),
                f"with a right cache ({case}) your gap is {got:.3g}: the cached logits equal one pass's to float32 rounding; check which tokens each call feeds"
                if name == "right"
                else f"with a broken cache ({name}; {case}) your gap is {got:.3g}, the largest absolute difference of the logits is {want:.3g}",
            )
    core.passed(
        ex,
        "a right cache passes; one that never advances and one that garbles a prefill are caught",
    )


# --------------------------------------------------------------------------- 9.9 generate_cached
def _generate_cached(model, idx, max_new_tokens, sample, cache, *, mistake=""):
    """generate_cached, right, or with the planted mistake `mistake` (a name in LOOP_MISTAKES)."""
    B, T = idx.shape
    out = torch.empty(B, T + max_new_tokens, dtype=torch.long, device=idx.device)
    out[:, :T] = idx
    with torch.no_grad():
        logits = model(idx, kv_cache=cache)[:, -1]
        for pos in range(T, T + max_new_tokens):
            out[:, pos] = logits.argmax(-1) if mistake == "sample ignored" else sample(logits)
            if pos + 1 == T + max_new_tokens:
                break
            if mistake == "cache ignored":  # the whole sequence again, the cache never used
                logits = model(out[:, : pos + 1])[:, -1]
            elif mistake == "whole sequence":
                logits = model(out[:, : pos + 1], kv_cache=cache)[:, -1]
            else:
                first = pos - 1 if mistake == "previous token" else pos
                logits = model(out[:, first : first + 1], kv_cache=cache)[:, -1]
    return out[:, T:] if mistake == "new tokens only" else out


LOOP_MISTAKES = core.variants(
    _generate_cached,
    {
        "previous token": "you feed the token BEFORE the one just sampled (out[:, pos - 1]): the cache slot at position pos then holds the keys and values of token pos - 1, and every later step sees a shifted past. Feed the token just made, at position pos",
        "sample ignored": "your tokens are the argmax even with a sampler that is not greedy: choose each token with sample(logits)",
        "whole sequence": "you feed the whole sequence again through the cache, which already holds the past: the cache overflows. Feed only the new token",
        "new tokens only": "you returned only the new tokens: return the prompt and them, (B, T + max_new_tokens)",
        "cache ignored": "your tokens are right, but the cache holds fewer tokens than were fed: you recompute the whole sequence at each step without it. Pass kv_cache=cache and feed the new token only",
    },
)


def _third_most_likely(logits):  # a deterministic sampler that is not greedy
    return logits.topk(3, dim=-1).indices[:, 2]


def _greedy(logits):
    return logits.argmax(dim=-1)


def _recomputed(model, idx, n, sample):
    """The tokens a full pass per step gives: what any cached loop must reproduce."""
    with torch.no_grad():
        for _ in range(n):
            idx = torch.cat([idx, sample(model(idx)[:, -1])[:, None]], dim=1)
    return idx


def _run_loop(exercise, fn, model, idx, n, sample):
    """fn's tokens with a fresh cache of room T + n, and how many tokens the cache then holds."""
    cache = KVCache.for_model(model, idx.shape[0], idx.shape[1] + n)
    try:
        out = core.call_learner(exercise, fn, model, idx, n, sample, cache)
    except ValueError as error:
        if "KV cache is full" in str(error):
            raise core.named_failure(exercise, LOOP_MISTAKES, "whole sequence") from None
        raise
    return out, cache.length


def check_generate_cached(generate_cached) -> None:
    """generate_cached(model, idx (B, T), max_new_tokens, sample, cache) -> (B, T + new)."""
    ex = EX_LOOP
    model = _tiny_model()
    gen = torch.Generator().manual_seed(2)
    cases = [(1, 3, 5, _greedy), (2, 5, 6, _greedy), (1, 1, 4, _greedy)]
    for B, T, n, sample in [*cases, (2, 4, 5, _third_most_likely)]:
        idx = torch.randint(0, 50, (B, T), generator=gen)
        got, held = _run_loop(ex, generate_cached, model, idx, n, sample)
        hints = {(B, n): core.named(LOOP_MISTAKES, "new tokens only").message}
        got = core.expect_tensor(ex, got, (B, T + n), what="your tokens", hints=hints).long()
        if held < T + n - 1:  # every token but the last one goes through the cache
            raise core.named_failure(ex, LOOP_MISTAKES, "cache ignored")
        want = _recomputed(model, idx, n, sample)
        if torch.equal(got, want):
            continue
        differs = (got != want)[:, T:].any(0).nonzero()  # the new tokens that differ
        core.fail_with(
            ex,
            LOOP_MISTAKES,
            lambda m: torch.equal(got, _run_loop(ex, m.fn, model, idx, n, sample)[0]),
            "the result must start with the prompt, unchanged"
            if not torch.equal(got[:, :T], idx)
            else "the first new token already differs from a full pass: it comes from the prefill, the whole prompt in one call, and the logits at the prompt's last position"
            if int(differs[0, 0]) == 0
            else f"with a prompt of {T} tokens, new token {int(differs[0, 0])} differs from a full recomputation: check what the cache holds at each position",
        )
    core.passed(
        ex,
        "greedy and a non-greedy sampler, batches and prompt lengths: the tokens of a full recomputation",
    )


# --------------------------------------------------------------------------- 9.10 the cache's gain
def check_cache_gains(lengths, gains) -> None:
    """The gains measured with cache_gain: one positive number per length, above 1 at the
    longest (without the cache, the longest run repeats the most work)."""
    ex = EX_GAIN
    if not isinstance(gains, (list, tuple)) or len(gains) != len(lengths):
        raise core.CheckFailed(ex, f"expected one gain per length ({len(lengths)}), got {gains!r}")
    for n, gain in zip(lengths, gains):
        if isinstance(gain, bool) or not isinstance(gain, (int, float)) or not 0 < gain < math.inf:
            raise core.CheckFailed(
                ex, f"the gain at {n} tokens should be a positive number of times, got {gain!r}"
            )
    if all(g < 1 for g in gains):
        raise core.CheckFailed(
            ex,
            "every gain is below 1, so the cache would be slower at every length: you probably return cached / uncached time; the gain is uncached / cached",
        )
    core.passed(ex, f"{len(gains)} lengths measured")


# --------------------------------------------------------------------------- 9.11 bytes per token
def _weight_bytes(model, *, mistake=""):
    """weight_bytes_per_token, right, or with the planted mistake `mistake` (WEIGHT_BYTES_MISTAKES)."""
    wpe = model.wpe.weight
    numbers = sum(p.numel() for p in model.parameters()) - wpe.numel() + wpe.shape[1]
    everything = sum(p.numel() * p.element_size() for p in model.parameters())
    return {
        "whole wpe": everything,
        "numbers": numbers,
        "float32 assumed": 4 * numbers,
        "no wpe row": everything - wpe.nbytes,
        "wte twice": decode_bytes_per_token(model) + model.wte.weight.nbytes,
    }.get(mistake, decode_bytes_per_token(model))


WEIGHT_BYTES_MISTAKES = core.variants(
    _weight_bytes,
    {
        "whole wpe": "you counted the whole position table: a step reads only one row of wpe, for its position",
        "numbers": "you counted numbers, not bytes: multiply each tensor's numel() by its element_size()",
        "float32 assumed": "you assumed 4 bytes a number: use each tensor's element_size() (a bfloat16 model has 2)",
        "no wpe row": "you left out the position table: a step still reads the one row of wpe for its position",
        "wte twice": "you counted the token table twice: the lookup reads one row of it and the readout reads it all, so the whole table once",
    },
)


def check_weight_bytes_per_token(weight_bytes_per_token) -> None:
    """weight_bytes_per_token(model) -> bytes one batch-1 decode step reads."""
    small = _tiny_model(n_layer=1, n_embd=8, n_positions=64, vocab_size=30)
    models = [_tiny_model(), small.to(torch.bfloat16)]
    got = _byte_counts(EX_WEIGHT_BYTES, weight_bytes_per_token, [(m,) for m in models])
    want = [decode_bytes_per_token(m) for m in models]
    if got == want:
        return core.passed(EX_WEIGHT_BYTES, "a float32 and a bfloat16 model")
    core.fail_with(
        EX_WEIGHT_BYTES,
        WEIGHT_BYTES_MISTAKES,
        lambda m: got == [m.fn(x) for x in models],
        f"for a tiny float32 model you give {got[0]:,} bytes, expected {want[0]:,}: every weight in full, once, except the position table, of which a step reads one row",
    )


# --------------------------------------------------------------------------- challenge: beam search
BEAM_PROMPTS = ["The king said", "Once upon a time", "In the morning we", "I will not"]
BEAM_TOKENS, BEAMS = 10, 4


def _log_prob(model, seq, prompt_len):
    """Total log-probability the model gives the tokens after the prompt, (1, T) -> float."""
    with torch.no_grad():
        logp = torch.log_softmax(model(seq)[:, :-1].float(), dim=-1)  # (1, T-1, V)
    picked = logp.gather(-1, seq[:, 1:, None]).squeeze(-1)  # (1, T-1)
    return float(picked[:, prompt_len - 1 :].sum())


def check_beam_search_challenge(beam_search, model, tokenizer) -> None:
    """beam_search(model, idx (1, T), max_new_tokens, beams) -> (1, T + max_new_tokens): scores
    at least greedy's total log-probability on every prompt and more on at least one."""
    device = next(model.parameters()).device
    better = 0
    for prompt in BEAM_PROMPTS:
        idx = torch.tensor([tokenizer.encode(prompt)], device=device)
        T = idx.shape[1]
        got = core.call_learner(CHALLENGE, beam_search, model, idx, BEAM_TOKENS, BEAMS)
        got = core.expect_tensor(CHALLENGE, got, (1, T + BEAM_TOKENS), what="your sequence")
        if not torch.equal(got[:, :T].long(), idx):
            raise core.CheckFailed(CHALLENGE, "the result must start with the prompt, unchanged")
        greedy = generate(model, idx, BEAM_TOKENS, temperature=0)
        yours, theirs = _log_prob(model, got.long(), T), _log_prob(model, greedy, T)
        print(
            f"{prompt!r}: greedy {theirs:.4f}, yours {yours:.4f} nats -> {tokenizer.decode(got[0, T:].tolist())!r}"
        )
        if yours < theirs - 1e-3:
            raise core.CheckFailed(
                CHALLENGE,
                f"on {prompt!r} your continuation is less likely than greedy's ({yours:.4f} < {theirs:.4f} nats): keep the best partial sequences by total log-probability",
            )
        better += yours > theirs + 1e-3
    if better == 0:
        raise core.CheckFailed(
            CHALLENGE,
            "on every prompt your continuation is only as likely as greedy's: keep several candidates per step, not one",
        )
    core.passed(CHALLENGE, f"more likely than greedy on {better} of {len(BEAM_PROMPTS)} prompts")


# Each check with the planted mistakes it names (the tests run every one through its check).
MISTAKES_BY_CHECK = {
    check_apply_temperature: TEMPERATURE_MISTAKES,
    check_top_k_filter: TOP_K_MISTAKES,
    check_top_p_filter: TOP_P_MISTAKES,
    check_sample_token: SAMPLE_MISTAKES,
    check_attend_with_offset: OFFSET_MASK_MISTAKES,
    check_kv_bytes_per_token: KV_BYTES_MISTAKES,
    check_write_kv: WRITE_KV_MISTAKES,
    check_simple_kv_cache: CACHE_MISTAKES,
    check_cache_gap: GAP_MISTAKES,
    check_generate_cached: LOOP_MISTAKES,
    check_weight_bytes_per_token: WEIGHT_BYTES_MISTAKES,
}
