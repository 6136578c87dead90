"""Chapter 8, a look inside: the experimenter API (run_with_cache, ablation, logit lens,
induction scores), tested against transformers, and the checks of exercises 8.1-8.3."""

from __future__ import annotations

import re
import threading
from pathlib import Path

import pytest
import torch
import torch.nn as nn
from checkpoints import write_hub_checkpoint

import gpt2lib
from gpt2lib import inspection
from gpt2lib.chapters import interpret
from gpt2lib.chapters.config import GPT2Config
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


def _no_hooks(model):
    return all(not m._forward_pre_hooks and not m._forward_hooks for m in model.modules())


# --------------------------------------------------------------------------- against transformers


def test_cache_matches_transformers_hidden_states_and_attentions(hub_dir, model, idx):
    from transformers import GPT2LMHeadModel

    theirs = GPT2LMHeadModel.from_pretrained(str(hub_dir), attn_implementation="eager").eval()
    with torch.no_grad():
        logits, cache = run_with_cache(model, idx)
        out = theirs(idx, output_hidden_states=True, output_attentions=True)
    n = SMALL["n_layer"]
    assert len(cache.resid) == n + 1 and len(cache.attn) == n
    for ours, hf in zip(cache.resid[:n], out.hidden_states[:n]):
        torch.testing.assert_close(ours, hf, atol=1e-5, rtol=1e-5)
    # transformers applies ln_f to its last entry; ours is the stream before ln_f
    torch.testing.assert_close(
        model.ln_f(cache.resid[n]), out.hidden_states[n], atol=1e-5, rtol=1e-5
    )
    for ours, hf in zip(cache.attn, out.attentions):
        assert ours.shape == (2, SMALL["n_head"], 11, 11)
        torch.testing.assert_close(ours, hf, atol=1e-5, rtol=0)
    torch.testing.assert_close(logits, out.logits, atol=1e-5, rtol=1e-5)


def test_plain_forward_is_unchanged_and_no_hooks_remain(model, idx):
    with torch.no_grad():
        before = model(idx)
        logits, _ = run_with_cache(model, idx, capture=inspection.CAPTURES, ablate_heads={1: [2]})
        after = model(idx)
    assert torch.equal(before, after)
    assert not torch.equal(logits, before)  # the ablation did act during the call
    assert _no_hooks(model)


def test_hooks_are_removed_when_the_forward_pass_fails(model):
    with pytest.raises(ValueError, match=r"token ids must be in 0 \.\. "):
        run_with_cache(model, torch.tensor([[0, SMALL["vocab_size"]]]), ablate_heads={0: [1]})
    assert _no_hooks(model)


def test_optional_captures_add_up_to_the_residual_stream(model, idx):
    with torch.no_grad():
        _, cache = run_with_cache(model, idx, capture=("resid", "head_out", "mlp_out"))
    assert cache.attn == []  # not asked for
    B, T = idx.shape
    hd = SMALL["n_embd"] // SMALL["n_head"]
    for layer, block in enumerate(model.h):
        heads = cache.head_out[layer]
        assert heads.shape == (B, SMALL["n_head"], T, hd)
        attn_out = block.attn.c_proj(heads.transpose(1, 2).reshape(B, T, -1))
        rebuilt = cache.resid[layer] + attn_out + cache.mlp_out[layer]
        torch.testing.assert_close(rebuilt, cache.resid[layer + 1], atol=1e-5, rtol=1e-5)


# --------------------------------------------------------------------------- ablation


@pytest.mark.parametrize("layer,head", [(0, 0), (1, 3), (2, 1)])
def test_ablating_a_head_equals_zeroing_its_rows_of_c_proj(hub_dir, model, idx, layer, head):
    hd = SMALL["n_embd"] // SMALL["n_head"]
    edited = from_pretrained(hub_dir, device="cpu")
    with torch.no_grad():
        edited.h[layer].attn.c_proj.weight[head * hd : (head + 1) * hd] = 0
        want = edited(idx)
        got, cache = run_with_cache(model, idx, capture="head_out", ablate_heads={layer: [head]})
    assert torch.equal(got, want)
    assert not cache.head_out[layer][:, head].any()  # the recorded head output is the zeroed one


def test_context_manager_has_the_same_effect(model, idx):
    with torch.no_grad():
        # capture="resid": attention keeps its fast path (recording the pattern computes it
        # explicitly, which rounds differently), so the two are the same computation
        want, _ = run_with_cache(model, idx, capture="resid", ablate_heads={0: [1, 2], 2: 3})
        with gpt2lib.ablated_heads(model, {0: [1, 2], 2: [3]}):
            got = model(idx)
        plain = model(idx)
    assert torch.equal(got, want) and not torch.equal(plain, want)
    assert _no_hooks(model)


@pytest.mark.parametrize(
    "ablate,error,message",
    [
        (
            {3: [0]},
            ValueError,
            r"layer must be at most 2, got 3 \(the model has 3, numbered from 0\)",
        ),
        ({-1: [0]}, ValueError, "layer must be at least 0, got -1"),
        ({0: [4]}, ValueError, r"head \(layer 0\) must be at most 3, got 4"),
        ({0: ["a"]}, TypeError, "head .* must be a whole number"),
        ({True: [0]}, TypeError, "layer must be a whole number"),
        ([0, 1], TypeError, r"ablate_heads must be a dict \{layer: \[head, \.\.\.\]\}"),
    ],
)
def test_bad_ablation_indices_are_refused(model, idx, ablate, error, message):
    with pytest.raises(error, match=message):
        run_with_cache(model, idx, ablate_heads=ablate)
    assert _no_hooks(model)


def test_unknown_capture_name_lists_the_known_ones(model, idx):
    with pytest.raises(
        ValueError, match="unknown capture name.*'attention'.*resid, attn, head_out, mlp_out"
    ):
        run_with_cache(model, idx, capture=("resid", "attention"))


class _BareBlock(nn.Module):
    """A learner's block that works in the model but hides its parts under other names."""

    def __init__(self, config):
        super().__init__()
        self.inner = nn.Identity()

    def forward(self, x):
        return self.inner(x)


def test_a_block_without_the_expected_parts_gets_a_clear_error():
    model = GPT2(GPT2Config(**SMALL), block_cls=_BareBlock).eval()
    ids = torch.tensor([[1, 2, 3]])
    _, cache = run_with_cache(model, ids, capture="resid")  # needs nothing from the block
    assert len(cache.resid) == SMALL["n_layer"] + 1
    with pytest.raises(
        TypeError, match="capturing 'attn' needs block 0 to have `ln_1`.*_BareBlock"
    ):
        run_with_cache(model, ids)
    with pytest.raises(TypeError, match="ablate_heads needs block 1 to have `attn.c_proj`"):
        run_with_cache(model, ids, capture="resid", ablate_heads={1: [0]})


# --------------------------------------------------------------------------- logit lens, induction


def test_logit_lens_last_layer_is_the_model_and_top_k(model, idx):
    with torch.no_grad():
        logits, cache = run_with_cache(model, idx)
        lens = gpt2lib.logit_lens(model, cache)
        top = gpt2lib.logit_lens(model, cache, top_k=3)
    assert lens.shape == (SMALL["n_layer"] + 1, *idx.shape, SMALL["vocab_size"])
    torch.testing.assert_close(lens[-1], logits, atol=1e-5, rtol=1e-5)
    assert top.indices.shape == (SMALL["n_layer"] + 1, *idx.shape, 3)
    assert torch.equal(top.indices[..., 0], lens.argmax(-1))
    with pytest.raises(ValueError, match="holds no residual stream"):
        gpt2lib.logit_lens(model, run_with_cache(model, idx, capture="attn")[1])


def test_induction_scores_find_a_copying_head_built_by_hand():
    """Attention patterns made to copy: the score of that head is 1, the others' are not."""
    L = 6
    T = 2 * L + 1
    pattern = torch.zeros(1, 2, T, T)
    pattern[0, :, torch.arange(T), 0] = 1.0  # every head rests on the first token ...
    q = torch.arange(L + 1, T)
    pattern[0, 0, q, 0] = 0.0
    pattern[0, 0, q, q - L + 1] = 1.0  # ... except head 0 in the second copy: induction
    assert torch.equal(interpret.induction_score(pattern, L), torch.tensor([1.0, 0.0]))


def test_induction_scores_of_a_model(model):
    induction, previous = gpt2lib.induction_scores(model, seq_len=10, batch=2, previous=True)
    assert induction.shape == previous.shape == (SMALL["n_layer"], SMALL["n_head"])
    assert bool(((induction >= 0) & (induction <= 1)).all())
    assert torch.equal(induction, gpt2lib.induction_scores(model, seq_len=10, batch=2))  # seeded
    with pytest.raises(ValueError, match="more than the model's n_positions=64"):
        gpt2lib.induction_scores(model, seq_len=40)
    tokens = interpret.repeated_tokens(batch=3, seq_len=5, vocab_size=100, seed=1)
    assert tokens.shape == (3, 11) and bool((tokens[:, 0] == 99).all())
    assert torch.equal(tokens[:, 1:6], tokens[:, 6:])


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


# --------------------------------------------------------------------------- threads (#24 item 5)


def _pause_thread_inside_forward(model, name):
    """A hook on the last block that, in thread `name` only, stops mid-forward until released."""
    inside, release = threading.Event(), threading.Event()

    def pause(module, args):
        if threading.current_thread().name == name:
            inside.set()
            assert release.wait(10)

    return model.h[-1].register_forward_pre_hook(pause), inside, release


def test_run_with_cache_in_two_threads_keeps_each_call_apart(model):
    """Thread A stops inside its run_with_cache (its hooks on the model) while this thread runs
    run_with_cache and a plain forward: neither sees A's hooks, and A's cache is A's alone."""
    a_ids = torch.randint(
        0, SMALL["vocab_size"], (1, 7), generator=torch.Generator().manual_seed(1)
    )
    b_ids = torch.randint(
        0, SMALL["vocab_size"], (3, 5), generator=torch.Generator().manual_seed(2)
    )
    with torch.no_grad():
        plain_b = model(b_ids)
        want_a, want_a_cache = run_with_cache(
            model, a_ids, capture=inspection.CAPTURES, ablate_heads={0: [1]}
        )
    handle, inside, release = _pause_thread_inside_forward(model, "A")
    got = {}

    def thread_a():
        with torch.no_grad():
            got["a"] = run_with_cache(
                model, a_ids, capture=inspection.CAPTURES, ablate_heads={0: [1]}
            )

    a = threading.Thread(target=thread_a, name="A")
    try:
        a.start()
        assert inside.wait(10)
        with torch.no_grad():
            b_logits, b_cache = run_with_cache(model, b_ids, capture=inspection.CAPTURES)
            b_plain_meanwhile = model(b_ids)  # A's ablation hooks are on the model right now
    finally:
        release.set()
        a.join(10)
        handle.remove()
    n = SMALL["n_layer"]
    torch.testing.assert_close(b_logits, plain_b, atol=1e-5, rtol=1e-5)  # the pattern's path
    torch.testing.assert_close(b_plain_meanwhile, plain_b, atol=0, rtol=0)
    assert (len(b_cache.resid), len(b_cache.attn), len(b_cache.head_out), len(b_cache.mlp_out)) == (
        n + 1,
        n,
        n,
        n,
    )
    assert all(t.shape[0] == 3 for t in b_cache.resid + b_cache.attn + b_cache.mlp_out)
    a_logits, a_cache = got["a"]
    torch.testing.assert_close(a_logits, want_a, atol=0, rtol=0)
    for field in ("resid", "attn", "head_out", "mlp_out"):
        ours, want = getattr(a_cache, field), getattr(want_a_cache, field)
        assert len(ours) == len(want)
        for x, y in zip(ours, want):
            torch.testing.assert_close(x, y, atol=0, rtol=0)
    assert _no_hooks(model)


def test_ablated_heads_in_one_thread_do_not_reach_another(model, idx):
    with torch.no_grad():
        plain = model(idx)
        with gpt2lib.ablated_heads(model, {0: [0, 1], 2: [3]}):
            ablated_here = model(idx)
    assert not torch.equal(ablated_here, plain)
    opened, release = threading.Event(), threading.Event()
    seen = {}

    def thread_a():
        with torch.no_grad(), gpt2lib.ablated_heads(model, {0: [0, 1], 2: [3]}):
            opened.set()
            assert release.wait(10)
            seen["a"] = model(idx)  # its own forward is ablated

    a = threading.Thread(target=thread_a)
    a.start()
    try:
        assert opened.wait(10)
        with torch.no_grad():
            here = [model(idx) for _ in range(3)]
    finally:
        release.set()
        a.join(10)
    for logits in here:
        torch.testing.assert_close(logits, plain, atol=0, rtol=0)
    torch.testing.assert_close(seen["a"], ablated_here, atol=0, rtol=0)
    assert _no_hooks(model)


def test_many_threads_calling_run_with_cache_get_their_own_caches(model):
    """The tester's probe, shortened: 4 threads x 25 calls, each on its own ids."""
    ids = [
        torch.randint(
            0, SMALL["vocab_size"], (b + 1, 6 + b), generator=torch.Generator().manual_seed(b)
        )
        for b in range(4)
    ]
    with torch.no_grad():
        want = [model(i) for i in ids]
    errors = []
    start = threading.Barrier(4)

    def work(b):
        start.wait()
        for _ in range(25):
            with torch.no_grad():
                logits, cache = run_with_cache(
                    model,
                    ids[b],
                    capture=("resid", "attn"),
                    ablate_heads={1: [b % SMALL["n_head"]]} if b % 2 else None,
                )
            n = SMALL["n_layer"]
            if (
                len(cache.resid) != n + 1
                or len(cache.attn) != n
                or any(t.shape[:2] != ids[b].shape for t in cache.resid)
            ):
                errors.append(
                    f"thread {b}: cache of {len(cache.resid)} resid, {len(cache.attn)} attn"
                )
            if b % 2 == 0 and not torch.allclose(logits, want[b], atol=1e-5, rtol=1e-5):
                errors.append(f"thread {b}: logits changed")

    threads = [threading.Thread(target=work, args=(b,)) for b in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert errors == []
    assert _no_hooks(model)


# --------------------------------------------------------------------------- bad arguments (#24 item 14)


@pytest.mark.parametrize(
    "kwargs, error, message",
    [
        (dict(seq_len=0), ValueError, r"seq_len must be at least 1, got 0"),
        (dict(seq_len=-3), ValueError, r"seq_len must be at least 1, got -3"),
        (dict(seq_len=2.5), TypeError, r"seq_len must be a whole number, got 2.5"),
        (dict(seq_len=True), TypeError, r"seq_len must be a whole number"),
        (dict(seq_len=5, batch=0), ValueError, r"batch must be at least 1, got 0"),
        (
            dict(seq_len=5, tokens=torch.tensor([1.0, 2.0])),
            TypeError,
            "tokens must be a non-empty 1-d tensor",
        ),
        (
            dict(seq_len=5, tokens=torch.tensor([], dtype=torch.long)),
            TypeError,
            "tokens must be a non-empty",
        ),
        (
            dict(seq_len=5, tokens=torch.tensor([3, 211])),
            ValueError,
            r"tokens must be ids in 0 \.\. 210",
        ),
    ],
)
def test_induction_scores_refuse_bad_arguments(model, kwargs, error, message):
    with pytest.raises(error, match=message):
        gpt2lib.induction_scores(model, **kwargs)
    assert _no_hooks(model)


def test_induction_scores_draw_from_the_given_tokens(model):
    pool = torch.tensor([5, 17, 40])
    tokens = interpret.repeated_tokens(batch=2, seq_len=6, vocab_size=211, seed=0, tokens=pool)
    assert set(tokens[:, 1:].flatten().tolist()) <= {5, 17, 40} and bool(
        (tokens[:, 0] == 210).all()
    )
    scores = gpt2lib.induction_scores(model, seq_len=6, batch=2, tokens=pool)
    assert scores.shape == (SMALL["n_layer"], SMALL["n_head"])


@pytest.mark.parametrize(
    "top_k, error, message",
    [
        (0, ValueError, r"top_k must be at least 1, got 0"),
        (-2, ValueError, r"top_k must be at least 1, got -2"),
        (212, ValueError, r"top_k must be at most 211, got 212"),
        (2.0, TypeError, "top_k must be a whole number"),
    ],
)
def test_logit_lens_refuses_a_bad_top_k(model, idx, top_k, error, message):
    with torch.no_grad():
        _, cache = run_with_cache(model, idx)
        with pytest.raises(error, match=message):
            gpt2lib.logit_lens(model, cache, top_k=top_k)
        assert gpt2lib.logit_lens(model, cache, top_k=211).indices.shape[-1] == 211


def test_tensor_head_indices_are_read_as_numbers(model, idx):
    with torch.no_grad():
        want, _ = run_with_cache(model, idx, capture=(), ablate_heads={1: [2, 3]})
        for ablate in (
            {1: torch.tensor([2, 3])},
            {torch.tensor(1): [torch.tensor(2), 3]},
            {1: torch.tensor([[2], [3]]).flatten()},
        ):
            got, _ = run_with_cache(model, idx, capture=(), ablate_heads=ablate)
            assert torch.equal(got, want)
        one, _ = run_with_cache(model, idx, capture=(), ablate_heads={1: torch.tensor(2)})
        assert torch.equal(one, run_with_cache(model, idx, capture=(), ablate_heads={1: 2})[0])


@pytest.mark.parametrize(
    "ablate, message",
    [
        (
            {0: torch.tensor([0.5])},
            r"head \(layer 0\) must be a whole number, got tensor\(0\.5000\)",
        ),
        (
            {0: torch.tensor(1.0)},
            r"must be a whole number, got tensor\(",
        ),
        (
            {torch.tensor([0, 1]): [0]},
            r"layer must be a whole number, got tensor\(\[0, 1\]\)",
        ),
        ({0: 1.5}, r"the heads of layer 0 must be a head number or a list of them, got 1.5"),
        ({0: "01"}, r"the heads of layer 0 must be a head number or a list of them"),
    ],
)
def test_bad_tensor_or_scalar_heads_get_a_clear_error(model, idx, ablate, message):
    with pytest.raises(TypeError, match=message):
        run_with_cache(model, idx, ablate_heads=ablate)
    assert _no_hooks(model)


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


# --------------------------------------------------------------------------- the chapter's fallback


def test_the_chapter_runs_on_the_learners_model_and_functions_after_each_exercise():
    """Issue 34: chapter 8 loads the weights into the learner's GPT-2 with the learner's loader,
    and computes its findings with the learner's functions once their exercise passed
    (`yours`), never with the package's entry points."""
    import nbformat

    path = Path(__file__).resolve().parents[2] / "solutions" / "08_real_weights.ipynb"
    code = [c.source for c in nbformat.read(path, as_version=4).cells if c.cell_type == "code"]
    lesson = "\n".join(code)
    assert "parts = your_gpt2()" in lesson and "from gpt2lib.inspection" not in lesson
    assert 'yours("8.1", load_weights)(' in lesson and "model_cls=parts.model.GPT2" in lesson
    for number in ("8.0", "8.2", "8.3", "8.4", "8.5", "8.6", "8.8"):
        assert f'yours("{number}", ' in lesson, number


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


def test_next_token_logprobs_reads_the_figure_of_the_chapter(model):
    """The package's answer equals log_softmax of the model's logits at the last layer."""
    idx = torch.randint(
        0, model.config.vocab_size, (2, 7), generator=torch.Generator().manual_seed(0)
    )
    logits, cache = run_with_cache(model, idx)
    right = interpret.next_token_logprobs(interpret.logit_lens(model, cache), idx)
    assert right.shape == (model.config.n_layer + 1, 2, 6)
    want = logits[:, :-1].log_softmax(-1).gather(-1, idx[:, 1:, None])[..., 0]
    assert torch.allclose(right[-1], want, atol=1e-4)


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
