"""Chapter 4's MLP written another way than the solution: the tanh GELU by hand, the hidden
width read off the layer (tools/learner_run.py --answer MLP=this file). It calls its two
layers rather than reading their weights, so that chapter 10's adapters, which wrap the
layers, still apply."""

import math

import torch
import torch.nn as nn

from gpt2lib.chapters.layers import Conv1D


class MLP(nn.Module):
    learner_mark = "GELU by hand"

    def __init__(self, config):
        super().__init__()
        width = config.n_embd
        self.c_fc = Conv1D(width, 4 * width)
        self.c_proj = Conv1D(4 * width, width)
        self.dropout = nn.Dropout(config.resid_pdrop)

    def forward(self, x):  # (B, T, C) -> (B, T, C)
        h = self.c_fc(x)  # (B, T, 4C)
        h = 0.5 * h * (1.0 + torch.tanh(math.sqrt(2.0 / math.pi) * (h + 0.044715 * h * h * h)))
        return self.dropout(self.c_proj(h))
