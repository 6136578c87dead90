"""Chapter 9's checks: each passes the reference (and other correct answers) and names each
planted mistake.

The tests over the mistake lists feed each planted wrong version itself to its check, so the
lists in gpt2lib.course.checks.generation and these tests cannot drift apart.
"""

import check_cases as cases
import pytest
import torch

from gpt2lib import generation as G
from gpt2lib import kvcache as K
from gpt2lib.course.checks import generation as C
from gpt2lib.kernels import split_matmul

# --------------------------------------------------------------------------- other right answers


def write_kv_narrow(k_buf, v_buf, k, v, start):  # copy_ into narrowed views
    end = start + k.shape[2]
    k_buf.narrow(2, start, k.shape[2]).copy_(k)
    v_buf.narrow(2, start, v.shape[2]).copy_(v)
    return k_buf.narrow(2, 0, end), v_buf.narrow(2, 0, end)


def forward_of_the_model(model, idx, cache):  # the finished model's own cached forward
    return model(idx, kv_cache=cache)


def temperature_shifted(logits, t):  # a shift per row leaves softmax unchanged
    return logits / t - (logits / t).max(-1, True).values


def temperature_log_softmax(logits, t):
    return torch.log_softmax(logits, -1) / t


def top_k_sorted(logits, k):  # by sorting, with torch.where
    threshold = logits.sort(-1, descending=True).values[..., k - 1:k]
    return torch.where(logits >= threshold, logits, torch.full_like(logits, float("-inf")))


def top_k_float64(logits, k):
    return G.top_k_filter(logits.double(), k)


def top_p_loop(logits, p):  # a plain loop over the tokens, most likely first
    out = logits.clone()
    probs = torch.softmax(logits, -1)
    for row in range(logits.shape[0]):
        total = 0.0
        for token in probs[row].argsort(descending=True).tolist():
            if total >= p:
                out[row, token] = float("-inf")
            total += float(probs[row, token])
    return out


def split_einsum(x, weight, parts):
    rows, n_in = x.shape
    return torch.einsum("prk,pkn->rn", x.view(rows, parts, n_in // parts).transpose(0, 1),
                        weight.view(parts, n_in // parts, weight.shape[1]))


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


@pytest.mark.parametrize("check, answer", cases.right_answers({
    C.check_write_kv: [K.write_kv, write_kv_narrow],
    C.check_cached_forward: [C._cached_forward(), forward_of_the_model],
    C.check_apply_temperature: [G.apply_temperature, temperature_shifted, temperature_log_softmax],
    C.check_top_k_filter: [G.top_k_filter, top_k_sorted, top_k_float64],
    C.check_top_p_filter: [G.top_p_filter, top_p_loop],
    C.check_split_matmul: [split_matmul, split_einsum],
    C.check_attend_with_offset: [K.attend_with_offset, offset_with_indices, offset_with_sdpa],
}))
def test_right_answers_pass(check, answer, capsys):
    check(answer)
    assert "✅" in capsys.readouterr().out


# --------------------------------------------------------------------------- planted mistakes

@pytest.mark.parametrize("check, mistake", cases.planted(C.MISTAKES_BY_CHECK))
def test_each_planted_mistake_is_named(check, mistake):
    cases.assert_named(check, mistake.fn, mistake.message)


@pytest.mark.parametrize("check", list(C.MISTAKES_BY_CHECK), ids=lambda c: c.__name__)
def test_the_stub_reads_not_done_yet(check):
    cases.assert_not_done_yet(check)


# --------------------------------------------------------------------------- other wrong answers
# (not planted: what the check says about them comes from a symptom or a shape)


def write_kv_returning_two_old_tokens(k_buf, v_buf, k, v, start):  # T positions, the wrong ones
    K.write_kv(k_buf, v_buf, k, v, start)
    return k_buf[:, :, :k.shape[2]], v_buf[:, :, :v.shape[2]]


def top_k_and_the_smallest(logits, k):  # k + 1 tokens, but not the k + 1 largest
    keep = G.top_k_filter(logits, k).isfinite() | (logits == logits.min(-1, keepdim=True).values)
    return logits.masked_fill(~keep, float("-inf"))


def top_p_ignores_p_at_one(logits, p):  # inverted below p = 1, then keeps everything
    return logits.clone() if p >= 1 else C._top_p(invert=True)(logits, p)


def attention_with_is_causal(q, k, v, past):  # top-left aligned: the queries taken as 0..
    return torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=True)


def attention_masking_the_allowed_keys(q, k, v, past):  # masked_fill where the query MAY look
    T = q.shape[-2]
    scores = q @ k.transpose(-2, -1) / q.shape[-1] ** 0.5
    allowed = torch.ones(T, past + T, dtype=torch.bool).tril(diagonal=past)
    return scores.masked_fill(allowed, float("-inf")).softmax(-1) @ v


@pytest.mark.parametrize("check, answer, message", cases.numbered([
    (C.check_write_kv, lambda k_buf, v_buf, k, v: None, "cannot take that"),
    (C.check_write_kv, lambda k_buf, v_buf, k, v, start: k, "return two tensors"),
    (C.check_write_kv, write_kv_returning_two_old_tokens, "you returned only the new keys"),
    (C.check_cached_forward, lambda model, idx, cache: model(idx, kv_cache=cache, last_only=True),
     r"expected logits of shape (B, T, vocab)"),
    (C.check_apply_temperature, lambda logits, t: [1.0], "should be a torch.Tensor"),
    (C.check_apply_temperature, lambda logits, t: logits[:, :1] / t, "has shape (2, 1)"),
    (C.check_top_k_filter, lambda logits, k: torch.topk(logits, k, -1).values, "has shape (3, 1)"),
    (C.check_top_k_filter, top_k_and_the_smallest, "with k=1: off by one: you kept k + 1"),
    (C.check_top_p_filter, top_p_ignores_p_at_one, "the mask is inverted"),
    (C.check_split_matmul, lambda x, weight, parts: (x @ weight).T, "has shape (3, 5)"),
    (C.check_split_matmul, lambda x, weight, parts: C._slab_products(x, weight, parts).sum(2),
     "you summed over the wrong dimension"),
    (C.check_attend_with_offset, attention_with_is_causal, "the offset is ignored"),
    (C.check_attend_with_offset, attention_masking_the_allowed_keys, "wrong side"),
    (C.check_attend_with_offset, lambda q, k, v, past: q[..., 0], "shape"),
]))
def test_other_wrong_answers_are_named(check, answer, message):
    cases.assert_named(check, answer, message)
