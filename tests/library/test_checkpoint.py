"""gpt2lib.checkpoint: atomic saves (kill -9 at any point), checks before the folder is touched,
path resolution from the course folder, and config.json files that cannot be read."""

import json
import os
import subprocess
import sys
import textwrap
from dataclasses import asdict, dataclass
from pathlib import Path

import pytest
import torch
from checkpoints import write_hub_checkpoint

from gpt2lib import checkpoint
from gpt2lib.chapters.config import GPT2Config
from gpt2lib.chapters.model import GPT2
from gpt2lib.checkpoint import CheckpointError, save_pretrained
from gpt2lib.model import from_pretrained

REPO = Path(__file__).resolve().parents[2]
SMALL = dict(n_layer=2, n_head=2, n_embd=16, n_positions=32, vocab_size=101)


def temps(folder):
    return sorted(p.name for p in Path(folder).iterdir() if p.name.startswith("."))


def files_of(folder):
    return {p.name: p.read_bytes() for p in Path(folder).iterdir()}


# --------------------------------------------------------------------------- crashes while saving


_CRASH = textwrap.dedent("""
    import os, sys, torch
    from gpt2lib.checkpoint import save_pretrained
    from gpt2lib.chapters.config import GPT2Config
    from gpt2lib.chapters.model import GPT2
    folder, where = sys.argv[1], sys.argv[2]
    torch.manual_seed(1)
    model = GPT2(GPT2Config(n_layer=3, n_head=2, n_embd=16, n_positions=32, vocab_size=101))
    real_replace = os.replace
    def replace(src, dst):
        if where == "before any rename":
            os._exit(9)
        real_replace(src, dst)
        if where == "after the weights" and str(dst).endswith("model.safetensors"):
            os._exit(9)  # as a kill -9 would: no clean-up runs
    os.replace = replace
    if where == "while writing the weights":
        import safetensors.torch as st
        real_save = st.save_file
        def half_then_die(tensors, path, metadata=None):
            real_save(tensors, path, metadata=metadata)
            with open(path, "r+b") as f:
                f.truncate(os.path.getsize(path) // 2)
            os._exit(9)
        st.save_file = half_then_die
    save_pretrained(model, folder, overwrite=True)
""")


@pytest.mark.parametrize(
    "where,survivor",
    [
        ("while writing the weights", "old"),
        ("before any rename", "old"),
        ("after the weights", "new"),  # the weights carry their config: the next load finishes it
    ],
)
def test_a_save_killed_at_any_point_leaves_a_loadable_model_and_no_temp_file(
    tmp_path, where, survivor, tiny_model
):
    old = tiny_model(n_layer=2)
    save_pretrained(old, tmp_path)
    out = subprocess.run(
        [sys.executable, "-c", _CRASH, str(tmp_path), where],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert out.returncode == 9, out.stderr
    loaded = from_pretrained(tmp_path, device="cpu")
    assert loaded.config.n_layer == (2 if survivor == "old" else 3)
    if survivor == "old":
        assert torch.equal(loaded.wte.weight, old.wte.weight)
    assert temps(tmp_path) == []  # the load cleaned up after the dead writer
    assert sorted(p.name for p in tmp_path.iterdir()) == ["config.json", "model.safetensors"]


_KILL_LOOP = textwrap.dedent("""
    import json, os, random, signal, sys, time
    import torch
    from gpt2lib.model import from_pretrained
    from gpt2lib.checkpoint import save_pretrained
    from gpt2lib.chapters.config import GPT2Config
    from gpt2lib.chapters.model import GPT2
    folder, rounds = sys.argv[1], int(sys.argv[2])
    def model(n_layer, seed):
        torch.manual_seed(seed)
        return GPT2(GPT2Config(n_layer=n_layer, n_head=2, n_embd=32, n_positions=64,
                               vocab_size=2000))
    versions = {2: model(2, 0), 3: model(3, 1)}
    save_pretrained(versions[2], folder)
    rng = random.Random(0)
    results = []
    for _ in range(rounds):
        pid = os.fork()
        if pid == 0:  # the writer: replace the model, with the other size, again and again
            while True:
                for n in (3, 2):
                    save_pretrained(versions[n], folder, overwrite=True)
        time.sleep(rng.uniform(0.0, 0.08))
        os.kill(pid, signal.SIGKILL)
        os.waitpid(pid, 0)
        try:
            loaded = from_pretrained(folder, device="cpu")
            n = loaded.config.n_layer
            same = all(torch.equal(a, b) for a, b in
                       zip(loaded.state_dict().values(), versions[n].state_dict().values()))
            result = "ok" if same else f"weights of neither version (n_layer={n})"
        except Exception as exc:
            result = f"{type(exc).__name__}: {exc}"
        left = [p for p in os.listdir(folder) if p.startswith(".")]
        results.append(result if not left else f"{result}; left behind: {left}")
    print(json.dumps(results))
""")


@pytest.mark.skipif(not hasattr(os, "fork"), reason="needs fork")
def test_kill_9_during_save_pretrained_always_leaves_the_old_or_the_new_model(tmp_path):
    """A save killed at any moment leaves a loadable folder (old or new) and no temp file."""
    out = subprocess.run(
        [sys.executable, "-c", _KILL_LOOP, str(tmp_path), "25"],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert out.returncode == 0, out.stderr[-2000:]
    results = json.loads(out.stdout.strip().splitlines()[-1])
    assert results == ["ok"] * 25, [r for r in results if r != "ok"]


def test_stale_temp_files_of_a_dead_writer_are_removed_by_the_next_save(tmp_path, tiny_model):
    save_pretrained(tiny_model(), tmp_path)
    dead = subprocess.run(
        [sys.executable, "-c", "import os; print(os.getpid())"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout.strip()
    stale = tmp_path / f".gpt2lib-save.{dead}.0123abcd"  # what a killed save leaves
    stale.mkdir()
    (stale / "model.safetensors").write_bytes(b"half a model")
    (stale / ".tmpAbC123").write_bytes(b"the safetensors library's own temp file")
    legacy = tmp_path / "model.safetensors.partial"  # what the earlier save_pretrained left
    legacy.write_bytes(b"x" * 100)
    mine = tmp_path / ".model.safetensors.notes"  # not ours: kept
    mine.write_text("mine", encoding="utf-8")
    save_pretrained(tiny_model(seed=1), tmp_path, overwrite=True)
    assert not stale.exists() and not legacy.exists() and mine.exists()


# --------------------------------------------------------------------------- checks before writing


@dataclass
class _ConfigWithADtype(GPT2Config):
    dtype: object = torch.float16  # json cannot write a torch.dtype


def test_a_config_that_cannot_be_serialised_leaves_the_old_model_untouched(tmp_path, tiny_model):
    """A config that JSON cannot write is refused before any file of the old model changes."""
    save_pretrained(tiny_model(), tmp_path)
    before = files_of(tmp_path)
    model = tiny_model(seed=1)
    model.config = _ConfigWithADtype(**asdict(model.config))
    with pytest.raises(ValueError, match="config cannot be written as JSON.*nothing was written"):
        save_pretrained(model, tmp_path, overwrite=True)
    assert files_of(tmp_path) == before


@pytest.mark.parametrize("bad", [float("nan"), float("inf")])
def test_non_finite_weights_are_not_saved(tmp_path, bad, tiny_model):
    save_pretrained(tiny_model(), tmp_path)
    before = files_of(tmp_path)
    model = tiny_model(seed=1)
    with torch.no_grad():
        model.h[1].mlp.c_fc.weight[0, 0] = bad
    with pytest.raises(
        ValueError,
        match=r"tensor 'h\.1\.mlp\.c_fc\.weight' holds 1 NaN or "
        "infinite value.*nothing was written",
    ):
        save_pretrained(model, tmp_path, overwrite=True)
    assert files_of(tmp_path) == before


def test_float16_overflow_is_refused_with_advice(tmp_path, tiny_model):
    model = tiny_model()
    with torch.no_grad():
        model.wpe.weight[0, 0] = 1e6  # fine in float32, infinite in float16
    with pytest.raises(ValueError, match="in torch.float16.*try dtype=torch.bfloat16"):
        save_pretrained(model, tmp_path / "m", dtype=torch.float16)
    assert not (tmp_path / "m").exists()


@pytest.mark.parametrize(
    "dtype,error,match",
    [
        (torch.int8, ValueError, "dtype must be float32, bfloat16 or float16"),
        ("int8", ValueError, "unknown dtype 'int8'"),
        (3, ValueError, "dtype must be float32"),
    ],
)
def test_integer_storage_dtypes_are_refused(tmp_path, dtype, error, match, tiny_model):
    with pytest.raises(error, match=match):
        save_pretrained(tiny_model(), tmp_path / "m", dtype=dtype)
    assert not (tmp_path / "m").exists()


@pytest.mark.parametrize(
    "name,stored",
    [("float16", torch.float16), ("bf16", torch.bfloat16), ("torch.float32", torch.float32)],
)
def test_storage_dtype_by_name(tmp_path, name, stored, tiny_model):
    from safetensors import safe_open

    model = tiny_model()
    save_pretrained(model, tmp_path, dtype=name)
    with safe_open(str(tmp_path / "model.safetensors"), framework="pt") as f:
        assert f.get_tensor("wte.weight").dtype == stored
    loaded = from_pretrained(tmp_path, device="cpu")
    assert torch.equal(loaded.wte.weight, model.wte.weight.to(stored).float())


@pytest.mark.parametrize(
    "kwargs,error,match",
    [
        (dict(model="not a model"), TypeError, "model must be a GPT-2 model"),
        (dict(folder=3), TypeError, "folder must be a path"),
        (dict(folder=""), ValueError, "folder must be a non-empty"),
        (dict(overwrite="yes"), TypeError, "overwrite must be True or False"),
    ],
)
def test_save_pretrained_checks_its_arguments_first(tmp_path, kwargs, error, match, tiny_model):
    args = {"model": tiny_model(), "folder": tmp_path / "m", **kwargs}
    with pytest.raises(error, match=match):
        save_pretrained(args.pop("model"), args.pop("folder"), **args)
    assert not (tmp_path / "m").exists()


def test_a_model_with_an_untied_readout_is_refused(tmp_path, tiny_model):
    class Untied(GPT2):
        def __init__(self, config):
            super().__init__(config)
            self.lm_head = torch.nn.Linear(config.n_embd, config.vocab_size, bias=False)

    model = tiny_model(model_cls=Untied, **SMALL)
    with pytest.raises(ValueError, match="lm_head.weight differs from wte.weight"):
        save_pretrained(model, tmp_path / "m")
    assert not (tmp_path / "m").exists()


# --------------------------------------------------------------------------- where a folder is


def test_a_relative_folder_resolves_from_the_course_folder_too(monkeypatch):
    standin = checkpoint.standin_folder()
    if standin is None:
        pytest.skip("data/standin is not in this checkout")
    monkeypatch.chdir(REPO / "notebooks")  # where a notebook kernel runs
    assert checkpoint.resolve_checkpoint("data/standin") == REPO / "data" / "standin"
    monkeypatch.chdir(REPO)
    assert checkpoint.resolve_checkpoint("data/standin") == Path("data/standin")


def test_the_current_folder_wins_over_the_course_folder(tmp_path, monkeypatch):
    write_hub_checkpoint(tmp_path / "data" / "standin", **SMALL)
    monkeypatch.chdir(tmp_path)
    assert from_pretrained("data/standin", device="cpu").config.vocab_size == 101


def test_a_missing_relative_folder_names_where_it_was_looked_for(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    with pytest.raises(FileNotFoundError) as info:
        from_pretrained("data/no-such-model")
    message = str(info.value)
    assert str(tmp_path / "data" / "no-such-model") in message
    assert str(REPO / "data" / "no-such-model") in message
    assert "from the current folder, then from the course folder" in message


def test_the_offline_error_names_the_stand_in_by_its_absolute_path(tmp_path):
    env = dict(os.environ, HF_HUB_OFFLINE="1", HF_HOME=str(tmp_path / "hf"))
    env.pop("HF_HUB_CACHE", None)
    code = (
        "from gpt2lib import from_pretrained\ntry:\n    from_pretrained('gpt2')\n"
        "except Exception as exc:\n    print(exc)"
    )
    out = subprocess.run(
        [sys.executable, "-c", code],
        capture_output=True,
        text=True,
        env=env,
        cwd=tmp_path,
        timeout=120,
    )
    standin = REPO / "data" / "standin"
    assert f"from_pretrained('{standin}')" in out.stdout, out.stdout + out.stderr
    assert f"GPT2LIB_CHECKPOINT={standin}" in out.stdout


# --------------------------------------------------------------------------- files that are not right


def _folder_with_config(tmp_path, text):
    folder = write_hub_checkpoint(tmp_path, **SMALL)
    (folder / "config.json").write_text(text, encoding="utf-8")
    return folder


def test_a_config_nested_100000_levels_deep_is_one_clear_error(tmp_path):
    folder = _folder_with_config(tmp_path, "[" * 100_000 + "]" * 100_000)
    with pytest.raises(
        CheckpointError,
        match="config.json' is not a readable JSON config "
        r"\(nested too deeply",
    ):
        from_pretrained(folder, device="cpu")


def test_a_huge_config_is_refused_without_reading_it_all(tmp_path):
    folder = _folder_with_config(tmp_path, '{"pad": "' + "x" * (2 << 20) + '"}')
    with pytest.raises(CheckpointError, match="over 1024 KiB"):
        from_pretrained(folder, device="cpu")


@pytest.mark.parametrize(
    "field,value,message",
    [
        ("n_embd", None, "n_embd must be a whole number, got None"),
        ("n_layer", 2.0, "n_layer must be a whole number, got 2.0"),
        ("layer_norm_epsilon", float("inf"), "layer_norm_epsilon must be a finite number"),
        ("attn_pdrop", float("nan"), "attn_pdrop must be a finite number"),
    ],
)
def test_a_bad_config_value_names_the_file(tmp_path, field, value, message):
    folder = write_hub_checkpoint(tmp_path, **SMALL)
    config = json.loads((folder / "config.json").read_text(encoding="utf-8"))
    config[field] = value
    (folder / "config.json").write_text(json.dumps(config), encoding="utf-8")  # Infinity, NaN
    with pytest.raises(CheckpointError) as info:
        from_pretrained(folder, device="cpu")
    assert str(folder / "config.json") in str(info.value) and message in str(info.value)


def test_a_config_that_is_not_utf8_is_refused(tmp_path):
    folder = write_hub_checkpoint(tmp_path, **SMALL)
    (folder / "config.json").write_bytes(b'{"n_embd": "\xff"}')
    with pytest.raises(CheckpointError, match="not UTF-8"):
        from_pretrained(folder, device="cpu")


@pytest.mark.skipif(not Path("/dev/zero").exists(), reason="needs /dev/zero")
def test_a_symlink_to_a_device_is_refused_and_to_a_file_accepted(tmp_path):
    source = write_hub_checkpoint(tmp_path / "source", **SMALL)
    linked = tmp_path / "linked"  # the Hugging Face cache links snapshots to blobs like this
    linked.mkdir()
    for name in ("config.json", "model.safetensors"):
        (linked / name).symlink_to(source / name)
    assert from_pretrained(linked, device="cpu").config.n_embd == 16
    (linked / "model.safetensors").unlink()
    (linked / "model.safetensors").symlink_to("/dev/zero")
    with pytest.raises(CheckpointError, match="does not hold model.safetensors"):
        from_pretrained(linked, device="cpu")


def test_a_header_that_claims_more_than_the_file_is_refused(tmp_path):
    folder = write_hub_checkpoint(tmp_path, **SMALL)
    path = folder / "model.safetensors"
    data = path.read_bytes()
    path.write_bytes((2**40).to_bytes(8, "little") + data[8:])  # a 1 TiB header
    with pytest.raises(CheckpointError, match="not a valid safetensors file"):
        from_pretrained(folder, device="cpu")


def test_float16_weights_that_overflow_on_loading_are_refused(tmp_path):
    from checkpoints import hub_config, random_hub_tensors

    tensors = random_hub_tensors(hub_config(**SMALL))
    tensors["wpe.weight"][0, 0] = 1e6
    folder = write_hub_checkpoint(tmp_path, tensors=tensors, config=hub_config(**SMALL))
    assert from_pretrained(folder, device="cpu").wpe.weight[0, 0] == 1e6
    with (
        pytest.raises(CheckpointError, match="too large for float16"),
        pytest.warns(UserWarning, match="float16 on the CPU is slow"),
    ):
        from_pretrained(folder, device="cpu", dtype=torch.float16)


def test_one_loader_and_one_saver():
    import gpt2lib
    from gpt2lib import model

    assert gpt2lib.save_pretrained is checkpoint.save_pretrained
    assert gpt2lib.from_pretrained is model.from_pretrained
    assert gpt2lib.GPT2.from_pretrained.__func__ is model.GPT2Methods.from_pretrained.__func__
    assert checkpoint.HUB_MODELS == tuple(GPT2Config.SIZES)


def test_two_threads_saving_into_one_folder_leave_one_whole_model(tmp_path, tiny_model):
    import threading

    models = [tiny_model(n_layer=2, seed=0), tiny_model(n_layer=3, seed=1)]
    save_pretrained(models[0], tmp_path)
    errors = []

    def save(model):
        try:
            for _ in range(5):
                save_pretrained(model, tmp_path, overwrite=True)
        except Exception as exc:  # pragma: no cover - shown by the assert below
            errors.append(exc)

    threads = [threading.Thread(target=save, args=(m,)) for m in models]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert errors == []
    loaded = from_pretrained(tmp_path, device="cpu")
    expected = models[loaded.config.n_layer - 2]
    assert all(
        torch.equal(a, b)
        for a, b in zip(loaded.state_dict().values(), expected.state_dict().values())
    )
    assert temps(tmp_path) == []
