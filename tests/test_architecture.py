"""Issue 17: the package's import graph, read from the source (imports inside functions
count), and what every generated module carries."""

import ast
import importlib
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parents[1] / "gpt2lib"
GENERATED = [line.removesuffix(".py") for line in
             (PACKAGE / "generated_modules.txt").read_text(encoding="utf-8").splitlines()
             if line.strip() and not line.startswith("#")]

# The model's parts, chapters 2 to 6: what learners read. They sit below everything that uses
# a model (training, loading, a look inside, generation and its engine) and import none of it.
LAYERS = ("validation", "config", "layers", "embeddings", "attention", "mlp", "block", "model")


def module_name(path: Path) -> str:
    parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


MODULES = {module_name(p): p for p in PACKAGE.rglob("*.py")}


def imports_of(name: str) -> set[str]:
    """The gpt2lib modules that `name` imports anywhere in its file, functions included."""
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
            found.add(base)
            found |= {f"{base}.{alias.name}" for alias in node.names}
    return {m for m in found if m in MODULES and m != name}


GRAPH = {name: imports_of(name) for name in MODULES}


def test_the_graph_reader_sees_imports_inside_functions():
    # cli imports the loader inside its command functions only
    assert "gpt2lib.checkpoint" in GRAPH["gpt2lib.cli"]
    assert GRAPH["gpt2lib.block"] == {"gpt2lib.attention", "gpt2lib.mlp"}


def find_cycle(graph):
    """One import cycle as a list of modules, or None."""
    state, stack = {}, []

    def visit(node):
        state[node] = "open"
        stack.append(node)
        for nxt in sorted(graph[node]):
            if state.get(nxt) == "open":
                return stack[stack.index(nxt):] + [nxt]
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
    # `gpt2lib/__init__.py` loads its names lazily (importlib), so it imports nothing here
    assert find_cycle(GRAPH) is None, " -> ".join(find_cycle(GRAPH))


@pytest.mark.parametrize("layer", LAYERS)
def test_the_layers_import_nothing_that_uses_a_model(layer):
    reached, todo = set(), [f"gpt2lib.{layer}"]
    while todo:  # everything the layer pulls in, directly or through another module
        for nxt in GRAPH[todo.pop()] - reached:
            reached.add(nxt)
            todo.append(nxt)
    beyond = reached - {f"gpt2lib.{name}" for name in LAYERS}
    assert not beyond, f"gpt2lib.{layer} imports {sorted(beyond)}"


def test_the_model_has_no_convenience_methods_that_reach_later_chapters():
    from gpt2lib.model import GPT2

    for method in ("from_pretrained", "generate", "save_pretrained", "run_with_cache"):
        assert not hasattr(GPT2, method), method


@pytest.mark.parametrize("name", GENERATED)
def test_every_generated_module_has_a_docstring_and_all(name):
    module = importlib.import_module(f"gpt2lib.{name}")
    assert module.__doc__ and "chapter" in module.__doc__.lower()  # says which chapter teaches it
    assert module.__all__ and all(hasattr(module, public) for public in module.__all__)
