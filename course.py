"""Set up and open the course, or run its tests, with nothing installed beforehand but Python.

    python3 course.py              open the course in JupyterLab, on chapter 00
    python3 course.py test         run every check and test (course check, ruff, pytest)
    python3 course.py setup        only set up the learner's environment (.venv)
    python3 course.py setup test   only set up the tests' environment (.venv-test)

(Windows: `py course.py`.) Words after `lab` go to JupyterLab, after `test` to pytest:
`python3 course.py lab --no-browser`, `python3 course.py test -m "not slow" tests/`.

The first run makes a virtual environment next to this file and installs into it what the
course needs (requirements.txt; the tests add requirements-test.txt, in a second environment,
so a learner's holds no test-only package). PyTorch comes first, as the machine needs it:
Linux without an NVIDIA GPU the CPU build, Linux with one the CUDA build, macOS the MPS build,
Windows the CPU build (GPT2LIB_TORCH_INDEX=<a PyTorch index URL> chooses another, such as a
CUDA build there). A stamp file in the environment records what was installed; a later run
whose files, Python and PyTorch choice match it installs nothing and works offline, and a
changed requirements file installs again.

This file uses only Python's standard library and runs on old Pythons far enough to say which
one the course needs.
"""

# Python 2 must read this far to say that it is too old: print_function, and %-formatting
# throughout (f-strings are a syntax error there).
# ruff: noqa: UP010, UP031
from __future__ import print_function

import hashlib
import json
import os
import platform
import shutil
import subprocess
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.abspath(__file__))
MIN_PYTHON = (3, 11)  # numpy 2.4.6 and matplotlib 3.11.2 (requirements.txt) need 3.11
WHY_MIN_PYTHON = "numpy 2.4.6 and matplotlib 3.11.2, pinned in requirements.txt, need it"
SETUP_VERSION = 1  # bump when what this file installs changes without a requirements change
STAMP = "course-setup.json"  # inside the environment
CPU_INDEX = "https://download.pytorch.org/whl/cpu"
INDEX_ENV = "GPT2LIB_TORCH_INDEX"
PROBE_TIMEOUT = 5.0  # seconds to wait for PyTorch's index before using what pip can reach
WINDOWS = os.name == "nt"

# What each command installs, where, and from which files (paths relative to ROOT).
ENVIRONMENTS = {
    "lab": (".venv", ["requirements.txt"]),
    "test": (".venv-test", ["requirements-test.txt"]),
}
# Files whose change means "install again": the requirements and the package's own metadata
# (requirements.txt installs the course folder itself, editable).
WATCHED = ["requirements.txt", "requirements-test.txt", "pyproject.toml", "setup.cfg"]
CHAPTER_ZERO = "notebooks/00_start_here.ipynb"
COMMANDS = ("lab", "test", "setup")
USAGE = "usage: python3 course.py [lab [JUPYTERLAB ARGS] | test [PYTEST ARGS] | setup [lab|test]]"


class SetupError(Exception):
    """Something the learner has to fix; the message is the one line printed."""


def say(message):
    print("course.py: " + message, flush=True)


# --------------------------------------------------------------------------- Python


def version_text(info=None):
    info = info or sys.version_info
    return ".".join(str(part) for part in tuple(info)[:3])


def newer_python():
    """Another Python on PATH that is new enough, or None: the one to run instead. The oldest
    such first: the pinned packages are surest to have wheels for it."""
    which = getattr(shutil, "which", None)  # Python 2 has none: it only gets the message
    minors = range(MIN_PYTHON[1], MIN_PYTHON[1] + 4)
    if which is None:
        return None
    if WINDOWS:
        launcher = which("py")
        candidates = [[launcher, "-3.%d" % minor] for minor in minors] if launcher else []
    else:
        candidates = [[which("python3.%d" % minor)] for minor in minors]
        candidates = [c for c in candidates if c[0]]
    for command in candidates:
        try:
            out = subprocess.Popen(
                command + ["-c", "import sys; print(sys.version_info[:2] >= %r)" % (MIN_PYTHON,)],
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                universal_newlines=True,
            )
            answer = out.communicate()[0]
        except OSError:
            continue
        if out.returncode == 0 and answer.strip() == "True":
            return command
    return None


def require_python(info=None, find=newer_python):
    """Return when this Python is new enough; else re-run this file with one that is, or stop."""
    info = info or sys.version_info
    if tuple(info)[:2] >= MIN_PYTHON:
        return
    needed = "%d.%d" % MIN_PYTHON
    other = None if os.environ.get("GPT2LIB_NO_REEXEC") else find()
    if other:
        say(
            "this is Python %s; the course needs %s or newer, so running %s instead"
            % (version_text(info), needed, " ".join(other))
        )
        env = dict(os.environ, GPT2LIB_NO_REEXEC="1")
        sys.exit(subprocess.call(other + [os.path.abspath(__file__)] + sys.argv[1:], env=env))
    raise SetupError(
        "the course needs Python %s or newer (%s); this is Python %s (%s). Install "
        "Python %s or newer (python.org, or your package manager), then run this "
        "file with it." % (needed, WHY_MIN_PYTHON, version_text(info), sys.executable, needed)
    )


# --------------------------------------------------------------------------- PyTorch's build


def has_nvidia_gpu():
    return bool(shutil.which("nvidia-smi")) or os.path.exists("/proc/driver/nvidia/version")


def torch_plan(system=None, machine=None, nvidia=None, index=None):
    """How PyTorch is installed here: (kind, one line saying so).

    kind: "cpu" (Linux without an NVIDIA GPU: the CPU build, which PyPI does not carry),
    "index:<url>" (GPT2LIB_TORCH_INDEX), or "pypi" (what pip picks: CUDA on Linux, MPS on
    macOS, CPU on Windows)."""
    system = system if system is not None else platform.system()
    machine = machine if machine is not None else platform.machine()
    index = index if index is not None else os.environ.get(INDEX_ENV, "").strip()
    if index:
        return "index:" + index, "PyTorch from %s (%s)" % (index, INDEX_ENV)
    if system == "Linux":
        if nvidia if nvidia is not None else has_nvidia_gpu():
            return "pypi", "PyTorch: the CUDA build (an NVIDIA GPU is here)"
        return (
            "cpu",
            "PyTorch: the CPU build (no NVIDIA GPU here; about 0.9 GB, not the 6 GB CUDA build)",
        )
    if system == "Darwin":
        if machine == "x86_64":
            raise SetupError(
                "PyTorch has no build for Intel Macs any more (only Apple silicon); "
                "use a Linux machine or Apple silicon for this course"
            )
        return "pypi", "PyTorch: the macOS build, which uses the GPU through MPS"
    if system == "Windows":
        return "pypi", (
            "PyTorch: the CPU build. For an NVIDIA GPU, set %s to the CUDA index "
            "pytorch.org/get-started shows (e.g. https://download.pytorch.org/whl/"
            "cu128) and run this again" % INDEX_ENV
        )
    return "pypi", "PyTorch: what pip picks for %s" % system


def torch_pin(requirements_text):
    """The version after `torch==` in requirements.txt, or None."""
    for line in requirements_text.splitlines():
        words = line.split("#")[0].replace(" ", "")
        if words.lower().startswith("torch=="):
            return words[len("torch==") :]
    return None


def reachable(url, timeout=PROBE_TIMEOUT):
    """'' when `url` answers within `timeout` seconds, else why not (one short phrase)."""
    import urllib.error
    import urllib.request

    try:
        request = urllib.request.Request(url, method="HEAD")
        with urllib.request.urlopen(request, timeout=timeout):
            return ""
    except urllib.error.HTTPError as exc:  # it answered: the index is there
        return "" if exc.code < 500 else "HTTP %d" % exc.code
    except (OSError, ValueError) as exc:
        reason = getattr(exc, "reason", exc)
        return str(reason) or type(exc).__name__


# --------------------------------------------------------------------------- environments


def venv_python(venv):
    return (
        os.path.join(venv, "Scripts", "python.exe")
        if WINDOWS
        else os.path.join(venv, "bin", "python")
    )


def file_digest(path):
    try:
        with open(path, "rb") as handle:
            return hashlib.sha256(handle.read()).hexdigest()
    except FileNotFoundError:
        return None


def wanted_stamp(python_version, plan):
    """What an up-to-date environment's stamp holds. Python as major.minor: a patch release of
    the same Python keeps the environment's packages working."""
    return {
        "setup_version": SETUP_VERSION,
        "python": ".".join(python_version.split(".")[:2]),
        "torch": plan,
        "files": {name: file_digest(os.path.join(ROOT, name)) for name in WATCHED},
    }


def read_stamp(venv):
    try:
        with open(os.path.join(venv, STAMP), encoding="utf-8") as handle:
            return json.load(handle)
    except (OSError, ValueError):
        return None


def write_stamp(venv, stamp):
    """Atomically: a reader sees the old stamp or the new one, never half of one."""
    handle, temp = tempfile.mkstemp(prefix=".stamp-", dir=venv)
    try:
        with os.fdopen(handle, "w", encoding="utf-8") as out:
            json.dump(stamp, out, indent=1, sort_keys=True)
            out.write("\n")
        os.replace(temp, os.path.join(venv, STAMP))
    except BaseException:
        if os.path.exists(temp):
            os.remove(temp)
        raise


def venv_version(python):
    """'3.11.7' for a working interpreter, None when it is missing or broken."""
    if not os.path.exists(python):
        return None
    try:
        out = subprocess.run(
            [python, "-c", "import sys; print('%d.%d.%d' % sys.version_info[:3])"],
            capture_output=True,
            text=True,
            timeout=60,
        )
    except (OSError, subprocess.SubprocessError):
        return None
    return out.stdout.strip() if out.returncode == 0 else None


def make_venv(venv):
    say("making a virtual environment in %s" % os.path.relpath(venv, ROOT))
    if os.path.exists(venv):
        shutil.rmtree(venv)
    result = subprocess.run([sys.executable, "-m", "venv", venv], capture_output=True, text=True)
    if result.returncode != 0:
        detail = (result.stderr or result.stdout).strip().splitlines()
        hint = ""
        if "ensurepip" in (result.stderr + result.stdout):
            hint = " (Debian/Ubuntu: sudo apt install python%d.%d-venv)" % sys.version_info[:2]
        raise SetupError(
            "Python could not make a virtual environment%s: %s"
            % (hint, detail[-1] if detail else "exit %d" % result.returncode)
        )
    with open(os.path.join(venv, ".gitignore"), "w", encoding="utf-8") as handle:
        handle.write("# made by course.py: git leaves this environment alone\n*\n")


def pip(python, args, quiet=False):
    command = [python, "-m", "pip", "install", "--disable-pip-version-check"] + args
    if quiet:
        return subprocess.run(command, cwd=ROOT, capture_output=True, text=True).returncode
    return subprocess.run(command, cwd=ROOT).returncode


def install_torch(python, plan, pin):
    """PyTorch's build for this machine, before the requirements (which then keep it)."""
    version = "==" + pin if pin else ""
    if plan.startswith("index:"):
        if pip(python, ["torch" + version, "--index-url", plan[len("index:") :]]) != 0:
            raise SetupError("pip could not install PyTorch from %s (%s)" % (plan[6:], INDEX_ENV))
        return
    if plan != "cpu":
        return  # the requirements install PyPI's build
    spec = "torch%s+cpu" % version if pin else "torch"
    # What pip can already reach (a local wheel folder or a mirror): seconds, no time-outs.
    if pin and pip(python, [spec, "--retries", "0", "--timeout", "15"], quiet=True) == 0:
        return
    problem = reachable(CPU_INDEX + "/")
    if not problem:
        if pip(python, [spec, "--index-url", CPU_INDEX, "--retries", "2"]) == 0:
            return
        problem = "pip could not install from it"
    say(
        "PyTorch's CPU build is out of reach (%s: %s), so pip installs PyPI's torch, the "
        "CUDA build (about 6 GB)" % (CPU_INDEX, problem)
    )


def folder_size(path):
    total = 0
    for folder, _, files in os.walk(path):
        for name in files:
            try:
                total += os.lstat(os.path.join(folder, name)).st_size
            except OSError:
                pass
    return total


def describe_size(size):
    return "%.1f GB" % (size / 1e9) if size >= 1e9 else "%d MB" % round(size / 1e6)


def describe_time(seconds):
    seconds = int(round(seconds))
    return "%d min %d s" % divmod(seconds, 60) if seconds >= 60 else "%d s" % seconds


def ensure_environment(kind):
    """The environment for `lab` or `test`, made or brought up to date; its Python's path."""
    name, requirement_files = ENVIRONMENTS[kind]
    venv = os.path.join(ROOT, name)
    for requirement in requirement_files:
        if not os.path.isfile(os.path.join(ROOT, requirement)):
            raise SetupError(
                "%s is missing: run this file from a complete copy of the course" % requirement
            )
    plan, plan_line = torch_plan()
    python = venv_python(venv)
    current = venv_version(python)
    stamp = read_stamp(venv) if current else None
    want = wanted_stamp(current or version_text(), plan)
    if stamp == want:
        return python
    started = time.monotonic()
    if current is None or tuple(int(p) for p in current.split(".")[:2]) < MIN_PYTHON:
        make_venv(venv)
        current = venv_version(python)
        if current is None:
            raise SetupError("the new environment's Python does not run: %s" % python)
        want = wanted_stamp(current, plan)
        say(
            "installing what the %s into %s (the first time takes minutes)"
            % ("course needs" if kind == "lab" else "course and its tests need", name)
        )
    elif stamp is None:
        say("finishing the set-up of %s (an earlier run did not complete it)" % name)
    else:
        changed = [f for f in WATCHED if stamp.get("files", {}).get(f) != want["files"][f]]
        say("%s changed: installing again into %s" % (", ".join(changed) or "the set-up", name))
    say(plan_line)
    if stamp and stamp.get("torch") != plan:  # another build than last time: replace it
        subprocess.run([python, "-m", "pip", "uninstall", "-y", "-q", "torch"], cwd=ROOT)
    with open(os.path.join(ROOT, "requirements.txt"), encoding="utf-8") as handle:
        pin = torch_pin(handle.read())
    install_torch(python, plan, pin)
    quiet = ["-q"] if stamp else []  # again: pip's "already satisfied" lines are noise
    for requirement in requirement_files:
        if pip(python, ["-r", requirement] + quiet) != 0:
            raise SetupError(
                "pip could not install %s into %s (its messages are above)" % (requirement, name)
            )
    check = subprocess.run(
        [python, "-c", "import torch; print(torch.__version__)"], capture_output=True, text=True
    )
    if check.returncode != 0:
        lines = check.stderr.strip().splitlines() or ["exit %d" % check.returncode]
        raise SetupError(
            "PyTorch was installed into %s but does not import: %s" % (name, lines[-1])
        )
    write_stamp(venv, want)
    say(
        "%s is ready: PyTorch %s, %s, in %s"
        % (
            name,
            check.stdout.strip() or "?",
            describe_size(folder_size(venv)),
            describe_time(time.monotonic() - started),
        )
    )
    return python


# --------------------------------------------------------------------------- threads


def torch_threads():
    """PyTorch threads per process: half the cores this process may use (at least 1, at most
    8). On 2 shared cores one thread stepped chapter 7's training at 1.2-1.8 s a step and two
    threads at 3.0-3.4 s; half also leaves room on machines whose cores are hyper-threads."""
    try:
        cores = len(os.sched_getaffinity(0))
    except AttributeError:
        cores = os.cpu_count() or 1
    return max(1, min(8, cores // 2))


def course_env(python=None):
    """The environment JupyterLab and its kernels get: PyTorch's threads, and, given the
    environment's Python, that environment activated (so that `python` and `pip` in
    JupyterLab's terminal, and `!pip` in a notebook, are the course's)."""
    env = dict(os.environ)
    env.setdefault("OMP_NUM_THREADS", str(torch_threads()))
    if python:
        scripts = os.path.dirname(python)
        env["VIRTUAL_ENV"] = os.path.dirname(scripts)
        env["PATH"] = scripts + os.pathsep + env.get("PATH", "")
        env.pop("PYTHONHOME", None)
    return env


# --------------------------------------------------------------------------- lab


def running_as_root():
    return hasattr(os, "geteuid") and os.geteuid() == 0


def workspace(path):
    """JupyterLab's saved layout for its first start: chapter 00 open, the file browser on the
    course folder (a URL naming the notebook would show notebooks/ instead)."""
    key = "notebook:" + CHAPTER_ZERO
    return {
        "data": {
            "layout-restorer:data": {
                "main": {
                    "dock": {"type": "tab-area", "currentIndex": 0, "widgets": [key]},
                    "current": key,
                },
                "left": {
                    "collapsed": False,
                    "visible": True,
                    "current": "filebrowser",
                    "widgets": ["filebrowser"],
                },
            },
            key: {"data": {"path": CHAPTER_ZERO, "factory": "Notebook"}},
            "file-browser-filebrowser:cwd": {"path": ""},
        },
        "metadata": {"id": "default"},
    }


def lab_command(python, extra):
    folder = os.path.join(ROOT, ".venv", "share", "jupyter", "lab", "workspaces")
    if not os.path.isdir(folder) or not os.listdir(folder):
        os.makedirs(folder, exist_ok=True)
        handle, temp = tempfile.mkstemp(dir=folder, prefix=".new-")
        with os.fdopen(handle, "w", encoding="utf-8") as out:
            json.dump(workspace(CHAPTER_ZERO), out)
        os.replace(temp, os.path.join(folder, "default-37a8.jupyterlab-workspace"))
    command = [
        python,
        "-m",
        "jupyterlab",
        "--ServerApp.root_dir=" + ROOT,
        "--LabApp.workspaces_dir=" + folder,
    ]
    if running_as_root() and "--allow-root" not in extra:
        command.append("--allow-root")  # JupyterLab refuses root without it (containers)
    return command + list(extra)


def lab(extra):
    python = ensure_environment("lab")
    if not os.path.isfile(os.path.join(ROOT, CHAPTER_ZERO)):
        raise SetupError(
            "%s is missing; `.venv/bin/python -m gpt2lib.course reset 00` makes "
            "a fresh copy" % CHAPTER_ZERO
        )
    env = course_env(python)
    command = lab_command(python, extra)
    say(
        "opening JupyterLab on chapter 00 (%s PyTorch thread%s per notebook); it runs until you "
        "press Ctrl-C twice here, or choose File > Shut Down"
        % (env["OMP_NUM_THREADS"], "" if env["OMP_NUM_THREADS"] == "1" else "s")
    )
    return run_in_foreground(command, env)


def run_in_foreground(command, env):
    """Run `command` in place of this process where the system allows it (Ctrl-C then goes
    straight to it); on Windows as a child whose exit status is ours."""
    if not WINDOWS:
        os.chdir(ROOT)
        os.execve(command[0], command, env)
    try:
        return subprocess.call(command, cwd=ROOT, env=env)
    except KeyboardInterrupt:
        return 130


# --------------------------------------------------------------------------- test


FIND_BROWSER = (
    "import sys; sys.path.insert(0, 'tests'); import browser_support as b; "
    "path, why = b.find_chromium(); print(path or ''); print(why)"
)


def find_browser(python):
    """(path or '', why there is none) by the tests' own search (tests/browser_support.py)."""
    out = subprocess.run([python, "-c", FIND_BROWSER], cwd=ROOT, capture_output=True, text=True)
    lines = out.stdout.splitlines() + ["", ""]
    if out.returncode != 0:
        return "", (out.stderr.strip().splitlines() or ["the search failed"])[-1]
    return lines[0].strip(), lines[1].strip()


def install_browser(python, run=None):
    """Try Debian's chromium (as root, with apt-get), then Playwright's; (what was installed or
    '', what failed)."""
    run = run or subprocess.run
    tried = []
    if platform.system() == "Linux" and shutil.which("apt-get") and running_as_root():
        env = dict(os.environ, DEBIAN_FRONTEND="noninteractive")
        steps = [["apt-get", "update", "-qq"], ["apt-get", "install", "-y", "-qq", "chromium"]]
        for step in steps:
            try:
                result = run(step, env=env, capture_output=True, text=True, timeout=900)
            except (OSError, subprocess.SubprocessError) as exc:
                tried.append("apt-get: %s" % exc)
                break
            if result.returncode != 0:
                lines = (result.stderr or result.stdout).strip().splitlines()
                tried.append(
                    "apt-get: %s" % (lines[-1] if lines else "exit %d" % result.returncode)
                )
                break
        else:
            return "Debian's chromium, with apt-get", tried
    try:
        result = run(
            [python, "-m", "playwright", "install", "chromium"],
            cwd=ROOT,
            capture_output=True,
            text=True,
            timeout=900,
        )
        if result.returncode == 0:
            return "Playwright's Chromium, with python -m playwright install chromium", tried
        lines = (result.stderr or result.stdout).strip().splitlines()
        tried.append("playwright: %s" % (lines[-1] if lines else "exit %d" % result.returncode))
    except (OSError, subprocess.SubprocessError) as exc:
        tried.append("playwright: %s" % exc)
    return "", tried


def ensure_browser(python):
    """Find or install Chromium for the JupyterLab tests, and say in one line what happened."""
    path, why = find_browser(python)
    if path:
        say("browser for the JupyterLab tests: %s (already here)" % path)
        return
    how, tried = install_browser(python)
    path, why_now = find_browser(python) if how else ("", why)
    if path:
        say("browser for the JupyterLab tests: installed %s (%s)" % (how, path))
        return
    outcome = (
        "they fail (CI=true)" if os.environ.get("CI", "").lower() == "true" else "they are skipped"
    )
    say(
        "browser for the JupyterLab tests: none (%s; %s); %s"
        % (why_now or why, "; ".join(tried) or "nothing tried", outcome)
    )


def has_ruff_config():
    """Whether the repository configures ruff (pyproject's [tool.ruff], ruff.toml, .ruff.toml)."""
    if any(os.path.isfile(os.path.join(ROOT, n)) for n in ("ruff.toml", ".ruff.toml")):
        return True
    try:
        with open(os.path.join(ROOT, "pyproject.toml"), encoding="utf-8") as handle:
            return any(line.strip().startswith("[tool.ruff") for line in handle)
    except OSError:
        return False


def test_steps(python, pytest_args):
    steps = [("course check", [python, "-m", "gpt2lib.course", "check"])]
    if has_ruff_config():
        steps += [
            ("ruff check", [python, "-m", "ruff", "check", "."]),
            ("ruff format", [python, "-m", "ruff", "format", "--check", "."]),
        ]
    steps.append(("pytest", [python, "-m", "pytest"] + list(pytest_args)))
    return steps


def test(pytest_args):
    started = time.monotonic()
    python = ensure_environment("test")
    ensure_browser(python)
    if not has_ruff_config():
        say(
            "lint: no ruff configuration in pyproject.toml yet, so ruff check and ruff format "
            "--check are left out"
        )
    env = dict(os.environ)
    failed = []
    for name, command in test_steps(python, pytest_args):
        say("%s: %s" % (name, " ".join([os.path.relpath(command[0], ROOT)] + command[1:])))
        try:
            code = subprocess.call(command, cwd=ROOT, env=env)
        except KeyboardInterrupt:
            say("stopped (Ctrl-C)")
            return 130
        if code != 0:
            failed.append("%s (exit %d)" % (name, code))
    took = describe_time(time.monotonic() - started)
    if failed:
        say("FAILED: %s; %s in all" % (", ".join(failed), took))
        return 1
    say("every step passed; %s in all" % took)
    return 0


# --------------------------------------------------------------------------- main


def parse(argv):
    """(command, its words) from the command line; SetupError for a bad one."""
    if not argv:
        return "lab", []
    first = argv[0]
    if first in ("-h", "--help", "help"):
        return "help", []
    if first in COMMANDS:
        if first == "setup" and argv[1:] not in ([], ["lab"], ["test"]):
            raise SetupError(
                "setup takes `lab` or `test` (or nothing, for lab), not %s; %s"
                % (" ".join(argv[1:]), USAGE)
            )
        return first, argv[1:]
    if first.startswith("-"):
        return "lab", argv  # options for JupyterLab
    raise SetupError("unknown command %r; %s" % (first, USAGE))


def main(argv=None):
    argv = sys.argv[1:] if argv is None else argv
    try:
        command, words = parse(argv)
        if command == "help":
            print(__doc__.strip())
            return 0
        require_python()
        if command == "setup":
            ensure_environment(words[0] if words else "lab")
            return 0
        if command == "test":
            return test(words)
        return lab(words)
    except SetupError as exc:
        print("course.py: error: %s" % exc, file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("course.py: stopped (Ctrl-C); run it again to carry on", file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())
