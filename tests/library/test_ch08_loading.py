"""Chapter 8: loading GPT-2 checkpoints (hub layout and save_pretrained layout), devices, dtypes."""

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import torch
from checkpoints import (
    hub_config,
    random_hub_tensors,
    write_hub_checkpoint,
    write_save_pretrained_checkpoint,
)

from gpt2lib import checkpoint
from gpt2lib.chapters.model import GPT2
from gpt2lib.checkpoint import CheckpointError, HubUnreachable
from gpt2lib.device import pick_device, resolve_dtype
from gpt2lib.model import from_pretrained

REPO = Path(__file__).resolve().parents[2]
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
    model = from_pretrained(checkpoint_dir, device="cpu")
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
    folder = write_hub_checkpoint(
        tmp_path, tensors=_prefixed(tensors, other), config=hub_config(**SMALL)
    )
    with pytest.raises(CheckpointError, match="lm_head.weight that differs from wte.weight"):
        from_pretrained(folder, device="cpu")


def test_bfloat16_load(hub_dir):
    model = from_pretrained(hub_dir, device="cpu", dtype="bfloat16")
    reference = from_pretrained(hub_dir, device="cpu")
    assert {p.dtype for p in model.parameters()} == {torch.bfloat16}
    idx = _ids(SMALL["vocab_size"])
    torch.testing.assert_close(model(idx).float(), reference(idx), atol=5e-2, rtol=5e-2)


_REWRITE_AFTER_LOADING = textwrap.dedent("""
    import sys
    from pathlib import Path
    import torch
    from gpt2lib import from_pretrained
    folder = Path(sys.argv[1])
    model = from_pretrained(folder, device="cpu")
    idx = torch.tensor([[1, 2, 3, 4]])
    with torch.no_grad():
        before = model(idx)
    weights = folder / "model.safetensors"
    data = weights.read_bytes()
    weights.write_bytes(data[:100])  # what a new download or save_pretrained does first
    with torch.no_grad():
        after_truncate = model(idx)
    weights.write_bytes(bytes(len(data)))  # then a different file of the same size
    with torch.no_grad():
        after_rewrite = model(idx)
    mapped = Path("/proc/self/maps").read_text() if sys.platform.startswith("linux") else ""
    print(torch.equal(before, after_truncate), torch.equal(before, after_rewrite),
          str(weights) in mapped)
""")


def test_a_loaded_model_does_not_depend_on_its_file(tmp_path):
    """A loaded model keeps working when its file is rewritten (a memory-mapped one died of SIGBUS).

    Run in a subprocess, so that a regression (a crash) fails this test instead of the run."""
    folder = write_hub_checkpoint(tmp_path, **SMALL)
    out = subprocess.run(
        [sys.executable, "-c", _REWRITE_AFTER_LOADING, str(folder)],
        capture_output=True,
        text=True,
        timeout=300,
        cwd=REPO,
    )
    assert out.returncode == 0, f"exit {out.returncode} (-7 is SIGBUS): {out.stderr[-2000:]}"
    assert out.stdout.split() == ["True", "True", "False"]  # same logits; the file is not mapped


def test_writing_a_weight_never_changes_the_file(tmp_path):
    folder = write_hub_checkpoint(tmp_path, **SMALL)
    before = (folder / "model.safetensors").read_bytes()
    model = from_pretrained(folder, device="cpu")
    with torch.no_grad():
        model.wte.weight.add_(1.0)
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
    with pytest.raises(
        CheckpointError,
        match=r"h\.0\.attn\.c_attn\.weight \(48, 16\) "
        r"\(model expects \(16, 48\)\)",
    ):
        from_pretrained(folder, device="cpu")


def test_config_that_disagrees_with_the_weights_is_refused(tmp_path):
    folder = write_hub_checkpoint(tmp_path, **SMALL)
    config = json.loads((folder / "config.json").read_text(encoding="utf-8"))
    config["n_layer"] = 3
    (folder / "config.json").write_text(json.dumps(config), encoding="utf-8")
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
    (folder / "config.json").write_text("{ nope", encoding="utf-8")
    with pytest.raises(CheckpointError, match="not a readable JSON config"):
        from_pretrained(folder, device="cpu")


def test_non_gpt2_config_is_refused(tmp_path):
    folder = write_hub_checkpoint(tmp_path, **SMALL)
    config = json.loads((folder / "config.json").read_text(encoding="utf-8"))
    config["model_type"] = "llama"
    (folder / "config.json").write_text(json.dumps(config), encoding="utf-8")
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
        from gpt2lib import from_pretrained
        from gpt2lib.checkpoint import CheckpointError
        try:
            from_pretrained("gpt2")
        except CheckpointError as exc:
            print(exc)
    """)
    out = subprocess.run(
        [sys.executable, "-c", code],
        capture_output=True,
        text=True,
        env=env,
        cwd=tmp_path,
        timeout=120,
    )
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
    import json, sys, time
    import torch
    from gpt2lib import from_pretrained
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
    # VmHWM: this process's own peak. ru_maxrss would not do: Linux carries the parent's
    # peak across fork and exec, so a large pytest worker would set this child's figure.
    status = open("/proc/self/status").read().split("VmHWM:")[1]
    peak = int(status.split()[0]) / 1024
    params = sum(p.numel() for p in model.parameters())
    print(json.dumps(dict(seconds=seconds, base=base, peak=peak, after=rss_mib(), params=params)))
""")


@pytest.mark.slow
@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc for memory")
def test_full_size_checkpoint_loads_without_a_second_copy(tmp_path):
    """124M shapes: load time and peak memory. Prints the numbers (pytest -s to see them)."""
    writer = (
        "import sys; sys.path.insert(0, sys.argv[2]); from checkpoints import *; "
        "write_hub_checkpoint(sys.argv[1], **GPT2_SMALL)"
    )
    subprocess.run(
        [sys.executable, "-c", writer, str(tmp_path), str(REPO / "tests")], check=True, timeout=300
    )
    out = subprocess.run(
        [sys.executable, "-c", _MEASURE, str(tmp_path)],
        capture_output=True,
        text=True,
        check=True,
        timeout=300,
        cwd=REPO,
    )
    result = json.loads(out.stdout.strip().splitlines()[-1])
    weights_mib = result["params"] * 4 / 2**20
    print(
        f"\n124M checkpoint: loaded in {result['seconds']:.2f} s; RSS {result['base']:.0f} MiB "
        f"before, peak {result['peak']:.0f} MiB (weights: {weights_mib:.1f} MiB)"
    )
    assert result["params"] == 124_439_808  # the design card's count
    # one copy of the weights (touched by the forward pass) plus working memory; two copies
    # would add at least another 474 MiB
    assert result["peak"] - result["base"] < 1.3 * weights_mib  # (load time: printed, not asserted)


# --------------------------------------------------------------------------- values and config.json


@pytest.mark.parametrize("bad", [float("nan"), float("inf"), float("-inf")])
def test_nan_or_inf_weights_are_refused_naming_the_tensor(tmp_path, bad):
    tensors = random_hub_tensors(hub_config(**SMALL))
    tensors["h.1.mlp.c_proj.weight"][2, 3] = bad
    folder = write_hub_checkpoint(tmp_path, tensors=tensors, config=hub_config(**SMALL))
    with pytest.raises(
        CheckpointError,
        match=r"tensor 'h\.1\.mlp\.c_proj\.weight' holds 1 NaN "
        "or infinite value",
    ):
        from_pretrained(folder, device="cpu")


def test_integer_weights_are_a_checkpoint_error(tmp_path):
    tensors = random_hub_tensors(hub_config(**SMALL))
    tensors["wpe.weight"] = torch.zeros(tensors["wpe.weight"].shape, dtype=torch.int64)
    folder = write_hub_checkpoint(tmp_path, tensors=tensors, config=hub_config(**SMALL))
    with pytest.raises(
        CheckpointError,
        match=r"tensor 'wpe\.weight' has dtype torch\.int64; "
        "GPT-2's weights are floating point",
    ):
        from_pretrained(folder, device="cpu")


def _with_config(tmp_path, **changes):
    folder = write_hub_checkpoint(tmp_path, **SMALL)
    config = json.loads((folder / "config.json").read_text(encoding="utf-8"))
    config.update(changes)
    (folder / "config.json").write_text(json.dumps(config), encoding="utf-8")
    return folder


@pytest.mark.parametrize(
    "changes,message",
    [
        (dict(n_embd="16"), r"config\.json' has a bad value: n_embd must be a whole number"),
        (
            dict(layer_norm_epsilon=None),
            r"config\.json' has a bad value: layer_norm_epsilon must be a number",
        ),
        (
            dict(activation_function="relu"),
            r"config\.json' sets activation_function='relu', which this "
            r"GPT-2 does not implement \(it computes "
            r"activation_function='gelu_new'\)",
        ),
        (dict(scale_attn_weights=False), "sets scale_attn_weights=False"),
        (dict(scale_attn_by_inverse_layer_idx=True), "sets scale_attn_by_inverse_layer_idx=True"),
        (dict(n_inner=7), "sets n_inner=7"),
    ],
)
def test_config_values_this_model_does_not_compute_are_refused(tmp_path, changes, message):
    with pytest.raises(CheckpointError, match=message):
        from_pretrained(_with_config(tmp_path, **changes), device="cpu")


def test_equivalent_config_values_are_accepted(tmp_path):
    folder = _with_config(
        tmp_path,
        activation_function="gelu_pytorch_tanh",
        n_inner=None,
        scale_attn_weights=True,
        scale_attn_by_inverse_layer_idx=False,
    )
    assert from_pretrained(folder, device="cpu").config.n_embd == SMALL["n_embd"]


# --------------------------------------------------------------------------- names and the hub


def test_hub_names_with_the_organisation_are_accepted(monkeypatch):
    asked = []
    monkeypatch.setattr(checkpoint, "hub_checkpoint", lambda name: asked.append(name) or Path("x"))
    assert checkpoint.resolve_checkpoint("openai-community/gpt2-medium") == Path("x")
    assert checkpoint.resolve_checkpoint("gpt2") == Path("x")
    assert asked == ["openai-community/gpt2-medium", "gpt2"]
    assert checkpoint.hub_name("openai-community/gpt2-xl") == "gpt2-xl"
    assert checkpoint.hub_name("someone-else/gpt2") is None


@pytest.mark.parametrize("name", ["", "   "])
def test_an_empty_name_is_refused(name):
    with pytest.raises(ValueError, match="name_or_folder is empty.*'.' for the current folder"):
        from_pretrained(name)


def test_the_loader_builds_gpt2_or_the_class_it_is_given(hub_dir):
    import gpt2lib

    assert type(from_pretrained(hub_dir, device="cpu")) is gpt2lib.GPT2

    class Variant(GPT2):  # e.g. a learner's model with the same parameter names, no methods
        pass

    loaded = from_pretrained(hub_dir, device="cpu", model_cls=Variant)
    assert isinstance(loaded, Variant) and type(loaded).__name__ == "Variant"
    for method in ("generate", "run_with_cache", "save_pretrained", "from_pretrained"):
        assert callable(getattr(loaded, method)), method  # the same methods as gpt2lib.GPT2
    with pytest.raises(TypeError, match="model_cls must be a model class such as GPT2"):
        from_pretrained(hub_dir, model_cls="GPT2")


class _FakeHub:
    """Stands in for huggingface_hub: an empty cache, and a network that is not there."""

    def __init__(self):
        self.probes, self.downloads = [], []

    def download(self, repo, filename, local_files_only=False, **kwargs):
        from huggingface_hub.errors import LocalEntryNotFoundError

        self.downloads.append((repo, filename, local_files_only))
        raise LocalEntryNotFoundError(f"{filename} is not cached")

    def metadata(self, url, timeout=None, retry_on_errors=True, **kwargs):
        self.probes.append(dict(url=url, timeout=timeout, retry_on_errors=retry_on_errors))
        raise ConnectionError("[Errno -2] Name or service not known")


def test_no_network_means_one_quick_request_and_no_retries(monkeypatch):
    import huggingface_hub

    fake = _FakeHub()
    monkeypatch.setattr(huggingface_hub, "hf_hub_download", fake.download)
    monkeypatch.setattr(huggingface_hub, "get_hf_file_metadata", fake.metadata)
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_OFFLINE", False)
    with pytest.raises(HubUnreachable) as info:
        from_pretrained("openai-community/gpt2")
    assert len(fake.probes) == 1  # one attempt ...
    assert fake.probes[0]["retry_on_errors"] is False  # ... that is not retried
    assert fake.probes[0]["timeout"] <= 10
    assert "openai-community/gpt2/resolve" in fake.probes[0]["url"]
    # only the local cache was looked at: no download with retries was started
    assert fake.downloads == [("openai-community/gpt2", "config.json", True)]
    assert info.value.name == "gpt2" and not info.value.offline
    message = str(info.value)
    assert "ConnectionError: [Errno -2] Name or service not known" in message
    assert "run `python -m gpt2lib download gpt2` once" in message
    # the way forward offline: the stand-in, by its absolute path in this checkout
    standin = checkpoint.standin_folder()
    assert standin is not None and standin.is_absolute()
    assert f"from_pretrained('{standin}')" in message
    assert f"GPT2LIB_CHECKPOINT={standin}" in message


def test_offline_mode_asks_the_cache_only(monkeypatch):
    import huggingface_hub

    fake = _FakeHub()
    monkeypatch.setattr(huggingface_hub, "hf_hub_download", fake.download)
    monkeypatch.setattr(huggingface_hub, "get_hf_file_metadata", fake.metadata)
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_OFFLINE", True)
    with pytest.raises(HubUnreachable, match="offline mode: HF_HUB_OFFLINE=1") as info:
        from_pretrained("gpt2")
    assert fake.probes == [] and info.value.offline


def test_the_package_level_loader_is_gpt2s(hub_dir):
    import gpt2lib

    assert gpt2lib.from_pretrained is from_pretrained
    assert type(gpt2lib.from_pretrained(hub_dir, device="cpu")) is gpt2lib.GPT2


def test_a_cached_model_needs_no_network(monkeypatch, tmp_path):
    import huggingface_hub

    fake = _FakeHub()
    snapshot = tmp_path / "snapshot"
    monkeypatch.setattr(
        huggingface_hub,
        "hf_hub_download",
        lambda repo, filename, local_files_only=False, **kw: (
            fake.downloads.append((repo, filename, local_files_only)) or str(snapshot / filename)
        ),
    )
    monkeypatch.setattr(huggingface_hub, "get_hf_file_metadata", fake.metadata)
    assert checkpoint.hub_checkpoint("gpt2-large") == snapshot
    assert checkpoint.download(["openai-community/gpt2-large"]) == [snapshot]
    assert fake.probes == []  # the cache answered: the network was never asked
    assert {d[2] for d in fake.downloads} == {True}
