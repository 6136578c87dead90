"""Chapter 9: KV cache, sampling filters, generate(), streaming, and every bad input."""

import pytest
import torch
import torch.nn as nn
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from gpt2lib.chapters.config import GPT2Config
from gpt2lib.generation import (
    generate,
    next_token_probs,
    sample_next,
    stream_text,
    top_k_filter,
    top_p_filter,
)
from gpt2lib.kvcache import KVCache, write_kv
from gpt2lib.model import from_pretrained
from gpt2lib.tokenizer import ENDOFTEXT_ID

INF = float("inf")


@pytest.fixture(scope="module")
def model(tiny_model):
    return tiny_model()


def prompt(B=2, T=5, vocab=97, seed=1):
    return torch.randint(0, vocab, (B, T), generator=torch.Generator().manual_seed(seed))


# --------------------------------------------------------------------------- KV cache


def test_cache_size_matches_the_design_card():
    # 12 layers x 2 (K, V) x 768 features x 4 bytes = 72 KiB per position for GPT-2 small
    assert KVCache.bytes_per_position(GPT2Config()) == 72 * 1024
    config = GPT2Config(n_layer=3, n_head=2, n_embd=8, n_positions=16)
    cache = KVCache(config, batch_size=2, max_len=10, device="meta")
    assert cache.layers[0].k.shape == (2, 2, 10, 4)  # (B, n_head, max_len, head_dim)
    assert cache.nbytes == 2 * 10 * KVCache.bytes_per_position(config)


def test_write_kv_writes_at_the_position_and_returns_past_and_new():
    k_buf, v_buf = torch.zeros(1, 2, 8, 3), torch.zeros(1, 2, 8, 3)
    first_k, first_v = torch.randn(1, 2, 3, 3), torch.randn(1, 2, 3, 3)
    k, v = write_kv(k_buf, v_buf, first_k, first_v, 0)
    assert torch.equal(k, first_k) and torch.equal(v, first_v)
    new_k, new_v = torch.randn(1, 2, 1, 3), torch.randn(1, 2, 1, 3)
    k, v = write_kv(k_buf, v_buf, new_k, new_v, 3)
    assert torch.equal(k, torch.cat([first_k, new_k], 2))
    assert torch.equal(v, torch.cat([first_v, new_v], 2))
    assert k.data_ptr() == k_buf.data_ptr()  # a view of the preallocated buffer: no copy


def test_cache_is_static_and_refuses_to_overflow():
    config = GPT2Config(n_layer=1, n_head=1, n_embd=4, n_positions=16)
    cache = KVCache(config, batch_size=1, max_len=4)
    pointer = cache[0].k.data_ptr()
    keys, values, visible = cache[0].update(torch.randn(1, 1, 3, 4), torch.randn(1, 1, 3, 4))
    assert keys.shape == (1, 1, 3, 4) and visible is None  # nothing held before: plain causal
    assert cache.length == 3 and cache.position == 3 and cache[0].position == 3
    assert cache[0].k.data_ptr() == pointer
    _, _, visible = cache[0].update(torch.randn(1, 1, 1, 4), torch.randn(1, 1, 1, 4))
    assert visible.tolist() == [[True, True, True, True]]  # the new token sees all four
    with pytest.raises(ValueError, match="KV cache is full: it holds 4 positions, 4 are used"):
        cache[0].update(torch.randn(1, 1, 1, 4), torch.randn(1, 1, 1, 4))
    with pytest.raises(ValueError, match="longer than the model's context of 16"):
        KVCache(config, batch_size=1, max_len=17)


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    n_layer=st.integers(1, 3),
    n_head=st.integers(1, 3),
    head_dim=st.integers(1, 6),
    vocab=st.integers(5, 60),
    T=st.integers(1, 10),
    chunks=st.lists(st.integers(1, 4), max_size=4),
    seed=st.integers(0, 1000),
)
def test_cached_logits_equal_uncached(
    n_layer, n_head, head_dim, vocab, T, chunks, seed, tiny_model
):
    """Prefill then feed tokens in chunks through the cache: same logits as one full pass."""
    model = tiny_model(
        seed,
        n_layer=n_layer,
        n_head=n_head,
        n_embd=n_head * head_dim,
        vocab_size=vocab,
        n_positions=32,
    )
    total = T + sum(chunks)
    ids = torch.randint(0, vocab, (2, total), generator=torch.Generator().manual_seed(seed))
    with torch.no_grad():
        full = model(ids)  # (2, total, vocab)
        cache = KVCache.for_model(model, 2, total)
        pieces, start = [model(ids[:, :T], kv_cache=cache)], T
        for n in chunks:
            pieces.append(model(ids[:, start : start + n], kv_cache=cache))
            start += n
    assert cache.length == total
    torch.testing.assert_close(torch.cat(pieces, 1), full, atol=1e-5, rtol=1e-5)


@settings(max_examples=15, deadline=None)
@given(T=st.integers(1, 12), new=st.integers(0, 12), B=st.integers(1, 3), seed=st.integers(0, 99))
def test_greedy_with_and_without_cache_is_identical(T, new, B, seed, tiny_model):
    model = tiny_model(seed % 3)
    idx = prompt(B, T, seed=seed)
    cached = generate(model, idx, new, temperature=0)
    uncached = generate(model, idx, new, temperature=0, use_cache=False)
    assert cached.shape == (B, T + new)
    assert torch.equal(cached[:, :T], idx)
    assert torch.equal(cached, uncached)


def test_greedy_matches_transformers_generate(checkpoint_dir):
    from transformers import GPT2LMHeadModel

    ours = from_pretrained(checkpoint_dir, device="cpu")
    theirs = GPT2LMHeadModel.from_pretrained(str(checkpoint_dir)).eval()
    idx = torch.randint(0, 50257, (2, 6), generator=torch.Generator().manual_seed(0))
    expected = theirs.generate(
        idx,
        attention_mask=torch.ones_like(idx),
        max_new_tokens=12,
        do_sample=False,
        pad_token_id=ENDOFTEXT_ID,
    )
    assert torch.equal(generate(ours, idx, 12, temperature=0), expected)


# --------------------------------------------------------------------------- sampling


def test_top_k_keeps_exactly_the_k_largest():
    logits = torch.tensor([[1.0, 5.0, 3.0, 4.0, 2.0], [0.0, -1.0, 2.0, 1.0, -2.0]])
    kept = top_k_filter(logits, 2)
    want = torch.tensor([[0, 1, 0, 1, 0], [0, 0, 1, 1, 0]]).bool()
    assert torch.equal(torch.isfinite(kept), want)
    assert torch.equal(kept[torch.isfinite(kept)], torch.tensor([5.0, 4.0, 2.0, 1.0]))
    assert torch.equal(top_k_filter(logits, 5), logits)
    assert torch.isfinite(top_k_filter(logits, 1)).sum(-1).tolist() == [1, 1]


def test_top_p_keeps_the_token_that_crosses_p():
    probs = torch.tensor([0.15, 0.5, 0.05, 0.3])  # sorted: 0.5, 0.3, 0.15, 0.05
    logits = probs.log()
    kept = lambda p: torch.isfinite(top_p_filter(logits, p)).tolist()  # noqa: E731
    assert kept(0.4) == [False, True, False, False]  # 0.5 alone reaches 0.4
    assert kept(0.5) == [False, True, False, False]  # exactly p is enough
    assert kept(0.7) == [False, True, False, True]  # 0.5 + 0.3 crosses 0.7
    assert kept(0.9) == [True, True, False, True]
    assert kept(1.0) == [True, True, True, True]
    kept_logits = top_p_filter(logits, 0.7)
    assert torch.equal(kept_logits[torch.isfinite(kept_logits)], logits[[1, 3]])  # unchanged


def test_top_p_works_per_row():
    logits = torch.log(torch.tensor([[0.7, 0.2, 0.1], [0.1, 0.2, 0.7]]))
    assert torch.isfinite(top_p_filter(logits, 0.6)).tolist() == [
        [True, False, False],
        [False, False, True],
    ]


def test_temperature_divides_the_logits():
    logits = torch.tensor([[2.0, 1.0, 0.0, -1.0]])
    torch.testing.assert_close(next_token_probs(logits, 0.5), torch.softmax(logits * 2, -1))
    torch.testing.assert_close(next_token_probs(logits, 1.0), torch.softmax(logits, -1))
    assert next_token_probs(logits, 0).tolist() == [[1.0, 0.0, 0.0, 0.0]]


def test_filters_combine_then_renormalise():
    logits = torch.log(torch.tensor([[0.4, 0.3, 0.2, 0.1]]))
    probs = next_token_probs(logits, 1.0, top_k=3, top_p=0.6)
    # top-3 renormalised: 4/9, 3/9, 2/9 -> 4/9 + 3/9 crosses 0.6 -> 4/7, 3/7
    torch.testing.assert_close(probs, torch.tensor([[4 / 7, 3 / 7, 0.0, 0.0]]))


def test_sampling_only_draws_kept_tokens():
    logits = torch.tensor([[3.0, 2.9, 2.8, -5.0, 0.0]]).repeat(400, 1)
    gen = torch.Generator().manual_seed(0)
    assert set(sample_next(logits, 1.0, top_k=2, generator=gen).tolist()) == {0, 1}
    drawn = sample_next(logits, 1.0, generator=gen)
    assert {0, 1, 2} <= set(drawn.tolist())


def test_seeded_sampling_is_repeatable(model):
    idx = prompt()
    a = generate(model, idx, 15, temperature=1.0, top_k=20, seed=123)
    b = generate(model, idx, 15, temperature=1.0, top_k=20, seed=123)
    c = generate(
        model, idx, 15, temperature=1.0, top_k=20, generator=torch.Generator().manual_seed(123)
    )
    d = generate(model, idx, 15, temperature=2.0, seed=124)
    assert torch.equal(a, b) and torch.equal(a, c)
    assert not torch.equal(a, d)


def test_seeded_sampling_with_and_without_cache_is_identical(model):
    idx = prompt()
    assert torch.equal(
        generate(model, idx, 10, seed=5), generate(model, idx, 10, seed=5, use_cache=False)
    )


def test_generate_leaves_training_mode_alone_and_warns_that_dropout_is_on(model):
    model.train()
    try:
        with pytest.warns(UserWarning, match=r"(?s)training mode.*dropout is on.*model.eval\(\)"):
            generate(model, prompt(), 5, temperature=0)
        assert model.training and all(m.training for m in model.modules())
    finally:
        model.eval()
    import warnings

    with warnings.catch_warnings():
        warnings.simplefilter("error")  # in eval mode: no warning
        generate(model, prompt(), 5, temperature=0)
    assert not any(m.training for m in model.modules())


# --------------------------------------------------------------------------- stopping at EOS


@pytest.mark.parametrize("stop_at", [0, 2, 5])
def test_stops_at_eos_and_pads_finished_rows(model, stop_at):
    idx, new = prompt(B=3, T=4, seed=7), 8
    free = generate(model, idx, new, temperature=0)
    eos = int(free[0, 4 + stop_at])  # whatever row 0 writes at that step plays the EOS
    stopped = generate(model, idx, new, temperature=0, eos_token_id=eos)
    # expected, row by row, from the unstopped run: copy until the first eos, then pad with it
    ends = []
    expected = free.clone()
    for row in range(3):
        hits = (free[row, 4:] == eos).nonzero()
        if len(hits):
            first = int(hits[0]) + 4
            expected[row, first:] = eos
            ends.append(first + 1)
        else:
            ends.append(4 + new)
    length = max(ends)
    assert stopped.shape == (3, length)
    assert torch.equal(stopped, expected[:, :length])


def test_stop_at_eos_uses_endoftext(tiny_model):
    model = tiny_model(vocab_size=50257, n_embd=8, n_head=1, n_layer=1)
    with torch.no_grad():  # every position's logits become bias @ wte.T: <|endoftext|> wins
        model.ln_f.weight.zero_()
        model.ln_f.bias.fill_(1.0)
        model.wte.weight[ENDOFTEXT_ID] = 100.0
    idx = prompt(B=2, T=3, vocab=50000)
    free = generate(model, idx, 5, temperature=0)
    assert (free[:, 3:] == ENDOFTEXT_ID).all()
    stopped = generate(model, idx, 5, temperature=0, stop_at_eos=True)
    assert torch.equal(stopped, free[:, :4])  # the prompt and one <|endoftext|>


# --------------------------------------------------------------------------- streaming


class ScriptedModel(nn.Module):
    """A stand-in model that always 'predicts' the next token of a fixed script."""

    def __init__(self, script, vocab_size=256, prompt_len=1):
        super().__init__()
        self.config = GPT2Config(
            vocab_size=vocab_size, n_positions=64, n_embd=4, n_head=1, n_layer=1
        )
        self.script, self.prompt_len = script, prompt_len
        self.anchor = nn.Parameter(torch.zeros(1))

    def forward(self, idx, kv_cache=None, last_only=False):
        past = 0 if kv_cache is None else kv_cache.length
        position = past + idx.shape[1]  # how many tokens exist: what comes next is scripted
        if kv_cache is not None:
            kv_cache.advance(idx.shape[1])
        logits = torch.zeros(idx.shape[0], 1, self.config.vocab_size)
        logits[:, :, self.script[position - self.prompt_len]] = 10.0
        return logits


class ByteTokenizer:
    """Token i is byte i: the worst case for streaming, characters split over tokens."""

    def encode(self, text):
        return list(text.encode("utf-8"))

    def decode(self, ids):
        return bytes(ids).decode("utf-8", errors="replace")

    def decode_single_token_bytes(self, token):
        return bytes([token])


class DecodeOnlyTokenizer(ByteTokenizer):
    decode_single_token_bytes = None


@pytest.mark.parametrize("tokenizer", [ByteTokenizer(), DecodeOnlyTokenizer()])
def test_stream_never_shows_half_a_character(tokenizer):
    text = "héllo 🙂 世界!"
    script = list(text.encode("utf-8"))
    model = ScriptedModel(script)
    pieces = list(stream_text(model, tokenizer, "x", max_new_tokens=len(script), temperature=0))
    assert "".join(pieces) == text
    assert all("\ufffd" not in piece for piece in pieces)
    assert "🙂" in pieces  # the four bytes of the emoji came out as one piece


def test_stream_of_invalid_bytes_ends_like_decode():
    script = list(b"ok") + [0xE2, 0x82]  # ends inside a 3-byte character
    model = ScriptedModel(script)
    pieces = list(stream_text(model, ByteTokenizer(), "x", max_new_tokens=4, temperature=0))
    assert "".join(pieces) == bytes(script).decode("utf-8", errors="replace")


def test_stream_text_equals_decode_of_generate(checkpoint_dir):
    tokenizer = pytest.importorskip("gpt2lib.tokenizer").get_encoding()
    model = from_pretrained(checkpoint_dir, device="cpu")
    text = "The café served 🙂 and"
    ids = torch.tensor([tokenizer.encode(text)])
    made = generate(model, ids, 25, temperature=1.0, top_p=0.95, seed=3)
    pieces = list(stream_text(model, tokenizer, text, 25, temperature=1.0, top_p=0.95, seed=3))
    assert "".join(pieces) == tokenizer.decode(made[0, ids.shape[1] :].tolist())


# --------------------------------------------------------------------------- bad input


@pytest.mark.parametrize(
    "kwargs,error,message",
    [
        (
            dict(max_new_tokens=60),
            ValueError,
            r"5 tokens \+ max_new_tokens=60 = 65 is more than "
            r"the model's context of 64 positions",
        ),
        (dict(max_new_tokens=-1), ValueError, "max_new_tokens must be >= 0, got -1"),
        (dict(max_new_tokens=2.5), TypeError, "max_new_tokens must be an int >= 0"),
        (dict(max_new_tokens=True), TypeError, "max_new_tokens must be an int >= 0, got a bool"),
        (
            dict(temperature=-0.5),
            ValueError,
            r"temperature must be >= 0, got -0.5 \(0 means greedy\)",
        ),
        (dict(temperature=float("nan")), ValueError, "temperature must be a finite number"),
        (dict(temperature="hot"), TypeError, "temperature must be a number"),
        (
            dict(top_k=0),
            ValueError,
            r"top_k must be at least 1, got 0 \(1 is greedy; None keeps every token\)",
        ),
        (dict(top_k=2.0), TypeError, "top_k must be a whole number, got 2.0"),
        (dict(top_p=0.0), ValueError, r"top_p must be > 0 and <= 1, got 0 \(1 keeps every token\)"),
        (dict(top_p=1.5), ValueError, r"top_p must be > 0 and <= 1, got 1.5"),
        (dict(seed=1, generator=torch.Generator()), ValueError, "either generator or seed"),
        (dict(eos_token_id=500), ValueError, "eos_token_id must be at most 96, got 500"),
    ],
)
def test_bad_settings_are_refused(model, kwargs, error, message):
    kwargs = {"max_new_tokens": 3, **kwargs}
    with pytest.raises(error, match=message):
        generate(model, prompt(), **kwargs)


@pytest.mark.parametrize(
    "idx,error,message",
    [
        # one validator for every entry point: chapter 2's check_token_ids, in its words
        (
            torch.tensor([[3, 97]]),
            ValueError,
            r"token ids must be in 0 \.\. 96 \(vocab_size=97\), "
            r"got values from 3 to 97",
        ),
        (torch.tensor([[-1, 3]]), ValueError, r"token ids must be in 0 \.\. 96 .*from -1 to 3"),
        (torch.zeros(1, 0, dtype=torch.long), ValueError, "hold no tokens"),
        (torch.zeros(0, 3, dtype=torch.long), ValueError, "hold no tokens"),
        (
            torch.tensor([1, 2, 3]),
            ValueError,
            r"must have shape \(B, T\), got \(3,\); for one sequence",
        ),
        (torch.tensor([[1.0, 2.0]]), TypeError, "token ids must be integers"),
        ([[1, 2]], TypeError, "token ids must be a torch.Tensor"),
    ],
)
def test_bad_prompts_are_refused(model, idx, error, message):
    with pytest.raises(error, match=message):
        generate(model, idx, 3)


def test_model_generate_delegates_and_refuses_the_same(model):
    assert torch.equal(
        generate(model, prompt(), 4, temperature=0), generate(model, prompt(), 4, temperature=0)
    )
    with pytest.raises(ValueError, match="top_p must be > 0 and <= 1"):
        generate(model, prompt(), 4, top_p=2)


def test_stream_text_refuses_at_once():
    model = ScriptedModel([65] * 10)
    with pytest.raises(ValueError, match="empty prompt"):
        stream_text(model, ByteTokenizer(), "", 3)
    with pytest.raises(TypeError, match="prompt must be a str"):
        stream_text(model, ByteTokenizer(), [1, 2], 3)
    with pytest.raises(ValueError, match="more than the model's context of 64"):
        stream_text(model, ByteTokenizer(), "abc", 62)
    with pytest.raises(ValueError, match="top_k must be at least 1"):
        stream_text(model, ByteTokenizer(), "abc", 3, top_k=0)


def test_compile_flag_is_harmless_on_cpu(model):
    with pytest.warns(UserWarning, match="compile=True captures a CUDA graph, which needs a CUDA"):
        a = generate(model, prompt(), 4, temperature=0, compile=True)
    assert torch.equal(a, generate(model, prompt(), 4, temperature=0))


def test_zero_new_tokens_returns_the_prompt(model):
    assert torch.equal(generate(model, prompt(), 0), prompt())


# --------------------------------------------------------------------------- arguments, once


@pytest.mark.parametrize(
    "kwargs,error,message",
    [
        (dict(seed="abc"), TypeError, r"seed must be a whole number, got 'abc'"),
        (dict(seed=2**70), ValueError, r"seed must be at most 18446744073709551615"),
        (dict(seed=True), TypeError, "seed must be a whole number, got True"),
        (dict(eos_token_id="x"), TypeError, "eos_token_id must be a whole number"),
        (dict(eos_token_id=True), TypeError, "eos_token_id must be a whole number"),
        (dict(temperature=float("inf")), ValueError, "temperature must be a finite number"),
        (dict(generator="g"), TypeError, "generator must be a torch.Generator"),
        (dict(use_cache="yes"), TypeError, "use_cache must be True or False"),
    ],
)
def test_bad_generate_arguments_name_the_argument_before_any_work(
    model, monkeypatch, kwargs, error, message
):
    from gpt2lib import generation

    monkeypatch.setattr(generation, "decode_all", lambda *a, **k: pytest.fail("work started"))
    hook = model.register_forward_pre_hook(lambda *a: pytest.fail("the model ran"))
    try:
        with pytest.raises(error, match=message):
            generate(model, prompt(), 3, **kwargs)
    finally:
        hook.remove()


def test_numpy_scalars_are_accepted(model):
    np = pytest.importorskip("numpy")
    a = generate(
        model,
        prompt(),
        6,
        temperature=np.float32(0.7),
        top_k=np.int64(20),
        top_p=np.float64(0.9),
        seed=np.int64(3),
        eos_token_id=np.int64(5),
    )
    b = generate(model, prompt(), 6, temperature=0.7, top_k=20, top_p=0.9, seed=3, eos_token_id=5)
    assert torch.equal(a, b)


def test_a_tiny_temperature_is_greedy_not_a_crash(model):
    greedy = generate(model, prompt(), 6, temperature=0)
    for t in (1e-45, 5e-324, 1e-30):
        assert torch.equal(generate(model, prompt(), 6, temperature=t, seed=0), greedy)
    probs = next_token_probs(torch.tensor([[1.0, 3.0, 2.0]]), 1e-45)
    assert probs.tolist() == [[0.0, 1.0, 0.0]]


def test_the_prompt_and_the_settings_are_checked_once(model, monkeypatch):
    from gpt2lib import generation

    counts = {"prompt": 0, "sampling": 0}
    real_prompt, real_sampling = generation._check_prompt, generation.check_sampling_args

    def count(name, fn):
        def wrapper(*args, **kwargs):
            counts[name] += 1
            return fn(*args, **kwargs)

        return wrapper

    monkeypatch.setattr(generation, "_check_prompt", count("prompt", real_prompt))
    monkeypatch.setattr(generation, "check_sampling_args", count("sampling", real_sampling))
    generate(model, prompt(), 10, temperature=0.8, top_k=5, seed=0)
    assert counts == {"prompt": 1, "sampling": 1}
    list(generation.stream_text(ScriptedModel([65] * 12), ByteTokenizer(), "x", 5, temperature=0))
    assert counts == {"prompt": 2, "sampling": 2}


def test_decode_tokens_arguments_after_the_count_are_keyword_only(model):
    from gpt2lib.generation import decode_tokens

    with pytest.raises(TypeError):
        decode_tokens(model, prompt(), 3, 0.0)
    with pytest.raises(ValueError, match="top_k must be at least 1"):
        decode_tokens(model, prompt(), 3, top_k=0)  # checked at the call, not at the first step
    assert len(list(decode_tokens(model, prompt(), 3, temperature=0))) == 3


# --------------------------------------------------------------------------- overlap


class CustomBlock(nn.Module):
    """A learner's block: generate() must run it through the model's forward."""

    def __init__(self, config):
        super().__init__()
        from gpt2lib.chapters.block import Block

        self.inner = Block(config)
        self.dropout = nn.Dropout(0.5)
        self.modes_seen = []

    def forward(self, x, kv_cache=None):
        self.modes_seen.append(self.training)
        return self.dropout(self.inner(x, kv_cache=kv_cache))


@pytest.mark.parametrize("learners", [False, True], ids=["gpt2lib", "learner blocks"])
def test_interleaved_generators_do_not_change_each_other_or_the_caller(learners, tiny_model):
    from gpt2lib.generation import decode_tokens

    model = tiny_model(model_kwargs={"block_cls": CustomBlock} if learners else None)
    expected = generate(model, prompt(), 8, temperature=0)[:, 5:]
    first = decode_tokens(model, prompt(), 8, temperature=0)
    second = decode_tokens(model, prompt(), 8, temperature=0)
    got_first, got_second = [], []
    for a, b in zip(first, second):
        got_first.append(a)
        assert torch.is_grad_enabled()  # paused generators leave gradients on for the caller
        assert not any(m.training for m in model.modules())  # the mode is the owner's
        got_second.append(b)
    assert torch.equal(torch.stack(got_first, 1), expected)
    assert torch.equal(torch.stack(got_second, 1), expected)
    if learners:  # every forward the generators ran was in eval mode
        assert model.h[0].modes_seen and not any(model.h[0].modes_seen)


def test_an_abandoned_stream_leaves_the_model_as_it_was(tiny_model):
    model = tiny_model(model_kwargs={"block_cls": CustomBlock}).train()
    pieces = stream_text(model, ByteTokenizer(), "AB", 10, temperature=0)
    next(pieces)
    del pieces
    assert model.training and all(m.training for m in model.modules())
    model.eval()
    pieces = stream_text(model, ByteTokenizer(), "AB", 10, temperature=0)
    next(pieces)
    del pieces
    assert not any(m.training for m in model.modules())


@pytest.mark.parametrize("learners", [False, True], ids=["gpt2lib", "learner blocks"])
def test_generations_in_threads_give_the_results_of_one_alone(learners, tiny_model):
    import threading

    model = tiny_model(model_kwargs={"block_cls": CustomBlock} if learners else None)
    idx = prompt()
    alone = generate(model, idx, 12, temperature=0)
    results, errors = [], []

    def run():
        try:
            for _ in range(3):
                results.append(generate(model, idx, 12, temperature=0))
        except Exception as error:  # pragma: no cover - reported below
            errors.append(error)

    threads = [threading.Thread(target=run) for _ in range(3)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert not errors
    assert len(results) == 9 and all(torch.equal(r, alone) for r in results)
    assert not any(m.training for m in model.modules())  # two threads, one eval-mode model
    if learners:
        assert not any(model.h[0].modes_seen)  # not one forward ran with dropout


@pytest.mark.parametrize("dtype", [torch.int16, torch.uint8, torch.int32])
def test_prompts_of_any_integer_dtype_give_the_same_tokens(model, dtype):
    ids = prompt()
    want = generate(model, ids, 4, temperature=0)
    got = generate(model, ids.to(dtype), 4, temperature=0)
    assert got.dtype == torch.long and torch.equal(got, want)


# --------------------------------------------------------------------------- the playground


@pytest.mark.slow
def test_the_playground_cell_finishes_under_nbclient_without_a_browser(tmp_path, monkeypatch):
    """Run by nbclient (what nbconvert and `course progress` use), with no
    frontend, the playground cell prints a sample and creates no widget to wait on."""
    import json
    import os
    from pathlib import Path

    import nbformat
    from nbclient import NotebookClient

    root = Path(__file__).resolve().parents[2]
    chapter = json.loads((root / "solutions" / "09_generation.ipynb").read_text(encoding="utf-8"))
    playground = next(c for c in chapter["cells"] if c.get("id") == "94411265")
    setup = (
        "import os, torch\n"
        "from gpt2lib.model import from_pretrained\n"
        "from gpt2lib.generation import stream_text\n"
        "from gpt2lib.tokenizer import get_encoding\n"
        f"model = from_pretrained({os.environ['GPT2LIB_CHECKPOINT']!r}).eval()\n"
        "tokenizer, NEW_TOKENS = get_encoding(), 5\n"
    )
    nb = nbformat.v4.new_notebook(
        cells=[
            nbformat.v4.new_code_cell(setup),
            nbformat.v4.new_code_cell("".join(playground["source"])),
        ]
    )
    monkeypatch.delenv("JPY_SESSION_NAME", raising=False)  # the kernel inherits: no browser
    NotebookClient(
        nb, timeout=120, kernel_name="python3", resources={"metadata": {"path": str(tmp_path)}}
    ).execute()
    outputs = nb.cells[1].outputs
    text = "".join(o.get("text", "") for o in outputs)
    assert text.startswith("The meaning of life is") and "no browser attached" in text
    assert not any("application/vnd.jupyter.widget-view+json" in o.get("data", {}) for o in outputs)


# --------------------------------------------------------------------------- the learner's code drives the chapter


def _chapter_cell(starts_with):
    import json
    from pathlib import Path

    root = Path(__file__).resolve().parents[2]
    chapter = json.loads((root / "solutions" / "09_generation.ipynb").read_text(encoding="utf-8"))
    return next(
        "".join(c["source"])
        for c in chapter["cells"]
        if "".join(c["source"]).startswith(starts_with)
    )


@pytest.mark.parametrize("planted", [False, True])
def test_the_chapters_text_comes_from_the_learners_loop_cache_and_sampling(
    planted, capsys, tiny_model
):
    """Chapter 9's generation cell runs the learner's decode loop, cache class and
    sampling step (through mine.yours); a planted wrong sampling step changes its text."""
    from gpt2lib.chapters import decoding
    from gpt2lib.course.mine import PASSED, yours
    from gpt2lib.tokenizer import get_encoding

    tokenizer = get_encoding()
    model = tiny_model(n_positions=64, vocab_size=tokenizer.n_vocab)

    def always_seven(logits, temperature=1.0, top_k=None, top_p=None, generator=None):
        return torch.full((logits.shape[0],), 7, dtype=torch.long, device=logits.device)

    namespace = dict(
        torch=torch,
        model=model,
        config=model.config,
        device=torch.device("cpu"),
        dtype=torch.float32,
        tokenizer=tokenizer,
        NEW_TOKENS=6,
        generate=generate,
        yours=yours,
        generate_cached=decoding.generate_cached,
        Cache=decoding.SimpleKVCache,
        greedy=lambda logits: logits.argmax(-1),
        sample=always_seven if planted else decoding.sample_token,
    )
    PASSED.add("9.9")  # as if the loop's check had passed in this kernel
    try:
        exec(_chapter_cell('loop = yours("9.9"'), namespace)
    finally:
        PASSED.discard("9.9")
    printed = capsys.readouterr().out
    sevens = tokenizer.decode([7] * 6)
    assert (printed.count(sevens) == 3) is planted  # the three sampled texts
    assert "use_cache=False): True" in printed  # greedy runs through the learner's loop too


def test_the_speed_printout_puts_each_speed_next_to_its_limit(capsys):
    """Chapter 9's speed cell prints through gpt2lib.measure.print_decode_limits: the memory limit
    only where the weights do not fit in the last-level cache; a rate above a limit is flagged."""
    from gpt2lib.speed.measure import print_decode_limits

    common = dict(per_token=2e6, llc=32 * 2**20, bandwidth=10.0)
    print_decode_limits(100.0, 400.0, 5000.0, True, **common)
    out = capsys.readouterr().out
    assert "25% of the limit of the multiplies alone: within it" in out
    assert "the memory stream:" not in out and "does not apply" in out
    print_decode_limits(100.0, 400.0, 80.0, False, **common)
    out = capsys.readouterr().out
    assert "125% of the limit of the memory stream: ABOVE" in out and "rerun" in out
