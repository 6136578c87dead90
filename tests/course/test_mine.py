"""The learner's package (gpt2lib.course.mine): what a learner's kernel runs and passes becomes
mygpt2/, a failed or unfinished exercise never lands there, and the course commands keep it.

A small course of two chapters is written in a temporary folder, and its learner notebooks'
cells run in a real IPython shell whose working folder is the course's notebooks/, as a
JupyterLab kernel's is."""

from __future__ import annotations

import io
import json
import sys
from pathlib import Path

import nbformat
import pytest

from gpt2lib.course import build, mine, reset, restore

ATTENTION = """import torch


def causal_mask(T):
    ### BEGIN SOLUTION
    return torch.tril(torch.ones(T, T, dtype=torch.bool))
    ### END SOLUTION"""

BLOCK = """from gpt2lib.chapters.attention import causal_mask


def block_mask(T):
    ### BEGIN SOLUTION
    return causal_mask(T)
    ### END SOLUTION"""

CHECK_MASK = """from gpt2lib.course.checks import CheckFailed, passed

if not bool((causal_mask(4) == torch.tril(torch.ones(4, 4, dtype=torch.bool))).all()):
    raise CheckFailed("Exercise 3.1", "the mask lets a token see the future")
passed("Exercise 3.1 (causal_mask)")"""


def notebook(path: Path, title: str, exercise: str, export: str, check: str) -> None:
    nb = nbformat.v4.new_notebook()
    nb.cells = [
        nbformat.v4.new_markdown_cell(f"# {title}"),
        nbformat.v4.new_markdown_cell(f"### {exercise} (difficulty: easy, about 5 min)"),
        nbformat.v4.new_code_cell(export, metadata={"tags": ["export"]}),
        nbformat.v4.new_code_cell(check, metadata={"tags": ["check"]}),
    ]
    path.parent.mkdir(parents=True, exist_ok=True)
    nbformat.write(nb, path)


@pytest.fixture
def course(tmp_path, monkeypatch):
    """Two chapters (attention, block) built, the working folder notebooks/, an IPython shell."""
    from IPython.core.interactiveshell import InteractiveShell

    root = tmp_path / "course"
    notebook(
        root / "solutions" / "03_attention.ipynb",
        "Chapter 3",
        "Exercise 3.1: a causal mask",
        ATTENTION,
        CHECK_MASK,
    )
    notebook(
        root / "solutions" / "05_block.ipynb",
        "Chapter 5",
        "Exercise 5.1: the block's mask",
        BLOCK,
        'from gpt2lib.course.checks import passed\n\nassert block_mask(2).sum() == 3\npassed("Exercise 5.1")',
    )
    (root / "pyproject.toml").write_bytes(
        (Path(__file__).parents[2] / "pyproject.toml").read_bytes()
    )
    build(root, out=io.StringIO())
    monkeypatch.chdir(root / "notebooks")
    monkeypatch.setenv("GPT2LIB_LEARNER_PACKAGE", "1")  # the suite turns it off elsewhere
    InteractiveShell.clear_instance()
    shell = InteractiveShell.instance()
    import gpt2lib.course.checks._core as core

    core.install_notebook_display()  # as importing the checks in a kernel does
    monkeypatch.setattr(mine, "PASSED", set())
    monkeypatch.setattr(sys, "path", list(sys.path))
    yield root, shell
    InteractiveShell.clear_instance()
    for name in [m for m in sys.modules if m == "mygpt2" or m.startswith("mygpt2.")]:
        del sys.modules[name]


def run(shell, code: str) -> str:
    result = shell.run_cell(code, store_history=True)  # as a kernel runs a cell
    return "" if result.error_in_exec is None else repr(result.error_in_exec)


def record(root: Path) -> dict:
    return json.loads((root / "mygpt2" / "parts.json").read_text(encoding="utf-8"))


def test_a_passed_check_writes_the_learners_code_and_only_a_modules_statements(course, capsys):
    root, shell = course
    answer = (
        "import torch\n\n"
        "def causal_mask(T):  # mine: built from ones, written my way\n"
        "    return torch.ones(T, T).tril().bool()\n\n"
        "causal_mask.mark = 'learner'\n"
        "print('trying it:', causal_mask(2))\n"
    )
    assert run(shell, answer) == ""
    assert run(shell, CHECK_MASK) == ""
    text = (root / "mygpt2" / "attention.py").read_text(encoding="utf-8")
    assert "torch.ones(T, T).tril().bool()" in text and "causal_mask.mark" in text
    assert "print('trying it:'" not in text  # a call at the top level does not run on import
    assert record(root)["exercises"]["3.1"]["status"] == "yours"
    block = (root / "mygpt2" / "block.py").read_text(encoding="utf-8")
    assert "from mygpt2.attention import causal_mask" in block  # the reference, on your parts
    capsys.readouterr()
    assert run(shell, "from gpt2lib.course.mine import your_gpt2\nparts = your_gpt2('block')") == ""
    line = capsys.readouterr().out.strip().splitlines()[-1]
    assert line.startswith("Your GPT-2 (mygpt2/): yours: attention;")
    assert "block (5.1: not passed yet)" in line
    parts = shell.user_ns["parts"]
    assert parts.attention.causal_mask.mark == "learner"
    assert parts.block.causal_mask is parts.attention.causal_mask  # the block uses yours


def test_a_failed_check_puts_the_reference_back_and_says_why(course):
    root, shell = course
    run(shell, "import torch\ndef causal_mask(T):\n    return torch.ones(T, T).tril().bool()")
    run(shell, CHECK_MASK)
    assert record(root)["exercises"]["3.1"]["status"] == "yours"
    run(shell, "def causal_mask(T):\n    return torch.ones(T, T, dtype=torch.bool)")  # sees all
    assert "CheckFailed" in run(shell, CHECK_MASK)
    entry = record(root)["exercises"]["3.1"]
    assert entry == {"status": "reference", "why": "its check failed"}
    text = (root / "mygpt2" / "attention.py").read_text(encoding="utf-8")
    assert "torch.tril(torch.ones(T, T, dtype=torch.bool))" in text  # the reference's code
    assert mine.parts_line(root, record(root)).startswith(
        "Your GPT-2 (mygpt2/): yours: none yet; the reference's: attention (3.1: its check failed)"
    )


def test_an_unfinished_exercise_never_lands_in_the_package(course):
    root, shell = course
    stub = (root / "notebooks" / "03_attention.ipynb").read_text(encoding="utf-8")
    assert "NotImplementedError" in stub
    learner = nbformat.read(root / "notebooks" / "03_attention.ipynb", as_version=4)
    run(shell, learner.cells[2].source)  # the stub as the learner notebook has it
    assert run(shell, learner.cells[3].source) != ""  # the check fails on the stub
    assert not (root / "mygpt2").exists() or "3.1" not in record(root)["exercises"]


def test_yours_gives_the_learners_object_only_after_its_check_passed(course, capsys):
    root, shell = course

    def causal_mask(T):
        return None

    assert mine.yours("3.1", causal_mask) is not causal_mask  # not passed: the reference's
    assert "has not passed yet" in capsys.readouterr().out
    mine.PASSED.add("3.1")
    assert mine.yours("3.1", causal_mask) is causal_mask
    # a piece the package does not export names its reference; the chapter's module comes first
    assert mine.yours("7.9", causal_mask, reference=len) is len
    from gpt2lib.chapters import decoding

    def sample_token(logits):
        return None

    assert mine.yours("9.4", sample_token) is decoding.sample_token


def test_outside_a_learner_notebook_nothing_is_written(course, monkeypatch, capsys):
    root, shell = course
    monkeypatch.chdir(root / "solutions")
    run(shell, "import torch\ndef causal_mask(T):\n    return torch.ones(T, T).tril().bool()")
    assert run(shell, CHECK_MASK) == ""
    assert not (root / "mygpt2").exists()
    parts = mine.your_gpt2()
    assert parts.attention.__name__ == "gpt2lib.chapters.attention"
    assert "not a learner notebook" in capsys.readouterr().out


def test_reset_backs_up_the_chapters_part_and_restore_brings_it_back(course):
    root, shell = course
    run(shell, "import torch\ndef causal_mask(T):\n    return torch.ones(T, T).tril().bool()")
    run(shell, CHECK_MASK)
    mine_text = (root / "mygpt2" / "attention.py").read_text(encoding="utf-8")
    path = root / "notebooks" / "03_attention.ipynb"
    path.write_text(path.read_text(encoding="utf-8").replace("easy", "easy "), encoding="utf-8")
    out = io.StringIO()
    reset("03", root=root, out=out)
    assert "code in mygpt2/ is kept as notebooks/backups/03_attention." in out.getvalue()
    assert "3.1" not in record(root)["exercises"]
    assert "torch.ones(T, T).tril()" not in (root / "mygpt2" / "attention.py").read_text(
        encoding="utf-8"
    )
    kept = list((root / "notebooks" / "backups").glob("03_attention.*.mygpt2.json"))
    assert (
        len(kept) == 1
        and json.loads(kept[0].read_text(encoding="utf-8"))["3.1"]["status"] == "yours"
    )
    restore("03", "1", root=root, out=io.StringIO())
    assert (root / "mygpt2" / "attention.py").read_text(encoding="utf-8") == mine_text
    assert record(root)["exercises"]["3.1"]["status"] == "yours"


def test_build_never_touches_the_learners_package(course):
    root, shell = course
    run(shell, "import torch\ndef causal_mask(T):\n    return torch.ones(T, T).tril().bool()")
    run(shell, CHECK_MASK)
    before = {p.name: p.read_bytes() for p in (root / "mygpt2").iterdir() if p.is_file()}
    build(root, out=io.StringIO())
    after = {p.name: p.read_bytes() for p in (root / "mygpt2").iterdir() if p.is_file()}
    assert after == before


def test_a_damaged_record_is_set_aside_not_trusted(course, capsys):
    root, shell = course
    (root / "mygpt2").mkdir()
    (root / "mygpt2" / "parts.json").write_text("{not json", encoding="utf-8")
    assert mine.read_record(root) == {"exercises": {}}
    assert (root / "mygpt2" / "parts.json.damaged").read_text(encoding="utf-8") == "{not json"
    assert "damaged" in capsys.readouterr().out


def test_the_switch_turns_the_package_off(course, monkeypatch):
    root, shell = course
    monkeypatch.setenv("GPT2LIB_LEARNER_PACKAGE", "0")
    run(shell, "import torch\ndef causal_mask(T):\n    return torch.ones(T, T).tril().bool()")
    assert run(shell, CHECK_MASK) == ""
    assert not (root / "mygpt2").exists()


@pytest.mark.slow  # starts a kernel
def test_progress_says_whose_parts_the_notebooks_make(course, monkeypatch):
    from gpt2lib.course.progress import report

    root, shell = course
    path = root / "notebooks" / "03_attention.ipynb"
    learner = nbformat.read(path, as_version=4)
    learner.cells[
        2
    ].source = "import torch\n\ndef causal_mask(T):\n    return torch.ones(T, T).tril().bool()"
    nbformat.write(learner, path)
    out = io.StringIO()
    report(root, ["03", "05"], out=out, live=False)
    lines = out.getvalue().splitlines()
    assert any("Exercise 3.1" in line and "✅" in line for line in lines), lines
    assert (
        "Your GPT-2 (mygpt2/): yours: attention; the reference's: block (5.1: not passed yet)"
        in lines
    )
    assert not (root / "mygpt2").exists()  # progress ran in a scratch copy
