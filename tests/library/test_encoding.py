"""Every text file the package, the tests and the benchmarks open names its encoding.

Without `encoding="utf-8"`, Python uses the locale's encoding: cp1252 on many Windows
machines, where the course's notebooks (✅, →, ä) then fail to read or write. This test reads
the source with `ast` and lists each call that opens a file in text mode without one.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

REPO_ROOT = Path(__file__).resolve().parents[2]
SCANNED = ["gpt2lib", "tests", "benchmarks", "conftest.py"]
# `<module>.open(...)` of these is not a text-file open, or is binary by default.
_NOT_FILE_OPENS = {"os", "gzip", "bz2", "lzma", "tarfile", "zipfile", "webbrowser", "Image"}
_TEMPFILES = {"NamedTemporaryFile", "TemporaryFile", "SpooledTemporaryFile"}


def _string(node: ast.AST | None) -> str | None:
    return node.value if isinstance(node, ast.Constant) and isinstance(node.value, str) else None


def _keyword(call: ast.Call, name: str) -> ast.AST | None:
    return next((k.value for k in call.keywords if k.arg == name), None)


def _has_encoding(call: ast.Call, position: int | None) -> bool:
    """Whether `encoding` is passed by keyword, by position, or through **kwargs."""
    if any(k.arg in ("encoding", None) for k in call.keywords):
        return True
    return position is not None and len(call.args) > position


def _is_text_mode(mode: ast.AST | None, default: str) -> bool:
    if mode is None:
        return "b" not in default
    text = _string(mode)
    return text is None or "b" not in text  # a mode computed at run time counts as text


def text_opens_without_encoding(tree: ast.AST) -> list[tuple[int, str]]:
    """(line, call) for each text-mode open, read_text or write_text without an encoding."""
    found = []
    for node in ast.walk(tree):
        if not isinstance(node, ast.Call):
            continue
        func = node.func
        name = func.id if isinstance(func, ast.Name) else getattr(func, "attr", None)
        receiver = func.value if isinstance(func, ast.Attribute) else None
        receiver_name = receiver.id if isinstance(receiver, ast.Name) else None
        if name == "open" and (receiver is None or receiver_name == "io"):
            # open(file, mode='r', buffering=-1, encoding=None, ...)
            mode = node.args[1] if len(node.args) > 1 else _keyword(node, "mode")
            if _is_text_mode(mode, "r") and not _has_encoding(node, 3):
                found.append((node.lineno, "open(...)"))
        elif name == "open" and receiver_name not in _NOT_FILE_OPENS:
            # Path.open(mode='r', buffering=-1, encoding=None, ...)
            mode = node.args[0] if node.args else _keyword(node, "mode")
            if _is_text_mode(mode, "r") and not _has_encoding(node, 2):
                found.append((node.lineno, ".open(...)"))
        elif name == "read_text" and receiver is not None:
            if not _has_encoding(node, 0):  # Path.read_text(encoding=None, errors=None)
                found.append((node.lineno, ".read_text()"))
        elif name == "write_text" and receiver is not None:
            if not _has_encoding(node, 1):  # Path.write_text(data, encoding=None, ...)
                found.append((node.lineno, ".write_text(...)"))
        elif name in _TEMPFILES:
            mode = node.args[0] if node.args else _keyword(node, "mode")
            if _is_text_mode(mode, "w+b") and not _has_encoding(node, 3):
                found.append((node.lineno, f"{name}(...)"))
    return sorted(found)


def python_files() -> list[Path]:
    files = []
    for name in SCANNED:
        path = REPO_ROOT / name
        files.extend([path] if path.is_file() else sorted(path.rglob("*.py")))
    return files


def test_every_text_open_names_its_encoding():
    problems = []
    for path in python_files():
        tree = ast.parse(path.read_bytes(), filename=str(path))
        for line, call in text_opens_without_encoding(tree):
            problems.append(
                f'{path.relative_to(REPO_ROOT).as_posix()}:{line}: {call} without encoding="utf-8"'
            )
    assert not problems, "text files opened without an encoding:\n" + "\n".join(problems)


@pytest.mark.parametrize(
    "source, flagged",
    [
        ("open('f')", True),
        ("open('f', 'w')", True),
        ("open('f', mode='a+')", True),
        ("open('f', 'rb')", False),
        ("open('f', mode='wb')", False),
        ("open('f', encoding='utf-8')", False),
        ("open('f', 'r', -1, 'utf-8')", False),
        ("io.open('f', 'w')", True),
        ("path.open()", True),
        ("path.open('rb')", False),
        ("path.open('w', encoding='utf-8')", False),
        ("path.read_text()", True),
        ("path.read_text('utf-8')", False),
        ("path.read_text(encoding='utf-8')", False),
        ("path.write_text('x')", True),
        ("path.write_text('x', encoding='utf-8')", False),
        ("path.read_bytes()", False),
        ("gzip.open('f')", False),
        ("os.open('f', 0)", False),
        ("tempfile.NamedTemporaryFile('w')", True),
        ("tempfile.NamedTemporaryFile()", False),
        ("open('f', **options)", False),
    ],
)
def test_the_scan_tells_text_opens_from_binary_ones(source, flagged):
    assert bool(text_opens_without_encoding(ast.parse(source))) is flagged
