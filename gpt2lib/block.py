# DRAFT: to be replaced by the export cells of solutions/05_block.ipynb
import torch
import torch.nn as nn
import torch.nn.functional as F

from gpt2lib.attention import CausalSelfAttention
from gpt2lib.mlp import MLP


class LayerNorm(nn.Module):
    def __init__(self, n_embd, eps=1e-5):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(n_embd))
        self.bias = nn.Parameter(torch.zeros(n_embd))
        self.eps = eps

    def forward(self, x):
        return F.layer_norm(x, self.weight.shape, self.weight, self.bias, self.eps)


class Block(nn.Module):
    """Pre-norm: x + attn(ln_1(x)), then x + mlp(ln_2(x))."""

    def __init__(self, config, attention_cls=CausalSelfAttention, mlp_cls=MLP):
        super().__init__()
        self.ln_1 = LayerNorm(config.n_embd, config.layer_norm_epsilon)
        self.attn = attention_cls(config)
        self.ln_2 = LayerNorm(config.n_embd, config.layer_norm_epsilon)
        self.mlp = mlp_cls(config)

    def forward(self, x, kv_cache=None):  # (B, T, C) -> (B, T, C)
        h = self.ln_1(x)
        # a learner's attention may not know about caches; only pass one when there is one
        x = x + (self.attn(h) if kv_cache is None else self.attn(h, kv_cache=kv_cache))
        x = x + self.mlp(self.ln_2(x))
        return x
