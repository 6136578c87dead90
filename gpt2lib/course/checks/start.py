"""Checks for chapter 0's warm-up exercise."""

import torch

from gpt2lib.course.checks._core import (CheckFailed, Mistake, call_learner, close, expect_tensor,
                                  first_mistake, passed)

EXERCISE = "Exercise 0.1 (token_means)"

# Wrong shapes, each with what it means. Keyed by the function that makes one from x (B, T, C).
SHAPE_MISTAKES = [
    Mistake("keepdim", "keepdim=True keeps a dimension of size 1; leave it out to get (B, T).",
            lambda x: x.mean(dim=-1, keepdim=True)),
    Mistake("mean over T", "That is the shape of a mean over T (dim=1); average over C, the "
            "last dim.", lambda x: x.mean(dim=1)),
    Mistake("mean over B", "That is the shape of a mean over the batch (dim=0); use the last "
            "dim.", lambda x: x.mean(dim=0)),
    Mistake("mean of all", "You averaged everything into one number; average only the last "
            "dim.", lambda x: x.mean()),
]
# Right shape, wrong values.
VALUE_MISTAKES = [
    Mistake("sum", "that is the sum over C; divide by C to get the mean",
            lambda x: x.sum(dim=-1)),
    Mistake("divided by T", "you divided the sum by T (x.shape[1]); the mean over C divides by "
            "C, x.shape[-1]", lambda x: x.sum(dim=-1) / x.shape[1]),
]


def check_token_means(token_means) -> None:
    """Passes any function giving the mean over the last dim, in any float dtype."""
    __tracebackhide__ = True
    torch.manual_seed(0)
    x = torch.randn(2, 3, 4)  # (B, T, C); T != C, so dividing by T is told apart
    expected = x.mean(dim=-1)  # (B, T)
    got = call_learner(EXERCISE, token_means, x.clone())
    if not isinstance(got, torch.Tensor):
        raise CheckFailed(EXERCISE, f"return a tensor, not {type(got).__name__}")
    if got.shape != expected.shape:
        shape_of = first_mistake(SHAPE_MISTAKES, lambda m: m.fn(x).shape == got.shape)
        hint = f" {shape_of.message}" if shape_of else ""
        raise CheckFailed(EXERCISE, f"expected shape {tuple(expected.shape)}, got "
                                    f"{tuple(got.shape)}.{hint}")
    got = expect_tensor(EXERCISE, got, tuple(expected.shape))  # float64 is fine; NaN is not
    mistake = first_mistake(VALUE_MISTAKES, lambda m: close(got, m.fn(x)))
    if mistake is not None:
        raise CheckFailed(EXERCISE, mistake.message)
    if not close(got, expected, atol=1e-6):
        raise CheckFailed(EXERCISE, "the shape is right but the values are not the means over C")
    passed(EXERCISE, "each token's vector averaged to one number, shape (B, T)")
