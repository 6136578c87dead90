"""The command line: generate text with GPT-2, fetch its weights, make token files, train.

    python -m gpt2lib generate --model gpt2 --prompt "The meaning of life is" --max-new-tokens 40
    python -m gpt2lib generate --model ./my-checkpoint --prompt "Hi" --temperature 0
    python -m gpt2lib download gpt2 gpt2-medium     # into the Hugging Face cache, for offline use
    python -m gpt2lib prepare TEXT_OR_FOLDER OUT.bin --val-fraction 0.1   # token files
    python -m gpt2lib train --data OUT.bin --out run ...   # also under torchrun (see train --help)

Written by hand (not generated from a notebook). Every error, whatever raised it, is one line
on standard error that starts with `error:`: exit status 2 for a bad argument (a value, a file
or a folder that cannot be used), 1 for a failure while the work runs (the network, a damaged
checkpoint, a training run that diverged), 130 for Ctrl-C. The parser imports nothing heavy,
so a bad argument is answered before PyTorch is imported; each command imports what it needs.
"""

from __future__ import annotations

import argparse
import math
import os
import re
import sys

EXIT_BAD_ARGUMENTS = 2
EXIT_FAILED = 1
EXIT_INTERRUPTED = 130

# what `python -m gpt2lib --help` shows (the module docstring adds notes for maintainers)
DESCRIPTION = """\
Generate text with GPT-2, fetch its weights, make token files and train.

    python -m gpt2lib generate --model gpt2 --prompt "The meaning of life is" --max-new-tokens 40
    python -m gpt2lib generate --model ./my-checkpoint --prompt "Hi" --temperature 0
    python -m gpt2lib download gpt2 gpt2-medium     # into the Hugging Face cache, for offline use
    python -m gpt2lib prepare TEXT_OR_FOLDER OUT.bin --val-fraction 0.1   # token files
    python -m gpt2lib train --data OUT.bin --out run ...   # also under torchrun (see train --help)
"""

# the released GPT-2s (gpt2lib.checkpoint.HUB_MODELS; tests/library/test_cli.py holds them equal): named
# here so that the parser does not import PyTorch
HUB_MODELS = ("gpt2", "gpt2-medium", "gpt2-large", "gpt2-xl")

TRAIN_EPILOG = """\
Several processes: torchrun --nproc_per_node=N -m gpt2lib train ... (gloo on CPU, NCCL on
CUDA). Several machines, torchrun's rendezvous, on every node:
  torchrun --nnodes=2 --nproc_per_node=8 --node_rank=R --rdzv_backend=c10d \\
      --rdzv_endpoint=HOST:29500 --rdzv_id=RUN -m gpt2lib train ...
A process waits --dist-timeout seconds (default 600) for the others to join, and for any one
exchange between them, then stops with an error.
The windows of a step depend only on --seed, the step and the global batch
(--batch-size x --grad-accum x processes). A --config FILE (JSON or TOML, keys as the flags)
gives defaults; flags on the command line win. The run folder is locked while a run uses it,
and the run never replaces a file it did not write.
"""


class _Parser(argparse.ArgumentParser):
    """argparse, but a bad argument gives one line (and exit code 2), not the usage block."""

    def error(self, message):
        self.exit(EXIT_BAD_ARGUMENTS, f"error: {message} (see `{self.prog} --help`)\n")


# --------------------------------------------------------------------------- argument types


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


def _number(text, allow_inf=False):
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a number, got {text!r}") from None
    if math.isnan(value) or (math.isinf(value) and not allow_inf):
        raise argparse.ArgumentTypeError(f"expected a finite number, got {text!r}")
    return value


def _real(low=None, high=None, low_inclusive=True, high_inclusive=True, allow_inf=False, why=""):
    """A float argument in a range (the CLI's side of gpt2lib.validation.check_real)."""

    def parse(text):
        value = _number(text, allow_inf)
        if low is not None and (value < low if low_inclusive else value <= low):
            raise argparse.ArgumentTypeError(
                f"must be {'>=' if low_inclusive else '>'} {low:g}, got {value:g}{why}"
            )
        if high is not None and (value > high if high_inclusive else value >= high):
            raise argparse.ArgumentTypeError(
                f"must be {'<=' if high_inclusive else '<'} {high:g}, got {value:g}{why}"
            )
        return value

    return parse


_temperature = _real(0, why=" (0 means greedy)")


def _top_p(text):
    value = _number(text)
    if not 0 < value <= 1:
        raise argparse.ArgumentTypeError(f"must be in (0, 1], got {value}")
    return value


_DEVICE = re.compile(r"^(auto|cpu|mps|cuda(:\d+)?)$")


def _device(text):
    if not _DEVICE.match(text.strip().lower()):
        raise argparse.ArgumentTypeError(f"unknown device {text!r}; use cpu, cuda, cuda:N or mps")
    return text


def _path(text):
    if not text.strip() or "\0" in text:
        raise argparse.ArgumentTypeError(f"expected a path, got {text!r}")
    return text


# --------------------------------------------------------------------------- the parser


def build_parser() -> argparse.ArgumentParser:
    """The parser of every command; it imports nothing heavy (no PyTorch, no numpy)."""
    parser = _Parser(
        prog="python -m gpt2lib",
        description=DESCRIPTION,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    sub = parser.add_subparsers(dest="command", required=True, parser_class=_Parser)

    gen = sub.add_parser("generate", help="continue a prompt, streaming the text to stdout")
    gen.add_argument(
        "--model",
        default=None,
        type=_path,
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
    gen.add_argument("--seed", type=_int_at_least(0), default=None, help="make sampling repeatable")
    gen.add_argument(
        "--device",
        default=None,
        type=_device,
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

    _add_prepare(sub)
    _add_train(sub)
    return parser


def _add_prepare(sub) -> None:
    prep = sub.add_parser(
        "prepare",
        help="tokenize text into a token file for `train`",
        description="Tokenize INPUT (a text file, or a folder of .txt/.md "
        "files joined with <|endoftext|> between them) with GPT-2's tokenizer "
        "into OUT: a 1,024-byte header (vocabulary, count, source SHA-256) "
        "and uint16 ids. OUT may replace only a token file, never the text.",
    )
    prep.add_argument(
        "input", metavar="INPUT", type=_path, help="a text file or a folder of text files"
    )
    prep.add_argument("out", metavar="OUT", type=_path, help="the token file to write")
    prep.add_argument(
        "--val-fraction",
        type=_real(0, 1, high_inclusive=False),
        default=0.0,
        metavar="F",
        help="put the last F of the ids in a validation file beside OUT, named "
        "with .val before the suffix (OUT=data/x.bin -> data/x.val.bin); default 0, "
        "no validation file",
    )
    prep.add_argument(
        "--processes",
        type=_int_at_least(1),
        default=None,
        help="worker processes for tokenizing (default: CPU count, at most 8)",
    )


def _add_train(sub) -> None:
    S = argparse.SUPPRESS  # only flags given on the command line reach the settings
    tr = sub.add_parser(
        "train",
        help="train a GPT-2 from token files (single process or torchrun)",
        epilog=TRAIN_EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
        argument_default=S,
    )
    add = tr.add_argument
    add("--config", type=_path, help="a JSON or TOML file of settings (keys as the flags)")
    add("--data", type=_path, help="training token file (python -m gpt2lib prepare)")
    add("--val-data", type=_path, help="validation token file")
    add(
        "--out",
        type=_path,
        help="run folder: log.jsonl, run.json, checkpoint.safetensors, and at the end "
        "config.json + model.safetensors",
    )
    for name, default in (("n-layer", 12), ("n-head", 12), ("n-embd", 768), ("block-size", 1024)):
        add(f"--{name}", type=_int_at_least(1), help=f"default {default}")
    add(
        "--batch-size", type=_int_at_least(1), help="windows per process per micro-step (default 8)"
    )
    add("--grad-accum", type=_int_at_least(1), help="micro-steps per optimizer step (default 1)")
    add(
        "--global-batch",
        type=_int_at_least(1),
        help="windows per optimizer step; sets --grad-accum, "
        "and must be a multiple of processes x --batch-size",
    )
    add("--steps", type=_int_at_least(1), help="optimizer steps (default 100)")
    add("--lr", type=_real(0, low_inclusive=False), help="peak learning rate (default 6e-4)")
    add("--min-lr", type=_real(0), help="the cosine's floor (default lr / 10)")
    add(
        "--warmup-steps",
        type=_int_at_least(0),
        help="linear warm-up steps (default 5%% of --steps)",
    )
    add("--weight-decay", type=_real(0), help="default 0.1; 0 turns it off")
    add(
        "--max-grad-norm",
        type=_real(0, low_inclusive=False, allow_inf=True),
        help="clip the gradient's norm to this (default 1.0; inf turns clipping off)",
    )
    add("--seed", type=_int_at_least(0), help="default 0")
    add(
        "--resume",
        action="store_true",
        help="continue from OUT/checkpoint.safetensors; it must be of the same model size, "
        "run settings and data",
    )
    add("--log-file", type=_path, help="the JSONL log (default OUT/log.jsonl)")
    add(
        "--checkpoint-every",
        type=_int_at_least(0),
        help="steps between checkpoints (default 0: only at the end)",
    )
    add(
        "--eval-every",
        type=_int_at_least(0),
        help="steps between validation estimates (default 0: at the end)",
    )
    add(
        "--dtype",
        choices=["float32", "bfloat16"],
        help="autocast dtype (default bfloat16 on a CUDA GPU that has it, else float32)",
    )
    add("--compile", action="store_true", help="torch.compile the model")
    add(
        "--device",
        type=_device,
        help="cpu, cuda or mps (default: cuda:LOCAL_RANK when CUDA is there)",
    )
    add(
        "--dropout",
        type=_real(0, 1, high_inclusive=False),
        help="dropout probability (default 0)",
    )
    add(
        "--pad-vocab",
        action="store_true",
        help="pad the vocabulary to a multiple of 64 "
        "(50,304); the saved model is cut back to 50,257",
    )
    add(
        "--peak-tflops",
        type=_real(0, low_inclusive=False),
        help="the device's peak for MFU (default: a data "
        "sheet for known GPUs, else a measured matmul)",
    )
    add(
        "--dist-timeout",
        type=_real(0, low_inclusive=False),
        help="seconds to wait for the other processes (default 600)",
    )
    add("--no-progress", action="store_true", help="no progress bar")


# --------------------------------------------------------------------------- generate, download


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
    if getattr(args, "model_from", None) == "default":  # the variable is read only then
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
    unknown = [n for n in args.names if n.removeprefix("openai-community/") not in HUB_MODELS]
    if unknown:  # refused before anything is imported or fetched
        print(
            f"error: unknown model {', '.join(map(repr, unknown))}; choose from "
            f"{', '.join(HUB_MODELS)}",
            file=sys.stderr,
        )
        return EXIT_BAD_ARGUMENTS
    from gpt2lib.checkpoint import download

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


# --------------------------------------------------------------------------- errors


def _one_line(exc: BaseException, with_type: bool = False) -> str:
    """An exception as one line: its message with every run of whitespace (newlines too) made
    one space, the type in front where the message alone would not say what happened."""
    text = " ".join(str(exc).split())
    if isinstance(exc, KeyError) and exc.args:
        text = repr(exc.args[0])
    if with_type or not text:
        return f"{type(exc).__name__}: {text}" if text else type(exc).__name__
    return text


def _bad_argument(exc: BaseException) -> bool:
    """Whether `exc` says that what was asked for cannot be done (exit 2) rather than that the
    work failed while it ran (exit 1)."""
    checkpoint = sys.modules.get("gpt2lib.checkpoint")  # imported by then if it raised
    if checkpoint is not None and isinstance(exc, checkpoint.CheckpointError):
        return False  # a damaged or unreachable checkpoint: the files, not the request
    return isinstance(
        exc, (ValueError, TypeError, FileNotFoundError, FileExistsError, IsADirectoryError)
    )


def _error(exc: BaseException, args) -> int:
    """Print `exc` as one `error:` line; return the exit status."""
    checkpoint = sys.modules.get("gpt2lib.checkpoint")
    if checkpoint is not None and isinstance(exc, checkpoint.HubUnreachable):
        message = _unreachable_message(exc, args)
    else:
        clear = isinstance(
            exc, (ValueError, TypeError, OSError, FloatingPointError, RuntimeError, MemoryError)
        )
        message = _one_line(exc, with_type=not clear or type(exc) in (OSError, RuntimeError))
        if (
            isinstance(exc, OSError)
            and exc.filename is not None
            and str(exc.filename) not in message
        ):
            message += f" ({exc.filename})"
    print(f"error: {' '.join(message.split())}", file=sys.stderr)
    return EXIT_BAD_ARGUMENTS if _bad_argument(exc) else EXIT_FAILED


def main(argv=None) -> int:
    """Run one command; every error becomes one `error:` line and an exit status."""
    args = build_parser().parse_args(argv)
    try:
        if args.command == "generate":
            return _generate(args)
        if args.command in ("prepare", "train"):
            from gpt2lib.scaling import run_command

            return run_command(args)
        return _download(args)
    except _OutputFailed as exc:  # > /dev/full, a closed stdout: say so, exit non-zero
        print(f"error: the output could not be written ({exc})", file=sys.stderr)
        if sys.stdout is not None and sys.stdout is sys.__stdout__:
            _silence_stdout()
        return EXIT_FAILED
    except KeyboardInterrupt:
        print("", file=sys.stderr)
        return EXIT_INTERRUPTED
    except BrokenPipeError:  # `... | head`: the reader left; not an error
        if sys.stdout is not None and sys.stdout is sys.__stdout__:
            _silence_stdout()
        return 0
    except RecursionError:
        print("error: the input is nested too deeply to be read", file=sys.stderr)
        return EXIT_FAILED
    except Exception as exc:  # every other error: one line, no traceback
        return _error(exc, args)
