"""gpt2lib.speed (the split multiplies of speed.kernels, module views, the static cache's step)
and gpt2lib.speed.measure: the splits give torch's numbers, are taken only where a measurement
that someone asked for found them faster, can be switched off; SplitConv1D is Conv1D with those
multiplies and SplitReadout chapter 6's TiedReadout, swapped in on a view, never in the
caller's model; the static cache's step gives the tokens of the growing slices, reads nothing
on the host and compiles without a graph break; speed holds no layer of its own."""

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from gpt2lib.chapters.config import GPT2Config
from gpt2lib.chapters.model import GPT2, TiedReadout
from gpt2lib.generation import generate
from gpt2lib.kvcache import KVCache
from gpt2lib.speed import kernels, measure

# What the routing tests pretend this machine measured: every route a split.
SPLIT_ROUTES = {
    "conv_one": "inner",
    "conv_few": "columns",
    "readout_one": "blocks",
    "readout_few": "table",
}
TORCH_ROUTES = dict.fromkeys(SPLIT_ROUTES, "torch")


def pretend_measured(monkeypatch, routes):
    monkeypatch.setattr(kernels, "known_routes", lambda threads=None: dict(routes))


@pytest.fixture(autouse=True)
def several_threads(monkeypatch):
    """The split is only taken with more than one thread: give the tests two, then restore.
    And only where it was measured faster: the routing tests pretend this machine is one."""
    pretend_measured(monkeypatch, SPLIT_ROUTES)
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
@given(
    rows=st.integers(1, 9),
    slab=st.integers(1, 12),
    parts=st.sampled_from([1, 2, 3, 8]),
    n_out=st.integers(1, 20),
    seed=st.integers(0, 2**16),
)
def test_split_matmul_equals_the_plain_product(rows, slab, parts, n_out, seed):
    gen = torch.Generator().manual_seed(seed)
    x = torch.randn(rows, slab * parts, generator=gen, dtype=torch.float64)
    w = torch.randn(slab * parts, n_out, generator=gen, dtype=torch.float64)
    torch.testing.assert_close(kernels.split_matmul(x, w, parts), x @ w)


class CountSplits:
    """Wraps kernels.split_matmul, kernels.column_split_matmul and torch.bmm to see which
    route a call took."""

    def __init__(self, monkeypatch):
        self.split_calls = 0
        self.column_calls = 0
        self.bmm_calls = 0
        real_split, real_columns, real_bmm = (
            kernels.split_matmul,
            kernels.column_split_matmul,
            torch.bmm,
        )

        def split(*args, **kwargs):
            self.split_calls += 1
            return real_split(*args, **kwargs)

        def columns(*args, **kwargs):
            self.column_calls += 1
            return real_columns(*args, **kwargs)

        def bmm(*args, **kwargs):
            self.bmm_calls += 1
            return real_bmm(*args, **kwargs)

        monkeypatch.setattr(kernels, "split_matmul", split)
        monkeypatch.setattr(kernels, "column_split_matmul", columns)
        monkeypatch.setattr(kernels.torch, "bmm", bmm)


@settings(max_examples=40, deadline=None)
@given(
    rows=st.integers(1, 9),
    n_in=st.integers(1, 12),
    slab=st.integers(1, 6),
    parts=st.sampled_from([1, 2, 3, 8]),
    seed=st.integers(0, 2**16),
)
def test_column_split_matmul_equals_the_plain_product(rows, n_in, slab, parts, seed):
    gen = torch.Generator().manual_seed(seed)
    x = torch.randn(rows, n_in, generator=gen, dtype=torch.float64)
    w = torch.randn(n_in, slab * parts, generator=gen, dtype=torch.float64)
    torch.testing.assert_close(kernels.column_split_matmul(x, w, parts), x @ w)


@pytest.mark.parametrize(
    "rows, route",
    [
        (1, "inner"),
        (8, "columns"),
        (kernels.SPLIT_MAX_ROWS, "columns"),
        (kernels.SPLIT_MAX_ROWS + 1, "torch"),
    ],
)
def test_matmul_bias_takes_the_measured_route_for_few_rows_and_matches_addmm(
    monkeypatch, rows, route
):
    counter = CountSplits(monkeypatch)
    gen = torch.Generator().manual_seed(rows)
    x, w, b = (
        torch.randn(rows, 64, generator=gen),
        torch.randn(64, 24, generator=gen),
        torch.randn(24, generator=gen),
    )
    got = kernels.matmul_bias(x, w, b)
    assert (counter.split_calls, counter.column_calls) == {
        "inner": (1, 0),
        "columns": (0, 1),
        "torch": (0, 0),
    }[route]
    torch.testing.assert_close(got, torch.addmm(b, x, w), atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize(
    "x_dtype, n_in", [(torch.float64, 64), (torch.bfloat16, 64), (torch.float32, 60)]
)
def test_matmul_bias_keeps_torch_for_other_dtypes_and_widths(monkeypatch, x_dtype, n_in):
    """Measured only for float32; a width that SPLIT_PARTS does not divide cannot be split."""
    counter = CountSplits(monkeypatch)
    for rows in (1, 8):  # the inner and the column route
        x = torch.randn(rows, n_in).to(x_dtype)
        w, b = torch.randn(n_in, 12).to(x_dtype), torch.randn(12).to(x_dtype)
        got = kernels.matmul_bias(x, w, b)
        torch.testing.assert_close(got, torch.addmm(b, x, w))
    assert counter.split_calls == 0 and counter.column_calls == 0


@pytest.mark.parametrize("rows", [1, 3, 16, 17, kernels.SPLIT_MAX_ROWS, 40])
@pytest.mark.parametrize("vocab", [5, 8, 50, 203])  # below SPLIT_PARTS, a multiple, leftovers
def test_readout_matmul_equals_x_times_table_transposed(rows, vocab):
    gen = torch.Generator().manual_seed(rows * 1000 + vocab)
    x, table = torch.randn(rows, 16, generator=gen), torch.randn(vocab, 16, generator=gen)
    got = kernels.readout_matmul(x, table)
    assert got.shape == (rows, vocab) and got.is_contiguous()
    torch.testing.assert_close(got, x @ table.T, atol=1e-5, rtol=1e-5)


def test_readout_matmul_takes_the_measured_route_for_few_rows_only(monkeypatch):
    counter = CountSplits(monkeypatch)
    table = torch.randn(203, 16)
    mm_calls = []
    real_mm = torch.mm
    monkeypatch.setattr(kernels.torch, "mm", lambda *a: mm_calls.append(1) or real_mm(*a))
    kernels.readout_matmul(torch.randn(1, 16), table)  # readout_one: the blocks, one bmm
    assert counter.bmm_calls == 1 and not mm_calls
    kernels.readout_matmul(torch.randn(2, 16), table)  # readout_few: the table walked by mm
    assert counter.bmm_calls == 1 and len(mm_calls) == 1
    kernels.readout_matmul(torch.randn(kernels.SPLIT_MAX_ROWS + 1, 16), table)  # torch's own
    assert counter.bmm_calls == 1 and len(mm_calls) == 1


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


def test_split_modules_are_the_chapters_with_the_split_and_the_model_keeps_its_own(
    monkeypatch, tiny_model
):
    from gpt2lib import speed
    from gpt2lib.chapters.layers import Conv1D

    model = tiny_model(vocab_size=331, n_embd=48, n_head=4)
    ids = torch.randint(0, 331, (3, 10))
    with torch.no_grad():
        plain = model(ids[:, :2], last_only=True)[:, -1]  # chapter 6's Conv1D: never split
    with kernels.use_split_matmul(False):
        tokens_off = generate(model, ids, 12, temperature=0)  # through the view, unsplit
    assert {type(m) for m in model.modules() if isinstance(m, Conv1D)} == {Conv1D}
    assert type(model.readout) is TiedReadout  # generate changed no class of the model
    view = speed.fast_view(model)
    assert {type(m) for m in view.modules() if isinstance(m, Conv1D)} == {speed.SplitConv1D}
    assert type(view.readout) is speed.SplitReadout
    assert view.state_dict().keys() == model.state_dict().keys()  # same names,
    assert all(a is b for a, b in zip(view.parameters(), model.parameters()))  # same tensors
    counter = CountSplits(monkeypatch)
    with torch.no_grad():
        split = view(ids[:, :2], last_only=True)[:, -1]
    assert counter.column_calls > 0  # three rows really go through the column split
    torch.testing.assert_close(split, plain, atol=1e-5, rtol=1e-5)
    assert torch.equal(generate(model, ids, 12, temperature=0), tokens_off)


def test_generate_takes_the_plain_model_where_no_split_was_measured_faster(monkeypatch, tiny_model):
    from gpt2lib import generation

    model = tiny_model()
    pretend_measured(monkeypatch, TORCH_ROUTES)
    assert generation._decoding_model(model, torch.device("cpu")) is model
    monkeypatch.setattr(kernels, "known_routes", lambda threads=None: None)  # never measured
    assert generation._decoding_model(model, torch.device("cpu")) is model
    pretend_measured(monkeypatch, SPLIT_ROUTES)
    assert generation._decoding_model(model, torch.device("cpu")) is not model


def test_generate_never_measures_and_leaves_every_module_as_it_was(
    monkeypatch, tmp_path, tiny_model
):
    """With two threads and no measurement kept, the first generate times nothing; with one
    kept, it decodes through a view: either way every module keeps its class and parameters."""
    monkeypatch.undo()
    torch.set_num_threads(2)
    monkeypatch.setenv("GPT2LIB_CACHE_DIR", str(tmp_path))
    monkeypatch.setattr(kernels, "_measured", {})
    monkeypatch.setattr(kernels, "_fastest", lambda *a, **k: pytest.fail("generate measured"))
    model = tiny_model()
    before = [(name, type(m)) for name, m in model.named_modules()]
    params = [p.data_ptr() for p in model.parameters()]
    ids = torch.zeros(1, 3, dtype=torch.long)
    generate(model, ids, 3, temperature=0)
    monkeypatch.setattr(kernels, "known_routes", lambda threads=None: dict(SPLIT_ROUTES))
    generate(model, ids, 3, temperature=0)
    assert [(name, type(m)) for name, m in model.named_modules()] == before
    assert [p.data_ptr() for p in model.parameters()] == params


def test_decode_bytes_per_token_counts_every_weight_but_the_unused_positions():
    with torch.device("meta"):
        model = GPT2(GPT2Config())
    n_embd = 768
    # GPT-2 small: 124,439,808 parameters; one step reads 1 of the 1,024 position rows
    assert measure.decode_bytes_per_token(model) == (124_439_808 - 1023 * n_embd) * 4


def test_wall_times_times_each_call_after_the_warmup_and_median_is_their_median():
    calls, ticks = [], iter(range(0, 100, 1))

    def clock():  # readings 0, 1, 4, 9, ...: each call lasts longer
        return next(ticks) ** 2

    times = measure.wall_times(lambda: calls.append(1), repeats=3, warmup=2, clock=clock)
    assert len(calls) == 5 and times == [1, 5, 9]  # (1-0), (9-4), (25-16): warm-up untimed
    ticks = iter(range(0, 100, 1))
    assert measure.median_seconds(lambda: None, repeats=3, warmup=0, clock=clock) == 5
    with pytest.raises(ValueError, match="repeats must be an int >= 1"):
        measure.wall_times(lambda: None, repeats=0)


def test_measurements_return_plausible_numbers(tiny_model):
    assert measure.median_seconds(lambda: None, repeats=3) >= 0
    assert 0.1 < measure.memory_read_gbps(megabytes=16, repeats=2) < 10_000
    model = tiny_model(vocab_size=64, n_positions=32, n_layer=1)
    assert (
        measure.decode_rate(model, torch.zeros(1, 4, dtype=torch.long), new_tokens=4, repeats=1) > 0
    )


# --------------------------------------------------------------------------- the engine


@settings(max_examples=20, deadline=None)
@given(
    n_layer=st.integers(1, 3),
    n_head=st.integers(1, 3),
    head_dim=st.sampled_from([2, 4, 8]),
    B=st.integers(1, 3),
    T=st.integers(1, 12),
    new=st.integers(1, 12),
    seed=st.integers(0, 999),
)
def test_static_cache_gives_the_tokens_of_the_growing_slices(
    n_layer, n_head, head_dim, B, T, new, seed, tiny_model
):
    """Whole buffer + validity mask + position tensor == growing slices == no cache."""
    from gpt2lib.generation import decode_all

    model = tiny_model(seed, n_layer=n_layer, n_head=n_head, n_embd=n_head * head_dim)
    prompt = torch.randint(0, 61, (B, T), generator=torch.Generator().manual_seed(seed))
    greedy = (0.0, None, None)
    static = decode_all(model, prompt, new, sampling=greedy, static=True)
    slices = decode_all(model, prompt, new, sampling=greedy)
    reference = decode_all(model, prompt, new, sampling=greedy, use_cache=False)
    assert torch.equal(static, slices) and torch.equal(static, reference)


def static_step_setup(model, B=2, T=3, max_len=16):
    cache = KVCache.for_model(model, B, max_len, static=True)
    with torch.no_grad():
        model(torch.zeros(B, T, dtype=torch.long), kv_cache=cache)
    return cache


def test_a_static_step_of_the_layers_reads_nothing_on_the_host(tiny_model):
    """Under a mode that fails on any tensor-to-Python read, the blocks and ln_f of a static
    step still run: attention and the cache write and read at the position tensor."""
    model = tiny_model()
    cache = static_step_setup(model)
    x = model.wte(torch.ones(2, 1, dtype=torch.long)) + model.wpe(cache.position[None])

    class NoHostReads(torch.overrides.TorchFunctionMode):
        def __torch_function__(self, func, types, args=(), kwargs=None):
            if func in (
                torch.Tensor.item,
                torch.Tensor.tolist,
                torch.Tensor.__bool__,
                torch.Tensor.__int__,
                torch.Tensor.__index__,
                torch.Tensor.__float__,
            ):
                raise AssertionError(f"host read: {func}")
            return func(*args, **(kwargs or {}))

    with torch.no_grad(), NoHostReads():
        for i, block in enumerate(model.h):
            x = block(x, kv_cache=cache[i])
        model.ln_f(x)
    assert cache.length == 4 and int(cache.position) == 4
    assert cache.layers[0].k[:, :, 3].abs().sum() > 0  # written at the position
    assert torch.equal(cache.layers[0].k[:, :, 4:], torch.zeros_like(cache.layers[0].k[:, :, 4:]))


def test_a_static_step_of_the_model_compiles_in_one_graph(tiny_model):
    """torch.compile(fullgraph=True) raises on any graph break, such as a host read."""
    model = tiny_model(n_layer=1, n_embd=8, n_head=2, vocab_size=17, n_positions=8)
    cache = static_step_setup(model, B=1, T=2, max_len=8)
    token = torch.tensor([[3]])
    with torch.no_grad():
        want = model(torch.tensor([[0, 0, 3]]), last_only=True)[:, -1]

        def step(token):
            return model(token, kv_cache=cache, last_only=True)[:, -1]

        got = torch.compile(step, fullgraph=True, backend="eager")(token)
    torch.testing.assert_close(got, want, atol=1e-5, rtol=1e-5)


def test_state_dict_to_and_deepcopy_work_after_a_compiled_generation(tiny_model):
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


def test_speed_holds_no_block_attention_or_mlp_of_its_own():
    """One forward: speed.py may choose modules and capture graphs, never compute a layer."""
    import ast
    import inspect

    from gpt2lib import speed

    tree = ast.parse(inspect.getsource(speed))
    names = {
        node.attr if isinstance(node, ast.Attribute) else node.id
        for node in ast.walk(tree)
        if isinstance(node, (ast.Attribute, ast.Name))
    }
    layer_math = {
        "scaled_dot_product_attention",
        "layer_norm",
        "gelu",
        "softmax",
        "embedding",
        "Block",
        "CausalSelfAttention",
        "MLP",
        "LayerNorm",
    }
    assert not names & layer_math, sorted(names & layer_math)
    defined = {
        node.name for node in ast.walk(tree) if isinstance(node, (ast.FunctionDef, ast.ClassDef))
    }
    assert not {
        n
        for n in defined
        if any(w in n.lower() for w in ("block", "attn", "attention", "mlp", "prefill"))
    }
    for gone in (
        "Decoder",
        "GraphDecoder",
        "decode_step",
        "prefill",
        "fast_path_applies",
        "model_weights",
        "_block",
    ):
        assert not hasattr(speed, gone), gone


@pytest.mark.parametrize("measured_faster", [True, False])
def test_by_default_the_split_follows_this_machines_measurement(monkeypatch, measured_faster):
    pretend_measured(monkeypatch, SPLIT_ROUTES if measured_faster else TORCH_ROUTES)
    assert kernels.split_measured_faster() is measured_faster
    counter = CountSplits(monkeypatch)
    x, w, b = torch.randn(1, 64), torch.randn(64, 8), torch.randn(8)
    torch.testing.assert_close(kernels.matmul_bias(x, w, b), torch.addmm(b, x, w))
    assert counter.split_calls == (1 if measured_faster else 0)
    with kernels.use_split_matmul(True):  # asked for: split even where it was measured slower
        kernels.matmul_bias(x, w, b)
    assert counter.split_calls == (2 if measured_faster else 1)


def test_a_measurement_asked_for_is_kept_on_disk_and_read_back_without_measuring(
    monkeypatch, tmp_path
):
    monkeypatch.undo()  # the real measurement, not the autouse fixture's stand-in
    torch.set_num_threads(2)
    monkeypatch.setenv("GPT2LIB_CACHE_DIR", str(tmp_path))
    monkeypatch.setattr(kernels, "_measured", {})
    assert kernels.known_routes() is None and not kernels.split_measured_faster()
    calls = []
    real_fastest = kernels._fastest
    monkeypatch.setattr(
        kernels, "_fastest", lambda *a, **k: calls.append(1) or real_fastest(*a, **k)
    )
    from gpt2lib import speed

    first = speed.tune()
    assert len(calls) == 4 and kernels.routes_file() == tmp_path / "split_routes.json"
    assert set(first) == set(SPLIT_ROUTES)
    assert {first[k] for k in first if k.startswith("conv")} <= {"torch", "inner", "columns"}
    assert {first[k] for k in first if k.startswith("readout")} <= {"torch", "table", "blocks"}
    monkeypatch.setattr(kernels, "_measured", {})  # a new process: only the file remembers
    assert kernels.known_routes() == first and kernels.measured_routes() == first
    assert len(calls) == 4  # read back, not measured again
    assert kernels.known_routes(threads=3) is None  # another thread count: not measured
    (tmp_path / "split_routes.json").write_text("{not json", encoding="utf-8")
    monkeypatch.setattr(kernels, "_measured", {})
    assert kernels.known_routes() is None  # a damaged file counts as no measurement


def test_a_split_is_chosen_only_when_it_beats_torch_by_ten_percent(monkeypatch):
    ticks = iter(range(10**6))
    monkeypatch.setattr(kernels.time, "perf_counter", lambda: next(ticks))
    cost = {}  # clock ticks each route takes

    def route(name):
        def run():
            for _ in range(cost[name]):
                next(ticks)

        return run

    routes = {name: route(name) for name in ("torch", "inner", "columns")}
    cost.update(torch=10, inner=9, columns=12)  # inner is faster, but by less than 10%
    assert kernels._fastest(routes, lambda: [()], repeats=2) == "torch"
    cost.update(torch=10, inner=7, columns=5)
    assert kernels._fastest(routes, lambda: [()], repeats=2) == "columns"


def test_use_split_matmul_refuses_what_is_not_true_false_or_none():
    with pytest.raises(TypeError, match="True, False or None"):
        with kernels.use_split_matmul("yes"):
            pass


# --------------------------------------------------------------------------- the swap, kept honest


@torch.no_grad()
def greedy_by_full_forwards(model, idx, n):
    """The reference: the whole sequence through model(...) at every step, argmax."""
    for _ in range(n):
        idx = torch.cat([idx, model(idx)[:, -1].argmax(-1, keepdim=True)], dim=1)
    return idx


def sharp_tiny_model(tiny_model):
    """tiny_model with larger weights: its greedy tokens depend on every layer and head."""
    model = tiny_model(n_embd=32, n_head=4, n_layer=3, vocab_size=97, seed=3)
    with torch.no_grad():
        for block in model.h:
            block.attn.c_proj.weight.mul_(8)
            block.mlp.c_proj.weight.mul_(4)
    return model


@pytest.mark.parametrize(
    "change", ["nothing", "hook on a block", "hook on a swapped layer", "ablated heads"]
)
def test_a_swapped_model_generates_what_the_plain_model_computes(change, tiny_model):
    """SplitConv1D is the same function: generating with the swapped layers (split on) gives the
    tokens of full forward passes of the untouched model, also under hooks and ablations
    (a hook registered before the swap keeps firing after it)."""
    import contextlib
    import copy

    from gpt2lib import speed
    from gpt2lib.chapters.layers import Conv1D
    from gpt2lib.inspection import ablated_heads

    plain = sharp_tiny_model(tiny_model)
    swapped = copy.deepcopy(plain)
    ids = torch.randint(0, 97, (2, 6), generator=torch.Generator().manual_seed(4))
    handles, scopes = [], []
    for model in (plain, swapped):
        if change == "hook on a block":
            handles.append(model.h[1].register_forward_hook(lambda m, a, out: -out))
        elif change == "hook on a swapped layer":
            handles.append(model.h[0].mlp.c_fc.register_forward_hook(lambda m, a, out: out * 3))
        elif change == "ablated heads":
            scopes.append(ablated_heads(model, {0: [0, 1], 2: [3]}))
    with contextlib.ExitStack() as stack:
        for scope in scopes:
            stack.enter_context(scope)
        want = greedy_by_full_forwards(plain, ids, 10)  # plain is never swapped
        view = speed.fast_view(swapped)
        split = [m for m in view.modules() if isinstance(m, Conv1D)]
        assert len(split) == 3 * 4 and all(type(m) is speed.SplitConv1D for m in split)
        assert type(view.readout) is speed.SplitReadout
        with kernels.use_split_matmul(True):
            with torch.no_grad():
                torch.testing.assert_close(view(ids), plain(ids), atol=1e-4, rtol=1e-4)
            got = generate(swapped, ids, 10, temperature=0)  # decodes through a view of it
    for handle in handles:
        handle.remove()
    assert torch.equal(got, want)
    if change != "nothing":  # the change mattered: without it the tokens differ
        assert not torch.equal(want, greedy_by_full_forwards(sharp_tiny_model(tiny_model), ids, 10))


def test_the_swap_leaves_a_learners_subclass_and_replaced_forwards_alone(monkeypatch, tiny_model):
    from gpt2lib import speed
    from gpt2lib.chapters.layers import Conv1D

    class MyConv1D(Conv1D):  # a learner's own layer: it keeps its class
        pass

    model = tiny_model()
    model.h[0].mlp.c_fc.__class__ = MyConv1D
    replaced = model.h[1].attn.c_proj
    replaced.forward = lambda x: Conv1D.forward(replaced, x) * 2  # an experimenter's patch
    view = speed.fast_view(model)
    swapped = [m for m in view.modules() if type(m) is speed.SplitConv1D]
    assert len(swapped) == 2 * 4 - 2
    assert type(view.h[0].mlp.c_fc) is MyConv1D and type(view.h[1].attn.c_proj) is Conv1D
    assert type(view.h[0].attn.c_attn) is speed.SplitConv1D
    assert type(model.h[0].attn.c_attn) is Conv1D  # the model itself keeps its classes
    ids = torch.zeros(1, 3, dtype=torch.long)
    assert torch.equal(
        generate(model, ids, 4, temperature=0), greedy_by_full_forwards(model, ids, 4)
    )

    fresh = tiny_model()  # a class whose forward was patched: nothing is swapped
    monkeypatch.setattr(Conv1D, "forward", lambda self, x: x @ self.weight + self.bias)
    fresh_view = speed.fast_view(fresh)
    assert all(type(m) is Conv1D for m in fresh_view.modules() if isinstance(m, Conv1D))


def test_the_cpu_time_benchmark_pairs_models_with_the_same_weights():
    """benchmarks/decode_cpu_time.py times gpt2lib against transformers on the weights it
    copies across: both must compute the same logits (the tied readout included)."""
    import sys
    from pathlib import Path

    pytest.importorskip("transformers")
    sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))
    import decode_cpu_time

    ours, hf = decode_cpu_time.paired_models(n_embd=24, vocab_size=50)
    assert hf.lm_head.weight.data_ptr() == hf.transformer.wte.weight.data_ptr()
    ids = torch.randint(0, 50, (2, 7), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        torch.testing.assert_close(ours(ids), hf(ids).logits, atol=1e-5, rtol=1e-5)
    assert decode_cpu_time.summary([0.5, 0.1, 0.3], per=10) == pytest.approx(
        {"median": 30.0, "min": 10.0, "max": 50.0}
    )


def test_the_readout_swap_keeps_its_hooks_and_leaves_a_learners_subclass_alone(tiny_model):
    from gpt2lib import speed

    model = tiny_model()
    seen = []
    model.readout.register_forward_hook(lambda module, args, logits: seen.append(logits.shape))
    ids = torch.zeros(2, 3, dtype=torch.long)
    want = greedy_by_full_forwards(tiny_model(), ids, 4)
    seen.clear()
    assert torch.equal(generate(model, ids, 4, temperature=0), want)
    assert type(model.readout) is TiedReadout  # the model keeps its class: the view swapped
    assert (
        seen == [(2, 1, model.config.vocab_size)] * 4
    )  # the prompt's pass and three steps, each seen by the hook

    class MyReadout(TiedReadout):  # a learner's own readout keeps its class
        pass

    mine = tiny_model()
    mine.readout.__class__ = MyReadout
    assert type(speed.fast_view(mine).readout) is MyReadout
