"""Fixtures and hooks for tests/ (the set-up shared with the notebooks is the root conftest.py).

The shared fixtures build the small models the tests run on: `tiny_config(**sizes)` and
`tiny_model(seed=0, model_cls=..., model_kwargs=..., **sizes)` are factories (2 layers, 2 heads,
width 16, 64 positions, 97 token ids and no dropout unless a test says otherwise), and
`tiny_checkpoint` is one small checkpoint folder in the Hugging Face hub's layout, written once
per session (GPT-2's vocabulary, 2 layers, 4 heads, width 64, 64 positions). Chapter 8's tests
look inside a model loaded the way an experimenter loads one: `small_hub_dir` (a hub checkpoint
of SMALL_SIZES, written once per session), `small_model` (it, loaded once per test module) and
`small_ids` (a (2, 11) batch of its token ids; SMALL_SIZES is in tests/checkpoints.py). The
fixtures import what they need inside: tests/course/test_readme.py runs this file alone in a
bare folder.

A skipped browser test says why in the run's summary, without `-rs`: the browser tests skip
on a machine without Chromium or Playwright, and a dozen bare "s" gave a learner no way to
know that a browser was missing, or how to install one.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

TINY_SIZES = dict(n_layer=2, n_head=2, n_embd=16, n_positions=64, vocab_size=97)


def make_tiny_config(*, pdrop: float = 0.0, **sizes: Any):
    """A GPT2Config of TINY_SIZES with dropout `pdrop` everywhere (none by default); `sizes`
    sets any field."""
    from gpt2lib.chapters.config import GPT2Config

    dropout = dict(embd_pdrop=pdrop, attn_pdrop=pdrop, resid_pdrop=pdrop)
    return GPT2Config(**{**TINY_SIZES, **dropout, **sizes})


def make_tiny_model(
    seed: int = 0,
    model_cls: type | None = None,
    *,
    model_kwargs: dict[str, Any] | None = None,
    **sizes: Any,
):
    """`model_cls` (the chapters' GPT2 by default) on make_tiny_config(**sizes), weights drawn
    from `seed`, in eval mode. `model_kwargs` are the class's own keywords besides the config
    (GPT2's `block_cls`, say): `tiny_model(model_kwargs={"block_cls": MyBlock}, n_layer=3)`."""
    import torch

    from gpt2lib.chapters.model import GPT2

    torch.manual_seed(seed)
    return (model_cls or GPT2)(make_tiny_config(**sizes), **(model_kwargs or {})).eval()


@pytest.fixture(scope="session")  # a factory, stateless: one for the whole run
def tiny_config() -> Callable[..., Any]:
    return make_tiny_config


@pytest.fixture(scope="session")
def tiny_model() -> Callable[..., Any]:
    return make_tiny_model


@pytest.fixture(scope="session")
def tiny_checkpoint(tmp_path_factory) -> Path:
    """A read-only-by-convention checkpoint folder: tests that change files copy it first."""
    from checkpoints import write_hub_checkpoint

    folder = tmp_path_factory.mktemp("tiny-checkpoint")
    return write_hub_checkpoint(folder, n_layer=2, n_head=4, n_embd=64, n_positions=64, seed=0)


@pytest.fixture(scope="session")
def small_hub_dir(tmp_path_factory) -> Path:
    """A checkpoint of SMALL_SIZES in the hub's layout; read-only by convention."""
    from checkpoints import SMALL_SIZES, write_hub_checkpoint

    return write_hub_checkpoint(tmp_path_factory.mktemp("small-hub"), seed=3, **SMALL_SIZES)


@pytest.fixture(scope="module")  # a module's tests may share it; each module gets a fresh one
def small_model(small_hub_dir: Path):
    """small_hub_dir loaded with gpt2lib.from_pretrained on the CPU."""
    from gpt2lib.model import from_pretrained

    return from_pretrained(small_hub_dir, device="cpu")


@pytest.fixture(scope="session")
def small_ids():
    """(2, 11) token ids of SMALL_SIZES's vocabulary, the same in every run."""
    import torch
    from checkpoints import SMALL_SIZES

    generator = torch.Generator().manual_seed(0)
    return torch.randint(0, SMALL_SIZES["vocab_size"], (2, 11), generator=generator)


BROWSER_SKIP_PREFIX = "browser test skipped: "  # what tests/course/test_browser.py puts in front


def skip_reason(report) -> str:
    """The text a skipped test gave pytest.skip(), or '' if there is none."""
    longrepr = report.longrepr
    if isinstance(longrepr, tuple) and len(longrepr) == 3:  # (path, line, "Skipped: reason")
        return str(longrepr[2]).removeprefix("Skipped: ")
    return ""


def browser_skip_lines(reports) -> list[str]:
    """One line per distinct reason the browser tests were skipped, with how many it skipped."""
    counts: dict[str, int] = {}
    for report in reports:
        reason = skip_reason(report)
        if reason.startswith(BROWSER_SKIP_PREFIX):
            reason = reason.removeprefix(BROWSER_SKIP_PREFIX)
            counts[reason] = counts.get(reason, 0) + 1
    return [
        f"{n} browser test{'s' if n != 1 else ''} skipped: {reason} (see the README's Test section)"
        for reason, n in counts.items()
    ]


def pytest_terminal_summary(terminalreporter):
    for line in browser_skip_lines(terminalreporter.stats.get("skipped", [])):
        terminalreporter.write_line(line, yellow=True, bold=True)
