"""gpt2lib: GPT-2 as built in the course's chapters.

Most modules are generated from the notebooks in solutions/ (see CONTRIBUTING.md).
"""

from gpt2lib.config import GPT2Config
from gpt2lib.model import GPT2

__all__ = ["GPT2", "GPT2Config"]
