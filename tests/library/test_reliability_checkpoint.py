"""Loading: the offline model pickers name a damaged config.json, a config whose
n_layer does not fit its weights is refused before a model is built, sizes past any GPT-2 are
refused at once, the offline error says what GPT2LIB_CHECKPOINT does, a tiny top_p works."""

from __future__ import annotations

import json

import pytest
from checkpoints import write_hub_checkpoint

from gpt2lib import checkpoint
from gpt2lib.checkpoint import CheckpointError, HubUnreachable
from gpt2lib.model import from_pretrained

SMALL = dict(n_layer=2, n_head=2, n_embd=16, n_positions=32, vocab_size=101)


def test_a_damaged_circuits_config_is_named_by_the_picker(tmp_path, monkeypatch):
    from gpt2lib.course import models

    small = write_hub_checkpoint(tmp_path / "small", **SMALL)
    circuits = write_hub_checkpoint(tmp_path / "circuits", **SMALL)
    (circuits / "config.json").write_text('{"n_layer": 2,', encoding="utf-8")
    monkeypatch.setattr(models, "CIRCUITS", circuits)
    for verbose in (True, False):
        with pytest.raises(CheckpointError, match="circuits/config.json' is not a readable JSON"):
            models.circuits_checkpoint(str(small), verbose=verbose)


def test_a_damaged_config_named_by_gpt2lib_checkpoint_is_named(tmp_path, monkeypatch):
    from gpt2lib.course import models

    folder = write_hub_checkpoint(tmp_path / "mine", **SMALL)
    (folder / "config.json").write_bytes(b"\xff\xfe not json")
    monkeypatch.setenv("GPT2LIB_CHECKPOINT", str(folder))
    with pytest.raises(CheckpointError, match="mine/config.json' is not a readable JSON"):
        models.chapter_checkpoint()


def test_a_config_with_more_layers_than_its_weights_is_refused_before_building(tmp_path):
    folder = write_hub_checkpoint(tmp_path, **SMALL)
    config = json.loads((folder / "config.json").read_text(encoding="utf-8"))
    config["n_layer"] = 4096
    (folder / "config.json").write_text(json.dumps(config), encoding="utf-8")
    built = []

    def model_cls(config):  # records every model the loader builds, even on meta
        built.append(config.n_layer)
        from gpt2lib.chapters.model import GPT2

        return GPT2(config)

    with pytest.raises(
        CheckpointError, match=r"n_layer=4096.*2 block\(s\); missing keys: h\.2\.\*"
    ):
        checkpoint.load_pretrained(folder, device="cpu", model_cls=model_cls)
    assert built == []


@pytest.mark.parametrize(
    "field, value", [("n_embd", 2**31), ("n_layer", 2**31), ("vocab_size", 2**40)]
)
def test_sizes_past_any_gpt2_are_refused_at_once(tmp_path, field, value):
    folder = write_hub_checkpoint(tmp_path, **SMALL)
    config = json.loads((folder / "config.json").read_text(encoding="utf-8"))
    config[field] = value
    (folder / "config.json").write_text(json.dumps(config), encoding="utf-8")
    with pytest.raises(CheckpointError, match=f"{field} must be at most"):
        from_pretrained(folder, device="cpu")


def test_the_offline_error_says_what_gpt2lib_checkpoint_changes():
    message = str(HubUnreachable("gpt2", "offline mode: HF_HUB_OFFLINE=1", offline=True))
    if checkpoint.standin_folder() is None:
        pytest.skip("no stand-in in this checkout")
    assert "'gpt2' always means OpenAI's model" in message
    assert "changes only what the chapters' loading cells" in message


def test_a_top_p_too_small_for_float32_keeps_the_top_token(checkpoint_dir, capsys):
    from gpt2lib.cli import main

    code = main(
        [
            "generate",
            "--model",
            str(checkpoint_dir),
            "--prompt",
            "Hello",
            "--top-p",
            "1e-50",
            "--max-new-tokens",
            "3",
            "--seed",
            "0",
            "--device",
            "cpu",
        ]
    )
    out = capsys.readouterr()
    assert code == 0, out.err
    greedy = main(
        [
            "generate",
            "--model",
            str(checkpoint_dir),
            "--prompt",
            "Hello",
            "--temperature",
            "0",
            "--max-new-tokens",
            "3",
            "--device",
            "cpu",
        ]
    )
    assert greedy == 0 and capsys.readouterr().out == out.out  # only the top token survives
