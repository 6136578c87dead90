"""The README's promises: every ```python block pastes into a Python prompt, the two commands
are the ones CI and the tests run, and test information shows.

Each ```python block of README.md and of docs/*.md is pasted, alone, into a fresh interactive
interpreter (`python -i`, fed on stdin as a paste is typed): each line is read as the prompt
reads it, so a block that runs with `python -c` but not at the prompt (a `with` block followed
at once by a dedented line needs a blank line between them) fails here. A block fails when
the interpreter reports an error (`File "<stdin>"`, as every traceback and SyntaxError from a
paste does) or never reaches the line pasted after it. It runs from a course folder, offline:
GPT2LIB_CHECKPOINT unset (so nothing points at the test checkpoint) and HF_HUB_OFFLINE=1 (so
nothing is fetched). A block that needs OpenAI's weights must say
`from_pretrained("data/standin")` instead, as the blocks do.

The course folder is a scratch folder whose entries link to the repository's own
(`gpt2lib/`, `data/`, ...), so that relative paths resolve as from the repository root while
what a block writes (the training block saves `my_shakespeare_gpt2/`) lands in the scratch
folder, never in the repository, and never over a learner's folder of that name.

The one short setting: blocks run with GPT2LIB_QUICK=1, the course's short CI setting, which
the training block reads to take 2 steps instead of 600 (it says so). Nothing in a block's
text is changed.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
from readme_commands import readme_commands

REPO_ROOT = Path(__file__).resolve().parents[2]
README = REPO_ROOT / "README.md"
DOCUMENTS = [README, *sorted((REPO_ROOT / "docs").glob("*.md"))]
# A fenced block opened by ```python (possibly indented, inside a list item) up to its fence.
PYTHON_BLOCK = re.compile(r"^([ \t]*)```python[ \t]*\n(.*?)^\1```[ \t]*$", re.MULTILINE | re.DOTALL)
BLOCK_TIMEOUT = 600  # seconds; the quick setting takes far less, this only stops a hang
PASTED_TO_THE_END = "--- the whole block ran ---"


def python_blocks(text: str) -> list[tuple[int, str]]:
    """(line number of the opening fence, dedented code) for every ```python block."""
    blocks = []
    for match in PYTHON_BLOCK.finditer(text):
        line = text.count("\n", 0, match.start()) + 1
        blocks.append((line, textwrap.dedent(match.group(2))))
    return blocks


BLOCKS = [
    (path.relative_to(REPO_ROOT).as_posix(), line, code)
    for path in DOCUMENTS
    for line, code in python_blocks(path.read_text(encoding="utf-8"))
]


def course_folder(target: Path) -> Path:
    """A scratch folder whose entries link to the repository's (no .git, nothing generated)."""
    target.mkdir()
    for entry in REPO_ROOT.iterdir():
        if entry.name in {".git", ".venv", ".venv-test", "my_shakespeare_gpt2"}:
            continue
        (target / entry.name).symlink_to(entry, target_is_directory=entry.is_dir())
    return target


def offline_env() -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k not in ("GPT2LIB_CHECKPOINT", "PYTHONSTARTUP")}
    env.update(HF_HUB_OFFLINE="1", TRANSFORMERS_OFFLINE="1", GPT2LIB_QUICK="1", MPLBACKEND="Agg")
    return env


def paste(code: str, cwd: Path, timeout: float = BLOCK_TIMEOUT) -> tuple[bool, str]:
    """Paste `code` into `python -i` and press Enter twice after it, then one more line.

    (whether it ran clean to the end, the interpreter's stderr and stdout)."""
    typed = code.rstrip("\n") + "\n\n" + f"print({PASTED_TO_THE_END!r})\n"
    result = subprocess.run(
        [sys.executable, "-i", "-q"],
        input=typed,
        cwd=cwd,
        env=offline_env(),
        capture_output=True,
        text=True,
        encoding="utf-8",
        timeout=timeout,
    )
    clean = 'File "<stdin>"' not in result.stderr and PASTED_TO_THE_END in result.stdout
    return clean, result.stderr + result.stdout


def test_the_extractor_finds_plain_and_indented_blocks_only():
    text = (
        "intro\n```python\nprint(1)\n```\n"
        "- item\n\n  ```python\n  if True:\n      print(2)\n  ```\n"
        "```bash\necho no\n```\n```pycon\n>>> no\n```\n"
    )
    assert python_blocks(text) == [(2, "print(1)\n"), (7, "if True:\n    print(2)\n")]


def test_the_docs_have_python_blocks():
    assert len(BLOCKS) >= 3, "the docs should show generation, a look inside and training"


@pytest.mark.parametrize(
    "code, ok",
    [
        ("x = 1\nprint(x + 1)\n", True),
        ("for i in range(2):\n    print(i)\n", True),
        # Runs with `python -c`, not at a prompt: the loop's block needs a blank line after it.
        ("for i in range(2):\n    print(i)\nprint('after')\n", False),
        ("raise ValueError('no')\n", False),
    ],
)
def test_a_paste_fails_where_the_prompt_fails(code, ok, tmp_path):
    assert subprocess.run([sys.executable, "-c", code], capture_output=True).returncode == (
        0 if "raise" not in code else 1
    )
    clean, output = paste(code, tmp_path, timeout=60)
    assert clean is ok, output


@pytest.mark.slow
@pytest.mark.parametrize(
    "document, line, code", BLOCKS, ids=[f"{doc}:{line}" for doc, line, _ in BLOCKS]
)
def test_python_block_runs_when_pasted_into_a_prompt(document, line, code, tmp_path):
    folder = course_folder(tmp_path / "course")
    clean, output = paste(code, folder)
    assert clean, (
        f"the ```python block at {document} line {line} fails when pasted:\n{output[-3000:]}"
    )
    for entry in folder.iterdir():  # what the block wrote stayed in the scratch folder
        assert entry.is_symlink() or not (REPO_ROOT / entry.name).exists(), entry.name


# --------------------------------------------------------------------------- the two commands


def test_the_start_section_opens_with_the_two_commands():
    commands = readme_commands()
    assert commands == {"lab": "python3 course.py", "test": "python3 course.py test"}


def test_ci_runs_the_readmes_test_command_from_its_text():
    script = (REPO_ROOT / ".ci" / "run").read_text(encoding="utf-8")
    assert "$(python3 tests/readme_commands.py test)" in script and 'eval "$command"' in script
    assert "pip install" not in script  # nothing installed before the README's command
    result = subprocess.run(
        [sys.executable, str(REPO_ROOT / "tests" / "readme_commands.py"), "test"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert result.stdout.strip() == readme_commands()["test"]


def test_the_command_reader_refuses_a_start_section_of_another_shape():
    with pytest.raises(ValueError, match="two ```bash blocks"):
        readme_commands("# x\n\n## Start\n\n```bash\npython3 a.py\npython3 b.py\n```\n")
    text = "# x\n\n## Start\n\n```bash\npython3 a.py  # one\n```\nthen\n```bash\nb\n```\n## Next\n"
    assert readme_commands(text) == {"lab": "python3 a.py", "test": "b"}


def test_the_readme_fits_and_hard_codes_no_test_count():
    text = README.read_text(encoding="utf-8")
    assert len(text.splitlines()) <= 200
    for path in DOCUMENTS:
        counted = re.findall(r"[\d,]{3,} tests", path.read_text(encoding="utf-8"))
        assert not counted, f"{path.name} states a test count ({counted}); it goes stale"


# --------------------------------------------------------------------------- test information


@pytest.mark.slow
def test_skipped_browser_tests_say_why_without_rs(tmp_path):
    """tests/conftest.py prints each reason the browser tests skipped in the summary."""
    (tmp_path / "pytest.ini").write_text("[pytest]\n", encoding="utf-8")
    (tmp_path / "conftest.py").write_text(
        (REPO_ROOT / "tests" / "conftest.py").read_text(encoding="utf-8"), encoding="utf-8"
    )
    (tmp_path / "test_fake_browser.py").write_text(
        "import pytest\n\n"
        "@pytest.mark.parametrize('n', range(3))\n"
        "def test_browser(n):\n"
        "    pytest.skip('browser test skipped: /usr/bin/chromium is missing (apt-get install chromium)')\n\n"
        "def test_other():\n"
        "    pytest.skip('something else')\n",
        encoding="utf-8",
    )
    result = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider"],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        encoding="utf-8",
        timeout=120,
        env=dict(os.environ, PYTEST_DISABLE_PLUGIN_AUTOLOAD="1"),  # nbval, hypothesis: not needed
    )
    lines = result.stdout.splitlines()
    assert (
        "3 browser tests skipped: /usr/bin/chromium is missing (apt-get install chromium) "
        "(see the README's Test section)" in lines
    ), result.stdout
    assert not any("something else" in line for line in lines)  # other skips keep pytest's way
    assert "4 skipped" in lines[-1]
