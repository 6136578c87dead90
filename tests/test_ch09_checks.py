"""Chapter 9's checks: each passes the reference (and other correct answers) and names each
planted mistake."""

import pytest
import torch

from gpt2lib import generation as G
from gpt2lib import kvcache as K
from gpt2lib.checks import CheckFailed
from gpt2lib.checks import generation as C

# --------------------------------------------------------------------------- 9.4 write_kv


def write_kv_cat(k_buf, v_buf, k, v, start):  # another correct answer: copy_ then narrow
    end = start + k.shape[2]
    k_buf.narrow(2, start, k.shape[2]).copy_(k)
    v_buf.narrow(2, start, v.shape[2]).copy_(v)
    return k_buf.narrow(2, 0, end), v_buf.narrow(2, 0, end)


def write_at_zero(k_buf, v_buf, k, v, start):
    T = k.shape[2]
    k_buf[:, :, :T] = k
    v_buf[:, :, :T] = v
    return k_buf[:, :, :start + T], v_buf[:, :, :start + T]


def whole_buffer(k_buf, v_buf, k, v, start):
    k_buf[:, :, start:start + k.shape[2]] = k
    v_buf[:, :, start:start + v.shape[2]] = v
    return k_buf, v_buf


def only_new(k_buf, v_buf, k, v, start):
    k_buf[:, :, start:start + k.shape[2]] = k
    v_buf[:, :, start:start + v.shape[2]] = v
    return k, v


def swapped(k_buf, v_buf, k, v, start):
    keys, values = K.write_kv(k_buf, v_buf, k, v, start)
    return values, keys


def not_stored(k_buf, v_buf, k, v, start):
    return torch.cat([k_buf[:, :, :start], k], 2), torch.cat([v_buf[:, :, :start], v], 2)


def stub(*args):
    raise NotImplementedError("Exercise 9.4: replace this line with your code")


def test_write_kv_accepts_correct_answers(capsys):
    C.check_write_kv(K.write_kv)
    C.check_write_kv(write_kv_cat)
    assert "✅" in capsys.readouterr().out


@pytest.mark.parametrize("wrong,phrase", [
    (write_at_zero, "cache position is not used"),
    (whole_buffer, "you returned the whole buffer"),
    (only_new, "you returned only the new keys"),
    (swapped, "keys and values are swapped"),
    (not_stored, "were not written into k_buf / v_buf"),
    (stub, "not done yet"),
    (lambda k_buf, v_buf, k, v: None, "cannot take that"),
])
def test_write_kv_names_the_mistake(wrong, phrase):
    with pytest.raises(CheckFailed, match=phrase):
        C.check_write_kv(wrong)


# --------------------------------------------------------------------------- 9.5 cached_forward


def make_forward(offset=True, advance=True, advance_per_layer=False, use_cache=True, ln_f=True):
    def cached_forward(model, idx, cache):
        T = idx.shape[1]
        start = cache.length if offset else 0
        x = model.wte(idx) + model.wpe(torch.arange(start, start + T))
        for i, block in enumerate(model.h):
            x = block(x, kv_cache=cache.layers[i]) if use_cache else block(x)
            if advance_per_layer:
                cache.advance(T)
        if advance and not advance_per_layer:
            cache.advance(T)
        return (model.ln_f(x) if ln_f else x) @ model.wte.weight.T
    return cached_forward


def test_cached_forward_accepts_correct_answers(capsys):
    C.check_cached_forward(make_forward())
    # another correct answer: the finished model's own forward
    C.check_cached_forward(lambda model, idx, cache: model(idx, kv_cache=cache))
    assert capsys.readouterr().out.count("✅") == 2


@pytest.mark.parametrize("options,phrase", [
    (dict(offset=False), "positions restart at 0"),
    (dict(advance=False), "cache position is never advanced"),
    (dict(advance_per_layer=True), "moved once per layer"),
    (dict(use_cache=False), "the blocks never get the cache"),
    (dict(ln_f=False), "final LayerNorm"),
])
def test_cached_forward_names_the_mistake(options, phrase):
    with pytest.raises(CheckFailed, match=phrase):
        C.check_cached_forward(make_forward(**options))


def test_cached_forward_wrong_shape():
    def last_only(model, idx, cache):
        return model(idx, kv_cache=cache, last_only=True)
    with pytest.raises(CheckFailed, match=r"expected logits of shape \(B, T, vocab\)"):
        C.check_cached_forward(last_only)


# --------------------------------------------------------------------------- 9.1 temperature


def test_temperature_accepts_correct_answers(capsys):
    C.check_apply_temperature(G.apply_temperature)
    C.check_apply_temperature(lambda logits, t: logits / t - (logits / t).max(-1, True).values)
    C.check_apply_temperature(lambda logits, t: torch.log_softmax(logits, -1) / t)
    assert capsys.readouterr().out.count("✅") == 3


@pytest.mark.parametrize("wrong,phrase", [
    (lambda logits, t: torch.softmax(logits, -1) / t, "applied after softmax"),
    (lambda logits, t: torch.softmax(torch.softmax(logits, -1) / t, -1),
     "applied after softmax"),
    (lambda logits, t: logits * t, "you multiplied by the temperature"),
    (lambda logits, t: logits, "has no effect"),
    (lambda logits, t: torch.softmax(logits / t, -1), "you returned probabilities"),
    (lambda logits, t: [1.0], "should be a torch.Tensor"),
])
def test_temperature_names_the_mistake(wrong, phrase):
    with pytest.raises(CheckFailed, match=phrase):
        C.check_apply_temperature(wrong)


# --------------------------------------------------------------------------- 9.2 top-k


def top_k_sorted(logits, k):  # another correct answer, by sorting
    threshold = logits.sort(-1, descending=True).values[..., k - 1:k]
    return torch.where(logits >= threshold, logits, torch.full_like(logits, float("-inf")))


def top_k_plus_one(logits, k):
    values = logits.sort(-1, descending=True).values
    threshold = values[..., min(k, logits.shape[-1] - 1):][..., :1]
    return logits.masked_fill(logits < threshold, float("-inf"))


def top_k_minus_one(logits, k):
    threshold = torch.topk(logits, k, -1).values[..., -1:]
    return logits.masked_fill(logits <= threshold, float("-inf")) if k > 1 else \
        logits.masked_fill(logits < threshold, float("-inf"))


def top_k_smallest(logits, k):
    threshold = torch.topk(logits, k, -1, largest=False).values[..., -1:]
    return logits.masked_fill(logits > threshold, float("-inf"))


def top_k_zero(logits, k):
    threshold = torch.topk(logits, k, -1).values[..., -1:]
    return logits.masked_fill(logits < threshold, 0.0)


def test_top_k_accepts_correct_answers(capsys):
    C.check_top_k_filter(G.top_k_filter)
    C.check_top_k_filter(top_k_sorted)
    assert capsys.readouterr().out.count("✅") == 2


@pytest.mark.parametrize("wrong,phrase", [
    (top_k_plus_one, "off by one: with k=1 you kept 2"),
    (top_k_minus_one, "off by one: with k=3 you kept only 2"),
    (top_k_smallest, "SMALLEST"),
    (top_k_zero, "set to 0"),
    (lambda logits, k: logits * 1.0, "every token was kept"),
    (lambda logits, k: torch.topk(logits, k, -1).values, "keep the shape"),
])
def test_top_k_names_the_mistake(wrong, phrase):
    with pytest.raises(CheckFailed, match=phrase):
        C.check_top_k_filter(wrong)


# --------------------------------------------------------------------------- 9.3 top-p


def top_p_variant(descending=True, include_crossing=True, scatter_back=True, fill=float("-inf")):
    def top_p_filter(logits, p):
        probs = torch.softmax(logits, -1)
        keep = C._nucleus_mask(probs, p, descending, include_crossing, scatter_back)
        return logits.masked_fill(~keep, fill)
    return top_p_filter


def top_p_loop(logits, p):  # another correct answer, written as a plain loop
    out = logits.clone()
    probs = torch.softmax(logits, -1)
    for row in range(logits.shape[0]):
        total = 0.0
        for token in probs[row].argsort(descending=True).tolist():
            if total >= p:
                out[row, token] = float("-inf")
            total += float(probs[row, token])
    return out


def test_top_p_accepts_correct_answers(capsys):
    C.check_top_p_filter(G.top_p_filter)
    C.check_top_p_filter(top_p_loop)
    assert capsys.readouterr().out.count("✅") == 2


@pytest.mark.parametrize("wrong,phrase", [
    (top_p_variant(include_crossing=False), "the token that carries the running total past p"),
    (top_p_variant(descending=False), "you sorted ascending"),
    (top_p_variant(scatter_back=False), "still in sorted order"),
    (top_p_variant(fill=0.0), "set them to float"),
    (lambda logits, p: logits.masked_fill(
        C._nucleus_mask(torch.softmax(logits, -1), p), float("-inf")), "the mask is inverted"),
])
def test_top_p_names_the_mistake(wrong, phrase):
    with pytest.raises(CheckFailed, match=phrase):
        C.check_top_p_filter(wrong)


# --------------------------------------------------------------------------- 9.6 split_matmul


def split_einsum(x, weight, parts):  # another correct answer
    rows, n_in = x.shape
    return torch.einsum("prk,pkn->rn", x.view(rows, parts, n_in // parts).transpose(0, 1),
                        weight.view(parts, n_in // parts, weight.shape[1]))


def _slabs(x, weight, parts):
    rows, n_in = x.shape
    return (x.view(rows, parts, n_in // parts).transpose(0, 1),
            weight.view(parts, n_in // parts, weight.shape[1]))


def split_no_sum(x, weight, parts):
    return torch.bmm(*_slabs(x, weight, parts))


def split_mean(x, weight, parts):
    return torch.bmm(*_slabs(x, weight, parts)).mean(0)


def split_wrong_dim(x, weight, parts):
    return torch.bmm(*_slabs(x, weight, parts)).sum(1)


def split_x_without_transpose(x, weight, parts):
    rows, n_in = x.shape
    return torch.bmm(x.reshape(parts, rows, n_in // parts), _slabs(x, weight, parts)[1]).sum(0)


def split_interleaved_weight(x, weight, parts):
    rows, n_in = x.shape
    w = weight.view(n_in // parts, parts, weight.shape[1]).transpose(0, 1)
    return torch.bmm(_slabs(x, weight, parts)[0], w).sum(0)


def not_split(x, weight, parts):
    return x @ weight


def split_right_only_when_small(x, weight, parts):  # e.g. a precision loss at GPT-2's width
    out = torch.bmm(*_slabs(x, weight, parts)).sum(0)
    return out if x.shape[1] <= 12 else out.half().float()


def test_split_matmul_check_passes_the_reference_and_einsum():
    from gpt2lib.kernels import split_matmul

    C.check_split_matmul(split_matmul)
    C.check_split_matmul(split_einsum)


@pytest.mark.parametrize("answer, message", [
    (split_no_sum, "partial products"),
    (split_mean, "averaged"),
    (split_wrong_dim, "wrong dimension"),
    (split_x_without_transpose, "x's slabs are cut wrongly"),
    (split_interleaved_weight, "consecutive rows"),
    (not_split, "not computed in slabs"),
    (split_right_only_when_small, "wrong for one row of 768"),
])
def test_split_matmul_check_names_each_mistake(answer, message):
    with pytest.raises(CheckFailed, match=message):
        C.check_split_matmul(answer)


# --------------------------------------------------------------------------- bad fills (9.2, 9.3)


@pytest.mark.parametrize("fill, phrase", [(float("inf"), r"\+inf"), (float("nan"), "NaN")])
def test_top_k_refuses_fills_that_break_softmax(fill, phrase):
    def wrong(logits, k):
        threshold = torch.topk(logits, k, -1).values[..., -1:]
        return logits.masked_fill(logits < threshold, fill)

    with pytest.raises(CheckFailed, match=phrase):
        C.check_top_k_filter(wrong)


@pytest.mark.parametrize("fill, phrase", [(float("inf"), r"\+inf"), (float("nan"), "NaN")])
def test_top_p_refuses_fills_that_break_softmax(fill, phrase):
    with pytest.raises(CheckFailed, match=phrase):
        C.check_top_p_filter(top_p_variant(fill=fill))


# --------------------------------------------------------------------------- 9.4 offset mask


def offset_with_tril(q, k, v, past):  # the reference, as the notebook writes it
    return K.attend_with_offset(q, k, v, past)


def offset_with_indices(q, k, v, past):  # index comparison, adding -inf, float64
    T = q.shape[-2]
    scores = (q.double() @ k.double().transpose(-2, -1)) / q.shape[-1] ** 0.5
    key_pos = torch.arange(past + T)[None, :]
    query_pos = torch.arange(T)[:, None] + past
    scores = scores + torch.where(key_pos <= query_pos, 0.0, float("-inf"))
    return scores.softmax(-1) @ v.double()


def offset_with_sdpa(q, k, v, past):  # torch's attention with an explicit boolean mask
    T = q.shape[-2]
    allowed = torch.ones(T, past + T, dtype=torch.bool).tril(diagonal=past)
    return torch.nn.functional.scaled_dot_product_attention(q, k, v, attn_mask=allowed)


def test_offset_mask_accepts_correct_answers(capsys):
    for answer in (offset_with_tril, offset_with_indices, offset_with_sdpa):
        C.check_attend_with_offset(answer)
    assert capsys.readouterr().out.count("✅") == 3


@pytest.mark.parametrize("mistake", C.OFFSET_MASK_MISTAKES, ids=lambda m: m.name)
def test_offset_mask_names_each_planted_mistake(mistake):
    with pytest.raises(CheckFailed, match=mistake.message[:40]):
        C.check_attend_with_offset(mistake.fn)


def test_offset_mask_names_is_causal_as_ignoring_the_offset():
    def with_is_causal(q, k, v, past):  # top-left aligned: the queries taken as positions 0..
        return torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=True)

    with pytest.raises(CheckFailed, match="the offset is ignored"):
        C.check_attend_with_offset(with_is_causal)


def test_offset_mask_names_a_mask_with_every_key_hidden():
    def inverted(q, k, v, past):  # masked_fill where the query MAY look
        T = q.shape[-2]
        scores = q @ k.transpose(-2, -1) / q.shape[-1] ** 0.5
        allowed = torch.ones(T, past + T, dtype=torch.bool).tril(diagonal=past)
        return scores.masked_fill(allowed, float("-inf")).softmax(-1) @ v

    with pytest.raises(CheckFailed, match="wrong side"):
        C.check_attend_with_offset(inverted)


def test_offset_mask_not_done_and_wrong_shape():
    def stub(q, k, v, past):
        raise NotImplementedError("Exercise 9.4")

    with pytest.raises(CheckFailed, match="not done yet"):
        C.check_attend_with_offset(stub)
    with pytest.raises(CheckFailed, match="shape"):
        C.check_attend_with_offset(lambda q, k, v, past: q[..., 0])
