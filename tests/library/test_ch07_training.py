"""Chapter 7's package contract: gpt2lib.training (loss, batches, schedule, loop, saving)."""

import json
import math
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F

from gpt2lib.chapters.training import decay_groups, estimate_loss
from gpt2lib.checkpoint import save_pretrained
from gpt2lib.model import from_pretrained
from gpt2lib.training import get_batch, lm_loss, lr_schedule, ngram_baselines, sample, train

ROOT = Path(__file__).resolve().parents[2]


# The model these tests train, sample and save is the shared tiny one (tests/conftest.py) with
# the sizes the numbers below count on: 61 token ids (repeating_ids draws from them, log 61 is
# the uniform loss, 61 is out of range) and a context of 32 (block_size=33 is refused).
SIZES = dict(n_positions=32, vocab_size=61)


def perturbed(model, seed=1):
    """Gains and biases away from 1 and 0, so that a dropped tensor changes the logits."""
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in model.parameters():
            p.add_(0.05 * torch.randn(p.shape, generator=gen))
    return model


def repeating_ids(n=600, vocab=61, seed=0):
    """A learnable text: a fixed random sequence of 20 ids, repeated."""
    gen = torch.Generator().manual_seed(seed)
    return torch.randint(0, vocab, (20,), generator=gen).repeat(n // 20 + 1)[:n]


# --------------------------------------------------------------------------- lm_loss


@pytest.mark.parametrize("shape", [(2, 5, 11), (1, 1, 3), (4, 3, 50257)])
def test_lm_loss_equals_cross_entropy(shape):
    gen = torch.Generator().manual_seed(0)
    logits = 4 * torch.randn(shape, generator=gen)
    targets = torch.randint(0, shape[-1], shape[:2], generator=gen)
    want = F.cross_entropy(logits.flatten(0, 1), targets.flatten())
    assert abs(float(lm_loss(logits, targets)) - float(want)) < 1e-5


def test_lm_loss_of_uniform_logits_is_log_vocab():
    assert math.isclose(
        float(lm_loss(torch.zeros(2, 3, 50257), torch.zeros(2, 3, dtype=torch.long))),
        math.log(50257),
        rel_tol=1e-6,
    )


def test_lm_loss_passes_gradients():
    logits = torch.randn(2, 3, 5, requires_grad=True)
    lm_loss(logits, torch.zeros(2, 3, dtype=torch.long)).backward()
    assert logits.grad is not None and logits.grad.abs().sum() > 0


@pytest.mark.parametrize("targets_shape", [(2, 4), (3, 5), (10,), (2, 5, 1)])
def test_lm_loss_refuses_targets_of_the_wrong_shape(targets_shape):
    with pytest.raises(ValueError, match=r"targets must have shape \(B, T\) = \(2, 5\)"):
        lm_loss(torch.randn(2, 5, 7), torch.zeros(targets_shape, dtype=torch.long))


def test_lm_loss_refuses_flat_logits():
    with pytest.raises(ValueError, match=r"logits must be a tensor of shape \(B, T, V\)"):
        lm_loss(torch.randn(10, 7), torch.zeros(10, dtype=torch.long))


# --------------------------------------------------------------------------- get_batch


def test_get_batch_windows_and_shift():
    ids = torch.arange(1000, 1100)
    x, y = get_batch(ids, 16, 7, generator=torch.Generator().manual_seed(0))
    assert x.shape == y.shape == (16, 7) and x.dtype == torch.long
    starts = x[:, 0] - 1000
    for row, s in zip(range(16), starts.tolist()):
        assert torch.equal(x[row], ids[s : s + 7]) and torch.equal(y[row], ids[s + 1 : s + 8])


def test_get_batch_is_repeatable_with_a_seed_and_reaches_the_last_token():
    ids = torch.arange(9)
    a = get_batch(ids, 50, 4, generator=torch.Generator().manual_seed(3))
    b = get_batch(ids, 50, 4, generator=torch.Generator().manual_seed(3))
    assert torch.equal(a[0], b[0]) and torch.equal(a[1], b[1])
    assert int(a[1].max()) == 8  # the last token is a target in some window
    assert set(a[0][:, 0].tolist()) == set(range(5))  # every start 0 .. N - T - 1


def test_get_batch_moves_to_the_device():
    x, y = get_batch(torch.arange(50), 2, 3, device="meta")
    assert x.is_meta and y.is_meta


@pytest.mark.parametrize("n_ids,block_size", [(5, 5), (1, 1), (0, 3)])
def test_get_batch_refuses_ids_shorter_than_block_size_plus_one(n_ids, block_size):
    with pytest.raises(ValueError, match=rf"needs block_size \+ 1 = {block_size + 1} tokens"):
        get_batch(torch.arange(n_ids), 2, block_size)


@pytest.mark.parametrize("batch_size", [0, -3])
def test_get_batch_refuses_batch_size_below_one(batch_size):
    with pytest.raises(ValueError, match="batch_size must be at least 1"):
        get_batch(torch.arange(50), batch_size, 4)


@pytest.mark.parametrize("bad,error", [(2.5, TypeError), (True, TypeError), (0, ValueError)])
def test_get_batch_refuses_a_bad_block_size(bad, error):
    with pytest.raises(error, match="block_size"):
        get_batch(torch.arange(50), 2, bad)


@pytest.mark.parametrize(
    "ids", [torch.zeros(3, 10, dtype=torch.long), [1, 2, 3, 4], torch.rand(20)]
)
def test_get_batch_refuses_ids_that_are_not_a_1d_id_tensor(ids):
    with pytest.raises((ValueError, TypeError), match="ids must"):
        get_batch(ids, 2, 3)


# --------------------------------------------------------------------------- lr_schedule


def test_lr_schedule_warms_up_then_follows_a_cosine_to_the_floor():
    kw = {"max_lr": 1e-3, "warmup_steps": 10, "total_steps": 110, "min_lr": 1e-4}
    rates = [lr_schedule(s, **kw) for s in range(130)]
    assert math.isclose(rates[0], 1e-4) and math.isclose(rates[9], 1e-3)  # near 0 -> max_lr
    assert all(a < b for a, b in zip(rates[:9], rates[1:10]))  # linear rise
    assert math.isclose(rates[10], 1e-3)  # the cosine starts at max_lr
    assert math.isclose(rates[60], 0.5 * (1e-3 + 1e-4))  # halfway: the mean of the two ends
    assert all(a >= b for a, b in zip(rates[10:110], rates[11:111]))  # never rises again
    assert all(math.isclose(r, 1e-4) for r in rates[110:])  # min_lr at total_steps and after
    assert all(isinstance(r, float) for r in rates)


def test_lr_schedule_without_warmup_starts_at_max_lr():
    assert lr_schedule(0, 1.0, 0, 10, 0.1) == 1.0


@pytest.mark.parametrize(
    "kwargs,match",
    [
        ({"step": -1}, "step must be at least 0"),
        ({"min_lr": 2.0}, "min_lr <= max_lr"),
        ({"warmup_steps": 1.5}, "warmup_steps must be a whole number"),
    ],
)
def test_lr_schedule_refuses_bad_arguments(kwargs, match):
    args = {"step": 0, "max_lr": 1.0, "warmup_steps": 2, "total_steps": 10, "min_lr": 0.1, **kwargs}
    with pytest.raises((ValueError, TypeError), match=match):
        lr_schedule(**args)


# --------------------------------------------------------------------------- optimizer groups


def test_decay_groups_split_by_dimension_and_cover_every_parameter(tiny_model):
    model = tiny_model(**SIZES)
    decay, no_decay = decay_groups(model, 0.1)
    assert decay["weight_decay"] == 0.1 and no_decay["weight_decay"] == 0.0
    assert all(p.dim() == 2 for p in decay["params"]) and all(
        p.dim() == 1 for p in no_decay["params"]
    )
    ids = [id(p) for p in decay["params"] + no_decay["params"]]
    assert sorted(ids) == sorted(id(p) for p in model.parameters())


# --------------------------------------------------------------------------- sample


def test_sample_greedy_crops_to_the_context_and_restores_train_mode(tiny_model):
    model = tiny_model(n_positions=8, vocab_size=61).train()
    prompt = torch.randint(0, 61, (2, 6), generator=torch.Generator().manual_seed(0))
    out = sample(model, prompt, 10, temperature=0)
    assert out.shape == (2, 16) and torch.equal(out[:, :6], prompt)
    assert model.training  # put back as it was
    with torch.no_grad():  # the last token is the argmax given the last 8 tokens
        want = model.eval()(out[:, -9:-1])[:, -1].argmax(-1)
    assert torch.equal(out[:, -1], want)


def test_sample_is_seeded(tiny_model):
    model = tiny_model(**SIZES)
    prompt = torch.zeros(1, 3, dtype=torch.long)
    a = sample(model, prompt, 8, temperature=1.0, generator=torch.Generator().manual_seed(1))
    b = sample(model, prompt, 8, temperature=1.0, generator=torch.Generator().manual_seed(1))
    assert torch.equal(a, b)


@pytest.mark.parametrize(
    "kwargs,match",
    [
        ({"temperature": -1.0}, "temperature must be >= 0"),
        ({"max_new_tokens": -2}, "max_new_tokens"),
    ],
)
def test_sample_refuses_bad_arguments(kwargs, match, tiny_model):
    args = {"max_new_tokens": 2, **kwargs}
    with pytest.raises(ValueError, match=match):
        sample(tiny_model(**SIZES), torch.zeros(1, 2, dtype=torch.long), **args)


# --------------------------------------------------------------------------- baselines


def test_ngram_baselines_on_a_text_where_the_next_token_is_determined():
    ids = torch.tensor([0, 1, 2, 3] * 50)
    out = ngram_baselines(ids[:160], ids[160:], vocab_size=4, smoothing=0.0, bigram_weight=1.0)
    assert math.isclose(out["unigram"], math.log(4), rel_tol=1e-9)  # all four equally often
    assert out["bigram"] < 1e-9  # the previous token decides the next: no surprise
    assert math.isclose(out["uniform"], math.log(4))


def test_ngram_baselines_match_a_direct_count():
    gen = torch.Generator().manual_seed(0)
    train_ids, val_ids = (
        torch.randint(0, 6, (300,), generator=gen),
        torch.randint(0, 6, (80,), generator=gen),
    )
    got = ngram_baselines(train_ids, val_ids, vocab_size=7, smoothing=0.5, bigram_weight=0.6)
    counts = torch.zeros(7, 7, dtype=torch.double)
    for a, b in zip(train_ids[:-1].tolist(), train_ids[1:].tolist()):
        counts[a, b] += 1
    uni = (torch.bincount(train_ids, minlength=7).double() + 0.5) / (300 + 0.5 * 7)
    bi = counts / counts.sum(1, keepdim=True).clamp(min=1)
    p = 0.6 * bi[val_ids[:-1], val_ids[1:]] + 0.4 * uni[val_ids[1:]]
    assert math.isclose(got["bigram"], float(-p.log().mean()), rel_tol=1e-9)
    assert math.isclose(got["unigram"], float(-uni[val_ids].log().mean()), rel_tol=1e-9)


# --------------------------------------------------------------------------- train


def test_train_learns_a_repeating_text_and_records_its_history(tiny_model):
    model = tiny_model(**SIZES).train()  # train() hands it back in eval mode
    ids = repeating_ids()
    history = train(
        model,
        ids[:500],
        ids[500:],
        60,
        batch_size=4,
        block_size=16,
        max_lr=1e-2,
        eval_every=20,
        eval_batches=2,
        progress=False,
    )
    assert len(history.train_loss) == len(history.step) == len(history.lr) == 60
    assert history.eval_step == [20, 40, 60]
    assert history.eval_val_loss[-1] < history.eval_val_loss[0] - 1.0
    assert history.train_loss[0] > math.log(61) - 0.5  # starts near uniform
    assert history.val_loss == history.eval_val_loss[-1]
    assert not model.training


def test_train_is_repeatable_with_a_seed(tiny_model):
    ids = repeating_ids()
    runs = []
    for _ in range(2):
        model = tiny_model(seed=3, pdrop=0.1, **SIZES)
        runs.append(
            train(
                model,
                ids[:500],
                ids[500:],
                8,
                batch_size=2,
                block_size=8,
                eval_every=4,
                eval_batches=1,
                seed=7,
                progress=False,
            )
        )
    assert runs[0].train_loss == runs[1].train_loss
    assert runs[0].eval_val_loss == runs[1].eval_val_loss


def test_train_calls_on_eval_with_the_history(tiny_model):
    seen = []
    ids = repeating_ids()
    train(
        tiny_model(**SIZES),
        ids[:500],
        ids[500:],
        6,
        batch_size=2,
        block_size=8,
        eval_every=3,
        eval_batches=1,
        progress=False,
        on_eval=lambda h, m: seen.append(h.eval_step[-1]),
    )
    assert seen == [3, 6]


def test_train_with_zero_steps_only_evaluates(tiny_model):
    ids = repeating_ids()
    model = tiny_model(**SIZES)
    before = [p.clone() for p in model.parameters()]
    history = train(model, ids[:500], ids[500:], 0, batch_size=2, block_size=8, progress=False)
    assert history.train_loss == [] and len(history.eval_val_loss) == 1
    assert all(torch.equal(a, b) for a, b in zip(before, model.parameters()))


@pytest.mark.parametrize(
    "kwargs,error,match",
    [
        ({"steps": -1}, ValueError, "steps must be at least 0"),
        ({"batch_size": 0}, ValueError, "batch_size must be at least 1"),
        ({"block_size": 33}, ValueError, r"block_size=33 is longer than the model's context of 32"),
        ({"steps": 2.0}, TypeError, "steps must be a whole number"),
    ],
)
def test_train_refuses_bad_settings(kwargs, error, match, tiny_model):
    ids = repeating_ids()
    args = {"steps": 2, "batch_size": 2, "block_size": 8, **kwargs}
    with pytest.raises(error, match=match):
        train(tiny_model(**SIZES), ids[:500], ids[500:], progress=False, **args)


def test_train_refuses_a_validation_text_shorter_than_a_window(tiny_model):
    ids = repeating_ids()
    with pytest.raises(
        ValueError, match=r"val_ids holds 8 tokens, fewer than block_size \+ 1 = 17"
    ):
        train(tiny_model(**SIZES), ids, ids[:8], 2, batch_size=2, block_size=16, progress=False)


def test_train_stops_on_a_nan_loss_and_names_the_step(tiny_model):
    model = tiny_model(**SIZES)
    ids = repeating_ids()

    class Poisoned(torch.nn.Module):  # the model's output turns NaN from the 4th call on
        def __init__(self, inner):
            super().__init__()
            self.inner, self.config, self.calls = inner, inner.config, 0

        def forward(self, idx):
            self.calls += 1
            out = self.inner(idx)
            return out * float("nan") if self.calls >= 4 else out

    with pytest.raises(FloatingPointError, match=r"became nan at step 3 .*Lower the learning rate"):
        train(
            Poisoned(model),
            ids[:500],
            ids[500:],
            10,
            batch_size=2,
            block_size=8,
            eval_every=100,
            progress=False,
        )


def test_estimate_loss_is_the_same_for_the_same_model_and_restores_the_mode(tiny_model):
    model = tiny_model(**SIZES).train()
    ids = repeating_ids()
    a = estimate_loss(model, ids, 2, 8, batches=3)
    assert a == estimate_loss(model, ids, 2, 8, batches=3) and model.training


# --------------------------------------------------------------------------- save_pretrained


def test_save_pretrained_writes_the_hub_layout(tmp_path, tiny_model):
    from safetensors import safe_open

    model = tiny_model(**SIZES)
    folder = save_pretrained(model, tmp_path / "m")
    assert sorted(p.name for p in folder.iterdir()) == ["config.json", "model.safetensors"]
    config = json.loads((folder / "config.json").read_text(encoding="utf-8"))
    assert config["model_type"] == "gpt2" and config["architectures"] == ["GPT2LMHeadModel"]
    assert (config["n_layer"], config["n_head"], config["n_embd"]) == (2, 2, 16)
    assert config["n_positions"] == config["n_ctx"] == 32 and config["vocab_size"] == 61
    with safe_open(str(folder / "model.safetensors"), framework="pt") as f:
        keys = set(f.keys())
        assert f.get_tensor("h.0.attn.c_attn.weight").shape == (16, 48)  # Conv1D [in, out]
        assert f.get_tensor("h.1.mlp.c_proj.weight").shape == (64, 16)
        metadata = f.metadata()
    assert metadata["format"] == "pt"  # what transformers reads
    # the weights carry their config.json, so that a save killed between its two renames is
    # finished by the next load (see gpt2lib.checkpoint)
    assert metadata["gpt2lib.config"] == (folder / "config.json").read_text(encoding="utf-8")
    assert "wte.weight" in keys and "lm_head.weight" not in keys
    assert not any(k.startswith("transformer.") for k in keys)
    assert keys == set(model.state_dict())


def test_round_trip_through_from_pretrained_is_exact(tmp_path, tiny_model):
    model = perturbed(tiny_model(**SIZES)).eval()
    save_pretrained(model, tmp_path)
    loaded = from_pretrained(tmp_path, device="cpu")
    assert loaded.config == model.config
    for (name, a), (_, b) in zip(model.state_dict().items(), loaded.state_dict().items()):
        assert torch.equal(a, b), name
    idx = torch.randint(0, 61, (2, 9), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        assert torch.equal(model(idx), loaded(idx))


def test_transformers_reads_the_folder_with_the_same_logits(tmp_path, tiny_model):
    from transformers import GPT2LMHeadModel

    model = perturbed(tiny_model(**SIZES)).eval()
    save_pretrained(model, tmp_path)
    theirs = GPT2LMHeadModel.from_pretrained(str(tmp_path)).eval()
    idx = torch.randint(0, 61, (2, 9), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        assert torch.allclose(theirs(idx).logits, model(idx), atol=1e-5)


def test_save_pretrained_in_float16_halves_the_file_and_loads(tmp_path, tiny_model):
    model = perturbed(tiny_model(**SIZES)).eval()
    save_pretrained(model, tmp_path / "f32")
    save_pretrained(model, tmp_path / "f16", dtype=torch.float16)
    size32 = (tmp_path / "f32" / "model.safetensors").stat().st_size
    size16 = (tmp_path / "f16" / "model.safetensors").stat().st_size
    assert size16 < 0.55 * size32
    loaded = from_pretrained(tmp_path / "f16", device="cpu")
    assert torch.equal(loaded.wte.weight, model.wte.weight.half().float())


def test_save_pretrained_refuses_a_folder_holding_a_model(tmp_path, tiny_model):
    first, second = tiny_model(seed=0, **SIZES), tiny_model(seed=1, **SIZES)
    save_pretrained(first, tmp_path)
    before = (tmp_path / "model.safetensors").read_bytes()
    with pytest.raises(FileExistsError, match="already holds a model .*overwrite=True"):
        save_pretrained(second, tmp_path)
    assert (tmp_path / "model.safetensors").read_bytes() == before  # nothing touched
    (tmp_path / "notes.txt").write_text("mine", encoding="utf-8")
    save_pretrained(second, tmp_path, overwrite=True)
    loaded = from_pretrained(tmp_path, device="cpu")
    assert torch.equal(loaded.wte.weight, second.wte.weight)
    assert (tmp_path / "notes.txt").read_text(encoding="utf-8") == "mine"  # other files kept
    assert sorted(p.name for p in tmp_path.iterdir()) == [
        "config.json",
        "model.safetensors",
        "notes.txt",
    ]


def test_save_pretrained_into_a_folder_of_other_files_is_fine(tmp_path, tiny_model):
    (tmp_path / "README.md").write_text("my run", encoding="utf-8")
    save_pretrained(tiny_model(**SIZES), tmp_path)
    assert (tmp_path / "README.md").read_text(encoding="utf-8") == "my run"


def test_save_pretrained_refuses_a_file(tmp_path, tiny_model):
    path = tmp_path / "model.bin"
    path.write_bytes(b"x")
    with pytest.raises(FileExistsError, match="is a file"):
        save_pretrained(tiny_model(**SIZES), path)


# --------------------------------------------------------------------------- the stand-in


STANDIN = ROOT / "data" / "standin"


def test_the_stand_in_is_small_and_in_the_hub_layout():
    sizes = {p.name: p.stat().st_size for p in STANDIN.iterdir()}
    assert {"config.json", "model.safetensors", "README.md"} <= set(sizes)
    assert sizes["config.json"] + sizes["model.safetensors"] <= 15_000_000
    model = from_pretrained(STANDIN, device="cpu")
    assert model.config.vocab_size == 50257 and model.config.n_positions >= 128


@pytest.mark.slow
def test_the_stand_in_writes_shakespeare_shaped_text():
    """A seeded sample after a speaker's name holds line breaks and a new 'NAME:' line."""
    import re

    from gpt2lib.tokenizer import get_encoding

    enc = get_encoding()
    model = from_pretrained(STANDIN, device="cpu")
    prompt = torch.tensor([enc.encode("ROMEO:\n")])
    out = sample(model, prompt, 120, temperature=0.8, generator=torch.Generator().manual_seed(0))
    text = enc.decode(out[0].tolist())
    assert re.search(r"\n[A-Z][A-Za-z]*( [A-Z][A-Za-z]*)*:\n", text[len("ROMEO:") :]), text
    assert len(set(text.split())) > 20, text  # words, not one token repeated
    # and it predicts held-out Shakespeare far better than chance (ln 50257 = 10.82)
    ids = torch.tensor(
        enc.encode_ordinary(
            (ROOT / "data" / "tinyshakespeare.txt").read_text(encoding="utf-8")[-20_000:]
        )
    )
    assert estimate_loss(model, ids, 4, 128, batches=4) < 6.0


# --------------------------------------------------------------------------- the benchmark


@pytest.mark.slow
def test_training_benchmark_quick_mode_runs(tmp_path):
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    out = subprocess.run(
        [
            sys.executable,
            str(ROOT / "benchmarks" / "compare_training.py"),
            "--quick",
            "--json",
            str(tmp_path / "result.json"),
        ],
        capture_output=True,
        text=True,
        env=env,
        timeout=120,
        check=False,
    )
    assert out.returncode == 0, out.stderr[-2000:]
    assert "gpt2lib / transformers" in out.stdout
    result = json.loads((tmp_path / "result.json").read_text(encoding="utf-8"))
    assert result["gpt2lib"]["tokens_per_s"] > 0 and result["transformers"]["tokens_per_s"] > 0
    assert result["same_losses"] is True


# --------------------------------------------------------------------------- settings checked up front


@pytest.mark.parametrize(
    "kwargs,error,match",
    [
        ({"max_grad_norm": -1}, ValueError, "max_grad_norm must be > 0, got -1 .*climb the loss"),
        ({"max_grad_norm": 0}, ValueError, "max_grad_norm must be > 0, got 0"),
        ({"max_grad_norm": float("nan")}, ValueError, "max_grad_norm must be a finite number"),
        ({"weight_decay": float("nan")}, ValueError, "weight_decay must be a finite number"),
        ({"weight_decay": -0.1}, ValueError, "weight_decay must be >= 0"),
        ({"max_lr": 0}, ValueError, "max_lr must be > 0"),
        ({"max_lr": float("inf")}, ValueError, "max_lr must be a finite number"),
        ({"max_lr": "3e-3"}, TypeError, "max_lr must be a number"),
        ({"min_lr": 1.0}, ValueError, r"need 0 <= min_lr <= max_lr"),
        ({"min_lr": -1e-4}, ValueError, "min_lr must be >= 0"),
        ({"warmup_steps": -1}, ValueError, "warmup_steps must be at least 0"),
        ({"warmup_steps": 2.5}, TypeError, "warmup_steps must be a whole number"),
        ({"eval_batches": 0}, ValueError, "eval_batches must be at least 1"),
        ({"eval_every": 0}, ValueError, "eval_every must be at least 1"),
        ({"seed": True}, TypeError, "seed must be a whole number"),
        ({"seed": -1}, ValueError, "seed must be at least 0"),
        ({"on_eval": "plot"}, TypeError, "on_eval must be a function"),
        ({"progress": "no"}, TypeError, "progress must be True or False"),
        ({"device": "gpu"}, ValueError, "unknown device 'gpu'"),
    ],
)
def test_every_training_setting_is_checked_before_a_step(kwargs, error, match, tiny_model):
    """Every setting is checked before the first step (max_grad_norm=-1 would climb the loss)."""
    ids = repeating_ids()
    model = tiny_model(**SIZES)  # in eval mode, as the factory makes it
    before = [p.clone() for p in model.parameters()]
    args = {"steps": 120, "batch_size": 2, "block_size": 8, **kwargs}
    with pytest.raises(error, match=match):
        train(model, ids[:500], ids[500:], progress=args.pop("progress", False), **args)
    assert all(torch.equal(a, b) for a, b in zip(before, model.parameters()))
    assert not model.training  # not even the mode changed


@pytest.mark.skipif(torch.cuda.is_available(), reason="this machine has CUDA")
def test_train_on_cuda_without_cuda_is_a_clear_error(tiny_model):
    ids = repeating_ids()
    with pytest.raises(ValueError, match="'cuda' was requested but this PyTorch sees no CUDA"):
        train(
            tiny_model(**SIZES),
            ids[:500],
            ids[500:],
            2,
            batch_size=2,
            block_size=8,
            device="cuda",
            progress=False,
        )


@pytest.mark.parametrize("bad", [61, -1])
def test_train_refuses_token_ids_outside_the_vocabulary(bad, tiny_model):
    ids = repeating_ids().clone()
    ids[7] = bad
    with pytest.raises(
        ValueError,
        match=f"train_ids holds token id {bad}, outside the "
        r"vocabulary 0\.\.60",
    ):
        train(tiny_model(**SIZES), ids, ids, 2, batch_size=2, block_size=8, progress=False)


@pytest.mark.parametrize(
    "train_ids,val_ids,match",
    [
        (
            torch.tensor([0, 1, 2, 99]),
            torch.tensor([0, 1]),
            r"train_ids holds token id 99, outside",
        ),
        (torch.tensor([0, 1, 2]), torch.tensor([-3, 1]), r"val_ids holds token id -3"),
        (torch.tensor([0, 1, 2]), torch.tensor([], dtype=torch.long), "val_ids holds 0 tokens"),
        (torch.tensor([0.0, 1.0]), torch.tensor([0, 1]), "train_ids must hold integer token ids"),
    ],
)
def test_ngram_baselines_refuse_ids_outside_the_vocabulary_or_an_empty_split(
    train_ids, val_ids, match
):
    with pytest.raises((ValueError, TypeError), match=match):
        ngram_baselines(train_ids, val_ids, vocab_size=4)


@pytest.mark.parametrize("start_in_train_mode", [False, True])
def test_an_interrupted_run_keeps_its_history_and_the_models_mode(start_in_train_mode, tiny_model):
    ids = repeating_ids()
    model = tiny_model(**SIZES).train(start_in_train_mode)

    def stop_at_the_second_estimate(history, model):
        if len(history.eval_step) == 2:
            raise KeyboardInterrupt  # what Ctrl-C in a notebook raises

    with pytest.raises(KeyboardInterrupt) as info:
        train(
            model,
            ids[:500],
            ids[500:],
            20,
            batch_size=2,
            block_size=8,
            eval_every=5,
            eval_batches=1,
            on_eval=stop_at_the_second_estimate,
            progress=False,
        )
    history = info.value.history
    assert history.step == list(range(10)) and len(history.train_loss) == 10
    assert history.eval_step == [5, 10] and history.seconds > 0
    assert model.training == start_in_train_mode


# --------------------------------------------------------------------------- the learner's pieces drive train


def test_train_runs_the_pieces_it_is_given(tiny_model):
    ids = repeating_ids()
    calls = {"batch": 0, "step": 0}

    def counting_batch(ids, batch_size, block_size, generator=None, device=None):
        calls["batch"] += 1
        return get_batch.unchecked(ids, batch_size, block_size, generator, device)

    def step_that_never_updates(model, optimizer, x, y, max_grad_norm=1.0):
        calls["step"] += 1
        return F.cross_entropy(model(x).flatten(0, 1), y.flatten()).detach()

    model = tiny_model(**SIZES)
    before = [p.clone() for p in model.parameters()]
    history = train(
        model,
        ids[:500],
        ids[500:],
        6,
        batch_size=2,
        block_size=8,
        eval_every=3,
        eval_batches=1,
        progress=False,
        get_batch=counting_batch,
        train_step=step_that_never_updates,
        lr_at=lambda step, *rest: 0.5 + step,
    )
    assert calls == {"batch": 6, "step": 6}
    assert history.lr == [0.5 + s for s in range(6)]
    assert all(torch.equal(a, b) for a, b in zip(before, model.parameters()))
    assert history.largest_batch == 16  # what the challenge check reads


def test_the_public_names_wrap_the_lessons_plain_functions():
    from gpt2lib.chapters import training

    assert train.unchecked is training.train_loop
    for entry in (get_batch, lm_loss, lr_schedule, sample, ngram_baselines):
        assert callable(entry.unchecked) and entry.__name__ == entry.unchecked.__name__
    x = torch.randn(2, 3, 5)
    targets = torch.tensor([[0, 1, 2], [3, 4, 0]])
    assert torch.equal(lm_loss(x, targets), training.lm_loss(x, targets))


@pytest.mark.parametrize("bad", ["get_batch", "train_step", "lr_at"])
def test_train_refuses_a_piece_that_is_not_a_function(bad, tiny_model):
    ids = repeating_ids()
    with pytest.raises(TypeError, match=f"{bad} must be a function or None"):
        train(
            tiny_model(**SIZES),
            ids[:500],
            ids[500:],
            2,
            batch_size=2,
            block_size=8,
            progress=False,
            **{bad: "mine"},
        )


def test_an_error_in_a_learners_piece_keeps_the_history_and_the_mode(tiny_model):
    ids = repeating_ids()
    model = tiny_model(**SIZES)  # in eval mode, as the factory makes it
    done = []

    def step_failing_at_the_third(model, optimizer, x, y, max_grad_norm=1.0):
        if len(done) == 2:
            raise RuntimeError("my bug")
        done.append(1)
        return torch.tensor(1.0)

    with pytest.raises(RuntimeError, match="my bug") as info:
        train(
            model,
            ids[:500],
            ids[500:],
            5,
            batch_size=2,
            block_size=8,
            progress=False,
            train_step=step_failing_at_the_third,
        )
    assert info.value.history.step == [0, 1] and not model.training


# --------------------------------------------------------------------------- the learner's notebook


_NEEDED = (
    "QUICK =",
    "from dataclasses",
    "def ",
    "train_ids, val_ids =",
    'yours("7.4"',
    "your_pieces(",
    "setting = dict",
    "history = train(model",
)


def _learner_cells():
    """The learner notebook's code cells up to the run, those the run needs (the setup, the
    data, every definition, the choice of pieces, the setting): the rest only prints."""
    nb = json.loads((ROOT / "notebooks" / "07_training.ipynb").read_text(encoding="utf-8"))
    cells = [
        ("".join(c["source"]), c.get("metadata", {}).get("tags", []))
        for c in nb["cells"]
        if c["cell_type"] == "code"
    ]
    run = next(i for i, (src, _) in enumerate(cells) if "history = train(model" in src)
    return [
        (src, tags) for src, tags in cells[: run + 1] if any(marker in src for marker in _NEEDED)
    ]


def _run_cells(cells, namespace):
    for src, tags in cells:
        if "check" in tags or "challenge" in tags:
            continue  # an unfinished exercise's check raises: a learner skips it too
        exec(compile(src, "<chapter 7 cell>", "exec"), namespace)  # noqa: S102 (the notebook's own code)


def test_a_planted_wrong_training_step_in_the_learner_notebook_changes_the_curve(
    capsys, monkeypatch
):
    """The curve comes from the learner's code. The learner notebook as shipped (every exercise
    a stub) trains with the reference pieces and says so; once 7.5 counts as passed, the
    learner's training step is what runs: one that forgets optimizer.step() draws a flat curve
    (in a notebook its check would refuse it; here it shows whose step the cells run)."""
    import matplotlib

    from gpt2lib.course import mine

    matplotlib.use("Agg")
    monkeypatch.setenv("GPT2LIB_QUICK", "1")
    cells = _learner_cells()
    namespace = {"__name__": "__chapter7__"}
    _run_cells(cells, namespace)
    out = capsys.readouterr().out
    assert (
        "Exercise 7.5 has not passed yet, so the cells below use the reference's training_step"
        in out
    )
    assert (
        "Exercise 7.6 has not passed yet, so the cells below use the reference's lr_schedule" in out
    )
    reference = namespace["history"]
    assert reference.train_loss[-1] < reference.train_loss[0] - 2  # the reference learns

    planted = """
def training_step(model, optimizer, x, y, max_grad_norm=1.0):
    optimizer.zero_grad()
    loss = F.cross_entropy(model(x).flatten(0, 1), y.flatten())
    loss.backward()
    torch.nn.utils.clip_grad_norm_(model.parameters(), max_grad_norm)
    return loss.item()  # the planted bug: no optimizer.step()
"""
    exercise = next(i for i, (src, _) in enumerate(cells) if src.startswith("def decay_groups"))
    start = next(i for i, (src, _) in enumerate(cells) if "= your_pieces(" in src)
    monkeypatch.setattr(mine, "PASSED", {"7.5"})
    _run_cells([(cells[exercise][0] + planted, [])] + cells[start:], namespace)
    assert "the reference's training_step" not in capsys.readouterr().out
    wrong = namespace["history"]
    assert len(wrong.train_loss) == len(reference.train_loss)
    assert max(wrong.train_loss) - min(wrong.train_loss) < 0.2  # flat: no weight ever moved
    assert wrong.val_loss > reference.val_loss + 2
