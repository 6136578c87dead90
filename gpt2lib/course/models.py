"""Which model a chapter loads: OpenAI's GPT-2 when it can be had, else a small model that ships.

Hand-written (not generated). Chapters 8 and 9 call it in their loading cells:

    CHECKPOINT = chapter_checkpoint("gpt2")       # a hub name or a local folder, with a banner
    model = from_pretrained(CHECKPOINT)
    circuits = circuits_checkpoint(CHECKPOINT)    # chapter 8's look for induction heads

The order, first match wins:

1. `GPT2LIB_CHECKPOINT` names a folder (the tests, a workshop with its own copy): that folder.
2. The real weights are in the local Hugging Face cache, or the hub answers (they download).
3. Otherwise the stand-in in `data/standin`, with a banner that says what it is, what will
   differ from GPT-2, and the one command that fetches the real weights.

The stand-in writes Shakespeare-shaped text but has no induction head (a few minutes of Tiny
Shakespeare do not reward copying), so chapter 8 looks for circuits in `data/circuits`, a small
attention-only GPT-2 trained to have them (tools/make_circuits.py; tests/library/test_circuits.py
measures them), unless OpenAI's weights are in use; without data/circuits it looks in the model
loaded, and says so.
"""

from __future__ import annotations

import os
from pathlib import Path

from gpt2lib.checkpoint import is_real_gpt2
from gpt2lib.validation import DATA_DIR

__all__ = [
    "CIRCUITS",
    "STANDIN",
    "chapter_checkpoint",
    "circuits_checkpoint",
]

DATA = DATA_DIR
STANDIN = DATA / "standin"
CIRCUITS = DATA / "circuits"
ENV = "GPT2LIB_CHECKPOINT"


def _shipped(folder: Path, what: str) -> Path:
    if not ((folder / "config.json").is_file() and (folder / "model.safetensors").is_file()):
        raise FileNotFoundError(
            f"{what} is missing: {folder} should hold config.json and model.safetensors (they "
            "ship with the course repository; gpt2lib installed elsewhere does not carry them). "
            "Run from a clone of the repository, or set GPT2LIB_CHECKPOINT to a checkpoint folder."
        )
    return folder


def chapter_checkpoint(name: str = "gpt2", *, verbose: bool = True):
    """What a chapter should load: $GPT2LIB_CHECKPOINT, else `name` from cache or hub, else the stand-in.

    Returns a local folder (as a str, like a name typed in a notebook); prints one line saying which model it is, or a banner when
    it falls back to the stand-in.
    """
    from gpt2lib.checkpoint import HubUnreachable, resolve_checkpoint

    chosen = os.environ.get(ENV)
    if chosen:
        folder = resolve_checkpoint(chosen)  # a clear error if the variable names nothing usable
        if verbose:
            kind = "GPT-2's sizes" if is_real_gpt2(folder) else "not OpenAI's GPT-2"
            print(f"model: {folder} (from {ENV}; {kind})")
        return str(folder)
    try:
        folder = resolve_checkpoint(name)
    except HubUnreachable as exc:
        folder = _shipped(STANDIN, "the stand-in")
        if verbose:
            print(_banner(name, getattr(exc, "reason", str(exc))))
        return str(folder)
    if verbose:
        print(f"model: {name}, OpenAI's weights, from {folder}")
    return str(folder)


def circuits_checkpoint(checkpoint, *, verbose: bool = True) -> Path:
    """The model to look for circuits in: `checkpoint` itself if it is OpenAI's GPT-2, else data/circuits."""
    from gpt2lib.checkpoint import resolve_checkpoint

    folder = resolve_checkpoint(checkpoint)
    if is_real_gpt2(folder):
        if verbose:
            print(f"looking for circuits in the model loaded above ({folder})")
        return folder
    if not (CIRCUITS / "model.safetensors").is_file():
        if verbose:
            print(
                "no circuits model in this repository (data/circuits; tools/make_circuits.py "
                "makes one): looking for circuits in the model loaded above, which was not "
                "trained to have them: expect no induction head"
            )
        return folder
    from gpt2lib.checkpoint import read_config_dict

    config = read_config_dict(CIRCUITS)  # a damaged file: a CheckpointError naming it
    if verbose:
        sizes = (
            f"{config.get('n_layer')} layers of {config.get('n_head')} heads, width "
            f"{config.get('n_embd')}"
        )
        print(
            "=" * 78 + "\n"
            "The model loaded above is not OpenAI's GPT-2, so this part uses the circuits model\n"
            f"({CIRCUITS}): GPT-2's code and vocabulary, {sizes},\n"
            "trained on common Tiny Shakespeare tokens to copy: first rows that pay for a\n"
            "previous-token head, then random rows with a segment written twice (tools/\n"
            "make_circuits.py; its README.md and training_record.json say how). It is trained\n"
            "for this part, not to write text, and its heads are fewer and cleaner than\n"
            "GPT-2's. With the real weights this part analyses GPT-2 itself:\n"
            "python -m gpt2lib download gpt2\n" + "=" * 78
        )
    return CIRCUITS


def _banner(name: str, reason: str) -> str:
    return (
        "=" * 78 + "\n"
        f"OFFLINE: the weights of {name!r} are not in the local cache and the hub cannot be\n"
        f"reached ({reason}).\n"
        f"Loading the STAND-IN instead: {STANDIN}\n"
        "  a 4-layer, 128-wide GPT-2 with GPT-2's vocabulary, trained for minutes on Tiny\n"
        "  Shakespeare by chapter 7's code. It is not OpenAI's model: its text is\n"
        "  Shakespeare-shaped nonsense, its loss on ordinary English is far higher, its\n"
        "  heads and figures differ from GPT-2's, and it runs many times faster.\n"
        f"To get the real weights (once, online): python -m gpt2lib download {name}\n"
        "then restart the kernel and run the chapter again.\n" + "=" * 78
    )
