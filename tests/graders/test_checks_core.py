"""The check toolkit every chapter's checks are built on (gpt2lib/course/checks/_core.py)."""

import pytest
import torch

from gpt2lib.course.checks._core import (
    CheckFailed,
    Mistake,
    call_explaining,
    close,
    dropout_of,
    expect_tensor,
    fail_with,
    first_mistake,
    judge,
    named,
    one_pass,
    passed,
    unpack,
    variants,
)

PLANTED = [
    Mistake("doubles", "you doubled it", lambda x: 2 * x),
    Mistake("breaks", "never matches: raises on every input", lambda x: 1 / 0),
    Mistake("negates", "you negated it", lambda x: -x),
]


def test_first_mistake_is_the_first_that_matches_and_skips_variants_that_raise():
    assert first_mistake(PLANTED, lambda m: m.fn(3) == -3).name == "negates"
    assert first_mistake(PLANTED, lambda m: m.fn(3) == 6).name == "doubles"
    assert first_mistake(PLANTED, lambda m: m.fn(3) == 7) is None


def test_named_finds_a_planted_mistake_and_refuses_an_unknown_name():
    assert named(PLANTED, "negates") is PLANTED[2]
    with pytest.raises(LookupError, match="no planted mistake is called 'halves'"):
        named(PLANTED, "halves")


def test_variants_plant_each_mistake_by_its_name_in_the_right_answer():
    def scaled(x, *, mistake=""):
        return x * (2 if mistake == "doubled" else 1) * (-1 if mistake == "negated" else 1)

    table = variants(scaled, {"doubled": "you doubled it", "negated": "you negated it"})
    assert [(m.name, m.message) for m in table] == [
        ("doubled", "you doubled it"),
        ("negated", "you negated it"),
    ]
    assert [m.fn(3) for m in table] == [6, -3]
    assert scaled(3) == 3  # the right answer itself is untouched


def test_call_explaining_says_a_known_runtime_error_in_the_exercise_s_terms():
    def viewed(x):
        return x.t().view(-1)  # not contiguous after the transpose: PyTorch's RuntimeError

    explain = {
        "view size is not compatible": lambda exc: f"use reshape ({type(exc).__name__})",
        "never raised": "unused",
    }
    with pytest.raises(CheckFailed, match=r"^Ex: use reshape \(RuntimeError\)$"):
        call_explaining("Ex", viewed, torch.ones(2, 3), explain=explain)
    assert call_explaining("Ex", viewed, torch.ones(1, 3), explain=explain).shape == (3,)
    with pytest.raises(RuntimeError, match="view size"):  # an error it does not know goes on
        call_explaining("Ex", viewed, torch.ones(2, 3), explain={"other": "unused"})


def test_unpack_returns_n_things_or_asks_for_them():
    assert unpack("Ex", (1, 2), 2, "two numbers") == (1, 2)
    for wrong in ((1, 2, 3), 5, "ab"):
        with pytest.raises(CheckFailed, match=r"^Ex: return two numbers; got (tuple|int|str)$"):
            unpack("Ex", wrong, 2, "two numbers")


def test_close_compares_values_in_float64_and_never_matches_nan_or_another_shape():
    want = torch.tensor([1.0, 2.0])
    assert close(want.double(), want)
    assert not close(want + 1e-3, want)
    assert not close(torch.tensor([1.0, float("nan")]), torch.tensor([1.0, float("nan")]))
    assert not close(want[None], want)
    assert not close([1.0, 2.0], want)


def test_expect_tensor_names_the_wrong_form():
    with pytest.raises(CheckFailed, match="your result should be a torch.Tensor, got list"):
        expect_tensor("Ex", [1.0])
    with pytest.raises(CheckFailed, match=r"shape \(2, 3\), expected \(3, 2\): transpose"):
        expect_tensor("Ex", torch.zeros(2, 3), (3, 2), hints={(2, 3): "transpose it"})
    with pytest.raises(CheckFailed, match="contains ±inf"):
        expect_tensor("Ex", torch.tensor([float("inf")]))
    assert expect_tensor("Ex", torch.ones(2, dtype=torch.float16)).dtype == torch.float64


def test_reveal_prints_the_prediction_beside_the_measurement(capsys):
    from gpt2lib.course.checks import reveal

    reveal(10.0, 10.8249, what="the loss of a random model", unit="nats")
    out = capsys.readouterr().out
    assert "your prediction: 10 nats" in out and "measured:        10.82 nats" in out
    reveal(None, 3, what="heads")
    assert "none written" in capsys.readouterr().out


def test_fail_with_names_the_matching_mistake_or_the_symptom_or_says_otherwise():
    with pytest.raises(CheckFailed, match=r"^E: with x=3: you doubled it!$"):
        fail_with("E", PLANTED, lambda m: m.fn(3) == 6, "no", prefix="with x=3: ", suffix="!")
    with pytest.raises(CheckFailed, match="^E: you negated it$"):
        fail_with("E", PLANTED, lambda m: False, "no", symptom="negates")
    with pytest.raises(CheckFailed, match="^E: no$"):
        fail_with("E", PLANTED, lambda m: False, "no")


def test_judge_returns_a_right_tensor_and_names_a_planted_wrong_one():
    want = torch.tensor([1.0, 2.0])
    assert torch.equal(
        judge("E", want.float(), want, PLANTED, lambda m: m.fn(want), "x", what="y"), want.double()
    )
    with pytest.raises(CheckFailed, match="you doubled it"):
        judge("E", 2 * want, want, PLANTED, lambda m: m.fn(want), "other", what="y")
    with pytest.raises(CheckFailed, match="shape"):
        judge("E", want[:1], want, PLANTED, lambda m: m.fn(want), "other", what="y")


def test_dropout_of_tells_a_dropout_of_the_tensor_from_other_tensors():
    torch.manual_seed(0)
    x = torch.rand(2000) + 0.5
    dropped = x * (torch.rand(2000) > 0.5) * 2  # half zeroed, the rest divided by 1 - p
    assert dropout_of(dropped, x, 0.5)
    assert not dropout_of(x, x, 0.5)  # nothing zeroed
    assert not dropout_of(x * (torch.rand(2000) > 0.5), x, 0.5)  # kept values not rescaled


def test_one_pass_prints_one_line_after_all_its_checks(capsys):
    with one_pass("Exercise 0.0 (two parts)"):
        passed("Exercise 0.0 (a)", part="the first")
        passed("Exercise 0.0 (b)")
    assert capsys.readouterr().out.count("✅") == 1
