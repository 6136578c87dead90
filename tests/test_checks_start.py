"""Chapter 0's warm-up check: passes the right answer and names each usual mistake."""

import pytest
import torch

from gpt2lib.checks import CheckFailed
from gpt2lib.checks.start import check_token_means


def test_reference_passes(capsys):
    check_token_means(lambda x: x.mean(dim=-1))
    assert "✅" in capsys.readouterr().out


@pytest.mark.parametrize(
    "wrong, phrase",
    [
        (lambda x: x.mean(dim=1), "mean over T"),
        (lambda x: x.mean(dim=0), "over the batch"),
        (lambda x: x.mean(), "into one number"),
        (lambda x: x.sum(dim=-1), "sum over C"),
        (lambda x: x.mean(dim=-1) + 1, "values are not the means"),
        (lambda x: x.mean(dim=-1).tolist(), "return a tensor"),
    ],
)
def test_mistakes_are_named(wrong, phrase):
    with pytest.raises(CheckFailed, match=phrase):
        check_token_means(wrong)


def test_unfinished_stub_says_not_done():
    def stub(x):
        raise NotImplementedError("Exercise 0.1")

    with pytest.raises(CheckFailed, match="not done yet"):
        check_token_means(stub)


def test_wrong_signature_is_explained():
    with pytest.raises(CheckFailed, match="cannot take that"):
        check_token_means(lambda x, y: x)


def test_learner_errors_surface_unchanged():
    def broken(x):
        return x.mean(dim=5)

    with pytest.raises(IndexError):
        check_token_means(broken)


@pytest.mark.parametrize(
    "wrong, phrase",
    [
        (lambda x: x.mean(dim=-1, keepdim=True), "keepdim=True keeps a dimension of size 1"),
        (lambda x: x.sum(dim=-1) / x.shape[1], r"divided the sum by T \(x.shape\[1\]\)"),
    ],
)
def test_more_learner_mistakes_are_named(wrong, phrase):
    with pytest.raises(CheckFailed, match=phrase):
        check_token_means(wrong)
