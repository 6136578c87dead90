"""Checks for chapter 0's warm-up exercise."""

import torch

from gpt2lib.checks._core import CheckFailed, call_learner, passed

EXERCISE = "Exercise 0.1 (token_means)"


def check_token_means(token_means) -> None:
    torch.manual_seed(0)
    x = torch.randn(2, 3, 4)  # (B, T, C)
    got = call_learner(EXERCISE, token_means, x)
    if not isinstance(got, torch.Tensor):
        raise CheckFailed(EXERCISE, f"return a tensor, not {type(got).__name__}")
    expected = x.mean(dim=-1)  # (B, T)
    if got.shape != expected.shape:
        hint = ""
        if got.shape == x.mean(dim=-1, keepdim=True).shape:
            hint = " keepdim=True keeps a dimension of size 1; leave it out to get (B, T)."
        elif got.shape == x.mean(dim=1).shape:
            hint = " That is the shape of a mean over T (dim=1); average over C, the last dim."
        elif got.shape == x.mean(dim=0).shape:
            hint = " That is the shape of a mean over the batch (dim=0); use the last dim."
        elif got.numel() == 1:
            hint = " You averaged everything into one number; average only the last dim."
        raise CheckFailed(EXERCISE, f"expected shape {tuple(expected.shape)}, got {tuple(got.shape)}.{hint}")
    if torch.allclose(got, x.sum(dim=-1)):
        raise CheckFailed(EXERCISE, "that is the sum over C; divide by C to get the mean")
    if torch.allclose(got, x.sum(dim=-1) / x.shape[1]):
        raise CheckFailed(EXERCISE, "you divided the sum by T (x.shape[1]); the mean over C divides by C, x.shape[-1]")
    if not torch.allclose(got, expected, atol=1e-6):
        raise CheckFailed(EXERCISE, "the shape is right but the values are not the means over C")
    passed(EXERCISE, "each token's vector averaged to one number, shape (B, T)")
