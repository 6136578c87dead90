# DRAFT: to be replaced by the export cells of solutions/03_attention.ipynb
import math

import torch
import torch.nn as nn
import torch.nn.functional as F


class Conv1D(nn.Module):
    """A linear layer whose weight is stored [in, out], as in GPT-2's checkpoints: y = x @ W + b.

    OpenAI's code called it conv1d (a 1x1 convolution is a linear layer). Storing [in, out]
    lets the real weights load without a transpose.
    """

    def __init__(self, n_in: int, n_out: int):
        super().__init__()
        self.weight = nn.Parameter(torch.empty(n_in, n_out))
        self.bias = nn.Parameter(torch.zeros(n_out))
        nn.init.normal_(self.weight, std=0.02)

    def forward(self, x):  # (..., n_in) -> (..., n_out)
        shape = x.shape[:-1] + (self.weight.shape[1],)
        return torch.addmm(self.bias, x.reshape(-1, x.shape[-1]), self.weight).view(shape)


class CausalSelfAttention(nn.Module):
    def __init__(self, config):
        super().__init__()
        self.n_head = config.n_head
        self.n_embd = config.n_embd
        self.c_attn = Conv1D(config.n_embd, 3 * config.n_embd)  # q, k, v in one matmul
        self.c_proj = Conv1D(config.n_embd, config.n_embd)
        self.attn_dropout = config.attn_pdrop
        self.resid_dropout = nn.Dropout(config.resid_pdrop)

    def forward(self, x, kv_cache=None):
        """x: (B, T, C). kv_cache: this layer's cache (see gpt2lib.kvcache) or None."""
        B, T, C = x.shape
        q, k, v = self.c_attn(x).split(self.n_embd, dim=2)  # 3 x (B, T, C)
        q = q.view(B, T, self.n_head, C // self.n_head).transpose(1, 2)  # (B, nh, T, hd)
        k = k.view(B, T, self.n_head, C // self.n_head).transpose(1, 2)
        v = v.view(B, T, self.n_head, C // self.n_head).transpose(1, 2)
        past = 0
        if kv_cache is not None:
            past = kv_cache.length
            k, v = kv_cache.update(k, v)  # (B, nh, past + T, hd)
        dropout = self.attn_dropout if self.training else 0.0
        if past == 0:
            y = F.scaled_dot_product_attention(q, k, v, dropout_p=dropout, is_causal=True)
        elif T == 1:  # one new query may look at every cached key
            y = F.scaled_dot_product_attention(q, k, v, dropout_p=dropout)
        else:  # query i sits at position past + i and sees keys 0 .. past + i
            mask = torch.ones(T, past + T, dtype=torch.bool, device=x.device).tril(diagonal=past)
            y = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, dropout_p=dropout)
        y = y.transpose(1, 2).contiguous().view(B, T, C)  # merge heads: (B, T, C)
        return self.resid_dropout(self.c_proj(y))
