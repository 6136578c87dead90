"""The learner's own package, `mygpt2/`: what a learner writes in notebooks/ is what later
chapters run.

`gpt2lib/chapters/` holds the reference, generated from the `export` cells of solutions/.
`mygpt2/` (at the course root, ignored by git) has the same modules, written from the learner's
export cells. It is written in the learner's kernel, with no step of their own:

- when a check passes (`checks.passed`), the exercise's export cells that hold the learner's
  answers, as the kernel last ran them, go into `mygpt2/` (only the statements a module holds: imports, definitions,
  assignments; a call or a print left in the cell is not run on import);
- when a check fails (the one-line CheckFailed in the notebook), that exercise's cells go back
  to the reference's, and `mygpt2/parts.json` says why.

Every other cell of a module (given code, and exercises not passed) is the reference's, so `mygpt2` is always a whole package whose
modules import each other (`mygpt2.model` builds the learner's block from the learner's
attention). `mygpt2/parts.json` records, per exercise, whose code is there and why.

Later chapters call `your_gpt2()` for the modules and `yours("8.4", fn)` inside a chapter.
Outside a learner notebook (solutions/, tests, scripts), `your_gpt2()` gives the reference.
`python -m gpt2lib.course reset NN` backs up and removes chapter NN's part, `restore NN` brings
it back with the notebook, `progress` says which parts are the learner's, and `build` never
touches the folder.
"""

from __future__ import annotations

import ast
import contextlib
import functools
import importlib
import json
import os
import re
import sys
import types
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from gpt2lib.files import recover_saves, save_files

__all__ = [
    "ALL_PARTS",
    "MODEL_PARTS",
    "PACKAGE",
    "RECORD",
    "chapter_part",
    "learner_root",
    "parts_line",
    "put_back_chapter_part",
    "read_record",
    "record_failure",
    "record_pass",
    "remove_chapter_part",
    "sync",
    "your_gpt2",
    "yours",
]

PACKAGE = "mygpt2"  # the learner's package, at the course root
RECORD = "parts.json"  # in it: whose code each exercise's cells are, and why
LOCK = ".mygpt2.lock"  # at the course root: one writer of the package at a time
MODEL_PARTS = ("config", "embeddings", "layers", "attention", "mlp", "block", "model")
ALL_PARTS = ("bpe", *MODEL_PARTS, "training", "weights", "interpret", "decoding", "tuning")
_EXERCISE = re.compile(r"Exercise\s+(\d+)\.(\d+[a-z]?)")
# What a module keeps of a learner's cell: the statements a module is made of.
_MODULE_STATEMENTS = (
    ast.Import,
    ast.ImportFrom,
    ast.FunctionDef,
    ast.AsyncFunctionDef,
    ast.ClassDef,
    ast.Assign,
    ast.AnnAssign,
    ast.If,  # `if TYPE_CHECKING:`
    ast.Try,  # an import with a fallback
)

# Exercises whose check passed in this process ("3.6"), for `yours`; a failure removes one.
PASSED: set[str] = set()


def exercise_number(label: str) -> str | None:
    """ "3.6" from "Exercise 3.6 (multi-head attention)", or None."""
    match = _EXERCISE.search(label)
    return f"{int(match.group(1))}.{match.group(2)}" if match else None


# --------------------------------------------------------------------------- where we are


def learner_root() -> Path | None:
    """The course folder when this process is a kernel running a learner notebook (its working
    folder is the course's notebooks/), else None: a solution notebook, a test, a script.
    GPT2LIB_LEARNER_PACKAGE=0 turns the package off (the test suite runs the learner notebooks
    so, and must not write over a learner's mygpt2/)."""
    if os.environ.get("GPT2LIB_LEARNER_PACKAGE") == "0":
        return None
    here = Path.cwd()
    if here.name != "notebooks" or not (here.parent / "solutions").is_dir():
        return None
    if _shell() is None:
        return None
    return here.parent


def _shell():
    ipython = sys.modules.get("IPython")
    return ipython.get_ipython() if ipython is not None else None


def _ran_cells() -> list[str]:
    """The sources of the cells this kernel ran, oldest first."""
    shell = _shell()
    if shell is None:
        return []
    return [c for c in shell.history_manager.input_hist_parsed if c]


# --------------------------------------------------------------------------- the plan


def _notebook(root: Path, folder: str, chapter: int) -> Path | None:
    found = sorted((root / folder).glob(f"{chapter:02d}_*.ipynb"))
    return found[0] if found else None


def _export_cells(root: Path) -> list[dict]:
    """Every export cell of solutions/, in the build's order: module, chapter, cell index,
    owning exercise ("3.6" or None), the reference code, and the names it defines."""
    paths = sorted((root / "solutions").glob("[0-9][0-9]_*.ipynb"))
    return _read_export_cells(tuple((p, p.stat().st_mtime_ns) for p in paths))


@functools.lru_cache(maxsize=4)  # read once per change of solutions/, not once per check
def _read_export_cells(stamped: tuple[tuple[Path, int], ...]) -> list[dict]:
    from gpt2lib.course.format import (
        BEGIN,
        CHAPTER_MODULES,
        exercises,
        export_cells,
        read_notebook,
    )

    cells = []
    for path, _ in stamped:
        if path.stem not in CHAPTER_MODULES:
            continue
        nb = read_notebook(path)
        owner = {}  # an answer cell (it holds a solution region): the exercise it answers
        for exercise in exercises(nb):
            for index in exercise.cells:
                if BEGIN in nb.cells[index].source:
                    owner[index] = exercise_number(exercise.title)
        for index, module, code in export_cells(nb, path.stem, f"solutions/{path.name}"):
            cells.append(
                dict(
                    module=module,
                    chapter=path.stem,
                    index=index,
                    exercise=owner.get(index),
                    code=code,
                    names=_defined_names(code),
                )
            )
    return cells


def _defined_names(code: str) -> list[str]:
    try:
        tree = ast.parse(code)
    except SyntaxError:
        return []
    return [
        node.name
        for node in tree.body
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef)
    ]


def _module_code(source: str) -> str:
    """A learner's cell as module code: its imports, definitions and assignments, with the
    comments just above them; calls, prints and loops at the top level are left out."""
    tree = ast.parse(source)
    lines = source.split("\n")
    kept = []
    for node in tree.body:
        docstring = (
            isinstance(node, ast.Expr)
            and isinstance(node.value, ast.Constant)
            and isinstance(node.value.value, str)
        )
        if not (isinstance(node, _MODULE_STATEMENTS) or docstring):
            continue
        first = min([node.lineno] + [d.lineno for d in getattr(node, "decorator_list", [])]) - 1
        while first > 0 and lines[first - 1].lstrip().startswith("#"):
            first -= 1
        kept.append("\n".join(lines[first : node.end_lineno]))
    return "\n\n".join(kept)


def _to_package(code: str) -> str:
    """Imports of the reference's modules point at the learner's package instead."""
    code = re.sub(r"\bfrom gpt2lib\.chapters import\b", f"from {PACKAGE} import", code)
    return re.sub(r"\bgpt2lib\.chapters\.", f"{PACKAGE}.", code)


def _module_text(module: str, cells: list[dict], record: dict) -> str:
    exercises = record.get("exercises", {})
    chunks = []
    for cell in cells:
        entry = exercises.get(cell["exercise"] or "", {})
        mine = entry.get("status") == "yours" and str(cell["index"]) in entry.get("cells", {})
        code = entry["cells"][str(cell["index"])] if mine else cell["code"]
        whose = f"yours, Exercise {cell['exercise']}" if mine else "the reference's"
        chunks.append(f"# %% {cell['chapter']}, cell {cell['index']} ({whose})\n{code}")
    chapters = sorted({c["chapter"] for c in cells})
    return (
        f'"""The learner\'s {module}: notebooks/{", ".join(chapters)}.ipynb, where each check '
        'passed,\nand the reference elsewhere (parts.json says which)."""\n'
        "# Written by the course when a check passes or fails. Do not edit: edit the notebook\n"
        "# and run its check again.\n\n" + _to_package("\n\n\n".join(chunks)) + "\n"
    )


def plan(root: Path, record: dict) -> dict[str, str]:
    """Every file of the learner's package, as text keyed by file name."""
    modules: dict[str, list[dict]] = {}
    for cell in _export_cells(root):
        modules.setdefault(cell["module"], []).append(cell)
    files = {f"{m}.py": _module_text(m, cells, record) for m, cells in modules.items()}
    files["__init__.py"] = (
        '"""Your GPT-2: the code you wrote in notebooks/, written here by the course when your\n'
        'checks passed (see parts.json). Later chapters import it."""\n'
    )
    files[RECORD] = json.dumps(record, indent=1, sort_keys=True) + "\n"
    return files


# --------------------------------------------------------------------------- reading and writing


def read_record(root: Path) -> dict:
    """mygpt2/parts.json, or an empty record. A damaged record is set aside, not trusted."""
    path = root / PACKAGE / RECORD
    try:
        record = json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        return {"exercises": {}}
    except (OSError, ValueError):
        path.replace(path.with_name(RECORD + ".damaged"))
        print(f"note: {path} was damaged; it is kept as {RECORD}.damaged and started afresh")
        return {"exercises": {}}
    if not isinstance(record, dict) or not isinstance(record.get("exercises"), dict):
        return {"exercises": {}}
    return record


@contextlib.contextmanager
def _locked(root: Path) -> Iterator[None]:
    from filelock import FileLock

    with FileLock(str(root / LOCK), timeout=120):
        if (root / PACKAGE).is_dir():
            recover_saves(root / PACKAGE)  # a save killed half-way is finished or undone
        yield


def _write(root: Path, record: dict) -> None:
    """Write the package as one unit, only the files that changed."""
    folder = root / PACKAGE
    wanted = plan(root, record)
    changed = {}
    for name, text in wanted.items():
        try:
            same = (folder / name).read_text(encoding="utf-8") == text
        except OSError:
            same = False
        if not same:
            changed[name] = text
    if changed:
        save_files(folder, changed)


def sync(root: Path) -> dict:
    """Make mygpt2/ whole and current (new chapters, a changed reference); its record."""
    with _locked(root):
        record = read_record(root)
        _write(root, record)
    return record


def _learner_cells(root: Path, number: str) -> tuple[dict[str, str], str | None]:
    """The learner's code for exercise `number`'s export cells, from what the kernel ran:
    ({cell index: code}, None), or ({}, why not)."""
    cells = [c for c in _export_cells(root) if c["exercise"] == number]
    if not cells:
        return {}, None
    ran = _ran_cells()
    found = {}
    used: list[str] = []  # a learner's cell that holds several export cells' code goes in once
    for cell in cells:
        wanted = cell["names"]
        if not wanted:  # an export cell with no definitions (imports, constants): as given
            found[str(cell["index"])] = cell["code"]
            continue
        sources = []
        for name in wanted:  # the latest cell that defines each name
            for source in reversed(ran):
                if name in _defined_names(source):
                    if source not in sources and source not in used:
                        sources.append(source)
                    break
            else:
                return {}, f"no cell this kernel ran defines {name}"
        used += sources
        found[str(cell["index"])] = "\n\n".join(_module_code(s) for s in sources)
    defined = _defined_names("\n\n".join(found.values()))
    if missing := [n for c in cells for n in c["names"] if n not in defined]:
        return {}, f"no cell this kernel ran defines {', '.join(missing)}"
    return found, None


def record_pass(label: str) -> None:
    """A check passed: remember it, and in a learner notebook write the exercise's cells into
    the learner's package."""
    number = exercise_number(label)
    if number is None:
        return
    PASSED.add(number)
    root = learner_root()
    if root is None:
        return
    try:
        cells, why = _learner_cells(root, number)
        if not cells and why is None:
            return  # the exercise exports nothing
        with _locked(root):
            record = read_record(root)
            entry = {"status": "yours", "cells": cells} if cells else {"status": "reference"}
            if why:
                entry["why"] = why
            record["exercises"][number] = entry
            _write(root, record)
    except Exception as error:  # noqa: BLE001 - the learner's pass line must still show
        print(f"note: your package (mygpt2/) was not updated: {type(error).__name__}: {error}")


def record_failure(label: str, message: str) -> None:
    """A check failed: its exercise's cells in the learner's package go back to the
    reference's, and the record says why."""
    number = exercise_number(label)
    if number is None:
        return
    PASSED.discard(number)
    root = learner_root()
    if root is None or not any(c["exercise"] == number for c in _export_cells(root)):
        return
    not_done = "not done yet" in message or "NotImplementedError" in message
    try:
        with _locked(root):
            record = read_record(root)
            old = record["exercises"].get(number)
            why = "not done yet" if not_done else "its check failed"
            if old is None and not_done:
                return  # nothing was there: the record stays as short as it was
            record["exercises"][number] = {"status": "reference", "why": why}
            _write(root, record)
    except Exception as error:  # noqa: BLE001
        print(f"note: your package (mygpt2/) was not updated: {type(error).__name__}: {error}")


# --------------------------------------------------------------------------- what chapters call


def parts_line(root: Path, record: dict, modules: tuple[str, ...] = MODEL_PARTS) -> str:
    """One line: which of `modules` are the learner's, and which fell back and why."""
    by_module: dict[str, list[str]] = {}
    for cell in _export_cells(root):
        if cell["exercise"] and cell["exercise"] not in by_module.get(cell["module"], []):
            by_module.setdefault(cell["module"], []).append(cell["exercise"])
    exercises = record.get("exercises", {})
    yours, reference = [], []
    for module in modules:
        owned = by_module.get(module, [])
        if not owned:
            continue
        missing = [
            f"{n}: {exercises.get(n, {}).get('why', 'not passed yet')}"
            for n in owned
            if exercises.get(n, {}).get("status") != "yours"
        ]
        if not missing:
            yours.append(module)
        elif len(missing) == len(owned):
            reference.append(f"{module} ({', '.join(missing)})")
        else:
            yours.append(f"{module} (but {', '.join(missing)}: the reference's)")
    return (
        f"Your GPT-2 ({PACKAGE}/): yours: {', '.join(yours) or 'none yet'}; "
        f"the reference's: {', '.join(reference) or 'none'}"
    )


def your_gpt2(*extra: str) -> types.SimpleNamespace:
    """The modules later chapters build on, as a namespace (`parts.model.GPT2`, ...).

    In a learner notebook: the learner's package, brought up to date, freshly imported, with one
    printed line saying whose each part of the model is (and of `extra` modules, say
    "decoding"). Elsewhere: the reference modules of gpt2lib.chapters, said in one line."""
    root = learner_root()
    if root is None:
        import gpt2lib.chapters as chapters

        names = sorted(Path(p).stem for p in Path(chapters.__path__[0]).glob("[a-z]*.py"))
        print("The reference's GPT-2 (gpt2lib.chapters): this is not a learner notebook")
        return types.SimpleNamespace(
            **{n: importlib.import_module(f"gpt2lib.chapters.{n}") for n in names}
        )
    record = sync(root)
    for name in [m for m in sys.modules if m == PACKAGE or m.startswith(PACKAGE + ".")]:
        del sys.modules[name]  # the files may have changed since the last import
    if str(root) not in sys.path:
        sys.path.insert(0, str(root))
    importlib.invalidate_caches()
    names = sorted(p.stem for p in (root / PACKAGE).glob("[a-z]*.py"))
    print(parts_line(root, record, MODEL_PARTS + tuple(extra)))
    return types.SimpleNamespace(**{n: importlib.import_module(f"{PACKAGE}.{n}") for n in names})


def yours(exercise: str, obj: Any, reference: Any = None) -> Any:
    """`obj` (the learner's function or class) when exercise `exercise` ("8.4") passed its
    check in this kernel, else the reference, with a printed note: `reference` if given (for a
    piece the package does not export), else the object of the same name in the generated
    modules, the exercise's chapter's first. The course's one switch between the learner's
    code and the reference's."""
    number = exercise_number(f"Exercise {exercise}") or exercise
    if number in PASSED:
        return obj
    name = getattr(obj, "__name__", None) or type(obj).__name__
    if reference is None:
        reference = _reference_object(name, number) if name else None
    if reference is None:
        raise LookupError(f"the reference has no {name!r} to use in place of yours")
    print(
        f"note: Exercise {number} has not passed yet, so the cells below use the reference's {name}"
    )
    return reference


def _reference_object(name: str, number: str) -> Any:
    import pkgutil

    import gpt2lib.chapters as chapters
    from gpt2lib.course.format import CHAPTER_MODULES

    chapter = number.split(".")[0].zfill(2)
    own = [m for stem, m in CHAPTER_MODULES.items() if stem.startswith(chapter + "_") and m]
    modules = own + [info.name for info in pkgutil.iter_modules(chapters.__path__)]
    for module_name in modules:
        module = importlib.import_module(f"gpt2lib.chapters.{module_name}")
        if hasattr(module, name):
            return getattr(module, name)
    return None


# --------------------------------------------------------------------------- reset and restore


def chapter_part(root: Path, chapter: int) -> dict:
    """Chapter `chapter`'s entries of the record (its exercises), for a backup."""
    record = read_record(root)
    return {
        number: entry
        for number, entry in record["exercises"].items()
        if number.split(".")[0] == str(chapter)
    }


def remove_chapter_part(root: Path, chapter: int) -> dict:
    """Take chapter `chapter`'s code out of the learner's package (the reference's takes its
    place); returns what was removed, for the caller's backup."""
    if not (root / PACKAGE).is_dir():
        return {}
    with _locked(root):
        record = read_record(root)
        removed = {n: e for n, e in record["exercises"].items() if n.split(".")[0] == str(chapter)}
        if removed:
            for number in removed:
                del record["exercises"][number]
            _write(root, record)
    return removed


def put_back_chapter_part(root: Path, chapter: int, part: dict) -> None:
    """Chapter `chapter`'s entries back into the learner's package (restore)."""
    with _locked(root):
        record = read_record(root)
        for number in [n for n in record["exercises"] if n.split(".")[0] == str(chapter)]:
            del record["exercises"][number]
        record["exercises"].update(part)
        _write(root, record)
