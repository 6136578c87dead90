"""What one run of the suite executes: a solution notebook that the run also drives in JupyterLab
is not executed a second time by nbval (the root conftest.py, run_once_in_lab)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import browser_support as bs
import pytest

REPO_ROOT = Path(__file__).resolve().parent.parent


def test_solution_chapter_names_only_solution_notebooks():
    assert bs.solution_chapter("solutions/10_finetuning.ipynb::Cell 3") == "10_finetuning"
    assert bs.solution_chapter("notebooks/10_finetuning.ipynb::Cell 3") is None
    assert (
        bs.solution_chapter("tests/test_browser.py::test_chapter_runs_in_jupyterlab[10_finetuning]")
        is None
    )
    assert bs.solution_chapter("solutions/old/10_finetuning.ipynb::Cell 3") is None


def collected(*args: str, chromium: str) -> list[str]:
    env = {**os.environ, bs.CHROMIUM_ENV: chromium}
    out = subprocess.run(
        [sys.executable, "-m", "pytest", "--collect-only", "-q", "-n", "0", *args],
        cwd=REPO_ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert out.returncode == 0, out.stdout + out.stderr
    return [line for line in out.stdout.splitlines() if "::" in line]


@pytest.mark.slow
def test_a_solution_run_in_jupyterlab_is_not_run_again_by_nbval():
    pytest.importorskip("playwright.sync_api")
    chapter = "solutions/00_start_here.ipynb"
    lab_test = "tests/test_browser.py::test_chapter_runs_in_jupyterlab[00_start_here]"
    # A browser "is here" when GPT2LIB_CHROMIUM names a file; collection never starts it.
    with_browser = collected(chapter, lab_test, chromium=sys.executable)
    assert with_browser == [lab_test]
    without_browser = collected(chapter, lab_test, chromium=str(REPO_ROOT / "no-such-chromium"))
    assert lab_test in without_browser
    assert sum(nodeid.startswith(chapter + "::") for nodeid in without_browser) > 5
    # Without the browser test in the run (`-m "not browser"`), nbval runs the solution.
    deselected = collected(chapter, lab_test, "-m", "not browser", chromium=sys.executable)
    assert lab_test not in deselected and len(deselected) == len(without_browser) - 1
