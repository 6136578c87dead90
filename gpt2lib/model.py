# DRAFT: to be replaced by the export cells of solutions/06_model.ipynb
import math

import torch
import torch.nn as nn

from gpt2lib.block import Block, LayerNorm
from gpt2lib.config import GPT2Config


class GPT2(nn.Module):
    def __init__(self, config: GPT2Config, block_cls=Block):
        super().__init__()
        self.config = config
        self.wte = nn.Embedding(config.vocab_size, config.n_embd)
        self.wpe = nn.Embedding(config.n_positions, config.n_embd)
        self.drop = nn.Dropout(config.embd_pdrop)
        self.h = nn.ModuleList([block_cls(config) for _ in range(config.n_layer)])
        self.ln_f = LayerNorm(config.n_embd, config.layer_norm_epsilon)
        self.apply(self._init_weights)
        for name, p in self.named_parameters():
            if name.endswith("c_proj.weight"):
                nn.init.normal_(p, mean=0.0, std=0.02 / math.sqrt(2 * config.n_layer))

    @staticmethod
    def _init_weights(module):
        if isinstance(module, nn.Embedding):
            nn.init.normal_(module.weight, mean=0.0, std=0.02)

    @classmethod
    def from_pretrained(cls, name_or_path, device=None, dtype=None):
        """Real GPT-2 weights from the hub or a local folder: see gpt2lib.loading (chapter 7)."""
        from gpt2lib.loading import from_pretrained

        return from_pretrained(name_or_path, device=device, dtype=dtype, model_cls=cls)

    @torch.no_grad()
    def generate(self, idx, max_new_tokens, **kwargs):
        """Prompt (B, T) -> prompt and new tokens (B, T + new): see gpt2lib.generation."""
        from gpt2lib.generation import generate

        return generate(self, idx, max_new_tokens, **kwargs)

    def forward(self, idx, kv_cache=None, last_only=False):
        """idx: (B, T) token ids -> logits (B, T, vocab_size) (or (B, 1, V) if last_only)."""
        B, T = idx.shape
        past = 0 if kv_cache is None else kv_cache.length
        if past + T > self.config.n_positions:
            raise ValueError(
                f"sequence of {past + T} tokens is longer than the model's context of "
                f"{self.config.n_positions} (n_positions); crop the prompt"
            )
        pos = torch.arange(past, past + T, device=idx.device)  # (T,)
        x = self.drop(self.wte(idx) + self.wpe(pos))  # (B, T, C)
        for i, block in enumerate(self.h):
            x = block(x, kv_cache=None if kv_cache is None else kv_cache.layers[i])
        if kv_cache is not None:
            kv_cache.advance(T)
        if last_only:
            x = x[:, -1:, :]
        x = self.ln_f(x)
        return x @ self.wte.weight.T  # tied readout: (B, T, vocab_size)
