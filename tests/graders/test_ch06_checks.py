"""Chapter 6's checks (gpt2lib.course.checks.model): right answers in any style pass, every planted mistake is named."""

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


def count(module):
    return sum(p.numel() for p in module.parameters())


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
