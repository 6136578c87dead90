"""`python -m gpt2lib generate|download`, end to end in a subprocess with a local checkpoint."""

import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from gpt2lib.cli import main

REPO = Path(__file__).resolve().parent.parent


def run(*args, env=None, timeout=180):
    env = {**os.environ, **(env or {})}
    return subprocess.run([sys.executable, "-m", "gpt2lib", *args], capture_output=True,
                          text=True, env=env, cwd=REPO, timeout=timeout)


def test_help_lists_the_commands():
    out = run("--help")
    assert out.returncode == 0
    assert "generate" in out.stdout and "download" in out.stdout
    gen = run("generate", "--help")
    for option in ("--model", "--prompt", "--max-new-tokens", "--temperature", "--top-k",
                   "--top-p", "--seed", "--device"):
        assert option in gen.stdout


def test_generate_streams_the_prompt_and_its_greedy_continuation(checkpoint_dir):
    tokenizer = pytest.importorskip("gpt2lib.tokenizer").get_encoding()
    from gpt2lib.generation import generate
    from gpt2lib.loading import from_pretrained

    text = "Hello, world"
    out = run("generate", "--model", str(checkpoint_dir), "--prompt", text,
              "--max-new-tokens", "8", "--temperature", "0", "--device", "cpu")
    assert out.returncode == 0, out.stderr
    model = from_pretrained(checkpoint_dir, device="cpu")
    ids = torch.tensor([tokenizer.encode(text)])
    expected = text + tokenizer.decode(generate(model, ids, 8, temperature=0)[0, ids.shape[1]:]
                                       .tolist()) + "\n"
    assert out.stdout == expected


def test_seeded_sampling_matches_stream_text(checkpoint_dir):
    tokenizer = pytest.importorskip("gpt2lib.tokenizer").get_encoding()
    from gpt2lib.generation import stream_text
    from gpt2lib.loading import from_pretrained

    out = run("generate", "--model", str(checkpoint_dir), "--prompt", "Once upon a time",
              "--max-new-tokens", "10", "--top-k", "40", "--top-p", "0.9", "--seed", "7",
              "--temperature", "0.8")
    assert out.returncode == 0, out.stderr
    model = from_pretrained(checkpoint_dir, device="cpu")
    pieces = stream_text(model, tokenizer, "Once upon a time", 10, temperature=0.8, top_k=40,
                         top_p=0.9, seed=7)
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


@pytest.mark.parametrize("args,message", [
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
])
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
    assert ("unknown model 'gpt-5'; choose from gpt2, gpt2-medium, gpt2-large, gpt2-xl"
            in capsys.readouterr().err)


def _offline_env(tmp_path, **extra):
    """No cached weights, and a hub address that refuses connections at once (port 9), so the
    test behaves the same with or without a network."""
    env = {k: v for k, v in os.environ.items()
           if k not in ("GPT2LIB_CHECKPOINT", "HF_HUB_OFFLINE", "HF_HUB_CACHE")}
    env.update(HF_HOME=str(tmp_path / "hf"), HF_ENDPOINT="http://127.0.0.1:9", **extra)
    return env


def _run_env(env, *args):
    return subprocess.run([sys.executable, "-m", "gpt2lib", *args], capture_output=True,
                          text=True, env=env, cwd=REPO, timeout=300)


def test_generate_without_network_prints_one_true_line(tmp_path):
    out = _run_env(_offline_env(tmp_path), "generate", "--model", "gpt2", "--prompt", "Hi")
    assert out.returncode == 1 and out.stdout == ""
    lines = out.stderr.strip().splitlines()
    assert len(lines) == 1, out.stderr  # no retry chatter, no traceback: only the message
    assert "Retrying" not in out.stderr
    assert lines[0].startswith("error: the weights of 'gpt2' are not in the local Hugging Face cache")
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
