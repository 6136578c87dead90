"""The course-format contract (gpt2lib/course/format.py): exercises with their stated
difficulty and time, prediction prompts and open challenges, read the same way by the build,
`progress` and the tests."""

from __future__ import annotations

import io
from pathlib import Path

import nbformat
import pytest
from nbformat.v4 import new_code_cell, new_markdown_cell, new_notebook, new_output

from gpt2lib import course
from gpt2lib.course import format as course_format
from gpt2lib.course import progress
from gpt2lib.course.format import CourseError


def code(source: str, *tags: str):
    return new_code_cell(source, metadata={"tags": list(tags)} if tags else {})


def chapter() -> list:
    return [
        new_markdown_cell("# Chapter 1: a fake chapter"),  # 0
        new_markdown_cell("### Exercise 1.1: add two numbers (difficulty: easy, about 5 min)"),
        code("def add(a, b):\n    ### BEGIN SOLUTION\n    return a + b\n    ### END SOLUTION"),
        code("assert add(2, 3) == 5", "check"),  # 3
        new_markdown_cell("### Predict: what does `add(1, 1)` print?\n\nWrite it down first."),
        code("print(add(1, 1))"),  # 5
        new_markdown_cell("## Exercise 1.2: scale a list (difficulty: Hard, about 30 minutes)"),
        code(
            "def scale(v):\n    ### BEGIN SOLUTION\n    return [2 * x for x in v]\n"
            "    ### END SOLUTION"
        ),
        code("assert scale([1]) == [2]", "check"),  # 8
        new_markdown_cell("### Exercise 1.3: no stated difficulty"),
        code("assert True", "check"),  # 10
        new_markdown_cell("### Challenge: make it fast\n\nGoal: under 10 operations."),
        code("def fast():\n    ### BEGIN SOLUTION\n    return 3\n    ### END SOLUTION"),
        code("assert fast() < 10", "challenge"),  # 13
        new_markdown_cell("#### Prediction 1.2: a second prompt"),
        new_markdown_cell("### Challenge: an open question, no check"),
        code("print('explore')"),  # 16
    ]


def notebook(cells=None) -> nbformat.NotebookNode:
    nb = new_notebook(cells=cells if cells is not None else chapter())
    nb.metadata["kernelspec"] = {
        "name": "python3",
        "display_name": "Python 3",
        "language": "python",
    }
    return nb


def test_exercises_carry_their_stated_difficulty_and_time_outside_the_title():
    found = course_format.exercises(notebook())
    assert [(e.title, e.difficulty, e.minutes, e.cells, e.checks) for e in found] == [
        ("Exercise 1.1: add two numbers", "easy", 5, [2, 3, 5], [3]),
        ("Exercise 1.2: scale a list", "hard", 30, [7, 8], [8]),
        # An exercise ends at the next challenge heading: cells 12-13 are the challenge's.
        ("Exercise 1.3: no stated difficulty", None, None, [10], [10]),
    ]


def test_predictions_are_cells_whose_first_heading_starts_with_predict():
    found = course_format.predictions(notebook())
    assert [(p.title, p.heading, p.answer) for p in found] == [
        ("Predict: what does `add(1, 1)` print?", 4, 5),
        ("Prediction 1.2: a second prompt", 14, 16),
    ]


def test_challenges_own_their_cells_and_are_confirmed_by_challenge_cells():
    found = course_format.challenges(notebook())
    assert [(c.title, c.heading, c.cells, c.checks) for c in found] == [
        ("Challenge: make it fast", 11, [12, 13], [13]),
        ("Challenge: an open question, no check", 15, [16], []),
    ]


def test_a_heading_that_only_mentions_predict_or_challenge_later_is_neither():
    nb = notebook(
        [
            new_markdown_cell("## Some section\n\n### Predict: not the first heading"),
            new_markdown_cell("The challenge of this chapter\n### Challenges ahead"),
            code("x = 1"),
        ]
    )
    assert course_format.predictions(nb) == []
    assert course_format.challenges(nb) == []


@pytest.mark.parametrize(
    "heading",
    [
        "### Exercise 1.1: a (difficulty: trivial, about 5 min)",
        "### Exercise 1.1: a (difficulty: easy)",
        "### Exercise 1.1: a (Difficulty: easy, 5 min)",
    ],
)
def test_a_misstated_difficulty_is_refused_by_the_build(tmp_path, heading):
    nb = notebook([new_markdown_cell(heading), code("assert True", "check")])
    problems = course_format.format_problems(nb, "solutions/01_x.ipynb")
    assert len(problems) == 1 and "(difficulty: easy|medium|hard, about K min)" in problems[0]
    with pytest.raises(CourseError, match=r"solutions/01_x.ipynb, cell 0: .* does not state"):
        course.learner_version(nb, "solutions/01_x.ipynb")


@pytest.mark.parametrize(
    "cells, phrase",
    [
        ([code("assert True", "challenge")], "no '### Challenge' heading comes before it"),
        (
            [new_markdown_cell("### Challenge: x"), code("assert True", "challenge", "check")],
            "tagged both 'check' and 'challenge'",
        ),
        ([code("x = 1"), new_markdown_cell("### Predict: the end")], "has no code cell after it"),
    ],
)
def test_challenge_tags_and_predictions_out_of_place_are_refused(cells, phrase):
    with pytest.raises(CourseError, match=phrase):
        course.learner_version(notebook(cells), "solutions/01_x.ipynb")


def test_learner_version_stubs_a_challenge_region_in_the_challenges_name():
    learner = course.learner_version(notebook(), "solutions/01_x.ipynb")
    assert 'raise NotImplementedError("Challenge: make it fast: replace' in learner.cells[12].source
    assert 'NotImplementedError("Exercise 1.1: add two numbers: replace' in learner.cells[2].source
    # The challenge cell may raise in the learner notebook (nbval), and only there.
    assert "raises-exception" in learner.cells[13].metadata["tags"]
    assert "raises-exception" not in learner.cells[16].metadata.get("tags", [])
    # The learner notebook is read the same way as the solution.
    assert [c.checks for c in course_format.challenges(learner)] == [[13], []]


def error(ename: str, evalue: str = "") -> list:
    return [new_output("error", ename=ename, evalue=evalue, traceback=[])]


@pytest.mark.parametrize(
    "outputs, status, detail",
    [
        (None, "done", ""),
        (error("NotDoneYet", "x"), "not done", "not done"),
        (error("NotImplementedError", "Challenge: make it fast: replace"), "not done", "not done"),
        (
            error("CheckFailed", "Challenge: 14 operations; the goal is under 10\nmore"),
            "not yet reached",
            "Challenge: 14 operations; the goal is under 10",
        ),
        (error("TypeError", "bad"), "not yet reached", "TypeError: bad"),
    ],
)
def test_grade_challenge_reads_the_exception_type(outputs, status, detail):
    nb = notebook()
    for index in (12, 13):
        nb.cells[index].execution_count = 1
    if outputs:
        nb.cells[13].outputs = outputs
    first = course_format.challenges(nb)[0]
    outcome = progress.grade_challenge(first, progress.Run(nb))
    assert (outcome.status, outcome.detail) == (status, detail)


def test_grade_challenge_without_a_check_or_after_the_notebook_stopped():
    nb = notebook()
    first, second = course_format.challenges(nb)
    assert progress.grade_challenge(second, progress.Run(nb)).status == "no check"
    stopped = progress.grade_challenge(first, progress.Run(nb, 7, "timed out after 4 s"))
    assert (stopped.status, stopped.detail) == ("not run", "the notebook stopped at cell 7")


@pytest.mark.slow  # starts a kernel
def test_progress_lists_open_challenges_as_done_or_not(tmp_path: Path):
    cells = [
        new_markdown_cell("# Chapter 1"),
        code("from gpt2lib.course.checks import CheckFailed"),
        new_markdown_cell("### Exercise 1.1: one (difficulty: easy, about 2 min)"),
        code("def one():\n    ### BEGIN SOLUTION\n    return 1\n    ### END SOLUTION"),
        code("assert one() == 1", "check"),
        new_markdown_cell("### Challenge: a small number"),
        code("def small():\n    ### BEGIN SOLUTION\n    return 3\n    ### END SOLUTION"),
        code(
            "if small() >= 10:\n    raise CheckFailed('Challenge', f'{small()} is not under 10')",
            "challenge",
        ),
        new_markdown_cell("### Challenge: a big number"),
        code("def big():\n    ### BEGIN SOLUTION\n    return 100\n    ### END SOLUTION"),
        code("assert big() > 10", "challenge"),
    ]
    (tmp_path / "solutions").mkdir()
    nbformat.write(notebook(cells), str(tmp_path / "solutions" / "01_tokenizer.ipynb"))
    (tmp_path / "gpt2lib").mkdir()
    course.build(tmp_path, out=io.StringIO())
    path = tmp_path / "notebooks" / "01_tokenizer.ipynb"
    learner = nbformat.read(str(path), as_version=4)
    learner.cells[3].source = "def one():\n    return 1"
    learner.cells[6].source = "def small():\n    return 12"  # tried; the goal is not met
    nbformat.write(learner, str(path))
    out = io.StringIO()
    # Challenges are optional: every exercise passed, so the exit status is 0.
    assert progress.report(tmp_path, ["01"], out=out, timeout=60) == 0
    body = [line.strip() for line in out.getvalue().splitlines()]
    assert "✅ Exercise 1.1: one" in body
    assert "✗  Challenge: a small number — Challenge: 12 is not under 10" in body
    assert "⋯  Challenge: a big number — not done" in body
    assert "0 of 2 open challenges done" in body
    assert body[-1] == (
        "Total: 1 of 1 exercises passed, 0 failed, 0 not started; 0 of 2 open challenges done"
    )
