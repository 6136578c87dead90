"""Helpers for the tests of the chapters' checks: parameters over the planted mistakes, and
the assertion that a check names a wrong answer with a given message."""

import pytest

from gpt2lib.course.checks._core import CheckFailed, NotDoneYet


def right_answers(answers_by_check):
    """{check: [right answers]} -> one pytest parameter (check, answer) per answer."""
    return [
        pytest.param(check, answer, id=f"{check.__name__}-{answer.__name__}")
        for check, answers in answers_by_check.items()
        for answer in answers
    ]


def planted(checks_and_mistakes):
    """{check: its list of Mistake} (or pairs) -> one pytest parameter (check, mistake) per
    mistake."""
    return [
        pytest.param(check, mistake, id=f"{check.__name__}-{mistake.name}")
        for check, mistakes in dict(checks_and_mistakes).items()
        for mistake in mistakes
    ]


def numbered(cases):
    """[(check, answer, message)] -> pytest parameters named after the check and a number."""
    return [pytest.param(*case, id=f"{case[0].__name__}-{i}") for i, case in enumerate(cases)]


def assert_named(check, answer, message):
    """check(answer) fails, and its message contains `message`."""
    with pytest.raises(CheckFailed) as info:
        check(answer)
    assert message in str(info.value)


def assert_not_done_yet(check):
    """check(stub), for an exercise that still holds its stub, raises NotDoneYet."""

    def stub(*args, **kwargs):
        raise NotImplementedError("Exercise: replace this line with your code")

    with pytest.raises(NotDoneYet, match="not done yet"):
        check(stub)
