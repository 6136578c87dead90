"""Shared test set-up, at the repository root so that it also applies when only notebooks
are collected (`python -m pytest solutions/08_real_weights.ipynb`).

Chapters 8 and 9 (real GPT-2 weights) must run offline in CI: once per pytest process we copy
the stand-in, a small GPT-2 trained on Tiny Shakespeare by chapter 7 (data/standin, GPT-2's
real 50,257-token vocabulary), into a temp folder in float32 and point `GPT2LIB_CHECKPOINT` at
it (see checkpoints.install_test_checkpoint; a tiny random checkpoint if data/standin is
missing). Notebook kernels started by nbval, and JupyterLab servers started by tests, inherit
the environment. With pytest-xdist every worker runs `pytest_configure` and gets its own copy.

`GPT2LIB_QUICK=1` (the short CI setting of long notebook cells) is set unless already set.

If `GPT2LIB_CHECKPOINT` is already set to an existing folder (say, real GPT-2 weights for a
workshop rehearsal), it is left alone.

`OMP_NUM_THREADS=1` (one PyTorch thread per process) is set unless already set. The suite
runs two xdist workers, each with notebook kernels, so on a 2-core machine two threads per
process oversubscribe the cores, and PyTorch's waiting threads then slow small operations
down many times over: the full suite took 8 min 1 s with the default threads and 5 min 9 s
with one thread per process, the same 1,803 tests passing.
"""

from __future__ import annotations

import os
import sys
import tempfile
from collections import Counter
from pathlib import Path

import pytest

# Before anything imports torch (checkpoints does): torch reads it when it starts its threads.
os.environ.setdefault("OMP_NUM_THREADS", "1")
# The split routes a developer measured on this machine (python -m gpt2lib.speed tune) must not
# steer the tests' generation: the suite starts without any (tests that need some set them).
os.environ["GPT2LIB_CACHE_DIR"] = tempfile.mkdtemp(prefix="gpt2lib-test-cache-")

sys.path.insert(0, str(Path(__file__).resolve().parent / "tests"))  # tests `import checkpoints`

from checkpoints import (
    install_test_checkpoint,
    make_random_test_checkpoint,
    remove_test_checkpoint,
)


def pytest_configure(config):
    os.environ.setdefault("GPT2LIB_QUICK", "1")  # long notebook cells take their CI setting
    # The learner notebooks run under nbval in the course folder itself: their checks must not
    # write over a learner's own package (mygpt2/). Tests of the package turn it back on.
    os.environ.setdefault("GPT2LIB_LEARNER_PACKAGE", "0")
    install_test_checkpoint()


# The modules that take minutes, first. pytest-xdist (`--dist loadscope`) gives each module to
# one worker, in the collection's order (`--no-loadscope-reorder` in pyproject.toml): the two
# workers start on these and fill in with the short ones. xdist's own order (most tests first)
# left chapter 10's one browser test for last, a 3-minute tail on one worker while the other
# waited.
SLOW_FIRST = (
    "tests/course/test_browser_heavy.py",
    "notebooks/10_finetuning.ipynb",
    "solutions/10_finetuning.ipynb",
    "tests/course/test_setup.py",  # builds a learner's .venv from nothing: minutes, mostly pip's disk work
    "tests/course/test_browser.py",
)


@pytest.hookimpl(trylast=True)  # after -m and -k have deselected what they deselect
def pytest_collection_modifyitems(config, items):
    run_once_in_lab(config, items)
    modules = Counter(item.nodeid.split("::")[0] for item in items)

    def order(item):
        module = item.nodeid.split("::")[0]
        first = SLOW_FIRST.index(module) if module in SLOW_FIRST else len(SLOW_FIRST)
        return first, -modules[module]  # then, as xdist would, the modules with most tests

    items.sort(key=order)  # stable: each module keeps its own order (a notebook's cells)


def pytest_report_header(config):
    import browser_support as bs

    if bs.browser_missing():
        return None  # the browser tests will skip and say why in the summary
    return (
        f"browser tests: {bs.find_chromium()[0]}; a solution notebook that a browser test runs in JupyterLab "
        "is not run a second time by nbval"
    )


def run_once_in_lab(config, items):
    """A solution notebook that this run executes in JupyterLab (tests/course/test_browser.py, when a
    browser is here) is not executed a second time, cell by cell, by nbval. Both runs fail on
    any cell that raises (nbval with --nbval-lax compares no outputs, and the solutions carry
    none); the JupyterLab run also checks the widgets. Chapter 10 alone took about 95 s a run.
    Without a browser, or with `-m "not browser"`, nbval runs every solution as before; the
    learner notebooks always run under nbval."""
    import browser_support as bs

    in_lab = {
        item.callspec.params.get("chapter")
        for item in items
        if item.get_closest_marker("browser") and hasattr(item, "callspec")
    } - {None}
    if not in_lab or bs.browser_missing():
        return
    twice = [item for item in items if bs.solution_chapter(item.nodeid) in in_lab]
    if twice:
        config.hook.pytest_deselected(items=twice)
        items[:] = [item for item in items if bs.solution_chapter(item.nodeid) not in in_lab]


def pytest_unconfigure(config):
    remove_test_checkpoint()


@pytest.fixture(scope="session")
def checkpoint_dir() -> Path:
    """The local checkpoint folder that GPT2LIB_CHECKPOINT points at (hub layout)."""
    return Path(os.environ["GPT2LIB_CHECKPOINT"])


@pytest.fixture(scope="session")
def random_checkpoint_dir() -> Path:
    """A tiny random checkpoint in the hub layout, for tests that need random weights."""
    return make_random_test_checkpoint()


@pytest.fixture(autouse=True)
def no_passes_carried_over():
    """Each test starts with no exercise passed: a check that passed in an earlier test of the
    same worker must not make `mine.yours` pick a later test's learner code."""
    mine = sys.modules.get("gpt2lib.course.mine")
    if mine is not None:
        mine.PASSED.clear()
    yield


@pytest.fixture(autouse=True)
def torch_threads_restored():
    """Each test leaves PyTorch's thread count as it found it. The benchmarks' main() sets
    its own (2 by default), and a worker that kept it oversubscribed the cores for every later
    test, and changed results that depend on the thread count (least squares on nearly
    dependent columns)."""
    torch = sys.modules.get("torch")
    before = torch.get_num_threads() if torch else None
    yield
    torch = sys.modules.get("torch")
    if torch is not None and before is not None and torch.get_num_threads() != before:
        torch.set_num_threads(before)
