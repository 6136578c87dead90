"""The CPU decode step of gpt2lib.speed (an int position, over the filled slots only): the same
logits as the model's own forward, and the cache contents of the static step."""

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from gpt2lib.config import GPT2Config
from gpt2lib.model import GPT2
from gpt2lib.speed import Decoder, decode_step


def small_model(seed, n_layer, n_head, head_dim):
    torch.manual_seed(seed)
    config = GPT2Config(vocab_size=61, n_positions=40, n_embd=n_head * head_dim,
                        n_layer=n_layer, n_head=n_head)
    return GPT2(config).eval()


@settings(max_examples=15, deadline=None)
@given(n_layer=st.integers(1, 3), n_head=st.integers(1, 4), head_dim=st.sampled_from([2, 4, 8]),
       B=st.integers(1, 3), T=st.integers(1, 10), new=st.integers(1, 8), seed=st.integers(0, 999))
def test_cpu_step_gives_the_forward_logits_and_the_static_steps_cache(n_layer, n_head, head_dim,
                                                                       B, T, new, seed):
    model = small_model(seed, n_layer, n_head, head_dim)
    ids = torch.randint(0, 61, (B, T + new), generator=torch.Generator().manual_seed(seed))
    eager, static = Decoder(model, B, T + new), Decoder(model, B, T + new, static=True)
    with torch.no_grad():
        eager.prefill(ids[:, :T])
        static.prefill(ids[:, :T])
        for pos in range(T, T + new):
            got = eager.step(ids[:, pos])  # the int-position step: (B, V)
            want = model(ids[:, :pos + 1])[:, -1]  # the full forward, no cache
            torch.testing.assert_close(got, want, atol=1e-5, rtol=1e-5)
            torch.testing.assert_close(got, static.step(ids[:, pos]), atol=1e-5, rtol=1e-5)
    for mine, theirs in zip(eager.cache.layers, static.cache.layers):
        # close, not equal: the static step's attention over the masked buffer rounds its sums
        # in another order, and later layers see that rounding
        torch.testing.assert_close(mine.k[:, :, :T + new], theirs.k[:, :, :T + new])
        torch.testing.assert_close(mine.v[:, :, :T + new], theirs.v[:, :, :T + new])


def test_cpu_step_takes_one_token_per_row_and_an_int_position():
    model = small_model(0, 2, 2, 4)
    decoder = Decoder(model, 2, 8)
    with torch.no_grad():
        decoder.prefill(torch.zeros(2, 3, dtype=torch.long))
        logits = decode_step(decoder.weights, torch.ones(2, 1, dtype=torch.long), 3,
                             decoder.k_bufs, decoder.v_bufs, decoder.n_head, decoder.eps)
    assert logits.shape == (2, 61)
    assert torch.isfinite(logits).all()
    # the new key went into slot 3 of every layer, and nothing after it
    for layer in decoder.cache.layers:
        assert layer.k[:, :, 3].abs().sum() > 0
        assert torch.equal(layer.k[:, :, 4:], torch.zeros_like(layer.k[:, :, 4:]))


@pytest.mark.parametrize("batch", [1, 5])
def test_cpu_step_works_on_a_non_contiguous_token_column(batch):
    """generate() passes out[:, pos], a strided column of its output tensor."""
    model = small_model(1, 1, 2, 4)
    out = torch.randint(0, 61, (batch, 6), generator=torch.Generator().manual_seed(1))
    decoder = Decoder(model, batch, 6)
    with torch.no_grad():
        decoder.prefill(out[:, :4])
        got = decoder.step(out[:, 4])
        want = model(out[:, :5])[:, -1]
    torch.testing.assert_close(got, want, atol=1e-5, rtol=1e-5)
