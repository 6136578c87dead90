"""The course's notebook format: the markers, the cell tags, and the one walk over exercises.

The build (`gpt2lib.course`) and the grader (`gpt2lib.progress`) both read notebooks through
this module, so they always agree on what an exercise is. CONTRIBUTING.md describes the
markers for authors. This file is written by hand.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:  # for the annotation only: importing the markers must stay light
    import nbformat

__all__ = [
    "BEGIN",
    "CHECK_TAG",
    "END",
    "EXERCISE_HEADING",
    "EXPORT_TAG",
    "RAISES_TAG",
    "CourseError",
    "Exercise",
    "chapter_fix",
    "exercise_titles",
    "exercises",
    "first_line",
    "read_notebook",
    "solution_regions",
    "tags",
]

BEGIN = "### BEGIN SOLUTION"  # a line opening an answer region inside a code cell
END = "### END SOLUTION"  # the line closing it
EXPORT_TAG = "export"  # cell tag: the cell's code goes into the chapter's module;
# `export:<module>` sends it to gpt2lib/<module>.py instead
CHECK_TAG = "check"  # cell tag: a cell that calls a check (it needs the learner's answer)
RAISES_TAG = "raises-exception"  # nbval's tag; the build adds it to learner notebooks only
# A markdown heading (any level) whose text starts with "Exercise" opens an exercise.
EXERCISE_HEADING = re.compile(r"^\s{0,3}#{1,6}\s*(Exercise\b.*?)\s*$", re.MULTILINE)


class CourseError(Exception):
    """A problem in the course files, reported in one line without a traceback."""


@dataclass
class Exercise:
    """One exercise: its title, and its code cells from its heading up to the next one."""

    title: str
    heading: int  # index of the markdown cell holding the heading
    cells: list[int] = field(default_factory=list)  # code cells, in notebook order
    checks: list[int] = field(default_factory=list)  # those of them tagged `check`


def tags(cell) -> list[str]:
    """A cell's tags (an empty list when it has none)."""
    return list(cell.get("metadata", {}).get("tags", []))


def exercises(nb) -> list[Exercise]:
    """The exercises of a notebook, in order.

    An exercise starts at a markdown cell with an `Exercise ...` heading (the last such
    heading when a cell holds several) and owns every code cell up to the next exercise
    heading. Code cells before the first exercise belong to none.
    """
    found: list[Exercise] = []
    for index, cell in enumerate(nb.cells):
        if cell.cell_type == "markdown":
            headings = EXERCISE_HEADING.findall(cell.source)
            if headings:
                found.append(Exercise(headings[-1].rstrip(":. "), index))
        elif cell.cell_type == "code" and found:
            found[-1].cells.append(index)
            if CHECK_TAG in tags(cell):
                found[-1].checks.append(index)
    return found


def exercise_titles(nb) -> dict[int, str]:
    """Code cell index -> title of the exercise it belongs to."""
    return {index: ex.title for ex in exercises(nb) for index in ex.cells}


def solution_regions(source: str, where: str) -> list[tuple[int, int]]:
    """Line index pairs (begin, end) of every BEGIN/END SOLUTION region in a cell's source."""
    lines = source.split("\n")
    regions, start = [], None
    for i, line in enumerate(lines):
        stripped = line.strip()
        if stripped.startswith(BEGIN):
            if start is not None:
                raise CourseError(f"{where}: '{BEGIN}' inside another solution region")
            start = i
        elif stripped.startswith(END):
            if start is None:
                raise CourseError(f"{where}: '{END}' without a '{BEGIN}' before it")
            regions.append((start, i))
            start = None
    if start is not None:
        raise CourseError(f"{where}: '{BEGIN}' is never closed by '{END}'")
    return regions


# --------------------------------------------------------------------------- reading


def read_notebook(path: Path, fix: str = "") -> "nbformat.NotebookNode":
    """A notebook from disk (UTF-8 JSON); CourseError naming the file and `fix` otherwise."""
    import nbformat  # here: importing the markers must stay light

    try:
        return nbformat.reads(path.read_bytes().decode("utf-8"), as_version=4)
    except UnicodeDecodeError as exc:
        reason = f"it is not UTF-8 text (byte {exc.start})"
    except Exception as exc:  # nbformat raises several types; all mean "not a notebook"
        reason = f"it is not a valid notebook ({type(exc).__name__}: {first_line(exc)})"
    raise CourseError(f"{path} cannot be read: {reason}" + (f"; {fix}" if fix else ""))


def first_line(text) -> str:
    lines = [line for line in str(text).strip().splitlines() if line.strip()]
    return lines[0].strip() if lines else ""


def chapter_fix(root: Path, path: Path) -> str:
    """What a learner can do about an unreadable notebooks/NN_*.ipynb."""
    number = path.name[:2]
    return (f"run `python -m gpt2lib.course restore {number}` to take back a backup, "
            f"or `python -m gpt2lib.course reset {number}` for a fresh copy")
