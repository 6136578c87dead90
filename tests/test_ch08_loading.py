"""Chapter 8: loading GPT-2 checkpoints (hub layout and save_pretrained layout), devices, dtypes."""

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import torch
from checkpoints import (hub_config, random_hub_tensors, write_hub_checkpoint,
                         write_save_pretrained_checkpoint)

from gpt2lib.device import pick_device, resolve_dtype
from gpt2lib.loading import CheckpointError, from_pretrained
from gpt2lib.model import GPT2

REPO = Path(__file__).resolve().parent.parent
SMALL = dict(n_layer=2, n_head=2, n_embd=16, n_positions=32, vocab_size=101)


def _ids(vocab, shape=(2, 9), seed=0):
    return torch.randint(0, vocab, shape, generator=torch.Generator().manual_seed(seed))


@pytest.fixture(scope="module")
def hub_dir(tmp_path_factory):
    return write_hub_checkpoint(tmp_path_factory.mktemp("hub"), **SMALL)


# --------------------------------------------------------------------------- what loads


def test_hub_layout_matches_transformers_logits(hub_dir):
    from transformers import GPT2LMHeadModel

    ours = from_pretrained(hub_dir, device="cpu")
    theirs = GPT2LMHeadModel.from_pretrained(str(hub_dir)).eval()
    idx = _ids(SMALL["vocab_size"])
    with torch.no_grad():
        torch.testing.assert_close(ours(idx), theirs(idx).logits, atol=1e-5, rtol=1e-5)
    assert not ours.training
    assert all(p.requires_grad for p in ours.parameters())


def test_every_tensor_lands_in_the_module_of_the_same_name(tmp_path):
    folder = write_hub_checkpoint(tmp_path, **SMALL)
    tensors = random_hub_tensors(hub_config(**SMALL))
    model = from_pretrained(folder, device="cpu")
    state = model.state_dict()
    for name, tensor in tensors.items():
        if name.endswith(".attn.bias") and name.count(".") == 3:
            assert name not in state  # the causal-mask buffer is not part of our model
        else:
            assert torch.equal(state[name], tensor), name  # Conv1D [in, out]: no transpose


def test_the_tiny_conftest_checkpoint_loads_with_real_vocabulary(checkpoint_dir):
    model = GPT2.from_pretrained(checkpoint_dir, device="cpu")
    assert model.config.vocab_size == 50257
    assert model(torch.tensor([[50256, 15496]])).shape == (1, 2, 50257)


@pytest.mark.parametrize("attn_bias,masked_bias", [(False, False), (True, True)])
def test_mask_buffers_are_optional(tmp_path, attn_bias, masked_bias):
    folder = write_hub_checkpoint(tmp_path, attn_bias=attn_bias, masked_bias=masked_bias, **SMALL)
    reference = from_pretrained(write_hub_checkpoint(tmp_path / "ref", **SMALL), device="cpu")
    model = from_pretrained(folder, device="cpu")
    for (name, got), (_, want) in zip(model.state_dict().items(), reference.state_dict().items()):
        assert torch.equal(got, want), name
    idx = _ids(SMALL["vocab_size"])
    # Not bit-equal: the weights sit at other memory alignments in the two files, and matrix
    # libraries may then round in another order.
    torch.testing.assert_close(model(idx), reference(idx), atol=1e-6, rtol=1e-6)


def test_save_pretrained_layout_matches_transformers(tmp_path):
    from transformers import GPT2LMHeadModel

    folder = write_save_pretrained_checkpoint(tmp_path)
    ours = from_pretrained(folder, device="cpu")
    theirs = GPT2LMHeadModel.from_pretrained(str(folder)).eval()
    idx = _ids(ours.config.vocab_size)
    with torch.no_grad():
        torch.testing.assert_close(ours(idx), theirs(idx).logits, atol=1e-5, rtol=1e-5)


def _prefixed(tensors, lm_head=None):
    out = {"transformer." + k: v for k, v in tensors.items()}
    if lm_head is not None:
        out["lm_head.weight"] = lm_head
    return out


def test_tied_lm_head_in_the_file_is_accepted(tmp_path):
    tensors = random_hub_tensors(hub_config(**SMALL))
    tied = _prefixed(tensors, tensors["wte.weight"].clone())
    folder = write_hub_checkpoint(tmp_path, tensors=tied, config=hub_config(**SMALL))
    model = from_pretrained(folder, device="cpu")
    assert torch.equal(model.wte.weight, tensors["wte.weight"])


def test_untied_lm_head_is_refused(tmp_path):
    tensors = random_hub_tensors(hub_config(**SMALL))
    other = tensors["wte.weight"] + 1.0
    folder = write_hub_checkpoint(tmp_path, tensors=_prefixed(tensors, other),
                                  config=hub_config(**SMALL))
    with pytest.raises(CheckpointError, match="lm_head.weight that differs from wte.weight"):
        from_pretrained(folder, device="cpu")


def test_bfloat16_load(hub_dir):
    model = from_pretrained(hub_dir, device="cpu", dtype="bfloat16")
    reference = from_pretrained(hub_dir, device="cpu")
    assert {p.dtype for p in model.parameters()} == {torch.bfloat16}
    idx = _ids(SMALL["vocab_size"])
    torch.testing.assert_close(model(idx).float(), reference(idx), atol=5e-2, rtol=5e-2)


def test_weights_are_a_copy_on_write_memory_map(tmp_path):
    folder = write_hub_checkpoint(tmp_path, **SMALL)
    before = (folder / "model.safetensors").read_bytes()
    model = from_pretrained(folder, device="cpu")
    if sys.platform.startswith("linux"):
        maps = Path("/proc/self/maps").read_text()
        assert str(folder / "model.safetensors") in maps  # mapped, not read into fresh memory
    with torch.no_grad():
        model.wte.weight.add_(1.0)  # writing a weight must never change the file
    assert (folder / "model.safetensors").read_bytes() == before


# --------------------------------------------------------------------------- what is refused


def _write(tmp_path, drop=(), add=None, reshape=None):
    config = hub_config(**SMALL)
    tensors = random_hub_tensors(config)
    for key in drop:
        del tensors[key]
    tensors.update(add or {})
    for key, shape in (reshape or {}).items():
        tensors[key] = torch.zeros(shape)
    return write_hub_checkpoint(tmp_path, tensors=tensors, config=config)


def test_missing_key_is_named(tmp_path):
    folder = _write(tmp_path, drop=["h.1.mlp.c_fc.bias"])
    with pytest.raises(CheckpointError, match=r"missing keys: h\.1\.mlp\.c_fc\.bias"):
        from_pretrained(folder, device="cpu")


def test_unexpected_key_is_named(tmp_path):
    folder = _write(tmp_path, add={"h.0.attn.q_proj.weight": torch.zeros(3)})
    with pytest.raises(CheckpointError, match=r"unexpected keys: h\.0\.attn\.q_proj\.weight"):
        from_pretrained(folder, device="cpu")


def test_wrong_shape_is_named_with_both_shapes(tmp_path):
    C = SMALL["n_embd"]
    folder = _write(tmp_path, reshape={"h.0.attn.c_attn.weight": (3 * C, C)})  # [out, in]
    with pytest.raises(CheckpointError, match=r"h\.0\.attn\.c_attn\.weight \(48, 16\) "
                                              r"\(model expects \(16, 48\)\)"):
        from_pretrained(folder, device="cpu")


def test_config_that_disagrees_with_the_weights_is_refused(tmp_path):
    folder = write_hub_checkpoint(tmp_path, **SMALL)
    config = json.loads((folder / "config.json").read_text())
    config["n_layer"] = 3
    (folder / "config.json").write_text(json.dumps(config))
    with pytest.raises(CheckpointError, match=r"missing keys: h\.2\."):
        from_pretrained(folder, device="cpu")


def test_truncated_file_is_refused(tmp_path):
    folder = write_hub_checkpoint(tmp_path, **SMALL)
    path = folder / "model.safetensors"
    data = path.read_bytes()
    path.write_bytes(data[: len(data) - 1000])
    with pytest.raises(CheckpointError, match="truncated or corrupt"):
        from_pretrained(folder, device="cpu")


@pytest.mark.parametrize("content", [b"", b"not a safetensors file at all", b"\xff" * 64])
def test_corrupt_file_is_refused(tmp_path, content):
    folder = write_hub_checkpoint(tmp_path, **SMALL)
    (folder / "model.safetensors").write_bytes(content)
    with pytest.raises(CheckpointError, match="not a valid safetensors file"):
        from_pretrained(folder, device="cpu")


def test_bad_config_json_is_refused(tmp_path):
    folder = write_hub_checkpoint(tmp_path, **SMALL)
    (folder / "config.json").write_text("{ nope")
    with pytest.raises(CheckpointError, match="not a readable JSON config"):
        from_pretrained(folder, device="cpu")


def test_non_gpt2_config_is_refused(tmp_path):
    folder = write_hub_checkpoint(tmp_path, **SMALL)
    config = json.loads((folder / "config.json").read_text())
    config["model_type"] = "llama"
    (folder / "config.json").write_text(json.dumps(config))
    with pytest.raises(CheckpointError, match="model_type must be 'gpt2'"):
        from_pretrained(folder, device="cpu")


def test_unknown_name_lists_the_valid_ones():
    with pytest.raises(ValueError, match="gpt2, gpt2-medium, gpt2-large, gpt2-xl"):
        from_pretrained("gpt3")


def test_path_that_does_not_exist(tmp_path):
    with pytest.raises(FileNotFoundError, match="no such checkpoint folder"):
        from_pretrained(tmp_path / "nothing-here")


def test_folder_without_the_files(tmp_path):
    with pytest.raises(CheckpointError, match="does not hold config.json and model.safetensors"):
        from_pretrained(tmp_path)


def test_file_instead_of_folder(hub_dir):
    with pytest.raises(CheckpointError, match="is a file; pass the folder"):
        from_pretrained(hub_dir / "model.safetensors")


def test_offline_without_a_cached_copy_says_how_to_download(tmp_path):
    env = dict(os.environ, HF_HUB_OFFLINE="1", HF_HOME=str(tmp_path / "hf"))
    env.pop("HF_HUB_CACHE", None)
    code = textwrap.dedent("""
        from gpt2lib.loading import CheckpointError, from_pretrained
        try:
            from_pretrained("gpt2")
        except CheckpointError as exc:
            print(exc)
    """)
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env,
                         cwd=tmp_path, timeout=120)
    assert "python -m gpt2lib download gpt2" in out.stdout, out.stdout + out.stderr
    assert "not in the local Hugging Face cache" in out.stdout


# --------------------------------------------------------------------------- devices and dtypes


def test_pick_device_prefers_cuda_then_mps_then_cpu(monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    monkeypatch.setattr(torch.backends.mps, "is_available", lambda: False)
    assert pick_device() == torch.device("cpu")
    assert pick_device("auto") == torch.device("cpu")
    monkeypatch.setattr(torch.backends.mps, "is_available", lambda: True)
    assert pick_device() == torch.device("mps")
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    assert pick_device() == torch.device("cuda")
    assert pick_device("cpu") == torch.device("cpu")  # asked for: honoured


def test_requested_device_that_is_missing_raises(monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    monkeypatch.setattr(torch.backends.mps, "is_available", lambda: False)
    with pytest.raises(ValueError, match="'cuda' was requested but this PyTorch sees no CUDA"):
        pick_device("cuda")
    with pytest.raises(ValueError, match="'mps' was requested"):
        pick_device("mps")


def test_unknown_device_and_dtype():
    with pytest.raises(ValueError, match="unknown device 'gpu'"):
        pick_device("gpu")
    with pytest.raises(TypeError, match="device must be a string"):
        pick_device(3)
    with pytest.raises(ValueError, match="unknown dtype 'float8'"):
        resolve_dtype("float8", "cpu")
    with pytest.raises(ValueError, match="dtype must be float32, bfloat16 or float16"):
        resolve_dtype(torch.int64, "cpu")
    assert resolve_dtype(None, "cpu") == torch.float32
    assert resolve_dtype("bf16", "cpu") == torch.bfloat16


# --------------------------------------------------------------------------- full size


_MEASURE = textwrap.dedent("""
    import json, resource, sys, time
    import torch
    from gpt2lib.loading import from_pretrained
    def rss_mib():
        return int(open("/proc/self/statm").read().split()[1]) * 4096 / 2**20
    torch.set_num_threads(1)
    from_pretrained  # imports done before the baseline
    base = rss_mib()
    t = time.perf_counter()
    model = from_pretrained(sys.argv[1], device="cpu")
    seconds = time.perf_counter() - t
    with torch.no_grad():
        model(torch.tensor([[50256, 464, 3290]]))  # touches every weight
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    params = sum(p.numel() for p in model.parameters())
    print(json.dumps(dict(seconds=seconds, base=base, peak=peak, after=rss_mib(), params=params)))
""")


@pytest.mark.slow
@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc for memory")
def test_full_size_checkpoint_loads_fast_without_a_second_copy(tmp_path):
    """124M shapes: load time and peak memory. Prints the numbers (pytest -s to see them)."""
    writer = ("import sys; sys.path.insert(0, sys.argv[2]); from checkpoints import *; "
              "write_hub_checkpoint(sys.argv[1], **GPT2_SMALL)")
    subprocess.run([sys.executable, "-c", writer, str(tmp_path), str(REPO / "tests")],
                   check=True, timeout=300)
    out = subprocess.run([sys.executable, "-c", _MEASURE, str(tmp_path)], capture_output=True,
                         text=True, check=True, timeout=300, cwd=REPO)
    result = json.loads(out.stdout.strip().splitlines()[-1])
    weights_mib = result["params"] * 4 / 2**20
    print(f"\n124M checkpoint: loaded in {result['seconds']:.2f} s; RSS {result['base']:.0f} MiB "
          f"before, peak {result['peak']:.0f} MiB (weights: {weights_mib:.1f} MiB)")
    assert result["params"] == 124_439_808  # the design card's count
    # one copy of the weights (touched by the forward pass) plus working memory; two copies
    # would add at least another 474 MiB
    assert result["peak"] - result["base"] < 1.3 * weights_mib
    assert result["seconds"] < 20
