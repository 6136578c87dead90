"""The course's notebook format: the markers, the cell tags, and the one walk over a chapter.

A chapter holds three kinds of learner task, each opened by a markdown heading:

- an exercise, `### Exercise N.M: title (difficulty: easy|medium|hard, about K min)`, whose
  answer sits in solution regions and is graded by the cells tagged `check` after it;
- a prediction prompt, a markdown cell whose first heading starts with `Predict`; the code
  cell after it shows the answer;
- an open challenge, a markdown cell whose first heading starts with `Challenge`; a code cell
  tagged `challenge` after it confirms the goal (it passes, or raises `CheckFailed`).

The build (`gpt2lib.course`), the grader (`gpt2lib.course.progress`) and the tests all read
notebooks through `exercises`, `predictions` and `challenges`, so they agree on what each one
is. CONTRIBUTING.md describes the markers for authors.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:  # for the annotation only: importing the markers must stay light
    import nbformat

__all__ = [
    "CHAPTER_MODULES",
    "exported_code",
    "BEGIN",
    "CHALLENGE_HEADING",
    "CHALLENGE_TAG",
    "CHECK_TAG",
    "END",
    "EXERCISE_HEADING",
    "EXPORT_TAG",
    "RAISES_TAG",
    "DIFFICULTIES",
    "PREDICT_HEADING",
    "Challenge",
    "CourseError",
    "Exercise",
    "Prediction",
    "chapter_fix",
    "challenges",
    "exercise_titles",
    "exercises",
    "first_line",
    "format_problems",
    "predictions",
    "read_notebook",
    "region_titles",
    "solution_regions",
    "split_difficulty",
    "tags",
]

BEGIN = "### BEGIN SOLUTION"  # a line opening an answer region inside a code cell
END = "### END SOLUTION"  # the line closing it
EXPORT_TAG = "export"  # cell tag: the cell's code goes into the chapter's module;
# `export:<module>` sends it to gpt2lib/<module>.py instead
CHECK_TAG = "check"  # cell tag: a cell that calls a check (it needs the learner's answer)
CHALLENGE_TAG = "challenge"  # cell tag: a cell that confirms an open challenge's goal
RAISES_TAG = "raises-exception"  # nbval's tag; the build adds it to learner notebooks only
# A markdown heading (any level) whose text starts with "Exercise" opens an exercise.
EXERCISE_HEADING = re.compile(r"^\s{0,3}#{1,6}\s*(Exercise\b.*?)\s*$", re.MULTILINE)
# Any markdown heading; a cell's first one decides whether it is a prediction or a challenge.
_ANY_HEADING = re.compile(r"^\s{0,3}#{1,6}\s+(.*?)\s*#*\s*$", re.MULTILINE)
PREDICT_HEADING = re.compile(r"^Predict")  # "Predict ...", "Prediction ..."
CHALLENGE_HEADING = re.compile(r"^Challenge\b")
DIFFICULTIES = ("easy", "medium", "hard")
# "(difficulty: medium, about 15 min)" at the end of an exercise heading.
_DIFFICULTY = re.compile(
    r"(?i)\s*\(\s*difficulty:\s*(?P<level>[A-Za-z]+)\s*,\s*about\s+"
    r"(?P<minutes>\d+)\s*min(?:utes)?\s*\)\s*$"
)
_LOOKS_LIKE_DIFFICULTY = re.compile(r"\(\s*difficulty\b", re.IGNORECASE)


class CourseError(Exception):
    """A problem in the course files, reported in one line without a traceback."""


@dataclass
class Exercise:
    """One exercise: its title, and its code cells from its heading up to the next exercise
    or challenge heading."""

    title: str  # "Exercise 1.2: apply merges by rank", without the difficulty and time
    heading: int  # index of the markdown cell holding the heading
    cells: list[int] = field(default_factory=list)  # code cells, in notebook order
    checks: list[int] = field(default_factory=list)  # those of them tagged `check`
    difficulty: str | None = None  # "easy", "medium" or "hard", as the heading states
    minutes: int | None = None  # the heading's expected time ("about K min")


@dataclass
class Prediction:
    """A prompt to write down a prediction before running the code cell after it."""

    title: str  # the heading's text, "Predict: ..."
    heading: int  # index of the markdown cell
    answer: int | None = None  # the first code cell after the prompt (it shows the answer)


@dataclass
class Challenge:
    """An open task; the cells tagged `challenge` after its heading confirm its goal."""

    title: str  # the heading's text, "Challenge: ..."
    heading: int  # index of the markdown cell
    cells: list[int] = field(
        default_factory=list
    )  # code cells up to the next exercise or challenge
    checks: list[int] = field(default_factory=list)  # those of them tagged `challenge`


def tags(cell) -> list[str]:
    """A cell's tags (an empty list when it has none)."""
    return list(cell.get("metadata", {}).get("tags", []))


def _first_heading(source: str) -> str | None:
    match = _ANY_HEADING.search(source)
    return match.group(1) if match else None


def _task_heading(cell) -> tuple[str, str] | None:
    """("exercise" | "prediction" | "challenge", heading text) for a markdown cell that opens
    a task, else None. An exercise heading anywhere in the cell counts (the last one, when a
    cell holds several); a prediction or a challenge is the cell's first heading."""
    if cell.cell_type != "markdown":
        return None
    first = _first_heading(cell.source)
    if first is not None and CHALLENGE_HEADING.match(first):
        return "challenge", first.rstrip(":. ")
    headings = EXERCISE_HEADING.findall(cell.source)
    if headings:
        return "exercise", headings[-1].rstrip(":. ")
    if first is not None and PREDICT_HEADING.match(first):
        return "prediction", first.rstrip(":. ")
    return None


def split_difficulty(heading: str) -> tuple[str, str | None, int | None]:
    """(title, difficulty, minutes) of an exercise heading; (heading, None, None) when it
    states no difficulty in the course's form."""
    match = _DIFFICULTY.search(heading)
    if match is None or match["level"].lower() not in DIFFICULTIES:
        return heading, None, None
    return heading[: match.start()].rstrip(":. "), match["level"].lower(), int(match["minutes"])


def _walk(nb) -> tuple[list[Exercise], list[Prediction], list[Challenge]]:
    found_exercises: list[Exercise] = []
    found_predictions: list[Prediction] = []
    found_challenges: list[Challenge] = []
    owner: Exercise | Challenge | None = None  # who the next code cells belong to
    waiting: list[Prediction] = []  # predictions whose answer cell is still ahead
    for index, cell in enumerate(nb.cells):
        task = _task_heading(cell)
        if task is not None:
            kind, text = task
            if kind == "exercise":
                title, difficulty, minutes = split_difficulty(text)
                owner = Exercise(title, index, difficulty=difficulty, minutes=minutes)
                found_exercises.append(owner)
            elif kind == "challenge":
                owner = Challenge(text, index)
                found_challenges.append(owner)
            else:  # a prediction sits inside whatever exercise or challenge it follows
                waiting.append(Prediction(text, index))
                found_predictions.append(waiting[-1])
        elif cell.cell_type == "code":
            for prediction in waiting:
                prediction.answer = index
            waiting = []
            if owner is None:
                continue
            owner.cells.append(index)
            tag = CHECK_TAG if isinstance(owner, Exercise) else CHALLENGE_TAG
            if tag in tags(cell):
                owner.checks.append(index)
    return found_exercises, found_predictions, found_challenges


def exercises(nb) -> list[Exercise]:
    """The exercises of a notebook, in order.

    An exercise starts at a markdown cell with an `Exercise ...` heading (the last such
    heading when a cell holds several) and owns every code cell up to the next exercise or
    challenge heading. Code cells before the first exercise belong to none. Its title leaves
    out the stated difficulty and time, which are in `difficulty` and `minutes`.
    """
    return _walk(nb)[0]


def predictions(nb) -> list[Prediction]:
    """The prediction prompts of a notebook, in order: markdown cells whose first heading
    starts with `Predict`."""
    return _walk(nb)[1]


def challenges(nb) -> list[Challenge]:
    """The open challenges of a notebook, in order: markdown cells whose first heading starts
    with `Challenge`. Each owns the code cells up to the next exercise or challenge heading;
    those tagged `challenge` confirm its goal."""
    return _walk(nb)[2]


def exercise_titles(nb) -> dict[int, str]:
    """Code cell index -> title of the exercise it belongs to."""
    return {index: ex.title for ex in exercises(nb) for index in ex.cells}


def region_titles(nb) -> dict[int, str]:
    """Code cell index -> title of the exercise or challenge it belongs to (what a stub names)."""
    found, _, open_tasks = _walk(nb)
    return {index: task.title for task in [*found, *open_tasks] for index in task.cells}


def format_problems(nb, where: str) -> list[str]:
    """What breaks the course's convention in a solution notebook (empty when fine): an
    exercise heading whose difficulty is not in the form "(difficulty: easy|medium|hard,
    about K min)", a cell tagged `challenge` outside a challenge, a challenge cell that is
    also a `check` cell, and a prediction with no code cell after it."""
    problems = []
    found, prompts, open_tasks = _walk(nb)
    for exercise in found:
        heading = EXERCISE_HEADING.findall(nb.cells[exercise.heading].source)[-1]
        if exercise.difficulty is None and _LOOKS_LIKE_DIFFICULTY.search(heading):
            problems.append(
                f"{where}, cell {exercise.heading}: '{heading}' does not state its "
                f"difficulty as '(difficulty: easy|medium|hard, about K min)'"
            )
    in_challenge = {index for task in open_tasks for index in task.cells}
    for index, cell in enumerate(nb.cells):
        if cell.cell_type != "code" or CHALLENGE_TAG not in tags(cell):
            continue
        if index not in in_challenge:
            problems.append(
                f"{where}, cell {index}: tagged '{CHALLENGE_TAG}' but no "
                f"'### Challenge' heading comes before it"
            )
        if CHECK_TAG in tags(cell):
            problems.append(
                f"{where}, cell {index}: tagged both '{CHECK_TAG}' and "
                f"'{CHALLENGE_TAG}'; a cell grades an exercise or a challenge"
            )
    for prompt in prompts:
        if prompt.answer is None:
            problems.append(
                f"{where}, cell {prompt.heading}: '{prompt.title}' has no code cell "
                f"after it to show the answer"
            )
    return problems


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


def read_notebook(path: Path, fix: str = "") -> nbformat.NotebookNode:
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
    return (
        f"run `python -m gpt2lib.course restore {number}` to take back a backup, "
        f"or `python -m gpt2lib.course reset {number}` for a fresh copy"
    )


# --------------------------------------------------------------------------- export cells

# Which module of gpt2lib/chapters/ a chapter's `export` cells go to; `export:<name>` overrides
# per cell. The hand-written entry points beside the folder (gpt2lib/tokenizer.py around bpe,
# training.py, inspection.py, generation.py, finetune.py, ...) are not the build's.
CHAPTER_MODULES = {
    "00_start_here": None,
    "01_tokenizer": "bpe",
    "02_embeddings": "embeddings",
    "03_attention": "attention",
    "04_mlp": "mlp",
    "05_block": "block",
    "06_model": "model",
    "07_training": "training",
    "08_real_weights": "interpret",  # and export:weights
    "09_generation": "decoding",
    "10_finetuning": "tuning",
    "11_scaling": None,  # exports nothing: gpt2lib.scaling and gpt2lib.tokenfile are hand-written
}


def exported_code(cell_source: str, where: str) -> str:
    """An export cell's code with the solution markers removed and the answers kept."""
    regions = solution_regions(cell_source, where)
    marker_lines = {i for pair in regions for i in pair}
    lines = [line for i, line in enumerate(cell_source.split("\n")) if i not in marker_lines]
    return "\n".join(lines).strip("\n")


def _export_module(cell_tags: list[str], default: str | None, where: str) -> str | None:
    targets = [t for t in cell_tags if t == EXPORT_TAG or t.startswith(EXPORT_TAG + ":")]
    if not targets:
        return None
    if len(targets) > 1:
        raise CourseError(f"{where}: more than one export tag {targets}")
    tag = targets[0]
    if tag == EXPORT_TAG:
        if default is None:
            raise CourseError(f"{where}: tagged '{EXPORT_TAG}' but the chapter has no module")
        return default
    module = tag.split(":", 1)[1]
    if not module.isidentifier():
        raise CourseError(f"{where}: '{tag}' does not name a Python module")
    return module
