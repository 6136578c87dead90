"""Chapter 2: GPT2Config, gpt2lib.embeddings, and the checks behind exercises 2.1-2.3."""

from __future__ import annotations

import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F

from gpt2lib.checks import CheckFailed
from gpt2lib.checks import embeddings as checks
from gpt2lib.config import GPT2Config
from gpt2lib.embeddings import (
    GPT2Embeddings,
    check_token_ids,
    embedding_parameter_count,
    position_ids,
)

TINY = dict(vocab_size=50, n_positions=12, n_embd=8, n_layer=2, n_head=2)


# --------------------------------------------------------------------------- GPT2Config


def test_defaults_match_hugging_face_gpt2():
    transformers = pytest.importorskip("transformers")
    hf = transformers.GPT2Config()
    ours = GPT2Config()
    for name in ("vocab_size", "n_positions", "n_embd", "n_layer", "n_head", "layer_norm_epsilon",
                 "embd_pdrop", "attn_pdrop", "resid_pdrop"):
        assert getattr(ours, name) == getattr(hf, name), name
    assert ours.head_dim == hf.n_embd // hf.n_head


def test_from_dict_reads_a_hugging_face_config_and_ignores_other_keys():
    transformers = pytest.importorskip("transformers")
    hf = transformers.GPT2Config(n_layer=3, n_head=4, n_embd=32, n_positions=64, vocab_size=99)
    ours = GPT2Config.from_dict(hf.to_dict())  # holds many keys GPT2Config does not know
    assert (ours.n_layer, ours.n_head, ours.n_embd, ours.n_positions, ours.vocab_size) == (3, 4, 32, 64, 99)
    assert ours.head_dim == 8


@pytest.mark.parametrize(
    "name, layers, heads, width",
    [("gpt2", 12, 12, 768), ("gpt2-medium", 24, 16, 1024), ("gpt2-large", 36, 20, 1280),
     ("gpt2-xl", 48, 25, 1600), ("openai-community/gpt2", 12, 12, 768)],
)
def test_from_name_gives_the_published_sizes(name, layers, heads, width):
    config = GPT2Config.from_name(name)
    assert (config.n_layer, config.n_head, config.n_embd) == (layers, heads, width)
    assert config.head_dim == 64  # every released GPT-2 uses 64 features per head
    assert config.vocab_size == 50257 and config.n_positions == 1024


def test_from_name_overrides():
    config = GPT2Config.from_name("gpt2", embd_pdrop=0.0, n_layer=2)
    assert config.n_layer == 2 and config.embd_pdrop == 0.0 and config.n_embd == 768


def test_from_name_unknown_lists_the_valid_names():
    with pytest.raises(ValueError, match="unknown model name 'gpt3'; choose one of gpt2, gpt2-medium, gpt2-large, gpt2-xl"):
        GPT2Config.from_name("gpt3")
    with pytest.raises(TypeError, match="must be a string"):
        GPT2Config.from_name(124)


@pytest.mark.parametrize(
    "bad, error, message",
    [
        (dict(n_embd=770), ValueError, r"n_embd \(770\) must be divisible by n_head \(12\)"),
        (dict(n_head=0), ValueError, "n_head must be at least 1, got 0"),
        (dict(vocab_size=-5), ValueError, "vocab_size must be at least 1"),
        (dict(n_positions=0), ValueError, "n_positions must be at least 1"),
        (dict(n_layer=0), ValueError, "n_layer must be at least 1"),
        (dict(n_layer=2.5), TypeError, "n_layer must be a whole number"),
        (dict(n_embd="768"), TypeError, "n_embd must be a whole number"),
        (dict(n_head=True), TypeError, "n_head must be a whole number"),
        (dict(embd_pdrop=1.0), ValueError, r"embd_pdrop is a dropout probability and must be in \[0, 1\)"),
        (dict(attn_pdrop=-0.1), ValueError, r"attn_pdrop .* must be in \[0, 1\)"),
        (dict(resid_pdrop="0.1"), TypeError, "resid_pdrop must be a number"),
        (dict(layer_norm_epsilon=0.0), ValueError, "layer_norm_epsilon must be greater than 0"),
    ],
)
def test_config_refuses_sizes_that_cannot_work(bad, error, message):
    with pytest.raises(error, match=message):
        GPT2Config(**bad)


def test_from_dict_needs_a_dict():
    with pytest.raises(TypeError, match="from_dict takes a dict"):
        GPT2Config.from_dict([("n_layer", 2)])


def test_config_converts_integral_numbers_to_int():
    config = GPT2Config(n_layer=torch.tensor(3).item(), embd_pdrop=0)
    assert type(config.n_layer) is int and type(config.embd_pdrop) is float


# --------------------------------------------------------------------------- embeddings module


def test_embeddings_are_token_rows_plus_position_rows():
    torch.manual_seed(0)
    config = GPT2Config(**TINY)
    emb = GPT2Embeddings(config).eval()
    idx = torch.randint(0, config.vocab_size, (3, 7))
    out = emb(idx)
    assert out.shape == (3, 7, config.n_embd)
    for b in range(3):
        for t in range(7):
            want = emb.wte.weight[idx[b, t]] + emb.wpe.weight[t]
            assert torch.allclose(out[b, t], want)


def test_past_length_continues_the_positions():
    torch.manual_seed(0)
    emb = GPT2Embeddings(GPT2Config(**TINY)).eval()
    idx = torch.randint(0, 50, (2, 9))
    full = emb(idx)
    head, tail = emb(idx[:, :4]), emb(idx[:, 4:], past_length=4)
    assert torch.allclose(torch.cat([head, tail], dim=1), full)
    assert not torch.allclose(emb(idx[:, 4:]), tail)  # without the offset the vectors differ


def test_dropout_only_in_training():
    torch.manual_seed(0)
    emb = GPT2Embeddings(GPT2Config(**{**TINY, "embd_pdrop": 0.5}))
    idx = torch.randint(0, 50, (4, 10))
    emb.eval()
    assert torch.equal(emb(idx), emb(idx))
    emb.train()
    dropped = emb(idx)
    zero_fraction = (dropped == 0).float().mean().item()
    assert 0.35 < zero_fraction < 0.65
    kept = dropped != 0
    emb.eval()
    assert torch.allclose(dropped[kept], emb(idx)[kept] * 2.0)  # survivors scaled by 1 / (1 - p)


def test_initialisation_is_gpt2s():
    torch.manual_seed(0)
    emb = GPT2Embeddings(GPT2Config())
    assert abs(emb.wte.weight.std().item() - 0.02) < 1e-3
    assert abs(emb.wpe.weight.std().item() - 0.02) < 2e-3


def test_parameter_count_matches_the_module():
    for config in (GPT2Config(**TINY), GPT2Config.from_name("gpt2")):
        emb = GPT2Embeddings(config) if config.n_embd < 100 else None
        if emb is not None:
            assert embedding_parameter_count(config) == sum(p.numel() for p in emb.parameters())
    assert embedding_parameter_count(GPT2Config()) == 50257 * 768 + 1024 * 768


@pytest.mark.parametrize(
    "make_idx, past, error, message",
    [
        (lambda: torch.tensor([1, 2, 3]), 0, ValueError, r"shape \(B, T\), got \(3,\); for one sequence use idx.unsqueeze\(0\)"),
        (lambda: torch.zeros(1, 2, 3, dtype=torch.long), 0, ValueError, r"shape \(B, T\)"),
        (lambda: torch.tensor([[1.0, 2.0]]), 0, TypeError, "token ids must be integers"),
        (lambda: torch.tensor([[True]]), 0, TypeError, "token ids must be integers"),
        (lambda: [[1, 2]], 0, TypeError, "must be a torch.Tensor"),
        (lambda: torch.tensor([[1, 50]]), 0, ValueError, r"token ids must be in 0 \.\. 49 \(vocab_size=50\), got values from 1 to 50"),
        (lambda: torch.tensor([[-1, 3]]), 0, ValueError, r"token ids must be in 0 \.\. 49"),
        (lambda: torch.zeros(1, 13, dtype=torch.long), 0, ValueError, r"0 earlier \+ 13 new tokens is longer than the model's context of 12"),
        (lambda: torch.zeros(1, 3, dtype=torch.long), 10, ValueError, r"10 earlier \+ 3 new tokens .* context of 12"),
        (lambda: torch.zeros(1, 3, dtype=torch.long), -1, ValueError, "past_length must be a whole number >= 0"),
    ],
)
def test_bad_token_ids_get_clear_errors(make_idx, past, error, message):
    emb = GPT2Embeddings(GPT2Config(**TINY))
    with pytest.raises(error, match=message):
        emb(make_idx(), past_length=past)


def test_full_context_is_allowed():
    emb = GPT2Embeddings(GPT2Config(**TINY)).eval()
    assert emb(torch.zeros(1, 12, dtype=torch.long)).shape == (1, 12, 8)
    assert emb(torch.zeros(1, 2, dtype=torch.long), past_length=10).shape == (1, 2, 8)
    check_token_ids(torch.zeros(0, 0, dtype=torch.long), GPT2Config(**TINY))  # empty: nothing to check


def test_position_ids():
    assert position_ids(4).tolist() == [0, 1, 2, 3]
    assert position_ids(3, past_length=5).tolist() == [5, 6, 7]
    assert position_ids(0).numel() == 0
    with pytest.raises(ValueError, match="length must be a whole number >= 0"):
        position_ids(-2)
    with pytest.raises(ValueError, match="past_length must be a whole number >= 0, got 1.5"):
        position_ids(2, past_length=1.5)


# --------------------------------------------------------------------------- check 2.1


def good_one_hot_embed(token_ids, table):
    return F.one_hot(token_ids, num_classes=table.shape[0]).to(table.dtype) @ table


def test_check_one_hot_accepts_right_answers(capsys):
    checks.check_one_hot_embed(good_one_hot_embed)
    checks.check_one_hot_embed(lambda ids, table: table[ids])  # any correct answer passes
    checks.check_one_hot_embed(lambda ids, table: F.embedding(ids, table))
    assert capsys.readouterr().out.count("✅ Exercise 2.1") == 3


@pytest.mark.parametrize(
    "wrong, phrase",
    [
        (lambda ids, table: F.one_hot(ids, table.shape[0]).float(), "that is the one-hot matrix itself"),
        (lambda ids, table: F.one_hot(ids, table.shape[0]) @ table.long(), "embeddings are floating point"),
        (lambda ids, table: table[(ids - 1) % table.shape[0]], "rows are shifted by one"),
        (lambda ids, table: table[(ids + 1) % table.shape[0]], "shifted by one the other way"),
        (lambda ids, table: F.one_hot(ids).float() @ table, "F.one_hot(ids) alone makes vectors only max(ids) + 1 long"),
        (lambda ids, table: (F.one_hot(ids, table.shape[0]).float() @ table).detach(), "no gradient reaches the table"),
        (lambda ids, table: torch.tensor((F.one_hot(ids, table.shape[0]).float() @ table).tolist()), "no gradient reaches the table"),
        (lambda ids, table: table[ids].sum(-1), "expected shape (2, 6, 5)"),
        (lambda ids, table: table[ids] * 2, "not the table rows of the ids"),
        (lambda ids, table: table[ids].tolist(), "should be a torch.Tensor"),
        (lambda ids, table: table[ids] if ids.dim() == 2 else table[ids].unsqueeze(0), "make it work for ids of any shape"),
    ],
)
def test_check_one_hot_names_the_mistake(wrong, phrase):
    with pytest.raises(CheckFailed, match=phrase.replace("(", r"\(").replace(")", r"\)").replace("+", r"\+")):
        checks.check_one_hot_embed(wrong)


def test_checks_report_stubs_and_wrong_signatures():
    def stub(token_ids, table):
        raise NotImplementedError("Exercise 2.1 (one_hot_embed): replace this line with your code")

    with pytest.raises(CheckFailed, match="not done yet"):
        checks.check_one_hot_embed(stub)
    with pytest.raises(CheckFailed, match="Keep the signature"):
        checks.check_one_hot_embed(lambda token_ids: token_ids)
    with pytest.raises(CheckFailed, match="Keep the signature"):
        checks.check_embed(lambda idx, wte, wpe: wte(idx))  # no past_length parameter
    with pytest.raises(CheckFailed, match="Keep the signature"):
        checks.check_embedding_parameter_count(lambda: 0)


# --------------------------------------------------------------------------- check 2.2


def good_embed(idx, wte, wpe, past_length=0):
    return wte(idx) + wpe(torch.arange(past_length, past_length + idx.shape[1]))


def test_check_embed_accepts_right_answers(capsys):
    checks.check_embed(good_embed)
    checks.check_embed(lambda idx, wte, wpe, past_length=0: wte.weight[idx] + wpe.weight[past_length: past_length + idx.shape[1]])
    assert capsys.readouterr().out.count("✅ Exercise 2.2") == 2


@pytest.mark.parametrize(
    "wrong, phrase",
    [
        (lambda idx, wte, wpe, past_length=0: wte(idx) + wpe(torch.arange(past_length + 1, past_length + idx.shape[1] + 1)), "positions start at 1"),
        (lambda idx, wte, wpe, past_length=0: wte(idx) + wpe(idx), "looked up the token ids in the position table"),
        (lambda idx, wte, wpe, past_length=0: wte(idx) + wpe(torch.arange(idx.shape[1])), "you ignored past_length"),
        (lambda idx, wte, wpe, past_length=0: wte(idx), "no position embeddings"),
        (lambda idx, wte, wpe, past_length=0: wte(idx) + wpe(torch.arange(idx.shape[0]))[:, None], "batch index as the position"),
        (lambda idx, wte, wpe, past_length=0: wpe(torch.arange(past_length, past_length + idx.shape[1])).expand(idx.shape[0], -1, -1), "only the position embeddings"),
        (lambda idx, wte, wpe, past_length=0: torch.cat([wte(idx), wpe(torch.arange(idx.shape[1])).expand(idx.shape[0], -1, -1)], -1), "added, not concatenated"),
        (lambda idx, wte, wpe, past_length=0: wte(idx) - wpe(torch.arange(past_length, past_length + idx.shape[1])), "right shape but wrong values"),
        (lambda idx, wte, wpe, past_length=0: idx, "should be a torch.Tensor|dtype torch.int64"),
    ],
)
def test_check_embed_names_the_mistake(wrong, phrase):
    with pytest.raises(CheckFailed, match=phrase):
        checks.check_embed(wrong)


# --------------------------------------------------------------------------- check 2.3


def test_check_count_accepts_right_answers(capsys):
    checks.check_embedding_parameter_count(lambda c: (c.vocab_size + c.n_positions) * c.n_embd)
    checks.check_embedding_parameter_count(lambda c: sum(p.numel() for p in (
        nn.Embedding(c.vocab_size, c.n_embd, _weight=torch.empty(c.vocab_size, c.n_embd)).parameters())) + c.n_positions * c.n_embd)
    assert capsys.readouterr().out.count("✅ Exercise 2.3") == 2


@pytest.mark.parametrize(
    "wrong, phrase",
    [
        (lambda c: c.vocab_size * c.n_embd, "only the token table"),
        (lambda c: c.n_positions * c.n_embd, "only the position table"),
        (lambda c: 2 * c.vocab_size * c.n_embd + c.n_positions * c.n_embd, "ties"),
        (lambda c: (c.vocab_size + c.n_positions) * c.n_embd * c.n_layer, "multiplied by n_layer"),
        (lambda c: c.vocab_size * c.n_positions, "each table has n_embd columns"),
        (lambda c: c.vocab_size + c.n_positions, "counted rows only"),
        (lambda c: 124_000_000, "not the size of wte plus wpe"),
        (lambda c: "39M", "return a number"),
    ],
)
def test_check_count_names_the_mistake(wrong, phrase):
    with pytest.raises(CheckFailed, match=phrase):
        checks.check_embedding_parameter_count(wrong)


# --------------------------------------------------------------------------- more learner mistakes


@pytest.mark.parametrize(
    "wrong, phrase",
    [
        (lambda ids, table: F.one_hot(ids, table.shape[0]) @ table, r"F.one_hot returns integers \(torch.long\)"),
        (lambda ids, table: table @ F.one_hot(ids, table.shape[0]).float(), "one-hot vectors .* go on the left"),
        (lambda ids, table: F.one_hot(ids, table.shape[1]).float() @ table, "num_classes is the vocabulary size"),
    ],
)
def test_check_one_hot_explains_errors_from_the_matmul(wrong, phrase):
    with pytest.raises(CheckFailed, match=phrase):
        checks.check_one_hot_embed(wrong)


def test_check_embed_explains_positions_counted_along_the_batch():
    def wrong(idx, wte, wpe, past_length=0):
        T = idx.shape[0]  # the batch size, not the length
        return wte(idx) + wpe(torch.arange(past_length, past_length + T))

    with pytest.raises(CheckFailed, match=r"T = idx.shape\[1\] positions"):
        checks.check_embed(wrong)


@pytest.mark.parametrize(
    "wrong, phrase",
    [
        (lambda c: (c.vocab_size + c.n_positions) * (c.n_embd + 1), "no bias"),
        (lambda c: (50257 + 1024) * 768, "you returned GPT-2 small's count"),
    ],
)
def test_check_count_names_more_mistakes(wrong, phrase):
    with pytest.raises(CheckFailed, match=phrase):
        checks.check_embedding_parameter_count(wrong)
