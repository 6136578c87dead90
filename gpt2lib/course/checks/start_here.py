"""Checks for chapter 0's warm-up exercises (0.1 to 0.4) and its challenge, a stable softmax."""

import torch

from gpt2lib.course.checks import _core as core

EXERCISE = "Exercise 0.1 (token_means)"
CENTER = "Exercise 0.2 (center)"
COUNTING = "Exercise 0.3 (where_counting_stops)"
OVERFLOW = "Exercise 0.4 (first_overflow)"
SOFTMAX = "Challenge (a softmax that never overflows)"


_MEANS = {  # x (B, T, C) -> what each planted token_means gives
    "keepdim": lambda x: x.mean(dim=-1, keepdim=True),
    "mean over T": lambda x: x.mean(dim=1),
    "mean over B": lambda x: x.mean(dim=0),
    "mean of all": lambda x: x.mean(),
    "sum": lambda x: x.sum(dim=-1),
    "divided by T": lambda x: x.sum(dim=-1) / x.shape[1],
}
# Wrong shapes, each with what it means.
SHAPE_MISTAKES = core.planted(
    _MEANS.get,
    {
        "keepdim": "keepdim=True keeps a dimension of size 1; leave it out to get (B, T).",
        "mean over T": "That is the shape of a mean over T (dim=1); average over C, the last dim.",
        "mean over B": "That is the shape of a mean over the batch (dim=0); use the last dim.",
        "mean of all": "You averaged everything into one number; average only the last dim.",
    },
)
# Right shape, wrong values.
VALUE_MISTAKES = core.planted(
    _MEANS.get,
    {
        "sum": "that is the sum over C; divide by C to get the mean",
        "divided by T": "you divided the sum by T (x.shape[1]); the mean over C divides by C, x.shape[-1]",
    },
)
_CENTERED = {  # x (B, T, C) -> what each planted center gives
    "means broadcast along C": lambda x: x - x.mean(dim=-1),
    "mean over T": lambda x: x - x.mean(dim=1, keepdim=True),
    "mean of all": lambda x: x - x.mean(),
}
CENTER_MISTAKES = core.planted(
    _CENTERED.get,
    {
        "means broadcast along C": "the (B, T) means were broadcast against the last dimension, so token t lost the mean of token number c instead of its own (it only runs for one text with T equal to C); keep the reduced dimension, keepdim=True or [..., None]",
        "mean over T": "you subtracted the mean over the tokens (dim=1); each token needs its own mean over its C numbers",
        "mean of all": "you subtracted one mean of the whole tensor; each token needs its own mean over its C numbers",
    },
)


def check_token_means(token_means) -> None:
    """Exercise 0.1: `token_means(x)` takes x (B, T, C) and returns each token's mean over C (B, T)."""
    __tracebackhide__ = True
    torch.manual_seed(0)
    x = torch.randn(2, 3, 4)  # (B, T, C); T != C, so dividing by T is told apart
    got = core.call_learner(EXERCISE, token_means, x.clone())
    if not isinstance(got, torch.Tensor):
        raise core.CheckFailed(EXERCISE, f"return a tensor, not {type(got).__name__}")
    hints = {tuple(m.fn(x).shape): m.message for m in SHAPE_MISTAKES}
    got = core.expect_tensor(EXERCISE, got, (2, 3), hints=hints)  # float64 is fine; NaN is not
    if not core.close(got, x.mean(dim=-1), atol=1e-6):
        wrong = "the shape is right but the values are not the means over C"
        core.fail_with(EXERCISE, VALUE_MISTAKES, lambda m: core.close(got, m.fn(x)), wrong)
    core.passed(EXERCISE, "each token's vector averaged to one number, shape (B, T)")


def check_center(center) -> None:
    """Exercise 0.2: `center(x)` takes x (B, T, C) and returns x minus each token's mean (B, T, C)."""
    __tracebackhide__ = True
    torch.manual_seed(0)
    for shape in [(1, 4, 4), (2, 3, 4), (1, 5, 2)]:  # (1, 4, 4) first: the planted bug runs there
        x = torch.randn(*shape) * 3 + 1  # (B, T, C), means far from 0
        before = x.clone()
        got = core.call_learner(CENTER, center, x)
        if not torch.equal(x, before):
            raise core.CheckFailed(
                CENTER,
                "your center changed its input in place (x -= ... or x.sub_); return a new tensor and leave x as it was",
            )
        got = core.expect_tensor(CENTER, got, shape, what=f"center(x) for x of shape {shape}")
        if not core.close(got, x - x.mean(dim=-1, keepdim=True)):
            mistake = core.first_mistake(CENTER_MISTAKES, lambda m: core.close(got, m.fn(x)))
            why = "the result is not x minus each token's mean: its tokens should each average to 0"
            raise core.CheckFailed(
                CENTER, f"on x of shape {shape}: {mistake.message if mistake else why}"
            )
    core.passed(
        CENTER,
        "every token averages to 0, at three shapes. The bug: the (B, T) means lined up against (T, C) from the right, so entry c of every token lost the mean of token c",
    )


def _whole_number(exercise, fn, dtype) -> int:
    """fn(dtype) as an int (a whole float is fine), or CheckFailed saying what to return."""
    answer = core.call_learner(exercise, fn, dtype)
    if isinstance(answer, torch.Tensor) and answer.numel() == 1:
        raise core.CheckFailed(
            exercise, "return a Python int: call .item() (or int()) on the tensor"
        )
    if isinstance(answer, float) and answer.is_integer():
        return int(answer)
    if not isinstance(answer, int) or isinstance(answer, bool):
        raise core.CheckFailed(exercise, f"return a whole number (an int), not {answer!r}")
    return answer


def check_where_counting_stops(where_counting_stops) -> None:
    """Exercise 0.3: `where_counting_stops(dtype)` returns the first int n with n + 1 == n in dtype."""
    __tracebackhide__ = True
    for dtype, bits in [(torch.float32, 24), (torch.float16, 11), (torch.bfloat16, 8)]:
        answer = _whole_number(COUNTING, where_counting_stops, dtype)
        below, above = 2**bits - 1, 2**bits + 1
        near = {
            below: f"{below:,} + 1 is still exact in {dtype}; the first n whose n + 1 is n is one more",
            above: f"{above:,} cannot even be held in {dtype}; the first n is one less",
            2**24: "that is float32's answer: did you pass the dtype to torch.tensor?",
            2**53: "that is float64's: make the tensor in the dtype the check asks for",
        }
        if answer != 2**bits:
            raise core.CheckFailed(
                COUNTING, f"for {dtype} you gave {answer:,}. " + near.get(answer, "measure again")
            )
    core.passed(
        COUNTING,
        "float32 stops at 2**24 = 16,777,216, float16 at 2,048 and bfloat16 at 256: a float keeps 24, 11 and 8 significant bits, so past 2**bits the step between neighbours is 2",
    )


def _first_overflow(dtype) -> int:
    """The smallest whole number s whose exp is inf in `dtype`, found by stepping up."""
    s = 0
    while torch.isfinite(torch.exp(torch.tensor(float(s), dtype=dtype))):
        s += 1
    return s


def check_first_overflow(first_overflow) -> None:
    """Exercise 0.4: `first_overflow(dtype)` returns the smallest int s whose exp is inf in dtype."""
    __tracebackhide__ = True
    float32s = _first_overflow(torch.float32)
    for dtype in (torch.float32, torch.float16, torch.float64):
        answer = _whole_number(OVERFLOW, first_overflow, dtype)
        want = _first_overflow(dtype)
        below = want - 1
        near = {
            below: f"exp({below}) is still finite in {dtype}; the question asks for the first s whose exp is inf",
            float32s: f"that is float32's answer, asked for {dtype}: make the tensor in the dtype the check passes",
        }
        if answer != want:
            raise core.CheckFailed(
                OVERFLOW, f"for {dtype}: " + near.get(answer, f"{answer} is not it")
            )
    core.passed(
        OVERFLOW,
        "float32 overflows at exp(89), float16 at exp(12), float64 at exp(710): e^s has about 0.43 s decimal digits, and float32 holds up to about 3.4e38",
    )


def _softmax_problem(got, want, case) -> str | None:
    if not isinstance(got, torch.Tensor) or got.shape != want.shape:
        return f"on {case}: return a tensor of the input's shape {tuple(want.shape)}, softmax over the last dimension"
    if bad := int((~torch.isfinite(got)).sum()):
        return f"on {case}: {bad} of {got.numel()} values are NaN or inf (exp overflowed, or inf - inf); what can you subtract from every score of a row without changing the result?"
    if (error := float((got.double() - want.double()).abs().max())) > 1e-6:
        return f"on {case}: off by up to {error:.2g} from torch.softmax (the goal is 1e-6); does each row sum to 1 over the last dim?"
    return None


def check_stable_softmax(softmax) -> None:
    """Challenge: `softmax(x)` returns softmax over x's last dim (x's shape), torch's own blocked."""
    __tracebackhide__ = True
    torch.manual_seed(0)
    masked = torch.ones(3, 5).triu(1).bool()
    cases = {
        "small scores": torch.randn(4, 6),
        "scores in the hundreds": torch.randn(3, 8) * 300,
        "scores up to 1e4": torch.randn(2, 3, 5) * 1e4,
        "masked (-inf) entries": torch.randn(3, 5).masked_fill(masked, float("-inf")),
    }
    blocked = [f"torch.{where}softmax" for where in ("", "nn.functional.", "Tensor.", "special.")]
    instead = "the challenge is to build softmax yourself, so torch's is blocked during this check"
    for case, x in cases.items():
        with core.forbidding(SOFTMAX, *blocked, instead=instead):
            got = core.call_learner(SOFTMAX, softmax, x.clone())
        if problem := _softmax_problem(got, torch.softmax(x, dim=-1), case):
            raise core.CheckFailed(SOFTMAX, problem)
    core.passed(
        SOFTMAX, "finite and within 1e-6 of torch.softmax, up to scores of 1e4 and with masks"
    )
