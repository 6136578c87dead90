"""Checks that follow each exercise: they pass any correct answer and name the usual mistakes.

One module per chapter, named after it (`gpt2lib.course.checks.tokenizer`,
`gpt2lib.course.checks.attention`, ...), written by hand. Every check either prints a line
starting with ✅ or raises `CheckFailed`. `reveal` prints a written prediction beside what a
cell measured.
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
    reveal,
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
    "reveal",
    "seeded_call",
]
