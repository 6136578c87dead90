"""Checks for chapter 5's exercises: LayerNorm from scratch, the LayerNorm module, the block.

Each check runs the learner's answer on small random cases, compares it with the right answer
and with known wrong answers (unbiased variance, wrong eps, post-norm, missing residual, ...),
and names the mistake when one of those matches.
"""

from __future__ import annotations

import torch
import torch.nn as nn
import torch.nn.functional as F

from gpt2lib.checks._core import CheckFailed, call_learner, passed

EX_LN = "Exercise 5.1 (layer_norm)"
EX_LN_MODULE = "Exercise 5.2 (LayerNorm)"
EX_BLOCK = "Exercise 5.3 (Block)"

EPS = 1e-5  # GPT-2's layer_norm_epsilon


def _close(got, want, atol: float = 1e-7) -> bool:
    return (
        isinstance(got, torch.Tensor)
        and got.shape == want.shape
        and torch.allclose(got.double(), want.double(), atol=atol, rtol=1e-6)
    )


def _ln_inputs():
    """(B, T, C) = (2, 3, 8) in float64: ordinary rows, rows with an offset, and nearly
    constant rows whose variance (~4e-6) is close to eps, so that eps mistakes show."""
    gen = torch.Generator().manual_seed(0)
    C = 8
    x = torch.randn(2, 3, C, generator=gen, dtype=torch.float64)
    x[0, 1] = x[0, 1] * 3.0 + 5.0  # big offset: the mean must be subtracted
    x[1, 0] = x[1, 0] * 2e-3 + 1.0  # nearly constant rows: var ~ 4e-6, close to eps
    x[1, 2] = x[1, 2] * 1e-3
    weight = 1.0 + 0.5 * torch.randn(C, generator=gen, dtype=torch.float64)
    bias = 0.5 * torch.randn(C, generator=gen, dtype=torch.float64)
    return x, weight, bias


def _manual(x, weight, bias, *, eps=EPS, dim=-1, unbiased=False, eps_outside=False,
            center=True, power=0.5):
    """LayerNorm written out, with switches for the usual mistakes (dim=None: whole tensor)."""
    dims = tuple(range(x.dim())) if dim is None else (dim,)
    count = 1
    for d in dims:
        count *= x.shape[d]
    mean = x.mean(dim=dims, keepdim=True) if center else torch.zeros((), dtype=x.dtype)
    var = ((x - mean) ** 2).sum(dim=dims, keepdim=True) / (count - (1 if unbiased else 0))
    scale = var**power + eps if eps_outside else (var + eps) ** power
    return (x - mean) / scale * weight + bias


def _layer_norm_mistakes(x, weight, bias):
    """(message, wrong output) pairs for the usual LayerNorm mistakes."""
    m = _manual
    mistakes = [
        ("the variance is unbiased (divided by C - 1): torch.var and x.var() do that by "
         "default. LayerNorm uses the biased variance: x.var(dim=-1, keepdim=True, "
         "unbiased=False) (or correction=0)", m(x, weight, bias, unbiased=True)),
        ("eps is added outside the square root: divide by sqrt(var + eps), not sqrt(var) + eps",
         m(x, weight, bias, eps_outside=True)),
        ("the variance is unbiased (torch.var's default: use unbiased=False) and eps is added "
         "outside the square root (use sqrt(var + eps))",
         m(x, weight, bias, unbiased=True, eps_outside=True)),
        ("you divide by the variance; divide by the standard deviation sqrt(var + eps)",
         m(x, weight, bias, power=1.0)),
        ("the mean is not subtracted (that is RMSNorm): LayerNorm centres each vector "
         "first, (x - mean) / sqrt(var + eps)", m(x, weight, bias, center=False)),
        ("you normalised over the wrong dimension: LayerNorm works on each token's own C "
         "features, the last dimension (dim=-1, keepdim=True)", m(x, weight, bias, dim=0)),
        ("you normalised over the wrong dimension (the sequence): use the last dimension "
         "(dim=-1, keepdim=True)", m(x, weight, bias, dim=1)),
        ("you normalised with one mean and variance for the whole tensor: each token gets its "
         "own, over the last dimension (dim=-1, keepdim=True)", m(x, weight, bias, dim=None)),
        ("the gain and bias are missing: end with `* weight + bias`",
         m(x, torch.ones_like(weight), torch.zeros_like(bias))),
        ("the bias is missing: end with `* weight + bias`", m(x, weight, torch.zeros_like(bias))),
        ("the gain is missing: end with `* weight + bias`", m(x, torch.ones_like(weight), bias)),
        ("weight and bias are swapped: multiply by weight, then add bias", m(x, bias, weight)),
        ("you divide by x.std(): that is the unbiased standard deviation (divides by C - 1) and "
         "has no eps. Use sqrt(var + eps) with the biased variance, x.var(dim=-1, keepdim=True, "
         "unbiased=False)", m(x, weight, bias, unbiased=True, eps=0.0)),
        ("you add bias before multiplying by weight, (x̂ + bias) * weight; the order is "
         "x̂ * weight + bias", m(x, weight, bias * weight)),
    ]
    for eps, name in ((1e-12, "1e-12 (BERT's value)"), (0.0, "0 (none at all)"),
                      (1e-6, "1e-6"), (1e-8, "1e-8"), (1e-5 * 1e-5, "1e-10"), (1e-3, "1e-3")):
        mistakes.append((
            f"your eps looks like {name}; GPT-2's is 1e-5. Add it to the variance inside the "
            "square root: sqrt(var + eps)", m(x, weight, bias, eps=eps)))
    return mistakes


def _explain_layer_norm(exercise, got, x, weight, bias, want, what):
    for message, wrong in _layer_norm_mistakes(x, weight, bias):
        if _close(got, wrong):
            raise CheckFailed(exercise, message)
    worst = (got.double() - want).abs().max().item()
    raise CheckFailed(
        exercise,
        f"{what} differs from F.layer_norm by up to {worst:.3g}. LayerNorm: mean and biased "
        "variance over the last dimension, (x - mean) / sqrt(var + eps) * weight + bias",
    )


# --------------------------------------------------------------------------- Exercise 5.1


def check_layer_norm(layer_norm) -> None:
    """`layer_norm(x, weight, bias, eps=1e-5)`: (..., C) -> (..., C)."""
    x, weight, bias = _ln_inputs()
    C = x.shape[-1]
    x_in = x.clone()
    try:
        got = call_learner(EX_LN, layer_norm, x_in, weight, bias)
    except RuntimeError as exc:
        if "must match the size" not in str(exc):
            raise
        raise CheckFailed(
            EX_LN, f"for x of shape {tuple(x.shape)} your function fails ({exc}). The mean and the "
            "variance lose their last dimension unless you keep it: x.mean(dim=-1, keepdim=True) "
            "has shape (..., 1), which broadcasts against x (..., C)"
        ) from None
    if not torch.equal(x_in, x):
        raise CheckFailed(
            EX_LN, "your function changed x in place (x -= mean, x.sub_, ...): compute new tensors"
        )
    if not isinstance(got, torch.Tensor):
        raise CheckFailed(EX_LN, f"should return a torch.Tensor, got {type(got).__name__}")
    if got.shape != x.shape:
        raise CheckFailed(
            EX_LN, f"input {tuple(x.shape)} gave output {tuple(got.shape)}: LayerNorm keeps the "
            "shape (did you forget keepdim=True on the mean or the variance?)"
        )
    want = F.layer_norm(x, (C,), weight, bias, EPS)
    if not _close(got, want):
        _explain_layer_norm(EX_LN, got, x, weight, bias, want, "your output")

    for eps in (1e-3, 1e-12):
        got_eps = call_learner(EX_LN, layer_norm, x.clone(), weight, bias, eps=eps)
        if not _close(got_eps, F.layer_norm(x, (C,), weight, bias, eps)):
            raise CheckFailed(
                EX_LN,
                f"with eps={eps:g} your output is wrong: use the `eps` argument (inside the "
                "square root) instead of a fixed number",
            )
    try:
        tokens = call_learner(EX_LN, layer_norm, x[0].float(), weight.float(), bias.float())
    except (IndexError, RuntimeError) as exc:
        raise CheckFailed(
            EX_LN, f"a 2-D input (T, C) fails ({exc}): use dim=-1 (the last dimension), "
            "not dim=2, so any number of leading dimensions works"
        ) from None
    if not isinstance(tokens, torch.Tensor) or tokens.shape != x[0].shape:
        raise CheckFailed(EX_LN, "a 2-D input (T, C) should work too: use dim=-1, not dim=2")
    if tokens.dtype != torch.float32:
        raise CheckFailed(EX_LN, f"float32 input gave {tokens.dtype} output: keep x's dtype")
    passed(EX_LN, "mean and biased variance over the last dimension, eps inside the root")


# --------------------------------------------------------------------------- Exercise 5.2


def check_layer_norm_module(LayerNorm) -> None:
    """`LayerNorm(n_embd, eps=1e-5)` with parameters `weight` (ones) and `bias` (zeros)."""
    x, weight, bias = _ln_inputs()
    C = x.shape[-1]
    ln = call_learner(EX_LN_MODULE, LayerNorm, C)
    if not isinstance(ln, nn.Module):
        raise CheckFailed(EX_LN_MODULE, f"LayerNorm(n) should make an nn.Module, got "
                                        f"{type(ln).__name__}")
    params = dict(ln.named_parameters())
    if not params:
        raise CheckFailed(
            EX_LN_MODULE,
            "the module has no parameters: wrap weight and bias in nn.Parameter, so that they "
            "are trained and saved in state_dict (and GPT-2's weights can load into them)",
        )
    if set(params) != {"weight", "bias"}:
        raise CheckFailed(
            EX_LN_MODULE,
            f"the parameters are named {sorted(params)}; name them `weight` and `bias`: GPT-2's "
            "checkpoint stores h.N.ln_1.weight and h.N.ln_1.bias (the gain and the shift)",
        )
    for name in ("weight", "bias"):
        if tuple(params[name].shape) != (C,):
            raise CheckFailed(
                EX_LN_MODULE,
                f"`{name}` has shape {tuple(params[name].shape)}; it should be (n_embd,) = ({C},)",
            )
    if not torch.equal(params["weight"].detach(), torch.ones(C, dtype=params["weight"].dtype)):
        raise CheckFailed(
            EX_LN_MODULE,
            "`weight` should start as ones (torch.ones(n_embd)): a fresh LayerNorm only "
            "normalises; with zeros its output would be all zeros (bias) and nothing would flow",
        )
    if not torch.equal(params["bias"].detach(), torch.zeros(C, dtype=params["bias"].dtype)):
        raise CheckFailed(EX_LN_MODULE, "`bias` should start as zeros (torch.zeros(n_embd))")

    ln = ln.double()
    with torch.no_grad():
        ln.weight.copy_(weight)
        ln.bias.copy_(bias)
        got = call_learner(EX_LN_MODULE, ln, x.clone())
        want = F.layer_norm(x, (C,), weight, bias, EPS)
        if not _close(got, want):
            if isinstance(got, torch.Tensor) and got.shape == x.shape:
                _explain_layer_norm(EX_LN_MODULE, got, x, weight, bias, want,
                                    "LayerNorm(n_embd)(x)")
            raise CheckFailed(EX_LN_MODULE, f"LayerNorm(n_embd)(x) should keep x's shape "
                                            f"{tuple(x.shape)}")

        ln_eps = call_learner(EX_LN_MODULE, LayerNorm, C, 1e-3).double()
        ln_eps.weight.copy_(weight)
        ln_eps.bias.copy_(bias)
        if not _close(ln_eps(x.clone()), F.layer_norm(x, (C,), weight, bias, 1e-3)):
            raise CheckFailed(
                EX_LN_MODULE,
                "LayerNorm(n_embd, eps=1e-3) does not use eps = 1e-3: store the `eps` argument "
                "(self.eps = eps) and use it in forward",
            )
    passed(EX_LN_MODULE, "weight and bias named as in GPT-2's checkpoint, right numbers")


# --------------------------------------------------------------------------- Exercise 5.3


def _small_config():
    from gpt2lib.config import GPT2Config

    return GPT2Config(n_embd=8, n_head=2, n_layer=1, n_positions=16, vocab_size=11,
                      embd_pdrop=0.0, attn_pdrop=0.0, resid_pdrop=0.0)


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


def _block_mistakes(x, ln_1, attn, ln_2, mlp):
    h = x + attn(ln_1(x))
    normed_h = ln_1(x) + attn(ln_1(x))
    return [
        ("this is the post-norm block of the original Transformer, ln(x + sublayer(x)). "
         "GPT-2 is pre-norm: normalise the sublayer's INPUT and add its output to the "
         "unnormalised stream: x = x + attn(ln_1(x)); x = x + mlp(ln_2(x))",
         (lambda p: ln_2(p + mlp(p)))(ln_1(x + attn(x)))),
        ("both residual connections are missing: add each sublayer's output to its input, "
         "x = x + attn(ln_1(x)), then x = x + mlp(ln_2(x))", mlp(ln_2(attn(ln_1(x))))),
        ("the residual connection around attention is missing: x = x + attn(ln_1(x))",
         (lambda p: p + mlp(ln_2(p)))(attn(ln_1(x)))),
        ("the residual connection around the MLP is missing: x = x + mlp(ln_2(x))",
         mlp(ln_2(h))),
        ("you used ln_1 twice: the MLP's input goes through ln_2, x + mlp(ln_2(x))",
         h + mlp(ln_1(h))),
        ("ln_1 and ln_2 are swapped: ln_1 goes before attention, ln_2 before the MLP",
         (lambda p: p + mlp(ln_1(p)))(x + attn(ln_2(x)))),
        ("the stream itself was normalised (x = ln_1(x), then x + attn(x)): keep x as it is "
         "and give only the sublayer a normalised copy, x + attn(ln_1(x))",
         (lambda p: ln_2(p) + mlp(ln_2(p)))(normed_h)),
        ("the MLP reads x instead of the stream after attention: first h = x + attn(ln_1(x)), "
         "then h + mlp(ln_2(h))", x + attn(ln_1(x)) + mlp(ln_2(x))),
        ("the MLP comes before attention: GPT-2's block runs attention first, then the MLP",
         (lambda p: p + attn(ln_1(p)))(x + mlp(ln_2(x)))),
        ("the LayerNorms are not used: x = x + attn(ln_1(x)); x = x + mlp(ln_2(x))",
         (lambda p: p + mlp(p))(x + attn(x))),
    ]


def _make_block(Block, *args, **kwargs):
    """call_learner, but a stub in an earlier exercise (say LayerNorm) is named in the message."""
    try:
        return call_learner(EX_BLOCK, Block, *args, **kwargs)
    except CheckFailed as failure:
        cause = failure.__context__
        if isinstance(cause, NotImplementedError) and str(cause):
            raise CheckFailed(
                EX_BLOCK,
                f"not done yet: building the block raised NotImplementedError('{cause}'). "
                "Finish that exercise, run its cell and the Block cell, then run this check again.",
            ) from None
        raise


def check_block(Block) -> None:
    """`Block(config, attention_cls, mlp_cls)`: x + attn(ln_1(x)), then x + mlp(ln_2(x))."""
    config = _small_config()
    block = _make_block(Block, config)
    if not isinstance(block, nn.Module):
        raise CheckFailed(EX_BLOCK, f"Block(config) should make an nn.Module, got "
                                    f"{type(block).__name__}")
    for name in ("ln_1", "attn", "ln_2", "mlp"):
        if not isinstance(getattr(block, name, None), nn.Module):
            raise CheckFailed(
                EX_BLOCK,
                f"your block has no submodule `{name}`: keep the names ln_1, attn, ln_2, mlp, "
                "which GPT-2's checkpoint uses (h.N.ln_1.weight, h.N.attn.c_attn.weight, ...)",
            )
    if block.ln_1 is block.ln_2:
        raise CheckFailed(EX_BLOCK, "ln_1 and ln_2 are the same module: make two LayerNorms")

    # Random weights everywhere (LayerNorm gains and biases too, so ln_1 and ln_2 differ).
    gen = torch.Generator().manual_seed(0)
    with torch.no_grad():
        for p in block.parameters():
            p.copy_(torch.randn(p.shape, generator=gen, dtype=torch.float64) * 0.4
                    + (1.0 if p.dim() == 1 and p.shape[0] == config.n_embd else 0.0))
    block = block.double().eval()
    x = torch.randn(2, 5, config.n_embd, generator=gen, dtype=torch.float64) * 2.0 + 0.5

    with torch.no_grad():
        got = call_learner(EX_BLOCK, block, x.clone())
        if not isinstance(got, torch.Tensor) or got.shape != x.shape:
            shape = tuple(got.shape) if isinstance(got, torch.Tensor) else type(got).__name__
            raise CheckFailed(
                EX_BLOCK, f"input {tuple(x.shape)} gave {shape}: a block maps (B, T, C) to "
                "(B, T, C) (return the updated x)"
            )
        ln_1, attn, ln_2, mlp = block.ln_1, block.attn, block.ln_2, block.mlp
        h = x + attn(ln_1(x))
        want = h + mlp(ln_2(h))
        if not _close(got, want, atol=1e-6):
            for message, wrong in _block_mistakes(x, ln_1, attn, ln_2, mlp):
                if _close(got, wrong, atol=1e-6):
                    raise CheckFailed(EX_BLOCK, message)
            raise CheckFailed(
                EX_BLOCK,
                "the output is not the pre-norm block x = x + attn(ln_1(x)); "
                f"x = x + mlp(ln_2(x)) (largest difference {(got - want).abs().max().item():.3g})",
            )

    # kv_cache goes to attention only when there is one.
    plain = _make_block(Block, config, attention_cls=_PlainAttention)
    try:
        plain(x.float())
    except TypeError as exc:
        raise CheckFailed(
            EX_BLOCK,
            f"with an attention whose forward takes only x, block(x) failed ({exc}). When "
            "kv_cache is None call self.attn(h) without it, so chapter 3's attention still works",
        ) from None
    recording = _make_block(Block, config, attention_cls=_RecordingAttention)
    marker = object()
    try:
        recording(x.float(), kv_cache=marker)
    except TypeError as exc:
        raise CheckFailed(
            EX_BLOCK, f"block(x, kv_cache=cache) failed ({exc}): forward(self, x, kv_cache=None)"
        ) from None
    if marker not in getattr(recording.attn, "seen", []):
        raise CheckFailed(
            EX_BLOCK,
            "block(x, kv_cache=cache) did not hand the cache to attention: when kv_cache is not "
            "None call self.attn(ln_1(x), kv_cache=kv_cache) (chapter 9's fast generation needs it)",
        )
    passed(EX_BLOCK, "pre-norm, two residual connections, kv_cache passed on to attention")
