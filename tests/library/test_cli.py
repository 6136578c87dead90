"""`python -m gpt2lib generate|download`, end to end in a subprocess with a local checkpoint."""

import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from gpt2lib.cli import main

REPO = Path(__file__).resolve().parents[2]


def run(*args, env=None, timeout=180):
    env = {**os.environ, **(env or {})}
    return subprocess.run(
        [sys.executable, "-m", "gpt2lib", *args],
        capture_output=True,
        text=True,
        env=env,
        cwd=REPO,
        timeout=timeout,
    )


def test_help_lists_the_commands():
    out = run("--help")
    assert out.returncode == 0
    assert "generate" in out.stdout and "download" in out.stdout
    gen = run("generate", "--help")
    for option in (
        "--model",
        "--prompt",
        "--max-new-tokens",
        "--temperature",
        "--top-k",
        "--top-p",
        "--seed",
        "--device",
    ):
        assert option in gen.stdout


def test_generate_streams_the_prompt_and_its_greedy_continuation(checkpoint_dir):
    tokenizer = pytest.importorskip("gpt2lib.tokenizer").get_encoding()
    from gpt2lib.generation import generate
    from gpt2lib.model import from_pretrained

    text = "Hello, world"
    out = run(
        "generate",
        "--model",
        str(checkpoint_dir),
        "--prompt",
        text,
        "--max-new-tokens",
        "8",
        "--temperature",
        "0",
        "--device",
        "cpu",
    )
    assert out.returncode == 0, out.stderr
    model = from_pretrained(checkpoint_dir, device="cpu")
    ids = torch.tensor([tokenizer.encode(text)])
    expected = (
        text
        + tokenizer.decode(generate(model, ids, 8, temperature=0)[0, ids.shape[1] :].tolist())
        + "\n"
    )
    assert out.stdout == expected


def test_seeded_sampling_matches_stream_text(checkpoint_dir):
    tokenizer = pytest.importorskip("gpt2lib.tokenizer").get_encoding()
    from gpt2lib.generation import stream_text
    from gpt2lib.model import from_pretrained

    out = run(
        "generate",
        "--model",
        str(checkpoint_dir),
        "--prompt",
        "Once upon a time",
        "--max-new-tokens",
        "10",
        "--top-k",
        "40",
        "--top-p",
        "0.9",
        "--seed",
        "7",
        "--temperature",
        "0.8",
    )
    assert out.returncode == 0, out.stderr
    model = from_pretrained(checkpoint_dir, device="cpu")
    pieces = stream_text(
        model, tokenizer, "Once upon a time", 10, temperature=0.8, top_k=40, top_p=0.9, seed=7
    )
    assert out.stdout == "Once upon a time" + "".join(pieces) + "\n"


def test_model_defaults_to_gpt2lib_checkpoint(checkpoint_dir, monkeypatch, capsys):
    pytest.importorskip("gpt2lib.tokenizer")
    monkeypatch.setenv("GPT2LIB_CHECKPOINT", str(checkpoint_dir))
    assert main(["generate", "--prompt", "Hi", "--max-new-tokens", "3", "--temperature", "0"]) == 0
    assert capsys.readouterr().out.startswith("Hi")


def run_main(argv):
    """main() in this process: (exit code, stdout, stderr); argparse's exit counts too."""
    try:
        return main(argv)
    except SystemExit as exc:
        return exc.code


@pytest.mark.parametrize(
    "args,message",
    [
        (["--temperature", "-1"], "argument --temperature: must be >= 0"),
        (["--temperature", "nan"], "argument --temperature: expected a finite number"),
        (["--top-p", "1.5"], r"argument --top-p: must be in (0, 1]"),
        (["--top-k", "0"], "argument --top-k: must be at least 1, got 0"),
        (["--max-new-tokens", "ten"], "argument --max-new-tokens: expected a whole number"),
        (["--max-new-tokens", "5000"], "more than the model's context of"),  # n_positions varies
        (["--device", "tpu"], "unknown device 'tpu'"),
        (["--dtype", "int8"], "argument --dtype: invalid choice"),
        (["--model", "gpt3"], "unknown model 'gpt3'"),
        (["--model", "/no/such/folder"], "no such checkpoint folder"),
    ],
)
def test_bad_arguments_exit_2_with_one_line(checkpoint_dir, capsys, args, message):
    code = run_main(["generate", "--model", str(checkpoint_dir), "--prompt", "Hi", *args])
    out = capsys.readouterr()
    assert code == 2, (out.out, out.err)
    assert len(out.err.strip().splitlines()) == 1, out.err
    assert message in out.err
    assert out.out == ""  # nothing printed before the error


def test_missing_prompt_is_a_usage_error(capsys):
    assert run_main(["generate"]) == 2
    assert "the following arguments are required: --prompt" in capsys.readouterr().err


def test_bad_argument_from_a_real_shell_has_no_traceback(checkpoint_dir):
    device = "cuda" if not torch.cuda.is_available() else "tpu"
    out = run("generate", "--model", str(checkpoint_dir), "--prompt", "Hi", "--device", device)
    assert out.returncode == 2
    assert "Traceback" not in out.stderr
    assert len(out.stderr.strip().splitlines()) == 1 and "device" in out.stderr
    assert out.stdout == ""


def test_download_offline_fails_clearly(tmp_path):
    out = run("download", "gpt2", env={"HF_HUB_OFFLINE": "1", "HF_HOME": str(tmp_path)})
    assert out.returncode == 1
    assert "Traceback" not in out.stderr
    assert "HF_HUB_OFFLINE=1" in out.stderr and "not in the local Hugging Face cache" in out.stderr


def test_download_unknown_name_lists_the_valid_ones(capsys):
    assert run_main(["download", "gpt2", "gpt-5"]) == 2  # refused before anything is fetched
    assert (
        "unknown model 'gpt-5'; choose from gpt2, gpt2-medium, gpt2-large, gpt2-xl"
        in capsys.readouterr().err
    )


def _offline_env(tmp_path, **extra):
    """No cached weights, and a hub address that refuses connections at once (port 9), so the
    test behaves the same with or without a network."""
    env = {
        k: v
        for k, v in os.environ.items()
        if k not in ("GPT2LIB_CHECKPOINT", "HF_HUB_OFFLINE", "HF_HUB_CACHE")
    }
    env.update(HF_HOME=str(tmp_path / "hf"), HF_ENDPOINT="http://127.0.0.1:9", **extra)
    return env


def _run_env(env, *args):
    return subprocess.run(
        [sys.executable, "-m", "gpt2lib", *args],
        capture_output=True,
        text=True,
        env=env,
        cwd=REPO,
        timeout=300,
    )


def test_generate_without_network_prints_one_true_line(tmp_path):
    out = _run_env(_offline_env(tmp_path), "generate", "--model", "gpt2", "--prompt", "Hi")
    assert out.returncode == 1 and out.stdout == ""
    lines = out.stderr.strip().splitlines()
    assert len(lines) == 1, out.stderr  # no retry chatter, no traceback: only the message
    assert "Retrying" not in out.stderr
    assert lines[0].startswith(
        "error: the weights of 'gpt2' are not in the local Hugging Face cache"
    )
    assert "run `python -m gpt2lib download gpt2` once" in lines[0]
    assert "pass --model FOLDER" in lines[0]
    # --model was given, so GPT2LIB_CHECKPOINT would change nothing: it is not suggested
    assert "GPT2LIB_CHECKPOINT" not in lines[0]


def test_generate_with_the_default_model_suggests_the_variable(tmp_path):
    out = _run_env(_offline_env(tmp_path), "generate", "--prompt", "Hi")
    assert out.returncode == 1
    assert "or set GPT2LIB_CHECKPOINT to such a folder" in out.stderr
    assert len(out.stderr.strip().splitlines()) == 1


def test_download_without_network_does_not_say_run_download(tmp_path):
    out = _run_env(_offline_env(tmp_path), "download", "openai-community/gpt2")
    assert out.returncode == 1
    lines = out.stderr.strip().splitlines()
    assert len(lines) == 1 and "Retrying" not in out.stderr
    assert "python -m gpt2lib download" not in lines[0]
    assert "Connect to the internet and run this command again" in lines[0]


# --------------------------------------------------------------------------- bad input: one clear line


def _one_error_line(out):
    lines = out.stderr.strip().splitlines()
    assert "Traceback" not in out.stderr and len(lines) == 1, out.stderr
    return lines[0]


def test_a_config_nested_100000_levels_deep_is_one_line(tmp_path, checkpoint_dir):
    """A config nested too deeply gives one error line, not a RecursionError traceback."""
    folder = tmp_path / "deep"
    folder.mkdir()
    (folder / "model.safetensors").write_bytes((checkpoint_dir / "model.safetensors").read_bytes())
    (folder / "config.json").write_text("[" * 100_000 + "]" * 100_000, encoding="utf-8")
    out = run("generate", "--model", str(folder), "--prompt", "Hi", "--max-new-tokens", "2")
    assert out.returncode == 1 and out.stdout == ""
    line = _one_error_line(out)
    assert "config.json' is not a readable JSON config (nested too deeply" in line


@pytest.mark.skipif(not Path("/dev/full").exists(), reason="needs /dev/full")
def test_output_to_a_full_disk_is_one_line_and_a_failure(checkpoint_dir):
    """Output to a full disk (`> /dev/full`) is one error line and a failing exit status."""
    with open("/dev/full", "w", encoding="utf-8") as full:
        out = subprocess.run(
            [
                sys.executable,
                "-m",
                "gpt2lib",
                "generate",
                "--model",
                str(checkpoint_dir),
                "--prompt",
                "Hi",
                "--max-new-tokens",
                "3",
                "--temperature",
                "0",
            ],
            stdout=full,
            stderr=subprocess.PIPE,
            text=True,
            cwd=REPO,
            timeout=180,
        )
    assert out.returncode == 1
    assert _one_error_line(out) == (
        "error: the output could not be written (No space left on device)"
    )


def test_a_closed_stdout_is_one_line_and_a_failure(checkpoint_dir):
    """With stdout closed the command says so in one line and fails, with no traceback."""
    command = (
        f"exec {sys.executable} -m gpt2lib generate --model '{checkpoint_dir}' "
        "--prompt Hi --max-new-tokens 3 >&-"
    )
    out = subprocess.run(
        ["sh", "-c", command], capture_output=True, text=True, cwd=REPO, timeout=180
    )
    assert out.returncode == 1
    assert _one_error_line(out) == (
        "error: the output could not be written (standard output is closed)"
    )


def test_a_model_whose_vocabulary_is_smaller_than_the_tokenizers_says_so(tmp_path):
    from checkpoints import write_hub_checkpoint

    folder = write_hub_checkpoint(
        tmp_path, n_layer=1, n_head=2, n_embd=16, n_positions=32, vocab_size=64
    )
    out = run("generate", "--model", str(folder), "--prompt", "Hello world", "--device", "cpu")
    assert out.returncode == 1 and out.stdout == ""
    line = _one_error_line(out)
    assert (
        "the model's vocabulary has 64 tokens, fewer than the 50,257 of GPT-2's tokenizer" in line
    )


def test_a_relative_gpt2lib_checkpoint_works_from_the_notebooks_folder():
    """GPT2LIB_CHECKPOINT=data/standin, relative to the course folder, also works from
    notebooks/ (the kernels' working folder)."""
    if not (REPO / "data" / "standin" / "model.safetensors").is_file():
        pytest.skip("data/standin is not in this checkout")
    env = {**os.environ, "GPT2LIB_CHECKPOINT": "data/standin"}
    out = subprocess.run(
        [
            sys.executable,
            "-m",
            "gpt2lib",
            "generate",
            "--prompt",
            "ROMEO:",
            "--max-new-tokens",
            "3",
            "--temperature",
            "0",
            "--device",
            "cpu",
        ],
        capture_output=True,
        text=True,
        env=env,
        cwd=REPO / "notebooks",
        timeout=180,
    )
    assert out.returncode == 0, out.stderr
    assert out.stdout.startswith("ROMEO:")


def test_offline_the_error_offers_the_stand_in(tmp_path):
    out = _run_env(_offline_env(tmp_path), "generate", "--model", "gpt2", "--prompt", "Hi")
    assert out.returncode == 1
    assert f"--model {REPO / 'data' / 'standin'}" in _one_error_line(out)
