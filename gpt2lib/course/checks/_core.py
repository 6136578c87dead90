"""What every check shares: the failure types, calling learner code safely, the pass line,
and the toolkit for naming mistakes (`Mistake`, `close`, `expect_tensor`, `first_mistake`).

A check compares the learner's answer with the right one, and when they differ, with each
planted `Mistake` (a known wrong version and the message that names it). Each check module
keeps its mistakes in module-level lists of `Mistake`, so that the tests can be parametrised
over exactly the variants the check knows.
"""

from __future__ import annotations

import contextlib
import functools
import inspect
import sys
import types
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from unittest import mock

# What a check says of an answer that still raises its exercise's NotImplementedError stub.
NOT_DONE = "not done yet: replace the `raise NotImplementedError(...)` line with your code, run that cell, then run this check again."


class CheckFailed(AssertionError):
    """An exercise answer is wrong; the message says what looks wrong and what to try."""

    def __init__(self, exercise: str, message: str):
        self.exercise = exercise
        super().__init__(f"{exercise}: {message}")


class NotDoneYet(CheckFailed):
    """The exercise still holds its `raise NotImplementedError(...)` stub."""


@dataclass(frozen=True)
class Mistake:
    """A planted wrong answer: a short name (for tests), the message a learner sees, and a
    function computing what that wrong answer gives. What `fn` takes is up to each check."""

    name: str
    message: str
    fn: Callable[..., Any]


def named(mistakes: Iterable[Mistake], name: str) -> Mistake:
    """The planted mistake called `name`: for a check that recognises a whole family of wrong
    answers by a symptom and names them with that mistake's message (written once)."""
    for mistake in mistakes:
        if mistake.name == name:
            return mistake
    raise LookupError(f"no planted mistake is called {name!r}")  # a bug in the check itself


def first_mistake(
    mistakes: Iterable[Mistake], matches: Callable[[Mistake], bool]
) -> Mistake | None:
    """The first planted mistake for which `matches(mistake)` is true, or None.

    A mistake whose function raises (it may not apply to this input) does not match."""
    for mistake in mistakes:
        try:
            if matches(mistake):
                return mistake
        except Exception:  # a wrong version that cannot run on this input is simply no match
            continue
    return None


def fail_with(
    exercise: str,
    mistakes: Iterable[Mistake],
    matches: Callable[[Mistake], bool],
    otherwise: str,
    *,
    symptom: str | None = None,
    prefix: str = "",
    suffix: str = "",
) -> None:
    """Raise CheckFailed naming the first planted mistake that `matches` (else the one called
    `symptom`, when the check saw its symptom), between `prefix` (say, the case where it
    showed) and `suffix`; with `otherwise` when no mistake is named."""
    mistake = first_mistake(mistakes, matches)
    if mistake is None and symptom is not None:
        mistake = named(mistakes, symptom)
    raise CheckFailed(exercise, prefix + mistake.message + suffix if mistake else otherwise)


def named_failure(
    exercise: str, mistakes: Iterable[Mistake], name: str, *, prefix: str = "", suffix: str = ""
) -> CheckFailed:
    """The failure that names the planted mistake `name` (a check saw its symptom), to raise."""
    return CheckFailed(exercise, prefix + named(mistakes, name).message + suffix)


def planted(make: Callable[[str], Callable[..., Any]], messages: dict[str, str]) -> list[Mistake]:
    """The planted mistakes {name: message}, each wrong answer made by make(name)."""
    return [Mistake(name, message, make(name)) for name, message in messages.items()]


def variants(right: Callable[..., Any], messages: dict[str, str]) -> list[Mistake]:
    """The planted mistakes {name: message} of a right answer that takes `mistake=`: each wrong
    answer is `right` called with `mistake=name`, so the name in the table is the switch that
    plants it and the right answer says, where it branches, which mistake it plants there."""
    return planted(lambda name: functools.partial(right, mistake=name), messages)


def unpack(exercise: str, got: Any, n: int, what: str) -> Any:
    """`got` when it is a tuple or list of n things, else CheckFailed asking to return `what`."""
    if not isinstance(got, (tuple, list)) or len(got) != n:
        raise CheckFailed(exercise, f"return {what}; got {type(got).__name__}")
    return got


def require(exercise: str, ok: Any, message: str) -> None:
    """CheckFailed(exercise, message) unless `ok`."""
    if not ok:
        raise CheckFailed(exercise, message)


def close(got: Any, want: Any, atol: float = 1e-5, rtol: float = 1e-5) -> bool:
    """Whether `got` is a tensor of `want`'s shape with the same values, compared in float64.

    Any float dtype is accepted (float64 answers are fine); NaN never equals anything."""
    import torch  # here, so that chapters without PyTorch (the tokenizer) can use this module

    if not isinstance(got, torch.Tensor) or not isinstance(want, torch.Tensor):
        return False
    if tuple(got.shape) != tuple(want.shape):
        return False
    return bool(
        torch.allclose(
            got.detach().double().cpu(), want.detach().double().cpu(), atol=atol, rtol=rtol
        )
    )


def fail_unless_close(
    exercise: str,
    got: Any,
    want: Any,
    mistakes: Iterable[Mistake],
    args: tuple,
    otherwise: str,
    *,
    part: int | None = None,
    **tol: float,
) -> None:
    """Nothing when `got` is close to `want`; else CheckFailed naming the first mistake whose
    seeded fn(*args) (its item `part`, when it returns a tuple) `got` is close to, or with
    `otherwise`."""
    if close(got, want, **tol):
        return

    def matches(mistake: Mistake) -> bool:
        wrong = seeded_call(mistake.fn, *args)
        return close(got, wrong if part is None else wrong[part], **tol)

    fail_with(exercise, mistakes, matches, otherwise)


def judge(
    exercise: str,
    got: Any,
    want: Any,
    mistakes: Iterable[Mistake],
    wrong: Callable[[Mistake], Any],
    otherwise: str | Callable[[Any], str],
    *,
    what: str,
    hints: dict[tuple, str] | None = None,
    atol: float = 1e-5,
    rtol: float = 1e-5,
) -> Any:
    """The learner's `got` as a tensor of want's shape and values (returned as float64); else
    the first mistake m with wrong(m) close to it is named, or `otherwise` (a message, or a
    function of `got` that gives one) is said."""
    got = expect_tensor(exercise, got, tuple(want.shape), what=what, hints=hints)
    if not close(got, want, atol=atol, rtol=rtol):
        fail_with(
            exercise,
            mistakes,
            lambda m: close(got, wrong(m), atol=atol, rtol=rtol),
            otherwise(got) if callable(otherwise) else otherwise,
        )
    return got


def dropout_of(got: Any, no_dropout: Any, p: float, **tol: float) -> bool:
    """Whether `got` is `no_dropout` after a dropout of p with other random numbers: about half
    (0.3 to 0.7) of it zeroed, the rest divided by 1 - p."""
    kept = got != 0
    zeroed = 1 - kept.double().mean().item()
    return 0.3 < zeroed < 0.7 and close(got[kept], no_dropout[kept] / (1 - p), **tol)


CHECK_SEED = 1234  # the seed seeded_call uses, so that a check's dropout masks line up


def seeded_call(fn: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
    """fn(*args, **kwargs) without gradients, with torch's global RNG seeded to CHECK_SEED.

    Two calls then draw the same dropout masks, so a learner's module in train mode can be
    compared with the reference. The notebook's own random state is restored afterwards."""
    import torch

    with torch.random.fork_rng():
        torch.manual_seed(CHECK_SEED)
        with torch.no_grad():
            return fn(*args, **kwargs)


def expect_tensor(
    exercise: str,
    got: Any,
    shape: tuple | None = None,
    *,
    what: str = "your result",
    finite: bool = True,
    hints: dict[tuple, str] | None = None,
):
    """Check the form of a learner's tensor before its values, naming what is off.

    shape: the expected shape (None: any). hints: messages for known wrong shapes, keyed by
    shape, such as {(B, T, nh, hd): "transpose(1, 2) is missing"}. finite: NaN and ±inf are
    mistakes. Returns the tensor as float64 (integer tensors are returned unchanged).
    """
    import torch

    if not isinstance(got, torch.Tensor):
        raise CheckFailed(exercise, f"{what} should be a torch.Tensor, got {type(got).__name__}")
    if shape is not None and tuple(got.shape) != tuple(shape):
        hint = (hints or {}).get(tuple(got.shape))
        message = f"{what} has shape {tuple(got.shape)}, expected {tuple(shape)}"
        raise CheckFailed(exercise, message + (f": {hint}" if hint else ""))
    if got.dtype.is_floating_point or got.dtype.is_complex:
        if finite and not bool(torch.isfinite(got).all()):
            bad = "NaN" if bool(torch.isnan(got).any()) else "±inf"
            raise CheckFailed(
                exercise, f"{what} contains {bad}; every value must be a finite number"
            )
        return got.detach().double()
    return got.detach()


def reveal(prediction: Any, measured: Any, *, what: str, unit: str = "") -> None:
    """Print the learner's written prediction beside what the cell measured (a Predict prompt's
    answer). A prediction left as None is shown as not written, never as wrong."""

    def shown(value: Any) -> str:
        if isinstance(value, float):
            value = f"{value:.4g}"
        return f"{value}{' ' + unit if unit else ''}"

    guess = (
        "(none written: write one down before you run this cell)"
        if prediction is None
        else shown(prediction)
    )
    print(f"{what}\n  your prediction: {guess}\n  measured:        {shown(measured)}")


_SILENCED = [0]  # > 0 while one_pass runs several checks that make up one exercise


@contextlib.contextmanager
def one_pass(exercise: str, detail: str = "") -> Iterator[None]:
    """Run several checks of one exercise with their own pass lines silenced; the exercise
    passes once, after all of them (so that no part is recorded as passed alone)."""
    _SILENCED[0] += 1
    try:
        yield
    finally:
        _SILENCED[0] -= 1
    passed(exercise, detail)


def passed(exercise: str, detail: str = "", *, part: str = "") -> None:
    """Print the line learners look for after a correct answer; in a learner notebook the
    exercise's code goes into the learner's package (gpt2lib.course.mine).

    part: for an exercise with several checks, which one this is ("the unigram line"): its
    line says so, and the exercise's code waits for the last check (called without `part`)."""
    if _SILENCED[0]:
        return
    if part:
        print(f"✅ {exercise}, {part}, passed" + (f": {detail}" if detail else ""))
        return
    from gpt2lib.course import mine

    mine.record_pass(exercise)
    print(f"✅ {exercise} passed" + (f": {detail}" if detail else ""))


@contextlib.contextmanager
def forbidding(exercise: str, *paths: str, instead: str) -> Iterator[None]:
    """While the block runs, each function in `paths` (e.g. "torch.nn.functional.gelu") raises
    CheckFailed naming it: an exercise that says "not allowed" checks it."""

    def refuse(path):
        def refused(*args, **kwargs):
            raise CheckFailed(
                exercise, f"your code calls {path}, which is not allowed here: {instead}"
            )

        return refused

    with contextlib.ExitStack() as stack:
        for path in paths:
            stack.enter_context(mock.patch(path, refuse(path)))
        yield


def refusing(
    exercise: str, fn: Callable[..., Any], *paths: str, instead: str
) -> Callable[..., Any]:
    """`fn` with `forbidding(exercise, *paths)` around each call (its signature kept)."""

    @functools.wraps(fn)
    def guarded(*args, **kwargs):
        with forbidding(exercise, *paths, instead=instead):
            return fn(*args, **kwargs)

    return guarded


def tiny_config(*, pdrop: float = 0.0, **sizes: Any) -> Any:
    """A small GPT2Config for a check: 1 layer, 2 heads, width 16, 16 positions, 50 token ids
    and dropout `pdrop` everywhere (none by default); `sizes` sets any other field."""
    from gpt2lib.chapters.config import GPT2Config

    fields = dict(n_layer=1, n_head=2, n_embd=16, n_positions=16, vocab_size=50)
    fields.update(embd_pdrop=pdrop, attn_pdrop=pdrop, resid_pdrop=pdrop)
    return GPT2Config(**{**fields, **sizes})


def tiny_gpt2(seed: int = 0, **sizes: Any) -> Any:
    """The reference GPT2 on `tiny_config(**sizes)`, its weights drawn from `seed`, in eval mode."""
    import torch

    from gpt2lib.chapters.model import GPT2

    torch.manual_seed(seed)
    return GPT2(tiny_config(**sizes)).eval()


def call_learner(exercise: str, fn: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
    """Call a learner's function, class or module, turning the usual non-answers into clear
    messages.

    - still the stub: raises NotDoneYet ("not done yet");
    - wrong signature (the arguments cannot be bound; for a torch module, to its `forward`):
      says what the check passed and what the learner's code takes;
    - any other exception: re-raised as is, so the learner sees their own traceback (the
      check's own frames are hidden in notebooks, see `install_notebook_display`).
    """
    __tracebackhide__ = True  # IPython and pytest leave this frame out of tracebacks
    if not callable(fn):
        raise CheckFailed(exercise, f"expected a function or class, got {type(fn).__name__}")
    target, shown_name = _call_target(fn)
    try:
        signature = inspect.signature(target)
    except (TypeError, ValueError):  # builtins without a signature: just try the call
        signature = None
    if signature is not None:
        try:
            signature.bind(*args, **kwargs)
        except TypeError as exc:
            shown = ", ".join(
                [_describe(a) for a in args] + [f"{k}={_describe(v)}" for k, v in kwargs.items()]
            )
            raise CheckFailed(
                exercise,
                f"the check calls {shown_name}({shown}), but {shown_name}{signature} cannot take that ({exc}). Keep the signature given in the exercise.",
            ) from None
    try:
        return fn(*args, **kwargs)
    except NotImplementedError:
        raise NotDoneYet(exercise, NOT_DONE) from None


def call_explaining(
    exercise: str,
    fn: Callable[..., Any],
    *args: Any,
    explain: dict[str, str | Callable[[RuntimeError], str]],
    **kwargs: Any,
) -> Any:
    """call_learner, where a RuntimeError whose text holds a key of `explain` is that key's
    message instead (a message, or a function of the error that gives one): the errors a known
    mistake raises deep inside PyTorch, said in the exercise's terms."""
    try:
        return call_learner(exercise, fn, *args, **kwargs)
    except RuntimeError as exc:
        for text, message in explain.items():
            if text in str(exc):
                raise CheckFailed(
                    exercise, message(exc) if callable(message) else message
                ) from None
        raise


def _call_target(fn: Any) -> tuple[Callable[..., Any], str]:
    """What a call of `fn` really runs, for its signature, and the name to show.

    A torch module instance is called as `module(x)`, which runs `module.forward(x)`; its
    own `__call__` takes anything, so its `forward` is what to check."""
    forward = getattr(type(fn), "forward", None)
    if forward is not None and not isinstance(fn, type) and _is_torch_module(fn):
        return fn.forward, f"{type(fn).__name__}.forward"
    return fn, getattr(fn, "__name__", repr(fn))


def _is_torch_module(value: Any) -> bool:
    torch = sys.modules.get("torch")  # no torch imported means it cannot be a torch module
    return torch is not None and isinstance(value, torch.nn.Module)


def _describe(value: Any) -> str:
    shape = getattr(value, "shape", None)
    if shape is not None:
        return f"<{type(value).__name__} of shape {tuple(shape)}>"
    text = repr(value)
    return text if len(text) <= 40 else text[:37] + "..."


# --------------------------------------------------------------------------- notebook display

_CHECKS_DIR = Path(__file__).resolve().parent  # gpt2lib/course/checks/


def _in_checks(frame) -> bool:
    try:
        return Path(frame.f_code.co_filename).resolve().parent == _CHECKS_DIR
    except (OSError, ValueError):
        return False


def _without_check_frames(tb: types.TracebackType | None) -> types.TracebackType | None:
    """The traceback with every frame from gpt2lib/course/checks/ left out (`tb` itself when it
    has none)."""
    kept, entry = [], tb
    while entry is not None:
        if not _in_checks(entry.tb_frame):
            kept.append(entry)
        entry = entry.tb_next
    if len(kept) == _length(tb):
        return tb
    rebuilt = None
    for item in reversed(kept):
        rebuilt = types.TracebackType(rebuilt, item.tb_frame, item.tb_lasti, item.tb_lineno)
    return rebuilt


def _length(tb: types.TracebackType | None) -> int:
    count = 0
    while tb is not None:
        count, tb = count + 1, tb.tb_next
    return count


def _show_in_notebook(shell, etype, value, tb, tb_offset=None):
    """IPython's handler for errors in a cell, once a check has been imported.

    A failed check is shown as one red line, `CheckFailed: <message>` (the error output
    keeps its ename and evalue, which nbval and `course progress` read). Any other error
    gets IPython's usual traceback, without the frames of gpt2lib/course/checks/, so the learner's
    own code is what they see."""
    if isinstance(value, CheckFailed):
        from gpt2lib.course import mine

        mine.record_failure(value.exercise, str(value))  # its part of mygpt2/ is the reference's
        line = f"\x1b[0;31m{etype.__name__}\x1b[0m: {value}"
        shell._showtraceback(etype, value, [line])
        return [line]
    trimmed = _without_check_frames(tb)
    if trimmed is tb:
        shell.showtraceback(running_compiled_code=True)
    else:
        shell.showtraceback((etype, value, trimmed), running_compiled_code=True)
    return None


def install_notebook_display() -> bool:
    """In an IPython kernel, show failed checks as one line (see `_show_in_notebook`).

    Runs when gpt2lib.course.checks is imported; outside IPython it does nothing. Returns whether
    the handler is installed."""
    ipython = sys.modules.get("IPython")
    shell = ipython.get_ipython() if ipython is not None else None
    if shell is None or not hasattr(shell, "_showtraceback"):
        return False
    shell.set_custom_exc((Exception,), _show_in_notebook)
    return True


install_notebook_display()
