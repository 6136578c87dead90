"""Fine-tuning's entry points: adapter files checked before use (truncated or damaged files,
bad config values), saved as one unit, read as peft reads them (layers_to_transform,
exclude_modules), runs that diverge stopped, and empty splits named."""

from __future__ import annotations

import copy
import json
import math
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import torch

from gpt2lib import finetune as ft
from gpt2lib.chapters.tuning import classification_loss
from gpt2lib.model import from_pretrained

REPO = Path(__file__).resolve().parents[2]
IDS = torch.tensor([[464, 2068, 7586, 21831, 18045, 625, 262, 16931, 3290, 13]])


def load(folder):
    return from_pretrained(folder, device="cpu").eval()


def with_adapter(tiny_checkpoint, seed=1, **lora):
    torch.manual_seed(seed)  # lora_A's initial values
    model = ft.apply_lora(load(tiny_checkpoint), **{"rank": 4, "alpha": 8, **lora})
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for layer in ft.lora_layers(model).values():
            if isinstance(layer, ft.LoRAEmbedding):
                layer.lora_embedding_A.copy_(
                    0.05 * torch.randn(layer.lora_embedding_A.shape, generator=gen)
                )
            else:
                layer.lora_B.weight.copy_(
                    0.05 * torch.randn(layer.lora_B.weight.shape, generator=gen)
                )
    return model


def untouched(model, state):
    """The model has no adapter, every parameter trains, and no weight changed."""
    return (
        not ft.lora_layers(model)
        and all(p.requires_grad for p in model.parameters())
        and all(torch.equal(state[k], v) for k, v in model.state_dict().items())
    )


@pytest.fixture
def saved(tiny_checkpoint, tmp_path):
    return ft.save_adapter(with_adapter(tiny_checkpoint), tmp_path / "adapter")


def edit_config(folder, **changes):
    path = Path(folder) / ft.ADAPTER_CONFIG
    config = json.loads(path.read_text(encoding="utf-8"))
    config.update(changes)
    path.write_text(json.dumps(config), encoding="utf-8")  # NaN and Infinity as Python writes them


# --------------------------------------------------------------------------- adapter files checked before use


@pytest.mark.parametrize("keep", [4, 8, 12, 200, -4, -1])
def test_a_truncated_adapter_file_is_one_adapter_error_naming_it(tiny_checkpoint, saved, keep):
    weights = saved / ft.ADAPTER_WEIGHTS
    data = weights.read_bytes()
    weights.write_bytes(data[:keep])
    model = load(tiny_checkpoint)
    state = copy.deepcopy(model.state_dict())
    with pytest.raises(
        ft.AdapterError, match="adapter_model.safetensors' is not a valid safetensors"
    ):
        ft.load_adapter(model, saved)
    assert untouched(model, state)


def test_a_header_that_claims_terabytes_is_refused_without_allocating(tiny_checkpoint, saved):
    (saved / ft.ADAPTER_WEIGHTS).write_bytes((1 << 40).to_bytes(8, "little") + b"{}")
    with pytest.raises(ft.AdapterError, match="not a valid safetensors file"):
        ft.load_adapter(load(tiny_checkpoint), saved)


# --------------------------------------------------------------------------- bad adapter values


@pytest.mark.parametrize(
    "alpha, phrase",
    [
        (float("nan"), "lora_alpha must be a finite number"),
        (float("inf"), "lora_alpha must be a finite number"),
        (1e308, "beyond the largest float32"),
    ],
)
def test_a_lora_alpha_that_is_not_a_usable_number_is_refused(tiny_checkpoint, saved, alpha, phrase):
    edit_config(saved, lora_alpha=alpha)
    model = load(tiny_checkpoint)
    state = copy.deepcopy(model.state_dict())
    with pytest.raises(ft.AdapterError, match=phrase) as info:
        ft.load_adapter(model, saved)
    assert "adapter_config.json" in str(info.value)
    assert untouched(model, state)


def test_nan_adapter_weights_are_refused_when_loading_and_saving(tiny_checkpoint, tmp_path):
    from safetensors.torch import load_file, save_file

    model = with_adapter(tiny_checkpoint)
    folder = ft.save_adapter(model, tmp_path / "adapter")
    tensors = load_file(str(folder / ft.ADAPTER_WEIGHTS))
    key = next(k for k in tensors if k.endswith("lora_B.weight"))
    tensors[key][0, 0] = float("nan")
    save_file(tensors, str(folder / ft.ADAPTER_WEIGHTS))
    fresh = load(tiny_checkpoint)
    with pytest.raises(ft.AdapterError, match="NaN or infinite"):
        ft.load_adapter(fresh, folder)
    assert not ft.lora_layers(fresh)
    with torch.no_grad():
        next(iter(ft.lora_layers(model).values())).lora_B.weight[0, 0] = float("inf")
    before = {p.name: p.read_bytes() for p in folder.iterdir()}
    with pytest.raises(ft.AdapterError, match="NaN or infinite.*nothing was written"):
        ft.save_adapter(model, folder)
    assert {p.name: p.read_bytes() for p in folder.iterdir()} == before


# --------------------------------------------------------------------------- the config checked before the model is touched


@pytest.mark.parametrize(
    "changes, phrase",
    [
        (dict(r=4.0), "r must be a whole number, got 4.0"),
        (dict(r=0), "r must be at least 1"),
        (dict(lora_alpha="8"), "lora_alpha must be a number, got '8'"),
        (dict(lora_dropout=1.5), "lora_dropout must be >= 0 and < 1, got 1.5"),
        (dict(target_modules=5), "target_modules must be a list of layer names"),
        (dict(target_modules="("), "target_modules '\\(' is not a valid regular expression"),
        (dict(rank_pattern={"c_attn": 2.5}), r"rank_pattern\['c_attn'\] must be a whole number"),
        (dict(alpha_pattern={"[": 2}), "alpha_pattern '\\[' is not a valid regular expression"),
        (dict(layers_to_transform="0"), "layers_to_transform must be a whole number"),
        (dict(exclude_modules=7), "exclude_modules must be a list"),
        (dict(use_dora=True), "use_dora=True"),
    ],
)
def test_every_value_of_adapter_config_is_checked_before_the_model_is_touched(
    tiny_checkpoint, saved, changes, phrase
):
    edit_config(saved, **changes)
    model = load(tiny_checkpoint)
    state = copy.deepcopy(model.state_dict())
    with pytest.raises(ft.AdapterError, match=phrase) as info:
        ft.load_adapter(model, saved)
    assert "adapter_config.json" in str(info.value)
    assert untouched(model, state)  # r=4.0 and lora_dropout=1.5 used to leave it frozen


def test_a_failure_while_adding_the_adapters_leaves_the_model_as_it_was(
    tiny_checkpoint, monkeypatch
):
    model = load(tiny_checkpoint)
    state = copy.deepcopy(model.state_dict())
    calls = []

    def fails_on_the_second_layer(model, names, rank, alpha, dropout=0.0):
        calls.append(names)
        if len(calls) == 2:
            raise RuntimeError("out of memory")
        return real(model, names, rank, alpha, dropout)

    real = ft.add_adapters
    monkeypatch.setattr(ft, "add_adapters", fails_on_the_second_layer)
    with pytest.raises(RuntimeError, match="out of memory"):
        ft.apply_lora(model, targets=("c_attn",))
    assert untouched(model, state)


def test_a_damaged_adapter_config_is_named(tiny_checkpoint, saved):
    (saved / ft.ADAPTER_CONFIG).write_bytes(b"[" * 100_000)
    with pytest.raises(ft.AdapterError, match="adapter_config.json' is not readable JSON"):
        ft.load_adapter(load(tiny_checkpoint), saved)
    (saved / ft.ADAPTER_CONFIG).write_bytes(b" " * (2 << 20))
    with pytest.raises(ft.AdapterError, match="is over 1024 KiB"):
        ft.load_adapter(load(tiny_checkpoint), saved)


# --------------------------------------------------------------------------- peft's layouts


def _peft_adapter(tiny_checkpoint, folder, **settings):
    peft = pytest.importorskip("peft")
    transformers = pytest.importorskip("transformers")
    hf = transformers.GPT2LMHeadModel.from_pretrained(str(tiny_checkpoint), dtype=torch.float32)
    config = peft.LoraConfig(
        r=4, lora_alpha=8, fan_in_fan_out=True, task_type="CAUSAL_LM", **settings
    )
    wrapped = peft.get_peft_model(hf, config)
    torch.manual_seed(0)
    with torch.no_grad():
        for name, p in wrapped.named_parameters():
            if "lora_B" in name:
                p.normal_(std=0.05)
    wrapped.eval().save_pretrained(str(folder))
    return wrapped


@pytest.mark.parametrize(
    "settings, adapted",
    [
        (
            dict(target_modules=["c_attn", "c_fc"], layers_to_transform=[1]),
            {"h.1.attn.c_attn", "h.1.mlp.c_fc"},
        ),
        (
            dict(target_modules=["c_attn", "c_proj"], layers_to_transform=0, layers_pattern="h"),
            {"h.0.attn.c_attn", "h.0.attn.c_proj", "h.0.mlp.c_proj"},
        ),
        (
            dict(target_modules=["c_attn", "c_proj"], exclude_modules=["mlp.c_proj"]),
            {"h.0.attn.c_attn", "h.1.attn.c_attn", "h.0.attn.c_proj", "h.1.attn.c_proj"},
        ),
        (dict(target_modules=r".*\.h\.1\.attn\.c_attn"), {"h.1.attn.c_attn"}),
    ],
    ids=["layers_to_transform", "layers_pattern", "exclude_modules", "regex"],
)
def test_an_adapter_peft_saved_with_layer_choices_loads_with_peft_s_logits(
    tiny_checkpoint, tmp_path, settings, adapted
):
    wrapped = _peft_adapter(tiny_checkpoint, tmp_path / "peft", **settings)
    ours = ft.load_adapter(load(tiny_checkpoint), tmp_path / "peft")
    assert set(ft.lora_layers(ours)) == adapted
    with torch.no_grad():
        assert (wrapped(IDS).logits - ours(IDS)).abs().max() < 1e-4


def test_weights_for_a_layer_the_config_does_not_adapt_are_refused(tiny_checkpoint, saved):
    edit_config(saved, layers_to_transform=[0])  # the weights cover layers 0 and 1
    with pytest.raises(ft.AdapterError, match="holds weights for h.1.attn.c_attn.*do not belong"):
        ft.load_adapter(load(tiny_checkpoint), saved)


# --------------------------------------------------------------------------- an adapter save is one unit


_KILL_BETWEEN_RENAMES = textwrap.dedent("""
    import os, sys, torch
    sys.path[:0] = sys.argv[3:5]  # this file's folder, and tests/ for what it imports
    from test_reliability_finetune import load, with_adapter
    from gpt2lib import finetune as ft
    tiny, folder = sys.argv[1], sys.argv[2]
    model = with_adapter(tiny, seed=2, rank=2, alpha=4, targets=("c_fc",))
    real_replace = os.replace
    def die_at_the_config(dst):
        if os.path.basename(str(dst)) == ft.ADAPTER_CONFIG and os.path.dirname(
            os.path.abspath(str(dst))) == os.path.abspath(folder):
            os._exit(9)  # as kill -9 would: the weights are in place, the config is not
    def replace(src, dst):
        die_at_the_config(dst)
        real_replace(src, dst)
    os.replace = replace
    ft.save_adapter(model, folder)
""")


def test_a_save_killed_between_the_two_files_leaves_one_whole_adapter(tiny_checkpoint, tmp_path):
    old = with_adapter(tiny_checkpoint, seed=1)  # rank 4 on c_attn
    folder = ft.save_adapter(old, tmp_path / "adapter")
    new = with_adapter(tiny_checkpoint, seed=2, rank=2, alpha=4, targets=("c_fc",))
    out = subprocess.run(
        [
            sys.executable,
            "-c",
            _KILL_BETWEEN_RENAMES,
            str(tiny_checkpoint),
            str(folder),
            str(Path(__file__).resolve().parent),
            str(REPO / "tests"),
        ],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert out.returncode == 9, out.stderr[-2000:]
    loaded = ft.load_adapter(load(tiny_checkpoint), folder)  # finishes the killed save
    with torch.no_grad():
        got = loaded(IDS)
        assert torch.allclose(got, new(IDS), atol=1e-6) or torch.allclose(got, old(IDS), atol=1e-6)
    assert sorted(p.name for p in folder.iterdir()) == [ft.ADAPTER_CONFIG, ft.ADAPTER_WEIGHTS]


# --------------------------------------------------------------------------- a run that diverges stops


def test_fine_tune_that_diverges_stops_naming_the_step_and_the_learning_rate(checkpoint_dir):
    rows = [([464, 2068, 7586, 13, 11], i % 3) for i in range(16)]
    torch.manual_seed(0)
    clf = ft.classifier(ft.apply_lora(load(checkpoint_dir), rank=8, alpha=16), 3)

    def loss(model, batch):
        return classification_loss(model, batch, 50256)

    with pytest.raises(
        FloatingPointError, match=r"at step \d+ \(learning rate 1e\+04\); training stopped"
    ):
        ft.fine_tune(clf, loss, rows, steps=4, batch_size=8, lr=1e4, progress=False)
    with pytest.raises(FloatingPointError, match="scores hold NaN"):
        ft.accuracy(clf, rows, 50256, progress=False)  # not the share of class 0


def test_fine_tune_checks_its_numbers_before_training():
    model = torch.nn.Linear(2, 1)

    def loss(model, batch):
        return model(torch.ones(1, 2)).sum()

    for kwargs, phrase in (
        (dict(lr=float("nan")), "lr must be a finite number"),
        (dict(lr=0), "lr must be > 0"),
        (dict(head_lr=-1.0), "head_lr must be > 0"),
        (dict(seed=-1), "seed must be at least 0"),
        (dict(steps=2.0), "steps must be a whole number"),
    ):
        before = copy.deepcopy(model.state_dict())
        with pytest.raises((TypeError, ValueError), match=phrase):
            ft.fine_tune(model, loss, [0, 1], **{"steps": 2, "progress": False, **kwargs})
        assert all(torch.equal(before[k], v) for k, v in model.state_dict().items())


def test_weights_that_are_no_longer_finite_after_the_last_step_are_named():
    model = torch.nn.Linear(1, 1, bias=False)

    def loss(model, batch):  # finite before the step; the step jumps to inf
        return (model.weight * 1e30).sum()

    with pytest.raises(FloatingPointError, match="weights became NaN or infinite.*at step 0"):
        ft.fine_tune(model, loss, [0], steps=1, batch_size=1, lr=1e300, progress=False)
    assert not math.isfinite(float(model.weight.detach()))


# --------------------------------------------------------------------------- empty splits


def test_an_empty_split_is_named_not_a_zero_division(tiny_checkpoint):
    data = ft.SpeakerData(speakers=["A", "B"], splits={"train": [("x", 0)], "val": [], "test": []})
    with pytest.raises(ValueError, match="the test split holds no speech"):
        data.majority_baseline("test")
    with pytest.raises(ValueError, match="the split is empty"):
        ft.mean_response_loss(load(tiny_checkpoint), [], 50256, progress=False)
    with pytest.raises(ValueError, match="the split is empty"):
        ft.accuracy(ft.classifier(load(tiny_checkpoint), 2), [], 50256, progress=False)


def _notebook_lora_class():
    """Chapter 10's LoRALinear as a learner's notebook defines it: the same code, in `__main__`."""
    import inspect

    from gpt2lib.chapters import tuning

    namespace = {**vars(tuning), "__name__": "__main__"}
    exec(inspect.getsource(tuning.LoRALinear), namespace)  # noqa: S102 - the course's own code
    return namespace["LoRALinear"]


def test_apply_lora_adds_the_learners_adapters_with_the_learners_function(tiny_checkpoint):
    mine = _notebook_lora_class()
    assert mine.__module__ == "__main__" and not issubclass(mine, ft.LoRALinear)
    calls = []

    def add_adapters(model, names, rank, alpha, dropout=0.0):
        calls.append(list(names))
        for name in names:
            model.set_submodule(name, mine(model.get_submodule(name), rank, alpha, dropout))
        return model

    model, reference = load(tiny_checkpoint).eval(), load(tiny_checkpoint).eval()
    ids = torch.randint(
        0, model.config.vocab_size, (2, 7), generator=torch.Generator().manual_seed(0)
    )
    ft.apply_lora(model, rank=2, alpha=4, targets=("c_attn",), add_adapters=add_adapters)
    layers = ft.lora_layers(model)
    assert len(calls) == len(layers) == model.config.n_layer
    assert all(type(layer) is mine for layer in layers.values())
    with torch.no_grad():  # B starts at zero: the model computes what it did
        assert torch.allclose(model(ids), reference(ids), atol=1e-6)
    trained = {n for n, p in model.named_parameters() if p.requires_grad}
    assert trained and all(".lora_" in n for n in trained)


def test_an_add_adapters_that_adds_nothing_is_refused_and_changes_nothing(tiny_checkpoint):
    model = load(tiny_checkpoint)
    state = copy.deepcopy(model.state_dict())

    def does_nothing(model, names, rank, alpha, dropout=0.0):
        return model

    with pytest.raises(ft.AdapterError, match="without a LoRALinear"):
        ft.apply_lora(model, targets=("c_attn",), add_adapters=does_nothing)
    assert untouched(model, state)
