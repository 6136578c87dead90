"""Chapter 7's checks: right answers pass, and every planted mistake is named.

Each test over a mistake list feeds the planted wrong version itself to the check, so the
lists in gpt2lib.course.checks.training and these tests cannot drift apart.
"""

import math

import check_cases as cases
import pytest
import torch
import torch.nn.functional as F

from gpt2lib.chapters import training
from gpt2lib.chapters.training import decay_groups
from gpt2lib.course.checks import training as checks
from gpt2lib.course.checks._core import CheckFailed
from gpt2lib.training import lr_schedule


def _loss_right(logits, targets):
    log_probs = logits.float().log_softmax(-1)
    return -log_probs.gather(-1, targets.unsqueeze(-1)).mean()


def _loss_in_place(logits, targets):
    """Right value, but it normalises the caller's logits in place."""
    logits.data -= logits.data.logsumexp(-1, keepdim=True)
    return -logits.float().gather(-1, targets.unsqueeze(-1)).mean()


def _loss_float64_einsum(logits, targets):
    """Another correct answer: one-hot and einsum, in float64."""
    one_hot = F.one_hot(targets, logits.shape[-1]).double()
    return -torch.einsum("btv,btv->bt", logits.double().log_softmax(-1), one_hot).mean()


def _batch_vectorised(ids, batch_size, block_size, generator=None, device=None):
    starts = torch.randint(len(ids) - block_size, (batch_size,), generator=generator)
    offsets = starts[:, None] + torch.arange(block_size)
    return ids[offsets].to(device, torch.long), ids[offsets + 1].to(device, torch.long)


def _bigram_with_a_dict(train_ids, val_ids, vocab_size, smoothing=0.01, bigram_weight=0.6):
    """Another correct answer: pair counts in a Python dict."""
    pairs, prev_counts = {}, {}
    for a, b in zip(train_ids[:-1].tolist(), train_ids[1:].tolist()):
        pairs[a, b] = pairs.get((a, b), 0) + 1
        prev_counts[a] = prev_counts.get(a, 0) + 1
    counts = torch.bincount(train_ids, minlength=vocab_size).double()
    p_uni = (counts + smoothing) / (counts.sum() + smoothing * vocab_size)
    losses = [
        -math.log(
            bigram_weight * pairs.get((a, b), 0) / max(prev_counts.get(a, 0), 1)
            + (1 - bigram_weight) * float(p_uni[b])
        )
        for a, b in zip(val_ids[:-1].tolist(), val_ids[1:].tolist())
    ]
    return {"bigram": sum(losses) / len(losses)}


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


def _uniform_from_probability(vocab_size):
    return -math.log(1 / vocab_size)


def _unigram_with_unique(train_ids, val_ids, vocab_size, smoothing=0.01):
    """Another correct answer: counts from torch.unique, in float32."""
    values, counts = torch.unique(train_ids, return_counts=True)
    table = torch.full((vocab_size,), smoothing)
    table[values] += counts.float()
    return float(-(table / table.sum())[val_ids].log().mean())


def _estimate_row_by_row(model, ids, batch_size, block_size, batches=10, seed=0):
    """Another correct answer: its own batches, drawn one row at a time, under a context manager."""
    was_training = model.training
    model.eval()
    generator = torch.Generator().manual_seed(seed)
    losses = []
    with torch.no_grad():
        for _ in range(batches):
            starts = [
                int(torch.randint(len(ids) - block_size, (1,), generator=generator))
                for _ in range(batch_size)
            ]
            x = torch.stack([ids[s : s + block_size] for s in starts])
            y = torch.stack([ids[s + 1 : s + block_size + 1] for s in starts])
            losses.append(F.cross_entropy(model(x).flatten(0, 1), y.flatten()).item())
    model.train(was_training)
    return sum(losses) / len(losses)


def _diagnosis_right():
    return {
        "A": "targets not shifted",
        "B": "gradients cleared before the step",
        "C": "warm-up never ends",
    }


@pytest.mark.parametrize(
    "check, answer",
    cases.right_answers(
        {
            checks.check_cross_entropy: [_loss_right, _loss_float64_einsum, training.lm_loss],
            checks.check_uniform_loss: [math.log, _uniform_from_probability],
            checks.check_unigram_loss: [checks._unigram_right, _unigram_with_unique],
            checks.check_random_batch: [checks._batch_right, _batch_vectorised],
            checks.check_bigram: [training.ngram_baselines, _bigram_with_a_dict],
            checks.check_decay_groups: [decay_groups, _decay_by_name],
            checks.check_training_step: [_step_right, training.training_step],
            checks.check_cosine_lr: [lr_schedule, _lr_numpy_style],
            checks.check_estimate_loss: [training.estimate_loss, _estimate_row_by_row],
            checks.check_train_loop: [training.train_loop],
            checks.check_diagnosis: [_diagnosis_right],
        }
    ),
)
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


def _estimate_on_the_last_batch(model, ids, batch_size, block_size, batches=10, seed=0):
    model.eval()
    generator = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for _ in range(batches):
            x, y = checks._batch_right(ids, batch_size, block_size, generator)
            loss = float(F.cross_entropy(model(x).flatten(0, 1), y.flatten()))
    model.train()  # the check starts in train mode once, in eval mode once
    return loss


def _bigram_dividing_by_zero(train_ids, val_ids, vocab_size, smoothing=0.01, bigram_weight=0.6):
    """The reference's counts without the clamp: a previous token never seen divides 0 by 0."""
    pairs, pair_counts = torch.unique(
        train_ids[:-1] * vocab_size + train_ids[1:], return_counts=True
    )
    keys = val_ids[:-1] * vocab_size + val_ids[1:]
    where = torch.searchsorted(pairs, keys).clamp(max=len(pairs) - 1)
    c_pair = torch.where(pairs[where] == keys, pair_counts[where], 0).double()
    c_prev = torch.bincount(train_ids[:-1], minlength=vocab_size).double()[val_ids[:-1]]
    counts = torch.bincount(train_ids, minlength=vocab_size).double()
    p_uni = (counts + smoothing) / (counts.sum() + smoothing * vocab_size)
    p = bigram_weight * c_pair / c_prev + (1 - bigram_weight) * p_uni[val_ids[1:]]
    return {"bigram": float(-p.log().mean())}


def _loop_that_records_nothing(model, train_ids, val_ids, steps, **kwargs):
    return kwargs["history"]


@pytest.mark.parametrize(
    "check, answer, message",
    cases.numbered(
        [
            # not planted: what the check says about them comes from a symptom or a shape
            (
                checks.check_cross_entropy,
                lambda lg, t: _loss_right(lg, t).detach(),
                "carries no gradient",
            ),
            (checks.check_cross_entropy, _loss_in_place, "changed its inputs in place"),
            (
                checks.check_cross_entropy,
                lambda lg, t: torch.nn.CrossEntropyLoss()(lg.float().flatten(0, 1), t.flatten()),
                "does not allow",
            ),
            (
                checks.check_uniform_loss,
                lambda v: torch.tensor(float(v)).log(),
                "return a Python float (.item()",
            ),
            (checks.check_random_batch, _unseeded_batch, "same seed gave different batches"),
            (checks.check_decay_groups, _a_parameter_in_two_groups, "is in two groups"),
            (checks.check_training_step, _step_returning_a_wrong_loss, "returned loss"),
            (
                checks.check_estimate_loss,
                _estimate_on_the_last_batch,
                "but the mean loss of the batches it ran",
            ),
            (
                checks.check_train_loop,
                _loop_that_records_nothing,
                "10 steps recorded 0 batch losses",
            ),
            (checks.check_diagnosis, lambda: {"A": "targets not shifted"}, 'keys "A", "B" and "C"'),
            (
                checks.check_diagnosis,
                lambda: dict.fromkeys("ABC", "a typo"),
                "is not one of the suspects",
            ),
            (
                checks.check_unigram_loss,
                lambda t, v, n, s=0.01: float(
                    -torch.log((torch.bincount(t) + s) / (len(t) + s * n))[v].mean()
                ),
                "minlength=vocab_size",
            ),
            (checks.check_uniform_loss, lambda v: math.log(50257), "with 2 equally likely tokens"),
            (checks.check_cosine_lr, lambda step, max_lr: max_lr, "Keep the signature"),
            (checks.check_bigram, checks._bigram_right, "a table of all pairs is too large"),
            (checks.check_bigram, _bigram_dividing_by_zero, "0 / 0 is NaN"),
        ]
    ),
)
def test_other_wrong_answers_are_named(check, answer, message):
    cases.assert_named(check, answer, message)


# --------------------------------------------------------------------------- the runs the chapter makes


@pytest.fixture(scope="module")
def shakespeare_splits():
    from gpt2lib.tokenizer import get_encoding, gpt2_data_dir

    text = (gpt2_data_dir() / "tinyshakespeare.txt").read_text(encoding="utf-8")[:200_000]
    ids = torch.tensor(get_encoding().encode_ordinary(text))
    return ids[:-5000], ids[-5000:]


def test_the_rate_sweep_check_passes_fresh_runs_and_names_a_wrong_reading(shakespeare_splits):
    train_ids, val_ids = shakespeare_splits
    rates = (3e-4, 3e-3, 3e-1)
    checks.check_rate_sweep(checks._sweep(train_ids, val_ids, rates), train_ids, val_ids)
    (mistake,) = checks.RATE_MISTAKES
    cases.assert_named(
        lambda sweep: checks.check_rate_sweep(sweep, train_ids, val_ids),
        mistake.fn(train_ids, val_ids, rates),
        mistake.message,
    )


def test_the_broken_runs_show_their_symptoms(shakespeare_splits):
    """What section 9's text says of the runs holds: A too good in training, B flat, C's rate."""
    runs = checks.broken_runs(*shakespeare_splits)
    healthy, a, b, c = runs["healthy"], runs["A"], runs["B"], runs["C"]
    assert min(a.train_loss) < min(healthy.train_loss) - 1.5 and a.val_loss > healthy.val_loss + 2
    assert max(b.train_loss) - min(b.train_loss) < 0.1  # the weights never moved
    assert abs(b.train_loss[-1] - math.log(checks.TINY_VOCAB)) < 0.1
    assert c.lr[-1] > 10 * max(healthy.lr) and c.val_loss > healthy.val_loss


def test_your_pieces_are_yours_once_their_checks_passed_else_the_references(monkeypatch, capsys):
    from gpt2lib.course import mine

    def get_batch(ids, batch_size, block_size, generator=None, device=None):
        raise NotImplementedError("Exercise 7.3: random batches: replace this line with your code")

    def lr_schedule(step, max_lr, warmup_steps, total_steps, min_lr):
        return max_lr

    monkeypatch.setattr(mine, "PASSED", {"7.6"})
    _, pieces, estimate = checks.your_pieces(
        get_batch, training.training_step, lr_schedule, training.estimate_loss, training.train_loop
    )
    assert pieces["get_batch"] is training.get_batch and pieces["lr_at"] is lr_schedule
    assert "Exercise 7.3 has not passed yet" in capsys.readouterr().out


def test_the_challenge_check_reads_steps_tokens_and_the_loss(shakespeare_splits):
    train_ids, val_ids = shakespeare_splits
    history = checks.tiny_run(train_ids, val_ids, steps=6)
    compact_val = checks._compact(train_ids, val_ids)[1]
    kwargs = {"max_tokens": 256, "block_size": 32}
    with pytest.raises(CheckFailed, match="took 6 steps; the limit is 5"):
        checks.check_challenge(
            history.model, history, compact_val, goal=100.0, max_steps=5, **kwargs
        )
    with pytest.raises(CheckFailed, match="held 256 tokens a step; the limit is 128"):
        checks.check_challenge(
            history.model,
            history,
            compact_val,
            goal=100.0,
            max_steps=6,
            max_tokens=128,
            block_size=32,
        )
    with pytest.raises(CheckFailed, match="above the goal 1.0000"):
        checks.check_challenge(history.model, history, compact_val, goal=1.0, max_steps=6, **kwargs)
    checks.check_challenge(history.model, history, compact_val, goal=100.0, max_steps=6, **kwargs)
