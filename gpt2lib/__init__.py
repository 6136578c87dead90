"""gpt2lib: GPT-2 as built in the course's chapters.

Most modules are generated from the notebooks in solutions/ (see CONTRIBUTING.md).
`GPT2` and `GPT2Config` are loaded on first use, so `import gpt2lib.tokenizer` (chapter 1)
does not pull in PyTorch.
"""

__all__ = ["GPT2", "GPT2Config"]


def __getattr__(name):
    if name == "GPT2":
        from gpt2lib.model import GPT2

        return GPT2
    if name == "GPT2Config":
        from gpt2lib.config import GPT2Config

        return GPT2Config
    raise AttributeError(f"module 'gpt2lib' has no attribute {name!r}")
