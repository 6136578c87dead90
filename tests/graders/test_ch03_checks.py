"""Chapter 3's checks (gpt2lib.course.checks.attention): right answers in any style pass, every planted mistake is named."""

from __future__ import annotations

import math

import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F
from check_cases import assert_named

from gpt2lib.chapters.attention import (
    CausalSelfAttention,
    HookPoint,
    attention_pattern,
    attention_weights,
    merge_heads,
    split_heads,
)
from gpt2lib.chapters.config import GPT2Config
from gpt2lib.chapters.layers import Conv1D
from gpt2lib.course.checks import CheckFailed
from gpt2lib.course.checks import attention as checks
from gpt2lib.course.checks._core import NotDoneYet
from gpt2lib.course.checks.attention import ListCache

NO_DROPOUT = dict(embd_pdrop=0.0, attn_pdrop=0.0, resid_pdrop=0.0)


def small_config(**kw):
    return GPT2Config(
        **{
            **dict(vocab_size=50257, n_positions=32, n_embd=32, n_head=4, n_layer=1),
            **NO_DROPOUT,
            **kw,
        }
    )


def randomise(module, seed=0):
    """Weights and biases large enough that attention is far from uniform."""
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in module.parameters():
            p.copy_(torch.randn(p.shape, generator=gen) * 0.3)
    return module


def loop_attention(layer, x):
    """GPT-2 attention written with Python loops over batch, heads, queries and keys."""
    B, T, C = x.shape
    nh, hd = layer.n_head, C // layer.n_head
    qkv = x @ layer.c_attn.weight + layer.c_attn.bias
    y = torch.zeros(B, T, C)
    for b in range(B):
        for h in range(nh):
            cols = slice(h * hd, (h + 1) * hd)
            q, k, v = qkv[b, :, cols], qkv[b, :, C:][:, cols], qkv[b, :, 2 * C :][:, cols]
            for i in range(T):
                scores = torch.stack([q[i] @ k[j] / math.sqrt(hd) for j in range(i + 1)])
                w = torch.softmax(scores, dim=0)
                y[b, i, cols] = sum(w[j] * v[j] for j in range(i + 1))
    return y @ layer.c_proj.weight + layer.c_proj.bias


def test_conv1d_is_linear_with_the_weight_transposed():
    torch.manual_seed(0)
    conv = Conv1D(5, 7)
    assert conv.weight.shape == (5, 7) and conv.bias.shape == (7,)
    randomise(conv)
    for x in (torch.randn(3, 5), torch.randn(2, 4, 5), torch.randn(2, 3, 4, 5)):
        assert torch.allclose(conv(x), F.linear(x, conv.weight.T, conv.bias), atol=1e-6)


# --------------------------------------------------------------------------- CausalSelfAttention


def test_attention_matches_python_loops():
    torch.manual_seed(0)
    layer = randomise(CausalSelfAttention(small_config(n_embd=12, n_head=3))).eval()
    x = torch.randn(2, 6, 12)
    with torch.no_grad():
        assert torch.allclose(layer(x), loop_attention(layer, x), atol=1e-5)


@pytest.mark.parametrize("impl", ["eager", "sdpa"])
def test_attention_matches_hugging_face(impl):
    transformers = pytest.importorskip("transformers")
    from transformers.models.gpt2.modeling_gpt2 import GPT2Attention

    hf_config = transformers.GPT2Config(
        n_embd=32,
        n_head=4,
        n_layer=1,
        n_positions=16,
        attn_pdrop=0.0,
        resid_pdrop=0.0,
        embd_pdrop=0.0,
    )
    hf_config._attn_implementation = impl
    hf = randomise(GPT2Attention(hf_config, layer_idx=0)).eval()
    ours = CausalSelfAttention(GPT2Config.from_dict(hf_config.to_dict())).eval()
    ours.load_state_dict(hf.state_dict())  # same names and [in, out] layout: loads as is
    T = 9
    x = torch.randn(2, T, 32)
    causal = torch.zeros(1, 1, T, T).masked_fill(
        torch.ones(T, T, dtype=torch.bool).triu(1), float("-inf")
    )
    with torch.no_grad():
        assert torch.allclose(ours(x), hf(x, attention_mask=causal)[0], atol=1e-5)


def test_future_tokens_do_not_change_the_past():
    torch.manual_seed(0)
    layer = randomise(CausalSelfAttention(small_config())).eval()
    x = torch.randn(1, 8, 32)
    x2 = x.clone()
    x2[:, 5:] = torch.randn(1, 3, 32)
    with torch.no_grad():
        a, b = layer(x), layer(x2)
    assert torch.allclose(a[:, :5], b[:, :5], atol=1e-6)
    assert not torch.allclose(a[:, 5:], b[:, 5:])


def test_kv_cache_chunks_and_single_steps_match_the_full_pass():
    torch.manual_seed(0)
    layer = randomise(CausalSelfAttention(small_config())).eval()
    x = torch.randn(2, 10, 32)
    with torch.no_grad():
        full = layer(x)
        cache = ListCache()
        parts = [layer(x[:, :4], kv_cache=cache)]  # past == 0
        parts.append(layer(x[:, 4:7], kv_cache=cache))  # past == 4, T == 3: offset mask
        for t in range(7, 10):
            parts.append(layer(x[:, t : t + 1], kv_cache=cache))  # past > 0, T == 1
    assert cache.position == 10
    assert torch.allclose(torch.cat(parts, dim=1), full, atol=1e-5)


def test_dropout_only_in_training():
    torch.manual_seed(0)
    layer = randomise(CausalSelfAttention(small_config(attn_pdrop=0.5, resid_pdrop=0.5)))
    x = torch.randn(2, 6, 32)
    layer.eval()
    assert torch.equal(layer(x), layer(x))
    layer.train()
    assert not torch.allclose(layer(x), layer(x))


@pytest.mark.parametrize("shape", [(4, 32), (1, 4, 16), (1, 2, 4, 32)])
def test_a_bad_input_shape_never_passes_the_layer_silently(shape):
    # the layer is plain teaching code without argument checks, but a wrong shape still stops it
    layer = CausalSelfAttention(small_config())
    with pytest.raises((ValueError, RuntimeError, IndexError)):
        layer(torch.randn(*shape))
    with pytest.raises((ValueError, RuntimeError, IndexError)):
        attention_weights(layer, torch.randn(*shape))


@pytest.mark.parametrize("shape", [(4,), (1, 2, 4)])
def test_the_clear_message_about_a_bad_shape_comes_from_the_entry_point(shape):
    from gpt2lib import GPT2
    from gpt2lib.generation import generate

    model = GPT2(small_config()).eval()
    with pytest.raises(ValueError, match=r"token ids must have shape \(B, T\)"):
        generate(model, torch.zeros(shape, dtype=torch.long), 1)


def test_attention_weights_are_causal_rows_that_reproduce_the_output():
    torch.manual_seed(0)
    layer = randomise(CausalSelfAttention(small_config())).eval()
    x = torch.randn(2, 7, 32)
    with torch.no_grad():
        w = attention_weights(layer, x)  # (B, nh, T, T)
        assert w.shape == (2, 4, 7, 7)
        assert torch.allclose(w.sum(-1), torch.ones(2, 4, 7), atol=1e-6)
        assert torch.count_nonzero(w.triu(1)) == 0
        v = layer.c_attn(x)[..., 64:].view(2, 7, 4, 8).transpose(1, 2)  # (B, nh, T, hd)
        y = (w @ v).transpose(1, 2).reshape(2, 7, 32)
        assert torch.allclose(layer.c_proj(y), layer(x), atol=1e-5)


# --------------------------------------------------------------------------- check 3.1


def test_the_reference_head_reads_the_previous_token():
    for T in (2, 5, 30):
        w_q, w_k = checks.previous_token_head_reference(T)
        weights = checks.attend(w_q, w_k, torch.eye(T), scale=1 / math.sqrt(T))[1]
        assert bool((weights.diagonal(offset=-1) >= 0.99).all())


def test_check_previous_token_head_accepts_right_answers(capsys):
    checks.check_previous_token_head(checks.previous_token_head_reference)

    def with_loops(T):  # lists of lists, float64, a larger scale
        w_q = torch.zeros(T, T, dtype=torch.float64)
        for i in range(1, T):
            w_q[i, i - 1] = 100.0
        return w_q, torch.eye(T, dtype=torch.float64)

    def keys_do_the_shift(T):  # w_q = I, w_k[j] = e_{j+1}: q_i . k_j large when j + 1 = i
        return 20 * math.sqrt(T) * torch.eye(T), torch.diag(torch.ones(T - 1), diagonal=1)

    checks.check_previous_token_head(with_loops)
    checks.check_previous_token_head(keys_do_the_shift)
    assert capsys.readouterr().out.count("✅ Exercise 3.4") == 3


@pytest.mark.parametrize("mistake", checks.PREVIOUS_TOKEN_MISTAKES, ids=lambda m: m.name)
def test_check_previous_token_head_names_every_planted_mistake(mistake):
    assert_named(checks.check_previous_token_head, mistake.fn, mistake.message)


@pytest.mark.parametrize(
    "wrong, phrase",
    [
        (lambda T: torch.eye(T), "return two matrices"),
        (
            lambda T: (torch.eye(T), torch.eye(T + 1)),
            r"w_k for T=4 has shape \(5, 5\), expected \(4, 4\)",
        ),
        (lambda T: (torch.eye(T) * float("inf"), torch.eye(T)), r"contains ±inf|NaN"),
        (lambda T: (torch.eye(T).tolist(), torch.eye(T)), "should be a torch.Tensor"),
        (
            lambda T: (torch.diag(torch.ones(T - 2), diagonal=-2) * 100, torch.eye(T)),
            r"token \d+ puts only",
        ),
    ],
)
def test_check_previous_token_head_names_other_mistakes(wrong, phrase):
    with pytest.raises(CheckFailed, match=phrase):
        checks.check_previous_token_head(wrong)


# --------------------------------------------------------------------------- check 3.2


def good_multi_head(q, k, v, n_head):
    B, T, C = q.shape
    q, k, v = (t.reshape(B, T, n_head, -1).transpose(1, 2) for t in (q, k, v))
    scores = (q @ k.transpose(-2, -1)) / math.sqrt(q.shape[-1])
    w = scores.masked_fill(torch.ones(T, T, dtype=torch.bool).triu(1), float("-inf")).softmax(-1)
    return (w @ v).transpose(1, 2).reshape(B, T, C), w


def einsum_multi_head(q, k, v, n_head):  # einsum, a tril mask, adding -inf instead of masked_fill
    B, T, C = q.shape
    hd = C // n_head
    q, k, v = (t.reshape(B, T, n_head, hd) for t in (q, k, v))
    scores = torch.einsum("bthd,bshd->bhts", q, k) / hd**0.5
    scores = scores + torch.zeros(T, T).masked_fill(
        ~torch.tril(torch.ones(T, T, dtype=torch.bool)), float("-inf")
    )
    w = scores.softmax(-1)
    return torch.einsum("bhts,bshd->bthd", w, v).reshape(B, T, C), w


def loop_multi_head(q, k, v, n_head):  # loops over heads, index comparisons, float64
    B, T, C = q.shape
    hd = C // n_head
    outs, weights = [], []
    i, j = torch.arange(T)[:, None], torch.arange(T)[None, :]
    for h in range(n_head):
        cols = slice(h * hd, (h + 1) * hd)
        s = (q[..., cols].double() @ k[..., cols].double().transpose(1, 2)) / math.sqrt(hd)
        w = torch.where(j <= i, s, torch.tensor(float("-inf"), dtype=torch.float64)).softmax(-1)
        outs.append(w @ v[..., cols].double())
        weights.append(w)
    return torch.cat(outs, dim=-1), torch.stack(weights, dim=1)


def sdpa_multi_head(q, k, v, n_head):  # not what the exercise asks, but a right answer all the same
    _, w = good_multi_head(q, k, v, n_head)
    qh, kh, vh = (checks.split(t, n_head) for t in (q, k, v))
    return checks.merge(F.scaled_dot_product_attention(qh, kh, vh, is_causal=True)), w


def test_check_multi_head_accepts_right_answers(capsys):
    for answer in (good_multi_head, einsum_multi_head, loop_multi_head, sdpa_multi_head):
        checks.check_multi_head_attention(answer)
    assert capsys.readouterr().out.count("✅ Exercise 3.5") == 4


def test_every_planted_multi_head_mistake_differs_from_the_right_answer():
    """Otherwise the check could call a right answer wrong, or never name that mistake."""
    gen = torch.Generator().manual_seed(1)
    q, k, v = (torch.randn(2, 5, 12, generator=gen) for _ in range(3))
    right = checks._heads(q, k, v, 3)[0]
    for mistake in checks.MULTI_HEAD_MISTAKES:
        assert not torch.allclose(mistake.fn(q, k, v, 3)[0], right, equal_nan=True), mistake.name


@pytest.mark.parametrize("mistake", checks.MULTI_HEAD_MISTAKES, ids=lambda m: m.name)
def test_check_multi_head_names_every_planted_mistake(mistake):
    assert_named(checks.check_multi_head_attention, mistake.fn, mistake.message)


def diagonal_masked_too(q, k, v, n_head):  # hides the token itself: row 0 has nothing left to see
    T = q.shape[1]
    qh, kh, vh = (checks.split(t, n_head) for t in (q, k, v))
    w = (
        (qh @ kh.transpose(-2, -1))
        .masked_fill(torch.ones(T, T, dtype=torch.bool).triu(0), float("-inf"))
        .softmax(-1)
    )
    return checks.merge(w @ vh), w


@pytest.mark.parametrize(
    "wrong, phrase",
    [
        (lambda q, k, v, n: good_multi_head(q, k, v, n)[0], "return two tensors"),
        (
            lambda q, k, v, n: (
                good_multi_head(q, k, v, n)[0],
                good_multi_head(q, k, v, n)[1].mean(1),
            ),
            "ONE head over all C features",
        ),
        (
            lambda q, k, v, n: (
                checks.split(good_multi_head(q, k, v, n)[0], n),
                good_multi_head(q, k, v, n)[1],
            ),
            r"that is \(B, nh, T, hd\): merge the heads back",
        ),
        (
            lambda q, k, v, n: (
                good_multi_head(q, k, v, n)[0],
                checks.split(good_multi_head(q, k, v, n)[0], n),
            ),
            "shape of the heads' OUTPUT",
        ),
        (
            lambda q, k, v, n: (good_multi_head(q, k, v, n)[0], good_multi_head(q, k, v, n)[1] * 2),
            "rows of your weights do not sum to 1",
        ),
        (
            lambda q, k, v, n: (
                good_multi_head(q, k, v, n)[0],
                good_multi_head(q, k, v, n)[1].flip(-2),
            ),
            "not the ones that made it",
        ),
        (
            lambda q, k, v, n: (good_multi_head(q, k, v, n)[0] * 2, good_multi_head(q, k, v, n)[1]),
            "y differs from causal multi-head attention",
        ),
        (
            lambda q, k, v, n: (q.view(*q.shape[:2], n, -1).transpose(1, 2).view(q.shape), None),
            r"`.view` failed",
        ),
        (diagonal_masked_too, "contains NaN: some row of scores is entirely -inf"),
        (
            lambda q, k, v, n: (good_multi_head(q, k, v, n)[0].tolist(), None),
            "should be a torch.Tensor",
        ),
    ],
)
def test_check_multi_head_names_other_mistakes(wrong, phrase):
    with pytest.raises(CheckFailed, match=phrase):
        checks.check_multi_head_attention(wrong)


def test_a_view_of_the_sliced_inputs_fails_like_in_the_model():
    def view_merge(q, k, v, n_head):
        _, w = good_multi_head(q, k, v, n_head)
        vh = checks.split(v, n_head)
        return (w @ vh).transpose(1, 2).view(q.shape), w  # transpose then view: refused

    with pytest.raises(CheckFailed, match=r"`.view` failed: after a transpose"):
        checks.check_multi_head_attention(view_merge)


# --------------------------------------------------------------------------- check 3.3


class Planted(nn.Module):
    """GPT-2 attention with one planted mistake: the given __init__, a forward made of the mistake."""

    mistake = None

    def __init__(self, config):
        super().__init__()
        self.n_head = config.n_head
        self.c_attn = Conv1D(config.n_embd, 3 * config.n_embd)
        self.c_proj = Conv1D(config.n_embd, config.n_embd)
        self.resid_dropout = nn.Dropout(config.resid_pdrop)

    def forward(self, x, kv_cache=None):
        weights = dict(self.named_parameters())
        p = self.resid_dropout.p if self.training else 0.0
        if kv_cache is None:
            return self.mistake.fn(x, weights, self.n_head, p)
        # with a cache: remember the inputs so far (attention is causal: the new rows of the whole
        # sequence are the answer), and advance the cache by T
        seen = getattr(kv_cache, "planted_inputs", None)
        full = x if seen is None else torch.cat([seen, x], dim=1)
        kv_cache.planted_inputs = full
        empty = torch.zeros(x.shape[0], self.n_head, x.shape[1], 1)
        kv_cache.update(empty, empty)
        return self.mistake.fn(full, weights, self.n_head, p)[:, -x.shape[1] :]


def planted(mistake):
    return type(f"Planted_{mistake.name}", (Planted,), {"mistake": mistake})


class LinearAttention(nn.Module):
    """A right answer built differently: nn.Linear-style math, chunk instead of split, its own
    cache handling and attention (no SDPA: the pattern always, through the hook point), F.dropout
    with training=self.training."""

    def __init__(self, config):
        super().__init__()
        self.nh = config.n_head
        self.p = config.resid_pdrop
        self.c_attn = Conv1D(config.n_embd, 3 * config.n_embd)
        self.c_proj = Conv1D(config.n_embd, config.n_embd)
        self.hook_pattern = HookPoint()

    def forward(self, x, kv_cache=None):
        q, k, v = (
            checks.split(t, self.nh)
            for t in F.linear(x, self.c_attn.weight.T, self.c_attn.bias).chunk(3, dim=-1)
        )
        if kv_cache is not None:
            k, v, _ = kv_cache.update(k, v)
        pattern = self.hook_pattern(checks.attend(q, k, v)[1])  # offset causal mask built in
        y = pattern @ v
        return F.dropout(self.c_proj(checks.merge(y)), self.p, training=self.training)


class SubclassOfTheReference(CausalSelfAttention):
    pass


def test_check_module_accepts_right_answers(capsys):
    checks.check_causal_self_attention(CausalSelfAttention)
    checks.check_causal_self_attention(LinearAttention)
    checks.check_causal_self_attention(SubclassOfTheReference)
    assert capsys.readouterr().out.count("✅ Exercise 3.6") == 3


class ScoresThroughTheHook(CausalSelfAttention):
    """Sends the scaled scores, not the softmax pattern, through the hook point."""

    def forward(self, x, kv_cache=None):
        if not self.hook_pattern.active:
            return super().forward(x, kv_cache)
        q, k, v = (split_heads(t, self.n_head) for t in self.c_attn(x).split(self.n_embd, dim=2))
        scores = q @ k.mT / math.sqrt(q.shape[-1])
        self.hook_pattern(scores)
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        return self.resid_dropout(self.c_proj(merge_heads(y)))


class HookIgnored(CausalSelfAttention):
    """Calls the hook point but uses its own pattern, not what the hook returns."""

    def forward(self, x, kv_cache=None):
        if not self.hook_pattern.active:
            return super().forward(x, kv_cache)
        q, k, v = (split_heads(t, self.n_head) for t in self.c_attn(x).split(self.n_embd, dim=2))
        pattern = attention_pattern(q, k)
        self.hook_pattern(pattern)
        return self.resid_dropout(self.c_proj(merge_heads(pattern @ v)))


def test_check_module_names_a_wrong_or_ignored_hook_pattern():
    assert_named(
        checks.check_causal_self_attention,
        ScoresThroughTheHook,
        "what goes through hook_pattern is not the attention pattern",
    )
    assert_named(
        checks.check_causal_self_attention,
        HookIgnored,
        "a hook that replaces the pattern does not change your output",
    )


@pytest.mark.parametrize("mistake", checks.MODULE_MISTAKES, ids=lambda m: m.name)
def test_check_module_names_every_planted_mistake(mistake):
    assert_named(checks.check_causal_self_attention, planted(mistake), mistake.message)


class LinearLayout(nn.Module):
    def __init__(self, config):
        super().__init__()
        self.c_attn = nn.Linear(config.n_embd, 3 * config.n_embd)
        self.c_proj = nn.Linear(config.n_embd, config.n_embd)

    def forward(self, x, kv_cache=None):
        return x


class OtherNames(nn.Module):
    def __init__(self, config):
        super().__init__()
        self.qkv = Conv1D(config.n_embd, 3 * config.n_embd)

    def forward(self, x, kv_cache=None):
        return x


def _answer(first_gap, second_gap):
    """CausalSelfAttention with its two gaps filled by the given functions."""

    class Answer(CausalSelfAttention):
        def forward(self, x, kv_cache=None):
            q, k, v = first_gap(self, x)
            if kv_cache is not None:
                k, v, _ = kv_cache.update(k, v)
            y = checks.attend(q, k, v)[0]
            return second_gap(self, y)

    return Answer


def _right_first(self, x):
    return [split_heads(t, self.n_head) for t in self.c_attn(x).split(self.n_embd, dim=2)]


def test_check_module_names_structural_mistakes():
    with pytest.raises(CheckFailed, match=r"\[out, in\], like nn.Linear; GPT-2 stores \[in, out\]"):
        checks.check_causal_self_attention(LinearLayout)
    with pytest.raises(
        CheckFailed, match="no parameter named c_attn.weight.*found: qkv.weight, qkv.bias"
    ):
        checks.check_causal_self_attention(OtherNames)
    with pytest.raises(CheckFailed, match="should build an nn.Module"):
        checks.check_causal_self_attention(lambda config: "attention")
    with pytest.raises(CheckFailed, match="Keep the signature"):
        checks.check_causal_self_attention(lambda: None)
    view_merge = _answer(
        _right_first,
        lambda self, y: self.resid_dropout(
            self.c_proj(y.transpose(1, 2).view(y.shape[0], y.shape[2], -1))
        ),
    )
    with pytest.raises(CheckFailed, match=r"contiguous\(\)"):
        checks.check_causal_self_attention(view_merge)
    cache_of_the_wrong_shape = _answer(
        lambda self, x: [t for t in self.c_attn(x).split(self.n_embd, dim=2)],
        lambda self, y: self.resid_dropout(self.c_proj(y)),
    )  # no heads at all
    with pytest.raises(CheckFailed, match="ONE head over all C features"):
        checks.check_causal_self_attention(cache_of_the_wrong_shape)
    dropout_before_c_proj = _answer(
        _right_first, lambda self, y: self.c_proj(self.resid_dropout(merge_heads(y)))
    )
    with pytest.raises(
        CheckFailed, match="in train\\(\\) mode it is not the layer followed by residual dropout"
    ):
        checks.check_causal_self_attention(dropout_before_c_proj)

    class NoCacheParameter(CausalSelfAttention):
        def forward(self, x):
            return super().forward(x)

    with pytest.raises(CheckFailed, match="Keep the signature"):
        checks.check_causal_self_attention(NoCacheParameter)

    class IgnoresTheCache(CausalSelfAttention):
        def forward(self, x, kv_cache=None):
            return super().forward(x)

    with pytest.raises(CheckFailed, match="fed in pieces through a kv_cache"):
        checks.check_causal_self_attention(IgnoresTheCache)


def test_checks_report_stubs_and_wrong_signatures():
    def stub(*args):
        raise NotImplementedError("stub")

    class Unfinished(CausalSelfAttention):
        def forward(self, x, kv_cache=None):
            raise NotImplementedError(
                "Exercise 3.6 (CausalSelfAttention): replace this line with your code"
            )

    for check, answer in (
        (checks.check_previous_token_head, stub),
        (checks.check_multi_head_attention, stub),
        (checks.check_causal_self_attention, Unfinished),
    ):
        with pytest.raises(NotDoneYet, match="not done yet"):
            check(answer)
    with pytest.raises(CheckFailed, match="Keep the signature"):
        checks.check_previous_token_head(lambda: None)
    with pytest.raises(CheckFailed, match="Keep the signature"):
        checks.check_multi_head_attention(lambda q, k, v: q)


def test_checks_leave_the_global_random_state_alone():
    torch.manual_seed(7)
    want = torch.rand(3)
    torch.manual_seed(7)
    checks.check_causal_self_attention(CausalSelfAttention)
    assert torch.equal(torch.rand(3), want)


def test_the_pattern_is_computed_only_when_a_hook_listens_and_is_what_the_layer_used():
    torch.manual_seed(0)
    layer = randomise(CausalSelfAttention(small_config())).eval()
    x = torch.randn(2, 6, 32)
    built = []
    layer.c_attn.register_forward_hook(lambda *a: built.append(1))
    with torch.no_grad():
        fast = layer(x)
        seen = []
        handle = layer.hook_pattern.register_forward_hook(lambda m, a, out: seen.append(out))
        recorded = layer(x)
        handle.remove()
    assert len(built) == 2 and len(seen) == 1  # one c_attn a forward, with or without a hook
    assert seen[0].shape == (2, layer.n_head, 6, 6)
    torch.testing.assert_close(seen[0].sum(-1), torch.ones(2, layer.n_head, 6))
    torch.testing.assert_close(recorded, fast, atol=1e-6, rtol=1e-5)
    # a hook that changes the pattern changes the output: the layer uses what passed the hook
    uniform = torch.ones(6, 6).tril() / torch.arange(1, 7)[:, None]
    handle = layer.hook_pattern.register_forward_hook(lambda m, a, out: uniform.expand_as(out))
    with torch.no_grad():
        assert not torch.allclose(layer(x), fast, atol=1e-4)
    handle.remove()
    assert not layer.hook_pattern.active


# --------------------------------------------------------------------------- checks 3.1 and 3.2


def loops_reference(q, k, v):
    """A right loops answer: a stable softmax through math.exp."""
    T, d = q.shape
    out, weights = torch.zeros(T, v.shape[1]), torch.zeros(T, T)
    for i in range(T):
        scores = [float(q[i] @ k[j]) / math.sqrt(d) for j in range(i + 1)]
        exps = [math.exp(s - max(scores)) for s in scores]
        for j in range(i + 1):
            weights[i, j] = exps[j] / sum(exps)
            out[i] += weights[i, j] * v[j]
    return out, weights


def matrices_with_where(q, k, v):  # torch.where and an index comparison instead of masked_fill
    T = q.shape[-2]
    i, j = torch.arange(T)[:, None], torch.arange(T)[None, :]
    scores = torch.where(j <= i, q @ k.mT / q.shape[-1] ** 0.5, float("-inf"))
    w = scores.softmax(-1)
    return w @ v, w


def test_causal_attention_is_one_head_of_the_reference_and_uses_the_one_mask():
    from gpt2lib.chapters.attention import causal_attention

    torch.manual_seed(0)
    q, k, v = torch.randn(3, 2, 3, 6, 4).unbind(0)
    out, w = causal_attention(q, k, v)
    want_out, want_w = checks.attend(q, k, v)
    assert torch.allclose(out, want_out, atol=1e-6) and torch.allclose(w, want_w, atol=1e-6)
    assert torch.allclose(out, F.scaled_dot_product_attention(q, k, v, is_causal=True), atol=1e-5)


def test_one_head_checks_accept_right_answers(capsys):
    from gpt2lib.chapters.attention import causal_attention

    checks.check_attention_with_loops(loops_reference)
    checks.check_attention_with_loops(causal_attention)  # matrices are fine for the loops check too
    checks.check_causal_attention(causal_attention)
    checks.check_causal_attention(matrices_with_where)
    out = capsys.readouterr().out
    assert out.count("✅ Exercise 3.1") == 2 and out.count("✅ Exercise 3.2") == 2


@pytest.mark.parametrize("mistake", checks.ONE_HEAD_MISTAKES, ids=lambda m: m.name)
def test_check_attention_with_loops_names_every_planted_mistake(mistake):
    assert_named(checks.check_attention_with_loops, mistake.fn, mistake.message)


@pytest.mark.parametrize("mistake", checks.ONE_HEAD_MISTAKES[:-1], ids=lambda m: m.name)
def test_check_causal_attention_names_every_planted_mistake(mistake):
    assert_named(checks.check_causal_attention, mistake.fn, mistake.message)


def test_a_torch_softmax_without_the_max_is_named_as_overflow():
    def exp_by_hand(q, k, v):
        T = q.shape[-2]
        s = (q @ k.mT / math.sqrt(q.shape[-1])).masked_fill(
            torch.ones(T, T, dtype=torch.bool).triu(1), float("-inf")
        )
        w = s.exp() / s.exp().sum(-1, keepdim=True)
        return w @ v, w

    assert_named(checks.check_causal_attention, exp_by_hand, "overflows on large scores")


def test_one_head_checks_report_the_stub_and_a_wrong_return():
    def stub(q, k, v):
        raise NotImplementedError

    with pytest.raises(NotDoneYet):
        checks.check_attention_with_loops(stub)
    with pytest.raises(CheckFailed, match="return two tensors"):
        checks.check_causal_attention(lambda q, k, v: q)
    with pytest.raises(CheckFailed, match=r"has shape"):
        checks.check_causal_attention(lambda q, k, v: (q, q))


# --------------------------------------------------------------------------- check 3.3


def saturation_in_float64(dim, scaled, trials=128, T=16):  # another dtype and batch layout
    q = torch.randn(trials * T, dim, dtype=torch.float64).view(trials, T, dim)
    k = torch.randn(trials * T, dim, dtype=torch.float64).view(trials, T, dim)
    s = torch.einsum("btd,bsd->bts", q, k) / (math.sqrt(dim) if scaled else 1.0)
    return float(s.var()), float(F.softmax(s, -1).amax(-1).mean())


def test_check_saturation_accepts_right_answers(capsys):
    checks.check_saturation(lambda dim, scaled: checks._saturation(dim, scaled))
    checks.check_saturation(saturation_in_float64)
    assert capsys.readouterr().out.count("✅ Exercise 3.3") == 2


@pytest.mark.parametrize("mistake", checks.SATURATION_MISTAKES, ids=lambda m: m.name)
def test_check_saturation_names_every_planted_mistake(mistake):
    assert_named(checks.check_saturation, mistake.fn, mistake.message)


def test_check_saturation_rejects_a_wrong_return():
    with pytest.raises(CheckFailed, match="return two numbers"):
        checks.check_saturation(lambda dim, scaled: 1.0)


# --------------------------------------------------------------------------- split and merge (3.6)


def test_check_split_merge_accepts_the_reference_and_reshape_versions(capsys):
    checks.check_split_merge(split_heads, merge_heads)
    checks.check_split_merge(checks.split, checks.merge)
    assert capsys.readouterr().out.count("split_heads and merge_heads passed") == 2


@pytest.mark.parametrize("mistake", checks.SPLIT_MISTAKES, ids=lambda m: m.name)
def test_check_split_merge_names_every_planted_split_mistake(mistake):
    assert_named(lambda fn: checks.check_split_merge(fn, merge_heads), mistake.fn, mistake.message)


@pytest.mark.parametrize("mistake", checks.MERGE_MISTAKES, ids=lambda m: m.name)
def test_check_split_merge_names_every_planted_merge_mistake(mistake):
    assert_named(lambda fn: checks.check_split_merge(split_heads, fn), mistake.fn, mistake.message)


def test_check_split_merge_names_a_view_after_the_transpose():
    def view_merge(y):
        B, nh, T, hd = y.shape
        return y.transpose(1, 2).view(B, T, nh * hd)

    with pytest.raises(CheckFailed, match=r"`.view` failed"):
        checks.check_split_merge(split_heads, view_merge)


def test_attention_init_stub_is_not_done_yet():
    class Unfinished(nn.Module):
        def __init__(self, config):
            super().__init__()
            raise NotImplementedError("Exercise 3.6: replace this line with your code")

    with pytest.raises(NotDoneYet):
        checks.check_causal_self_attention(Unfinished)


# --------------------------------------------------------------------------- check 3.7


def test_check_attention_by_hand_accepts_right_answers(capsys):
    checks.check_attention_by_hand(checks.attention_by_hand_reference)
    checks.check_attention_by_hand(loop_attention)  # loops over batch, heads, queries and keys
    assert capsys.readouterr().out.count("✅ Exercise 3.7") == 2


# The planted mistake: 3.7 forbids SDPA (and the layer itself); the check must refuse them.
def sdpa_by_hand(layer, x):
    C = x.shape[-1]
    q, k, v = (x @ layer.c_attn.weight + layer.c_attn.bias).split(C, dim=2)
    q, k, v = (split_heads(t, layer.n_head) for t in (q, k, v))
    y = merge_heads(F.scaled_dot_product_attention(q, k, v, is_causal=True))
    return y @ layer.c_proj.weight + layer.c_proj.bias


def test_checks_of_3_1_3_2_and_3_7_name_inputs_changed_in_place():
    def loops_in_place(q, k, v):
        out = checks.attend(q, k, v)
        q.mul_(2)
        return out

    def by_hand_in_place(layer, x):
        out = checks.attention_by_hand_reference(layer, x)
        x.zero_()
        return out

    assert_named(
        checks.check_attention_with_loops, loops_in_place, "changed its input tensors in place"
    )
    assert_named(
        checks.check_causal_attention, loops_in_place, "changed its input tensors in place"
    )
    assert_named(
        checks.check_attention_by_hand, by_hand_in_place, "changed its input tensors in place"
    )


def test_check_attention_by_hand_refuses_sdpa():
    assert_named(
        checks.check_attention_by_hand,
        sdpa_by_hand,
        "calls torch.nn.functional.scaled_dot_product_attention, which is not allowed",
    )


@pytest.mark.parametrize(
    "call",
    [
        lambda layer, x: layer(x),
        lambda layer, x: layer.forward(x),
        lambda layer, x: (
            checks.attention_by_hand_reference(layer, x) * 0
            + layer.c_proj(layer.c_attn(x)[..., : x.shape[-1]])
        ),
    ],
    ids=["layer(x)", "layer.forward(x)", "a submodule"],
)
def test_check_attention_by_hand_refuses_calling_the_layer(call):
    assert_named(checks.check_attention_by_hand, call, "calls the layer or one of its submodules")


def test_the_reference_by_hand_is_the_layer_at_gpt2_small_size():
    torch.manual_seed(0)
    layer = CausalSelfAttention(GPT2Config()).eval()
    x = torch.randn(1, 7, 768)
    with torch.no_grad():
        assert torch.allclose(checks.attention_by_hand_reference(layer, x), layer(x), atol=1e-5)


@pytest.mark.parametrize("mistake", checks.BY_HAND_MISTAKES, ids=lambda m: m.name)
def test_check_attention_by_hand_names_every_planted_mistake(mistake):
    assert_named(checks.check_attention_by_hand, mistake.fn, mistake.message)


def test_check_attention_by_hand_reports_the_stub_a_wrong_shape_and_other_mistakes():
    def stub(layer, x):
        raise NotImplementedError("Exercise 3.7: replace this line with your code")

    with pytest.raises(NotDoneYet):
        checks.check_attention_by_hand(stub)
    assert_named(checks.check_attention_by_hand, lambda layer, x: x[:, :-1], "has shape")
    assert_named(
        checks.check_attention_by_hand,
        lambda layer, x: 2 * checks.attention_by_hand_reference(layer, x),
        "differs from the layer's",
    )


# --------------------------------------------------------------------------- check 3.8


def cost_by_layer(T, n_embd, n_head):  # counted from the matmul shapes, head by head
    hd = n_embd // n_head
    matmuls = [(T, n_embd, 3 * n_embd), (T, n_embd, n_embd)] + [(T, hd, T), (T, T, hd)] * n_head
    return sum(2 * m * k * n for m, k, n in matmuls)


def test_check_attention_cost_accepts_right_answers(capsys):
    checks.check_attention_cost(lambda T, C, n: checks._cost(T, C, n))
    checks.check_attention_cost(cost_by_layer)
    assert capsys.readouterr().out.count("✅ Exercise 3.8") == 2


def test_the_cost_formula_equals_torchs_flop_counter():
    from torch.utils.flop_counter import FlopCounterMode

    layer = CausalSelfAttention(small_config(n_embd=24, n_head=3))
    x = torch.randn(1, 10, 24)
    with torch.no_grad(), FlopCounterMode(display=False) as counter:
        q, k, v = (split_heads(t, 3) for t in layer.c_attn(x).split(24, dim=2))
        w = (q @ k.mT).softmax(-1)
        layer.c_proj(merge_heads(w @ v))
    assert counter.get_total_flops() == checks._cost(10, 24, 3)


@pytest.mark.parametrize("mistake", checks.COST_MISTAKES, ids=lambda m: m.name)
def test_check_attention_cost_names_every_planted_mistake(mistake):
    assert_named(checks.check_attention_cost, mistake.fn, mistake.message)


def test_check_attention_cost_names_an_unknown_wrong_count():
    with pytest.raises(CheckFailed, match="FLOPs, not"):
        checks.check_attention_cost(lambda T, C, n: 1)
    with pytest.raises(CheckFailed, match=r"a tensor: return a Python int \(\.item\(\)\)"):
        checks.check_attention_cost(lambda T, C, n: torch.tensor(checks._cost(T, C, n)))
    with pytest.raises(CheckFailed, match="whole number"):
        checks.check_attention_cost(lambda T, C, n: (1, checks._cost(T, C, n)))


# --------------------------------------------------------------------------- challenge


def relative_position_head(V, T):  # d = 2: a rotation by the position, aimed 2 back
    theta = math.pi / (T + 2)
    pos = torch.arange(T, dtype=torch.float64)
    w_q, w_k = (
        torch.zeros(V + T, 2, dtype=torch.float64),
        torch.zeros(V + T, 2, dtype=torch.float64),
    )
    w_q[V:] = 400 * torch.stack([torch.cos(theta * (pos - 2)), torch.sin(theta * (pos - 2))], dim=1)
    w_k[V:] = torch.stack([torch.cos(theta * pos), torch.sin(theta * pos)], dim=1)
    w_v = torch.zeros(V + T, V, dtype=torch.float64)
    w_v[:V] = torch.eye(V)
    return w_q, w_k, w_v


def reference_copy_head(V, T):
    w_q = torch.zeros(V + T, T)
    w_q[V + 2 :, : T - 2] = 10 * math.sqrt(T) * torch.eye(T - 2)
    w_k = torch.zeros(V + T, T)
    w_k[V:] = torch.eye(T)
    w_v = torch.zeros(V + T, V)
    w_v[:V] = torch.eye(V)
    return w_q, w_k, w_v


def test_check_copy_two_back_accepts_different_designs(capsys):
    checks.check_copy_two_back(reference_copy_head)
    checks.check_copy_two_back(relative_position_head)
    assert capsys.readouterr().out.count("✅ Challenge") == 2


def test_check_copy_two_back_says_how_far_off_and_where_the_head_looks():
    def one_back(V, T):
        w_q, w_k, w_v = reference_copy_head(V, T)
        w_q = torch.zeros_like(w_q)
        w_q[V + 1 :, : T - 1] = 10 * math.sqrt(T) * torch.eye(T - 1)
        return w_q, w_k, w_v

    with pytest.raises(
        CheckFailed,
        match=r"of the rows copy token i - 2 \(goal 0.99\); most rows put their largest weight on token i - 1",
    ):
        checks.check_copy_two_back(one_back)
    with pytest.raises(CheckFailed, match="return three matrices"):
        checks.check_copy_two_back(lambda V, T: reference_copy_head(V, T)[:2])
    with pytest.raises(CheckFailed, match=r"w_v \(V=5, T=8\) has shape"):
        checks.check_copy_two_back(lambda V, T: (*reference_copy_head(V, T)[:2], torch.eye(V + T)))
