"""gpt2lib.speed: the split multiply gives torch's numbers, is taken only where it was measured
to pay, can be switched off, and the model's outputs do not depend on it."""

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from gpt2lib import speed
from gpt2lib.config import GPT2Config
from gpt2lib.generation import generate
from gpt2lib.model import GPT2


@settings(max_examples=40, deadline=None)
@given(rows=st.integers(1, 9), slab=st.integers(1, 12), parts=st.sampled_from([1, 2, 3, 8]),
       n_out=st.integers(1, 20), seed=st.integers(0, 2**16))
def test_split_matmul_equals_the_plain_product(rows, slab, parts, n_out, seed):
    gen = torch.Generator().manual_seed(seed)
    x = torch.randn(rows, slab * parts, generator=gen, dtype=torch.float64)
    w = torch.randn(slab * parts, n_out, generator=gen, dtype=torch.float64)
    torch.testing.assert_close(speed.split_matmul(x, w, parts), x @ w)


class CountSplits:
    """Wraps speed.split_matmul and torch.bmm to see which route a call took."""

    def __init__(self, monkeypatch):
        self.split_calls = 0
        self.bmm_calls = 0
        real_split, real_bmm = speed.split_matmul, torch.bmm

        def split(*args, **kwargs):
            self.split_calls += 1
            return real_split(*args, **kwargs)

        def bmm(*args, **kwargs):
            self.bmm_calls += 1
            return real_bmm(*args, **kwargs)

        monkeypatch.setattr(speed, "split_matmul", split)
        monkeypatch.setattr(speed.torch, "bmm", bmm)


@pytest.mark.parametrize("rows, splits", [(1, True), (8, True), (speed.SPLIT_MAX_ROWS, True),
                                          (speed.SPLIT_MAX_ROWS + 1, False)])
def test_matmul_bias_splits_only_few_rows_and_matches_addmm(monkeypatch, rows, splits):
    counter = CountSplits(monkeypatch)
    gen = torch.Generator().manual_seed(rows)
    x, w, b = torch.randn(rows, 64, generator=gen), torch.randn(64, 24, generator=gen), torch.randn(24, generator=gen)
    got = speed.matmul_bias(x, w, b)
    assert counter.split_calls == (1 if splits else 0)
    torch.testing.assert_close(got, torch.addmm(b, x, w), atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("x_dtype, n_in", [(torch.float64, 64), (torch.bfloat16, 64),
                                           (torch.float32, 60)])
def test_matmul_bias_keeps_torch_for_other_dtypes_and_widths(monkeypatch, x_dtype, n_in):
    """Measured only for float32; a width that SPLIT_PARTS does not divide cannot be split."""
    counter = CountSplits(monkeypatch)
    x = torch.randn(1, n_in).to(x_dtype)
    w, b = torch.randn(n_in, 8).to(x_dtype), torch.randn(8).to(x_dtype)
    got = speed.matmul_bias(x, w, b)
    assert counter.split_calls == 0
    torch.testing.assert_close(got, torch.addmm(b, x, w))


@pytest.mark.parametrize("rows", [1, 3, 16, 17, speed.SPLIT_MAX_ROWS, 40])
@pytest.mark.parametrize("vocab", [5, 8, 50, 203])  # below SPLIT_PARTS, a multiple, leftovers
def test_readout_matmul_equals_x_times_table_transposed(rows, vocab):
    gen = torch.Generator().manual_seed(rows * 1000 + vocab)
    x, table = torch.randn(rows, 16, generator=gen), torch.randn(vocab, 16, generator=gen)
    got = speed.readout_matmul(x, table)
    assert got.shape == (rows, vocab) and got.is_contiguous()
    torch.testing.assert_close(got, x @ table.T, atol=1e-5, rtol=1e-5)


def test_readout_matmul_uses_the_blocks_for_few_rows_only(monkeypatch):
    counter = CountSplits(monkeypatch)
    table = torch.randn(203, 16)
    speed.readout_matmul(torch.randn(2, 16), table)
    assert counter.bmm_calls == 1
    speed.readout_matmul(torch.randn(speed.SPLIT_MAX_ROWS + 1, 16), table)
    assert counter.bmm_calls == 1


def test_use_split_matmul_switches_off_and_restores_even_after_an_error(monkeypatch):
    counter = CountSplits(monkeypatch)
    x, w, b = torch.randn(1, 64), torch.randn(64, 8), torch.randn(8)
    with pytest.raises(RuntimeError, match="inside"):
        with speed.use_split_matmul(False):
            speed.matmul_bias(x, w, b)
            speed.readout_matmul(x, torch.randn(30, 64))
            raise RuntimeError("inside")
    assert counter.split_calls == 0 and counter.bmm_calls == 0
    speed.matmul_bias(x, w, b)
    assert counter.split_calls == 1


def test_gradients_through_the_split_equal_the_plain_ones():
    gen = torch.Generator().manual_seed(0)
    x = torch.randn(2, 32, generator=gen, requires_grad=True)
    w = torch.randn(32, 6, generator=gen, requires_grad=True)
    b = torch.randn(6, generator=gen, requires_grad=True)
    speed.matmul_bias(x, w, b).square().sum().backward()
    split_grads = [t.grad.clone() for t in (x, w, b)]
    for t in (x, w, b):
        t.grad = None
    torch.addmm(b, x, w).square().sum().backward()
    for got, want in zip(split_grads, (x.grad, w.grad, b.grad)):
        torch.testing.assert_close(got, want, atol=1e-5, rtol=1e-5)


def test_model_gives_the_same_logits_and_tokens_with_and_without_the_split():
    torch.manual_seed(0)
    model = GPT2(GPT2Config(vocab_size=331, n_positions=64, n_embd=48, n_layer=2, n_head=4)).eval()
    ids = torch.randint(0, 331, (3, 10))
    with torch.no_grad():
        on = model(ids[:1, :1]), model(ids)  # 1 row: split; 30 rows: split
        with speed.use_split_matmul(False):
            off = model(ids[:1, :1]), model(ids)
    for a, b in zip(on, off):
        torch.testing.assert_close(a, b, atol=1e-5, rtol=1e-5)
    tokens_on = generate(model, ids, 12, temperature=0)
    with speed.use_split_matmul(False):
        tokens_off = generate(model, ids, 12, temperature=0)
    assert torch.equal(tokens_on, tokens_off)


def test_decode_bytes_per_token_counts_every_weight_but_the_unused_positions():
    with torch.device("meta"):
        model = GPT2(GPT2Config())
    n_embd = 768
    # GPT-2 small: 124,439,808 parameters; one step reads 1 of the 1,024 position rows
    assert speed.decode_bytes_per_token(model) == (124_439_808 - 1023 * n_embd) * 4


def test_measurements_return_plausible_numbers():
    assert speed.median_seconds(lambda: None, repeats=3) >= 0
    assert 0.1 < speed.memory_read_gbps(megabytes=16, repeats=2) < 10_000
    torch.manual_seed(0)
    model = GPT2(GPT2Config(vocab_size=64, n_positions=32, n_embd=16, n_layer=1, n_head=2)).eval()
    assert speed.decode_rate(model, torch.zeros(1, 4, dtype=torch.long), new_tokens=4, repeats=1) > 0
