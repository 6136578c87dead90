"""The README's two commands, read from its own text: the first two ```bash blocks of its Start
section, one command each (the course in JupyterLab, then every test).

    python3 tests/readme_commands.py lab     # prints the first
    python3 tests/readme_commands.py test    # prints the second (.ci/run runs it)

Standard library only: CI runs this before anything is installed.
"""

from __future__ import annotations

import re
import sys
from pathlib import Path

README = Path(__file__).resolve().parent.parent / "README.md"
BASH_BLOCK = re.compile(r"^```bash[ \t]*\n(.*?)^```[ \t]*$", re.MULTILINE | re.DOTALL)


def start_section(text: str) -> str:
    begin = text.index("\n## Start\n")
    end = text.find("\n## ", begin + 1)
    return text[begin : end if end != -1 else len(text)]


def block_commands(block: str) -> list[str]:
    """The commands of a bash block: its lines without comments and blank lines."""
    lines = [line.split(" #")[0].strip() for line in block.splitlines()]
    return [line for line in lines if line and not line.startswith("#")]


def readme_commands(text: str | None = None) -> dict[str, str]:
    """{"lab": ..., "test": ...}: the one command of each of the Start section's first two
    ```bash blocks. ValueError when the section does not have that shape."""
    text = README.read_text(encoding="utf-8") if text is None else text
    blocks = [block_commands(m.group(1)) for m in BASH_BLOCK.finditer(start_section(text))]
    if len(blocks) < 2 or len(blocks[0]) != 1 or len(blocks[1]) != 1:
        raise ValueError(
            "the README's Start section should open with two ```bash blocks of "
            f"one command each; found {blocks[:2]}"
        )
    return {"lab": blocks[0][0], "test": blocks[1][0]}


if __name__ == "__main__":
    if len(sys.argv) != 2 or sys.argv[1] not in ("lab", "test"):
        sys.exit("usage: python3 tests/readme_commands.py lab|test")
    try:
        print(readme_commands()[sys.argv[1]])
    except ValueError as exc:
        sys.exit(f"error: {exc}")
