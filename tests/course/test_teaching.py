"""The course's teaching numbers hold for every chapter: size, longest cell, the learner's share,
exercises with difficulty and time, half of them more than transcription, a prediction and a
challenge (tools/teaching_stats.py measures them; this test keeps them from slipping)."""

import importlib.util
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
CHAPTERS = sorted((REPO / "solutions").glob("[0-9][0-9]_*.ipynb"))

_spec = importlib.util.spec_from_file_location(
    "teaching_stats", REPO / "tools" / "teaching_stats.py"
)
teaching_stats = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(teaching_stats)


@pytest.mark.parametrize("path", CHAPTERS, ids=lambda p: p.stem)
def test_chapter_meets_the_teaching_targets(path):
    assert teaching_stats.misses(teaching_stats.stats(path)) == []


def test_the_measure_sees_a_chapter_that_misses(monkeypatch):
    # A chapter of given code only, with one dictated exercise, misses several targets.
    monkeypatch.setattr(teaching_stats, "REWRITTEN", set())  # the older rules only
    row = dict(
        chapter="05_block",
        code=400,
        longest=70,
        inside=0,
        share=0.0,
        exercises=1,
        stated=0,
        thinking=0,
        predict=0,
        challenge=0,
        challenge_cells=0,
    )
    found = teaching_stats.misses(row)
    assert any("code lines > 350" in m for m in found)
    assert any("a cell of 70 lines" in m for m in found)
    assert any("solution share 0% < 20%" in m for m in found)
    assert any("no ### Predict" in m for m in found) and any("no ### Challenge" in m for m in found)


def test_the_learner_writes_a_quarter_of_the_course():
    # At least 25% overall, over chapters 01 on, marker lines counted as code.
    code, inside = teaching_stats.course_share([teaching_stats.stats(p) for p in CHAPTERS])
    assert inside / code >= teaching_stats.LIMITS["overall_share"], f"{inside}/{code}"


def test_marker_lines_count_as_code_not_as_the_learners(tmp_path):
    cell = {
        "cell_type": "code",
        "metadata": {},
        "source": "x = 1\n### BEGIN SOLUTION\ny = 2\n\n### END SOLUTION\n",
    }
    path = tmp_path / "05_x.ipynb"
    path.write_text(__import__("json").dumps({"cells": [cell]}), encoding="utf-8")
    row = teaching_stats.stats(path)
    assert (row["code"], row["inside"]) == (4, 1)


@pytest.mark.parametrize("path", CHAPTERS, ids=lambda p: p.stem)
def test_every_exercise_and_challenge_has_a_cell_that_grades_it(path):
    # `progress` grades an exercise by its `check` cells and a challenge by its `challenge`
    # cells: without one, a learner who finished it is told it failed.
    from gpt2lib.course.format import challenges, exercises, read_notebook

    nb = read_notebook(path)
    assert [t.title for t in exercises(nb) + challenges(nb) if not t.checks] == []


def _notebook(tmp_path, name, cells):
    path = tmp_path / name
    path.write_text(__import__("json").dumps({"cells": cells}), encoding="utf-8")
    return path


def _md(text):
    return {"cell_type": "markdown", "metadata": {}, "source": text}


def _code(text, tags=()):
    return {"cell_type": "code", "metadata": {"tags": list(tags)}, "source": text}


def test_the_measures_of_issue_37_see_what_they_name(tmp_path, monkeypatch):
    """Written predictions, timed challenges, long specs (a hint aside), prose words, minutes,
    and drawing lines left out of the learner's share in a rewritten chapter."""
    spec = " ".join(["word"] * 130)
    path = _notebook(
        tmp_path,
        "05_x.ipynb",
        [
            _md(f"### Exercise 5.1: a (difficulty: easy, about 10 min)\n\nKind: derive.\n\n{spec}"),
            _md(
                "### Exercise 5.2: b (difficulty: hard, about 15 min)\n\nKind: write.\n\nshort.\n"
                f"<details><summary>Hint</summary>\n\n{spec}\n\n</details>"
            ),
            _md("### Predict: the loss"),
            _code("my_prediction = None  # your number"),
            _code("reveal(my_prediction, 1.0, what='the loss')"),
            _md("### Predict: unanswered"),
            _code("print(1)"),
            _md("### Challenge: fast (about 20 min)"),
            _md("### Challenge: untimed"),
            _code("### BEGIN SOLUTION\nx = 1\nprint(x)\nplt.plot([x])\n### END SOLUTION"),
        ],
    )
    monkeypatch.setattr(teaching_stats, "REWRITTEN", set())
    row = teaching_stats.stats(path)
    assert (row["predict"], row["written"]) == (2, 1)
    assert (row["challenge"], row["timed"]) == (2, 1)
    assert row["minutes"] == 10 + 15 + 20
    assert len(row["long_specs"]) == 1 and "5.1" in row["long_specs"][0]
    assert row["words"] > 260 and row["inside"] == 3  # not rewritten: every line counts
    monkeypatch.setattr(teaching_stats, "REWRITTEN", {"05"})
    row = teaching_stats.stats(path)
    assert row["inside"] == 1  # print( and plt. lines are not the learner's code
    found = teaching_stats.rewritten_misses(row)
    assert any("not written down" in m for m in found)
    assert any("does not state its time" in m for m in found)
    assert any("spec over 120 words" in m for m in found)


@pytest.mark.parametrize("path", CHAPTERS, ids=lambda p: p.stem)
def test_a_rewritten_chapter_meets_issue_37s_limits(path):
    if path.stem[:2] not in teaching_stats.REWRITTEN:
        pytest.skip(f"chapter {path.stem[:2]} is not rewritten yet")
    assert teaching_stats.rewritten_misses(teaching_stats.stats(path)) == []


def test_the_course_meets_its_limits():
    assert teaching_stats.course_misses([teaching_stats.stats(p) for p in CHAPTERS]) == []
