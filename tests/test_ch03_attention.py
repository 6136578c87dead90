"""Chapter 3: gpt2lib.attention (Conv1D, CausalSelfAttention, attention_weights) and the checks
behind exercises 3.1-3.4, one test per planted mistake."""

from __future__ import annotations

import math

import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F

from gpt2lib.attention import CausalSelfAttention, Conv1D, attention_weights
from gpt2lib.checks import CheckFailed
from gpt2lib.checks import attention as checks
from gpt2lib.config import GPT2Config

NO_DROPOUT = dict(embd_pdrop=0.0, attn_pdrop=0.0, resid_pdrop=0.0)


def small_config(**kw):
    return GPT2Config(**{**dict(vocab_size=50257, n_positions=32, n_embd=32, n_head=4, n_layer=1), **NO_DROPOUT, **kw})


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
            q, k, v = qkv[b, :, cols], qkv[b, :, C:][:, cols], qkv[b, :, 2 * C:][:, cols]
            for i in range(T):
                scores = torch.stack([q[i] @ k[j] / math.sqrt(hd) for j in range(i + 1)])
                w = torch.softmax(scores, dim=0)
                y[b, i, cols] = sum(w[j] * v[j] for j in range(i + 1))
    return y @ layer.c_proj.weight + layer.c_proj.bias


class ListCache:
    """The smallest cache that follows the protocol chapter 9 implements."""

    def __init__(self):
        self.k = self.v = None

    @property
    def length(self):
        return 0 if self.k is None else self.k.shape[2]

    def update(self, k, v):
        self.k = k if self.k is None else torch.cat([self.k, k], dim=2)
        self.v = v if self.v is None else torch.cat([self.v, v], dim=2)
        return self.k, self.v


# --------------------------------------------------------------------------- Conv1D


def test_conv1d_is_linear_with_the_weight_transposed():
    torch.manual_seed(0)
    conv = Conv1D(5, 7)
    assert conv.weight.shape == (5, 7) and conv.bias.shape == (7,)
    randomise(conv)
    for x in (torch.randn(3, 5), torch.randn(2, 4, 5), torch.randn(2, 3, 4, 5)):
        assert torch.allclose(conv(x), F.linear(x, conv.weight.T, conv.bias), atol=1e-6)


def test_conv1d_on_meta_skips_the_init_but_keeps_shapes():
    with torch.device("meta"):
        conv = Conv1D(16, 48)
    assert conv.weight.is_meta and conv.weight.shape == (16, 48) and conv.bias.shape == (48,)
    # the same draws as before on a real device: the meta skip changes nothing else
    torch.manual_seed(0)
    a = Conv1D(8, 4)
    torch.manual_seed(0)
    b = torch.empty(8, 4).normal_(std=0.02)
    assert torch.equal(a.weight.detach(), b)


def test_conv1d_init_matches_gpt2():
    torch.manual_seed(0)
    conv = Conv1D(256, 512)
    assert abs(conv.weight.std().item() - 0.02) < 1e-3
    assert torch.count_nonzero(conv.bias) == 0


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

    hf_config = transformers.GPT2Config(n_embd=32, n_head=4, n_layer=1, n_positions=16,
                                        attn_pdrop=0.0, resid_pdrop=0.0, embd_pdrop=0.0)
    hf_config._attn_implementation = impl
    hf = randomise(GPT2Attention(hf_config, layer_idx=0)).eval()
    ours = CausalSelfAttention(GPT2Config.from_dict(hf_config.to_dict())).eval()
    ours.load_state_dict(hf.state_dict())  # same names and [in, out] layout: loads as is
    T = 9
    x = torch.randn(2, T, 32)
    causal = torch.zeros(1, 1, T, T).masked_fill(torch.ones(T, T, dtype=torch.bool).triu(1), float("-inf"))
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
            parts.append(layer(x[:, t:t + 1], kv_cache=cache))  # past > 0, T == 1
    assert cache.length == 10
    assert torch.allclose(torch.cat(parts, dim=1), full, atol=1e-5)


def test_dropout_only_in_training():
    torch.manual_seed(0)
    layer = randomise(CausalSelfAttention(small_config(attn_pdrop=0.5, resid_pdrop=0.5)))
    x = torch.randn(2, 6, 32)
    layer.eval()
    assert torch.equal(layer(x), layer(x))
    layer.train()
    assert not torch.allclose(layer(x), layer(x))


def test_submodules_and_parameter_count_of_gpt2_small():
    layer = CausalSelfAttention(GPT2Config())
    assert layer.c_attn.weight.shape == (768, 2304) and layer.c_proj.weight.shape == (768, 768)
    assert isinstance(layer.resid_dropout, nn.Dropout)
    assert sum(p.numel() for p in layer.parameters()) == 768 * 2304 + 2304 + 768 * 768 + 768


@pytest.mark.parametrize("shape", [(4, 32), (1, 4, 16), (1, 2, 4, 32)])
def test_attention_rejects_bad_input_shapes(shape):
    layer = CausalSelfAttention(small_config())
    with pytest.raises(ValueError, match=r"expected x of shape \(B, T, 32\)"):
        layer(torch.randn(*shape))
    with pytest.raises(ValueError, match=r"expected x of shape \(B, T, 32\)"):
        attention_weights(layer, torch.randn(*shape))


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


# --------------------------------------------------------------------------- planted variants


def test_every_planted_variant_differs_from_the_right_answer():
    """Otherwise a check could call a right answer wrong (or a mistake could never be named)."""
    gen = torch.Generator().manual_seed(1)
    q, k, v = (torch.randn(2, 5, 8, generator=gen) for _ in range(3))
    right = checks.attend(q, k, v)
    for name in checks.HEAD_MISTAKES:
        assert not torch.allclose(checks.attend(q, k, v, name), right, equal_nan=True), name


# --------------------------------------------------------------------------- check 3.1


def good_causal_attention(q, k, v):
    T, d = q.shape[-2:]
    scores = (q @ k.transpose(-2, -1)) / math.sqrt(d)
    scores = scores.masked_fill(torch.ones(T, T, dtype=torch.bool).triu(1), float("-inf"))
    return scores.softmax(-1) @ v


def loop_causal_attention(q, k, v):  # a correct answer written quite differently
    B, T, d = q.shape
    out = torch.zeros_like(q)
    for b in range(B):
        for i in range(T):
            w = torch.softmax(torch.stack([q[b, i] @ k[b, j] for j in range(i + 1)]) / d ** 0.5, 0)
            out[b, i] = (w[:, None] * v[b, : i + 1]).sum(0)
    return out


def test_check_causal_attention_accepts_right_answers(capsys):
    checks.check_causal_attention(good_causal_attention)
    checks.check_causal_attention(loop_causal_attention)
    checks.check_causal_attention(lambda q, k, v: F.scaled_dot_product_attention(q, k, v, is_causal=True))
    assert capsys.readouterr().out.count("✅ Exercise 3.1") == 3


def diagonal_masked_too(q, k, v):  # hides the token itself: row 0 has nothing left to see
    T = q.shape[1]
    scores = (q @ k.transpose(-2, -1)).masked_fill(torch.ones(T, T, dtype=torch.bool).triu(0), float("-inf"))
    return scores.softmax(-1) @ v


def _head(mistake):
    return lambda q, k, v: checks.attend(q, k, v, mistake)


@pytest.mark.parametrize(
    "wrong, phrase",
    [
        (_head("no_mask"), "WITHOUT the causal mask: future tokens leak in"),
        (lambda q, k, v: F.scaled_dot_product_attention(q, k, v), "WITHOUT the causal mask"),
        (_head("no_scale"), r"not divided by sqrt\(d\)"),
        (_head("divide_by_d"), "you divided the scores by d"),
        (_head("multiply_by_sqrt_d"), r"multiplied the scores by sqrt\(d\)"),
        (_head("softmax_wrong_dim"), r"softmax runs over the wrong dimension"),
        (_head("mask_after_softmax"), "AFTER the softmax"),
        (_head("mask_with_zero"), r"exp\(0\) = 1"),
        (_head("anti_causal_mask"), "mask is upside down"),
        (_head("keys_times_queries"), r"you computed k @ q\^T"),
        (lambda q, k, v: (k @ q.transpose(-2, -1) / math.sqrt(q.shape[-1])).masked_fill(
            torch.ones(q.shape[1], q.shape[1], dtype=torch.bool).triu(1), float("-inf")).softmax(-1) @ v,
         r"you computed k @ q\^T"),
        (_head("scale_by_sqrt_T"), r"divided the scores by sqrt\(T\), the number of tokens"),
        (lambda q, k, v: (q @ k.transpose(-2, -1) / math.sqrt(q.shape[1])).masked_fill(  # d taken from dim 1
            torch.ones(q.shape[1], q.shape[1], dtype=torch.bool).triu(1), float("-inf")).softmax(-1) @ v,
         r"sqrt\(T\)"),
        (diagonal_masked_too, "contains NaN"),
        (lambda q, k, v: (q @ k.transpose(-2, -1) / math.sqrt(q.shape[-1])).masked_fill(
            torch.ones(q.shape[1], q.shape[1], dtype=torch.bool).triu(1), float("-inf")).softmax(-1), "shape of the attention weights"),
        (lambda q, k, v: checks.attend(q, k, v) + 0.5 * checks.attend(q, k, v, "no_mask"), "future tokens leak in; check the causal mask"),
        (lambda q, k, v: checks.attend(q, k, v) * 2, "values differ from causal attention"),
        (lambda q, k, v: checks.attend(q, k, v).tolist(), "return a torch.Tensor"),
    ],
)
def test_check_causal_attention_names_the_mistake(wrong, phrase):
    with pytest.raises(CheckFailed, match=phrase):
        checks.check_causal_attention(wrong)


# --------------------------------------------------------------------------- checks 3.2 and 3.3


def test_check_split_and_merge_accept_right_answers(capsys):
    checks.check_split_heads(lambda x, n_head: x.view(*x.shape[:2], n_head, -1).transpose(1, 2))
    checks.check_split_heads(lambda x, n_head: torch.stack(x.chunk(n_head, dim=-1), dim=1))
    checks.check_merge_heads(lambda y: y.transpose(1, 2).contiguous().view(y.shape[0], y.shape[2], -1))
    checks.check_merge_heads(lambda y: torch.cat(y.unbind(1), dim=-1))
    out = capsys.readouterr().out
    assert out.count("✅ Exercise 3.2") == 2 and out.count("✅ Exercise 3.3") == 2


@pytest.mark.parametrize(
    "wrong, phrase",
    [
        (lambda x, n_head: x.view(x.shape[0], n_head, x.shape[1], -1), r"straight to \(B, nh, T, hd\)"),
        (lambda x, n_head: x.view(*x.shape[:2], -1, n_head).permute(0, 3, 1, 2), "interleaved"),
        (lambda x, n_head: x.view(*x.shape[:2], n_head, -1), r"that is \(B, T, nh, hd\); transpose\(1, 2\)"),
        (lambda x, n_head: x.view(*x.shape[:2], n_head, -1).permute(0, 2, 3, 1), r"that is \(B, nh, hd, T\)"),
        (lambda x, n_head: x.view(*x.shape[:2], 3, -1).transpose(1, 2), r"expected shape \(1, 2, 4, 6\)"),  # n_head ignored
        (lambda x, n_head: x.view(*x.shape[:2], n_head, -1).transpose(1, 2).flip(-1), "values are not in place"),
    ],
)
def test_check_split_heads_names_the_mistake(wrong, phrase):
    with pytest.raises(CheckFailed, match=phrase):
        checks.check_split_heads(wrong)


@pytest.mark.parametrize(
    "wrong, phrase",
    [
        (lambda y: y.reshape(y.shape[0], y.shape[2], -1), r"straight to \(B, T, C\)"),
        (lambda y: y.permute(0, 2, 3, 1).reshape(y.shape[0], y.shape[2], -1), "interleaved"),
        (lambda y: y.transpose(1, 2), r"that is \(B, T, nh, hd\); reshape the last two dims"),
        (lambda y: y.transpose(1, 2).view(y.shape[0], y.shape[2], -1), r"use `.contiguous\(\).view"),
        (lambda y: y.transpose(1, 2).reshape(y.shape[0], y.shape[2], -1).flip(-1), "values are not in place"),
    ],
)
def test_check_merge_heads_names_the_mistake(wrong, phrase):
    with pytest.raises(CheckFailed, match=phrase):
        checks.check_merge_heads(wrong)


# --------------------------------------------------------------------------- check 3.4


class Planted(nn.Module):
    """GPT-2 attention with one planted mistake (or none)."""

    mistake = None

    def __init__(self, config):
        super().__init__()
        self.n_head = config.n_head
        self.c_attn = Conv1D(config.n_embd, 3 * config.n_embd)
        self.c_proj = Conv1D(config.n_embd, config.n_embd)

    def forward(self, x, kv_cache=None):
        return checks.full_attention(x, self.c_attn.weight, self.c_attn.bias, self.c_proj.weight,
                                     self.c_proj.bias, self.n_head, self.mistake)


def planted(mistake):
    return type(f"Planted_{mistake}", (Planted,), {"mistake": mistake})


class LinearAttention(nn.Module):
    """A right answer built differently: nn.Linear-style math, explicit loops over heads."""

    def __init__(self, config):
        super().__init__()
        self.nh = config.n_head
        self.c_attn = Conv1D(config.n_embd, 3 * config.n_embd)
        self.c_proj = Conv1D(config.n_embd, config.n_embd)

    def forward(self, x):
        C = x.shape[-1]
        q, k, v = F.linear(x, self.c_attn.weight.T, self.c_attn.bias).chunk(3, dim=-1)
        heads = [good_causal_attention(a, b, c) for a, b, c in zip(q.chunk(self.nh, -1), k.chunk(self.nh, -1), v.chunk(self.nh, -1))]
        return self.c_proj(torch.cat(heads, dim=-1).reshape(*x.shape[:2], C))


def test_check_module_accepts_right_answers(capsys):
    checks.check_causal_self_attention(CausalSelfAttention)
    checks.check_causal_self_attention(planted(None))
    checks.check_causal_self_attention(LinearAttention)
    assert capsys.readouterr().out.count("✅ Exercise 3.4") == 3


@pytest.mark.parametrize("mistake", sorted(checks.MODULE_MISTAKES))
def test_check_module_names_every_planted_mistake(mistake):
    with pytest.raises(CheckFailed) as info:
        checks.check_causal_self_attention(planted(mistake))
    assert checks.MODULE_MISTAKES[mistake] in str(info.value)


class LinearLayout(nn.Module):
    def __init__(self, config):
        super().__init__()
        self.c_attn = nn.Linear(config.n_embd, 3 * config.n_embd)
        self.c_proj = nn.Linear(config.n_embd, config.n_embd)

    def forward(self, x):
        return x


class OtherNames(nn.Module):
    def __init__(self, config):
        super().__init__()
        self.qkv = Conv1D(config.n_embd, 3 * config.n_embd)

    def forward(self, x):
        return x


def test_check_module_names_structural_mistakes():
    with pytest.raises(CheckFailed, match=r"\[out, in\], like nn.Linear; GPT-2 stores \[in, out\]"):
        checks.check_causal_self_attention(LinearLayout)
    with pytest.raises(CheckFailed, match="no parameter named c_attn.weight.*found: qkv.weight, qkv.bias"):
        checks.check_causal_self_attention(OtherNames)
    with pytest.raises(CheckFailed, match="should build an nn.Module"):
        checks.check_causal_self_attention(lambda config: "attention")
    with pytest.raises(CheckFailed, match="Keep the signature"):
        checks.check_causal_self_attention(lambda: None)

    class ViewAfterTranspose(Planted):
        def forward(self, x):
            B, T, C = x.shape
            return self.c_attn(x)[..., :C].view(B, T, self.n_head, -1).transpose(1, 2).view(B, T, C)

    with pytest.raises(CheckFailed, match=r"contiguous\(\)"):
        checks.check_causal_self_attention(ViewAfterTranspose)

    class Unfinished(Planted):
        def forward(self, x, kv_cache=None):
            raise NotImplementedError("Exercise 3.4 (CausalSelfAttention): replace this line with your code")

    with pytest.raises(CheckFailed, match="not done yet"):
        checks.check_causal_self_attention(Unfinished)


def test_checks_report_stubs_and_wrong_signatures():
    def stub(*args):
        raise NotImplementedError("stub")

    for check in (checks.check_causal_attention, checks.check_split_heads, checks.check_merge_heads):
        with pytest.raises(CheckFailed, match="not done yet"):
            check(stub)
    with pytest.raises(CheckFailed, match="Keep the signature"):
        checks.check_causal_attention(lambda q, k: q)
    with pytest.raises(CheckFailed, match="Keep the signature"):
        checks.check_split_heads(lambda x: x)
    with pytest.raises(CheckFailed, match="Keep the signature"):
        checks.check_merge_heads(lambda y, n_head: y)
