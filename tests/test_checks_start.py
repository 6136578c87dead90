"""Chapter 0's warm-up check, and the shared toolkit's handling of learner code
(gpt2lib/course/checks/_core.py): passes right answers in any style, names each planted mistake."""

import pytest
import torch

from gpt2lib.course.checks import CheckFailed, NotDoneYet, call_learner
from gpt2lib.course.checks.start import SHAPE_MISTAKES, VALUE_MISTAKES, check_token_means


@pytest.mark.parametrize("right", [
    lambda x: x.mean(dim=-1),
    lambda x: x.sum(dim=2) / x.shape[-1],
    lambda x: x.double().mean(dim=-1),  # float64 answers are fine
    lambda x: torch.stack([torch.stack([row.mean() for row in b]) for b in x]),  # loops
], ids=["mean", "sum-over-C", "float64", "loops"])
def test_right_answers_pass(capsys, right):
    check_token_means(right)
    assert "✅" in capsys.readouterr().out


@pytest.mark.parametrize("mistake", SHAPE_MISTAKES + VALUE_MISTAKES, ids=lambda m: m.name)
def test_each_planted_mistake_is_named(mistake):
    with pytest.raises(CheckFailed) as info:
        check_token_means(mistake.fn)
    assert mistake.message in str(info.value)


@pytest.mark.parametrize("wrong, phrase", [
    (lambda x: x.mean(dim=-1) + 1, "values are not the means"),
    (lambda x: x.mean(dim=-1).tolist(), "return a tensor"),
    (lambda x: x.mean(dim=-1) * float("nan"), "contains NaN"),
])
def test_other_wrong_answers_are_explained(wrong, phrase):
    with pytest.raises(CheckFailed, match=phrase):
        check_token_means(wrong)


def test_unfinished_stub_says_not_done():
    def stub(x):
        raise NotImplementedError("Exercise 0.1")

    with pytest.raises(NotDoneYet, match="not done yet"):
        check_token_means(stub)


def test_wrong_signature_is_explained():
    with pytest.raises(CheckFailed, match="cannot take that"):
        check_token_means(lambda x, y: x)


def test_learner_errors_surface_unchanged():
    def broken(x):
        return x.mean(dim=5)

    with pytest.raises(IndexError):
        check_token_means(broken)


class TakesOneInput(torch.nn.Module):
    def forward(self, x):
        return x * 2


class WantsTwoInputs(torch.nn.Module):
    def __init__(self, n_embd):
        super().__init__()
        self.n_embd = n_embd

    def forward(self, x, mask):
        return x * mask


def test_call_learner_checks_a_module_against_its_forward():
    x = torch.ones(2, 3)
    assert torch.equal(call_learner("Exercise 9.9", TakesOneInput(), x), x * 2)
    with pytest.raises(CheckFailed, match=r"WantsTwoInputs\.forward\(x, mask\) cannot take that"):
        call_learner("Exercise 9.9", WantsTwoInputs(3), x)
    # A class is checked against its constructor.
    with pytest.raises(CheckFailed, match=r"the check calls WantsTwoInputs\(3, 4\)"):
        call_learner("Exercise 9.9", WantsTwoInputs, 3, 4)
