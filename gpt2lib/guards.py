"""Argument checks for chapter 7's entry points: `train` and `ngram_baselines`.

Written by hand (not generated from a notebook). The chapter's code stays the plain lesson and
makes one call here before it changes anything; every setting is checked up front, so that a
bad value is a clear error before the first step, never a run that trains nothing, climbs the
loss, or fails after a hundred steps.
"""

from __future__ import annotations

import math
import numbers

import torch

from gpt2lib.validation import token_range

__all__ = ["check_ngram_arguments", "check_train_arguments"]


def _whole(name, value, minimum, allow_none=False):
    if value is None and allow_none:
        return
    if isinstance(value, bool) or not isinstance(value, numbers.Integral):
        raise TypeError(f"{name} must be a whole number, got {value!r} ({type(value).__name__})")
    if value < minimum:
        raise ValueError(f"{name} must be at least {minimum}, got {value}")


def _real(name, value, *, low, low_inclusive, high=None, allow_none=False, allow_inf=False,
          why=""):
    """A real number in a range: NaN, infinity (unless allowed) and bools refused."""
    if value is None and allow_none:
        return
    if isinstance(value, bool) or not isinstance(value, numbers.Real):
        raise TypeError(f"{name} must be a number, got {value!r} ({type(value).__name__})")
    value = float(value)
    if math.isnan(value) or (math.isinf(value) and not allow_inf):
        raise ValueError(f"{name} must be a finite number, got {value}{why}")
    below = value < low if low_inclusive else value <= low
    if below or (high is not None and value > high):
        bound = f">= {low:g}" if low_inclusive else f"> {low:g}"
        if high is not None:
            bound += f" and <= {high:g}"
        raise ValueError(f"{name} must be {bound}, got {value:g}{why}")


def _token_ids(name, ids, vocab_size, minimum_length, length_why):
    if not isinstance(ids, torch.Tensor) or ids.dim() != 1:
        got = f"shape {tuple(ids.shape)}" if isinstance(ids, torch.Tensor) else type(ids).__name__
        raise ValueError(f"{name} must be a 1-D tensor of token ids, got {got}; for a list use "
                         "torch.tensor(ids)")
    if ids.dtype.is_floating_point or ids.dtype.is_complex or ids.dtype == torch.bool:
        raise TypeError(f"{name} must hold integer token ids (torch.long), got {ids.dtype}")
    if len(ids) < minimum_length:
        raise ValueError(f"{name} holds {len(ids)} tokens, fewer than {length_why}: use more "
                         "text" + (" or a smaller block_size" if "block_size" in length_why
                                   else ""))
    low, high = token_range(ids)  # gpt2lib.validation: any integer dtype
    if low < 0 or high >= vocab_size:
        bad = low if low < 0 else high
        raise ValueError(f"{name} holds token id {bad}, outside the vocabulary 0..{vocab_size - 1}"
                         f" (vocab_size={vocab_size}); encode the text with the model's tokenizer")


def check_train_arguments(model, train_ids, val_ids, steps, *, batch_size, block_size, max_lr,
                          min_lr, warmup_steps, weight_decay, max_grad_norm, eval_every,
                          eval_batches, seed, device, on_eval, progress) -> None:
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
        raise ValueError("the model has no parameter that requires a gradient: training would "
                         "change nothing")
    _whole("steps", steps, 0)
    _whole("batch_size", batch_size, 1)
    _whole("block_size", block_size, 1, allow_none=True)
    if block_size is not None and block_size > context:
        raise ValueError(f"block_size={block_size} is longer than the model's context of "
                         f"{context} tokens (n_positions); use block_size <= {context}")
    window = context if block_size is None else block_size
    for name, ids in (("train_ids", train_ids), ("val_ids", val_ids)):
        _token_ids(name, ids, vocab_size, window + 1, f"block_size + 1 = {window + 1}")
    _real("max_lr", max_lr, low=0, low_inclusive=False, why=" (GPT-2 style runs use 1e-4 to 1e-2)")
    _real("min_lr", min_lr, low=0, low_inclusive=True, allow_none=True)
    if min_lr is not None and min_lr > max_lr:
        raise ValueError(f"need 0 <= min_lr <= max_lr, got min_lr={min_lr:g}, max_lr={max_lr:g}")
    _whole("warmup_steps", warmup_steps, 0, allow_none=True)
    _real("weight_decay", weight_decay, low=0, low_inclusive=True,
          why=" (0 turns weight decay off; 0.1 is usual)")
    _real("max_grad_norm", max_grad_norm, low=0, low_inclusive=False, allow_inf=True,
          why=" (the largest gradient norm kept by clipping; 1.0 is usual, inf turns it off; "
              "a negative norm would climb the loss and 0 would train nothing)")
    _whole("eval_every", eval_every, 1, allow_none=True)
    _whole("eval_batches", eval_batches, 1)
    if isinstance(seed, bool) or not isinstance(seed, numbers.Integral):
        raise TypeError(f"seed must be a whole number, got {seed!r} ({type(seed).__name__})")
    if not 0 <= seed < 2**63:
        raise ValueError(f"seed must be in 0 .. 2**63 - 1, got {seed}")
    if device is not None:
        from gpt2lib.device import pick_device

        pick_device(device)  # a clear ValueError for a device this machine does not have
    if on_eval is not None and not callable(on_eval):
        raise TypeError(f"on_eval must be a function of (history, model) or None, got "
                        f"{type(on_eval).__name__}")
    if not isinstance(progress, bool):
        raise TypeError(f"progress must be True or False, got {progress!r}")


def check_ngram_arguments(train_ids, val_ids, vocab_size, smoothing, bigram_weight) -> None:
    """Refuse bad arguments of gpt2lib.training.ngram_baselines before anything is counted."""
    _whole("vocab_size", vocab_size, 1)
    _token_ids("train_ids", train_ids, vocab_size, 2, "2 (one pair to count)")
    _token_ids("val_ids", val_ids, vocab_size, 2, "2 (one pair to score)")
    _real("smoothing", smoothing, low=0, low_inclusive=True,
          why=" (the count added to every token, so that an unseen one keeps some probability)")
    _real("bigram_weight", bigram_weight, low=0, low_inclusive=True, high=1,
          why=" (the bigram's share of the mix)")
