"""Chapter 11's training entry point: checkpoints read without unpickling and checked,
settings checked before any work, a run that diverges is one line, the run folder locked, no
writer replaces what it did not write, token files checked (int32 ones too), resuming on other
data refused, and a rank whose peer never starts gives up in time."""

from __future__ import annotations

import json
import pickle
import socket
import struct
import subprocess
import sys
import time
from pathlib import Path

import pytest
from test_scaling import TINY, TINY_FLAGS, environment, shakespeare_ids, token_file  # noqa: F401

from gpt2lib import scaling, tokenfile
from gpt2lib.cli import main
from gpt2lib.scaling import CHECKPOINT_FILE, TrainingSetupError, load_checkpoint, pretrain
from gpt2lib.tokenfile import TokenFileError

REPO = Path(__file__).resolve().parents[2]


def cli(*args, timeout=240, env=None):
    return subprocess.run(
        [sys.executable, "-m", "gpt2lib", *args],
        capture_output=True,
        text=True,
        env={**environment(), **(env or {})},
        cwd=REPO,
        timeout=timeout,
    )


def one_error_line(err: str) -> str:
    lines = err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: "), err
    assert "Traceback" not in err
    return lines[0]


def run_main(argv, capsys):
    try:
        code = main(argv)
    except SystemExit as exc:
        code = exc.code
    out = capsys.readouterr()
    return code, out.out, out.err


@pytest.fixture
def finished_run(tmp_path, token_file):  # noqa: F811
    out = tmp_path / "run"
    pretrain(**{**TINY, "steps": 2, "out": str(out), "data": str(token_file)})
    return out


# --------------------------------------------------------------------------- checkpoints: never unpickled, always checked


class _Payload:
    """Unpickling this creates a file: the proof that a checkpoint's code ran."""

    def __init__(self, marker):
        self.marker = marker

    def __reduce__(self):
        return (open, (self.marker, "w"))


def test_a_hostile_checkpoint_does_not_run_its_code(tmp_path, token_file):  # noqa: F811
    out = tmp_path / "run"
    out.mkdir()
    marker = tmp_path / "the payload ran"
    hostile = pickle.dumps({"format": "gpt2lib-training-checkpoint", "x": _Payload(str(marker))})
    for name in {CHECKPOINT_FILE, "checkpoint.pt"}:
        (out / name).write_bytes(hostile)
    done = cli(
        "train",
        "--data",
        str(token_file),
        *TINY_FLAGS,
        "--steps",
        "2",
        "--out",
        str(out),
        "--resume",
    )
    assert not marker.exists(), "the checkpoint's pickle was loaded and its code ran"
    assert done.returncode == 2
    assert "pickle" in one_error_line(done.stderr) or "not a" in done.stderr


def test_a_checkpoint_missing_a_field_is_named_not_a_key_error(finished_run, token_file):  # noqa: F811
    path = finished_run / CHECKPOINT_FILE
    state = load_checkpoint(path)
    del state["rng"]
    scaling.save_checkpoint(path, state)
    with pytest.raises(TrainingSetupError, match="'rng' is missing"):
        pretrain(
            **{
                **TINY,
                "steps": 2,
                "out": str(finished_run),
                "data": str(token_file),
                "resume": True,
            }
        )


def test_a_damaged_or_cut_checkpoint_is_one_clear_error(finished_run, token_file):  # noqa: F811
    path = finished_run / CHECKPOINT_FILE
    data = path.read_bytes()
    for damaged in (data[: len(data) // 2], data[:7], b"", b"\x00" * 100):
        path.write_bytes(damaged)
        with pytest.raises(TrainingSetupError, match="training checkpoint"):
            load_checkpoint(path)


def test_nan_weights_in_a_checkpoint_are_refused(finished_run):
    path = finished_run / CHECKPOINT_FILE
    state = load_checkpoint(path)
    next(iter(state["model"].values())).view(-1)[0] = float("nan")
    scaling.save_checkpoint(path, state)
    with pytest.raises(TrainingSetupError, match="NaN or infinite"):
        load_checkpoint(path)


# --------------------------------------------------------------------------- settings checked first; a diverging run is one line


def test_a_run_that_diverges_is_one_line_with_sensible_advice(tmp_path, token_file):  # noqa: F811
    done = cli(
        "train",
        "--data",
        str(token_file),
        *TINY_FLAGS,
        "--steps",
        "6",
        "--lr",
        "1e30",
        "--out",
        str(tmp_path / "run"),
    )
    line = one_error_line(done.stderr)
    assert done.returncode == 1
    assert "training loss became" in line and "at step" in line and "learning rate" in line
    assert "3.3e+29" not in line and "try 0.0006" in line


@pytest.mark.parametrize("norm", [-1, 0, float("nan")])
def test_a_max_grad_norm_that_would_climb_or_freeze_is_refused(tmp_path, token_file, norm):  # noqa: F811
    out = tmp_path / "run"
    with pytest.raises(TrainingSetupError, match="--max-grad-norm must be"):
        pretrain(**{**TINY, "out": str(out), "data": str(token_file), "max_grad_norm": norm})
    config = tmp_path / "settings.json"
    config.write_text(json.dumps({"max_grad_norm": norm}), encoding="utf-8")
    code = main(["train", "--config", str(config), "--data", str(token_file), "--out", str(out)])
    assert code == 2 and not out.exists()


@pytest.mark.parametrize(
    "settings, phrase",
    [
        (dict(dropout="0.1"), "--dropout must be a number, got '0.1'"),
        (dict(pad_vocab="false"), "--pad-vocab is a switch"),
        (dict(weight_decay=float("nan")), "--weight-decay must be a finite number"),
        (dict(weight_decay=-1), "--weight-decay must be >= 0"),
        (dict(peak_tflops=-1), "--peak-tflops must be > 0"),
        (dict(steps=3.0), "--steps must be a whole number"),
        (dict(seed=True), "--seed must be a whole number"),
        (dict(out=5), "--out must be a path"),
        (dict(global_batch=0), "--global-batch must be at least 1"),
    ],
)
def test_settings_of_the_wrong_type_or_range_are_refused_before_any_work(
    tmp_path,
    token_file,  # noqa: F811
    settings,
    phrase,
):
    out = tmp_path / "run"
    config = tmp_path / "settings.json"
    values = {"data": str(token_file), "out": str(out), **settings}
    config.write_text(json.dumps(values), encoding="utf-8")
    with pytest.raises(TrainingSetupError, match=phrase):
        pretrain(**{**TINY, **values})
    assert main(["train", "--config", str(config), *TINY_FLAGS]) == 2
    assert not out.exists()


@pytest.mark.parametrize(
    "flags, phrase",
    [
        (["--weight-decay", "nan"], "argument --weight-decay: expected a finite number"),
        (["--weight-decay", "-1"], "argument --weight-decay: must be >= 0"),
        (["--peak-tflops", "-1"], "argument --peak-tflops: must be > 0"),
        (["--max-grad-norm", "-1"], "argument --max-grad-norm: must be > 0"),
        (["--dist-timeout", "0"], "argument --dist-timeout: must be > 0"),
    ],
)
def test_bad_flags_are_refused_by_the_parser(tmp_path, capsys, flags, phrase):
    code, out, err = run_main(
        ["train", "--data", "x.bin", "--out", str(tmp_path / "r"), *flags], capsys
    )
    assert code == 2 and out == "" and phrase in one_error_line(err)


# --------------------------------------------------------------------------- the run folder is locked


def test_a_second_run_in_a_locked_folder_is_refused_at_once(tmp_path, token_file):  # noqa: F811
    out = tmp_path / "run"
    flags = ["--data", str(token_file), *TINY_FLAGS, "--steps", "100000", "--checkpoint-every", "1"]
    first = subprocess.Popen(
        [sys.executable, "-m", "gpt2lib", "train", *flags, "--out", str(out)],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        env=environment(),
        cwd=REPO,
    )
    try:
        deadline = time.monotonic() + 180
        while not (out / CHECKPOINT_FILE).exists() and time.monotonic() < deadline:
            assert first.poll() is None, first.stderr.read().decode()
            time.sleep(0.05)
        log_before = (out / "log.jsonl").read_text(encoding="utf-8").count("\n")
        began = time.monotonic()
        second = cli("train", *flags, "--out", str(out), "--resume", timeout=60)
        assert time.monotonic() - began < 40  # at once: torch's import, then the lock
        assert second.returncode == 2 and second.stdout == ""
        assert "another training run is using" in one_error_line(second.stderr)
        assert first.poll() is None  # the first run goes on
        time.sleep(0.5)
        assert (out / "log.jsonl").read_text(encoding="utf-8").count("\n") >= log_before
    finally:
        first.kill()
        first.wait()


# --------------------------------------------------------------------------- no writer replaces what it did not write


def test_a_log_file_that_is_not_the_runs_own_is_never_replaced(tmp_path, token_file, capsys):  # noqa: F811
    notes = tmp_path / "notes.txt"
    notes.write_text("my notes\n" * 3000, encoding="utf-8")
    before = notes.read_bytes()
    code, _, err = run_main(
        [
            "train",
            "--data",
            str(token_file),
            *TINY_FLAGS,
            "--steps",
            "2",
            "--log-file",
            str(notes),
            "--out",
            str(tmp_path / "run"),
        ],
        capsys,
    )
    assert code == 2 and "notes.txt" in one_error_line(err)
    assert notes.read_bytes() == before and not (tmp_path / "run").exists()


def test_the_runs_own_log_is_rewritten_on_resume(finished_run, token_file):  # noqa: F811
    """The log this folder's run wrote is its own: a resume keeps and continues it."""
    log = (finished_run / "log.jsonl").read_text(encoding="utf-8")
    pretrain(
        **{**TINY, "steps": 2, "out": str(finished_run), "data": str(token_file), "resume": True}
    )
    assert (finished_run / "log.jsonl").read_text(encoding="utf-8") == log


@pytest.mark.parametrize("resume", [[], ["--resume"]])
def test_a_settings_file_inside_the_run_folder_is_never_overwritten(
    tmp_path,
    token_file,  # noqa: F811
    capsys,
    resume,
):
    out = tmp_path / "run"
    out.mkdir()
    settings = out / "config.json"
    settings.write_text(json.dumps({"steps": 2, "n_layer": 2}), encoding="utf-8")
    before = settings.read_bytes()
    code, _, err = run_main(
        [
            "train",
            "--config",
            str(settings),
            "--data",
            str(token_file),
            *TINY_FLAGS,
            "--out",
            str(out),
            *resume,
        ],
        capsys,
    )
    assert code == 2 and "config.json" in one_error_line(err)
    assert settings.read_bytes() == before


def test_a_folder_holding_someone_elses_run_json_is_refused(tmp_path, token_file):  # noqa: F811
    out = tmp_path / "run"
    out.mkdir()
    (out / "run.json").write_text("my own notes", encoding="utf-8")
    with pytest.raises(TrainingSetupError, match="run.json' exists and is not a gpt2lib run"):
        pretrain(**{**TINY, "out": str(out), "data": str(token_file)})
    assert (out / "run.json").read_text(encoding="utf-8") == "my own notes"


# --------------------------------------------------------------------------- prepare never writes over its input


def test_prepare_never_writes_over_its_input_or_a_file_it_did_not_make(tmp_path, capsys):
    notes = tmp_path / "notes.txt"
    notes.write_text("Some text to keep.\n" * 100, encoding="utf-8")
    corpus = tmp_path / "corpus"
    corpus.mkdir()
    (corpus / "a.txt").write_text("First file.\n", encoding="utf-8")
    (corpus / "b.txt").write_text("Second file.\n", encoding="utf-8")
    other = tmp_path / "other.bin"
    other.write_bytes(b"not a token file")
    texts = {p: p.read_bytes() for p in (notes, corpus / "a.txt", corpus / "b.txt", other)}
    for argv, phrase in (
        (["prepare", str(notes), str(notes)], "is one of the input files"),
        (["prepare", str(corpus), str(corpus / "b.txt")], "is one of the input files"),
        (["prepare", str(corpus), str(corpus / "c.txt")], "inside the input folder"),
        (["prepare", str(notes), str(other)], "is not a token file"),
        (["prepare", str(notes), str(corpus)], "is a folder"),
    ):
        code, _, err = run_main([*argv, "--processes", "1"], capsys)
        assert code == 2 and phrase in one_error_line(err), (argv, err)
    assert {p: p.read_bytes() for p in texts} == texts
    assert not (corpus / "c.txt").exists()
    # a token file prepare made may be made again
    out = tmp_path / "t.bin"
    tokenfile.prepare(notes, out, processes=1, progress=False)
    tokenfile.prepare(notes, out, val_fraction=0.5, processes=1, progress=False)
    assert tokenfile.read_header(out)["count"] + tokenfile.read_header(tokenfile.val_path(out))[
        "count"
    ] == len(tokenfile._encode(notes.read_text(encoding="utf-8")))


# --------------------------------------------------------------------------- token files checked, int32 ones too


def _token_file_with_header(path: Path, header: bytes, ids: int = 2000) -> Path:
    raw = tokenfile.MAGIC + struct.pack("<I", len(header)) + header
    path.write_bytes(raw.ljust(tokenfile.HEADER_BYTES, b"\0") + b"\0\0" * ids)
    return path


@pytest.mark.parametrize(
    "header, phrase",
    [
        (b"[1, 2]", "header is damaged \\(it holds a JSON list"),
        (
            json.dumps({"vocabulary": "gpt2", "vocab_size": 50257, "count": "2000"}).encode(),
            "count must be a whole number, got '2000'",
        ),
        (
            json.dumps({"vocabulary": "gpt2", "vocab_size": 50257, "count": 2000.5}).encode(),
            "count must be a whole number, got 2000.5",
        ),
        (
            json.dumps(
                {"vocabulary": "gpt2", "vocab_size": 50257, "count": 2000, "dtype": "int32"}
            ).encode(),
            "says its ids are 'int32'",
        ),
        (b"{}" + b" " * 2000, "header is damaged"),
    ],
)
def test_a_token_file_header_of_the_wrong_shape_is_named(tmp_path, header, phrase):
    path = _token_file_with_header(tmp_path / "bad.bin", header)
    with pytest.raises(TokenFileError, match=phrase) as info:
        tokenfile.open_tokens(path, 50257)
    assert "bad.bin" in str(info.value)


# --------------------------------------------------------------------------- resume, torchrun


def test_resuming_on_other_data_is_refused(finished_run, tmp_path, shakespeare_ids):  # noqa: F811
    other = tokenfile.write_token_file(
        tmp_path / "other.bin", shakespeare_ids[40_000:80_000], source_sha256="0" * 64
    )
    with pytest.raises(TrainingSetupError, match="--data is not the run's training data"):
        pretrain(
            **{**TINY, "steps": 2, "out": str(finished_run), "data": str(other), "resume": True}
        )


def test_a_rank_whose_peer_never_starts_gives_up_within_the_timeout(tmp_path, token_file):  # noqa: F811
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    began = time.monotonic()
    done = cli(
        "train",
        "--data",
        str(token_file),
        *TINY_FLAGS,
        "--steps",
        "2",
        "--device",
        "cpu",
        "--dist-timeout",
        "3",
        "--out",
        str(tmp_path / "run"),
        env={
            "WORLD_SIZE": "2",
            "RANK": "0",
            "LOCAL_RANK": "0",
            "MASTER_ADDR": "127.0.0.1",
            "MASTER_PORT": str(port),
        },
        timeout=120,
    )
    assert time.monotonic() - began < 90
    assert done.returncode == 1
    line = one_error_line(done.stderr)
    assert "did not all join" in line and "--dist-timeout 3 s" in line


def test_bad_torchrun_variables_are_named(monkeypatch, tmp_path, token_file):  # noqa: F811
    for name, value, phrase in (
        ("WORLD_SIZE", "two", "WORLD_SIZE='two' is not a whole number"),
        ("RANK", "5", "RANK must be at most 0"),
    ):
        monkeypatch.setenv(name, value)
        with pytest.raises(TrainingSetupError, match=phrase):
            pretrain(**{**TINY, "out": str(tmp_path / "r"), "data": str(token_file)})
        monkeypatch.delenv(name)
