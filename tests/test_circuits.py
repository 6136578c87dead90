"""The shipped circuits model (data/circuits) has the circuits chapter 8 looks for (#23 item 1).

Measured here without gpt2lib.interpret: the attention patterns come from transformers'
GPT2LMHeadModel (eager attention, output_attentions=True), after checking that it and
gpt2lib.from_pretrained give the same logits from the same folder.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F

from gpt2lib.loading import from_pretrained
from gpt2lib.tokenizer import get_encoding

transformers = pytest.importorskip("transformers")

REPO = Path(__file__).resolve().parent.parent
FOLDER = REPO / "data" / "circuits"
BOS = 50256

# tools/make_circuits.py has not yet found a recipe that meets #23's targets, so no model ships
# yet; these tests are the acceptance check for the one that will (nothing is skipped then)
pytestmark = pytest.mark.skipif(not (FOLDER / "model.safetensors").is_file(),
                                reason="no data/circuits model shipped yet (tools/make_circuits.py)")


@pytest.fixture(scope="module")
def setting():
    record = json.loads((FOLDER / "training_record.json").read_text(encoding="utf-8"))
    text = (REPO / "data" / "tinyshakespeare.txt").read_text(encoding="utf-8")
    ids = torch.tensor(get_encoding().encode_ordinary(text))
    split = int(0.9 * len(ids))
    train, val = ids[:split], ids[split:]
    pool = torch.bincount(train, minlength=BOS + 1).argsort(descending=True)[:record["common_tokens"]]
    hf = transformers.GPT2LMHeadModel.from_pretrained(
        FOLDER, torch_dtype=torch.float32, attn_implementation="eager").eval()
    ours = from_pretrained(FOLDER, device="cpu").eval()
    return {"record": record, "val": val, "pool": pool, "hf": hf, "ours": ours,
            "n_positions": hf.config.n_positions}


def repeated(pool, batch, seq_len, seed):
    """(batch, 2 * seq_len + 1): <|endoftext|>, seq_len random pool ids, the same ids again."""
    gen = torch.Generator().manual_seed(seed)
    seg = pool[torch.randint(0, len(pool), (batch, seq_len), generator=gen)]
    return torch.cat([torch.full((batch, 1), BOS), seg, seg], dim=1)


def test_the_folder_is_small_and_documented():
    assert (FOLDER / "model.safetensors").stat().st_size <= 20 * 2**20
    for name in ("config.json", "README.md", "training_record.json", "training_log.json"):
        assert (FOLDER / name).is_file(), name
    log = json.loads((FOLDER / "training_log.json").read_text(encoding="utf-8"))
    assert {"step", "induction", "previous"} <= set(log["columns"]) and len(log["rows"]) >= 10


def test_gpt2lib_and_transformers_read_the_same_model(setting):
    idx = repeated(setting["pool"], 2, 20, seed=5)
    with torch.no_grad():
        ours = setting["ours"](idx)
        theirs = setting["hf"](idx).logits
    assert ours.shape == theirs.shape == (2, 41, 50257)
    torch.testing.assert_close(ours, theirs, atol=2e-4, rtol=1e-4)


def test_induction_head_in_a_later_layer_and_cheaper_second_copy(setting):
    seq_len = min(50, (setting["n_positions"] - 1) // 2)
    for seed in (0, 1):  # two different sets of sequences
        idx = repeated(setting["pool"], 8, seq_len, seed)
        with torch.no_grad():
            out = setting["hf"](idx, output_attentions=True)
        # query q of the second copy should attend to key q - seq_len + 1: the token after
        # the earlier copy of the current token
        q = torch.arange(seq_len + 1, 2 * seq_len + 1)
        scores = torch.stack([a[:, :, q, q - seq_len + 1].mean(dim=(0, 2)) for a in out.attentions])
        assert scores[1:].max() >= 0.5, f"no induction head in layers >= 1: {scores}"
        nll = F.cross_entropy(out.logits[:, :-1].transpose(1, 2), idx[:, 1:], reduction="none")
        first, second = nll[:, :seq_len].mean(), nll[:, seq_len:].mean()
        assert first - second >= 2.0, f"second copy {second:.2f} nats vs first {first:.2f}"


def test_previous_token_head_on_shakespeare(setting):
    T = setting["n_positions"]
    val = setting["val"]
    text = torch.stack([val[s:s + T] for s in range(0, 16 * 3 * T, 3 * T)])  # 16 windows
    with torch.no_grad():
        out = setting["hf"](text, output_attentions=True)
    previous = torch.stack([a.diagonal(offset=-1, dim1=-2, dim2=-1).mean(dim=(0, -1))
                            for a in out.attentions])  # (n_layer, n_head)
    assert previous.max() >= 0.5, f"no previous-token head: {previous}"
