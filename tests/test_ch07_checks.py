"""Chapter 7's checks: right answers pass, and every planted mistake is named.

Each test over a mistake list feeds the planted wrong version itself to the check, so the
lists in gpt2lib.course.checks.training and these tests cannot drift apart.
"""

import math

import check_cases as cases
import pytest
import torch
import torch.nn.functional as F

from gpt2lib.course.checks import training as checks
from gpt2lib.training import decay_groups, lr_schedule, sample


def _targets_right(chunk):
    return chunk[:, :-1], chunk[:, 1:]


def _loss_right(logits, targets):
    return F.cross_entropy(logits.flatten(0, 1), targets.flatten())


def _loss_float64_einsum(logits, targets):
    """Another correct answer: one-hot and einsum, in float64."""
    one_hot = F.one_hot(targets, logits.shape[-1]).double()
    return -torch.einsum("btv,btv->bt", logits.double().log_softmax(-1), one_hot).mean()


def _batch_vectorised(ids, batch_size, block_size, generator=None):
    starts = torch.randint(len(ids) - block_size, (batch_size,), generator=generator)
    offsets = starts[:, None] + torch.arange(block_size)
    return ids[offsets], ids[offsets + 1]


def _decay_by_name(model, weight_decay):
    """Another correct answer: choose by module type rather than by shape."""
    decay, other = [], []
    for name, p in model.named_parameters():
        (decay if (name.endswith("weight") and "ln" not in name) else other).append(p)
    return [{"params": other, "weight_decay": 0.0}, {"params": decay, "weight_decay": weight_decay}]


def _step_right(model, optimizer, x, y, max_grad_norm=1.0):
    optimizer.zero_grad(set_to_none=True)
    loss = F.cross_entropy(model(x).flatten(0, 1), y.flatten())
    loss.backward()
    torch.nn.utils.clip_grad_norm_(model.parameters(), max_grad_norm)
    optimizer.step()
    return loss.item()


def _lr_numpy_style(step, max_lr, warmup_steps, total_steps, min_lr):
    """Another correct answer, written with min/max instead of branches."""
    warm = max_lr * min(step + 1, warmup_steps) / max(warmup_steps, 1)
    if step < warmup_steps:
        return warm
    progress = min(1.0, (step - warmup_steps) / (total_steps - warmup_steps))
    return min_lr + (max_lr - min_lr) * (1 + math.cos(math.pi * progress)) / 2


def _sample_reference(model, idx, max_new_tokens, temperature=1.0, generator=None):
    return sample(model, idx, max_new_tokens, temperature=temperature, generator=generator)


@pytest.mark.parametrize("check, answer", cases.right_answers({
    checks.check_inputs_and_targets: [_targets_right],
    checks.check_cross_entropy: [_loss_right, _loss_float64_einsum],
    checks.check_random_batch: [checks._batch_right, _batch_vectorised],
    checks.check_decay_groups: [decay_groups, _decay_by_name],
    checks.check_training_step: [_step_right],
    checks.check_cosine_lr: [lr_schedule, _lr_numpy_style],
    checks.check_sample_tokens: [_sample_reference],
}))
def test_right_answers_pass(check, answer, capsys):
    check(answer)
    assert "✅" in capsys.readouterr().out


@pytest.mark.parametrize("check", list(checks.MISTAKES_BY_CHECK), ids=lambda c: c.__name__)
def test_the_stub_reads_not_done_yet(check):
    cases.assert_not_done_yet(check)


@pytest.mark.parametrize("check, mistake", cases.planted(checks.MISTAKES_BY_CHECK))
def test_each_planted_mistake_is_named(check, mistake):
    cases.assert_named(check, mistake.fn, mistake.message)


def _unseeded_batch(ids, batch_size, block_size, generator=None):
    return checks._batch_right(ids, batch_size, block_size, None)


def _a_parameter_in_two_groups(model, wd):
    params = list(model.parameters())
    return [{"params": params, "weight_decay": wd}, {"params": params[:1], "weight_decay": 0.0}]


def _step_returning_a_wrong_loss(model, optimizer, x, y, max_grad_norm=1.0):
    _step_right(model, optimizer, x, y, max_grad_norm)
    return torch.tensor(0.0)  # a tensor is taken as a number: only its value is wrong


def _sample_only_new_tokens(model, idx, n, temperature=1.0, generator=None):
    return sample(model, idx, n, temperature, generator)[:, idx.shape[1]:]


@pytest.mark.parametrize("check, answer, message", cases.numbered([
    # not planted: what the check says about them comes from a symptom or a shape
    (checks.check_cross_entropy, lambda lg, t: _loss_right(lg, t).detach(), "carries no gradient"),
    (checks.check_random_batch, _unseeded_batch, "same seed gave different batches"),
    (checks.check_decay_groups, _a_parameter_in_two_groups, "is in two groups"),
    (checks.check_training_step, _step_returning_a_wrong_loss, "returned loss"),
    (checks.check_sample_tokens, _sample_only_new_tokens, "return the prompt AND the new tokens"),
    (checks.check_cosine_lr, lambda step, max_lr: max_lr, "Keep the signature"),
]))
def test_other_wrong_answers_are_named(check, answer, message):
    cases.assert_named(check, answer, message)
