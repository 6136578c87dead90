"""The one-source build tool (gpt2lib/course/__init__.py), tested on a tiny fake course in tmp_path.

The real chapters are still being written, so every test here builds its own `solutions/`
and `gpt2lib/` folders; only `test_real_repository_is_consistent` looks at the real repo.
"""

from __future__ import annotations

import datetime as real_datetime
import io
import subprocess
import sys
import types
from pathlib import Path

import nbformat
import pytest
from nbformat.v4 import new_code_cell, new_markdown_cell, new_notebook, new_output

from gpt2lib import course
from gpt2lib.course import CourseError, progress
from gpt2lib.course import format as course_format

REPO_ROOT = course.REPO_ROOT

EXERCISE_1_1 = '''def add(a, b):
    """Sum of a and b."""
    ### BEGIN SOLUTION
    total = a + b
    return total
    ### END SOLUTION'''

EXERCISE_1_2 = """class Scaler:
    def __init__(self, factor):
        self.factor = factor

    def apply(self, values):
        if not values:
            ### BEGIN SOLUTION
            return []
            ### END SOLUTION
        ### BEGIN SOLUTION
        return [v * self.factor for v in values]
        ### END SOLUTION"""


def code(source: str, *tags: str, outputs=None, execution_count=None):
    cell = new_code_cell(source, metadata={"tags": list(tags)} if tags else {})
    if outputs:
        cell.outputs = outputs
        cell.execution_count = execution_count or 1
    return cell


def chapter_01() -> list:
    """Cells of a small chapter 01: two exercises, export cells, a check cell per exercise."""
    return [
        new_markdown_cell("# Chapter 1: a fake chapter"),
        code("import math\n\nSCALE = 2", "export"),
        new_markdown_cell("### Exercise 1.1: add two numbers\n\nWrite `add`."),
        code(EXERCISE_1_1, "export"),
        code("assert add(2, 3) == 5\nprint('✅ Exercise 1.1 passed')", "check"),
        new_markdown_cell("Some prose first.\n\n## Exercise 1.2: scale a list.\n\nMore prose."),
        code(EXERCISE_1_2),
        code("assert Scaler(2).apply([1, 2]) == [2, 4]", "check", "nbval-ignore-output"),
        code("VOCAB_SIZE = 50257", "export:config"),
        code("print(SCALE * 3)", outputs=[new_output("stream", name="stdout", text="6\n")]),
    ]


def chapter_02() -> list:
    return [
        new_markdown_cell("# Chapter 2"),
        code(
            "from gpt2lib.chapters.bpe import add\n\n\ndef twice(x):\n    return add(x, x)",
            "export",
        ),
        code("N_EMBD = 768", "export:config"),
    ]


def write_notebook(path: Path, cells: list) -> None:
    nb = new_notebook(cells=cells)
    nb.metadata["kernelspec"] = {
        "name": "python3",
        "display_name": "Python 3",
        "language": "python",
    }
    nb.metadata["widgets"] = {"application/vnd.jupyter.widget-state+json": {"state": {}}}
    path.parent.mkdir(parents=True, exist_ok=True)
    nbformat.write(nb, str(path))


@pytest.fixture
def fake_course(tmp_path: Path) -> Path:
    """A course folder with chapters 01 and 02 and one hand-written module."""
    write_notebook(tmp_path / "solutions" / "01_tokenizer.ipynb", chapter_01())
    write_notebook(tmp_path / "solutions" / "02_embeddings.ipynb", chapter_02())
    (tmp_path / "gpt2lib").mkdir()
    (tmp_path / "gpt2lib" / "helper.py").write_text(
        "# written by hand\nVALUE = 1\n", encoding="utf-8"
    )
    (tmp_path / "notebooks").mkdir()
    return tmp_path


def build(root: Path) -> list[Path]:
    """Build the fake course; what build prints is appended to build.log."""
    with open(root / "build.log", "a", encoding="utf-8") as log:
        return course.build(root, out=log)


def read(path: Path) -> nbformat.NotebookNode:
    return nbformat.read(str(path), as_version=4)


def set_source(path: Path, index: int, source: str) -> None:
    nb = read(path)
    nb.cells[index].source = source
    nbformat.write(nb, str(path))


# --------------------------------------------------------------------------- learner version


def test_learner_stub_replaces_region_keeps_indentation_and_names_exercise(fake_course):
    build(fake_course)
    learner = read(fake_course / "notebooks" / "01_tokenizer.ipynb")
    nbformat.validate(learner)

    lines = learner.cells[3].source.split("\n")
    assert lines[:2] == EXERCISE_1_1.split("\n")[:2]  # code outside the region is kept
    assert len(lines) == 3
    assert lines[2].startswith('    raise NotImplementedError("Exercise 1.1: add two numbers')
    assert "total = a + b" not in learner.cells[3].source

    # The stub runs: the definition succeeds and only a call raises, naming the exercise.
    namespace: dict = {}
    exec(learner.cells[3].source, namespace)
    with pytest.raises(NotImplementedError, match=r"^Exercise 1\.1: add two numbers"):
        namespace["add"](1, 2)


def test_each_region_gets_its_own_stub_named_after_the_nearest_heading(fake_course):
    build(fake_course)
    source = read(fake_course / "notebooks" / "01_tokenizer.ipynb").cells[6].source
    stubs = [match.group(0) for match in course.STUB.finditer(source)]  # a long one: 3 lines
    assert len(stubs) == 2
    # Indentation of each `### BEGIN SOLUTION` line is kept (12 and 8 spaces).
    assert stubs[0].startswith(" " * 12 + "raise NotImplementedError(")
    assert stubs[1].startswith(" " * 8 + "raise NotImplementedError(")
    # Named after 1.2 (the nearest heading), with the heading's trailing period dropped.
    assert all("Exercise 1.2: scale a list:" in s for s in stubs)
    assert "Exercise 1.1" not in source
    assert "BEGIN SOLUTION" not in source and "v * self.factor" not in source

    namespace: dict = {}
    exec(source, namespace)
    scaler = namespace["Scaler"](3)
    with pytest.raises(NotImplementedError, match="Exercise 1.2"):
        scaler.apply([])
    with pytest.raises(NotImplementedError, match="Exercise 1.2"):
        scaler.apply([1])


def test_region_before_any_exercise_heading_still_gets_a_stub(tmp_path):
    write_notebook(
        tmp_path / "solutions" / "01_tokenizer.ipynb",
        [code("def f():\n    ### BEGIN SOLUTION\n    return 1\n    ### END SOLUTION")],
    )
    build(tmp_path)
    source = read(tmp_path / "notebooks" / "01_tokenizer.ipynb").cells[0].source
    namespace: dict = {}
    exec(source, namespace)
    with pytest.raises(NotImplementedError, match="replace this line with your code"):
        namespace["f"]()


def test_learner_and_solution_have_no_outputs_or_editor_metadata(fake_course):
    solution_path = fake_course / "solutions" / "01_tokenizer.ipynb"
    assert read(solution_path).cells[9].outputs  # the fixture starts with an output
    build(fake_course)
    for path in (solution_path, fake_course / "notebooks" / "01_tokenizer.ipynb"):
        nb = read(path)
        assert "widgets" not in nb.metadata
        assert nb.metadata["kernelspec"]["name"] == "python3"
        for cell in nb.cells:
            if cell.cell_type == "code":
                assert cell.outputs == [] and cell.execution_count is None, path


def test_raises_exception_only_on_exercise_and_check_cells(fake_course):
    build(fake_course)
    learner = read(fake_course / "notebooks" / "01_tokenizer.ipynb")
    tags = {i: cell.metadata.get("tags", []) for i, cell in enumerate(learner.cells)}
    tagged = {i for i, t in tags.items() if "raises-exception" in t}
    assert tagged == {3, 4, 6, 7}
    assert tags[3] == ["export", "raises-exception"]
    assert tags[7] == ["check", "nbval-ignore-output", "raises-exception"]
    # The solution itself never gets the tag.
    solution = read(fake_course / "solutions" / "01_tokenizer.ipynb")
    assert not any("raises-exception" in c.metadata.get("tags", []) for c in solution.cells)


def test_solution_with_raises_exception_is_refused_and_nothing_is_written(tmp_path):
    cells = chapter_01()
    cells[4].metadata["tags"] = ["check", "raises-exception"]
    write_notebook(tmp_path / "solutions" / "01_tokenizer.ipynb", cells)
    with pytest.raises(
        CourseError,
        match=r"01_tokenizer\.ipynb, cell 4: solutions must not carry 'raises-exception'",
    ):
        build(tmp_path)
    assert not (tmp_path / "notebooks").exists()
    assert not (tmp_path / "gpt2lib").exists()


@pytest.mark.parametrize(
    "source, phrase",
    [
        ("def f():\n    ### BEGIN SOLUTION\n    return 1", "is never closed"),
        (
            "def f():\n    ### BEGIN SOLUTION\n    ### BEGIN SOLUTION\n    return 1\n"
            "    ### END SOLUTION\n    ### END SOLUTION",
            "inside another solution region",
        ),
        ("def f():\n    return 1\n    ### END SOLUTION", "without a '### BEGIN SOLUTION'"),
    ],
    ids=["unclosed", "nested", "end-without-begin"],
)
@pytest.mark.parametrize("tag", [None, "export"])
def test_broken_markers_name_the_notebook_and_cell(tmp_path, source, phrase, tag):
    cells = [
        new_markdown_cell("### Exercise 1.1: f"),
        code("x = 1"),
        code(source, *([tag] if tag else [])),
    ]
    write_notebook(tmp_path / "solutions" / "01_tokenizer.ipynb", cells)
    with pytest.raises(
        CourseError, match=r"solutions/01_tokenizer\.ipynb, cell 2: .*" + phrase.replace("'", ".")
    ):
        course.plan_build(tmp_path)


# --------------------------------------------------------------------------- exported modules


def test_export_cells_go_to_chapter_module_with_answers_and_header(fake_course):
    build(fake_course)
    text = (fake_course / "gpt2lib" / "chapters" / "bpe.py").read_text(encoding="utf-8")
    assert text.startswith("# AUTOGENERATED from solutions/01_tokenizer.ipynb by")
    assert "Do not edit" in text
    assert "SOLUTION" not in text
    assert "total = a + b" in text and "return total" in text  # answers kept
    assert "class Scaler" not in text  # not an export cell
    assert "print(SCALE * 3)" not in text
    assert "VOCAB_SIZE" not in text  # went to config.py
    assert text.index("SCALE = 2") < text.index("def add")  # notebook order

    namespace: dict = {}
    exec(compile(text, "bpe.py", "exec"), namespace)
    assert namespace["add"](2, 3) == 5
    # The answer keeps its indentation: the function body is intact.
    assert '    """Sum of a and b."""\n    total = a + b\n    return total' in text


def test_export_name_sends_cells_to_another_module_from_several_chapters(fake_course):
    build(fake_course)
    config = (fake_course / "gpt2lib" / "chapters" / "config.py").read_text(encoding="utf-8")
    assert config.startswith(
        "# AUTOGENERATED from solutions/01_tokenizer.ipynb and solutions/02_embeddings.ipynb by"
    )
    namespace: dict = {}
    exec(config, namespace)
    assert namespace["VOCAB_SIZE"] == 50257 and namespace["N_EMBD"] == 768
    embeddings = (fake_course / "gpt2lib" / "chapters" / "embeddings.py").read_text(
        encoding="utf-8"
    )
    assert embeddings.startswith("# AUTOGENERATED from solutions/02_embeddings.ipynb by")
    assert "def twice" in embeddings and "N_EMBD" not in embeddings
    # The hand-written module is untouched.
    assert (fake_course / "gpt2lib" / "helper.py").read_text(
        encoding="utf-8"
    ) == "# written by hand\nVALUE = 1\n"


@pytest.mark.parametrize(
    "name, tags, phrase",
    [
        ("00_start_here", ["export"], "the chapter has no module"),
        ("01_tokenizer", ["export:not-a-module"], "does not name a Python module"),
        ("01_tokenizer", ["export", "export:config"], "more than one export tag"),
    ],
)
def test_bad_export_tags_are_refused(tmp_path, name, tags, phrase):
    write_notebook(tmp_path / "solutions" / f"{name}.ipynb", [code("x = 1", *tags)])
    with pytest.raises(CourseError, match=rf"{name}\.ipynb, cell 0: .*{phrase}"):
        course.plan_build(tmp_path)


def test_unknown_chapter_file_and_empty_course_are_refused(tmp_path):
    with pytest.raises(CourseError, match="no chapters found"):
        course.plan_build(tmp_path)
    write_notebook(tmp_path / "solutions" / "09_extra.ipynb", [code("x = 1")])
    with pytest.raises(
        CourseError, match="09_extra.ipynb: unknown chapter; add it to CHAPTER_MODULES"
    ):
        course.plan_build(tmp_path)


# --------------------------------------------------------------------------- check


def run_main(capsys, *argv: str) -> tuple[int, str, str]:
    code_ = course.main(list(argv))
    captured = capsys.readouterr()
    return code_, captured.out, captured.err


def test_check_passes_after_build_and_build_is_idempotent(fake_course, capsys):
    build(fake_course)
    assert course.check(fake_course) == []
    rc, out, _ = run_main(capsys, "--root", str(fake_course), "check")
    assert rc == 0 and "agree" in out
    assert build(fake_course) == []  # nothing to write the second time


def test_check_lists_files_after_unbuilt_edit_to_solution(fake_course, capsys):
    build(fake_course)
    solution = fake_course / "solutions" / "01_tokenizer.ipynb"
    # An edit inside the answer changes only the exported module (the stub hides it).
    set_source(solution, 3, EXERCISE_1_1.replace("total = a + b", "total = b + a"))
    assert course.check(fake_course) == [
        "gpt2lib/chapters/bpe.py: out of date (run `python -m gpt2lib.course build`)",
    ]
    # An edit outside the answer changes the learner notebook too.
    set_source(solution, 3, EXERCISE_1_1.replace("Sum of a and b.", "The sum."))
    problems = course.check(fake_course)
    assert problems == [
        "notebooks/01_tokenizer.ipynb: out of date (run `python -m gpt2lib.course build`)",
        "gpt2lib/chapters/bpe.py: out of date (run `python -m gpt2lib.course build`)",
    ]
    rc, out, err = run_main(capsys, "--root", str(fake_course), "check")
    assert rc == 1
    assert "notebooks/01_tokenizer.ipynb" in out and "gpt2lib/chapters/bpe.py" in out
    assert "2 file(s) out of date" in err
    build(fake_course)
    assert course.check(fake_course) == []


def test_check_flags_edit_to_a_non_export_solution_cell(fake_course):
    build(fake_course)
    set_source(fake_course / "solutions" / "01_tokenizer.ipynb", 9, "print(SCALE * 4)")
    problems = course.check(fake_course)
    assert problems == [
        "notebooks/01_tokenizer.ipynb: out of date (run `python -m gpt2lib.course build`)"
    ]


def test_check_fails_when_a_solution_has_outputs(fake_course, capsys):
    build(fake_course)
    path = fake_course / "solutions" / "02_embeddings.ipynb"
    nb = read(path)
    nb.cells[1].outputs = [new_output("stream", name="stdout", text="hi\n")]
    nb.cells[1].execution_count = 3
    nbformat.write(nb, str(path))
    problems = course.check(fake_course)
    assert problems == [
        "solutions/02_embeddings.ipynb: has outputs, editor metadata or unformatted code; run "
        "`python -m gpt2lib.course build`, which strips and formats it"
    ]
    rc, out, _ = run_main(capsys, "--root", str(fake_course), "check")
    assert rc == 1 and "solutions/02_embeddings.ipynb" in out


def test_check_flags_missing_and_stale_generated_files(fake_course):
    build(fake_course)
    (fake_course / "notebooks" / "02_embeddings.ipynb").unlink()
    # Chapter 02 stops exporting to `embeddings`: the old generated module is stale.
    cells = chapter_02()
    cells[1].metadata["tags"] = []
    write_notebook(fake_course / "solutions" / "02_embeddings.ipynb", cells)
    nb = course.strip_outputs(read(fake_course / "solutions" / "02_embeddings.ipynb"))
    (fake_course / "solutions" / "02_embeddings.ipynb").write_text(
        course._dump(nb), encoding="utf-8"
    )
    problems = course.check(fake_course)
    assert (
        "notebooks/02_embeddings.ipynb: missing (run `python -m gpt2lib.course build`)" in problems
    )
    assert "gpt2lib/chapters/embeddings.py: generated but no cell exports it" in problems
    assert not any("helper.py" in p for p in problems)  # hand-written modules are never stale

    build(fake_course)
    assert not (fake_course / "gpt2lib" / "chapters" / "embeddings.py").exists()
    assert (fake_course / "gpt2lib" / "helper.py").exists()
    assert course.check(fake_course) == []


# --------------------------------------------------------------------------- reset and backups


def learner_path(root: Path) -> Path:
    return root / "notebooks" / "01_tokenizer.ipynb"


def type_answer(root: Path, answer: str) -> None:
    """What a learner does: replace the stub of exercise 1.1 with their code and save."""
    set_source(learner_path(root), 3, f"def add(a, b):\n    return {answer}")


@pytest.fixture
def frozen_clock(monkeypatch):
    """Every backup is taken in the same second."""
    moment = real_datetime.datetime(2025, 1, 2, 3, 4, 5)
    fake_datetime = types.SimpleNamespace(datetime=types.SimpleNamespace(now=lambda: moment))
    monkeypatch.setattr(course, "_dt", fake_datetime)


def test_reset_writes_fresh_copy_and_keeps_the_edited_one(fake_course, frozen_clock, capsys):
    build(fake_course)
    fresh = learner_path(fake_course).read_text(encoding="utf-8")
    type_answer(fake_course, "a + b  # first try")
    edited = learner_path(fake_course).read_text(encoding="utf-8")

    rc, out, _ = run_main(capsys, "--root", str(fake_course), "reset", "1")
    assert rc == 0
    assert learner_path(fake_course).read_text(encoding="utf-8") == fresh
    backups = sorted((fake_course / "notebooks" / "backups").iterdir())
    assert [b.name for b in backups] == ["01_tokenizer.2025-01-02T03-04-05.ipynb"]
    assert backups[0].read_text(encoding="utf-8") == edited
    assert "notebooks/backups/01_tokenizer.2025-01-02T03-04-05.ipynb" in out


def test_two_resets_in_the_same_second_keep_both_backups(fake_course, frozen_clock):
    build(fake_course)
    out = io.StringIO()
    type_answer(fake_course, "a + b  # first try")
    course.reset("01", fake_course, out=out)
    type_answer(fake_course, "b + a  # second try")
    course.reset("01", fake_course, out=out)
    backups = sorted((fake_course / "notebooks" / "backups").iterdir())
    assert len(backups) == 2
    texts = [read(b).cells[3].source for b in backups]
    assert sorted(texts) == sorted(
        [
            "def add(a, b):\n    return a + b  # first try",
            "def add(a, b):\n    return b + a  # second try",
        ]
    )


def test_reset_of_a_fresh_or_missing_copy_makes_no_backup(fake_course):
    out = io.StringIO()
    target = course.reset("01", fake_course, out=out)  # no learner copy yet
    assert target == learner_path(fake_course)
    assert target.read_text(encoding="utf-8") == course._dump(
        course.learner_version(read(fake_course / "solutions" / "01_tokenizer.ipynb"), "x")
    )
    course.reset("01", fake_course, out=out)  # already fresh
    assert not (fake_course / "notebooks" / "backups").exists()


def test_reset_of_unknown_chapter_lists_valid_chapters(fake_course, capsys):
    with pytest.raises(
        CourseError, match="no chapter '7'; the chapters are: 01_tokenizer, 02_embeddings"
    ):
        course.reset("7", fake_course)
    rc, _, err = run_main(capsys, "--root", str(fake_course), "reset", "09")
    assert rc == 2
    assert "01_tokenizer, 02_embeddings" in err


def test_build_backs_up_a_learner_notebook_with_edited_sources(fake_course):
    build(fake_course)
    type_answer(fake_course, "a + b  # mine")
    edited = learner_path(fake_course).read_text(encoding="utf-8")
    # The author changes the chapter; the rebuild must not lose the learner's answer.
    set_source(fake_course / "solutions" / "01_tokenizer.ipynb", 9, "print(SCALE * 5)")
    build(fake_course)
    backups = list((fake_course / "notebooks" / "backups").iterdir())
    assert len(backups) == 1 and backups[0].read_text(encoding="utf-8") == edited
    assert read(learner_path(fake_course)).cells[9].source == "print(SCALE * 5)"
    assert "kept your edited 01_tokenizer.ipynb as notebooks/backups/" in (
        fake_course / "build.log"
    ).read_text(encoding="utf-8")
    # Chapter 02 was not edited by the learner: no backup of it.
    assert not any(b.name.startswith("02_") for b in backups)


def test_build_overwrites_without_backup_when_only_outputs_differ(fake_course):
    build(fake_course)
    nb = read(learner_path(fake_course))
    nb.cells[9].outputs = [new_output("stream", name="stdout", text="6\n")]
    nb.cells[9].execution_count = 1
    nbformat.write(nb, str(learner_path(fake_course)))
    build(fake_course)
    assert not (fake_course / "notebooks" / "backups").exists()
    assert course.check(fake_course) == []


def git(root: Path, *args: str) -> None:
    subprocess.run(
        [
            "git",
            "-C",
            str(root),
            "-c",
            "user.name=t",
            "-c",
            "user.email=t@example.com",
            "-c",
            "commit.gpgsign=false",
            *args,
        ],
        check=True,
        capture_output=True,
    )


def test_build_in_git_checkout_backs_up_only_real_learner_edits(fake_course):
    build(fake_course)
    git(fake_course, "init", "-q")
    git(fake_course, "add", "-A")
    git(fake_course, "commit", "-q", "-m", "course")
    # An author edit alone: the learner copy is still the committed one, so no backup.
    set_source(fake_course / "solutions" / "01_tokenizer.ipynb", 9, "print(SCALE * 5)")
    build(fake_course)
    assert not (fake_course / "notebooks" / "backups").exists()
    # A learner edit followed by a rebuild after another author edit: backed up.
    type_answer(fake_course, "a + b  # mine")
    set_source(fake_course / "solutions" / "01_tokenizer.ipynb", 9, "print(SCALE * 6)")
    build(fake_course)
    backups = list((fake_course / "notebooks" / "backups").iterdir())
    assert len(backups) == 1
    assert read(backups[0]).cells[3].source == "def add(a, b):\n    return a + b  # mine"


# --------------------------------------------------------------------------- the real repository


@pytest.mark.slow  # builds the whole course in memory
def test_real_repository_is_consistent():
    result = subprocess.run(
        [sys.executable, "-m", "gpt2lib.course", "check"],
        cwd=REPO_ROOT,
        capture_output=True,
        text=True,
        encoding="utf-8",
        timeout=120,
    )
    assert result.returncode == 0, result.stdout + result.stderr
    assert "solutions/, notebooks/ and gpt2lib/ agree" in result.stdout


# --------------------------------------------------------------------------- progress

PROGRESS_CHECKS = """import os
from gpt2lib.course.checks import CheckFailed, call_learner, passed


def check_double(fn):
    got = call_learner("Exercise 1.1", fn, 3)
    if os.path.basename(os.getcwd()) != "notebooks":
        raise CheckFailed("Exercise 1.1", "not run from notebooks/")
    if got != 6:
        raise CheckFailed("Exercise 1.1", f"double(3) gave {got!r}")
    passed("Exercise 1.1")


def check_square(fn):
    got = call_learner("Exercise 1.2", fn, 3)
    if got == 6:
        raise CheckFailed("Exercise 1.2", "you doubled instead of squaring\\nsecond line")
    if got != 9:
        raise CheckFailed("Exercise 1.2", f"square(3) gave {got!r}")
    passed("Exercise 1.2")


def check_negate(fn):
    if call_learner("Exercise 1.3", fn, 3) != -3:
        raise CheckFailed("Exercise 1.3", "wrong sign")
    passed("Exercise 1.3")


def check_halve(fn):
    if call_learner("Exercise 1.4", fn, 4) != 2:
        raise CheckFailed("Exercise 1.4", "wrong half")
    passed("Exercise 1.4")"""


def progress_chapter() -> list:
    def exercise(number, title, name, answer, check):
        return [
            new_markdown_cell(f"### Exercise 1.{number}: {title}"),
            code(
                f"def {name}(x):\n    ### BEGIN SOLUTION\n    return {answer}\n    ### END SOLUTION"
            ),
            code(f"{check}({name})", "check"),
        ]

    return [
        new_markdown_cell("# Chapter 1"),
        code(PROGRESS_CHECKS),
        *exercise(1, "double", "double", "2 * x", "check_double"),
        *exercise(2, "square", "square", "x * x", "check_square"),
        *exercise(3, "negate", "negate", "-x", "check_negate"),
        *exercise(4, "halve", "halve", "x // 2", "check_halve"),
        new_markdown_cell("## What comes next"),
        code("print('the rest of the chapter runs')"),
    ]


@pytest.fixture
def learner_course(tmp_path: Path) -> Path:
    """A built course whose learner solved 1.1, got 1.2 wrong, skipped 1.3, crashed 1.4."""
    write_notebook(tmp_path / "solutions" / "01_tokenizer.ipynb", progress_chapter())
    (tmp_path / "gpt2lib").mkdir()
    build(tmp_path)
    path = learner_path(tmp_path)
    set_source(path, 3, "def double(x):\n    return x + x")
    set_source(path, 6, "def square(x):\n    return 2 * x")
    set_source(path, 12, "def halve(x):\n    return x / 0")
    return tmp_path


@pytest.mark.slow  # starts a kernel
def test_progress_reports_passed_failed_and_not_started(learner_course):
    before = learner_path(learner_course).read_bytes()
    out = io.StringIO()
    # Not every exercise passed: the exit status says so, for an instructor's script.
    assert progress.report(learner_course, ["1"], out=out, timeout=60) == 1
    lines = out.getvalue().splitlines()
    assert learner_path(learner_course).read_bytes() == before  # the learner's file is untouched
    assert not list((learner_course / "notebooks").glob("*.ipynb.*"))
    body = [line.strip() for line in lines]
    assert "✅ Exercise 1.1: double" in body
    assert "✗  Exercise 1.2: square — Exercise 1.2: you doubled instead of squaring" in body
    assert "⋯  Exercise 1.3: negate — not started" in body
    assert "✗  Exercise 1.4: halve — ZeroDivisionError: division by zero" in body
    assert "1 of 4 exercises passed, 2 failed, 1 not started" in body
    assert lines[-1] == "Total: 1 of 4 exercises passed, 2 failed, 1 not started"


@pytest.mark.slow  # starts a kernel
def test_progress_exits_0_only_when_every_exercise_passed(learner_course, capsys):
    path = learner_path(learner_course)
    set_source(path, 6, "def square(x):\n    return x * x")
    set_source(path, 9, "def negate(x):\n    return -x")
    set_source(path, 12, "def halve(x):\n    return x // 2")
    rc, out, _ = run_main(capsys, "--root", str(learner_course), "progress")
    assert out.splitlines()[-1] == "Total: 4 of 4 exercises passed, 0 failed, 0 not started"
    assert rc == 0


@pytest.mark.slow  # starts a kernel
def test_progress_on_a_fresh_notebook_reports_everything_not_started(learner_course, capsys):
    course.reset("01", learner_course, out=io.StringIO())
    rc, out, _ = run_main(capsys, "--root", str(learner_course), "progress")
    assert rc == 1
    assert out.count("— not started") == 4
    assert out.splitlines()[-1] == "Total: 0 of 4 exercises passed, 0 failed, 4 not started"


def test_grade_reads_exception_types_of_an_executed_notebook():
    # Without a kernel: outputs as nbclient records them.
    nb = new_notebook(
        cells=[
            new_markdown_cell("## Exercise 2.1: a"),
            code("f()", "check"),
            new_markdown_cell("## Exercise 2.2: b"),
            code("g()", "check"),
            new_markdown_cell("## Exercise 2.3: c"),
            code("h()"),
            new_markdown_cell("## Exercise 2.4: d"),
            code("k()", "check"),
            new_markdown_cell("## Exercise 2.5: e"),
            code("m()", "check"),
        ]
    )
    # The message is never read for the grade: only the exception's type.
    nb.cells[1].outputs = [new_output("error", ename="NotDoneYet", evalue="anything", traceback=[])]
    nb.cells[3].outputs = [new_output("stream", name="stdout", text="all good\n")]
    nb.cells[3].execution_count = 1
    nb.cells[7].outputs = [
        new_output("error", ename="CheckFailed", evalue="Exercise 2.4: not done yet", traceback=[])
    ]
    found = course_format.exercises(nb)
    assert [(e.title, e.checks) for e in found] == [
        ("Exercise 2.1: a", [1]),
        ("Exercise 2.2: b", [3]),
        ("Exercise 2.3: c", []),
        ("Exercise 2.4: d", [7]),
        ("Exercise 2.5: e", [9]),
    ]
    outcomes = [progress.grade(e, progress.Run(nb)) for e in found]
    assert [(o.status, o.detail) for o in outcomes] == [
        ("not started", ""),
        ("passed", ""),
        ("failed", "no check cell follows this exercise"),
        ("failed", "Exercise 2.4: not done yet"),
        ("failed", "the check cell did not run"),
    ]


def test_progress_of_unknown_or_missing_chapter_says_what_to_do(learner_course, capsys):
    rc, _, err = run_main(capsys, "--root", str(learner_course), "progress", "5")
    assert rc == 2 and "no chapter '5'; your notebooks are: 01_tokenizer" in err
    rc, _, err = run_main(capsys, "--root", str(learner_course), "progress", "abc")
    assert rc == 2 and "'abc' is not a chapter number" in err
    learner_path(learner_course).unlink()
    rc, _, err = run_main(capsys, "--root", str(learner_course), "progress", "01")
    assert rc == 2 and "run `python -m gpt2lib.course reset 01`" in err
    rc, _, err = run_main(capsys, "--root", str(learner_course), "progress")
    assert rc == 2 and "no notebooks in" in err


def run_module(*argv: str, timeout: float = 120) -> subprocess.CompletedProcess:
    """`python -m gpt2lib.course ...` in a subprocess (the way learners run it)."""
    return subprocess.run(
        [sys.executable, "-m", "gpt2lib.course", *argv],
        capture_output=True,
        text=True,
        encoding="utf-8",
        timeout=timeout,
    )


@pytest.mark.parametrize(
    "argv, phrase",
    [
        (["progress", "abc"], "'abc' is not a chapter number"),
        (["progress"], "no notebooks in"),
        (["reset", "7"], "no chapter '7'"),
        (["restore", "1"], "has no backups"),
    ],
)
def test_every_command_fails_in_one_line_when_run_as_a_module(fake_course, argv, phrase):
    # As `__main__`, course.py once had its own CourseError class, which progress did not raise.
    result = run_module("--root", str(fake_course), *argv)
    assert result.returncode == 2, result.stderr
    assert result.stderr.count("\n") == 1 and phrase in result.stderr, result.stderr
    assert "Traceback" not in result.stderr


HANGS = {
    # Catches the interrupt a timeout sends: stopping it needs the kernel killed.
    "swallows-interrupts": "import time\nwhile True:\n    try:\n        time.sleep(.1)\n"
    "    except KeyboardInterrupt:\n        pass",
    "endless-loop": "while True:\n    pass",
}


@pytest.mark.slow  # starts a kernel, then waits the 4 s limit
@pytest.mark.parametrize("answer", HANGS.values(), ids=HANGS.keys())
def test_progress_stops_a_cell_that_runs_past_the_limit(learner_course, answer):
    set_source(learner_path(learner_course), 6, "def square(x):\n    return x * x\n\n" + answer)
    # The subprocess timeout only turns a regression (a hang) into a failure.
    # 8 s: long enough that cell 1's import of gpt2lib (torch) finishes on a loaded machine.
    result = run_module(
        "--root", str(learner_course), "progress", "01", "--cell-timeout", "8", timeout=120
    )
    lines = [line.strip() for line in result.stdout.splitlines()]
    assert "! timed out after 8 s at cell 6; the cells after it did not run" in lines
    assert "✗  Exercise 1.2: square — timed out after 8 s (cell 6)" in lines
    assert "✅ Exercise 1.1: double" in lines
    assert "–  Exercise 1.3: negate — the notebook stopped at cell 6" in lines
    assert "KeyboardInterrupt" not in result.stdout + result.stderr
    assert result.returncode == 1


@pytest.mark.slow  # starts a kernel
def test_progress_runs_in_a_scratch_copy_with_the_quick_setting(learner_course):
    # A learner cell that deletes and writes files in the course folder, and records the
    # environment it ran in.
    set_source(
        learner_path(learner_course),
        12,
        (
            "import os, pathlib, shutil\n"
            "shutil.rmtree('../solutions')\n"
            "pathlib.Path('../gpt2lib/chapters/new_file.py').write_text('x = 1', encoding='utf-8')\n"
            "pathlib.Path('mine.txt').write_text(os.environ.get('GPT2LIB_QUICK', 'unset'), "
            "encoding='utf-8')\n"
            "assert os.environ['GPT2LIB_QUICK'] == '1'\n"
            "def halve(x):\n    return x // 2"
        ),
    )
    out = io.StringIO()
    progress.report(learner_course, ["01"], out=out, timeout=60)
    assert "✅ Exercise 1.4: halve" in out.getvalue()  # the cell ran, with GPT2LIB_QUICK=1
    assert (learner_course / "solutions" / "01_tokenizer.ipynb").exists()
    assert not (learner_course / "gpt2lib" / "chapters" / "new_file.py").exists()
    assert not (learner_course / "notebooks" / "mine.txt").exists()


@pytest.mark.parametrize(
    "damage, phrase",
    [
        (lambda p: p.write_bytes(b'{"cells": [ oops'), "is not a valid notebook"),
        (
            lambda p: p.write_bytes(
                p.read_bytes().replace(b"Chapter 1", "Kapitel ä".encode("latin-1"))
            ),
            "is not UTF-8 text",
        ),
    ],
    ids=["invalid-json", "not-utf-8"],
)
@pytest.mark.slow  # starts a kernel for the chapter that can be read
def test_an_unreadable_notebook_is_named_and_the_other_chapters_go_on(fake_course, damage, phrase):
    build(fake_course)
    broken = fake_course / "notebooks" / "01_tokenizer.ipynb"
    damage(broken)
    damaged = broken.read_bytes()
    # progress: names the file, says how to fix it, runs chapter 02 anyway.
    out = io.StringIO()
    assert progress.report(fake_course, [], out=out, timeout=60) == 1
    text = out.getvalue()
    assert f"{broken} cannot be read: it {phrase}" in text
    assert (
        "`python -m gpt2lib.course restore 01`" in text
        and "`python -m gpt2lib.course reset 01`" in text
    )
    assert "02_embeddings (running notebooks/02_embeddings.ipynb ...)" in text
    # build: keeps the damaged file as a backup and writes a fresh copy.
    set_source(fake_course / "solutions" / "01_tokenizer.ipynb", 9, "print(SCALE * 7)")
    build(fake_course)
    log = (fake_course / "build.log").read_text(encoding="utf-8")
    assert "01_tokenizer.ipynb cannot be read" in log and "wrote a fresh copy" in log
    backups = list((fake_course / "notebooks" / "backups").iterdir())
    assert [b.read_bytes() for b in backups] == [damaged]
    assert course.check(fake_course) == []


# --------------------------------------------------------------------------- restore


def test_restore_lists_backups_and_puts_one_back_keeping_the_current_copy(fake_course, capsys):
    build(fake_course)
    out = io.StringIO()
    type_answer(fake_course, "a + b  # first try")
    first = learner_path(fake_course).read_bytes()
    course.reset("01", fake_course, out=out)
    type_answer(fake_course, "b + a  # second try")
    second = learner_path(fake_course).read_bytes()
    course.reset("01", fake_course, out=out)
    fresh = learner_path(fake_course).read_bytes()

    rc, listing, _ = run_main(capsys, "--root", str(fake_course), "restore", "01")
    assert rc == 0
    assert learner_path(fake_course).read_bytes() == fresh  # listing changes nothing
    entries = [line.strip() for line in listing.splitlines() if line.strip()[:2] in ("1.", "2.")]
    assert len(entries) == 2 and all("01_tokenizer." in e for e in entries)
    assert "restore 01 NUMBER" in listing

    rc, said, _ = run_main(capsys, "--root", str(fake_course), "restore", "01", "2")  # the older
    assert rc == 0
    assert learner_path(fake_course).read_bytes() == first
    # The fresh copy it replaced is now a backup too, and the newest one.
    newest = course.backups_of("01", fake_course)[0]
    assert newest.path.read_bytes() == fresh and "your current copy is kept as" in said
    assert {b.path.read_bytes() for b in course.backups_of("01", fake_course)} == {
        first,
        second,
        fresh,
    }


def test_restore_refuses_unknown_choices_and_broken_backups(fake_course, capsys):
    build(fake_course)
    type_answer(fake_course, "a + b")
    course.reset("01", fake_course, out=io.StringIO())
    rc, _, err = run_main(capsys, "--root", str(fake_course), "restore", "01", "5")
    assert rc == 2 and "choose a number from 1 to 1" in err
    course.backups_of("01", fake_course)[0].path.write_bytes(b"not json")
    before = learner_path(fake_course).read_bytes()
    rc, _, err = run_main(capsys, "--root", str(fake_course), "restore", "01", "1")
    assert rc == 2 and "cannot be read" in err
    assert learner_path(fake_course).read_bytes() == before


def test_restore_can_ask_which_backup(fake_course):
    build(fake_course)
    type_answer(fake_course, "a + b  # mine")
    mine = learner_path(fake_course).read_bytes()
    course.reset("01", fake_course, out=io.StringIO())
    questions = []
    restored = course.restore(
        "01", root=fake_course, out=io.StringIO(), ask=lambda q: questions.append(q) or "1"
    )
    assert restored == learner_path(fake_course) and restored.read_bytes() == mine
    assert questions and "[1-1" in questions[0]


# --------------------------------------------------------------------------- generated modules


def test_generated_module_has_a_docstring_all_and_a_comment_per_cell(fake_course):
    build(fake_course)
    text = (fake_course / "gpt2lib" / "chapters" / "bpe.py").read_text(encoding="utf-8")
    namespace: dict = {}
    exec(compile(text, "bpe.py", "exec"), namespace)
    # No docstring in the notebook: one naming the chapter is generated.
    assert namespace["__doc__"] == (
        "Chapter 1: a fake chapter (solutions/01_tokenizer.ipynb): the code its export cells hold."
    )
    assert namespace["__all__"] == ["SCALE", "add"]  # public names it defines, not imports
    assert "# %% solutions/01_tokenizer.ipynb, cell 1\nimport math" in text
    assert "# %% solutions/01_tokenizer.ipynb, cell 3\ndef add(a, b):" in text
    config = (fake_course / "gpt2lib" / "chapters" / "config.py").read_text(encoding="utf-8")
    assert "# %% solutions/02_embeddings.ipynb, cell 2\nN_EMBD = 768" in config


def test_a_docstring_in_the_first_export_cell_is_the_module_docstring(tmp_path):
    first = (
        '"""Tools for chapter 1."""\n\nfrom __future__ import annotations\n\n'
        "import math\n\n_PRIVATE = 1\nPUBLIC: int = 2\n\n\nclass Thing:\n    pass"
    )
    write_notebook(tmp_path / "solutions" / "01_tokenizer.ipynb", [code(first, "export")])
    build(tmp_path)
    text = (tmp_path / "gpt2lib" / "chapters" / "bpe.py").read_text(encoding="utf-8")
    namespace: dict = {}
    exec(compile(text, "bpe.py", "exec"), namespace)  # __all__ after __future__ is valid
    assert namespace["__doc__"] == "Tools for chapter 1."
    assert namespace["__all__"] == ["PUBLIC", "Thing"]
    assert text.index("from __future__") < text.index("__all__") < text.index("import math")


def test_the_build_owns_the_chapters_folder_and_backs_up_what_it_did_not_write(fake_course):
    build(fake_course)
    generated = fake_course / "gpt2lib" / "chapters" / "embeddings.py"
    experiment = fake_course / "gpt2lib" / "chapters" / "my_experiment.py"
    experiment.write_text(generated.read_text(encoding="utf-8") + "\nEXTRA = 1\n", encoding="utf-8")
    notes = fake_course / "gpt2lib" / "chapters" / "notes.py"
    notes.write_text("# mine\n", encoding="utf-8")
    assert (
        "gpt2lib/chapters/notes.py: not written by the build, which owns gpt2lib/chapters/"
        in course.check(fake_course)
    )
    # Chapter 02 stops exporting to `embeddings`: that module is stale and goes without a copy
    cells = chapter_02()
    cells[1].metadata["tags"] = []
    write_notebook(fake_course / "solutions" / "02_embeddings.ipynb", cells)
    build(fake_course)
    log = (fake_course / "build.log").read_text(encoding="utf-8")
    assert not generated.exists() and not experiment.exists() and not notes.exists()
    assert "removed gpt2lib/chapters/embeddings.py (no export cells produce it)" in log
    assert "removed gpt2lib/chapters/my_experiment.py: the build owns gpt2lib/chapters/" in log
    backups = {
        b.name.split(".")[0]: b.read_text(encoding="utf-8")
        for b in (fake_course / "backups" / "gpt2lib" / "chapters").iterdir()
    }
    assert backups.keys() == {"my_experiment", "notes"} and "EXTRA = 1" in backups["my_experiment"]
    assert (fake_course / "gpt2lib" / "helper.py").exists()  # outside the folder: never touched
    assert course.check(fake_course) == []


def test_build_backs_up_a_hand_edited_generated_module_before_rewriting_it(fake_course, capsys):
    build(fake_course)
    module = fake_course / "gpt2lib" / "chapters" / "bpe.py"
    edited = module.read_text(encoding="utf-8").replace("SCALE = 2", "SCALE = 3")
    module.write_text(edited, encoding="utf-8")
    assert course.check(fake_course) == [
        "gpt2lib/chapters/bpe.py: edited by hand; change the notebook instead "
        "(build keeps a backup of this version and rewrites it)"
    ]
    build(fake_course)
    backups = list((fake_course / "backups" / "gpt2lib" / "chapters").iterdir())
    assert [b.read_text(encoding="utf-8") for b in backups] == [edited]
    assert "gpt2lib/chapters/bpe.py was changed by hand; kept that version as backups/gpt2lib/" in (
        fake_course / "build.log"
    ).read_text(encoding="utf-8")
    assert "SCALE = 2" in module.read_text(encoding="utf-8") and course.check(fake_course) == []


def test_a_stale_module_edited_by_hand_is_backed_up_before_removal(fake_course):
    build(fake_course)
    module = fake_course / "gpt2lib" / "chapters" / "embeddings.py"
    edited = module.read_text(encoding="utf-8") + "\nMINE = 1\n"
    module.write_text(edited, encoding="utf-8")
    cells = chapter_02()
    cells[1].metadata["tags"] = []
    write_notebook(fake_course / "solutions" / "02_embeddings.ipynb", cells)
    build(fake_course)
    assert not module.exists()
    backups = list((fake_course / "backups" / "gpt2lib" / "chapters").iterdir())
    assert [b.read_text(encoding="utf-8") for b in backups] == [edited]


# --------------------------------------------------------------------------- the README's launch


def readme_launch_command() -> list[str]:
    """The `jupyter lab ...` line of the README's Start section, split into words."""
    readme = (REPO_ROOT / "README.md").read_text(encoding="utf-8")
    start = readme[readme.index("## Start") : readme.index("## Test")]
    lines = [line.strip() for line in start.splitlines() if line.strip().startswith("jupyter lab")]
    assert len(lines) == 1, lines
    return lines[0].split("#")[0].split()


@pytest.mark.slow
def test_the_readmes_launch_shows_the_whole_course_with_chapter_00_open(tmp_path):
    import json
    import os
    import secrets
    import socket
    import time
    import urllib.request

    command = readme_launch_command()
    assert command[:2] == ["jupyter", "lab"]
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    token = secrets.token_hex(16)
    runtime = tmp_path / "runtime"
    env = dict(
        os.environ,
        JUPYTER_RUNTIME_DIR=str(runtime),
        JUPYTER_CONFIG_DIR=str(tmp_path / "config"),
        JUPYTER_DATA_DIR=str(tmp_path / "data"),
    )
    # The README's words, plus what a headless test needs (and --allow-root, as the README says).
    server = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "jupyterlab",
            *command[2:],
            "--no-browser",
            "--ip",
            "127.0.0.1",
            "--port",
            str(port),
            "--ServerApp.port_retries=0",
            f"--IdentityProvider.token={token}",
            "--allow-root",
            "--LabApp.news_url=None",
        ],
        cwd=REPO_ROOT,
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        listing = None
        deadline = time.monotonic() + 90
        while listing is None and time.monotonic() < deadline and server.poll() is None:
            try:
                url = f"http://127.0.0.1:{port}/api/contents?token={token}"
                with urllib.request.urlopen(url, timeout=2) as answer:
                    listing = json.load(answer)
            except OSError:
                time.sleep(0.25)
        assert listing is not None, "JupyterLab did not start"
        names = {item["name"] for item in listing["content"]}
        assert {"notebooks", "solutions", "gpt2lib", "README.md"} <= names  # the whole course
        # What the browser is sent to: chapter 0, as a path inside the course folder.
        opened = list(runtime.glob("jpserver-file-to-run-*-open.html"))
        assert len(opened) == 1
        assert f"/lab/tree/notebooks/00_start_here.ipynb?token={token}" in opened[0].read_text(
            encoding="utf-8"
        )
    finally:
        server.terminate()
        server.wait(timeout=30)


def test_every_chapter_names_its_kernel_so_jupyterlab_does_not_ask():
    # Without a kernelspec, JupyterLab opens a "Select kernel" dialog over the notebook.
    root = Path(__file__).resolve().parents[2]
    for path in sorted((root / "solutions").glob("[0-9][0-9]_*.ipynb")):
        kernelspec = nbformat.read(str(path), as_version=4).metadata.get("kernelspec", {})
        assert kernelspec.get("name") == "python3", f"{path.name} has no python3 kernelspec"


# --------------------------------------------------------------------------- the formatter


def test_generated_modules_are_formatted_however_the_cell_was_laid_out(tmp_path):
    cramped = "def add( a,b ):\n  return a+b\nTABLE = {'a':1,\n   'b':2}"
    write_notebook(tmp_path / "solutions" / "01_tokenizer.ipynb", [code(cramped, "export")])
    build(tmp_path)
    text = (tmp_path / "gpt2lib" / "chapters" / "bpe.py").read_text(encoding="utf-8")
    assert "def add(a, b):\n    return a + b\n" in text
    assert 'TABLE = {"a": 1, "b": 2}\n' in text
    assert course.check(tmp_path) == []  # the formatted module is what check expects
    assert course.module_state(tmp_path / "gpt2lib" / "chapters" / "bpe.py") == "generated"


def test_the_formatter_leaves_behaviour_alone():
    text = "x = (1 +\n  2)\nnames = ['a',\n 'b']\n"
    namespace, formatted = {}, {}
    exec(text, namespace)
    exec(course.format_module(text, "t.py"), formatted)
    assert (
        (formatted["x"], formatted["names"])
        == (namespace["x"], namespace["names"])
        == (3, ["a", "b"])
    )


def test_another_ruff_version_is_refused_with_the_install_line(monkeypatch, tmp_path):
    course._ruff.cache_clear()
    monkeypatch.setattr(course, "RUFF_VERSION", "0.0.1")
    try:
        with pytest.raises(
            CourseError,
            match=r"ruff 0\.0\.1, and this environment has ruff .*"
            r"pip install ruff==0\.0\.1",
        ):
            course.format_module("x = 1\n", "t.py")
    finally:
        course._ruff.cache_clear()


def test_requirements_pin_the_ruff_the_build_expects():
    requirements = (Path(course.REPO_ROOT) / "requirements.txt").read_text(encoding="utf-8")
    assert f"ruff=={course.RUFF_VERSION}" in requirements.split()
