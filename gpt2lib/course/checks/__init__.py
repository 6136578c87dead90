"""Checks that follow each exercise: they pass any correct answer and name the usual mistakes.

One module per chapter (`gpt2lib.course.checks.tokenizer`, `gpt2lib.course.checks.attention`, ...), written
by hand. Every check either prints a line starting with ✅ or raises `CheckFailed`.
"""

from gpt2lib.course.checks._core import (
    CheckFailed,
    Mistake,
    NotDoneYet,
    call_learner,
    close,
    expect_tensor,
    first_mistake,
    passed,
    seeded_call,
)

__all__ = [
    "CheckFailed",
    "Mistake",
    "NotDoneYet",
    "call_learner",
    "close",
    "expect_tensor",
    "first_mistake",
    "passed",
    "seeded_call",
]
