"""The README's promises: every ```python block runs as pasted, and test information shows.

Each ```python block of README.md runs alone, in a fresh `python -c` process, from a course
folder, offline: GPT2LIB_CHECKPOINT unset (so nothing points at the test checkpoint) and
HF_HUB_OFFLINE=1 (so nothing is fetched). A block that needs OpenAI's weights must say
`from_pretrained("data/standin")` instead, as the README's blocks do.

The course folder is a scratch folder whose entries link to the repository's own
(`gpt2lib/`, `data/`, ...), so that relative paths resolve as from the repository root while
what a block writes (the training block saves `my_shakespeare_gpt2/`) lands in the scratch
folder, never in the repository, and never over a learner's folder of that name.

The one short setting: blocks run with GPT2LIB_QUICK=1, the course's short CI setting, which
the README's training block reads to take 2 steps instead of 600 (the README says so). Nothing
in a block's text is changed.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

REPO_ROOT = Path(__file__).resolve().parent.parent
README = REPO_ROOT / "README.md"
# A fenced block opened by ```python (possibly indented, inside a list item) up to its fence.
PYTHON_BLOCK = re.compile(r"^([ \t]*)```python[ \t]*\n(.*?)^\1```[ \t]*$", re.MULTILINE | re.DOTALL)
BLOCK_TIMEOUT = 600  # seconds; the quick setting takes far less, this only stops a hang


def python_blocks(text: str) -> list[tuple[int, str]]:
    """(line number of the opening fence, dedented code) for every ```python block."""
    blocks = []
    for match in PYTHON_BLOCK.finditer(text):
        line = text.count("\n", 0, match.start()) + 1
        blocks.append((line, textwrap.dedent(match.group(2))))
    return blocks


BLOCKS = python_blocks(README.read_text(encoding="utf-8"))


def course_folder(target: Path) -> Path:
    """A scratch folder whose entries link to the repository's (no .git, nothing generated)."""
    target.mkdir()
    for entry in REPO_ROOT.iterdir():
        if entry.name in {".git", ".venv", "my_shakespeare_gpt2"}:
            continue
        (target / entry.name).symlink_to(entry, target_is_directory=entry.is_dir())
    return target


def offline_env() -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k != "GPT2LIB_CHECKPOINT"}
    env.update(HF_HUB_OFFLINE="1", TRANSFORMERS_OFFLINE="1", GPT2LIB_QUICK="1", MPLBACKEND="Agg")
    return env


def test_the_extractor_finds_plain_and_indented_blocks_only():
    text = (
        "intro\n```python\nprint(1)\n```\n"
        "- item\n\n  ```python\n  if True:\n      print(2)\n  ```\n"
        "```bash\necho no\n```\n```pycon\n>>> no\n```\n"
    )
    assert python_blocks(text) == [(2, "print(1)\n"), (7, "if True:\n    print(2)\n")]


def test_the_readme_has_python_blocks():
    assert len(BLOCKS) >= 3, "README.md should show generation, a look inside and training"


@pytest.mark.slow
@pytest.mark.parametrize("line, code", BLOCKS, ids=[f"README.md:{line}" for line, _ in BLOCKS])
def test_readme_python_block_runs_as_pasted(line, code, tmp_path):
    folder = course_folder(tmp_path / "course")
    result = subprocess.run(
        [sys.executable, "-c", code],
        cwd=folder,
        env=offline_env(),
        capture_output=True,
        text=True,
        encoding="utf-8",
        timeout=BLOCK_TIMEOUT,
    )
    assert result.returncode == 0, (
        f"the ```python block at README.md line {line} failed (exit {result.returncode}):\n"
        f"{result.stderr[-3000:]}"
    )
    for entry in folder.iterdir():  # what the block wrote stayed in the scratch folder
        assert entry.is_symlink() or not (REPO_ROOT / entry.name).exists(), entry.name


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
