"""Checks for chapter 8's exercises: the induction score, the logit lens, zeroing heads.

Each check runs the learner's function on small made-up cases (attention patterns, a tiny
random GPT-2), compares it with the right answer computed here, and when they differ names the
mistake by comparing with the planted wrong versions below (one list of `Mistake` per
exercise; the tests are parametrised over them). Written by hand.
"""

from __future__ import annotations

import torch

from gpt2lib.course.checks._core import (CheckFailed, Mistake, call_learner, close, expect_tensor,
                                  first_mistake, passed)

EX_INDUCTION = "Exercise 8.1 (induction_score)"
EX_LENS = "Exercise 8.2 (logit_lens)"
EX_ZERO = "Exercise 8.3 (zero_heads)"


# --------------------------------------------------------------------------- 8.1 induction score


def _induction_right(pattern, L):
    """For query q in the second copy (L + 1 .. 2L), the attention to key q - L + 1."""
    q = torch.arange(L + 1, 2 * L + 1)
    return pattern[:, :, q, q - L + 1].mean(dim=(0, -1))  # (nh,)


def _second_copy(pattern, L, offset):
    q = torch.arange(L + 1, 2 * L + 1)
    return pattern[:, :, q, q - offset]  # (B, nh, L)


INDUCTION_MISTAKES = [
    Mistake("same_token", "you score the attention to the earlier copy of the *same* token "
            "(key q - seq_len). An induction head attends to the token *after* it: key "
            "q - seq_len + 1", lambda p, L: _second_copy(p, L, L).mean(dim=(0, -1))),
    Mistake("two_after", "off by one the other way: key q - seq_len + 2 is two tokens after the "
            "earlier copy; the induction key is q - seq_len + 1",
            lambda p, L: _second_copy(p, L, L - 2).mean(dim=(0, -1))),
    Mistake("previous_token", "this is the attention to the previous token (key q - 1), the "
            "previous-token score; the induction key is q - seq_len + 1",
            lambda p, L: _second_copy(p, L, 1).mean(dim=(0, -1))),
    Mistake("whole_stripe", "you average the whole stripe key = q - seq_len + 1, including "
            "queries of the first copy (where there is nothing to repeat yet); average over the "
            "seq_len queries of the second copy only (q = seq_len + 1 .. 2 * seq_len)",
            lambda p, L: p.diagonal(offset=-(L - 1), dim1=-2, dim2=-1).mean(dim=(0, -1))),
    Mistake("transposed", "rows are queries and columns keys: pattern[..., q, k]. You read "
            "pattern[..., k, q], which the causal mask makes 0 above the diagonal",
            lambda p, L: _induction_right(p.transpose(-1, -2), L)),
    Mistake("sum", "you add the attention up instead of averaging it: a perfect induction head "
            "should score 1, so take the mean over the batch and the queries",
            lambda p, L: _second_copy(p, L, L - 1).sum(dim=(0, -1))),
    Mistake("first_example", "you use only the first sequence of the batch; average over the "
            "batch dimension too", lambda p, L: _second_copy(p, L, L - 1)[0].mean(dim=-1)),
]


def _patterns(B=3, nh=4, L=5, seed=0):
    """Causal attention probabilities with a boost on the induction and previous-token keys."""
    T = 2 * L + 1
    gen = torch.Generator().manual_seed(seed)
    scores = torch.randn(B, nh, T, T, generator=gen, dtype=torch.float64)
    q = torch.arange(L + 1, T)
    scores[:, 0, q, q - L + 1] += 4.0  # head 0: an induction head
    scores[:, 1, torch.arange(1, T), torch.arange(0, T - 1)] += 4.0  # head 1: previous token
    scores[:, 2, q, q - L] += 4.0  # head 2: duplicate-token head
    future = torch.ones(T, T, dtype=torch.bool).triu(diagonal=1)
    return scores.masked_fill(future, float("-inf")).softmax(dim=-1)


def check_induction_score(induction_score) -> None:
    """Exercise 8.1: `induction_score(pattern, seq_len)` -> (n_head,) scores."""
    for B, nh, L, seed in [(3, 4, 5, 0), (2, 3, 7, 1)]:
        pattern = _patterns(B, nh, L, seed)
        given = pattern.clone()
        got = call_learner(EX_INDUCTION, induction_score, pattern, L)
        if not torch.equal(pattern, given):
            raise CheckFailed(EX_INDUCTION, "your function changed the pattern it was given; "
                              "read it without writing to it")
        got = expect_tensor(EX_INDUCTION, got, (nh,), what="the scores", hints={
            (): "you return one number: keep one score per head (average over dims 0 and the "
                "queries, not over the heads)",
            (B, nh): "average over the batch too: one score per head",
            (nh, L): "average over the seq_len queries too: one score per head",
            (B, nh, L): "average over the batch and the queries: one score per head",
        })
        want = _induction_right(pattern, L)
        if close(got, want, atol=1e-6):
            continue
        mistake = first_mistake(INDUCTION_MISTAKES,
                               lambda m, got=got, p=pattern, L=L: close(got, m.fn(p, L), atol=1e-6))
        if mistake:
            raise CheckFailed(EX_INDUCTION, mistake.message)
        raise CheckFailed(EX_INDUCTION, f"for seq_len={L} the scores should be "
                          f"{[round(v, 4) for v in want.tolist()]}, got "
                          f"{[round(v, 4) for v in got.tolist()]}: average pattern[b, h, q, "
                          "q - seq_len + 1] over b and q = seq_len + 1 .. 2 * seq_len")
    passed(EX_INDUCTION, "head 0 of the test pattern (an induction head) scores highest")


# --------------------------------------------------------------------------- 8.2 logit lens


class _Cache:
    """A minimal stand-in for ActivationCache: the check only needs `resid`."""

    def __init__(self, resid):
        self.resid = resid


def _lens_model(seed=0):
    """A tiny random GPT-2 whose ln_f has a gain and a shift far from 1 and 0."""
    from gpt2lib.config import GPT2Config
    from gpt2lib.model import GPT2

    torch.manual_seed(seed)
    model = GPT2(GPT2Config(vocab_size=23, n_positions=16, n_embd=12, n_layer=3, n_head=3)).eval()
    with torch.no_grad():
        model.ln_f.weight.copy_(1.0 + 0.5 * torch.randn(12))
        model.ln_f.bias.copy_(0.5 * torch.randn(12))
    return model


def _lens_right(model, resid):
    return model.ln_f(torch.stack(resid)) @ model.wte.weight.T


LENS_MISTAKES = [
    Mistake("no_ln_f", "the final LayerNorm is missing: apply model.ln_f to each stream before "
            "the readout, as the model does before its logits",
            lambda model, resid: torch.stack(resid) @ model.wte.weight.T),
    Mistake("plain_norm", "you normalise without ln_f's learned gain and shift; call "
            "model.ln_f(...) itself rather than F.layer_norm without its weight and bias",
            lambda model, resid: torch.nn.functional.layer_norm(
                torch.stack(resid), (resid[0].shape[-1],), eps=model.ln_f.eps) @ model.wte.weight.T),
    Mistake("ln_f_twice", "ln_f is applied twice; once, right before the readout, is enough",
            lambda model, resid: model.ln_f(model.ln_f(torch.stack(resid))) @ model.wte.weight.T),
    Mistake("probabilities", "you return probabilities (softmax); return the logits, as the "
            "model does", lambda model, resid: _lens_right(model, resid).softmax(-1)),
    Mistake("log_probabilities", "you return log-probabilities (log_softmax); return the "
            "logits, as the model does", lambda model, resid: _lens_right(model, resid).log_softmax(-1)),
]


def check_logit_lens(logit_lens) -> None:
    """Exercise 8.2: `logit_lens(model, cache)` -> (n_layer + 1, B, T, V) logits."""
    model = _lens_model()
    C, V, L = model.config.n_embd, model.config.vocab_size, model.config.n_layer
    B, T = 2, 5
    gen = torch.Generator().manual_seed(1)
    # streams of growing size, as in a real model; the last one is what the model reads out
    resid = [torch.randn(B, T, C, generator=gen) * (1 + i) for i in range(L + 1)]
    cache = _Cache(resid)
    given = [r.clone() for r in resid]
    with torch.no_grad():
        got = call_learner(EX_LENS, logit_lens, model, cache)
        want = _lens_right(model, resid)
    if isinstance(got, tuple) and len(got) == 2:  # torch.topk's (values, indices)
        raise CheckFailed(EX_LENS, "you return top-k values and indices; return the full logits "
                          "(n_layer + 1, B, T, V)")
    if not all(torch.equal(a, b) for a, b in zip(resid, given)):
        raise CheckFailed(EX_LENS, "your function changed cache.resid; read it without writing to it")
    got = expect_tensor(EX_LENS, got, (L + 1, B, T, V), what="the lens logits", hints={
        (B, T, V): "that is one layer's logits: stack all n_layer + 1 entries of cache.resid "
                   "(torch.stack) and read out each",
        (L, B, T, V): "one entry is missing: cache.resid has n_layer + 1 entries (the embeddings "
                      "and the stream after each block); use them all",
        (L + 1, B, T, C): "these are still streams of width C: multiply by model.wte.weight.T "
                          "to get one logit per vocabulary entry",
        (B, T, L + 1, V): "stack along a new first dimension: (n_layer + 1, B, T, V)",
    })
    if close(got, want, atol=1e-4):
        passed(EX_LENS, "the last layer's lens equals the model's logits")
        return
    mistake = first_mistake(LENS_MISTAKES, lambda m: close(got, m.fn(model, resid), atol=1e-4))
    if mistake:
        raise CheckFailed(EX_LENS, mistake.message)
    raise CheckFailed(EX_LENS, "the logits differ from model.ln_f(stream) @ model.wte.weight.T "
                      "for each stream in cache.resid")


# --------------------------------------------------------------------------- 8.3 zero heads


def _zero_right(y, heads, n_head):
    B, T, C = y.shape
    out = y.clone().view(B, T, n_head, C // n_head)
    out[:, :, heads] = 0
    return out.view(B, T, C)


def _zero_keep(y, heads, n_head):
    keep = [h for h in range(n_head) if h not in heads]
    return _zero_right(y, keep, n_head)


def _zero_slices(y, heads, width):
    out = y.clone()
    for h in heads:
        out[..., h * width:(h + 1) * width] = 0
    return out


def _zero_head_last(y, heads, n_head):
    B, T, C = y.shape
    out = y.clone().view(B, T, C // n_head, n_head)  # wrong order: head index taken as fastest
    out[..., heads] = 0
    return out.view(B, T, C)


def _zero_positions(y, heads, n_head):
    out = y.clone()
    out[:, heads, :] = 0
    return out


ZERO_MISTAKES = [
    Mistake("kept_instead", "you zero every head except the listed ones; zero the listed heads "
            "and keep the others", _zero_keep),
    Mistake("n_head_width", "you zero n_head channels per head; each head owns head_dim = C // "
            "n_head channels: h * head_dim to (h + 1) * head_dim",
            lambda y, heads, n_head: _zero_slices(y, heads, n_head)),
    Mistake("head_fastest", "the channels of head h are one block, h * head_dim .. (h + 1) * "
            "head_dim - 1: view y as (B, T, n_head, head_dim), not (B, T, head_dim, n_head)",
            _zero_head_last),
    Mistake("positions", "you zero time positions (dimension 1); a head is a group of channels "
            "in the last dimension", _zero_positions),
    Mistake("first_only", "only the first listed head is zeroed; zero all of them",
            lambda y, heads, n_head: _zero_right(y, list(heads)[:1], n_head)),
]


def check_zero_heads(zero_heads) -> None:
    """Exercise 8.3: `zero_heads(y, heads, n_head)` -> y with those heads' channels zeroed."""
    gen = torch.Generator().manual_seed(0)
    # n_head=3, C=12: head_dim=4, so an n_head-wide or head-fastest slice differs from the right one
    for B, T, C, n_head, heads in [(2, 4, 12, 3, [1]), (2, 3, 12, 3, [0, 2]), (1, 5, 8, 4, [3, 1])]:
        y = torch.randn(B, T, C, generator=gen) + 0.5  # no zeros of its own
        given = y.clone()
        got = call_learner(EX_ZERO, zero_heads, y, list(heads), n_head)
        want = _zero_right(given, heads, n_head)
        if not torch.equal(y, given):
            if close(y, want, atol=0):
                raise CheckFailed(EX_ZERO, "you zeroed y in place; work on a copy (y.clone()) "
                                  "and return it, so that the caller's tensor is unchanged")
            raise CheckFailed(EX_ZERO, "your function changed y; work on a copy (y.clone())")
        got = expect_tensor(EX_ZERO, got, (B, T, C), what="the result", hints={
            (B, T, n_head, C // n_head): "reshape the result back to (B, T, C)",
        })
        if close(got, want, atol=0):
            continue
        mistake = first_mistake(ZERO_MISTAKES, lambda m, got=got, y=given, hs=heads, n=n_head:
                                close(got, m.fn(y, hs, n), atol=0))
        if mistake:
            raise CheckFailed(EX_ZERO, mistake.message)
        raise CheckFailed(EX_ZERO, f"with n_head={n_head} and heads={heads}, channels "
                          f"h * {C // n_head} .. (h + 1) * {C // n_head} - 1 of each listed head "
                          "must be 0 and every other value unchanged")
    passed(EX_ZERO, "the listed heads' channels are 0, the rest untouched, y unchanged")
