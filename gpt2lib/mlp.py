# DRAFT: to be replaced by the export cells of solutions/04_mlp.ipynb
import math

import torch
import torch.nn as nn

from gpt2lib.attention import Conv1D


def gelu_tanh(x):
    """GPT-2's GELU: the tanh approximation, not the exact erf form."""
    return 0.5 * x * (1.0 + torch.tanh(math.sqrt(2.0 / math.pi) * (x + 0.044715 * x.pow(3))))


class MLP(nn.Module):
    def __init__(self, config):
        super().__init__()
        self.c_fc = Conv1D(config.n_embd, 4 * config.n_embd)
        self.c_proj = Conv1D(4 * config.n_embd, config.n_embd)
        self.dropout = nn.Dropout(config.resid_pdrop)

    def forward(self, x):  # (B, T, C) -> (B, T, C)
        h = torch.nn.functional.gelu(self.c_fc(x), approximate="tanh")  # (B, T, 4C)
        return self.dropout(self.c_proj(h))
