"""The command line: every subcommand answers every bad argument with one `error:`
line and exit status 2, no traceback; a bad argument is answered before PyTorch is imported;
--help carries no maintainer's note; any other error is one line too."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from gpt2lib import cli

REPO = Path(__file__).resolve().parents[2]


def subcommands() -> set[str]:
    import argparse

    parser = cli.build_parser()
    (action,) = [a for a in parser._actions if isinstance(a, argparse._SubParsersAction)]
    return set(action.choices)


# Bad arguments of every subcommand: those the parser refuses (answered before PyTorch is
# imported), then those only the command itself can judge (a missing file, a model name).
BAD_ARGUMENTS = {
    "generate": [
        ["--prompt", "x", "--temperature", "-1"],
        ["--prompt", "x", "--top-p", "0"],
        ["--prompt", "x", "--top-k", "many"],
        ["--prompt", "x", "--seed", "-1"],
        ["--prompt", "x", "--device", "tpu"],
        ["--prompt", "x", "--max-new-tokens", "1.5"],
        ["--prompt", "x", "--bogus"],
        [],
    ],
    "download": [[], ["--bogus", "gpt2"]],
    "prepare": [
        ["only-one"],
        ["in.txt", "out.bin", "--val-fraction", "1"],
        ["in.txt", "out.bin", "--val-fraction", "nan"],
        ["in.txt", "out.bin", "--processes", "0"],
    ],
    "train": [
        ["--steps", "0"],
        ["--lr", "-1"],
        ["--lr", "inf"],
        ["--weight-decay", "nan"],
        ["--dropout", "1"],
        ["--peak-tflops", "-1"],
        ["--max-grad-norm", "0"],
        ["--n-layer", "two"],
        ["--dtype", "float16"],
        ["--device", "tpu"],
        ["--bogus"],
    ],
}
BAD_ARGUMENTS_AT_WORK = {  # judged by the command, after its imports
    "generate": [["--prompt", "x", "--model", "gpt3"], ["--prompt", "x", "--model", "/no/such"]],
    "download": [["gpt-5"]],
    "prepare": [["/no/such/text.txt", "out.bin"]],
    "train": [
        ["--data", "/no/such.bin", "--out", "run"],
        ["--out", "run"],
        ["--config", "/no/such.toml", "--data", "x.bin", "--out", "run"],
    ],
}


def test_the_table_covers_every_subcommand():
    assert set(BAD_ARGUMENTS) == set(BAD_ARGUMENTS_AT_WORK) == subcommands()


_PROBE = """
import json, sys
from gpt2lib.cli import main
try:
    code = main(json.loads(sys.argv[1]))
except SystemExit as exc:
    code = exc.code
sys.stderr.flush()
print(json.dumps([code, "torch" in sys.modules]))
"""


def _probe(argv, cwd):
    """main(argv) in a fresh interpreter: (exit status, stdout before the probe's own line,
    stderr, whether torch was imported)."""
    done = subprocess.run(
        [sys.executable, "-c", _PROBE, json.dumps(argv)],
        capture_output=True,
        text=True,
        cwd=cwd,
        timeout=120,
    )
    *printed, last = done.stdout.splitlines() or [""]
    code, imported = json.loads(last)
    return code, "\n".join(printed), done.stderr, imported


def _one_error_line(err):
    lines = err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: "), err
    assert "Traceback" not in err


@pytest.mark.parametrize(
    "command, args",
    [(c, a) for c, cases in BAD_ARGUMENTS.items() for a in cases],
    ids=lambda v: v if isinstance(v, str) else " ".join(v) or "(none)",
)
def test_a_bad_argument_is_one_line_exit_2_before_torch_is_imported(command, args, tmp_path):
    code, out, err, imported = _probe([command, *args], tmp_path)
    assert code == 2, err
    _one_error_line(err)
    assert out == ""
    assert not imported, "the parser imported PyTorch before answering a bad argument"


@pytest.mark.parametrize(
    "command, args",
    [(c, a) for c, cases in BAD_ARGUMENTS_AT_WORK.items() for a in cases],
    ids=lambda v: v if isinstance(v, str) else " ".join(v) or "(none)",
)
def test_a_bad_argument_the_command_judges_is_one_line_exit_2(
    command, args, tmp_path, monkeypatch, capsys
):
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    try:
        code = cli.main([command, *args])
    except SystemExit as exc:
        code = exc.code
    out = capsys.readouterr()
    assert code == 2, out.err
    _one_error_line(out.err)
    assert out.out == ""


def test_any_other_error_is_one_line_too(monkeypatch, capsys, tmp_path):
    """An error of a kind no one foresaw: one line with its type, exit 1, no traceback."""
    import gpt2lib.scaling

    def boom(args):
        raise ZeroDivisionError("division by zero\nsecond line")

    monkeypatch.setattr(gpt2lib.scaling, "run_command", boom)
    assert cli.main(["prepare", "a.txt", "b.bin"]) == 1
    err = capsys.readouterr().err
    _one_error_line(err)
    assert "ZeroDivisionError: division by zero second line" in err


def test_help_holds_no_maintainers_note():
    for argv in (["--help"], *[[c, "--help"] for c in sorted(subcommands())]):
        done = subprocess.run(
            [sys.executable, "-m", "gpt2lib", *argv],
            capture_output=True,
            text=True,
            cwd=REPO,
            timeout=60,
        )
        assert done.returncode == 0, done.stderr
        assert (
            "Written by hand" not in done.stdout and "generated from a notebook" not in done.stdout
        )


def test_the_cli_names_the_released_models_as_the_checkpoint_module_does():
    from gpt2lib.checkpoint import HUB_MODELS

    assert cli.HUB_MODELS == HUB_MODELS
