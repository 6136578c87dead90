"""Chapter 3's attention written another way than the solution: an einsum for the scores and
a softmax by hand (tools/learner_run.py --answer CausalSelfAttention=this file)."""

import math

import torch
import torch.nn as nn

from gpt2lib.chapters.layers import Conv1D


def split_heads(x, n_head):  # (B, T, C) -> (B, nh, T, hd)
    B, T, C = x.shape
    return x.reshape(B, T, n_head, C // n_head).permute(0, 2, 1, 3)


def merge_heads(x):  # (B, nh, T, hd) -> (B, T, C)
    B, nh, T, hd = x.shape
    return x.permute(0, 2, 1, 3).reshape(B, T, nh * hd)


class HookPoint(nn.Module):
    def forward(self, x):
        return x

    @property
    def active(self):
        return len(self._forward_hooks) + len(self._forward_pre_hooks) > 0


def attention_pattern(q, k, visible=None):
    scores = torch.einsum("bhtd,bhld->bhtl", q, k) / math.sqrt(q.size(-1))
    if visible is None:
        visible = torch.ones(q.size(-2), k.size(-2), dtype=torch.bool, device=q.device).tril()
    scores = scores.masked_fill(~visible, float("-inf"))
    e = torch.exp(scores - scores.amax(-1, keepdim=True))  # my own softmax
    return e / e.sum(-1, keepdim=True)


class CausalSelfAttention(nn.Module):
    learner_mark = "explicit softmax"
    announced = False  # say once, in each chapter, that this class is the one the model runs

    def __init__(self, config):
        super().__init__()
        if not CausalSelfAttention.announced:
            print("(the model below is built with my explicit-softmax attention)")
            CausalSelfAttention.announced = True
        self.n_head, self.n_embd = config.n_head, config.n_embd
        self.c_attn = Conv1D(config.n_embd, 3 * config.n_embd)
        self.c_proj = Conv1D(config.n_embd, config.n_embd)
        self.attn_dropout = nn.Dropout(config.attn_pdrop)
        self.resid_dropout = nn.Dropout(config.resid_pdrop)
        self.hook_pattern = HookPoint()

    def forward(self, x, kv_cache=None):
        q, k, v = (split_heads(t, self.n_head) for t in self.c_attn(x).chunk(3, dim=-1))
        visible = None
        if kv_cache is not None:
            k, v, visible = kv_cache.update(k, v)
        pattern = self.hook_pattern(attention_pattern(q, k, visible))
        return self.resid_dropout(self.c_proj(merge_heads(self.attn_dropout(pattern) @ v)))
