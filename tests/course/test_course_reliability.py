"""The course tool under stress (issues 24 and 27): concurrent commands, Ctrl-C, bad arguments,
files and folders in the wrong place, and a learner's work that is not drift."""

from __future__ import annotations

import io
import os
import signal
import stat
import subprocess
import sys
import threading
import time
from pathlib import Path

import nbformat
import pytest
from nbformat.v4 import new_output
from test_course import (
    chapter_01,
    chapter_02,
    learner_path,
    progress_chapter,
    read,
    set_source,
    type_answer,
    write_notebook,
)

from gpt2lib import course
from gpt2lib.course import CourseError, progress


@pytest.fixture
def built(tmp_path: Path) -> Path:
    write_notebook(tmp_path / "solutions" / "01_tokenizer.ipynb", chapter_01())
    write_notebook(tmp_path / "solutions" / "02_embeddings.ipynb", chapter_02())
    (tmp_path / "gpt2lib").mkdir()
    course.build(tmp_path, out=io.StringIO())
    return tmp_path


def run_module(*argv: str, timeout: float = 120, **kwargs) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "gpt2lib.course", *argv],
        capture_output=True,
        text=True,
        encoding="utf-8",
        timeout=timeout,
        **kwargs,
    )


def run_main(capsys, *argv: str) -> subprocess.CompletedProcess:
    """`course.main` in this process (a subprocess imports torch: seconds per call)."""
    capsys.readouterr()
    try:
        rc = course.main(list(argv))
    except SystemExit as exc:  # --help
        rc = exc.code
    captured = capsys.readouterr()
    return subprocess.CompletedProcess(argv, rc, captured.out, captured.err)


def assert_one_error_line(result: subprocess.CompletedProcess, phrase: str) -> None:
    assert result.returncode == 2, result.stdout + result.stderr
    assert result.stderr.startswith("error: ") and result.stderr.count("\n") == 1, result.stderr
    assert phrase in result.stderr, result.stderr
    assert "Traceback" not in result.stdout + result.stderr


# --------------------------------------------------------------------------- concurrency


def edits_kept(root: Path, marker: str) -> bool:
    """Whether the learner's edit `marker` survives, in the notebook or in a backup."""
    places = [learner_path(root), *(root / "notebooks" / "backups").glob("*.ipynb")]
    return any(marker in place.read_text(encoding="utf-8") for place in places)


def test_reset_and_restore_from_two_threads_lose_nothing_and_write_valid_json(built):
    type_answer(built, "a + b  # round -1")
    course.reset("01", built, out=io.StringIO())  # so that restore has a backup to take
    errors: list[BaseException] = []
    for round_number in range(25):
        marker = f"round {round_number}"
        type_answer(built, f"a + b  # {marker}")
        barrier = threading.Barrier(2)

        def run(command, barrier=barrier):
            try:
                barrier.wait()
                command()
            except CourseError as exc:  # "already the same" and the like are fine; crashes are not
                errors.append(exc)
            except BaseException as exc:  # noqa: BLE001 - reported below
                errors.append(exc)

        threads = [
            threading.Thread(
                target=run, args=(lambda: course.reset("01", built, out=io.StringIO()),)
            ),
            threading.Thread(
                target=run, args=(lambda: course.restore("01", "1", built, out=io.StringIO()),)
            ),
        ]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
        nbformat.validate(read(learner_path(built)))  # valid JSON, a valid notebook
        assert edits_kept(built, marker), f"the edit of round {round_number} was lost"
    assert not errors, errors
    assert not list((built / "notebooks").glob(".*.tmp"))  # no temporary file left behind


@pytest.mark.slow  # starts four Python processes
def test_reset_and_restore_from_two_processes_lose_nothing(built):
    type_answer(built, "a + b  # first")
    course.reset("01", built, out=io.StringIO())
    env = dict(os.environ, PYTHONPATH=str(course.REPO_ROOT))
    for round_number in range(2):
        marker = f"process round {round_number}"
        type_answer(built, f"a + b  # {marker}")
        commands = [["reset", "01"], ["restore", "01", "1"]]
        running = [
            subprocess.Popen(
                [sys.executable, "-m", "gpt2lib.course", "--root", str(built), *argv],
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                text=True,
                env=env,
            )
            for argv in commands
        ]
        for process in running:
            _, err = process.communicate(timeout=120)
            assert process.returncode == 0, err
        nbformat.validate(read(learner_path(built)))
        assert edits_kept(built, marker)


def test_a_write_that_fails_leaves_the_old_notebook_whole(built, monkeypatch):
    type_answer(built, "a + b  # mine")
    before = learner_path(built).read_bytes()

    def full_disk(*args, **kwargs):
        raise OSError(28, "No space left on device")

    import gpt2lib.files

    monkeypatch.setattr(gpt2lib.files.os, "replace", full_disk)
    with pytest.raises(OSError):
        course.reset("01", built, out=io.StringIO())
    assert learner_path(built).read_bytes() == before
    assert not [p for p in (built / "notebooks").rglob("*.tmp")]


# --------------------------------------------------------------------------- bad arguments


@pytest.mark.parametrize(
    "argv, phrase",
    [
        (["restore", "01", "²"], "no backup '²'"),
        (["restore", "²"], "'²' is not a chapter number"),
        (["reset", "٣"], "'٣' is not a chapter number"),
        (["progress", "²"], "'²' is not a chapter number"),
        (
            ["progress", "--cell-timeout", "0"],
            "--cell-timeout must be a whole number of seconds, at least 1",
        ),
        (["progress", "--cell-timeout", "-1"], "--cell-timeout must be a whole number of seconds"),
        (["progress", "--cell-timeout", "ten"], "--cell-timeout must be a whole number of seconds"),
        (["frobnicate"], "invalid choice"),
        ([], "the following arguments are required"),
        (["reset"], "the following arguments are required: chapter"),
        (["restore", "01", "1", "2"], "unrecognized arguments"),
    ],
)
def test_every_bad_argument_gives_one_error_line(built, argv, phrase, capsys):
    if argv[:1] == ["restore"] and argv[1:2] == ["01"]:
        type_answer(built, "a + b")
        course.reset("01", built, out=io.StringIO())
    assert_one_error_line(run_main(capsys, "--root", str(built), *argv), phrase)


def test_a_bad_argument_run_as_a_module_gives_one_error_line(built):
    assert_one_error_line(
        run_module("--root", str(built), "restore", "²"), "'²' is not a chapter number"
    )


def test_a_root_that_does_not_exist_says_so(tmp_path, capsys):
    missing = tmp_path / "nowhere"
    for command in (["progress"], ["build"], ["check"], ["reset", "01"]):
        assert_one_error_line(run_main(capsys, "--root", str(missing), *command), "does not exist")


def test_a_cell_timeout_of_zero_in_the_environment_is_refused(built, monkeypatch):
    monkeypatch.setenv("GPT2LIB_PROGRESS_CELL_TIMEOUT", "0")
    with pytest.raises(CourseError, match="at least 1"):
        progress.cell_timeout()


def test_help_texts_carry_no_maintainer_notes(capsys):
    for argv in (["--help"], ["progress", "--help"], ["restore", "--help"]):
        result = run_main(capsys, *argv)
        assert result.returncode == 0
        assert "written by hand" not in result.stdout.lower()
        assert "CONTRIBUTING" not in result.stdout


# --------------------------------------------------------------------------- things in the way


def test_reset_when_backups_is_a_file_says_what_is_wrong(built, capsys):
    type_answer(built, "a + b  # mine")
    before = learner_path(built).read_bytes()
    (built / "notebooks" / "backups").write_text("not a folder", encoding="utf-8")
    result = run_main(capsys, "--root", str(built), "reset", "01")
    assert_one_error_line(result, "notebooks/backups is a file")
    assert learner_path(built).read_bytes() == before  # nothing was changed
    assert_one_error_line(
        run_main(capsys, "--root", str(built), "restore", "01"), "backups is a file"
    )


def test_reset_when_the_notebook_path_is_a_folder_says_what_is_wrong(built, capsys):
    learner_path(built).unlink()
    learner_path(built).mkdir()
    (learner_path(built) / "mine.txt").write_text("kept", encoding="utf-8")
    assert_one_error_line(run_main(capsys, "--root", str(built), "reset", "01"), "is a folder")
    assert (learner_path(built) / "mine.txt").read_text(encoding="utf-8") == "kept"
    assert_one_error_line(run_main(capsys, "--root", str(built), "build"), "is a folder")


# --------------------------------------------------------------------------- a learner's work


def test_a_learners_answers_are_not_drift_for_check_or_build(built):
    type_answer(built, "a + b  # mine")
    nb = read(learner_path(built))
    nb.cells[4].outputs = [new_output("stream", name="stdout", text="✅\n")]
    nb.cells[4].execution_count = 7
    nb.metadata["widgets"] = {"state": {}}
    nbformat.write(nb, str(learner_path(built)))
    mine = learner_path(built).read_bytes()
    assert course.check(built) == []
    out = io.StringIO()
    course.build(built, out=out)
    assert learner_path(built).read_bytes() == mine  # left alone: it is up to date
    assert (
        "kept notebooks/01_tokenizer.ipynb: it holds your answers and is up to date"
        in out.getvalue()
    )
    assert not (built / "notebooks" / "backups").exists()


def test_a_changed_cell_outside_the_exercises_is_still_drift(built):
    set_source(learner_path(built), 9, "print(SCALE * 4)  # edited by hand")
    problems = course.check(built)
    assert len(problems) == 1 and problems[0].startswith(
        "notebooks/01_tokenizer.ipynb: cell 9 was changed"
    )
    assert "keeps that copy in notebooks/backups/" in problems[0]  # never advice that loses it


def test_a_learner_notebook_built_from_an_older_chapter_is_drift_and_the_advice_keeps_the_work(
    built,
):
    type_answer(built, "a + b  # mine")
    set_source(built / "solutions" / "01_tokenizer.ipynb", 9, "print(SCALE * 5)")
    problems = [p for p in course.check(built) if p.startswith("notebooks/")]
    assert problems == [
        "notebooks/01_tokenizer.ipynb: built from another version of its solution notebook; it "
        "also holds typed-in work. `python -m gpt2lib.course build` keeps that copy in "
        "notebooks/backups/ and writes the new one (`python -m gpt2lib.course restore 01` lists "
        "the backups)"
    ]


def test_a_hand_edited_module_still_fails_check(built):
    type_answer(built, "a + b  # mine")
    module = built / "gpt2lib" / "chapters" / "bpe.py"
    module.write_text(module.read_text(encoding="utf-8") + "\nX = 1\n", encoding="utf-8")
    assert course.check(built) == [
        "gpt2lib/chapters/bpe.py: edited by hand; change the notebook instead (build keeps a backup "
        "of this version and rewrites it)"
    ]


def test_the_restore_list_says_which_backups_hold_work(built):
    out = io.StringIO()
    course.reset("01", built, out=out)  # fresh: no backup
    type_answer(built, "a + b  # mine")
    course.reset("01", built, out=out)  # a backup with exercise 1.1 answered
    nb = read(learner_path(built))
    nb.cells[1].source = "import math\n\nSCALE = 3"  # changed, but no exercise answered
    nbformat.write(nb, str(learner_path(built)))
    course.reset("01", built, out=out)
    course.reset("01", built, out=out)  # already fresh: no backup
    listing = io.StringIO()
    course.restore("01", None, built, out=listing)
    lines = listing.getvalue().splitlines()
    assert lines[1].endswith("; answers typed into 0 of 2 exercises)")
    assert lines[2].endswith("; answers typed into 1 of 2 exercises)")
    # A backup of an untouched copy (made by another tool, or before a rebuild) says so.
    fresh_copy = built / "notebooks" / "backups" / "01_tokenizer.2020-01-01T00-00-00.ipynb"
    fresh_copy.write_bytes(learner_path(built).read_bytes())
    listing = io.StringIO()
    course.restore("01", None, built, out=listing)
    assert listing.getvalue().splitlines()[3].endswith("; a fresh copy, nothing typed in)")


# --------------------------------------------------------------------------- progress


@pytest.fixture
def slow_course(tmp_path: Path) -> tuple[Path, Path]:
    """A course whose exercise 1.1 answer records the kernel's pid, then sleeps."""
    write_notebook(tmp_path / "solutions" / "01_tokenizer.ipynb", progress_chapter())
    write_notebook(tmp_path / "solutions" / "02_embeddings.ipynb", progress_chapter())
    (tmp_path / "gpt2lib").mkdir()
    course.build(tmp_path, out=io.StringIO())
    pid_file = tmp_path / "kernel.pid"
    set_source(
        learner_path(tmp_path),
        3,
        (
            "import os, pathlib, time\n"
            f"pathlib.Path({str(pid_file)!r}).write_text(str(os.getpid()), encoding='utf-8')\n"
            "time.sleep(600)\n\n"
            "def double(x):\n    return 2 * x"
        ),
    )
    return tmp_path, pid_file


def alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat", encoding="utf-8") as stat:
            return stat.read().split(") ")[1][0] != "Z"  # a zombie is not running
    except FileNotFoundError:
        return False


@pytest.mark.slow  # starts a kernel
@pytest.mark.skipif(sys.platform == "win32", reason="sends SIGINT, a POSIX signal")
def test_ctrl_c_during_progress_stops_it_with_no_kernel_left(slow_course):
    root, pid_file = slow_course
    env = dict(os.environ, PYTHONPATH=str(course.REPO_ROOT))
    process = subprocess.Popen(
        [sys.executable, "-m", "gpt2lib.course", "--root", str(root), "progress"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        encoding="utf-8",
        env=env,
    )
    deadline = time.monotonic() + 120
    while not pid_file.exists() and time.monotonic() < deadline and process.poll() is None:
        time.sleep(0.2)
    assert pid_file.exists(), process.communicate()
    time.sleep(0.5)
    kernel = int(pid_file.read_text(encoding="utf-8"))
    process.send_signal(signal.SIGINT)
    out, err = process.communicate(timeout=60)
    assert process.returncode == 130, out + err
    assert err.strip().splitlines()[-1] == "stopped", err
    assert "02_embeddings" not in out  # the next chapter did not start
    assert "could not run" not in out and "Task exception" not in err and "Traceback" not in err
    for _ in range(50):
        if not alive(kernel):
            break
        time.sleep(0.1)
    assert not alive(kernel), "the kernel is still running"


@pytest.mark.slow  # starts a kernel
def test_progress_shows_a_bar_while_it_runs(tmp_path):
    write_notebook(tmp_path / "solutions" / "01_tokenizer.ipynb", progress_chapter())
    (tmp_path / "gpt2lib").mkdir()
    course.build(tmp_path, out=io.StringIO())
    checks = read(tmp_path / "solutions" / "01_tokenizer.ipynb").cells[1].source
    set_source(learner_path(tmp_path), 1, checks + "\nimport time\ntime.sleep(1.5)")
    live = io.StringIO()
    progress.report(tmp_path, ["01"], out=io.StringIO(), timeout=60, live=live)
    drawn = live.getvalue()
    code_cells = sum(c.cell_type == "code" for c in read(learner_path(tmp_path)).cells)
    assert f"cell 1 of {code_cells} code cells" in drawn  # drawn while cell 1 sleeps
    assert (
        drawn.rstrip("\n")
        .split("\r")[-1]
        .startswith(f"  [{'#' * 20}] ran {code_cells} of {code_cells}")
    )


@pytest.mark.skipif(os.name == "nt", reason="POSIX modes")
def test_build_and_reset_write_notebooks_and_modules_with_the_umask_s_mode(tmp_path):
    old_umask = os.umask(0o022)
    try:
        write_notebook(tmp_path / "solutions" / "01_tokenizer.ipynb", chapter_01())
        (tmp_path / "gpt2lib").mkdir()
        course.build(tmp_path, out=io.StringIO())
        written = list((tmp_path / "notebooks").glob("*.ipynb")) + list(
            (tmp_path / "gpt2lib" / "chapters").glob("*.py")
        )
        course.reset("01", tmp_path, out=io.StringIO())
    finally:
        os.umask(old_umask)
    modes = {stat.S_IMODE(os.stat(path).st_mode) for path in written}
    assert len(written) >= 2 and modes == {0o644}
