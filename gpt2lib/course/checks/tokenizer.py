"""Checks for chapter 1 (the tokenizer): one per exercise.

Each check runs the learner's function on small cases, compares with the reference in
`gpt2lib.tokenizer` and, when the answer is wrong, names the mistake by comparing with known
wrong versions. The checks never look at source code, so any correct answer passes.

The known wrong versions are module-level lists of `Mistake` (MERGE_MISTAKES, DECODE_MISTAKES,
PAIR_MISTAKES, MERGE_PAIR_MISTAKES, TRAIN_MISTAKES); the tests feed each one to its check.
Training checks accept either tie rule (first seen, or the greater pair): any most frequent pair
is right.
"""

from __future__ import annotations

import functools
from collections import Counter

import regex

from gpt2lib.course.checks._core import (
    CheckFailed,
    Mistake,
    call_learner,
    first_mistake,
    named,
    passed,
)

EX_SPLIT = "Exercise 1.1 (finish the split pattern)"
EX_MERGE = "Exercise 1.2 (apply merges by rank)"
EX_DECODE = "Exercise 1.3 (decode ids to text)"
EX_PAIR = "Exercise 1.4 (find the most frequent pair)"
EX_MERGE_PAIR = "Exercise 1.5 (merge a pair in every word)"
EX_TRAIN = "Exercise 1.6 (the training loop)"


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


def _four_given() -> str:
    """The four alternatives the exercise gives (GPT-2's pattern without its two whitespace ones)."""
    from gpt2lib.tokenizer import GPT2_SPLIT_PATTERN

    return GPT2_SPLIT_PATTERN.rsplit("|", 2)[0]


# Each mistake's function returns a pattern written with that mistake; the check recognises the
# mistake by how the learner's pattern splits a probe text.
SPLIT_MISTAKES = [
    Mistake("no whitespace", "characters are lost: whitespace is matched by none of your alternatives. A tokenizer "
            "must keep every character; add alternatives that match whitespace after the four given ones.",
            _four_given),
    Mistake("lookahead only", "characters are lost: some whitespace is matched but not all. A lookahead alone "
            "cannot take a single newline or tab before a word (as in 'a\\nb'); add \\s+ as the last alternative.",
            lambda: _four_given() + r"|\s+(?!\S)"),
    Mistake("whitespace first", "for 'x y' you get ['x', ' ', 'y']: the space before a word became a piece of its "
            "own. The regex tries alternatives from left to right, so keep the four given ones first and add the "
            "whitespace alternatives after them.", lambda: r"\s+(?!\S)|\s+|" + _four_given()),
    Mistake("no lookahead", "for 'x   y' you get ['x', '   ', 'y']: the whole run of spaces is one piece, so 'y' "
            "loses its leading space and becomes a different token from the ' y' in 'x y'. GPT-2 gives "
            "['x', '  ', ' y']: match whitespace with a negative lookahead, \\s+(?!\\S), before \\s+.",
            lambda: _four_given() + r"|\s+"),
    Mistake("single whitespace", "runs of whitespace are cut into single characters (for 'x  \\n' you get "
            "['x', ' ', ' ', '\\n']); GPT-2 keeps a run together: use \\s+, not \\s.", lambda: _four_given() + r"|\s"),
]
_SPLIT_PROBES = {  # mistake name -> (probe text, how that mistake splits it)
    "whitespace first": ("x y", ["x", " ", "y"]),
    "no lookahead": ("x   y", ["x", "   ", "y"]),
    "single whitespace": ("x  \n", ["x", " ", " ", "\n"]),
}


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
            mistake = named(SPLIT_MISTAKES, "lookahead only" if matches_whitespace else "no whitespace")
            raise CheckFailed(EX_SPLIT, f"{mistake.message} (for {text!r} your pieces {pieces} join to {joined!r})")
    for text in SPLIT_SAMPLES:
        pieces, expected = compiled.findall(text), reference.findall(text)
        if pieces == expected:
            continue
        for name, (probe, wrong_pieces) in _SPLIT_PROBES.items():
            if compiled.findall(probe) == wrong_pieces:
                raise CheckFailed(EX_SPLIT, named(SPLIT_MISTAKES, name).message)
        raise CheckFailed(EX_SPLIT, f"for {text!r} GPT-2's pattern gives {expected} but yours gives {pieces}.")
    passed(EX_SPLIT, f"your pattern splits all {len(SPLIT_SAMPLES)} samples like GPT-2's")


# --------------------------------------------------------------------------- 1.2 merges by rank


def _merge_adjacent(symbols, should_merge) -> list[bytes]:
    """One pass from left to right that merges each neighbouring pair with should_merge(pair)."""
    out, i = [], 0
    while i < len(symbols):
        if i + 1 < len(symbols) and should_merge((symbols[i], symbols[i + 1])):
            out.append(symbols[i] + symbols[i + 1])
            i += 2
        else:
            out.append(symbols[i])
            i += 1
    return out


def _merge_everywhere(symbols: list[bytes], pair: tuple[bytes, bytes]) -> list[bytes]:
    return _merge_adjacent(symbols, lambda neighbours: neighbours == pair)


def _one_pass(symbols, ranks):
    return _merge_adjacent(list(symbols), ranks.__contains__)


def _merge_loop(choose, everywhere=True):
    """A wrong bpe_merge: while some neighbouring pair has a rank, merge the pair at position
    choose(positions of ranked pairs, all pairs, ranks), at every place it occurs
    (everywhere) or only there. The right rule is the lowest rank, every occurrence."""

    def merge(symbols, ranks):
        symbols = list(symbols)
        while True:
            pairs = list(zip(symbols, symbols[1:]))
            positions = [i for i, pair in enumerate(pairs) if pair in ranks]
            if not positions:
                return symbols
            i = choose(positions, pairs, ranks)
            if everywhere:
                symbols = _merge_everywhere(symbols, pairs[i])
            else:
                symbols[i : i + 2] = [symbols[i] + symbols[i + 1]]

    return merge


_leftmost_first = _merge_loop(lambda positions, pairs, ranks: positions[0])
_highest_rank_first = _merge_loop(lambda positions, pairs, ranks: max(positions, key=lambda i: ranks[pairs[i]]))
_leftmost_one_at_a_time = _merge_loop(lambda positions, pairs, ranks: positions[0], everywhere=False)
_lowest_rank_rightmost_occurrence = _merge_loop(
    lambda positions, pairs, ranks: min(positions, key=lambda i: (ranks[pairs[i]], -i)), everywhere=False
)


def _rank_zero_never_merged(symbols, ranks):
    from gpt2lib.tokenizer import bpe_merge as reference

    return reference(list(symbols), {pair: rank for pair, rank in ranks.items() if rank != 0})


def _one_merge(symbols, ranks):
    ranked = [pair for pair in zip(symbols, symbols[1:]) if pair in ranks]
    if not ranked:
        return list(symbols)
    return _merge_everywhere(list(symbols), min(ranked, key=ranks.__getitem__))


MERGE_MISTAKES = [
    Mistake("no merges", "your function returns the symbols without merging anything: merge pairs that have a rank.",
            lambda symbols, ranks: list(symbols)),
    Mistake("one merge", "you stop after the first merge. Keep going: after each merge look at the new neighbouring "
            "pairs again, until no pair has a rank.", _one_merge),
    Mistake("highest rank first", "you merge the pair with the HIGHEST rank first. The lowest rank (the earliest "
            "line of vocab.bpe, learned first) must go first.", _highest_rank_first),
    Mistake("leftmost pair", "you merge the leftmost pair that has a rank, not the pair with the LOWEST rank. "
            "Merges must follow rank order wherever the pair is in the word.", _leftmost_first),
    Mistake("leftmost pair, one at a time", "you merge the leftmost pair that has a rank, not the pair with the "
            "LOWEST rank. Merges must follow rank order wherever the pair is in the word.", _leftmost_one_at_a_time),
    Mistake("rightmost occurrence", "when the lowest-ranked pair occurs more than once, you merge the rightmost "
            "occurrence first; merge from left to right (take the first occurrence), as GPT-2 does. In 'aaaaa' "
            "the left 'a a' must merge first.", _lowest_rank_rightmost_occurrence),
    Mistake("rank 0 is no rank", "the pair with rank 0 is never merged: a test like `if rank:` or "
            "`ranks.get(pair) or ...` treats rank 0 as 'no rank'. Test for a missing rank with `pair in ranks` "
            "or `is None`.", _rank_zero_never_merged),
    Mistake("one pass", "you make one pass over the word, merging ranked pairs as you meet them. Merges must "
            "follow rank order, and after each merge new pairs appear: repeat, lowest rank first, until none is "
            "left.", _one_pass),
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
    mistake = first_mistake(MERGE_MISTAKES, lambda m: all(got == m.fn(list(s), t) for got, (s, t) in zip(results, cases)))
    if mistake is not None:
        raise CheckFailed(EX_MERGE, mistake.message)
    for got, want, (symbols, _) in zip(results, expected, cases):
        if got != want:
            raise CheckFailed(
                EX_MERGE,
                f"for {_short(symbols)} the merges by rank give {_short(want)}, but yours gives {_short(got)}.",
            )


# --------------------------------------------------------------------------- 1.3 decode


@functools.lru_cache(maxsize=1)
def _gpt2_token_texts() -> dict[int, str]:
    from gpt2lib.tokenizer import (
        ENDOFTEXT,
        ENDOFTEXT_ID,
        bytes_to_unicode,
        load_gpt2_vocab,
    )

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


def _byte_of_char() -> dict[str, int]:
    from gpt2lib.tokenizer import bytes_to_unicode

    return {c: b for b, c in bytes_to_unicode().items()}


def _joined_bytes(ids, token_texts) -> bytes:
    byte_of = _byte_of_char()
    return bytes(byte_of[c] for i in ids for c in token_texts[i])


DECODE_MISTAKES = [
    Mistake("no byte map", "GPT-2's printable stand-ins (like 'Ġ' for a space) are still there. Map each "
            "character back to its byte with the inverse of bytes_to_unicode() first.",
            lambda ids, token_texts: "".join(token_texts[i] for i in ids)),
    Mistake("per token", "you decode each token on its own, so a character whose bytes are spread over two "
            "tokens becomes '\\ufffd'. Join the bytes of all tokens first, then decode once.",
            lambda ids, token_texts: "".join(_joined_bytes([i], token_texts).decode("utf-8", errors="replace")
                                             for i in ids)),
    Mistake("errors=ignore", "you drop the bytes of an incomplete character; GPT-2's decoder shows them as "
            "'\\ufffd' (errors='replace', not 'ignore'), so the reader sees that something is missing.",
            lambda ids, token_texts: _joined_bytes(ids, token_texts).decode("utf-8", errors="ignore")),
    Mistake("latin-1", "decode the bytes as UTF-8, not latin-1.",
            lambda ids, token_texts: _joined_bytes(ids, token_texts).decode("latin-1")),
]


def check_decode_ids(decode_ids) -> None:
    """Exercise 1.3: `decode_ids(ids, token_texts)` maps characters back to bytes, joins, decodes."""
    token_texts = _gpt2_token_texts()
    tok, cases = _decode_cases()
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
        mistake = first_mistake(DECODE_MISTAKES, lambda m, ids=ids, got=got: m.fn(list(ids), token_texts) == got)
        detail = f"for {ids} you return {got!r}, expected {expected!r}"
        if mistake is not None:
            raise CheckFailed(EX_DECODE, f"{mistake.message} ({detail})")
        raise CheckFailed(EX_DECODE, f"for ids {ids} the text is {expected!r}, but yours gives {got!r}.")
    passed(EX_DECODE, f"{len(cases)} id lists decoded, including cut characters and <|endoftext|>")


# --------------------------------------------------------------------------- 1.4 most frequent pair


def _pair_counts(word_counts, weighted=True, once_per_word=False, skip_last=False) -> Counter:
    counts = Counter()
    for word, n in word_counts.items():
        pairs = list(zip(word, word[1:]))
        if skip_last:
            pairs = pairs[:-1]
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


# Each mistake gives the scores that the wrong counting assigns to every pair; a learner's answer
# shows the mistake when it is a best pair under those scores in every case (any tie accepted).
PAIR_MISTAKES = [
    Mistake("skips the last pair", "your loop stops one pair early: the last pair of each word is never "
            "counted (a word of n symbols has n - 1 pairs, at positions 0 to n - 2; zip(word, word[1:]) gives "
            "them all).", lambda word_counts: _pair_counts(word_counts, skip_last=True)),
    Mistake("unweighted", "you count each word once. A word that occurs 5 times adds 5 to each of its pairs: "
            "multiply by the word's count from word_counts.", lambda word_counts: _pair_counts(word_counts, weighted=False)),
    Mistake("once per word", "a pair that appears twice inside one word counts twice (like (b'a', b'a') in "
            "b'aaaa', three times); you count it once per word.",
            lambda word_counts: _pair_counts(word_counts, once_per_word=True)),
    Mistake("least frequent", "you return the LEAST frequent pair; return the most frequent one.",
            lambda word_counts: Counter({p: -c for p, c in _pair_counts(word_counts).items()})),
]

_PAIR_CASES = [
    # weighted by count: (x, y) occurs 5 times; (y, z) is in two words that occur once each
    {(b"x", b"y"): 5, (b"y", b"z"): 1, (b"y", b"z", b"w"): 1},
    # a pair twice inside one word: (a, a) three times in "aaaa"
    {(b"a", b"a", b"a", b"a"): 1, (b"b", b"c"): 2, (b"c",): 9, (b"d", b"e"): 1},
    # symbols longer than one byte, as after a few merges
    {(b"th", b"e"): 4, (b" ", b"th", b"e"): 3, (b" ", b"a"): 6, (b"e",): 1},
    # the most frequent pair is the last pair of its words
    {(b"q", b"u", b"i", b"t"): 2, (b" ", b"i", b"t"): 3, (b"i", b"t"): 1, (b"u", b"p"): 1},
]


def _is_best(pair, scores: Counter) -> bool:
    return bool(scores) and pair in scores and scores[pair] == max(scores.values())


def check_most_frequent_pair(most_frequent_pair) -> None:
    """Exercise 1.4: `most_frequent_pair(word_counts)` returns a pair with the largest weighted count."""
    cases = list(_PAIR_CASES) + [_training_word_counts()]
    answers = []
    for word_counts in cases:
        counts = _pair_counts(word_counts)
        got = call_learner(EX_PAIR, most_frequent_pair, dict(word_counts))
        if not (isinstance(got, tuple) and len(got) == 2 and all(isinstance(s, bytes) for s in got)):
            raise CheckFailed(
                EX_PAIR, f"return the pair as a tuple of two bytes objects, like (b'a', b'b'); you returned {_short(got)}"
            )
        if got not in counts:
            raise CheckFailed(EX_PAIR, f"{got} is not a pair of neighbouring symbols in any word of {_short(word_counts)}")
        answers.append(got)
    for word_counts, got in zip(cases, answers):
        counts = _pair_counts(word_counts)
        if _is_best(got, counts):
            continue
        mistake = first_mistake(PAIR_MISTAKES, lambda m: all(_is_best(g, m.fn(wc)) for wc, g in zip(cases, answers)))
        best = max(counts.values())
        message = mistake.message if mistake else (
            f"{got} occurs {counts[got]} times, but {max(counts, key=counts.__getitem__)} occurs {best} times.")
        raise CheckFailed(EX_PAIR, message + f" (words: {_short(word_counts)}; you returned {got})")
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


# --------------------------------------------------------------------------- 1.5 merge a pair


def _merge_word(word, pair, first_only=False, from_right=False, no_skip=False):
    first, second = pair
    symbols = list(reversed(word)) if from_right else list(word)
    if from_right:
        first, second = second, first
    out, i, merged_once = [], 0, False
    while i < len(symbols):
        if i + 1 < len(symbols) and symbols[i] == first and symbols[i + 1] == second and not (first_only and merged_once):
            out.append(symbols[i + 1] + symbols[i] if from_right else symbols[i] + symbols[i + 1])
            merged_once = True
            i += 1 if no_skip else 2
        else:
            out.append(symbols[i])
            i += 1
    return tuple(reversed(out)) if from_right else tuple(out)


def _merge_all_words(word_counts, pair, overwrite=False, **how):
    merged = {}
    for word, count in word_counts.items():
        key = _merge_word(word, pair, **how)
        merged[key] = count if overwrite else merged.get(key, 0) + count
    return merged


MERGE_PAIR_MISTAKES = [
    Mistake("nothing merged", "your result still holds the words unmerged: replace every occurrence of the pair "
            "by the one symbol first + second.", lambda word_counts, pair: dict(word_counts)),
    Mistake("counts overwritten", "two words that become the same word after the merge must add their counts; "
            "you keep only one of them (merged[key] = count overwrites: use merged.get(key, 0) + count).",
            lambda word_counts, pair: _merge_all_words(word_counts, pair, overwrite=True)),
    Mistake("first occurrence only", "you merge only the first occurrence of the pair in each word; merge every "
            "occurrence, from left to right.", lambda word_counts, pair: _merge_all_words(word_counts, pair, first_only=True)),
    Mistake("from the right", "you merge from right to left: (a, a, a) on (a, a) must give (aa, a), not (a, aa). "
            "Walk through each word from the left.", lambda word_counts, pair: _merge_all_words(word_counts, pair, from_right=True)),
]

_MERGE_PAIR_CASES = [
    ({(b"a", b"b", b"c"): 2, (b"x", b"a", b"b"): 1, (b"b", b"a"): 4}, (b"a", b"b")),
    ({(b"a", b"a", b"a"): 3, (b"a", b"a", b"a", b"a", b"a"): 1, (b"a",): 7}, (b"a", b"a")),
    # two words become one: (ab, c) and (a, b, c)
    ({(b"ab", b"c"): 3, (b"a", b"b", b"c"): 2, (b"c", b"a", b"b", b"a", b"b"): 1}, (b"a", b"b")),
    ({(b" ", b"th", b"e"): 5, (b"th", b"e", b"th", b"e"): 1, (b"t", b"h", b"e"): 2}, (b"th", b"e")),
    ({}, (b"a", b"b")),
]


def check_merge_pair(merge_pair) -> None:
    """Exercise 1.5: `merge_pair(word_counts, pair)` merges every occurrence, left to right, and adds counts."""
    from gpt2lib.tokenizer import merge_pair as reference

    results = []
    for word_counts, pair in _MERGE_PAIR_CASES:
        given = dict(word_counts)
        got = call_learner(EX_MERGE_PAIR, merge_pair, given, pair)
        if given != word_counts:
            raise CheckFailed(EX_MERGE_PAIR, "your function changed the caller's dict; build a new dict and return it.")
        if not isinstance(got, dict):
            raise CheckFailed(EX_MERGE_PAIR, f"merge_pair should return a dict of word -> count, got {type(got).__name__}")
        for word in got:
            if not (isinstance(word, tuple) and all(isinstance(s, bytes) for s in word)):
                raise CheckFailed(EX_MERGE_PAIR, f"each word must stay a tuple of bytes symbols; you have {_short(word)}")
        if sum(got.values()) != sum(word_counts.values()):
            raise CheckFailed(
                EX_MERGE_PAIR,
                f"the counts add up to {sum(got.values())} instead of {sum(word_counts.values())}: two words that "
                "become the same word must add their counts (merged.get(key, 0) + count), never overwrite or drop "
                f"one (words: {_short(word_counts)}, pair {pair})",
            )
        for word in got:
            if b"".join(word) not in {b"".join(w) for w in word_counts}:
                raise CheckFailed(
                    EX_MERGE_PAIR,
                    f"{_short(word)} spells bytes that no input word spells: after a merge, skip both halves before "
                    "looking at the next pair, and join them as first + second.",
                )
        results.append(got)
    expected = [reference(dict(wc), pair) for wc, pair in _MERGE_PAIR_CASES]
    if results == expected:
        passed(EX_MERGE_PAIR, f"{len(results)} word tables merged, including words that become one")
        return
    mistake = first_mistake(
        MERGE_PAIR_MISTAKES, lambda m: all(got == m.fn(dict(wc), p) for got, (wc, p) in zip(results, _MERGE_PAIR_CASES))
    )
    if mistake is not None:
        raise CheckFailed(EX_MERGE_PAIR, mistake.message)
    for got, want, (word_counts, pair) in zip(results, expected, _MERGE_PAIR_CASES):
        if got != want:
            raise CheckFailed(EX_MERGE_PAIR, f"merging {pair} in {_short(word_counts)} gives {_short(want)}, "
                                             f"but yours gives {_short(got)}.")


# --------------------------------------------------------------------------- 1.6 training loop


def _loop(word_counts, num_merges, apply=True, extra=0, stop_on_none=True):
    from gpt2lib.tokenizer import merge_pair, most_frequent_pair

    merges = []
    for _ in range(num_merges + extra):
        pair = most_frequent_pair(word_counts)
        if pair is None and stop_on_none:
            break
        merges.append(pair)
        if apply:
            word_counts = merge_pair(word_counts, pair)
    return merges


TRAIN_MISTAKES = [
    Mistake("merge not applied", "you record the pair but the words never change, so the same pair wins every "
            "time: keep the merged words, word_counts = merge_pair(word_counts, pair).",
            lambda word_counts, num_merges: _loop(word_counts, num_merges, apply=False)),
    Mistake("one too few", "you learn one merge too few: the loop must run num_merges times (range(num_merges)).",
            lambda word_counts, num_merges: _loop(word_counts, num_merges, extra=-1)),
    Mistake("one too many", "you learn one merge too many: the loop must run num_merges times (range(num_merges)).",
            lambda word_counts, num_merges: _loop(word_counts, num_merges, extra=1)),
    Mistake("no stop", "when no pair is left, most_frequent_pair returns None: stop there instead of "
            "recording None as a merge.", lambda word_counts, num_merges: _loop(word_counts, num_merges, stop_on_none=False)),
]


def _train_cases():
    return [
        (_training_word_counts(), 12),
        ({(b"a", b"b"): 3, (b"a", b"b", b"c"): 2, (b"x", b"y"): 1}, 10),  # runs out of pairs after 3 merges
        ({(b"l", b"o", b"w"): 5, (b"l", b"o", b"w", b"e", b"r"): 2, (b"n", b"e", b"w", b"e", b"s", b"t"): 6,
          (b"w", b"i", b"d", b"e", b"s", b"t"): 3}, 6),
        ({(b"z",): 4}, 3),
    ]


def _replay_problem(word_counts, num_merges, merges) -> str | None:
    """Why `merges` is not a valid run of BPE training, or None. Any tied pair is accepted."""
    from gpt2lib.tokenizer import merge_pair

    for step, pair in enumerate(merges):
        if step >= num_merges:
            return f"you return {len(merges)} merges; num_merges={num_merges} asks for at most {num_merges}"
        counts = _pair_counts(word_counts)
        if not counts:
            return f"merge {step} is {_short(pair)}, but no pair is left by then: stop when most_frequent_pair returns None"
        if not _is_best(pair, counts):
            best = max(counts, key=counts.__getitem__)
            return (f"merge {step} is {_short(pair)}, which occurs {counts.get(pair, 0)} times then; the most frequent "
                    f"pair occurs {counts[best]} times, for example {best}")
        word_counts = merge_pair(word_counts, pair)
    if len(merges) < num_merges and _pair_counts(word_counts):
        return (f"you return {len(merges)} merges, but num_merges={num_merges} and pairs are still left: keep "
                "going until num_merges merges are learned")
    return None


def check_train_merges(train_merges) -> None:
    """Exercise 1.6: `train_merges(word_counts, num_merges)` is count, merge, repeat (either tie rule)."""
    cases = _train_cases()
    results = []
    for word_counts, num_merges in cases:
        try:
            got = call_learner(EX_TRAIN, train_merges, dict(word_counts), num_merges)
        except TypeError as exc:
            if "NoneType" not in str(exc):
                raise
            # merge_pair(word_counts, None): the loop went on after most_frequent_pair found no pair
            no_stop = next(m for m in TRAIN_MISTAKES if m.name == "no stop")
            raise CheckFailed(EX_TRAIN, f"{no_stop.message} (your code raised TypeError: {exc})") from None
        if not isinstance(got, (list, tuple)):
            raise CheckFailed(EX_TRAIN, f"train_merges should return a list of pairs, got {type(got).__name__}")
        results.append(list(got))
    problems = [_replay_problem(dict(wc), n, got) for (wc, n), got in zip(cases, results)]
    if not any(problems):
        passed(EX_TRAIN, f"{len(cases)} trainings, each merge a most frequent pair, stopping when none is left")
        return
    mistake = first_mistake(TRAIN_MISTAKES, lambda m: all(got == m.fn(dict(wc), n) for got, (wc, n) in zip(results, cases)))
    if mistake is not None:
        raise CheckFailed(EX_TRAIN, mistake.message)
    for got in results:
        for pair in got:
            if not (isinstance(pair, tuple) and len(pair) == 2 and all(isinstance(s, bytes) for s in pair)):
                raise CheckFailed(EX_TRAIN, f"each merge should be a pair (bytes, bytes), like (b't', b'h'); "
                                            f"you have {_short(pair)}")
    (word_counts, _), problem = next(((case, p) for case, p in zip(cases, problems) if p))
    raise CheckFailed(EX_TRAIN, f"{problem} (words: {_short(word_counts)})")
