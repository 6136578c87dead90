"""Chapter 1: the from-scratch BPE tokenizer, its tiktoken fast path, and the exercise checks.

The references are independent of our code: tiktoken's own loader for GPT-2's files
(`data_gym_to_mergeable_bpe_ranks`) and tiktoken's own GPT-2 split pattern, run by tiktoken's
Rust engine.
"""

from __future__ import annotations

import json
import warnings
from collections import Counter

import pytest
import regex
import tiktoken
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from tiktoken.load import data_gym_to_mergeable_bpe_ranks
from tiktoken_ext.openai_public import r50k_pat_str

from gpt2lib.checks import CheckFailed
from gpt2lib.checks import tokenizer as checks
from gpt2lib.tokenizer import (
    ENDOFTEXT,
    ENDOFTEXT_ID,
    GPT2_SPLIT_PATTERN,
    BPETokenizer,
    bpe_merge,
    bytes_to_unicode,
    get_encoding,
    gpt2_data_dir,
    load_gpt2_vocab,
    merge_pair,
    most_frequent_pair,
    train_bpe,
)

DATA = gpt2_data_dir()


@pytest.fixture(scope="module")
def tok() -> BPETokenizer:
    return BPETokenizer.gpt2()


@pytest.fixture(scope="module")
def openai_encoding() -> tiktoken.Encoding:
    """GPT-2 as tiktoken itself builds it (its loader, its pattern), from the local files."""
    ranks = data_gym_to_mergeable_bpe_ranks(str(DATA / "vocab.bpe"), str(DATA / "encoder.json"))
    return tiktoken.Encoding(
        name="gpt2-reference", pat_str=r50k_pat_str, mergeable_ranks=ranks, special_tokens={ENDOFTEXT: ENDOFTEXT_ID}
    )


CORPUS = [
    "",
    "Hello world",
    "The quick brown fox jumps over the lazy dog.",
    "I'm sure you're right; we'll see, they've said it's done and I'd agree.",
    "DON'T SHOUT. I'M LISTENING! YOU'RE HERE, WE'LL GO, THEY'VE LEFT, IT'S ODD, I'D KNOW",
    "it’s curly ’s not straight 's",
    "def f(x):\n    return x ** 2  # square\n\n\nclass A:\n\tpass\n",
    "trailing spaces   ",
    "   leading spaces",
    "x   y",
    "tabs\t\tand\r\nwindows lines\r\n",
    "\n\n\n",
    "     ",
    "a \n b \n\n  c",
    "3.14159 1234567890 2024-06-01 $1,000,000.00 0x1F 1e-5",
    "١٢٣ ٤٥٦ (Arabic-Indic digits) Ⅻ ½",
    "I 💙 tokenizers 🤗👍🏽 👨‍👩‍👧‍👦 🇩🇪",
    "你好，世界。日本語のテキスト。한국어 텍스트",
    "مرحبا بالعالم، كيف حالك؟",
    "Привет, мир! Ελληνικά. עברית",
    "e\u0301 a\u0308 n\u0303 combining marks, and precomposed é ä ñ",
    "control \x00\x01\x07\x1b[31m chars \x7f \x1c\x1d\x1e\x1f \x85 \xa0 nbsp \u2028 \u3000 ideographic space",
    "zero\u200bwidth\u200cjoiners\u200d and BOM \ufeff",
    "<|endoftext" + "|> is special only as a whole; <|endof text|> is not",
    "a" * 300 + " " + "ab" * 200,
    " " * 100 + "x",
]


# --------------------------------------------------------------------------- equality with tiktoken


@pytest.mark.parametrize("text", CORPUS)
def test_same_ids_as_tiktoken(tok, openai_encoding, text):
    expected = openai_encoding.encode(text, disallowed_special=())
    assert tok.encode(text, disallowed_special=()) == expected
    assert get_encoding().encode(text, disallowed_special=()) == expected
    assert tok.decode(expected) == text


def test_get_encoding_matches_tiktokens_own_loader(openai_encoding):
    enc = get_encoding()
    assert enc.n_vocab == 50257
    assert enc.eot_token == ENDOFTEXT_ID
    assert enc._mergeable_ranks == openai_encoding._mergeable_ranks
    assert enc.encode("Hello world") == [15496, 995]


def test_split_pattern_agrees_with_tiktokens_gpt2_pattern():
    # Different spelling (tiktoken's uses possessive quantifiers), same pieces.
    text = "".join(CORPUS) + "".join(chr(c) for c in range(0, 0x3000, 7))
    ours = regex.findall(GPT2_SPLIT_PATTERN, text)
    assert ours == regex.findall(r50k_pat_str, text)
    assert "".join(ours) == text


def test_every_kind_of_character_matches_tiktoken(tok, openai_encoding):
    # A stride through all of Unicode (skipping surrogates) in contexts that exercise the split
    # pattern: between letters, doubled, after spaces and newlines. (A full sweep of every code
    # point was run while writing the chapter: 0 differences.)
    mismatches = []
    for cp in list(range(0, 0x250)) + list(range(0x250, 0x110000, 331)):
        if 0xD800 <= cp < 0xE000:
            continue
        c = chr(cp)
        text = f"a{c}b {c}{c} x{c} {c}\n{c}  {c}"
        if tok.encode(text, disallowed_special=()) != openai_encoding.encode(text, disallowed_special=()):
            mismatches.append(hex(cp))
    assert mismatches == []


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.text(alphabet=st.characters(exclude_categories=["Cs"]), max_size=60))
def test_property_same_ids_as_tiktoken_and_round_trip(text):
    tok = _shared_tokenizer()
    ids = tok.encode(text, disallowed_special=())
    assert ids == get_encoding().encode(text, disallowed_special=())
    assert tok.decode(ids) == text


@settings(max_examples=150, deadline=None)
@given(st.lists(st.sampled_from(list("ab 'sl\n\t") + ["DON'T", "é", "世", "🤗", "42", "  "]), max_size=40).map("".join))
def test_property_tricky_alphabet(text):
    tok = _shared_tokenizer()
    ids = tok.encode(text, disallowed_special=())
    assert ids == get_encoding().encode(text, disallowed_special=())
    assert tok.decode(ids) == text


_SHARED: list[BPETokenizer] = []


def _shared_tokenizer() -> BPETokenizer:
    if not _SHARED:
        _SHARED.append(BPETokenizer.gpt2())
    return _SHARED[0]


def test_lone_surrogates_are_encoded_like_tiktoken(tok):
    text = "a\ud800b \udfff"
    assert tok.encode(text) == get_encoding().encode(text)
    assert tok.decode(tok.encode(text)) == "a\ufffdb \ufffd"


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


def test_loaded_vocab_matches_encoder_json():
    vocab, merges = load_gpt2_vocab()
    encoder = json.loads((DATA / "encoder.json").read_text(encoding="utf-8"))
    assert len(vocab) == 50256 and len(merges) == 50000
    char_of = bytes_to_unicode()
    for token, token_id in list(vocab.items())[::997]:
        assert encoder["".join(char_of[b] for b in token)] == token_id
    assert merges[0] == (b" ", b"t")


def test_split_examples():
    split = regex.compile(GPT2_SPLIT_PATTERN).findall
    assert split("x   y") == ["x", "  ", " y"]
    assert split("a\nb") == ["a", "\n", "b"]
    assert split("I DON'T know, I don't.") == ["I", " DON", "'", "T", " know", ",", " I", " don", "'t", "."]
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


# --------------------------------------------------------------------------- special tokens


def test_endoftext_needs_permission(tok):
    text = "one<|endoftext|>two"
    with pytest.raises(ValueError, match=r"special token '<\|endoftext\|>'.*allowed_special"):
        tok.encode(text)
    expected = get_encoding().encode(text, allowed_special="all")
    assert tok.encode(text, allowed_special="all") == expected
    assert tok.encode(text, allowed_special={ENDOFTEXT}) == expected
    assert ENDOFTEXT_ID in expected and tok.eot_token == ENDOFTEXT_ID
    plain = tok.encode(text, disallowed_special=())
    assert ENDOFTEXT_ID not in plain
    assert plain == get_encoding().encode(text, disallowed_special=())
    assert tok.decode(expected) == text


def test_bad_allowed_special(tok):
    with pytest.raises(ValueError, match="not a special token here"):
        tok.encode("x", allowed_special={"<|startoftext|>"})
    with pytest.raises(ValueError, match='must be "all" or a set'):
        tok.encode("x", allowed_special="<|endoftext|>")
    with pytest.raises(TypeError, match="must be \"all\" or a set of strings"):
        tok.encode("x", allowed_special=5)


def test_encode_rejects_non_text(tok):
    with pytest.raises(TypeError, match="encode takes a str, got bytes"):
        tok.encode(b"bytes")
    with pytest.raises(TypeError, match="encode takes a str, got NoneType"):
        tok.encode_ordinary(None)


# --------------------------------------------------------------------------- decode errors


def test_decode_out_of_range_ids(tok):
    with pytest.raises(ValueError, match=r"token id 50257 at position 1 .*valid ids are 0 to 50256"):
        tok.decode([15496, 50257])
    with pytest.raises(ValueError, match=r"token id -1 at position 0 .*valid ids are 0 to 50256"):
        tok.decode([-1])


@pytest.mark.parametrize("bad", [1.5, "3", None, True])
def test_decode_non_int_ids(tok, bad):
    with pytest.raises(TypeError, match=r"token ids must be ints.*at position 1"):
        tok.decode([15496, bad])


def test_decode_rejects_non_sequences(tok):
    with pytest.raises(TypeError, match="decode takes a sequence of token ids"):
        tok.decode("15496")
    with pytest.raises(TypeError, match="decode takes a sequence of token ids"):
        tok.decode(15496)


def test_decode_accepts_numpy_integers(tok):
    np = pytest.importorskip("numpy")
    assert tok.decode(np.array([15496, 995])) == "Hello world"


def test_decode_cut_inside_a_character_gives_replacement(tok):
    ids = tok.encode("a🤗")
    assert len(ids) >= 3  # the emoji is spread over several tokens
    assert tok.decode(ids[:-1]) == "a" + "\ufffd"
    assert "\ufffd" not in tok.decode(ids)
    assert tok.decode([tok.vocab[b"\xc3"]]) == "\ufffd"


def test_missing_data_files_give_a_clear_error(tmp_path):
    (tmp_path / "encoder.json").write_text("{}")
    with pytest.raises(FileNotFoundError, match=r"missing from .*: vocab.bpe.*pip install -e"):
        BPETokenizer.gpt2(tmp_path)


def test_inconsistent_vocabulary_is_refused():
    vocab = {bytes([b]): b for b in range(255)}
    with pytest.raises(ValueError, match="lacks 1 of the 256 single bytes"):
        BPETokenizer(vocab, [])
    vocab = {bytes([b]): b for b in range(256)}
    with pytest.raises(ValueError, match="not in the vocabulary"):
        BPETokenizer(vocab, [(b"a", b"b")])


# --------------------------------------------------------------------------- training

TRAINING_TEXT = (DATA / "bpe_training_text.txt").read_text(encoding="utf-8")


def test_train_reaches_vocab_size_and_round_trips():
    small = BPETokenizer.train(TRAINING_TEXT, vocab_size=300)
    assert small.n_vocab == 300 and len(small.merges) == 44
    for text in [TRAINING_TEXT, "Unseen words: 世界 🤗 zzz!", ""]:
        assert small.decode(small.encode(text)) == text
    assert len(small.encode(TRAINING_TEXT)) < len(TRAINING_TEXT.encode("utf-8")) * 0.7


def test_first_merge_is_the_most_frequent_pair_by_brute_force():
    vocab, merges = train_bpe(TRAINING_TEXT, 257)
    counts = Counter()
    for piece in regex.findall(GPT2_SPLIT_PATTERN, TRAINING_TEXT):
        data = piece.encode("utf-8")
        for i in range(len(data) - 1):
            counts[(data[i : i + 1], data[i + 1 : i + 2])] += 1
    assert counts[merges[0]] == max(counts.values())
    assert vocab[merges[0][0] + merges[0][1]] == 256


def test_training_on_a_tiny_text():
    # pieces: 'ab' once, ' ab' twice: (a, b) occurs 3 times, ( , a) twice
    vocab, merges = train_bpe("ab ab ab", 258)
    assert merges == [(b"a", b"b"), (b" ", b"ab")]
    assert vocab[b"ab"] == 256 and vocab[b" ab"] == 257


def test_train_is_deterministic():
    assert train_bpe(TRAINING_TEXT, 280) == train_bpe(TRAINING_TEXT, 280)


def test_train_with_special_tokens():
    small = BPETokenizer.train(TRAINING_TEXT + ENDOFTEXT + TRAINING_TEXT, 270, special_tokens=[ENDOFTEXT])
    assert small.n_vocab == 270 and small.special_tokens == {ENDOFTEXT: 269}
    assert small.encode("a" + ENDOFTEXT, allowed_special="all")[-1] == 269
    assert all(b"<|" not in token for token in small.vocab)


@pytest.mark.parametrize("size", [0, 100, 255])
def test_train_rejects_small_vocab(size):
    with pytest.raises(ValueError, match=rf"vocab_size must be at least 256.*got {size}"):
        BPETokenizer.train("some text", size)


def test_train_rejects_bad_types():
    with pytest.raises(TypeError, match="vocab_size must be an int, got float"):
        BPETokenizer.train("some text", 300.0)
    with pytest.raises(TypeError, match="training text as a str, got bytes"):
        BPETokenizer.train(b"some text", 300)
    with pytest.raises(ValueError, match=r"at least 256 \+ 1"):
        BPETokenizer.train("some text", 256, special_tokens=[ENDOFTEXT])


def test_train_warns_when_the_text_runs_out():
    with pytest.warns(UserWarning, match="stopped at .* short of vocab_size=1000"):
        small = BPETokenizer.train("aaa bbb", 1000)
    assert small.decode(small.encode("aaa bbb")) == "aaa bbb"


def test_merge_pair_and_most_frequent_pair():
    words = {(b"a", b"b", b"a", b"b"): 2, (b"b", b"a"): 1}
    assert most_frequent_pair(words) == (b"a", b"b")
    assert merge_pair(words, (b"a", b"b")) == {(b"ab", b"ab"): 2, (b"b", b"a"): 1}
    assert most_frequent_pair({(b"x",): 4}) is None


# --------------------------------------------------------------------------- checks: references pass


def _passes(check, fn, capsys):
    check(fn)
    assert capsys.readouterr().out.startswith("✅")


def test_reference_answers_pass_the_checks(capsys):
    _passes(checks.check_split_pattern, lambda: GPT2_SPLIT_PATTERN, capsys)
    _passes(checks.check_split_pattern, lambda: r50k_pat_str, capsys)  # another correct spelling
    _passes(checks.check_bpe_merge, bpe_merge, capsys)
    _passes(checks.check_most_frequent_pair, most_frequent_pair, capsys)

    def decode_ids(ids, token_texts):
        byte_of = {c: b for b, c in bytes_to_unicode().items()}
        return bytes(byte_of[c] for i in ids for c in token_texts[i]).decode("utf-8", errors="replace")

    _passes(checks.check_decode_ids, decode_ids, capsys)


def test_other_correct_answers_pass(capsys):
    # bpe_merge that merges one occurrence at a time, rescanning after each
    def merge_one_at_a_time(symbols, ranks):
        symbols = list(symbols)
        while True:
            candidates = [(ranks[p], i) for i, p in enumerate(zip(symbols, symbols[1:])) if p in ranks]
            if not candidates:
                return symbols
            _, i = min(candidates)
            symbols[i : i + 2] = [symbols[i] + symbols[i + 1]]

    # the pair count built with Counter.most_common
    def pair_by_most_common(word_counts):
        counts = Counter()
        for word, n in word_counts.items():
            counts.update({p: 0 for p in zip(word, word[1:])})
            for p in zip(word, word[1:]):
                counts[p] += n
        return counts.most_common(1)[0][0] if counts else None

    _passes(checks.check_bpe_merge, merge_one_at_a_time, capsys)
    _passes(checks.check_most_frequent_pair, pair_by_most_common, capsys)
    _passes(checks.check_split_pattern, lambda: GPT2_SPLIT_PATTERN.replace(r"\s+(?!\S)|\s+", r"\s+(?!\S)|\s"), capsys)


# --------------------------------------------------------------------------- checks: planted mistakes


def _fails(check, fn, phrase):
    with pytest.raises(CheckFailed, match=phrase):
        check(fn)


FOUR = r"'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+"


@pytest.mark.parametrize(
    "pattern, phrase",
    [
        (FOUR, "characters are lost.*add alternatives that match whitespace"),
        (FOUR + r"|\s+(?!\S)", r"characters are lost.*add \\s\+ as the last alternative"),
        (FOUR + r"|\s+", r"whole run of spaces is one piece.*\\s\+\(\?!\\S\)"),
        (FOUR + r"|\s+|\s+(?!\S)", r"whole run of spaces is one piece"),
        (FOUR + r"|\s", r"cut into single characters"),
        (r"\s+(?!\S)|\s+|" + FOUR, r"the space before a word became a piece of its own"),
        (FOUR + r"|\s*", "matches empty strings"),
        (FOUR + r"|(\s+)", "capturing group"),
        (FOUR + r"|(\s+", "not a valid regular expression"),
        (FOUR.replace(r" ?\p{N}+", r"\p{N}+") + r"|\s+(?!\S)|\s+", r"for \"I'll say it's 42, isn't it\?\" GPT-2's pattern gives"),
        (r"\S+|\s+", r"the space before a word became a piece of its own"),
    ],
)
def test_split_check_names_mistakes(pattern, phrase):
    _fails(checks.check_split_pattern, lambda: pattern, phrase)


def test_split_check_non_answers():
    def stub():
        raise NotImplementedError("Exercise 1.1")

    _fails(checks.check_split_pattern, stub, "not done yet")
    _fails(checks.check_split_pattern, lambda text: text, "cannot take that")
    _fails(checks.check_split_pattern, lambda: ["\\s+"], "as one str, got list")


def _merge_all(symbols, pair):
    out, i = [], 0
    while i < len(symbols):
        if i + 1 < len(symbols) and (symbols[i], symbols[i + 1]) == pair:
            out.append(symbols[i] + symbols[i + 1])
            i += 2
        else:
            out.append(symbols[i])
            i += 1
    return out


def merge_leftmost(symbols, ranks):
    while True:
        pairs = [p for p in zip(symbols, symbols[1:]) if p in ranks]
        if not pairs:
            return symbols
        symbols = _merge_all(symbols, pairs[0])


def merge_highest(symbols, ranks):
    while True:
        pairs = [p for p in zip(symbols, symbols[1:]) if p in ranks]
        if not pairs:
            return symbols
        symbols = _merge_all(symbols, max(pairs, key=lambda p: ranks[p]))


def merge_once(symbols, ranks):
    pairs = [p for p in zip(symbols, symbols[1:]) if p in ranks]
    return _merge_all(symbols, min(pairs, key=lambda p: ranks[p])) if pairs else symbols


def merge_single_scan(symbols, ranks):
    out, i = [], 0
    while i < len(symbols):
        pair = tuple(symbols[i : i + 2])
        if len(pair) == 2 and pair in ranks:
            out.append(b"".join(pair))
            i += 2
        else:
            out.append(symbols[i])
            i += 1
    return out


def merge_overlapping(symbols, ranks):
    # forgets to skip the second half after a merge
    while True:
        pairs = [p for p in zip(symbols, symbols[1:]) if p in ranks]
        if not pairs:
            return symbols
        best = min(pairs, key=lambda p: ranks[p])
        out = []
        for i, s in enumerate(symbols):
            if i + 1 < len(symbols) and (s, symbols[i + 1]) == best:
                out.append(s + symbols[i + 1])
            else:
                out.append(s)
        symbols = out


def merge_with_len_sentinel(symbols, ranks):
    # treats len(ranks) as "no rank", which breaks on rank tables that do not start at 0
    symbols = list(symbols)
    while len(symbols) > 1:
        best = min(zip(symbols, symbols[1:]), key=lambda p: ranks.get(p, len(ranks)))
        if best not in ranks:
            return symbols
        symbols = _merge_all(symbols, best)
    return symbols


@pytest.mark.parametrize(
    "fn, phrase",
    [
        (lambda symbols, ranks: list(symbols), "without merging anything"),
        (merge_once, "stop after the first merge"),
        (merge_highest, "HIGHEST rank first"),
        (merge_leftmost, "leftmost pair that has a rank"),
        (merge_single_scan, "one pass over the word"),
        (merge_overlapping, "spells different bytes.*skip both"),
        (merge_with_len_sentinel, r"for \[b'p', b'q', b'r', b's'\] the merges by rank give"),
        (lambda symbols, ranks: b"".join(symbols), "should return a list of bytes"),
    ],
)
def test_merge_check_names_mistakes(fn, phrase):
    _fails(checks.check_bpe_merge, fn, phrase)


def test_merge_check_non_answers():
    def stub(symbols, ranks):
        raise NotImplementedError("Exercise 1.2")

    _fails(checks.check_bpe_merge, stub, "not done yet")
    _fails(checks.check_bpe_merge, lambda symbols: symbols, "cannot take that")


def _byte_of():
    return {c: b for b, c in bytes_to_unicode().items()}


def decode_no_byte_map(ids, token_texts):
    return "".join(token_texts[i] for i in ids)


def decode_per_token(ids, token_texts):
    byte_of = _byte_of()
    return "".join(bytes(byte_of[c] for c in token_texts[i]).decode("utf-8", errors="replace") for i in ids)


def decode_strict(ids, token_texts):
    byte_of = _byte_of()
    return bytes(byte_of[c] for i in ids for c in token_texts[i]).decode("utf-8")


def decode_ignore(ids, token_texts):
    byte_of = _byte_of()
    return bytes(byte_of[c] for i in ids for c in token_texts[i]).decode("utf-8", errors="ignore")


def decode_latin1(ids, token_texts):
    byte_of = _byte_of()
    return bytes(byte_of[c] for i in ids for c in token_texts[i]).decode("latin-1")


def decode_to_bytes(ids, token_texts):
    byte_of = _byte_of()
    return bytes(byte_of[c] for i in ids for c in token_texts[i])


def decode_drops_spaces(ids, token_texts):
    return decode_no_byte_map(ids, token_texts).replace("Ġ", "")


@pytest.mark.parametrize(
    "fn, phrase",
    [
        (decode_no_byte_map, "printable stand-ins"),
        (decode_per_token, "decode each token on its own"),
        (decode_strict, "raised UnicodeDecodeError.*errors='replace'"),
        (decode_ignore, r"errors='replace', not 'ignore'"),
        (decode_latin1, "not latin-1"),
        (decode_to_bytes, "you return bytes"),
        (decode_drops_spaces, "the text is"),
    ],
)
def test_decode_check_names_mistakes(fn, phrase):
    _fails(checks.check_decode_ids, fn, phrase)


def test_decode_check_non_answers():
    def stub(ids, token_texts):
        raise NotImplementedError("Exercise 1.3")

    _fails(checks.check_decode_ids, stub, "not done yet")
    _fails(checks.check_decode_ids, lambda ids: "", "cannot take that")


def pair_unweighted(word_counts):
    counts = Counter()
    for word in word_counts:
        counts.update(zip(word, word[1:]))
    return max(counts, key=counts.get) if counts else None


def pair_once_per_word(word_counts):
    counts = Counter()
    for word, n in word_counts.items():
        for pair in set(zip(word, word[1:])):
            counts[pair] += n
    return max(counts, key=counts.get) if counts else None


def pair_least(word_counts):
    counts = Counter()
    for word, n in word_counts.items():
        for pair in zip(word, word[1:]):
            counts[pair] += n
    return min(counts, key=counts.get) if counts else None


def pair_no_none(word_counts):
    counts = Counter()
    for word, n in word_counts.items():
        for pair in zip(word, word[1:]):
            counts[pair] += n
    return max(counts, key=counts.get)  # ValueError on an empty Counter


def pair_with_count(word_counts):
    counts = Counter()
    for word, n in word_counts.items():
        for pair in zip(word, word[1:]):
            counts[pair] += n
    return counts.most_common(1)[0] if counts else None


def pair_empty_tuple(word_counts):
    result = most_frequent_pair(word_counts)
    return () if result is None else result


@pytest.mark.parametrize(
    "fn, phrase",
    [
        (pair_unweighted, "you count each word once.*multiply"),
        (pair_once_per_word, "counts twice"),
        (pair_least, "LEAST frequent"),
        (pair_no_none, "return None; your function raised ValueError"),
        (pair_with_count, "tuple of two bytes objects"),
        (pair_empty_tuple, r"return None, not \(\)"),
        (lambda word_counts: (b"q", b"q"), "not a pair of neighbouring symbols"),
    ],
)
def test_pair_check_names_mistakes(fn, phrase):
    _fails(checks.check_most_frequent_pair, fn, phrase)


def test_pair_check_non_answers():
    def stub(word_counts):
        raise NotImplementedError("Exercise 1.4")

    _fails(checks.check_most_frequent_pair, stub, "not done yet")
    _fails(checks.check_most_frequent_pair, lambda: None, "cannot take that")


# ----------------------------------------------------------------- more learner mistakes, check 1.2


def _merge_lowest(symbols, ranks, pick_rightmost=False, zero_is_missing=False):
    """bpe_merge written the way learners do, with one switchable mistake."""
    symbols = list(symbols)
    while True:
        best = None
        for i, pair in enumerate(zip(symbols, symbols[1:])):
            rank = ranks.get(pair)
            if (not rank) if zero_is_missing else (rank is None):
                continue
            if best is None or rank < best[0] or (pick_rightmost and rank == best[0]):
                best = (rank, i)
        if best is None:
            return symbols
        i = best[1]
        symbols[i : i + 2] = [symbols[i] + symbols[i + 1]]


def _merge_leftmost_one_at_a_time(symbols, ranks):
    symbols = list(symbols)
    while True:
        hits = [i for i, pair in enumerate(zip(symbols, symbols[1:])) if pair in ranks]
        if not hits:
            return symbols
        symbols[hits[0] : hits[0] + 2] = [symbols[hits[0]] + symbols[hits[0] + 1]]


def _merge_in_place(symbols, ranks):
    while True:  # works on the caller's list
        ranked = [(ranks[p], i) for i, p in enumerate(zip(symbols, symbols[1:])) if p in ranks]
        if not ranked:
            return symbols
        _, i = min(ranked)
        symbols[i : i + 2] = [symbols[i] + symbols[i + 1]]


def test_merge_check_accepts_a_learner_style_answer(capsys):
    from gpt2lib.checks.tokenizer import check_bpe_merge

    check_bpe_merge(_merge_lowest)
    assert "✅ Exercise 1.2" in capsys.readouterr().out


@pytest.mark.parametrize(
    "fn, phrase",
    [
        (lambda s, r: _merge_lowest(s, r, pick_rightmost=True), "you merge the rightmost occurrence first"),
        (lambda s, r: _merge_lowest(s, r, zero_is_missing=True), "the pair with rank 0 is never merged"),
        (_merge_leftmost_one_at_a_time, "you merge the leftmost pair that has a rank"),
        (_merge_in_place, "changed the caller's list"),
    ],
)
def test_merge_check_names_more_learner_mistakes(fn, phrase):
    from gpt2lib.checks.tokenizer import check_bpe_merge

    with pytest.raises(CheckFailed, match=phrase):
        check_bpe_merge(fn)
