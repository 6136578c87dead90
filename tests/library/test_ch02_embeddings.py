"""Chapter 2's modules: GPT2Config and gpt2lib.chapters.embeddings (the one token-id validator).
The checks of its exercises are tested in tests/graders/test_ch02_checks.py."""

from __future__ import annotations

import pytest
import torch

from gpt2lib.chapters.config import GPT2Config
from gpt2lib.chapters.embeddings import GPT2Embeddings, position_ids
from gpt2lib.validation import check_token_ids

TINY = dict(vocab_size=50, n_positions=12, n_embd=8, n_layer=2, n_head=2)


# --------------------------------------------------------------------------- GPT2Config


def test_defaults_match_hugging_face_gpt2():
    transformers = pytest.importorskip("transformers")
    hf = transformers.GPT2Config()
    ours = GPT2Config()
    for name in (
        "vocab_size",
        "n_positions",
        "n_embd",
        "n_layer",
        "n_head",
        "layer_norm_epsilon",
        "embd_pdrop",
        "attn_pdrop",
        "resid_pdrop",
    ):
        assert getattr(ours, name) == getattr(hf, name), name
    assert ours.head_dim == hf.n_embd // hf.n_head


def test_from_dict_reads_a_hugging_face_config_and_ignores_other_keys():
    transformers = pytest.importorskip("transformers")
    hf = transformers.GPT2Config(n_layer=3, n_head=4, n_embd=32, n_positions=64, vocab_size=99)
    ours = GPT2Config.from_dict(hf.to_dict())  # holds many keys GPT2Config does not know
    assert (ours.n_layer, ours.n_head, ours.n_embd, ours.n_positions, ours.vocab_size) == (
        3,
        4,
        32,
        64,
        99,
    )
    assert ours.head_dim == 8


@pytest.mark.parametrize(
    "name, layers, heads, width",
    [
        ("gpt2", 12, 12, 768),
        ("gpt2-medium", 24, 16, 1024),
        ("gpt2-large", 36, 20, 1280),
        ("gpt2-xl", 48, 25, 1600),
        ("openai-community/gpt2", 12, 12, 768),
    ],
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
    with pytest.raises(
        ValueError,
        match="unknown model name 'gpt3'; choose one of gpt2, gpt2-medium, gpt2-large, gpt2-xl",
    ):
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
        (
            dict(embd_pdrop=1.0),
            ValueError,
            r"embd_pdrop is a dropout probability and must be in \[0, 1\)",
        ),
        (dict(attn_pdrop=-0.1), ValueError, r"attn_pdrop .* must be in \[0, 1\)"),
        (dict(resid_pdrop="0.1"), TypeError, "resid_pdrop must be a number"),
        (dict(layer_norm_epsilon=0.0), ValueError, "layer_norm_epsilon must be greater than 0"),
        (dict(layer_norm_epsilon=-1e-5), ValueError, "layer_norm_epsilon must be greater than 0"),
        (
            dict(layer_norm_epsilon=float("inf")),
            ValueError,
            "layer_norm_epsilon must be greater than 0 and finite .* got inf",
        ),
        (
            dict(layer_norm_epsilon=float("nan")),
            ValueError,
            "layer_norm_epsilon must be greater than 0 and finite .* got nan",
        ),
        (dict(layer_norm_epsilon="1e-5"), TypeError, "layer_norm_epsilon must be a number"),
        (dict(embd_pdrop=float("nan")), ValueError, r"embd_pdrop is a dropout probability"),
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


@pytest.mark.parametrize(
    "make_idx, past, error, message",
    [
        (
            lambda: torch.tensor([1, 2, 3]),
            0,
            ValueError,
            r"shape \(B, T\), got \(3,\); for one sequence use idx.unsqueeze\(0\)",
        ),
        (
            lambda: torch.zeros(1, 2, 3, dtype=torch.long),
            0,
            ValueError,
            r"shape \(B, T\), got \(1, 2, 3\)$",
        ),
        (lambda: torch.tensor(5), 0, ValueError, r"shape \(B, T\), got \(\)$"),
        (
            lambda: torch.tensor([[1.0, 2.0]]),
            0,
            TypeError,
            r"token ids must be integers, got dtype torch.float32; convert with idx.long\(\)",
        ),
        (
            lambda: torch.tensor([[1.0, 2.0]], dtype=torch.float16),
            0,
            TypeError,
            "must be integers, got dtype torch.float16",
        ),
        (lambda: torch.tensor([[True]]), 0, TypeError, "must be integers, got dtype torch.bool"),
        (
            lambda: torch.tensor([[1 + 2j]]),
            0,
            TypeError,
            "must be integers, got dtype torch.complex64",
        ),
        (
            lambda: [[1, 2]],
            0,
            TypeError,
            r"must be a torch.Tensor of shape \(B, T\), got list; for a list of ids use torch.tensor\(\[ids\]\)",
        ),
        (lambda: None, 0, TypeError, "got NoneType"),
        (
            lambda: torch.zeros(0, 3, dtype=torch.long),
            0,
            ValueError,
            r"shape \(0, 3\) hold no tokens",
        ),
        (
            lambda: torch.zeros(2, 0, dtype=torch.long),
            0,
            ValueError,
            r"shape \(2, 0\) hold no tokens",
        ),
        (
            lambda: torch.tensor([[1, 50]]),
            0,
            ValueError,
            r"token ids must be in 0 \.\. 49 \(vocab_size=50\), got values from 1 to 50",
        ),
        (
            lambda: torch.tensor([[-1, 3]]),
            0,
            ValueError,
            r"token ids must be in 0 \.\. 49 \(vocab_size=50\), got values from -1 to 3",
        ),
        (
            lambda: torch.tensor([[-1, 3]], dtype=torch.int8),
            0,
            ValueError,
            r"0 \.\. 49 .* from -1 to 3",
        ),
        (
            lambda: torch.tensor([[200]], dtype=torch.uint8),
            0,
            ValueError,
            r"0 \.\. 49 .* from 200 to 200",
        ),
        (
            lambda: torch.tensor([[7, 60000]]).to(torch.uint16),
            0,
            ValueError,
            r"0 \.\. 49 .* from 7 to 60000",
        ),
        (
            lambda: torch.tensor([2**63 + 5], dtype=torch.uint64)[None],
            0,
            ValueError,
            r"0 \.\. 49 .* got a value of 2\*\*63 or more",
        ),
        (
            lambda: torch.zeros(1, 13, dtype=torch.long),
            0,
            ValueError,
            r"0 earlier \+ 13 new tokens is longer than the model's context of 12",
        ),
        (
            lambda: torch.zeros(1, 3, dtype=torch.long),
            10,
            ValueError,
            r"10 earlier \+ 3 new tokens .* context of 12",
        ),
        (
            lambda: torch.zeros(1, 3, dtype=torch.long),
            -1,
            ValueError,
            "past_length must be a whole number >= 0, got -1",
        ),
        (
            lambda: torch.zeros(1, 3, dtype=torch.long),
            1.0,
            ValueError,
            "past_length must be a whole number >= 0, got 1.0",
        ),
        (
            lambda: torch.zeros(1, 3, dtype=torch.long),
            True,
            ValueError,
            "past_length must be a whole number >= 0, got True",
        ),
    ],
)
def test_bad_token_ids_get_clear_errors(make_idx, past, error, message):
    config = GPT2Config(**TINY)
    with pytest.raises(error, match=message):
        check_token_ids(make_idx(), config, past_length=past)


def test_the_embeddings_forward_reads_no_token_values(monkeypatch):
    # the ids are checked once where they come in (generate, train, run_with_cache), not on
    # every forward: the module is the plain lesson code
    import gpt2lib.validation as validation

    monkeypatch.setattr(
        validation, "_check_range", lambda *a, **k: pytest.fail("the forward read the ids")
    )
    emb = GPT2Embeddings(GPT2Config(**TINY)).eval()
    assert emb(torch.tensor([[1, 2, 3]])).shape == (1, 3, 8)


def test_check_token_ids_is_the_validation_module_s():
    import gpt2lib.validation as validation

    assert check_token_ids is validation.check_token_ids


@pytest.mark.parametrize(
    "dtype",
    [
        torch.int8,
        torch.uint8,
        torch.int16,
        torch.int32,
        torch.int64,
        torch.uint16,
        torch.uint32,
        torch.uint64,
    ],
)
def test_every_integer_dtype_is_accepted_and_embeds_like_long(dtype):
    config = GPT2Config(**TINY)
    emb = GPT2Embeddings(config).eval()
    idx = torch.tensor([[0, 7, 49, 3], [1, 1, 2, 48]])
    assert check_token_ids(idx.to(dtype), config) is None  # checks only: never converts
    assert torch.equal(emb(idx.to(dtype)), emb(idx))


def test_check_token_ids_reads_no_values_on_meta():
    config = GPT2Config(**TINY)
    check_token_ids(torch.empty(2, 3, dtype=torch.long, device="meta"), config)
    with pytest.raises(ValueError, match="longer than the model's context"):
        check_token_ids(torch.empty(1, 13, dtype=torch.long, device="meta"), config)


def test_check_token_ids_reads_no_values_while_compiling(monkeypatch):
    config = GPT2Config(**TINY)
    out_of_range = torch.tensor([[0, 50]])
    with pytest.raises(ValueError, match="must be in 0 .. 49"):
        check_token_ids(out_of_range, config)
    monkeypatch.setattr(torch.compiler, "is_compiling", lambda: True)
    check_token_ids(out_of_range, config)  # values are not read: that would break the graph
    with pytest.raises(ValueError, match="longer than the model's context"):  # shapes still are
        check_token_ids(torch.zeros(1, 13, dtype=torch.long), config)


def test_full_context_is_allowed():
    config = GPT2Config(**TINY)
    emb = GPT2Embeddings(config).eval()
    assert emb(torch.zeros(1, 12, dtype=torch.long)).shape == (1, 12, 8)
    assert emb(torch.zeros(1, 2, dtype=torch.long), past_length=10).shape == (1, 2, 8)
    check_token_ids(torch.tensor([[0, 49]]), config, past_length=10)  # both ends of the range


def test_position_ids():
    assert position_ids(4).tolist() == [0, 1, 2, 3]
    assert position_ids(3, past_length=5).tolist() == [5, 6, 7]
    assert position_ids(0).numel() == 0
    # a bad past_length is refused by check_token_ids at the entry points (see
    # test_bad_token_ids_get_clear_errors); position_ids is the plain arange of the lesson


def test_the_module_uses_the_positions_of_position_ids():
    torch.manual_seed(0)
    emb = GPT2Embeddings(GPT2Config(**TINY)).eval()
    idx = torch.randint(0, 50, (2, 3))
    with torch.no_grad():
        assert torch.allclose(emb(idx, past_length=6), emb.wte(idx) + emb.wpe(position_ids(3, 6)))


def test_from_name_takes_the_hub_prefix_through_the_one_list_of_names():
    from gpt2lib import checkpoint, validation

    assert validation.check_model_name("openai-community/gpt2-xl", GPT2Config.SIZES) == "gpt2-xl"
    assert checkpoint.HUB_ORG == validation.HUB_ORG == "openai-community"
    assert checkpoint.hub_name("openai-community/gpt2-medium") == "gpt2-medium"
    assert checkpoint.HUB_MODELS == tuple(GPT2Config.SIZES)
