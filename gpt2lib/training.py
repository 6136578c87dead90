"""Training: chapter 7's functions as the package's entry points, each behind its checks.

    from gpt2lib.training import train, get_batch, lm_loss, lr_schedule, sample, ngram_baselines

Hand-written. The lesson's own functions live in `gpt2lib.chapters.training` (generated from
chapter 7); this module wraps the public ones with `guarded(check)` and `guarded_train`, so
that every setting is checked up front: a bad value is a clear error before the first step,
never a run that trains nothing, climbs the loss, or fails after a hundred steps. Each wrapped
function keeps the lesson's own as `.unchecked`. `sample` is chapter 9's decoding loop without
a cache, which chapter 7 uses to show text before chapter 9 teaches sampling.
"""

from __future__ import annotations

import functools
import inspect
import math
import time
from collections.abc import Callable

import torch
import torch.nn as nn

from gpt2lib.chapters import training as lesson
from gpt2lib.chapters.training import History
from gpt2lib.validation import check_real, check_whole, token_range
from gpt2lib.views import model_view

__all__ = [
    "History",
    "check_batch_arguments",
    "check_loss_arguments",
    "check_ngram_arguments",
    "check_sample_arguments",
    "check_schedule_arguments",
    "check_train_arguments",
    "get_batch",
    "guarded",
    "guarded_train",
    "lm_loss",
    "lr_schedule",
    "ngram_baselines",
    "sample",
    "train",
]


def _whole(name, value, minimum, allow_none=False):
    if not (value is None and allow_none):
        check_whole(name, value, minimum)


def _real(name, value, *, low, low_inclusive, high=None, allow_none=False, allow_inf=False, why=""):
    """A real number in a range: NaN, infinity (unless allowed) and bools refused."""
    if not (value is None and allow_none):
        check_real(
            name, value, low, high, low_inclusive=low_inclusive, allow_inf=allow_inf, why=why
        )


def _token_ids(name, ids, vocab_size, minimum_length, length_why):
    if not isinstance(ids, torch.Tensor) or ids.dim() != 1:
        got = f"shape {tuple(ids.shape)}" if isinstance(ids, torch.Tensor) else type(ids).__name__
        raise ValueError(
            f"{name} must be a 1-D tensor of token ids, got {got}; for a list use torch.tensor(ids)"
        )
    if ids.dtype.is_floating_point or ids.dtype.is_complex or ids.dtype == torch.bool:
        raise TypeError(f"{name} must hold integer token ids (torch.long), got {ids.dtype}")
    if len(ids) < minimum_length:
        raise ValueError(
            f"{name} holds {len(ids)} tokens, fewer than {length_why}: use more "
            "text" + (" or a smaller block_size" if "block_size" in length_why else "")
        )
    low, high = token_range(ids)  # gpt2lib.validation: any integer dtype
    if low < 0 or high >= vocab_size:
        bad = low if low < 0 else high
        raise ValueError(
            f"{name} holds token id {bad}, outside the vocabulary 0..{vocab_size - 1}"
            f" (vocab_size={vocab_size}); encode the text with the model's tokenizer"
        )


def check_train_arguments(
    model: object,
    train_ids: object,
    val_ids: object,
    steps: object,
    *,
    batch_size: object,
    block_size: object,
    max_lr: object,
    min_lr: object,
    warmup_steps: object,
    weight_decay: object,
    max_grad_norm: object,
    eval_every: object,
    eval_batches: object,
    seed: object,
    device: object,
    on_eval: object,
    progress: object,
) -> None:
    """Refuse any bad argument of gpt2lib.training.train, naming it, before anything runs.

    None means "the default" for block_size, min_lr, warmup_steps, eval_every and device.
    """
    if not isinstance(model, torch.nn.Module):
        raise TypeError(f"model must be a GPT-2 model (an nn.Module), got {type(model).__name__}")
    config = getattr(model, "config", None)
    context = getattr(config, "n_positions", None)
    vocab_size = getattr(config, "vocab_size", None)
    if not isinstance(context, int) or not isinstance(vocab_size, int):
        raise TypeError("model.config must be a GPT2Config (with n_positions and vocab_size)")
    if not any(p.requires_grad for p in model.parameters()):
        raise ValueError(
            "the model has no parameter that requires a gradient: training would change nothing"
        )
    _whole("steps", steps, 0)
    _whole("batch_size", batch_size, 1)
    _whole("block_size", block_size, 1, allow_none=True)
    if block_size is not None and block_size > context:
        raise ValueError(
            f"block_size={block_size} is longer than the model's context of "
            f"{context} tokens (n_positions); use block_size <= {context}"
        )
    window = context if block_size is None else block_size
    for name, ids in (("train_ids", train_ids), ("val_ids", val_ids)):
        _token_ids(name, ids, vocab_size, window + 1, f"block_size + 1 = {window + 1}")
    _real("max_lr", max_lr, low=0, low_inclusive=False, why=" (GPT-2 style runs use 1e-4 to 1e-2)")
    _real("min_lr", min_lr, low=0, low_inclusive=True, allow_none=True)
    if min_lr is not None and min_lr > max_lr:
        raise ValueError(f"need 0 <= min_lr <= max_lr, got min_lr={min_lr:g}, max_lr={max_lr:g}")
    _whole("warmup_steps", warmup_steps, 0, allow_none=True)
    _real(
        "weight_decay",
        weight_decay,
        low=0,
        low_inclusive=True,
        why=" (0 turns weight decay off; 0.1 is usual)",
    )
    _real(
        "max_grad_norm",
        max_grad_norm,
        low=0,
        low_inclusive=False,
        allow_inf=True,
        why=" (the largest gradient norm kept by clipping; 1.0 is usual, inf turns it off; "
        "a negative norm would climb the loss and 0 would train nothing)",
    )
    _whole("eval_every", eval_every, 1, allow_none=True)
    _whole("eval_batches", eval_batches, 1)
    check_whole("seed", seed, 0, 2**63 - 1)
    if device is not None:
        from gpt2lib.device import pick_device

        pick_device(device)  # a clear ValueError for a device this machine does not have
    if on_eval is not None and not callable(on_eval):
        raise TypeError(
            f"on_eval must be a function of (history, model) or None, got {type(on_eval).__name__}"
        )
    if not isinstance(progress, bool):
        raise TypeError(f"progress must be True or False, got {progress!r}")


def check_ngram_arguments(
    train_ids: object, val_ids: object, vocab_size: object, smoothing: object, bigram_weight: object
) -> None:
    """Refuse bad arguments of gpt2lib.training.ngram_baselines before anything is counted."""
    _whole("vocab_size", vocab_size, 1)
    _token_ids("train_ids", train_ids, vocab_size, 2, "2 (one pair to count)")
    _token_ids("val_ids", val_ids, vocab_size, 2, "2 (one pair to score)")
    _real(
        "smoothing",
        smoothing,
        low=0,
        low_inclusive=True,
        why=" (the count added to every token, so that an unseen one keeps some probability)",
    )
    _real(
        "bigram_weight",
        bigram_weight,
        low=0,
        low_inclusive=True,
        high=1,
        why=" (the bigram's share of the mix)",
    )


# --------------------------------------------------------------------------- the entry points
# Chapter 7's cells are the plain lesson. The end of this module wraps its public names with the
# functions below, so that `gpt2lib.training.get_batch`, `lm_loss`, `lr_schedule`, `sample` and
# `train` refuse bad input with a clear message before anything runs, while the chapter shows
# (and the learner writes) only the lesson.


def _shape(value):
    return tuple(value.shape) if isinstance(value, torch.Tensor) else type(value).__name__


def check_loss_arguments(logits: object, targets: object) -> None:
    """lm_loss(logits (B, T, V), targets (B, T))."""
    if not isinstance(logits, torch.Tensor) or logits.dim() != 3:
        raise ValueError(f"logits must be a tensor of shape (B, T, V), got {_shape(logits)}")
    if not isinstance(targets, torch.Tensor) or tuple(targets.shape) != tuple(logits.shape[:2]):
        raise ValueError(
            f"targets must have shape (B, T) = {tuple(logits.shape[:2])} to match logits of shape "
            f"{tuple(logits.shape)}, got {_shape(targets)}; targets hold one next-token id per "
            "position"
        )
    if targets.dtype != torch.long:
        raise TypeError(f"targets must hold integer token ids (torch.long), got {targets.dtype}")


def check_batch_arguments(
    ids: object,
    batch_size: object,
    block_size: object,
    generator: object = None,
    device: object = None,
) -> None:
    """get_batch(ids (N,), batch_size, block_size, generator, device)."""
    if not isinstance(ids, torch.Tensor) or ids.dim() != 1:
        raise ValueError(
            "ids must be a 1-D tensor of token ids (the whole text, encoded); "
            "for a list use torch.tensor(ids)"
        )
    if ids.dtype not in (torch.long, torch.int32):
        raise TypeError(f"ids must hold integer token ids (torch.long), got {ids.dtype}")
    _whole("batch_size", batch_size, 1)
    _whole("block_size", block_size, 1)
    if len(ids) < block_size + 1:
        raise ValueError(
            f"ids hold {len(ids)} tokens, too few for one window: a window of block_size="
            f"{block_size} needs block_size + 1 = {block_size + 1} tokens (inputs plus the next "
            "token); use more text or a smaller block_size"
        )


def check_schedule_arguments(
    step: object, max_lr: object, warmup_steps: object, total_steps: object, min_lr: object
) -> None:
    """lr_schedule(step, max_lr, warmup_steps, total_steps, min_lr)."""
    _whole("step", step, 0)
    _whole("warmup_steps", warmup_steps, 0)
    _whole("total_steps", total_steps, 0)
    if not 0 <= min_lr <= max_lr:
        raise ValueError(f"need 0 <= min_lr <= max_lr, got min_lr={min_lr}, max_lr={max_lr}")


def check_sample_arguments(
    model: object,
    idx: object,
    max_new_tokens: object,
    temperature: object = 1.0,
    generator: object = None,
) -> None:
    """sample(model, idx (B, T), max_new_tokens, temperature, generator)."""
    if not isinstance(idx, torch.Tensor) or idx.dim() != 2:
        raise ValueError("idx must be a (B, T) tensor of token ids; for one prompt use ids[None]")
    _whole("max_new_tokens", max_new_tokens, 0)
    if not temperature >= 0:
        raise ValueError(f"temperature must be >= 0 (0 means greedy), got {temperature}")


def guarded(check: Callable[..., None]) -> Callable[[Callable], Callable]:
    """fn -> fn behind `check`, called first with the same arguments, defaults filled in."""

    def wrap(fn):
        signature = inspect.signature(fn)

        @functools.wraps(fn)
        def entry(*args, **kwargs):
            bound = signature.bind(*args, **kwargs)  # a wrong call fails as the function would
            bound.apply_defaults()  # the check sees the defaults too
            check(*bound.args, **bound.kwargs)
            return fn(*args, **kwargs)

        entry.unchecked = fn  # the lesson's own function, for whoever wants it plain
        return entry

    return wrap


@guarded(check_sample_arguments)
@torch.no_grad()
def sample(
    model: nn.Module,
    idx: torch.Tensor,
    max_new_tokens: int,
    temperature: float = 1.0,
    generator: torch.Generator | None = None,
) -> torch.Tensor:
    """Extend idx (B, T) by max_new_tokens tokens with chapter 9's loop (no cache), in eval mode.

    Each step feeds the last n_positions tokens; temperature 0 is greedy. The steps run on a
    view of the model put in eval mode (gpt2lib.views), so the model keeps its own mode, also
    for another thread that is training or generating with it meanwhile.
    """
    from gpt2lib.generation import decode_all  # chapter 9's loop, the one generate() runs

    return decode_all(
        model_view(model).eval(),
        idx,
        max_new_tokens,
        sampling=(float(temperature), None, None),
        generator=generator,
        use_cache=False,
        crop=True,
    )


def guarded_train(lesson_train: Callable, history_cls: type) -> Callable[..., History]:
    """The public `train`: chapter 7's loop `lesson_train`, with every guarantee around it.

    Before anything changes: every argument is checked (check_train_arguments). While it runs:
    a loss that turns NaN or inf stops the run naming the step and the learning rate, and a
    progress bar counts the steps. Stopped early (Ctrl-C, that NaN, or an error in on_eval),
    the exception carries what was recorded as `.history`, and the model keeps the mode it
    came in. `get_batch`, `train_step` and `lr_at` (None: the chapter's reference) plug in
    the learner's own pieces.
    """

    def train(
        model: nn.Module,
        train_ids: torch.Tensor,
        val_ids: torch.Tensor,
        steps: int,
        *,
        batch_size: int = 8,
        block_size: int | None = None,
        max_lr: float = 3e-3,
        min_lr: float | None = None,
        warmup_steps: int | None = None,
        weight_decay: float = 0.1,
        max_grad_norm: float = 1.0,
        eval_every: int | None = None,
        eval_batches: int = 10,
        seed: int = 0,
        device: torch.device | str | None = None,
        on_eval: Callable | None = None,
        progress: bool = True,
        get_batch: Callable | None = None,
        train_step: Callable | None = None,
        lr_at: Callable | None = None,
    ) -> History:
        settings = dict(  # what chapter 7's loop takes as it is
            batch_size=batch_size,
            block_size=block_size,
            max_lr=max_lr,
            min_lr=min_lr,
            warmup_steps=warmup_steps,
            weight_decay=weight_decay,
            max_grad_norm=max_grad_norm,
            eval_every=eval_every,
            eval_batches=eval_batches,
            seed=seed,
        )
        check_train_arguments(
            model,
            train_ids,
            val_ids,
            steps,
            **settings,
            device=device,
            on_eval=on_eval,
            progress=progress,
        )
        for name, fn in (("get_batch", get_batch), ("train_step", train_step), ("lr_at", lr_at)):
            if fn is not None and not callable(fn):
                raise TypeError(
                    f"{name} must be a function or None (the reference), got {type(fn).__name__}"
                )
        pieces = {
            k: v
            for k, v in (("get_batch", get_batch), ("train_step", train_step), ("lr_at", lr_at))
            if v is not None
        }
        step_fn = train_step or lesson_train.__kwdefaults__["train_step"]
        if device is not None:
            model.to(device)
        history = history_cls()
        bar = _progress_bar(steps) if progress else None
        started = time.perf_counter()
        was_training = model.training

        def watched_step(model, optimizer, x, y, max_grad_norm):
            loss = float(step_fn(model, optimizer, x, y, max_grad_norm))
            step = len(history.step)
            history.largest_batch = max(getattr(history, "largest_batch", 0), x.numel())
            if not math.isfinite(loss):
                lr = optimizer.param_groups[0]["lr"]
                raise FloatingPointError(
                    f"the training loss became {loss} at step {step} (learning rate {lr:.3g}); "
                    f"training stopped. Lower the learning rate (max_lr={max_lr:g}, try "
                    f"{max_lr / 3:.2g}) or keep gradient clipping on"
                )
            if bar is not None:
                bar.update(1)
                bar.set_postfix(loss=f"{loss:.3f}")
            return loss

        def timed_eval(history, model):
            history.seconds = time.perf_counter() - started
            if on_eval is not None:
                on_eval(history, model)

        try:
            lesson_train(
                model,
                train_ids,
                val_ids,
                steps,
                **settings,
                on_eval=timed_eval,
                history=history,
                **{**pieces, "train_step": watched_step},
            )
        except BaseException as stopped:
            history.seconds = time.perf_counter() - started
            stopped.history = history  # an interrupted run keeps what it recorded
            model.train(was_training)
            raise
        finally:
            if bar is not None:
                bar.close()
        history.seconds = time.perf_counter() - started
        return history

    train.__doc__ = lesson_train.__doc__
    train.unchecked = lesson_train
    return train


def _progress_bar(total):
    """tqdm's bar (a widget in notebooks) if tqdm is installed, else None."""
    try:
        from tqdm.auto import tqdm
    except ImportError:
        return None
    return tqdm(
        total=total, desc="training", unit="step", mininterval=1.0
    )  # see finetune._progress


lm_loss = guarded(check_loss_arguments)(lesson.lm_loss)
get_batch = guarded(check_batch_arguments)(lesson.get_batch)
lr_schedule = guarded(check_schedule_arguments)(lesson.lr_schedule)
ngram_baselines = guarded(check_ngram_arguments)(lesson.ngram_baselines)
train = guarded_train(lesson.train_loop, History)
