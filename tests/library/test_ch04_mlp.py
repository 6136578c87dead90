"""Chapter 4's modules: gelu_tanh and MLP. The checks of its exercises are tested in
tests/graders/test_ch04_checks.py."""

from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F

from gpt2lib.chapters.config import GPT2Config
from gpt2lib.chapters.layers import Conv1D
from gpt2lib.chapters.mlp import MLP, gelu_tanh

# --------------------------------------------------------------------------- gelu_tanh


def test_gelu_tanh_equals_the_formula_computed_with_math():
    points = [-7.5, -2.7, -1.0, -0.3, 0.0, 0.3, 1.0, 2.7, 7.5]
    want = [
        0.5 * v * (1 + math.tanh(math.sqrt(2 / math.pi) * (v + 0.044715 * v**3))) for v in points
    ]
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


def test_gelu_tanh_fails_loudly_on_non_tensors():
    # the lesson's function has no type check of its own: torch refuses a float in torch.tanh
    with pytest.raises((TypeError, AttributeError)):
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


def test_mlp_computes_c_proj_of_gelu_tanh_of_c_fc(tiny_config):
    torch.manual_seed(0)
    mlp = MLP(tiny_config()).eval()
    x = torch.randn(2, 5, 16)
    with torch.no_grad():
        want = gelu_tanh(x @ mlp.c_fc.weight + mlp.c_fc.bias) @ mlp.c_proj.weight + mlp.c_proj.bias
        assert torch.allclose(mlp(x), want, atol=1e-6)


def test_mlp_works_position_by_position(tiny_config):
    torch.manual_seed(0)
    mlp = MLP(tiny_config()).eval()
    x = torch.randn(3, 7, 16)
    with torch.no_grad():
        whole = mlp(x)
        one_at_a_time = torch.stack([mlp(x[:, t : t + 1])[:, 0] for t in range(7)], dim=1)
        assert torch.allclose(whole, one_at_a_time, atol=1e-6)
        order = torch.randperm(7)
        assert torch.allclose(mlp(x[:, order]), whole[:, order], atol=1e-6)


def test_mlp_dropout_only_in_training(tiny_config):
    torch.manual_seed(0)
    mlp = MLP(tiny_config(pdrop=0.5))
    x = torch.randn(4, 16, 16)
    with torch.no_grad():
        mlp.eval()
        assert torch.equal(mlp(x), mlp(x))
        mlp.train()
        zeros = (mlp(x) == 0).float().mean().item()
    assert 0.35 < zeros < 0.65


def test_mlp_fails_loudly_on_the_wrong_width(tiny_config):
    # no check of its own on every forward: the matrix product in c_fc names both shapes
    mlp = MLP(tiny_config())
    with pytest.raises(RuntimeError, match=r"cannot be multiplied|size mismatch|shapes"):
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
