"""What a learner sees when a check fails in a notebook: one line, not a traceback through
gpt2lib/course/checks/. Run in a real kernel with nbclient (one kernel for the whole module)."""

from __future__ import annotations

import os
import re
import subprocess
from pathlib import Path

import pytest
from nbclient import NotebookClient
from nbformat.v4 import new_code_cell, new_notebook

REPO_ROOT = Path(__file__).resolve().parents[2]

CELLS = {
    "wrong": "from gpt2lib.course.checks.start_here import check_token_means\n"
    "check_token_means(lambda x: x.sum(dim=-1))",
    "stub": "def token_means(x):\n"
    "    raise NotImplementedError('Exercise 0.1: replace this line with your code')\n"
    "check_token_means(token_means)",
    "learner_bug": "def token_means(x):\n"
    "    return x.mean(dim=5)  # the learner's own mistake\n"
    "check_token_means(token_means)",
    "right": "check_token_means(lambda x: x.mean(dim=-1))",
    "plain_error": "def broken():\n    return {}['missing']\nbroken()",
}


pytestmark = pytest.mark.slow  # one kernel for the module, about 5 s


@pytest.fixture(scope="module")
def outputs() -> dict[str, list]:
    nb = new_notebook(cells=[new_code_cell(source) for source in CELLS.values()])
    nb.metadata["kernelspec"] = {
        "name": "python3",
        "display_name": "Python 3",
        "language": "python",
    }
    client = NotebookClient(
        nb,
        timeout=120,
        allow_errors=True,
        kernel_name="python3",
        resources={"metadata": {"path": str(REPO_ROOT)}},
    )
    client.execute(stderr=subprocess.DEVNULL, env=dict(os.environ))
    return {name: cell.outputs for name, cell in zip(CELLS, nb.cells, strict=True)}


def error_of(cell_outputs: list) -> dict:
    errors = [o for o in cell_outputs if o.output_type == "error"]
    assert len(errors) == 1, cell_outputs
    return errors[0]


def shown(error: dict) -> str:
    """The traceback as the learner reads it, without colour codes."""
    return re.sub(r"\x1b\[[0-9;]*m", "", "\n".join(error["traceback"]))


@pytest.mark.parametrize(
    "name, ename, phrase",
    [
        ("wrong", "CheckFailed", "that is the sum over C"),
        ("stub", "NotDoneYet", "not done yet"),
    ],
)
def test_a_failed_check_is_one_line_without_check_frames(outputs, name, ename, phrase):
    error = error_of(outputs[name])
    # nbval's raises-exception and `course progress` read these two fields.
    assert error["ename"] == ename
    assert phrase in error["evalue"]
    text = shown(error)
    assert "gpt2lib/course/checks" not in text and "_core.py" not in text
    assert len(error["traceback"]) == 1 and phrase in text and ename in text


def test_an_error_in_learner_code_shows_their_frames_but_not_the_checks(outputs):
    error = error_of(outputs["learner_bug"])
    assert error["ename"] == "IndexError"
    text = shown(error)
    assert "x.mean(dim=5)" in text  # the learner's line is still shown, to debug it
    assert "gpt2lib/course/checks" not in text and "call_learner" not in text


def test_a_passing_check_and_other_errors_are_untouched(outputs):
    assert not [o for o in outputs["right"] if o.output_type == "error"]
    assert "✅" in "".join(o.get("text", "") for o in outputs["right"])
    # An error that has nothing to do with a check keeps IPython's usual traceback.
    error = error_of(outputs["plain_error"])
    assert error["ename"] == "KeyError"
    assert "broken()" in shown(error) and len(error["traceback"]) > 1
