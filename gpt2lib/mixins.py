"""The familiar methods, as mixins (hand-written, not generated from a chapter).

    from gpt2lib import GPT2
    model = GPT2.from_pretrained("gpt2")          # or a checkpoint folder
    out = model.generate(ids, 20, temperature=0)
    logits, cache = model.run_with_cache(ids)
    model.save_pretrained("my-model")

Each method is a thin call of the function that stays the core (transformers' mixin
pattern): `model.generate(...)` is `gpt2lib.generation.generate(model, ...)`, and so on.
Chapter 6's class, `gpt2lib.model.GPT2`, stays a plain nn.Module; `gpt2lib.GPT2` is that class
with these mixins. A learner's own class gets the methods the same way:

    class Mine(MyGPT2, GenerationMixin): ...
"""

from gpt2lib import generation, interpret
from gpt2lib.config import GPT2Config
from gpt2lib.model import GPT2 as _ChapterGPT2

# The checkpoint functions, in one place: repoint these two names to move saving and loading.
from gpt2lib.checkpoint import from_pretrained as _from_pretrained
from gpt2lib.checkpoint import save_pretrained as _save_pretrained

__all__ = ["GPT2", "GenerationMixin", "InspectionMixin", "PretrainedMixin"]


class GenerationMixin:
    """model.generate(idx, max_new_tokens, ...) = gpt2lib.generation.generate(model, ...)."""

    def generate(self, idx, max_new_tokens, **kwargs):
        return generation.generate(self, idx, max_new_tokens, **kwargs)


class InspectionMixin:
    """model.run_with_cache(idx, ...) = gpt2lib.interpret.run_with_cache(model, idx, ...)."""

    def run_with_cache(self, idx, **kwargs):
        return interpret.run_with_cache(self, idx, **kwargs)


class PretrainedMixin:
    """Cls.from_pretrained(name_or_folder, ...) builds an instance of Cls with the checkpoint's
    weights; model.save_pretrained(folder, ...) writes one."""

    @classmethod
    def from_pretrained(cls, name_or_path, device=None, dtype=None, **kwargs):
        kwargs.setdefault("model_cls", cls)
        return _from_pretrained(name_or_path, device, dtype, **kwargs)

    def save_pretrained(self, folder, **kwargs):
        return _save_pretrained(self, folder, **kwargs)


class GPT2(PretrainedMixin, GenerationMixin, InspectionMixin, _ChapterGPT2):
    """Chapter 6's GPT2 (gpt2lib.model.GPT2) with from_pretrained, generate, save_pretrained
    and run_with_cache. The modules, parameter names and forward are chapter 6's; the
    constructor, an entry point, first checks that it was given a GPT2Config (chapter 6's
    plain class checks nothing)."""

    def __init__(self, config, *args, **kwargs):
        check_is_gpt2_config(config)
        super().__init__(config, *args, **kwargs)


def check_is_gpt2_config(config) -> None:
    """A clear TypeError unless `config` is a GPT2Config (a dict, a name or None is not)."""
    if not isinstance(config, GPT2Config):
        raise TypeError(
            f"GPT2 needs a GPT2Config, got {type(config).__name__}: build one with "
            "GPT2Config(n_layer=..., ...) or GPT2Config.from_name('gpt2') "
            "(from gpt2lib import GPT2Config)"
        )
