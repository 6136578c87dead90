"""Shared test set-up, at the repository root so that it also applies when only notebooks
are collected (`python -m pytest solutions/08_real_weights.ipynb`).

Chapters 8 and 9 (real GPT-2 weights) must run offline in CI: once per pytest process we write a small
random checkpoint in the hub's exact layout (2 layers, width 64, GPT-2's real 50,257-token
vocabulary so the real tokenizer works) into a temp folder and point `GPT2LIB_CHECKPOINT` at
it (see checkpoints.install_test_checkpoint). Notebook kernels started by nbval, and JupyterLab
servers started by tests, inherit the environment. With pytest-xdist every worker runs
`pytest_configure` and gets its own copy.

If `GPT2LIB_CHECKPOINT` is already set to an existing folder (say, real GPT-2 weights for a
workshop rehearsal), it is left alone.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent / "tests"))  # tests `import checkpoints`

from checkpoints import install_test_checkpoint, remove_test_checkpoint  # noqa: E402


def pytest_configure(config):
    install_test_checkpoint()


def pytest_unconfigure(config):
    remove_test_checkpoint()


@pytest.fixture(scope="session")
def checkpoint_dir() -> Path:
    """The local checkpoint folder that GPT2LIB_CHECKPOINT points at (hub layout)."""
    return Path(os.environ["GPT2LIB_CHECKPOINT"])
