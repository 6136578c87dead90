"""Chapter 1's checks (gpt2lib.course.checks.tokenizer): right answers in any style pass, every planted mistake is named."""

from __future__ import annotations

import json
from collections import Counter
from itertools import islice

import pytest
import regex
import tiktoken
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from tiktoken.load import data_gym_to_mergeable_bpe_ranks
from tiktoken_ext.openai_public import r50k_pat_str

from gpt2lib.course.checks import CheckFailed
from gpt2lib.course.checks import tokenizer as checks
from gpt2lib.tokenizer import (
    ENDOFTEXT,
    ENDOFTEXT_ID,
    GPT2_SPLIT_PATTERN,
    BPETokenizer,
    bpe_merge,
    bpe_merge_fast,
    bytes_to_unicode,
    get_encoding,
    gpt2_data_dir,
    load_gpt2_vocab,
    merge_pair,
    most_frequent_pair,
    train_bpe,
    train_merges_simple,
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
        name="gpt2-reference",
        pat_str=r50k_pat_str,
        mergeable_ranks=ranks,
        special_tokens={ENDOFTEXT: ENDOFTEXT_ID},
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
        if tok.encode(text, disallowed_special=()) != openai_encoding.encode(
            text, disallowed_special=()
        ):
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
@given(
    st.lists(
        st.sampled_from(list("ab 'sl\n\t") + ["DON'T", "é", "世", "🤗", "42", "  "]), max_size=40
    ).map("".join)
)
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


def test_loaded_vocab_matches_encoder_json():
    vocab, merges = load_gpt2_vocab()
    encoder = json.loads((DATA / "encoder.json").read_text(encoding="utf-8"))
    assert len(vocab) == 50256 and len(merges) == 50000
    char_of = bytes_to_unicode()
    for token, token_id in list(vocab.items())[::997]:
        assert encoder["".join(char_of[b] for b in token)] == token_id
    assert merges[0] == (b" ", b"t")


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
    with pytest.raises(TypeError, match='must be "all" or a set of strings'):
        tok.encode("x", allowed_special=5)


def test_encode_rejects_non_text(tok):
    with pytest.raises(TypeError, match="encode takes a str, got bytes"):
        tok.encode(b"bytes")
    with pytest.raises(TypeError, match="encode takes a str, got NoneType"):
        tok.encode_ordinary(None)


# --------------------------------------------------------------------------- decode errors


def test_decode_out_of_range_ids(tok):
    with pytest.raises(
        ValueError, match=r"token id 50257 at position 1 .*valid ids are 0 to 50256"
    ):
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


# --------------------------------------------------------------------------- fast merge


def test_fast_merge_equals_the_simple_one_on_gpt2_words(tok):
    words = [
        " lowering",
        "hello",
        " internationalization",
        "aaaaaaa",
        " 👋",
        "\n\n",
        "é" * 40,
        "ab" * 33,
        "",
    ]
    for word in words:
        symbols = [bytes([b]) for b in word.encode("utf-8")]
        assert bpe_merge_fast(symbols, tok.ranks) == bpe_merge(symbols, tok.ranks), word


# --------------------------------------------------------------------------- streaming

STREAM_TEXT = "Hi  there.\n\nIt's 42, isn't it?\n\n\n   We'll see 世界🤗 <|endoftext|> end \n\n<|endoftext|>x  "


def test_stream_cut_in_two_at_every_position(tok, openai_encoding):
    text = STREAM_TEXT
    expected = openai_encoding.encode(text, disallowed_special=())
    for cut in range(len(text) + 1):
        assert (
            list(tok.encode_iterable([text[:cut], text[cut:]], disallowed_special=())) == expected
        ), cut


def test_stream_one_character_at_a_time_with_special_tokens(tok, openai_encoding):
    text = STREAM_TEXT
    expected = openai_encoding.encode(text, allowed_special="all")
    assert list(tok.encode_iterable(iter(text), allowed_special="all")) == expected
    for cut in range(len(text) + 1):  # a special token split between two chunks
        assert (
            list(tok.encode_iterable([text[:cut], text[cut:]], allowed_special="all")) == expected
        ), cut


def test_stream_whitespace_before_a_special_token_cut_in_three(tok):
    # The start of a special token ends the ordinary text: "\n\n" stays one token before it.
    chunks = ["s ", "\n", "\n<|endoftext", "|>", " x"]
    expected = get_encoding().encode("".join(chunks), allowed_special="all")
    assert list(tok.encode_iterable(chunks, allowed_special="all")) == expected


def test_stream_keeps_blank_lines_whole(tok):
    assert list(tok.encode_iterable(["\n", "\n"])) == tok.encode("\n\n") == [628]
    lines = ["first line\n", "\n", "third line\n"]
    assert list(tok.encode_iterable(lines)) == tok.encode("".join(lines))


def test_stream_reads_an_open_file(tok, tmp_path):
    path = tmp_path / "text.txt"
    text = TRAINING_TEXT * 3
    path.write_text(text, encoding="utf-8")
    with path.open(encoding="utf-8") as lines:
        assert list(tok.encode_iterable(lines)) == get_encoding().encode(text)


def test_stream_yields_while_reading_an_endless_input(tok):
    # Bounded memory: ids come out after a few lines, not after the input ends (it never does).
    pulled = []

    def endless():
        while True:
            pulled.append(1)
            yield f"line {len(pulled)} of an endless stream.\n"

    first = list(islice(tok.encode_iterable(endless()), 1000))
    lines = "".join(f"line {i} of an endless stream.\n" for i in range(1, len(pulled) + 1))
    assert first == get_encoding().encode(lines)[:1000]
    per_line = len(get_encoding().encode("line 100 of an endless stream.\n"))
    assert len(pulled) <= 1000 // per_line + 3  # at most a couple of lines held back


@settings(max_examples=150, deadline=None)
@given(
    st.lists(
        st.lists(
            st.sampled_from(list("ab 'sl\n\t.") + ["é", "世", "<|endoftext|>", "<|end", "42"]),
            max_size=12,
        ).map("".join),
        max_size=8,
    )
)
def test_property_stream_equals_encoding_the_joined_text(chunks):
    tok = _shared_tokenizer()
    text = "".join(chunks)
    assert list(tok.encode_iterable(chunks, allowed_special="all")) == get_encoding().encode(
        text, allowed_special="all"
    )


def test_stream_refuses_bad_items_naming_the_position(tok):
    with pytest.raises(TypeError, match=r"item 2 is bytes"):
        list(tok.encode_iterable(["a", "b", b"c"]))
    with pytest.raises(TypeError, match=r"item 0 is int"):
        list(tok.encode_iterable([7]))
    with pytest.raises(TypeError, match=r"iterable of str.*use encode\(\)"):
        tok.encode_iterable("one string")


def test_stream_refuses_a_disallowed_special_token_across_chunks(tok):
    with pytest.raises(ValueError, match=r"special token '<\|endoftext\|>'"):
        list(tok.encode_iterable(["one <|endof", "text|> two"]))


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


def test_incremental_training_equals_the_simple_loop():
    assert train_bpe(TRAINING_TEXT, 600) == train_merges_simple(TRAINING_TEXT, 600)


def test_train_is_deterministic():
    assert train_bpe(TRAINING_TEXT, 280) == train_bpe(TRAINING_TEXT, 280)


def test_train_with_special_tokens():
    small = BPETokenizer.train(
        TRAINING_TEXT + ENDOFTEXT + TRAINING_TEXT, 270, special_tokens=[ENDOFTEXT, "<|pad|>"]
    )
    assert small.n_vocab == 270 and small.special_tokens == {ENDOFTEXT: 268, "<|pad|>": 269}
    assert small.encode("a" + ENDOFTEXT, allowed_special="all")[-1] == 268
    assert all(b"<|" not in token for token in small.vocab)


# --------------------------------------------------------------------------- formats


def test_saved_gpt2_tokenizer_is_byte_identical_to_data(tok, tmp_path):
    tok.save(tmp_path)
    for name in ["encoder.json", "vocab.bpe"]:
        assert (tmp_path / name).read_bytes() == (DATA / name).read_bytes(), name


def test_load_gives_gpt2_back(tmp_path):
    loaded = BPETokenizer.load(DATA)
    assert loaded.special_tokens == {ENDOFTEXT: ENDOFTEXT_ID} and loaded.n_vocab == 50257
    text = "Loaded from GPT-2's own files <|endoftext|> ok"
    assert loaded.encode(text, allowed_special="all") == get_encoding().encode(
        text, allowed_special="all"
    )


def test_trained_tokenizer_round_trips_through_files(tmp_path):
    small = BPETokenizer.train(TRAINING_TEXT, 320, special_tokens=[ENDOFTEXT, "<|pad|>"])
    small.save(tmp_path / "tok")
    again = BPETokenizer.load(tmp_path / "tok")
    assert again.vocab == small.vocab and again.merges == small.merges
    assert again.special_tokens == small.special_tokens
    text = TRAINING_TEXT[:500] + ENDOFTEXT + " 世界"
    assert again.encode(text, allowed_special="all") == small.encode(text, allowed_special="all")


def test_save_never_overwrites_without_asking(tok, tmp_path):
    (tmp_path / "vocab.bpe").write_text("mine", encoding="utf-8")
    with pytest.raises(FileExistsError, match="overwrite=True"):
        tok.save(tmp_path)
    assert (tmp_path / "vocab.bpe").read_text(encoding="utf-8") == "mine"
    tok.save(tmp_path, overwrite=True)
    assert (tmp_path / "vocab.bpe").read_bytes() == (DATA / "vocab.bpe").read_bytes()


def test_from_vocab_and_merges():
    small = BPETokenizer.train(TRAINING_TEXT, 300)
    id_to_bytes = {token_id: token for token, token_id in small.vocab.items()}
    rebuilt = BPETokenizer.from_vocab_and_merges(
        id_to_bytes, small.merges, special_tokens=[ENDOFTEXT]
    )
    assert rebuilt.encode(TRAINING_TEXT) == small.encode(TRAINING_TEXT)
    assert rebuilt.special_tokens == {ENDOFTEXT: 300}
    # a special token already in the vocabulary keeps its id, as in CS336's format
    with_special = {**id_to_bytes, 300: ENDOFTEXT.encode()}
    again = BPETokenizer.from_vocab_and_merges(
        with_special, small.merges, special_tokens=[ENDOFTEXT]
    )
    assert again.special_tokens == {ENDOFTEXT: 300} and again.n_vocab == 301


def test_token_bytes_has_one_name(tok):
    # tiktoken's name, kept alone: code written for tiktoken works with either tokenizer.
    assert (
        tok.decode_single_token_bytes(995)
        == get_encoding().decode_single_token_bytes(995)
        == b" world"
    )
    assert not hasattr(tok, "token_bytes")


# --------------------------------------------------------------------------- checks: references pass


def _passes(check, fn, capsys):
    check(fn)
    assert capsys.readouterr().out.startswith("✅")


def _train_merges_with(choose_pair):
    """train_merges that learns, each round, the pair choose_pair(word_counts) picks."""

    def train_merges(word_counts, num_merges):
        merges = []
        for _ in range(num_merges):
            pair = choose_pair(word_counts)
            if pair is None:
                break
            merges.append(pair)
            word_counts = merge_pair(word_counts, pair)
        return merges

    return train_merges


_reference_train_merges = _train_merges_with(most_frequent_pair)


def test_reference_answers_pass_the_checks(capsys):
    _passes(checks.check_split_pattern, lambda: GPT2_SPLIT_PATTERN, capsys)
    _passes(checks.check_split_pattern, lambda: r50k_pat_str, capsys)  # another correct spelling
    _passes(checks.check_bpe_merge, bpe_merge, capsys)
    _passes(checks.check_bpe_merge, bpe_merge_fast, capsys)
    _passes(checks.check_most_frequent_pair, most_frequent_pair, capsys)
    _passes(checks.check_merge_pair, merge_pair, capsys)
    _passes(checks.check_train_merges, _reference_train_merges, capsys)

    def decode_ids(ids, token_texts):
        byte_of = {c: b for b, c in bytes_to_unicode().items()}
        return bytes(byte_of[c] for i in ids for c in token_texts[i]).decode(
            "utf-8", errors="replace"
        )

    _passes(checks.check_decode_ids, decode_ids, capsys)


def _first_seen_pair(word_counts):
    # the other common tie rule: the pair seen first wins (Counter keeps insertion order)
    counts = Counter()
    for word, n in word_counts.items():
        for pair in zip(word, word[1:]):
            counts[pair] += n
    return max(counts, key=counts.__getitem__) if counts else None


def test_either_tie_rule_passes(capsys):
    tied = {(b"a", b"b"): 2, (b"c", b"d"): 2}
    assert _first_seen_pair(tied) == (b"a", b"b") and most_frequent_pair(tied) == (b"c", b"d")
    _passes(checks.check_most_frequent_pair, _first_seen_pair, capsys)

    train_first_seen = _train_merges_with(_first_seen_pair)

    # the check's cases have ties, so the two rules really learn different merges there
    wc, n = checks._train_cases()[0]
    assert train_first_seen(dict(wc), n) != _reference_train_merges(dict(wc), n)
    _passes(checks.check_train_merges, train_first_seen, capsys)


def test_other_correct_answers_pass(capsys):
    # bpe_merge that merges one occurrence at a time, rescanning after each
    def merge_one_at_a_time(symbols, ranks):
        symbols = list(symbols)
        while True:
            candidates = [
                (ranks[p], i) for i, p in enumerate(zip(symbols, symbols[1:])) if p in ranks
            ]
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

    # merge_pair with a Counter and index arithmetic
    def merge_pair_counter(word_counts, pair):
        out = Counter()
        for word, n in word_counts.items():
            symbols, i = [], 0
            while i < len(word):
                if word[i : i + 2] == pair:
                    symbols.append(pair[0] + pair[1])
                    i += 2
                else:
                    symbols.append(word[i])
                    i += 1
            out[tuple(symbols)] += n
        return dict(out)

    _passes(checks.check_bpe_merge, merge_one_at_a_time, capsys)
    _passes(checks.check_most_frequent_pair, pair_by_most_common, capsys)
    _passes(checks.check_merge_pair, merge_pair_counter, capsys)
    _passes(
        checks.check_split_pattern,
        lambda: GPT2_SPLIT_PATTERN.replace(r"\s+(?!\S)|\s+", r"\s+(?!\S)|\s"),
        capsys,
    )


# --------------------------------------------------------------------------- checks: planted mistakes


def _fails(check, fn, phrase):
    with pytest.raises(CheckFailed, match=phrase):
        check(fn)


def _message_of(check, fn):
    """The message of the CheckFailed that check(fn) raises."""
    with pytest.raises(CheckFailed) as failure:
        check(fn)
    return str(failure.value)


FOUR = r"'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+"


@pytest.mark.parametrize(
    "mistake", checks.SPLIT_MISTAKES, ids=[m.name for m in checks.SPLIT_MISTAKES]
)
def test_split_check_names_each_planted_mistake(mistake):
    assert mistake.fn().startswith(FOUR) or mistake.fn().endswith(
        FOUR
    )  # the four given alternatives
    assert _message_of(checks.check_split_pattern, mistake.fn).startswith(
        f"{checks.EX_SPLIT}: {mistake.message}"
    )


@pytest.mark.parametrize(
    "pattern, phrase",
    [
        (
            FOUR + r"|\s+|\s+(?!\S)",
            r"whole run of spaces is one piece",
        ),  # the lookahead never gets a turn
        (r"\S+|\s+", r"the space before a word became a piece of its own"),
        (FOUR + r"|\s*", "matches empty strings"),
        (FOUR + r"|(\s+)", "capturing group"),
        (FOUR + r"|(\s+", "not a valid regular expression"),
        (
            FOUR.replace(r" ?\p{N}+", r"\p{N}+") + r"|\s+(?!\S)|\s+",
            r"for \"I'll say it's 42, isn't it\?\" GPT-2's pattern gives",
        ),
    ],
)
def test_split_check_other_ways_to_go_wrong(pattern, phrase):
    _fails(checks.check_split_pattern, lambda: pattern, phrase)


def test_split_check_non_answers():
    def stub():
        raise NotImplementedError("Exercise 1.1")

    _fails(checks.check_split_pattern, stub, "not done yet")
    _fails(checks.check_split_pattern, lambda text: text, "cannot take that")
    _fails(checks.check_split_pattern, lambda: ["\\s+"], "as one str, got list")


def _named(mistakes):
    return pytest.mark.parametrize("mistake", mistakes, ids=[m.name for m in mistakes])


@_named(checks.MERGE_MISTAKES)
def test_merge_check_names_each_planted_mistake(mistake):
    assert (
        _message_of(checks.check_bpe_merge, mistake.fn) == f"{checks.EX_MERGE}: {mistake.message}"
    )


def test_merge_check_form_mistakes():
    def merge_overlapping(symbols, ranks):  # forgets to skip the second half after a merge
        out = []
        for i, s in enumerate(symbols):
            out.append(
                s + symbols[i + 1] if i + 1 < len(symbols) and (s, symbols[i + 1]) in ranks else s
            )
        return out

    def merge_in_place(symbols, ranks):  # works on the caller's list
        symbols[:] = bpe_merge(symbols, ranks)
        return symbols

    def merge_with_len_sentinel(
        symbols, ranks
    ):  # len(ranks) as "no rank": wrong for tables not from 0
        symbols = list(symbols)
        while len(symbols) > 1:
            best = min(zip(symbols, symbols[1:]), key=lambda p: ranks.get(p, len(ranks)))
            if best not in ranks:
                return symbols
            symbols = bpe_merge(symbols, {best: 0})
        return symbols

    _fails(checks.check_bpe_merge, merge_overlapping, "spells different bytes.*skip both")
    _fails(checks.check_bpe_merge, merge_in_place, "changed the caller's list")
    _fails(
        checks.check_bpe_merge,
        merge_with_len_sentinel,
        r"for \[b'p', b'q', b'r', b's'\] the merges by rank give",
    )
    _fails(
        checks.check_bpe_merge,
        lambda symbols, ranks: b"".join(symbols),
        "should return a list of bytes",
    )


def test_merge_check_non_answers():
    def stub(symbols, ranks):
        raise NotImplementedError("Exercise 1.2")

    _fails(checks.check_bpe_merge, stub, "not done yet")
    _fails(checks.check_bpe_merge, lambda symbols: symbols, "cannot take that")


@_named(checks.DECODE_MISTAKES)
def test_decode_check_names_each_planted_mistake(mistake):
    assert _message_of(checks.check_decode_ids, mistake.fn).startswith(
        f"{checks.EX_DECODE}: {mistake.message} (for "
    )


def test_decode_check_form_mistakes():
    byte_of = {c: b for b, c in bytes_to_unicode().items()}

    def decode_strict(ids, token_texts):
        return bytes(byte_of[c] for i in ids for c in token_texts[i]).decode("utf-8")

    def decode_to_bytes(ids, token_texts):
        return bytes(byte_of[c] for i in ids for c in token_texts[i])

    _fails(checks.check_decode_ids, decode_strict, "raised UnicodeDecodeError.*errors='replace'")
    _fails(checks.check_decode_ids, decode_to_bytes, "you return bytes")
    _fails(
        checks.check_decode_ids,
        lambda ids, tt: "".join(tt[i] for i in ids).replace("Ġ", ""),
        "the text is",
    )


def test_decode_check_non_answers():
    def stub(ids, token_texts):
        raise NotImplementedError("Exercise 1.3")

    _fails(checks.check_decode_ids, stub, "not done yet")
    _fails(checks.check_decode_ids, lambda ids: "", "cannot take that")


def _answer_from_scores(scores_of):
    """A learner's most_frequent_pair built from a planted mistake's wrong counting."""

    def most_frequent(word_counts):
        scores = scores_of(word_counts)
        return max(scores, key=scores.__getitem__) if scores else None

    return most_frequent


@_named(checks.PAIR_MISTAKES)
def test_pair_check_names_each_planted_mistake(mistake):
    message = _message_of(checks.check_most_frequent_pair, _answer_from_scores(mistake.fn))
    assert message.startswith(f"{checks.EX_PAIR}: {mistake.message} (words: ")


def test_pair_check_names_the_loop_that_skips_the_last_pair():
    # The loop as learners write it, off by one: range(len(word) - 2) misses the last pair.
    def skips_last(word_counts):
        counts = Counter()
        for word, n in word_counts.items():
            for i in range(len(word) - 2):
                counts[(word[i], word[i + 1])] += n
        return max(counts, key=counts.get) if counts else None

    _fails(checks.check_most_frequent_pair, skips_last, "stops one pair early")
    assert "count each word once" not in _message_of(checks.check_most_frequent_pair, skips_last)


def test_pair_check_form_mistakes():
    def with_count(word_counts):
        pair = most_frequent_pair(word_counts)
        return None if pair is None else (pair, 3)

    def no_none(word_counts):
        pair = most_frequent_pair(word_counts)
        if pair is None:
            raise ValueError("max() arg is an empty sequence")
        return pair

    def empty_tuple(word_counts):
        return most_frequent_pair(word_counts) or ()

    _fails(checks.check_most_frequent_pair, with_count, "tuple of two bytes objects")
    _fails(checks.check_most_frequent_pair, no_none, "return None; your function raised ValueError")
    _fails(checks.check_most_frequent_pair, empty_tuple, r"return None, not \(\)")
    _fails(
        checks.check_most_frequent_pair,
        lambda word_counts: (b"q", b"q"),
        "not a pair of neighbouring symbols",
    )


def test_pair_check_non_answers():
    def stub(word_counts):
        raise NotImplementedError("Exercise 1.4")

    _fails(checks.check_most_frequent_pair, stub, "not done yet")
    _fails(checks.check_most_frequent_pair, lambda: None, "cannot take that")


@_named(checks.MERGE_PAIR_MISTAKES)
def test_merge_pair_check_names_each_planted_mistake(mistake):
    message = _message_of(checks.check_merge_pair, mistake.fn)
    assert message == f"{checks.EX_MERGE_PAIR}: {mistake.message}" or (
        mistake.name == "counts overwritten" and "must add their counts" in message
    )


def test_merge_pair_check_form_mistakes():
    def no_skip(word_counts, pair):  # merges overlapping occurrences: (a, a, a) -> (aa, aa)
        out = {}
        for word, n in word_counts.items():
            new = tuple(
                word[i] + word[i + 1]
                if i + 1 < len(word) and (word[i], word[i + 1]) == pair
                else word[i]
                for i in range(len(word))
            )
            out[new] = out.get(new, 0) + n
        return out

    def in_place(word_counts, pair):
        merged = merge_pair(word_counts, pair)
        word_counts.clear()
        word_counts.update(merged)
        return word_counts

    _fails(checks.check_merge_pair, no_skip, "spells bytes that no input word spells")
    _fails(checks.check_merge_pair, in_place, "changed the caller's dict")
    _fails(
        checks.check_merge_pair,
        lambda wc, pair: list(merge_pair(wc, pair).items()),
        "should return a dict",
    )
    _fails(
        checks.check_merge_pair,
        lambda wc, pair: {b"".join(w): n for w, n in merge_pair(wc, pair).items()},
        "must stay a tuple of bytes",
    )


def test_merge_pair_check_non_answers():
    def stub(word_counts, pair):
        raise NotImplementedError("Exercise 1.5")

    _fails(checks.check_merge_pair, stub, "not done yet")
    _fails(checks.check_merge_pair, lambda word_counts: {}, "cannot take that")


@_named(checks.TRAIN_MISTAKES)
def test_train_check_names_each_planted_mistake(mistake):
    assert _message_of(checks.check_train_merges, mistake.fn).startswith(
        f"{checks.EX_TRAIN}: {mistake.message}"
    )


def test_train_check_form_mistakes():
    def merged_tokens(word_counts, num_merges):
        return [a + b for a, b in _reference_train_merges(word_counts, num_merges)]

    def least_frequent(word_counts, num_merges):
        merges = []
        for _ in range(num_merges):
            counts = Counter()
            for word, n in word_counts.items():
                for pair in zip(word, word[1:]):
                    counts[pair] += n
            if not counts:
                break
            pair = min(counts, key=counts.get)
            merges.append(pair)
            word_counts = merge_pair(word_counts, pair)
        return merges

    _fails(
        checks.check_train_merges, merged_tokens, r"each merge should be a pair \(bytes, bytes\)"
    )
    _fails(checks.check_train_merges, least_frequent, "merge 0 is .* the most frequent pair occurs")
    _fails(checks.check_train_merges, lambda wc, n: None, "should return a list of pairs")


def test_train_check_non_answers():
    def stub(word_counts, num_merges):
        raise NotImplementedError("Exercise 1.6")

    _fails(checks.check_train_merges, stub, "not done yet")
    _fails(checks.check_train_merges, lambda word_counts: [], "cannot take that")


def test_merge_check_accepts_a_learner_style_answer(capsys):
    def merge_lowest(symbols, ranks):
        symbols = list(symbols)
        while True:
            best = None
            for i, pair in enumerate(zip(symbols, symbols[1:])):
                rank = ranks.get(pair)
                if rank is not None and (best is None or rank < best[0]):
                    best = (rank, i)
            if best is None:
                return symbols
            i = best[1]
            symbols[i : i + 2] = [symbols[i] + symbols[i + 1]]

    _passes(checks.check_bpe_merge, merge_lowest, capsys)


# --------------------------------------------------------------------------- the speed benchmark runs


def test_benchmark_training_rows_run_on_a_small_text():
    import sys

    sys.path.insert(0, str(DATA.parent / "benchmarks"))
    import tokenizer_speed

    row = tokenizer_speed.measure_training(
        TRAINING_TEXT, 300, simple=True
    )  # raises if the two trainers differ
    assert row["gpt2lib_vocab"] == 300 and row["huggingface_vocab"] <= 300
    assert row["gpt2lib"]["cpu_s"] >= 0 and "simple_loop" in row


# --------------------------------------------------------------------------- the teaching module and the entry point


def test_the_chapters_plain_tokenizer_gives_tiktokens_ids(openai_encoding):
    import gpt2lib.chapters.bpe as bpe

    plain = bpe.BPETokenizer.gpt2()
    assert isinstance(
        BPETokenizer.gpt2(), bpe.BPETokenizer
    )  # the entry point wraps the chapter's class
    for text in CORPUS[:20]:
        assert plain.encode(text) == openai_encoding.encode(text)
        assert plain.decode(plain.encode(text)) == text
    text = "one<|endoftext|>two"
    assert plain.encode(text, allowed_special="all") == openai_encoding.encode(
        text, allowed_special="all"
    )
    assert plain.encode(text) == openai_encoding.encode(
        text, disallowed_special=()
    )  # ordinary text there


def test_the_plain_trainer_is_the_packages_trainer():
    import gpt2lib.chapters.bpe as bpe

    plain = bpe.BPETokenizer.train(TRAINING_TEXT, 320, special_tokens=[ENDOFTEXT])
    hardened = BPETokenizer.train(TRAINING_TEXT, 320, special_tokens=[ENDOFTEXT])
    assert (plain.vocab, plain.merges, plain.special_tokens) == (
        hardened.vocab,
        hardened.merges,
        hardened.special_tokens,
    )
    assert plain.n_vocab == hardened.n_vocab == 320


def test_the_generated_module_holds_no_hardening():
    import gpt2lib.chapters.bpe as bpe

    source = (DATA.parent / "gpt2lib" / "chapters" / "bpe.py").read_text(encoding="utf-8")
    assert source.startswith("# AUTOGENERATED")
    code = source[source.index('"""', source.index('"""') + 3) + 3 :]  # after the module docstring
    for hardening in ("raise ", "lru_cache", "heapq", "import tiktoken", "warnings", "Lock"):
        assert hardening not in code, hardening
    assert not hasattr(bpe, "get_encoding") and not hasattr(bpe, "train_bpe")


# --------------------------------------------------------------------------- checks of the newer exercises

from check_cases import assert_named, assert_not_done_yet, planted  # noqa: E402


def _reference_table():
    return dict(bytes_to_unicode())


def _fixed_merge(symbols, ranks):
    symbols = list(symbols)
    while True:
        ranked = [i for i in range(len(symbols) - 1) if (symbols[i], symbols[i + 1]) in ranks]
        if not ranked:
            return symbols
        i = min(ranked, key=lambda i: ranks[(symbols[i], symbols[i + 1])])
        symbols[i : i + 2] = [symbols[i] + symbols[i + 1]]


def _fast_train(text, vocab_size):
    return train_bpe(text, vocab_size)


RIGHT_ANSWERS = {
    checks.check_bytes_to_unicode: [_reference_table],
    checks.check_load_gpt2_vocab: [
        lambda folder: __import__("gpt2lib.chapters.bpe").chapters.bpe.load_gpt2_vocab(folder)
    ],
    checks.check_lowering_merges: [
        lambda: checks._merge_sequence(" lowering", checks._gpt2_ranks())
    ],
    checks.check_disagreeing_word: [lambda: " lowering", lambda: " the", lambda: "hello"],
    checks.check_fixed_merge: [_fixed_merge, bpe_merge],
    checks.check_tie_text: [lambda: "ab xy", lambda: "ab ba"],
    checks.check_bytes_per_token: [
        lambda tokenizer, text: len(text.encode()) / len(tokenizer.encode(text))
    ],
}


@pytest.mark.parametrize(
    "check, answer",
    [
        pytest.param(c, a, id=f"{c.__name__}-{i}")
        for c, answers in RIGHT_ANSWERS.items()
        for i, a in enumerate(answers)
    ],
)
def test_newer_checks_pass_right_answers(check, answer, capsys):
    _passes(check, answer, capsys)


@pytest.mark.parametrize(
    "check", [*RIGHT_ANSWERS, checks.check_fast_training], ids=lambda c: c.__name__
)
def test_newer_checks_say_not_done_yet_for_the_stub(check):
    assert_not_done_yet(check)


def _without_timing(monkeypatch, yours_s=0.1, reference_s=1.0):
    """The challenge check, with fixed times: tests never depend on how fast the machine is."""
    times = iter([yours_s, reference_s])
    monkeypatch.setattr(checks, "_seconds", lambda fn, *args, **kw: (next(times), fn(*args)))


@pytest.mark.parametrize("check, mistake", planted(checks.MISTAKES_BY_CHECK))
def test_newer_checks_name_each_planted_mistake(check, mistake, monkeypatch):
    if check is checks.check_fast_training:
        _without_timing(monkeypatch)
        with pytest.raises(CheckFailed) as info:
            check(mistake.fn, n_chars=3000, vocab_size=300)
        assert mistake.message in str(info.value)
        return
    assert_named(check, mistake.fn, mistake.message)


def test_bytes_check_names_form_mistakes():
    _fails(
        checks.check_bytes_to_unicode,
        lambda: list(_reference_table().values()),
        "should return a dict",
    )
    _fails(
        checks.check_bytes_to_unicode,
        lambda: {b: c for b, c in _reference_table().items() if b != 7},
        "byte 7 is missing",
    )
    _fails(
        checks.check_bytes_to_unicode,
        lambda: {**_reference_table(), 9: "ab"},
        "one-character str; byte 9",
    )
    # two mistakes at once: the message names the first symptom
    _fails(
        checks.check_bytes_to_unicode,
        lambda: {b: chr(b) if 33 <= b <= 126 else chr(256 + b) for b in range(256)},
        "Latin-1 letters",
    )
    swapped = {**_reference_table(), 65: "B", 66: "A"}
    _fails(
        checks.check_bytes_to_unicode,
        lambda: swapped,
        "first is byte 65: GPT-2 gives 'A', yours 'B'",
    )


def test_load_check_names_form_mistakes():
    from gpt2lib.chapters.bpe import load_gpt2_vocab as plain

    _fails(
        checks.check_load_gpt2_vocab,
        lambda folder: plain(folder)[0],
        r"should return two things, \(vocab, merges\)",
    )

    def reversed_merges(folder):
        vocab, merges = plain(folder)
        return vocab, merges[::-1]

    _fails(checks.check_load_gpt2_vocab, reversed_merges, "for data/ merge 0 should be")


@pytest.mark.parametrize(
    "wrong, phrase",
    [
        (lambda: [(b"i", b"n"), (b"e", b"r")], "right so far"),
        (
            lambda: checks._merge_sequence(" lowering", checks._gpt2_ranks(), leftmost=True),
            "leftmost",
        ),
        (lambda: [("i", "n")], "pairs of bytes"),
        (lambda: [(b"zq", b"jx")], "not a merge of GPT-2"),
        (lambda: [(b"i", b"n"), (b"in", b"g")], "merge 2 is not"),
    ],
)
def test_the_by_hand_check_names_its_mistakes(wrong, phrase):
    _fails(checks.check_lowering_merges, wrong, phrase)


def test_debug_check_prints_both_tokenizations(capsys):
    checks.check_disagreeing_word(lambda: " lowering")
    out = capsys.readouterr().out
    assert "[b' lo', b'we', b'ri', b'ng']" in out and "[b' lowering']" in out
    _fails(checks.check_disagreeing_word, lambda: 42, "non-empty str")


def test_colleague_merge_really_disagrees_with_gpt2_and_passes_its_own_tests():
    ranks = checks._gpt2_ranks()
    for word in [" and", " dog"]:
        symbols = [bytes([b]) for b in word.encode()]
        assert (
            checks.colleague_merge(symbols, ranks) == bpe_merge(symbols, ranks) == [word.encode()]
        )
    symbols = [bytes([b]) for b in b" lowering"]
    assert checks.colleague_merge(symbols, ranks) != bpe_merge(symbols, ranks)


def test_tie_check_counts_inside_pieces_only(capsys):
    # 'a b': the pattern gives the space to the word after it, so the only pair is (' ', b'b')
    _fails(checks.check_tie_text, lambda: "a b", "no tie")
    checks.check_tie_text(lambda: "ab xy")
    assert (
        "first seen picks (b'a', b'b'), the greater pair picks (b'x', b'y')"
        in capsys.readouterr().out
    )


def test_ratio_check_tries_two_tokenizers_and_non_ascii_text():
    cases = checks._ratio_cases()
    assert len({id(tok) for tok, _ in cases}) == 2
    assert any(len(text) != len(text.encode()) for _, text in cases)  # characters and bytes differ
    _fails(checks.check_bytes_per_token, lambda tokenizer, text: "3.5", "should return a number")
    _fails(
        checks.check_bytes_per_token, lambda tokenizer, text: 3.5, "you give 3.5000 bytes per token"
    )


def test_fast_training_check_passes_fast_enough_and_refuses_slow(monkeypatch, capsys):
    _without_timing(monkeypatch, yours_s=0.1, reference_s=1.0)
    assert checks.check_fast_training(_fast_train, n_chars=3000, vocab_size=300) == pytest.approx(
        10.0
    )
    assert "the same 44 merges, 10.0 times as fast" in capsys.readouterr().out
    _without_timing(monkeypatch, yours_s=0.6, reference_s=1.0)
    _fails(
        lambda fn: checks.check_fast_training(fn, n_chars=3000, vocab_size=300),
        _fast_train,
        r"only 1.67 times as fast as the reference .*the goal is 2 times",
    )


def test_fast_training_check_refuses_wrong_merges_and_vocabulary(monkeypatch):
    def one_merge_short(text, vocab_size):
        vocab, merges = train_bpe(text, vocab_size)
        return vocab, merges[:-1]

    def ids_shifted(text, vocab_size):
        vocab, merges = train_bpe(text, vocab_size)
        return {token: i + 1 for token, i in vocab.items()}, merges

    for wrong, phrase in [
        (one_merge_short, "you learn 43 merges, the reference 44"),
        (ids_shifted, "vocabulary is not"),
    ]:
        _without_timing(monkeypatch)
        _fails(
            lambda fn: checks.check_fast_training(fn, n_chars=3000, vocab_size=300), wrong, phrase
        )


def test_the_chapter_states_what_each_check_uses():
    # Each exercise's check names its exercise as the heading in the notebook does.
    import nbformat

    from gpt2lib.course import format as course_format

    nb = nbformat.read(str(DATA.parent / "solutions" / "01_tokenizer.ipynb"), as_version=4)
    titles = [ex.title for ex in course_format.exercises(nb)]
    names = [
        checks.EX_BYTES,
        checks.EX_SPLIT,
        checks.EX_HAND,
        checks.EX_MERGE,
        checks.EX_DEBUG,
        checks.EX_DECODE,
        checks.EX_TIE,
        checks.EX_PAIR,
        checks.EX_TRAIN,
        checks.EX_RATIO,
    ]
    assert [
        name.split(" (")[0] + ": " + name.split(" (", 1)[1].split(")")[0] for name in names
    ] == titles
    assert [c.title for c in course_format.challenges(nb)] == [
        "Challenge: train twice as fast (about 15 min)"
    ]


# --------------------------------------------------------------------------- 1.10 measurement


_SWEEP_TEXT = (DATA / "bpe_training_text.txt").read_text(encoding="utf-8")
SWEEP_TEXTS = _SWEEP_TEXT[:1500], _SWEEP_TEXT[1500:2700]  # (train, held out)
SWEEP_SIZES = [256, 270, 290]


def test_the_sweep_check_accepts_the_right_measurement(capsys):
    ratios, gpt2_ratio = checks._sweep(*SWEEP_TEXTS, SWEEP_SIZES)
    checks.check_vocabulary_sweep(SWEEP_SIZES, ratios, gpt2_ratio, *SWEEP_TEXTS)
    assert ratios[0] == 1.0  # bytes only
    assert (
        "✅ Exercise 1.10 (measure how much text a token holds): the measurement"
        in capsys.readouterr().out
    )


@pytest.mark.parametrize("mistake", checks.SWEEP_MISTAKES, ids=lambda m: m.name)
def test_the_sweep_check_names_each_planted_mistake(mistake):
    ratios, gpt2_ratio = mistake.fn(*SWEEP_TEXTS, SWEEP_SIZES)
    with pytest.raises(CheckFailed) as info:
        checks.check_vocabulary_sweep(SWEEP_SIZES, ratios, gpt2_ratio, *SWEEP_TEXTS)
    assert mistake.message in str(info.value)


def test_the_sweep_check_names_form_mistakes_and_unknown_numbers():
    with pytest.raises(CheckFailed, match="give one per size"):
        checks.check_vocabulary_sweep(SWEEP_SIZES, [1.0], 3.0, *SWEEP_TEXTS)
    with pytest.raises(CheckFailed, match="a list of numbers"):
        checks.check_vocabulary_sweep(SWEEP_SIZES, ["a", "b", "c"], 3.0, *SWEEP_TEXTS)
    with pytest.raises(CheckFailed, match="your numbers are not the bytes per token on held_out"):
        checks.check_vocabulary_sweep(SWEEP_SIZES, [1.0, 2.0, 3.0], 3.0, *SWEEP_TEXTS)
