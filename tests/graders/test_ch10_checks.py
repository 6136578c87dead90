"""Chapter 10's checks (gpt2lib.course.checks.finetuning): right answers in any style pass, every planted mistake is named."""

from __future__ import annotations

import pytest
import torch

from gpt2lib.chapters.tuning import (
    GPT2Classifier,
    LoRALinear,
    add_adapters,
    classification_loss,
    collate,
    hidden_states,
    loss_by_position,
    masked_lm_loss,
    merged_weight,
    pool_mean,
    response_loss,
    speaker_batch,
)
from gpt2lib.course.checks import finetuning as checks
from gpt2lib.course.checks._core import CheckFailed, named

# --------------------------------------------------------------------------- the checks


REFERENCE = {
    checks.check_pool_mean: lambda: (pool_mean,),
    checks.check_classifier: lambda: (GPT2Classifier, hidden_states),
    checks.check_classification_loss: lambda: (classification_loss,),
    checks.check_confusion_counts: lambda: (checks._confusion_right,),
    checks.check_response_loss: lambda: (response_loss,),
    checks.check_write_reply: lambda: (checks.reference_write_reply,),
    checks.check_collate: lambda: (collate,),
    checks.check_speaker_batch: lambda: (speaker_batch,),
    checks.check_loss_by_position: lambda: (loss_by_position,),
    checks.check_masked_lm_loss: lambda: (masked_lm_loss,),
    checks.check_lora_linear: lambda: (LoRALinear,),
    checks.check_add_adapters: lambda: (add_adapters, LoRALinear),
    checks.check_merged_weight: lambda: (merged_weight, LoRALinear),
    checks.check_exercise_10_1: lambda: (
        speaker_batch,
        hidden_states,
        pool_mean,
        GPT2Classifier,
        classification_loss,
    ),
    checks.check_exercise_10_3: lambda: (masked_lm_loss, response_loss),
    checks.check_rank_sweep: lambda: ([(1, 0.0011, 0.33), (4, 0.0045, 0.39), (16, 0.0178, 0.41)],),
}


@pytest.mark.parametrize("check", list(REFERENCE), ids=lambda c: c.__name__)
def test_every_check_passes_the_reference(check, capsys):
    check(*REFERENCE[check]())
    assert "✅" in capsys.readouterr().out


@pytest.mark.parametrize(
    "check, mistake",
    [
        pytest.param(check, m, id=f"{check.__name__}-{m.name}")
        for check, ms in (
            (checks.check_classification_loss, checks.CLASS_LOSS_MISTAKES),
            (checks.check_confusion_counts, checks.CONFUSION_MISTAKES),
            (checks.check_response_loss, checks.RESPONSE_MISTAKES),
            (checks.check_write_reply, checks.REPLY_MISTAKES),
        )
        for m in ms
    ],
)
def test_classifier_loss_and_confusion_checks_name_each_mistake(check, mistake):
    with pytest.raises(CheckFailed) as info:
        check(mistake.fn)
    assert mistake.message in str(info.value)


def test_confusion_check_passes_a_vectorised_count_and_the_package_s(capsys):
    checks.check_confusion_counts(
        lambda t, p, n: torch.bincount(t * n + p, minlength=n * n).view(n, n)
    )
    from gpt2lib.finetune import confusion_matrix

    checks.check_confusion_counts(confusion_matrix)
    assert capsys.readouterr().out.count("✅") == 2


def test_reply_check_names_a_reply_that_asks_for_more_than_the_context():
    with pytest.raises(CheckFailed, match="no more tokens than fit"):
        checks.check_write_reply(checks._reply(crop=False))


def test_classifier_check_names_a_head_on_the_wrong_size_and_the_last_token():
    class WrongHead(GPT2Classifier):
        def __init__(self, gpt, n_classes):
            super().__init__(gpt, n_classes)
            self.head = torch.nn.Linear(gpt.config.vocab_size, n_classes)

    class LastToken(GPT2Classifier):
        def forward(self, idx, lengths):
            return self.head(hidden_states(self.gpt, idx)[torch.arange(len(idx)), lengths - 1])

    for cls, phrase in (
        (WrongHead, "it reads a pooled hidden state"),
        (LastToken, "reads the last real token"),
    ):
        with pytest.raises(CheckFailed, match=phrase):
            checks.check_classifier(cls, hidden_states)


@pytest.mark.parametrize("mistake", checks.POOL_MISTAKES, ids=lambda m: m.name)
def test_pool_check_names_each_mistake(mistake):
    with pytest.raises(CheckFailed) as info:
        checks.check_pool_mean(mistake.fn)
    assert mistake.message in str(info.value)


def _collate_of(mistake):
    return lambda pairs, pad_id: mistake.fn(pairs, pad_id)


@pytest.mark.parametrize("mistake", checks.COLLATE_MISTAKES, ids=lambda m: m.name)
def test_collate_check_names_each_mistake(mistake):
    with pytest.raises(CheckFailed) as info:
        checks.check_collate(_collate_of(mistake))
    assert mistake.message in str(info.value)


@pytest.mark.parametrize("mistake", checks.LOSS_MISTAKES, ids=lambda m: m.name)
def test_loss_check_names_each_mistake(mistake):
    with pytest.raises(CheckFailed) as info:
        checks.check_masked_lm_loss(mistake.fn)
    assert mistake.message in str(info.value)


@pytest.mark.parametrize("mistake", checks.LORA_MISTAKES, ids=lambda m: m.name)
def test_lora_check_names_each_mistake(mistake):
    class Wrong(LoRALinear):
        def forward(self, x):
            return mistake.fn(self, x)

    with pytest.raises(CheckFailed) as info:
        checks.check_lora_linear(Wrong)
    assert mistake.message in str(info.value)


def test_lora_check_names_dropout_on_the_update_as_a_learner_writes_it():
    class DropoutOnOutput(LoRALinear):
        def forward(self, x):
            return self.base(x) + self.lora_dropout(self.lora_B(self.lora_A(x))) * self.scale

    with pytest.raises(CheckFailed) as info:
        checks.check_lora_linear(DropoutOnOutput)
    assert named(checks.LORA_MISTAKES, "dropout on output").message in str(info.value)


@pytest.mark.parametrize("mistake", checks.MERGE_MISTAKES, ids=lambda m: m.name)
def test_merge_check_names_each_mistake(mistake):
    with pytest.raises(CheckFailed) as info:
        checks.check_merged_weight(mistake.fn, LoRALinear)
    assert mistake.message in str(info.value)


@pytest.mark.parametrize("mistake", checks.COUNT_MISTAKES, ids=lambda m: m.name)
def test_count_check_names_each_mistake(mistake):
    with pytest.raises(CheckFailed) as info:
        checks.check_lora_parameter_count(mistake.fn)
    assert mistake.message in str(info.value)


@pytest.mark.parametrize("mistake", checks.POSITION_MISTAKES, ids=lambda m: m.name)
def test_position_check_names_each_mistake(mistake):
    with pytest.raises(CheckFailed) as info:
        checks.check_loss_by_position(mistake.fn)
    assert mistake.message in str(info.value)


def test_batch_check_names_left_padding():
    def left(rows, pad_id):
        T = max(len(i) for i, _ in rows)
        idx = torch.full((len(rows), T), pad_id)
        for b, (ids, _) in enumerate(rows):
            idx[b, T - len(ids) :] = torch.tensor(ids)
        return idx, torch.tensor([len(i) for i, _ in rows]), torch.tensor([y for _, y in rows])

    with pytest.raises(CheckFailed, match="your padding is on the left"):
        checks.check_speaker_batch(left)


@pytest.mark.parametrize("mistake", checks.LORA_INIT_MISTAKES, ids=lambda m: m.name)
def test_lora_check_names_each_mistake_of_the_starting_values(mistake):
    with pytest.raises(CheckFailed) as info:
        checks.check_lora_linear(mistake.fn)
    assert mistake.message in str(info.value)


def test_one_exercise_passes_once_after_all_its_parts(capsys):
    checks.check_exercise_10_3(masked_lm_loss, response_loss)
    out = capsys.readouterr().out
    assert out.count("✅") == 1 and "Exercise 10.3" in out
    with pytest.raises(CheckFailed):
        checks.check_exercise_10_3(masked_lm_loss, checks.RESPONSE_MISTAKES[0].fn)
    assert "✅" not in capsys.readouterr().out


@pytest.mark.parametrize("mistake", checks.RANK_MISTAKES, ids=lambda m: m.name)
def test_rank_check_names_each_mistake(mistake):
    with pytest.raises(CheckFailed) as info:
        checks.check_rank_sweep(mistake.fn((1, 4, 16)), (1, 4, 16))
    assert mistake.message in str(info.value)


def test_the_rank_check_tries_the_ranks_it_is_given():
    checks.check_rank_sweep([(2, 0.001, 0.2), (8, 0.004, 0.3)], (2, 8))
    with pytest.raises(CheckFailed, match=r"measure RANKS = \[1, 4, 16\]"):
        checks.check_rank_sweep([(1, 0.001, 0.2), (2, 0.002, 0.3), (16, 0.01, 0.4)])


# --------------------------------------------------------------------------- 10.9b the frozen table


def test_the_frozen_table_check_passes_a_copy_with_only_wte_unchanged(capsys):
    base = checks._tiny_gpt()
    checks.check_frozen_table(checks._trained_copy(base, lambda n: n != "wte.weight"), base)
    assert "✅" in capsys.readouterr().out


@pytest.mark.parametrize("mistake", checks.FROZEN_MISTAKES, ids=lambda m: m.name)
def test_the_frozen_table_check_names_each_mistake(mistake):
    base = checks._tiny_gpt()
    with pytest.raises(CheckFailed) as info:
        checks.check_frozen_table(mistake.fn(base), base)
    assert mistake.message in str(info.value)
