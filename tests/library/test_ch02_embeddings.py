"""Chapter 2: GPT2Config, gpt2lib.embeddings (the one token-id validator), and the checks behind
exercises 2.1-2.6 and the challenge, one test per planted mistake."""

from __future__ import annotations

import re

import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F
from check_cases import assert_named, assert_not_done_yet, planted

from gpt2lib.chapters.config import GPT2Config
from gpt2lib.chapters.embeddings import GPT2Embeddings, position_ids
from gpt2lib.course.checks import CheckFailed
from gpt2lib.course.checks import embeddings as checks
from gpt2lib.course.checks._core import NotDoneYet
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


# --------------------------------------------------------------------------- check 2.1


def good_one_hot_embed(token_ids, table):
    return F.one_hot(token_ids, num_classes=table.shape[0]).to(table.dtype) @ table


def test_check_one_hot_accepts_right_answers(capsys):
    checks.check_one_hot_embed(good_one_hot_embed)
    checks.check_one_hot_embed(  # any product form passes; a lookup (table[ids]) does not
        lambda ids, table: (F.one_hot(ids, table.shape[0])[..., None] * table).sum(-2)
    )
    checks.check_one_hot_embed(
        lambda ids, table: F.one_hot(ids, table.shape[0]).double() @ table.double()
    )
    checks.check_one_hot_embed(
        lambda ids, table: torch.einsum(
            "...v,vc->...c", F.one_hot(ids, table.shape[0]).float(), table
        )
    )
    assert capsys.readouterr().out.count("✅ Exercise 2.1") == 4


@pytest.mark.parametrize("mistake", checks.ONE_HOT_MISTAKES, ids=lambda m: m.name)
def test_check_one_hot_names_every_planted_mistake(mistake):
    with pytest.raises(CheckFailed) as info:
        checks.check_one_hot_embed(mistake.fn)
    assert mistake.message in str(info.value)


@pytest.mark.parametrize(
    "wrong, phrase",
    [
        (
            lambda ids, table: F.one_hot(ids, table.shape[0]).float(),
            "that is the one-hot matrix itself",
        ),
        (
            lambda ids, table: F.one_hot(ids, table.shape[0]) @ table.long(),
            "embeddings are floating point",
        ),
        (
            lambda ids, table: F.one_hot(ids).float() @ table,
            r"F.one_hot\(ids\) alone makes vectors only max\(ids\) \+ 1 long",
        ),
        (
            lambda ids, table: (F.one_hot(ids, table.shape[0]).float() @ table).detach(),
            "no gradient reaches the table",
        ),
        (
            lambda ids, table: torch.tensor(
                (F.one_hot(ids, table.shape[0]).float() @ table).tolist()
            ),
            "no gradient reaches the table",
        ),
        (lambda ids, table: table[ids].sum(-1), r"shape \(2, 6\), expected \(2, 6, 5\)"),
        (lambda ids, table: table[ids] * 2, "not the table rows of the ids"),
        (lambda ids, table: table[ids] * float("nan"), "contains NaN"),
        (lambda ids, table: table[ids].tolist(), "should be a torch.Tensor"),
        (
            lambda ids, table: table[ids] if ids.dim() == 2 else table[ids].unsqueeze(0),
            "make it work for ids of any shape",
        ),
        (
            lambda ids, table: F.one_hot(ids, table.shape[0]) @ table,
            r"F.one_hot returns integers \(torch.long\)",
        ),
        (
            lambda ids, table: table @ F.one_hot(ids, table.shape[0]).float(),
            r"one-hot vectors .* go on the left",
        ),
        (
            lambda ids, table: F.one_hot(ids, table.shape[1]).float() @ table,
            "num_classes is the vocabulary size",
        ),
    ],
)
def test_check_one_hot_names_other_mistakes(wrong, phrase):
    with pytest.raises(CheckFailed, match=phrase):
        checks.check_one_hot_embed(wrong)


def test_checks_report_stubs_and_wrong_signatures():
    def stub(*args, **kwargs):
        raise NotImplementedError("Exercise 2.x: replace this line with your code")

    class StubModule(GPT2Embeddings):
        def forward(self, idx, past_length=0):
            raise NotImplementedError("Exercise 2.3: replace this line with your code")

    for check, answer in (
        (checks.check_one_hot_embed, stub),
        (checks.check_lookup_backward, stub),
        (checks.check_gpt2_embeddings, StubModule),
    ):
        with pytest.raises(NotDoneYet, match="not done yet"):
            check(answer)
    with pytest.raises(CheckFailed, match="Keep the signature"):
        checks.check_one_hot_embed(lambda token_ids: token_ids)
    with pytest.raises(CheckFailed, match="Keep the signature"):
        checks.check_lookup_backward(lambda token_ids, grad_out: grad_out)

    class NoPastLength(GPT2Embeddings):
        def forward(self, idx):
            return self.wte(idx)

    with pytest.raises(CheckFailed, match="Keep the signature"):
        checks.check_gpt2_embeddings(NoPastLength)


# --------------------------------------------------------------------------- check 2.2


def loop_lookup_backward(token_ids, grad_out, vocab_size):  # a right answer, written with loops
    grad = torch.zeros(vocab_size, grad_out.shape[-1])
    for i, row in zip(token_ids.reshape(-1).tolist(), grad_out.reshape(-1, grad_out.shape[-1])):
        grad[i] += row
    return grad


def test_check_lookup_backward_accepts_right_answers(capsys):
    checks.check_lookup_backward(checks.lookup_backward_reference)
    checks.check_lookup_backward(loop_lookup_backward)
    checks.check_lookup_backward(
        lambda ids, g, V: F.one_hot(ids.reshape(-1), V).to(g.dtype).T @ g.reshape(-1, g.shape[-1])
    )
    checks.check_lookup_backward(
        lambda ids, g, V: torch.zeros(V, g.shape[-1]).index_put_(
            (ids.reshape(-1),), g.reshape(-1, g.shape[-1]), accumulate=True
        )
    )
    assert capsys.readouterr().out.count("✅ Exercise 2.2") == 4


def test_the_reference_is_what_autograd_computes():
    gen = torch.Generator().manual_seed(3)
    ids = torch.randint(0, 6, (3, 7), generator=gen)
    g = torch.randn(3, 7, 4, generator=gen)
    table = torch.zeros(6, 4, requires_grad=True)
    F.embedding(ids, table).backward(g)
    assert torch.allclose(checks.lookup_backward_reference(ids, g, 6), table.grad)


@pytest.mark.parametrize("mistake", checks.BACKWARD_MISTAKES, ids=lambda m: m.name)
def test_check_lookup_backward_names_every_planted_mistake(mistake):
    with pytest.raises(CheckFailed) as info:
        checks.check_lookup_backward(mistake.fn)
    assert mistake.message in str(info.value)


def in_place_add_with_repeats(
    ids, g, V
):  # the classic: += on an advanced index keeps one value per index
    grad = torch.zeros(V, g.shape[-1])
    grad[ids.reshape(-1)] += g.reshape(-1, g.shape[-1])
    return grad


def first_use_kept(
    ids, g, V
):  # another way to lose repeats: not the planted one, found by the rows
    grad = torch.zeros(V, g.shape[-1])
    seen = set()
    for i, row in zip(ids.reshape(-1).tolist(), g.reshape(-1, g.shape[-1])):
        if i not in seen:
            grad[i], _ = row, seen.add(i)
    return grad


@pytest.mark.parametrize(
    "wrong, phrase",
    [
        (in_place_add_with_repeats, "a repeated id keeps only ONE of its gradients"),
        (first_use_kept, "a repeated id keeps only ONE of its gradients"),
        (
            lambda ids, g, V: checks.lookup_backward_reference(ids, g, V).T,
            r"that is \(C, V\), transposed",
        ),
        (lambda ids, g, V: g.reshape(-1, g.shape[-1]), "one row per use"),
        (
            lambda ids, g, V: checks.lookup_backward_reference(ids, g, V)[ids.unique()],
            "return all V rows",
        ),
        (lambda ids, g, V: g, "that is grad_out's shape"),
        (
            lambda ids, g, V: checks.lookup_backward_reference(ids, g, V) + 1,
            "rows of ids that never appear must be zero",
        ),
        (
            lambda ids, g, V: -checks.lookup_backward_reference(ids, g, V),
            "the shape is right but the values are not",
        ),
    ],
)
def test_check_lookup_backward_names_other_mistakes(wrong, phrase):
    with pytest.raises(CheckFailed, match=phrase):
        checks.check_lookup_backward(wrong)


# --------------------------------------------------------------------------- check 2.3


class Planted(GPT2Embeddings):
    """The given __init__, with a forward made of one planted mistake."""

    mistake = None

    def forward(self, idx, past_length=0):
        return self.mistake.fn(self, idx, past_length)


class FunctionalDropout(GPT2Embeddings):  # right: F.dropout with training=self.training
    def forward(self, idx, past_length=0):
        pos = torch.arange(past_length, past_length + idx.shape[1])
        return F.dropout(
            F.embedding(idx, self.wte.weight) + self.wpe.weight[pos],
            self.drop.p,
            training=self.training,
        )


class OwnMask(GPT2Embeddings):  # right: dropout drawn by hand, with other random numbers
    def forward(self, idx, past_length=0):
        x = self.wte(idx) + self.wpe(position_ids(idx.shape[1], past_length))
        if self.training:
            keep = torch.rand(x.shape) >= self.drop.p
            x = x * keep / (1 - self.drop.p)
        return x


def test_check_module_accepts_right_answers(capsys):
    checks.check_gpt2_embeddings(GPT2Embeddings)
    checks.check_gpt2_embeddings(FunctionalDropout)
    checks.check_gpt2_embeddings(OwnMask)
    assert capsys.readouterr().out.count("✅ Exercise 2.5") == 3


@pytest.mark.parametrize("mistake", checks.EMBEDDINGS_MISTAKES, ids=lambda m: m.name)
def test_check_module_names_every_planted_mistake(mistake):
    with pytest.raises(CheckFailed) as info:
        checks.check_gpt2_embeddings(
            type(f"Planted_{mistake.name}", (Planted,), {"mistake": mistake})
        )
    assert mistake.message in str(info.value)


def _module(forward):
    return type("Answer", (GPT2Embeddings,), {"forward": forward})


@pytest.mark.parametrize(
    "forward, phrase",
    [
        (
            lambda self, idx, past_length=0: (
                self.wte(idx) + self.wpe(torch.arange(past_length, past_length + idx.shape[0]))
            ),
            r"T = idx.shape\[1\] positions",
        ),
        (
            lambda self, idx, past_length=0: torch.cat(
                [
                    self.wte(idx),
                    self.wpe(torch.arange(past_length, past_length + idx.shape[1])).expand(
                        idx.shape[0], -1, -1
                    ),
                ],
                -1,
            ),
            "added, not concatenated",
        ),
        (
            lambda self, idx, past_length=0: (
                self.wte(idx.view(-1)).view(*idx.shape, -1)
                + self.wpe(torch.arange(past_length, past_length + idx.shape[1]))
            ),
            "is not contiguous",
        ),
        (
            lambda self, idx, past_length=0: self.drop(
                self.wte(idx) - self.wpe(torch.arange(past_length, past_length + idx.shape[1]))
            ),
            "right shape but wrong values",
        ),
        (lambda self, idx, past_length=0: idx, "dtype|should be|expected"),
    ],
)
def test_check_module_names_other_mistakes(forward, phrase):
    with pytest.raises(CheckFailed, match=phrase):
        checks.check_gpt2_embeddings(_module(forward))


def test_check_module_names_structural_mistakes():
    class NoTables(nn.Module):
        def __init__(self, config):
            super().__init__()

    with pytest.raises(CheckFailed, match="self.wte should be an nn.Embedding"):
        checks.check_gpt2_embeddings(NoTables)
    with pytest.raises(CheckFailed, match="should build an nn.Module"):
        checks.check_gpt2_embeddings(lambda config: "embeddings")


def test_check_module_leaves_the_global_random_state_alone():
    torch.manual_seed(7)
    want = torch.rand(3)
    torch.manual_seed(7)
    checks.check_gpt2_embeddings(GPT2Embeddings)
    assert torch.equal(torch.rand(3), want)


# --------------------------------------------------------------------------- checks 2.3, 2.4, challenge


def test_check_cosine_accepts_right_answers(capsys):
    checks.check_cosine_matrix(lambda t: F.normalize(t, dim=1) @ F.normalize(t, dim=1).T)
    checks.check_cosine_matrix(lambda t: F.cosine_similarity(t[:, None, :], t[None, :, :], dim=-1))
    checks.check_cosine_matrix(lambda t: (t @ t.T) / torch.outer(t.norm(dim=1), t.norm(dim=1)))
    assert capsys.readouterr().out.count("✅ Exercise 2.3") == 3


@pytest.mark.parametrize("check, mistake", planted(checks.MISTAKES_BY_CHECK))
def test_new_checks_name_every_planted_mistake(check, mistake):
    assert_named(check, mistake.fn, mistake.message)


def test_check_mean_abs_cosine_names_its_mistakes(capsys):
    table = torch.randn(16, 32)
    cosine = F.normalize(table, dim=1) @ F.normalize(table, dim=1).T
    off = cosine[~torch.eye(16, dtype=torch.bool)]
    checks.check_mean_abs_cosine(table, off.abs().mean().item())
    assert "✅ Exercise 2.3" in capsys.readouterr().out
    for wrong, phrase in [
        (off.abs().mean(), ".item()"),
        (cosine.abs().mean().item(), "diagonal"),
        (off.mean().item(), "absolute values"),
        (0.5, "not that"),
    ]:
        with pytest.raises(CheckFailed, match=re.escape(phrase)):
            checks.check_mean_abs_cosine(table, wrong)
    assert_not_done_yet(checks.check_cosine_matrix)


def test_check_module_checks_position_ids(capsys):
    checks.check_gpt2_embeddings(GPT2Embeddings, position_ids)
    assert "✅ Exercise 2.5" in capsys.readouterr().out
    for wrong, phrase in [
        (
            lambda n, past=0, device=None: torch.arange(past, past + n, dtype=torch.float32),
            "integers",
        ),
        (lambda n, past=0, device=None: torch.arange(n), "expected [4, 5, 6]"),
        (lambda n, past=0, device=None: torch.arange(past + 1, past + n + 1), "expected [0, 1"),
    ]:
        with pytest.raises(CheckFailed, match=re.escape(phrase)):
            checks.check_gpt2_embeddings(GPT2Embeddings, wrong)


def _sinusoidal(P, C):
    position = torch.arange(P, dtype=torch.float64)[:, None]
    rates = 1e4 ** (-torch.arange(0, C, 2, dtype=torch.float64) / C)
    table = torch.zeros(P, C, dtype=torch.float64)
    table[:, 0::2], table[:, 1::2] = torch.sin(position * rates), torch.cos(position * rates)
    return table


def test_challenge_check_passes_a_sinusoidal_table_and_refuses_random_or_degenerate_ones(capsys):
    scores = checks.check_position_table(_sinusoidal(1024, 768))
    assert scores["gap"] >= 0.3 and scores["max_cosine"] < 0.999
    assert "✅ Challenge" in capsys.readouterr().out
    with pytest.raises(CheckFailed, match="the goal is 0.3"):
        checks.check_position_table(
            torch.randn(1024, 768, generator=torch.Generator().manual_seed(0))
        )
    with pytest.raises(CheckFailed, match="could not tell them apart"):
        checks.check_position_table(torch.ones(1024, 768) + 1e-6 * torch.randn(1024, 768))
    with pytest.raises(CheckFailed, match="all zeros"):
        checks.check_position_table(torch.zeros(1024, 768))
    with pytest.raises(CheckFailed, match="shape"):
        checks.check_position_table(torch.randn(16, 8))


def test_check_pieces_accepts_right_answers(capsys):
    def with_a_cache_count(embeddings, idx, n):
        out, seen = [], 0
        while seen < idx.shape[1]:
            piece = idx[:, seen : seen + n]
            out.append(embeddings(piece, past_length=seen))
            seen += piece.shape[1]
        return torch.cat(out, dim=1)

    checks.check_embed_in_pieces(with_a_cache_count)
    checks.check_embed_in_pieces(
        lambda e, idx, n: torch.cat(
            [e(p, past_length=i * n) for i, p in enumerate(idx.split(n, dim=1))], dim=1
        )
    )
    assert capsys.readouterr().out.count("✅ Exercise 2.6") == 2
    assert_not_done_yet(checks.check_embed_in_pieces)


# --------------------------------------------------------------------------- check 2.4 (dropout)


def dropout_reference(x, p, training=True):
    if not training or p == 0:
        return x
    return x * (torch.rand(x.shape) >= p) / (1 - p)


def dropout_with_bernoulli(x, p, training=True):  # another way to draw the mask, float64 inside
    if not training:
        return x.clone()
    return (
        x.double() * torch.bernoulli(torch.full(x.shape, 1 - p, dtype=torch.float64)) / (1 - p)
    ).float()


def test_check_dropout_accepts_right_answers(capsys):
    checks.check_dropout(dropout_reference)
    checks.check_dropout(dropout_with_bernoulli)
    assert capsys.readouterr().out.count("✅ Exercise 2.4") == 2


def measure_dropout_reference(drop, x):
    y = drop.train()(x)
    kept = y != 0
    return (
        1 - kept.float().mean().item(),
        (y[kept] / x[kept]).mean().item(),
        torch.equal(drop.eval()(x), x),
    )


def measure_dropout_by_scale(drop, x):  # right: the factor from the largest kept ratio
    y = drop.train()(x)
    return (y == 0).double().mean().item(), (y / x).max().item(), bool((drop.eval()(x) == x).all())


def test_check_measure_dropout_accepts_right_answers(capsys):
    checks.check_measure_dropout(measure_dropout_reference)
    checks.check_measure_dropout(measure_dropout_by_scale)
    assert capsys.readouterr().out.count("✅ Exercise 2.4 (measure_dropout)") == 2


def test_check_measure_dropout_reports_the_stub_a_wrong_return_and_unknown_numbers():
    assert_not_done_yet(checks.check_measure_dropout)
    with pytest.raises(CheckFailed, match="return three things"):
        checks.check_measure_dropout(lambda drop, x: 0.1)
    with pytest.raises(CheckFailed, match=r"\.item\(\)"):
        checks.check_measure_dropout(lambda drop, x: (torch.tensor(0.1), 1 / 0.9, True))
    with pytest.raises(CheckFailed, match=r"for nn.Dropout\(0.1\) you measured 0.5000 zeroed"):
        checks.check_measure_dropout(lambda drop, x: (0.5, 2.0, True))


def test_check_dropout_names_an_unknown_mistake_with_its_numbers():
    with pytest.raises(CheckFailed, match=r"for p=0.1 your dropout zeroes 0.0000 of the numbers"):
        checks.check_dropout(lambda x, p, training=True: x * 3)


def test_from_name_takes_the_hub_prefix_through_the_one_list_of_names():
    from gpt2lib import checkpoint, validation

    assert validation.check_model_name("openai-community/gpt2-xl", GPT2Config.SIZES) == "gpt2-xl"
    assert checkpoint.HUB_ORG == validation.HUB_ORG == "openai-community"
    assert checkpoint.hub_name("openai-community/gpt2-medium") == "gpt2-medium"
    assert checkpoint.HUB_MODELS == tuple(GPT2Config.SIZES)


@pytest.mark.parametrize(
    "check, wrong, phrase",
    [
        (checks.check_one_hot_embed, lambda ids, table: table[ids], "one-hot vectors times"),
        (checks.check_one_hot_embed, lambda ids, table: F.embedding(ids, table), "F.embedding"),
        (checks.check_dropout, lambda x, p, training=True: F.dropout(x, p, training), "blocked"),
        (checks.check_dropout, lambda x, p, training=True: nn.Dropout(p)(x), "blocked"),
    ],
)
def test_checks_refuse_what_the_text_does_not_allow(check, wrong, phrase):
    with pytest.raises(CheckFailed, match=phrase):
        check(wrong)


def test_lookup_backward_refuses_autograd():
    def by_autograd(ids, grad_out, V):
        table = torch.zeros(V, grad_out.shape[-1], requires_grad=True)
        table[ids].backward(grad_out)
        return table.grad

    with pytest.raises(CheckFailed, match="autograd is blocked"):
        checks.check_lookup_backward(by_autograd)
    assert torch.Tensor.backward.__name__ == "backward"  # restored after the check
