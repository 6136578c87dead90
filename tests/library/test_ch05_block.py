"""Chapter 5's modules: LayerNorm and Block. The checks of its exercises are tested in
tests/graders/test_ch05_checks.py."""

from __future__ import annotations

import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F

from gpt2lib.chapters.block import Block, LayerNorm
from gpt2lib.chapters.config import GPT2Config
from gpt2lib.chapters.mlp import MLP

# --------------------------------------------------------------------------- LayerNorm


def test_layer_norm_matches_torch_with_random_gain_and_shift():
    torch.manual_seed(0)
    ours, theirs = LayerNorm(16), nn.LayerNorm(16, eps=1e-5)
    with torch.no_grad():
        theirs.weight.normal_()
        theirs.bias.normal_()
    ours.load_state_dict(theirs.state_dict())  # same names: weight, bias
    x = torch.randn(3, 5, 16) * 4 + 2
    assert torch.allclose(ours(x), theirs(x), atol=1e-6)
    y = LayerNorm(16)(x)  # fresh: mean 0, biased variance 1 per token
    assert torch.allclose(y.mean(-1), torch.zeros(3, 5), atol=1e-5)
    assert torch.allclose(y.var(-1, unbiased=False), torch.ones(3, 5), atol=1e-3)


def test_layer_norm_uses_its_eps_and_the_config_default():
    x = 1.0 + 1e-4 * torch.randn(2, 8, dtype=torch.float64)
    for eps in (1e-5, 1e-3):
        ln = LayerNorm(8, eps).double()
        assert torch.allclose(ln(x), F.layer_norm(x, (8,), eps=eps), atol=1e-10)
    assert LayerNorm(8).eps == 1e-5 == GPT2Config().layer_norm_epsilon


def test_layer_norm_parameters_are_named_and_initialised_like_gpt2():
    ln = LayerNorm(768)
    assert list(ln.state_dict()) == ["weight", "bias"]
    assert torch.equal(ln.weight, torch.ones(768)) and torch.equal(ln.bias, torch.zeros(768))
    assert sum(p.numel() for p in ln.parameters()) == 1_536


@pytest.mark.parametrize("eps", [0, -1e-5, float("inf"), float("nan")])
def test_a_bad_epsilon_is_refused_where_the_sizes_come_in(eps):
    # moved from LayerNorm(n_embd, eps): the lesson's module takes the config's value, and
    # GPT2Config (gpt2lib.validation.check_config) refuses what cannot work
    with pytest.raises(ValueError, match="layer_norm_epsilon must be greater than 0"):
        GPT2Config(n_embd=8, n_head=2, layer_norm_epsilon=eps)


def test_layer_norm_fails_loudly_on_the_wrong_width():
    # torch's own error names both shapes; the module adds no check of its own
    with pytest.raises(RuntimeError, match=r"normalized_shape=\[8\].*\[2, 7\]"):
        LayerNorm(8)(torch.randn(2, 7))


# --------------------------------------------------------------------------- Block


def test_block_parameter_breakdown_for_gpt2_small():
    with torch.device("meta"):  # shapes only
        block = Block(GPT2Config())
    counts = {
        name: sum(p.numel() for p in child.parameters()) for name, child in block.named_children()
    }
    assert counts == {"ln_1": 1_536, "attn": 2_362_368, "ln_2": 1_536, "mlp": 4_722_432}
    assert sum(counts.values()) == 7_087_872
    assert set(block.state_dict()) >= {
        "ln_1.weight",
        "ln_1.bias",
        "attn.c_attn.weight",
        "attn.c_proj.bias",
        "ln_2.weight",
        "ln_2.bias",
        "mlp.c_fc.weight",
        "mlp.c_proj.weight",
    }


def test_block_is_the_pre_norm_composition(tiny_config):
    torch.manual_seed(0)
    block = Block(tiny_config(n_embd=8)).eval()
    with torch.no_grad():
        for p in block.parameters():
            p.normal_(std=0.5)
        x = torch.randn(2, 6, 8)
        h = x + block.attn(F.layer_norm(x, (8,), block.ln_1.weight, block.ln_1.bias, 1e-5))
        want = h + block.mlp(F.layer_norm(h, (8,), block.ln_2.weight, block.ln_2.bias, 1e-5))
        assert torch.allclose(block(x), want, atol=1e-5)


def test_block_is_causal(tiny_config):
    torch.manual_seed(0)
    block = Block(tiny_config(n_embd=8)).double().eval()
    with torch.no_grad():
        for p in block.parameters():
            p.normal_(std=0.5)  # big enough that every dependence shows
    x = torch.randn(1, 6, 8, dtype=torch.float64)
    changed = x.clone()
    changed[0, 4, 0] += 1.0  # one feature: a shift of all features is erased by LayerNorm
    with torch.no_grad():
        moved = (block(changed) - block(x)).abs().sum(-1)[0] > 0
    assert moved.tolist() == [False, False, False, False, True, True]


class PlainAttention(nn.Module):
    def __init__(self, config):
        super().__init__()
        self.proj = nn.Linear(config.n_embd, config.n_embd)

    def forward(self, x):  # no kv_cache argument, as in a learner's chapter 3 attention
        return self.proj(x)


class RecordingAttention(PlainAttention):
    def forward(self, x, kv_cache=None):
        self.seen = kv_cache
        return self.proj(x)


class RecordingMLP(MLP):
    def forward(self, x, *args, **kwargs):
        self.extra = (args, kwargs)
        return super().forward(x)


def test_block_passes_kv_cache_to_attention_only_when_given(tiny_config):
    block = Block(tiny_config(n_embd=8), attention_cls=PlainAttention)
    assert block(torch.randn(1, 3, 8)).shape == (1, 3, 8)  # no kv_cache: not passed on

    block = Block(tiny_config(n_embd=8), attention_cls=RecordingAttention, mlp_cls=RecordingMLP)
    cache = object()
    block(torch.randn(1, 3, 8), kv_cache=cache)
    assert block.attn.seen is cache
    assert block.mlp.extra == ((), {})  # the MLP never sees the cache


@pytest.mark.parametrize("shape", [(3, 8), (1, 3, 7), (1, 1, 3, 8)])
def test_block_fails_loudly_on_wrong_shapes(shape, tiny_config):
    # no silent wrong answer: the LayerNorm or attention's (B, T, C) unpacking refuses it
    with pytest.raises((ValueError, RuntimeError)):
        Block(tiny_config(n_embd=8))(torch.randn(*shape))


@pytest.mark.slow
def test_block_matches_hugging_face_gpt2():
    from transformers import GPT2Config as HFConfig
    from transformers import GPT2Model

    torch.manual_seed(0)
    hf = GPT2Model(
        HFConfig(
            n_embd=64,
            n_head=4,
            n_layer=2,
            n_positions=32,
            vocab_size=50,
            resid_pdrop=0.0,
            embd_pdrop=0.0,
            attn_pdrop=0.0,
        )
    ).eval()
    with torch.no_grad():
        hf.wpe.weight.zero_()  # so the first hidden state is exactly our input
        for p in hf.h[0].parameters():  # make LayerNorms and biases non-trivial
            p.normal_(std=0.3 if p.dim() == 1 else 0.1)
    ours = Block(GPT2Config(n_embd=64, n_head=4)).eval()
    wanted = {k: v for k, v in hf.h[0].state_dict().items() if k in ours.state_dict()}
    ours.load_state_dict(wanted)  # the checkpoint's names fit ours one to one
    x = torch.randn(2, 10, 64)
    with torch.no_grad():
        states = hf(inputs_embeds=x, output_hidden_states=True).hidden_states
        assert torch.allclose(states[0], x)
        assert torch.allclose(ours(x), states[1], atol=1e-5)
