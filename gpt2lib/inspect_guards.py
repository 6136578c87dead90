"""Argument checks and thread-scoped hooks behind chapter 8's look inside (gpt2lib.interpret).

Written by hand (not generated from a notebook). The chapter's code stays the plain lesson
(hooks that record, a head zeroed before c_proj, a score read off a diagonal) and makes one
call here before it registers anything: every argument is checked up front, so that a bad
layer number, capture name or sequence length is a clear error before any hook is on the
model. `hook_scope()` registers hooks that act only in the calling thread and context and are
removed afterwards, also when the forward pass fails. This module imports nothing from
gpt2lib.interpret (it is a leaf the interpret module calls).
"""

from __future__ import annotations

import contextlib
import contextvars
import numbers

import torch

from gpt2lib.validation import check_token_ids

__all__ = [
    "CAPTURES",
    "check_ablation",
    "check_lens",
    "check_pattern",
    "check_repeat_args",
    "check_run_with_cache",
    "check_whole",
    "hook_scope",
]

# What run_with_cache can record.
CAPTURES = ("resid", "attn", "head_out", "mlp_out")


def _blocks(model):
    blocks = getattr(model, "h", None)
    if blocks is None or not hasattr(blocks, "__len__"):
        raise TypeError(
            f"{type(model).__name__} has no list of blocks `h`; run_with_cache works on GPT-2 "
            "models built like gpt2lib.model.GPT2 (wte, wpe, h, ln_f)"
        )
    return list(blocks)


def _require(block, index, paths, purpose):
    """Name the first attribute path (like 'attn.c_proj') that block `index` lacks."""
    for path in paths:
        obj = block
        for part in path.split("."):
            if not hasattr(obj, part):
                raise TypeError(
                    f"{purpose} needs block {index} to have `{path}` (as gpt2lib.block.Block "
                    f"has: ln_1, attn with c_attn, c_proj, n_head and n_embd, ln_2, mlp), but "
                    f"{type(block).__name__} has no `{path}`"
                )
            obj = getattr(obj, part)


def _check_capture(capture):
    names = (capture,) if isinstance(capture, str) else tuple(capture)
    unknown = [n for n in names if n not in CAPTURES]
    if unknown:
        raise ValueError(
            f"unknown capture name(s) {', '.join(map(repr, unknown))}; choose from "
            f"{', '.join(CAPTURES)}"
        )
    return set(names)


def _check_index(value, size, what):
    if isinstance(value, torch.Tensor):  # scores.argmax() and the like: a one-element int tensor
        if (value.numel() != 1 or value.dtype.is_floating_point or value.dtype.is_complex
                or value.dtype == torch.bool):
            raise TypeError(f"{what} must be a whole number; got a tensor of shape "
                            f"{tuple(value.shape)} and dtype {value.dtype}")
        value = value.item()
    if isinstance(value, bool) or not isinstance(value, numbers.Integral):
        raise TypeError(f"{what} must be a whole number, got {value!r}")
    if not 0 <= value < size:
        raise ValueError(f"{what} {value} is out of range: the model has {size}, numbered "
                         f"0 .. {size - 1}")
    return int(value)


def check_run_with_cache(model, idx, capture) -> set:
    """The capture names (a set), after checking them, the token ids and the blocks' parts."""
    wanted = _check_capture(capture)
    check_token_ids(idx, model.config)  # the entry point checks the ids once
    for i, block in enumerate(_blocks(model)):
        if "attn" in wanted:
            _require(block, i, ["ln_1", "attn.c_attn", "attn.n_head", "attn.n_embd"],
                     "capturing 'attn'")
        if "head_out" in wanted:
            _require(block, i, ["attn.c_proj", "attn.n_head"], "capturing 'head_out'")
        if "mlp_out" in wanted:
            _require(block, i, ["mlp"], "capturing 'mlp_out'")
    return wanted


def check_ablation(ablate_heads, model) -> dict:
    """{layer: [head, ...]} with every index checked; a single head may be given as an int."""
    if ablate_heads is None:
        return {}
    blocks = _blocks(model)
    if not isinstance(ablate_heads, dict):
        raise TypeError(
            f"ablate_heads must be a dict {{layer: [head, ...]}}, got {type(ablate_heads).__name__}"
        )
    checked = {}
    for layer, heads in ablate_heads.items():
        layer = _check_index(layer, len(blocks), "layer")
        _require(blocks[layer], layer, ["attn.c_proj", "attn.n_head"], "ablate_heads")
        n_head = blocks[layer].attn.n_head
        if isinstance(heads, numbers.Integral) or (isinstance(heads, torch.Tensor) and heads.dim() == 0):
            heads = [heads]
        elif isinstance(heads, (str, bytes)) or not hasattr(heads, "__iter__"):
            raise TypeError(f"the heads of layer {layer} must be a head number or a list of them, "
                            f"got {heads!r}")
        heads = list(heads)
        checked[layer] = sorted({_check_index(h, n_head, f"head (layer {layer})") for h in heads})
    return checked


def check_whole(value, what, low=None, high=None):
    """value as an int, checked to be a whole number in low .. high (either bound optional)."""
    if isinstance(value, bool) or not isinstance(value, numbers.Integral):
        raise TypeError(f"{what} must be a whole number, got {value!r}")
    if (low is not None and value < low) or (high is not None and value > high):
        bounds = f"{low} .. {high}" if high is not None else f"{low} or more"
        raise ValueError(f"{what} must be {bounds}, got {value}")
    return int(value)


def check_repeat_args(model, seq_len, batch, tokens):
    """The arguments of induction_scores, checked before any forward pass."""
    n_positions, vocab_size = model.config.n_positions, model.config.vocab_size
    check_whole(seq_len, "seq_len", 1)
    if 2 * seq_len + 1 > n_positions:
        raise ValueError(f"seq_len={seq_len} gives {2 * seq_len + 1} tokens, more than the "
                         f"model's n_positions={n_positions}")
    check_whole(batch, "batch", 1)
    if tokens is not None:
        if (not isinstance(tokens, torch.Tensor) or tokens.dim() != 1 or tokens.numel() == 0
                or tokens.dtype.is_floating_point or tokens.dtype == torch.bool):
            raise TypeError("tokens must be a non-empty 1-d tensor of token ids (integers)")
        if tokens.min() < 0 or tokens.max() >= vocab_size:
            raise ValueError(f"tokens must be ids in 0 .. {vocab_size - 1} (the model's vocabulary)")


def check_pattern(pattern, seq_len):
    """An attention pattern on repeated_tokens of seq_len must cover 2 * seq_len + 1 tokens."""
    T = pattern.shape[-1]
    if T != 2 * seq_len + 1:
        raise ValueError(f"pattern covers {T} tokens; repeated_tokens of seq_len={seq_len} "
                         f"have {2 * seq_len + 1}")


def check_lens(model, cache, top_k):
    """logit_lens's arguments: a top_k within the vocabulary, a cache that holds the stream."""
    if top_k is not None:
        check_whole(top_k, "top_k", 1, model.wte.weight.shape[0])  # at most the vocabulary
    if not cache.resid:
        raise ValueError("the cache holds no residual stream: run run_with_cache with 'resid' "
                         "in capture (it is there by default)")


# Hooks sit on the model, which other threads may be running at the same moment. Each scope is
# visible only to its own thread (and context), and its hooks act only there: another thread's
# forward pass runs past them unchanged.
_OPEN_SCOPES = contextvars.ContextVar("gpt2lib_interpret_open_scopes", default=frozenset())


@contextlib.contextmanager
def hook_scope():
    """Yields add(register, hook): register a hook that acts only in this scope; all removed after.

        with hook_scope() as add:
            add(block.register_forward_pre_hook, before_block)
            logits = model(idx)
    """
    key = object()
    handles = []

    def add(register, hook):
        handles.append(register(lambda *args: hook(*args) if key in _OPEN_SCOPES.get() else None))

    _OPEN_SCOPES.set(_OPEN_SCOPES.get() | {key})
    try:
        yield add
    finally:
        for handle in handles:
            handle.remove()
        _OPEN_SCOPES.set(_OPEN_SCOPES.get() - {key})
