"""Chapter 6: the whole model (gpt2lib.model.GPT2) and the chapter's exercise checks."""

import math
import re

import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F
from check_cases import assert_named, planted

from gpt2lib.chapters.block import Block, LayerNorm
from gpt2lib.chapters.config import GPT2Config
from gpt2lib.chapters.layers import Conv1D
from gpt2lib.chapters.model import GPT2
from gpt2lib.course.checks import CheckFailed
from gpt2lib.course.checks import model as checks

TINY = GPT2Config(vocab_size=61, n_positions=16, n_embd=32, n_layer=2, n_head=4)


def count(module):
    return sum(p.numel() for p in module.parameters())


@pytest.fixture(scope="module")
def tiny():
    torch.manual_seed(0)
    return GPT2(TINY).eval()


@pytest.fixture(scope="module")
def small_meta():
    with torch.device("meta"):
        return GPT2(GPT2Config())


# --------------------------------------------------------------------------- sizes


@pytest.mark.parametrize(
    "name, expected",
    [
        ("gpt2", 124_439_808),
        ("gpt2-medium", 354_823_168),
        ("gpt2-large", 774_030_080),
        ("gpt2-xl", 1_557_611_200),
    ],
)
def test_parameter_counts_of_the_four_sizes_on_meta(name, expected):
    with torch.device("meta"):
        model = GPT2(GPT2Config.from_name(name))
    assert all(p.is_meta for p in model.parameters())
    assert all(p.data_ptr() == 0 for p in model.parameters()), "meta tensors own no memory"
    assert count(model) == expected


def test_per_component_counts_match_the_design_card(small_meta):
    m = small_meta
    assert count(m.wte) == 50_257 * 768 == 38_597_376
    assert count(m.wpe) == 1_024 * 768 == 786_432
    assert count(m.h[0]) == 7_087_872
    assert count(m.h) == 7_087_872 * 12 == 85_054_464
    assert count(m.h[0].attn) == 2_362_368 and count(m.h[0].mlp) == 4_722_432
    assert count(m.h[0].ln_1) == count(m.h[0].ln_2) == count(m.ln_f) == 1_536
    assert count(m) == 124_439_808
    assert count(m) * 4 / 2**20 == pytest.approx(474.7, abs=0.05)  # float32 weights, MiB


def test_names_match_the_hub_checkpoint_keys(small_meta):
    names = set(small_meta.state_dict())
    assert {
        "wte.weight",
        "wpe.weight",
        "ln_f.weight",
        "ln_f.bias",
        "h.0.ln_1.weight",
        "h.11.attn.c_attn.weight",
        "h.11.attn.c_proj.bias",
        "h.5.mlp.c_fc.weight",
        "h.5.mlp.c_proj.weight",
        "h.0.ln_2.bias",
    } <= names
    assert not any(n.startswith(("transformer.", "lm_head")) for n in names)
    assert tuple(small_meta.h[0].attn.c_attn.weight.shape) == (768, 2304)  # Conv1D: [in, out]


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


# --------------------------------------------------------------------------- Exercise 6.1 check


class RightGPT2(nn.Module):
    """A correct answer written differently: tied through an lm_head that shares wte's weight."""

    def __init__(self, config):
        super().__init__()
        self.wte = nn.Embedding(config.vocab_size, config.n_embd)
        self.wpe = nn.Embedding(config.n_positions, config.n_embd)
        self.drop = nn.Dropout(config.embd_pdrop)
        self.h = nn.ModuleList(Block(config) for _ in range(config.n_layer))
        self.ln_f = LayerNorm(config.n_embd, config.layer_norm_epsilon)
        self.lm_head = nn.Linear(config.n_embd, config.vocab_size, bias=False)
        self.lm_head.weight = self.wte.weight  # tied: one tensor, two uses

    def embed(self, idx):
        return self.wte(idx) + self.wpe(torch.arange(idx.size(1))[None, :])

    def forward(self, idx):
        x = self.drop(self.embed(idx))
        for block in self.h:
            x = block(x)
        return self.lm_head(self.ln_f(x))


def test_check_module_passes_the_reference_and_another_correct_answer(capsys):
    checks.check_gpt2_module(RightGPT2)
    checks.check_gpt2_module(lambda config: GPT2(config))

    class TorchLayerNorm(RightGPT2):  # nn.LayerNorm for ln_f, float64 logits
        def __init__(self, config):
            super().__init__(config)
            self.ln_f = nn.LayerNorm(config.n_embd, eps=config.layer_norm_epsilon)

        def forward(self, idx):
            return super().forward(idx).double()

    checks.check_gpt2_module(TorchLayerNorm)
    assert capsys.readouterr().out.count("✅") == 3


@pytest.mark.parametrize("mistake", checks.MODULE_MISTAKES, ids=lambda m: m.name)
def test_check_module_names_each_planted_mistake(mistake):
    class Planted(RightGPT2):
        def forward(self, idx):
            return mistake.fn(self, idx)

    with pytest.raises(CheckFailed, match=re.escape(mistake.message)):
        checks.check_gpt2_module(Planted)


def test_check_module_names_the_double_residual_that_exercise_6_8_plants():
    class AddsTwice(RightGPT2):  # x = x + block(x), as a learner writes it
        def forward(self, idx):
            x = self.drop(self.embed(idx))
            for block in self.h:
                x = x + block(x)
            return self.lm_head(self.ln_f(x))

    with pytest.raises(CheckFailed, match=r"x = x \+ block\(x\).*Write x = block\(x\)"):
        checks.check_gpt2_module(AddsTwice)


def test_check_module_names_a_missing_readout_dropout_and_a_wrong_signature():
    class NoReadout(RightGPT2):
        def forward(self, idx):
            x = self.drop(self.embed(idx))
            for block in self.h:
                x = block(x)
            return self.ln_f(x)

    with pytest.raises(CheckFailed, match="the readout is missing"):
        checks.check_gpt2_module(NoReadout)

    class NoDropout(RightGPT2):
        def forward(self, idx):
            x = self.embed(idx)  # self.drop exists but is never applied
            for block in self.h:
                x = block(x)
            return self.lm_head(self.ln_f(x))

    with pytest.raises(CheckFailed, match="self.drop is never applied"):
        checks.check_gpt2_module(NoDropout)

    class AlwaysDropout(RightGPT2):
        def forward(self, idx):
            x = F.dropout(self.embed(idx), self.drop.p)  # training=True by default
            for block in self.h:
                x = block(x)
            return self.lm_head(self.ln_f(x))

    with pytest.raises(CheckFailed, match="in eval mode two calls gave different logits"):
        checks.check_gpt2_module(AlwaysDropout)

    class NeedsTargets(RightGPT2):
        def forward(self, idx, targets):
            return super().forward(idx)

    with pytest.raises(CheckFailed, match="Keep the signature"):
        checks.check_gpt2_module(NeedsTargets)


def test_check_module_catches_an_untied_readout():
    class Untied(RightGPT2):
        def __init__(self, config):
            super().__init__(config)
            self.lm_head = nn.Linear(config.n_embd, config.vocab_size, bias=False)

    with pytest.raises(CheckFailed, match=r"separate readout \(lm_head.weight.*38,597,376.*tied"):
        checks.check_gpt2_module(Untied)


def test_check_module_catches_a_missing_final_layernorm():
    class NoLnF(RightGPT2):
        def __init__(self, config):
            super().__init__(config)
            del self.ln_f

        def forward(self, idx):
            x = self.drop(self.embed(idx))
            for block in self.h:
                x = block(x)
            return self.lm_head(x)

    with pytest.raises(CheckFailed, match="no `ln_f`: the final LayerNorm is missing"):
        checks.check_gpt2_module(NoLnF)


def test_check_module_catches_wrong_names_stub_and_signature():
    class Renamed(RightGPT2):
        def __init__(self, config):
            super().__init__(config)
            self.blocks = self.h
            del self.h

    with pytest.raises(CheckFailed, match="no attribute.*h.*use exactly the names"):
        checks.check_gpt2_module(Renamed)

    class PlainList(RightGPT2):
        def __init__(self, config):
            super().__init__(config)
            blocks = list(self.h)
            del self.h  # a learner writing self.h = [Block(config) ...] from the start
            self.h = blocks

    with pytest.raises(CheckFailed, match=r"self.h is a plain list.*nn.ModuleList"):
        checks.check_gpt2_module(PlainList)

    class Stub(nn.Module):
        def __init__(self, config):
            super().__init__()
            raise NotImplementedError("Exercise 6.1: replace this line with your code")

    with pytest.raises(CheckFailed, match="not done yet"):
        checks.check_gpt2_module(Stub)

    class NoConfig(nn.Module):
        def __init__(self):
            super().__init__()

    with pytest.raises(CheckFailed, match="cannot take that"):
        checks.check_gpt2_module(NoConfig)


# --------------------------------------------------------------------------- Exercise 6.2 check


def _right_init(model, residual_scale=None, skip=()):
    n_layer = model.config.n_layer
    scale = residual_scale if residual_scale is not None else 1 / math.sqrt(2 * n_layer)
    for name, module in model.named_modules():
        if isinstance(module, nn.Embedding) and "embedding" not in skip:
            nn.init.normal_(module.weight, std=0.02)
        elif isinstance(module, Conv1D):
            is_residual = name.endswith("c_proj") and not any(name.endswith(s) for s in skip)
            nn.init.normal_(module.weight, std=0.02 * scale if is_residual else 0.02)
            if "bias" not in skip:
                nn.init.zeros_(module.bias)
        elif isinstance(module, LayerNorm) and "layernorm" not in skip:
            nn.init.ones_(module.weight)
            nn.init.zeros_(module.bias)


def test_check_init_passes_correct_answers(capsys):
    checks.check_init_gpt2_weights(_right_init)

    def by_parameter_name(model):  # another correct style: by names, trunc_normal_ far out
        std = 0.02 / math.sqrt(2 * len(model.h))
        for name, p in model.named_parameters():
            if name.endswith("bias"):
                p.zero_()
            elif ".ln_" in name or name.startswith("ln_f"):
                p.fill_(1.0)
            else:
                nn.init.trunc_normal_(
                    p, std=std if name.endswith("c_proj.weight") else 0.02, a=-1.0, b=1.0
                )

    checks.check_init_gpt2_weights(by_parameter_name)
    checks.check_init_gpt2_weights(lambda model: model.init_weights())  # the reference
    assert capsys.readouterr().out.count("✅") == 3


@pytest.mark.parametrize("mistake", checks.INIT_SCALE_MISTAKES, ids=lambda m: m.name)
def test_check_init_names_each_planted_scale(mistake):
    def planted(model):
        _right_init(model, residual_scale=mistake.fn(model.config.n_layer) / 0.02)

    with pytest.raises(CheckFailed, match=re.escape(mistake.message)):
        checks.check_init_gpt2_weights(planted)


@pytest.mark.parametrize(
    "wrong, phrase",
    [
        (lambda m: _right_init(m, residual_scale=1.0), "not scaled"),
        (
            lambda m: _right_init(m, skip=("mlp.c_proj",)),
            "only attn.c_proj is scaled, mlp.c_proj is not",
        ),
        (
            lambda m: _right_init(m, skip=("attn.c_proj",)),
            "only mlp.c_proj is scaled, attn.c_proj is not",
        ),
        (lambda m: _right_init(m, skip=("bias",)), r"attn.c_attn.bias is not zero"),
        (lambda m: _right_init(m, skip=("layernorm",)), r"ln_1.weight is not all ones"),
        (lambda m: _right_init(m, skip=("embedding",)), r"wte.weight still holds the value"),
    ],
)
def test_check_init_names_the_mistake(wrong, phrase):
    with pytest.raises(CheckFailed, match=phrase):
        checks.check_init_gpt2_weights(wrong)


def test_check_init_catches_variance_for_std():
    def variance(model):
        _right_init(model)
        for module in model.modules():
            if isinstance(module, (nn.Embedding, Conv1D)):
                nn.init.normal_(module.weight, std=math.sqrt(0.02))

    with pytest.raises(CheckFailed, match="not the variance"):
        checks.check_init_gpt2_weights(variance)


# --------------------------------------------------------------------------- Exercise 6.3 check


def _formula(config, extra=0, block_extra=0, one_block=False, hidden=4):
    """The count, right by default; the arguments plant the usual mistakes."""
    V, P, C, L = config.vocab_size, config.n_positions, config.n_embd, config.n_layer
    attention = (C * 3 * C + 3 * C) + (C * C + C)
    mlp = (C * hidden * C + hidden * C) + (hidden * C * C + C)
    block = 2 * (2 * C) + attention + mlp + block_extra
    return V * C + P * C + (1 if one_block else L) * block + 2 * C + extra


def test_check_count_passes_correct_answers(capsys):
    checks.check_count_gpt2_parameters(_formula)

    def via_meta(config):  # counting a meta model is also a correct answer
        with torch.device("meta"):
            return count(GPT2(config))

    checks.check_count_gpt2_parameters(via_meta)
    checks.check_count_gpt2_parameters(lambda config: float(_formula(config)))
    assert capsys.readouterr().out.count("✅") == 3


@pytest.mark.parametrize("mistake", checks.COUNT_MISTAKES, ids=lambda m: m.name)
def test_check_count_names_each_planted_mistake(mistake):
    with pytest.raises(CheckFailed, match=re.escape(mistake.message)):
        checks.check_count_gpt2_parameters(mistake.fn)


def _formula_c_proj_square(config):  # the MLP's c_proj counted as n × n, written as a learner would
    V, P, C, L = config.vocab_size, config.n_positions, config.n_embd, config.n_layer
    attention = (C * 3 * C + 3 * C) + (C * C + C)
    mlp = (C * 4 * C + 4 * C) + (C * C + C)
    return V * C + P * C + L * (4 * C + attention + mlp) + 2 * C


@pytest.mark.parametrize(
    "wrong, phrase",
    [
        (_formula_c_proj_square, r"MLP's c_proj is counted as n_embd × n_embd"),
        (
            lambda c: _formula(c, extra=c.vocab_size * c.n_embd),
            "counted the readout as well as wte.*TIED",
        ),
        (lambda c: _formula(c, extra=-2 * c.n_embd), "final LayerNorm ln_f .* is missing"),
        (lambda c: _formula(c, extra=-c.n_positions * c.n_embd), "position embedding table wpe"),
        (lambda c: _formula(c, block_extra=-9 * c.n_embd), "biases of c_attn"),
        (lambda c: _formula(c, block_extra=-4 * c.n_embd), "ln_1 and ln_2"),
        (lambda c: _formula(c, one_block=True), "only ONE block"),
        (lambda c: _formula(c, hidden=1), "hidden layer is 4 · n_embd wide"),
        (lambda c: _formula(c, extra=1), r"off by \+1"),
        (lambda c: "124M", "return a number"),
    ],
)
def test_check_count_names_the_mistake(wrong, phrase):
    with pytest.raises(CheckFailed, match=phrase):
        checks.check_count_gpt2_parameters(wrong)


# --------------------------------------------------------------------------- more learner mistakes


class _SharedBlocks(nn.Module):
    def __init__(self, config):
        super().__init__()
        self.wte = nn.Embedding(config.vocab_size, config.n_embd)
        self.wpe = nn.Embedding(config.n_positions, config.n_embd)
        self.drop = nn.Dropout(config.embd_pdrop)
        self.h = nn.ModuleList([Block(config)] * config.n_layer)  # one block, n_layer times
        self.ln_f = LayerNorm(config.n_embd, config.layer_norm_epsilon)

    def forward(self, idx):
        x = self.drop(self.wte(idx) + self.wpe(torch.arange(idx.shape[1])))
        for block in self.h:
            x = block(x)
        return self.ln_f(x) @ self.wte.weight.T


def test_check_module_names_one_block_repeated():
    with pytest.raises(CheckFailed, match="holds the same Block object more than once"):
        checks.check_gpt2_module(_SharedBlocks)


def test_check_init_names_a_returned_copy():
    import copy

    def init_a_copy(model):
        fresh = copy.deepcopy(model)
        fresh.init_weights()
        return fresh

    with pytest.raises(
        CheckFailed, match="returned a new model and left the one it was given unchanged"
    ):
        checks.check_init_gpt2_weights(init_a_copy)


def _count(config, layer_norms_per_block=2, layer_norm_size=2, attn_out=3):
    V, P, C, L = config.vocab_size, config.n_positions, config.n_embd, config.n_layer
    ln = layer_norm_size * C
    attention = C * attn_out * C + attn_out * C + C * C + C
    mlp = C * 4 * C + 4 * C + 4 * C * C + C
    return V * C + P * C + L * (layer_norms_per_block * ln + attention + mlp) + ln


@pytest.mark.parametrize(
    "wrong, phrase",
    [
        (lambda c: _count(c, layer_norms_per_block=1), "each block has TWO LayerNorms"),
        (lambda c: _count(c, layer_norm_size=1), r"a gain \(weight\) AND a bias"),
        (lambda c: _count(c, attn_out=1), "c_attn maps n_embd to 3 · n_embd"),
        (lambda c: 124_439_808, "you return GPT-2 small's count"),
    ],
)
def test_check_count_names_more_learner_mistakes(wrong, phrase):
    with pytest.raises(CheckFailed, match=phrase):
        checks.check_count_gpt2_parameters(wrong)


def test_check_count_accepts_the_learner_style_formula(capsys):
    checks.check_count_gpt2_parameters(_count)
    assert "✅ Exercise 6.5" in capsys.readouterr().out


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


# --------------------------------------------------------------------------- Exercise 6.5 check


def right_memory(n_params, bytes_per_number=4):
    weights = n_params * bytes_per_number
    return {
        "weights": weights,
        "gradients": weights,
        "optimizer": 2 * weights,
        "total": 4 * weights,
    }


def test_check_memory_passes_correct_answers(capsys):
    checks.check_training_memory(right_memory)
    checks.check_training_memory(  # floats and extra keys are fine
        lambda n, bytes_per_number=4: {
            **{k: float(v) for k, v in right_memory(n, bytes_per_number).items()},
            "activations": None,
        }
    )
    assert capsys.readouterr().out.count("✅ Exercise 6.6") == 2


@pytest.mark.parametrize("mistake", checks.MEMORY_MISTAKES, ids=lambda m: m.name)
def test_check_memory_names_each_planted_mistake(mistake):
    with pytest.raises(CheckFailed, match=re.escape(mistake.message)):
        checks.check_training_memory(lambda n, bytes_per_number=4: mistake.fn(n, bytes_per_number))


def test_check_memory_explains_other_answers():
    with pytest.raises(CheckFailed, match="return a dict"):
        checks.check_training_memory(lambda n, bytes_per_number=4: 16 * n)
    with pytest.raises(CheckFailed, match="lacks the key.*'optimizer'"):
        checks.check_training_memory(
            lambda n, bytes_per_number=4: {"weights": 1, "gradients": 1, "total": 2}
        )
    with pytest.raises(CheckFailed, match="should be the sum of the other three"):
        checks.check_training_memory(
            lambda n, bytes_per_number=4: {**right_memory(n, bytes_per_number), "total": 0}
        )
    with pytest.raises(CheckFailed, match="converted to MiB or GiB"):
        checks.check_training_memory(
            lambda n, bytes_per_number=4: {
                k: v / 2**20 for k, v in right_memory(n, bytes_per_number).items()
            }
        )
    with pytest.raises(CheckFailed, match="should be a number of bytes"):
        checks.check_training_memory(
            lambda n, bytes_per_number=4: {k: "1 GB" for k in right_memory(n)}
        )
    with pytest.raises(CheckFailed, match="Keep the signature"):
        checks.check_training_memory(lambda n: right_memory(n))


def _one_adamw_step():
    torch.manual_seed(0)
    model = GPT2(GPT2Config(vocab_size=40, n_positions=8, n_embd=16, n_layer=1, n_head=2))
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    model(torch.tensor([[1, 2, 3]])).sum().backward()
    optimizer.step()
    n = count(model)
    return model, optimizer, {"weights": 4 * n, "gradients": 4 * n, "optimizer": 8 * n}


def test_check_memory_checks_the_measured_bytes_and_names_the_mistakes(capsys):
    model, optimizer, right = _one_adamw_step()
    checks.check_training_memory(right_memory, right, model, optimizer)
    assert "✅ Exercise 6.6" in capsys.readouterr().out
    steps = sum(s["step"].numel() * s["step"].element_size() for s in optimizer.state.values())
    for wrong, phrase in [
        ({**right, "optimizer": right["optimizer"] + steps}, "`step` counters"),
        ({**right, "weights": count(model)}, "counts numbers, not bytes"),
        ({**right, "gradients": 0}, r"measured\['gradients'\] is 0 bytes"),
        ({"weights": 1}, "should be a dict with the keys"),
    ]:
        with pytest.raises(CheckFailed, match=phrase):
            checks.check_training_memory(right_memory, wrong, model, optimizer)


def test_adamw_keeps_two_states_per_parameter_as_the_exercise_says():
    torch.manual_seed(0)
    model = GPT2(GPT2Config(vocab_size=40, n_positions=8, n_embd=16, n_layer=1, n_head=2))
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    model(torch.tensor([[1, 2, 3]])).sum().backward()
    optimizer.step()
    n = count(model)
    state = sum(
        t.numel() * t.element_size()
        for s in optimizer.state.values()
        for k, t in s.items()
        if k != "step"
    )
    grads = sum(p.grad.numel() * p.grad.element_size() for p in model.parameters())
    assert right_memory(n) == {
        "weights": 4 * n,
        "gradients": grads,
        "optimizer": state,
        "total": 16 * n,
    }


@pytest.mark.parametrize("dtype", [torch.int8, torch.int16, torch.uint8, torch.int32])
@pytest.mark.parametrize("entry", ["generate", "run_with_cache"])
def test_any_integer_dtype_of_ids_gives_the_same_result_at_the_entry_points(dtype, entry):
    # One validator (chapter 2's check_token_ids) accepts every integer dtype; the entry points
    # convert with idx.long() before the lookup (the plain forward does not: it takes the int64
    # or int32 ids nn.Embedding takes), so small int types are not a crash inside nn.Embedding.
    from gpt2lib.generation import generate
    from gpt2lib.inspection import run_with_cache

    torch.manual_seed(0)
    model = GPT2(GPT2Config(n_layer=1, n_embd=8, n_head=2, vocab_size=50, n_positions=8)).eval()
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


def test_a_plain_forward_refuses_small_integer_ids_loudly():
    # no silent wrong answer: nn.Embedding names the dtypes it takes
    model = GPT2(GPT2Config(n_layer=1, n_embd=8, n_head=2, vocab_size=50, n_positions=8)).eval()
    with pytest.raises((RuntimeError, IndexError)):
        model(torch.tensor([[1, 7, 3]], dtype=torch.int8))


# --------------------------------------------------------------------------- challenge


def test_budget_challenge_passes_a_fitting_config_and_names_the_others(capsys):
    assert checks.check_budget_config(GPT2Config(n_layer=8, n_embd=512, n_head=8)) >= 50_000_000
    assert "✅ Challenge" in capsys.readouterr().out
    cases = [
        (GPT2Config(), "more than 1 GiB"),
        (GPT2Config(n_layer=8, n_embd=256, n_head=8), "there is room for more"),
        (GPT2Config(n_layer=4, n_embd=512, n_head=8), "at least 8 blocks"),
        (GPT2Config(n_layer=8, n_embd=512, n_head=8, vocab_size=1000), "keep GPT-2's vocab_size"),
        ({"n_layer": 8}, "give a GPT2Config"),
    ]
    for config, phrase in cases:
        with pytest.raises(CheckFailed, match=phrase):
            checks.check_budget_config(config)


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


# --------------------------------------------------------------------------- Exercise 6.6


# --------------------------------------------------------------------------- Exercise 6.8


def forward_reference(model, idx):
    x = model.drop(model.wte(idx) + model.wpe(torch.arange(idx.shape[1])))
    for block in model.h:
        x = block(x)
    return model.ln_f(x) @ model.wte.weight.T


def test_forward_check_accepts_right_answers(capsys):
    checks.check_forward_by_hand(forward_reference)
    checks.check_forward_by_hand(lambda model, idx: model(idx))
    assert capsys.readouterr().out.count("✅ Exercise 6.8") == 2


@pytest.mark.parametrize("check, mistake", planted(checks.MISTAKES_BY_CHECK))
def test_forward_check_names_every_planted_mistake(check, mistake):
    assert_named(check, mistake.fn, mistake.message)


def test_the_notebooks_buggy_forward_is_named_with_both_bugs():
    def buggy_forward(model, idx):
        x = model.drop(model.wte(idx) + model.wpe(torch.arange(1, idx.shape[1] + 1)))
        for block in model.h:
            x = x + block(x)
        return model.ln_f(x) @ model.wte.weight.T

    assert_named(checks.check_forward_by_hand, buggy_forward, "both planted bugs are still there")


def test_forward_check_names_a_position_past_the_table_and_a_wrong_return():
    def positions_from_one_only_at_the_end(model, idx):
        if idx.shape[1] == model.config.n_positions:
            model.wpe(torch.arange(1, idx.shape[1] + 1))
        return forward_reference(model, idx)

    with pytest.raises(CheckFailed, match="reads a position the table does not have"):
        checks.check_forward_by_hand(positions_from_one_only_at_the_end)
    with pytest.raises(CheckFailed, match="should be a torch.Tensor"):
        checks.check_forward_by_hand(lambda model, idx: None)
