"""Chapter 3's modules: Conv1D and attention (split_heads, merge_heads, CausalSelfAttention,
attention_weights). The checks of its exercises are in tests/graders/test_ch03_checks.py."""

from __future__ import annotations

import torch
import torch.nn as nn

import gpt2lib.chapters.attention
from gpt2lib.chapters.attention import (
    CausalSelfAttention,
    merge_heads,
    split_heads,
)
from gpt2lib.chapters.config import GPT2Config
from gpt2lib.chapters.layers import Conv1D

# --------------------------------------------------------------------------- Conv1D


def test_conv1d_lives_in_layers_and_is_re_exported_by_attention():

    assert gpt2lib.chapters.attention.Conv1D is Conv1D
    assert Conv1D.__module__ == "gpt2lib.chapters.layers"


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


def test_submodules_and_parameter_count_of_gpt2_small():
    layer = CausalSelfAttention(GPT2Config())
    assert layer.c_attn.weight.shape == (768, 2304) and layer.c_proj.weight.shape == (768, 768)
    assert isinstance(layer.resid_dropout, nn.Dropout)
    assert sum(p.numel() for p in layer.parameters()) == 768 * 2304 + 2304 + 768 * 768 + 768


def test_split_and_merge_heads_are_inverse_and_take_consecutive_features():
    x = torch.arange(2 * 3 * 12, dtype=torch.float).view(2, 3, 12)
    heads = split_heads(x, 4)  # (B, nh, T, hd)
    assert heads.shape == (2, 4, 3, 3)
    assert torch.equal(heads[1, 2, 0], x[1, 0, 6:9])  # head 2 holds features 6..8
    assert torch.equal(merge_heads(heads), x)
    q = torch.randn(2, 3, 36)[..., :12]  # a slice, as c_attn's split gives: not contiguous
    assert torch.equal(merge_heads(split_heads(q, 3)), q)


# --------------------------------------------------------------------------- causal_mask


def test_causal_mask_is_the_lower_triangle_and_takes_an_offset():
    from gpt2lib.chapters.attention import causal_mask

    assert torch.equal(causal_mask(4), torch.ones(4, 4, dtype=torch.bool).tril())
    # 3 new queries after 4 cached tokens: query i sees keys 0 .. 4 + i
    assert torch.equal(causal_mask(3, 4), torch.ones(3, 7, dtype=torch.bool).tril(diagonal=4))


def test_attention_with_a_cache_of_whole_buffers_equals_the_growing_slices():
    """The static cache of chapter 9 hands attention its whole buffers and a mask that hides
    the slots not yet written: the layer needs no branch of its own for it."""
    from gpt2lib.kvcache import KVCache

    config = GPT2Config(vocab_size=32, n_positions=16, n_embd=12, n_head=3, n_layer=1)
    torch.manual_seed(0)
    attn = CausalSelfAttention(config).eval()
    x = torch.randn(2, 7, 12)
    outs = {}
    for static in (False, True):
        cache = KVCache(config, 2, 16, static=static)
        with torch.no_grad():
            pieces = [attn(x[:, a:b], kv_cache=cache[0]) for a, b in ((0, 4), (4, 6), (6, 7))]
        outs[static] = torch.cat(pieces, dim=1)
        assert cache.length == 7
    with torch.no_grad():
        full = attn(x)
    torch.testing.assert_close(outs[False], full, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(outs[True], full, atol=1e-5, rtol=1e-5)
