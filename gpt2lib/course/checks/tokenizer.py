"""Checks for chapter 1 (the tokenizer): Exercises 1.1 to 1.10 and the challenge. Training checks
accept either tie rule; the challenge asks for the reference's merges exactly."""

from __future__ import annotations

import functools
import json
import operator
import tempfile
import time
from collections import Counter
from pathlib import Path

import regex

from gpt2lib import tokenizer as tk
from gpt2lib.chapters import bpe
from gpt2lib.course.checks import _core as core

EX_BYTES = "Exercise 1.1 (the byte table, and reading the files): bytes_to_unicode"
EX_LOAD = "Exercise 1.1 (the byte table, and reading the files): load_gpt2_vocab"
EX_SPLIT = "Exercise 1.2 (finish the split pattern)"
EX_HAND = "Exercise 1.3 (merge a word by hand)"
EX_MERGE = "Exercise 1.4 (apply merges by rank)"
EX_DEBUG = "Exercise 1.5 (find and fix the bug in a colleague's encoder)"
EX_DECODE = "Exercise 1.6 (decode ids to text)"
EX_TIE = "Exercise 1.7 (a text on which the tie rules disagree)"
EX_PAIR = "Exercise 1.8 (count pairs, and merge one): most_frequent_pair"
EX_MERGE_PAIR = "Exercise 1.8 (count pairs, and merge one): merge_pair"
EX_TRAIN = "Exercise 1.9 (the training loop)"
EX_RATIO = "Exercise 1.10 (measure how much text a token holds)"
EX_SWEEP = "Exercise 1.10 (measure how much text a token holds): the measurement"
CH_FAST = "Challenge (train twice as fast)"


def _short(value, limit: int = 120) -> str:
    text = repr(value)
    return text if len(text) <= limit else text[: limit - 3] + "..."


def _bytes_of(word: str) -> list[bytes]:
    return [bytes([b]) for b in word.encode("utf-8")]


def _is_pair(value) -> bool:
    return isinstance(value, tuple) and len(value) == 2 and all(isinstance(s, bytes) for s in value)


def _first_difference(got, want) -> int:
    return next((i for i, (a, b) in enumerate(zip(got, want)) if a != b), min(len(got), len(want)))


def _fail_if(exercise: str, problem: str | None) -> None:
    """Raise CheckFailed with `problem`, the message a check's problem function returned, if any."""
    core.require(exercise, not problem, problem)


def _results(exercise, fn, cases, problem, changed=""):
    """fn(*case) for each case, its first argument a copy that must stay as it was (else the
    `changed` message); problem(got, *case) says what is wrong with a result's form, or None."""
    results = []
    for first, *rest in cases:
        given = type(first)(first) if isinstance(first, (list, dict)) else first
        results.append(core.call_learner(exercise, fn, given, *rest))
        if changed and given != first:
            _fail_if(exercise, changed.format(before=_short(first), after=_short(given)))
        _fail_if(exercise, problem(results[-1], first, *rest))
    return results


def _grade(exercise, cases, results, want, mistakes, otherwise, detail, same=operator.eq):
    """Pass when each result is the right one; else name the first planted mistake whose
    fn(*case) gives every result, else fail with otherwise(i), i the first case that differs."""
    if all(map(same, results, want)):
        core.passed(exercise, detail)
        return
    i = next(i for i, (r, w) in enumerate(zip(results, want)) if not same(r, w))
    core.fail_with(
        exercise,
        mistakes,
        lambda m: all(same(r, m.fn(*case)) for r, case in zip(results, cases)),
        otherwise(i),
    )


def _fixed_answers(answers: dict[str, str], messages: dict[str, str]) -> list[core.Mistake]:
    """The planted answers of an exercise whose answer is a text: mistake `name` gives answers[name]."""
    return core.planted(lambda name: lambda: answers[name], messages)


# --------------------------------------------------------------------------- 1.1 byte table

_VISIBLE = {*range(33, 127), *range(161, 173), *range(174, 256)}  # '!'..'~', '¡'..'¬', '®'..'ÿ'
_VISIBLE_IF = {  # the bytes that keep their own character, for the mistakes that get them wrong
    "ascii only": set(range(33, 127)),
    "soft hyphen kept": _VISIBLE | {173},
    "space kept": _VISIBLE | {32},
    "ends left out": _VISIBLE - {126, 172, 255},
}


def _byte_table(*, mistake="") -> dict[int, str]:
    """GPT-2's table; `mistake` plants one of BYTES_MISTAKES by its name."""
    if mistake == "every byte its own character":
        return {b: chr(b) for b in range(256)}
    visible = _VISIBLE_IF.get(mistake, _VISIBLE)
    others = [byte for byte in range(256) if byte not in visible]
    new = {
        "offset by the byte": [256 + b for b in others],
        "one new character": [256] * len(others),
    }
    new_chars = map(chr, new.get(mistake, range(256, 256 + len(others))))
    return {b: chr(b) for b in visible} | dict(zip(others, new_chars))


BYTES_MISTAKES = core.variants(
    _byte_table,
    {
        "every byte its own character": "every byte keeps its own character, so the space stays ' ' and the newline '\\n', which are not visible in a file; only the 188 visible bytes keep theirs, the other 68 get chr(256), chr(257), ... in byte order",
        "offset by the byte": "a byte without a visible character should get the next unused character: chr(256), chr(257), ... one after another; yours gives byte b chr(256 + b), which skips characters (keep a counter of how many new characters you have handed out)",
        "ascii only": "the Latin-1 letters and signs '¡'..'¬' and '®'..'ÿ' (bytes 161-172 and 174-255) are visible characters too and keep their own character; you gave them new ones",
        "soft hyphen kept": "byte 173, the soft hyphen, is invisible: GPT-2 gives it a new character like the other 67, so the second range stops at '¬' (172) and the third starts at '®' (174)",
        "space kept": "byte 32, the space, keeps ' ' in your table, but GPT-2 writes it as a new character (that is the Ġ of 'Ġthe'): the first range starts at '!' (33)",
        "ends left out": "both ends of each range are visible characters ('~', '¬' and 'ÿ' too): range(ord('!'), ord('~')) stops one short; add 1 to each end",
        "one new character": "several bytes map to the same character, so the vocabulary files could not be read back: each byte without a visible character needs its own, chr(256), chr(257), ... (advance the counter after each one)",
    },
)


def _byte_table_symptom(got: dict[int, str]) -> core.Mistake | None:
    """The planted mistake a table shows when it holds several at once: first the visible bytes,
    then the invisible ones kept, then the new characters."""
    wrong_visible = {b for b in _VISIBLE if got[b] != chr(b)}
    kept = {b for b in range(256) if b not in _VISIBLE and got[b] == chr(b)}
    new = [got[b] for b in range(256) if b not in _VISIBLE]
    symptoms = {
        "ends left out": wrong_visible and wrong_visible <= {126, 172, 255},
        "ascii only": wrong_visible and wrong_visible <= set(range(161, 256)),
        "space kept": 32 in kept,
        "soft hyphen kept": 173 in kept,
        "one new character": len(set(got.values())) < 256,
        "offset by the byte": not wrong_visible and new != [chr(256 + k) for k in range(68)],
    }
    return next(
        (core.named(BYTES_MISTAKES, name) for name, shown in symptoms.items() if shown), None
    )


def _table_problem(got, want) -> str | None:
    if not isinstance(got, dict):
        return f"bytes_to_unicode() should return a dict from byte to character, got {type(got).__name__}"
    if set(got) != set(range(256)) or any(type(k) is not int for k in got):
        missing = sorted(set(range(256)) - set(got))
        extra = sorted((k for k in got if type(k) is not int or not 0 <= k < 256), key=repr)
        where = f"byte {missing[0]} is missing" if missing else f"you have {_short(extra)} too"
        return f"the keys should be the 256 ints 0..255; {where}"
    odd = [b for b in range(256) if not (isinstance(got[b], str) and len(got[b]) == 1)]
    if odd:
        return f"every value should be a one-character str; byte {odd[0]} maps to {_short(got[odd[0]])}"
    if got == want:
        return None
    mistake = core.first_mistake(BYTES_MISTAKES, lambda m: m.fn() == got)
    if mistake := mistake or _byte_table_symptom(got):
        return mistake.message
    wrong = [b for b in range(256) if got[b] != want[b]]
    return f"{len(wrong)} bytes map differently from GPT-2's table; the first is byte {wrong[0]}: GPT-2 gives {want[wrong[0]]!r}, yours {got[wrong[0]]!r}"


def check_bytes_to_unicode(bytes_to_unicode) -> None:
    """Exercise 1.1: `bytes_to_unicode()` returns GPT-2's dict byte (int) -> character (str)."""
    got = core.call_learner(EX_BYTES, bytes_to_unicode)
    _fail_if(EX_BYTES, _table_problem(got, tk.bytes_to_unicode()))
    core.passed(EX_BYTES, "all 256 bytes map like GPT-2's table")


def _load(folder, *, mistake=""):
    """What load_gpt2_vocab(folder) returns; `mistake` plants one of LOAD_MISTAKES by its name."""
    byte_of_char = {char: byte for byte, char in tk.bytes_to_unicode().items()}

    def convert(text):
        return text if mistake == "text not bytes" else bytes(byte_of_char[c] for c in text)

    encoder = json.loads((Path(folder) / "encoder.json").read_text(encoding="utf-8"))
    vocab = {
        convert(t): i for t, i in encoder.items() if t != tk.ENDOFTEXT or mistake == "special kept"
    }
    lines = (Path(folder) / "vocab.bpe").read_text(encoding="utf-8").split("\n")
    lines = lines[0 if mistake == "header kept" else 1 :]
    return vocab, [
        tuple(map(convert, line.split(" ")))
        for line in lines
        if line or mistake == "empty line kept"
    ]


LOAD_MISTAKES = core.variants(
    _load,
    {
        "header kept": "your first merge is vocab.bpe's first line, '#version: 0.2', which is a header, not a merge: start from the second line",
        "empty line kept": "your last merge comes from the empty line at the end of vocab.bpe (the file ends with a newline, so split('\\n') gives '' last); skip empty lines",
        "special kept": "<|endoftext|> is in your vocab; it is a special token, not made of bytes, so leave it out (section 5 adds it)",
        "text not bytes": "your tokens are GPT-2's printable characters ('Ġthe'), not bytes: turn each character back into its byte with the inverted table, {char: byte for byte, char in bytes_to_unicode().items()}",
    },
)


def _as_comparable(result):
    """(dict, list of tuples) from what a loader returned, or None if it has another form."""
    if not (isinstance(result, tuple) and len(result) == 2 and isinstance(result[0], dict)):
        return None
    try:
        return dict(result[0]), [tuple(m) for m in result[1]]
    except TypeError:
        return None


def _load_difference(where, got, want) -> str:
    (vocab, merges), (want_vocab, want_merges) = got, want
    if vocab != want_vocab:
        wrong = next(iter(set(vocab.items()) ^ set(want_vocab.items())))
        side = "yours only" if wrong in vocab.items() else "the files only"
        return f"for {where} your vocab differs from the files: {_short(wrong)} is in {side}"
    i = _first_difference(merges, want_merges)
    should = _short(want_merges[i]) if i < len(want_merges) else "absent"
    return f"for {where} merge {i} should be {should}, yours is {_short(merges[i]) if i < len(merges) else 'missing'}"


def check_load_gpt2_vocab(load_gpt2_vocab) -> None:
    """Exercise 1.1: `load_gpt2_vocab(folder)` returns (vocab bytes -> id, merges [(bytes, bytes)])."""
    form = "load_gpt2_vocab should return two things, (vocab, merges): a dict from token bytes to id, and a list of (bytes, bytes) pairs"
    with tempfile.TemporaryDirectory() as scratch:
        tk.BPETokenizer.train(_training_text(), 300, special_tokens=["<|endoftext|>"]).save(scratch)
        folders = {"data/": tk.gpt2_data_dir(), "a small tokenizer's folder": Path(scratch)}
        cases = [(folder,) for folder in folders.values()]
        got = _results(
            EX_LOAD, load_gpt2_vocab, cases, lambda r, f: None if _as_comparable(r) else form
        )
        got = [_as_comparable(r) for r in got]
        want = [bpe.load_gpt2_vocab(folder) for (folder,) in cases]  # (dict, list of tuples) too

        def differs(i):
            return _load_difference(list(folders)[i], got[i], want[i])

        detail = f"GPT-2's {len(want[0][1])} merges and a small tokenizer's files read right"
        _grade(EX_LOAD, cases, got, want, LOAD_MISTAKES, differs, detail)


# --------------------------------------------------------------------------- 1.2 split pattern

SPLIT_SAMPLES = ["x y", "x   y", "a\nb", "Hello  world\n\nNext paragraph.\n"]
SPLIT_SAMPLES += ["def f(x):\n    return x  \n", "trailing spaces   ", "   leading spaces"]
SPLIT_SAMPLES += ["tab\there\t\tand\r\nthere", "I'll say it's 42, isn't it?", "x  \n  y"]


def _pattern(*, mistake="") -> str:
    """GPT-2's split pattern; `mistake` plants one of SPLIT_MISTAKES by its name."""
    four = tk.GPT2_SPLIT_PATTERN.rsplit("|", 2)[0]
    if mistake == "whitespace first":
        return r"\s+(?!\S)|\s+|" + four
    ends = {
        "no whitespace": "",
        "lookahead only": r"|\s+(?!\S)",
        "no lookahead": r"|\s+",
        "single whitespace": r"|\s",
    }
    return four + ends.get(mistake, r"|\s+(?!\S)|\s+")


SPLIT_MISTAKES = core.variants(
    _pattern,
    {
        "no whitespace": "characters are lost: whitespace is matched by none of your alternatives. A tokenizer must keep every character; add alternatives that match whitespace after the four given ones.",
        "lookahead only": "characters are lost: some whitespace is matched but not all. A lookahead alone cannot take a single newline or tab before a word (as in 'a\\nb'); add \\s+ as the last alternative.",
        "whitespace first": "for 'x y' you get ['x', ' ', 'y']: the space before a word became a piece of its own. The regex tries alternatives from left to right, so keep the four given ones first and add the whitespace alternatives after them.",
        "no lookahead": "for 'x   y' you get ['x', '   ', 'y']: the whole run of spaces is one piece, so 'y' loses its leading space and becomes a different token from the ' y' in 'x y'. GPT-2 gives ['x', '  ', ' y']: match whitespace with a negative lookahead, \\s+(?!\\S), before \\s+.",
        "single whitespace": "runs of whitespace are cut into single characters (for 'x  \\n' you get ['x', ' ', ' ', '\\n']); GPT-2 keeps a run together: use \\s+, not \\s.",
    },
)
_SPLIT_PROBES = {  # mistake name -> (probe text, how that mistake splits it)
    "whitespace first": ("x y", ["x", " ", "y"]),
    "no lookahead": ("x   y", ["x", "   ", "y"]),
    "single whitespace": ("x  \n", ["x", " ", " ", "\n"]),
}


def _split_problem(pattern) -> str | None:
    if not isinstance(pattern, str):
        return f"gpt2_split_pattern() should return the pattern as one str, got {type(pattern).__name__}"
    try:
        compiled = regex.compile(pattern)
    except regex.error as exc:
        return f"your pattern is not a valid regular expression: {exc}"
    if compiled.groups:
        return "your pattern has a capturing group ( ... ), so findall returns the group instead of the whole match. Write groups as (?: ... ) or leave them out."
    splits = {text: compiled.findall(text) for text in SPLIT_SAMPLES}
    for text, pieces in splits.items():
        if "" in pieces:
            return f"your pattern matches empty strings (for {text!r}: {pieces}). Every piece must hold at least one character: use + (one or more), not * (zero or more)."
        if "".join(pieces) != text:
            some = any(p.isspace() for ps in splits.values() for p in ps)
            lost = core.named(SPLIT_MISTAKES, "lookahead only" if some else "no whitespace")
            return f"{lost.message} (for {text!r} your pieces {pieces} join to {''.join(pieces)!r})"
    for text, pieces in splits.items():
        if pieces != (expected := regex.findall(tk.GPT2_SPLIT_PATTERN, text)):
            for name, (probe, wrong_pieces) in _SPLIT_PROBES.items():
                if compiled.findall(probe) == wrong_pieces:
                    return core.named(SPLIT_MISTAKES, name).message
            return f"for {text!r} GPT-2's pattern gives {expected} but yours gives {pieces}."
    return None


def check_split_pattern(gpt2_split_pattern) -> None:
    """Exercise 1.2: `gpt2_split_pattern()` returns a regex (str) that splits text like GPT-2's."""
    _fail_if(EX_SPLIT, _split_problem(core.call_learner(EX_SPLIT, gpt2_split_pattern)))
    core.passed(EX_SPLIT, f"your pattern splits all {len(SPLIT_SAMPLES)} samples like GPT-2's")


# --------------------------------------------------------------------------- 1.3 by hand


def _merge_sequence(word: str, ranks, leftmost: bool = False) -> list[tuple[bytes, bytes]]:
    """The pairs merged on `word`, in order: the lowest rank first (GPT-2), or the leftmost pair
    that has a rank (the colleague's rule of Exercise 1.5)."""
    applied = []
    key = (lambda i, rank: i) if leftmost else (lambda i, rank: rank)
    _merge_by(_bytes_of(word), ranks, key, everywhere=False, applied=applied)
    return applied


def _by_hand_problem(got, ranks) -> str | None:
    if not isinstance(got, (list, tuple)) or not all(_is_pair(p) for p in got):
        return f"return a list of pairs of bytes, like [(b'i', b'n'), ...], not {_short(got)}"
    got, want = list(got), _merge_sequence(" lowering", ranks)
    unknown = [p for p in got if p not in ranks]
    if got == want:
        return None
    if unknown:
        return f"{_short(unknown[0])} is not a merge of GPT-2: not in ranks"
    if got == want[: len(got)]:
        return f"right so far, but after your {len(got)} merges a pair with a rank is left"
    if got == _merge_sequence(" lowering", ranks, leftmost=True):
        return "you merged the leftmost pair that has a rank each time; take the pair with the lowest rank among all neighbouring pairs"
    return f"merge {_first_difference(got, want) + 1} is not GPT-2's: at that point, list every neighbouring pair with its rank and take the lowest"


def check_lowering_merges(lowering_merges) -> None:
    """Exercise 1.3: `lowering_merges()` returns the [(bytes, bytes)] GPT-2 merges in " lowering"."""
    ranks = _gpt2_ranks()
    _fail_if(EX_HAND, _by_hand_problem(core.call_learner(EX_HAND, lowering_merges), ranks))
    core.passed(
        EX_HAND,
        f"{len(_merge_sequence(' lowering', ranks))} merges, lowest rank first, until ' lowering' is one token: a rank is the order in which merges were learned, and each assumes the earlier ones",
    )


# --------------------------------------------------------------------------- 1.4 merges by rank


def _merge_adjacent(symbols, should_merge) -> list[bytes]:
    """One pass from left to right that merges each neighbouring pair with should_merge(pair)."""
    out, i = [], 0
    while i < len(symbols):
        n = 2 if i + 1 < len(symbols) and should_merge((symbols[i], symbols[i + 1])) else 1
        out.append(b"".join(symbols[i : i + n]))
        i += n
    return out


def _merge_by(symbols, ranks, key=lambda i, rank: rank, everywhere=True, once=False, applied=None):
    """While a neighbouring pair has a rank, merge the one at the position i with the least
    key(i, rank): at every place that pair occurs (everywhere) or at i only. The defaults are
    GPT-2's rule; once stops after one merge; `applied` collects the merged pairs."""
    symbols = list(symbols)
    while ranked := [i for i, pair in enumerate(zip(symbols, symbols[1:])) if pair in ranks]:
        i = min(ranked, key=lambda i: key(i, ranks[symbols[i], symbols[i + 1]]))
        pair = (symbols[i], symbols[i + 1])
        if applied is not None:
            applied.append(pair)
        if everywhere:
            symbols = _merge_adjacent(symbols, pair.__eq__)
        else:
            symbols[i : i + 2] = [pair[0] + pair[1]]
        if once:
            break
    return symbols


_PICKS = {  # how a planted merge picks its pair: the least key(i, rank), merged everywhere or not
    "highest rank first": (lambda i, rank: -rank, True),
    "leftmost pair": (lambda i, rank: i, True),
    "leftmost pair, one at a time": (lambda i, rank: i, False),
    "rightmost occurrence": (lambda i, rank: (rank, -i), False),
    "unfixed": (lambda i, rank: i, False),
    "rightmost": (lambda i, rank: -i, False),
}


def _merged(symbols, ranks, *, mistake=""):
    """GPT-2's merges by rank; `mistake` plants one of MERGE_MISTAKES or FIXED_MISTAKES by its name."""
    if mistake == "no merges":
        return list(symbols)
    if mistake == "one pass":
        return _merge_adjacent(list(symbols), ranks.__contains__)
    if mistake == "rank 0 is no rank":
        ranks = {p: r for p, r in ranks.items() if r != 0}
    key, everywhere = _PICKS.get(mistake, (lambda i, rank: rank, True))
    return _merge_by(symbols, ranks, key, everywhere=everywhere, once=mistake == "one merge")


MERGE_MISTAKES = core.variants(
    _merged,
    {
        "no merges": "your function returns the symbols without merging anything: merge pairs that have a rank.",
        "one merge": "you stop after the first merge. Keep going: after each merge look at the new neighbouring pairs again, until no pair has a rank.",
        "highest rank first": "you merge the pair with the HIGHEST rank first. The lowest rank (the earliest line of vocab.bpe, learned first) must go first.",
        "leftmost pair": "you merge the leftmost pair that has a rank, not the pair with the LOWEST rank. Merges must follow rank order wherever the pair is in the word.",
        "leftmost pair, one at a time": "you merge the leftmost pair that has a rank, not the pair with the LOWEST rank. Merges must follow rank order wherever the pair is in the word.",
        "rightmost occurrence": "when the lowest-ranked pair occurs more than once, you merge the rightmost occurrence first; merge from left to right (take the first occurrence), as GPT-2 does. In 'aaaaa' the left 'a a' must merge first.",
        "rank 0 is no rank": "the pair with rank 0 is never merged: a test like `if rank:` or `ranks.get(pair) or ...` treats rank 0 as 'no rank'. Test for a missing rank with `pair in ranks` or `is None`.",
        "one pass": "you make one pass over the word, merging ranked pairs as you meet them. Merges must follow rank order, and after each merge new pairs appear: repeat, lowest rank first, until none is left.",
    },
)

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
_GPT2_WORDS = [" lowering", "hello", " tokenization", " internationalization", "aaaaaaa"]
_GPT2_WORDS += [" 👋", "\n\n", " the"]


@functools.lru_cache(maxsize=1)
def _gpt2_ranks() -> dict[tuple[bytes, bytes], int]:
    return {pair: rank for rank, pair in enumerate(tk.load_gpt2_vocab()[1])}


def check_bpe_merge(bpe_merge) -> None:
    """Exercise 1.4: `bpe_merge(symbols: [bytes], ranks: pair -> rank)` returns the merged [bytes]."""
    _check_merge(EX_MERGE, bpe_merge)


def _check_merge(exercise: str, bpe_merge, what="bpe_merge", mistakes=MERGE_MISTAKES) -> None:
    """`bpe_merge(symbols, ranks)` merges like GPT-2 (Exercises 1.4 and 1.5)."""

    def problem(got, symbols, ranks):
        if not isinstance(got, (list, tuple)) or not all(isinstance(s, bytes) for s in got):
            return f"{what} should return a list of bytes objects, got {_short(got)} for {_short(symbols)}"
        if b"".join(got) != b"".join(symbols):
            return f"for {_short(symbols)} you return {_short(list(got))}, which spells different bytes. When you merge a pair, the two halves become one symbol: skip both before looking further."
        return None

    def differs(i):
        return f"for {_short(cases[i][0])} the merges by rank give {_short(want[i])}, but yours gives {_short(got[i])}."

    cases = _TOY_CASES + [(_bytes_of(word), _gpt2_ranks()) for word in _GPT2_WORDS]
    changed = "your function changed the caller's list (it was {before}, afterwards {after}). Work on a copy: start with symbols = list(symbols)."
    got = [list(r) for r in _results(exercise, bpe_merge, cases, problem, changed)]
    want = [tk.bpe_merge(list(symbols), table) for symbols, table in cases]
    _grade(
        exercise,
        cases,
        got,
        want,
        mistakes,
        differs,
        f"{len(cases)} words merged exactly like GPT-2",
    )


# --------------------------------------------------------------------------- 1.5 the colleague's bug


def colleague_merge(symbols: list[bytes], ranks: dict[tuple[bytes, bytes], int]) -> list[bytes]:
    """The encoder of Exercise 1.5: merges the leftmost pair that has any rank (a planted bug)."""
    return _merged(symbols, ranks, mistake="unfixed")


DEBUG_MISTAKES = _fixed_answers(
    {"agrees": " dog", "one byte": "a", "several pieces": "the cat"},
    {
        "agrees": "on that word the colleague's encoder gives GPT-2's tokens: the bug only shows on a word where the order of the merges matters. Compare the ranks of the pairs in a word (`ranks[pair]`) with the order in which the colleague's loop merges them",
        "one byte": "a word of one byte has no pair to merge, so every encoder agrees on it",
        "several pieces": "the tokenizer cuts that text into several pieces and merges each piece on its own; give one piece (one word, with at most one space in front)",
    },
)


def _disagreeing_problem(word) -> str | None:
    if not isinstance(word, str) or not word:
        return f"disagreeing_word() should return a non-empty str, got {_short(word)}"
    if (pieces := regex.findall(tk.GPT2_SPLIT_PATTERN, word)) != [word]:
        return f"{core.named(DEBUG_MISTAKES, 'several pieces').message} ({word!r} splits as {_short(pieces)})"
    if len(symbols := _bytes_of(word)) < 2:
        return core.named(DEBUG_MISTAKES, "one byte").message
    if (right := tk.bpe_merge(symbols, _gpt2_ranks())) == colleague_merge(symbols, _gpt2_ranks()):
        return f"{core.named(DEBUG_MISTAKES, 'agrees').message} (both give {_short(right)})"
    return None


def check_disagreeing_word(disagreeing_word) -> None:
    """Exercise 1.5: `disagreeing_word()` returns a str the colleague and GPT-2 encode differently."""
    word = core.call_learner(EX_DEBUG, disagreeing_word)
    _fail_if(EX_DEBUG, _disagreeing_problem(word))
    symbols = _bytes_of(word)
    core.passed(
        EX_DEBUG,
        f"on {word!r} the colleague's encoder gives {_short(colleague_merge(symbols, _gpt2_ranks()))}, GPT-2's gives {_short(tk.bpe_merge(symbols, _gpt2_ranks()))}: it merges the leftmost pair that has a rank, not the pair of lowest rank",
    )


def check_fixed_merge(fixed_merge) -> None:
    """Exercise 1.5: `fixed_merge(symbols: [bytes], ranks)` returns the [bytes] GPT-2 merges to."""
    _check_merge(EX_DEBUG, fixed_merge, "fixed_merge", FIXED_MISTAKES + MERGE_MISTAKES)


FIXED_MISTAKES = core.variants(
    _merged,
    {
        "unfixed": "fixed_merge still gives the colleague's tokens: it merges the first pair from the left that has a rank. Among all neighbouring pairs, merge the one with the lowest rank",
        "rightmost": "your fix merges the ranked pair furthest to the right; the rank, not the position, decides which pair goes first",
    },
)


# --------------------------------------------------------------------------- 1.6 decode


@functools.lru_cache(maxsize=1)
def _gpt2_token_texts() -> dict[int, str]:
    char_of_byte = tk.bytes_to_unicode()
    texts = {
        i: "".join(char_of_byte[b] for b in token) for token, i in tk.load_gpt2_vocab()[0].items()
    }
    return texts | {tk.ENDOFTEXT_ID: tk.ENDOFTEXT}


def _decode_cases():
    tok = tk.BPETokenizer.gpt2()
    texts = ["Hello world", "  two spaces\n\nand lines\n", "Grüße aus Köln", "I 💙 tokenizers 🤗"]
    cases = [tok.encode(t) for t in texts]
    cases += [tok.encode("one") + [tk.ENDOFTEXT_ID] + tok.encode("two"), []]
    cases.append([tok.vocab[b"a"], tok.vocab[b"\xe4"], tok.vocab[b"\xb8"]])  # 2 of 3 bytes of '世'
    cases.append([tok.vocab[b"\xc3"]])  # the first byte of a two-byte character, alone
    return tok, cases


def _decoded(ids, token_texts, *, mistake="") -> str:
    """The text of `ids`; `mistake` plants one of DECODE_MISTAKES by its name."""
    if mistake == "no byte map":
        return "".join(token_texts[i] for i in ids)
    if mistake == "per token":
        return "".join(_decoded([i], token_texts) for i in ids)
    byte_of = {c: b for b, c in tk.bytes_to_unicode().items()}
    joined = bytes(byte_of[c] for i in ids for c in token_texts[i])
    if mistake == "latin-1":
        return joined.decode("latin-1")
    return joined.decode("utf-8", errors="ignore" if mistake == "errors=ignore" else "replace")


DECODE_MISTAKES = core.variants(
    _decoded,
    {
        "no byte map": "GPT-2's printable stand-ins (like 'Ġ' for a space) are still there. Map each character back to its byte with the inverse of bytes_to_unicode() first.",
        "per token": "you decode each token on its own, so a character whose bytes are spread over two tokens becomes '\\ufffd'. Join the bytes of all tokens first, then decode once.",
        "errors=ignore": "you drop the bytes of an incomplete character; GPT-2's decoder shows them as '\\ufffd' (errors='replace', not 'ignore'), so the reader sees that something is missing.",
        "latin-1": "decode the bytes as UTF-8, not latin-1.",
    },
)


def _decoded_problem(got, ids, want, token_texts) -> str | None:
    if isinstance(got, (bytes, bytearray)):
        return "you return bytes; decode the joined bytes with UTF-8 and return a str."
    if not isinstance(got, str):
        return f"decode_ids should return a str, got {type(got).__name__}"
    if got == want:
        return None
    if mistake := core.first_mistake(DECODE_MISTAKES, lambda m: m.fn(ids, token_texts) == got):
        return f"{mistake.message} (for {ids} you return {got!r}, expected {want!r})"
    return f"for ids {ids} the text is {want!r}, but yours gives {got!r}."


def check_decode_ids(decode_ids) -> None:
    """Exercise 1.6: `decode_ids(ids: [int], token_texts: id -> str)` returns the text (a str)."""
    token_texts = _gpt2_token_texts()
    tok, cases = _decode_cases()
    for ids in cases:
        try:
            got = core.call_learner(EX_DECODE, decode_ids, list(ids), token_texts)
        except UnicodeDecodeError:
            raise core.CheckFailed(
                EX_DECODE,
                f"decoding {ids} raised UnicodeDecodeError: these ids end in the middle of a character. Decode with errors='replace' so the broken bytes become '\\ufffd' instead of an exception.",
            ) from None
        _fail_if(EX_DECODE, _decoded_problem(got, ids, tok.decode(ids), token_texts))
    core.passed(
        EX_DECODE, f"{len(cases)} id lists decoded, including cut characters and <|endoftext|>"
    )


# --------------------------------------------------------------------------- 1.7 a tie

TIE_MISTAKES = _fixed_answers(
    {
        "no tie": "abab",
        "same choice": "xy ab",
        "no pair": "a.b,c",
        "too long": "the quick brown fox jumps over the lazy dog and the cat",
    },
    {
        "no tie": "the most frequent pair of your text occurs more often than every other pair, so there is no tie to decide; make two pairs occur equally often",
        "same choice": "your text has a tie, but both rules pick the same pair: the pair seen first is also the greater one. Put the smaller pair first",
        "no pair": "no piece of your text has two bytes, so there is no pair at all: the pattern cuts letters from punctuation and digits, and a pair only counts inside one piece",
        "too long": "your text is longer than 40 characters; a short one shows the tie better",
    },
)


def _tied_pairs(text: str) -> tuple[Counter, list]:
    """(the pair counts of the text's pieces, in the order first seen; the pairs tied at the top)."""
    counts = _pair_counts({tuple(_bytes_of(p)): n for p, n in tk.pretokenize(text).items()})
    return counts, [pair for pair, n in counts.items() if n == max(counts.values())]


def _tie_problem(text) -> str | None:
    if not isinstance(text, str):
        return f"tie_text() should return a str, got {type(text).__name__}"
    if len(text) > 40:
        return core.named(TIE_MISTAKES, "too long").message
    counts, tied = _tied_pairs(text)
    if not counts:
        return core.named(TIE_MISTAKES, "no pair").message
    if len(tied) < 2:
        return f"{core.named(TIE_MISTAKES, 'no tie').message} ({tied[0]} occurs {counts[tied[0]]} times)"
    if tied[0] == max(tied):
        return f"{core.named(TIE_MISTAKES, 'same choice').message} (tied: {_short(tied)})"
    return None


def check_tie_text(tie_text) -> None:
    """Exercise 1.7: `tie_text()` returns a short str on which the two tie rules pick different pairs."""
    text = core.call_learner(EX_TIE, tie_text)
    _fail_if(EX_TIE, _tie_problem(text))
    counts, tied = _tied_pairs(text)
    core.passed(
        EX_TIE,
        f"{len(tied)} pairs tie at {counts[tied[0]]}: first seen picks {tied[0]}, the greater pair picks {max(tied)}",
    )


# --------------------------------------------------------------------------- 1.8 most frequent pair


def _pair_counts(word_counts, *, mistake="") -> Counter:
    """How often each pair occurs; `mistake` plants one of PAIR_MISTAKES: its wrong scores."""
    counts = Counter()
    for word, n in word_counts.items():
        pairs = list(zip(word, word[1:]))[: -1 if mistake == "skips the last pair" else None]
        for pair in dict.fromkeys(pairs) if mistake == "once per word" else pairs:
            counts[pair] += 1 if mistake == "unweighted" else n
    if mistake == "least frequent":
        return Counter({p: -c for p, c in counts.items()})
    return counts


PAIR_MISTAKES = core.variants(
    _pair_counts,
    {
        "skips the last pair": "your loop stops one pair early: the last pair of each word is never counted (a word of n symbols has n - 1 pairs, at positions 0 to n - 2; zip(word, word[1:]) gives them all).",
        "unweighted": "you count each word once. A word that occurs 5 times adds 5 to each of its pairs: multiply by the word's count from word_counts.",
        "once per word": "a pair that appears twice inside one word counts twice (like (b'a', b'a') in b'aaaa', three times); you count it once per word.",
        "least frequent": "you return the LEAST frequent pair; return the most frequent one.",
    },
)


def _training_word_counts() -> dict[tuple[bytes, ...], int]:
    text = "the cat sat on the mat; the dog sat on the log. then the cat and the dog ate. "
    text += "that is that, and this is this. these things happen."
    return {tuple(_bytes_of(p)): n for p, n in tk.pretokenize(text).items()}


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


def _pair_form(got, word_counts) -> str | None:
    if not _is_pair(got):
        return f"return the pair as a tuple of two bytes objects, like (b'a', b'b'); you returned {_short(got)}"
    if got not in _pair_counts(word_counts):
        return f"{got} is not a pair of neighbouring symbols in any word of {_short(word_counts)}"
    return None


def _no_pair_problem(most_frequent_pair, word_counts) -> str | None:
    when = f"when no word has two symbols left (word_counts={word_counts}) return None"
    try:
        got = core.call_learner(EX_PAIR, most_frequent_pair, dict(word_counts))
    except core.CheckFailed:
        raise
    except Exception as exc:
        return f"{when}; your function raised {type(exc).__name__}: {exc}"
    return None if got is None else f"{when}, not {_short(got)}"


def check_most_frequent_pair(most_frequent_pair) -> None:
    """Exercise 1.8: `most_frequent_pair(word_counts)` returns a top pair (bytes, bytes) or None."""
    cases = [(wc,) for wc in [*_PAIR_CASES, _training_word_counts()]]
    answers = _results(EX_PAIR, most_frequent_pair, cases, _pair_form)
    for (word_counts,), got in zip(cases, answers):
        if not _is_best(got, counts := _pair_counts(word_counts)):
            best = max(counts, key=counts.__getitem__)
            where = f" (words: {_short(word_counts)}; you returned {got})"
            core.fail_with(
                EX_PAIR,
                PAIR_MISTAKES,
                lambda m: all(_is_best(g, m.fn(*c)) for c, g in zip(cases, answers)),
                f"{got} occurs {counts[got]} times, but {best} occurs {counts[best]} times.{where}",
                suffix=where,
            )
    for empty in ({(b"a",): 3, (b"b",): 1}, {}):
        _fail_if(EX_PAIR, _no_pair_problem(most_frequent_pair, empty))
    core.passed(EX_PAIR, f"{len(cases)} word counts, plus the case with no pairs left")


# --------------------------------------------------------------------------- 1.8 merge a pair


def _merge_word(word, pair, mistake="") -> tuple[bytes, ...]:
    """`word` with `pair` merged at every occurrence from the left, or as `mistake` merges it."""
    if mistake == "from the right":  # merge the mirror image, and mirror the result back
        mirror = tuple(s[::-1] for s in reversed(word))
        return tuple(s[::-1] for s in reversed(_merge_word(mirror, (pair[1][::-1], pair[0][::-1]))))
    pairs = list(zip(word, word[1:]))
    if mistake != "first occurrence only" or pair not in pairs:
        return tuple(_merge_adjacent(list(word), pair.__eq__))
    i = pairs.index(pair)
    return (*word[:i], pair[0] + pair[1], *word[i + 2 :])


def _merge_all_words(word_counts, pair, *, mistake=""):
    """merge_pair's answer; `mistake` plants one of MERGE_PAIR_MISTAKES by its name."""
    if mistake == "nothing merged":
        return dict(word_counts)
    merged = {}
    for word, count in word_counts.items():
        key = _merge_word(word, pair, mistake)
        merged[key] = count if mistake == "counts overwritten" else merged.get(key, 0) + count
    return merged


MERGE_PAIR_MISTAKES = core.variants(
    _merge_all_words,
    {
        "nothing merged": "your result still holds the words unmerged: replace every occurrence of the pair by the one symbol first + second.",
        "counts overwritten": "two words that become the same word after the merge must add their counts; you keep only one of them (merged[key] = count overwrites: use merged.get(key, 0) + count).",
        "first occurrence only": "you merge only the first occurrence of the pair in each word; merge every occurrence, from left to right.",
        "from the right": "you merge from right to left: (a, a, a) on (a, a) must give (aa, a), not (a, aa). Walk through each word from the left.",
    },
)

_MERGE_PAIR_CASES = [
    ({(b"a", b"b", b"c"): 2, (b"x", b"a", b"b"): 1, (b"b", b"a"): 4}, (b"a", b"b")),
    ({(b"a", b"a", b"a"): 3, (b"a", b"a", b"a", b"a", b"a"): 1, (b"a",): 7}, (b"a", b"a")),
    # two words become one: (ab, c) and (a, b, c)
    ({(b"ab", b"c"): 3, (b"a", b"b", b"c"): 2, (b"c", b"a", b"b", b"a", b"b"): 1}, (b"a", b"b")),
    ({(b" ", b"th", b"e"): 5, (b"th", b"e", b"th", b"e"): 1, (b"t", b"h", b"e"): 2}, (b"th", b"e")),
    ({}, (b"a", b"b")),
]


def _merge_pair_form(got, word_counts, pair) -> str | None:
    if not isinstance(got, dict):
        return f"merge_pair should return a dict of word -> count, got {type(got).__name__}"
    odd = [w for w in got if not (isinstance(w, tuple) and all(isinstance(s, bytes) for s in w))]
    if odd:
        return f"each word must stay a tuple of bytes symbols; you have {_short(odd[0])}"
    if sum(got.values()) != sum(word_counts.values()):
        return f"the counts add up to {sum(got.values())} instead of {sum(word_counts.values())}: two words that become the same word must add their counts (merged.get(key, 0) + count), never overwrite or drop one (words: {_short(word_counts)}, pair {pair})"
    spelled = {b"".join(w) for w in word_counts}
    for word in got:
        if b"".join(word) not in spelled:
            return f"{_short(word)} spells bytes that no input word spells: after a merge, skip both halves before looking at the next pair, and join them as first + second."
    return None


def check_merge_pair(merge_pair) -> None:
    """Exercise 1.8: `merge_pair(word_counts, pair)` returns a new dict with the pair merged."""
    cases = _MERGE_PAIR_CASES
    changed = "your function changed the caller's dict; build a new dict and return it."
    got = _results(EX_MERGE_PAIR, merge_pair, cases, _merge_pair_form, changed)
    want = [tk.merge_pair(dict(word_counts), pair) for word_counts, pair in cases]

    def differs(i):
        return f"merging {cases[i][1]} in {_short(cases[i][0])} gives {_short(want[i])}, but yours gives {_short(got[i])}."

    detail = f"{len(cases)} word tables merged, including words that become one"
    _grade(EX_MERGE_PAIR, cases, got, want, MERGE_PAIR_MISTAKES, differs, detail)


# --------------------------------------------------------------------------- 1.9 training loop


def _loop(word_counts, num_merges, *, mistake=""):
    """The merges train_merges learns; `mistake` plants one of TRAIN_MISTAKES by its name."""
    merges = []
    for _ in range(num_merges + {"one too few": -1, "one too many": 1}.get(mistake, 0)):
        pair = tk.most_frequent_pair(word_counts)
        if pair is None and mistake != "no stop":
            break
        merges.append(pair)
        if mistake != "merge not applied":
            word_counts = tk.merge_pair(word_counts, pair)
    return merges


TRAIN_MISTAKES = core.variants(
    _loop,
    {
        "merge not applied": "you record the pair but the words never change, so the same pair wins every time: keep the merged words, word_counts = merge_pair(word_counts, pair).",
        "one too few": "you learn one merge too few: the loop must run num_merges times (range(num_merges)).",
        "one too many": "you learn one merge too many: the loop must run num_merges times (range(num_merges)).",
        "no stop": "when no pair is left, most_frequent_pair returns None: stop there instead of recording None as a merge.",
    },
)


def _train_cases():
    low = {(b"l", b"o", b"w"): 5, (b"l", b"o", b"w", b"e", b"r"): 2}
    newest = {(b"n", b"e", b"w", b"e", b"s", b"t"): 6, (b"w", b"i", b"d", b"e", b"s", b"t"): 3}
    return [
        (_training_word_counts(), 12),
        ({(b"a", b"b"): 3, (b"a", b"b", b"c"): 2, (b"x", b"y"): 1}, 10),  # no pair after 3 merges
        ({**low, **newest}, 6),
        ({(b"z",): 4}, 3),
    ]


def _replay_problem(word_counts, num_merges, merges) -> str | None:
    """Why `merges` is not a valid run of BPE training, or None. Any tied pair is accepted."""
    for step, pair in enumerate(merges):
        counts = _pair_counts(word_counts)
        if step >= num_merges:
            return f"you return {len(merges)} merges; num_merges={num_merges} asks for at most {num_merges}"
        if not counts:
            return f"merge {step} is {_short(pair)}, but no pair is left by then: stop when most_frequent_pair returns None"
        if not _is_best(pair, counts):
            best = max(counts, key=counts.__getitem__)
            return f"merge {step} is {_short(pair)}, which occurs {counts.get(pair, 0)} times then; the most frequent pair occurs {counts[best]} times, for example {best}"
        word_counts = tk.merge_pair(word_counts, pair)
    if len(merges) < num_merges and _pair_counts(word_counts):
        return f"you return {len(merges)} merges, but num_merges={num_merges} and pairs are still left: keep going until num_merges merges are learned"
    return None


def _merges_form(got, word_counts, num_merges) -> str | None:
    if not isinstance(got, (list, tuple)):
        return f"train_merges should return a list of pairs, got {type(got).__name__}"
    return None


def check_train_merges(train_merges) -> None:
    """Exercise 1.9: `train_merges(word_counts, num_merges)` returns the learned [(bytes, bytes)]."""
    cases = _train_cases()
    try:
        results = [list(r) for r in _results(EX_TRAIN, train_merges, cases, _merges_form)]
    except TypeError as exc:  # merge_pair(word_counts, None): the loop went on without a pair
        if "NoneType" not in str(exc):
            raise
        suffix = f" (your code raised TypeError: {exc})"
        raise core.named_failure(EX_TRAIN, TRAIN_MISTAKES, "no stop", suffix=suffix) from None
    problems = [_replay_problem(dict(wc), n, got) for (wc, n), got in zip(cases, results)]
    if any(problems):
        odd = [pair for got in results for pair in got if not _is_pair(pair)]
        (word_counts, _), problem = next((case, p) for case, p in zip(cases, problems) if p)
        otherwise = f"{problem} (words: {_short(word_counts)})"
        if odd:
            otherwise = f"each merge should be a pair (bytes, bytes), like (b't', b'h'); you have {_short(odd[0])}"
        core.fail_with(
            EX_TRAIN,
            TRAIN_MISTAKES,
            lambda m: all(got == m.fn(*case) for got, case in zip(results, cases)),
            otherwise,
        )
    core.passed(
        EX_TRAIN,
        f"{len(cases)} trainings, each merge a most frequent pair, stopping when none is left",
    )


# --------------------------------------------------------------------------- 1.10 bytes per token


def _ratio(tokenizer, text, *, mistake=""):
    """UTF-8 bytes of `text` per token; `mistake` plants one of RATIO_MISTAKES by its name."""
    ids = tokenizer.encode(text)
    size = len(text) if mistake == "characters" else len(text.encode("utf-8"))
    count = len(set(ids)) if mistake == "distinct tokens" else len(ids)
    if mistake == "inverted":
        return count / size
    return size // count if mistake == "integer division" else size / count


RATIO_MISTAKES = core.variants(
    _ratio,
    {
        "characters": "you count characters, not bytes: len(text) counts 'ü' or '世' once, but their UTF-8 takes 2 and 3 bytes; count len(text.encode('utf-8'))",
        "inverted": "your number is tokens per byte, the inverse: divide the bytes by the tokens",
        "integer division": "you divide with //, which drops the fraction (3.7 bytes per token becomes 3); use /",
        "distinct tokens": "you count distinct token ids; every token costs a position in the window, repeats included",
    },
)


@functools.lru_cache(maxsize=1)
def _training_text() -> str:
    return (tk.gpt2_data_dir() / "bpe_training_text.txt").read_text(encoding="utf-8")


def _ratio_cases():
    texts = ["The keeper of the harbour light, the keeper.", "Grüße aus Köln! 世界 🤗"]
    texts.append("naïve café au lait")
    small = tk.BPETokenizer.train(_training_text(), 300)
    return [(tokenizer, text) for tokenizer in (tk.get_encoding(), small) for text in texts]


def _number_form(got, tokenizer, text) -> str | None:
    if isinstance(got, bool) or not isinstance(got, (int, float)):
        return f"bytes_per_token should return a number (a float), got {_short(got)}"
    return None


def _near(a, b) -> bool:
    return abs(a - b) < 1e-9


def check_bytes_per_token(bytes_per_token) -> None:
    """Exercise 1.10: `bytes_per_token(tokenizer, text)` returns UTF-8 bytes per token (a float)."""
    cases = _ratio_cases()
    got = [float(r) for r in _results(EX_RATIO, bytes_per_token, cases, _number_form)]
    want = [_ratio(tokenizer, text) for tokenizer, text in cases]

    def differs(i):
        return f"for {cases[i][1]!r} you give {got[i]:.4f} bytes per token; it is {want[i]:.4f}"

    detail = f"{len(cases)} texts and two tokenizers measured right"
    _grade(EX_RATIO, cases, got, want, RATIO_MISTAKES, differs, detail, same=_near)


# --------------------------------------------------------------------------- 1.10 the measurement


def _sweep(train_text, test_text, sizes, *, mistake=""):
    """(bytes per token on test_text of BPEs trained with each size, GPT-2's); `mistake` plants
    one of SWEEP_MISTAKES by its name."""
    measured = train_text if mistake == "measured_on_training_text" else test_text
    trained_on = test_text if mistake == "trained_on_held_out" else train_text
    gpt2_on = train_text if mistake == "gpt2_on_training_text" else test_text
    trained = [tk.BPETokenizer.train(trained_on, vocab_size=n) for n in sizes]
    return [_ratio(t, measured) for t in trained], _ratio(tk.get_encoding(), gpt2_on)


SWEEP_MISTAKES = core.variants(
    _sweep,
    {
        "measured_on_training_text": "your tokenizers were measured on the text they were trained on; measure them on held_out, text they have not seen (a tokenizer fits its own training text best)",
        "trained_on_held_out": "your tokenizers were trained on held_out, the text they are measured on; train them on train_part",
        "gpt2_on_training_text": "your GPT-2 number is measured on train_part; measure it on held_out, like the others, or the comparison mixes two texts",
    },
)


def check_vocabulary_sweep(sizes, ratios, gpt2_ratio, train_text, test_text) -> None:
    """Exercise 1.10's measurement: `ratios` (one per size) and `gpt2_ratio`, bytes per token on test_text."""
    try:
        got = [*map(float, ratios), float(gpt2_ratio)]
    except (TypeError, ValueError):
        raise core.CheckFailed(
            EX_SWEEP, "ratios should be a list of numbers, one per size, and gpt2_ratio a number"
        ) from None
    core.require(
        EX_SWEEP,
        len(got) == len(sizes) + 1,
        f"ratios holds {len(got) - 1} numbers; give one per size in sizes ({len(sizes)})",
    )

    def same(sweep):
        return all(map(_near, got, [*sweep[0], sweep[1]]))

    if not same(_sweep(train_text, test_text, sizes)):
        core.fail_with(
            EX_SWEEP,
            SWEEP_MISTAKES,
            lambda m: same(m.fn(train_text, test_text, sizes)),
            "your numbers are not the bytes per token on held_out of tokenizers trained on train_part (BPETokenizer.train(train_part, vocab_size=n)) and of GPT-2 (get_encoding())",
        )
    core.passed(EX_SWEEP, f"{len(sizes)} vocabulary sizes and GPT-2, measured on the held-out text")


# --------------------------------------------------------------------------- challenge: fast training


def _seconds(fn, *args, repeats: int = 2) -> tuple[float, object]:
    """The best wall time of `repeats` calls of fn(*args), and the result of the last call."""
    best, result = float("inf"), None
    for _ in range(repeats):
        start = time.perf_counter()
        result = fn(*args)
        best = min(best, time.perf_counter() - start)
    return best, result


def _train(text, vocab_size, *, mistake=""):
    """train_merges_simple's (vocab, merges); `mistake` plants one of FAST_MISTAKES by its name."""
    words = {tuple(_bytes_of(piece)): n for piece, n in tk.pretokenize(text).items()}
    vocab, merges = {bytes([b]): b for b in range(256)}, []
    while len(vocab) < vocab_size and (counts := _pair_counts(words)):
        first_seen = mistake == "other tie rule"  # max gives the first of the pairs that tie
        pair = max(counts, key=counts.__getitem__ if first_seen else lambda p: (counts[p], p))
        merges.append(pair)
        vocab.setdefault(pair[0] + pair[1], len(vocab))
        words = tk.merge_pair(words, pair)
    return merges if mistake == "merges only" else (vocab, merges)


FAST_MISTAKES = core.variants(
    _train,
    {
        "other tie rule": "the merges are not the reference's: on a tie the reference takes the greater pair, max(counts, key=lambda pair: (counts[pair], pair))",
        "merges only": "fast_train should return (vocab, merges) like train_merges_simple, not only the merges",
    },
)


@functools.lru_cache(maxsize=2)
def _shakespeare(n_chars: int) -> str:
    return (tk.gpt2_data_dir() / "tinyshakespeare.txt").read_text(encoding="utf-8")[:n_chars]


def _fast_problem(got, text, vocab_size, vocab, merges) -> str | None:
    if not (isinstance(got, tuple) and len(got) == 2 and isinstance(got[0], dict)):
        return f"{core.named(FAST_MISTAKES, 'merges only').message} (got {type(got).__name__})"
    got_merges = [tuple(m) for m in got[1]]
    if got_merges != merges:
        i = _first_difference(got_merges, merges)
        detail = f"you learn {len(got_merges)} merges, the reference {len(merges)}"
        if i < min(len(got_merges), len(merges)):
            detail = f"merge {i} is {got_merges[i]}, the reference learns {merges[i]}"
        tie = core.named(FAST_MISTAKES, "other tie rule")
        same_as_tie = tie.fn(text, vocab_size)[1] == got_merges
        hint = (
            tie.message if same_as_tie else "the merges must be the reference's, in the same order"
        )
        return f"{hint} ({detail})"
    if dict(got[0]) != vocab:
        return "the merges are right but the vocabulary is not: ids 0-255 are the bytes, and each new token takes the next free id (a token spelled twice keeps its first)"
    return None


def check_fast_training(
    fast_train, n_chars: int = 20_000, vocab_size: int = 512, goal: float = 2.0
) -> float:
    """Challenge: `fast_train(text, vocab_size)` returns (vocab, merges), `goal` times as fast; returns the speedup."""
    text = _shakespeare(n_chars)
    core.call_learner(CH_FAST, fast_train, text[:100], 260)  # the stub and a wrong signature first
    yours_s, got = _seconds(fast_train, text, vocab_size)
    reference_s, (vocab, merges) = _seconds(bpe.train_merges_simple, text, vocab_size)
    _fail_if(CH_FAST, _fast_problem(got, text, vocab_size, vocab, merges))
    speedup = reference_s / max(yours_s, 1e-9)
    timing = f"{yours_s:.3f} s against the reference's {reference_s:.3f} s, on this machine"
    core.require(
        CH_FAST,
        speedup >= goal,
        f"the same {len(merges)} merges, but only {speedup:.2f} times as fast as the reference ({timing}); the goal is {goal:g} times",
    )
    core.passed(CH_FAST, f"the same {len(merges)} merges, {speedup:.1f} times as fast ({timing})")
    return speedup


MISTAKES_BY_CHECK = {
    check_bytes_to_unicode: BYTES_MISTAKES,
    check_load_gpt2_vocab: LOAD_MISTAKES,
    check_fixed_merge: FIXED_MISTAKES,
    check_disagreeing_word: DEBUG_MISTAKES,
    check_tie_text: TIE_MISTAKES,
    check_bytes_per_token: RATIO_MISTAKES,
    check_fast_training: FAST_MISTAKES,
}
