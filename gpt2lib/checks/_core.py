"""What every check shares: the failure types, calling learner code safely, the pass line,
and the toolkit for naming mistakes (`Mistake`, `close`, `expect_tensor`, `first_mistake`).

A check compares the learner's answer with the right one, and when they differ, with each
planted `Mistake` (a known wrong version and the message that names it). Each check module
keeps its mistakes in module-level lists of `Mistake`, so that the tests can be parametrised
over exactly the variants the check knows.
"""

from __future__ import annotations

import inspect
from dataclasses import dataclass
from typing import Any, Callable, Iterable


class CheckFailed(AssertionError):
    """An exercise answer is wrong; the message says what looks wrong and what to try."""

    def __init__(self, exercise: str, message: str):
        self.exercise = exercise
        super().__init__(f"{exercise}: {message}")


class NotDoneYet(CheckFailed):
    """The exercise still holds its `raise NotImplementedError(...)` stub."""


@dataclass(frozen=True)
class Mistake:
    """A planted wrong answer: a short name (for tests), the message a learner sees, and a
    function computing what that wrong answer gives. What `fn` takes is up to each check."""

    name: str
    message: str
    fn: Callable[..., Any]


def first_mistake(mistakes: Iterable[Mistake], matches: Callable[[Mistake], bool]) -> Mistake | None:
    """The first planted mistake for which `matches(mistake)` is true, or None.

    A mistake whose function raises (it may not apply to this input) does not match."""
    for mistake in mistakes:
        try:
            if matches(mistake):
                return mistake
        except Exception:  # a wrong version that cannot run on this input is simply no match
            continue
    return None


def close(got: Any, want: Any, atol: float = 1e-5, rtol: float = 1e-5) -> bool:
    """Whether `got` is a tensor of `want`'s shape with the same values, compared in float64.

    Any float dtype is accepted (float64 answers are fine); NaN never equals anything."""
    import torch  # here, so that chapters without PyTorch (the tokenizer) can use this module

    if not isinstance(got, torch.Tensor) or not isinstance(want, torch.Tensor):
        return False
    if tuple(got.shape) != tuple(want.shape):
        return False
    return bool(torch.allclose(got.detach().double().cpu(), want.detach().double().cpu(),
                               atol=atol, rtol=rtol))


def expect_tensor(exercise: str, got: Any, shape: tuple | None = None, *, what: str = "your result",
                  finite: bool = True, hints: dict[tuple, str] | None = None):
    """Check the form of a learner's tensor before its values, naming what is off.

    shape: the expected shape (None: any). hints: messages for known wrong shapes, keyed by
    shape, such as {(B, T, nh, hd): "transpose(1, 2) is missing"}. finite: NaN and ±inf are
    mistakes. Returns the tensor as float64 (integer tensors are returned unchanged).
    """
    import torch

    if not isinstance(got, torch.Tensor):
        raise CheckFailed(exercise, f"{what} should be a torch.Tensor, got {type(got).__name__}")
    if shape is not None and tuple(got.shape) != tuple(shape):
        hint = (hints or {}).get(tuple(got.shape))
        message = f"{what} has shape {tuple(got.shape)}, expected {tuple(shape)}"
        raise CheckFailed(exercise, message + (f": {hint}" if hint else ""))
    if got.dtype.is_floating_point or got.dtype.is_complex:
        if finite and not bool(torch.isfinite(got).all()):
            bad = "NaN" if bool(torch.isnan(got).any()) else "±inf"
            raise CheckFailed(exercise, f"{what} contains {bad}; every value must be a finite number")
        return got.detach().double()
    return got.detach()


def passed(exercise: str, detail: str = "") -> None:
    """Print the line learners look for after a correct answer."""
    print(f"✅ {exercise} passed" + (f": {detail}" if detail else ""))


def call_learner(exercise: str, fn: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
    """Call a learner's function or class, turning the usual non-answers into clear messages.

    - still the stub: says the exercise is not done yet;
    - wrong signature (TypeError while binding the arguments): says what the check passed;
    - any other exception: re-raised as is, so the learner sees their own traceback.
    """
    if not callable(fn):
        raise CheckFailed(exercise, f"expected a function or class, got {type(fn).__name__}")
    try:
        signature = inspect.signature(fn)
    except (TypeError, ValueError):  # builtins without a signature: just try the call
        signature = None
    if signature is not None:
        try:
            signature.bind(*args, **kwargs)
        except TypeError as exc:
            shown = ", ".join([_describe(a) for a in args] + [f"{k}={_describe(v)}" for k, v in kwargs.items()])
            name = getattr(fn, "__name__", repr(fn))
            raise CheckFailed(
                exercise,
                f"the check calls {name}({shown}), but {name}{signature} cannot take that "
                f"({exc}). Keep the signature given in the exercise.",
            ) from None
    try:
        return fn(*args, **kwargs)
    except NotImplementedError:
        raise NotDoneYet(
            exercise,
            "not done yet: replace the `raise NotImplementedError(...)` line with your code, "
            "run that cell, then run this check again.",
        ) from None


def _describe(value: Any) -> str:
    shape = getattr(value, "shape", None)
    if shape is not None:
        return f"<{type(value).__name__} of shape {tuple(shape)}>"
    text = repr(value)
    return text if len(text) <= 40 else text[:37] + "..."
