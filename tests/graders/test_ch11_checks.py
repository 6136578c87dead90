"""Chapter 11's checks for 11.1, 11.2, 11.5 and 11.6: right answers pass, and every planted
mistake is named (11.4's format check and 11.7's run speed are tested in test_scaling.py)."""

import check_cases as cases
import pytest
import torch
import torch.nn.functional as F

from gpt2lib.chapters.model import count_gpt2_parameters
from gpt2lib.course.checks import scaling as checks
from gpt2lib.course.checks._core import CheckFailed


def _shards_right(model, x, y, world):
    total = {}
    for xs, ys in zip(x.chunk(world), y.chunk(world)):
        for name, grad in checks.full_batch_gradients(model, xs, ys).items():
            total[name] = total.get(name, 0) + grad / world
    return total


def _accumulate_right(model, x, y, micro_steps):
    model.zero_grad(set_to_none=True)
    for xs, ys in zip(x.chunk(micro_steps), y.chunk(micro_steps)):
        (F.cross_entropy(model(xs).flatten(0, 1), ys.flatten()) / micro_steps).backward()


def _flops_right(config, block_size):
    params = count_gpt2_parameters(config) - config.n_positions * config.n_embd
    return params, 6 * params + 12 * config.n_layer * block_size * config.n_embd


@pytest.mark.parametrize(
    "check, answer",
    cases.right_answers(
        {
            checks.check_shard_gradients: [_shards_right],
            checks.check_accumulate_gradients: [_accumulate_right],
            checks.check_flops_per_token: [_flops_right, checks.reference_flops_per_token],
            checks.check_run_cost: [checks.reference_run_cost],
        }
    ),
)
def test_right_answers_pass(check, answer, capsys):
    check(answer)
    assert "✅" in capsys.readouterr().out


@pytest.mark.parametrize("mistake", checks.ACCUM_MISTAKES, ids=lambda m: m.name)
def test_each_planted_accumulation_mistake_is_named(mistake):
    def planted(model, x, y, micro_steps):
        mistake.fn(model, x, y, micro_steps)  # leaves its gradients in .grad

    cases.assert_named(checks.check_accumulate_gradients, planted, mistake.message)


@pytest.mark.parametrize("mistake", checks.BF16_MISTAKES, ids=lambda m: m.name)
def test_each_planted_bfloat16_mistake_is_named(mistake):
    cases.assert_named(checks.check_to_bfloat16, mistake.fn, mistake.message)


@pytest.mark.parametrize(
    "answer", [lambda x: x.bfloat16().float(), lambda x: x.to(dtype=torch.bfloat16).float()]
)
def test_other_ways_to_let_pytorch_round_are_named(answer):
    cases.assert_named(checks.check_to_bfloat16, answer, "rounding done by hand")


def _bf16_by_bits(x):
    bits = x.view(torch.int32)
    rounded = bits + 0x7FFF + ((bits >> 16) & 1)
    return ((rounded >> 16) << 16).view(torch.float32)


def test_rounding_by_the_bits_passes(capsys):
    checks.check_to_bfloat16(_bf16_by_bits)
    assert "✅" in capsys.readouterr().out


@pytest.mark.parametrize("mistake", checks.SHARD_MISTAKES, ids=lambda m: m.name)
def test_each_planted_shard_mistake_is_named(mistake):
    cases.assert_named(checks.check_shard_gradients, mistake.fn, mistake.message)


def _flops_with(extra_params=0, forward_only=False, attention=True):
    def flops_per_token(config, block_size):
        params = checks.reference_flops_per_token(config, block_size)[0] + extra_params * (
            config.n_positions * config.n_embd
        )
        attn = 4 * config.n_layer * block_size * config.n_embd if attention else 0
        return params, (2 * params + attn) if forward_only else (6 * params + 3 * attn)

    return flops_per_token


@pytest.mark.parametrize(
    "answer, message",
    [
        (_flops_with(extra_params=1), "you counted the position table"),
        (_flops_with(forward_only=True), "the forward pass only"),
        (_flops_with(attention=False), "attention's scores and weighted sum are missing"),
    ],
)
def test_the_flops_check_names_the_usual_slips(answer, message):
    cases.assert_named(checks.check_flops_per_token, answer, message)


def test_the_recipe_price_takes_a_whole_number_of_steps(capsys):
    from gpt2lib.chapters.config import GPT2Config

    _, per_token = checks.reference_flops_per_token(GPT2Config(), 1024)
    total = per_token * 10e9
    hours, dollars = checks.reference_run_cost(total, 8, 989e12, 0.4, 2.5)
    for steps in (19_073, 19_074, 10e9 / 524_288):  # rounded down, up, or not at all
        checks.check_recipe_price(steps, total, hours, dollars)
        assert "✅" in capsys.readouterr().out
    with pytest.raises(CheckFailed, match="19,072.0 steps, expected 19,073.5"):
        checks.check_recipe_price(19_072, total, hours, dollars)


def test_the_stubs_read_not_done_yet():
    for check in (
        checks.check_shard_gradients,
        checks.check_accumulate_gradients,
        checks.check_flops_per_token,
        checks.check_run_cost,
    ):
        cases.assert_not_done_yet(check)


def test_stale_gradients_are_what_the_accumulation_check_starts_from():
    model = checks._model_with_stale_grads(0)
    assert all(p.grad is not None and bool(p.grad.abs().sum() > 0) for p in model.parameters())
    assert torch.equal(
        model.wte.weight.grad, checks._model_with_stale_grads(0).wte.weight.grad
    )  # the same stale gradient every time, so a planted mistake matches exactly
