"""Write GPT-2 checkpoints for tests, in exactly the layouts the loader must accept.

- `write_hub_checkpoint`: the layout of the hub repo openai-community/gpt2 — a config.json like
  theirs and a model.safetensors with prefix-less keys (`wte.weight`, `h.0.attn.c_attn.weight`,
  ...), Conv1D weights stored [in, out], the `h.N.attn.bias` causal-mask buffers, no lm_head.
- `write_save_pretrained_checkpoint`: what transformers' `GPT2LMHeadModel.save_pretrained`
  writes (made by transformers itself, not imitated).

Weights are random (seeded) but not trivial: LayerNorm gains and all biases are perturbed too,
so a loader that drops or swaps a tensor changes the logits.
"""

from __future__ import annotations

import json
import os
import shutil
import tempfile
from pathlib import Path

import torch
from safetensors.torch import save_file

# The fields of openai-community/gpt2's config.json; sizes are filled in per checkpoint.
_HUB_CONFIG = {
    "activation_function": "gelu_new",
    "architectures": ["GPT2LMHeadModel"],
    "attn_pdrop": 0.1,
    "bos_token_id": 50256,
    "embd_pdrop": 0.1,
    "eos_token_id": 50256,
    "initializer_range": 0.02,
    "layer_norm_epsilon": 1e-05,
    "model_type": "gpt2",
    "n_ctx": 1024,
    "n_embd": 768,
    "n_head": 12,
    "n_layer": 12,
    "n_positions": 1024,
    "resid_pdrop": 0.1,
    "summary_activation": None,
    "summary_first_dropout": 0.1,
    "summary_proj_to_labels": True,
    "summary_type": "cls_index",
    "summary_use_proj": True,
    "task_specific_params": {"text-generation": {"do_sample": True, "max_length": 50}},
    "vocab_size": 50257,
}

# The tiny random model (real vocabulary, so the real tokenizer works, but only 2 layers of
# width 64): the fallback when the stand-in is missing, and for tests that want random weights.
TINY = {"n_layer": 2, "n_head": 4, "n_embd": 64, "n_positions": 1024, "vocab_size": 50257}
# The small model chapter 8's tests look inside (tests/conftest.py: small_hub_dir, small_model).
SMALL_SIZES = {"n_layer": 3, "n_head": 4, "n_embd": 32, "n_positions": 64, "vocab_size": 211}
GPT2_SMALL = {"n_layer": 12, "n_head": 12, "n_embd": 768, "n_positions": 1024, "vocab_size": 50257}


def hub_config(
    n_layer: int, n_head: int, n_embd: int, n_positions: int = 1024, vocab_size: int = 50257
) -> dict:
    config = dict(_HUB_CONFIG)
    config.update(
        n_layer=n_layer,
        n_head=n_head,
        n_embd=n_embd,
        n_positions=n_positions,
        n_ctx=n_positions,
        vocab_size=vocab_size,
    )
    return config


def hub_shapes(config: dict, attn_bias: bool = True) -> dict[str, tuple[int, ...]]:
    """Every tensor of a hub GPT-2 checkpoint with its shape, in the file's order."""
    C, V, P = config["n_embd"], config["vocab_size"], config["n_positions"]
    shapes = {"wte.weight": (V, C), "wpe.weight": (P, C)}
    for i in range(config["n_layer"]):
        h = f"h.{i}."
        shapes[h + "ln_1.weight"] = (C,)
        shapes[h + "ln_1.bias"] = (C,)
        if attn_bias:
            shapes[h + "attn.bias"] = (1, 1, P, P)
        shapes[h + "attn.c_attn.weight"] = (C, 3 * C)  # [in, out]: Conv1D layout
        shapes[h + "attn.c_attn.bias"] = (3 * C,)
        shapes[h + "attn.c_proj.weight"] = (C, C)
        shapes[h + "attn.c_proj.bias"] = (C,)
        shapes[h + "ln_2.weight"] = (C,)
        shapes[h + "ln_2.bias"] = (C,)
        shapes[h + "mlp.c_fc.weight"] = (C, 4 * C)
        shapes[h + "mlp.c_fc.bias"] = (4 * C,)
        shapes[h + "mlp.c_proj.weight"] = (4 * C, C)
        shapes[h + "mlp.c_proj.bias"] = (C,)
    shapes["ln_f.weight"] = (C,)
    shapes["ln_f.bias"] = (C,)
    return shapes


def random_hub_tensors(
    config: dict, seed: int = 0, attn_bias: bool = True, dtype: torch.dtype = torch.float32
) -> dict[str, torch.Tensor]:
    gen = torch.Generator().manual_seed(seed)
    P = config["n_positions"]
    tensors = {}
    for name, shape in hub_shapes(config, attn_bias).items():
        if name.endswith(".attn.bias") and name.count(".") == 3:  # h.N.attn.bias: causal mask
            tensors[name] = torch.tril(torch.ones(P, P)).view(1, 1, P, P)
        elif name.endswith(("ln_1.weight", "ln_2.weight", "ln_f.weight")):
            tensors[name] = 1.0 + 0.1 * torch.randn(shape, generator=gen)
        elif name.endswith(".bias"):
            tensors[name] = 0.02 * torch.randn(shape, generator=gen)
        else:
            tensors[name] = 0.02 * torch.randn(shape, generator=gen)
        tensors[name] = tensors[name].to(dtype)
    return tensors


def write_hub_checkpoint(
    folder,
    n_layer=2,
    n_head=4,
    n_embd=64,
    n_positions=1024,
    vocab_size=50257,
    seed=0,
    attn_bias=True,
    masked_bias=False,
    tensors=None,
    config=None,
) -> Path:
    """A folder with config.json and model.safetensors in the hub's layout. Returns the folder.

    `tensors` / `config` replace the generated ones (to plant a broken checkpoint).
    """
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    if config is None:
        config = hub_config(n_layer, n_head, n_embd, n_positions, vocab_size)
    if tensors is None:
        tensors = random_hub_tensors(config, seed=seed, attn_bias=attn_bias)
        if masked_bias:
            for i in range(config["n_layer"]):
                tensors[f"h.{i}.attn.masked_bias"] = torch.tensor(-1e4)
    (folder / "config.json").write_text(json.dumps(config, indent=2) + "\n", encoding="utf-8")
    save_file(
        {k: v.contiguous() for k, v in tensors.items()},
        str(folder / "model.safetensors"),
        metadata={"format": "pt"},
    )
    return folder


def write_save_pretrained_checkpoint(
    folder, n_layer=2, n_head=4, n_embd=64, n_positions=128, vocab_size=1000, seed=0
) -> Path:
    """A checkpoint written by transformers' own GPT2LMHeadModel.save_pretrained."""
    from transformers import GPT2Config as HFConfig
    from transformers import GPT2LMHeadModel

    torch.manual_seed(seed)
    hf = GPT2LMHeadModel(
        HFConfig(
            n_layer=n_layer,
            n_head=n_head,
            n_embd=n_embd,
            n_positions=n_positions,
            n_ctx=n_positions,
            vocab_size=vocab_size,
            bos_token_id=vocab_size - 1,
            eos_token_id=vocab_size - 1,
        )
    )
    with torch.no_grad():  # perturb biases and gains so that every tensor matters
        for name, p in hf.named_parameters():
            if name.endswith("bias") or "ln_" in name:
                p.add_(0.05 * torch.randn_like(p))
    hf.save_pretrained(str(folder), safe_serialization=True)
    return Path(folder)


# The stand-in: a small GPT-2 trained on Tiny Shakespeare by chapter 7's code
# (tools/make_standin.py), committed in float16 to stay small.
STANDIN = Path(__file__).resolve().parent.parent / "data" / "standin"

_MADE_HERE: list = []


def standin_available() -> bool:
    return (STANDIN / "config.json").is_file() and (STANDIN / "model.safetensors").is_file()


def write_standin_float32(folder) -> Path:
    """Copy the stand-in into `folder` with its weights widened to float32.

    The committed file is float16. Our loader widens it to float32 on the CPU anyway, but
    transformers' from_pretrained keeps a checkpoint's own dtype by default; a float32 copy
    makes both libraries run the same numbers, so the tests can compare them exactly.
    """
    from safetensors.torch import load_file

    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    tensors = load_file(str(STANDIN / "model.safetensors"))
    save_file(
        {k: (v.float() if v.is_floating_point() else v).contiguous() for k, v in tensors.items()},
        str(folder / "model.safetensors"),
        metadata={"format": "pt"},
    )
    shutil.copyfile(STANDIN / "config.json", folder / "config.json")
    return folder


def install_test_checkpoint() -> Path:
    """Point GPT2LIB_CHECKPOINT at an offline hub-layout checkpoint in a temp folder.

    Called from pytest_configure, so that the chapter 8 and 9 notebooks (whose kernels
    inherit the environment) and the CLI run offline. The checkpoint is the trained stand-in
    (data/standin, in float32), so their text is Shakespeare-shaped; only if that folder is
    missing, a tiny random checkpoint. A GPT2LIB_CHECKPOINT that already names a folder (real
    weights for a rehearsal, or a second call) is left alone.
    """
    existing = os.environ.get("GPT2LIB_CHECKPOINT")
    if existing and Path(existing).is_dir():
        return Path(existing)
    folder = tempfile.mkdtemp(prefix="gpt2lib-test-checkpoint-")
    if standin_available():
        write_standin_float32(folder)
    else:
        write_hub_checkpoint(folder, seed=0, **TINY)
    _MADE_HERE.append(folder)
    os.environ["GPT2LIB_CHECKPOINT"] = folder
    return Path(folder)


def make_random_test_checkpoint() -> Path:
    """A tiny random hub-layout checkpoint (2 layers, width 64, real vocabulary) in a temp
    folder, for tests that need random weights; remove_test_checkpoint deletes it."""
    folder = tempfile.mkdtemp(prefix="gpt2lib-tiny-checkpoint-")
    write_hub_checkpoint(folder, seed=0, **TINY)
    _MADE_HERE.append(folder)
    return Path(folder)


def remove_test_checkpoint() -> None:
    """Undo install_test_checkpoint and make_random_test_checkpoint (only what they made)."""
    while _MADE_HERE:
        folder = _MADE_HERE.pop()
        shutil.rmtree(folder, ignore_errors=True)
        if os.environ.get("GPT2LIB_CHECKPOINT") == folder:
            del os.environ["GPT2LIB_CHECKPOINT"]
