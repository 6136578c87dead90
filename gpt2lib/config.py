# DRAFT: to be replaced by the export cells of solutions/02_embeddings.ipynb
from dataclasses import dataclass, fields


@dataclass
class GPT2Config:
    """GPT-2's hyperparameters, with Hugging Face's field names so configs load both ways."""

    vocab_size: int = 50257
    n_positions: int = 1024  # the longest context: rows of the position table
    n_embd: int = 768  # width of the residual stream
    n_layer: int = 12
    n_head: int = 12
    layer_norm_epsilon: float = 1e-5
    embd_pdrop: float = 0.1
    attn_pdrop: float = 0.1
    resid_pdrop: float = 0.1

    SIZES = {
        "gpt2": dict(n_layer=12, n_head=12, n_embd=768),
        "gpt2-medium": dict(n_layer=24, n_head=16, n_embd=1024),
        "gpt2-large": dict(n_layer=36, n_head=20, n_embd=1280),
        "gpt2-xl": dict(n_layer=48, n_head=25, n_embd=1600),
    }

    def __post_init__(self):
        if self.n_embd % self.n_head != 0:
            raise ValueError(
                f"n_embd ({self.n_embd}) must be divisible by n_head ({self.n_head}): "
                "each head gets n_embd // n_head features"
            )

    @property
    def head_dim(self) -> int:
        return self.n_embd // self.n_head

    @classmethod
    def from_name(cls, name: str, **overrides) -> "GPT2Config":
        if name not in cls.SIZES:
            raise ValueError(f"unknown model name {name!r}; choose one of {', '.join(cls.SIZES)}")
        return cls(**{**cls.SIZES[name], **overrides})

    @classmethod
    def from_dict(cls, values: dict) -> "GPT2Config":
        """From a Hugging Face config.json dict; unknown keys are ignored."""
        known = {f.name for f in fields(cls)}
        return cls(**{k: v for k, v in values.items() if k in known})
