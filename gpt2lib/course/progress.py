"""`python -m gpt2lib.course progress [NN ...]`: which exercises in your notebooks pass.

Each of your notebooks (notebooks/NN_*.ipynb) is run from top to bottom, as "Run All" would,
inside a scratch copy of the course folder: a cell that writes or deletes files changes only
the copy, and your own files are never changed. Long cells run at their short CI setting
(`GPT2LIB_QUICK=1`), with `torch_threads()` PyTorch threads unless OMP_NUM_THREADS says
otherwise. A cell that runs longer than the time limit stops the notebook: the kernel is shut
down and the exercise is reported as timed out.

Grading reads the exception type of each check cell's error (`NotDoneYet`: not started;
`CheckFailed`: failed, with its message); a check cell that runs without an error passed.
Open challenges are listed after the exercises, read the same way from their cells tagged
`challenge`: a clean run is done, `NotDoneYet` or `NotImplementedError` is not done, and
`CheckFailed` (or any other error) means the goal is not reached yet. Challenges are
optional: they do not change the exit status.
Exit status: 0 when every exercise passed, 1 otherwise, 2 when the command could not run.
"""

from __future__ import annotations

import asyncio
import contextlib
import copy
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import nbformat

from gpt2lib.course import mine
from gpt2lib.course.format import (
    Challenge,
    CourseError,
    Exercise,
    challenges,
    chapter_fix,
    exercises,
    first_line,
    read_notebook,
)

__all__ = [
    "DEFAULT_CELL_TIMEOUT",
    "Outcome",
    "Run",
    "execute_copy",
    "grade",
    "grade_challenge",
    "learner_notebooks",
    "report",
    "torch_threads",
]

PASSED, FAILED, NOT_STARTED, NOT_RUN = "passed", "failed", "not started", "not run"
# A challenge's states: its goal met, not started, tried but the goal not reached yet.
DONE, NOT_DONE, NOT_REACHED, NO_CHECK = "done", "not done", "not yet reached", "no check"
SYMBOLS = {
    PASSED: "✅",
    FAILED: "✗ ",
    NOT_STARTED: "⋯ ",
    NOT_RUN: "– ",
    DONE: "✅",
    NOT_DONE: "⋯ ",
    NOT_REACHED: "✗ ",
    NO_CHECK: "○ ",
}
DEFAULT_CELL_TIMEOUT = 600  # seconds; GPT2LIB_PROGRESS_CELL_TIMEOUT or --cell-timeout override
# Not copied into the scratch folder: version control, virtual environments, caches, backups.
_NOT_COPIED = {
    ".git",
    ".hg",
    ".venv",
    "venv",
    "env",
    "node_modules",
    "__pycache__",
    ".ipynb_checkpoints",
    "backups",
    "build",
    "dist",
    ".pytest_cache",
    ".ruff_cache",
}
# Exceptions that mean "this exercise is still the stub".
_NOT_DONE = ("NotDoneYet", "NotImplementedError")


class Outcome:
    """What happened to one exercise."""

    def __init__(self, exercise: Exercise | Challenge, status: str, detail: str = ""):
        self.exercise, self.status, self.detail = exercise, status, detail

    @property
    def title(self) -> str:
        return self.exercise.title


class Run:
    """An executed copy of a notebook and, when it stopped early, where and why."""

    def __init__(self, nb: nbformat.NotebookNode, stopped_at: int | None = None, problem: str = ""):
        self.nb, self.stopped_at, self.problem = nb, stopped_at, problem
        self.package: dict = {}  # the run's record of the learner's package (mygpt2/parts.json)


def torch_threads() -> int:
    """PyTorch threads per kernel when OMP_NUM_THREADS is unset: half the cores this process
    may use, at least 1 and at most 8 (course.py gives JupyterLab's kernels the same). A kernel
    otherwise takes every core: on 2 shared cores chapter 7's training stepped at 3.0-3.4 s
    with two threads and 1.2-1.8 s with one, and chapter 10 ran past the 600 s cell limit."""
    try:
        cores = len(os.sched_getaffinity(0))
    except AttributeError:  # macOS, Windows
        cores = os.cpu_count() or 1
    return max(1, min(8, cores // 2))


def cell_timeout() -> int:
    value = os.environ.get("GPT2LIB_PROGRESS_CELL_TIMEOUT", str(DEFAULT_CELL_TIMEOUT))
    if not value.strip().isascii() or not value.strip().isdigit() or int(value) < 1:
        raise CourseError(
            f"GPT2LIB_PROGRESS_CELL_TIMEOUT={value!r} is not a whole number of seconds, at least 1"
        )
    return int(value)


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
        if not (chapter.isascii() and chapter.isdigit()):
            names = ", ".join(p.stem[:2] for p in available) or "none"
            raise CourseError(f"'{chapter}' is not a chapter number; your notebooks are: {names}")
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


def _error(cell) -> dict | None:
    for output in cell.get("outputs", []):
        if output.get("output_type") == "error":
            return output
    return None


def _first_problem(cells: list[int], checks: list[int], run: Run) -> tuple[str, str] | None:
    """What went wrong from a heading to its last check cell, as (kind, message), or None.

    The first error explains the failure: kind "not done" (the stub), "check failed" (the
    check's own message), "error" (any other exception) or "stopped" (the run ended in that
    cell); then "not run" when the run stopped before the last check, or "check not run"
    when a check cell has no execution count. Exercises and challenges share this walk and
    differ only in what they call each kind."""
    last_check = checks[-1]
    for index in (i for i in cells if i <= last_check):
        error = _error(run.nb.cells[index])
        if error is not None:
            name, message = error.get("ename", "Error"), error.get("evalue", "")
            if name in _NOT_DONE:
                return "not done", ""
            if name == "CheckFailed":
                return "check failed", first_line(message)
            return "error", f"{name}: {first_line(message)}" if message else name
        if index == run.stopped_at:
            return "stopped", f"{run.problem} (cell {index})"
    if run.stopped_at is not None and run.stopped_at < last_check:
        return "not run", f"the notebook stopped at cell {run.stopped_at}"
    if any(run.nb.cells[i].get("execution_count") is None for i in checks):
        return "check not run", ""
    return None


# What each kind of problem `_first_problem` finds makes of an exercise and of a challenge:
# kind -> (status, message); a message of None keeps the walk's own.
_EXERCISE_OUTCOMES = {
    "not done": (NOT_STARTED, ""),
    "not run": (NOT_RUN, None),
    "check not run": (FAILED, "the check cell did not run"),
}
_CHALLENGE_OUTCOMES = {
    "not done": (NOT_DONE, "not done"),
    "not run": (NOT_RUN, None),
    "check not run": (NOT_RUN, "the challenge cell did not run"),
}


def _outcome(item, run: Run, ok: str, outcomes: dict, otherwise: str) -> Outcome:
    problem = _first_problem(item.cells, item.checks, run)
    if problem is None:
        return Outcome(item, ok)
    kind, message = problem
    status, fixed = outcomes.get(kind, (otherwise, None))
    return Outcome(item, status, message if fixed is None else fixed)


def grade(exercise: Exercise, run: Run) -> Outcome:
    """An exercise's outcome, read from the outputs of the executed copy."""
    if not exercise.checks:
        return Outcome(exercise, FAILED, "no check cell follows this exercise")
    return _outcome(exercise, run, PASSED, _EXERCISE_OUTCOMES, FAILED)


def grade_challenge(challenge: Challenge, run: Run) -> Outcome:
    """An open challenge's outcome, read from its `challenge` cells in the executed copy."""
    if not challenge.checks:
        return Outcome(challenge, NO_CHECK, "open: no cell confirms a goal")
    outcome = _outcome(challenge, run, DONE, _CHALLENGE_OUTCOMES, NOT_REACHED)
    if outcome.status == NOT_REACHED and not outcome.detail:
        return Outcome(challenge, NOT_REACHED, NOT_REACHED)
    return outcome


def _ignored(folder: str, names: list[str]) -> set[str]:
    skipped = {n for n in names if n in _NOT_COPIED or n.endswith(".egg-info")}
    # Any virtual environment, whatever its name.
    skipped |= {n for n in names if (Path(folder) / n / "pyvenv.cfg").exists()}
    return skipped


class _Stopped(Exception):
    """Ctrl-C arrived before the kernel could be stopped: raised from a hook to end the run."""


class _Live:
    """The line that shows a chapter's progress while it runs: a bar, the cell being run and
    the time so far, redrawn in place on a terminal (stderr, so the report stays clean)."""

    WIDTH = 20

    def __init__(self, stream, cells: int):
        self.stream, self.cells, self.started = stream, cells, time.monotonic()
        self.done = 0  # code cells started so far
        self.shown = ""

    def cell_started(self) -> None:
        self.done += 1  # called from the thread that runs the notebook; drawn by the other

    def draw(self, final: bool = False) -> None:
        if self.stream is None:
            return
        elapsed = int(time.monotonic() - self.started)
        filled = self.WIDTH * self.done // max(self.cells, 1)
        bar = "#" * filled + "-" * (self.WIDTH - filled)
        verb = "ran" if final else "cell"
        text = (
            f"  [{bar}] {verb} {self.done} of {self.cells} code cells, "
            f"{elapsed // 60}:{elapsed % 60:02d}"
        )
        if text != self.shown or final:
            self.stream.write("\r" + text.ljust(len(self.shown)) + ("\n" if final else ""))
            self.stream.flush()
            self.shown = text


def _kill_kernel(client) -> None:
    """Stop the kernel at once (and whatever it started): the answer to Ctrl-C."""
    manager = getattr(client, "km", None)
    provisioner = getattr(manager, "provisioner", None)
    process = getattr(provisioner, "process", None)
    if process is None or process.poll() is not None:
        return
    if hasattr(os, "killpg"):
        try:
            group = os.getpgid(process.pid)
            # jupyter_client starts the kernel in a session of its own; never signal ours.
            if group != os.getpgid(0):
                os.killpg(group, signal.SIGKILL)
                return
        except OSError:
            pass
    with contextlib.suppress(OSError):
        process.kill()


def execute_copy(
    nb: nbformat.NotebookNode, path: Path, root: Path, timeout: int, live: _Live | None = None
) -> Run:
    """Run notebook `nb`, read from `path`, inside a scratch copy of the course folder `root`.

    The notebook runs in a worker thread, so that Ctrl-C reaches this thread: it stops the
    kernel, waits for the worker to end and raises KeyboardInterrupt, with no kernel left."""
    from nbclient import NotebookClient
    from nbclient.exceptions import CellTimeoutError, DeadKernelError

    with tempfile.TemporaryDirectory(prefix="gpt2lib-progress-") as scratch:
        course = Path(scratch) / "course"
        shutil.copytree(root, course, ignore=_ignored, symlinks=True)
        notebook_dir = course / path.parent.relative_to(root)
        notebook_dir.mkdir(parents=True, exist_ok=True)
        current: list[int] = [-1]  # index of the cell being run
        stop = threading.Event()

        def on_notebook_start(**_):
            if stop.is_set():
                raise _Stopped()

        def on_cell_start(cell, cell_index, **_):
            if stop.is_set():
                raise _Stopped()
            current[0] = cell_index
            if live is not None and cell.cell_type == "code":
                live.cell_started()

        client = NotebookClient(
            copy.deepcopy(nb),
            timeout=timeout,
            interrupt_on_timeout=False,  # an interrupt can be caught by the cell: stop instead
            allow_errors=True,
            kernel_name="python3",
            shutdown_kernel="immediate",  # a cell still running is not waited for
            on_notebook_start=on_notebook_start,
            on_cell_start=on_cell_start,
            resources={"metadata": {"path": str(notebook_dir)}},
        )
        env = dict(os.environ, GPT2LIB_QUICK="1")  # long cells use their short CI setting
        env.setdefault("OMP_NUM_THREADS", str(torch_threads()))
        result: list[Run] = []

        def work() -> None:
            try:
                # The kernel's own console chatter (a TCP notice, C-level warnings) is not the
                # report. asyncio.run, not client.execute: when a cell times out, nbclient
                # cancels its output poller, and only a loop that runs on lets the cancellation
                # finish (else "Task was destroyed but it is pending!" at exit).
                asyncio.run(client.async_execute(stderr=subprocess.DEVNULL, env=env))
                result.append(Run(client.nb))
            except CellTimeoutError:
                result.append(Run(client.nb, current[0], f"timed out after {timeout} s"))
            except DeadKernelError as exc:
                result.append(Run(client.nb, current[0], f"the kernel died ({first_line(exc)})"))
            except Exception as exc:  # the kernel could not start, and the like
                if stop.is_set():
                    return
                result.append(
                    Run(
                        client.nb,
                        current[0] if current[0] >= 0 else -1,
                        f"could not run the notebook: {type(exc).__name__}: {first_line(exc)}",
                    )
                )

        worker = threading.Thread(target=work, name="gpt2lib-progress", daemon=True)
        try:
            worker.start()
            while worker.is_alive():
                worker.join(timeout=0.25)
                if live is not None:
                    live.draw()
        except KeyboardInterrupt:
            stop.set()
            _kill_kernel(client)
            worker.join(timeout=60)  # nbclient notices the dead kernel within a second or two
            raise
        finally:
            if result:
                result[0].package = mine.read_record(course)
            shutil.rmtree(course, ignore_errors=True)  # cells may leave read-only files
        if live is not None:
            live.draw(final=True)
        return result[0]


def report(root: Path, chapters: list[str], out=None, timeout: int | None = None, live=None) -> int:
    """Print every exercise's state, a summary per chapter and a total.

    live: where the progress bar of the chapter being run is drawn (default: stderr when it is
    a terminal; pass a stream to force it, or False for none).
    Returns 0 when every exercise passed, 1 otherwise (the exit status of `progress`)."""
    out = out or sys.stdout
    if live is None:
        live = sys.stderr if sys.stderr is not None and sys.stderr.isatty() else False
    root = Path(root).resolve()
    timeout = timeout or cell_timeout()
    paths = learner_notebooks(root, list(chapters))
    totals = {PASSED: 0, FAILED: 0, NOT_STARTED: 0, NOT_RUN: 0}
    challenge_totals = [0, 0]  # done, listed
    trouble = False
    package = mine.read_record(root)  # the learner's package as the runs below leave it
    for path in paths:
        print(f"{path.stem} (running notebooks/{path.name} ...)", file=out, flush=True)
        try:
            nb = read_notebook(path, chapter_fix(root, path))
        except CourseError as exc:  # the other chapters still run
            print(f"  ! {exc}", file=out)
            print(file=out)
            trouble = True
            continue
        code_cells = sum(cell.cell_type == "code" for cell in nb.cells)
        run = execute_copy(nb, path, root, timeout, _Live(live, code_cells) if live else None)
        if run.problem:
            trouble = True
            where = (
                f"cell {run.stopped_at}"
                if run.stopped_at is not None and run.stopped_at >= 0
                else "the start"
            )
            print(f"  ! {run.problem} at {where}; the cells after it did not run", file=out)
        outcomes = [grade(exercise, run) for exercise in exercises(run.nb)]
        counts = {PASSED: 0, FAILED: 0, NOT_STARTED: 0, NOT_RUN: 0}
        for outcome in outcomes:
            counts[outcome.status] += 1
            line = f"  {SYMBOLS[outcome.status]} {outcome.title}"
            if outcome.status in (FAILED, NOT_RUN):
                line += f" — {outcome.detail}"
            elif outcome.status == NOT_STARTED:
                line += " — not started"
                if outcome.exercise.difficulty:  # what the heading states, to plan by
                    line += (
                        f" ({outcome.exercise.difficulty}, about {outcome.exercise.minutes} min)"
                    )
            print(line, file=out)
        if not outcomes:
            print("  (no exercises in this chapter)", file=out)
        else:
            print(f"  {_summary(counts)}", file=out)
        open_tasks = [grade_challenge(challenge, run) for challenge in challenges(run.nb)]
        for outcome in open_tasks:
            print(
                f"  {SYMBOLS[outcome.status]} {outcome.title} — {outcome.detail or outcome.status}",
                file=out,
            )
        if open_tasks:
            done = sum(o.status == DONE for o in open_tasks)
            challenge_totals[0] += done
            challenge_totals[1] += len(open_tasks)
            print(f"  {_challenge_summary(done, len(open_tasks))}", file=out)
        for key in totals:
            totals[key] += counts[key]
        number = str(int(path.stem[:2]))
        chapter = {n: e for n, e in run.package["exercises"].items() if n.split(".")[0] == number}
        package["exercises"] = {
            n: e for n, e in package["exercises"].items() if n.split(".")[0] != number
        } | chapter
        print(file=out)
    print(mine.parts_line(root, package, mine.ALL_PARTS), file=out)
    total_line = f"Total: {_summary(totals)}"
    if challenge_totals[1]:
        total_line += f"; {_challenge_summary(*challenge_totals)}"
    print(total_line, file=out)
    all_passed = not trouble and totals[PASSED] == sum(totals.values())
    return 0 if all_passed else 1


def _summary(counts: dict[str, int]) -> str:
    total = sum(counts.values())
    text = (
        f"{counts[PASSED]} of {total} exercises passed, "
        f"{counts[FAILED]} failed, {counts[NOT_STARTED]} not started"
    )
    if counts.get(NOT_RUN):
        text += f", {counts[NOT_RUN]} not run"
    return text


def _challenge_summary(done: int, listed: int) -> str:
    return f"{done} of {listed} open challenge{'s' if listed != 1 else ''} done"
