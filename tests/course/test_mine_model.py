"""The learner's GPT-2, assembled from the learner's own parts: attention written
with an explicit softmax and an einsum MLP, different from the solutions', carried through
mygpt2/ into the model that loads the stand-in's weights, generates, is inspected and gets
LoRA adapters; the block, left unfinished, is the reference's and is said to be.

The course's real solutions/ define the package; the learner's cells run in an IPython shell
whose working folder is a course's notebooks/, as a JupyterLab kernel's is."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
import torch

import gpt2lib
from gpt2lib.course import mine

REPO_ROOT = Path(__file__).resolve().parents[2]
STANDIN = REPO_ROOT / "data" / "standin"

# Chapter 3's attention with an einsum and a softmax by hand, and a mark of its own; the same
# answer tools/learner_run.py --answer runs through the notebooks.
ATTENTION = (REPO_ROOT / "tools" / "other_answers" / "attention_explicit_softmax.py").read_text(
    encoding="utf-8"
)

MLP = """
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
"""


def exercise_defining(root: Path, name: str) -> str:
    """The exercise ("3.6") whose export cells define `name`, as the solutions have it."""
    return next(c["exercise"] for c in mine._export_cells(root) if name in c["names"])


@pytest.fixture
def learner(tmp_path, monkeypatch):
    from IPython.core.interactiveshell import InteractiveShell

    root = tmp_path / "course"
    (root / "notebooks").mkdir(parents=True)
    (root / "solutions").symlink_to(REPO_ROOT / "solutions")
    monkeypatch.chdir(root / "notebooks")
    monkeypatch.setenv("GPT2LIB_LEARNER_PACKAGE", "1")
    monkeypatch.setattr(mine, "PASSED", set())
    monkeypatch.setattr(sys, "path", list(sys.path))
    InteractiveShell.clear_instance()
    shell = InteractiveShell.instance()
    yield root, shell
    InteractiveShell.clear_instance()
    for name in [m for m in sys.modules if m == "mygpt2" or m.startswith("mygpt2.")]:
        del sys.modules[name]


def ran(shell, code: str) -> None:
    result = shell.run_cell(code, store_history=True)
    assert result.error_in_exec is None, result.error_in_exec


@pytest.mark.slow
def test_the_learners_parts_make_the_model_that_loads_generates_and_is_inspected(learner, capsys):
    root, shell = learner
    attention, mlp = exercise_defining(root, "CausalSelfAttention"), exercise_defining(root, "MLP")
    block = exercise_defining(root, "Block")
    ran(shell, ATTENTION)
    ran(shell, f'from gpt2lib.course.checks import passed\npassed("Exercise {attention}")')
    ran(shell, MLP)
    ran(shell, f'passed("Exercise {mlp}")')  # the block's exercise is left unfinished
    capsys.readouterr()
    ran(shell, "from gpt2lib.course.mine import your_gpt2\nparts = your_gpt2()")
    line = capsys.readouterr().out.strip().splitlines()[-1]
    yours, reference = line.split("; the reference's: ")
    assert "attention" in yours and "mlp" in yours
    assert "block (" in reference and f"{block}: not passed yet" in reference
    parts = shell.user_ns["parts"]

    model = gpt2lib.from_pretrained(str(STANDIN), model_cls=parts.model.GPT2).eval()
    reference_model = gpt2lib.from_pretrained(str(STANDIN)).eval()
    attentions = [b.attn for b in model.h]
    assert all(a.learner_mark == "explicit softmax" for a in attentions)
    assert all(b.mlp.learner_mark == "einsum" for b in model.h)
    assert type(model.h[0]).__module__ == "mygpt2.block"  # the reference's code, on your parts

    ids = torch.randint(
        0, model.config.vocab_size, (2, 24), generator=torch.Generator().manual_seed(0)
    )
    with torch.no_grad():
        distance = (model(ids) - reference_model(ids)).abs().max().item()
    assert distance < 1e-4

    mine_tokens = gpt2lib.generate(model, ids[:1, :8], 12, temperature=0)
    assert torch.equal(
        mine_tokens, gpt2lib.generate(reference_model, ids[:1, :8], 12, temperature=0)
    )

    _, cache = gpt2lib.run_with_cache(model, ids[:1])  # through the learner's hook point
    _, expected = gpt2lib.run_with_cache(reference_model, ids[:1])
    assert torch.allclose(cache.attn[1], expected.attn[1], atol=1e-5)

    from gpt2lib.finetune import apply_lora, lora_layers

    apply_lora(model, rank=2, targets=("c_attn",))  # the learner's Conv1D layers are adapted
    assert len(lora_layers(model)) == model.config.n_layer
