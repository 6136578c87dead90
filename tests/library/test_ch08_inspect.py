"""Chapter 8, a look inside: the experimenter API (run_with_cache, ablation, logit lens,
induction scores), tested against transformers. The checks of its exercises are tested in
tests/graders/test_ch08_checks.py."""

from __future__ import annotations

import threading
from pathlib import Path

import pytest
import torch
import torch.nn as nn
from checkpoints import SMALL_SIZES

import gpt2lib
from gpt2lib import inspection
from gpt2lib.chapters import interpret
from gpt2lib.inspection import run_with_cache
from gpt2lib.model import from_pretrained


def _no_hooks(small_model):
    return all(not m._forward_pre_hooks and not m._forward_hooks for m in small_model.modules())


# --------------------------------------------------------------------------- against transformers


def test_cache_matches_transformers_hidden_states_and_attentions(
    small_hub_dir, small_model, small_ids
):
    from transformers import GPT2LMHeadModel

    theirs = GPT2LMHeadModel.from_pretrained(str(small_hub_dir), attn_implementation="eager").eval()
    with torch.no_grad():
        logits, cache = run_with_cache(small_model, small_ids)
        out = theirs(small_ids, output_hidden_states=True, output_attentions=True)
    n = SMALL_SIZES["n_layer"]
    assert len(cache.resid) == n + 1 and len(cache.attn) == n
    for ours, hf in zip(cache.resid[:n], out.hidden_states[:n]):
        torch.testing.assert_close(ours, hf, atol=1e-5, rtol=1e-5)
    # transformers applies ln_f to its last entry; ours is the stream before ln_f
    torch.testing.assert_close(
        small_model.ln_f(cache.resid[n]), out.hidden_states[n], atol=1e-5, rtol=1e-5
    )
    for ours, hf in zip(cache.attn, out.attentions):
        assert ours.shape == (2, SMALL_SIZES["n_head"], 11, 11)
        torch.testing.assert_close(ours, hf, atol=1e-5, rtol=0)
    torch.testing.assert_close(logits, out.logits, atol=1e-5, rtol=1e-5)


def test_plain_forward_is_unchanged_and_no_hooks_remain(small_model, small_ids):
    with torch.no_grad():
        before = small_model(small_ids)
        logits, _ = run_with_cache(
            small_model, small_ids, capture=inspection.CAPTURES, ablate_heads={1: [2]}
        )
        after = small_model(small_ids)
    assert torch.equal(before, after)
    assert not torch.equal(logits, before)  # the ablation did act during the call
    assert _no_hooks(small_model)


def test_hooks_are_removed_when_the_forward_pass_fails(small_model):
    with pytest.raises(ValueError, match=r"token ids must be in 0 \.\. "):
        run_with_cache(
            small_model, torch.tensor([[0, SMALL_SIZES["vocab_size"]]]), ablate_heads={0: [1]}
        )
    assert _no_hooks(small_model)


def test_optional_captures_add_up_to_the_residual_stream(small_model, small_ids):
    with torch.no_grad():
        _, cache = run_with_cache(small_model, small_ids, capture=("resid", "head_out", "mlp_out"))
    assert cache.attn == []  # not asked for
    B, T = small_ids.shape
    hd = SMALL_SIZES["n_embd"] // SMALL_SIZES["n_head"]
    for layer, block in enumerate(small_model.h):
        heads = cache.head_out[layer]
        assert heads.shape == (B, SMALL_SIZES["n_head"], T, hd)
        attn_out = block.attn.c_proj(heads.transpose(1, 2).reshape(B, T, -1))
        rebuilt = cache.resid[layer] + attn_out + cache.mlp_out[layer]
        torch.testing.assert_close(rebuilt, cache.resid[layer + 1], atol=1e-5, rtol=1e-5)


# --------------------------------------------------------------------------- ablation


@pytest.mark.parametrize("layer,head", [(0, 0), (1, 3), (2, 1)])
def test_ablating_a_head_equals_zeroing_its_rows_of_c_proj(
    small_hub_dir, small_model, small_ids, layer, head
):
    hd = SMALL_SIZES["n_embd"] // SMALL_SIZES["n_head"]
    edited = from_pretrained(small_hub_dir, device="cpu")
    with torch.no_grad():
        edited.h[layer].attn.c_proj.weight[head * hd : (head + 1) * hd] = 0
        want = edited(small_ids)
        got, cache = run_with_cache(
            small_model, small_ids, capture="head_out", ablate_heads={layer: [head]}
        )
    assert torch.equal(got, want)
    assert not cache.head_out[layer][:, head].any()  # the recorded head output is the zeroed one


def test_context_manager_has_the_same_effect(small_model, small_ids):
    with torch.no_grad():
        # capture="resid": attention keeps its fast path (recording the pattern computes it
        # explicitly, which rounds differently), so the two are the same computation
        want, _ = run_with_cache(
            small_model, small_ids, capture="resid", ablate_heads={0: [1, 2], 2: 3}
        )
        with gpt2lib.ablated_heads(small_model, {0: [1, 2], 2: [3]}):
            got = small_model(small_ids)
        plain = small_model(small_ids)
    assert torch.equal(got, want) and not torch.equal(plain, want)
    assert _no_hooks(small_model)


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
def test_bad_ablation_indices_are_refused(small_model, small_ids, ablate, error, message):
    with pytest.raises(error, match=message):
        run_with_cache(small_model, small_ids, ablate_heads=ablate)
    assert _no_hooks(small_model)


def test_unknown_capture_name_lists_the_known_ones(small_model, small_ids):
    with pytest.raises(
        ValueError, match="unknown capture name.*'attention'.*resid, attn, head_out, mlp_out"
    ):
        run_with_cache(small_model, small_ids, capture=("resid", "attention"))


class _BareBlock(nn.Module):
    """A learner's block that works in the model but hides its parts under other names."""

    def __init__(self, config):
        super().__init__()
        self.inner = nn.Identity()

    def forward(self, x):
        return self.inner(x)


def test_a_block_without_the_expected_parts_gets_a_clear_error(tiny_model):
    model = tiny_model(model_kwargs={"block_cls": _BareBlock}, **SMALL_SIZES)
    ids = torch.tensor([[1, 2, 3]])
    _, cache = run_with_cache(model, ids, capture="resid")  # needs nothing from the block
    assert len(cache.resid) == SMALL_SIZES["n_layer"] + 1
    with pytest.raises(
        TypeError, match="capturing 'attn' needs block 0 to have `ln_1`.*_BareBlock"
    ):
        run_with_cache(model, ids)
    with pytest.raises(TypeError, match="ablate_heads needs block 1 to have `attn.c_proj`"):
        run_with_cache(model, ids, capture="resid", ablate_heads={1: [0]})


# --------------------------------------------------------------------------- logit lens, induction


def test_logit_lens_last_layer_is_the_model_and_top_k(small_model, small_ids):
    with torch.no_grad():
        logits, cache = run_with_cache(small_model, small_ids)
        lens = gpt2lib.logit_lens(small_model, cache)
        top = gpt2lib.logit_lens(small_model, cache, top_k=3)
    assert lens.shape == (SMALL_SIZES["n_layer"] + 1, *small_ids.shape, SMALL_SIZES["vocab_size"])
    torch.testing.assert_close(lens[-1], logits, atol=1e-5, rtol=1e-5)
    assert top.indices.shape == (SMALL_SIZES["n_layer"] + 1, *small_ids.shape, 3)
    assert torch.equal(top.indices[..., 0], lens.argmax(-1))
    with pytest.raises(ValueError, match="holds no residual stream"):
        gpt2lib.logit_lens(small_model, run_with_cache(small_model, small_ids, capture="attn")[1])


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


def test_induction_scores_of_a_model(small_model):
    induction, previous = gpt2lib.induction_scores(small_model, seq_len=10, batch=2, previous=True)
    assert induction.shape == previous.shape == (SMALL_SIZES["n_layer"], SMALL_SIZES["n_head"])
    assert bool(((induction >= 0) & (induction <= 1)).all())
    assert torch.equal(
        induction, gpt2lib.induction_scores(small_model, seq_len=10, batch=2)
    )  # seeded
    with pytest.raises(ValueError, match="more than the model's n_positions=64"):
        gpt2lib.induction_scores(small_model, seq_len=40)
    tokens = interpret.repeated_tokens(batch=3, seq_len=5, vocab_size=100, seed=1)
    assert tokens.shape == (3, 11) and bool((tokens[:, 0] == 99).all())
    assert torch.equal(tokens[:, 1:6], tokens[:, 6:])


# --------------------------------------------------------------------------- threads (#24 item 5)


def _pause_thread_inside_forward(small_model, name):
    """A hook on the last block that, in thread `name` only, stops mid-forward until released."""
    inside, release = threading.Event(), threading.Event()

    def pause(module, args):
        if threading.current_thread().name == name:
            inside.set()
            assert release.wait(10)

    return small_model.h[-1].register_forward_pre_hook(pause), inside, release


def test_run_with_cache_in_two_threads_keeps_each_call_apart(small_model):
    """Thread A stops inside its run_with_cache (its hooks on the model) while this thread runs
    run_with_cache and a plain forward: neither sees A's hooks, and A's cache is A's alone."""
    a_ids = torch.randint(
        0, SMALL_SIZES["vocab_size"], (1, 7), generator=torch.Generator().manual_seed(1)
    )
    b_ids = torch.randint(
        0, SMALL_SIZES["vocab_size"], (3, 5), generator=torch.Generator().manual_seed(2)
    )
    with torch.no_grad():
        plain_b = small_model(b_ids)
        want_a, want_a_cache = run_with_cache(
            small_model, a_ids, capture=inspection.CAPTURES, ablate_heads={0: [1]}
        )
    handle, inside, release = _pause_thread_inside_forward(small_model, "A")
    got = {}

    def thread_a():
        with torch.no_grad():
            got["a"] = run_with_cache(
                small_model, a_ids, capture=inspection.CAPTURES, ablate_heads={0: [1]}
            )

    a = threading.Thread(target=thread_a, name="A")
    try:
        a.start()
        assert inside.wait(10)
        with torch.no_grad():
            b_logits, b_cache = run_with_cache(small_model, b_ids, capture=inspection.CAPTURES)
            b_plain_meanwhile = small_model(b_ids)  # A's ablation hooks are on the model right now
    finally:
        release.set()
        a.join(10)
        handle.remove()
    n = SMALL_SIZES["n_layer"]
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
    assert _no_hooks(small_model)


def test_ablated_heads_in_one_thread_do_not_reach_another(small_model, small_ids):
    with torch.no_grad():
        plain = small_model(small_ids)
        with gpt2lib.ablated_heads(small_model, {0: [0, 1], 2: [3]}):
            ablated_here = small_model(small_ids)
    assert not torch.equal(ablated_here, plain)
    opened, release = threading.Event(), threading.Event()
    seen = {}

    def thread_a():
        with torch.no_grad(), gpt2lib.ablated_heads(small_model, {0: [0, 1], 2: [3]}):
            opened.set()
            assert release.wait(10)
            seen["a"] = small_model(small_ids)  # its own forward is ablated

    a = threading.Thread(target=thread_a)
    a.start()
    try:
        assert opened.wait(10)
        with torch.no_grad():
            here = [small_model(small_ids) for _ in range(3)]
    finally:
        release.set()
        a.join(10)
    for logits in here:
        torch.testing.assert_close(logits, plain, atol=0, rtol=0)
    torch.testing.assert_close(seen["a"], ablated_here, atol=0, rtol=0)
    assert _no_hooks(small_model)


def test_many_threads_calling_run_with_cache_get_their_own_caches(small_model):
    """The tester's probe, shortened: 4 threads x 25 calls, each on its own ids."""
    ids = [
        torch.randint(
            0, SMALL_SIZES["vocab_size"], (b + 1, 6 + b), generator=torch.Generator().manual_seed(b)
        )
        for b in range(4)
    ]
    with torch.no_grad():
        want = [small_model(i) for i in ids]
    errors = []
    start = threading.Barrier(4)

    def work(b):
        start.wait()
        for _ in range(25):
            with torch.no_grad():
                logits, cache = run_with_cache(
                    small_model,
                    ids[b],
                    capture=("resid", "attn"),
                    ablate_heads={1: [b % SMALL_SIZES["n_head"]]} if b % 2 else None,
                )
            n = SMALL_SIZES["n_layer"]
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
    assert _no_hooks(small_model)


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
def test_induction_scores_refuse_bad_arguments(small_model, kwargs, error, message):
    with pytest.raises(error, match=message):
        gpt2lib.induction_scores(small_model, **kwargs)
    assert _no_hooks(small_model)


def test_induction_scores_draw_from_the_given_tokens(small_model):
    pool = torch.tensor([5, 17, 40])
    tokens = interpret.repeated_tokens(batch=2, seq_len=6, vocab_size=211, seed=0, tokens=pool)
    assert set(tokens[:, 1:].flatten().tolist()) <= {5, 17, 40} and bool(
        (tokens[:, 0] == 210).all()
    )
    scores = gpt2lib.induction_scores(small_model, seq_len=6, batch=2, tokens=pool)
    assert scores.shape == (SMALL_SIZES["n_layer"], SMALL_SIZES["n_head"])


@pytest.mark.parametrize(
    "top_k, error, message",
    [
        (0, ValueError, r"top_k must be at least 1, got 0"),
        (-2, ValueError, r"top_k must be at least 1, got -2"),
        (212, ValueError, r"top_k must be at most 211, got 212"),
        (2.0, TypeError, "top_k must be a whole number"),
    ],
)
def test_logit_lens_refuses_a_bad_top_k(small_model, small_ids, top_k, error, message):
    with torch.no_grad():
        _, cache = run_with_cache(small_model, small_ids)
        with pytest.raises(error, match=message):
            gpt2lib.logit_lens(small_model, cache, top_k=top_k)
        assert gpt2lib.logit_lens(small_model, cache, top_k=211).indices.shape[-1] == 211


def test_tensor_head_indices_are_read_as_numbers(small_model, small_ids):
    with torch.no_grad():
        want, _ = run_with_cache(small_model, small_ids, capture=(), ablate_heads={1: [2, 3]})
        for ablate in (
            {1: torch.tensor([2, 3])},
            {torch.tensor(1): [torch.tensor(2), 3]},
            {1: torch.tensor([[2], [3]]).flatten()},
        ):
            got, _ = run_with_cache(small_model, small_ids, capture=(), ablate_heads=ablate)
            assert torch.equal(got, want)
        one, _ = run_with_cache(
            small_model, small_ids, capture=(), ablate_heads={1: torch.tensor(2)}
        )
        assert torch.equal(
            one, run_with_cache(small_model, small_ids, capture=(), ablate_heads={1: 2})[0]
        )


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
def test_bad_tensor_or_scalar_heads_get_a_clear_error(small_model, small_ids, ablate, message):
    with pytest.raises(TypeError, match=message):
        run_with_cache(small_model, small_ids, ablate_heads=ablate)
    assert _no_hooks(small_model)


# --------------------------------------------------------------------------- the new checks (#21)


# --------------------------------------------------------------------------- the chapter's fallback


def test_the_chapter_runs_on_the_learners_model_and_functions_after_each_exercise():
    """Chapter 8 loads the weights into the learner's GPT-2 with the learner's loader,
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


def test_next_token_logprobs_reads_the_figure_of_the_chapter(small_model):
    """The package's answer equals log_softmax of the model's logits at the last layer."""
    small_ids = torch.randint(
        0, small_model.config.vocab_size, (2, 7), generator=torch.Generator().manual_seed(0)
    )
    logits, cache = run_with_cache(small_model, small_ids)
    right = interpret.next_token_logprobs(interpret.logit_lens(small_model, cache), small_ids)
    assert right.shape == (small_model.config.n_layer + 1, 2, 6)
    want = logits[:, :-1].log_softmax(-1).gather(-1, small_ids[:, 1:, None])[..., 0]
    assert torch.allclose(right[-1], want, atol=1e-4)
