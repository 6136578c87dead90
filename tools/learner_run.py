"""Run the learner notebooks as a learner who finished every exercise would, and grade them.

    python tools/learner_run.py            # every chapter
    python tools/learner_run.py 03 07      # some chapters

Each stub in notebooks/NN_*.ipynb (the `raise NotImplementedError("...: replace this line with
your code")` line that the build writes for a solution region) is replaced by that region's
answer from solutions/NN_*.ipynb, and the filled notebook is run top to bottom by the same
machinery as `python -m gpt2lib.course progress` (a scratch copy of the course folder, the
short CI setting). It prints each exercise's grade and every cell that raised, and exits 1
when an exercise did not pass, a challenge was not done, or any cell raised: a finished
learner notebook must run clean. With --one-course the chapters run in order in one scratch
course, as a learner works: what each chapter's passed checks put into mygpt2/ is what the later
chapters run, and the lines saying whose parts ran are printed. This is issue #21's "verified by running the chapters as a
learner would, with the learner notebooks filled in"; the course's tests run the solutions and
the unfinished notebooks, not this.
"""

from __future__ import annotations

import argparse
import os
import re
import shutil
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from gpt2lib.course import STUB, exported_code  # noqa: E402
from gpt2lib.course import mine as package  # noqa: E402
from gpt2lib.course.format import challenges, exercises, read_notebook, solution_regions  # noqa: E402
from gpt2lib.course.progress import (  # noqa: E402
    DONE,
    PASSED,
    _ignored,
    cell_timeout,
    execute_copy,
    grade,
    grade_challenge,
    learner_notebooks,
)


def filled(learner, solution, where: str, leave: frozenset[str] = frozenset()):
    """The learner notebook with each stub replaced by the solution's answer, in order; the
    exercises in `leave` ("5.2") keep their stubs, as a learner who has not done them yet."""
    unfinished = {
        index
        for exercise in exercises(solution)
        if package.exercise_number(exercise.title) in leave
        for index in exercise.cells
    }
    for index, (mine, answer) in enumerate(zip(learner.cells, solution.cells)):
        if mine.cell_type != "code" or index in unfinished:
            continue
        regions = solution_regions(answer.source, f"{where}, cell {index}")
        stubs = list(STUB.finditer(mine.source))
        if len(stubs) != len(regions):
            raise SystemExit(
                f"{where}, cell {index}: {len(stubs)} stubs for {len(regions)} "
                f"solution regions; run `python -m gpt2lib.course build`"
            )
        if not regions:
            continue
        answer_lines = answer.source.split("\n")
        text = mine.source
        for stub, (begin, end) in reversed(list(zip(stubs, regions))):
            text = (
                text[: stub.start()] + "\n".join(answer_lines[begin + 1 : end]) + text[stub.end() :]
            )
        mine.source = text
        # the filled cell is the solution's code without the markers: anything else is drift
        if mine.source.strip("\n") != exported_code(answer.source, where):
            raise SystemExit(
                f"{where}, cell {index}: the learner cell differs from the solution "
                f"outside its answers; run `python -m gpt2lib.course build`"
            )
    return learner


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("chapters", nargs="*", help="chapter numbers (default: all)")
    parser.add_argument(
        "--one-course",
        action="store_true",
        help="run the chapters in order in one scratch course, as a learner does: what each "
        "chapter's passed checks write into mygpt2/ is what the later chapters run; prints "
        "each chapter's lines about whose parts ran",
    )
    parser.add_argument(
        "--answer",
        action="append",
        default=[],
        metavar="NAME=FILE",
        help="your own answer: the cell that defines NAME becomes FILE's code (a learner's "
        "attention written another way, say); repeatable",
    )
    parser.add_argument(
        "--leave",
        default="",
        help="exercises to leave unfinished, comma-separated (--leave 5.1,5.2)",
    )
    args = parser.parse_args(argv)
    leave = frozenset(n.strip() for n in args.leave.split(",") if n.strip())
    global ANSWERS
    ANSWERS = {}
    for item in args.answer:
        name, _, file = item.partition("=")
        ANSWERS[name] = Path(file).read_text(encoding="utf-8")
    if args.one_course:
        with tempfile.TemporaryDirectory(prefix="gpt2lib-learner-run-") as scratch:
            course = Path(scratch) / "course"
            shutil.copytree(ROOT, course, ignore=_ignored, symlinks=True)
            shutil.rmtree(course / package.PACKAGE, ignore_errors=True)  # start as a new learner
            os.environ["GPT2LIB_LEARNER_PACKAGE"] = "1"
            return run_chapters(course, args.chapters, leave)
    return run_chapters(ROOT, args.chapters, leave)


ANSWERS: dict[str, str] = {}  # --answer: a defined name -> the code of the cell that defines it


def with_answers(nb):
    """The notebook with each --answer's code in place of the cell that defines its name."""
    import ast

    for cell in nb.cells:
        if cell.cell_type != "code":
            continue
        try:
            tree = ast.parse(cell.source)
        except SyntaxError:
            continue
        defined = {n.name for n in tree.body if hasattr(n, "name")}
        for name, code in ANSWERS.items():
            if name in defined:
                cell.source = code
    return nb


WHOSE = re.compile(
    r"^(Your GPT-2|\(the model below is built with my|note: Exercise .* has not passed|.*logit.*(differ|distance))"
)


def run_chapters(root: Path, chapters: list[str], leave: frozenset[str] = frozenset()) -> int:
    """Run the filled learner notebooks of `root`; in a scratch course (--one-course), each
    chapter's package record is carried into the next."""
    failed = False
    for path in learner_notebooks(root, chapters):
        solution = read_notebook(root / "solutions" / path.name)
        nb = with_answers(filled(read_notebook(path), solution, f"notebooks/{path.name}", leave))
        run = execute_copy(nb, path, root, cell_timeout())
        print(f"{path.stem}" + (f": {run.problem} at cell {run.stopped_at}" if run.problem else ""))
        if root != ROOT:  # carry this chapter's part of the learner's package to the next
            number = str(int(path.stem[:2]))
            ran = {n: e for n, e in run.package["exercises"].items() if n.split(".")[0] == number}
            package.put_back_chapter_part(root, int(number), ran)
            for cell in run.nb.cells:
                for output in cell.get("outputs", []):
                    for line in str(output.get("text", "")).splitlines():
                        if WHOSE.match(line):
                            print(f"  | {line}")
        failed |= bool(run.problem)
        for outcome in [grade(e, run) for e in exercises(run.nb)] + [
            grade_challenge(c, run) for c in challenges(run.nb)
        ]:
            left = package.exercise_number(outcome.title) in leave
            ok = outcome.status in (PASSED, DONE) or left
            failed |= not ok
            print(
                f"  {'ok  ' if ok else 'FAIL'} {outcome.title}"
                + ("" if ok else f" ({outcome.status}: {outcome.detail})")
            )
        left_cells = {
            index
            for exercise in exercises(solution)
            if package.exercise_number(exercise.title) in leave
            for index in exercise.cells
        }
        for index, cell in enumerate(run.nb.cells):
            for output in cell.get("outputs", []):
                if output.get("output_type") == "error" and index not in left_cells:
                    failed = True
                    print(
                        f"  cell {index} raised {output.get('ename')}: "
                        f"{str(output.get('evalue', '')).splitlines()[:1]}"
                    )
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
