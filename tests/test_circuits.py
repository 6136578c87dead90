"""The shipped circuits model (data/circuits, issue #23) has the circuits chapter 8 looks for.

Measured with plain tensor code, not gpt2lib.interpret: the attention of each head is
recomputed from its queries and keys. On repeated sequences of common Tiny Shakespeare tokens
(<|endoftext|>, L random ids, the same L ids again) a head in layer >= 1 attends from the
second copy to the token after the current token's earlier copy (induction, >= 0.5); a head
attends to the previous token of Shakespeare text (>= 0.5); and the second copy costs at least
2 nats less than the first in the full 50,257-way softmax."""

from __future__ import annotations

import json
import math
import os
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F

REPO = Path(__file__).resolve().parent.parent
FOLDER = Path(os.environ.get("CIRCUITS_FOLDER", REPO / "data" / "circuits"))  # to try another model
BOS = 50256


def _patterns(model, idx):
    """Per layer, (B, n_head, T, T) attention probabilities, from the blocks' own weights."""
    T = idx.shape[1]
    x = model.wte(idx) + model.wpe(torch.arange(T))
    causal = torch.ones(T, T, dtype=torch.bool).tril()
    out = []
    for block in model.h:
        attn = block.attn
        C, nh = attn.n_embd, attn.n_head
        q, k, _ = attn.c_attn(block.ln_1(x)).split(C, dim=2)
        q = q.view(*q.shape[:2], nh, C // nh).transpose(1, 2)
        k = k.view(*k.shape[:2], nh, C // nh).transpose(1, 2)
        scores = (q @ k.transpose(-2, -1) / math.sqrt(C // nh)).masked_fill(~causal, float("-inf"))
        out.append(scores.softmax(-1))
        x = block(x)
    return out


@pytest.fixture(scope="module")
def measured():
    from gpt2lib.loading import from_pretrained
    from gpt2lib.tokenizer import get_encoding

    if not (FOLDER / "model.safetensors").is_file():
        pytest.fail(f"no circuits model in {FOLDER}")
    torch.set_grad_enabled(False)
    model = from_pretrained(FOLDER, device="cpu").eval()
    assert model.config.vocab_size == 50257
    record = FOLDER / "training_record.json"
    n_common = (
        json.loads(record.read_text(encoding="utf-8")).get("common_tokens", 1000)
        if record.is_file()
        else 1000
    )
    enc = get_encoding()
    ids = torch.tensor(
        enc.encode_ordinary((REPO / "data" / "tinyshakespeare.txt").read_text(encoding="utf-8"))
    )
    split = int(0.9 * len(ids))
    common = ids[:split].bincount(minlength=BOS + 1).argsort(descending=True)[:n_common]
    T = model.config.n_positions
    L = min(50, (T - 1) // 2)
    gen = torch.Generator().manual_seed(7)
    seg = common[torch.randint(0, len(common), (16, L), generator=gen)]
    rep = torch.cat([torch.full((16, 1), BOS), seg, seg], dim=1)  # (16, 2L + 1)
    pats = _patterns(model, rep)
    q = torch.arange(L + 1, 2 * L + 1)  # queries of the second copy; their earlier copy is at q - L
    induction = torch.stack([p[:, :, q, q - L + 1].mean(dim=(0, 2)) for p in pats])  # (layers, nh)
    nll = F.cross_entropy(
        model(rep)[:, :-1].transpose(1, 2), rep[:, 1:], reduction="none"
    )  # (16, 2L)
    first, second = (
        nll[:, 1:L].mean().item(),
        nll[:, L + 1 :].mean().item(),
    )  # tokens 2..L of each copy
    val = ids[split:]
    text = torch.stack(
        [val[s : s + T] for s in range(0, 16 * 3 * T, 3 * T)]
    )  # 16 validation windows
    previous = torch.stack(
        [p.diagonal(offset=-1, dim1=-2, dim2=-1).mean(dim=(0, -1)) for p in _patterns(model, text)]
    )
    return {"induction": induction, "previous": previous, "first": first, "second": second}


def test_an_induction_head_in_a_later_layer(measured):
    best = measured["induction"][1:].max().item()
    assert best >= 0.5, f"best induction score from layer 1 on: {best:.3f}"


def test_a_previous_token_head_on_shakespeare(measured):
    best = measured["previous"].max().item()
    assert best >= 0.5, f"best previous-token score on Shakespeare: {best:.3f}"


def test_the_second_copy_is_much_cheaper(measured):
    first, second = measured["first"], measured["second"]
    assert second <= first - 2.0, f"first copy {first:.2f}, second {second:.2f} nats (full softmax)"
