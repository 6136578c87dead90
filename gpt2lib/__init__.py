"""gpt2lib: GPT-2 as built in the course's chapters.

Most modules are generated from the notebooks in solutions/ (see CONTRIBUTING.md). The names
below load on first use, so `import gpt2lib.tokenizer` (chapter 1) does not pull in PyTorch.

    from gpt2lib import GPT2, GPT2Config, KVCache, generate, stream_text, pick_device
    from gpt2lib import run_with_cache, logit_lens, induction_scores   # a look inside (ch 8)

`gpt2lib.from_pretrained(name_or_path, device=None, dtype=None)` is `GPT2.from_pretrained`.
"""

import importlib

# public name -> the module it lives in
_EXPORTS = {
    "GPT2": "gpt2lib.model",
    "GPT2Config": "gpt2lib.config",
    "KVCache": "gpt2lib.kvcache",
    "from_pretrained": "gpt2lib.model",  # GPT2.from_pretrained (see __getattr__)
    "CheckpointError": "gpt2lib.loading",
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
}

__all__ = sorted(_EXPORTS)


def __getattr__(name):
    if name == "from_pretrained":  # the loader needs a model class: GPT2 passes itself
        return importlib.import_module("gpt2lib.model").GPT2.from_pretrained
    if name in _EXPORTS:
        return getattr(importlib.import_module(_EXPORTS[name]), name)
    raise AttributeError(f"module 'gpt2lib' has no attribute {name!r}")


def __dir__():
    return sorted(set(globals()) | set(_EXPORTS))
