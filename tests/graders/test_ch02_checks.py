"""Chapter 2's checks (gpt2lib.course.checks.embeddings): right answers in any style pass, every planted mistake is named."""

from __future__ import annotations

import re

import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F
from check_cases import assert_named, assert_not_done_yet, planted

from gpt2lib.chapters.embeddings import GPT2Embeddings, position_ids
from gpt2lib.course.checks import CheckFailed
from gpt2lib.course.checks import embeddings as checks
from gpt2lib.course.checks._core import NotDoneYet

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
