"""The package's layout and import graph, read from the source (imports inside functions and
the lazy names of `gpt2lib/__init__.py` count): the folder of generated modules holds only
them, generated code imports only generated code and the one leaf, and nothing imports in a
circle."""

import ast
import importlib
import re
import subprocess
import sys
import tokenize
from pathlib import Path

import pytest

from gpt2lib.course import CHAPTERS_DIR, module_state

ROOT = Path(__file__).resolve().parents[2]
PACKAGE = ROOT / "gpt2lib"
CHAPTERS = ROOT / CHAPTERS_DIR
LEAF = "gpt2lib.validation"  # the one hand-written module generated code may import

# The model's parts, chapters 2 to 6: what learners read. They sit below everything that uses
# a model (training, loading, a look inside, generation and its engine) and import none of it.
LAYERS = ("config", "layers", "embeddings", "attention", "mlp", "block", "model")


def module_name(path: Path) -> str:
    parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


MODULES = {module_name(p): p for p in PACKAGE.rglob("*.py")}
GENERATED = sorted(name for name in MODULES if name.startswith("gpt2lib.chapters"))


def imports_of(name: str) -> set[str]:
    """The gpt2lib modules that `name` imports anywhere in its file, functions included, and
    the modules named in a lazy-export table (`_EXPORTS = {"name": "gpt2lib.module"}`)."""
    path = MODULES[name]
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    found = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            found |= {alias.name for alias in node.names}
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:  # relative: from . import x / from .x import y
                anchor = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join(anchor + ([base] if base else []))
            for alias in node.names:  # `from gpt2lib import speed` imports the submodule
                full = f"{base}.{alias.name}"
                found.add(full if full in MODULES else base)
        elif isinstance(node, ast.Call) and getattr(node.func, "attr", "") == "import_module":
            found |= {a.value for a in node.args if isinstance(a, ast.Constant)}
        elif isinstance(node, ast.Assign) and any(
            getattr(t, "id", "") == "_EXPORTS" for t in node.targets
        ):
            found |= {v.value for v in node.value.values if isinstance(v, ast.Constant)}
    return {m for m in found if m in MODULES and m != name}


GRAPH = {name: imports_of(name) for name in MODULES}


def reach(name: str) -> set[str]:
    """Every gpt2lib module `name` pulls in, directly or through another."""
    reached, todo = set(), [name]
    while todo:
        for nxt in GRAPH[todo.pop()] - reached:
            reached.add(nxt)
            todo.append(nxt)
    return reached


def test_the_graph_reader_sees_imports_inside_functions_and_lazy_names():
    # cli imports the loader inside its command functions only
    assert "gpt2lib.checkpoint" in GRAPH["gpt2lib.cli"]
    assert GRAPH["gpt2lib.chapters.block"] == {"gpt2lib.chapters.attention", "gpt2lib.chapters.mlp"}
    assert "gpt2lib.scaling" in GRAPH["gpt2lib"]  # `pretrain` is a lazy name of the package


def find_cycle(graph):
    """One import cycle as a list of modules, or None."""
    state, stack = {}, []

    def visit(node):
        state[node] = "open"
        stack.append(node)
        for nxt in sorted(graph[node]):
            if state.get(nxt) == "open":
                return stack[stack.index(nxt) :] + [nxt]
            if nxt not in state and (cycle := visit(nxt)):
                return cycle
        state[node] = "done"
        stack.pop()
        return None

    for node in sorted(graph):
        if node not in state and (cycle := visit(node)):
            return cycle
    return None


def test_find_cycle_finds_one():
    assert find_cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}}) == ["a", "b", "c", "a"]
    assert find_cycle({"a": {"b"}, "b": set()}) is None


def test_no_import_cycle_in_gpt2lib():
    assert find_cycle(GRAPH) is None, " -> ".join(find_cycle(GRAPH))


def test_the_folder_of_generated_modules_holds_only_what_the_build_wrote():
    files = sorted(p for p in CHAPTERS.iterdir() if p.is_file())
    assert files and all(p.suffix == ".py" for p in files)
    assert {p.name: module_state(p) for p in files} == {p.name: "generated" for p in files}


def test_no_generated_module_lives_outside_its_folder():
    outside = [
        p for p in PACKAGE.rglob("*.py") if CHAPTERS not in p.parents and module_state(p) != "other"
    ]
    assert outside == []


@pytest.mark.parametrize("name", GENERATED)
def test_generated_code_imports_only_generated_code_and_the_leaf(name):
    foreign = {m for m in GRAPH[name] if not m.startswith("gpt2lib.chapters")} - {LEAF}
    assert not foreign, f"{name} imports {sorted(foreign)}"


def test_the_leaf_imports_nothing_from_gpt2lib():
    assert GRAPH[LEAF] == set()


@pytest.mark.parametrize("layer", LAYERS)
def test_the_layers_import_nothing_that_uses_a_model(layer):
    beyond = reach(f"gpt2lib.chapters.{layer}") - {f"gpt2lib.chapters.{n}" for n in LAYERS} - {LEAF}
    assert not beyond, f"gpt2lib.chapters.{layer} imports {sorted(beyond)}"


def test_the_chapter_model_has_no_convenience_methods_that_reach_later_chapters():
    from gpt2lib.chapters.model import GPT2

    for method in ("from_pretrained", "generate", "save_pretrained", "run_with_cache"):
        assert not hasattr(GPT2, method), method


@pytest.mark.parametrize("name", [n for n in GENERATED if n != "gpt2lib.chapters"])
def test_every_generated_module_has_a_docstring_and_all(name):
    module = importlib.import_module(name)
    assert module.__doc__ and "chapter" in module.__doc__.lower()  # says which chapter teaches it
    assert module.__all__ and all(hasattr(module, public) for public in module.__all__)


def _code_lines(path: Path) -> dict[int, str]:
    """The source lines of a file with comments and strings blanked, by line number."""
    lines = path.read_text(encoding="utf-8").splitlines()
    kept = {n: "" for n in range(1, len(lines) + 1)}
    with path.open("rb") as file:
        for token in tokenize.tokenize(file.readline):
            if token.type in (tokenize.COMMENT, tokenize.STRING, tokenize.ENCODING):
                continue
            for n in range(token.start[0], token.end[0] + 1):
                kept[n] = kept.get(n, "") + " " + token.string
    return kept


def _places(pattern: str) -> list[str]:
    """`file:line` of every line of code in gpt2lib/ (graders aside) that matches `pattern`."""
    found = []
    for path in sorted(PACKAGE.rglob("*.py")):
        if "checks" in path.parts:
            continue
        for number, line in _code_lines(path).items():
            if re.search(pattern, line):
                found.append(f"{path.relative_to(ROOT)}:{number}")
    return found


@pytest.mark.parametrize(
    "what, pattern, home",
    [
        ("the end-of-text id", r"\b50256\b", "gpt2lib/validation.py"),
        ("the token-id validator", r"\bdef check_token_ids\b", "gpt2lib/validation.py"),
        ("the atomic write", r"\bos \. fsync\b|\bmkstemp\b|\bO_EXCL\b", "gpt2lib/files.py"),
    ],
)
def test_one_definition_of_each_shared_thing(what, pattern, home):
    places = _places(pattern)
    assert places and all(p.startswith(home) for p in places), f"{what}: {places}"


def test_one_path_to_the_data_folder():
    joins = [
        f"{path.relative_to(ROOT)}:{n}"
        for path in sorted(PACKAGE.rglob("*.py"))
        for n, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1)
        if re.search(r'/ "data"', line.split("#")[0])
    ]
    assert len(joins) == 1 and joins[0].startswith("gpt2lib/validation.py:"), joins


def test_the_tokenizer_imports_without_pytorch():
    """gpt2lib/__init__.py promises it: the leaf the generated tokenizer imports builds its torch
    dtype tables on first use."""
    code = "import sys, gpt2lib.tokenizer; sys.exit('torch' in sys.modules)"
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert result.returncode == 0, "import gpt2lib.tokenizer loaded PyTorch" + result.stderr
