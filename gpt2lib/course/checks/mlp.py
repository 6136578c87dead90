"""Checks for chapter 4's exercises: which outputs a token moves, merging two linear layers, the
best fit of a hidden layer, the GELUs (F.gelu refused), their approximation gaps, and the MLP."""

from __future__ import annotations

import copy
import functools
import math
import numbers

import torch
import torch.nn as nn
import torch.nn.functional as F

from gpt2lib.course.checks import _core as core

EX_MOVED = "Exercise 4.1 (outputs_that_change)"
EX_MERGE = "Exercise 4.2 (merge_linear_layers)"
EX_FIT = "Exercise 4.3 (best_fit_error)"
EX_GELU = "Exercise 4.4 (gelu_tanh)"
EX_GELU_ERF = "Exercise 4.4 (gelu_erf)"
EX_GAPS = "Exercise 4.5 (approximation_gaps)"
EX_MLP = "Exercise 4.6 (MLP)"


_TANH = "0.5·x·(1 + tanh(√(2/π)·(x + 0.044715·x³)))"


def _gelu_tanh(x, *, mistake=""):
    """GPT-2's tanh GELU, written out so that the check does not depend on gpt2lib; `mistake`
    plants one of GELU_MISTAKES by its name (typo <c>: the constant c for 0.044715)."""
    if mistake == "erf":
        return 0.5 * x * (1 + torch.erf(x / math.sqrt(2)))
    if mistake in ("relu", "sigmoid"):
        return torch.relu(x) if mistake == "relu" else x * torch.sigmoid(1.702 * x)
    scale = {"2/pi": 2.0 / math.pi, "no sqrt scale": 1.0}.get(mistake, math.sqrt(2.0 / math.pi))
    cubic = {"no cubic": 0.0}.get(mistake, 0.044715)
    if mistake.startswith("typo "):
        cubic = float(mistake.removeprefix("typo "))
    half, power = (1.0 if mistake == "no half" else 0.5), (2 if mistake == "square" else 3)
    return half * x * (1.0 + torch.tanh(scale * (x + cubic * x**power)))


_erf = F.gelu  # the exact GELU (bound here, so that refusing F.gelu does not refuse it)


def _as_number(exercise, got):
    if isinstance(got, torch.Tensor) and got.numel() == 1:
        got = got.item()
    if isinstance(got, bool) or not isinstance(got, numbers.Real):
        raise core.CheckFailed(
            exercise,
            f"return the error as one number (a Python float; `.item()` turns a 1-element tensor into one), got {type(got).__name__}",
        )
    return float(got)


# --------------------------------------------------------------------------- Exercise 4.1
def _moved(f, x, position, *, mistake=""):
    """The right answer: edit token `position` of a copy, in every sequence; (B, T) bools;
    `mistake` plants one of MOVED_MISTAKES by its name."""
    before = f(x)
    edited = x if mistake == "in place" else x.clone()
    where = {"first sequence": (0, position), "feature": (..., position)}
    edited[where.get(mistake, (slice(None), position))] += 1.0
    diff = f(edited) - before
    diff = diff if mistake == "signed sum" else diff.abs()
    return diff.sum(dim=1 if mistake == "over time" else -1) > 0


# fn(f, x, position) -> what that wrong answer returns
MOVED_MISTAKES = core.variants(
    _moved,
    {
        "signed sum": "you test the SIGNED sum of the differences: an output that moved down sums to less than 0 and is missed. Take the absolute value first, (f(edited) - f(x)).abs().sum(dim=-1) > 0",
        "in place": "you changed x itself: the caller's tensor must stay as it was. Edit a copy, edited = x.clone()",
        "first sequence": "you changed the token in the first sequence only: change it in every sequence of the batch, edited[:, position]",
        "feature": "you changed feature number `position` of every token (x[..., position]): change the whole token at that position, x[:, position]",
        "over time": "you added up over the positions (dim 1): add up over each output's vector (the last dim), one answer per (sequence, position)",
    },
)


def check_outputs_that_change(outputs_that_change) -> None:
    """`outputs_that_change(f, x, position)` -> (B, T) bools: which outputs of f move when the
    token at `position` changes, in every sequence; x is left unchanged."""
    W = torch.randn(3, 3, generator=torch.Generator().manual_seed(0), dtype=torch.float64)
    x = torch.randn(2, 5, 3, generator=torch.Generator().manual_seed(1), dtype=torch.float64)
    cases = {  # what f depends on: f
        "position by position": lambda x: torch.tanh(x @ W),
        "a running sum over the tokens before": lambda x: torch.tanh(x.cumsum(dim=1) @ W),
        "the token before only": lambda x: torch.roll(x, 1, dims=1) @ W,
    }
    for name, f in cases.items():
        for position in (0, 2):
            before = x.clone()
            got = core.call_learner(EX_MOVED, outputs_that_change, f, x, position)
            if not torch.equal(x, before):
                raise core.named_failure(EX_MOVED, MOVED_MISTAKES, "in place")
            want = _moved(f, x, position)
            try:
                got = torch.as_tensor(got)
            except (TypeError, ValueError, RuntimeError):
                raise core.CheckFailed(
                    EX_MOVED, f"return a (B, T) tensor of booleans, got {type(got).__name__}"
                ) from None
            if got.shape != want.shape:
                core.fail_with(
                    EX_MOVED,
                    MOVED_MISTAKES,
                    lambda m: m.fn(f, x.clone(), position).shape == got.shape,
                    f"return one answer per (sequence, position), shape {tuple(want.shape)}; got {tuple(got.shape)}",
                )
            if not torch.equal(got.bool(), want):
                core.fail_with(
                    EX_MOVED,
                    MOVED_MISTAKES,
                    lambda m: torch.equal(got.bool(), m.fn(f, x.clone(), position)),
                    f"for f = {name}, changing token {position}: expected {want.tolist()}, got {got.bool().tolist()}",
                )
    core.passed(EX_MOVED, "the right outputs move, for three kinds of f, and x is left unchanged")


# --------------------------------------------------------------------------- Exercise 4.2
def _merged(W1, b1, W2, b2, *, mistake=""):
    """(W, b) with x @ W + b = (x @ W1 + b1) @ W2 + b2; `mistake` plants one of MERGE_MISTAKES by
    its name."""
    W = (W1 @ W2).T if mistake == "W transposed" else W1 @ W2
    return W, {"b2 missing": b1 @ W2, "b1 missing": b2}.get(mistake, b1 @ W2 + b2)


# fn(W1, b1, W2, b2) -> (W, b), a wrong merge
MERGE_MISTAKES = core.variants(
    _merged,
    {
        "b2 missing": "your bias leaves out b2: the second layer adds its own bias after the product, so b = b1 @ W2 + b2",
        "b1 missing": "your bias is only b2: the first layer's bias b1 also goes through the second layer, (x @ W1 + b1) @ W2 = x @ W1 @ W2 + b1 @ W2, so b = b1 @ W2 + b2",
        "W transposed": "your W is transposed: x @ W needs W of shape (C, D), which is W1 @ W2, not (W1 @ W2).T or W2.T @ W1.T",
    },
)


def check_merge_linear_layers(merge_linear_layers) -> None:
    """`merge_linear_layers(W1 (C, H), b1 (H,), W2 (H, D), b2 (D,))` -> W (C, D), b (D,) with
    x @ W + b = (x @ W1 + b1) @ W2 + b2."""
    gen = torch.Generator().manual_seed(0)
    for C, H, D in ((3, 5, 2), (4, 16, 4)):
        W1, b1 = torch.randn(C, H, generator=gen), torch.randn(H, generator=gen)
        W2, b2 = torch.randn(H, D, generator=gen), torch.randn(D, generator=gen)
        args = (W1, b1, W2, b2)
        got = core.call_learner(EX_MERGE, merge_linear_layers, *(t.clone() for t in args))
        core.unpack(EX_MERGE, got, 2, "two tensors, (W, b)")
        want = _merged(*args)
        sizes = f"with C={C}, H={H}, D={D}"
        for part, want_part, what in zip(got, want, "Wb"):
            if isinstance(part, torch.Tensor) and part.shape != want_part.shape:
                shaped = core.first_mistake(
                    MERGE_MISTAKES,
                    lambda m: [g.shape for g in got] == [w.shape for w in m.fn(*args)],
                )
                if shaped is not None:
                    raise core.CheckFailed(EX_MERGE, shaped.message)
            core.expect_tensor(EX_MERGE, part, want_part.shape, what=f"{what} ({sizes})")
        right = [core.close(g, w, atol=1e-4) for g, w in zip(got, want)]
        if not all(right):
            core.fail_with(
                EX_MERGE,
                MERGE_MISTAKES,
                lambda m: all(core.close(g, w, atol=1e-4) for g, w in zip(got, m.fn(*args))),
                f"{sizes}, your {'W' if not right[0] else 'b'} is wrong: expand (x @ W1 + b1) @ W2 + b2 and collect the part that multiplies x (W) and the part that does not (b)",
            )
    core.passed(EX_MERGE, "W = W1 @ W2 and b = b1 @ W2 + b2: no activation, no extra power")


# --------------------------------------------------------------------------- Exercise 4.3
def _fit_error(x, y, W1, b1, activation, *, mistake=""):
    """The mean squared error of the least-squares fit of y on activation(x @ W1 + b1); `mistake`
    plants one of FIT_MISTAKES by its name."""
    activation = {"no activation": lambda h: h, "relu": torch.relu}.get(mistake, activation)
    hidden = activation(x @ W1 if mistake == "no b1" else x @ W1 + b1)  # (N, H)
    if mistake == "fit on x":
        hidden = x
    residuals = hidden @ torch.linalg.lstsq(hidden, y).solution - y  # (N, D)
    squared = residuals.pow(2)
    errors = {
        "sum": squared.sum(),
        "root": squared.mean().sqrt(),
        "absolute": residuals.abs().mean(),
    }
    return errors.get(mistake, squared.mean()).item()


FIT_MISTAKES = core.variants(
    _fit_error,
    {
        "no activation": "your error does not depend on the activation: apply `activation` to x @ W1 + b1 before the least-squares fit (with no activation the best fit is a straight line whatever the width)",
        "no b1": "the first layer's bias b1 is missing: the hidden layer is activation(x @ W1 + b1); without b1 every hidden unit bends at x = 0",
        "sum": "you return the SUM of the squared errors: take the mean, over all N · D numbers",
        "root": "you return the root of the mean squared error (RMSE): return the mean squared error itself, without the square root",
        "absolute": "you return the mean ABSOLUTE error: square the residuals, ((hidden @ W2 - y) ** 2).mean()",
        "fit on x": "you fitted y from x directly, not from the hidden layer: solve the least squares for `hidden = activation(x @ W1 + b1)` (N, H), giving W2 of shape (H, D)",
        "relu": "your error is ReLU's, not that of the `activation` you were given: call activation(x @ W1 + b1) (its default is GELU)",
    },
)


def check_best_fit_error(best_fit_error) -> None:
    """`best_fit_error(x (N, C), y (N, D), W1 (C, H), b1 (H,), activation)` -> a float: the mean
    squared error of the least-squares fit of y on activation(x @ W1 + b1)."""
    gen = torch.Generator().manual_seed(0)
    for N, C, H, D in ((64, 1, 6, 1), (50, 3, 10, 2)):
        x = torch.randn(N, C, generator=gen, dtype=torch.float64) * 2
        y = torch.sin(x @ torch.randn(C, D, generator=gen, dtype=torch.float64) * 2) + 0.3
        W1 = torch.randn(C, H, generator=gen, dtype=torch.float64) * 2
        b1 = torch.randn(H, generator=gen, dtype=torch.float64) * 2
        for act in (_gelu_tanh, torch.tanh):
            got = core.call_learner(EX_FIT, best_fit_error, x, y, W1, b1, activation=act)
            got = _as_number(EX_FIT, got)
            want = _fit_error(x, y, W1, b1, act)
            if not math.isclose(got, want, rel_tol=1e-4, abs_tol=1e-9):
                core.fail_with(
                    EX_FIT,
                    FIT_MISTAKES,
                    lambda m: math.isclose(
                        got, m.fn(x, y, W1, b1, act), rel_tol=1e-4, abs_tol=1e-9
                    ),
                    f"for x {tuple(x.shape)}, y {tuple(y.shape)} and H = {H} the best fit's mean squared error is {want:.6g}, you return {got:.6g}. Steps: hidden = activation(x @ W1 + b1); W2 = least squares of hidden against y; mean of (hidden @ W2 - y) ** 2",
                )
    core.passed(EX_FIT, "the best second layer for a fixed first layer, and its mean squared error")


CHALLENGE_FIT = "Challenge (fit the curve with 8 hidden units)"
FIT_GOALS = dict(max_units=8, max_error=0.01)


def challenge_fit_error(W1, b1) -> float:
    """The error the challenge measures: the best least-squares second layer (no bias) on the
    tanh GELU of x @ W1 + b1, for y = sin(3x) + 0.5·x at 256 points in [-3, 3]."""
    x = torch.linspace(-3, 3, 256, dtype=torch.float64)[:, None]  # (N, 1)
    y = torch.sin(3 * x) + 0.5 * x
    return _fit_error(x, y, W1.detach().double(), b1.detach().double(), _gelu_tanh)


def check_fit_challenge(W1, b1) -> float:
    """The challenge: a first layer (W1 (1, H), b1 (H,)) of at most 8 units whose best fit
    has a mean squared error below 0.01. Returns the error."""
    W1 = core.expect_tensor(CHALLENGE_FIT, W1, what="W1")
    b1 = core.expect_tensor(CHALLENGE_FIT, b1, what="b1")
    if W1.dim() != 2 or W1.shape[0] != 1 or b1.shape != (W1.shape[1],):
        raise core.CheckFailed(
            CHALLENGE_FIT,
            f"W1 should be (1, H) and b1 (H,), got {tuple(W1.shape)} and {tuple(b1.shape)}",
        )
    H, goal = W1.shape[1], FIT_GOALS["max_error"]
    if H > FIT_GOALS["max_units"]:
        raise core.CheckFailed(
            CHALLENGE_FIT, f"{H} hidden units: the goal allows at most {FIT_GOALS['max_units']}"
        )
    error = challenge_fit_error(W1, b1)
    if not error < goal:
        raise core.CheckFailed(
            CHALLENGE_FIT,
            f"with {H} units the best fit has error {error:.4f}; the goal is below {goal}. Spread the bends over [-3, 3]",
        )
    core.passed(CHALLENGE_FIT, f"{H} hidden units, error {error:.5f}")
    return error


# --------------------------------------------------------------------------- Exercise 4.4: GELU
def _gelu_call(exercise, gelu, x, what):
    """gelu(x) with F.gelu refused (nn.GELU calls it: the formula is the task), and x left as it
    was (what: how the message names x)."""
    before = x.clone()
    instead = "write the formula with torch operations (torch.tanh, torch.erf, x**3)"
    with core.forbidding(exercise, "torch.nn.functional.gelu", instead=instead):
        got = core.call_learner(exercise, gelu, x)
    if not torch.equal(x, before):
        raise core.CheckFailed(
            exercise,
            f"your function changed its {what} in place (an operation ending in _, like x.pow_ or x.mul_, or `x *= ...`): return a new tensor and leave x alone",
        )
    return got


# fn(x) -> a wrong activation
GELU_MISTAKES = core.variants(
    _gelu_tanh,
    {
        "erf": f"this is the exact GELU, x·Φ(x) with erf (what F.gelu(x) and nn.GELU() compute by default). GPT-2 uses the tanh approximation: {_TANH}. The two differ by up to about 5e-4, enough to stop matching GPT-2's outputs",
        "relu": "this is ReLU (max(0, x)), not GELU: GELU is smooth and slightly negative for negative x",
        "no cubic": "the 0.044715·x³ term is missing: the tanh's argument is √(2/π)·(x + 0.044715·x³), not √(2/π)·x",
        "square": "the correction term must be cubic: 0.044715·x³ (x**3 or x.pow(3)), not 0.044715·x²",
        "2/pi": "the scale inside the tanh is √(2/π) ≈ 0.7979 (math.sqrt(2 / math.pi)), not 2/π ≈ 0.6366",
        "no sqrt scale": "the tanh's argument is multiplied by √(2/π) ≈ 0.7979: tanh(√(2/π)·(x + 0.044715·x³))",
        "no half": "the leading factor 0.5 is missing: GELU is 0.5·x·(1 + tanh(...)), so that it tends to x (not 2x) for large x",
        "sigmoid": "this is the sigmoid approximation x·sigmoid(1.702·x), not GPT-2's tanh form",
        **{
            f"typo {c}": f"the constant is 0.044715, not {c}: {why}"
            for c, why in (
                (0.0044715, "one zero too many after the point, a classic typo"),
                (0.04715, "a digit is missing"),
                (0.44715, "a zero is missing after the point"),
            )
        },
    },
)


def check_gelu_tanh(gelu_tanh) -> None:
    """`gelu_tanh(x)`: tensor of any shape -> tensor of the same shape, element by element."""
    # Points where the erf and tanh forms differ most (|x| near 2.7 and 0.9), plus the easy ones.
    points = torch.tensor(
        [-6.0, -3.5, -2.7, -2.0, -1.5, -0.9, -0.5, 0.0, 0.5, 0.9, 1.5, 2.0, 2.7, 3.5, 6.0, 10.0],
        dtype=torch.float64,
    ).reshape(2, 8)
    try:
        got = _gelu_call(EX_GELU, gelu_tanh, points.clone(), "input tensor")
    except (TypeError, ValueError, RuntimeError) as exc:
        if "Python scalar" not in str(exc) and "must be real number" not in str(exc):
            raise
        raise core.CheckFailed(
            EX_GELU,
            f"your function fails on a tensor ({exc}): a function from `math` (math.tanh, math.exp, ...) works on one number only. Use torch.tanh for the tensor; math.sqrt and math.pi are fine for the constant √(2/π)",
        ) from None
    hints = {(16,): "GELU works element by element: keep the input's shape"}
    got = core.expect_tensor(EX_GELU, got, points.shape, what="the output", hints=hints)
    want = _gelu_tanh(points)
    if not core.close(got, want):
        worst = (got - want).abs().argmax()
        core.fail_with(
            EX_GELU,
            GELU_MISTAKES,
            lambda m: core.close(got, m.fn(points)),
            f"wrong value at x = {points.flatten()[worst].item():g}: expected {want.flatten()[worst].item():.6f}, got {got.flatten()[worst].item():.6f}. The formula is {_TANH}",
        )
    # float32 in, float32 out, same numbers: the model runs in float32; and a strided input
    got32 = _gelu_call(EX_GELU, gelu_tanh, points.float().reshape(4, 4).T, "float32 input")
    if not isinstance(got32, torch.Tensor) or got32.dtype != torch.float32:
        raise core.CheckFailed(
            EX_GELU,
            f"a float32 input should give a float32 output, got {getattr(got32, 'dtype', type(got32).__name__)}: build the result from x with torch operations (torch.tanh, x**3) and Python floats, so it keeps x's dtype",
        )
    if got32.shape != (4, 4):
        raise core.CheckFailed(
            EX_GELU, f"a (4, 4) input should give a (4, 4) output, got {got32.shape!r}"
        )
    if not core.close(got32, want.reshape(4, 4).T, atol=1e-4):
        raise core.CheckFailed(
            EX_GELU, "right in float64 but wrong in float32: check your constants"
        )
    core.passed(EX_GELU, "GPT-2's tanh GELU, and not the erf one")


def _gelu_erf(x, *, mistake=""):
    """The exact GELU, 0.5·x·(1 + erf(x / √2)); `mistake` plants one of GELU_ERF_MISTAKES by its
    name. (The check compares with F.gelu.)"""
    if mistake == "tanh_form":
        return _gelu_tanh(x)
    inside = {"no_sqrt2": x, "divided_by_2": x / 2}.get(mistake, x / math.sqrt(2))
    half, times = (1 if mistake == "no_half" else 0.5), (1 if mistake == "phi_only" else x)
    return half * times * (1 + torch.erf(inside))


# fn(x) -> what that wrong exact GELU gives
GELU_ERF_MISTAKES = core.variants(
    _gelu_erf,
    {
        "tanh_form": "this is the tanh approximation; gelu_erf is the exact form 0.5·x·(1 + erf(x / √2)) with torch.erf",
        "no_sqrt2": "erf's argument is x / √2, not x: Φ(x) = ½·(1 + erf(x / √2))",
        "divided_by_2": "erf's argument is x / √2 (math.sqrt(2)), not x / 2",
        "no_half": "the factor ½ is missing: Φ(x) = ½·(1 + erf(x / √2)), so GELU(x) tends to x",
        "phi_only": "this is Φ(x) alone: GELU multiplies it by x",
    },
)


def check_gelu_erf(gelu_erf) -> None:
    """`gelu_erf(x)`: the exact GELU, on float64 and float32 (strided) inputs, input unchanged."""
    points = torch.linspace(-6, 6, 25, dtype=torch.float64).reshape(5, 5)
    for x in (points.clone(), points.float().T):  # float64; float32 and not contiguous
        got = _gelu_call(EX_GELU_ERF, gelu_erf, x, "input tensor")
        if not isinstance(got, torch.Tensor) or got.dtype != x.dtype:
            raise core.CheckFailed(
                EX_GELU_ERF,
                f"a {x.dtype} input should give a {x.dtype} tensor, got {getattr(got, 'dtype', type(got).__name__)}",
            )
        got = core.expect_tensor(EX_GELU_ERF, got, x.shape, what="the output")
        if not core.close(got, _erf(x.double()), atol=1e-5 if x.dtype == torch.float64 else 1e-4):
            core.fail_with(
                EX_GELU_ERF,
                GELU_ERF_MISTAKES,
                lambda m: core.close(got, m.fn(x.double()), atol=1e-4),
                "wrong values: the exact GELU is 0.5·x·(1 + erf(x / √2))",
            )
    gap = (_gelu_tanh(points) - _erf(points)).abs().max().item()
    core.passed(
        EX_GELU_ERF, f"the exact GELU; it differs from GPT-2's tanh form by up to {gap:.1e}"
    )


# --------------------------------------------------------------------------- Exercise 4.5: gaps
def _mlp_outputs(fc, proj, x, activation, dtype=None):
    """proj(activation(fc(x))) without gradients, on copies of the layers when `dtype` is given."""
    with torch.no_grad():
        if dtype is not None:
            fc, proj, x = copy.deepcopy(fc).to(dtype), copy.deepcopy(proj).to(dtype), x.to(dtype)
        return proj(activation(fc(x)))


def _gaps(fc, proj, x, *, mistake=""):
    """The right (activation gap, rounding gap); `mistake` plants one of GAPS_MISTAKES by its
    name."""

    def measure(d):
        return d.abs().mean() if mistake == "mean" else d.abs().max()

    out_tanh = _mlp_outputs(fc, proj, x, _gelu_tanh)  # float32
    if mistake == "hidden":  # the first gap measured after GELU, not at the output
        h = fc(x)
        first = measure(_gelu_tanh(h) - _erf(h))
    else:
        first = measure(out_tanh - _mlp_outputs(fc, proj, x, _erf))
    reference = _erf if mistake == "erf reference" else _gelu_tanh  # the float64 MLP's activation
    exact = _mlp_outputs(fc, proj, x, reference, torch.float64)
    gaps = first.item(), measure(out_tanh.double() - exact).item()
    wrong = {"swapped": gaps[::-1], "same activation": (0.0, gaps[1])}
    return {**wrong, "float32 reference": (gaps[0], 0.0)}.get(mistake, gaps)


# fn(fc, proj, x) -> the two floats that wrong answer returns
GAPS_MISTAKES = core.variants(
    _gaps,
    {
        "swapped": "your two numbers are the right ones the other way round: return first the change that the erf GELU makes, then the change that float32 rounding makes",
        "hidden": "your first number is the largest change of the hidden values after GELU; the question is how far the MLP's OUTPUT moves, so run both activations through proj (its weights can make the change larger or smaller)",
        "mean": "you return the MEAN change of the output numbers; the question is the largest change of any one of them (the absolute difference's maximum)",
        "same activation": 'your first number is 0: both outputs used the same GELU. F.gelu(h) is the exact (erf) form; GPT-2\'s is F.gelu(h, approximate="tanh") or your gelu_tanh',
        "float32 reference": "your rounding gap is 0: both sides ran in float32, so they round alike. The reference must be the same tanh MLP computed in float64 (layers and input)",
        "erf reference": "your rounding gap is as large as the activation's: your float64 reference used the other GELU. Rounding alone is the float32 tanh MLP against the SAME tanh MLP in float64",
    },
)


def _gap_cases():
    """Three MLPs: (B, T, C, H), the std of proj's weights (hidden values of a few units)."""
    from gpt2lib.chapters.layers import Conv1D

    gen = torch.Generator().manual_seed(4)
    for (B, T, C, H), proj_std in (
        ((2, 5, 16, 64), 0.5),
        ((1, 9, 32, 128), 0.02),
        ((3, 4, 24, 96), 0.1),
    ):
        fc, proj = Conv1D(C, H), Conv1D(H, C)
        with torch.no_grad():
            fc.weight.copy_(torch.randn(C, H, generator=gen) * (2.5 / math.sqrt(C)))
            fc.bias.copy_(torch.randn(H, generator=gen) * 0.5)
            proj.weight.copy_(torch.randn(H, C, generator=gen) * proj_std)
            proj.bias.copy_(torch.randn(C, generator=gen) * 0.1)
        yield fc, proj, torch.randn(B, T, C, generator=gen)


def _layer_tensors(fc, proj):
    return [*fc.state_dict().values(), *proj.state_dict().values()]


def _gaps_match(got, want):
    """The activation gap to 1e-3 (float32 or float64 arithmetic both fine); the rounding gap,
    which depends on the order of the float32 operations, within a factor of 4 and not 0."""
    (a, r), (wa, wr) = got, want
    return math.isclose(a, wa, rel_tol=1e-3, abs_tol=1e-9) and wr / 4 <= r <= wr * 4


def check_approximation_gaps(approximation_gaps) -> None:
    """`approximation_gaps(fc, proj, x (B, T, C))` -> two floats: the largest change of the MLP's
    output from the erf GELU for the tanh one, and from float32 rounding."""
    for fc, proj, x in _gap_cases():
        layers_before, x_before = [t.clone() for t in _layer_tensors(fc, proj)], x.clone()
        got = core.call_learner(EX_GAPS, approximation_gaps, fc, proj, x)
        if not isinstance(got, (tuple, list)) or len(got) != 2:
            raise core.CheckFailed(
                EX_GAPS,
                f"return two numbers, `gap_activation, gap_rounding` (a tuple), got {type(got).__name__}",
            )
        got = tuple(_as_number(EX_GAPS, g) for g in got)
        layers = zip(_layer_tensors(fc, proj), layers_before)
        if any(t.dtype != b.dtype or not torch.equal(t, b) for t, b in layers):
            raise core.CheckFailed(
                EX_GAPS,
                "your function changed the layers it was given (their dtype or values): Module.double() and .to() convert a module IN PLACE. Work on copies (copy.deepcopy(fc).double()), or compute from the weights",
            )
        if not torch.equal(x, x_before):
            raise core.CheckFailed(
                EX_GAPS, "your function changed its input x in place: leave it alone"
            )
        want = _gaps(fc, proj, x)
        if not _gaps_match(got, want):
            zero = "same activation" if got[0] == 0.0 else "float32 reference"
            core.fail_with(
                EX_GAPS,
                GAPS_MISTAKES,
                lambda m: _gaps_match(got, m.fn(fc, proj, x)),
                f"for an MLP {fc.weight.shape[0]} -> {fc.weight.shape[1]} -> {proj.weight.shape[1]} on x {tuple(x.shape)} the gaps are about {want[0]:.3g} (erf for tanh) and {want[1]:.2g} (float32 rounding); you return {got[0]:.3g} and {got[1]:.2g}",
                symptom=zero if 0.0 in got else None,  # a zero gap with the other wrong as well
            )
    core.passed(
        EX_GAPS, "the output's largest change from the activation, and from float32 rounding"
    )


# --------------------------------------------------------------------------- Exercise 4.6: MLP
def _mlp(m, x, *, mistake=""):
    """c_proj(gelu_tanh(c_fc(x))) with the learner's own layers m.c_fc and m.c_proj; `mistake`
    plants one of MLP_MISTAKES by its name (activation: <name>: that one of GELU_MISTAKES)."""
    gelu = functools.partial(_gelu_tanh, mistake=mistake.removeprefix("activation: "))
    h = m.c_fc(gelu(x) if mistake == "activation on the input" else x)
    if mistake not in ("activation after c_proj", "no activation", "activation on the input"):
        h = gelu(h)
    out = m.c_proj(h)
    if mistake in ("activation after c_proj", "activation twice"):
        out = gelu(out)
    return x + out if mistake == "residual inside" else out


# fn(mlp, x) -> a wrong output, computed with the learner's own layers mlp.c_fc and mlp.c_proj
MLP_MISTAKES = core.variants(
    _mlp,
    {
        "activation after c_proj": "the activation comes after c_proj: it belongs BETWEEN the layers, c_proj(gelu(c_fc(x)))",
        "no activation": "there is no activation between c_fc and c_proj, so the two linear layers collapse into one (Exercise 4.2): apply GELU to c_fc's output",
        "activation twice": "GELU is applied twice (also after c_proj): apply it only between the layers",
        "activation on the input": "GELU is applied to the input before c_fc: the order is c_fc, GELU, c_proj",
        "residual inside": "your MLP adds its input to its output (x + ...): the residual connection belongs to the block (chapter 5); the MLP returns c_proj(gelu(c_fc(x))) only",
        **{
            f"activation: {g.name}": "your activation is wrong: " + g.message for g in GELU_MISTAKES
        },
    },
)


def _build_mlp(MLP, pdrop) -> nn.Module:
    mlp = core.call_learner(EX_MLP, MLP, core.tiny_config(n_embd=8, pdrop=pdrop))
    if not isinstance(mlp, nn.Module):
        raise core.CheckFailed(
            EX_MLP, f"MLP(config) should make an nn.Module, got {type(mlp).__name__}"
        )
    for name in ("c_fc", "c_proj"):
        if not isinstance(getattr(mlp, name, None), nn.Module):
            raise core.CheckFailed(
                EX_MLP,
                f"your MLP has no layer called `{name}`: keep the names c_fc and c_proj, because GPT-2's checkpoint stores the weights under them",
            )
    return mlp


def _call(mlp, x):
    """The learner's forward on x, with a `.view` of a strided input named."""
    explain = {
        "view size is not compatible": lambda exc: (
            f"your forward fails on a non-contiguous input (as the model gives it, after a transpose): {exc}. Use .reshape instead of .view, or no reshaping at all: Conv1D and nn.Linear take (B, T, C)"
        )
    }  # forward, not mlp(x): so a wrong signature is named
    return core.call_explaining(EX_MLP, mlp.forward, x, explain=explain)


def check_mlp(MLP) -> None:
    """`MLP(config)`: c_fc (n_embd -> 4·n_embd), tanh GELU, c_proj (4·n_embd -> n_embd), dropout."""
    C, H = 8, 32  # core.tiny_config(n_embd=8), and the 4x wider hidden layer
    mlp = _build_mlp(MLP, pdrop=0.1)
    weight = getattr(mlp.c_fc, "weight", None)
    layout_note = ""
    if isinstance(weight, torch.Tensor) and weight.dim() == 2 and tuple(weight.shape) != (C, H):
        if tuple(weight.shape) == (H, C) and isinstance(mlp.c_fc, nn.Linear):
            layout_note = "; note: your layers are nn.Linear, which store weights [out, in]. GPT-2's checkpoint stores [in, out] (Conv1D), so to load OpenAI's weights (chapter 8) use Conv1D or transpose them"
        elif sorted(weight.shape) == sorted((C, H)):
            raise core.CheckFailed(
                EX_MLP,
                f"c_fc.weight has shape {tuple(weight.shape)}, stored [out, in] but used as [in, out]: with Conv1D(n_embd, 4 * n_embd) from gpt2lib.chapters.attention it is ({C}, {H})",
            )
        else:
            raise core.CheckFailed(
                EX_MLP,
                f"c_fc.weight has shape {tuple(weight.shape)}; with n_embd = {C} it maps {C} to {H} numbers: the hidden layer is 4·n_embd wide (the 4x expansion)",
            )
    # Big random float64 weights, so the hidden values spread over a few units where the
    # activations differ, and rounding never blurs a 1e-4 difference.
    gen = torch.Generator().manual_seed(0)
    with torch.no_grad():
        for p in mlp.parameters():
            p.copy_(torch.randn(p.shape, generator=gen, dtype=torch.float64) * 0.5)
        mlp = mlp.double().eval()
        # (B, T, C), not contiguous: the model hands over the output of transposes and slices
        x = (torch.randn(C, 5, 2, generator=gen, dtype=torch.float64) * 2.0).permute(2, 1, 0)
        got = _call(mlp, x)
        again = mlp(x)
        hints = {(2, 5, H): "c_proj must bring the 4·n_embd hidden values back to n_embd"}
        what = f"the output for an input of shape {tuple(x.shape)}"
        got = core.expect_tensor(EX_MLP, got, x.shape, what=what, hints=hints)
        if not torch.equal(got, again.double()):
            raise core.CheckFailed(
                EX_MLP,
                "in eval mode two calls on the same input gave different outputs: dropout is still on. Use nn.Dropout (it switches off in .eval()), or F.dropout(..., training=self.training)",
            )
        h = mlp.c_fc(x)  # (B, T, hidden)
        if h.shape[-1] != H:
            raise core.CheckFailed(
                EX_MLP, f"c_fc makes {h.shape[-1]} hidden features; it should make 4·n_embd = {H}"
            )
        want = mlp.c_proj(_gelu_tanh(h))
        if not core.close(got, want, atol=1e-7):
            core.fail_with(
                EX_MLP,
                MLP_MISTAKES,
                lambda m: core.close(got, m.fn(mlp, x), atol=1e-7),
                f"the output is not c_proj(gelu_tanh(c_fc(x))) (largest difference {(got - want).abs().max().item():.3g})",
            )
        # Dropout: on in training, on the MLP's output (as GPT-2 does), at config.resid_pdrop.
        mlp.train()
        torch.manual_seed(0)
        if torch.equal(_call(mlp, x).double(), got):
            raise core.CheckFailed(
                EX_MLP,
                "no dropout in training mode: end with nn.Dropout(config.resid_pdrop) on the MLP's output",
            )
        heavy = _build_mlp(MLP, pdrop=0.5).double().train()
        torch.manual_seed(0)
        zeros = (heavy(torch.randn(4, 16, C, dtype=torch.float64)) == 0).double().mean().item()
        if not 0.35 < zeros < 0.65:
            raise core.CheckFailed(
                EX_MLP,
                f"with resid_pdrop = 0.5 about half of the outputs should be dropped (zero) in training, but {zeros:.0%} are: apply nn.Dropout(config.resid_pdrop) to the output of c_proj (not to the hidden layer, not with a fixed rate)",
            )
    core.passed(
        EX_MLP, "c_fc -> tanh GELU -> c_proj -> dropout, with the 4x expansion" + layout_note
    )
