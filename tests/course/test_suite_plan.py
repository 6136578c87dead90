"""What one run of the suite executes: a solution notebook that the run also drives in JupyterLab
is not executed a second time by nbval (the root conftest.py, run_once_in_lab)."""

from __future__ import annotations

import sys
from pathlib import Path

import browser_support as bs
import pytest

REPO_ROOT = Path(__file__).resolve().parents[2]


def test_solution_chapter_names_only_solution_notebooks():
    assert bs.solution_chapter("solutions/10_finetuning.ipynb::Cell 3") == "10_finetuning"
    assert bs.solution_chapter("notebooks/10_finetuning.ipynb::Cell 3") is None
    assert (
        bs.solution_chapter(
            "tests/course/test_browser.py::test_chapter_runs_in_jupyterlab[10_finetuning]"
        )
        is None
    )
    assert bs.solution_chapter("solutions/old/10_finetuning.ipynb::Cell 3") is None


class Item:
    """What run_once_in_lab reads of a collected test: its id, markers and parameters."""

    def __init__(self, nodeid: str, chapter: str | None = None):
        self.nodeid = nodeid
        if chapter is not None:
            self.callspec = type("Callspec", (), {"params": {"chapter": chapter}})()

    def get_closest_marker(self, name: str):
        return object() if name == "browser" and hasattr(self, "callspec") else None


class Config:
    def __init__(self):
        self.deselected: list[Item] = []
        self.hook = type("Hook", (), {"pytest_deselected": self._deselect})()

    def _deselect(self, items):
        self.deselected += items


def planned(items: list[Item], monkeypatch, chromium: str) -> tuple[list[str], list[str]]:
    """(what runs, what was deselected), as the root conftest plans it."""
    import importlib.util

    spec = importlib.util.spec_from_file_location("root_conftest", REPO_ROOT / "conftest.py")
    root_conftest = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(root_conftest)
    monkeypatch.setenv(bs.CHROMIUM_ENV, chromium)
    config = Config()
    kept = list(items)
    root_conftest.run_once_in_lab(config, kept)
    return [i.nodeid for i in kept], [i.nodeid for i in config.deselected]


def test_a_solution_run_in_jupyterlab_is_not_run_again_by_nbval(monkeypatch):
    pytest.importorskip("playwright.sync_api")
    lab_test = "tests/course/test_browser.py::test_chapter_runs_in_jupyterlab[00_start_here]"
    cells = [f"solutions/00_start_here.ipynb::Cell {i}" for i in range(6)]
    other = ["solutions/01_tokenizer.ipynb::Cell 0", "notebooks/00_start_here.ipynb::Cell 0"]

    def items() -> list[Item]:
        return [Item(lab_test, "00_start_here"), *map(Item, cells + other)]

    # A browser "is here" when GPT2LIB_CHROMIUM names a file.
    kept, dropped = planned(items(), monkeypatch, chromium=sys.executable)
    assert kept == [lab_test, *other] and dropped == cells
    kept, dropped = planned(items(), monkeypatch, str(REPO_ROOT / "no-such-chromium"))
    assert kept == [lab_test, *cells, *other] and dropped == []
    # Without the browser test in the run (`-m "not browser"`), nbval runs the solution.
    kept, dropped = planned([Item(c) for c in cells + other], monkeypatch, sys.executable)
    assert kept == cells + other and dropped == []
