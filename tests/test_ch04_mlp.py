"""Chapter 4: gelu_tanh and MLP in gpt2lib.mlp, and the checks of the chapter's exercises."""

from __future__ import annotations

import math

import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F

from gpt2lib.attention import Conv1D
from gpt2lib.checks import CheckFailed
from gpt2lib.checks import mlp as checks
from gpt2lib.config import GPT2Config
from gpt2lib.mlp import MLP, gelu_tanh


def small_config(pdrop: float = 0.0, n_embd: int = 8) -> GPT2Config:
    return GPT2Config(n_embd=n_embd, n_head=2, n_layer=1, n_positions=16, vocab_size=11,
                      embd_pdrop=pdrop, attn_pdrop=pdrop, resid_pdrop=pdrop)


# --------------------------------------------------------------------------- gelu_tanh


def test_gelu_tanh_equals_the_formula_computed_with_math():
    points = [-7.5, -2.7, -1.0, -0.3, 0.0, 0.3, 1.0, 2.7, 7.5]
    want = [0.5 * v * (1 + math.tanh(math.sqrt(2 / math.pi) * (v + 0.044715 * v**3)))
            for v in points]
    got = gelu_tanh(torch.tensor(points, dtype=torch.float64))
    assert got.tolist() == pytest.approx(want, abs=1e-12)
    assert gelu_tanh(torch.tensor(1.0)).item() == pytest.approx(0.8411920, abs=1e-6)


def test_gelu_tanh_keeps_shape_and_dtype_and_leaves_input_alone():
    x = torch.randn(2, 3, 4)
    before = x.clone()
    y = gelu_tanh(x)
    assert y.shape == x.shape and y.dtype == torch.float32
    assert torch.equal(x, before)
    assert torch.allclose(y, F.gelu(x, approximate="tanh"), atol=1e-6)


def test_gelu_tanh_is_not_the_erf_gelu():
    xs = torch.linspace(-6, 6, 1201, dtype=torch.float64)
    gap = (gelu_tanh(xs) - F.gelu(xs)).abs()
    assert 4e-4 < gap.max().item() < 5e-4
    assert abs(abs(xs[gap.argmax()].item()) - 2.7) < 0.05


def test_gelu_tanh_rejects_non_tensors():
    with pytest.raises(TypeError, match="expects a torch.Tensor, got float"):
        gelu_tanh(1.0)


# --------------------------------------------------------------------------- MLP


def test_mlp_has_gpt2_names_shapes_and_parameter_count():
    mlp = MLP(GPT2Config())
    shapes = {k: tuple(v.shape) for k, v in mlp.state_dict().items()}
    assert shapes == {
        "c_fc.weight": (768, 3072),
        "c_fc.bias": (3072,),
        "c_proj.weight": (3072, 768),
        "c_proj.bias": (768,),
    }
    assert sum(p.numel() for p in mlp.parameters()) == 4_722_432
    assert isinstance(mlp.c_fc, Conv1D) and isinstance(mlp.c_proj, Conv1D)


def test_mlp_computes_c_proj_of_gelu_tanh_of_c_fc():
    torch.manual_seed(0)
    mlp = MLP(small_config()).eval()
    x = torch.randn(2, 5, 8)
    with torch.no_grad():
        want = (gelu_tanh(x @ mlp.c_fc.weight + mlp.c_fc.bias) @ mlp.c_proj.weight
                + mlp.c_proj.bias)
        assert torch.allclose(mlp(x), want, atol=1e-6)


def test_mlp_works_position_by_position():
    torch.manual_seed(0)
    mlp = MLP(small_config()).eval()
    x = torch.randn(3, 7, 8)
    with torch.no_grad():
        whole = mlp(x)
        one_at_a_time = torch.stack([mlp(x[:, t : t + 1])[:, 0] for t in range(7)], dim=1)
        assert torch.allclose(whole, one_at_a_time, atol=1e-6)
        order = torch.randperm(7)
        assert torch.allclose(mlp(x[:, order]), whole[:, order], atol=1e-6)


def test_mlp_dropout_only_in_training():
    torch.manual_seed(0)
    mlp = MLP(small_config(pdrop=0.5))
    x = torch.randn(4, 16, 8)
    with torch.no_grad():
        mlp.eval()
        assert torch.equal(mlp(x), mlp(x))
        mlp.train()
        zeros = (mlp(x) == 0).float().mean().item()
    assert 0.35 < zeros < 0.65


def test_mlp_rejects_the_wrong_width():
    mlp = MLP(small_config())
    with pytest.raises(ValueError, match=r"last dimension is n_embd = 8, got shape \(2, 5, 6\)"):
        mlp(torch.randn(2, 5, 6))


@pytest.mark.slow
def test_mlp_matches_hugging_face_and_an_erf_gelu_does_not():
    from transformers import GPT2Config as HFConfig
    from transformers.models.gpt2.modeling_gpt2 import GPT2MLP

    torch.manual_seed(0)
    hf_config = HFConfig(n_embd=768, n_head=12, resid_pdrop=0.0)
    assert hf_config.activation_function == "gelu_new"  # GPT-2's tanh GELU
    theirs = GPT2MLP(4 * 768, hf_config).eval()
    with torch.no_grad():  # weights at the scale of a trained model
        theirs.c_fc.weight.normal_(std=0.07)
        theirs.c_fc.bias.normal_(std=0.1)
        theirs.c_proj.weight.normal_(std=0.02)
    ours = MLP(GPT2Config()).eval()
    ours.load_state_dict(theirs.state_dict())  # same names, same [in, out] layout
    x = torch.randn(2, 16, 768)
    with torch.no_grad():
        want = theirs(x)
        assert torch.allclose(ours(x), want, atol=1e-5)
        with_erf = ours.c_proj(F.gelu(ours.c_fc(x)))
        assert (with_erf - want).abs().max().item() > 1e-4


# --------------------------------------------------------------------------- check_gelu_tanh


def test_check_gelu_tanh_passes_the_reference_and_other_correct_answers(capsys):
    checks.check_gelu_tanh(gelu_tanh)
    checks.check_gelu_tanh(lambda x: F.gelu(x, approximate="tanh"))
    checks.check_gelu_tanh(
        lambda x: x * torch.sigmoid(2 * math.sqrt(2 / math.pi) * (x + 0.044715 * x * x * x))
    )
    assert capsys.readouterr().out.count("✅ Exercise 4.1 (gelu_tanh) passed") == 3


SQ = math.sqrt(2 / math.pi)

WRONG_GELUS = {
    "erf": (lambda x: F.gelu(x), "exact GELU"),
    "nn.GELU": (lambda x: nn.GELU()(x), "exact GELU"),
    "relu": (lambda x: torch.relu(x), "ReLU"),
    "no cubic": (lambda x: 0.5 * x * (1 + torch.tanh(SQ * x)), "0.044715·x³ term is missing"),
    "square": (lambda x: 0.5 * x * (1 + torch.tanh(SQ * (x + 0.044715 * x**2))), "must be cubic"),
    "2/pi": (lambda x: 0.5 * x * (1 + torch.tanh(2 / math.pi * (x + 0.044715 * x**3))), "not 2/π"),
    "no half": (lambda x: x * (1 + torch.tanh(SQ * (x + 0.044715 * x**3))), "factor 0.5"),
    "sigmoid": (lambda x: x * torch.sigmoid(1.702 * x), "sigmoid approximation"),
    "typo": (lambda x: 0.5 * x * (1 + torch.tanh(SQ * (x + 0.04715 * x**3))), "wrong value at x"),
}


@pytest.mark.parametrize("name", WRONG_GELUS)
def test_check_gelu_tanh_names_each_planted_mistake(name):
    wrong, phrase = WRONG_GELUS[name]
    with pytest.raises(CheckFailed, match=phrase):
        checks.check_gelu_tanh(wrong)


def test_check_gelu_tanh_catches_in_place_changes_shapes_types_and_stubs():
    def in_place(x):
        y = gelu_tanh(x.clone())
        x.pow_(3)  # the classic slip: pow_ instead of pow
        return y

    with pytest.raises(CheckFailed, match="changed its input tensor in place"):
        checks.check_gelu_tanh(in_place)
    with pytest.raises(CheckFailed, match="must have the input's shape"):
        checks.check_gelu_tanh(lambda x: gelu_tanh(x).flatten())
    with pytest.raises(CheckFailed, match="should return a torch.Tensor"):
        checks.check_gelu_tanh(lambda x: gelu_tanh(x).tolist())
    with pytest.raises(CheckFailed, match="float32 input should give a float32 output"):
        checks.check_gelu_tanh(lambda x: gelu_tanh(x.double()))

    def stub(x):
        raise NotImplementedError("Exercise 4.1: replace this line with your code")

    with pytest.raises(CheckFailed, match="not done yet"):
        checks.check_gelu_tanh(stub)
    with pytest.raises(CheckFailed, match="Keep the signature"):
        checks.check_gelu_tanh(lambda x, approximate: gelu_tanh(x))


# --------------------------------------------------------------------------- parameter count


def test_check_mlp_parameter_count_passes_a_correct_formula(capsys):
    checks.check_mlp_parameter_count(lambda n: 8 * n * n + 5 * n)

    def count_a_real_module(n_embd):
        with torch.device("meta"):  # shapes only, no memory
            mlp = MLP(GPT2Config(n_embd=n_embd, n_head=1))
        return sum(p.numel() for p in mlp.parameters())

    checks.check_mlp_parameter_count(count_a_real_module)
    assert capsys.readouterr().out.count("✅ Exercise 4.2") == 2


WRONG_COUNTS = {
    "no biases": (lambda n: 8 * n * n, "left out both biases"),
    "no c_proj bias": (lambda n: 8 * n * n + 4 * n, "bias of c_proj"),
    "no c_fc bias": (lambda n: 8 * n * n + n, "bias of c_fc"),
    "both biases 4n": (lambda n: 8 * n * n + 8 * n, "you gave both 4·n_embd"),
    "both biases n": (lambda n: 8 * n * n + 2 * n, "you gave both n_embd"),
    "no expansion": (lambda n: 2 * n * n + 2 * n, "no expansion"),
    "only c_fc": (lambda n: 4 * n * n + 4 * n, "counted only c_fc"),
    "only c_proj": (lambda n: 4 * n * n + n, "counted only c_proj"),
    "3x expansion": (lambda n: 6 * n * n + 4 * n, "expected 4,722,432 parameters"),
    "a string": (lambda n: "4722432", "should return an int"),
}


@pytest.mark.parametrize("name", WRONG_COUNTS)
def test_check_mlp_parameter_count_names_each_planted_mistake(name):
    wrong, phrase = WRONG_COUNTS[name]
    with pytest.raises(CheckFailed, match=phrase):
        checks.check_mlp_parameter_count(wrong)


# --------------------------------------------------------------------------- check_mlp


def make_mlp(activation=lambda h: F.gelu(h, approximate="tanh"), placement="between",
             hidden_factor=4, linear=False, names=("c_fc", "c_proj"), dropout="output"):
    """An MLP class with one planted mistake (or none, with the defaults)."""

    class PlantedMLP(nn.Module):
        def __init__(self, config):
            super().__init__()
            C, H = config.n_embd, hidden_factor * config.n_embd
            make = (lambda i, o: nn.Linear(i, o)) if linear else Conv1D
            setattr(self, names[0], make(C, H))
            setattr(self, names[1], make(H, C))
            self.p = config.resid_pdrop
            self.dropout = nn.Dropout(0.1 if dropout == "fixed" else config.resid_pdrop)

        def forward(self, x):
            fc, proj = getattr(self, names[0]), getattr(self, names[1])
            h = fc(x)
            if dropout == "hidden":
                h = self.dropout(h)
            if placement == "between":
                y = proj(activation(h))
            elif placement == "after":
                y = activation(proj(h))
            elif placement == "none":
                y = proj(h)
            elif placement == "twice":
                y = activation(proj(activation(h)))
            if dropout in ("output", "fixed"):
                y = self.dropout(y)
            elif dropout == "always":
                y = F.dropout(y, self.p)
            return y

    return PlantedMLP


def test_check_mlp_passes_the_reference_and_other_correct_answers(capsys):
    checks.check_mlp(MLP)
    checks.check_mlp(make_mlp())
    checks.check_mlp(make_mlp(activation=gelu_tanh))
    assert capsys.readouterr().out.count("✅ Exercise 4.3 (MLP) passed") == 3


WRONG_MLPS = {
    "erf gelu": (dict(activation=F.gelu), "exact GELU"),
    "relu": (dict(activation=torch.relu), "ReLU"),
    "no cubic": (dict(activation=lambda h: 0.5 * h * (1 + torch.tanh(SQ * h))),
                 "0.044715·x³ term is missing"),
    "activation after c_proj": (dict(placement="after"), "activation comes after c_proj"),
    "no activation": (dict(placement="none"), "no activation between c_fc and c_proj"),
    "activation twice": (dict(placement="twice"), "GELU is applied twice"),
    "no expansion": (dict(hidden_factor=1), r"should be \(8, 32\).*4x expansion"),
    "2x expansion": (dict(hidden_factor=2), r"should be \(8, 32\)"),
    "nn.Linear": (dict(linear=True), r"stored \[out, in\] like nn.Linear"),
    "wrong names": (dict(names=("fc", "proj")), "no layer called `c_fc`"),
    "no dropout": (dict(dropout="none"), "no dropout in training mode"),
    "dropout in eval": (dict(dropout="always"), "dropout is still on"),
    "dropout on hidden": (dict(dropout="hidden"), "about half of the outputs should be dropped"),
    "fixed dropout rate": (dict(dropout="fixed"), "not with a fixed rate"),
}


@pytest.mark.parametrize("name", WRONG_MLPS)
def test_check_mlp_names_each_planted_mistake(name):
    kwargs, phrase = WRONG_MLPS[name]
    with pytest.raises(CheckFailed, match=phrase):
        checks.check_mlp(make_mlp(**kwargs))


def test_check_mlp_explains_stubs_wrong_outputs_and_non_modules():
    class Stub(nn.Module):
        def __init__(self, config):
            super().__init__()
            raise NotImplementedError("Exercise 4.3: replace this line with your code")

    with pytest.raises(CheckFailed, match="not done yet"):
        checks.check_mlp(Stub)

    class Shrinks(make_mlp()):
        def forward(self, x):
            return super().forward(x)[..., :4]

    with pytest.raises(CheckFailed, match=r"must map \(B, T, n_embd\) to \(B, T, n_embd\)"):
        checks.check_mlp(Shrinks)

    class Scaled(make_mlp()):
        def forward(self, x):
            return 2 * super().forward(x)

    with pytest.raises(CheckFailed, match=r"not c_proj\(gelu_tanh\(c_fc\(x\)\)\)"):
        checks.check_mlp(Scaled)
    with pytest.raises(CheckFailed, match="should make an nn.Module"):
        checks.check_mlp(lambda config: "an MLP")
    with pytest.raises(CheckFailed, match="Keep the signature"):
        checks.check_mlp(lambda: None)


def test_check_gelu_tanh_explains_math_functions_on_tensors():
    def with_math_tanh(x):
        return 0.5 * x * (1 + math.tanh(math.sqrt(2 / math.pi) * (x + 0.044715 * x**3)))

    with pytest.raises(CheckFailed, match="Use torch.tanh for the tensor"):
        checks.check_gelu_tanh(with_math_tanh)
