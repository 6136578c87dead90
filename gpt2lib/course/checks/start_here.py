"""Checks for chapter 0's warm-up exercises and challenge."""

import torch

from gpt2lib.course.checks import _core as core

EXERCISE = "Exercise 0.1 (token_means)"

# Wrong shapes, each with what it means. Keyed by the function that makes one from x (B, T, C).
SHAPE_MISTAKES = [
    core.Mistake(
        "keepdim",
        "keepdim=True keeps a dimension of size 1; leave it out to get (B, T).",
        lambda x: x.mean(dim=-1, keepdim=True),
    ),
    core.Mistake(
        "mean over T",
        "That is the shape of a mean over T (dim=1); average over C, the last dim.",
        lambda x: x.mean(dim=1),
    ),
    core.Mistake(
        "mean over B",
        "That is the shape of a mean over the batch (dim=0); use the last dim.",
        lambda x: x.mean(dim=0),
    ),
    core.Mistake(
        "mean of all",
        "You averaged everything into one number; average only the last dim.",
        lambda x: x.mean(),
    ),
]
# Right shape, wrong values.
VALUE_MISTAKES = [
    core.Mistake(
        "sum", "that is the sum over C; divide by C to get the mean", lambda x: x.sum(dim=-1)
    ),
    core.Mistake(
        "divided by T",
        "you divided the sum by T (x.shape[1]); the mean over C divides by C, x.shape[-1]",
        lambda x: x.sum(dim=-1) / x.shape[1],
    ),
]


def check_token_means(token_means) -> None:
    """Passes any function giving the mean over the last dim, in any float dtype."""
    __tracebackhide__ = True
    torch.manual_seed(0)
    x = torch.randn(2, 3, 4)  # (B, T, C); T != C, so dividing by T is told apart
    expected = x.mean(dim=-1)  # (B, T)
    got = core.call_learner(EXERCISE, token_means, x.clone())
    if not isinstance(got, torch.Tensor):
        raise core.CheckFailed(EXERCISE, f"return a tensor, not {type(got).__name__}")
    if got.shape != expected.shape:
        shape_of = core.first_mistake(SHAPE_MISTAKES, lambda m: m.fn(x).shape == got.shape)
        hint = f" {shape_of.message}" if shape_of else ""
        raise core.CheckFailed(
            EXERCISE, f"expected shape {tuple(expected.shape)}, got {tuple(got.shape)}.{hint}"
        )
    got = core.expect_tensor(EXERCISE, got, tuple(expected.shape))  # float64 is fine; NaN is not
    mistake = core.first_mistake(VALUE_MISTAKES, lambda m: core.close(got, m.fn(x)))
    if mistake is not None:
        raise core.CheckFailed(EXERCISE, mistake.message)
    if not core.close(got, expected, atol=1e-6):
        raise core.CheckFailed(
            EXERCISE, "the shape is right but the values are not the means over C"
        )
    core.passed(EXERCISE, "each token's vector averaged to one number, shape (B, T)")


# --------------------------------------------------------------------------- Exercise 0.2

CENTER = "Exercise 0.2 (center)"

CENTER_MISTAKES = [
    core.Mistake(
        "means broadcast along C",
        "the (B, T) means were broadcast against the last dimension, so token t lost the "
        "mean of token number c instead of its own (it only runs for one text with T equal to C); keep the "
        "reduced dimension, keepdim=True or [..., None]",
        lambda x: x - x.mean(dim=-1),
    ),
    core.Mistake(
        "mean over T",
        "you subtracted the mean over the tokens (dim=1); each token needs its "
        "own mean over its C numbers",
        lambda x: x - x.mean(dim=1, keepdim=True),
    ),
    core.Mistake(
        "mean of all",
        "you subtracted one mean of the whole tensor; each token needs its "
        "own mean over its C numbers",
        lambda x: x - x.mean(),
    ),
]


def check_center(center) -> None:
    """Passes any `center(x)` that subtracts each token's own mean, on one text with T == C
    (where the planted bug runs silently) and on other shapes, and leaves its input alone."""
    __tracebackhide__ = True
    torch.manual_seed(0)
    for shape in [(1, 4, 4), (2, 3, 4), (1, 5, 2)]:  # (1, 4, 4) first: the planted bug runs there
        x = torch.randn(*shape) * 3 + 1  # (B, T, C), means far from 0
        before = x.clone()
        got = core.call_learner(CENTER, center, x)
        if not torch.equal(x, before):
            raise core.CheckFailed(
                CENTER,
                "your center changed its input in place (x -= ... or "
                "x.sub_); return a new tensor and leave x as it was",
            )
        got = core.expect_tensor(CENTER, got, shape, what=f"center(x) for x of shape {shape}")
        if core.close(got, x - x.mean(dim=-1, keepdim=True)):
            continue
        mistake = core.first_mistake(CENTER_MISTAKES, lambda m: core.close(got, m.fn(x)))
        if mistake is not None:
            raise core.CheckFailed(CENTER, f"on x of shape {shape}: {mistake.message}")
        raise core.CheckFailed(
            CENTER,
            f"on x of shape {shape} the result is not x minus each "
            "token's mean: its tokens should each average to 0",
        )
    core.passed(
        CENTER,
        "every token averages to 0, at three shapes. The bug: the (B, T) means lined up against "
        "(T, C) from the right, so entry c of every token lost the mean of token c",
    )


# --------------------------------------------------------------------------- Exercise 0.3

COUNTING = "Exercise 0.3 (where_counting_stops)"


def check_where_counting_stops(where_counting_stops) -> None:
    """The learner's measurement for three dtypes (so no single number can be written in),
    with the near misses named."""
    __tracebackhide__ = True
    for dtype, bits in [(torch.float32, 24), (torch.float16, 11), (torch.bfloat16, 8)]:
        answer = core.call_learner(COUNTING, where_counting_stops, dtype)
        if isinstance(answer, torch.Tensor) and answer.numel() == 1:
            raise core.CheckFailed(
                COUNTING, "return a Python int: call .item() (or int()) on the tensor"
            )
        if isinstance(answer, float) and answer.is_integer():
            answer = int(answer)
        if not isinstance(answer, int) or isinstance(answer, bool):
            raise core.CheckFailed(COUNTING, f"return a whole number (an int), not {answer!r}")
        want = 2**bits
        if answer == want:
            continue
        near = {
            want
            - 1: f"{want - 1:,} + 1 is still exact in {dtype}; the first n whose n + 1 is n is one more",
            want + 1: f"{want + 1:,} cannot even be held in {dtype}; the first n is one less",
            2**24: "that is float32's answer: did you pass the dtype to torch.tensor?",
            2**53: "that is float64's: make the tensor in the dtype the check asks for",
        }
        raise core.CheckFailed(
            COUNTING, f"for {dtype} you gave {answer:,}. " + near.get(answer, "measure again")
        )
    core.passed(
        COUNTING,
        "float32 stops at 2**24 = 16,777,216, float16 at 2,048 and bfloat16 at 256: a float "
        "keeps 24, 11 and 8 significant bits, so past 2**bits the step between neighbours is 2",
    )


# --------------------------------------------------------------------------- Exercise 0.4

OVERFLOW = "Exercise 0.4 (first_overflow)"


def _first_overflow(dtype) -> int:
    """The smallest whole number s whose exp is inf in `dtype`, found by stepping up."""
    s = 0
    while torch.isfinite(torch.exp(torch.tensor(float(s), dtype=dtype))):
        s += 1
    return s


def check_first_overflow(first_overflow) -> None:
    """The learner's `first_overflow(dtype)` against the numbers measured here, for three dtypes
    (so no single number can be written in), naming the near misses."""
    __tracebackhide__ = True
    for dtype in (torch.float32, torch.float16, torch.float64):
        answer = core.call_learner(OVERFLOW, first_overflow, dtype)
        if isinstance(answer, torch.Tensor) and answer.numel() == 1:
            raise core.CheckFailed(
                OVERFLOW, "return a Python int: call .item() (or int()) on the tensor"
            )
        if isinstance(answer, float) and answer.is_integer():
            answer = int(answer)
        if not isinstance(answer, int) or isinstance(answer, bool):
            raise core.CheckFailed(OVERFLOW, f"return a whole number (an int), not {answer!r}")
        want = _first_overflow(dtype)
        if answer == want:
            continue
        near = {
            want - 1: f"exp({want - 1}) is still finite in {dtype}; the question asks for the "
            "first s whose exp is inf",
            _first_overflow(torch.float32): f"that is float32's answer, asked for {dtype}: make "
            "the tensor in the dtype the check passes",
        }
        raise core.CheckFailed(OVERFLOW, f"for {dtype}: " + near.get(answer, f"{answer} is not it"))
    core.passed(
        OVERFLOW,
        "float32 overflows at exp(89), float16 at exp(12), float64 at exp(710): e^s has about "
        "0.43 s decimal digits, and float32 holds up to about 3.4e38",
    )


# --------------------------------------------------------------------------- Challenge

SOFTMAX = "Challenge (a softmax that never overflows)"


def check_stable_softmax(softmax) -> None:
    """Compares with torch.softmax on scores up to ±1e4 and on rows with -inf (masked) entries,
    while torch's own softmax is blocked, and says how far off the worst row is."""
    __tracebackhide__ = True
    torch.manual_seed(0)
    cases = {
        "small scores": torch.randn(4, 6),
        "scores in the hundreds": torch.randn(3, 8) * 300,
        "scores up to 1e4": torch.randn(2, 3, 5) * 1e4,
        "masked (-inf) entries": torch.randn(3, 5).masked_fill(
            torch.ones(3, 5).triu(1).bool(), float("-inf")
        ),
    }
    blocked = "the challenge is to build it yourself: torch's softmax is blocked during this check"

    def refuse(*args, **kwargs):
        raise core.CheckFailed(SOFTMAX, blocked)

    originals = [
        (torch, "softmax", torch.softmax),
        (torch.nn.functional, "softmax", torch.nn.functional.softmax),
        (torch.Tensor, "softmax", torch.Tensor.softmax),
        (torch.special, "softmax", torch.special.softmax),
    ]
    for case, x in cases.items():
        want = originals[0][2](x, dim=-1)
        for owner, name, _ in originals:
            setattr(owner, name, refuse)
        try:
            got = core.call_learner(SOFTMAX, softmax, x.clone())
        finally:
            for owner, name, original in originals:
                setattr(owner, name, original)
        if not isinstance(got, torch.Tensor) or got.shape != want.shape:
            raise core.CheckFailed(
                SOFTMAX,
                f"on {case}: return a tensor of the input's shape "
                f"{tuple(x.shape)}, softmax over the last dimension",
            )
        bad = int((~torch.isfinite(got)).sum())
        if bad:
            raise core.CheckFailed(
                SOFTMAX,
                f"on {case}: {bad} of {got.numel()} values are NaN or inf "
                "(exp overflowed, or inf - inf); what can you subtract from every "
                "score of a row without changing the result?",
            )
        error = float((got.double() - want.double()).abs().max())
        if error > 1e-6:
            raise core.CheckFailed(
                SOFTMAX,
                f"on {case}: off by up to {error:.2g} from torch.softmax "
                "(the goal is 1e-6); does each row sum to 1 over the last dim?",
            )
    core.passed(
        SOFTMAX, "finite and within 1e-6 of torch.softmax, up to scores of 1e4 and with masks"
    )
