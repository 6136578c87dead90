"""The shipped circuits model (data/circuits) has the circuits chapter 8 looks for.

Measured with plain tensor code, not gpt2lib.inspection: the attention of each head is
recomputed from its queries and keys. On repeated sequences of the 2,000 commonest Tiny
Shakespeare training tokens (<|endoftext|>, L random ids, the same L ids again) a head in
layer >= 1 attends from the second copy to the token after the current token's earlier copy
(induction, >= 0.5); a head attends to the previous token of Shakespeare text (>= 0.5); and the
second copy costs at least 2 nats less than the first in the full 50,257-way softmax."""

from __future__ import annotations

import json
import math
import os
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F

REPO = Path(__file__).resolve().parents[2]
FOLDER = Path(os.environ.get("CIRCUITS_FOLDER", REPO / "data" / "circuits"))  # to try another model
BOS = 50256
# Repeats are drawn from the 2,000 commonest tokens of Tiny Shakespeare's training split (90% of
# its tokens): the ids a learner meets in chapter 8, which draws from as many as the model's
# training_record.json names (test_the_record_names_the_measured_pool).
N_COMMON = 2000


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


def _common_tokens(ids, n):
    """The n most frequent ids of the training split (first 90%), most frequent first."""
    return ids[: int(0.9 * len(ids))].bincount(minlength=BOS + 1).argsort(descending=True)[:n]


@pytest.fixture(scope="module")
def shakespeare_ids():
    from gpt2lib.tokenizer import get_encoding

    text = (REPO / "data" / "tinyshakespeare.txt").read_text(encoding="utf-8")
    return torch.tensor(get_encoding().encode_ordinary(text))


@pytest.fixture(scope="module")
def model():
    from gpt2lib import from_pretrained

    if not (FOLDER / "model.safetensors").is_file():
        pytest.fail(f"no circuits model in {FOLDER}")
    model = from_pretrained(FOLDER, device="cpu").eval()
    assert model.config.vocab_size == 50257
    return model


def _repeats(pool, L, rows=16, seed=7):
    """(rows, 2L + 1): <|endoftext|>, L random ids of `pool`, the same L ids again."""
    gen = torch.Generator().manual_seed(seed)
    seg = pool[torch.randint(0, len(pool), (rows, L), generator=gen)]
    return torch.cat([torch.full((rows, 1), BOS), seg, seg], dim=1)


@pytest.fixture(scope="module")
def measured(model, shakespeare_ids):
    ids = shakespeare_ids
    T = model.config.n_positions
    L = min(50, (T - 1) // 2)  # as chapter 8: two copies and the start token fit the context
    rep = _repeats(_common_tokens(ids, N_COMMON), L)  # (16, 2L + 1)
    with torch.no_grad():
        pats = _patterns(model, rep)
        q = torch.arange(L + 1, 2 * L + 1)  # the second copy's queries; earlier copy at q - L
        induction = torch.stack([p[:, :, q, q - L + 1].mean(dim=(0, 2)) for p in pats])
        logits = model(rep)[:, :-1]  # the full 50,257-way softmax
        nll = F.cross_entropy(logits.transpose(1, 2), rep[:, 1:], reduction="none")  # (16, 2L)
        val = ids[int(0.9 * len(ids)) :]
        text = torch.stack([val[s : s + T] for s in range(0, 16 * 3 * T, 3 * T)])  # 16 windows
        previous = torch.stack(
            [
                p.diagonal(offset=-1, dim1=-2, dim2=-1).mean(dim=(0, -1))
                for p in _patterns(model, text)
            ]
        )
    # tokens 2 .. L of each copy: no head can guess the first token of a copy
    first, second = nll[:, 1:L].mean().item(), nll[:, L + 1 :].mean().item()
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


def test_the_record_names_the_measured_pool():
    """Chapter 8 draws its repeats from the record's `common_tokens` commonest ids: the pool above."""
    record = json.loads((FOLDER / "training_record.json").read_text(encoding="utf-8"))
    assert record["common_tokens"] == N_COMMON


def test_transformers_reads_the_same_model(model, shakespeare_ids):
    """The folder is GPT-2 in the hub's layout: transformers' GPT2LMHeadModel gives our logits."""
    transformers = pytest.importorskip("transformers")
    theirs = transformers.GPT2LMHeadModel.from_pretrained(FOLDER, dtype=torch.float32).eval()
    rep = _repeats(_common_tokens(shakespeare_ids, N_COMMON), 15, rows=2)
    with torch.no_grad():
        ours, reference = model(rep), theirs(rep).logits
    torch.testing.assert_close(ours, reference, atol=1e-4, rtol=1e-4)
