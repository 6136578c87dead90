"""The model class people use: chapter 6's GPT-2 with its methods, and `from_pretrained`.

    from gpt2lib import GPT2, from_pretrained
    model = GPT2.from_pretrained("gpt2")          # or from_pretrained("gpt2"), or a folder
    out = model.generate(ids, 20, temperature=0)
    logits, cache = model.run_with_cache(ids)
    model.save_pretrained("my-model")

Hand-written. Chapter 6's class, `gpt2lib.chapters.model.GPT2`, stays a plain nn.Module;
`gpt2lib.GPT2` is that class with `GPT2Methods` (transformers' mixin pattern): each method is a
thin call of the function that stays the core (`model.generate(...)` is
`gpt2lib.generation.generate(model, ...)`). Every way to get a model gives an object with the
same methods: `GPT2(config)`, `GPT2.from_pretrained(...)`, `from_pretrained(...)`, and
`from_pretrained(..., model_cls=Mine)` with a class of your own (which gets the methods it
lacks through `with_methods`).
"""

from __future__ import annotations

import functools
import os
from pathlib import Path

import torch
import torch.nn as nn

from gpt2lib import generation, inspection
from gpt2lib.chapters.config import GPT2Config
from gpt2lib.chapters.model import GPT2 as ChapterGPT2
from gpt2lib.checkpoint import load_pretrained, save_pretrained
from gpt2lib.inspection import ActivationCache

__all__ = ["GPT2", "GPT2Methods", "check_is_gpt2_config", "from_pretrained", "with_methods"]


class GPT2Methods:
    """generate, run_with_cache, save_pretrained and from_pretrained as methods, for any GPT-2
    class built like chapter 6's (wte, wpe, h, ln_f)."""

    def generate(self, idx: torch.Tensor, max_new_tokens: int, **kwargs) -> torch.Tensor:
        """gpt2lib.generation.generate(self, idx, max_new_tokens, **kwargs): (B, T + new)."""
        return generation.generate(self, idx, max_new_tokens, **kwargs)

    def run_with_cache(self, idx: torch.Tensor, **kwargs) -> tuple[torch.Tensor, ActivationCache]:
        """gpt2lib.inspection.run_with_cache(self, idx, **kwargs): logits and a cache."""
        return inspection.run_with_cache(self, idx, **kwargs)

    def save_pretrained(self, folder: str | os.PathLike, **kwargs) -> Path:
        """gpt2lib.checkpoint.save_pretrained(self, folder, **kwargs)."""
        return save_pretrained(self, folder, **kwargs)

    @classmethod
    def from_pretrained(
        cls,
        name_or_path: str | os.PathLike,
        device: torch.device | str | None = None,
        dtype: torch.dtype | str | None = None,
        **kwargs,
    ) -> nn.Module:
        """An instance of this class with a checkpoint's weights (see from_pretrained)."""
        kwargs.setdefault("model_cls", cls)
        return from_pretrained(name_or_path, device, dtype, **kwargs)


class GPT2(GPT2Methods, ChapterGPT2):
    """Chapter 6's GPT2 (gpt2lib.chapters.model.GPT2) with GPT2Methods. The modules, parameter
    names and forward are chapter 6's; the constructor, an entry point, first checks that it
    was given a GPT2Config (chapter 6's plain class checks nothing)."""

    def __init__(self, config: GPT2Config, *args, **kwargs):
        check_is_gpt2_config(config)
        super().__init__(config, *args, **kwargs)


def check_is_gpt2_config(config: object) -> None:
    """A clear TypeError unless `config` is a GPT2Config (a dict, a name or None is not)."""
    if not isinstance(config, GPT2Config):
        raise TypeError(
            f"GPT2 needs a GPT2Config, got {type(config).__name__}: build one with "
            "GPT2Config(n_layer=..., ...) or GPT2Config.from_name('gpt2') "
            "(from gpt2lib import GPT2Config)"
        )


@functools.cache
def with_methods(cls: type) -> type:
    """`cls` itself if it has GPT2Methods, else a subclass of it that adds the methods it lacks
    (its own methods, and its name, stay first)."""
    if not isinstance(cls, type) or issubclass(cls, GPT2Methods):
        return cls  # a factory function is called as it is
    return type(
        cls.__name__,
        (cls, GPT2Methods),
        {"__module__": cls.__module__, "__qualname__": cls.__qualname__, "__doc__": cls.__doc__},
    )


def from_pretrained(
    name_or_path: str | os.PathLike,
    device: torch.device | str | None = None,
    dtype: torch.dtype | str | None = None,
    *,
    model_cls: type | None = None,
) -> nn.Module:
    """A model with a checkpoint's weights, in eval mode, from a hub name ('gpt2',
    'gpt2-medium', 'gpt2-large', 'gpt2-xl') or a folder holding config.json and
    model.safetensors. device None picks CUDA, then MPS, then the CPU; dtype None is float32
    (bfloat16 on a CUDA GPU that has it). model_cls: gpt2lib.GPT2 unless told; a class of your
    own gets the methods through with_methods. Every file and value is checked before the
    model is built (gpt2lib.checkpoint.load_pretrained)."""
    if model_cls is not None and (isinstance(model_cls, str) or not callable(model_cls)):
        raise TypeError(f"model_cls must be a model class such as GPT2, got {model_cls!r}")
    cls = GPT2 if model_cls is None else with_methods(model_cls)
    return load_pretrained(name_or_path, device, dtype, model_cls=cls)
