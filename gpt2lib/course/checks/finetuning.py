"""Checks for chapter 10's exercises: the classifier (pooling, batch, loss, confusion counts), the
masked loss, replies, LoRA (layer, adapters, merging, size, rank) and the frozen token table."""

from __future__ import annotations

import copy
import functools
import sys
import types

import torch
import torch.nn as nn
import torch.nn.functional as F

from gpt2lib.course.checks import _core as core

EX_POOL = "Exercise 10.1 (pool_mean)"
EX_BATCH = "Exercise 10.1 (speaker_batch)"
EX_CLASSIFIER = "Exercise 10.1 (GPT2Classifier)"
EX_CLASS_LOSS = "Exercise 10.1 (classification_loss)"
EX_CONFUSION = "Exercise 10.1b (confusion_counts)"
EX_COLLATE = "Exercise 10.2 (collate)"
EX_LOSS = "Exercise 10.3 (masked_lm_loss)"
EX_RESPONSE = "Exercise 10.3 (response_loss)"
EX_POSITION = "Exercise 10.4 (loss_by_position)"
EX_REPLY = "Exercise 10.4b (write_reply)"
EX_LORA = "Exercise 10.5 (LoRALinear)"
EX_ADD = "Exercise 10.6 (add_adapters)"
EX_MERGE = "Exercise 10.7 (merged_weight)"
EX_COUNT = "Exercise 10.8 (lora_parameter_count)"
EX_FROZEN = "Exercise 10.9b (full fine-tuning, token table frozen)"
EX_RANK = "Exercise 10.10 (the effect of rank)"
IGNORE = -100

_tiny_gpt = functools.partial(core.tiny_gpt2, vocab_size=60)  # 1 layer, 2 heads, width 16


def check_exercise_10_1(speaker_batch, hidden_states, pool_mean, GPT2Classifier, loss) -> None:
    """Exercise 10.1's five parts: the batch, the pooling, the classifier and its loss."""
    with core.one_pass("Exercise 10.1 (the classifier)"):
        check_pool_mean(pool_mean)
        check_speaker_batch(speaker_batch)
        check_classifier(GPT2Classifier, hidden_states)
        check_classification_loss(loss)


def check_exercise_10_3(masked_lm_loss, response_loss) -> None:
    """Exercise 10.3's two losses."""
    with core.one_pass("Exercise 10.3 (the masked loss)"):
        check_masked_lm_loss(masked_lm_loss)
        check_response_loss(response_loss)


# --------------------------------------------------------------------------- 10.1 the classifier


def _pool_right(hidden, lengths, *, mistake=""):
    """The mean over each row's real tokens; `mistake` plants one of POOL_MISTAKES by its name."""
    if mistake == "padding averaged":
        return hidden.mean(1)
    if mistake == "last token":
        return hidden[torch.arange(hidden.shape[0]), lengths - 1]
    if mistake == "off by one":
        lengths = torch.clamp(lengths + 1, max=hidden.shape[1])
    mask = torch.arange(hidden.shape[1]) < lengths[:, None]
    total = (hidden * mask[..., None]).sum(1)
    return total / (hidden.shape[1] if mistake == "divided by T" else lengths[:, None])


POOL_MISTAKES = core.variants(
    _pool_right,
    {
        "padding averaged": "your mean includes the padding positions: average only the first lengths[b] positions of row b",
        "divided by T": "you sum only the real tokens but divide by the padded length T; divide by each row's own length",
        "last token": "you return the last real token's state; this exercise asks for the mean over the real tokens",
        "off by one": "your mask keeps one position too many or too few: row b's real tokens are positions 0 .. lengths[b] - 1",
    },
)


def check_pool_mean(pool_mean) -> None:
    """`pool_mean(hidden (B, T, C), lengths (B,))` -> (B, C): the mean over each row's real tokens."""
    gen = torch.Generator().manual_seed(0)
    for B, T, C in ((3, 5, 4), (4, 9, 6)):
        hidden = torch.randn(B, T, C, generator=gen)
        lengths = torch.randint(1, T, (B,), generator=gen)
        lengths[0] = T  # one full row
        core.judge(
            EX_POOL,
            core.call_learner(EX_POOL, pool_mean, hidden.clone(), lengths.clone()),
            _pool_right(hidden, lengths),
            POOL_MISTAKES,
            lambda m: m.fn(hidden, lengths),
            "your pooled states differ from the mean over each row's real tokens",
            what=f"your pooled states (B={B}, C={C})",
            hints={
                (B, T, C): "nothing was averaged over dim 1 (the positions)",
                (C,): "you averaged over the batch too",
            },
        )
    core.passed(EX_POOL, "padding does not reach the pooled state")


def _padded(rows, pad_id, left=False):
    """The (B, T) ids of (ids, label) rows padded with pad_id on the right (or the left)."""
    T = max(len(ids) for ids, _ in rows)
    idx = torch.full((len(rows), T), pad_id)
    for b, (ids, _) in enumerate(rows):
        idx[b, slice(T - len(ids), None) if left else slice(None, len(ids))] = torch.tensor(ids)
    return idx


def check_speaker_batch(speaker_batch) -> None:
    """`speaker_batch(rows, pad_id)` -> idx (B, T) right-padded, lengths (B,), labels (B,)."""
    need = functools.partial(core.require, EX_BATCH)
    for rows in ([([5, 6, 7], 1), ([8], 0), ([9, 10], 3)], [([1, 2], 2), ([3, 4, 5, 6], 0)]):
        got = core.call_learner(EX_BATCH, speaker_batch, [(list(i), y) for i, y in rows], 99)
        need(
            isinstance(got, (tuple, list)) and len(got) == 3,
            "return three tensors: idx, lengths, labels",
        )
        want = _padded(rows, 99)
        idx = core.expect_tensor(EX_BATCH, got[0], tuple(want.shape), what="your idx").long()
        if torch.equal(idx, _padded(rows, 99, left=True)) and not torch.equal(idx, want):
            raise core.CheckFailed(
                EX_BATCH,
                "your padding is on the left: pad on the right, so that every row's real tokens start at position 0",
            )
        need(
            torch.equal(idx, want),
            "your idx differs: each row's ids, then pad_id up to the longest row",
        )
        lengths = core.expect_tensor(EX_BATCH, got[1], (len(rows),), what="your lengths")
        need(
            lengths.tolist() == [len(i) for i, _ in rows],
            "lengths must count each row's real tokens (no padding)",
        )
        labels = core.expect_tensor(EX_BATCH, got[2], (len(rows),), what="your labels")
        need(labels.tolist() == [y for _, y in rows], "labels must be the rows' labels, in order")
    core.passed(EX_BATCH)


def check_classifier(GPT2Classifier, hidden_states) -> None:
    """`GPT2Classifier(gpt, n)(idx (B, T), lengths (B,))` -> (B, n) scores of the mean state."""
    from gpt2lib.chapters.tuning import hidden_states as reference_states

    gen = torch.Generator().manual_seed(4)
    need = functools.partial(core.require, EX_CLASSIFIER)
    for n_classes in (3, 5):
        gpt = _tiny_gpt()
        model = core.call_learner(EX_CLASSIFIER, GPT2Classifier, gpt, n_classes)
        head = getattr(model, "head", None)
        need(
            getattr(model, "gpt", None) is gpt and isinstance(head, nn.Linear),
            "keep the body as self.gpt and the head as self.head, an nn.Linear",
        )
        need(
            (head.in_features, head.out_features) == (gpt.config.n_embd, n_classes),
            f"your head maps {head.in_features} -> {head.out_features}: it reads a pooled hidden state of n_embd = {gpt.config.n_embd} numbers and gives one score per class ({n_classes})",
        )
        idx = torch.randint(0, 60, (3, 7), generator=gen)
        lengths = torch.tensor([7, 4, 2])
        with torch.no_grad():
            got = core.call_learner(EX_CLASSIFIER, model, idx, lengths)
            got = core.expect_tensor(EX_CLASSIFIER, got, (3, n_classes), what="your scores")
            states = reference_states(gpt, idx)
            if not core.close(got, head(_pool_right(states, lengths)), atol=1e-5):
                last = head(states[torch.arange(3), lengths - 1])
                raise core.CheckFailed(
                    EX_CLASSIFIER,
                    "your forward reads the last real token: pool with pool_mean over the real tokens"
                    if core.close(got, last, atol=1e-5)
                    else "your scores differ from head(pool_mean(hidden_states(gpt, idx), lengths))",
                )
    core.passed(EX_CLASSIFIER, "a head of n_embd -> n_classes on the masked mean of the states")


def _class_loss(model, rows, pad_id, *, mistake=""):
    """F.cross_entropy of the classifier's scores on speaker_batch(rows); `mistake` plants one of
    CLASS_LOSS_MISTAKES by its name."""
    from gpt2lib.chapters.tuning import speaker_batch

    idx, lengths, labels = speaker_batch(rows, pad_id)
    if mistake == "padding pooled":
        lengths = torch.full((len(rows),), idx.shape[1])
    scores = model(idx, lengths)
    scores = scores.softmax(-1) if mistake == "softmax first" else scores
    return F.cross_entropy(scores, labels, reduction="sum" if mistake == "sum" else "mean")


CLASS_LOSS_MISTAKES = core.variants(
    _class_loss,
    {
        "softmax first": "you applied softmax before F.cross_entropy, which takes raw scores (logits) and does the log-softmax itself",
        "sum": "your loss is a sum over the batch: take the mean, so that the step size does not grow with the batch",
        "padding pooled": "your model read the padding: pass each row's real lengths, not the padded length, to the classifier",
    },
)


def check_classification_loss(classification_loss) -> None:
    """`classification_loss(model, rows, pad_id)` -> the mean cross-entropy of the batch's scores."""
    from gpt2lib.chapters.tuning import GPT2Classifier

    for n_classes, rows in (
        (3, [([5, 6, 7], 1), ([8], 0), ([9, 10], 2)]),
        (4, [([1, 2], 3), ([3, 4, 5, 6], 0)]),
    ):
        model = GPT2Classifier(_tiny_gpt(), n_classes).eval()
        with torch.no_grad():
            core.judge(
                EX_CLASS_LOSS,
                core.call_learner(
                    EX_CLASS_LOSS, classification_loss, model, [(list(i), y) for i, y in rows], 59
                ),
                _class_loss(model, rows, 59),
                CLASS_LOSS_MISTAKES,
                lambda m: m.fn(model, rows, 59),
                "your loss differs from F.cross_entropy of the classifier's scores on speaker_batch(rows, pad_id) and the labels",
                what="your loss",
            )
    core.passed(EX_CLASS_LOSS)


def _confusion_right(labels, predictions, n_classes, *, mistake=""):
    """The (n, n) counts, row = true class; `mistake` plants one of CONFUSION_MISTAKES by its
    name."""
    counts = torch.zeros(n_classes, n_classes, dtype=torch.long)
    if mistake == "no accumulate":
        return counts.index_put_((labels, predictions), torch.tensor(1))
    for t, p in zip(labels.tolist(), predictions.tolist()):
        counts[t, p] += 1
    if mistake == "hits only":
        return torch.diag(torch.diag(counts))
    return counts.T if mistake == "transposed" else counts


CONFUSION_MISTAKES = core.variants(
    _confusion_right,
    {
        "no accumulate": "two speeches in the same cell were counted once: counts[labels, predictions] += 1 writes each cell once however often it repeats. Add the repeats up (index_put_ with accumulate=True, or bincount of t * n + p)",
        "transposed": "your rows are the predictions: row = the true class, column = the classifier's answer",
        "hits only": "you counted only the right answers (the diagonal): every speech counts once, in row t and column p",
    },
)


def check_confusion_counts(confusion_counts) -> None:
    """`confusion_counts(labels (N,), predictions (N,), n)` -> (n, n) counts, row = true class."""
    gen = torch.Generator().manual_seed(5)
    for n, N in ((3, 20), (5, 40)):
        labels = torch.randint(0, n, (N,), generator=gen)
        predictions = torch.randint(0, n, (N,), generator=gen)
        got = core.call_learner(
            EX_CONFUSION, confusion_counts, labels.clone(), predictions.clone(), n
        )
        got = core.expect_tensor(EX_CONFUSION, got, (n, n), what="your counts").long()
        if not torch.equal(got, _confusion_right(labels, predictions, n)):
            core.fail_with(
                EX_CONFUSION,
                CONFUSION_MISTAKES,
                lambda m: torch.equal(got, m.fn(labels, predictions, n)),
                "your counts differ: entry [t, p] is the number of speeches of class t answered p",
            )
    core.passed(EX_CONFUSION, f"repeats add up; {N} speeches, {N} counts")


# --------------------------------------------------------------------------- 10.2 collate


def _collate_right(pairs, pad_id, *, mistake=""):
    """inputs, targets of (prompt, response) pairs; `mistake` plants one of COLLATE_MISTAKES by
    its name."""
    T = max(len(p) + len(r) for p, r in pairs) - 1
    inputs = torch.full((len(pairs), T), pad_id, dtype=torch.long)
    fill = pad_id if mistake == "padding as target" else IGNORE
    targets = torch.full((len(pairs), T), fill, dtype=torch.long)
    shift = {"mask one too far": 1, "mask one short": -1}.get(mistake, 0)
    for i, (p, r) in enumerate(pairs):
        tokens = list(p) + list(r)
        inputs[i, : len(tokens) - 1] = torch.tensor(tokens[:-1])
        targets[i, : len(tokens) - 1] = torch.tensor(tokens[1:])
        if mistake != "prompt kept":
            targets[i, : max(0, len(p) - 1 + shift)] = IGNORE
    return inputs, targets


COLLATE_MISTAKES = core.variants(
    _collate_right,
    {
        "prompt kept": "your targets keep the prompt's tokens: the loss would train the model to write prompts; set the targets of prompt tokens to IGNORE_INDEX",
        "mask one too far": "you ignore one target too many: the target at position len(prompt) - 1 is the response's first token, which must be kept",
        "mask one short": "you keep the target of the prompt's last token: target t is token t + 1, so the prompt's targets are positions 0 .. len(prompt) - 2",
        "padding as target": "the padding positions have pad_id as their target: the loss would teach the model to write padding; they must be IGNORE_INDEX",
    },
)


def _pairs_cases():
    gen = torch.Generator().manual_seed(1)

    def ids(n):
        return torch.randint(0, 90, (n,), generator=gen).tolist()

    cases = (((3, 2), (5, 4), (2, 1)), ((4, 3), (2, 6)))  # (prompt, response) lengths
    return [[(ids(p), ids(r)) for p, r in lengths] for lengths in cases]


def check_collate(collate) -> None:
    """`collate(pairs, pad_id)` -> inputs (B, T), targets (B, T), as the exercise says."""
    pad_id = 99
    need = functools.partial(core.require, EX_COLLATE)
    for pairs in _pairs_cases():
        got = core.call_learner(EX_COLLATE, collate, [(list(p), list(r)) for p, r in pairs], pad_id)
        core.unpack(EX_COLLATE, got, 2, "two tensors, (inputs, targets)")
        want = _collate_right(pairs, pad_id)
        shape = tuple(want[0].shape)
        too_long = "rows are one token too long: the inputs drop each row's last token and the targets its first"
        hints = {(shape[0], shape[1] + 1): too_long}
        inputs = core.expect_tensor(EX_COLLATE, got[0], shape, what="your inputs", hints=hints)
        targets = core.expect_tensor(EX_COLLATE, got[1], shape, what="your targets", hints=hints)
        need(
            not (inputs.dtype.is_floating_point or targets.dtype.is_floating_point),
            "token ids must be an integer tensor (torch.long)",
        )
        need(
            torch.equal(inputs, want[0]),
            "your inputs differ: each row is prompt + response without its last token, then pad_id up to the longest row",
        )
        if not torch.equal(targets, want[1]):
            core.fail_with(
                EX_COLLATE,
                COLLATE_MISTAKES,
                lambda m: torch.equal(targets, m.fn(pairs, pad_id)[1]),
                "your targets differ: target t is token t + 1 of the row, IGNORE_INDEX for prompt tokens and padding",
            )
    core.passed(EX_COLLATE, "inputs shifted, prompt and padding ignored")


# --------------------------------------------------------------------------- 10.3 the losses


def _masked_loss(logits, targets, *, mistake=""):
    """The mean cross-entropy over the kept targets; `mistake` plants one of LOSS_MISTAKES by its
    name."""
    if not mistake:
        keep = targets != IGNORE
        return F.cross_entropy(logits[keep], targets[keep])
    total = F.cross_entropy(logits.flatten(0, 1), targets.flatten(), reduction="sum")
    return total / targets.numel() if mistake == "mean over all" else total


SUM_MESSAGE = "your loss is a sum; take the mean over the kept targets"
LOSS_MISTAKES = core.variants(
    _masked_loss,
    {
        "sum": SUM_MESSAGE,
        "mean over all": "you average over every position, ignored ones included (as zeros): divide by the number of kept targets",
    },
)


def _targets(gen, B, T, V, ignored):
    """Random (B, T) targets; the first `ignored` of row 0 and the last ignored - 1 are IGNORE."""
    targets = torch.randint(0, V, (B, T), generator=gen)
    targets[0, :ignored] = IGNORE
    targets[-1, -(ignored - 1) :] = IGNORE
    return targets


def check_masked_lm_loss(masked_lm_loss) -> None:
    """`masked_lm_loss(logits (B, T, V), targets (B, T))` -> the mean over kept targets."""
    gen = torch.Generator().manual_seed(2)
    for B, T, V in ((2, 5, 7), (3, 4, 11)):
        logits = torch.randn(B, T, V, generator=gen)
        targets = _targets(gen, B, T, V, 2)
        core.judge(
            EX_LOSS,
            core.call_learner(EX_LOSS, masked_lm_loss, logits.clone(), targets.clone()),
            _masked_loss(logits, targets),
            LOSS_MISTAKES,
            lambda m: m.fn(logits, targets),
            "your loss differs from the mean cross-entropy over the targets that are not IGNORE_INDEX",
            what="your loss",
            hints={(B * T,): "return one number: the mean, not one loss per position"},
        )
    core.passed(EX_LOSS)


def _response_loss(gpt, inputs, targets, *, mistake=""):
    """masked_lm_loss(gpt(inputs), targets); `mistake` plants one of RESPONSE_MISTAKES by its name."""
    return _masked_loss(gpt(inputs), targets, mistake=mistake)


RESPONSE_MISTAKES = core.variants(
    _response_loss,
    {
        "sum": SUM_MESSAGE,
        "mean over all": "you divided by every position, ignored ones included: divide by the number of kept targets",
    },
)


def check_response_loss(response_loss) -> None:
    """`response_loss(gpt, inputs (B, T), targets (B, T))` = masked_lm_loss(gpt(inputs), targets)."""
    gen = torch.Generator().manual_seed(6)
    for B, T in ((2, 6), (3, 5)):
        gpt = _tiny_gpt(seed=B)
        inputs = torch.randint(0, 60, (B, T), generator=gen)
        targets = _targets(gen, B, T, 60, 3)
        with torch.no_grad():
            core.judge(
                EX_RESPONSE,
                core.call_learner(EX_RESPONSE, response_loss, gpt, inputs.clone(), targets.clone()),
                _response_loss(gpt, inputs, targets),
                RESPONSE_MISTAKES,
                lambda m: m.fn(gpt, inputs, targets),
                "your loss differs from masked_lm_loss(gpt(inputs), targets): the readout of hidden_states at the kept positions, scored against their targets",
                what="your loss",
            )
    core.passed(EX_RESPONSE, "the same loss as the whole model's logits, read out where it counts")


# --------------------------------------------------------------------------- 10.4 losses, replies


def _by_position(gpt, pairs, pad_id, positions, *, mistake=""):
    """The mean loss at each reply position over the pairs (NaN where no reply is that long);
    `mistake` plants one of POSITION_MISTAKES by its name."""
    shift = 1 if mistake == "one late" else 0
    inputs, targets = _collate_right(pairs, pad_id)
    with torch.no_grad():
        per = F.cross_entropy(
            gpt(inputs).flatten(0, 1), targets.flatten(), reduction="none", ignore_index=IGNORE
        ).view(targets.shape)
    table = torch.full((len(pairs), positions), float("nan"))
    for i, (p, r) in enumerate(pairs):
        kept = per[i, len(p) - 1 + shift : len(p) - 1 + len(r)][:positions]
        table[i, : len(kept)] = kept
    return table.nanmean(0)


POSITION_MISTAKES = core.variants(
    _by_position,
    {
        "one late": "your position 0 is the reply's second token: the first reply token is the target of the prompt's last token, at len(prompt) - 1",
    },
)


def _same_with_nan(a, b) -> bool:
    return torch.equal(torch.isnan(a), torch.isnan(b)) and core.close(
        torch.nan_to_num(a, nan=0.0), torch.nan_to_num(b, nan=0.0), atol=1e-5
    )


def check_loss_by_position(loss_by_position) -> None:
    """`loss_by_position(gpt, pairs, pad_id, positions)` -> (positions,) mean loss per reply position."""
    gpt = core.tiny_gpt2(0, n_positions=32, vocab_size=100)
    for pairs, positions in zip(_pairs_cases(), (4, 8)):
        got = core.call_learner(
            EX_POSITION,
            loss_by_position,
            gpt,
            [(list(p), list(r)) for p, r in pairs],
            99,
            positions,
        )
        got = core.expect_tensor(EX_POSITION, got, (positions,), what="your losses", finite=False)
        if not _same_with_nan(got, _by_position(gpt, pairs, 99, positions)):
            core.fail_with(
                EX_POSITION,
                POSITION_MISTAKES,
                lambda m: _same_with_nan(got, m.fn(gpt, pairs, 99, positions)),
                "your losses differ from the mean over the pairs of the loss at each reply position (NaN where no reply is that long)",
            )
    core.passed(EX_POSITION)


def _reply(mistake="", crop=True):
    """A write_reply: the right one by default; `mistake` plants one of REPLY_MISTAKES by its name
    (and crop=False asks generate for more tokens than the context holds)."""

    def write_reply(gpt, prompt, new_tokens=30):
        from gpt2lib.generation import generate
        from gpt2lib.tokenizer import get_encoding

        enc = get_encoding()
        ids = torch.tensor([enc.encode(prompt)])
        if crop:
            new_tokens = min(new_tokens, gpt.config.n_positions - ids.shape[1])
        out = generate(gpt, ids, new_tokens, temperature=0)[0].tolist()
        out = out if mistake == "prompt kept" else out[ids.shape[1] :]
        if mistake != "not cut" and enc.eot_token in out:
            out = out[: out.index(enc.eot_token)]
        return enc.decode(out).strip()

    return write_reply


reference_write_reply = _reply()

REPLY_MISTAKES = core.planted(
    _reply,
    {
        "prompt kept": "your reply starts with the prompt: return only the new tokens, those after the prompt's length",
        "not cut": "your reply runs past <|endoftext|>: cut the new tokens before the first PAD, where the model ended its reply",
    },
)


def _eot_model():
    """A tiny GPT2 whose every next token is <|endoftext|>: the tied readout sees only that row."""
    gpt = _tiny_gpt(vocab_size=50257)
    with torch.no_grad():
        gpt.ln_f.weight.zero_()
        gpt.ln_f.bias.fill_(1.0)  # every final state is all ones
        gpt.wte.weight.zero_()
        gpt.wte.weight[50256] = 1.0  # so <|endoftext|> scores n_embd, every other token 0
    return gpt


def check_write_reply(write_reply) -> None:
    """`write_reply(gpt, prompt, new_tokens)` -> the greedy reply's text, cut at <|endoftext|>."""
    prompt = "ROMEO:\nBut soft, what light"  # 9 tokens; the tiny models' context is 16
    model = _tiny_gpt(seed=1, vocab_size=50257)
    for gpt, new_tokens in [(model, 5), (_eot_model(), 8), (model, 30)]:
        try:
            got = core.call_learner(EX_REPLY, write_reply, gpt, prompt, new_tokens)
        except ValueError:  # generate refuses a prompt and new tokens longer than the context
            raise core.CheckFailed(
                EX_REPLY,
                "with a prompt near the end of the context, ask generate for no more tokens than fit: n_positions - the prompt's length",
            ) from None
        core.require(
            EX_REPLY,
            isinstance(got, str),
            f"return the reply as text (a str), not {type(got).__name__}",
        )
        want = reference_write_reply(gpt, prompt, new_tokens)
        if got != want:
            core.fail_with(
                EX_REPLY,
                REPLY_MISTAKES,
                lambda m: got == m.fn(gpt, prompt, new_tokens),
                f"your reply {got[:60]!r} differs from the greedy one, {want[:60]!r}",
            )
    core.passed(EX_REPLY, "new tokens only, greedy, cut at <|endoftext|>, within the context")


# --------------------------------------------------------------------------- 10.5 LoRA


class _Conv1D(nn.Module):
    def __init__(self, n_in, n_out, gen):
        super().__init__()
        self.weight = nn.Parameter(torch.randn(n_in, n_out, generator=gen) * 0.1)
        self.bias = nn.Parameter(torch.randn(n_out, generator=gen) * 0.1)

    def forward(self, x):
        return x @ self.weight + self.bias


def _lora_out(layer, x, scale=None, *, mistake=""):
    """base(x) + lora_B(lora_A(dropout(x))) * scale (the layer's own by default); `mistake`
    plants one of LORA_MISTAKES by its name."""
    if mistake == "no scale":
        scale = 1.0
    elif mistake == "alpha, not alpha / rank":
        scale = layer.alpha
    elif mistake == "scale inverted":
        scale = layer.rank / layer.alpha
    elif scale is None:
        scale = layer.scale
    A, B = layer.lora_A.weight, layer.lora_B.weight
    dropped_input = mistake not in ("no dropout", "dropout on output")
    update = (layer.lora_dropout(x) if dropped_input else x) @ A.T @ B.T
    if mistake == "dropout on output":  # one mask, on the update: as a learner writes it
        update = layer.lora_dropout(update)
    return update * scale if mistake == "base missing" else layer.base(x) + update * scale


LORA_MISTAKES = core.variants(
    _lora_out,
    {
        "no scale": "the update is not multiplied by alpha / rank (self.scale)",
        "alpha, not alpha / rank": "you scale the update by alpha; LoRA's scale is alpha / rank, so that trying another rank keeps the update's size",
        "scale inverted": "you scale by rank / alpha; LoRA's scale is alpha / rank",
        "base missing": "the frozen layer's output base(x) is missing: LoRA adds the update to it",
        "dropout on output": "dropout acts on the update's output; LoRA drops the input of lora_A, x, and never touches base(x)",
        "no dropout": "in training mode the adapter's input must go through self.lora_dropout",
    },
)


def _lora_init(mistake):
    """A LoRALinear class whose __init__ plants one of LORA_INIT_MISTAKES by its name."""
    from gpt2lib.chapters.tuning import LoRALinear

    class Wrong(LoRALinear):
        def __init__(self, base, rank, alpha, dropout=0.0):
            super().__init__(base, rank, alpha, 0.0 if mistake == "dropout dropped" else dropout)
            with torch.no_grad():
                if mistake in ("both zero", "A and B swapped"):
                    self.lora_A.weight.zero_()
                if mistake == "A and B swapped":
                    self.lora_B.weight.normal_()

    return Wrong


LORA_INIT_MISTAKES = core.planted(
    _lora_init,
    {
        "both zero": "lora_A and lora_B both start at zero: then each one's gradient is zero too (it is multiplied by the other) and the adapter never learns. Only B starts at zero; A starts random, as nn.Linear initialises it",
        "A and B swapped": "lora_A starts at zero and lora_B random: the text starts B at zero and A random (as peft does); swap the two initialisations",
        "dropout dropped": "the dropout argument is not used: lora_dropout must drop with the probability given",
    },
)


def _check_lora_init(layer, dropout) -> None:
    need = functools.partial(core.require, EX_LORA)
    for part in ("lora_A", "lora_B", "lora_dropout", "base"):
        need(hasattr(layer, part), f"your layer has no {part}; keep the names of __init__")
    a_zero, b_zero = not bool(layer.lora_A.weight.any()), not bool(layer.lora_B.weight.any())
    if a_zero:
        raise core.CheckFailed(
            EX_LORA,
            core.named(LORA_INIT_MISTAKES, "both zero" if b_zero else "A and B swapped").message,
        )
    need(b_zero, "lora_B must start at zero, so that training starts at base(x)")
    p = getattr(layer.lora_dropout, "p", 0.0)  # nn.Identity stands for no dropout
    need(p == dropout, core.named(LORA_INIT_MISTAKES, "dropout dropped").message)


def check_lora_linear(LoRALinear) -> None:
    """`LoRALinear(base, rank, alpha, dropout)` computes base(x) + B(A(dropout(x))) * alpha / rank."""
    gen = torch.Generator().manual_seed(3)
    for n_in, n_out, rank, alpha, dropout in ((6, 10, 2, 4.0, 0.0), (8, 5, 3, 6.0, 0.5)):
        base = _Conv1D(n_in, n_out, gen)
        layer = core.call_learner(EX_LORA, LoRALinear, base, rank, alpha, dropout)
        _check_lora_init(layer, dropout)
        x = torch.randn(2, 3, n_in, generator=gen)
        with torch.no_grad():
            start = core.call_learner(EX_LORA, layer, x)
        if not core.close(start, base(x), atol=1e-6):
            core.require(
                EX_LORA,
                not core.close(start, torch.zeros_like(start), atol=1e-6),
                core.named(LORA_MISTAKES, "base missing").message,
            )
            raise core.CheckFailed(
                EX_LORA,
                "with lora_B at zero your layer should compute exactly base(x); the update must be B(A(x)), which starts at zero",
            )
        with torch.no_grad():
            layer.lora_B.weight.normal_(generator=gen)
        for mode in ("eval", "train") if dropout else ("eval",):
            layer.train(mode == "train")
            core.judge(
                EX_LORA,
                core.seeded_call(layer, x),
                core.seeded_call(lambda: _lora_out(layer, x, alpha / rank)),
                LORA_MISTAKES,
                lambda m: core.seeded_call(lambda: m.fn(layer, x)),
                f"your output differs from base(x) + lora_B(lora_A(dropout(x))) * alpha / rank ({mode} mode)",
                what=f"your output ({mode} mode)",
            )
        layer.eval()
    core.passed(EX_LORA, "zero at the start, scaled by alpha / rank, dropout on the input only")


def check_add_adapters(add_adapters, LoRALinear) -> None:
    """`add_adapters(model, names, rank, alpha, dropout)` swaps each named layer for a LoRALinear."""
    model = core.tiny_gpt2(0, n_layer=2)
    names = ["h.0.attn.c_attn", "h.1.mlp.c_fc"]
    bases = {n: model.get_submodule(n) for n in names}
    idx = torch.randint(0, 50, (2, 6))
    before = model(idx)
    got = core.call_learner(EX_ADD, add_adapters, model, names, 2, 4.0, 0.0)
    need = functools.partial(core.require, EX_ADD)
    need(got is model, "change the model in place and return it")
    for name in names:
        layer = model.get_submodule(name)
        need(
            isinstance(layer, LoRALinear),
            f"model.{name} is a {type(layer).__name__}, not a LoRALinear: use model.set_submodule(name, ...)",
        )
        need(
            layer.base is bases[name],
            f"the LoRALinear at {name} must wrap the layer that was there (its trained weights), not a new one",
        )
    others = [n for n, m in model.named_modules() if isinstance(m, LoRALinear) and n not in names]
    need(not others, f"only the named layers get adapters; you also changed {others}")
    need(
        core.close(model(idx), before, atol=1e-6),
        "the model's logits changed: new adapters start at zero",
    )
    core.passed(EX_ADD)


def _merged(layer, *, mistake=""):
    """The merged [in, out] weight of a LoRALinear; `mistake` plants one of MERGE_MISTAKES by its
    name."""
    W, A, B = layer.base.weight, layer.lora_A.weight, layer.lora_B.weight
    if mistake == "no scale":
        return W + A.T @ B.T
    if mistake == "B A":
        return W + (B @ A).reshape(W.shape) * layer.scale
    return W + A.T @ B.T * layer.scale


MERGE_MISTAKES = core.variants(
    _merged,
    {
        "no scale": "the merged update is not multiplied by layer.scale (alpha / rank)",
        "B A": "lora_B.weight @ lora_A.weight is (n_out, n_in), the layout of nn.Linear; the Conv1D weight is [in, out], so take its transpose",
    },
)


def check_merged_weight(merged_weight, LoRALinear) -> None:
    """`merged_weight(layer)` -> the [in, out] weight W with x @ W + b == layer(x)."""
    from gpt2lib.chapters.tuning import LoRALinear as Reference

    gen = torch.Generator().manual_seed(4)
    for n_in, n_out, rank in ((6, 10, 2), (9, 4, 3)):
        layer = Reference(_Conv1D(n_in, n_out, gen), rank, 2.0 * rank + 1)
        with torch.no_grad():
            layer.lora_B.weight.normal_(generator=gen)
        got = core.call_learner(EX_MERGE, merged_weight, layer)
        got = core.expect_tensor(
            EX_MERGE,
            got,
            (n_in, n_out),
            what="your merged weight",
            hints={
                (n_out, n_in): "it is transposed: Conv1D stores [in, out]",
                (rank, rank): "A.weight @ B.weight is not the update: mind the shapes",
            },
        )
        x = torch.randn(3, n_in, generator=gen)
        with torch.no_grad():
            want = layer(x)
        if not core.close(x.double() @ got + layer.base.bias.double(), want, atol=1e-5):
            core.fail_with(
                EX_MERGE,
                MERGE_MISTAKES,
                lambda m: core.close(got, m.fn(layer), atol=1e-5),
                "x @ your weight + bias differs from the layer's output",
            )
    core.passed(EX_MERGE, "x @ W_merged + b equals the adapted layer")


def reference_lora_parameter_count(config, rank, targets, *, mistake=""):
    """The parameters LoRA of `rank` adds on `targets` ('c_attn', 'c_proj', 'c_fc') of every block;
    `mistake` plants one of COUNT_MISTAKES by its name."""
    C, layers = config.n_embd, 1 if mistake == "one layer" else config.n_layer
    if mistake == "full matrix":
        return layers * sum({"c_attn": 3, "c_fc": 4, "c_proj": 5}[t] * C**2 for t in targets)
    # rank * (n_in + n_out) per adapter; 'c_proj' names attention's and the MLP's
    attn = C + (C if mistake == "c_attn as C x C" else 3 * C)
    sizes = {"c_attn": attn, "c_fc": C + 4 * C, "c_proj": (C + C) + (4 * C + C)}
    return layers * rank * sum(sizes[t] for t in targets)


COUNT_MISTAKES = core.variants(
    reference_lora_parameter_count,
    {
        "one layer": "you counted one block; every block has these layers (n_layer of them)",
        "full matrix": "you counted the full weight n_in * n_out; LoRA stores A (rank x n_in) and B (n_out x rank)",
        "c_attn as C x C": "c_attn maps C to 3C (queries, keys and values at once)",
    },
)


def check_lora_parameter_count(lora_parameter_count) -> None:
    """`lora_parameter_count(config, rank, targets)` -> parameters the adapters add."""
    from gpt2lib.chapters.config import GPT2Config
    from gpt2lib.chapters.model import count_gpt2_parameters  # chapter 6's count (6.5)

    def counts(got, want):
        return isinstance(got, (int, torch.Tensor)) and int(got) == want

    for config, rank, targets in [
        (GPT2Config(), 8, ("c_attn",)),
        (GPT2Config(n_layer=3, n_head=2, n_embd=32), 4, ("c_attn", "c_fc")),
        (GPT2Config(n_layer=2, n_head=2, n_embd=16), 2, ("c_attn", "c_proj", "c_fc")),
    ]:
        got = core.call_learner(EX_COUNT, lora_parameter_count, config, rank, targets)
        want = reference_lora_parameter_count(config, rank, targets)
        if not counts(got, want):
            core.fail_with(
                EX_COUNT,
                COUNT_MISTAKES,
                lambda m: counts(got, m.fn(config, rank, targets)),
                f"for n_layer={config.n_layer}, n_embd={config.n_embd}, rank={rank}, targets={targets} the adapters add {want:,} parameters; you said {got!r}",
            )
    added = reference_lora_parameter_count(GPT2Config(), 8, ("c_attn",))
    core.passed(
        EX_COUNT,
        f"GPT-2 small, rank 8 on c_attn: {added:,} parameters, {added / count_gpt2_parameters(GPT2Config()):.3%} of the model's",
    )


# --------------------------------------------------------------------------- 10.9b frozen table


class _NotAnswered:
    """What `frozen` holds in a notebook until the learner's cell of Exercise 10.9b assigns it."""

    def __repr__(self) -> str:
        return "<not answered yet>"


NOT_ANSWERED = _NotAnswered()


def _placeholders(*names: str) -> None:
    """In an IPython kernel, set each unset name to NOT_ANSWERED, so that a check cell run before
    its exercise says "not done yet" instead of raising NameError."""
    ipython = sys.modules.get("IPython")
    shell = ipython.get_ipython() if ipython is not None else None
    if shell is not None:
        for name in names:
            shell.user_ns.setdefault(name, NOT_ANSWERED)


_placeholders("frozen")


def _trained_copy(base, moved=lambda name: name != "wte.weight", *, mistake=""):
    """A classifier on a copy of `base` whose parameters named by `moved` (all but wte) were
    nudged; `mistake` plants one of FROZEN_MISTAKES by its name."""
    moved = {
        "table trained": lambda name: True,
        "only the head": lambda name: False,
        "positions frozen": lambda name: name not in ("wte.weight", "wpe.weight"),
    }.get(mistake, moved)
    gpt = base if mistake == "base trained" else copy.deepcopy(base)
    with torch.no_grad():
        for name, p in gpt.named_parameters():
            if moved(name):
                p.add_(0.01)
    return types.SimpleNamespace(gpt=gpt, head=nn.Linear(gpt.config.n_embd, 3))


FROZEN_MISTAKES = core.variants(
    _trained_copy,
    {
        "table trained": "the token table moved: call requires_grad_(False) on the copy's wte.weight before training (the optimizer gets what requires grad)",
        "base trained": "you trained base_model itself: train a copy.deepcopy of it, so that the cells below still start from the pretrained weights",
        "only the head": "nothing but the head trained: freeze only the token table; the blocks, the position table and ln_f train as in full fine-tuning",
        "positions frozen": "more than the token table is frozen: only wte.weight should stay as pretrained",
    },
)


def check_frozen_table(model, base) -> None:
    """`model`: a classifier trained from a copy of `base` (a GPT2) with only wte frozen."""
    if model is NOT_ANSWERED:
        raise core.NotDoneYet(EX_FROZEN, core.NOT_DONE)
    gpt, head = getattr(model, "gpt", None), getattr(model, "head", None)
    need = functools.partial(core.require, EX_FROZEN)
    need(
        gpt is not None and isinstance(head, nn.Linear),
        f"frozen should be a classifier (classifier(gpt, n_classes)) after training; got {type(model).__name__}",
    )
    need(gpt is not base, FROZEN_MISTAKES[1].message)
    reference = dict(base.named_parameters())
    still = [
        n for n, p in gpt.named_parameters() if n in reference and torch.equal(p, reference[n])
    ]
    need("wte.weight" in still, FROZEN_MISTAKES[0].message)
    need(len(still) < len(reference), FROZEN_MISTAKES[2].message)
    need(
        len(still) == 1,
        f"{FROZEN_MISTAKES[3].message}; these did not move: {', '.join(n for n in still if n != 'wte.weight')[:200]}",
    )
    core.passed(EX_FROZEN, f"wte is as pretrained; the other {len(reference) - 1} tensors trained")


# --------------------------------------------------------------------------- 10.10 rank, challenge


def _rank_right(ranks, *, mistake=""):
    """One (rank, share trained, loss drop) per rank, as a sweep gives; `mistake` plants one of
    RANK_MISTAKES by its name."""
    rows = []
    for r in ranks:
        share = {"count not share": 7_000 * r, "same adapter": 0.001}.get(mistake, 0.001 * r)
        drop = 0.3 + 0.01 * r
        rows.append((r, share, -drop if mistake == "drop sign" else drop))
    return rows[:1] if mistake == "one rank" else rows


RANK_MISTAKES = core.variants(
    _rank_right,
    {
        "drop sign": "your loss drops are negative: the drop is the loss before tuning minus the loss after (or training raised the loss; look at its printout)",
        "count not share": "the second entry should be the share of the parameters trained (trained / total), not a count",
        "one rank": "measure every rank in RANKS, one result each, in that order",
        "same adapter": "the share trained is the same at every rank: build a fresh copy of the base model with apply_lora(..., rank=rank) for each rank",
    },
)


def check_rank_sweep(results, ranks=(1, 4, 16)) -> None:
    """`results`: one (rank, share of parameters trained, response-loss drop) per rank."""
    ranks = tuple(ranks)
    rows = list(results) if isinstance(results, (list, tuple)) else []
    need = functools.partial(core.require, EX_RANK)
    need(
        len(rows) == len(ranks) and all(isinstance(r, (list, tuple)) and len(r) == 3 for r in rows),
        f"{RANK_MISTAKES[2].message}: {len(ranks)} tuples (rank, share, drop); got {results!r}",
    )
    need(
        tuple(r for r, _, _ in rows) == ranks,
        f"the ranks measured are {[r for r, _, _ in rows]}; measure RANKS = {list(ranks)}, in that order",
    )
    shares, drops = [float(s) for _, s, _ in rows], [float(d) for _, _, d in rows]
    need(all(0 < s < 1 for s in shares), RANK_MISTAKES[1].message)
    need(all(b > a for a, b in zip(shares, shares[1:])), RANK_MISTAKES[3].message)
    need(all(d == d and d > 0 for d in drops), RANK_MISTAKES[0].message)
    core.passed(
        EX_RANK,
        f"rank {ranks[-1]} trains {shares[-1] / shares[0]:.1f}x the parameters of rank {ranks[0]} for {drops[-1] - drops[0]:+.4f} nats of drop",
    )


def check_challenge(loss_drop, trainable_fraction, goal_nats=0.3) -> None:
    """The challenge: LoRA training under 2% of the parameters lowers the loss by `goal_nats`."""
    name = "Challenge 10"
    need = functools.partial(core.require, name)
    need(
        trainable_fraction < 0.02,
        f"{100 * trainable_fraction:.2f}% of the parameters are trained; the goal allows under 2%",
    )
    need(
        loss_drop >= goal_nats,
        f"the response loss fell by {loss_drop:.3f} nats; the goal is {goal_nats} nats",
    )
    core.passed(
        name,
        f"{loss_drop:.3f} nats lower with {100 * trainable_fraction:.2f}% of the parameters trained",
    )


MISTAKES_BY_CHECK = {
    check_pool_mean: POOL_MISTAKES,
    check_collate: COLLATE_MISTAKES,
    check_loss_by_position: POSITION_MISTAKES,
    check_masked_lm_loss: LOSS_MISTAKES,
    check_lora_linear: LORA_MISTAKES,
    check_merged_weight: MERGE_MISTAKES,
    check_lora_parameter_count: COUNT_MISTAKES,
    check_rank_sweep: RANK_MISTAKES,
    check_frozen_table: FROZEN_MISTAKES,
    check_classification_loss: CLASS_LOSS_MISTAKES,
    check_confusion_counts: CONFUSION_MISTAKES,
    check_response_loss: RESPONSE_MISTAKES,
    check_write_reply: REPLY_MISTAKES,
}
