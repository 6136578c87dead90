"""Checks for chapter 4's exercises: GPT-2's GELU, the MLP's parameter count, the MLP module.

Each check runs the learner's answer on small random cases, compares it with the right answer
and with known wrong answers (erf GELU, ReLU, no cubic term, activation in the wrong place, ...),
and names the mistake when one of those matches.
"""

from __future__ import annotations

import math

import torch
import torch.nn as nn
import torch.nn.functional as F

from gpt2lib.checks._core import CheckFailed, call_learner, passed

EX_GELU = "Exercise 4.1 (gelu_tanh)"
EX_COUNT = "Exercise 4.2 (mlp_parameter_count)"
EX_MLP = "Exercise 4.3 (MLP)"

_SQRT_2_OVER_PI = math.sqrt(2.0 / math.pi)


def _gelu_tanh(x: torch.Tensor) -> torch.Tensor:
    """The right answer, written out in float64 so the check does not depend on gpt2lib."""
    return 0.5 * x * (1.0 + torch.tanh(_SQRT_2_OVER_PI * (x + 0.044715 * x**3)))


# Known wrong activations, each with the message that names the mistake.
_WRONG_ACTIVATIONS = [
    (
        "this is the exact GELU, x·Φ(x) with erf (what F.gelu(x) and nn.GELU() compute by "
        "default). GPT-2 uses the tanh approximation: 0.5·x·(1 + tanh(√(2/π)·(x + 0.044715·x³))). "
        "The two differ by up to about 5e-4, enough to stop matching GPT-2's outputs",
        lambda x: F.gelu(x),
    ),
    (
        "this is ReLU (max(0, x)), not GELU: GELU is smooth and slightly negative for negative x",
        lambda x: torch.relu(x),
    ),
    (
        "the 0.044715·x³ term is missing: the tanh's argument is √(2/π)·(x + 0.044715·x³), "
        "not √(2/π)·x",
        lambda x: 0.5 * x * (1.0 + torch.tanh(_SQRT_2_OVER_PI * x)),
    ),
    (
        "the correction term must be cubic: 0.044715·x³ (x**3 or x.pow(3)), not 0.044715·x²",
        lambda x: 0.5 * x * (1.0 + torch.tanh(_SQRT_2_OVER_PI * (x + 0.044715 * x**2))),
    ),
    (
        "the scale inside the tanh is √(2/π) ≈ 0.7979 (math.sqrt(2 / math.pi)), not 2/π ≈ 0.6366",
        lambda x: 0.5 * x * (1.0 + torch.tanh((2.0 / math.pi) * (x + 0.044715 * x**3))),
    ),
    (
        "the leading factor 0.5 is missing: GELU is 0.5·x·(1 + tanh(...)), so that it tends "
        "to x (not 2x) for large x",
        lambda x: x * (1.0 + torch.tanh(_SQRT_2_OVER_PI * (x + 0.044715 * x**3))),
    ),
    (
        "this is the sigmoid approximation x·sigmoid(1.702·x), not GPT-2's tanh form",
        lambda x: x * torch.sigmoid(1.702 * x),
    ),
]


def _close(got: torch.Tensor, want: torch.Tensor, atol: float = 1e-5) -> bool:
    return (
        isinstance(got, torch.Tensor)
        and got.shape == want.shape
        and torch.allclose(got.double(), want.double(), atol=atol, rtol=1e-5)
    )


def _name_activation(got_fn, points: torch.Tensor) -> str | None:
    """The message of the first known-wrong activation that matches `got_fn` on `points`."""
    for message, wrong in _WRONG_ACTIVATIONS:
        if got_fn(wrong, points):
            return message
    return None


# --------------------------------------------------------------------------- Exercise 4.1


def check_gelu_tanh(gelu_tanh) -> None:
    """`gelu_tanh(x)`: tensor of any shape -> tensor of the same shape, element by element."""
    # Points where the erf and tanh forms differ most (|x| near 2.7 and 0.9), plus the easy ones.
    points = torch.tensor(
        [
            [-6.0, -3.5, -2.7, -2.0, -1.5, -0.9, -0.5, 0.0],
            [0.5, 0.9, 1.5, 2.0, 2.7, 3.5, 6.0, 10.0],
        ],
        dtype=torch.float64,
    )  # (2, 8)
    x = points.clone()
    try:
        got = call_learner(EX_GELU, gelu_tanh, x)
    except (TypeError, ValueError, RuntimeError) as exc:
        if "Python scalar" not in str(exc) and "must be real number" not in str(exc):
            raise
        raise CheckFailed(
            EX_GELU,
            f"your function fails on a tensor ({exc}): a function from `math` (math.tanh, "
            "math.exp, ...) works on one number only. Use torch.tanh for the tensor; math.sqrt "
            "and math.pi are fine for the constant √(2/π)",
        ) from None
    if not torch.equal(x, points):
        raise CheckFailed(
            EX_GELU,
            "your function changed its input tensor in place (an operation ending in _, like "
            "x.pow_ or x.mul_, or `x *= ...`): return a new tensor and leave x alone",
        )
    if not isinstance(got, torch.Tensor):
        raise CheckFailed(EX_GELU, f"should return a torch.Tensor, got {type(got).__name__}")
    if got.shape != points.shape:
        raise CheckFailed(
            EX_GELU,
            f"GELU works element by element, so the output must have the input's shape "
            f"{tuple(points.shape)}; got {tuple(got.shape)}",
        )
    want = _gelu_tanh(points)
    if not _close(got, want):
        message = _name_activation(lambda wrong, p: _close(got, wrong(p)), points)
        if message:
            raise CheckFailed(EX_GELU, message)
        worst = (got.double() - want).abs().argmax()
        raise CheckFailed(
            EX_GELU,
            f"wrong value at x = {points.flatten()[worst].item():g}: expected "
            f"{want.flatten()[worst].item():.6f}, got {got.double().flatten()[worst].item():.6f}. "
            "The formula is 0.5·x·(1 + tanh(√(2/π)·(x + 0.044715·x³)))",
        )
    # float32 in, float32 out, same numbers: the model runs in float32
    got32 = call_learner(EX_GELU, gelu_tanh, points.float())
    if not isinstance(got32, torch.Tensor) or got32.dtype != torch.float32:
        dtype = got32.dtype if isinstance(got32, torch.Tensor) else type(got32).__name__
        raise CheckFailed(
            EX_GELU,
            f"a float32 input should give a float32 output, got {dtype}: build the result "
            "from x with torch operations (torch.tanh, x**3) and Python floats",
        )
    if not _close(got32, want, atol=1e-4):
        raise CheckFailed(EX_GELU, "right in float64 but wrong in float32: check your constants")
    passed(EX_GELU, "GPT-2's tanh GELU, and not the erf one")


# --------------------------------------------------------------------------- Exercise 4.2


def check_mlp_parameter_count(mlp_parameter_count) -> None:
    """`mlp_parameter_count(n_embd)` -> int: weights and biases of c_fc and c_proj."""
    for C in (768, 8, 1024, 1600):
        got = call_learner(EX_COUNT, mlp_parameter_count, C)
        if isinstance(got, torch.Tensor) and got.numel() == 1:
            got = got.item()
        if isinstance(got, float) and got.is_integer():
            got = int(got)
        if not isinstance(got, int) or isinstance(got, bool):
            raise CheckFailed(
                EX_COUNT, f"should return an int (a number of parameters), got {got!r}"
            )
        H = 4 * C
        want = C * H + H + H * C + C
        if got == want:
            continue
        wrong = {
            C * H + H * C: "you counted the weights but left out both biases "
            f"(c_fc has {H} = 4·n_embd, c_proj has {C} = n_embd)",
            C * H + H * C + H: f"the bias of c_proj ({C} = n_embd numbers) is missing",
            C * H + H * C + C: f"the bias of c_fc ({H} = 4·n_embd numbers) is missing",
            C * H + H * C + 2 * H: "each layer's bias has as many numbers as that layer has "
            "OUTPUTS: c_fc's bias is 4·n_embd, c_proj's is n_embd (you gave both 4·n_embd)",
            C * H + H * C + 2 * C: "each layer's bias has as many numbers as that layer has "
            "OUTPUTS: c_fc's bias is 4·n_embd, c_proj's is n_embd (you gave both n_embd)",
            2 * (C * C + C): "no expansion: the hidden layer has 4·n_embd units, so c_fc is "
            "n_embd -> 4·n_embd and c_proj is 4·n_embd -> n_embd",
            C * H + H: "you counted only c_fc: add c_proj (4·n_embd -> n_embd, weight and bias)",
            H * C + C: "you counted only c_proj: add c_fc (n_embd -> 4·n_embd, weight and bias)",
        }
        hint = wrong.get(got, f"count c_fc (n_embd x 4·n_embd weight + 4·n_embd bias) and "
                              f"c_proj (4·n_embd x n_embd weight + n_embd bias)")
        raise CheckFailed(
            EX_COUNT, f"for n_embd = {C} expected {want:,} parameters, got {got:,}: {hint}"
        )
    passed(EX_COUNT, "8·n² + 5·n parameters, 4,722,432 for GPT-2 small")


# --------------------------------------------------------------------------- Exercise 4.3


def _small_config(pdrop: float):
    from gpt2lib.config import GPT2Config

    return GPT2Config(n_embd=8, n_head=2, n_layer=1, n_positions=16, vocab_size=11,
                      embd_pdrop=pdrop, attn_pdrop=pdrop, resid_pdrop=pdrop)


def _build_mlp(MLP, config) -> nn.Module:
    mlp = call_learner(EX_MLP, MLP, config)
    if not isinstance(mlp, nn.Module):
        raise CheckFailed(
            EX_MLP, f"MLP(config) should make an nn.Module, got {type(mlp).__name__}"
        )
    for name in ("c_fc", "c_proj"):
        if not isinstance(getattr(mlp, name, None), nn.Module):
            raise CheckFailed(
                EX_MLP,
                f"your MLP has no layer called `{name}`: keep the names c_fc and c_proj, "
                "because GPT-2's checkpoint stores the weights under them",
            )
    return mlp


def check_mlp(MLP) -> None:
    """`MLP(config)`: c_fc (n_embd -> 4·n_embd), tanh GELU, c_proj (4·n_embd -> n_embd), dropout."""
    config = _small_config(pdrop=0.1)
    C, H = config.n_embd, 4 * config.n_embd
    mlp = _build_mlp(MLP, config)

    weight = getattr(mlp.c_fc, "weight", None)
    if isinstance(weight, torch.Tensor) and weight.dim() == 2 and tuple(weight.shape) != (C, H):
        if tuple(weight.shape) == (H, C):
            raise CheckFailed(
                EX_MLP,
                f"c_fc.weight has shape {tuple(weight.shape)}, stored [out, in] like nn.Linear. "
                "GPT-2 stores [in, out]: use Conv1D(n_embd, 4 * n_embd) from gpt2lib.attention",
            )
        raise CheckFailed(
            EX_MLP,
            f"c_fc.weight has shape {tuple(weight.shape)}; with n_embd = {C} it should be "
            f"({C}, {H}): the hidden layer is 4·n_embd wide (the 4x expansion)",
        )

    # Big random weights, so the hidden values spread over a few units where the activations
    # differ; float64 so rounding never blurs a 1e-4 difference.
    gen = torch.Generator().manual_seed(0)
    with torch.no_grad():
        for p in mlp.parameters():
            p.copy_(torch.randn(p.shape, generator=gen, dtype=torch.float64) * 0.5)
    mlp = mlp.double().eval()
    x = torch.randn(2, 5, C, generator=gen, dtype=torch.float64) * 2.0  # (B, T, C)

    with torch.no_grad():
        got = call_learner(EX_MLP, mlp, x)
        again = mlp(x)
        if not isinstance(got, torch.Tensor):
            raise CheckFailed(EX_MLP, f"forward should return a tensor, got {type(got).__name__}")
        if got.shape != x.shape:
            raise CheckFailed(
                EX_MLP,
                f"input {tuple(x.shape)} gave output {tuple(got.shape)}: the MLP must map "
                "(B, T, n_embd) to (B, T, n_embd) (c_proj brings 4·n_embd back to n_embd)",
            )
        if not torch.equal(got, again):
            raise CheckFailed(
                EX_MLP,
                "in eval mode two calls on the same input gave different outputs: dropout is "
                "still on. Use nn.Dropout (it switches off in .eval()), or "
                "F.dropout(..., training=self.training)",
            )
        h = mlp.c_fc(x)  # (B, T, hidden)
        if h.shape[-1] != H:
            raise CheckFailed(
                EX_MLP,
                f"c_fc makes {h.shape[-1]} hidden features; it should make 4·n_embd = {H}",
            )
        want = mlp.c_proj(_gelu_tanh(h))
        if not _close(got, want, atol=1e-7):
            placement = {
                "the activation comes after c_proj: it belongs BETWEEN the layers, "
                "c_proj(gelu(c_fc(x)))": _gelu_tanh(mlp.c_proj(h)),
                "there is no activation between c_fc and c_proj, so the two linear layers "
                "collapse into one: apply GELU to c_fc's output": mlp.c_proj(h),
                "GELU is applied twice (also after c_proj): apply it only between the layers":
                    _gelu_tanh(mlp.c_proj(_gelu_tanh(h))),
                "c_fc is applied but c_proj is not used after the activation":
                    _gelu_tanh(h),
            }
            for message, value in placement.items():
                if value.shape == got.shape and _close(got, value, atol=1e-7):
                    raise CheckFailed(EX_MLP, message)
            message = _name_activation(
                lambda wrong, _: _close(got, mlp.c_proj(wrong(h)), atol=1e-7), h
            )
            if message:
                raise CheckFailed(EX_MLP, "your activation is wrong: " + message)
            raise CheckFailed(
                EX_MLP,
                "the output is not c_proj(gelu_tanh(c_fc(x))) (largest difference "
                f"{(got - want).abs().max().item():.3g})",
            )

        # Dropout: on in training, on the MLP's output (as GPT-2 does), at config.resid_pdrop.
        mlp.train()
        torch.manual_seed(0)
        trained = mlp(x)
        if torch.equal(trained, got):
            raise CheckFailed(
                EX_MLP,
                "no dropout in training mode: end with nn.Dropout(config.resid_pdrop) on the "
                "MLP's output",
            )
        heavy = _build_mlp(MLP, _small_config(pdrop=0.5)).double().train()
        torch.manual_seed(0)
        zeros = (heavy(torch.randn(4, 16, C, dtype=torch.float64)) == 0).double().mean().item()
        if not 0.35 < zeros < 0.65:
            raise CheckFailed(
                EX_MLP,
                f"with resid_pdrop = 0.5 about half of the outputs should be dropped (zero) in "
                f"training, but {zeros:.0%} are: apply nn.Dropout(config.resid_pdrop) to the "
                "output of c_proj (not to the hidden layer, not with a fixed rate)",
            )
    passed(EX_MLP, "c_fc -> tanh GELU -> c_proj -> dropout, with the 4x expansion")
