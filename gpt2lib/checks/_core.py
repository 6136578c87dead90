"""What every check shares: the failure type, calling learner code safely, the pass line."""

from __future__ import annotations

import inspect
from typing import Any, Callable


class CheckFailed(AssertionError):
    """An exercise answer is wrong; the message says what looks wrong and what to try."""

    def __init__(self, exercise: str, message: str):
        self.exercise = exercise
        super().__init__(f"{exercise}: {message}")


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
        raise CheckFailed(
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
