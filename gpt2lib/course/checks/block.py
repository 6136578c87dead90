"""Checks for chapter 5's exercises: LayerNorm (function and module), the pre-norm, post-norm and
no-residual blocks, the gradient at the input of a stack, and measuring the residual stream."""

from __future__ import annotations

import math
import numbers

import torch
import torch.nn as nn
import torch.nn.functional as F

from gpt2lib.course.checks import _core as core

EX_LN = "Exercise 5.1 (layer_norm)"
EX_LN_MODULE = "Exercise 5.1 (LayerNorm)"
EX_BLOCK = "Exercise 5.2 (Block)"
EX_POST = "Exercise 5.2 (PostNormBlock)"
EX_NO_RESIDUAL = "Exercise 5.2 (NoResidualBlock)"
EX_STREAM = "Exercise 5.4 (follow_stream)"
EX_GRAD = "Exercise 5.3 (input_gradient_norm)"

EPS = 1e-5  # GPT-2's layer_norm_epsilon


def _ln_inputs():
    """(B, T, C) = (2, 3, 8) in float64: ordinary rows, a row with an offset, and nearly
    constant rows whose variance (~4e-6) is close to eps, so that eps mistakes show."""
    gen = torch.Generator().manual_seed(0)
    x = torch.randn(2, 3, 8, generator=gen, dtype=torch.float64)
    x[0, 1] = x[0, 1] * 3.0 + 5.0
    x[1, 0] = x[1, 0] * 2e-3 + 1.0
    x[1, 2] = x[1, 2] * 1e-3
    weight = 1.0 + 0.5 * torch.randn(8, generator=gen, dtype=torch.float64)
    bias = 0.5 * torch.randn(8, generator=gen, dtype=torch.float64)
    return x, weight, bias


_WRONG_DIMS = {"over the batch": (0,), "over the sequence": (1,), "whole tensor": None}


def _layer_norm(x, weight, bias, eps=EPS, *, mistake=""):
    """LayerNorm written out; `mistake` plants one of LAYER_NORM_MISTAKES by its name (the
    "eps 1e-..." ones and "x.std" use their own eps, whatever the argument)."""
    if mistake.startswith("eps 1") or mistake == "x.std":
        eps = 0.0 if mistake == "x.std" else float(mistake.split()[1])
    dims = _WRONG_DIMS.get(mistake, (-1,)) or tuple(range(x.dim()))
    mean = 0.0 if mistake == "rmsnorm" else x.mean(dim=dims, keepdim=True)
    unbiased = mistake in ("unbiased variance", "unbiased, eps outside", "x.std")
    count = math.prod(x.shape[d] for d in dims)
    var = ((x - mean) ** 2).sum(dim=dims, keepdim=True) / (count - unbiased)
    power = 1.0 if mistake == "variance not std" else 0.5
    scale = var**power + eps if mistake.endswith("eps outside") else (var + eps) ** power
    w, b = (bias, weight) if mistake == "swapped" else (weight, bias)
    b = b * w if mistake == "bias first" else b
    w = torch.ones_like(w) if mistake in ("no gain", "no gain, no bias") else w
    b = torch.zeros_like(b) if mistake in ("no bias", "no gain, no bias") else b
    return (x - mean) / scale * w + b


# fn(x, weight, bias, eps) -> what a wrong LayerNorm gives
LAYER_NORM_MISTAKES = core.variants(
    _layer_norm,
    {
        "unbiased variance": "the variance is unbiased (divided by C - 1): torch.var and x.var() do that by default. LayerNorm uses the biased variance: x.var(dim=-1, keepdim=True, unbiased=False) (or correction=0)",
        "eps outside": "eps is added outside the square root: divide by sqrt(var + eps), not sqrt(var) + eps",
        "unbiased, eps outside": "the variance is unbiased (torch.var's default: use unbiased=False) and eps is added outside the square root (use sqrt(var + eps))",
        "variance not std": "you divide by the variance; divide by the standard deviation sqrt(var + eps)",
        "rmsnorm": "the mean is not subtracted (that is RMSNorm): LayerNorm centres each vector first, (x - mean) / sqrt(var + eps)",
        "over the batch": "you normalised over the wrong dimension: LayerNorm works on each token's own C features, the last dimension (dim=-1, keepdim=True)",
        "over the sequence": "you normalised over the wrong dimension (the sequence): use the last dimension (dim=-1, keepdim=True)",
        "whole tensor": "you normalised with one mean and variance for the whole tensor: each token gets its own, over the last dimension (dim=-1, keepdim=True)",
        "no gain, no bias": "the gain and bias are missing: end with `* weight + bias`",
        "no bias": "the bias is missing: end with `* weight + bias`",
        "no gain": "the gain is missing: end with `* weight + bias`",
        "swapped": "weight and bias are swapped: multiply by weight, then add bias",
        "x.std": "you divide by x.std(): that is the unbiased standard deviation (divides by C - 1) and has no eps. Use sqrt(var + eps) with the biased variance, x.var(dim=-1, keepdim=True, unbiased=False)",
        "bias first": "you add bias before multiplying by weight, (x̂ + bias) * weight; the order is x̂ * weight + bias",
    }
    | {
        f"eps {name}": f"your eps looks like {name}; GPT-2's is 1e-5. Add it to the variance inside the square root: sqrt(var + eps)"
        for name in ("1e-12 (BERT's value) or 0 (none at all)", "1e-6", "1e-8", "1e-10", "1e-3")
    },
)


def _expect_layer_norm(exercise, got, x, weight, bias, what):
    """Raise naming the planted mistake when `got` is not F.layer_norm(x) (same shape as x)."""
    want = F.layer_norm(x, x.shape[-1:], weight, bias, EPS)
    otherwise = f"{what} differs from F.layer_norm by up to {(got.double() - want).abs().max():.3g}. LayerNorm: mean and biased variance over the last dimension, (x - mean) / sqrt(var + eps) * weight + bias"
    core.fail_unless_close(
        exercise, got, want, LAYER_NORM_MISTAKES, (x, weight, bias), otherwise, atol=1e-7
    )


# --------------------------------------------------------------------------- Exercise 5.1
def check_layer_norm(layer_norm) -> None:
    """`layer_norm(x, weight, bias, eps=1e-5)`: (..., C) -> (..., C)."""
    layer_norm = core.refusing(
        EX_LN,
        layer_norm,
        "torch.nn.functional.layer_norm",
        "torch.layer_norm",
        instead="write the formula (nn.LayerNorm calls F.layer_norm too)",
    )
    x, weight, bias = _ln_inputs()
    x_in = x.clone()
    explain = {
        "must match the size": lambda exc: (
            f"for x of shape {tuple(x.shape)} your function fails ({exc}). The mean and the variance lose their last dimension unless you keep it: x.mean(dim=-1, keepdim=True) has shape (..., 1), which broadcasts against x (..., C)"
        )
    }
    got = core.call_explaining(EX_LN, layer_norm, x_in, weight, bias, explain=explain)
    if not torch.equal(x_in, x):
        raise core.CheckFailed(
            EX_LN, "your function changed x in place (x -= mean, x.sub_, ...): compute new tensors"
        )
    if not isinstance(got, torch.Tensor):
        raise core.CheckFailed(EX_LN, f"should return a torch.Tensor, got {type(got).__name__}")
    if got.shape != x.shape:
        raise core.CheckFailed(
            EX_LN,
            f"input {tuple(x.shape)} gave output {tuple(got.shape)}: LayerNorm keeps the shape (did you forget keepdim=True on the mean or the variance?)",
        )
    _expect_layer_norm(EX_LN, got, x, weight, bias, "your output")
    for eps in (1e-3, 1e-12):
        got_eps = core.call_learner(EX_LN, layer_norm, x.clone(), weight, bias, eps=eps)
        if not core.close(got_eps, F.layer_norm(x, (8,), weight, bias, eps), atol=1e-7):
            raise core.CheckFailed(
                EX_LN,
                f"with eps={eps:g} your output is wrong: use the `eps` argument (inside the square root) instead of a fixed number",
            )
    try:
        tokens = core.call_learner(EX_LN, layer_norm, x[0].float(), weight.float(), bias.float())
    except (IndexError, RuntimeError) as exc:
        raise core.CheckFailed(
            EX_LN,
            f"a 2-D input (T, C) fails ({exc}): use dim=-1 (the last dimension), not dim=2, so any number of leading dimensions works",
        ) from None
    if not isinstance(tokens, torch.Tensor) or tokens.shape != x[0].shape:
        raise core.CheckFailed(EX_LN, "a 2-D input (T, C) should work too: use dim=-1, not dim=2")
    if tokens.dtype != torch.float32:
        raise core.CheckFailed(EX_LN, f"float32 input gave {tokens.dtype} output: keep x's dtype")
    core.passed(EX_LN, "mean and biased variance over the last dimension, eps inside the root")


_START = {
    "weight": "`weight` should start as ones (torch.ones(n_embd)): a fresh LayerNorm only normalises; with zeros its output would be all zeros (bias) and nothing would flow",
    "bias": "`bias` should start as zeros (torch.zeros(n_embd))",
}


def check_layer_norm_module(LayerNorm) -> None:
    """`LayerNorm(n_embd, eps=1e-5)` with parameters `weight` (ones) and `bias` (zeros)."""
    x, weight, bias = _ln_inputs()
    C = x.shape[-1]
    ln = core.call_learner(EX_LN_MODULE, LayerNorm, C)
    if not isinstance(ln, nn.Module):
        raise core.CheckFailed(
            EX_LN_MODULE, f"LayerNorm(n) should make an nn.Module, got {type(ln).__name__}"
        )
    params = dict(ln.named_parameters())
    if not params:
        raise core.CheckFailed(
            EX_LN_MODULE,
            "the module has no parameters: wrap weight and bias in nn.Parameter, so that they are trained and saved in state_dict (and GPT-2's weights can load into them)",
        )
    if set(params) != {"weight", "bias"}:
        raise core.CheckFailed(
            EX_LN_MODULE,
            f"the parameters are named {sorted(params)}; name them `weight` and `bias`: GPT-2's checkpoint stores h.N.ln_1.weight and h.N.ln_1.bias (the gain and the shift)",
        )
    for name, start in (("weight", 1.0), ("bias", 0.0)):
        p = params[name].detach()
        if tuple(p.shape) != (C,):
            raise core.CheckFailed(
                EX_LN_MODULE,
                f"`{name}` has shape {tuple(p.shape)}; it should be (n_embd,) = ({C},)",
            )
        if not torch.equal(p, torch.full((C,), start, dtype=p.dtype)):
            raise core.CheckFailed(EX_LN_MODULE, _START[name])
    strided = x.transpose(0, 1).contiguous().transpose(0, 1)  # as the model passes it
    with torch.no_grad():
        for eps in (EPS, 1e-3):  # the module made above, then LayerNorm(n_embd, eps=1e-3)
            ln = ln if eps == EPS else core.call_learner(EX_LN_MODULE, LayerNorm, C, eps)
            ln = ln.double()
            ln.weight.copy_(weight)
            ln.bias.copy_(bias)
            got = core.call_learner(EX_LN_MODULE, ln.forward, strided)
            if eps == EPS:
                if not isinstance(got, torch.Tensor) or got.shape != x.shape:
                    raise core.CheckFailed(
                        EX_LN_MODULE, f"LayerNorm(n_embd)(x) should keep x's shape {tuple(x.shape)}"
                    )
                _expect_layer_norm(EX_LN_MODULE, got, x, weight, bias, "LayerNorm(n_embd)(x)")
            elif not core.close(got, F.layer_norm(x, (C,), weight, bias, eps), atol=1e-7):
                raise core.CheckFailed(
                    EX_LN_MODULE,
                    "LayerNorm(n_embd, eps=1e-3) does not use eps = 1e-3: store the `eps` argument (self.eps = eps) and use it in forward",
                )
    core.passed(EX_LN_MODULE, "weight and bias named as in GPT-2's checkpoint, right numbers")


# --------------------------------------------------------------------------- Exercise 5.2
class _PlainAttention(nn.Module):
    """An attention as a learner may write it in chapter 3: no kv_cache argument."""

    def __init__(self, config):
        super().__init__()
        self.proj = nn.Linear(config.n_embd, config.n_embd)

    def forward(self, x):
        return self.proj(x).cumsum(dim=1)  # depends on earlier positions, like attention


class _RecordingAttention(_PlainAttention):
    """Remembers the kv_cache it was given."""

    def forward(self, x, kv_cache=None):
        self.seen = getattr(self, "seen", []) + [kv_cache]
        return super().forward(x)


# fn(block, x) -> a block's output, computed with the learner's own ln_1, attn, ln_2, mlp: the pre-
# and post-norm blocks' planted mistakes by name, among them the three right answers (the right
# answer of one block is a mistake for the others)
_FORMS = {
    "post-norm": lambda b, x: b.ln_2((h := b.ln_1(x + b.attn(x))) + b.mlp(h)),
    "no attention residual": lambda b, x: (h := b.attn(b.ln_1(x))) + b.mlp(b.ln_2(h)),
    "no MLP residual": lambda b, x: b.mlp(b.ln_2(x + b.attn(b.ln_1(x)))),
    "ln_1 twice": lambda b, x: (h := x + b.attn(b.ln_1(x))) + b.mlp(b.ln_1(h)),
    "normalised stream": lambda b, x: (n := b.ln_2((s := b.ln_1(x)) + b.attn(s))) + b.mlp(n),
    "parallel": lambda b, x: x + b.attn(b.ln_1(x)) + b.mlp(b.ln_2(x)),
    "pre-norm": lambda b, x: (h := x + b.attn(b.ln_1(x))) + b.mlp(b.ln_2(h)),
    "no final norm": lambda b, x: (h := b.ln_1(x + b.attn(x))) + b.mlp(h),
    "norm inside": lambda b, x: (h := x + b.ln_1(b.attn(x))) + b.ln_2(b.mlp(h)),
    "sublayer reads normalised": lambda b, x: b.ln_2(
        (h := b.ln_1(x + b.attn(b.ln_1(x)))) + b.mlp(b.ln_2(h))
    ),
    "no residuals": lambda b, x: b.mlp(b.ln_2(b.attn(b.ln_1(x)))),
    "swapped norms": lambda b, x: (h := x + b.attn(b.ln_2(x))) + b.mlp(b.ln_1(h)),
    "MLP first": lambda b, x: (h := x + b.mlp(b.ln_2(x))) + b.attn(b.ln_1(h)),
    "no norms": lambda b, x: (h := x + b.attn(x)) + b.mlp(h),
}
_ORDER_MISTAKES = core.planted(  # shared by the pre- and post-norm blocks
    _FORMS.__getitem__,
    {
        "no residuals": "both residual connections are missing: add each sublayer's output to its input",
        "swapped norms": "ln_1 and ln_2 are swapped: ln_1 belongs to attention, ln_2 to the MLP",
        "MLP first": "the MLP comes before attention: GPT-2's block runs attention first, then the MLP",
        "no norms": "the LayerNorms are not used: x = x + attn(ln_1(x)); x = x + mlp(ln_2(x))",
    },
)
BLOCK_MISTAKES = (
    core.planted(
        _FORMS.__getitem__,
        {
            "post-norm": "this is the post-norm block of the original Transformer, ln(x + sublayer(x)). GPT-2 is pre-norm: normalise the sublayer's INPUT and add its output to the unnormalised stream: x = x + attn(ln_1(x)); x = x + mlp(ln_2(x))",
            "no attention residual": "the residual connection around attention is missing: x = x + attn(ln_1(x))",
            "no MLP residual": "the residual connection around the MLP is missing: x = x + mlp(ln_2(x))",
            "ln_1 twice": "you used ln_1 twice: the MLP's input goes through ln_2, x + mlp(ln_2(x))",
            "normalised stream": "the stream itself was normalised (x = ln_1(x), then x + attn(x)): keep x as it is and give only the sublayer a normalised copy, x + attn(ln_1(x))",
            "parallel": "the MLP reads x instead of the stream after attention: first h = x + attn(ln_1(x)), then h + mlp(ln_2(h))",
        },
    )
    + _ORDER_MISTAKES
)
POST_NORM_MISTAKES = (
    core.planted(
        _FORMS.__getitem__,
        {
            "pre-norm": "this is GPT-2's pre-norm block again: post-norm adds first and then normalises the stream itself, x = ln_1(x + attn(x)), then x = ln_2(x + mlp(x))",
            "no final norm": "the MLP's sum is not normalised: post-norm ends with ln_2(x + mlp(x))",
            "norm inside": "you normalised the sublayer's output before adding, x + ln(sublayer(x)): post-norm normalises the SUM, ln(x + sublayer(x))",
            "sublayer reads normalised": "the sublayers read a normalised copy, ln(x + sublayer(ln(x))): in post-norm each sublayer reads the stream as it is, ln(x + sublayer(x))",
        },
    )
    + _ORDER_MISTAKES
)
# fn(block, x) -> a wrong output of the block without residual connections
NO_RESIDUAL_MISTAKES = core.planted(
    {
        "residuals kept": _FORMS["pre-norm"],
        "attention residual kept": _FORMS["no MLP residual"],
        "MLP residual kept": _FORMS["no attention residual"],
        "MLP reads the input": lambda b, x: b.attn(b.ln_1(x)) + b.mlp(b.ln_2(x)),
        "no norms": lambda b, x: b.mlp(b.attn(x)),
        "swapped norms": lambda b, x: b.mlp(b.ln_1(b.attn(b.ln_2(x)))),
    }.__getitem__,
    {
        "residuals kept": "this is GPT-2's pre-norm block with both residual connections: take them out, each sublayer's output replaces the stream, x = attn(ln_1(x)), then x = mlp(ln_2(x))",
        "attention residual kept": "the residual connection around attention is still there: x = attn(ln_1(x)), not x + attn(ln_1(x))",
        "MLP residual kept": "the residual connection around the MLP is still there: return mlp(ln_2(x)), not x + mlp(ln_2(x))",
        "MLP reads the input": "the MLP reads the block's input: without residuals the MLP reads what attention returned, mlp(ln_2(attn(ln_1(x))))",
        "no norms": "the LayerNorms are gone too: only the residual connections go, each sublayer still reads a normalised copy, mlp(ln_2(attn(ln_1(x))))",
        "swapped norms": core.named(_ORDER_MISTAKES, "swapped norms").message,
    },
)


def _make_block(exercise, Block, config, **kwargs):
    """call_learner, but a stub in an earlier exercise (say LayerNorm) is named in the message."""
    try:
        return core.call_learner(exercise, Block, config, **kwargs)
    except core.CheckFailed as failure:
        cause = failure.__context__
        if isinstance(cause, NotImplementedError) and str(cause):
            raise core.NotDoneYet(
                exercise,
                f"not done yet: building the block raised NotImplementedError('{cause}'). Finish that exercise, run its cell and the Block cell, then run this check again.",
            ) from None
        raise


def _check_block(exercise, Block, right, mistakes, what):
    """The driver of the three blocks: names and modules, the output with random float64 weights
    (LayerNorm's too, so that ln_1 and ln_2 differ) on a strided input against `right` and the
    planted `mistakes`, then dropout in training mode. Returns the config and the input."""
    config = core.tiny_config(n_embd=8)
    block = _make_block(exercise, Block, config)
    if not isinstance(block, nn.Module):
        raise core.CheckFailed(
            exercise,
            f"{getattr(Block, '__name__', 'Block')}(config) should make an nn.Module, got {type(block).__name__}",
        )
    for name in ("ln_1", "attn", "ln_2", "mlp"):
        if not isinstance(getattr(block, name, None), nn.Module):
            raise core.CheckFailed(
                exercise,
                f"your block has no submodule `{name}`: keep the names ln_1, attn, ln_2, mlp, which GPT-2's checkpoint uses (h.N.ln_1.weight, h.N.attn.c_attn.weight, ...)",
            )
    if block.ln_1 is block.ln_2:
        raise core.CheckFailed(exercise, "ln_1 and ln_2 are the same module: make two LayerNorms")
    gen = torch.Generator().manual_seed(0)
    with torch.no_grad():
        for p in block.parameters():
            gain = 1.0 if p.dim() == 1 and p.shape[0] == config.n_embd else 0.0
            p.copy_(torch.randn(p.shape, generator=gen, dtype=torch.float64) * 0.4 + gain)
        block = block.double().eval()
        x = torch.randn(8, 5, 2, generator=gen, dtype=torch.float64) * 2.0 + 0.5
        x = x.permute(2, 1, 0)  # (B, T, C), not contiguous
        got = core.call_learner(exercise, block.forward, x)  # forward: a wrong signature is named
        what_got = f"the output for x of shape {tuple(x.shape)}"
        got = core.expect_tensor(exercise, got, x.shape, what=what_got)
        want = right(block, x)
        otherwise = (
            f"the output is not the {what} (largest difference {(got - want).abs().max():.3g})"
        )
        core.fail_unless_close(exercise, got, want, mistakes, (block, x), otherwise, atol=1e-6)
        # With dropout in the sublayers, training mode must differ from eval mode (nothing forces
        # eval inside forward) and eval mode must be repeatable.
        block = _make_block(exercise, Block, core.tiny_config(n_embd=8, pdrop=0.5)).eval()
        x_drop = torch.randn(2, 5, 8, generator=torch.Generator().manual_seed(1))
        first = block(x_drop)
        if not torch.equal(first, block(x_drop)):
            raise core.CheckFailed(
                exercise,
                "in eval mode two calls gave different outputs: something random runs outside the sublayers' dropout",
            )
        block.train()
        torch.manual_seed(0)
        if torch.equal(block(x_drop), first):
            raise core.CheckFailed(
                exercise,
                "in training mode the output equals eval mode's, though the sublayers have dropout: do not switch modes (.eval()) inside forward",
            )
    return config, x


def check_block(Block) -> None:
    """`Block(config, attention_cls, mlp_cls)`: (B, T, C) -> (B, T, C), x + attn(ln_1(x)), then
    x + mlp(ln_2(x)); `kv_cache` handed to attention only when given."""
    what = "pre-norm block x = x + attn(ln_1(x)); x = x + mlp(ln_2(x))"
    config, x = _check_block(EX_BLOCK, Block, _FORMS["pre-norm"], BLOCK_MISTAKES, what)
    plain = _make_block(EX_BLOCK, Block, config, attention_cls=_PlainAttention)
    try:
        plain(x.float())
    except TypeError as exc:
        raise core.CheckFailed(
            EX_BLOCK,
            f"with an attention whose forward takes only x, block(x) failed ({exc}). When kv_cache is None call self.attn(h) without it, so chapter 3's attention still works",
        ) from None
    recording = _make_block(EX_BLOCK, Block, config, attention_cls=_RecordingAttention)
    marker = object()
    try:
        recording(x.float(), kv_cache=marker)
    except TypeError as exc:
        raise core.CheckFailed(
            EX_BLOCK, f"block(x, kv_cache=cache) failed ({exc}): forward(self, x, kv_cache=None)"
        ) from None
    if marker not in getattr(recording.attn, "seen", []):
        raise core.CheckFailed(
            EX_BLOCK,
            "block(x, kv_cache=cache) did not hand the cache to attention: when kv_cache is not None call self.attn(ln_1(x), kv_cache=kv_cache) (chapter 9's fast generation needs it)",
        )
    core.passed(EX_BLOCK, "pre-norm, two residual connections, kv_cache passed on to attention")


def check_post_norm_block(PostNormBlock) -> None:
    """`PostNormBlock(config)`: (B, T, C) -> (B, T, C), x = ln_1(x + attn(x)), x = ln_2(x + mlp(x))."""
    what = "post-norm block x = ln_1(x + attn(x)); x = ln_2(x + mlp(x))"
    _check_block(EX_POST, PostNormBlock, _FORMS["post-norm"], POST_NORM_MISTAKES, what)
    core.passed(EX_POST, "add, then normalise the stream: the original Transformer's order")


def check_no_residual_block(NoResidualBlock) -> None:
    """`NoResidualBlock(config)`: (B, T, C) -> (B, T, C), mlp(ln_2(attn(ln_1(x))))."""
    what = "block without residuals, x = attn(ln_1(x)); x = mlp(ln_2(x))"
    _check_block(
        EX_NO_RESIDUAL, NoResidualBlock, _FORMS["no residuals"], NO_RESIDUAL_MISTAKES, what
    )
    core.passed(EX_NO_RESIDUAL, "each sublayer replaces the stream; the LayerNorms stay in front")


# --------------------------------------------------------------------------- Exercise 5.4
def _stream(blocks, x0, *, mistake=""):
    """The right (norms, cosines); `mistake` plants one of STREAM_MISTAKES by its name."""
    size = {
        "norm of the whole tensor": lambda x: x.norm(),
        "rms": lambda x: x.pow(2).mean().sqrt(),
        "squared norm": lambda x: x.pow(2).sum(-1).mean(),
    }.get(mistake, lambda x: x.norm(dim=-1).mean())
    cosine = {
        "cosine of the flattened tensors": lambda x: F.cosine_similarity(
            x.flatten(), x0.flatten(), dim=0
        ),
        "cosine over the wrong dimension": lambda x: F.cosine_similarity(x, x0, dim=1).mean(),
        "dot product": lambda x: (x * x0).sum(-1).mean(),
    }.get(mistake, lambda x: F.cosine_similarity(x, x0, dim=-1).mean())
    norms, cosines = ([], []) if mistake == "no input entry" else ([size(x0).item()], [1.0])
    x = x0
    with torch.no_grad():
        for block in blocks:
            x = block(x0 if mistake == "not chained" else x)
            norms.append(size(x).item())
            cosines.append(cosine(x).item())
    return norms, cosines


# fn(blocks, x0) -> (norms, cosines) of a wrong measurement
STREAM_MISTAKES = core.variants(
    _stream,
    {
        "not chained": "every block was applied to x0: the blocks run one after another, each on the output of the one before (x = block(x))",
        "norm of the whole tensor": "your sizes are the norm of the whole (B, T, C) tensor: take each token's norm, x.norm(dim=-1), then the mean over the B · T tokens",
        "rms": "your sizes are the root mean square of the numbers (norm / √C): the size here is each token's Euclidean norm, x.norm(dim=-1), averaged over the tokens",
        "squared norm": "your sizes are squared norms: take x.norm(dim=-1) (the square root of the sum of squares), then the mean",
        "cosine of the flattened tensors": "your cosines compare the whole flattened tensors: compare each token with the same token of x0, F.cosine_similarity(x, x0, dim=-1), then average",
        "cosine over the wrong dimension": "your cosines are taken over the wrong dimension: each token's C features are its vector, so use dim=-1",
        "dot product": "your 'cosines' are dot products: divide by both norms, or use F.cosine_similarity(x, x0, dim=-1)",
        "no input entry": "entry 0 must be the input itself (its norm, and cosine 1), so each list has len(blocks) + 1 entries: start the lists before the loop",
    },
)


class _Scale(nn.Module):
    """A stand-in block: scales and shifts the stream, so chaining, sizes and angles all show."""

    def __init__(self, factor, shift):
        super().__init__()
        self.factor, self.shift = factor, shift

    def forward(self, x):
        return self.factor * x + self.shift.to(x.dtype)


def _near(a, b):
    return math.isclose(a, float(b), rel_tol=1e-4, abs_tol=1e-6)


def _same_stream(candidate, got):
    return all(
        len(right) == len(mine) and all(_near(a, b) for a, b in zip(right, mine))
        for right, mine in zip(candidate, got)
    )


def check_follow_stream(follow_stream) -> None:
    """`follow_stream(blocks, x0)` -> (norms, cosines), lists of Python floats, each of length
    len(blocks) + 1; tried on two stacks and shapes, x0 left as it was."""
    gen = torch.Generator().manual_seed(0)
    for C, factors, shape in ((6, (1.5, 0.5, 2.0), (2, 4)), (5, (0.7, 3.0), (3, 2))):
        blocks = nn.ModuleList(_Scale(f, torch.randn(C, generator=gen)) for f in factors)
        x0 = torch.randn(*shape, C, generator=gen) + 0.3  # (B, T, C)
        x0_before = x0.clone()
        got = core.call_learner(EX_STREAM, follow_stream, blocks, x0)
        if not torch.equal(x0, x0_before):
            raise core.CheckFailed(
                EX_STREAM,
                "your function changed x0 in place (x += ..., x0.mul_): keep x0 unchanged, you compare with it at every step",
            )
        core.unpack(EX_STREAM, got, 2, "two lists, (norms, cosines)")
        if not all(
            isinstance(part, (list, tuple)) and all(isinstance(v, numbers.Real) for v in part)
            for part in got
        ):
            raise core.CheckFailed(
                EX_STREAM,
                "norms and cosines should be lists of Python floats: use .item() on a one-number tensor",
            )
        want = _stream(blocks, x0)
        if not _same_stream(want, got):
            mistake = core.first_mistake(
                STREAM_MISTAKES, lambda m: _same_stream(m.fn(blocks, x0), got)
            )
            if mistake is not None:
                raise core.CheckFailed(EX_STREAM, mistake.message)
        n = len(blocks) + 1
        for values, right, what in zip(got, want, ("norms", "cosines")):
            if len(values) != n:
                raise core.CheckFailed(
                    EX_STREAM,
                    f"with {n - 1} blocks each list should have {n} entries (the input, then one per block), got {len(values)}",
                )
            for i, (a, b) in enumerate(zip(values, right)):
                if not _near(b, a):
                    where = "the input" if i == 0 else f"block {i}"
                    raise core.CheckFailed(
                        EX_STREAM, f"your {what}[{i}] (after {where}) is {a:.5g}, expected {b:.5g}"
                    )
    core.passed(EX_STREAM, "the stream's size and its cosine with the input, block by block")


# --------------------------------------------------------------------------- Exercise 5.3
def _input_gradient(blocks, x0, direction, *, mistake=""):
    """The mean per-token norm of d((out * direction).sum()) / d x0; `mistake` plants one of
    GRAD_MISTAKES by its name."""
    x = x0.detach().clone().requires_grad_(True)
    out = x
    for block in blocks:
        out = block(out)
    loss = out.sum() if mistake == "no_direction" else (out * direction).sum()
    (grad,) = torch.autograd.grad(loss, x)
    return grad.norm().item() if mistake == "whole_norm" else grad.norm(dim=-1).mean().item()


GRAD_MISTAKES = core.variants(
    _input_gradient,
    {
        "whole_norm": "you return the norm of the whole gradient; the question is each token's norm (g.norm(dim=-1)), averaged over the B · T tokens",
        "no_direction": "you took the gradient of out.sum(); the loss is (out * direction).sum()",
    },
)


def check_input_gradient_norm(input_gradient_norm) -> None:
    """`input_gradient_norm(blocks, x0, direction)` -> a float: the mean per-token norm of the
    gradient of (out * direction).sum() with respect to x0; x0 and the parameters untouched.
    Tried on GPT-2 blocks with large weights, on stand-ins in float64, and on no blocks."""
    from gpt2lib.chapters.block import Block

    gen = torch.Generator().manual_seed(3)
    with torch.random.fork_rng():  # building blocks draws random numbers: leave the notebook's
        gpt2 = nn.ModuleList(Block(core.tiny_config(n_embd=8)) for _ in range(3)).eval()
    with torch.no_grad():
        for p in gpt2.parameters():
            p.copy_(torch.randn(p.shape, generator=gen) * 0.1)
    cases = [
        (gpt2, torch.randn(2, 5, 8, generator=gen)),
        ([_Scale(0.5, torch.zeros(8)), _Scale(3.0, torch.ones(8))], torch.randn(3, 4, 8).double()),
        ([], torch.randn(1, 6, 8, generator=gen)),
    ]
    for blocks, x0 in cases:
        direction, kept = torch.randn(x0.shape, generator=gen).to(x0.dtype), x0.clone()
        got = core.call_learner(EX_GRAD, input_gradient_norm, blocks, x0, direction)
        if isinstance(got, bool) or not isinstance(got, numbers.Real):
            what = "a tensor: use .item()" if isinstance(got, torch.Tensor) else type(got).__name__
            raise core.CheckFailed(EX_GRAD, f"return a Python float, got {what}")
        if not torch.equal(x0, kept) or x0.requires_grad or x0.grad is not None:
            raise core.CheckFailed(
                EX_GRAD,
                "x0 is not as it was (changed, or left with requires_grad or a .grad): take a copy, x0.detach().clone().requires_grad_(True)",
            )
        if any(p.grad is not None for b in blocks for p in b.parameters()):
            raise core.CheckFailed(
                EX_GRAD,
                "the blocks' parameters now carry a .grad (loss.backward() fills them): use torch.autograd.grad(loss, x), which returns the gradient and leaves them alone",
            )
        want = _input_gradient(blocks, x0, direction)
        if not math.isclose(got, want, rel_tol=1e-4, abs_tol=1e-6):
            core.fail_with(
                EX_GRAD,
                GRAD_MISTAKES,
                lambda m: math.isclose(got, m.fn(blocks, x0, direction), rel_tol=1e-4),
                f"for {len(blocks)} blocks on x0 {tuple(x0.shape)} you return {got:.4g}, expected {want:.4g}",
            )
    core.passed(EX_GRAD, "the gradient at the input, per token, with x0 and the weights left alone")


# --------------------------------------------------------------------------- Challenge
CHALLENGE_DEEP = "Challenge (keep the input alive through 48 blocks)"
DEEP_GOALS = dict(n_layer=48, weight_std=0.1, min_cosine=0.5, min_update=0.02)


def deep_stack_scores(block_cls) -> dict:
    """48 blocks of block_cls (n_embd 64, 4 heads, no dropout), every weight matrix drawn from
    N(0, 0.1²) by the check: the input's cosine after the last block, and the smallest mean
    relative update of any block, |block(x) - x| / |x|."""
    config = core.tiny_config(
        n_embd=64, n_head=4, n_layer=DEEP_GOALS["n_layer"], n_positions=1024, vocab_size=50257
    )
    with torch.random.fork_rng():
        torch.manual_seed(0)
        blocks = nn.ModuleList(block_cls(config) for _ in range(config.n_layer))
        with torch.no_grad():
            for p in blocks.parameters():
                if p.dim() == 2:
                    p.normal_(std=DEEP_GOALS["weight_std"])
        x0 = torch.randn(4, 32, config.n_embd, generator=torch.Generator().manual_seed(0))
    blocks.eval()
    x, updates = x0, []
    with torch.no_grad():
        for block in blocks:
            new = block(x)
            core.expect_tensor(CHALLENGE_DEEP, new, x.shape, what="the stream after a block")
            updates.append(((new - x).norm(dim=-1) / x.norm(dim=-1)).mean().item())
            x = new
    return {"cosine": F.cosine_similarity(x, x0, dim=-1).mean().item(), "min_update": min(updates)}


def check_deep_stack(block_cls) -> dict:
    """The challenge: after 48 blocks the stream keeps cosine >= 0.5 with its input, and every
    block still changes it by at least 2% of its size."""
    scores = deep_stack_scores(block_cls)
    if scores["min_update"] < DEEP_GOALS["min_update"]:
        raise core.CheckFailed(
            CHALLENGE_DEEP,
            f"one block changes the stream by only {scores['min_update']:.4f} of its size (the goal: at least {DEEP_GOALS['min_update']}): a block that does nothing keeps the input trivially",
        )
    if scores["cosine"] < DEEP_GOALS["min_cosine"]:
        raise core.CheckFailed(
            CHALLENGE_DEEP,
            f"after 48 blocks the cosine with the input is {scores['cosine']:.4f}; the goal is {DEEP_GOALS['min_cosine']}",
        )
    core.passed(
        CHALLENGE_DEEP,
        f"cosine with the input {scores['cosine']:.4f} after 48 blocks, smallest update {scores['min_update']:.4f}",
    )
    return scores
