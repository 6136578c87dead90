"""Checks for chapter 1 (the tokenizer): one per exercise.

Each check runs the learner's function on small cases, compares with the reference in
`gpt2lib.tokenizer` and, when the answer is wrong, names the mistake by comparing with known
wrong versions. The checks never look at source code, so any correct answer passes.
"""

from __future__ import annotations

import functools
from collections import Counter

import regex

from gpt2lib.checks._core import CheckFailed, call_learner, passed

EX_SPLIT = "Exercise 1.1 (finish the split pattern)"
EX_MERGE = "Exercise 1.2 (apply merges by rank)"
EX_DECODE = "Exercise 1.3 (decode ids to text)"
EX_PAIR = "Exercise 1.4 (find the most frequent pair)"


def _short(value, limit: int = 120) -> str:
    text = repr(value)
    return text if len(text) <= limit else text[: limit - 3] + "..."


# --------------------------------------------------------------------------- 1.1 split pattern

SPLIT_SAMPLES = [
    "x y",
    "x   y",
    "a\nb",
    "Hello  world\n\nNext paragraph.\n",
    "def f(x):\n    return x  \n",
    "trailing spaces   ",
    "   leading spaces",
    "tab\there\t\tand\r\nthere",
    "I'll say it's 42, isn't it?",
    "x  \n  y",
]


def check_split_pattern(gpt2_split_pattern) -> None:
    """Exercise 1.1: `gpt2_split_pattern()` returns a regex that splits text like GPT-2's."""
    from gpt2lib.tokenizer import GPT2_SPLIT_PATTERN

    pattern = call_learner(EX_SPLIT, gpt2_split_pattern)
    if not isinstance(pattern, str):
        raise CheckFailed(
            EX_SPLIT, f"gpt2_split_pattern() should return the pattern as one str, got {type(pattern).__name__}"
        )
    try:
        compiled = regex.compile(pattern)
    except regex.error as exc:
        raise CheckFailed(EX_SPLIT, f"your pattern is not a valid regular expression: {exc}") from None
    reference = regex.compile(GPT2_SPLIT_PATTERN)
    if compiled.groups:
        raise CheckFailed(
            EX_SPLIT,
            "your pattern has a capturing group ( ... ), so findall returns the group instead of the "
            "whole match. Write groups as (?: ... ) or leave them out.",
        )
    matches_whitespace = any(p.isspace() for t in SPLIT_SAMPLES for p in compiled.findall(t))
    for text in SPLIT_SAMPLES:
        pieces = compiled.findall(text)
        if "" in pieces:
            raise CheckFailed(
                EX_SPLIT,
                f"your pattern matches empty strings (for {text!r}: {pieces}). Every piece must hold at "
                "least one character: use + (one or more), not * (zero or more).",
            )
        joined = "".join(pieces)
        if joined != text:
            hint = "add alternatives that match whitespace after the four given ones"
            if matches_whitespace:
                hint = (
                    "some whitespace is matched but not all: a lookahead alone cannot take a single "
                    "newline or tab before a word (as in 'a\\nb'); add \\s+ as the last alternative"
                )
            raise CheckFailed(
                EX_SPLIT,
                f"characters are lost: for {text!r} your pieces {pieces} join to {joined!r}. "
                f"A tokenizer must keep every character; {hint}.",
            )
    for text in SPLIT_SAMPLES:
        pieces, expected = compiled.findall(text), reference.findall(text)
        if pieces == expected:
            continue
        if compiled.findall("x y") == ["x", " ", "y"]:
            raise CheckFailed(
                EX_SPLIT,
                "for 'x y' you get ['x', ' ', 'y']: the space before a word became a piece of its own. "
                "The regex tries alternatives from left to right, so keep the four given ones first and "
                "add the whitespace alternatives after them.",
            )
        if compiled.findall("x   y") == ["x", "   ", "y"]:
            raise CheckFailed(
                EX_SPLIT,
                "for 'x   y' you get ['x', '   ', 'y']: the whole run of spaces is one piece, so 'y' loses its "
                "leading space and becomes a different token from the ' y' in 'x y'. GPT-2 gives "
                "['x', '  ', ' y']: match whitespace with a negative lookahead, \\s+(?!\\S), before \\s+.",
            )
        if compiled.findall("x  \n") == ["x", " ", " ", "\n"]:
            raise CheckFailed(
                EX_SPLIT,
                "runs of whitespace are cut into single characters (for 'x  \\n' you get "
                "['x', ' ', ' ', '\\n']); GPT-2 keeps a run together: use \\s+, not \\s.",
            )
        raise CheckFailed(EX_SPLIT, f"for {text!r} GPT-2's pattern gives {expected} but yours gives {pieces}.")
    passed(EX_SPLIT, f"your pattern splits all {len(SPLIT_SAMPLES)} samples like GPT-2's")


# --------------------------------------------------------------------------- 1.2 merges by rank


def _merge_everywhere(symbols: list[bytes], pair: tuple[bytes, bytes]) -> list[bytes]:
    out, i = [], 0
    while i < len(symbols):
        if i + 1 < len(symbols) and (symbols[i], symbols[i + 1]) == pair:
            out.append(pair[0] + pair[1])
            i += 2
        else:
            out.append(symbols[i])
            i += 1
    return out


def _leftmost_first(symbols, ranks):
    symbols = list(symbols)
    while True:
        ranked = [pair for pair in zip(symbols, symbols[1:]) if pair in ranks]
        if not ranked:
            return symbols
        symbols = _merge_everywhere(symbols, ranked[0])


def _highest_rank_first(symbols, ranks):
    symbols = list(symbols)
    while True:
        ranked = [pair for pair in zip(symbols, symbols[1:]) if pair in ranks]
        if not ranked:
            return symbols
        symbols = _merge_everywhere(symbols, max(ranked, key=ranks.__getitem__))


def _one_pass(symbols, ranks):
    out, i = [], 0
    while i < len(symbols):
        if i + 1 < len(symbols) and (symbols[i], symbols[i + 1]) in ranks:
            out.append(symbols[i] + symbols[i + 1])
            i += 2
        else:
            out.append(symbols[i])
            i += 1
    return out


def _leftmost_one_at_a_time(symbols, ranks):
    symbols = list(symbols)
    while True:
        positions = [i for i, pair in enumerate(zip(symbols, symbols[1:])) if pair in ranks]
        if not positions:
            return symbols
        i = positions[0]
        symbols[i : i + 2] = [symbols[i] + symbols[i + 1]]


def _lowest_rank_rightmost_occurrence(symbols, ranks):
    symbols = list(symbols)
    while True:
        ranked = [(ranks[pair], -i) for i, pair in enumerate(zip(symbols, symbols[1:])) if pair in ranks]
        if not ranked:
            return symbols
        i = -min(ranked)[1]
        symbols[i : i + 2] = [symbols[i] + symbols[i + 1]]


def _rank_zero_never_merged(symbols, ranks):
    from gpt2lib.tokenizer import bpe_merge as reference

    return reference(list(symbols), {pair: rank for pair, rank in ranks.items() if rank != 0})


def _one_merge(symbols, ranks):
    ranked = [pair for pair in zip(symbols, symbols[1:]) if pair in ranks]
    if not ranked:
        return list(symbols)
    return _merge_everywhere(list(symbols), min(ranked, key=ranks.__getitem__))


_MERGE_MISTAKES = [
    (
        lambda symbols, ranks: list(symbols),
        "your function returns the symbols without merging anything: merge pairs that have a rank.",
    ),
    (
        _one_merge,
        "you stop after the first merge. Keep going: after each merge look at the new neighbouring "
        "pairs again, until no pair has a rank.",
    ),
    (
        _highest_rank_first,
        "you merge the pair with the HIGHEST rank first. The lowest rank (the earliest line of "
        "vocab.bpe, learned first) must go first.",
    ),
    (
        _leftmost_first,
        "you merge the leftmost pair that has a rank, not the pair with the LOWEST rank. Merges must "
        "follow rank order wherever the pair is in the word.",
    ),
    (
        _leftmost_one_at_a_time,
        "you merge the leftmost pair that has a rank, not the pair with the LOWEST rank. Merges must "
        "follow rank order wherever the pair is in the word.",
    ),
    (
        _lowest_rank_rightmost_occurrence,
        "when the lowest-ranked pair occurs more than once, you merge the rightmost occurrence "
        "first; merge from left to right (take the first occurrence), as GPT-2 does. In 'aaaaa' "
        "the left 'a a' must merge first.",
    ),
    (
        _rank_zero_never_merged,
        "the pair with rank 0 is never merged: a test like `if rank:` or `ranks.get(pair) or ...` "
        "treats rank 0 as 'no rank'. Test for a missing rank with `pair in ranks` or `is None`.",
    ),
    (
        _one_pass,
        "you make one pass over the word, merging ranked pairs as you meet them. Merges must follow "
        "rank order, and after each merge new pairs appear: repeat, lowest rank first, until none is left.",
    ),
]

# Small rank tables where the order of merges changes the result.
_TOY_CASES = [
    ([b"a", b"b", b"c"], {(b"b", b"c"): 0, (b"a", b"b"): 1, (b"a", b"bc"): 2}),
    ([b"a", b"b", b"c", b"d"], {(b"b", b"c"): 0, (b"c", b"d"): 1, (b"a", b"b"): 2}),
    ([b"b", b"c", b"d"], {(b"a", b"b"): 0, (b"b", b"c"): 1, (b"c", b"d"): 2}),
    ([b"a", b"a", b"a", b"a", b"a"], {(b"a", b"a"): 0, (b"aa", b"aa"): 1}),
    ([b"x"], {(b"x", b"x"): 0}),
    ([], {(b"x", b"x"): 0}),
    ([b"x", b"y"], {}),
    # ranks need not start at 0 or be consecutive (a part of a larger table)
    ([b"p", b"q", b"r", b"s"], {(b"r", b"s"): 7000, (b"q", b"r"): 900, (b"p", b"qr"): 50000}),
]
_GPT2_WORDS = [" lowering", "hello", " tokenization", " internationalization", "aaaaaaa", " 👋", "\n\n", " the"]


@functools.lru_cache(maxsize=1)
def _gpt2_ranks() -> dict[tuple[bytes, bytes], int]:
    from gpt2lib.tokenizer import load_gpt2_vocab

    _, merges = load_gpt2_vocab()
    return {pair: rank for rank, pair in enumerate(merges)}


def check_bpe_merge(bpe_merge) -> None:
    """Exercise 1.2: `bpe_merge(symbols, ranks)` merges the lowest-ranked pair first, repeatedly."""
    from gpt2lib.tokenizer import bpe_merge as reference

    ranks = _gpt2_ranks()
    cases = list(_TOY_CASES) + [([bytes([b]) for b in w.encode("utf-8")], ranks) for w in _GPT2_WORDS]
    results = []
    for symbols, table in cases:
        given = list(symbols)
        got = call_learner(EX_MERGE, bpe_merge, given, table)
        if given != list(symbols):
            raise CheckFailed(
                EX_MERGE,
                f"your function changed the caller's list (it was {_short(list(symbols))}, afterwards "
                f"{_short(given)}). Work on a copy: start with symbols = list(symbols).",
            )
        if not isinstance(got, (list, tuple)) or not all(isinstance(s, bytes) for s in got):
            raise CheckFailed(
                EX_MERGE,
                f"bpe_merge should return a list of bytes objects, got {_short(got)} for {_short(symbols)}",
            )
        if b"".join(got) != b"".join(symbols):
            raise CheckFailed(
                EX_MERGE,
                f"for {_short(symbols)} you return {_short(list(got))}, which spells different bytes. "
                "When you merge a pair, the two halves become one symbol: skip both before looking further.",
            )
        results.append(list(got))
    expected = [reference(list(symbols), table) for symbols, table in cases]
    if results == expected:
        passed(EX_MERGE, f"{len(cases)} words merged exactly like GPT-2")
        return
    for mistake, message in _MERGE_MISTAKES:
        if all(got == mistake(list(s), t) for got, (s, t) in zip(results, cases)):
            raise CheckFailed(EX_MERGE, message)
    for got, want, (symbols, _) in zip(results, expected, cases):
        if got != want:
            raise CheckFailed(
                EX_MERGE,
                f"for {_short(symbols)} the merges by rank give {_short(want)}, but yours gives {_short(got)}.",
            )


# --------------------------------------------------------------------------- 1.3 decode


@functools.lru_cache(maxsize=1)
def _gpt2_token_texts() -> dict[int, str]:
    from gpt2lib.tokenizer import ENDOFTEXT, ENDOFTEXT_ID, bytes_to_unicode, load_gpt2_vocab

    vocab, _ = load_gpt2_vocab()
    char_of_byte = bytes_to_unicode()
    texts = {token_id: "".join(char_of_byte[b] for b in token) for token, token_id in vocab.items()}
    texts[ENDOFTEXT_ID] = ENDOFTEXT
    return texts


def _decode_cases():
    from gpt2lib.tokenizer import ENDOFTEXT_ID, BPETokenizer

    tok = BPETokenizer.gpt2()
    texts = ["Hello world", "  two spaces\n\nand lines\n", "Grüße aus Köln", "I 💙 tokenizers 🤗"]
    cases = [tok.encode(t) for t in texts]
    cases.append(tok.encode("one") + [ENDOFTEXT_ID] + tok.encode("two"))
    cases.append([])
    cases.append([tok.vocab[b"a"], tok.vocab[b"\xe4"], tok.vocab[b"\xb8"]])  # 'a' and 2 of the 3 bytes of '世'
    cases.append([tok.vocab[b"\xc3"]])  # the first byte of a two-byte character, alone
    return tok, cases


def check_decode_ids(decode_ids) -> None:
    """Exercise 1.3: `decode_ids(ids, token_texts)` maps characters back to bytes, joins, decodes."""
    from gpt2lib.tokenizer import bytes_to_unicode

    token_texts = _gpt2_token_texts()
    tok, cases = _decode_cases()
    byte_of_char = {c: b for b, c in bytes_to_unicode().items()}

    def token_bytes(i):
        return bytes(byte_of_char[c] for c in token_texts[i])

    for ids in cases:
        expected = tok.decode(ids)
        try:
            got = call_learner(EX_DECODE, decode_ids, list(ids), token_texts)
        except UnicodeDecodeError:
            raise CheckFailed(
                EX_DECODE,
                f"decoding {ids} raised UnicodeDecodeError: these ids end in the middle of a character. "
                "Decode with errors='replace' so the broken bytes become '\\ufffd' instead of an exception.",
            ) from None
        if isinstance(got, (bytes, bytearray)):
            raise CheckFailed(EX_DECODE, "you return bytes; decode the joined bytes with UTF-8 and return a str.")
        if not isinstance(got, str):
            raise CheckFailed(EX_DECODE, f"decode_ids should return a str, got {type(got).__name__}")
        if got == expected:
            continue
        if got == "".join(token_texts[i] for i in ids):
            raise CheckFailed(
                EX_DECODE,
                f"for {ids} you return {got!r}: GPT-2's printable stand-ins (like 'Ġ' for a space) are still "
                "there. Map each character back to its byte with the inverse of bytes_to_unicode() first.",
            )
        if got == "".join(token_bytes(i).decode("utf-8", errors="replace") for i in ids):
            raise CheckFailed(
                EX_DECODE,
                f"you decode each token on its own, so a character whose bytes are spread over two tokens "
                f"becomes '\\ufffd' (for {ids} you return {got!r}, expected {expected!r}). "
                "Join the bytes of all tokens first, then decode once.",
            )
        joined = b"".join(token_bytes(i) for i in ids)
        if got == joined.decode("utf-8", errors="ignore"):
            raise CheckFailed(
                EX_DECODE,
                f"for {ids} you return {got!r}, dropping the bytes of an incomplete character; GPT-2's "
                "decoder shows them as '\\ufffd' (errors='replace', not 'ignore'), so the reader sees that "
                "something is missing.",
            )
        if got == joined.decode("latin-1"):
            raise CheckFailed(
                EX_DECODE, f"for {ids} you return {got!r}: decode the bytes as UTF-8, not latin-1."
            )
        raise CheckFailed(EX_DECODE, f"for ids {ids} the text is {expected!r}, but yours gives {got!r}.")
    passed(EX_DECODE, f"{len(cases)} id lists decoded, including cut characters and <|endoftext|>")


# --------------------------------------------------------------------------- 1.4 most frequent pair


def _pair_counts(word_counts, weighted=True, once_per_word=False) -> Counter:
    counts = Counter()
    for word, n in word_counts.items():
        pairs = list(zip(word, word[1:]))
        if once_per_word:
            pairs = list(dict.fromkeys(pairs))
        for pair in pairs:
            counts[pair] += n if weighted else 1
    return counts


def _training_word_counts() -> dict[tuple[bytes, ...], int]:
    from gpt2lib.tokenizer import GPT2_SPLIT_PATTERN

    text = (
        "the cat sat on the mat; the dog sat on the log. then the cat and the dog ate. "
        "that is that, and this is this. these things happen."
    )
    pieces = Counter(regex.findall(GPT2_SPLIT_PATTERN, text))
    return {tuple(bytes([b]) for b in p.encode()): n for p, n in pieces.items()}


_PAIR_CASES = [
    # weighted by count: (x, y) occurs 5 times; (y, z) is in two words that occur once each
    {(b"x", b"y"): 5, (b"y", b"z"): 1, (b"y", b"z", b"w"): 1},
    # a pair twice inside one word: (a, a) three times in "aaaa"
    {(b"a", b"a", b"a", b"a"): 1, (b"b", b"c"): 2, (b"c",): 9, (b"d", b"e"): 1},
    # symbols longer than one byte, as after a few merges
    {(b"th", b"e"): 4, (b" ", b"th", b"e"): 3, (b" ", b"a"): 6, (b"e",): 1},
]


def check_most_frequent_pair(most_frequent_pair) -> None:
    """Exercise 1.4: `most_frequent_pair(word_counts)` returns the pair with the largest weighted count."""
    cases = list(_PAIR_CASES) + [_training_word_counts()]
    for word_counts in cases:
        counts = _pair_counts(word_counts)
        got = call_learner(EX_PAIR, most_frequent_pair, dict(word_counts))
        if not (isinstance(got, tuple) and len(got) == 2 and all(isinstance(s, bytes) for s in got)):
            raise CheckFailed(
                EX_PAIR, f"return the pair as a tuple of two bytes objects, like (b'a', b'b'); you returned {_short(got)}"
            )
        if got not in counts:
            raise CheckFailed(EX_PAIR, f"{got} is not a pair of neighbouring symbols in any word of {_short(word_counts)}")
        best = max(counts.values())
        if counts[got] == best:
            continue
        unweighted = _pair_counts(word_counts, weighted=False)
        once = _pair_counts(word_counts, once_per_word=True)
        if unweighted[got] == max(unweighted.values()):
            message = (
                "you count each word once. A word that occurs 5 times adds 5 to each of its pairs: "
                "multiply by the word's count from word_counts."
            )
        elif once[got] == max(once.values()):
            message = (
                "a pair that appears twice inside one word counts twice (like (b'a', b'a') in "
                "b'aaaa', three times); you count it once per word."
            )
        elif counts[got] == min(counts.values()):
            message = "you return the LEAST frequent pair; return the most frequent one."
        else:
            message = f"{got} occurs {counts[got]} times, but {max(counts, key=counts.__getitem__)} occurs {best} times."
        raise CheckFailed(EX_PAIR, message + f" (words: {_short(word_counts)})")
    for empty in ({(b"a",): 3, (b"b",): 1}, {}):
        try:
            got = call_learner(EX_PAIR, most_frequent_pair, dict(empty))
        except CheckFailed:
            raise
        except Exception as exc:
            raise CheckFailed(
                EX_PAIR,
                f"when no word has two symbols left (word_counts={empty}) return None; your function raised "
                f"{type(exc).__name__}: {exc}",
            ) from None
        if got is not None:
            raise CheckFailed(EX_PAIR, f"when no word has two symbols left (word_counts={empty}) return None, not {_short(got)}")
    passed(EX_PAIR, f"{len(cases)} word counts, plus the case with no pairs left")
