"""Token files, the training run in one process and under torchrun, checkpoints
that resume exactly, and the errors bad input gets before any step (gpt2lib.scaling,
gpt2lib.tokenfile, `python -m gpt2lib prepare|train`)."""

import json
import os
import random
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
import torch

from gpt2lib import tokenfile
from gpt2lib.course.checks import scaling as scaling_checks
from gpt2lib.course.checks._core import CheckFailed
from gpt2lib.scaling import (
    CHECKPOINT_FILE,
    Ranks,
    TrainingSetupError,
    load_checkpoint,
    pretrain,
    rank_slice,
    save_checkpoint,
    step_starts,
)
from gpt2lib.tokenfile import TokenFileError, open_tokens, write_token_file

REPO = Path(__file__).resolve().parents[2]
SHAKESPEARE = REPO / "data" / "tinyshakespeare.txt"
TINY = dict(
    n_layer=2, n_head=2, n_embd=32, block_size=16, batch_size=4, steps=6, lr=3e-3, progress=False
)
TINY_FLAGS = [
    "--n-layer",
    "2",
    "--n-head",
    "2",
    "--n-embd",
    "32",
    "--block-size",
    "16",
    "--batch-size",
    "4",
    "--lr",
    "3e-3",
    "--no-progress",
]


@pytest.fixture(scope="module")
def shakespeare_ids():
    from gpt2lib.tokenizer import get_encoding

    return np.asarray(get_encoding().encode_ordinary(SHAKESPEARE.read_text(encoding="utf-8")))


@pytest.fixture(scope="module")
def token_file(tmp_path_factory, shakespeare_ids):
    """The first 40,000 ids of Tiny Shakespeare as a token file (fast to train on)."""
    path = tmp_path_factory.mktemp("tokens") / "train.bin"
    return write_token_file(path, shakespeare_ids[:40_000])


def read_log(path):
    return [json.loads(line) for line in Path(path).read_text(encoding="utf-8").splitlines()]


def final_weights(folder):
    from safetensors.torch import load_file

    return load_file(str(Path(folder) / "model.safetensors"))


def assert_same_weights(a, b, atol):
    assert a.keys() == b.keys()
    worst = max(float((a[k] - b[k]).abs().max()) for k in a)
    assert worst <= atol, worst


def environment():
    return {**os.environ, "PYTHONPATH": str(REPO), "OMP_NUM_THREADS": "1"}


# --------------------------------------------------------------------------- token files


def test_prepare_on_tiny_shakespeare_gives_tiktokens_ids_split_as_chapter_7(
    tmp_path, shakespeare_ids
):
    out = tmp_path / "s.bin"
    # small pieces and two worker processes: the cuts must not change a single id
    summary = tokenfile.prepare(
        SHAKESPEARE, out, val_fraction=0.1, processes=2, chunk_chars=50_000, progress=False
    )
    n = len(shakespeare_ids)
    split = int((1 - 0.1) * n)
    assert summary["tokens"] == n and summary["train_tokens"] == split
    train, val = open_tokens(out, 50257), open_tokens(tmp_path / "s.val.bin", 50257)
    np.testing.assert_array_equal(train, shakespeare_ids[:split])
    np.testing.assert_array_equal(val, shakespeare_ids[split:])
    header = tokenfile.read_header(out)
    assert header["vocabulary"] == "gpt2" and header["count"] == split
    import hashlib

    assert header["source_sha256"] == hashlib.sha256(SHAKESPEARE.read_bytes()).hexdigest()


def test_the_cut_points_never_change_the_ids():
    from gpt2lib.tokenizer import get_encoding

    enc = get_encoding()
    text = "a  \nb\n\n c\n'tis\nx \n  y\n1\n2\nend"  # whitespace runs on both sides of newlines
    cuts = tokenfile.split_points(text, len(text))
    pieces = [enc.encode_ordinary(text[a:b]) for a, b in zip(cuts, cuts[1:])]
    assert sum(pieces, []) == enc.encode_ordinary(text)
    assert len(cuts) > 3  # it did cut


def test_prepare_of_a_folder_joins_the_files_with_endoftext(tmp_path):
    from gpt2lib.tokenizer import get_encoding

    enc = get_encoding()
    (tmp_path / "in").mkdir()
    (tmp_path / "in" / "a.txt").write_text("Hello world", encoding="utf-8")
    (tmp_path / "in" / "b.txt").write_text("Good night", encoding="utf-8")
    tokenfile.prepare(tmp_path / "in", tmp_path / "t.bin", processes=1, progress=False)
    want = enc.encode_ordinary("Hello world") + [50256] + enc.encode_ordinary("Good night")
    assert open_tokens(tmp_path / "t.bin").tolist() == want


def test_memmap_windows_equal_the_in_memory_loaders_windows(token_file):
    from gpt2lib.training import get_batch

    ids = open_tokens(token_file, 50257)
    in_memory = torch.from_numpy(np.asarray(ids, dtype=np.int64))
    for batch_size, block_size in ((4, 16), (3, 100)):
        want_x, want_y = get_batch(
            in_memory, batch_size, block_size, torch.Generator().manual_seed(7)
        )
        starts = torch.randint(
            len(ids) - block_size, (batch_size,), generator=torch.Generator().manual_seed(7)
        )
        x, y = tokenfile.windows(ids, starts, block_size)
        assert torch.equal(x, want_x) and torch.equal(y, want_y)


def test_a_steps_windows_depend_only_on_seed_step_and_global_batch():
    starts = step_starts(3, 5, 8, 10_000, 16)
    assert torch.equal(starts, step_starts(3, 5, 8, 10_000, 16))
    assert not torch.equal(starts, step_starts(3, 6, 8, 10_000, 16))
    assert not torch.equal(starts, step_starts(4, 5, 8, 10_000, 16))
    for world, accum, batch in ((1, 1, 8), (1, 2, 4), (2, 1, 4), (2, 2, 2), (4, 2, 1)):
        split = [rank_slice(starts, Ranks(r, world, r), batch, accum) for r in range(world)]
        joined = torch.cat([micro for rank in split for micro in rank])
        assert torch.equal(joined, starts), (world, accum, batch)


# --------------------------------------------------------------------------- bad input


def test_token_files_of_another_vocabulary_or_out_of_range_ids_are_refused(tmp_path):
    other = write_token_file(
        tmp_path / "other.bin", [1, 2, 3], vocabulary="cl100k_base", vocab_size=100277
    )
    with pytest.raises(TokenFileError, match="'cl100k_base' vocabulary"):
        open_tokens(other, 50257)
    big = write_token_file(tmp_path / "big.bin", [1, 60000, 3], vocab_size=65536)
    with pytest.raises(TokenFileError, match="holds the id 60000"):
        open_tokens(big, 50257)
    raw = tmp_path / "raw.bin"
    raw.write_bytes(np.arange(100, dtype=np.uint16).tobytes())
    with pytest.raises(TokenFileError, match="not a gpt2lib token file"):
        open_tokens(raw)
    cut = tmp_path / "cut.bin"
    cut.write_bytes(write_token_file(tmp_path / "whole.bin", list(range(50))).read_bytes()[:-10])
    with pytest.raises(TokenFileError, match="cut short"):
        open_tokens(cut)


def test_bad_input_is_refused_before_any_step(tmp_path, token_file, monkeypatch):
    other = write_token_file(tmp_path / "other.bin", list(range(100)), vocabulary="r50k")
    out = tmp_path / "run"
    cases = [
        (dict(data=str(other)), "'r50k' vocabulary"),
        (dict(data=str(token_file), global_batch=6, batch_size=4), "does not divide it"),
        (dict(data=str(token_file), resume=True), "holds no checkpoint.safetensors"),
        (dict(data=str(token_file), n_embd=33), "divisible by --n-head"),
        (dict(data=str(token_file), dtype="float16"), "float32 or bfloat16"),
        (dict(data=str(token_file), bogus=1), "unknown training setting"),
    ]
    for overrides, message in cases:
        with pytest.raises(ValueError, match=message):  # TrainingSetupError, TokenFileError
            pretrain(**{**TINY, "out": str(out), **overrides})
        assert not out.exists(), overrides  # nothing was written: no step ran
    # a world size that does not divide the global batch, as torchrun would set it
    monkeypatch.setenv("WORLD_SIZE", "3")
    with pytest.raises(TrainingSetupError, match="3 process\\(es\\) x --batch-size 4 = 12"):
        pretrain(**{**TINY, "out": str(out), "data": str(token_file), "global_batch": 16})
    assert not out.exists()


def test_a_checkpoint_of_another_size_or_run_is_an_error_not_adopted(tmp_path, token_file):
    out = tmp_path / "run"
    pretrain(**{**TINY, "steps": 2, "out": str(out), "data": str(token_file)})
    log_before = (out / "log.jsonl").read_text(encoding="utf-8")
    with pytest.raises(TrainingSetupError, match="another model size.*n_embd=32.*n_embd=64"):
        pretrain(
            **{
                **TINY,
                "steps": 2,
                "n_embd": 64,
                "out": str(out),
                "data": str(token_file),
                "resume": True,
            }
        )
    with pytest.raises(TrainingSetupError, match="seed: 0 in the checkpoint, 1 now"):
        pretrain(
            **{
                **TINY,
                "steps": 2,
                "seed": 1,
                "out": str(out),
                "data": str(token_file),
                "resume": True,
            }
        )
    with pytest.raises(TrainingSetupError, match="already holds a run .*; pass --resume"):
        pretrain(**{**TINY, "steps": 2, "out": str(out), "data": str(token_file)})
    assert (out / "log.jsonl").read_text(encoding="utf-8") == log_before


def test_the_cli_gives_one_line_and_exit_code_2_for_bad_input(tmp_path, capsys):
    from gpt2lib.cli import main

    code = main(
        [
            "train",
            "--data",
            str(tmp_path / "missing.bin"),
            "--out",
            str(tmp_path / "r"),
            *TINY_FLAGS,
        ]
    )
    err = capsys.readouterr().err
    assert code == 2 and err.startswith("error: no token file at") and "prepare" in err


# --------------------------------------------------------------------------- runs


@pytest.mark.slow
def test_a_run_logs_every_step_and_saves_a_model_both_libraries_load(tmp_path, token_file):
    out = tmp_path / "run"
    config = tmp_path / "run.toml"
    config.write_text(
        "n-layer = 2\nn-head = 2\nn-embd = 32\nblock-size = 16\nbatch-size = 2\n"
        "steps = 3\nlr = 3e-3\n",
        encoding="utf-8",
    )
    from gpt2lib.cli import main

    # the config file gives settings, a flag overrides one of them
    assert (
        main(
            [
                "train",
                "--config",
                str(config),
                "--data",
                str(token_file),
                "--val-data",
                str(token_file),
                "--out",
                str(out),
                "--batch-size",
                "4",
                "--pad-vocab",
                "--no-progress",
            ]
        )
        == 0
    )
    log = read_log(out / "log.jsonl")
    assert [line["step"] for line in log] == [0, 1, 2]
    for line in log:
        assert {"step", "loss", "lr", "tokens_per_s", "mfu"} <= line.keys()
        assert all(
            isinstance(line[k], float) and line[k] > 0
            for k in ("loss", "lr", "tokens_per_s", "mfu")
        )
    assert "val_loss" in log[-1]
    run = json.loads((out / "run.json").read_text(encoding="utf-8"))
    assert run["vocab_size"] == 50304 and run["global_batch"] == 4
    from transformers import GPT2LMHeadModel

    from gpt2lib.model import from_pretrained

    ours = from_pretrained(str(out), device="cpu")
    theirs = GPT2LMHeadModel.from_pretrained(str(out)).eval()
    assert ours.config.vocab_size == 50257 and ours.config.n_embd == 32
    x = torch.tensor([[464, 3290, 318, 257]])
    with torch.no_grad():
        torch.testing.assert_close(ours(x), theirs(x).logits, atol=1e-4, rtol=1e-4)
    state = load_checkpoint(out / CHECKPOINT_FILE)
    assert state["step"] == 3 and state["data_position"]["next_step"] == 3


def a_training_state(step):
    """A whole training state of a tiny model, as the run's checkpoint() writes one."""
    from gpt2lib.scaling import (
        CHECKPOINT_FORMAT,
        CHECKPOINT_VERSION,
        MODEL_FIELDS,
        RUN_FIELDS,
        _rng_state,
    )

    layer = torch.nn.Linear(4, 4)
    optimizer = torch.optim.AdamW(layer.parameters())
    layer(torch.ones(1, 4)).sum().backward()
    optimizer.step()
    return {
        "format": CHECKPOINT_FORMAT,
        "version": CHECKPOINT_VERSION,
        "step": step,
        "model": layer.state_dict(),
        "optimizer": optimizer.state_dict(),
        "model_size": dict.fromkeys(MODEL_FIELDS, 1),
        "run": dict.fromkeys(RUN_FIELDS, 0),
        "global_batch": 1,
        "world_size": 1,
        "rng": [_rng_state(torch.device("cpu"))],
        "data_position": {"seed": 0, "next_step": step, "global_batch": 1},
        "data": {"train": None, "val": None},
    }


def test_a_crash_during_the_checkpoint_write_leaves_the_old_one_loadable(tmp_path, monkeypatch):
    import safetensors.torch

    path = tmp_path / CHECKPOINT_FILE
    save_checkpoint(path, a_training_state(1))
    real_save = safetensors.torch.save_file

    def crash_halfway(tensors, filename, metadata=None):
        real_save(tensors, filename, metadata=metadata)
        with open(filename, "r+b") as f:
            f.truncate(os.path.getsize(filename) // 2)  # half is on disk when the machine dies
        raise KeyboardInterrupt

    monkeypatch.setattr(safetensors.torch, "save_file", crash_halfway)
    with pytest.raises(KeyboardInterrupt):
        save_checkpoint(path, a_training_state(2))
    monkeypatch.setattr(safetensors.torch, "save_file", real_save)
    assert [p.name for p in tmp_path.iterdir()] == [CHECKPOINT_FILE]  # the half is cleaned away
    assert load_checkpoint(path)["step"] == 1
    save_checkpoint(path, a_training_state(3))  # recovers
    assert load_checkpoint(path)["step"] == 3


@pytest.mark.slow
def test_two_processes_with_gloo_equal_one_process_with_accumulation(tmp_path, token_file):
    common = ["--data", str(token_file), *TINY_FLAGS, "--steps", "4", "--seed", "5"]
    one = subprocess.run(
        [
            sys.executable,
            "-m",
            "gpt2lib",
            "train",
            *common,
            "--grad-accum",
            "2",
            "--out",
            str(tmp_path / "one"),
        ],
        capture_output=True,
        text=True,
        env=environment(),
        cwd=REPO,
        timeout=200,
    )
    assert one.returncode == 0, one.stderr
    two = subprocess.run(
        [
            sys.executable,
            "-m",
            "torch.distributed.run",
            "--nproc_per_node=2",
            "--standalone",
            "-m",
            "gpt2lib",
            "train",
            *common,
            "--grad-accum",
            "1",
            "--out",
            str(tmp_path / "two"),
        ],
        capture_output=True,
        text=True,
        env=environment(),
        cwd=REPO,
        timeout=200,
    )
    assert two.returncode == 0, two.stderr
    log_one, log_two = (
        read_log(tmp_path / "one" / "log.jsonl"),
        read_log(tmp_path / "two" / "log.jsonl"),
    )
    assert [line["step"] for line in log_two] == [0, 1, 2, 3]
    for a, b in zip(log_one, log_two):
        assert abs(a["loss"] - b["loss"]) <= 1e-5, (a, b)
    assert_same_weights(final_weights(tmp_path / "one"), final_weights(tmp_path / "two"), 1e-5)
    assert (
        json.loads((tmp_path / "two" / "run.json").read_text(encoding="utf-8"))["world_size"] == 2
    )


@pytest.mark.slow
def test_a_run_killed_at_a_random_point_and_resumed_equals_an_uninterrupted_run(
    tmp_path, token_file
):
    steps = 8
    flags = [
        "--data",
        str(token_file),
        *TINY_FLAGS,
        "--steps",
        str(steps),
        "--dropout",
        "0.1",
        "--checkpoint-every",
        "2",
    ]
    whole = tmp_path / "whole"
    done = subprocess.run(
        [sys.executable, "-m", "gpt2lib", "train", *flags, "--out", str(whole)],
        capture_output=True,
        text=True,
        env=environment(),
        cwd=REPO,
        timeout=200,
    )
    assert done.returncode == 0, done.stderr
    seed = random.randrange(10**6)
    rng = random.Random(seed)
    kill_after, delay = rng.randrange(1, steps - 1), rng.uniform(0, 0.3)
    where = f"(killed after {kill_after} log lines + {delay:.2f} s; random seed {seed})"
    cut = tmp_path / "cut"
    proc = subprocess.Popen(
        [sys.executable, "-m", "gpt2lib", "train", *flags, "--out", str(cut)],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        env=environment(),
        cwd=REPO,
    )
    log = cut / "log.jsonl"
    deadline = time.monotonic() + 240
    while time.monotonic() < deadline and proc.poll() is None:
        if log.exists() and log.read_text(encoding="utf-8").count("\n") >= kill_after:
            time.sleep(delay)
            break
        time.sleep(0.02)
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    if not (cut / CHECKPOINT_FILE).exists():  # killed before the first checkpoint: start again
        resume = []
    else:
        resume = ["--resume"]
    again = subprocess.run(
        [sys.executable, "-m", "gpt2lib", "train", *flags, "--out", str(cut), *resume],
        capture_output=True,
        text=True,
        env=environment(),
        cwd=REPO,
        timeout=200,
    )
    assert again.returncode == 0, f"{where}\n{again.stderr}"
    a, b = read_log(whole / "log.jsonl"), read_log(log)
    assert [x["step"] for x in b] == list(range(steps)), where
    for x, y in zip(a, b):
        assert abs(x["loss"] - y["loss"]) <= 1e-6, (where, x, y)
    assert_same_weights(final_weights(whole), final_weights(cut), 1e-6)


# --------------------------------------------------------------------------- chapter 11's format check


def test_the_format_check_passes_a_right_answer_written_another_way(capsys):
    def with_numpy_style(values, dtype):
        back = values.to(dtype).to(torch.float32)
        held = torch.isfinite(back) & (back.abs() > 0)
        return (back[held] / values[held] - 1).abs().max().item(), held.sum().item() / len(values)

    scaling_checks.check_format_error(with_numpy_style)
    assert "✅" in capsys.readouterr().out


@pytest.mark.parametrize("mistake", scaling_checks.FORMAT_MISTAKES, ids=lambda m: m.name)
def test_the_format_check_names_each_planted_mistake(mistake):
    with pytest.raises(CheckFailed) as info:
        scaling_checks.check_format_error(mistake.fn)
    assert mistake.message in str(info.value)


# --------------------------------------------------------------------------- chapter 11's log check


def test_the_run_speed_check_passes_a_right_answer_written_another_way(capsys):
    def from_the_mfu_column(folder):
        """Another right answer: each step's seconds from its MFU, the run's rate from them."""
        run = json.loads((folder / "run.json").read_text(encoding="utf-8"))
        lines = (folder / "log.jsonl").read_text(encoding="utf-8").splitlines()[1:]
        flops = run["flops_per_token"] * run["tokens_per_step"]
        peak = run["peak_flops_per_device"] * run["world_size"]
        seconds = sum(flops / (json.loads(line)["mfu"] * peak) for line in lines)
        rate = len(lines) * run["tokens_per_step"] / seconds
        return [rate, rate * run["flops_per_token"] / peak]

    scaling_checks.check_run_speed(from_the_mfu_column)
    assert "✅" in capsys.readouterr().out


@pytest.mark.parametrize("mistake", scaling_checks.SPEED_MISTAKES, ids=lambda m: m.name)
def test_the_run_speed_check_names_each_planted_mistake(mistake):
    with pytest.raises(CheckFailed) as info:
        scaling_checks.check_run_speed(mistake.fn)
    assert mistake.message in str(info.value)


@pytest.mark.parametrize(
    "answer, message",
    [
        (
            lambda folder: (lambda t, m: (t, 100 * m))(*scaling_checks._run_speed(folder)),
            "a percentage",
        ),
        (lambda folder: scaling_checks._run_speed(folder)[0], "return two numbers"),
        (lambda folder: (1.0, 0.5), "tokens/s and MFU"),
    ],
    ids=["percent", "one number", "far off"],
)
def test_the_run_speed_check_names_other_wrong_answers(answer, message):
    with pytest.raises(CheckFailed, match=message):
        scaling_checks.check_run_speed(answer)


def test_the_run_speed_check_reads_a_stub_as_not_done_yet():
    from gpt2lib.course.checks._core import NotDoneYet

    def run_speed(folder):
        raise NotImplementedError("Exercise 11.7: replace this line with your code")

    with pytest.raises(NotDoneYet):
        scaling_checks.check_run_speed(run_speed)


def test_run_speed_reads_a_real_runs_files_as_the_log_wrote_them(tmp_path, token_file):
    """The check's synthetic runs have the keys and meaning of a real run's files."""
    from gpt2lib.cli import main

    out = tmp_path / "run"
    assert (
        main(
            [
                "train",
                "--data",
                str(token_file),
                "--n-layer",
                "1",
                "--n-head",
                "2",
                "--n-embd",
                "16",
                "--block-size",
                "16",
                "--batch-size",
                "2",
                "--steps",
                "3",
                "--no-progress",
                "--out",
                str(out),
            ]
        )
        == 0
    )
    lines = [json.loads(x) for x in (out / "log.jsonl").read_text(encoding="utf-8").splitlines()]
    rate, mfu = scaling_checks._run_speed(out)
    assert (
        min(x["tokens_per_s"] for x in lines[1:])
        <= rate
        <= max(x["tokens_per_s"] for x in lines[1:])
    )
    assert min(x["mfu"] for x in lines[1:]) <= mfu * (1 + 1e-9) and mfu <= max(
        x["mfu"] for x in lines[1:]
    ) * (1 + 1e-9)


def _recipe_price(**mistakes):
    """Exercise 11.6's four numbers, right unless a mistake is planted."""
    from gpt2lib.chapters.config import GPT2Config

    _, per_token = scaling_checks.reference_flops_per_token(GPT2Config(), 1024)
    steps = 10e9 / (512 if mistakes.get("windows") else 524_288)
    total = per_token * (steps if mistakes.get("per_step") else 10e9)
    gpus, mfu = (1 if mistakes.get("one_gpu") else 8), (1.0 if mistakes.get("no_mfu") else 0.4)
    hours, dollars = scaling_checks.reference_run_cost(total, gpus, 989e12, mfu, 2.5)
    if mistakes.get("one_gpu_paid"):
        dollars /= 8
    return steps, total, hours, dollars


def test_the_recipe_price_check_passes_the_right_numbers(capsys):
    scaling_checks.check_recipe_price(*_recipe_price())
    assert "Exercise 11.6" in capsys.readouterr().out


@pytest.mark.parametrize(
    "mistake, phrase",
    [
        ("windows", "divide the tokens by the tokens of a step"),
        ("per_step", "every token of every step"),
        ("one_gpu", "shared by all the GPUs"),
        ("no_mfu", "MFU share of their peak"),
        ("one_gpu_paid", "every GPU of the node is paid"),
    ],
)
def test_the_recipe_price_check_names_each_planted_mistake(mistake, phrase):
    with pytest.raises(CheckFailed, match=phrase):
        scaling_checks.check_recipe_price(*_recipe_price(**{mistake: True}))


def test_the_recipe_price_check_refuses_what_is_not_a_number():
    steps, total, hours, _ = _recipe_price()
    with pytest.raises(CheckFailed, match="dollars should be a number"):
        scaling_checks.check_recipe_price(steps, total, hours, "$15")
