"""The side-by-side benchmark runs end to end (on a tiny checkpoint; speed is not asserted)."""

import json
import os
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))

import compare_transformers  # noqa: E402


@pytest.mark.slow
def test_benchmark_checks_identical_generations_then_writes_its_record(tmp_path, capsys):
    record_path = tmp_path / "record.json"
    code = compare_transformers.main(
        [
            "--checkpoint",
            os.environ["GPT2LIB_CHECKPOINT"],
            "--quick",
            "--repeats",
            "1",
            "--threads",
            "1",
            "--prefill-len",
            "64",
            "--skip-loading",
            "--skip-tokenizer",
            "--json",
            str(record_path),
        ]
    )
    assert code == 0
    record = json.loads(record_path.read_text(encoding="utf-8"))
    assert record["results"]["greedy_identical_batch1"] is True
    assert record["results"]["greedy_identical_batch8"] is True
    for name in (
        "decode, KV cache, batch 1",
        "decode, KV cache, batch 8",
        "decode, KV cache, batch 1, gpt2lib without split matmul",
        "decode, no cache, batch 1",
        "prefill, 64 tokens",
    ):
        result = record["results"][name]
        assert result["gpt2lib"]["median"] > 0 and result["transformers"]["median"] > 0
        assert result["ratio"] == pytest.approx(
            result["gpt2lib"]["median"] / result["transformers"]["median"]
        )
    decode1 = record["results"]["decode, KV cache, batch 1"]
    assert decode1["weights_gb_per_s"]["gpt2lib"] == pytest.approx(
        decode1["gpt2lib"]["median"] * decode1["weight_bytes_per_token"] / 1e9
    )
    assert record["machine"]["memory_read_gb_per_s"] > 0
    ceiling = decode1["ceiling"]  # the batch-1 speed limit, beside the measured ratio
    assert ceiling["stream_tokens_per_s"] == pytest.approx(
        ceiling["gb_per_s"] * 1e9 / decode1["weight_bytes_per_token"]
    )
    assert ceiling["tokens_per_s"] == max(
        ceiling["stream_tokens_per_s"], ceiling["multiplies_only_tokens_per_s"]
    )
    assert ceiling["best_ratio_to_transformers"] == pytest.approx(
        ceiling["tokens_per_s"] / decode1["transformers"]["median"]
    )
    assert isinstance(ceiling["is_a_bound"], bool)
    out = capsys.readouterr().out
    assert "| decode, KV cache, batch 1" in out
    assert "ceiling:" in out


def test_benchmark_refuses_to_time_models_that_disagree(tmp_path, monkeypatch, capsys):
    """If greedy outputs differ, nothing is timed and the exit code says so."""

    real = compare_transformers.ours_generate

    def off_by_one(model, prompt, new_tokens, use_cache=True):
        out = real(model, prompt, new_tokens, use_cache).clone()
        out[:, -1] = (out[:, -1] + 1) % model.config.vocab_size
        return out

    monkeypatch.setattr(compare_transformers, "ours_generate", off_by_one)
    code = compare_transformers.main(
        [
            "--checkpoint",
            os.environ["GPT2LIB_CHECKPOINT"],
            "--quick",
            "--threads",
            "1",  # one thread: no split routes to measure before the refusal
            "--skip-loading",
            "--skip-tokenizer",
            "--json",
            str(tmp_path / "r.json"),
        ]
    )
    assert code == 1
    assert "refusing to time" in capsys.readouterr().out


@pytest.mark.slow
def test_gpu_check_smoke_run_on_cpu_writes_its_record(tmp_path, monkeypatch, capsys):
    """`gpu_check.py --device cpu --quick`: the GPU check's code path, on a tiny model."""
    import gpu_check

    monkeypatch.setenv("OUT", str(tmp_path / "out"))
    record_path = tmp_path / "gpu.json"
    code = gpu_check.main(
        ["--device", "cpu", "--quick", "--no-install", "--json", str(record_path)]
    )
    assert code == 0
    record = json.loads(record_path.read_text(encoding="utf-8"))
    assert record["results"]["greedy_identical_float32"] is True
    for dtype in ("bfloat16", "float32"):
        for batch in (1, 8):
            rows = record["results"][dtype][f"batch {batch}"]
            assert rows["greedy_identical"]["gpt2lib eager"] in (True, False)
            for name in ("transformers generate", "gpt2lib eager"):
                assert rows[name]["tokens_per_s"] > 0
            assert rows["gpt2lib eager"]["weights_gb_per_s"] == pytest.approx(
                rows["gpt2lib eager"]["tokens_per_s"]
                / batch
                * record["results"][dtype]["weight_bytes_per_token"]
                / 1e9
            )
    assert record["results"]["float32"]["batch 1"]["greedy_identical"]["gpt2lib eager"] is True
    assert record["machine"]["memory_read_gb_per_s"] > 0
    assert len(list((tmp_path / "out").glob("gpu-check-cpu-*.json"))) == 1  # the $OUT copy
    assert "float32 greedy tokens identical: True" in capsys.readouterr().out


def test_gpu_check_refuses_cuda_when_there_is_none(capsys):
    import gpu_check
    import torch

    if torch.cuda.is_available():
        pytest.skip("this machine has a GPU")
    assert gpu_check.main(["--device", "cuda", "--quick", "--no-install"]) == 2
    assert "sees no CUDA GPU" in capsys.readouterr().out
