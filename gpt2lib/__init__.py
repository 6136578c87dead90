"""gpt2lib: GPT-2 as built in the course's chapters.

`gpt2lib.chapters` holds the code the chapters write (generated from solutions/, see
CONTRIBUTING.md); the modules beside it are the hand-written entry points around it, one per
job: the model class (`model`), loading and saving (`checkpoint`), generation (`generation`,
`kvcache`), a look inside (`inspection`), training (`training`), the tokenizer (`tokenizer`),
fine-tuning (`finetune`), scaling (`scaling`, `tokenfile`); opt-in speed is `gpt2lib.speed`.
The names below load on first use, so `import gpt2lib.tokenizer` does not pull in PyTorch.

    from gpt2lib import GPT2, GPT2Config, from_pretrained, generate, stream_text, pick_device
    from gpt2lib import run_with_cache, logit_lens, induction_scores   # a look inside (ch 8)
    from gpt2lib import pretrain   # train from token files, one process or torchrun (ch 11)

Chapter 6's model (gpt2lib.chapters.model.GPT2) is a plain nn.Module; saving, loading,
generating and looking inside are functions that take it: `save_pretrained(model, folder)`,
`from_pretrained(name_or_path)`, `generate(model, idx, max_new_tokens)`,
`run_with_cache(model, idx)`. `gpt2lib.GPT2` is that class with the same four as methods
(gpt2lib.model): `GPT2.from_pretrained("gpt2").generate(ids, 20)`, and every model
`from_pretrained` returns has them.
"""

import importlib

# public name -> the module it lives in
_EXPORTS = {
    "GPT2": "gpt2lib.model",  # chapter 6's model with from_pretrained, generate, ...
    "GPT2Methods": "gpt2lib.model",
    "GPT2Config": "gpt2lib.chapters.config",
    "KVCache": "gpt2lib.kvcache",
    "from_pretrained": "gpt2lib.model",
    "save_pretrained": "gpt2lib.checkpoint",
    "CheckpointError": "gpt2lib.checkpoint",
    "HubUnreachable": "gpt2lib.checkpoint",
    "run_with_cache": "gpt2lib.inspection",
    "ablated_heads": "gpt2lib.inspection",
    "ActivationCache": "gpt2lib.inspection",
    "logit_lens": "gpt2lib.inspection",
    "induction_scores": "gpt2lib.inspection",
    "generate": "gpt2lib.generation",
    "stream_text": "gpt2lib.generation",
    "pick_device": "gpt2lib.device",
    "get_encoding": "gpt2lib.tokenizer",
    "BPETokenizer": "gpt2lib.tokenizer",
    "pretrain": "gpt2lib.scaling",  # chapter 11: train from token files, one process or torchrun
}

__all__ = sorted(_EXPORTS)


def __getattr__(name):
    if name in _EXPORTS:
        return getattr(importlib.import_module(_EXPORTS[name]), name)
    raise AttributeError(f"module 'gpt2lib' has no attribute {name!r}")


def __dir__():
    return sorted(set(globals()) | set(_EXPORTS))
