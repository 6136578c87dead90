"""Chapter 4's MLP written with einsum and GELU by hand (tools/learner_run.py --answer
MLP=this file)."""

import math

import torch
import torch.nn as nn

from gpt2lib.chapters.layers import Conv1D


class MLP(nn.Module):
    learner_mark = "einsum"

    def __init__(self, config):
        super().__init__()
        self.c_fc = Conv1D(config.n_embd, 4 * config.n_embd)
        self.c_proj = Conv1D(4 * config.n_embd, config.n_embd)
        self.dropout = nn.Dropout(config.resid_pdrop)

    def forward(self, x):
        h = torch.einsum("btc,ch->bth", x, self.c_fc.weight) + self.c_fc.bias
        h = 0.5 * h * (1 + torch.tanh(math.sqrt(2 / math.pi) * (h + 0.044715 * h**3)))
        return self.dropout(torch.einsum("bth,hc->btc", h, self.c_proj.weight) + self.c_proj.bias)
