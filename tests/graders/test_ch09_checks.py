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
from gpt2lib.chapters import decoding as D
from gpt2lib.course.checks import generation as C
from gpt2lib.course.checks._core import CheckFailed, named
from gpt2lib.speed.measure import decode_bytes_per_token

# --------------------------------------------------------------------------- other right answers


def write_kv_narrow(k_buf, v_buf, k, v, start):  # copy_ into narrowed views
    end = start + k.shape[2]
    k_buf.narrow(2, start, k.shape[2]).copy_(k)
    v_buf.narrow(2, start, v.shape[2]).copy_(v)
    return k_buf.narrow(2, 0, end), v_buf.narrow(2, 0, end)


def temperature_shifted(logits, t):  # a shift per row leaves softmax unchanged
    return logits / t - (logits / t).max(-1, True).values


def temperature_log_softmax(logits, t):
    return torch.log_softmax(logits, -1) / t


def top_k_sorted(logits, k):  # by sorting, with torch.where
    threshold = logits.sort(-1, descending=True).values[..., k - 1 : k]
    return torch.where(logits >= threshold, logits, torch.full_like(logits, float("-inf")))


def top_k_float64(logits, k):
    return D.top_k_filter(logits.double(), k)


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


def sample_by_inverse_cdf(logits, temperature=1.0, top_k=None, top_p=None, generator=None):
    # one uniform number per row, looked up in the running total of the probabilities
    if temperature == 0:
        return logits.argmax(-1)
    probs = G.next_token_probs(logits, temperature, top_k, top_p)
    u = torch.rand(probs.shape[0], 1, generator=generator)
    return (probs.cumsum(-1) < u).sum(-1).clamp(max=probs.shape[-1] - 1)


def kv_bytes_by_heads(config, bytes_per_number):  # heads x head width, the same n_embd
    return 2 * config.n_layer * config.n_head * (config.n_embd // config.n_head) * bytes_per_number


def generate_cached_without_prefill(model, idx, max_new_tokens, sample, cache):
    # the prompt fed one token at a time: slower, the same tokens
    out = idx
    with torch.no_grad():
        for t in range(idx.shape[1]):
            logits = model(idx[:, t : t + 1], kv_cache=cache)[:, -1]
        for i in range(max_new_tokens):
            token = sample(logits)
            out = torch.cat([out, token[:, None]], 1)
            if i + 1 < max_new_tokens:
                logits = model(token[:, None], kv_cache=cache)[:, -1]
    return out


def weight_bytes_by_name(model):
    return (
        sum(p.nbytes for name, p in model.named_parameters() if name != "wpe.weight")
        + model.wpe.weight[0].nbytes
    )


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


def cache_gap_loop(model, cache_cls, idx, prefill):  # a right answer: compared call by call
    B, T = idx.shape
    full = model(idx)
    cache = cache_cls(model.config, B, T, dtype=torch.float32)
    worst = (model(idx[:, :prefill], kv_cache=cache) - full[:, :prefill]).abs().max()
    for t in range(prefill, T):
        worst = torch.maximum(
            worst, (model(idx[:, t : t + 1], kv_cache=cache) - full[:, t : t + 1]).abs().max()
        )
    return float(worst)


def cache_gap_with_kvcache_sizes(
    model, cache_cls, idx, prefill
):  # room for more than T: also right
    B, T = idx.shape
    cache = cache_cls(model.config, B, T + 3)
    logits = [model(idx[:, :prefill], kv_cache=cache)] + [
        model(idx[:, t : t + 1], kv_cache=cache) for t in range(prefill, T)
    ]
    return (torch.cat(logits, 1) - model(idx)).abs().amax().item()


@pytest.mark.parametrize(
    "check, answer",
    cases.right_answers(
        {
            C.check_write_kv: [D.write_kv, write_kv_narrow],
            C.check_sample_token: [D.sample_token, sample_by_inverse_cdf],
            C.check_kv_bytes_per_token: [C._kv_bytes, kv_bytes_by_heads],
            C.check_simple_kv_cache: [D.SimpleKVCache, K.KVCache],
            C.check_generate_cached: [D.generate_cached, generate_cached_without_prefill],
            C.check_cache_gap: [D.cache_gap, cache_gap_loop, cache_gap_with_kvcache_sizes],
            C.check_weight_bytes_per_token: [decode_bytes_per_token, weight_bytes_by_name],
            C.check_apply_temperature: [
                D.apply_temperature,
                temperature_shifted,
                temperature_log_softmax,
            ],
            C.check_top_k_filter: [D.top_k_filter, top_k_sorted, top_k_float64],
            C.check_top_p_filter: [D.top_p_filter, top_p_loop],
            C.check_attend_with_offset: [
                D.attend_with_offset,
                offset_with_indices,
                offset_with_sdpa,
            ],
        }
    ),
)
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
    D.write_kv(k_buf, v_buf, k, v, start)
    return k_buf[:, :, : k.shape[2]], v_buf[:, :, : v.shape[2]]


def top_k_and_the_smallest(logits, k):  # k + 1 tokens, but not the k + 1 largest
    keep = D.top_k_filter(logits, k).isfinite() | (logits == logits.min(-1, keepdim=True).values)
    return logits.masked_fill(~keep, float("-inf"))


def top_p_ignores_p_at_one(logits, p):  # inverted below p = 1, then keeps everything
    return logits.clone() if p >= 1 else C._top_p(logits, p, mistake="inverted")


def attention_with_is_causal(q, k, v, past):  # top-left aligned: the queries taken as 0..
    return torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=True)


def attention_masking_the_allowed_keys(q, k, v, past):  # masked_fill where the query MAY look
    T = q.shape[-2]
    scores = q @ k.transpose(-2, -1) / q.shape[-1] ** 0.5
    allowed = torch.ones(T, past + T, dtype=torch.bool).tril(diagonal=past)
    return scores.masked_fill(allowed, float("-inf")).softmax(-1) @ v


@pytest.mark.parametrize(
    "check, answer, message",
    cases.numbered(
        [
            (C.check_write_kv, lambda k_buf, v_buf, k, v: None, "cannot take that"),
            (C.check_write_kv, lambda k_buf, v_buf, k, v, start: k, "return two tensors"),
            (C.check_write_kv, write_kv_returning_two_old_tokens, "you returned only the new keys"),
            (C.check_generate_cached, lambda model, idx, n, sample, cache: idx, "has shape"),
            (
                C.check_cache_gap,
                lambda model, cls, idx, prefill: torch.tensor(
                    D.cache_gap(model, cls, idx, prefill)
                ),
                "return a Python float",
            ),
            (C.check_cache_gap, lambda model, cls, idx, prefill: [0.0], "return one Python float"),
            (C.check_cache_gap, lambda model, cls, idx, prefill: 0.0, "your gap is 0"),
            (
                C.check_cache_gap,
                lambda model, cls, idx, prefill: D.cache_gap(model, cls, idx, prefill) + 1.0,
                "with a right cache",
            ),
            (C.check_kv_bytes_per_token, lambda config, size: "72 KiB", "return a number of bytes"),
            (
                C.check_simple_kv_cache,
                lambda config, B, max_len, device=None, dtype=None: None,
                "cache.layers should be a list",
            ),
            (C.check_apply_temperature, lambda logits, t: [1.0], "should be a torch.Tensor"),
            (C.check_apply_temperature, lambda logits, t: logits[:, :1] / t, "has shape (2, 1)"),
            (
                C.check_top_k_filter,
                lambda logits, k: torch.topk(logits, k, -1).values,
                "has shape (3, 1)",
            ),
            (C.check_top_k_filter, top_k_and_the_smallest, "with k=1: off by one: you kept k + 1"),
            (C.check_top_p_filter, top_p_ignores_p_at_one, "the mask is inverted"),
            (C.check_attend_with_offset, attention_with_is_causal, "the offset is ignored"),
            (C.check_attend_with_offset, attention_masking_the_allowed_keys, "wrong side"),
            (C.check_attend_with_offset, lambda q, k, v, past: q[..., 0], "shape"),
        ]
    ),
)
def test_other_wrong_answers_are_named(check, answer, message):
    cases.assert_named(check, answer, message)


# --------------------------------------------------------------------------- measured, and the challenge


def test_cache_gains_are_numbers_and_an_inverted_ratio_is_named(capsys):
    C.check_cache_gains([8, 64], [1.2, 3.5])
    assert "✅" in capsys.readouterr().out
    cases.assert_named(lambda g: C.check_cache_gains([8, 64], g), [0.8, 0.3], "cached / uncached")
    cases.assert_named(lambda g: C.check_cache_gains([8, 64], g), [1.0], "one gain per length")
    cases.assert_named(
        lambda g: C.check_cache_gains([8, 64], g), [1.0, float("nan")], "positive number"
    )


class SmallVocabTokenizer:  # text -> ids below the tiny model's vocabulary of 50
    def encode(self, text):
        return [ord(c) % 50 for c in text]

    def decode(self, ids):
        return "".join(chr(65 + i % 26) for i in ids)


def beam_search_reference(model, idx, max_new_tokens, beams):
    seqs, scores = idx, torch.zeros(1)
    with torch.no_grad():
        for _ in range(max_new_tokens):
            logp = torch.log_softmax(model(seqs)[:, -1].float(), dim=-1)
            vocab = logp.shape[-1]
            scores, best = (scores[:, None] + logp).flatten().topk(beams)
            seqs = torch.cat([seqs[best // vocab], (best % vocab)[:, None]], dim=1)
    return seqs[:1]


def test_the_beam_search_challenge_passes_a_beam_search_and_refuses_greedy(capsys):
    model, tokenizer = C._tiny_model(), SmallVocabTokenizer()
    C.check_beam_search_challenge(beam_search_reference, model, tokenizer)
    assert "✅" in capsys.readouterr().out

    def greedy(model, idx, n, beams):
        return G.generate(model, idx, n, temperature=0)

    def worst(model, idx, n, beams):  # the least likely token at every step
        with torch.no_grad():
            for _ in range(n):
                idx = torch.cat([idx, model(idx)[:, -1].argmin(-1, keepdim=True)], 1)
        return idx

    with pytest.raises(CheckFailed, match="only as likely as greedy"):
        C.check_beam_search_challenge(greedy, model, tokenizer)
    with pytest.raises(CheckFailed, match="less likely than greedy"):
        C.check_beam_search_challenge(worst, model, tokenizer)


def test_an_exercise_of_two_parts_passes_once_after_both(capsys):
    C.check_kv_cache(D.write_kv, D.SimpleKVCache)
    C.check_temperature_and_top_k(D.apply_temperature, D.top_k_filter)
    assert capsys.readouterr().out.count("✅") == 2
    with pytest.raises(CheckFailed, match="copies"):
        C.check_kv_cache(named(C.WRITE_KV_MISTAKES, "copies").fn, D.SimpleKVCache)
    with pytest.raises(CheckFailed, match="changed the logits"):
        C.check_temperature_and_top_k(D.apply_temperature, named(C.TOP_K_MISTAKES, "in place").fn)
    assert "✅" not in capsys.readouterr().out
