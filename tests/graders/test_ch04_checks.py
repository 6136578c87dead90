"""Chapter 4's checks (gpt2lib.course.checks.mlp): right answers in any style pass, every planted mistake is named."""

from __future__ import annotations

import math
import re

import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F

from gpt2lib.chapters.layers import Conv1D
from gpt2lib.chapters.mlp import MLP, gelu_tanh
from gpt2lib.course.checks import CheckFailed
from gpt2lib.course.checks import mlp as checks

# --------------------------------------------------------------------------- Exercise 4.1


def right_moved(f, x, position):
    edited = x.clone()
    edited[:, position] += 1.0
    return (f(edited) - f(x)).abs().sum(dim=-1) > 0


def test_check_outputs_that_change_passes_correct_answers_in_any_style(capsys):
    checks.check_outputs_that_change(right_moved)

    def with_ne_and_any(f, x, position):  # a list result, another way to say "moved at all"
        edited = torch.cat(
            [x[:, :position], x[:, position : position + 1] + 1, x[:, position + 1 :]], 1
        )
        return (f(edited) != f(x)).any(dim=-1).tolist()

    checks.check_outputs_that_change(with_ne_and_any)
    assert capsys.readouterr().out.count("✅ Exercise 4.1") == 2


def test_outputs_that_change_tells_the_mlp_from_attention(tiny_config):
    from gpt2lib.chapters.attention import CausalSelfAttention

    torch.manual_seed(0)
    mlp = MLP(tiny_config()).eval()
    attn = CausalSelfAttention(tiny_config()).eval()
    x = torch.randn(2, 4, 16)
    with torch.no_grad():
        assert right_moved(mlp, x, 1).tolist() == [[False, True, False, False]] * 2
        assert right_moved(attn, x, 1).tolist() == [[False, True, True, True]] * 2


@pytest.mark.parametrize("mistake", checks.MOVED_MISTAKES, ids=lambda m: m.name)
def test_check_outputs_that_change_names_each_planted_mistake(mistake):
    with pytest.raises(CheckFailed, match=re.escape(mistake.message)):
        checks.check_outputs_that_change(mistake.fn)


def test_check_outputs_that_change_explains_other_wrong_answers():
    with pytest.raises(CheckFailed, match="expected"):
        checks.check_outputs_that_change(
            lambda f, x, position: torch.zeros(x.shape[:2], dtype=torch.bool)
        )
    with pytest.raises(CheckFailed, match="shape"):
        checks.check_outputs_that_change(lambda f, x, position: torch.ones(3))


# --------------------------------------------------------------------------- Exercise 4.2


def right_merge(W1, b1, W2, b2):
    return W1 @ W2, b1 @ W2 + b2


def test_check_merge_passes_correct_answers_in_any_style(capsys):
    checks.check_merge_linear_layers(right_merge)
    checks.check_merge_linear_layers(
        lambda W1, b1, W2, b2: (
            torch.einsum("ch,hd->cd", W1, W2).double(),
            torch.addmv(b2, W2.T, b1),
        )
    )
    checks.check_merge_linear_layers(lambda W1, b1, W2, b2: [W1 @ W2, (b1[None] @ W2)[0] + b2])
    assert capsys.readouterr().out.count("✅ Exercise 4.2") == 3


def test_a_merge_is_really_one_layer():
    torch.manual_seed(0)
    fc, proj = Conv1D(4, 16), Conv1D(16, 4)
    W, b = right_merge(fc.weight, fc.bias, proj.weight, proj.bias)
    x = torch.randn(2, 3, 4)
    assert torch.allclose(x @ W + b, proj(fc(x)), atol=1e-5)


@pytest.mark.parametrize("mistake", checks.MERGE_MISTAKES, ids=lambda m: m.name)
def test_check_merge_names_each_planted_mistake(mistake):
    with pytest.raises(CheckFailed, match=re.escape(mistake.message)):
        checks.check_merge_linear_layers(mistake.fn)


def test_check_merge_explains_the_form_of_the_answer():
    with pytest.raises(CheckFailed, match=r"return two tensors, \(W, b\)"):
        checks.check_merge_linear_layers(lambda W1, b1, W2, b2: W1 @ W2)
    with pytest.raises(CheckFailed, match="should be a torch.Tensor"):
        checks.check_merge_linear_layers(lambda W1, b1, W2, b2: ((W1 @ W2).tolist(), b2))
    with pytest.raises(CheckFailed, match="your b is wrong"):
        checks.check_merge_linear_layers(lambda W1, b1, W2, b2: (W1 @ W2, 2 * b2))
    with pytest.raises(CheckFailed, match="Keep the signature"):
        checks.check_merge_linear_layers(lambda W1, W2: None)


# --------------------------------------------------------------------------- Exercise 4.3


def right_fit(x, y, W1, b1, activation=lambda h: F.gelu(h, approximate="tanh"), driver=None):
    hidden = activation(x @ W1 + b1)
    W2 = torch.linalg.lstsq(hidden, y, driver=driver).solution
    return ((hidden @ W2 - y) ** 2).mean().item()


def test_check_fit_passes_correct_answers_in_any_style(capsys):
    checks.check_best_fit_error(right_fit)

    def with_pinv(x, y, W1, b1, activation=None):  # another solver, a tensor result
        hidden = activation(x @ W1 + b1)
        return F.mse_loss(hidden @ torch.linalg.pinv(hidden) @ y, y)

    checks.check_best_fit_error(with_pinv)
    assert capsys.readouterr().out.count("✅ Exercise 4.3") == 2


@pytest.mark.parametrize("mistake", checks.FIT_MISTAKES, ids=lambda m: m.name)
def test_check_fit_names_each_planted_mistake(mistake):
    def planted(x, y, W1, b1, activation=None):
        return mistake.fn(x, y, W1, b1, activation)

    with pytest.raises(CheckFailed, match=re.escape(mistake.message)):
        checks.check_best_fit_error(planted)


def test_check_fit_explains_other_answers():
    with pytest.raises(CheckFailed, match="return the error as one number"):
        checks.check_best_fit_error(lambda x, y, W1, b1, activation=None: "small")
    with pytest.raises(CheckFailed, match="the best fit's mean squared error is"):
        checks.check_best_fit_error(
            lambda x, y, W1, b1, activation=None: 1.5 * right_fit(x, y, W1, b1, activation)
        )


def test_a_wider_hidden_layer_fits_better_only_with_an_activation():
    x = torch.linspace(-3, 3, 256, dtype=torch.float64)[:, None]
    y = torch.sin(3 * x) + 0.5 * x
    gen = torch.Generator().manual_seed(0)
    errors, linear = [], []
    for H in (4, 16, 64):
        W1 = torch.randn(1, H, generator=gen, dtype=torch.float64) * 2
        b1 = torch.randn(H, generator=gen, dtype=torch.float64) * 3
        # gelsd (by SVD): 64 GELU columns are nearly dependent, and the default solver's
        # cut-off then varies with the thread count (an H=64 error of 9e-17 on 1 thread,
        # 2e-5 on 2, 3e-4 once in CI); the SVD solver gives the true least-squares error.
        errors.append(right_fit(x, y, W1, b1, driver="gelsd"))
        linear.append(right_fit(x, y, W1, b1, activation=lambda h: h, driver="gelsd"))
    assert errors[0] > errors[1] > errors[2]
    assert linear[0] == pytest.approx(linear[2], rel=1e-6)


# --------------------------------------------------------------------------- Exercise 4.4: gelu_tanh


def test_check_gelu_tanh_passes_the_reference_and_other_correct_answers(capsys):
    checks.check_gelu_tanh(gelu_tanh)
    checks.check_gelu_tanh(
        lambda x: x * torch.sigmoid(2 * math.sqrt(2 / math.pi) * (x + 0.044715 * x * x * x))
    )
    assert capsys.readouterr().out.count("✅ Exercise 4.4 (gelu_tanh) passed") == 2


@pytest.mark.parametrize("mistake", checks.GELU_MISTAKES, ids=lambda m: m.name)
def test_check_gelu_tanh_names_each_planted_mistake(mistake):
    with pytest.raises(CheckFailed, match=re.escape(mistake.message)):
        checks.check_gelu_tanh(mistake.fn)


def test_check_gelu_tanh_names_unknown_constants():
    with pytest.raises(CheckFailed, match="wrong value at x"):
        checks.check_gelu_tanh(lambda x: gelu_tanh(x) + 1e-3 * x)


def test_check_gelu_tanh_catches_in_place_changes_shapes_types_and_stubs():
    def in_place(x):
        y = gelu_tanh(x.clone())
        x.pow_(3)  # the classic slip: pow_ instead of pow
        return y

    with pytest.raises(CheckFailed, match="changed its input tensor in place"):
        checks.check_gelu_tanh(in_place)
    with pytest.raises(CheckFailed, match="keep the input's shape"):
        checks.check_gelu_tanh(lambda x: gelu_tanh(x).flatten())
    with pytest.raises(CheckFailed, match="should be a torch.Tensor"):
        checks.check_gelu_tanh(lambda x: gelu_tanh(x).tolist())
    with pytest.raises(CheckFailed, match="float32 input should give a float32 output"):
        checks.check_gelu_tanh(lambda x: gelu_tanh(x.double()))
    with pytest.raises(CheckFailed, match="contains NaN"):
        checks.check_gelu_tanh(lambda x: gelu_tanh(x) / (x != 0))

    def stub(x):
        raise NotImplementedError("Exercise 4.4: replace this line with your code")

    with pytest.raises(CheckFailed, match="not done yet"):
        checks.check_gelu_tanh(stub)
    with pytest.raises(CheckFailed, match="Keep the signature"):
        checks.check_gelu_tanh(lambda x, approximate: gelu_tanh(x))


def test_check_gelu_tanh_explains_math_functions_on_tensors():
    def with_math_tanh(x):
        return 0.5 * x * (1 + math.tanh(math.sqrt(2 / math.pi) * (x + 0.044715 * x**3)))

    with pytest.raises(CheckFailed, match="Use torch.tanh for the tensor"):
        checks.check_gelu_tanh(with_math_tanh)


# The planted mistake: 4.4 says F.gelu is not allowed, and the check must refuse it.
@pytest.mark.parametrize(
    "forbidden",
    [
        lambda x: F.gelu(x, approximate="tanh"),
        lambda x: nn.GELU(approximate="tanh")(x),
        lambda x: F.gelu(x),
    ],
    ids=["F.gelu tanh", "nn.GELU tanh", "F.gelu erf"],
)
def test_check_gelu_tanh_refuses_f_gelu(forbidden):
    with pytest.raises(
        CheckFailed, match=r"calls torch\.nn\.functional\.gelu, which is not allowed"
    ):
        checks.check_gelu_tanh(forbidden)


def test_check_gelu_erf_refuses_f_gelu():
    with pytest.raises(
        CheckFailed, match=r"calls torch\.nn\.functional\.gelu, which is not allowed"
    ):
        checks.check_gelu_erf(lambda x: F.gelu(x))
    with pytest.raises(CheckFailed, match="not allowed"):
        checks.check_gelu_erf(lambda x: nn.GELU()(x))


def test_check_gelu_tanh_tries_a_second_shape_and_leaves_float32_input_unchanged():
    def in_place_float32(x):
        y = gelu_tanh(x.clone())
        if x.dtype == torch.float32:
            x.mul_(2)
        return y

    with pytest.raises(CheckFailed, match="float32 input in place"):
        checks.check_gelu_tanh(in_place_float32)
    with pytest.raises(CheckFailed, match=r"\(4, 4\) input should give a \(4, 4\) output"):
        checks.check_gelu_tanh(
            lambda x: gelu_tanh(x) if x.dtype == torch.float64 else gelu_tanh(x).flatten()
        )


# --------------------------------------------------------------------------- Exercise 4.6: MLP


class GoodMLP(nn.Module):
    """A correct answer; subclasses replace `compute` to plant one mistake."""

    hidden_factor, layer, dropout_where = 4, Conv1D, "output"

    def __init__(self, config):
        super().__init__()
        C, H = config.n_embd, self.hidden_factor * config.n_embd
        self.c_fc = self.layer(C, H)
        self.c_proj = self.layer(H, C)
        self.p = config.resid_pdrop
        self.dropout = nn.Dropout(0.1 if self.dropout_where == "fixed" else config.resid_pdrop)

    def compute(self, x):
        return self.c_proj(F.gelu(self.c_fc(x), approximate="tanh"))

    def forward(self, x):
        if self.dropout_where == "hidden":
            return self.c_proj(F.gelu(self.dropout(self.c_fc(x)), approximate="tanh"))
        y = self.compute(x)
        if self.dropout_where in ("output", "fixed"):
            y = self.dropout(y)
        elif self.dropout_where == "always":
            y = F.dropout(y, self.p)
        return y


def planted(**attributes):
    return type("PlantedMLP", (GoodMLP,), attributes)


class LinearMLP(nn.Module):
    """A correct MLP from torch's own layers: nn.Linear, nn.GELU, nn.Dropout, and .view reshapes
    done right (reshape)."""

    def __init__(self, config):
        super().__init__()
        self.c_fc = nn.Linear(config.n_embd, 4 * config.n_embd)
        self.c_proj = nn.Linear(4 * config.n_embd, config.n_embd)
        self.act = nn.GELU(approximate="tanh")
        self.drop = nn.Dropout(config.resid_pdrop)

    def forward(self, x):
        B, T, C = x.shape
        flat = x.reshape(B * T, C)
        return self.drop(self.c_proj(self.act(self.c_fc(flat)))).reshape(B, T, C)


class SubclassedConv1D(Conv1D):
    pass


def test_check_mlp_passes_the_reference_and_other_correct_answers(capsys):
    checks.check_mlp(MLP)
    checks.check_mlp(GoodMLP)
    checks.check_mlp(planted(compute=lambda self, x: self.c_proj(gelu_tanh(self.c_fc(x)))))
    checks.check_mlp(planted(layer=SubclassedConv1D))
    checks.check_mlp(LinearMLP)
    out = capsys.readouterr().out
    assert out.count("✅ Exercise 4.6 (MLP) passed") == 5
    assert "nn.Linear, which store weights [out, in]" in out  # the note for LinearMLP


@pytest.mark.parametrize("mistake", checks.MLP_MISTAKES, ids=lambda m: m.name)
def test_check_mlp_names_each_planted_mistake(mistake):
    with pytest.raises(CheckFailed, match=re.escape(mistake.message)):
        checks.check_mlp(planted(compute=lambda self, x: mistake.fn(self, x)))


@pytest.mark.parametrize(
    "attributes, phrase",
    [
        (dict(hidden_factor=1), r"maps 8 to 32 numbers.*4x expansion"),
        (dict(hidden_factor=2), r"maps 8 to 32 numbers"),
        (dict(dropout_where="none"), "no dropout in training mode"),
        (dict(dropout_where="always"), "dropout is still on"),
        (dict(dropout_where="hidden"), "about half of the outputs should be dropped"),
        (dict(dropout_where="fixed"), "not with a fixed rate"),
    ],
)
def test_check_mlp_names_structural_mistakes(attributes, phrase):
    with pytest.raises(CheckFailed, match=phrase):
        checks.check_mlp(planted(**attributes))


def test_check_mlp_names_a_view_of_a_non_contiguous_input():
    class Viewing(GoodMLP):
        def compute(self, x):
            B, T, C = x.shape
            return super().compute(x.view(B * T, C)).view(B, T, C)

    with pytest.raises(CheckFailed, match="non-contiguous input.*Use .reshape instead of .view"):
        checks.check_mlp(Viewing)


def test_check_mlp_names_a_weight_stored_the_wrong_way_round():
    class Transposed(GoodMLP):
        def __init__(self, config):
            super().__init__(config)
            self.c_fc.weight = nn.Parameter(self.c_fc.weight.T.clone())

        def compute(self, x):
            return self.c_proj(gelu_tanh(x @ self.c_fc.weight.T + self.c_fc.bias))

    with pytest.raises(CheckFailed, match=r"stored \[out, in\] but used as"):
        checks.check_mlp(Transposed)


def test_check_mlp_explains_stubs_names_signatures_and_non_modules():
    class Stub(nn.Module):
        def __init__(self, config):
            super().__init__()
            raise NotImplementedError("Exercise 4.4: replace this line with your code")

    with pytest.raises(CheckFailed, match="not done yet"):
        checks.check_mlp(Stub)
    with pytest.raises(CheckFailed, match=r"c_proj must bring the 4·n_embd hidden values back"):
        checks.check_mlp(planted(compute=lambda self, x: F.gelu(self.c_fc(x))))
    with pytest.raises(CheckFailed, match=r"not c_proj\(gelu_tanh\(c_fc\(x\)\)\)"):
        checks.check_mlp(planted(compute=lambda self, x: 2 * GoodMLP.compute(self, x)))
    with pytest.raises(CheckFailed, match="should make an nn.Module"):
        checks.check_mlp(lambda config: "an MLP")
    with pytest.raises(CheckFailed, match="Keep the signature"):
        checks.check_mlp(lambda: None)

    class Renamed(GoodMLP):
        def __init__(self, config):
            super().__init__(config)
            self.fc = self.c_fc
            del self.c_fc

    with pytest.raises(CheckFailed, match="no layer called `c_fc`"):
        checks.check_mlp(Renamed)

    class WrongForward(GoodMLP):
        def forward(self, x, mask):
            return super().forward(x)

    with pytest.raises(CheckFailed, match="Keep the signature"):
        checks.check_mlp(WrongForward)


# --------------------------------------------------------------------------- challenge


def test_fit_challenge_passes_a_designed_layer_and_refuses_random_or_wide_ones(capsys):
    centres = torch.linspace(-3, 3, 8, dtype=torch.float64)
    assert checks.check_fit_challenge(torch.ones(1, 8, dtype=torch.float64), -centres) < 0.01
    assert "✅ Challenge" in capsys.readouterr().out
    gen = torch.Generator().manual_seed(0)
    W1 = torch.randn(1, 8, generator=gen, dtype=torch.float64) * 2.0
    b1 = torch.randn(8, generator=gen, dtype=torch.float64) * 3.0
    with pytest.raises(CheckFailed, match="the goal is below 0.01"):
        checks.check_fit_challenge(W1, b1)
    with pytest.raises(CheckFailed, match="at most 8"):
        checks.check_fit_challenge(torch.ones(1, 16), torch.zeros(16))
    with pytest.raises(CheckFailed, match=r"W1 should be \(1, H\)"):
        checks.check_fit_challenge(torch.ones(8), torch.zeros(8))
    with pytest.raises(CheckFailed, match="NaN"):
        checks.check_fit_challenge(torch.full((1, 8), float("nan")), torch.zeros(8))


@pytest.mark.parametrize("mistake", checks.GELU_ERF_MISTAKES, ids=lambda m: m.name)
def test_check_gelu_erf_names_each_planted_mistake(mistake):
    with pytest.raises(CheckFailed) as info:
        checks.check_gelu_erf(mistake.fn)
    assert mistake.message in str(info.value)


def test_check_gelu_erf_passes_right_answers_and_names_in_place_and_dtype(capsys):
    from gpt2lib.chapters.mlp import gelu_erf

    checks.check_gelu_erf(gelu_erf)
    checks.check_gelu_erf(lambda x: 0.5 * x * torch.erfc(-x / math.sqrt(2)))
    assert capsys.readouterr().out.count("✅ Exercise 4.4 (gelu_erf)") == 2

    def in_place(x):
        return x.mul_(0.5 * (1 + torch.erf(x / math.sqrt(2))))

    with pytest.raises(CheckFailed, match="in place"):
        checks.check_gelu_erf(in_place)
    with pytest.raises(CheckFailed, match="should give a torch.float32 tensor"):
        checks.check_gelu_erf(
            lambda x: 0.5 * x.double() * (1 + torch.erf(x.double() / math.sqrt(2)))
        )


# --------------------------------------------------------------------------- Exercise 4.5: gaps


def _gaps_with_modules(fc, proj, x):
    import copy

    with torch.no_grad():
        h = fc(x)
        out_tanh, out_erf = proj(F.gelu(h, approximate="tanh")), proj(F.gelu(h))
        fc64, proj64 = copy.deepcopy(fc).double(), copy.deepcopy(proj).double()
        exact = proj64(F.gelu(fc64(x.double()), approximate="tanh"))
    return (out_tanh - out_erf).abs().max().item(), (out_tanh.double() - exact).abs().max().item()


def _gaps_from_weights(fc, proj, x):  # the chapter's own gelu_tanh/gelu_erf, tensors returned
    from gpt2lib.chapters.mlp import gelu_erf

    W1, b1, W2, b2 = (t.detach() for t in (fc.weight, fc.bias, proj.weight, proj.bias))
    h = x @ W1 + b1
    out_tanh, out_erf = gelu_tanh(h) @ W2 + b2, gelu_erf(h) @ W2 + b2
    exact = gelu_tanh(x.double() @ W1.double() + b1.double()) @ W2.double() + b2.double()
    return (out_tanh - out_erf).abs().max(), (out_tanh.double() - exact).abs().max()


def test_check_approximation_gaps_passes_right_answers_in_any_style(capsys):
    checks.check_approximation_gaps(_gaps_with_modules)
    checks.check_approximation_gaps(_gaps_from_weights)
    assert capsys.readouterr().out.count("✅ Exercise 4.5 (approximation_gaps) passed") == 2


@pytest.mark.parametrize("mistake", checks.GAPS_MISTAKES, ids=lambda m: m.name)
def test_check_approximation_gaps_names_each_planted_mistake(mistake):
    with pytest.raises(CheckFailed) as info:
        checks.check_approximation_gaps(mistake.fn)
    assert mistake.message in str(info.value)


def test_check_approximation_gaps_names_changed_layers_stubs_and_other_answers():
    def converts_in_place(fc, proj, x):  # the trap: Module.double() converts the module itself
        with torch.no_grad():
            out_tanh = proj(F.gelu(fc(x), approximate="tanh"))
            out_erf = proj(F.gelu(fc(x)))
            exact = proj.double()(F.gelu(fc.double()(x.double()), approximate="tanh"))
        return (out_tanh - out_erf).abs().max().item(), (
            out_tanh.double() - exact
        ).abs().max().item()

    with pytest.raises(CheckFailed, match="IN PLACE"):
        checks.check_approximation_gaps(converts_in_place)
    with pytest.raises(CheckFailed, match="return two numbers"):
        checks.check_approximation_gaps(lambda fc, proj, x: 0.1)
    with pytest.raises(CheckFailed, match=r"the gaps are about .* you return 1 and 1"):
        checks.check_approximation_gaps(lambda fc, proj, x: (1.0, 1.0))
    with pytest.raises(CheckFailed, match="your first number is 0"):  # 0 with a wrong rounding gap
        checks.check_approximation_gaps(lambda fc, proj, x: (0.0, 1.0))

    def stub(fc, proj, x):
        raise NotImplementedError("Exercise 4.5: replace this line with your code")

    from gpt2lib.course.checks._core import NotDoneYet

    with pytest.raises(NotDoneYet, match="not done yet"):
        checks.check_approximation_gaps(stub)


def test_the_erf_gelu_moves_a_scaled_up_mlp_far_more_than_float32_rounding():
    torch.manual_seed(0)
    fc, proj = Conv1D(768, 3072), Conv1D(3072, 768)
    with torch.no_grad():
        fc.weight.normal_(std=0.07)
        proj.weight.normal_(std=0.02)
    gap_activation, gap_rounding = _gaps_with_modules(fc, proj, torch.randn(1, 16, 768))
    assert gap_activation > 100 * gap_rounding and gap_activation > 1e-5  # the chapter's claim
