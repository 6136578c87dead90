"""`python -m gpt2lib.course progress [NN ...]`: which exercises in your notebooks pass.

Runs a copy of each of your notebooks (notebooks/NN_*.ipynb) from top to bottom, exactly as
"Run All" would, and reads what each exercise's check cell did. Your file is never changed.
This file is written by hand.
"""

from __future__ import annotations

import copy
import os
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import nbformat

from gpt2lib.course import CHECK_TAG, CourseError, _EXERCISE_HEADING, _tags

PASSED, FAILED, NOT_STARTED = "passed", "failed", "not started"
SYMBOLS = {PASSED: "✅", FAILED: "✗ ", NOT_STARTED: "⋯ "}
# Seconds one cell may run before it is interrupted; long chapters read a larger value.
CELL_TIMEOUT = int(os.environ.get("GPT2LIB_PROGRESS_CELL_TIMEOUT", "600"))


@dataclass
class Exercise:
    title: str
    cells: list[int]  # the exercise's code cells, from its heading to the next heading
    checks: list[int]  # those of them tagged `check`
    status: str = NOT_STARTED
    detail: str = ""


def learner_notebooks(root: Path, chapters: list[str]) -> list[Path]:
    """The learner notebooks asked for (all of them when `chapters` is empty)."""
    folder = root / "notebooks"
    available = sorted(folder.glob("[0-9][0-9]_*.ipynb"))
    if not chapters:
        if not available:
            raise CourseError(
                f"no notebooks in {folder}; run `python -m gpt2lib.course reset NN` for a chapter"
            )
        return available
    chosen = []
    for chapter in chapters:
        prefix = chapter.zfill(2) + "_"
        matches = [p for p in available if p.name.startswith(prefix)]
        if not matches:
            solutions = sorted((root / "solutions").glob(f"{prefix}*.ipynb"))
            if solutions:
                raise CourseError(
                    f"you have no notebooks/{solutions[0].name} yet; "
                    f"run `python -m gpt2lib.course reset {chapter}` to get it"
                )
            names = ", ".join(p.stem for p in available) or "none"
            raise CourseError(f"no chapter '{chapter}'; your notebooks are: {names}")
        chosen.extend(m for m in matches if m not in chosen)
    return chosen


def find_exercises(nb: nbformat.NotebookNode) -> list[Exercise]:
    """Exercises in notebook order: each `Exercise` heading and the code cells up to the next."""
    exercises: list[Exercise] = []
    for index, cell in enumerate(nb.cells):
        if cell.cell_type == "markdown":
            headings = _EXERCISE_HEADING.findall(cell.source)
            if headings:
                exercises.append(Exercise(headings[-1].rstrip(":. "), [], []))
        elif cell.cell_type == "code" and exercises:
            exercises[-1].cells.append(index)
            if CHECK_TAG in _tags(cell):
                exercises[-1].checks.append(index)
    return exercises


def _first_line(text: str) -> str:
    lines = [line for line in str(text).strip().splitlines() if line.strip()]
    return lines[0].strip() if lines else ""


def _error(cell) -> dict | None:
    for output in cell.get("outputs", []):
        if output.get("output_type") == "error":
            return output
    return None


def _printed(cell) -> str:
    return "".join(
        o.get("text", "") for o in cell.get("outputs", []) if o.get("output_type") == "stream"
    )


def grade(exercise: Exercise, executed: nbformat.NotebookNode) -> None:
    """Set the exercise's status from the outputs of the executed copy."""
    if not exercise.checks:
        exercise.status, exercise.detail = FAILED, "no check cell follows this exercise"
        return
    checks = [executed.cells[i] for i in exercise.checks]
    if all(_error(c) is None and "✅" in _printed(c) for c in checks):
        exercise.status, exercise.detail = PASSED, ""
        return
    # The first error from the heading to the last check cell explains the failure.
    for index in (i for i in exercise.cells if i <= exercise.checks[-1]):
        error = _error(executed.cells[index])
        if error is None:
            continue
        name, message = error.get("ename", "Error"), error.get("evalue", "")
        if name in ("NotImplementedError", "NotDoneYet"):
            exercise.status, exercise.detail = NOT_STARTED, ""
        elif name in ("CheckFailed",):
            exercise.status, exercise.detail = FAILED, _first_line(message)
        else:
            exercise.status = FAILED
            exercise.detail = f"{name}: {_first_line(message)}" if message else name
        return
    unrun = [c for c in checks if c.get("execution_count") is None]
    if unrun:
        exercise.status, exercise.detail = FAILED, "the check cell did not run"
    else:
        exercise.status, exercise.detail = FAILED, "the check cell printed no ✅ line"


def execute_copy(path: Path, timeout: int = CELL_TIMEOUT) -> tuple[nbformat.NotebookNode, str]:
    """Run an in-memory copy of the notebook in notebooks/; returns it and a problem, if any."""
    from nbclient import NotebookClient
    from nbclient.exceptions import DeadKernelError

    nb = copy.deepcopy(nbformat.read(str(path), as_version=4))
    client = NotebookClient(
        nb,
        timeout=timeout,
        interrupt_on_timeout=True,  # a stuck cell is stopped and the rest still runs
        allow_errors=True,
        kernel_name="python3",
        resources={"metadata": {"path": str(path.parent)}},
    )
    try:
        # The kernel's own console chatter (a TCP notice, C-level warnings) is not the report.
        client.execute(stderr=subprocess.DEVNULL)
    except DeadKernelError as exc:
        return nb, f"the kernel died while running the notebook ({_first_line(exc)})"
    except Exception as exc:  # kernel could not start, and the like
        return nb, f"could not run the notebook: {type(exc).__name__}: {_first_line(exc)}"
    return nb, ""


def report(root: Path, chapters: list[str], out=None, timeout: int = CELL_TIMEOUT) -> int:
    """Print every exercise's state, a summary per chapter and a total; returns 0."""
    out = out or sys.stdout
    paths = learner_notebooks(Path(root), list(chapters))
    totals = {PASSED: 0, FAILED: 0, NOT_STARTED: 0}
    for path in paths:
        print(f"{path.stem} (running notebooks/{path.name} ...)", file=out, flush=True)
        executed, problem = execute_copy(path, timeout)
        if problem:
            print(f"  ! {problem}", file=out)
        exercises = find_exercises(executed)
        counts = {PASSED: 0, FAILED: 0, NOT_STARTED: 0}
        for exercise in exercises:
            grade(exercise, executed)
            counts[exercise.status] += 1
            line = f"  {SYMBOLS[exercise.status]} {exercise.title}"
            if exercise.status == FAILED:
                line += f" — {exercise.detail}"
            elif exercise.status == NOT_STARTED:
                line += " — not started"
            print(line, file=out)
        if not exercises:
            print("  (no exercises in this chapter)", file=out)
        else:
            print(f"  {_summary(counts)}", file=out)
        for key in totals:
            totals[key] += counts[key]
        print(file=out)
    print(f"Total: {_summary(totals)}", file=out)
    return 0


def _summary(counts: dict[str, int]) -> str:
    total = sum(counts.values())
    return (
        f"{counts[PASSED]} of {total} exercises passed, "
        f"{counts[FAILED]} failed, {counts[NOT_STARTED]} not started"
    )
