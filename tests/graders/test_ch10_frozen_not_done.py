"""Exercise 10.9b unanswered says "not done yet", like every other check.

The learner's cell of 10.9b assigns `frozen`; until it is answered the name did not exist, so
the check cell, `checks.check_frozen_table(frozen, base_model)`, raised NameError before the
check could run. The chapter's checks module now gives `frozen` a placeholder when the
notebook imports it, and the check turns the placeholder into NotDoneYet.
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

import pytest

from gpt2lib.course.checks import NotDoneYet
from gpt2lib.course.checks import finetuning as checks

REPO_ROOT = Path(__file__).resolve().parents[2]
LEARNER = REPO_ROOT / "notebooks" / "10_finetuning.ipynb"


def test_the_placeholder_is_not_done_yet():
    with pytest.raises(NotDoneYet, match="Exercise 10.9b .*not done yet"):
        checks.check_frozen_table(checks.NOT_ANSWERED, None)


def test_outside_a_notebook_the_import_defines_nothing():
    assert "frozen" not in globals()


def the_learners_cells() -> tuple[str, str, str]:
    """The chapter's import of its checks, 10.9b's stub cell and its check cell, as shipped."""
    cells = [
        "".join(c["source"]) if isinstance(c["source"], list) else c["source"]
        for c in json.loads(LEARNER.read_text(encoding="utf-8"))["cells"]
    ]
    import_line = "from gpt2lib.course.checks import finetuning as checks"
    assert any(import_line in c.splitlines() for c in cells)  # the chapter's own import
    check = next(i for i, c in enumerate(cells) if "checks.check_frozen_table(frozen" in c)
    stub = cells[check - 1]
    assert re.search(r'raise NotImplementedError\(\s*"Exercise 10.9b', stub)
    return import_line, stub, cells[check]


@pytest.mark.slow  # an IPython shell in a subprocess, importing torch
def test_the_shipped_check_cell_says_not_done_yet_in_a_notebook():
    import_line, stub, check = the_learners_cells()
    script = f"""
from IPython.core.interactiveshell import InteractiveShell
shell = InteractiveShell.instance()
shell.user_ns["base_model"] = None
for source in ({import_line!r}, {stub!r}, {check!r}):
    result = shell.run_cell(source)
    print("CELL", type(result.error_in_exec).__name__, str(result.error_in_exec)[:200])
"""
    out = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, timeout=300, cwd=REPO_ROOT
    )
    cells = [line.split(" ", 2)[1:] for line in out.stdout.splitlines() if line.startswith("CELL ")]
    assert [name for name, *_ in cells] == ["NoneType", "NotImplementedError", "NotDoneYet"], (
        out.stdout[-3000:] + out.stderr[-3000:]
    )
    assert "not done yet" in cells[2][1]
