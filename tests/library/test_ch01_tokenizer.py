"""Chapter 1: the from-scratch BPE tokenizer and its tiktoken fast path (the checks of its
exercises are tested in tests/graders/test_ch01_checks.py).

The references are independent of our code: tiktoken's own loader for GPT-2's files
(`data_gym_to_mergeable_bpe_ranks`) and tiktoken's own GPT-2 split pattern, run by tiktoken's
Rust engine.
"""

from __future__ import annotations

import warnings
from collections import Counter

import pytest
import regex
from hypothesis import given, settings
from hypothesis import strategies as st

from gpt2lib.tokenizer import (
    ENDOFTEXT,
    GPT2_SPLIT_PATTERN,
    BPETokenizer,
    bpe_merge,
    bpe_merge_fast,
    bytes_to_unicode,
    get_encoding,
    merge_pair,
    most_frequent_pair,
    pretokenize,
    train_bpe,
    train_merges_simple,
)


@pytest.fixture(scope="module")
def tok() -> BPETokenizer:
    return BPETokenizer.gpt2()


def test_get_encoding_is_cached_and_needs_no_network(monkeypatch):
    import tiktoken.load

    def no_network(*args, **kwargs):
        raise AssertionError("get_encoding tried to download")

    monkeypatch.setattr(tiktoken.load, "read_file", no_network)
    monkeypatch.setattr(tiktoken.load, "read_file_cached", no_network)
    get_encoding.cache_clear()
    enc = get_encoding()
    assert get_encoding() is enc
    assert enc.encode("offline") == BPETokenizer.gpt2().encode("offline")


# --------------------------------------------------------------------------- pieces


def test_bytes_to_unicode_is_a_printable_bijection():
    mapping = bytes_to_unicode()
    assert sorted(mapping) == list(range(256))
    chars = list(mapping.values())
    assert len(set(chars)) == 256
    assert all(c.isprintable() and not c.isspace() for c in chars)
    assert mapping[ord("A")] == "A" and mapping[ord(" ")] == "Ġ" and mapping[ord("\n")] == "Ċ"


def test_split_examples():
    split = regex.compile(GPT2_SPLIT_PATTERN).findall
    assert split("x   y") == ["x", "  ", " y"]
    assert split("a\nb") == ["a", "\n", "b"]
    assert split("I DON'T know, I don't.") == [
        "I",
        " DON",
        "'",
        "T",
        " know",
        ",",
        " I",
        " don",
        "'t",
        ".",
    ]
    assert split("end  \n") == ["end", "  \n"]


def test_bpe_merge_follows_rank_order():
    ranks = {(b"b", b"c"): 0, (b"a", b"b"): 1, (b"a", b"bc"): 2}
    assert bpe_merge([b"a", b"b", b"c"], ranks) == [b"abc"]
    # ranks need not be consecutive
    assert bpe_merge([b"a", b"b", b"c"], {(b"b", b"c"): 900, (b"a", b"b"): 5000}) == [b"a", b"bc"]
    assert bpe_merge([b"a"] * 5, {(b"a", b"a"): 0}) == [b"aa", b"aa", b"a"]
    assert bpe_merge([], {}) == []
    symbols = [b"a", b"b"]
    bpe_merge(symbols, {(b"a", b"b"): 0})
    assert symbols == [b"a", b"b"], "bpe_merge must not change the caller's list"


def test_encode_uses_the_word_cache(tok, monkeypatch):
    fresh = BPETokenizer.gpt2()
    calls = Counter()
    import gpt2lib.tokenizer as module

    original = module.bpe_merge

    def counting(symbols, ranks):
        calls["n"] += 1
        return original(symbols, ranks)

    monkeypatch.setattr(module, "bpe_merge", counting)
    ids = fresh.encode("the cat and the dog and the cat")
    assert calls["n"] == 5  # 'the', ' cat', ' and', ' the', ' dog': repeats come from the cache
    assert fresh.encode("the cat and the dog and the cat") == ids
    assert calls["n"] == 5


def test_cache_is_bounded():
    small = BPETokenizer.gpt2()
    small.cache_limit = 10
    text = " ".join(f"w{i}" for i in range(100))
    assert small.encode(text) == get_encoding().encode(text)
    assert len(small._cache) <= 10
    # cached pieces and new ones in one text, past the limit
    for text in ["a b c d", "a b c d e f g h i j k", "k l a b"]:
        assert small.encode(text) == get_encoding().encode(text)
        assert len(small._cache) <= 10


def test_missing_data_files_give_a_clear_error(tmp_path):
    (tmp_path / "encoder.json").write_text("{}", encoding="utf-8")
    with pytest.raises(FileNotFoundError, match=r"lacks vocab.bpe: .*pip install -e"):
        BPETokenizer.gpt2(tmp_path)


def test_inconsistent_vocabulary_is_refused():
    vocab = {bytes([b]): b for b in range(255)}
    with pytest.raises(ValueError, match="lacks 1 of the 256 single bytes"):
        BPETokenizer(vocab, [])
    vocab = {bytes([b]): b for b in range(256)}
    with pytest.raises(ValueError, match="not in the vocabulary"):
        BPETokenizer(vocab, [(b"a", b"b")])


@settings(max_examples=300, deadline=None)
@given(
    st.lists(st.sampled_from([b"a", b"b", b"c"]), max_size=14),
    st.dictionaries(
        st.tuples(
            st.sampled_from([b"a", b"b", b"c", b"ab", b"bc", b"aa", b"abc", b"ca"]),
            st.sampled_from([b"a", b"b", b"c", b"ab", b"bc", b"aa", b"ca"]),
        ),
        st.integers(0, 5),  # repeated ranks too: ties go to the leftmost pair in both versions
        max_size=8,
    ),
)
def test_property_fast_merge_equals_the_simple_one(symbols, ranks):
    given_symbols = list(symbols)
    assert bpe_merge_fast(symbols, ranks) == bpe_merge(symbols, ranks)
    assert symbols == given_symbols  # the caller's list is left alone


@settings(max_examples=100, deadline=None)
@given(
    st.lists(st.sampled_from(["a", "b", "ab", "é", "ba", "aa"]), min_size=1, max_size=40).map(
        "".join
    ),
    st.lists(st.sampled_from(["a", "b", "é"]), max_size=60).map("".join),
    st.integers(257, 300),
)
def test_property_fast_merge_equals_the_simple_one_on_trained_merges(training, word, vocab_size):
    # Rank tables made by training: the fast path proper (no fall-back to the simple loop).
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # short texts run out of pairs
        _, merges = train_bpe(training, vocab_size)
    ranks = {pair: rank for rank, pair in enumerate(merges)}
    symbols = [bytes([b]) for b in word.encode("utf-8")]
    assert bpe_merge_fast(symbols, ranks) == bpe_merge(symbols, ranks)


def test_fast_merge_falls_back_for_a_table_not_made_by_training(monkeypatch):
    # (ab, c) has a lower rank than (a, b), which makes 'ab': no trainer writes that.
    ranks = {(b"ab", b"c"): 0, (b"a", b"b"): 1, (b"c", b"c"): 2}
    symbols = [b"c", b"c", b"a", b"b", b"c"] * 3
    import gpt2lib.tokenizer as module

    calls = []
    monkeypatch.setattr(module, "bpe_merge", lambda s, r: calls.append(1) or bpe_merge(s, r))
    assert bpe_merge_fast(symbols, ranks) == bpe_merge(symbols, ranks)
    assert calls == [1]


@pytest.mark.parametrize(
    "text", ["é" * 8000, "a" * 16000, "ab" * 5000 + " " + "\n" * 3000, "🤗" * 3000]
)
def test_long_runs_match_tiktoken(text):
    # Each run is one pre-token: the heap merge handles it (the simple loop would take minutes).
    assert BPETokenizer.gpt2().encode(text) == get_encoding().encode(text)


@pytest.mark.slow
def test_one_megabyte_of_one_letter_matches_tiktoken():
    text = "a" * 1_000_000
    assert BPETokenizer.gpt2().encode(text) == get_encoding().encode(text)


def test_training_on_a_tiny_text():
    # pieces: 'ab' once, ' ab' twice: (a, b) occurs 3 times, ( , a) twice
    vocab, merges = train_bpe("ab ab ab", 258)
    assert merges == [(b"a", b"b"), (b" ", b"ab")]
    assert vocab[b"ab"] == 256 and vocab[b" ab"] == 257


def test_ties_go_to_the_lexicographically_greater_pair():
    # 'ab' and 'cd' both occur twice: (c, d) > (a, b), so it is learned first, whatever comes first.
    for text in ["ab cd ab cd", "cd ab cd ab"]:
        _, merges = train_bpe(text, 258)
        assert merges[0] == (b"c", b"d")
    # the comparison is of byte strings, so a longer string beats its own prefix
    assert most_frequent_pair({(b"a", b"b"): 1, (b"a", b"bc"): 1}) == (b"a", b"bc")
    assert most_frequent_pair({(b"z", b"a"): 1, (b"y", b"z"): 1, (b"y", b"zz"): 1}) == (b"z", b"a")


@settings(max_examples=60, deadline=None)
@given(
    st.lists(st.sampled_from(list("aab bc\n") + ["é", "<|endoftext|>"]), max_size=80).map("".join),
    st.integers(256, 290),
)
def test_property_incremental_training_equals_the_simple_loop(text, vocab_size):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # short texts run out of pairs
        fast = train_bpe(text, vocab_size, special_tokens=[ENDOFTEXT])
    assert fast == train_merges_simple(text, vocab_size, special_tokens=[ENDOFTEXT])


def test_no_merge_crosses_a_special_token():
    text = "the<|endoftext|>cat " * 20
    with pytest.warns(UserWarning, match="stopped at 261 tokens"):  # every piece became one token
        small = BPETokenizer.train(text, 300, special_tokens=[ENDOFTEXT])
    tokens = set(small.vocab)
    assert b"thec" not in tokens and (b"the", b"c") not in small.merges
    assert all(b"<|" not in token and b"ec" not in token for token in tokens)
    assert pretokenize(text, special_tokens=[ENDOFTEXT]) == Counter(
        {"the": 1, " the": 19, "cat": 20, " ": 1}
    )


@pytest.mark.parametrize(
    "specials, message",
    [
        ([""], "cannot be the empty string"),
        ([ENDOFTEXT, "x", ENDOFTEXT], r"lists '<\|endoftext\|>' more than once"),
        (ENDOFTEXT, "must be a list of strings"),
        ([ENDOFTEXT, 3], "must be a list of strings, got 3"),
    ],
)
def test_train_refuses_bad_special_tokens(specials, message):
    with pytest.raises((ValueError, TypeError), match=message):
        BPETokenizer.train("some text", 300, special_tokens=specials)


@pytest.mark.parametrize("size", [0, 100, 255])
def test_train_rejects_small_vocab(size):
    with pytest.raises(ValueError, match=rf"vocab_size must be at least 256.*got {size}"):
        BPETokenizer.train("some text", size)


def test_train_rejects_bad_types():
    with pytest.raises(TypeError, match="vocab_size must be an int, got float"):
        BPETokenizer.train("some text", 300.0)
    with pytest.raises(TypeError, match="vocab_size must be an int, got str"):
        BPETokenizer.train("some text", "300", special_tokens=[ENDOFTEXT])
    with pytest.raises(TypeError, match="vocab_size must be an int, got bool"):
        BPETokenizer.train("some text", True)
    with pytest.raises(TypeError, match="training text as a str, got bytes"):
        BPETokenizer.train(b"some text", 300)
    with pytest.raises(
        ValueError, match=r"at least 256 \+ 2 \(one token per byte plus the 2 special tokens\)"
    ):
        BPETokenizer.train("some text", 257, special_tokens=[ENDOFTEXT, "<|pad|>"])


def test_train_warns_when_the_text_runs_out():
    with pytest.warns(UserWarning, match="stopped at .* short of vocab_size=1000"):
        small = BPETokenizer.train("aaa bbb", 1000)
    assert small.decode(small.encode("aaa bbb")) == "aaa bbb"


def test_merge_pair_and_most_frequent_pair():
    words = {(b"a", b"b", b"a", b"b"): 2, (b"b", b"a"): 1}
    assert most_frequent_pair(words) == (b"a", b"b")
    assert merge_pair(words, (b"a", b"b")) == {(b"ab", b"ab"): 2, (b"b", b"a"): 1}
    assert merge_pair({(b"ab", b"c"): 3, (b"a", b"b", b"c"): 2}, (b"a", b"b")) == {(b"ab", b"c"): 5}
    assert most_frequent_pair({(b"x",): 4}) is None


def test_save_refuses_a_special_token_spelled_like_a_token(tmp_path):
    vocab = {bytes([b]): b for b in range(256)}
    with pytest.raises(ValueError, match="'a' is written like an ordinary token"):
        BPETokenizer(vocab, [], special_tokens={"a": 256}).save(tmp_path)
    assert not (tmp_path / "encoder.json").exists()


def test_load_refuses_broken_files(tmp_path):
    with pytest.raises(FileNotFoundError, match="lacks encoder.json, vocab.bpe"):
        BPETokenizer.load(tmp_path)
    (tmp_path / "encoder.json").write_text("{not json", encoding="utf-8")
    (tmp_path / "vocab.bpe").write_text("#version: 0.2\n", encoding="utf-8")
    with pytest.raises(ValueError, match="is not valid JSON"):
        BPETokenizer.load(tmp_path)
    BPETokenizer.train("ab ab", 257).save(tmp_path / "ok")
    (tmp_path / "ok" / "vocab.bpe").write_text("#version: 0.2\na b c\n", encoding="utf-8")
    with pytest.raises(ValueError, match="line 2: expected two tokens"):
        BPETokenizer.load(tmp_path / "ok")


def test_from_vocab_and_merges_refuses_bad_input():
    vocab = {i: bytes([i]) for i in range(256)}
    with pytest.raises(
        ValueError, match=r"merge 0 \(b'a' \+ b'zz'\) names b'zz', which is not a token"
    ):
        BPETokenizer.from_vocab_and_merges({**vocab, 256: b"azz"}, [(b"a", b"zz")])
    with pytest.raises(ValueError, match="makes a token that is not in the vocabulary"):
        BPETokenizer.from_vocab_and_merges(vocab, [(b"a", b"b")])
    with pytest.raises(ValueError, match="lacks 1 of the 256 single bytes"):
        BPETokenizer.from_vocab_and_merges({i: bytes([i]) for i in range(255)}, [])
    with pytest.raises(ValueError, match=r"ids 97 and 256 both hold b'a'"):
        BPETokenizer.from_vocab_and_merges({**vocab, 256: b"a"}, [])
    with pytest.raises(TypeError, match="must be a pair"):
        BPETokenizer.from_vocab_and_merges({**vocab, 256: b"ab"}, [b"ab"])
    with pytest.raises(ValueError, match="cannot be the empty string"):
        BPETokenizer.from_vocab_and_merges(vocab, [], special_tokens=[""])
    with pytest.raises(ValueError, match="more than once"):
        BPETokenizer.from_vocab_and_merges(vocab, [], special_tokens=["<|x|>", "<|x|>"])


def test_constructor_refuses_an_empty_special_token():
    vocab = {bytes([b]): b for b in range(256)}
    with pytest.raises(ValueError, match="cannot be the empty string"):
        BPETokenizer(vocab, [], special_tokens={"": 256})


def _first_with_message(mistakes, mistake):
    # Two planted mistakes may share a message (two ways of writing one mistake).
    return next(m for m in mistakes if m.message == mistake.message)


def test_the_entry_point_checks_what_the_plain_class_does_not():
    import gpt2lib.chapters.bpe as bpe

    # The chapter's class shows the algorithm: it trusts its input.
    assert bpe.BPETokenizer.gpt2().encode("a<|endoftext|>") == get_encoding().encode(
        "a<|endoftext|>", disallowed_special=()
    )
    # The package's refuses, with the messages the rest of these tests assert.
    with pytest.raises(ValueError, match="not allowed"):
        BPETokenizer.gpt2().encode("a<|endoftext|>")
    with pytest.raises(TypeError, match="token ids must be ints"):
        BPETokenizer.gpt2().decode([1.5])


# --------------------------------------------------------------------------- checks of the newer exercises
