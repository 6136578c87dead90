"""The checks and constants that everything shares: the one leaf of the package.

Hand-written. It imports nothing from gpt2lib, so the chapters' generated code may use it (and
nothing else that is hand-written): GPT-2's constants (the end-of-text token, the released
sizes, safetensors' dtype names, where the course's data lives) and the checks that run once
at the entry points people call (`GPT2Config(...)`, `generate`, `train`, `run_with_cache`,
the CLI), never inside a layer's forward: the config's values, token ids and numbers.
"""

from __future__ import annotations

import math
import numbers
import os
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import torch

__all__ = [
    "DATA_DIR",
    "DTYPE_NAMES",  # noqa: F822 - built on first use, by __getattr__
    "ENDOFTEXT",
    "ENDOFTEXT_ID",
    "GPT2_SIZES",
    "GPT2_SPLIT_PATTERN",
    "HUB_ORG",
    "SAFETENSORS_DTYPES",  # noqa: F822
    "check_config",
    "check_is_dict",
    "check_model_name",
    "check_token_ids",
    "check_token_stream",
    "released_name",
    "require_count",
    "token_range",
]

# --------------------------------------------------------------------------- constants

ENDOFTEXT = "<|endoftext|>"  # GPT-2's one special token: it separates documents
ENDOFTEXT_ID = 50256  # its id, the last of the 50,257

# GPT-2's split pattern (chapter 1, section 3), the same as OpenAI's and tiktoken's: contractions,
# letters, numbers, other symbols (each with one optional leading space), then whitespace: a run
# not followed by a word (the lookahead leaves the last space to the next word), and last any
# whitespace the lookahead could not take.
GPT2_SPLIT_PATTERN = (
    r"""'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+"""
)

# The released GPT-2s: name -> the sizes that differ between them (all have 50,257 tokens and a
# context of 1,024).
GPT2_SIZES = {
    "gpt2": dict(n_layer=12, n_head=12, n_embd=768),
    "gpt2-medium": dict(n_layer=24, n_head=16, n_embd=1024),
    "gpt2-large": dict(n_layer=36, n_head=20, n_embd=1280),
    "gpt2-xl": dict(n_layer=48, n_head=25, n_embd=1600),
}
HUB_ORG = "openai-community"  # the hub organisation of the released GPT-2s: 'openai-community/gpt2'

# safetensors' dtype names -> torch dtypes, and what a user may call the float dtypes a model can
# be loaded or saved in. Tables of names here; the torch dtypes are looked up on first use
# (module __getattr__ below), so that importing the leaf (the tokenizer does) loads no PyTorch.
_SAFETENSORS_DTYPE_NAMES = {
    "F64": "float64",
    "F32": "float32",
    "F16": "float16",
    "BF16": "bfloat16",
    "I64": "int64",
    "I32": "int32",
    "I16": "int16",
    "I8": "int8",
    "U8": "uint8",
    "BOOL": "bool",
}
_USER_DTYPE_NAMES = {
    "float32": "float32",
    "fp32": "float32",
    "float": "float32",
    "bfloat16": "bfloat16",
    "bf16": "bfloat16",
    "float16": "float16",
    "fp16": "float16",
    "half": "float16",
}
_DTYPE_TABLES = {"SAFETENSORS_DTYPES": _SAFETENSORS_DTYPE_NAMES, "DTYPE_NAMES": _USER_DTYPE_NAMES}


def __getattr__(name: str) -> Any:
    """SAFETENSORS_DTYPES and DTYPE_NAMES, built from the tables above on first use."""
    if name in _DTYPE_TABLES:
        import torch

        table = {key: getattr(torch, dtype) for key, dtype in _DTYPE_TABLES[name].items()}
        globals()[name] = table
        return table
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


# The course's data (GPT-2's vocabulary files, Tiny Shakespeare, the shipped models): beside the
# package in a clone of the repository.
DATA_DIR = Path(__file__).resolve().parent.parent / "data"


def released_name(config) -> str | None:
    """The name of the released GPT-2 whose sizes `config` (a GPT2Config or a config.json dict)
    has, or None."""
    get = config.get if isinstance(config, dict) else lambda key: getattr(config, key, None)
    if get("vocab_size") != 50257:
        return None
    for name, sizes in GPT2_SIZES.items():
        if all(get(key) == value for key, value in sizes.items()):
            return name
    return None


# --------------------------------------------------------------------------- checks

_EXACT_RANGE_DTYPES = ("int8", "uint8", "int16", "int32", "int64")  # torch dtype names
_SIZE_FIELDS = ("vocab_size", "n_positions", "n_embd", "n_layer", "n_head")
_LARGEST = {
    "vocab_size": 2**21,
    "n_positions": 2**21,
    "n_embd": 2**16,
    "n_layer": 2**12,
    "n_head": 2**12,
}
_DROPOUT_FIELDS = ("embd_pdrop", "attn_pdrop", "resid_pdrop")


def check_whole(
    name: str, value, low: int | None = None, high: int | None = None, *, why: str = ""
) -> int:
    """`value` as an int: a whole number (Python's, numpy's or a one-element integer tensor's;
    never a bool) in low .. high, either bound optional. Otherwise a TypeError or ValueError
    that names the argument, says what it must be and what it got; `why` is added to it."""
    torch = sys.modules.get("torch")  # a tensor can only come from a loaded PyTorch
    if (
        torch is not None
        and isinstance(value, torch.Tensor)
        and value.numel() == 1
        and not (
            value.dtype.is_floating_point or value.dtype.is_complex or value.dtype == torch.bool
        )
    ):
        value = value.item()  # scores.argmax() and the like
    if isinstance(value, bool) or not isinstance(value, numbers.Integral):
        raise TypeError(
            f"{name} must be a whole number, got {value!r} ({type(value).__name__}){why}"
        )
    if low is not None and value < low:
        raise ValueError(f"{name} must be at least {low}, got {value}{why}")
    if high is not None and value > high:
        raise ValueError(f"{name} must be at most {high}, got {value}{why}")
    return int(value)


def check_real(
    name: str,
    value,
    low: float | None = None,
    high: float | None = None,
    *,
    low_inclusive: bool = True,
    high_inclusive: bool = True,
    allow_inf: bool = False,
    why: str = "",
) -> float:
    """`value` as a float: a real number (never a bool) in the range the bounds give; NaN is
    always refused, and so are ±inf unless allow_inf. Errors name the argument as check_whole's
    do."""
    if isinstance(value, bool) or not isinstance(value, numbers.Real):
        raise TypeError(f"{name} must be a number, got {value!r} ({type(value).__name__}){why}")
    value = float(value)
    if math.isnan(value) or (math.isinf(value) and not allow_inf):
        raise ValueError(f"{name} must be a finite number, got {value}{why}")
    below = low is not None and (value < low if low_inclusive else value <= low)
    above = high is not None and (value > high if high_inclusive else value >= high)
    if below or above:
        bounds = _bounds(low, high, low_inclusive, high_inclusive)
        raise ValueError(f"{name} must be {bounds}, got {value:g}{why}")
    return value


def _bounds(low, high, low_inclusive: bool, high_inclusive: bool) -> str:
    if low is not None and high is not None:
        return (
            f"{'>=' if low_inclusive else '>'} {low:g} and "
            f"{'<=' if high_inclusive else '<'} {high:g}"
        )
    if low is not None:
        return f"{'>=' if low_inclusive else '>'} {low:g}"
    return f"{'<=' if high_inclusive else '<'} {high:g}"


def check_path(value: Any, what: str = "folder") -> Path:
    """`value` as a Path (a leading ~ expanded): TypeError unless it is a str or os.PathLike,
    ValueError if it is empty, blank or holds a NUL character."""
    if not isinstance(value, (str, os.PathLike)):
        raise TypeError(f"{what} must be a path (str or pathlib.Path), got {type(value).__name__}")
    text = os.fspath(value)
    if not isinstance(text, str) or not text.strip():
        raise ValueError(f"{what} must be a non-empty text path, got {text!r}")
    if "\0" in text:
        raise ValueError(f"{what} {text!r} holds a NUL character")
    return Path(text).expanduser()


def require_count(name: str, value) -> None:
    """A length or a number of earlier tokens: a whole number >= 0 (not a bool)."""
    if isinstance(value, bool) or not isinstance(value, numbers.Integral) or value < 0:
        raise ValueError(f"{name} must be a whole number >= 0, got {value!r}")


def check_config(config) -> None:
    """Refuse a GPT2Config whose sizes cannot work, with what to change; normalise the types.

    Sizes become int, epsilon and dropouts float. Called by GPT2Config.__post_init__.
    """
    for name in _SIZE_FIELDS:
        # the upper bounds are far past any GPT-2 (or any model of its kind): a size beyond them
        # is a typo that would otherwise fail deep inside PyTorch, or build for minutes first
        setattr(config, name, check_whole(name, getattr(config, name), 1, _LARGEST[name]))
    for name in ("layer_norm_epsilon",) + _DROPOUT_FIELDS:
        value = getattr(config, name)
        if isinstance(value, bool) or not isinstance(value, numbers.Real):
            raise TypeError(f"{name} must be a number, got {value!r} ({type(value).__name__})")
        setattr(config, name, float(value))
    eps = config.layer_norm_epsilon
    if not (eps > 0 and math.isfinite(eps)):  # NaN fails both; inf would zero every output
        raise ValueError(
            f"layer_norm_epsilon must be greater than 0 and finite (GPT-2 uses 1e-5), got {eps}"
        )
    for name in _DROPOUT_FIELDS:
        value = getattr(config, name)
        if not 0.0 <= value < 1.0:  # NaN fails too
            raise ValueError(
                f"{name} is a dropout probability and must be in [0, 1) (0 turns dropout off), got {value}"
            )
    if config.n_embd % config.n_head != 0:
        raise ValueError(
            f"n_embd ({config.n_embd}) must be divisible by n_head ({config.n_head}): "
            "each head gets n_embd // n_head features"
        )


def check_token_ids(idx: torch.Tensor, config, past_length: int = 0) -> None:
    """Raise a clear error unless idx is (B, T) token ids that fit the vocabulary and context.

    Any integer dtype is accepted (int8 ... int64, uint8 ... uint64); bool, float and complex
    are refused. It returns nothing and never converts: callers look the ids up with
    `idx.long()`, since nn.Embedding takes only int32 and int64. The valid range is written
    `0 .. vocab_size-1` in every message. Under torch.compile the values are not read (that
    would break the graph); eager calls check them. `gpt2lib.embeddings` re-exports it.
    """
    import torch

    if not isinstance(idx, torch.Tensor):
        raise TypeError(
            f"token ids must be a torch.Tensor of shape (B, T), got {type(idx).__name__}; "
            "for a list of ids use torch.tensor([ids])"
        )
    if idx.dtype.is_floating_point or idx.dtype.is_complex or idx.dtype == torch.bool:
        raise TypeError(
            f"token ids must be integers, got dtype {idx.dtype}; convert with idx.long()"
        )
    if idx.dim() != 2:
        hint = "; for one sequence use idx.unsqueeze(0)" if idx.dim() == 1 else ""
        raise ValueError(f"token ids must have shape (B, T), got {tuple(idx.shape)}{hint}")
    if idx.shape[0] == 0 or idx.shape[1] == 0:
        raise ValueError(
            f"token ids of shape {tuple(idx.shape)} hold no tokens; give at least one sequence "
            "(B >= 1) of at least one token (T >= 1)"
        )
    require_count("past_length", past_length)
    if past_length + idx.shape[1] > config.n_positions:
        raise ValueError(
            f"{past_length} earlier + {idx.shape[1]} new tokens is longer than the model's "
            f"context of {config.n_positions} (n_positions); crop the input"
        )
    if idx.is_meta or torch.compiler.is_compiling():
        return  # no values to read
    _check_range(idx, config.vocab_size)


def check_token_stream(ids: torch.Tensor, config, name: str = "token ids") -> None:
    """Raise a clear error unless `ids` is a 1-D integer tensor of ids in the vocabulary
    (a training text as one long stream, read once before training starts)."""
    import torch

    if not isinstance(ids, torch.Tensor) or ids.dim() != 1:
        raise ValueError(f"{name} must be a 1-D tensor of token ids")
    if ids.dtype.is_floating_point or ids.dtype.is_complex or ids.dtype == torch.bool:
        raise TypeError(f"{name} must be integers, got dtype {ids.dtype}; convert with ids.long()")
    if len(ids) and not ids.is_meta:
        _check_range(ids, config.vocab_size, what=name)


def token_range(idx: torch.Tensor) -> tuple[int, int]:
    """The smallest and largest id in a non-empty integer tensor, for any integer dtype."""
    import torch

    # PyTorch has no min/max for uint16/32/64: compare those as int64 (uint64 >= 2**63 wraps below 0)
    exact = str(idx.dtype).removeprefix("torch.") in _EXACT_RANGE_DTYPES
    values = idx if exact else idx.to(torch.int64)
    low, high = (int(v) for v in torch.aminmax(values))
    return low, high


def _check_range(idx: torch.Tensor, vocab_size: int, what: str = "token ids") -> None:
    import torch

    low, high = token_range(idx)
    if low < 0 or high >= vocab_size:
        shown = (
            "a value of 2**63 or more"
            if idx.dtype == torch.uint64 and low < 0
            else f"values from {low} to {high}"
        )
        raise ValueError(
            f"{what} must be in 0 .. {vocab_size - 1} (vocab_size={vocab_size}), got {shown}"
        )


def check_model_name(name, sizes) -> str:
    """The key of `sizes` (chapter 2's GPT2Config.SIZES, the one list of model names) that
    `name` names, with or without the hub's 'openai-community/' in front."""
    if not isinstance(name, str):
        raise TypeError(
            f"the model name must be a string such as 'gpt2', got {type(name).__name__}"
        )
    key = name.removeprefix(f"{HUB_ORG}/")
    if key not in sizes:
        raise ValueError(f"unknown model name {name!r}; choose one of {', '.join(sizes)}")
    return key


def check_is_dict(values) -> None:
    if not isinstance(values, dict):
        raise TypeError(
            f"from_dict takes a dict (a parsed config.json), got {type(values).__name__}"
        )
