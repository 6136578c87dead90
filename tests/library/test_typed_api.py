"""The public callables of the package's entry points are typed.

The callables are the names of `gpt2lib.__all__` and the `__all__` of the entry-point modules
below (a class counts through its `__init__`, which needs no return annotation). A callable is
fully annotated when every parameter but self, cls, *args and **kwargs has an annotation and it
has a return annotation. At least 90% of them must be; the hand-written ones (defined outside
the generated `gpt2lib.chapters`) all must, so that removing one annotation fails; and every
annotation there is must name something that exists."""

from __future__ import annotations

import ast
import importlib
import inspect
import sys
import typing
from collections.abc import Callable
from types import ModuleType

import gpt2lib

MODULES = (
    "gpt2lib.model",
    "gpt2lib.checkpoint",
    "gpt2lib.generation",
    "gpt2lib.inspection",
    "gpt2lib.training",
    "gpt2lib.finetune",
    "gpt2lib.scaling",
    "gpt2lib.kvcache",
    "gpt2lib.tokenizer",
)
MIN_TYPED = 0.90
GENERATED = "gpt2lib.chapters."  # code generated from solutions/: counted, not required


def public_callables() -> dict[str, object]:
    """{qualified public name: object}: gpt2lib's names, then each module's __all__ (callables
    of the package only; a re-export counts under each name it is exported as)."""
    seen: dict[str, object] = {f"gpt2lib.{n}": getattr(gpt2lib, n) for n in gpt2lib.__all__}
    for module_name in MODULES:
        module = importlib.import_module(module_name)
        for name in getattr(module, "__all__", []):
            obj = getattr(module, name)
            if callable(obj) and getattr(obj, "__module__", "").startswith("gpt2lib"):
                seen.setdefault(f"{module_name}.{name}", obj)
    return seen


def function_of(obj: object) -> Callable | None:
    """The function whose signature is measured: a class's __init__, undecorated; None when
    there is none of the package's own (object.__init__, or no signature: a constant)."""
    fn = obj.__init__ if inspect.isclass(obj) else obj
    if fn is object.__init__ or not callable(fn):
        return None
    fn = inspect.unwrap(fn)
    try:
        inspect.signature(fn)
    except (TypeError, ValueError):
        return None
    return fn


def missing_annotations(obj: object) -> list[str]:
    """The parameters (and 'return') of obj that have no annotation; [] when fully annotated."""
    fn = function_of(obj)
    if fn is None:
        return []
    sig = inspect.signature(fn)
    skipped = (inspect.Parameter.VAR_POSITIONAL, inspect.Parameter.VAR_KEYWORD)
    missing = [
        p.name
        for p in sig.parameters.values()
        if p.name not in ("self", "cls")
        and p.kind not in skipped
        and p.annotation is inspect.Parameter.empty
    ]
    if sig.return_annotation is inspect.Signature.empty and fn.__name__ != "__init__":
        missing.append("return")
    return missing


def defined_in(obj: object) -> str:
    fn = function_of(obj)
    return getattr(fn if fn is not None else obj, "__module__", "") or ""


def test_public_callables_are_typed():
    items = public_callables()
    untyped = {name: gaps for name, obj in items.items() if (gaps := missing_annotations(obj))}
    share = 1 - len(untyped) / len(items)
    listing = "\n".join(
        f"  {name} ({defined_in(items[name])}): no annotation for {', '.join(gaps)}"
        for name, gaps in sorted(untyped.items())
    )
    assert share >= MIN_TYPED, (
        f"{len(items) - len(untyped)} of {len(items)} public callables ({share:.1%}) are fully "
        f"annotated, fewer than {MIN_TYPED:.0%}; untyped:\n{listing}"
    )
    hand_written = [n for n in untyped if not defined_in(items[n]).startswith(GENERATED)]
    assert not hand_written, (
        f"hand-written public callables without full annotations: {', '.join(hand_written)}"
        f"\n{listing}"
    )


def type_checking_names(module: ModuleType) -> tuple[dict[str, object], set[str]]:
    """The names a module imports under `if TYPE_CHECKING:` (for type checkers only, so absent
    from its globals): ({name: object} of those that import here, {names of those that do
    not})."""
    tree = ast.parse(inspect.getsource(module))
    found: dict[str, object] = {}
    failed: set[str] = set()
    for node in ast.walk(tree):
        test = getattr(node, "test", None)
        if not isinstance(node, ast.If) or ast.unparse(test) not in (
            "TYPE_CHECKING",
            "typing.TYPE_CHECKING",
        ):
            continue
        for statement in node.body:
            if not isinstance(statement, (ast.Import, ast.ImportFrom)):
                continue
            names = {(a.asname or a.name).split(".")[0] for a in statement.names}
            space: dict[str, object] = {
                "__name__": module.__name__,
                "__package__": module.__package__,
            }
            try:
                exec(compile(ast.Module([statement], []), module.__name__, "exec"), space)
            except ImportError:
                failed |= names
                continue
            found.update({n: space[n] for n in names})
    return found, failed


def test_annotations_resolve():
    """Every annotation of the callables above names something that exists:
    typing.get_type_hints with the defining module's globals, plus the names it imports under
    `if TYPE_CHECKING:` (imported here for the purpose). Only where such an import fails here
    (an optional package not installed) does an annotation that names it just have to parse
    (ast.parse) instead."""
    problems = []
    checked = 0
    for name, obj in sorted(public_callables().items()):
        fn = function_of(obj)
        if not inspect.isfunction(fn):
            continue  # none, or a builtin's (an exception's inherited __init__): no annotations
        module = sys.modules[fn.__module__]
        localns, unimportable = type_checking_names(module)
        try:
            typing.get_type_hints(fn, globalns=vars(module), localns=localns)
            checked += 1
        except NameError as exc:
            if exc.name not in unimportable:
                problems.append(f"{name}: {exc}")
                continue
            for key, text in fn.__annotations__.items():
                if not isinstance(text, str):
                    continue  # an object already: nothing to resolve
                try:
                    ast.parse(text, mode="eval")
                except SyntaxError as error:
                    problems.append(f"{name}: annotation of {key} {text!r} does not parse: {error}")
        except Exception as exc:  # a malformed annotation: SyntaxError, TypeError, ...
            problems.append(f"{name}: {type(exc).__name__}: {exc}")
    assert not problems, "annotations that do not resolve:\n  " + "\n  ".join(problems)
    assert checked, "no callable's annotations were resolved"
