"""Chapter 8's checks (gpt2lib.course.checks.real_weights): right answers in any style pass, every planted mistake is named."""

from __future__ import annotations

import re

import pytest
import torch
from checkpoints import write_hub_checkpoint

from gpt2lib import inspection
from gpt2lib.chapters import interpret
from gpt2lib.chapters.model import GPT2
from gpt2lib.course.checks import CheckFailed, NotDoneYet
from gpt2lib.course.checks import real_weights as checks
from gpt2lib.inspection import run_with_cache
from gpt2lib.model import from_pretrained

SMALL = dict(n_layer=3, n_head=4, n_embd=32, n_positions=64, vocab_size=211)


@pytest.fixture(scope="module")
def hub_dir(tmp_path_factory):
    return write_hub_checkpoint(tmp_path_factory.mktemp("inspect"), seed=3, **SMALL)


@pytest.fixture(scope="module")
def model(hub_dir):
    return from_pretrained(hub_dir, device="cpu")


@pytest.fixture(scope="module")
def idx():
    return torch.randint(
        0, SMALL["vocab_size"], (2, 11), generator=torch.Generator().manual_seed(0)
    )


# --------------------------------------------------------------------------- checks: right answers


def _induction_loop(pattern, seq_len):
    B, nh, T, _ = pattern.shape
    total = torch.zeros(nh, dtype=pattern.dtype)
    for q in range(seq_len + 1, T):
        total += pattern[:, :, q, q - seq_len + 1].sum(0)
    return total / (B * seq_len)


def _lens_einsum(model, cache):
    resid = torch.stack(cache.resid)
    return torch.einsum("lbtc,vc->lbtv", model.ln_f(resid), model.wte.weight)


def _lens_list(model, cache):
    return torch.stack([model.ln_f(r) @ model.wte.weight.T for r in cache.resid]).double()


def _zero_mask(y, heads, n_head):
    hd = y.shape[-1] // n_head
    keep = torch.ones(y.shape[-1], dtype=y.dtype)
    for h in heads:
        keep[h * hd : (h + 1) * hd] = 0
    return y * keep


def _zero_loop(y, heads, n_head):
    out = y.clone()
    hd = y.shape[-1] // n_head
    for h in heads:
        out[:, :, h * hd : (h + 1) * hd] = 0.0
    return out


@pytest.mark.parametrize("answer", [interpret.induction_score, _induction_loop])
def test_induction_check_passes_right_answers(answer, capsys):
    checks.check_induction_score(answer)
    assert "✅" in capsys.readouterr().out


@pytest.mark.parametrize("answer", [interpret.logit_lens, _lens_einsum, _lens_list])
def test_logit_lens_check_passes_right_answers(answer, capsys):
    checks.check_logit_lens(answer)
    assert "✅" in capsys.readouterr().out


@pytest.mark.parametrize("answer", [interpret.zero_heads, _zero_mask, _zero_loop])
def test_zero_heads_check_passes_right_answers(answer, capsys):
    checks.check_zero_heads(answer)
    assert "✅" in capsys.readouterr().out


# --------------------------------------------------------------------------- checks: planted mistakes


@pytest.mark.parametrize("mistake", checks.INDUCTION_MISTAKES, ids=lambda m: m.name)
def test_induction_check_names_each_planted_mistake(mistake):
    with pytest.raises(CheckFailed) as info:
        checks.check_induction_score(lambda pattern, seq_len: mistake.fn(pattern, seq_len))
    assert mistake.message in str(info.value)


@pytest.mark.parametrize("mistake", checks.LENS_MISTAKES, ids=lambda m: m.name)
def test_logit_lens_check_names_each_planted_mistake(mistake):
    with pytest.raises(CheckFailed) as info:
        checks.check_logit_lens(lambda model, cache: mistake.fn(model, cache.resid))
    assert mistake.message in str(info.value)


@pytest.mark.parametrize("mistake", checks.ZERO_MISTAKES, ids=lambda m: m.name)
def test_zero_heads_check_names_each_planted_mistake(mistake):
    with pytest.raises(CheckFailed) as info:
        checks.check_zero_heads(lambda y, heads, n_head: mistake.fn(y, heads, n_head))
    assert mistake.message in str(info.value)


def _stub(*args):
    raise NotImplementedError("Exercise 8.x: replace this line with your code")


@pytest.mark.parametrize(
    "check", [checks.check_induction_score, checks.check_logit_lens, checks.check_zero_heads]
)
def test_unfinished_exercises_are_not_done_yet(check):
    with pytest.raises(NotDoneYet):
        check(_stub)


def test_shape_hints_and_other_wrong_forms():
    with pytest.raises(CheckFailed, match="one score per head"):
        checks.check_induction_score(lambda p, L: interpret.induction_score(p, L).mean())
    with pytest.raises(CheckFailed, match="average over the batch too"):
        checks.check_induction_score(
            lambda p, L: p.diagonal(offset=-(L - 1), dim1=-2, dim2=-1)[..., -L:].mean(-1)
        )
    with pytest.raises(CheckFailed, match="NaN"):
        checks.check_induction_score(lambda p, L: interpret.induction_score(p, L) * float("nan"))
    with pytest.raises(CheckFailed, match="one layer's logits"):
        checks.check_logit_lens(lambda model, cache: interpret.logit_lens(model, cache)[-1])
    with pytest.raises(CheckFailed, match="one entry is missing"):
        checks.check_logit_lens(lambda model, cache: interpret.logit_lens(model, cache)[1:])
    with pytest.raises(CheckFailed, match="top-k values and indices"):
        checks.check_logit_lens(lambda model, cache: inspection.logit_lens(model, cache, top_k=2))
    with pytest.raises(CheckFailed, match="reshape the result back"):
        checks.check_zero_heads(
            lambda y, heads, n: interpret.zero_heads(y, heads, n).view(*y.shape[:2], n, -1)
        )
    with pytest.raises(CheckFailed, match="cannot take that"):
        checks.check_zero_heads(lambda y, heads: y)


def test_zeroing_in_place_is_named():
    def in_place(y, heads, n_head):
        hd = y.shape[-1] // n_head
        for h in heads:
            y[..., h * hd : (h + 1) * hd] = 0
        return y

    with pytest.raises(CheckFailed, match="you zeroed y in place"):
        checks.check_zero_heads(in_place)


def test_writing_to_the_inputs_is_named():
    def scribbles(pattern, seq_len):
        result = interpret.induction_score(pattern, seq_len).clone()
        pattern.zero_()
        return result

    with pytest.raises(CheckFailed, match="changed the pattern"):
        checks.check_induction_score(scribbles)


# --------------------------------------------------------------------------- the new checks (#21)


from check_cases import planted  # noqa: E402

from gpt2lib.chapters import weights  # noqa: E402


@pytest.mark.parametrize("check, mistake", planted(checks.MISTAKES_BY_CHECK))
def test_every_planted_mistake_is_named(check, mistake):
    with pytest.raises(CheckFailed) as info:
        check(mistake.fn)
    assert mistake.message in str(info.value)


def _mapping_regex(tensors):
    return {
        k.removeprefix("transformer."): v
        for k, v in tensors.items()
        if not weights.is_mask_buffer(k) and k != "lm_head.weight"
    }


def _scores_loop(pattern):
    B, nh, T, _ = pattern.shape
    return sum(pattern[:, :, q, q - 1].sum(0) for q in range(1, T)) / (B * (T - 1))


def _copies_loop(logits, idx, seq_len):
    losses = [[], []]
    for b in range(idx.shape[0]):
        for t in range(1, 2 * seq_len + 1):  # logits at t - 1 predict idx[t]
            if t in (1, seq_len + 1):
                continue  # the first token of each copy
            loss = -logits[b, t - 1].log_softmax(-1)[idx[b, t]]
            losses[t > seq_len].append(loss)
    return tuple(torch.stack(part).mean().item() for part in losses)


def test_the_new_checks_pass_right_answers(capsys):
    checks.check_checkpoint_to_model(weights.checkpoint_to_model, weights.load_weights)
    checks.check_checkpoint_to_model(_mapping_regex)
    checks.check_run_with_cache(interpret.run_with_cache)
    checks.check_previous_token_score(interpret.previous_token_score)
    checks.check_previous_token_score(_scores_loop)
    checks.check_induction_score(
        interpret.induction_score, interpret.repeated_tokens, interpret.induction_scores
    )
    checks.check_copy_losses(interpret.copy_losses)
    checks.check_copy_losses(_copies_loop)
    checks.check_ablation_effects(interpret.ablation_effects, interpret.mean_head_outputs)
    assert capsys.readouterr().out.count("✅") == 9


@pytest.mark.parametrize(
    "check",
    [
        checks.check_checkpoint_to_model,
        checks.check_run_with_cache,
        checks.check_previous_token_score,
        checks.check_copy_losses,
        checks.check_ablation_effects,
    ],
)
def test_new_unfinished_exercises_are_not_done_yet(check):
    def stub(*args, **kwargs):  # the learner notebook's stub raises when the code runs
        raise NotImplementedError("Exercise 8.x: replace this line with your code")

    with pytest.raises(NotDoneYet):
        check(stub)


def _recorder(before=None, after=None, on_pattern=None):
    """run_with_cache with its recording hooks replaced: a learner's wrong version."""
    on_pattern = on_pattern or _pattern_right

    def run(model, idx, capture=interpret.DEFAULT_CAPTURE, ablate_heads=None):
        cache = interpret.ActivationCache()
        wanted = set((capture,) if isinstance(capture, str) else capture)
        handles = []
        for block in model.h:
            handles.append(
                block.register_forward_pre_hook(lambda b, a: before(b, a, cache, wanted))
            )
            handles.append(
                block.register_forward_hook(lambda b, a, o: after(b, a, o, cache, wanted))
            )
            handles.append(
                block.attn.hook_pattern.register_forward_hook(
                    lambda m, a, out: on_pattern(m, a, out, cache, wanted)
                )
            )
            if "head_out" in wanted:
                handles.append(
                    block.attn.c_proj.register_forward_pre_hook(
                        lambda m, a, n=block.attn.n_head: cache.head_out.append(
                            a[0].detach().reshape(*a[0].shape[:2], n, -1).transpose(1, 2)
                        )
                    )
                )
        try:
            return model(idx), cache
        finally:
            for h in handles:
                h.remove()

    return run


def _before_right(block, args, cache, wanted, *, first_only=True, detach=True):
    x = args[0]
    if "resid" in wanted and (not cache.resid or not first_only):
        cache.resid.append(x.detach() if detach else x)


def _pattern_right(hook_point, args, pattern, cache, wanted, *, detach=True):
    if "attn" in wanted:
        cache.attn.append(pattern.detach() if detach else pattern)


def _after_right(block, args, out, cache, wanted, *, detach=True):
    if "resid" in wanted:
        cache.resid.append(out.detach() if detach else out)


@pytest.mark.parametrize(
    "before, after, message",
    [
        (
            lambda b, a, c, w: _before_right(b, a, c, w, first_only=False),
            _after_right,
            "there twice",
        ),
        (
            lambda b, a, c, w: _before_right(b, a, c, w) if c.resid else None,
            _after_right,
            "embeddings",
        ),
        (
            lambda b, a, c, w: _before_right(b, a, c, w, detach=False),
            lambda b, a, o, c, w: _after_right(b, a, o, c, w, detach=False),
            "autograd",
        ),
    ],
)
def test_recording_mistakes_are_named(before, after, message):
    with pytest.raises(CheckFailed, match=re.escape(message)):
        checks.check_run_with_cache(_recorder(before, after))


def test_a_pattern_recorded_twice_or_with_its_history_is_named():
    def twice(m, a, out, cache, wanted):
        cache.attn.extend([out.detach(), out.detach()])

    with pytest.raises(CheckFailed, match="recorded once per forward pass"):
        checks.check_run_with_cache(_recorder(_before_right, _after_right, twice))
    with pytest.raises(CheckFailed, match="autograd"):
        checks.check_run_with_cache(
            _recorder(
                _before_right,
                _after_right,
                lambda m, a, out, c, w: _pattern_right(m, a, out, c, w, detach=False),
            )
        )


def test_recording_only_what_is_asked_for():
    def everything(m, a, out, cache, wanted):
        cache.attn.append(out.detach())

    with pytest.raises(CheckFailed, match="only when they are in `wanted`"):
        checks.check_run_with_cache(_recorder(_before_right, _after_right, everything))


def _tokens_with(mutate):
    def make(batch=4, seq_len=50, vocab_size=50257, seed=0, bos_token_id=None, tokens=None):
        return mutate(
            interpret.repeated_tokens(batch, seq_len, vocab_size, seed, bos_token_id, tokens),
            seq_len,
            seed,
        )

    return make


@pytest.mark.parametrize(
    "make, message",
    [
        (_tokens_with(lambda t, L, s: t[:, 1:]), "the start token is missing"),
        (_tokens_with(lambda t, L, s: t[:, : L + 1]), "the second copy is missing"),
        (_tokens_with(lambda t, L, s: torch.cat([t[:, :1] * 0, t[:, 1:]], 1)), "bos_token_id"),
        (
            _tokens_with(lambda t, L, s: torch.cat([t[:, : L + 1], t[:, 1 : L + 1].flip(1)], 1)),
            "repeat the first",
        ),
        (
            lambda batch, seq_len, vocab_size, seed=0, bos_token_id=None, tokens=None: (
                interpret.repeated_tokens(batch, seq_len, vocab_size, 0, bos_token_id, tokens)
            ),
            "another seed gives the same ids",
        ),
        (
            lambda batch, seq_len, vocab_size, seed=0, bos_token_id=None, tokens=None: (
                interpret.repeated_tokens(batch, seq_len, vocab_size, seed, bos_token_id, None)
            ),
            "draw the ids from `tokens`",
        ),
    ],
)
def test_repeated_tokens_mistakes_are_named(make, message):
    with pytest.raises(CheckFailed, match=re.escape(message)):
        checks.check_induction_score(interpret.induction_score, make)


def test_induction_scores_mistakes_are_named():
    def last_layer_only(model, seq_len=50, batch=4, seed=0, previous=False, tokens=None):
        return interpret.induction_scores(model, seq_len, batch, seed, previous, tokens)[-1]

    def no_previous(model, seq_len=50, batch=4, seed=0, previous=False, tokens=None):
        return interpret.induction_scores(model, seq_len, batch, seed, False, tokens)

    with pytest.raises(CheckFailed, match="one row per layer"):
        checks.check_induction_score(interpret.induction_score, None, last_layer_only)
    with pytest.raises(CheckFailed, match="previous=True"):
        checks.check_induction_score(interpret.induction_score, None, no_previous)


def test_load_weights_mistakes_are_named():
    def on_meta(path, config, device="cpu", dtype=torch.float32, model_cls=GPT2):
        tensors = {n: t.to(dtype=dtype) for n, t in weights.iter_safetensors(path)}
        with torch.device("meta"):
            model = model_cls(config)
        model.load_state_dict(weights.checkpoint_to_model(tensors), strict=True)  # no assign
        return model.eval()

    def train_mode(*args, **kwargs):
        return weights.load_weights(*args, **kwargs).train()

    def float32_always(path, config, device="cpu", dtype=torch.float32, model_cls=GPT2):
        return weights.load_weights(path, config, device, torch.float32, model_cls)

    for wrong, message in [
        (on_meta, "meta device"),
        (train_mode, "eval mode"),
        (float32_always, "dtype"),
    ]:
        with pytest.raises(CheckFailed, match=message):
            checks.check_checkpoint_to_model(weights.checkpoint_to_model, wrong)


def test_mean_head_outputs_mistakes_are_named():
    def over_heads(model, idx):
        return [
            m.mean(0, keepdim=True).expand_as(m) for m in interpret.mean_head_outputs(model, idx)
        ]

    def flat(model, idx):
        return [m.mean(-1) for m in interpret.mean_head_outputs(model, idx)]

    with pytest.raises(CheckFailed, match="means differ"):
        checks.check_ablation_effects(interpret.ablation_effects, over_heads)
    with pytest.raises(CheckFailed, match="keep the head_dim channels"):
        checks.check_ablation_effects(interpret.ablation_effects, flat)


def test_ablation_effects_that_leave_a_hook_are_named(model):
    def leaky(model, idx, seq_len, head_means=None):
        model.h[0].attn.c_proj.register_forward_pre_hook(lambda m, a: None)
        return interpret.ablation_effects(model, idx, seq_len, head_means)

    with pytest.raises(CheckFailed, match="left hooks"):
        checks.check_ablation_effects(leaky)


def test_the_challenge_check_compares_with_the_best_head(model, monkeypatch):
    idx = interpret.repeated_tokens(2, 5, SMALL["vocab_size"], seed=0)
    effects = torch.zeros(SMALL["n_layer"], SMALL["n_head"])
    effects[2, 1], effects[1, 3] = 1.0, 0.95
    monkeypatch.setattr(checks, "_zero_effects", lambda *args: effects)
    checks.check_copying_head(model, (2, 1), idx, 5)
    checks.check_copying_head(model, (1, 3), idx, 5)  # 95% of the best: enough
    with pytest.raises(CheckFailed, match="Keep looking"):
        checks.check_copying_head(model, (0, 0), idx, 5)
    with pytest.raises(NotDoneYet):
        checks.check_copying_head(model, None, idx, 5)
    for wrong in [(3, 0), (0, 4), "2.1", (1.0, 2)]:
        with pytest.raises(CheckFailed):
            checks.check_copying_head(model, wrong, idx, 5)
    monkeypatch.setattr(checks, "_zero_effects", lambda *args: effects * 0.01)
    checks.check_copying_head(model, (0, 0), idx, 5)  # no head matters: said, and passed


def test_the_challenge_check_runs_the_real_effects(model, capsys):
    idx = interpret.repeated_tokens(2, 5, SMALL["vocab_size"], seed=0)
    best = interpret.ablation_effects(model, idx, 5).argmax().item()
    checks.check_copying_head(model, divmod(best, SMALL["n_head"]), idx, 5)
    assert "✅" in capsys.readouterr().out


# --------------------------------------------------------------------------- 8.3 next_token_logprobs


def _next_by_loops(lens, idx):  # a right answer written another way: one position at a time
    L, B, T, _ = lens.shape
    out = torch.empty(L, B, T - 1)
    for t in range(T - 1):
        logp = torch.log_softmax(lens[:, :, t], dim=-1)  # (L, B, V)
        out[:, :, t] = logp[:, torch.arange(B), idx[:, t + 1]]
    return out


@pytest.mark.parametrize(
    "answer",
    [
        interpret.next_token_logprobs,
        _next_by_loops,
        lambda lens, idx: interpret.next_token_logprobs(lens.double(), idx),
    ],
    ids=["package", "loops", "float64"],
)
def test_next_token_logprobs_check_accepts_right_answers(answer, capsys):
    checks.check_next_token_logprobs(answer)
    assert "✅" in capsys.readouterr().out


@pytest.mark.parametrize(
    "answer, message",
    [
        (
            lambda lens, idx: interpret.next_token_logprobs(
                torch.cat([lens, lens[:, :, -1:]], 2), torch.cat([idx, idx[:, -1:]], 1)
            ),
            "the last position predicts no token",
        ),
        (lambda lens, idx: lens[:, :, :-1].log_softmax(-1), "keep only the one of the token"),
        (
            lambda lens, idx: interpret.next_token_logprobs(lens.sub_(1), idx),
            "changed the lens logits",
        ),
        (
            lambda lens, idx: interpret.next_token_logprobs(lens, idx).exp().log() * 2,
            "your values differ",
        ),
    ],
    ids=["T values", "whole distribution", "in place", "other"],
)
def test_next_token_logprobs_check_names_other_wrong_answers(answer, message):
    with pytest.raises(CheckFailed, match=message):
        checks.check_next_token_logprobs(answer)


def test_next_token_logprobs_check_says_not_done_yet():
    with pytest.raises(NotDoneYet):
        checks.check_next_token_logprobs(_stub)


def test_run_with_cache_is_one_forward_and_records_what_a_replaced_attention_computed(hub_dir, idx):
    """c_attn runs once a block (the pattern is not recomputed), and with one block's
    attention replaced by a subclass that attends evenly, the recorded pattern is the subclass's."""
    import torch.nn.functional as F

    from gpt2lib.chapters.attention import CausalSelfAttention, merge_heads, split_heads

    class EvenAttention(CausalSelfAttention):
        def forward(self, x, kv_cache=None):
            B, T, C = x.shape
            q, k, v = (split_heads(t, self.n_head) for t in self.c_attn(x).split(C, dim=2))
            even = torch.ones(T, T).tril() / torch.arange(1, T + 1)[:, None]  # (T, T)
            pattern = self.hook_pattern(even.expand(B, self.n_head, T, T))
            return self.resid_dropout(self.c_proj(merge_heads(F.dropout(pattern, 0.0) @ v)))

    model = from_pretrained(hub_dir, device="cpu")
    calls = []
    for block in model.h:
        block.attn.c_attn.register_forward_hook(lambda *a: calls.append(1))
    with torch.no_grad():
        _, cache = run_with_cache(model, idx, capture="attn", ablate_heads={0: [1]})
    assert len(calls) == SMALL["n_layer"]  # one forward, ablation included
    model.h[1].attn.__class__ = EvenAttention
    with torch.no_grad():
        logits, cache = run_with_cache(model, idx, capture="attn")
        plain = model(idx)
    T = idx.shape[1]
    even = torch.ones(T, T).tril() / torch.arange(1, T + 1)[:, None]
    torch.testing.assert_close(cache.attn[1], even.expand_as(cache.attn[1]))
    assert not torch.allclose(cache.attn[0], even.expand_as(cache.attn[0]))
    torch.testing.assert_close(logits, plain, atol=1e-5, rtol=1e-5)  # what the model computed
