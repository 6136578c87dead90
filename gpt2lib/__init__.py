"""gpt2lib: GPT-2 as built in the course's chapters.

Most modules are generated from the notebooks in solutions/ (see CONTRIBUTING.md). The names
below load on first use, so `import gpt2lib.tokenizer` (chapter 1) does not pull in PyTorch.

    from gpt2lib import GPT2, GPT2Config, from_pretrained, generate, stream_text, pick_device
    from gpt2lib import run_with_cache, logit_lens, induction_scores   # a look inside (ch 8)
    from gpt2lib import pretrain   # train from token files, one process or torchrun (ch 11)

Chapter 6's model (gpt2lib.model.GPT2) is a plain nn.Module; saving, loading, generating and
looking inside are functions that take it: `save_pretrained(model, folder)`,
`from_pretrained(name_or_path)`, `generate(model, idx, max_new_tokens)`,
`run_with_cache(model, idx)`. `gpt2lib.GPT2` is that class with the same four as methods
(gpt2lib.mixins): `GPT2.from_pretrained("gpt2").generate(ids, 20)`.
"""

import importlib

# public name -> the module it lives in
_EXPORTS = {
    "GPT2": "gpt2lib.mixins",  # chapter 6's model with from_pretrained, generate, ...
    "GenerationMixin": "gpt2lib.mixins",
    "GPT2Config": "gpt2lib.config",
    "KVCache": "gpt2lib.kvcache",
    "from_pretrained": "gpt2lib.checkpoint",
    "save_pretrained": "gpt2lib.checkpoint",
    "CheckpointError": "gpt2lib.checkpoint",
    "HubUnreachable": "gpt2lib.checkpoint",
    "run_with_cache": "gpt2lib.interpret",
    "ablated_heads": "gpt2lib.interpret",
    "ActivationCache": "gpt2lib.interpret",
    "logit_lens": "gpt2lib.interpret",
    "induction_scores": "gpt2lib.interpret",
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
