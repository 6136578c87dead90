"""The command line: generate text with GPT-2, or fetch its weights ahead of time.

    python -m gpt2lib generate --model gpt2 --prompt "The meaning of life is" --max-new-tokens 40
    python -m gpt2lib generate --model ./my-checkpoint --prompt "Hi" --temperature 0
    python -m gpt2lib download gpt2 gpt2-medium     # into the Hugging Face cache, for offline use
    python -m gpt2lib prepare TEXT_OR_FOLDER OUT.bin --val-fraction 0.1   # token files
    python -m gpt2lib train --data OUT.bin --out run ...   # also under torchrun (see train --help)

Written by hand (not generated from a notebook).
"""

from __future__ import annotations

import argparse
import math
import os
import sys

EXIT_BAD_ARGUMENTS = 2
EXIT_FAILED = 1


class _Parser(argparse.ArgumentParser):
    """argparse, but a bad argument gives one line (and exit code 2), not the usage block."""

    def error(self, message):
        self.exit(EXIT_BAD_ARGUMENTS, f"{self.prog}: error: {message} (see --help)\n")


def _int_at_least(low):
    def parse(text):
        try:
            value = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected a whole number, got {text!r}") from None
        if value < low:
            raise argparse.ArgumentTypeError(f"must be at least {low}, got {value}")
        return value

    return parse


def _number(text):
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a number, got {text!r}") from None
    if not math.isfinite(value):
        raise argparse.ArgumentTypeError(f"expected a finite number, got {text!r}")
    return value


def _temperature(text):
    value = _number(text)
    if value < 0:
        raise argparse.ArgumentTypeError(f"must be >= 0 (0 means greedy), got {value}")
    return value


def _top_p(text):
    value = _number(text)
    if not 0 < value <= 1:
        raise argparse.ArgumentTypeError(f"must be in (0, 1], got {value}")
    return value


def build_parser() -> argparse.ArgumentParser:
    from gpt2lib.checkpoint import HUB_MODELS

    parser = _Parser(
        prog="python -m gpt2lib",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    sub = parser.add_subparsers(dest="command", required=True, parser_class=_Parser)

    gen = sub.add_parser("generate", help="continue a prompt, streaming the text to stdout")
    gen.add_argument(
        "--model",
        default=None,
        help=f"one of {', '.join(HUB_MODELS)}, or a local folder holding "
        "config.json and model.safetensors (default: $GPT2LIB_CHECKPOINT "
        "if set, else gpt2)",
    )
    gen.add_argument("--prompt", required=True, help="the text to continue")
    gen.add_argument(
        "--max-new-tokens",
        type=_int_at_least(0),
        default=50,
        help="how many tokens to add (default 50)",
    )
    gen.add_argument(
        "--temperature",
        type=_temperature,
        default=1.0,
        help="0 is greedy; below 1 is more focused, above 1 more random (default 1)",
    )
    gen.add_argument(
        "--top-k",
        type=_int_at_least(1),
        default=None,
        help="sample only among the K most likely tokens",
    )
    gen.add_argument(
        "--top-p",
        type=_top_p,
        default=None,
        help="sample only among the most likely tokens whose probability adds "
        "up to P (nucleus sampling)",
    )
    gen.add_argument("--seed", type=int, default=None, help="make sampling repeatable")
    gen.add_argument(
        "--device",
        default=None,
        help="cpu, cuda, cuda:N or mps (default: CUDA, then MPS, then CPU)",
    )
    gen.add_argument(
        "--dtype",
        default=None,
        choices=["float32", "bfloat16", "float16"],
        help="default: float32 on CPU/MPS, bfloat16 on a CUDA GPU that has it",
    )
    gen.add_argument(
        "--stop-at-eos", action="store_true", help="stop when the model writes <|endoftext|>"
    )
    gen.add_argument(
        "--no-cache",
        action="store_true",
        help="recompute every token each step instead of using the KV cache",
    )
    gen.add_argument(
        "--compile",
        action="store_true",
        help="compile the decode step with torch.compile (CUDA only)",
    )

    down = sub.add_parser(
        "download", help="fetch weights into the Hugging Face cache so that later runs work offline"
    )
    down.add_argument(
        "names", nargs="+", metavar="NAME", help=f"one or more of {', '.join(HUB_MODELS)}"
    )

    from gpt2lib.scaling import add_subcommands  # prepare, train (chapter 11)

    add_subcommands(sub)
    return parser


def _model_name(args) -> str:
    """--model, else $GPT2LIB_CHECKPOINT, else gpt2 (records which one was used)."""
    if args.model is not None:
        args.model_from = "--model"
        return args.model
    if os.environ.get("GPT2LIB_CHECKPOINT"):
        args.model_from = "GPT2LIB_CHECKPOINT"
        return os.environ["GPT2LIB_CHECKPOINT"]
    args.model_from = "default"
    return "gpt2"


def _unreachable_message(exc, args) -> str:
    """The hub cannot be reached: what to do, in terms of the command that was typed."""
    head = (
        f"the weights of {exc.name!r} are not in the local Hugging Face cache, and the hub "
        f"cannot be reached ({exc.reason})."
    )
    if args.command == "download":
        what = "Unset HF_HUB_OFFLINE" if exc.offline else "Connect to the internet"
        return (
            f"{head} {what} and run this command again; the files are then kept in the "
            "cache for offline use."
        )
    from gpt2lib.checkpoint import standin_folder

    instead = "pass --model FOLDER, a folder holding config.json and model.safetensors"
    if args.model_from == "default":  # the variable is read only when --model is left out
        instead += ", or set GPT2LIB_CHECKPOINT to such a folder"
    standin = standin_folder()
    offline = (
        f" Without a network, the course's small stand-in (not OpenAI's model) works: "
        f"--model {standin}."
        if standin is not None
        else ""
    )
    return (
        f"{head} While online, run `python -m gpt2lib download {exc.name}` once; or "
        f"{instead}.{offline}"
    )


class _OutputFailed(Exception):
    """Standard output could not be written (closed, a full disk, /dev/full)."""


def _write(out, text: str) -> None:
    try:
        out.write(text)
        out.flush()
    except BrokenPipeError:
        raise
    except (OSError, ValueError) as exc:  # ValueError: "I/O operation on closed file"
        raise _OutputFailed(getattr(exc, "strerror", None) or str(exc)) from None


def _stdout_or_fail():
    out = sys.stdout
    if out is None or getattr(out, "closed", False):
        raise _OutputFailed("standard output is closed")
    return out


def _generate(args) -> int:
    from gpt2lib.generation import stream_text
    from gpt2lib.model import from_pretrained

    out = _stdout_or_fail()  # before the model is loaded: nowhere to write means no work
    try:
        from gpt2lib.tokenizer import get_encoding
    except ImportError as exc:
        print(
            f"error: the tokenizer (gpt2lib.tokenizer, chapter 1) cannot be imported: {exc}",
            file=sys.stderr,
        )
        return EXIT_FAILED
    model = from_pretrained(_model_name(args), device=args.device, dtype=args.dtype)
    tokenizer = get_encoding()
    if model.config.vocab_size < tokenizer.n_vocab:
        print(
            f"error: the model's vocabulary has {model.config.vocab_size:,} tokens, fewer than "
            f"the {tokenizer.n_vocab:,} of GPT-2's tokenizer that this command uses, so the "
            "tokenizer's ids do not fit the model; use a model with GPT-2's vocabulary "
            "(vocab_size=50257)",
            file=sys.stderr,
        )
        return EXIT_FAILED
    pieces = stream_text(
        model,
        tokenizer,
        args.prompt,
        args.max_new_tokens,
        temperature=args.temperature,
        top_k=args.top_k,
        top_p=args.top_p,
        seed=args.seed,
        stop_at_eos=args.stop_at_eos,
        use_cache=not args.no_cache,
        compile=args.compile,
    )  # checks arguments
    _write(out, args.prompt)
    for piece in pieces:
        _write(out, piece)
    _write(out, "\n")
    return 0


def _download(args) -> int:
    from gpt2lib.checkpoint import HUB_MODELS, download, hub_name

    unknown = [n for n in args.names if hub_name(n) is None]
    if unknown:
        print(
            f"error: unknown model {', '.join(map(repr, unknown))}; choose from "
            f"{', '.join(HUB_MODELS)}",
            file=sys.stderr,
        )
        return EXIT_BAD_ARGUMENTS
    download(args.names, out=_StdoutLines(_stdout_or_fail()))
    return 0


class _StdoutLines:
    """print(..., file=this) that reports a failed write as _OutputFailed."""

    def __init__(self, out):
        self.out = out

    def write(self, text):
        _write(self.out, text)

    def flush(self):
        pass


def _silence_stdout() -> None:
    """Point file descriptor 1 at /dev/null, so that the interpreter's last flush of what is
    still buffered does not fail again at exit (Python's advice for a closed pipe)."""
    try:
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        os.close(devnull)
    except (OSError, ValueError, AttributeError):
        pass


def main(argv=None) -> int:
    args = build_parser().parse_args(argv)
    from gpt2lib.checkpoint import CheckpointError, HubUnreachable

    try:
        if args.command == "generate":
            return _generate(args)
        if args.command in ("prepare", "train"):
            from gpt2lib.scaling import run_command

            return run_command(args)
        return _download(args)
    except HubUnreachable as exc:  # no network, or offline mode, and nothing in the cache
        print(f"error: {_unreachable_message(exc, args)}", file=sys.stderr)
        return EXIT_FAILED
    except CheckpointError as exc:  # the files: missing, corrupt
        print(f"error: {exc}", file=sys.stderr)
        return EXIT_FAILED
    except (ValueError, TypeError, FileNotFoundError) as exc:  # what the user asked for
        print(f"error: {exc}", file=sys.stderr)
        return EXIT_BAD_ARGUMENTS
    except _OutputFailed as exc:  # > /dev/full, a closed stdout: say so, exit non-zero
        print(f"error: the output could not be written ({exc})", file=sys.stderr)
        if sys.stdout is not None and sys.stdout is sys.__stdout__:
            _silence_stdout()
        return EXIT_FAILED
    except KeyboardInterrupt:
        print("", file=sys.stderr)
        return 130
    except BrokenPipeError:  # `... | head`: the reader left; not an error
        if sys.stdout is not None and sys.stdout is sys.__stdout__:
            _silence_stdout()
        return 0
    except (OSError, RuntimeError, MemoryError, RecursionError) as exc:  # one line, no traceback
        first = (str(exc).strip().splitlines() or [""])[0]
        print(f"error: {type(exc).__name__}: {first}", file=sys.stderr)
        return EXIT_FAILED
