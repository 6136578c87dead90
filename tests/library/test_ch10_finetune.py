"""Chapter 10: gpt2lib.finetune's entry points (LoRA, adapters in peft's layout, the data
sets); the checks of its exercises are tested in tests/graders/test_ch10_checks.py.

The chapter's trained numbers are asserted by the notebook itself at the tests' setting (nbval
runs solutions/10_finetuning), the LoRA-against-full comparison over two seeds included (LoRA
at least 90% of full fine-tuning's gain, full at least 10 points over the baseline): a test of
its own would train the same classifiers again, about 40 s. benchmarks/lora_gain.py repeats it
over more seeds and splits."""

from __future__ import annotations

import copy
import json

import pytest
import torch
from checkpoints import write_hub_checkpoint

from gpt2lib import finetune as ft
from gpt2lib.model import from_pretrained


def load(folder, dtype=torch.float32):
    return from_pretrained(folder, device="cpu", dtype=dtype).eval()


IDS = torch.tensor([[464, 2068, 7586, 21831, 18045, 625, 262, 16931, 3290, 13]])


def trained_adapter(model, seed=1):
    """Random adapter weights, so that the update is not zero."""
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for layer in ft.lora_layers(model).values():
            if isinstance(layer, ft.LoRAEmbedding):  # A starts at zero there, as in peft
                layer.lora_embedding_A.copy_(
                    0.05 * torch.randn(layer.lora_embedding_A.shape, generator=gen)
                )
                continue
            layer.lora_B.weight.copy_(0.05 * torch.randn(layer.lora_B.weight.shape, generator=gen))
    return model


# --------------------------------------------------------------------------- apply / merge


def test_apply_lora_starts_at_zero_freezes_the_rest_and_trains_under_two_percent(tiny_checkpoint):
    model = load(tiny_checkpoint)
    before = model(IDS)
    ft.apply_lora(model, rank=4, alpha=8, targets=("c_attn", "c_fc"))
    assert torch.equal(model(IDS), before)
    names = sorted(ft.lora_layers(model))
    assert names == ["h.0.attn.c_attn", "h.0.mlp.c_fc", "h.1.attn.c_attn", "h.1.mlp.c_fc"]
    trainable = {n for n, p in model.named_parameters() if p.requires_grad}
    assert trainable and all(".lora_A." in n or ".lora_B." in n for n in trainable)
    trained, total = ft.trainable_parameters(model)
    assert trained / total < 0.02


def test_an_adapter_on_the_token_table_starts_at_zero_and_the_readout_keeps_the_base_table(
    tiny_checkpoint,
):
    model = load(tiny_checkpoint)
    table, before = model.wte.weight, model(IDS)
    ft.apply_lora(model, rank=2, alpha=4, targets=("wte", "c_attn"))
    assert isinstance(model.wte, ft.LoRAEmbedding) and model.wte.weight is table
    assert model.wte.lora_embedding_A.shape == (2, 50257) and model.wte.lora_embedding_B.shape == (
        64,
        2,
    )
    assert not model.wte.lora_embedding_A.any()  # peft's start: A zero, B normal
    assert torch.equal(model(IDS), before)
    trained_adapter(model)
    with torch.no_grad():
        embedded = model.wte(IDS)
        update = model.wte.lora_embedding_A.T[IDS] @ model.wte.lora_embedding_B.T * 2.0
        assert torch.allclose(embedded, table[IDS] + update, atol=1e-6)
    trainable = {n for n, p in model.named_parameters() if p.requires_grad}
    assert {"wte.lora_embedding_A", "wte.lora_embedding_B"} <= trainable
    assert not table.requires_grad and all("lora" in n for n in trainable)


def test_merge_refuses_an_adapter_on_the_tied_token_table_before_merging_anything(tiny_checkpoint):
    model = trained_adapter(
        ft.apply_lora(load(tiny_checkpoint), rank=2, alpha=4, targets=("wte", "c_attn"))
    )
    with torch.no_grad():
        before = model(IDS)
    with pytest.raises(ft.AdapterError, match="the readout is tied to the token table"):
        ft.merge_lora(model)
    assert sorted(ft.lora_layers(model)) == ["h.0.attn.c_attn", "h.1.attn.c_attn", "wte"]
    with torch.no_grad():
        assert torch.equal(model(IDS), before)


def test_a_full_dotted_name_targets_one_layer_and_transformers_names_are_refused(tiny_checkpoint):
    model = ft.apply_lora(load(tiny_checkpoint), targets=("h.1.mlp.c_fc",))
    assert list(ft.lora_layers(model)) == ["h.1.mlp.c_fc"]
    with pytest.raises(ft.AdapterError, match="no 'transformer.' prefix"):
        ft.apply_lora(load(tiny_checkpoint), targets=("transformer.h.1.mlp.c_fc",))


@pytest.mark.parametrize(
    "kwargs, message",
    [
        (dict(targets=("q_proj",)), "no layer of the model is called 'q_proj'"),
        (dict(rank=0), "rank must be at least 1"),
        (dict(rank=65), r"rank 65 is above the width of h.0.attn.c_attn \(64 -> 192\)"),
        (
            dict(rank=65, targets=("wte",)),
            r"rank 65 is above the width of wte \(50257 rows of width 64\)",
        ),
        (
            dict(targets=("wte", "ln_f")),
            "no layer of the model is called 'ln_f'.* end in c_attn, c_fc, c_proj, wpe, wte",
        ),
        (dict(rank=2.5), "rank must be a whole number"),
        (dict(alpha=0), "alpha must be > 0, got 0"),
        (dict(alpha=float("inf")), "alpha must be a finite number"),
        (dict(dropout=1.0), r"dropout must be >= 0 and < 1, got 1 \(a probability"),
        (
            dict(rank_pattern={"c_fc": 2}),
            "rank_pattern names 'c_fc', which is none of the adapted layers",
        ),
        (dict(rank_pattern={"c_attn": 0}), "rank must be at least 1"),
        (dict(alpha_pattern={"c_attn": -1}), "alpha must be > 0, got -1"),
        (dict(rank_pattern=[2]), r"rank_pattern must be a dict \{target: value\}"),
        (
            dict(rank_pattern={"wte": 65}, targets=("wte", "c_attn")),
            "rank 65 is above the width of wte",
        ),
    ],
)
def test_apply_lora_refuses_bad_input_before_changing_anything(tiny_checkpoint, kwargs, message):
    model = load(tiny_checkpoint)
    state = copy.deepcopy(model.state_dict())
    with pytest.raises((ValueError, TypeError), match=message):
        ft.apply_lora(model, **kwargs)
    assert not ft.lora_layers(model)
    assert all(p.requires_grad for p in model.parameters())
    assert all(torch.equal(state[k], v) for k, v in model.state_dict().items())


def test_apply_lora_twice_is_refused(tiny_checkpoint):
    model = ft.apply_lora(load(tiny_checkpoint))
    with pytest.raises(ft.AdapterError, match="already has LoRA adapters"):
        ft.apply_lora(model)


def test_merge_gives_the_adapters_logits_in_float64_and_the_plain_names(tiny_checkpoint):
    plain = load(tiny_checkpoint).double()
    model = trained_adapter(
        ft.apply_lora(copy.deepcopy(plain), rank=4, alpha=8, targets=("c_attn", "c_proj", "c_fc"))
    )
    with torch.no_grad():
        unmerged = model(IDS)
        assert (unmerged - plain(IDS)).abs().max() > 1e-3  # the adapter does something
        ft.merge_lora(model)
        assert (model(IDS) - unmerged).abs().max() < 1e-5
    assert list(dict(model.named_parameters())) == list(dict(plain.named_parameters()))
    assert not ft.lora_layers(model)


def test_the_adapters_dropout_acts_in_training_mode_only(tiny_checkpoint):
    model = trained_adapter(ft.apply_lora(load(tiny_checkpoint), dropout=0.5))
    model.eval()
    with torch.no_grad():
        assert torch.equal(model(IDS), model(IDS))
        model.train()
        torch.manual_seed(0)
        first = model(IDS)
        torch.manual_seed(1)
        assert not torch.equal(first, model(IDS))


# --------------------------------------------------------------------------- adapter files


def test_save_and_load_adapter_round_trip_creates_the_folder(tiny_checkpoint, tmp_path):
    model = trained_adapter(
        ft.apply_lora(load(tiny_checkpoint), rank=4, alpha=8, targets=("c_attn", "c_proj"))
    )
    folder = ft.save_adapter(model, tmp_path / "new" / "adapter")
    config = json.loads((folder / "adapter_config.json").read_text(encoding="utf-8"))
    assert config["r"] == 4 and config["lora_alpha"] == 8 and config["fan_in_fan_out"] is True
    other = ft.load_adapter(load(tiny_checkpoint), folder)
    with torch.no_grad():
        assert torch.allclose(other(IDS), model(IDS), atol=1e-6)
    assert sorted(ft.lora_layers(other)) == sorted(ft.lora_layers(model))


def test_an_adapter_on_the_token_table_round_trips(tiny_checkpoint, tmp_path):
    model = trained_adapter(
        ft.apply_lora(load(tiny_checkpoint), rank=2, alpha=4, targets=("wte", "c_fc"))
    )
    folder = ft.save_adapter(model, tmp_path / "adapter")
    config = json.loads((folder / "adapter_config.json").read_text(encoding="utf-8"))
    assert config["target_modules"] == ["c_fc", "wte"] and config["r"] == 2
    from safetensors import safe_open

    with safe_open(str(folder / "adapter_model.safetensors"), framework="pt") as handle:
        keys = set(handle.keys())
    assert {
        "base_model.model.transformer.wte.lora_embedding_A",
        "base_model.model.transformer.wte.lora_embedding_B",
    } <= keys
    other = ft.load_adapter(load(tiny_checkpoint), folder)
    assert isinstance(other.wte, ft.LoRAEmbedding)
    with torch.no_grad():
        assert torch.equal(other(IDS), model(IDS))


def test_a_table_adapter_for_another_width_is_refused_and_nothing_is_loaded(
    tiny_checkpoint, tmp_path
):
    adapter = ft.save_adapter(
        trained_adapter(ft.apply_lora(load(tiny_checkpoint), rank=2, alpha=4, targets=("wte",))),
        tmp_path / "adapter",
    )
    other = load(
        write_hub_checkpoint(tmp_path / "other", n_positions=64, n_layer=2, n_head=4, n_embd=32)
    )
    with pytest.raises(
        ft.AdapterError, match=r"wte.lora_embedding_B has shape \(64, 2\).*needs \(32, 2\)"
    ):
        ft.load_adapter(other, adapter)
    assert not ft.lora_layers(other)


@pytest.mark.parametrize(
    "sizes, phrase",
    [
        (
            dict(n_layer=2, n_head=4, n_embd=32),
            "does not fit this model: h.0.attn.c_attn.lora_A has shape",
        ),
        (dict(n_layer=3, n_head=4, n_embd=64), "holds no weights for them"),
        (dict(n_layer=1, n_head=4, n_embd=64), "which this model does not have"),
    ],
)
def test_an_adapter_for_another_base_is_refused_and_nothing_is_loaded(
    tiny_checkpoint, tmp_path, sizes, phrase
):
    adapter = ft.save_adapter(
        trained_adapter(ft.apply_lora(load(tiny_checkpoint))), tmp_path / "adapter"
    )
    other = load(write_hub_checkpoint(tmp_path / "other", n_positions=64, **sizes))
    before = copy.deepcopy(other.state_dict())
    with pytest.raises(ft.AdapterError, match=phrase):
        ft.load_adapter(other, adapter)
    assert not ft.lora_layers(other)
    assert all(torch.equal(before[k], v) for k, v in other.state_dict().items())


def test_a_folder_without_an_adapter_is_named(tiny_checkpoint, tmp_path):
    with pytest.raises(
        ft.AdapterError, match="does not hold adapter_config.json and adapter_model"
    ):
        ft.load_adapter(load(tiny_checkpoint), tmp_path)


@pytest.mark.parametrize(
    "patterns, saved",
    [
        (
            dict(rank_pattern={"wte": 2}, alpha_pattern={"c_fc": 16}),
            dict(r=4, lora_alpha=8, rank_pattern={"wte": 2}, alpha_pattern={"c_fc": 16}),
        ),
        (
            dict(rank_pattern={"h.1.mlp.c_fc": 1}),
            dict(r=4, lora_alpha=8, rank_pattern={r"h\.1\.mlp\.c_fc": 1}, alpha_pattern={}),
        ),
    ],
)
def test_per_target_ranks_and_alphas_save_as_peft_patterns_and_load_back(
    tiny_checkpoint, tmp_path, patterns, saved
):
    model = trained_adapter(
        ft.apply_lora(
            load(tiny_checkpoint), rank=4, alpha=8, targets=("wte", "c_attn", "c_fc"), **patterns
        )
    )
    layers = ft.lora_layers(model)
    for name, layer in layers.items():
        want = next(
            (
                v
                for t, v in patterns.get("rank_pattern", {}).items()
                if name == t or name.endswith("." + t)
            ),
            4,
        )
        assert layer.rank == want
    assert layers["h.0.mlp.c_fc"].scale == patterns.get("alpha_pattern", {}).get("c_fc", 8) / 4
    folder = ft.save_adapter(model, tmp_path / "adapter")
    config = json.loads((folder / "adapter_config.json").read_text(encoding="utf-8"))
    assert {k: config[k] for k in saved} == saved
    other = ft.load_adapter(load(tiny_checkpoint), folder)
    assert {n: (m.rank, m.alpha) for n, m in ft.lora_layers(other).items()} == {
        n: (m.rank, m.alpha) for n, m in layers.items()
    }
    with torch.no_grad():
        assert torch.equal(other(IDS), model(IDS))
    peft, transformers = _peft()
    hf = transformers.GPT2LMHeadModel.from_pretrained(str(tiny_checkpoint), dtype=torch.float32)
    theirs = peft.PeftModel.from_pretrained(hf, str(folder)).eval()
    with torch.no_grad():
        assert (theirs(IDS).logits - model(IDS)).abs().max() < 1e-4


def _peft():
    peft = pytest.importorskip("peft")
    transformers = pytest.importorskip("transformers")
    return peft, transformers


def test_peft_loads_a_gpt2lib_adapter_onto_transformers_gpt2_with_the_same_logits(
    tiny_checkpoint, tmp_path
):
    peft, transformers = _peft()
    model = trained_adapter(
        ft.apply_lora(load(tiny_checkpoint), rank=4, alpha=8, targets=("c_attn", "c_proj", "c_fc"))
    )
    adapter = ft.save_adapter(model, tmp_path / "adapter")
    hf = transformers.GPT2LMHeadModel.from_pretrained(str(tiny_checkpoint), dtype=torch.float32)
    theirs = peft.PeftModel.from_pretrained(hf, str(adapter)).eval()
    with torch.no_grad():
        assert (theirs(IDS).logits - model(IDS)).abs().max() < 1e-4


def test_peft_loads_a_gpt2lib_adapter_on_the_token_table_with_the_same_logits(
    tiny_checkpoint, tmp_path
):
    peft, transformers = _peft()
    model = trained_adapter(
        ft.apply_lora(
            load(tiny_checkpoint), rank=2, alpha=4, targets=("wte", "c_attn", "c_proj", "c_fc")
        )
    )
    adapter = ft.save_adapter(model, tmp_path / "adapter")
    hf = transformers.GPT2LMHeadModel.from_pretrained(str(tiny_checkpoint), dtype=torch.float32)
    theirs = peft.PeftModel.from_pretrained(hf, str(adapter)).eval()
    assert isinstance(theirs.base_model.model.transformer.wte, peft.tuners.lora.Embedding)
    with torch.no_grad():
        assert (theirs(IDS).logits - model(IDS)).abs().max() < 1e-4


@pytest.mark.parametrize(
    "targets, patterns",
    [
        (["c_attn", "c_fc"], {}),
        (["wte", "c_attn", "c_proj"], {}),
        (["wte", "c_attn", "c_proj"], dict(rank_pattern={"wte": 2}, alpha_pattern={"c_proj": 2})),
    ],
)
def test_a_peft_adapter_loads_into_gpt2lib_with_the_same_logits(
    tiny_checkpoint, tmp_path, targets, patterns
):
    peft, transformers = _peft()
    hf = transformers.GPT2LMHeadModel.from_pretrained(str(tiny_checkpoint), dtype=torch.float32)
    config = peft.LoraConfig(
        r=4,
        lora_alpha=8,
        target_modules=targets,
        fan_in_fan_out=True,
        task_type="CAUSAL_LM",
        **patterns,
    )
    wrapped = peft.get_peft_model(hf, config)
    torch.manual_seed(0)
    with torch.no_grad():
        for name, p in wrapped.named_parameters():
            if "lora_B" in name or "lora_embedding_A" in name:  # the parts that start at zero
                p.normal_(std=0.05)
    wrapped.eval()
    wrapped.save_pretrained(str(tmp_path / "peft_adapter"))
    ours = ft.load_adapter(load(tiny_checkpoint), tmp_path / "peft_adapter")
    assert len(ft.lora_layers(ours)) == {2: 4, 3: 7}[len(targets)]
    assert ft.lora_layers(ours)["h.0.attn.c_attn"].rank == 4
    assert (
        ours.wte.rank == patterns.get("rank_pattern", {}).get("wte", 4)
        if "wte" in targets
        else True
    )
    with torch.no_grad():
        assert (wrapped(IDS).logits - ours(IDS)).abs().max() < 1e-4


# --------------------------------------------------------------------------- data, classifier


def test_the_data_sets_are_fixed_and_the_baseline_is_the_majority_share():
    first, again = ft.speaker_dataset(), ft.speaker_dataset()
    assert first == again and len(first.speakers) == 8
    train = first.splits["train"]
    sizes = {split: len(rows) for split, rows in first.splits.items()}
    assert sizes == {
        "train": 799,
        "val": 237,
        "test": 252,
    }  # 60/20/20: one test speech is 0.4 points
    test_labels = [y for _, y in first.splits["test"]]
    majority = max(range(8), key=[y for _, y in train].count)
    assert first.majority_baseline("test") == test_labels.count(majority) / len(test_labels)
    replies = ft.reply_dataset()
    assert all(p.speaker != p.replier for p in replies["val"])
    assert replies["train"][0].prompt.endswith("### Response:\n")


def test_a_class_count_that_does_not_match_the_head_is_refused(tiny_checkpoint):
    clf = ft.classifier(load(tiny_checkpoint), 4)
    rows = [([464, 2068], 0), ([13], 5)]
    with pytest.raises(ValueError, match="label 5 does not fit the classifier's head of 4"):
        ft.accuracy(clf, rows, 50256, progress=False)
    with pytest.raises(
        ValueError, match="the data set has 8 classes but the classifier's head has 4"
    ):
        ft.accuracy(clf, rows[:1], 50256, n_classes=8, progress=False)
    with pytest.raises(ValueError, match="n_classes must be at least 2, got 1"):
        ft.classifier(load(tiny_checkpoint), 1)


def test_the_chapter_names_a_hub_snapshot_of_openais_weights_by_the_models_name(tmp_path):
    import json

    snapshot = tmp_path / "snapshots" / "607a30d783dfa663caf39e06633721c8d4cfcd7e"
    snapshot.mkdir(parents=True)
    (snapshot / "config.json").write_text(
        json.dumps({"n_layer": 24, "n_head": 16, "n_embd": 1024, "vocab_size": 50257}),
        encoding="utf-8",
    )
    assert ft.model_name(snapshot) == "gpt2-medium"
    assert ft.model_name("gpt2") == "gpt2"
    (snapshot / "config.json").write_text(
        json.dumps({"n_layer": 4, "n_head": 4, "n_embd": 128, "vocab_size": 50257}),
        encoding="utf-8",
    )
    assert ft.model_name(snapshot) == snapshot.name
