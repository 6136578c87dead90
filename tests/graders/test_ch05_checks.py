"""Chapter 5's checks (gpt2lib.course.checks.block): right answers in any style pass, every planted mistake is named."""

from __future__ import annotations

import re

import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F

from gpt2lib.chapters.attention import CausalSelfAttention
from gpt2lib.chapters.block import Block, LayerNorm
from gpt2lib.chapters.mlp import MLP
from gpt2lib.course.checks import CheckFailed
from gpt2lib.course.checks import block as checks
from gpt2lib.course.checks._core import NotDoneYet

# --------------------------------------------------------------------------- check_layer_norm


def correct_layer_norm(x, weight, bias, eps=1e-5):
    mean = x.mean(-1, keepdim=True)
    var = x.var(-1, keepdim=True, unbiased=False)
    return (x - mean) * torch.rsqrt(var + eps) * weight + bias


def test_check_layer_norm_passes_correct_answers(capsys):
    checks.check_layer_norm(correct_layer_norm)
    assert capsys.readouterr().out.count("✅ Exercise 5.1 (layer_norm) passed") == 1


# The planted mistake: 5.1 says F.layer_norm and nn.LayerNorm are not allowed.
@pytest.mark.parametrize(
    "forbidden",
    [
        lambda x, w, b, eps=1e-5: F.layer_norm(x, x.shape[-1:], w, b, eps),
        lambda x, w, b, eps=1e-5: torch.layer_norm(x, x.shape[-1:], w, b, eps),
        lambda x, w, b, eps=1e-5: nn.LayerNorm(x.shape[-1], eps=eps).to(x.dtype)(x) * w + b,
    ],
    ids=["F.layer_norm", "torch.layer_norm", "nn.LayerNorm"],
)
def test_check_layer_norm_refuses_the_library_layer_norm(forbidden):
    with pytest.raises(CheckFailed, match=r"layer_norm, which is not allowed"):
        checks.check_layer_norm(forbidden)


def planted_layer_norm(
    eps_default=1e-5,
    unbiased=False,
    eps_outside=False,
    dim=-1,
    center=True,
    use_weight=True,
    use_bias=True,
    swap=False,
    power=0.5,
    ignore_eps=False,
):
    def layer_norm(x, weight, bias, eps=eps_default):
        if ignore_eps:
            eps = 1e-5
        mean = x.mean(dim=dim, keepdim=True) if center else 0.0
        var = (
            x.var(dim=dim, keepdim=True, unbiased=unbiased)
            if center
            else (x**2).mean(dim=dim, keepdim=True)
        )
        scale = var**power + eps if eps_outside else (var + eps) ** power
        w, b = (bias, weight) if swap else (weight, bias)
        y = (x - mean) / scale
        return y * (w if use_weight else 1.0) + (b if use_bias else 0.0)

    return layer_norm


@pytest.mark.parametrize("mistake", checks.LAYER_NORM_MISTAKES, ids=lambda m: m.name)
def test_check_layer_norm_names_each_planted_mistake(mistake):
    with pytest.raises(CheckFailed, match=re.escape(mistake.message)):
        checks.check_layer_norm(mistake.fn)


@pytest.mark.parametrize(
    "kwargs, phrase",
    [  # the same mistakes, written the way learners write them
        (dict(unbiased=True), "torch.var and x.var"),
        (dict(eps_outside=True), "eps is added outside the square root"),
        (dict(eps_default=1e-12), "looks like 1e-12"),
        (dict(ignore_eps=True), "use the `eps` argument"),
        (dict(dim=2), "2-D input"),
        (dict(center=False), "RMSNorm"),
        (dict(swap=True), "swapped"),
    ],
)
def test_check_layer_norm_names_learner_written_mistakes(kwargs, phrase):
    with pytest.raises(CheckFailed, match=phrase):
        checks.check_layer_norm(planted_layer_norm(**kwargs))


def test_check_layer_norm_catches_in_place_shapes_dtypes_and_stubs():
    def in_place(x, weight, bias, eps=1e-5):
        x -= x.mean(-1, keepdim=True)
        return x / torch.sqrt(x.var(-1, keepdim=True, unbiased=False) + eps) * weight + bias

    with pytest.raises(CheckFailed, match="changed x in place"):
        checks.check_layer_norm(in_place)
    with pytest.raises(CheckFailed, match="keepdim=True"):
        checks.check_layer_norm(lambda x, w, b, eps=1e-5: correct_layer_norm(x, w, b, eps)[..., 0])
    with pytest.raises(CheckFailed, match="keep x's dtype"):
        checks.check_layer_norm(lambda x, w, b, eps=1e-5: correct_layer_norm(x.double(), w, b, eps))

    def stub(x, weight, bias, eps=1e-5):
        raise NotImplementedError("Exercise 5.1: replace this line with your code")

    with pytest.raises(CheckFailed, match="not done yet"):
        checks.check_layer_norm(stub)
    with pytest.raises(CheckFailed, match="Keep the signature"):
        checks.check_layer_norm(lambda x, weight, bias: correct_layer_norm(x, weight, bias))


# --------------------------------------------------------------------------- check_layer_norm_module


def test_check_layer_norm_module_passes_correct_answers(capsys):
    class FromScratch(nn.Module):
        def __init__(self, n_embd, eps=1e-5):
            super().__init__()
            self.weight = nn.Parameter(torch.ones(n_embd))
            self.bias = nn.Parameter(torch.zeros(n_embd))
            self.eps = eps

        def forward(self, x):
            return correct_layer_norm(x, self.weight, self.bias, self.eps)

    class SubclassOfTorch(nn.LayerNorm):
        def __init__(self, n_embd, eps=1e-5):
            super().__init__(n_embd, eps=eps)

    checks.check_layer_norm_module(LayerNorm)
    checks.check_layer_norm_module(FromScratch)
    checks.check_layer_norm_module(SubclassOfTorch)
    assert capsys.readouterr().out.count("✅ Exercise 5.1 (LayerNorm) passed") == 3


def planted_module(
    names=("weight", "bias"),
    parameters=True,
    init=(1.0, 0.0),
    eps_default=1e-5,
    store_eps=True,
    unbiased=False,
):
    class PlantedLayerNorm(nn.Module):
        def __init__(self, n_embd, eps=eps_default):
            super().__init__()
            make = nn.Parameter if parameters else (lambda t: t)
            setattr(self, names[0], make(torch.full((n_embd,), init[0])))
            setattr(self, names[1], make(torch.full((n_embd,), init[1])))
            self.eps = eps if store_eps else 1e-5

        def forward(self, x):
            w, b = getattr(self, names[0]), getattr(self, names[1])
            mean = x.mean(-1, keepdim=True)
            var = x.var(-1, keepdim=True, unbiased=unbiased)
            return (x - mean) / torch.sqrt(var + self.eps) * w + b

    return PlantedLayerNorm


WRONG_MODULES = {
    "gamma and beta": (dict(names=("gamma", "beta")), "name them `weight` and `bias`"),
    "plain tensors": (dict(parameters=False), "wrap weight and bias in nn.Parameter"),
    "weight starts at zero": (dict(init=(0.0, 0.0)), "`weight` should start as ones"),
    "bias starts at one": (dict(init=(1.0, 1.0)), "`bias` should start as zeros"),
    "eps 1e-12": (dict(eps_default=1e-12), "looks like 1e-12"),
    "eps ignored": (dict(store_eps=False), "does not use eps = 1e-3"),
    "unbiased": (dict(unbiased=True), "torch.var and x.var"),
}


@pytest.mark.parametrize("name", WRONG_MODULES)
def test_check_layer_norm_module_names_each_planted_mistake(name):
    kwargs, phrase = WRONG_MODULES[name]
    with pytest.raises(CheckFailed, match=phrase):
        checks.check_layer_norm_module(planted_module(**kwargs))


def test_check_layer_norm_module_names_a_wrong_forward_signature():
    class TakesEps(LayerNorm):
        def forward(self, x, eps):
            return super().forward(x)

    with pytest.raises(CheckFailed, match="Keep the signature"):
        checks.check_layer_norm_module(TakesEps)


def test_check_layer_norm_module_explains_stubs():
    class Stub(nn.Module):
        def __init__(self, n_embd, eps=1e-5):
            super().__init__()
            raise NotImplementedError("Exercise 5.1: replace this line with your code")

    with pytest.raises(CheckFailed, match="not done yet"):
        checks.check_layer_norm_module(Stub)


# --------------------------------------------------------------------------- check_block


class AnotherAttention(CausalSelfAttention):
    """A different but correct attention: the check must accept any."""


def test_check_block_passes_the_reference_and_blocks_built_from_other_parts(capsys):
    from functools import partial

    checks.check_block(Block)
    checks.check_block(partial(Block, attention_cls=AnotherAttention))

    class ExplicitBlock(Block):
        def forward(self, x, kv_cache=None):
            if kv_cache is None:
                a = self.attn(self.ln_1(x))
            else:
                a = self.attn(self.ln_1(x), kv_cache)
            x = x + a
            return x + self.mlp(self.ln_2(x))

    class TorchLayerNormBlock(Block):  # nn.LayerNorm instead of the chapter's LayerNorm
        def __init__(self, config, attention_cls=CausalSelfAttention, mlp_cls=MLP):
            super().__init__(config, attention_cls, mlp_cls)
            self.ln_1, self.ln_2 = nn.LayerNorm(config.n_embd), nn.LayerNorm(config.n_embd)

    checks.check_block(ExplicitBlock)
    checks.check_block(TorchLayerNormBlock)
    assert capsys.readouterr().out.count("✅ Exercise 5.2 (Block) passed") == 4


def planted_block(forward, base=Block):
    class PlantedBlock(base):
        def forward(self, x, kv_cache=None):
            return forward(self, x)

    return PlantedBlock


@pytest.mark.parametrize("mistake", checks.BLOCK_MISTAKES, ids=lambda m: m.name)
def test_check_block_names_each_planted_mistake(mistake):
    with pytest.raises(CheckFailed, match=re.escape(mistake.message)):
        checks.check_block(planted_block(mistake.fn))


@pytest.mark.parametrize(
    "forward, phrase",
    [
        (
            lambda s, x: 2 * (lambda h: h + s.mlp(s.ln_2(h)))(x + s.attn(s.ln_1(x))),
            "is not the pre-norm block",
        ),
        (lambda s, x: (x, None), "should be a torch.Tensor"),
        (lambda s, x: s.ln_1(x)[..., :4], r"has shape \(2, 5, 4\), expected \(2, 5, 8\)"),
    ],
)
def test_check_block_names_other_wrong_outputs(forward, phrase):
    with pytest.raises(CheckFailed, match=phrase):
        checks.check_block(planted_block(forward))


def test_check_block_names_a_forward_that_forces_eval_mode_or_has_the_wrong_signature():
    class ForcesEval(Block):
        def forward(self, x, kv_cache=None):
            self.eval()
            return super().forward(x, kv_cache)

    with pytest.raises(CheckFailed, match="do not switch modes"):
        checks.check_block(ForcesEval)

    class NeedsMask(Block):
        def forward(self, x, mask, kv_cache=None):
            return super().forward(x, kv_cache)

    with pytest.raises(CheckFailed, match="Keep the signature"):
        checks.check_block(NeedsMask)


# --------------------------------------------------------------------------- check_no_residual_block


class NoResidual(Block):
    def forward(self, x, kv_cache=None):
        x = self.attn(self.ln_1(x))
        return self.mlp(self.ln_2(x))


def test_check_no_residual_passes_correct_answers(capsys):
    class InOneLine(Block):
        def forward(self, x, kv_cache=None):
            return self.mlp(self.ln_2(self.attn(self.ln_1(x))))

    checks.check_no_residual_block(NoResidual)
    checks.check_no_residual_block(InOneLine)
    assert capsys.readouterr().out.count("✅ Exercise 5.2 (NoResidualBlock) passed") == 2


@pytest.mark.parametrize("mistake", checks.NO_RESIDUAL_MISTAKES, ids=lambda m: m.name)
def test_check_no_residual_names_each_planted_mistake(mistake):
    with pytest.raises(CheckFailed, match=re.escape(mistake.message)):
        checks.check_no_residual_block(planted_block(mistake.fn))


def test_check_no_residual_explains_other_wrong_outputs():
    with pytest.raises(CheckFailed, match="is not the block without residuals"):
        checks.check_no_residual_block(
            planted_block(lambda s, x: 2 * s.mlp(s.ln_2(s.attn(s.ln_1(x)))))
        )


# --------------------------------------------------------------------------- check_post_norm_block


class PostNorm(Block):
    def forward(self, x, kv_cache=None):
        x = self.ln_1(x + self.attn(x))
        return self.ln_2(x + self.mlp(x))


def test_check_post_norm_passes_correct_answers(capsys):
    class WithTorchParts(PostNorm):
        def __init__(self, config):
            super().__init__(config)
            self.ln_1, self.ln_2 = nn.LayerNorm(config.n_embd), nn.LayerNorm(config.n_embd)

    checks.check_post_norm_block(PostNorm)
    checks.check_post_norm_block(WithTorchParts)
    assert capsys.readouterr().out.count("✅ Exercise 5.2 (PostNormBlock) passed") == 2


@pytest.mark.parametrize("mistake", checks.POST_NORM_MISTAKES, ids=lambda m: m.name)
def test_check_post_norm_names_each_planted_mistake(mistake):
    with pytest.raises(CheckFailed, match=re.escape(mistake.message)):
        checks.check_post_norm_block(planted_block(mistake.fn))


def test_check_post_norm_explains_a_stub():
    class Stub(Block):
        def forward(self, x, kv_cache=None):
            raise NotImplementedError("Exercise 5.2: replace this line with your code")

    with pytest.raises(CheckFailed, match="not done yet"):
        checks.check_post_norm_block(Stub)


# --------------------------------------------------------------------------- check_follow_stream


def right_follow(blocks, x0):
    norms, cosines = [x0.norm(dim=-1).mean().item()], [1.0]
    x = x0
    with torch.no_grad():
        for block in blocks:
            x = block(x)
            norms.append(x.norm(dim=-1).mean().item())
            cosines.append(F.cosine_similarity(x, x0, dim=-1).mean().item())
    return norms, cosines


def test_check_follow_stream_passes_correct_answers_in_any_style(capsys):
    checks.check_follow_stream(right_follow)

    def as_tensors(blocks, x0):  # float64, stacked tensors, a different formula
        states = [x0.double()]
        for block in blocks:
            states.append(block(states[-1]).double())
        flat = [s.reshape(-1, s.shape[-1]) for s in states]
        norms = torch.stack([f.pow(2).sum(-1).sqrt().mean() for f in flat])
        first = flat[0]
        cosines = torch.stack(
            [((f * first).sum(-1) / (f.norm(dim=-1) * first.norm(dim=-1))).mean() for f in flat]
        )
        return norms.tolist(), cosines.tolist()

    checks.check_follow_stream(as_tensors)
    assert capsys.readouterr().out.count("✅ Exercise 5.4") == 2


def test_check_follow_stream_names_tensors_where_floats_are_asked():
    def tensors(blocks, x0):
        norms, cosines = right_follow(blocks, x0)
        return [torch.tensor(v) for v in norms], cosines

    with pytest.raises(CheckFailed, match=r"lists of Python floats: use \.item\(\)"):
        checks.check_follow_stream(tensors)
    with pytest.raises(CheckFailed, match=r"lists of Python floats: use \.item\(\)"):
        checks.check_follow_stream(lambda b, x: tuple(torch.tensor(v) for v in right_follow(b, x)))


@pytest.mark.parametrize("mistake", checks.STREAM_MISTAKES, ids=lambda m: m.name)
def test_check_follow_stream_names_each_planted_mistake(mistake):
    with pytest.raises(CheckFailed, match=re.escape(mistake.message)):
        checks.check_follow_stream(mistake.fn)


def test_check_follow_stream_explains_other_answers():
    def in_place(blocks, x0):
        result = right_follow(blocks, x0.clone())
        x0.mul_(2)
        return result

    with pytest.raises(CheckFailed, match="changed x0 in place"):
        checks.check_follow_stream(in_place)
    with pytest.raises(CheckFailed, match=r"return two lists, \(norms, cosines\)"):
        checks.check_follow_stream(lambda blocks, x0: right_follow(blocks, x0)[0])
    with pytest.raises(CheckFailed, match=r"your cosines\[2\] \(after block 2\)"):
        checks.check_follow_stream(
            lambda blocks, x0: (
                right_follow(blocks, x0)[0],
                [1.0, right_follow(blocks, x0)[1][1], 0.5, 0.5],
            )
        )


def test_pre_norm_stream_grows_and_post_norm_stream_does_not(tiny_config):
    config = tiny_config(n_embd=16, n_layer=6)
    torch.manual_seed(0)
    x0 = torch.randn(2, 8, 16)
    stacks = {}
    for name, cls in (("pre", Block), ("post", PostNorm)):
        torch.manual_seed(0)
        blocks = nn.ModuleList(cls(config) for _ in range(6)).eval()
        with torch.no_grad():
            for p in blocks.parameters():
                if p.dim() == 2:
                    p.normal_(std=0.2)
        stacks[name] = right_follow(blocks, x0)
    pre, post = stacks["pre"][0], stacks["post"][0]
    assert all(b > a for a, b in zip(pre, pre[1:]))
    assert all(abs(n - 4.0) < 1e-3 for n in post[1:])  # renormalised to √16 after every block


def test_check_block_requires_the_kv_cache_protocol():
    class AlwaysPassesCache(Block):
        def forward(self, x, kv_cache=None):
            x = x + self.attn(self.ln_1(x), kv_cache=kv_cache)
            return x + self.mlp(self.ln_2(x))

    with pytest.raises(CheckFailed, match="call self.attn\\(h\\) without it"):
        checks.check_block(AlwaysPassesCache)

    class DropsCache(Block):
        def forward(self, x, kv_cache=None):
            x = x + self.attn(self.ln_1(x))
            return x + self.mlp(self.ln_2(x))

    with pytest.raises(CheckFailed, match="did not hand the cache to attention"):
        checks.check_block(DropsCache)

    class NoCacheArgument(Block):
        def forward(self, x):
            x = x + self.attn(self.ln_1(x))
            return x + self.mlp(self.ln_2(x))

    with pytest.raises(CheckFailed, match=r"block\(x, kv_cache=cache\) failed"):
        checks.check_block(NoCacheArgument)


def test_check_block_explains_names_shared_norms_and_stubs():
    class Renamed(nn.Module):
        def __init__(self, config, attention_cls=CausalSelfAttention, mlp_cls=MLP):
            super().__init__()
            self.norm1, self.attn = LayerNorm(config.n_embd), attention_cls(config)
            self.ln_2, self.mlp = LayerNorm(config.n_embd), mlp_cls(config)

    with pytest.raises(CheckFailed, match="no submodule `ln_1`"):
        checks.check_block(Renamed)

    class SharedNorm(Block):
        def __init__(self, config, attention_cls=CausalSelfAttention, mlp_cls=MLP):
            super().__init__(config, attention_cls, mlp_cls)
            self.ln_2 = self.ln_1

    with pytest.raises(CheckFailed, match="ln_1 and ln_2 are the same module"):
        checks.check_block(SharedNorm)

    class StubLayerNorm(nn.Module):
        def __init__(self, n_embd, eps=1e-5):
            super().__init__()
            raise NotImplementedError("Exercise 5.1 (LayerNorm): replace this line with your code")

    class BlockOnStub(nn.Module):
        def __init__(self, config, attention_cls=CausalSelfAttention, mlp_cls=MLP):
            super().__init__()
            self.ln_1 = StubLayerNorm(config.n_embd)

    with pytest.raises(NotDoneYet, match=r"not done yet.*Exercise 5\.1 \(LayerNorm\)"):
        checks.check_block(BlockOnStub)

    class StubForward(Block):
        def forward(self, x, kv_cache=None):
            raise NotImplementedError("Exercise 5.2 (Block): replace this line with your code")

    with pytest.raises(CheckFailed, match="not done yet"):
        checks.check_block(StubForward)
    with pytest.raises(CheckFailed, match="Keep the signature"):
        checks.check_block(lambda: None)


# --------------------------------------------------------------------------- more learner mistakes


def _normalised(x, eps=1e-5):
    return (x - x.mean(-1, keepdim=True)) / torch.sqrt(
        x.var(-1, keepdim=True, unbiased=False) + eps
    )


@pytest.mark.parametrize(
    "wrong, phrase",
    [
        (
            lambda x, w, b, eps=1e-5: (
                (x - x.mean(-1)) / torch.sqrt(x.var(-1, unbiased=False) + eps) * w + b
            ),
            r"x.mean\(dim=-1, keepdim=True\) has shape \(..., 1\)",
        ),
        (
            lambda x, w, b, eps=1e-5: (
                (x - x.mean(-1, keepdim=True)) / x.std(-1, keepdim=True) * w + b
            ),
            r"you divide by x.std\(\)",
        ),
        (
            lambda x, w, b, eps=1e-5: (_normalised(x, eps) + b) * w,
            "you add bias before multiplying by weight",
        ),
    ],
)
def test_check_layer_norm_names_more_learner_mistakes(wrong, phrase):
    with pytest.raises(CheckFailed, match=phrase):
        checks.check_layer_norm(wrong)


# --------------------------------------------------------------------------- 5.3 and the challenge


def right_gradient(blocks, x0, direction):
    x = x0.detach().clone().requires_grad_(True)
    out = x
    for block in blocks:
        out = block(out)
    (grad,) = torch.autograd.grad((out * direction).sum(), x)
    return grad.norm(dim=-1).mean().item()


def test_check_input_gradient_norm_passes_right_answers(capsys):
    def with_backward_on_a_copy(blocks, x0, direction):
        x = x0.clone().requires_grad_(True)
        out = x
        for block in blocks:
            out = block(out)
        for p in (p for b in blocks for p in b.parameters()):
            p.requires_grad_(False)
        try:
            (out * direction).sum().backward()
        finally:
            for p in (p for b in blocks for p in b.parameters()):
                p.requires_grad_(True)
        return float(x.grad.norm(dim=-1).mean())

    checks.check_input_gradient_norm(right_gradient)
    checks.check_input_gradient_norm(with_backward_on_a_copy)
    assert capsys.readouterr().out.count("✅ Exercise 5.3 (input_gradient_norm) passed") == 2


@pytest.mark.parametrize("mistake", checks.GRAD_MISTAKES, ids=lambda m: m.name)
def test_check_input_gradient_norm_names_every_planted_mistake(mistake):
    with pytest.raises(CheckFailed) as info:
        checks.check_input_gradient_norm(mistake.fn)
    assert mistake.message in str(info.value)


def test_check_input_gradient_norm_names_tensors_changed_inputs_and_left_grads():
    def as_tensor(blocks, x0, direction):
        return torch.tensor(right_gradient(blocks, x0, direction))

    def input_marked(blocks, x0, direction):
        x0.requires_grad_(True)
        return right_gradient(blocks, x0, direction)

    def backward(blocks, x0, direction):
        x = x0.detach().clone().requires_grad_(True)
        out = x
        for block in blocks:
            out = block(out)
        (out * direction).sum().backward()
        return x.grad.norm(dim=-1).mean().item()

    with pytest.raises(CheckFailed, match=r"a tensor: use \.item\(\)"):
        checks.check_input_gradient_norm(as_tensor)
    with pytest.raises(CheckFailed, match="x0 is not as it was"):
        checks.check_input_gradient_norm(input_marked)
    with pytest.raises(CheckFailed, match="carry a .grad"):
        checks.check_input_gradient_norm(backward)
    with pytest.raises(CheckFailed, match="expected"):
        checks.check_input_gradient_norm(lambda b, x, d: 2 * right_gradient(b, x, d))


@pytest.mark.slow
def test_deep_stack_challenge_passes_a_scaled_block_and_refuses_gpt2s_and_a_do_nothing_block(
    capsys,
):
    import math

    class Scaled(Block):
        def forward(self, x, kv_cache=None):
            s = 1 / math.sqrt(96)
            x = x + s * self.attn(self.ln_1(x))
            return x + s * self.mlp(self.ln_2(x))

    class Idle(Block):
        def forward(self, x, kv_cache=None):
            return x + 1e-4 * self.mlp(self.ln_2(x))

    assert checks.check_deep_stack(Scaled)["cosine"] >= 0.5
    assert "✅ Challenge" in capsys.readouterr().out
    with pytest.raises(CheckFailed, match="the goal is 0.5"):
        checks.check_deep_stack(Block)
    with pytest.raises(CheckFailed, match="does nothing keeps the input trivially"):
        checks.check_deep_stack(Idle)
