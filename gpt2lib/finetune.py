"""Fine-tuning GPT-2: the two data sets of chapter 10, LoRA adapters in peft's layout, and the
entry points that check their input (hand-written; the teaching pieces, written by the learner
in solutions/10_finetuning.ipynb, are generated into gpt2lib/tuning.py).

    model = from_pretrained("gpt2")
    apply_lora(model, rank=8, alpha=16, targets=("c_attn",))   # adapters in place, rest frozen
    apply_lora(model, rank=2, alpha=4, targets=("wte", "c_attn"))  # the token table too (peft's
                                                                  # lora_embedding_A/B)
    apply_lora(model, rank=4, alpha=8, targets=("wte", "c_fc"), rank_pattern={"wte": 2})
                                           # a rank per target (peft's rank_pattern, alpha_pattern)
    ...train...
    save_adapter(model, "my_adapter")      # adapter_config.json + adapter_model.safetensors
    load_adapter(other_model, "my_adapter")
    merge_lora(model)                      # the plain model again: save_pretrained works

The adapter folder is what `peft.PeftModel.from_pretrained(GPT2LMHeadModel, folder)` reads,
and an adapter that peft saved for a GPT-2 loads here.
"""

from __future__ import annotations

import hashlib
import json
import math
import os
import re
from collections import Counter
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Protocol, TypeVar

import torch
import torch.nn as nn

from gpt2lib.chapters.layers import Conv1D
from gpt2lib.chapters.tuning import (
    IGNORE_INDEX,
    GPT2Classifier,
    LoRALinear,
    add_adapters,
    collate,
    merged_weight,
    response_loss,
    speaker_batch,
)
from gpt2lib.checkpoint import CheckpointError, check_values, read_config_dict, read_safetensors
from gpt2lib.files import (
    folder_lock,
    json_object,
    read_small_file,
    recover_saves,
    save_files,
    stale_saves,
)
from gpt2lib.validation import (
    DATA_DIR,
    ENDOFTEXT_ID,
    check_path,
    check_real,
    check_whole,
    released_name,
)

__all__ = [
    "ADAPTER_CONFIG",
    "ADAPTER_WEIGHTS",
    "AdapterError",
    "LoRAEmbedding",
    "PROMPT_TEMPLATE",
    "ReplyPair",
    "SpeakerData",
    "accuracy",
    "apply_lora",
    "classifier",
    "collate",
    "confusion_matrix",
    "encode_pairs",
    "encode_speeches",
    "fine_tune",
    "load_adapter",
    "lora_layers",
    "mean_response_loss",
    "merge_lora",
    "model_name",
    "peft_logits",
    "plot_confusion",
    "plot_curves",
    "reply_dataset",
    "save_adapter",
    "speaker_batch",
    "speaker_dataset",
    "speeches",
    "trainable_parameters",
    "tune_seeds",
]

DATA_FILE = DATA_DIR / "tinyshakespeare.txt"
ADAPTER_CONFIG = "adapter_config.json"
ADAPTER_WEIGHTS = "adapter_model.safetensors"
_PEFT_PREFIX = "base_model.model.transformer."  # peft's key prefix on transformers' GPT-2


def _or_the_learners(cls: type) -> type:
    """A stand-in for `cls` in isinstance: `cls`, or the class of the same name in the
    learner's package (mygpt2/, gpt2lib.course.mine) or notebook (`__main__`), so that chapter
    10 adapts and tunes the learner's own model with the learner's own layers."""

    class Kind(type):
        def __instancecheck__(self, obj: object) -> bool:
            return isinstance(obj, cls) or any(
                k.__name__ == cls.__name__
                and (k.__module__.startswith("mygpt2.") or k.__module__ == "__main__")
                for k in type(obj).__mro__
            )

    return Kind(cls.__name__, (), {})


# the layers an adapter can wrap: GPT-2's [in, out] linear layers and its tables (wte, wpe)
_TARGETABLE = (_or_the_learners(Conv1D), nn.Embedding)
SPLITS = ("train", "val", "test")
MAX_ADAPTER_CONFIG_BYTES = 1 << 20  # an adapter_config.json is about 1 KB
MAX_RANK = 1 << 16


class AdapterError(ValueError):
    """An adapter or a LoRA request that does not fit the model; the message names the misfit."""


class _Encoder(Protocol):
    """What the batch builders need of a tokenizer: gpt2lib's BPETokenizer or tiktoken's
    Encoding (get_encoding())."""

    def encode(self, text: str) -> list[int]: ...


_Model = TypeVar("_Model", bound=nn.Module)  # the functions that change a model in place return it
_Row = TypeVar("_Row")  # one training example, as loss_of_batch reads it


# --------------------------------------------------------------------------- the data sets


def speeches(path: str | os.PathLike | None = None) -> list[tuple[str, str]]:
    """(speaker, speech) for every speech of Tiny Shakespeare, in the play's order.

    A speech is a block of lines after a line `NAME:`; blocks are separated by a blank line."""
    text = Path(path or DATA_FILE).read_text(encoding="utf-8")
    found = []
    for block in text.split("\n\n"):
        lines = block.strip("\n").split("\n")
        if len(lines) >= 2 and lines[0].endswith(":"):
            found.append((lines[0][:-1].strip(), " ".join(line.strip() for line in lines[1:])))
    return found


def _split_of(key: str, train: int = 8, val: int = 1) -> str:
    """A fixed split from a hash of the example's position: `train` tenths train, `val` tenths
    validation, the rest test (80/10/10 by default).

    The same on every machine and Python version (no random generator involved)."""
    bucket = int(hashlib.sha256(key.encode("utf-8")).hexdigest(), 16) % 10
    return "train" if bucket < train else ("val" if bucket < train + val else "test")


@dataclass
class SpeakerData:
    """Speeches of the `top` most frequent speakers, labelled by speaker (0 = most frequent).

    splits[name] is a list of (speech, label) for name in train, val, test."""

    speakers: list[str]
    splits: dict[str, list[tuple[str, int]]] = field(default_factory=dict)

    def majority_baseline(self, split: str = "test") -> float:
        """The accuracy of always answering the training split's most frequent speaker."""
        if split not in self.splits:
            raise ValueError(f"no split {split!r}; the splits are {', '.join(self.splits)}")
        for name in ("train", split):
            if not self.splits.get(name):
                raise ValueError(
                    f"the {name} split holds no speech, so there is no majority baseline; "
                    "use a text with more speeches of these speakers"
                )
        counts = torch.bincount(
            torch.tensor([y for _, y in self.splits["train"]]), minlength=len(self.speakers)
        )
        majority = int(counts.argmax())
        labels = [y for _, y in self.splits[split]]
        return sum(y == majority for y in labels) / len(labels)


def speaker_dataset(top: int = 8, path: str | os.PathLike | None = None) -> SpeakerData:
    """The classification data set: which of the `top` most frequent speakers said a speech.

    Split 60/20/20 (train, validation, test), so that the test split holds about 250 speeches
    of the top 8 and one speech is 0.4 points of accuracy."""
    top = check_whole("top", top, 2, why=" (the number of speakers to tell apart)")
    found = speeches(path)
    counts: dict[str, int] = {}
    for speaker, _ in found:
        counts[speaker] = counts.get(speaker, 0) + 1
    names = sorted(counts, key=lambda s: (-counts[s], s))[:top]  # ties broken by name
    label = {name: i for i, name in enumerate(names)}
    data = SpeakerData(speakers=names, splits={s: [] for s in SPLITS})
    for position, (speaker, speech) in enumerate(found):
        if speaker in label:
            data.splits[_split_of(f"speech {position}", train=6, val=2)].append(
                (speech, label[speaker])
            )
    return data


@dataclass(frozen=True)
class ReplyPair:
    """One instruction example: `replier` answers `speech` (said by `speaker`) with `reply`."""

    speaker: str
    speech: str
    replier: str
    reply: str

    @property
    def prompt(self) -> str:
        return PROMPT_TEMPLATE.format(
            replier=self.replier, speaker=self.speaker, speech=self.speech
        )


# Alpaca's layout (instruction, input, response), without its long preamble: the stand-in's
# context is 128 tokens.
PROMPT_TEMPLATE = (
    "### Instruction:\nReply as {replier} to this speech by {speaker}.\n\n"
    "### Input:\n{speech}\n\n### Response:\n"
)


def reply_dataset(
    path: str | os.PathLike | None = None, max_speech_tokens: int = 60, max_reply_tokens: int = 40
) -> dict[str, list[ReplyPair]]:
    """The instruction data set: {split: [ReplyPair, ...]}, each speech with the one after it.

    Pairs whose speech or reply is longer than the limits (in GPT-2 tokens) are left out, so
    that prompt + reply fit the stand-in's 128 positions; so are a speaker's replies to
    themself (a speech continued after a stage break)."""
    from gpt2lib.tokenizer import get_encoding

    tokenizer = get_encoding()
    found = speeches(path)
    splits: dict[str, list[ReplyPair]] = {s: [] for s in SPLITS}
    for position in range(len(found) - 1):
        (speaker, speech), (replier, reply) = found[position], found[position + 1]
        if speaker == replier:
            continue
        if (
            len(tokenizer.encode(speech)) > max_speech_tokens
            or len(tokenizer.encode(reply)) > max_reply_tokens
        ):
            continue
        splits[_split_of(f"pair {position}")].append(ReplyPair(speaker, speech, replier, reply))
    return splits


# --------------------------------------------------------------------------- batches


def encode_speeches(
    examples: Iterable[tuple[str, int]], tokenizer: _Encoder, max_tokens: int = 64
) -> list[tuple[list[int], int]]:
    """(speech, label) -> (ids, label), each speech cut to its first `max_tokens` tokens."""
    return [(tokenizer.encode(text)[:max_tokens], label) for text, label in examples]


def encode_pairs(
    pairs: Iterable[ReplyPair], tokenizer: _Encoder
) -> list[tuple[list[int], list[int]]]:
    """ReplyPair -> (prompt_ids, reply_ids + [<|endoftext|>]): the reply ends the text."""
    end = tokenizer.eot_token if hasattr(tokenizer, "eot_token") else ENDOFTEXT_ID
    return [(tokenizer.encode(p.prompt), tokenizer.encode(p.reply) + [end]) for p in pairs]


def _progress(iterable, total, desc, show):
    if not show:
        return iterable
    try:
        from tqdm.auto import tqdm
    except ImportError:
        return iterable
    # At most one redraw a second: each redraw is a message to the notebook, and a minute-long
    # cell of runs at tqdm's default 10 a second overflowed the kernel's output queue under
    # load (nbval then timed out waiting for the cell's end, which had been dropped).
    return tqdm(iterable, total=total, desc=desc, unit="batch", leave=True, mininterval=1.0)


def _chunks(rows, batch_size):
    return [rows[i : i + batch_size] for i in range(0, len(rows), batch_size)]


# --------------------------------------------------------------------------- classification


def classifier(gpt: nn.Module, n_classes: int) -> GPT2Classifier:
    """GPT2Classifier(gpt, n_classes), with n_classes checked (a whole number, at least 2)."""
    n_classes = check_whole("n_classes", n_classes, 2, why=" (a classifier tells classes apart)")
    return GPT2Classifier(gpt, n_classes)


def _check_labels(model, encoded, n_classes=None):
    head = model.head.out_features
    if n_classes is not None and n_classes != head:
        raise ValueError(
            f"the data set has {n_classes} classes but the classifier's head has "
            f"{head} outputs; build the classifier with n_classes={n_classes}"
        )
    for _, label in encoded:
        try:
            check_whole("label", label, 0, head - 1)
        except (TypeError, ValueError):
            raise ValueError(
                f"label {label!r} does not fit the classifier's head of {head} "
                f"classes (labels 0 to {head - 1}); the class counts do not match"
            ) from None


@torch.no_grad()
def accuracy(
    model: nn.Module,
    encoded: Sequence[tuple[Sequence[int], int]],
    pad_id: int,
    batch_size: int = 32,
    n_classes: int | None = None,
    progress: bool = True,
) -> tuple[float, torch.Tensor]:
    """(accuracy, predictions (N,)) of a classifier on (ids, label) rows, in eval mode."""
    if len(encoded) == 0:
        raise ValueError("no rows to measure the accuracy on: the split is empty")
    batch_size = check_whole("batch_size", batch_size, 1)
    _check_labels(model, encoded, n_classes)
    was_training = model.training
    model.eval()
    predictions = []
    try:
        for rows in _progress(_chunks(encoded, batch_size), None, "evaluating", progress):
            idx, lengths, _ = speaker_batch(rows, pad_id)
            scores = model(idx, lengths)
            if not bool(torch.isfinite(scores).all()):
                raise FloatingPointError(
                    "the classifier's scores hold NaN or infinite values, so its answers would "
                    "mean nothing (argmax would pick class 0); its weights are not finite, as "
                    "after a fine-tuning run that diverged"
                )
            predictions.append(scores.argmax(-1))
    finally:
        model.train(was_training)
    predictions = torch.cat(predictions)
    labels = torch.tensor([label for _, label in encoded])
    return (predictions == labels).float().mean().item(), predictions


def confusion_matrix(
    labels: Sequence[int] | torch.Tensor, predictions: Sequence[int] | torch.Tensor, n_classes: int
) -> torch.Tensor:
    """(n_classes, n_classes) counts: row = true class, column = predicted class."""
    counts = torch.zeros(n_classes, n_classes, dtype=torch.long)
    for y, p in zip(torch.as_tensor(labels).tolist(), torch.as_tensor(predictions).tolist()):
        counts[y, p] += 1
    return counts


def fine_tune(
    model: nn.Module,
    loss_of_batch: Callable[[nn.Module, list[_Row]], torch.Tensor],
    rows: Sequence[_Row],
    steps: int,
    batch_size: int = 16,
    lr: float = 1e-3,
    head_lr: float | None = None,
    seed: int = 0,
    desc: str = "fine-tuning",
    progress: bool = True,
) -> list[float]:
    """AdamW on the parameters that require grad, `steps` batches drawn from `rows` in shuffled
    order (a new order each pass). loss_of_batch(model, rows) -> scalar loss. head_lr: the
    learning rate of the parameters under `head.` (a new classifier head starts from random
    and can take larger steps than the pretrained body). Returns the losses.

    Every argument is checked before anything trains. A loss that becomes NaN or infinite
    stops the run with a FloatingPointError naming the step and the learning rate (as chapter
    7's train does), and so do weights that are no longer finite after the last step: a model
    that diverged is never handed back as if it had trained."""
    if not isinstance(model, nn.Module):
        raise TypeError(f"model must be a torch model, got {type(model).__name__}")
    if not callable(loss_of_batch):
        raise TypeError(
            f"loss_of_batch must be a function (model, rows) -> loss, got "
            f"{type(loss_of_batch).__name__}"
        )
    steps = check_whole("steps", steps, 1)
    batch_size = check_whole("batch_size", batch_size, 1)
    lr = check_real("lr", lr, 0, low_inclusive=False, why=" (fine-tuning uses 1e-5 to 1e-2)")
    if head_lr is not None:
        head_lr = check_real("head_lr", head_lr, 0, low_inclusive=False)
    seed = check_whole("seed", seed, 0, 2**63 - 1)
    if not isinstance(desc, str):
        raise TypeError(f"desc must be a str, got {type(desc).__name__}")
    if not isinstance(progress, bool):
        raise TypeError(f"progress must be True or False, got {progress!r}")
    try:
        n_rows = len(rows)
    except TypeError:
        raise TypeError(f"rows must be a list of examples, got {type(rows).__name__}") from None
    named = [(n, p) for n, p in model.named_parameters() if p.requires_grad]
    if not named:
        raise ValueError("no parameter of the model requires grad: nothing would be trained")
    if n_rows == 0:
        raise ValueError("no training rows")
    head = [p for n, p in named if n.startswith("head.")] if head_lr is not None else []
    body = [p for n, p in named if not (head_lr is not None and n.startswith("head."))]
    groups = [
        g for g in ({"params": body, "lr": lr}, {"params": head, "lr": head_lr}) if g["params"]
    ]
    optimizer = _adamw(groups, lr)
    generator = torch.Generator().manual_seed(seed)
    order, losses = [], []
    model.train()
    try:
        for step in _progress(range(steps), steps, desc, progress):
            if len(order) < batch_size:
                order += torch.randperm(n_rows, generator=generator).tolist()
            batch, order = [rows[i] for i in order[:batch_size]], order[batch_size:]
            loss = loss_of_batch(model, batch)
            value = float(loss.detach()) if isinstance(loss, torch.Tensor) else float(loss)
            if not math.isfinite(value):
                raise FloatingPointError(_diverged(f"the loss became {value}", step, lr, head_lr))
            optimizer.zero_grad(set_to_none=True)
            loss.backward()
            optimizer.step()
            losses.append(value)
        broken = [n for n, p in named if not bool(torch.isfinite(p.detach()).all())]
        if broken:
            raise FloatingPointError(
                _diverged(
                    f"the weights became NaN or infinite ({', '.join(broken[:3])}"
                    f"{' ...' if len(broken) > 3 else ''})",
                    steps - 1,
                    lr,
                    head_lr,
                )
            )
    finally:
        model.eval()
    return losses


def _diverged(what, step, lr, head_lr):
    """Chapter 7's words for a run that diverged (gpt2lib.training.train), for fine_tune."""
    rates = f"learning rate {lr:.3g}" + ("" if head_lr is None else f", head_lr {head_lr:.3g}")
    return (
        f"{what} at step {step} ({rates}); training stopped. Lower the learning rate "
        f"(lr={lr:g}, try {lr / 3:.2g})"
        + ("" if head_lr is None else f" or head_lr (head_lr={head_lr:g})")
        + "; the model's weights are those of the diverged run: build or load it again"
    )


def _adamw(groups, lr):
    """AdamW without weight decay; fused (one pass over each tensor) where PyTorch has it for
    these parameters. On the CPU the default loop of AdamW took more than half of each step of
    full fine-tuning on the stand-in (its 6.4M-number token table), the fused one a tenth of
    that; the two agree to rounding."""
    params = [p for g in groups for p in g["params"]]
    if all(
        p.device.type in ("cpu", "cuda") and p.dtype in (torch.float32, torch.float64)
        for p in params
    ):
        try:
            return torch.optim.AdamW(groups, lr=lr, weight_decay=0.0, fused=True)
        except (RuntimeError, ValueError, TypeError):  # a PyTorch without it for this device
            pass
    return torch.optim.AdamW(groups, lr=lr, weight_decay=0.0)


def tune_seeds(
    make_model: Callable[[], nn.Module],
    loss_of_batch: Callable[[nn.Module, list[tuple[Sequence[int], int]]], torch.Tensor],
    encoded: Mapping[str, Sequence[tuple[Sequence[int], int]]],
    pad_id: int,
    seeds: Iterable[int],
    steps: int,
    lr: float,
    head_lr: float | None = None,
    batch_size: int = 16,
    baseline: float | None = None,
    split: str = "test",
    desc: str = "fine-tuning",
    progress: bool = True,
) -> tuple[list[float], list[nn.Module]]:
    """One classifier per seed: torch.manual_seed(seed), model = make_model(), fine_tune on
    encoded["train"] with that seed's batch order, accuracy on encoded[split]. Prints a line per
    seed, with the majority baseline beside the accuracy when given. Returns (accuracies, models)."""
    accuracies, models = [], []
    for seed in seeds:
        torch.manual_seed(seed)
        model = make_model()
        fine_tune(
            model,
            loss_of_batch,
            encoded["train"],
            steps,
            batch_size=batch_size,
            lr=lr,
            head_lr=head_lr,
            seed=seed,
            desc=f"{desc}, seed {seed}",
            progress=progress,
        )
        acc, _ = accuracy(model, encoded[split], pad_id, progress=False)
        accuracies.append(acc)
        models.append(model)
        versus = (
            ""
            if baseline is None
            else (f" (majority baseline {baseline:.1%}, {100 * (acc - baseline):+.1f} points)")
        )
        print(f"{desc}, seed {seed}: {split} accuracy {acc:.1%}{versus}")
    return accuracies, models


@torch.no_grad()
def mean_response_loss(
    gpt: nn.Module,
    encoded_pairs: Sequence[tuple[Sequence[int], Sequence[int]]],
    pad_id: int,
    batch_size: int = 16,
    progress: bool = True,
) -> float:
    """The mean loss per response token over (prompt_ids, response_ids) pairs, in eval mode."""
    if len(encoded_pairs) == 0:
        raise ValueError("no pairs to measure the response loss on: the split is empty")
    batch_size = check_whole("batch_size", batch_size, 1)
    was_training = gpt.training
    gpt.eval()
    total, count = 0.0, 0
    try:
        for rows in _progress(_chunks(encoded_pairs, batch_size), None, "response loss", progress):
            inputs, targets = collate(rows, pad_id)
            n = int((targets != IGNORE_INDEX).sum())
            total += response_loss(gpt, inputs, targets).item() * n
            count += n
    finally:
        gpt.train(was_training)
    if count == 0:
        raise ValueError("the pairs hold no response token to measure the loss on")
    return total / count


def model_name(checkpoint: str | os.PathLike) -> str:
    """The name the chapter prints for a checkpoint: a hub name as is; a folder with OpenAI's
    sizes (the hub cache's snapshot folder, say) by that model's name; any other folder by its
    last part."""
    checkpoint = str(checkpoint)
    if not os.path.isdir(checkpoint):
        return checkpoint
    name = released_name(read_config_dict(checkpoint))
    return name if name is not None else os.path.basename(checkpoint.rstrip("/\\"))


# --------------------------------------------------------------------------- figures


def plot_confusion(
    counts: torch.Tensor | Sequence[Sequence[int]], names: Sequence[str], title: str
) -> None:
    """Draw a confusion matrix of counts (row = true class, column = answer) with class names."""
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6.5, 5.5))
    image = ax.imshow(counts, cmap="Blues")
    ax.set_xticks(range(len(names)), names, rotation=60, ha="right")
    ax.set_yticks(range(len(names)), names)
    ax.set(xlabel="predicted speaker", ylabel="true speaker", title=title)
    fig.colorbar(image, ax=ax, label="speeches")
    plt.show()


def plot_curves(
    curves: Mapping[str, Sequence[float]], xlabel: str, ylabel: str, title: str
) -> None:
    """Draw {label: values} as lines with markers on one axis."""
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(8, 3.2))
    for (label, values), marker in zip(curves.items(), "os^vD"):
        ax.plot(values, marker=marker, label=label)
    ax.set(xlabel=xlabel, ylabel=ylabel, title=title)
    ax.legend()
    plt.show()


# --------------------------------------------------------------------------- LoRA


def trainable_parameters(model: nn.Module) -> tuple[int, int]:
    """(parameters that require grad, all parameters)."""
    params = list(model.parameters())
    return sum(p.numel() for p in params if p.requires_grad), sum(p.numel() for p in params)


class LoRAEmbedding(nn.Module):
    """A frozen token table and a trainable low-rank update, as peft's LoRA on an nn.Embedding:
    base(idx) + B·A[:, idx] · alpha / rank, with lora_embedding_A (rank, rows) starting at zero
    (so the output starts unchanged) and lora_embedding_B (width, rank) from a normal
    distribution. As in peft, there is no dropout on a table.

    `.weight` is the base table: GPT-2's readout is tied to it and keeps reading the frozen
    table, as lm_head does when peft adapts transformers' wte."""

    def __init__(self, base: nn.Embedding, rank: int, alpha: float, dropout: float = 0.0) -> None:
        super().__init__()
        n_rows, width = base.weight.shape
        self.base, self.rank, self.alpha, self.scale = base, rank, alpha, alpha / rank
        self.dropout = dropout  # recorded for the adapter's config; a table applies none (peft)
        self.lora_embedding_A = nn.Parameter(
            torch.zeros(rank, n_rows, device=base.weight.device, dtype=base.weight.dtype)
        )
        self.lora_embedding_B = nn.Parameter(
            torch.randn(width, rank, device=base.weight.device, dtype=base.weight.dtype)
        )

    @property
    def weight(self) -> torch.Tensor:
        return self.base.weight

    def forward(self, idx: torch.Tensor) -> torch.Tensor:  # (B, T) -> (B, T, width)
        rows = nn.functional.embedding(idx, self.lora_embedding_A.T)  # (B, T, rank)
        return self.base(idx) + (rows @ self.lora_embedding_B.T) * self.scale


_ADAPTERS = (_or_the_learners(LoRALinear), LoRAEmbedding)


def lora_layers(model: nn.Module) -> dict[str, LoRALinear | LoRAEmbedding]:
    """{module name: adapter} of the adapters in `model` (LoRALinear, LoRAEmbedding)."""
    return {name: m for name, m in model.named_modules() if isinstance(m, _ADAPTERS)}


def _lora_parts(layer):
    """{part: parameter} of one adapter, by peft's key suffix."""
    if isinstance(layer, LoRAEmbedding):
        return {
            "lora_embedding_A": layer.lora_embedding_A,
            "lora_embedding_B": layer.lora_embedding_B,
        }
    return {"lora_A.weight": layer.lora_A.weight, "lora_B.weight": layer.lora_B.weight}


def _matches(name: str, target: str) -> bool:
    return name == target or name.endswith("." + target)


def _targets_of(model, targets) -> dict[str, nn.Module]:
    """The layers named by `targets`, checked: each target must name at least one layer."""
    if isinstance(targets, str):
        targets = (targets,)
    targets = tuple(targets)
    if not targets or not all(isinstance(t, str) and t for t in targets):
        raise ValueError(f"targets must be module names such as 'c_attn', got {targets!r}")
    layers = {name: m for name, m in model.named_modules() if isinstance(m, _TARGETABLE)}
    chosen = {}
    for target in targets:
        found = {n: m for n, m in layers.items() if _matches(n, target)}
        if not found:
            kinds = sorted({n.rsplit(".", 1)[-1] for n in layers})
            hint = (
                " (gpt2lib's names have no 'transformer.' prefix)"
                if target.startswith("transformer.")
                else ""
            )
            raise AdapterError(
                f"no layer of the model is called {target!r}{hint}; the "
                f"layers an adapter can wrap end in {', '.join(kinds)}, "
                "or give a full name such as 'h.0.attn.c_attn'"
            )
        chosen.update(found)
    return chosen


def _check_plain(model, what):
    if not isinstance(model, nn.Module):
        raise TypeError(f"{what} needs a torch model (a GPT2), got {type(model).__name__}")
    if lora_layers(model):
        raise AdapterError(
            f"the model already has LoRA adapters ({', '.join(lora_layers(model))}"
            f"); merge_lora(model) first, or start from a model without them"
        )


def apply_lora(
    model: _Model,
    rank: int = 8,
    alpha: float = 16,
    targets: str | Iterable[str] = ("c_attn",),
    dropout: float = 0.0,
    rank_pattern: dict[str, int] | None = None,
    alpha_pattern: dict[str, float] | None = None,
    add_adapters: Callable[..., object] | None = None,
) -> _Model:
    """Add LoRA adapters in place to every layer whose name ends with a target; freeze the rest.

    targets: 'c_attn', 'c_proj', 'c_fc' (every layer of that name), the tables 'wte' and 'wpe'
    (a LoRAEmbedding, peft's layout; the readout tied to wte keeps the base table), or full
    names of gpt2lib's modules ('h.1.mlp.c_fc'). Each adapter's output starts at zero, so the
    model computes what it did. Only the adapters train. dropout acts on the linear layers'
    adapters only (peft applies none on a table). rank_pattern and alpha_pattern (peft's names):
    {target: value} for the layers that take another rank or alpha than `rank` and `alpha`, a
    target named as in `targets` (rank=4, rank_pattern={"wte": 2}: rank 2 on the table, 4 on
    the rest). add_adapters: chapter 10's function that wraps the linear layers
    (`add_adapters(model, names, rank, alpha, dropout)`; the reference's by default), so that a
    learner's own LoRALinear does the work. Returns the model."""
    _check_plain(model, "apply_lora")
    if add_adapters is not None and not callable(add_adapters):
        raise TypeError(f"add_adapters must be a function, got {type(add_adapters).__name__}")
    rank = _rank(rank)
    alpha = _alpha(alpha)
    dropout = _dropout(dropout)
    chosen = _targets_of(model, targets)
    ranks = _per_layer(chosen, rank, rank_pattern, "rank_pattern", _rank)
    alphas = _per_layer(chosen, alpha, alpha_pattern, "alpha_pattern", _alpha)
    for name, layer in chosen.items():
        n_in, n_out = _in_out(layer)
        if ranks[name] > min(n_in, n_out):
            shape = (
                f"{n_in} rows of width {n_out}"
                if isinstance(layer, nn.Embedding)
                else f"{n_in} -> {n_out}"
            )
            raise AdapterError(
                f"rank {ranks[name]} is above the width of {name} ({shape}): a "
                f"rank above {min(n_in, n_out)} adds parameters and no expressiveness"
            )
        _check_scale(name, layer, ranks[name], alphas[name])

    def move(model):
        for layer in lora_layers(model).values():
            layer.to(device=layer.base.weight.device, dtype=layer.base.weight.dtype)

    return _install(model, list(chosen), ranks, alphas, dropout, move, add_adapters)


def _rank(rank, what="rank"):
    return check_whole(what, rank, 1, MAX_RANK)


def _alpha(alpha, what="alpha"):
    return check_real(
        what,
        alpha,
        0,
        low_inclusive=False,
        why=" (LoRA's scale is alpha / rank; alpha = 2 x rank is usual)",
    )


def _dropout(dropout, what="dropout"):
    return check_real(
        what, dropout, 0, 1, high_inclusive=False, why=" (a probability; 0 turns dropout off)"
    )


def _check_scale(name, layer, rank, alpha, where="", what="alpha"):
    """Refuse a scale alpha / rank that the layer's dtype cannot hold (it would make every
    output infinite or NaN)."""
    dtype = layer.weight.dtype
    if dtype.is_floating_point and alpha / rank > torch.finfo(dtype).max:
        raise AdapterError(
            f"{where}{what} {alpha:g} / rank {rank} = {alpha / rank:.3g} on {name} is beyond the "
            f"largest {str(dtype).removeprefix('torch.')} ({torch.finfo(dtype).max:.3g}): the "
            "layer would compute infinity or NaN. alpha is usually 1 to 4 times the rank"
        )


def _install(model, names, ranks, alphas, dropout, then, adder=None):
    """Freeze the model, add the adapters and run then(model); on any failure put the model
    back as it was (its layers and which parameters train), so a refusal changes nothing."""
    trains = {n: p.requires_grad for n, p in model.named_parameters()}
    try:
        for p in model.parameters():
            p.requires_grad_(False)
        _add(model, names, ranks, alphas, dropout, adder or add_adapters)
        then(model)
    except BaseException:
        for name, layer in lora_layers(model).items():
            model.set_submodule(name, layer.base)
        for n, p in model.named_parameters():
            p.requires_grad_(trains.get(n, p.requires_grad))
        raise
    return model


def _per_layer(chosen, default, pattern, what, check):
    """{layer name: value}: pattern's value where one of its targets names the layer, else default."""
    if pattern is None:
        return dict.fromkeys(chosen, default)
    if not isinstance(pattern, dict) or not all(isinstance(t, str) and t for t in pattern):
        raise ValueError(
            f"{what} must be a dict {{target: value}} such as {{'wte': 2}}, got {pattern!r}"
        )
    values = {t: check(v) for t, v in pattern.items()}
    for target in values:
        if not any(_matches(name, target) for name in chosen):
            raise AdapterError(
                f"{what} names {target!r}, which is none of the adapted layers "
                f"(the targets pick them: {', '.join(list(chosen)[:4])}"
                f"{' ...' if len(chosen) > 4 else ''})"
            )
    return {
        name: next((v for t, v in values.items() if _matches(name, t)), default) for name in chosen
    }


def _add(model, names, ranks, alphas, dropout, adder):
    """adder (chapter 10's add_adapters) for the linear layers, a LoRAEmbedding for each table;
    ranks and alphas: {name: value}."""
    tables = [n for n in names if isinstance(model.get_submodule(n), nn.Embedding)]
    for name in names:  # one call per layer, in order: each may take its own rank and alpha
        if name not in tables:
            adder(model, [name], ranks[name], alphas[name], dropout)
            if not isinstance(model.get_submodule(name), _ADAPTERS):
                raise AdapterError(
                    f"add_adapters left {name} without a LoRALinear around it "
                    f"({type(model.get_submodule(name)).__name__})"
                )
    for name in tables:
        model.set_submodule(
            name, LoRAEmbedding(model.get_submodule(name), ranks[name], alphas[name], dropout)
        )


def _in_out(layer):
    return tuple(layer.weight.shape)  # Conv1D: [in, out]; nn.Embedding: [rows, width]


@torch.no_grad()
def merge_lora(model: _Model) -> _Model:
    """Fold every adapter into its base weight and put the plain layer back. Returns the model.

    Afterwards the model has the plain model's modules and parameter names (save_pretrained
    saves it as a full fine-tune); the merged layers keep requires_grad=False. An adapter on
    the token table is refused (AdapterError), before anything is merged: GPT-2's readout is
    tied to wte, so folding the update into the table would change the readout too, and the
    merged model would no longer compute what the adapter did."""
    tables = [n for n, m in lora_layers(model).items() if isinstance(m, LoRAEmbedding)]
    if tables:
        raise AdapterError(
            f"merge_lora cannot merge the adapter on {', '.join(tables)}: the readout is tied to "
            "the token table and reads the base table, so merging the update into it would "
            "change the readout too and the logits with it (peft's merge does that). Keep the "
            "adapter unmerged, or save the model with save_adapter"
        )
    for name, layer in lora_layers(model).items():
        layer.base.weight.copy_(merged_weight(layer))
        model.set_submodule(name, layer.base)
    return model


# --------------------------------------------------------------------------- adapter files


def save_adapter(
    model: nn.Module, folder: str | os.PathLike, base_model_name_or_path: str | None = None
) -> Path:
    """Write the model's adapters in peft's layout: folder/adapter_config.json and
    folder/adapter_model.safetensors (keys `base_model.model.transformer.<name>.lora_A.weight`).
    Creates the folder; an adapter already there is replaced. The two files are one unit
    (gpt2lib.files.save_files): after a crash at any point the folder holds the old adapter or
    the new one. Adapters that are NaN or infinite are refused before anything is written."""
    if base_model_name_or_path is not None and not isinstance(base_model_name_or_path, str):
        raise TypeError(
            "base_model_name_or_path must be a str (a hub name or a folder) or None, got "
            f"{type(base_model_name_or_path).__name__}"
        )
    from safetensors.torch import save

    layers = lora_layers(model)
    if not layers:
        raise AdapterError("the model has no LoRA adapters to save: apply_lora(model) first")
    dropouts = {
        m.dropout if isinstance(m, LoRAEmbedding) else m.lora_dropout.p for m in layers.values()
    }
    if len(dropouts) != 1:
        raise AdapterError(
            f"the adapters differ in dropout ({sorted(dropouts)}); peft's layout "
            "holds one dropout for all of them"
        )
    dropout = dropouts.pop()
    rank, rank_pattern = _pattern(model, {n: m.rank for n, m in layers.items()})
    alpha, alpha_pattern = _pattern(model, {n: m.alpha for n, m in layers.items()})
    tensors = {}
    for name, layer in layers.items():
        for part, weight in _lora_parts(layer).items():
            weight = weight.detach().to("cpu", torch.float32)
            tensors[f"{_PEFT_PREFIX}{name}.{part}"] = weight.contiguous().clone()
    config = {
        "peft_type": "LORA",
        "task_type": "CAUSAL_LM",
        "base_model_name_or_path": base_model_name_or_path,
        "r": rank,
        "lora_alpha": alpha,
        "rank_pattern": rank_pattern,  # {pattern: rank} where a layer's differs from r (peft's)
        "alpha_pattern": alpha_pattern,
        "lora_dropout": dropout,
        "target_modules": _short_targets(model, layers),
        "fan_in_fan_out": True,  # Conv1D stores [in, out], as transformers' GPT-2 does
        "bias": "none",
        "inference_mode": True,
        "modules_to_save": None,
        "init_lora_weights": True,
    }
    folder = check_path(folder)
    if folder.exists() and not folder.is_dir():
        raise FileExistsError(f"{str(folder)!r} is a file; give a folder for the adapter")
    # the base model's sizes ride in the file's metadata (peft ignores it), so that a misfit
    # can be named in the model's terms
    metadata = {"format": "pt", "gpt2lib_base": json.dumps(_base_sizes(model))}
    try:
        config_text = json.dumps(config, indent=2, allow_nan=False) + "\n"
    except ValueError as exc:
        raise AdapterError(f"the adapter's settings cannot be written ({exc})") from None
    for name, tensor in tensors.items():
        try:
            check_values(name, tensor, "the adapter")
        except CheckpointError as exc:
            raise AdapterError(f"{exc}; nothing was written") from None
    # one unit: the weights and the config change together, or neither does (a kill between
    # the two renames is finished by the next load or save of the folder)
    save_files(
        folder,
        {
            ADAPTER_WEIGHTS: save(tensors, metadata=metadata),
            ADAPTER_CONFIG: config_text,
        },
    )
    return folder


def _pattern(model, values):
    """peft's default and pattern for one setting of the adapters: the most common value, and
    {pattern: value} for the layers that differ (a layer kind, 'wte' or 'c_fc', where every
    adapted layer of that kind shares the value; the escaped full name otherwise)."""
    default = Counter(values.values()).most_common(1)[0][0]  # ties: the first layer's
    pattern = {}
    for kind in sorted({n.rsplit(".", 1)[-1] for n in values}):
        of_kind = {n: v for n, v in values.items() if n.rsplit(".", 1)[-1] == kind}
        if len(set(of_kind.values())) == 1:
            if next(iter(of_kind.values())) != default:
                pattern[kind] = next(iter(of_kind.values()))
        else:
            pattern.update({re.escape(n): v for n, v in of_kind.items() if v != default})
    return default, pattern


def _from_pattern(name, default, pattern):
    """A layer's value under peft's rule: the first key k of `pattern` for which the regular
    expression (.*\\.)?(k)$ matches the layer's name in transformers' GPT-2, else `default`."""
    for key, value in (pattern or {}).items():
        if re.match(rf"(.*\.)?({key})$", "transformer." + name):
            return value
    return default


def _short_targets(model, adapted):
    """peft's target_modules: a layer kind ('c_attn') where every layer of that kind is adapted
    (so that a model with more layers is seen not to fit), full names otherwise."""
    layers = [
        n
        for n, m in model.named_modules()
        if isinstance(m, (*_TARGETABLE, *_ADAPTERS)) and not n.endswith(".base")
    ]
    targets = []
    for kind in sorted({n.rsplit(".", 1)[-1] for n in adapted}):
        every = [n for n in layers if n.rsplit(".", 1)[-1] == kind]
        if all(n in adapted for n in every):
            targets.append(kind)
        else:
            targets += sorted(n for n in adapted if n.rsplit(".", 1)[-1] == kind)
    return targets


def _base_sizes(model):
    config = getattr(model, "config", None)
    keys = ("n_layer", "n_embd", "n_head", "vocab_size")
    return {k: getattr(config, k) for k in keys if hasattr(config, k)} or None


def _read_adapter(folder):
    """(config dict, {key: tensor}, the base model's sizes) of an adapter folder; every file
    checked (the config's size and JSON, the weights by the safetensors library: no unpickling,
    truncated or damaged files refused), AdapterError naming the file otherwise. A save into
    the folder that was killed is finished or undone first, and both files are read under the
    folder's lock, so they are always the pair one save wrote."""
    folder = check_path(folder)
    if stale_saves(folder):
        with folder_lock(folder, exclusive=True):
            recover_saves(folder)
    with folder_lock(folder, exclusive=False):
        missing = [f for f in (ADAPTER_CONFIG, ADAPTER_WEIGHTS) if not (folder / f).is_file()]
        if missing:
            raise AdapterError(
                f"{str(folder)!r} does not hold {' and '.join(missing)}: an adapter "
                f"folder (peft's layout) holds {ADAPTER_CONFIG} and {ADAPTER_WEIGHTS}"
            )
        config = _read_adapter_config(folder / ADAPTER_CONFIG)
        try:
            tensors, metadata = read_safetensors(folder / ADAPTER_WEIGHTS)
        except CheckpointError as exc:
            raise AdapterError(str(exc)) from None
    try:
        base = json.loads(metadata.get("gpt2lib_base", "null")) or {}
    except (ValueError, RecursionError):
        base = {}
    if not isinstance(base, dict):
        base = {}
    return config, tensors, base


def _read_adapter_config(path: Path) -> dict:
    where = repr(str(path))
    data = read_small_file(
        path, MAX_ADAPTER_CONFIG_BYTES, AdapterError, where, "an adapter's config is about 1 KiB"
    )
    config = json_object(data, where, AdapterError, "readable JSON")
    if config.get("peft_type", "LORA") != "LORA":
        raise AdapterError(
            f"{where} is not a LoRA adapter's config (peft_type {config['peft_type']!r})"
        )
    return config


@dataclass
class _AdapterSettings:
    """What an adapter_config.json asks for, every value checked (peft's names and defaults)."""

    r: int
    lora_alpha: float
    lora_dropout: float
    target_modules: str | list[str]
    rank_pattern: dict
    alpha_pattern: dict
    layers_to_transform: int | list[int] | None
    layers_pattern: list[str]
    exclude_modules: str | list[str] | None


def _adapter_settings(config: dict, where: str) -> _AdapterSettings:
    """The settings of an adapter_config.json, each value checked before the model is touched;
    AdapterError naming the file and the value otherwise."""

    def bad(message):
        return AdapterError(f"{where}: {message}")

    problems = []
    for key, harmless in (
        ("bias", "none"),
        ("modules_to_save", None),
        ("use_dora", False),
        ("use_rslora", False),
        ("lora_bias", False),
    ):
        value = config.get(key, harmless)
        if value not in (harmless, None, [], False) or (key == "bias" and value != "none"):
            problems.append(f"{key}={value!r}")
    if problems:
        raise AdapterError(
            f"{where} asks for {', '.join(problems)}, which gpt2lib's LoRA does not implement; "
            "the model would compute something else, so it is refused"
        )
    try:
        r = _rank(config.get("r", 8), "r")
        alpha = _alpha(config.get("lora_alpha", 8), "lora_alpha")
        dropout = _dropout(config.get("lora_dropout", 0.0), "lora_dropout")
        patterns = {}
        for key, check in (("rank_pattern", _rank), ("alpha_pattern", _alpha)):
            pattern = config.get(key) or {}
            if not isinstance(pattern, dict):
                raise bad(f"{key} must be an object {{pattern: value}}, got {pattern!r}")
            patterns[key] = {
                _regex(k, key, where): check(v, f"{key}[{k!r}]") for k, v in pattern.items()
            }
    except (TypeError, ValueError) as exc:
        if isinstance(exc, AdapterError):
            raise
        raise bad(exc) from None
    targets = config.get("target_modules")
    if targets is None:
        targets = ["c_attn"]  # peft's default for GPT-2
    if isinstance(targets, str):
        if targets != "all-linear":
            _regex(targets, "target_modules", where, whole=True)
    elif not (
        isinstance(targets, list) and targets and all(isinstance(t, str) and t for t in targets)
    ):
        raise bad(
            f"target_modules must be a list of layer names or one regular expression, got "
            f"{targets!r}"
        )
    layers = config.get("layers_to_transform")
    if layers is not None:
        try:
            if isinstance(layers, list):
                layers = [check_whole("layers_to_transform[]", v, 0) for v in layers]
            else:
                layers = check_whole("layers_to_transform", layers, 0)
        except (TypeError, ValueError) as exc:
            raise bad(exc) from None
    layer_pattern = config.get("layers_pattern") or []
    if isinstance(layer_pattern, str):
        layer_pattern = [layer_pattern]
    if not (isinstance(layer_pattern, list) and all(isinstance(p, str) for p in layer_pattern)):
        raise bad(f"layers_pattern must be a name or a list of names, got {layer_pattern!r}")
    for pattern in layer_pattern:
        _regex(pattern, "layers_pattern", where, whole=True)
    excluded = config.get("exclude_modules")
    if isinstance(excluded, str):
        _regex(excluded, "exclude_modules", where, whole=True)
    elif excluded is not None and not (
        isinstance(excluded, list) and all(isinstance(t, str) and t for t in excluded)
    ):
        raise bad(
            f"exclude_modules must be a list of layer names or one regular expression, got "
            f"{excluded!r}"
        )
    return _AdapterSettings(
        r=r,
        lora_alpha=alpha,
        lora_dropout=dropout,
        target_modules=targets,
        rank_pattern=patterns["rank_pattern"],
        alpha_pattern=patterns["alpha_pattern"],
        layers_to_transform=layers,
        layers_pattern=layer_pattern,
        exclude_modules=excluded or None,
    )


def _regex(text, what, where, whole=False) -> str:
    """`text` if it compiles as the regular expression peft makes of it; AdapterError if not."""
    if not isinstance(text, str) or not text:
        raise AdapterError(f"{where}: the keys of {what} must be layer names, got {text!r}")
    try:
        re.compile(text if whole else rf"(.*\.)?({text})$")
    except (re.error, RecursionError, OverflowError) as exc:
        raise AdapterError(
            f"{where}: {what} {text!r} is not a valid regular expression ({exc})"
        ) from None
    return text


def _peft_targets(layers: dict, settings: _AdapterSettings) -> set[str]:
    """The names of `layers` (gpt2lib's names) that peft adapts under these settings: peft's
    check_target_module_exists on transformers' names ('transformer.' + ours)."""
    chosen = set()
    targets, excluded = settings.target_modules, settings.exclude_modules
    for name, layer in layers.items():
        key = "transformer." + name
        if isinstance(excluded, str):
            if re.fullmatch(excluded, key):
                continue
        elif excluded and (key in excluded or any(key.endswith("." + m) for m in excluded)):
            continue
        if targets == "all-linear":
            found = isinstance(layer, _TARGETABLE[0])  # every linear layer but the tied readout
        elif isinstance(targets, str):
            found = re.fullmatch(targets, key) is not None
        elif key in targets:
            found = True  # named in full
        else:
            found = any(key.endswith("." + t) for t in targets)
            wanted = settings.layers_to_transform
            if found and wanted is not None and wanted != []:
                match = None
                if not settings.layers_pattern:  # the first numbered part of the name
                    match = re.match(r".*?\.[^.]*\.(?P<idx>\d+)\.", key)
                for pattern in settings.layers_pattern:
                    match = re.match(rf"(?:^|.*?\.){pattern}\.(?P<idx>\d+)\.", key)
                    if match is not None:
                        break
                if match is None:
                    found = False
                else:
                    number = int(match.group("idx"))
                    found = number == wanted if isinstance(wanted, int) else number in wanted
        if found:
            chosen.add(name)
    return chosen


def _module_name(key):
    """A peft key -> (gpt2lib module name, part), or None if it is no LoRA weight. The part is
    'lora_A' or 'lora_B' (a linear layer) or 'lora_embedding_A' or 'lora_embedding_B' (a table)."""
    for part, suffixes in (
        ("lora_A", (".lora_A.weight", ".lora_A.default.weight")),
        ("lora_B", (".lora_B.weight", ".lora_B.default.weight")),
        ("lora_embedding_A", (".lora_embedding_A", ".lora_embedding_A.default")),
        ("lora_embedding_B", (".lora_embedding_B", ".lora_embedding_B.default")),
    ):
        for suffix in suffixes:
            if key.endswith(suffix):
                name = key[: -len(suffix)]
                for prefix in (_PEFT_PREFIX, "base_model.model.", "transformer."):
                    name = name.removeprefix(prefix)
                return name, part
    return None


def load_adapter(model: _Model, folder: str | os.PathLike) -> _Model:
    """Add the adapter saved in `folder` (peft's layout) to a model without adapters, in place.

    Rank, alpha, dropout and the adapted layers come from adapter_config.json, read as peft
    reads it (target_modules, layers_to_transform, layers_pattern, exclude_modules, rank_pattern,
    alpha_pattern). Every check runs before the model is touched: each value of the config,
    the weights file (no unpickling; a truncated or damaged file, and NaN or infinite weights,
    are refused), and the fit: an adapter whose layers or shapes do not fit the model (another
    width, another number of layers) is refused with an AdapterError naming the misfit, and
    nothing is loaded. Returns the model (adapters trainable, everything else frozen)."""
    _check_plain(model, "load_adapter")
    config, tensors, base = _read_adapter(folder)
    folder = check_path(folder)
    where = repr(str(folder / ADAPTER_CONFIG))
    settings = _adapter_settings(config, where)
    weights: dict[str, dict[str, torch.Tensor]] = {}
    for key, tensor in tensors.items():
        named = _module_name(key)
        if named is None:
            raise AdapterError(
                f"{str(folder)!r}: tensor {key!r} is not a LoRA weight (lora_A, "
                "lora_B, lora_embedding_A or lora_embedding_B); gpt2lib loads "
                "LoRA adapters only"
            )
        try:
            check_values(key, tensor, str(folder / ADAPTER_WEIGHTS))
        except CheckpointError as exc:
            raise AdapterError(str(exc)) from None
        weights.setdefault(named[0], {})[named[1]] = tensor
    layers = {name: m for name, m in model.named_modules() if isinstance(m, _TARGETABLE)}
    sizes = _base_sizes(model) or {}
    differ = [
        f"{k} {base[k]} (the model has {sizes[k]})"
        for k in base
        if k in sizes and base[k] != sizes[k]
    ]
    saved_for = f"; it was saved for {', '.join(differ)}" if differ else ""
    unknown = sorted(set(weights) - set(layers))
    if unknown:
        raise AdapterError(
            f"the adapter in {str(folder)!r} was made for another base model: it "
            f"adapts {', '.join(unknown[:4])}{' ...' if len(unknown) > 4 else ''}, "
            "which this model does not have" + saved_for
        )
    targets = settings.target_modules
    expected = _peft_targets(layers, settings)
    without = sorted(expected - set(weights))
    if without:
        raise AdapterError(
            f"the adapter in {str(folder)!r} was made for another base model: its "
            f"targets {targets} cover {', '.join(without[:4])}"
            f"{' ...' if len(without) > 4 else ''} of this model, but it holds no "
            "weights for them" + saved_for
        )
    extra = sorted(set(weights) - expected)
    if extra:
        raise AdapterError(
            f"the adapter in {str(folder)!r} holds weights for {', '.join(extra[:4])}"
            f"{' ...' if len(extra) > 4 else ''}, which its config does not adapt "
            f"(target_modules {targets!r}, layers_to_transform "
            f"{settings.layers_to_transform!r}, exclude_modules {settings.exclude_modules!r}); "
            f"its {ADAPTER_CONFIG} and {ADAPTER_WEIGHTS} do not belong together"
        )
    names = sorted(weights)
    ranks = {n: _from_pattern(n, settings.r, settings.rank_pattern) for n in names}
    alphas = {n: _from_pattern(n, settings.lora_alpha, settings.alpha_pattern) for n in names}
    for name, parts in sorted(weights.items()):
        layer = layers[name]
        table = isinstance(layer, nn.Embedding)
        need = {"lora_embedding_A", "lora_embedding_B"} if table else {"lora_A", "lora_B"}
        if set(parts) != need:
            raise AdapterError(
                f"{str(folder)!r}: {name} has {', '.join(sorted(parts))}; its layer "
                f"({type(layer).__name__}) needs {' and '.join(sorted(need))}"
            )
        n_in, n_out = _in_out(layer)
        rank = ranks[name]
        want = {
            "lora_A": (rank, n_in),
            "lora_B": (n_out, rank),
            "lora_embedding_A": (rank, n_in),
            "lora_embedding_B": (n_out, rank),
        }
        for part, tensor in parts.items():
            if tuple(tensor.shape) != want[part]:
                raise AdapterError(
                    f"the adapter in {str(folder)!r} does not fit this model: {name}.{part} has "
                    f"shape {tuple(tensor.shape)}, but rank {rank} on this model's {name} "
                    f"({n_in} -> {n_out}) needs {want[part]}" + saved_for
                )
        _check_scale(name, layer, rank, alphas[name], f"{where}: ", "lora_alpha")
        _check_update(folder, name, layer, [parts[p] for p in sorted(need)], rank, alphas[name])

    def copy_weights(model):
        with torch.no_grad():
            for name, layer in lora_layers(model).items():
                device, dtype = layer.base.weight.device, layer.base.weight.dtype
                for part, parameter in _lora_parts(layer).items():
                    parameter.copy_(weights[name][part.removesuffix(".weight")].to(device, dtype))
                layer.to(device=device, dtype=dtype)

    return _install(model, names, ranks, alphas, settings.lora_dropout, copy_weights)


def _check_update(folder, name, layer, parts, rank, alpha):
    """Refuse an adapter whose update could pass the largest number of the layer's dtype:
    each output of B·A·alpha/rank is at most rank · max|A| · max|B| · alpha/rank."""
    a, b = parts
    if a.numel() == 0 or b.numel() == 0:
        return
    largest = float(a.abs().max()) * float(b.abs().max()) * alpha
    dtype = layer.weight.dtype
    limit = torch.finfo(dtype).max if dtype.is_floating_point else math.inf
    if not largest <= limit:
        raise AdapterError(
            f"the adapter in {str(folder)!r} can add up to {largest:.3g} to {name}'s outputs, "
            f"beyond the largest {str(dtype).removeprefix('torch.')} ({limit:.3g}): its "
            f"lora_alpha {alpha:g} is far too large for rank {rank}, or its weights are damaged"
        )


def peft_logits(
    base_folder: str | os.PathLike, adapter_folder: str | os.PathLike, ids: torch.Tensor
) -> torch.Tensor | None:
    """The logits of transformers' GPT2LMHeadModel from `base_folder` with the adapter in
    `adapter_folder` loaded by peft, for ids (B, T); None when peft or transformers is missing."""
    try:
        from peft import PeftModel
        from transformers import GPT2LMHeadModel
    except ImportError:
        return None
    hf = GPT2LMHeadModel.from_pretrained(str(base_folder), dtype=torch.float32)
    with torch.no_grad():
        return PeftModel.from_pretrained(hf, str(adapter_folder)).eval()(ids).logits
