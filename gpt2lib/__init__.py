"""gpt2lib: GPT-2 as built in the course's chapters.

Most modules are generated from the notebooks in solutions/ (see CONTRIBUTING.md). The names
below load on first use, so `import gpt2lib.tokenizer` (chapter 1) does not pull in PyTorch.

    from gpt2lib import GPT2, GPT2Config, KVCache, generate, stream_text, pick_device
"""

import importlib

# public name -> the module it lives in
_EXPORTS = {
    "GPT2": "gpt2lib.model",
    "GPT2Config": "gpt2lib.config",
    "KVCache": "gpt2lib.kvcache",
    "from_pretrained": "gpt2lib.loading",
    "generate": "gpt2lib.generation",
    "stream_text": "gpt2lib.generation",
    "pick_device": "gpt2lib.device",
    "get_encoding": "gpt2lib.tokenizer",
    "BPETokenizer": "gpt2lib.tokenizer",
}

__all__ = sorted(_EXPORTS)


def __getattr__(name):
    if name in _EXPORTS:
        return getattr(importlib.import_module(_EXPORTS[name]), name)
    raise AttributeError(f"module 'gpt2lib' has no attribute {name!r}")


def __dir__():
    return sorted(set(globals()) | set(_EXPORTS))
