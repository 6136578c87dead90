"""course.py, the bootstrap behind the README's two commands, and the threads kernels get.

The README's first command runs for real in `test_the_readmes_lab_command_in_a_fresh_copy`
(a fresh copy of the course and a fresh HOME: it builds `.venv` there, then starts JupyterLab
twice); its second command is what CI runs (`.ci/run`), and
`test_the_test_command_runs_its_steps` runs it here on a few tests. The rest are unit tests of
the pieces, with pip and the network replaced where the real ones would take minutes.
"""

from __future__ import annotations

import ast
import http.server
import json
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
import tomllib
import urllib.request
from pathlib import Path

import pytest
from readme_commands import readme_commands

REPO_ROOT = Path(__file__).resolve().parents[2]
COURSE_PY = REPO_ROOT / "course.py"
sys.path.insert(0, str(REPO_ROOT))
import course  # noqa: E402
from gpt2lib.course import progress  # noqa: E402

# What the issue lists as the course's needs, and as the tests' alone.
COURSE_PACKAGES = {
    "jupyterlab",
    "torch",
    "numpy",
    "tiktoken",
    "matplotlib",
    "ipywidgets",
    "safetensors",
    "huggingface_hub",
    "tqdm",
    "nbformat",
    "nbclient",
    "regex",
    "ruff",
}
TEST_ONLY = {"pytest", "pytest-xdist", "nbval", "hypothesis", "transformers", "peft", "playwright"}


def requirement_names(path: Path) -> set[str]:
    names = set()
    for line in path.read_text(encoding="utf-8").splitlines():
        line = line.split("#")[0].strip()
        if line and not line.startswith("-"):
            names.add(re.split(r"[=<>!~\[ ]", line)[0].lower().replace("_", "-"))
    return names


def normal(names: set[str]) -> set[str]:
    return {n.lower().replace("_", "-") for n in names}


def run_course(*argv: str, timeout: float = 60, **kwargs) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, str(COURSE_PY), *argv],
        capture_output=True,
        text=True,
        encoding="utf-8",
        timeout=timeout,
        **kwargs,
    )


# --------------------------------------------------------------------------- what is installed


def test_the_course_and_the_tests_need_separate_lists():
    course_needs = requirement_names(REPO_ROOT / "requirements.txt")
    test_file = REPO_ROOT / "requirements-test.txt"
    assert normal(COURSE_PACKAGES) <= course_needs
    assert not course_needs & normal(TEST_ONLY), "a test-only package in the learner's list"
    assert normal(TEST_ONLY) <= requirement_names(test_file)
    assert "-r requirements.txt" in test_file.read_text(encoding="utf-8").splitlines()
    assert course.ENVIRONMENTS["lab"][1] == ["requirements.txt"]
    assert course.ENVIRONMENTS["test"][1] == ["requirements-test.txt"]


def test_the_minimum_python_is_stated_and_the_same_everywhere():
    project = tomllib.loads((REPO_ROOT / "pyproject.toml").read_text(encoding="utf-8"))
    assert project["project"]["requires-python"] == ">={}.{}".format(*course.MIN_PYTHON)
    assert course.MIN_PYTHON == (3, 11)  # numpy 2.4.6 and matplotlib 3.11.2 have no 3.10 wheels
    readme = (REPO_ROOT / "README.md").read_text(encoding="utf-8")
    assert "Python 3.11 or newer" in readme and "3.10 or newer" not in readme


def test_torch_is_pinned_so_the_cpu_build_can_be_named():
    text = (REPO_ROOT / "requirements.txt").read_text(encoding="utf-8")
    assert course.torch_pin(text) == "2.13.0"
    assert course.torch_pin("numpy==1\ntorch == 2.5.1  # comment\n") == "2.5.1"
    assert course.torch_pin("torch>=2.2\n") is None


# --------------------------------------------------------------------------- Python


def test_course_py_is_plain_enough_for_old_pythons_to_read():
    ast.parse(COURSE_PY.read_text(encoding="utf-8"), feature_version=(3, 6))


def old_pythons() -> list[str]:
    """Pythons older than 3.11 here: on PATH, or installed by pyenv (whose shims run only the
    versions it is told to)."""
    candidates = [shutil.which(f"python{v}") for v in ("2.7", "3.6", "3.8", "3.9", "3.10")]
    pyenv = Path(os.environ.get("PYENV_ROOT", Path.home() / ".pyenv"))
    candidates += sorted(str(p) for p in pyenv.glob("versions/*/bin/python"))
    found = {}
    for path in filter(None, candidates):
        try:
            out = subprocess.run(
                [path, "-c", "import sys; print(sys.version_info[:2])"],
                capture_output=True,
                text=True,
                timeout=30,
            )
        except (OSError, subprocess.SubprocessError):
            continue
        version = out.stdout.strip()
        if out.returncode == 0 and tuple(int(n) for n in version.strip("()").split(", ")) < (3, 11):
            found.setdefault("python" + version.strip("()").replace(", ", "."), path)
    return sorted(found.items())  # (name, path), one of each version


OLD_PYTHONS = old_pythons()


@pytest.mark.parametrize(
    "python",
    [path for _, path in OLD_PYTHONS]
    or [pytest.param(None, marks=pytest.mark.skip(reason="no Python older than 3.11 here"))],
    ids=[name for name, _ in OLD_PYTHONS] or None,
)
def test_an_old_python_is_told_in_one_line_which_it_needs(python, tmp_path):
    result = subprocess.run(
        [python, str(COURSE_PY), "setup"],
        capture_output=True,
        text=True,
        cwd=tmp_path,
        timeout=60,
        env=dict(os.environ, GPT2LIB_NO_REEXEC="1"),
    )
    assert result.returncode == 2
    assert result.stderr.count("\n") == 1 and "Traceback" not in result.stderr, result.stderr
    assert "the course needs Python 3.11 or newer" in result.stderr
    assert not (tmp_path / ".venv").exists() and not (REPO_ROOT / "course-setup.json").exists()


def test_an_old_python_hands_over_to_a_newer_one(monkeypatch):
    calls = []
    monkeypatch.setattr(
        course.subprocess, "call", lambda command, env: calls.append((command, env)) or 7
    )
    with pytest.raises(SystemExit) as stopped:
        course.require_python((3, 10, 13), find=lambda: ["/somewhere/python3.12"])
    assert stopped.value.code == 7  # the newer Python's exit status is ours
    command, env = calls[0]
    assert command[:2] == ["/somewhere/python3.12", str(COURSE_PY)]
    assert env["GPT2LIB_NO_REEXEC"] == "1"  # it never hands over again
    with pytest.raises(course.SetupError, match="needs Python 3.11 or newer"):
        course.require_python((3, 10, 13), find=lambda: None)
    course.require_python((3, 11, 0), find=lambda: pytest.fail("no hand-over needed"))


def test_the_newer_python_found_is_the_oldest_new_enough(monkeypatch):
    on_path = {"python3.12": sys.executable, "python3.13": sys.executable}
    monkeypatch.setattr(course.shutil, "which", on_path.get)
    monkeypatch.setattr(course, "WINDOWS", False)
    assert course.newer_python() == [sys.executable]  # 3.12 is tried before 3.13
    tried = []
    monkeypatch.setattr(course.shutil, "which", lambda name: tried.append(name))
    assert course.newer_python() is None
    assert tried == ["python3.11", "python3.12", "python3.13", "python3.14"]


# --------------------------------------------------------------------------- PyTorch's build


@pytest.mark.parametrize(
    "system, machine, nvidia, kind, phrase",
    [
        ("Linux", "x86_64", False, "cpu", "the CPU build"),
        ("Linux", "aarch64", False, "cpu", "the CPU build"),
        ("Linux", "x86_64", True, "pypi", "the CUDA build"),
        ("Darwin", "arm64", False, "pypi", "MPS"),
        ("Windows", "AMD64", False, "pypi", "GPT2LIB_TORCH_INDEX"),
    ],
)
def test_each_machine_gets_its_pytorch(system, machine, nvidia, kind, phrase):
    got, line = course.torch_plan(system, machine, nvidia, index="")
    assert got == kind and phrase in line


def test_a_chosen_index_wins_and_an_intel_mac_is_told_why_not():
    assert course.torch_plan("Windows", "AMD64", False, index="https://x/cu128")[0] == (
        "index:https://x/cu128"
    )
    with pytest.raises(course.SetupError, match="Intel Macs"):
        course.torch_plan("Darwin", "x86_64", False, index="")


class FakePip:
    def __init__(self, *codes):
        self.codes, self.calls = list(codes), []

    def __call__(self, python, args, quiet=False):
        self.calls.append(args)
        return self.codes.pop(0)


def test_the_cpu_build_comes_from_what_pip_reaches_first(monkeypatch):
    fake = FakePip(0)
    monkeypatch.setattr(course, "pip", fake)
    monkeypatch.setattr(course, "reachable", lambda url: pytest.fail("no need to ask the index"))
    course.install_torch("py", "cpu", "2.13.0")
    assert fake.calls == [["torch==2.13.0+cpu", "--retries", "0", "--timeout", "15"]]


class Index(http.server.BaseHTTPRequestHandler):
    def do_HEAD(self):
        self.send_response(200)
        self.end_headers()

    def log_message(self, *args):
        pass


@pytest.fixture
def index_url():
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Index)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield f"http://127.0.0.1:{server.server_address[1]}/whl/cpu"
    server.shutdown()


def test_then_from_pytorchs_index_when_it_answers(monkeypatch, index_url):
    fake = FakePip(1, 0)
    monkeypatch.setattr(course, "pip", fake)
    monkeypatch.setattr(course, "CPU_INDEX", index_url)
    course.install_torch("py", "cpu", "2.13.0")
    assert fake.calls[1] == ["torch==2.13.0+cpu", "--index-url", index_url, "--retries", "2"]


def test_an_unreachable_index_costs_seconds_and_says_so(monkeypatch, capsys):
    fake = FakePip(1)
    monkeypatch.setattr(course, "pip", fake)
    monkeypatch.setattr(course, "CPU_INDEX", "https://download.pytorch.invalid/whl/cpu")
    started = time.monotonic()
    course.install_torch("py", "cpu", "2.13.0")
    assert time.monotonic() - started < course.PROBE_TIMEOUT + 1
    assert len(fake.calls) == 1  # no pip run against the dead index: the requirements follow
    assert "PyTorch's CPU build is out of reach" in capsys.readouterr().out


def test_the_probe_gives_up_on_a_silent_server():
    with socket.socket() as silent:  # listens, never answers
        silent.bind(("127.0.0.1", 0))
        silent.listen()
        started = time.monotonic()
        why = course.reachable(f"http://127.0.0.1:{silent.getsockname()[1]}/", timeout=1)
    assert why and time.monotonic() - started < 3


def test_pypi_builds_and_a_chosen_index_need_no_step_of_their_own(monkeypatch):
    fake = FakePip(0)
    monkeypatch.setattr(course, "pip", fake)
    course.install_torch("py", "pypi", "2.13.0")
    assert fake.calls == []
    course.install_torch("py", "index:https://x/cu128", "2.13.0")
    assert fake.calls == [["torch==2.13.0", "--index-url", "https://x/cu128"]]


# --------------------------------------------------------------------------- the stamp


@pytest.fixture
def course_root(tmp_path, monkeypatch):
    """A course folder of requirement files only, with course.py pointed at it."""
    for name in course.WATCHED:
        (tmp_path / name).write_text(f"# {name}\n", encoding="utf-8")
    monkeypatch.setattr(course, "ROOT", str(tmp_path))
    return tmp_path


def test_the_stamp_is_written_whole_or_not_at_all(tmp_path):
    course.write_stamp(str(tmp_path), {"a": 1})
    assert course.read_stamp(str(tmp_path)) == {"a": 1}
    with pytest.raises(TypeError):
        course.write_stamp(str(tmp_path), {"a": object()})  # fails half-way through
    assert course.read_stamp(str(tmp_path)) == {"a": 1}
    assert sorted(p.name for p in tmp_path.iterdir()) == [course.STAMP]


def test_the_stamp_names_the_python_the_build_and_every_watched_file(course_root):
    stamp = course.wanted_stamp("3.11.7", "cpu")
    assert set(stamp["files"]) == set(course.WATCHED)
    assert course.wanted_stamp("3.11.9", "cpu") == stamp  # a patch release installs nothing
    (course_root / "requirements.txt").write_text("numpy==2\n", encoding="utf-8")
    assert course.wanted_stamp("3.11.7", "cpu") != stamp
    assert course.wanted_stamp("3.12.1", "cpu")["python"] == "3.12"


@pytest.fixture
def small_venv(course_root):
    """A real environment without pip in the course folder (seconds), as `.venv`."""
    venv = course_root / ".venv"
    subprocess.run(
        [sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True, timeout=120
    )
    purelib = "import sysconfig; print(sysconfig.get_paths()['purelib'])"
    site = subprocess.run(
        [course.venv_python(str(venv)), "-c", purelib], capture_output=True, text=True, check=True
    ).stdout.strip()
    (Path(site) / "torch").mkdir()  # a stand-in PyTorch, for the check after installing
    (Path(site) / "torch" / "__init__.py").write_text(
        "__version__ = '0.0+stand-in'\n", encoding="utf-8"
    )
    return venv


def test_an_environment_up_to_date_installs_nothing(small_venv, monkeypatch):
    python = course.venv_python(str(small_venv))
    plan = course.torch_plan()[0]
    course.write_stamp(str(small_venv), course.wanted_stamp(course.venv_version(python), plan))
    monkeypatch.setattr(course, "pip", lambda *a, **k: pytest.fail("pip ran"))
    monkeypatch.setattr(course, "make_venv", lambda *a: pytest.fail("the environment was remade"))
    started = time.monotonic()
    assert course.ensure_environment("lab") == python
    assert time.monotonic() - started < 5


def test_a_changed_requirements_file_installs_again(small_venv, monkeypatch, capsys):
    python = course.venv_python(str(small_venv))
    plan = course.torch_plan()[0]
    course.write_stamp(str(small_venv), course.wanted_stamp(course.venv_version(python), plan))
    (small_venv.parent / "requirements.txt").write_text("torch==2.13.0\n", encoding="utf-8")
    fake = FakePip(*[0] * 5)
    monkeypatch.setattr(course, "pip", fake)
    monkeypatch.setattr(course, "make_venv", lambda *a: pytest.fail("the environment was remade"))
    course.ensure_environment("lab")
    assert ["-r", "requirements.txt", "-q"] in fake.calls  # quiet: most of it is installed
    assert "requirements.txt changed: installing again into .venv" in capsys.readouterr().out
    assert course.read_stamp(str(small_venv)) == course.wanted_stamp(
        course.venv_version(python), plan
    )
    fake.calls.clear()
    course.ensure_environment("lab")  # and then it is up to date again
    assert fake.calls == []


def test_a_pytorch_that_does_not_import_is_an_error_and_no_stamp(small_venv, monkeypatch):
    site = next(small_venv.glob("lib/python*/site-packages"))
    (site / "torch" / "__init__.py").write_text(
        "raise ImportError('libtorch.so: missing')\n", encoding="utf-8"
    )
    monkeypatch.setattr(course, "pip", FakePip(*[0] * 5))
    with pytest.raises(course.SetupError, match="does not import: ImportError: libtorch.so"):
        course.ensure_environment("lab")
    assert course.read_stamp(str(small_venv)) is None


def test_a_broken_environment_is_made_again(course_root, monkeypatch):
    (course_root / ".venv").mkdir()  # no Python in it
    made = []

    def make(venv):
        made.append(venv)
        raise course.SetupError("stop here")

    monkeypatch.setattr(course, "make_venv", make)
    with pytest.raises(course.SetupError, match="stop here"):
        course.ensure_environment("lab")
    assert made == [str(course_root / ".venv")]


def test_missing_requirements_are_one_clear_error(course_root):
    (course_root / "requirements-test.txt").unlink()
    with pytest.raises(course.SetupError, match="requirements-test.txt is missing"):
        course.ensure_environment("test")


# --------------------------------------------------------------------------- the command line


@pytest.mark.parametrize(
    "argv, phrase",
    [
        (["bogus"], "unknown command 'bogus'"),
        (["setup", "everything"], "setup takes `lab` or `test`"),
    ],
)
def test_a_bad_argument_is_one_line_within_a_second(argv, phrase):
    started = time.monotonic()
    result = run_course(*argv)
    assert time.monotonic() - started < 1.0
    assert result.returncode == 2 and result.stdout == ""
    assert result.stderr.count("\n") == 1 and phrase in result.stderr and "usage:" in result.stderr


def test_help_and_parsing():
    result = run_course("--help")
    assert result.returncode == 0 and "python3 course.py test" in result.stdout
    assert course.parse([]) == ("lab", [])
    assert course.parse(["--no-browser"]) == ("lab", ["--no-browser"])
    assert course.parse(["test", "-m", "not slow"]) == ("test", ["-m", "not slow"])
    assert course.parse(["setup", "test"]) == ("setup", ["test"])


# --------------------------------------------------------------------------- JupyterLab


def test_lab_opens_the_course_folder_with_chapter_00_and_keeps_a_learners_layout(
    course_root, monkeypatch
):
    monkeypatch.setattr(course, "running_as_root", lambda: False)
    command = course.lab_command("py", ["--no-browser"])
    assert command[:3] == ["py", "-m", "jupyterlab"]
    assert f"--ServerApp.root_dir={course_root}" in command and command[-1] == "--no-browser"
    assert "--allow-root" not in command
    folder = course_root / ".venv" / "share" / "jupyter" / "lab" / "workspaces"
    assert f"--LabApp.workspaces_dir={folder}" in command
    saved = json.loads((folder / "default-37a8.jupyterlab-workspace").read_text(encoding="utf-8"))
    data = saved["data"]
    assert data["layout-restorer:data"]["main"]["current"] == "notebook:" + course.CHAPTER_ZERO
    assert data["notebook:" + course.CHAPTER_ZERO]["data"]["path"] == course.CHAPTER_ZERO
    assert data["file-browser-filebrowser:cwd"] == {"path": ""}  # the course folder, not notebooks/
    (folder / "default-37a8.jupyterlab-workspace").write_text('{"mine": 1}', encoding="utf-8")
    monkeypatch.setattr(course, "running_as_root", lambda: True)
    command = course.lab_command("py", [])
    assert command.count("--allow-root") == 1  # JupyterLab refuses root without it
    assert course.lab_command("py", ["--allow-root"]).count("--allow-root") == 1
    assert (folder / "default-37a8.jupyterlab-workspace").read_text(encoding="utf-8") == (
        '{"mine": 1}'
    )  # a learner's layout is not reset


def test_the_workspace_file_is_the_one_jupyterlab_reads():
    from jupyterlab_server.workspaces_handler import WORKSPACE_EXTENSION, slugify

    assert slugify("default") + WORKSPACE_EXTENSION == "default-37a8.jupyterlab-workspace"


# --------------------------------------------------------------------------- threads


@pytest.mark.parametrize("cores, threads", [(1, 1), (2, 1), (4, 2), (8, 4), (16, 8), (64, 8)])
def test_kernels_get_half_the_cores(cores, threads, monkeypatch):
    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: set(range(cores)), raising=False)
    assert course.torch_threads() == threads
    assert progress.torch_threads() == threads  # progress's kernels get the same


def test_a_thread_count_set_by_hand_is_kept(monkeypatch):
    monkeypatch.setenv("OMP_NUM_THREADS", "3")
    assert course.course_env()["OMP_NUM_THREADS"] == "3"
    monkeypatch.delenv("OMP_NUM_THREADS")
    assert course.course_env()["OMP_NUM_THREADS"] == str(course.torch_threads())


def test_jupyterlab_runs_in_the_environment_activated(monkeypatch):
    monkeypatch.setenv("PATH", "/usr/bin")
    python = os.path.join("/course", ".venv", "bin", "python")
    env = course.course_env(python)
    assert env["PATH"] == os.path.join("/course", ".venv", "bin") + os.pathsep + "/usr/bin"
    assert env["VIRTUAL_ENV"] == os.path.join("/course", ".venv")


def scratch_course(root: Path, first_cell: str) -> Path:
    """A course folder holding chapter 00's learner notebook with `first_cell` put first."""
    import nbformat

    nb = nbformat.read(str(REPO_ROOT / "notebooks" / "00_start_here.ipynb"), as_version=4)
    nb.cells.insert(0, nbformat.v4.new_code_cell(first_cell))
    (root / "notebooks").mkdir(parents=True)
    nbformat.write(nb, str(root / "notebooks" / "00_start_here.ipynb"))
    return root


@pytest.mark.slow  # starts a kernel, then waits out a 4 s limit
def test_progress_gives_kernels_threads_and_times_out_without_noise(tmp_path):
    seen = tmp_path / "threads.txt"
    root = scratch_course(
        tmp_path / "course",
        (
            f"import os, time\nopen({str(seen)!r}, 'w').write(os.environ.get('OMP_NUM_THREADS', "
            "'unset'))\ntime.sleep(60)"
        ),
    )
    env = {k: v for k, v in os.environ.items() if k != "OMP_NUM_THREADS"}
    result = subprocess.run(
        [
            sys.executable,
            "-m",
            "gpt2lib.course",
            "--root",
            str(root),
            "progress",
            "00",
            "--cell-timeout",
            "4",
        ],
        capture_output=True,
        text=True,
        encoding="utf-8",
        timeout=180,
        env=env,
    )
    assert seen.read_text(encoding="utf-8") == str(progress.torch_threads())
    assert "! timed out after 4 s at cell 0; the cells after it did not run" in result.stdout
    assert result.returncode == 1
    assert result.stderr.strip() == "", result.stderr  # no "Task was destroyed but it is pending!"


# --------------------------------------------------------------------------- the test command


def test_the_browser_line_says_what_happened(monkeypatch, capsys):
    monkeypatch.setattr(course, "find_browser", lambda python: ("/usr/bin/chromium", ""))
    monkeypatch.setattr(course, "install_browser", lambda python: pytest.fail("installed"))
    course.ensure_browser("py")
    assert capsys.readouterr().out == (
        "course.py: browser for the JupyterLab tests: /usr/bin/chromium (already here)\n"
    )

    found = iter([("", "no chromium"), ("/opt/pw/chrome", "")])
    monkeypatch.setattr(course, "find_browser", lambda python: next(found))
    monkeypatch.setattr(course, "install_browser", lambda python: ("Playwright's Chromium", []))
    course.ensure_browser("py")
    assert "installed Playwright's Chromium (/opt/pw/chrome)" in capsys.readouterr().out

    monkeypatch.setattr(course, "find_browser", lambda python: ("", "no chromium"))
    monkeypatch.setattr(course, "install_browser", lambda python: ("", ["playwright: offline"]))
    for ci, outcome in (("", "they are skipped"), ("true", "they fail (CI=true)")):
        monkeypatch.setenv("CI", ci)
        course.ensure_browser("py")
        line = capsys.readouterr().out
        assert line.count("\n") == 1 and "none (no chromium; playwright: offline)" in line
        assert line.rstrip().endswith(outcome)


class FakeRun:
    def __init__(self, failing=()):
        self.failing, self.calls = failing, []

    def __call__(self, command, **kwargs):
        self.calls.append(command)
        code = 1 if any(word in command for word in self.failing) else 0
        return subprocess.CompletedProcess(command, code, "", "E: no such package\n")


def test_debians_chromium_as_root_then_playwrights(monkeypatch):
    monkeypatch.setattr(course.platform, "system", lambda: "Linux")
    monkeypatch.setattr(course.shutil, "which", lambda name: "/usr/bin/" + name)
    monkeypatch.setattr(course, "running_as_root", lambda: True)
    run = FakeRun()
    assert course.install_browser("py", run=run) == ("Debian's chromium, with apt-get", [])
    assert run.calls[-1] == ["apt-get", "install", "-y", "-qq", "chromium"]

    run = FakeRun(failing=("install",))  # apt-get install fails, and so does playwright
    how, tried = course.install_browser("py", run=run)
    assert how == "" and run.calls[-1] == ["py", "-m", "playwright", "install", "chromium"]
    assert tried == ["apt-get: E: no such package", "playwright: E: no such package"]

    monkeypatch.setattr(course, "running_as_root", lambda: False)  # no apt-get without root
    run = FakeRun()
    assert course.install_browser("py", run=run)[0].startswith("Playwright's Chromium")
    assert run.calls == [["py", "-m", "playwright", "install", "chromium"]]


def test_the_test_command_runs_check_lint_and_pytest_in_that_order(monkeypatch):
    monkeypatch.setattr(course, "has_ruff_config", lambda: True)
    steps = course.test_steps("py", ["-m", "not slow"])
    assert [name for name, _ in steps] == ["course check", "ruff check", "ruff format", "pytest"]
    assert steps[1][1] == ["py", "-m", "ruff", "check", "."]
    assert steps[2][1] == ["py", "-m", "ruff", "format", "--check", "."]
    assert steps[-1][1] == ["py", "-m", "pytest", "-m", "not slow"]
    monkeypatch.setattr(course, "has_ruff_config", lambda: False)
    assert [name for name, _ in course.test_steps("py", [])] == ["course check", "pytest"]


def test_every_step_runs_and_the_failed_ones_are_named(monkeypatch, capsys):
    monkeypatch.setattr(course, "ensure_environment", lambda kind: sys.executable)
    monkeypatch.setattr(course, "ensure_browser", lambda python: None)
    monkeypatch.setattr(
        course,
        "test_steps",
        lambda python, args: [
            ("first", [sys.executable, "-c", "raise SystemExit(3)"]),
            ("second", [sys.executable, "-c", "print('second ran')"]),
        ],
    )
    assert course.test([]) == 1
    out = capsys.readouterr().out
    assert "FAILED: first (exit 3)" in out.splitlines()[-1]


def test_the_ruff_steps_follow_the_repositorys_configuration(course_root):
    (course_root / "pyproject.toml").write_text("[project]\nname = 'x'\n", encoding="utf-8")
    assert not course.has_ruff_config()
    (course_root / "pyproject.toml").write_text(
        "[tool.ruff]\nline-length = 100\n", encoding="utf-8"
    )
    assert course.has_ruff_config()


def in_the_tests_environment() -> bool:
    return Path(sys.prefix).resolve() == (REPO_ROOT / ".venv-test").resolve()


@pytest.mark.slow
@pytest.mark.skipif(
    not in_the_tests_environment(),
    reason="runs `python3 course.py test`, which would build .venv-test here",
)
def test_the_test_command_runs_its_steps():
    """The README's test command, on one fast test: the environment is up to date, so it
    installs nothing, then says which browser, and runs course check, (lint,) and pytest."""
    words = readme_commands()["test"].split()
    assert words[:2] == ["python3", "course.py"]
    result = subprocess.run(
        [
            sys.executable,
            *words[1:],
            "-n",
            "0",
            "-q",
            "tests/course/test_setup.py::test_help_and_parsing",
        ],
        cwd=REPO_ROOT,
        capture_output=True,
        text=True,
        encoding="utf-8",
        timeout=600,
    )
    lines = [line for line in result.stdout.splitlines() if line.startswith("course.py: ")]
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    assert not any("installing" in line for line in lines), lines
    assert lines[0].startswith("course.py: browser for the JupyterLab tests: ")
    assert any(line.startswith("course.py: course check: ") for line in lines)
    assert any(line.startswith("course.py: pytest: ") for line in lines)
    assert lines[-1].startswith("course.py: every step passed")


# --------------------------------------------------------------------------- the README's first command


def fresh_copy(target: Path) -> Path:
    """The course as a fresh clone of this working tree has it: tracked and new files, not
    ignored ones (no environments, no caches)."""
    listed = subprocess.run(
        ["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"],
        cwd=REPO_ROOT,
        capture_output=True,
        check=True,
    ).stdout
    for name in filter(None, listed.decode("utf-8").split("\0")):
        source = REPO_ROOT / name
        if source.is_file():
            (target / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(source, target / name)
    return target


def system_python3() -> str | None:
    """`python3` as a newcomer's shell finds it: PATH without this test environment."""
    here = str(Path(sys.prefix) / "bin")
    path = os.pathsep.join(p for p in os.environ.get("PATH", "").split(os.pathsep) if p != here)
    return shutil.which("python3", path=path)


def newcomer_env(home: Path) -> dict[str, str]:
    env = {
        k: v
        for k, v in os.environ.items()
        if not k.startswith(("JUPYTER", "GPT2LIB_", "VIRTUAL_ENV", "PYTHON", "OMP_"))
    }
    here = str(Path(sys.prefix) / "bin")
    env["PATH"] = os.pathsep.join(p for p in env.get("PATH", "").split(os.pathsep) if p != here)
    env.update(HOME=str(home), BROWSER="true")  # JupyterLab "opens" its page with `true`
    for name in ("XDG_CACHE_HOME", "XDG_CONFIG_HOME", "XDG_DATA_HOME", "XDG_RUNTIME_DIR"):
        env.pop(name, None)
    return env


def start_readme_lab(folder: Path, env: dict[str, str], log: Path, timeout: float):
    """Run the README's first command in `folder`; (process, server info, seconds until
    chapter 00 was served)."""
    command = readme_commands()["lab"]
    started = time.monotonic()
    process = subprocess.Popen(
        command,
        shell=True,
        cwd=folder,
        env=env,
        stdout=log.open("w", encoding="utf-8"),
        stderr=subprocess.STDOUT,
        start_new_session=True,
    )
    runtime = Path(env["HOME"]) / ".local" / "share" / "jupyter" / "runtime"
    while time.monotonic() - started < timeout and process.poll() is None:
        for found in runtime.glob("jpserver-*.json"):
            try:
                info = json.loads(found.read_text(encoding="utf-8"))
                url = (
                    f"{info['url']}api/contents/{course.CHAPTER_ZERO}?content=0"
                    f"&token={info['token']}"
                )
                with urllib.request.urlopen(url, timeout=2) as answer:
                    if answer.status == 200:
                        return process, info, time.monotonic() - started
            except (OSError, ValueError, KeyError):
                pass
        time.sleep(0.1)
    stop(process)
    raise AssertionError(
        f"JupyterLab did not serve chapter 00 within {timeout:.0f} s:\n"
        + log.read_text(encoding="utf-8", errors="replace")[-4000:]
    )


def stop(process: subprocess.Popen) -> None:
    if process.poll() is None:
        os.killpg(process.pid, signal.SIGTERM)
        try:
            process.wait(timeout=30)
        except subprocess.TimeoutExpired:
            os.killpg(process.pid, signal.SIGKILL)
            process.wait(timeout=10)


def api(info: dict, path: str):
    with urllib.request.urlopen(f"{info['url']}{path}?token={info['token']}", timeout=10) as r:
        return json.load(r)


@pytest.mark.slow  # builds the learner's environment from nothing: minutes
@pytest.mark.skipif(sys.platform == "win32", reason="the POSIX shell and process groups")
@pytest.mark.skipif(system_python3() is None, reason="no python3 on PATH")
def test_the_readmes_lab_command_in_a_fresh_copy(tmp_path):
    folder, home = fresh_copy(tmp_path / "course"), tmp_path / "home"
    home.mkdir()
    env = newcomer_env(home)
    log = tmp_path / "first.log"
    process, info, first = start_readme_lab(folder, env, log, timeout=1200)
    try:
        assert Path(info["root_dir"]).resolve() == folder.resolve()
        names = {item["name"] for item in api(info, "api/contents")["content"]}
        assert {"notebooks", "solutions", "gpt2lib", "README.md"} <= names  # the course folder
        layout = api(info, "lab/api/workspaces/default")["data"]
        assert layout["layout-restorer:data"]["main"]["current"] == (
            "notebook:" + course.CHAPTER_ZERO
        )
        assert layout["file-browser-filebrowser:cwd"] == {"path": ""}
        assert "python3" in api(info, "api/kernelspecs")["kernelspecs"]
    finally:
        stop(process)
    said = log.read_text(encoding="utf-8")
    print(f"first run: chapter 00 served after {first:.0f} s")  # for the record (pytest -s)
    assert "course.py: making a virtual environment in .venv" in said
    python = folder / ".venv" / "bin" / "python"
    installed = subprocess.run(
        [str(python), "-m", "pip", "list", "--format=json"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    installed = normal({p["name"] for p in json.loads(installed)})
    assert normal(COURSE_PACKAGES) <= installed
    assert not installed & normal(TEST_ONLY | {"pytest_xdist", "accelerate"}), "test-only packages"
    if course.torch_plan()[0] == "cpu":  # this machine: Linux without an NVIDIA GPU
        version = subprocess.run(
            [str(python), "-c", "import torch; print(torch.__version__)"],
            capture_output=True,
            text=True,
        ).stdout
        assert version.strip().endswith("+cpu")

    log = tmp_path / "second.log"
    process, info, second = start_readme_lab(folder, env, log, timeout=60)
    stop(process)
    print(f"second run: chapter 00 served after {second:.1f} s")
    assert second < 10, f"the second run took {second:.1f} s to serve chapter 00"
    said = log.read_text(encoding="utf-8")
    assert "installing" not in said and "making a virtual environment" not in said
