"""Chapter 6's module: the whole model (gpt2lib.chapters.model.GPT2). The checks of its
exercises are tested in tests/graders/test_ch06_checks.py."""

import math

import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F

from gpt2lib.chapters.block import Block
from gpt2lib.chapters.config import GPT2Config
from gpt2lib.chapters.model import GPT2

TINY = GPT2Config(vocab_size=61, n_positions=16, n_embd=32, n_layer=2, n_head=4)


@pytest.fixture(scope="module")
def tiny():
    torch.manual_seed(0)
    return GPT2(TINY).eval()


# --------------------------------------------------------------------------- tied readout


def test_readout_is_tied_to_the_token_table(tiny):
    vocab_sized = [n for n, p in tiny.named_parameters() if TINY.vocab_size in p.shape]
    assert vocab_sized == ["wte.weight"]
    idx = torch.randint(0, TINY.vocab_size, (2, 7), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        x = tiny.wte(idx) + tiny.wpe(torch.arange(7))
        for block in tiny.h:
            x = block(x)
        by_hand = tiny.ln_f(x) @ tiny.wte.weight.T
        torch.testing.assert_close(tiny(idx), by_hand, atol=1e-5, rtol=1e-5)


def test_changing_the_token_table_changes_the_readout():
    torch.manual_seed(0)
    model = GPT2(TINY).eval()
    idx = torch.tensor([[1, 2, 3]])
    with torch.no_grad():
        before = model(idx)
        model.wte.weight[40] += torch.randn(
            TINY.n_embd
        )  # 40 is not in the input: only the readout reads it
        after = model(idx)
    changed = (after - before).abs().amax(dim=(0, 1)) > 1e-6  # (V,)
    assert changed.nonzero().flatten().tolist() == [40]


# --------------------------------------------------------------------------- initialisation


def test_init_stds_follow_gpt2():
    config = GPT2Config(vocab_size=2000, n_positions=128, n_embd=128, n_layer=4, n_head=4)
    torch.manual_seed(0)
    model = GPT2(config)
    params = dict(model.named_parameters())
    residual = 0.02 / math.sqrt(2 * config.n_layer)
    for name, p in params.items():
        if name.endswith("c_proj.weight"):
            assert p.std().item() == pytest.approx(residual, rel=0.05), name
            assert abs(p.mean().item()) < 0.1 * residual, name
        elif name in ("wte.weight", "wpe.weight") or name.endswith(
            ("c_attn.weight", "c_fc.weight")
        ):
            assert p.std().item() == pytest.approx(0.02, rel=0.05), name
            assert abs(p.mean().item()) < 0.002, name
        elif ".ln_" in name or name.startswith("ln_f"):
            assert torch.all(p == (1.0 if name.endswith("weight") else 0.0)), name
        else:
            assert name.endswith(".bias") and torch.all(p == 0), name


def test_init_covers_blocks_built_from_torch_layers():
    class LinearBlock(nn.Module):  # a learner's block made of nn.Linear / nn.LayerNorm
        def __init__(self, config):
            super().__init__()
            self.ln = nn.LayerNorm(config.n_embd)
            self.c_fc = nn.Linear(config.n_embd, 4 * config.n_embd)
            self.c_proj = nn.Linear(4 * config.n_embd, config.n_embd)

        def forward(self, x):  # no kv_cache argument: must still work
            return x + self.c_proj(F.gelu(self.c_fc(self.ln(x))))

    config = GPT2Config(vocab_size=50, n_positions=8, n_embd=64, n_layer=8, n_head=4)
    torch.manual_seed(0)
    model = GPT2(config, block_cls=LinearBlock).eval()
    fc = torch.cat([b.c_fc.weight.flatten() for b in model.h])
    proj = torch.cat([b.c_proj.weight.flatten() for b in model.h])
    assert fc.std().item() == pytest.approx(0.02, rel=0.05)
    assert proj.std().item() == pytest.approx(0.02 / math.sqrt(16), rel=0.05)
    assert all(torch.all(b.c_fc.bias == 0) for b in model.h)
    assert model(torch.tensor([[1, 2, 3]])).shape == (1, 3, 50)


def test_building_on_meta_needs_no_memory_and_loads_with_assign(tiny):
    with torch.device("meta"):
        empty = GPT2(TINY)
    empty.load_state_dict(tiny.state_dict(), assign=True)
    empty.eval()
    assert empty.wte.weight.data_ptr() == tiny.wte.weight.data_ptr()  # shared, not copied
    idx = torch.tensor([[5, 6, 7]])
    with torch.no_grad():
        torch.testing.assert_close(empty(idx), tiny(idx))


# --------------------------------------------------------------------------- forward


def test_shapes_last_only_and_int32_ids(tiny):
    idx = torch.randint(
        0, TINY.vocab_size, (3, TINY.n_positions), generator=torch.Generator().manual_seed(2)
    )
    with torch.no_grad():
        full = tiny(idx)
        last = tiny(idx, last_only=True)
        as_int32 = tiny(idx.int())
    assert full.shape == (3, TINY.n_positions, TINY.vocab_size)
    assert last.shape == (3, 1, TINY.vocab_size)
    torch.testing.assert_close(last, full[:, -1:], atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(as_int32, full)


def test_causal_earlier_logits_ignore_later_tokens(tiny):
    a = torch.tensor([[3, 4, 5, 6, 7]])
    b = torch.tensor([[3, 4, 5, 50, 1]])
    with torch.no_grad():
        torch.testing.assert_close(tiny(a)[:, :3], tiny(b)[:, :3])
        assert not torch.allclose(tiny(a)[:, 3:], tiny(b)[:, 3:])


def test_positions_matter(tiny):
    with torch.no_grad():
        forwards = tiny(torch.tensor([[7, 7, 7]]))
    assert not torch.allclose(forwards[0, 0], forwards[0, 2], atol=1e-4)


def test_dropout_only_in_training():
    config = GPT2Config(
        vocab_size=30,
        n_positions=8,
        n_embd=16,
        n_layer=1,
        n_head=2,
        embd_pdrop=0.5,
        attn_pdrop=0.0,
        resid_pdrop=0.0,
    )
    torch.manual_seed(0)
    model = GPT2(config)
    idx = torch.tensor([[1, 2, 3, 4]])
    model.train()
    assert not torch.allclose(model(idx), model(idx))
    model.eval()
    torch.testing.assert_close(model(idx), model(idx))


# --------------------------------------------------------------------------- errors


@pytest.mark.parametrize(
    "bad, error, message",
    [  # chapter 2's validator words these
        (torch.tensor([[1, 61]]), ValueError, r"(?s)(?=.*61)(?=.*vocab)"),
        (torch.tensor([[-1, 3]]), ValueError, r"(?s)(?=.*-1)(?=.*vocab)"),
        (torch.tensor([1, 2, 3]), ValueError, r"(?s)(?=.*\(B, T\))(?=.*\(3,\))"),
        (
            torch.zeros(1, 2, 3, dtype=torch.long),
            ValueError,
            r"(?s)(?=.*\(B, T\))(?=.*\(1, 2, 3\))",
        ),
        (torch.zeros(1, 0, dtype=torch.long), ValueError, r"hold no tokens.*T >= 1"),
        (torch.zeros(0, 4, dtype=torch.long), ValueError, r"hold no tokens.*B >= 1"),
        (torch.tensor([[1.0, 2.0]]), TypeError, r"(?s)(?=.*integer)(?=.*float32)"),
        (torch.tensor([[True, False]]), TypeError, r"(?s)(?=.*integer)(?=.*bool)"),
        ([[1, 2, 3]], TypeError, r"(?s)(?=.*torch.Tensor)(?=.*list)"),
        (
            torch.zeros(1, 17, dtype=torch.long),
            ValueError,
            r"(?s)(?=.*17)(?=.*context of 16)(?=.*n_positions)",
        ),
    ],
)
@pytest.mark.parametrize("entry", ["check_token_ids", "generate", "run_with_cache"])
def test_bad_input_gets_a_clear_error_at_the_entry_points(tiny, bad, error, message, entry):
    # moved from a plain forward (tiny(bad)): the forward no longer reads the ids; the entry
    # points that take ids from users check them once, with chapter 2's validator
    from gpt2lib.generation import generate
    from gpt2lib.inspection import run_with_cache
    from gpt2lib.validation import check_token_ids

    call = {
        "check_token_ids": lambda: check_token_ids(bad, TINY),
        "generate": lambda: generate(tiny, bad, 1),
        "run_with_cache": lambda: run_with_cache(tiny, bad),
    }[entry]
    with pytest.raises(error, match=message):
        call()


@pytest.mark.parametrize(
    "bad",
    [
        torch.tensor([1, 2, 3]),
        torch.zeros(1, 2, 3, dtype=torch.long),
        torch.tensor([[1, 61]]),
        torch.zeros(1, 17, dtype=torch.long),
    ],
)
def test_a_plain_forward_still_fails_loudly_on_bad_input(tiny, bad):
    # no silent wrong answer: a wrong shape cannot unpack into (B, T), an id past the table is
    # torch's IndexError, a context that is too long is the forward's one assert
    with pytest.raises((ValueError, IndexError, AssertionError)):
        tiny(bad)


def test_the_forward_reads_no_token_values_and_uses_chapter_2s_positions(tiny, monkeypatch):
    import gpt2lib.chapters.model as model_module
    import gpt2lib.validation as validation

    calls = []
    real_positions = model_module.position_ids
    monkeypatch.setattr(
        validation, "_check_range", lambda *a, **k: pytest.fail("the forward read the ids")
    )
    monkeypatch.setattr(
        model_module,
        "position_ids",
        lambda T, past=0, device=None: (
            calls.append(("positions", T, past)) or real_positions(T, past, device=device)
        ),
    )
    cache = FakeCache(TINY.n_layer)
    with torch.no_grad():
        tiny(torch.tensor([[1, 2, 3]]))
        tiny(torch.tensor([[1, 2, 3]]), kv_cache=cache)
        tiny(torch.tensor([[4]]), kv_cache=cache)
    assert calls == [("positions", 3, 0), ("positions", 3, 0), ("positions", 1, 3)]


@pytest.mark.parametrize("config", [{}, {"n_embd": 768}, None, "gpt2"])
def test_the_constructor_needs_a_gpt2_config(config):
    # the clear error moved from chapter 6's teaching cell to the entry point, gpt2lib.GPT2 (what
    # `from gpt2lib import GPT2` gives); the plain class still fails loudly, at the first field
    import gpt2lib

    with pytest.raises(TypeError, match=r"GPT2 needs a GPT2Config, got .*GPT2Config.from_name"):
        gpt2lib.GPT2(config)
    with pytest.raises(TypeError, match=r"GPT2 needs a GPT2Config, got dict"):
        gpt2lib.GPT2(config={"n_layer": 1})
    with pytest.raises((AttributeError, TypeError)):
        GPT2(config)


def test_the_entry_point_class_builds_the_same_model_from_a_gpt2_config():
    import gpt2lib

    torch.manual_seed(0)
    plain = GPT2(TINY)
    torch.manual_seed(0)
    entry = gpt2lib.GPT2(TINY, block_cls=Block)
    assert isinstance(entry, GPT2)
    assert all(
        torch.equal(a, b) for a, b in zip(plain.state_dict().values(), entry.state_dict().values())
    )


# --------------------------------------------------------------------------- KV-cache protocol


class FakeLayerCache:
    """Keeps keys and values by concatenation: the protocol of gpt2lib.kvcache, minimally."""

    def __init__(self, log, index):
        self.k = self.v = None
        self.log, self.index = log, index

    @property
    def position(self):
        return 0 if self.k is None else self.k.shape[2]

    def update(self, k, v):  # (B, nh, T, hd) -> all so far (B, nh, past + T, hd), and the mask
        from gpt2lib.chapters.attention import causal_mask

        past, T = self.position, k.shape[2]
        self.log.append(("update", self.index, T))
        self.k = k if self.k is None else torch.cat([self.k, k], dim=2)
        self.v = v if self.v is None else torch.cat([self.v, v], dim=2)
        return self.k, self.v, None if past == 0 else causal_mask(T, past)


class FakeCache:
    def __init__(self, n_layer):
        self.log = []
        self.layers = [FakeLayerCache(self.log, i) for i in range(n_layer)]

    def __getitem__(self, i):
        return self.layers[i]

    @property
    def position(self):
        return self.layers[0].position


def test_kv_cache_protocol_gives_the_uncached_logits(tiny):
    idx = torch.randint(0, TINY.vocab_size, (2, 9), generator=torch.Generator().manual_seed(3))
    cache = FakeCache(TINY.n_layer)
    with torch.no_grad():
        full = tiny(idx)
        prompt = tiny(idx[:, :6], kv_cache=cache)
        steps = [tiny(idx[:, t : t + 1], kv_cache=cache, last_only=True) for t in range(6, 9)]
    assert cache.log[:2] == [("update", 0, 6), ("update", 1, 6)]  # block i gets cache[i]
    assert cache.log[2:4] == [("update", 0, 1), ("update", 1, 1)]
    assert cache.position == 9
    torch.testing.assert_close(prompt, full[:, :6], atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(torch.cat(steps, dim=1), full[:, 6:], atol=1e-5, rtol=1e-5)


def test_too_many_tokens_for_the_context_are_refused_before_any_block_runs(tiny):
    cache = FakeCache(TINY.n_layer)
    with pytest.raises(AssertionError, match=r"17 tokens; the context is 16"):
        tiny(torch.zeros(1, 17, dtype=torch.long), kv_cache=cache)
    assert cache.log == [], "nothing may touch the cache when the input is refused"


def test_building_on_meta_for_the_loader_fills_nothing(monkeypatch):
    """The loader builds models on meta for their shapes: there are no values, and each fill on
    meta costs tens of milliseconds, so gpt2lib.checkpoint skips them (chapter 6's class stays
    plain); a real tensor is still filled, inside the block as outside it."""
    from gpt2lib.checkpoint import fills_skipped_on_meta

    filled = []
    real_normal = torch.nn.init.normal_

    def recording_normal(tensor, *args, **kwargs):
        filled.append(tuple(tensor.shape))
        return real_normal(tensor, *args, **kwargs)

    monkeypatch.setattr(torch.nn.init, "normal_", recording_normal)
    with fills_skipped_on_meta():
        with torch.device("meta"):
            model = GPT2(GPT2Config.from_name("gpt2-xl"))
        assert filled == []
        real = torch.nn.init.normal_(torch.empty(3, 4))
    assert filled == [(3, 4)] and torch.nn.init.normal_ is recording_normal and real.std() > 0
    filled.clear()
    assert all(p.is_meta for p in model.parameters())
    assert isinstance(model.wte, nn.Embedding) and model.wte.weight.requires_grad
    assert sum(p.numel() for p in model.parameters()) == 1_557_611_200
    # on a real device the same code does fill the weights
    GPT2(GPT2Config(vocab_size=50, n_positions=8, n_embd=16, n_layer=1, n_head=2))
    assert (50, 16) in filled and (16, 48) in filled


@pytest.mark.parametrize("B, T", [(1, 1), (8, 1), (4, 4), (2, 9), (3, 40)])
def test_tied_readout_equals_the_product_with_the_transposed_table(B, T):
    from gpt2lib.chapters.model import tied_readout

    torch.manual_seed(0)
    weight = torch.randn(101, 24)  # (V, C)
    x = torch.randn(B, T, 24)  # (B, T, C)
    logits = tied_readout(x, weight)
    assert logits.shape == (B, T, 101)
    assert logits.is_contiguous()  # callers may .view(-1, V) for the loss
    torch.testing.assert_close(logits, x @ weight.T, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("dtype", [torch.int8, torch.int16, torch.uint8, torch.int32])
@pytest.mark.parametrize("entry", ["generate", "run_with_cache"])
def test_any_integer_dtype_of_ids_gives_the_same_result_at_the_entry_points(
    dtype, entry, tiny_model
):
    # One validator (chapter 2's check_token_ids) accepts every integer dtype; the entry points
    # convert with idx.long() before the lookup (the plain forward does not: it takes the int64
    # or int32 ids nn.Embedding takes), so small int types are not a crash inside nn.Embedding.
    from gpt2lib.generation import generate
    from gpt2lib.inspection import run_with_cache

    model = tiny_model(n_layer=1, n_embd=8, vocab_size=50, n_positions=8)
    ids = torch.tensor([[1, 7, 3, 42]])
    with torch.no_grad():
        if entry == "generate":
            assert torch.equal(
                generate(model, ids.to(dtype), 3, temperature=0),
                generate(model, ids, 3, temperature=0),
            )
        else:
            assert torch.equal(
                run_with_cache(model, ids.to(dtype))[0], run_with_cache(model, ids)[0]
            )


def test_a_plain_forward_refuses_small_integer_ids_loudly(tiny_model):
    # no silent wrong answer: nn.Embedding names the dtypes it takes
    model = tiny_model(n_layer=1, n_embd=8, vocab_size=50, n_positions=8)
    with pytest.raises((RuntimeError, IndexError)):
        model(torch.tensor([[1, 7, 3]], dtype=torch.int8))


def test_train_checks_the_ids_once_before_training(tiny):
    # the guarantee a plain forward gave before (a clear error for an id outside the
    # vocabulary) now comes from train's entry, before any step changes the model
    from gpt2lib.training import train

    before = {k: v.clone() for k, v in tiny.state_dict().items()}
    good = torch.randint(0, TINY.vocab_size, (40,), generator=torch.Generator().manual_seed(0))
    bad = good.clone()
    bad[7] = TINY.vocab_size
    with pytest.raises(
        ValueError, match=r"train_ids holds token id 61, outside the vocabulary 0\.\.60"
    ):
        train(tiny, bad, good, 1, batch_size=2, block_size=8, progress=False)
    with pytest.raises(TypeError, match="val_ids must hold integer token ids"):
        train(tiny, good, good.float(), 1, batch_size=2, block_size=8, progress=False)
    assert all(torch.equal(v, before[k]) for k, v in tiny.state_dict().items())
    tiny.eval()
