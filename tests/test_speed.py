"""gpt2lib.kernels (the split multiply), gpt2lib.measure and the decoding engine gpt2lib.speed:
the split gives torch's numbers, is taken only where it was measured to pay, can be switched
off; the engine's static step gives the tokens of the growing-slice path, compiles without a
graph break, and keeps nothing inside the model."""

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from gpt2lib import kernels, measure
from gpt2lib.config import GPT2Config
from gpt2lib.generation import generate
from gpt2lib.kvcache import KVCache
from gpt2lib.model import GPT2


@pytest.fixture(autouse=True)
def several_threads(monkeypatch):
    """The split is only taken with more than one thread: give the tests two, then restore.
    And only where it was measured faster: the routing tests pretend this machine is one."""
    monkeypatch.setattr(kernels, "split_measured_faster", lambda: True)
    before = torch.get_num_threads()
    torch.set_num_threads(max(2, before))
    yield
    torch.set_num_threads(before)


def test_one_thread_never_splits(monkeypatch):
    counter = CountSplits(monkeypatch)
    torch.set_num_threads(1)
    x, w, b = torch.randn(1, 64), torch.randn(64, 8), torch.randn(8)
    torch.testing.assert_close(kernels.matmul_bias(x, w, b), torch.addmm(b, x, w))
    kernels.readout_matmul(x, torch.randn(30, 64))
    assert counter.split_calls == 0 and counter.bmm_calls == 0


@settings(max_examples=40, deadline=None)
@given(rows=st.integers(1, 9), slab=st.integers(1, 12), parts=st.sampled_from([1, 2, 3, 8]),
       n_out=st.integers(1, 20), seed=st.integers(0, 2**16))
def test_split_matmul_equals_the_plain_product(rows, slab, parts, n_out, seed):
    gen = torch.Generator().manual_seed(seed)
    x = torch.randn(rows, slab * parts, generator=gen, dtype=torch.float64)
    w = torch.randn(slab * parts, n_out, generator=gen, dtype=torch.float64)
    torch.testing.assert_close(kernels.split_matmul(x, w, parts), x @ w)


class CountSplits:
    """Wraps kernels.split_matmul and torch.bmm to see which route a call took."""

    def __init__(self, monkeypatch):
        self.split_calls = 0
        self.bmm_calls = 0
        real_split, real_bmm = kernels.split_matmul, torch.bmm

        def split(*args, **kwargs):
            self.split_calls += 1
            return real_split(*args, **kwargs)

        def bmm(*args, **kwargs):
            self.bmm_calls += 1
            return real_bmm(*args, **kwargs)

        monkeypatch.setattr(kernels, "split_matmul", split)
        monkeypatch.setattr(kernels.torch, "bmm", bmm)


@pytest.mark.parametrize("rows, splits", [(1, True), (8, True), (kernels.SPLIT_MAX_ROWS, True),
                                          (kernels.SPLIT_MAX_ROWS + 1, False)])
def test_matmul_bias_splits_only_few_rows_and_matches_addmm(monkeypatch, rows, splits):
    counter = CountSplits(monkeypatch)
    gen = torch.Generator().manual_seed(rows)
    x, w, b = torch.randn(rows, 64, generator=gen), torch.randn(64, 24, generator=gen), torch.randn(24, generator=gen)
    got = kernels.matmul_bias(x, w, b)
    assert counter.split_calls == (1 if splits else 0)
    torch.testing.assert_close(got, torch.addmm(b, x, w), atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("x_dtype, n_in", [(torch.float64, 64), (torch.bfloat16, 64),
                                           (torch.float32, 60)])
def test_matmul_bias_keeps_torch_for_other_dtypes_and_widths(monkeypatch, x_dtype, n_in):
    """Measured only for float32; a width that SPLIT_PARTS does not divide cannot be split."""
    counter = CountSplits(monkeypatch)
    x = torch.randn(1, n_in).to(x_dtype)
    w, b = torch.randn(n_in, 8).to(x_dtype), torch.randn(8).to(x_dtype)
    got = kernels.matmul_bias(x, w, b)
    assert counter.split_calls == 0
    torch.testing.assert_close(got, torch.addmm(b, x, w))


@pytest.mark.parametrize("rows", [1, 3, 16, 17, kernels.SPLIT_MAX_ROWS, 40])
@pytest.mark.parametrize("vocab", [5, 8, 50, 203])  # below SPLIT_PARTS, a multiple, leftovers
def test_readout_matmul_equals_x_times_table_transposed(rows, vocab):
    gen = torch.Generator().manual_seed(rows * 1000 + vocab)
    x, table = torch.randn(rows, 16, generator=gen), torch.randn(vocab, 16, generator=gen)
    got = kernels.readout_matmul(x, table)
    assert got.shape == (rows, vocab) and got.is_contiguous()
    torch.testing.assert_close(got, x @ table.T, atol=1e-5, rtol=1e-5)


def test_readout_matmul_uses_the_blocks_for_few_rows_only(monkeypatch):
    counter = CountSplits(monkeypatch)
    table = torch.randn(203, 16)
    kernels.readout_matmul(torch.randn(2, 16), table)
    assert counter.bmm_calls == 1
    kernels.readout_matmul(torch.randn(kernels.SPLIT_MAX_ROWS + 1, 16), table)
    assert counter.bmm_calls == 1


def test_use_split_matmul_switches_off_and_restores_even_after_an_error(monkeypatch):
    counter = CountSplits(monkeypatch)
    x, w, b = torch.randn(1, 64), torch.randn(64, 8), torch.randn(8)
    with pytest.raises(RuntimeError, match="inside"):
        with kernels.use_split_matmul(False):
            kernels.matmul_bias(x, w, b)
            kernels.readout_matmul(x, torch.randn(30, 64))
            raise RuntimeError("inside")
    assert counter.split_calls == 0 and counter.bmm_calls == 0
    kernels.matmul_bias(x, w, b)
    assert counter.split_calls == 1


def test_gradients_through_the_split_equal_the_plain_ones():
    gen = torch.Generator().manual_seed(0)
    x = torch.randn(2, 32, generator=gen, requires_grad=True)
    w = torch.randn(32, 6, generator=gen, requires_grad=True)
    b = torch.randn(6, generator=gen, requires_grad=True)
    kernels.matmul_bias(x, w, b).square().sum().backward()
    split_grads = [t.grad.clone() for t in (x, w, b)]
    for t in (x, w, b):
        t.grad = None
    torch.addmm(b, x, w).square().sum().backward()
    for got, want in zip(split_grads, (x.grad, w.grad, b.grad)):
        torch.testing.assert_close(got, want, atol=1e-5, rtol=1e-5)


def test_engine_gives_the_same_logits_and_tokens_with_and_without_the_split(monkeypatch):
    from gpt2lib.speed import Decoder

    torch.manual_seed(0)
    model = GPT2(GPT2Config(vocab_size=331, n_positions=64, n_embd=48, n_layer=2, n_head=4)).eval()
    ids = torch.randint(0, 331, (3, 10))
    counter = CountSplits(monkeypatch)
    with torch.no_grad():
        on = Decoder(model, 1, 1).prefill(ids[:1, :1]), Decoder(model, 3, 10).prefill(ids)
        assert counter.split_calls > 0  # the engine really splits few rows
        with kernels.use_split_matmul(False):
            off = Decoder(model, 1, 1).prefill(ids[:1, :1]), Decoder(model, 3, 10).prefill(ids)
        plain = model(ids, last_only=True)[:, -1]  # chapter 6's forward: never split
    for a, b in zip(on, off):
        torch.testing.assert_close(a, b, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(on[1], plain, atol=1e-5, rtol=1e-5)
    tokens_on = generate(model, ids, 12, temperature=0)
    with kernels.use_split_matmul(False):
        tokens_off = generate(model, ids, 12, temperature=0)
    assert torch.equal(tokens_on, tokens_off)


def test_decode_bytes_per_token_counts_every_weight_but_the_unused_positions():
    with torch.device("meta"):
        model = GPT2(GPT2Config())
    n_embd = 768
    # GPT-2 small: 124,439,808 parameters; one step reads 1 of the 1,024 position rows
    assert measure.decode_bytes_per_token(model) == (124_439_808 - 1023 * n_embd) * 4


def test_wall_times_times_each_call_after_the_warmup_and_median_is_their_median():
    calls, ticks = [], iter(range(0, 100, 1))
    clock = lambda: next(ticks) ** 2  # readings 0, 1, 4, 9, ...: each call lasts longer
    times = measure.wall_times(lambda: calls.append(1), repeats=3, warmup=2, clock=clock)
    assert len(calls) == 5 and times == [1, 5, 9]  # (1-0), (9-4), (25-16): warm-up untimed
    ticks = iter(range(0, 100, 1))
    assert measure.median_seconds(lambda: None, repeats=3, warmup=0, clock=clock) == 5
    with pytest.raises(ValueError, match="repeats must be an int >= 1"):
        measure.wall_times(lambda: None, repeats=0)


def test_measurements_return_plausible_numbers():
    assert measure.median_seconds(lambda: None, repeats=3) >= 0
    assert 0.1 < measure.memory_read_gbps(megabytes=16, repeats=2) < 10_000
    torch.manual_seed(0)
    model = GPT2(GPT2Config(vocab_size=64, n_positions=32, n_embd=16, n_layer=1, n_head=2)).eval()
    assert measure.decode_rate(model, torch.zeros(1, 4, dtype=torch.long), new_tokens=4, repeats=1) > 0


# --------------------------------------------------------------------------- the engine


def tiny_model(seed=0, **sizes):
    sizes = {**dict(n_layer=2, n_head=2, n_embd=16, n_positions=48, vocab_size=61), **sizes}
    torch.manual_seed(seed)
    return GPT2(GPT2Config(**sizes)).eval()


def greedy_with(decoder, prompt, new):
    with torch.no_grad():
        logits = decoder.prefill(prompt)
        tokens = []
        for _ in range(new):
            token = logits.argmax(-1)
            tokens.append(token)
            logits = decoder.step(token)
    return torch.stack(tokens, 1)


@settings(max_examples=20, deadline=None)
@given(n_layer=st.integers(1, 3), n_head=st.integers(1, 3), head_dim=st.sampled_from([2, 4, 8]),
       B=st.integers(1, 3), T=st.integers(1, 12), new=st.integers(1, 12),
       seed=st.integers(0, 999))
def test_static_step_gives_the_tokens_of_the_growing_slices(n_layer, n_head, head_dim, B, T,
                                                             new, seed):
    """Whole buffer + validity mask + position tensor == the model's own KVCache path."""
    from gpt2lib.speed import Decoder

    model = tiny_model(seed, n_layer=n_layer, n_head=n_head, n_embd=n_head * head_dim)
    prompt = torch.randint(0, 61, (B, T), generator=torch.Generator().manual_seed(seed))
    static = greedy_with(Decoder(model, B, T + new + 5, static=True), prompt, new)  # spare slots
    slices = greedy_with(Decoder(model, B, T + new), prompt, new)
    assert torch.equal(static, slices)
    # the growing-slice path of chapter 6's forward with a KVCache: today's reference
    reference = generate(model, prompt, new, temperature=0, use_cache=False)[:, T:]
    assert torch.equal(static, reference)


def test_generate_takes_the_engine_only_for_gpt2lib_modules(monkeypatch):
    from gpt2lib import speed
    from gpt2lib.block import Block

    calls = []
    real = speed.Decoder.step
    monkeypatch.setattr(speed.Decoder, "step", lambda self, t: calls.append(1) or real(self, t))
    model = tiny_model()
    assert speed.fast_path_applies(model)
    generate(model, torch.zeros(1, 3, dtype=torch.long), 4, temperature=0)
    assert len(calls) == 3

    class MyBlock(Block):  # a learner's block: the model's own forward must run it
        def forward(self, x, kv_cache=None):
            self.seen = True
            return super().forward(x, kv_cache=kv_cache)

    torch.manual_seed(0)
    learner = GPT2(tiny_model().config, block_cls=MyBlock).eval()
    assert not speed.fast_path_applies(learner)
    calls.clear()
    generate(learner, torch.zeros(1, 3, dtype=torch.long), 4, temperature=0)
    assert calls == [] and learner.h[0].seen


def test_decode_step_reads_nothing_on_the_host():
    """Under a mode that fails on any tensor-to-Python read, the static step still runs."""
    from gpt2lib.speed import Decoder

    model = tiny_model()
    decoder = Decoder(model, 2, 16, static=True)
    with torch.no_grad():
        logits = decoder.prefill(torch.zeros(2, 3, dtype=torch.long))
        token = logits.argmax(-1)

        class NoHostReads(torch.overrides.TorchFunctionMode):
            def __torch_function__(self, func, types, args=(), kwargs=None):
                if func in (torch.Tensor.item, torch.Tensor.tolist, torch.Tensor.__bool__,
                            torch.Tensor.__int__, torch.Tensor.__index__, torch.Tensor.__float__):
                    raise AssertionError(f"host read: {func}")
                return func(*args, **(kwargs or {}))

        with NoHostReads():
            decoder.step(token)


@pytest.mark.slow
def test_decode_step_compiles_in_one_graph_on_cpu():
    """torch.compile(fullgraph=True) raises on any graph break, such as a host read."""
    from gpt2lib.speed import decode_step, model_weights

    model = tiny_model(n_layer=1, n_embd=8, n_head=2, vocab_size=17, n_positions=8)
    weights = model_weights(model)
    cache = KVCache.for_model(model, 1, 8)
    k_bufs = [layer.k for layer in cache.layers]
    v_bufs = [layer.v for layer in cache.layers]
    step = torch.compile(decode_step, fullgraph=True, dynamic=False)
    token, pos = torch.tensor([[3]]), torch.tensor([0])
    with torch.no_grad():
        got = step(weights, token, pos, k_bufs, v_bufs, 2, 1e-5)
        want = model(token, last_only=True)[:, -1]
    torch.testing.assert_close(got, want, atol=1e-5, rtol=1e-5)


def test_state_dict_to_and_deepcopy_work_after_a_compiled_generation():
    import copy

    model = tiny_model()
    prompt = torch.zeros(1, 3, dtype=torch.long)
    with pytest.warns(UserWarning, match="compile=True"):
        first = generate(model, prompt, 5, temperature=0, compile=True)
    assert set(model.state_dict()) == set(tiny_model().state_dict())
    assert not any("compiled" in name or "graph" in name for name, _ in model.named_modules())
    copied = copy.deepcopy(model)
    model.to(torch.float64)
    model.to(torch.float32)
    assert torch.equal(generate(copied, prompt, 5, temperature=0), first)
    assert torch.equal(generate(model, prompt, 5, temperature=0), first)


def test_graphs_are_kept_outside_the_model_and_die_with_it():
    import gc
    import weakref

    from gpt2lib import speed

    model = tiny_model()
    speed._GRAPHS[model] = {"stand-in": []}  # what a CUDA run stores, keyed weakly
    assert speed.captured_graph_count(model) == 0
    gone = weakref.ref(model)
    del model
    gc.collect()
    assert gone() is None and len(speed._GRAPHS) == 0


@pytest.mark.parametrize("measured_faster", [True, False])
def test_by_default_the_split_follows_this_machines_measurement(monkeypatch, measured_faster):
    monkeypatch.setattr(kernels, "split_measured_faster", lambda: measured_faster)
    counter = CountSplits(monkeypatch)
    x, w, b = torch.randn(1, 64), torch.randn(64, 8), torch.randn(8)
    torch.testing.assert_close(kernels.matmul_bias(x, w, b), torch.addmm(b, x, w))
    assert counter.split_calls == (1 if measured_faster else 0)
    with kernels.use_split_matmul(True):  # asked for: split even where it was measured slower
        kernels.matmul_bias(x, w, b)
    assert counter.split_calls == (2 if measured_faster else 1)


def test_the_measurement_runs_once_per_thread_count_and_gives_a_bool(monkeypatch):
    monkeypatch.undo()  # the real measurement, not the autouse fixture's stand-in
    monkeypatch.setattr(kernels, "_measured", {})
    calls = []
    real_mm = torch.mm
    monkeypatch.setattr(kernels.torch, "mm", lambda *a: calls.append(1) or real_mm(*a))
    first = kernels.split_measured_faster()
    second = kernels.split_measured_faster()
    assert isinstance(first, bool) and first == second
    assert len(calls) == 15  # measured once, then remembered
    assert set(kernels._measured) == {torch.get_num_threads()}


def test_use_split_matmul_refuses_what_is_not_true_false_or_none():
    with pytest.raises(TypeError, match="True, False or None"):
        with kernels.use_split_matmul("yes"):
            pass
