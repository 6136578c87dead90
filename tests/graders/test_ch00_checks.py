"""Chapter 0's warm-up check, and the shared toolkit's handling of learner code
(gpt2lib/course/checks/_core.py): passes right answers in any style, names each planted mistake."""

import re

import pytest
import torch

from gpt2lib.course.checks import CheckFailed, NotDoneYet, call_learner
from gpt2lib.course.checks.start_here import SHAPE_MISTAKES, VALUE_MISTAKES, check_token_means


@pytest.mark.parametrize(
    "right",
    [
        lambda x: x.mean(dim=-1),
        lambda x: x.sum(dim=2) / x.shape[-1],
        lambda x: x.double().mean(dim=-1),  # float64 answers are fine
        lambda x: torch.stack([torch.stack([row.mean() for row in b]) for b in x]),  # loops
    ],
    ids=["mean", "sum-over-C", "float64", "loops"],
)
def test_right_answers_pass(capsys, right):
    check_token_means(right)
    assert "✅" in capsys.readouterr().out


@pytest.mark.parametrize("mistake", SHAPE_MISTAKES + VALUE_MISTAKES, ids=lambda m: m.name)
def test_each_planted_mistake_is_named(mistake):
    with pytest.raises(CheckFailed) as info:
        check_token_means(mistake.fn)
    assert mistake.message in str(info.value)


@pytest.mark.parametrize(
    "wrong, phrase",
    [
        (lambda x: x.mean(dim=-1) + 1, "values are not the means"),
        (lambda x: x.mean(dim=-1).tolist(), "return a tensor"),
        (lambda x: x.mean(dim=-1) * float("nan"), "contains NaN"),
    ],
)
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


# --------------------------------------------------------------------------- 0.2 to the challenge

from gpt2lib.course.checks.start_here import (  # noqa: E402 - this section's imports
    CENTER_MISTAKES,
    check_center,  # noqa: E402
    check_first_overflow,
    check_stable_softmax,
    check_where_counting_stops,
)


@pytest.mark.parametrize(
    "right",
    [
        lambda x: x - x.mean(dim=-1, keepdim=True),
        lambda x: x - x.mean(dim=-1)[..., None],
        lambda x: x - x.sum(dim=2, keepdim=True) / x.shape[-1],
    ],
    ids=["keepdim", "none-index", "sum"],
)
def test_center_right_answers_pass(capsys, right):
    check_center(right)
    assert "✅" in capsys.readouterr().out


@pytest.mark.parametrize("mistake", CENTER_MISTAKES, ids=lambda m: m.name)
def test_center_planted_mistakes_are_named(mistake):
    # The notebook's own bug only runs when T == C; the check must still name it.
    with pytest.raises(CheckFailed) as info:
        check_center(mistake.fn)
    assert mistake.message in str(info.value)


def test_center_that_changes_its_input_is_named():
    def in_place(x):
        x -= x.mean(dim=-1, keepdim=True)
        return x

    with pytest.raises(CheckFailed, match="changed its input in place"):
        check_center(in_place)


def _doubling(dtype=torch.float32):
    n = 1
    while torch.tensor(n, dtype=dtype) + 1 != n:
        n *= 2
    return n


def test_where_counting_stops_passes(capsys):
    check_where_counting_stops(_doubling)
    check_where_counting_stops(lambda dtype: float(_doubling(dtype)))  # a whole float is fine
    assert "✅" in capsys.readouterr().out


@pytest.mark.parametrize(
    "wrong, phrase",
    [
        (lambda dtype: 2**24, "float32's answer"),  # written in, or the dtype ignored
        (lambda dtype: _doubling(dtype) - 1, "still exact"),
        (lambda dtype: _doubling(dtype) + 1, "one less"),
        (lambda dtype: torch.tensor(_doubling(dtype)), ".item()"),
        (lambda dtype: 2**53, "float64"),
        (lambda dtype: "16777216", "whole number"),
    ],
)
def test_where_counting_stops_mistakes_are_named(wrong, phrase):
    with pytest.raises(CheckFailed, match=re.escape(phrase)):
        check_where_counting_stops(wrong)


def _overflow(dtype=torch.float32):
    s = 0
    while torch.isfinite(torch.exp(torch.tensor(float(s), dtype=dtype))):
        s += 1
    return s


def test_first_overflow_is_the_measured_number(capsys):
    check_first_overflow(_overflow)
    assert "✅" in capsys.readouterr().out


@pytest.mark.parametrize(
    "answer, phrase",
    [
        (lambda dtype: _overflow(dtype) - 1, "still finite"),
        (lambda dtype: 89, "float32's answer"),  # written in, or the dtype ignored
        (lambda dtype: 100, "is not it"),
        (lambda dtype: "89", "whole number"),
        (lambda dtype: torch.tensor(_overflow(dtype)), ".item()"),
    ],
)
def test_first_overflow_near_misses_are_named(answer, phrase):
    with pytest.raises(CheckFailed, match=re.escape(phrase)):
        check_first_overflow(answer)


def test_first_overflow_stub_is_not_done():
    def stub(dtype=torch.float32):
        raise NotImplementedError("Exercise 0.4")

    with pytest.raises(NotDoneYet):
        check_first_overflow(stub)


def _shifted(x):
    e = torch.exp(x - x.max(dim=-1, keepdim=True).values)
    return e / e.sum(dim=-1, keepdim=True)


def test_stable_softmax_passes(capsys):
    check_stable_softmax(_shifted)
    assert "✅" in capsys.readouterr().out


@pytest.mark.parametrize(
    "wrong, phrase",
    [
        (lambda x: torch.exp(x) / torch.exp(x).sum(dim=-1, keepdim=True), "NaN or inf"),
        (lambda x: torch.softmax(x, dim=-1), "blocked"),
        (lambda x: x.softmax(-1), "blocked"),
        (lambda x: torch.nn.functional.softmax(x, dim=-1), "blocked"),
        (lambda x: _shifted(x) * 1.01, "off by up to"),
        (lambda x: _shifted(x.transpose(-2, -1)).transpose(-2, -1), "off by up to"),
    ],
)
def test_stable_softmax_wrong_answers_are_explained(wrong, phrase):
    with pytest.raises(CheckFailed, match=phrase):
        check_stable_softmax(wrong)


def test_stable_softmax_check_restores_torch_softmax():
    with pytest.raises(CheckFailed):
        check_stable_softmax(lambda x: torch.softmax(x, dim=-1))
    assert torch.allclose(torch.softmax(torch.zeros(2), dim=-1), torch.tensor([0.5, 0.5]))
