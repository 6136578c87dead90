"""A look inside a model (chapter 8), as the package's entry points.

    from gpt2lib.inspection import run_with_cache, ablated_heads, logit_lens, induction_scores

Hand-written. Chapter 8's lesson (`gpt2lib.chapters.interpret`) records a forward pass with
hooks, reads the logit lens, scores heads and zeroes them. This module checks every argument
before anything runs, so that a bad layer number, capture name or sequence length is a clear
error before any hook is on the model, and records on a view of the model
(`gpt2lib.views.model_view`): the caller's model never carries the recording hooks, so another
thread running it at the same moment is not recorded or changed.
"""

from __future__ import annotations

import contextlib
import contextvars
import numbers
from collections.abc import Iterable, Iterator

import torch
import torch.nn as nn

from gpt2lib.chapters import interpret as lesson
from gpt2lib.chapters.interpret import ActivationCache
from gpt2lib.validation import check_token_ids, check_whole
from gpt2lib.views import model_view

__all__ = [
    "CAPTURES",
    "DEFAULT_CAPTURE",
    "ActivationCache",
    "ablated_heads",
    "check_ablation",
    "check_lens",
    "check_repeat_args",
    "check_run_with_cache",
    "induction_scores",
    "logit_lens",
    "run_with_cache",
]

# What run_with_cache can record, and what it records unless asked otherwise.
CAPTURES = ("resid", "attn", "head_out", "mlp_out")
DEFAULT_CAPTURE = ("resid", "attn")


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
    """A layer or head number (an int, or a one-element integer tensor such as argmax's)."""
    return check_whole(what, value, 0, size - 1, why=f" (the model has {size}, numbered from 0)")


def check_run_with_cache(model: nn.Module, idx: torch.Tensor, capture: str | Iterable[str]) -> set:
    """The capture names (a set), after checking them, the token ids and the blocks' parts."""
    wanted = _check_capture(capture)
    check_token_ids(idx, model.config)  # the entry point checks the ids once
    for i, block in enumerate(_blocks(model)):
        if "attn" in wanted:
            _require(
                block, i, ["ln_1", "attn.c_attn", "attn.n_head", "attn.n_embd"], "capturing 'attn'"
            )
        if "head_out" in wanted:
            _require(block, i, ["attn.c_proj", "attn.n_head"], "capturing 'head_out'")
        if "mlp_out" in wanted:
            _require(block, i, ["mlp"], "capturing 'mlp_out'")
    return wanted


def check_ablation(ablate_heads: dict | None, model: nn.Module) -> dict:
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
        if isinstance(heads, numbers.Integral) or (
            isinstance(heads, torch.Tensor) and heads.dim() == 0
        ):
            heads = [heads]
        elif isinstance(heads, (str, bytes)) or not hasattr(heads, "__iter__"):
            raise TypeError(
                f"the heads of layer {layer} must be a head number or a list of them, got {heads!r}"
            )
        heads = list(heads)
        checked[layer] = sorted({_check_index(h, n_head, f"head (layer {layer})") for h in heads})
    return checked


def check_repeat_args(
    model: nn.Module, seq_len: int, batch: int, tokens: torch.Tensor | None
) -> None:
    """The arguments of induction_scores, checked before any forward pass."""
    n_positions, vocab_size = model.config.n_positions, model.config.vocab_size
    check_whole("seq_len", seq_len, 1)
    if 2 * seq_len + 1 > n_positions:
        raise ValueError(
            f"seq_len={seq_len} gives {2 * seq_len + 1} tokens, more than the "
            f"model's n_positions={n_positions}"
        )
    check_whole("batch", batch, 1)
    if tokens is not None:
        if (
            not isinstance(tokens, torch.Tensor)
            or tokens.dim() != 1
            or tokens.numel() == 0
            or tokens.dtype.is_floating_point
            or tokens.dtype == torch.bool
        ):
            raise TypeError("tokens must be a non-empty 1-d tensor of token ids (integers)")
        if tokens.min() < 0 or tokens.max() >= vocab_size:
            raise ValueError(
                f"tokens must be ids in 0 .. {vocab_size - 1} (the model's vocabulary)"
            )


def check_lens(model: nn.Module, cache: ActivationCache, top_k: int | None) -> None:
    """logit_lens's arguments: a top_k within the vocabulary, a cache that holds the stream."""
    if top_k is not None:
        check_whole("top_k", top_k, 1, model.wte.weight.shape[0])  # at most the vocabulary
    if not cache.resid:
        raise ValueError(
            "the cache holds no residual stream: run run_with_cache with 'resid' "
            "in capture (it is there by default)"
        )


# --------------------------------------------------------------------------- the entry points


def run_with_cache(
    model: nn.Module,
    idx: torch.Tensor,
    capture: str | Iterable[str] = DEFAULT_CAPTURE,
    ablate_heads: dict | None = None,
) -> tuple[torch.Tensor, ActivationCache]:
    """Logits (B, T, V) and an ActivationCache of one forward pass over idx (B, T).

    capture: any of CAPTURES. ablate_heads: {layer: [head, ...]}, heads whose outputs are
    zeroed before c_proj in this pass. Every argument is checked before anything runs; the
    hooks go on a view of the model, never on the model itself.
    """
    wanted = check_run_with_cache(model, idx, capture)
    checked = check_ablation(ablate_heads, model)
    view = model_view(model)
    return lesson.run_with_cache(view, idx.long(), tuple(sorted(wanted)), checked or None)


# The context manager below changes the model itself, which other threads may be running. Each
# one is seen only in its own thread (and context): another thread's forward runs past its hooks.
_OPEN_ABLATIONS = contextvars.ContextVar("gpt2lib_open_ablations", default=frozenset())


@contextlib.contextmanager
def ablated_heads(model: nn.Module, ablate_heads: dict) -> Iterator[nn.Module]:
    """Within the block, the listed heads' outputs ({layer: [head, ...]}) are zeroed before
    c_proj on `model` itself (chapter 8's zero_heads), in this thread only; the hooks are
    removed afterwards, also after an error."""
    checked = check_ablation(ablate_heads, model)
    key = object()

    def zero(heads, n_head):
        def hook(module, args):
            if key in _OPEN_ABLATIONS.get():
                return (lesson.zero_heads(args[0], heads, n_head),)
            return None

        return hook

    handles = [
        model.h[layer].attn.c_proj.register_forward_pre_hook(
            zero(heads, model.h[layer].attn.n_head)
        )
        for layer, heads in checked.items()
    ]
    token = _OPEN_ABLATIONS.set(_OPEN_ABLATIONS.get() | {key})
    try:
        yield model
    finally:
        _OPEN_ABLATIONS.reset(token)
        for handle in handles:
            handle.remove()


def logit_lens(
    model: nn.Module, cache: ActivationCache, top_k: int | None = None
) -> torch.Tensor | torch.return_types.topk:
    """The readout applied to the stream after every block: (n_layer + 1, B, T, V) logits, or
    their torch.topk (values and indices, (n_layer + 1, B, T, top_k)) when top_k is given."""
    check_lens(model, cache, top_k)
    logits = lesson.logit_lens(model, cache)
    return logits if top_k is None else logits.topk(top_k, dim=-1)


def induction_scores(
    model: nn.Module,
    seq_len: int = 50,
    batch: int = 4,
    seed: int = 0,
    previous: bool = False,
    tokens: torch.Tensor | None = None,
) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor]:
    """(n_layer, n_head) induction scores on repeated random tokens; with previous=True also
    the previous-token scores. `tokens` (1-d ids) is the pool the random tokens come from."""
    check_repeat_args(model, seq_len, batch, tokens)
    return lesson.induction_scores(model_view(model), seq_len, batch, seed, previous, tokens)
