"""GPT-2's tokenizer as the package exposes it: the hand-written entry point around chapter 1.

    from gpt2lib.tokenizer import BPETokenizer, get_encoding
    tok = BPETokenizer.gpt2()          # GPT-2's tokenizer, from data/encoder.json + vocab.bpe
    ids = tok.encode("Hello world")    # [15496, 995], the same ids as tiktoken
    tok.decode(ids)                    # 'Hello world'
    ids = list(tok.encode_iterable(open("book.txt", encoding="utf-8")))  # streaming, bounded memory
    small = BPETokenizer.train(text, vocab_size=500, special_tokens=["<|endoftext|>"])
    small.save("my_tokenizer/")        # GPT-2's own format: encoder.json + vocab.bpe
    BPETokenizer.load("my_tokenizer/")
    get_encoding().encode("Hello world")  # the same ids from tiktoken, without network access

The algorithm is the one the learner writes in chapter 1, generated into `gpt2lib.bpe`
(`bytes_to_unicode`, `GPT2_SPLIT_PATTERN`, `bpe_merge`, `most_frequent_pair`, `merge_pair`,
`pretokenize`, `train_merges_simple`, and the plain `gpt2lib.bpe.BPETokenizer`). This module is
written by hand and adds what a tool needs and a lesson does not, at the public entry points:

- checks on input with clear errors (`BPETokenizer(...)`, `train`, `encode`, `decode`, the files);
- the refusal of special-token text that the caller did not allow (as tiktoken does);
- a word cache, and a heap merge for long pieces (`bpe_merge_fast`), same ids as `bpe_merge`;
- an incremental trainer (`train_bpe`), same merges as `train_merges_simple`;
- a streaming encoder (`encode_iterable`);
- GPT-2's file format both ways (`save`, `load`, `from_vocab_and_merges`);
- `get_encoding()`: tiktoken's Rust encoder built from data/, without network access.

Rules, shared by the teaching functions and the fast paths:
- encoding merges the pair with the lowest rank first, its leftmost occurrence first;
- training merges the most frequent pair; on a tie, the lexicographically greater pair of byte
  strings (Stanford CS336's rule); it never merges across a special token;
- ids of a trained tokenizer: 0-255 are the bytes, then one id per new token in training order,
  then the special tokens in the order given (GPT-2's own files number the bytes differently).
"""

from __future__ import annotations

import functools
import heapq
import json
import operator
import os
import warnings
from collections import Counter, defaultdict
from collections.abc import Iterable, Iterator
from itertools import chain
from pathlib import Path
from typing import TYPE_CHECKING

import regex  # not `re`: GPT-2's pattern needs the Unicode classes \p{L} and \p{N}

from gpt2lib.chapters import bpe
from gpt2lib.chapters.bpe import (
    GPT2_SPLIT_PATTERN,
    bpe_merge,
    bytes_to_unicode,
    gpt2_data_dir,
    merge_pair,
    most_frequent_pair,
    pretokenize,
    train_merges_simple,
)
from gpt2lib.files import folder_lock, json_object, recover_saves, save_files, stale_saves
from gpt2lib.validation import ENDOFTEXT, ENDOFTEXT_ID, check_path, check_whole

if TYPE_CHECKING:  # get_encoding imports tiktoken when called, not at import time
    import tiktoken

__all__ = [
    "BPETokenizer",
    "ENDOFTEXT",
    "ENDOFTEXT_ID",
    "GPT2_SPLIT_PATTERN",
    "bpe_merge",
    "bpe_merge_fast",
    "bytes_to_unicode",
    "get_encoding",
    "gpt2_data_dir",
    "load_gpt2_vocab",
    "merge_pair",
    "most_frequent_pair",
    "pretokenize",
    "read_gpt2_files",
    "save_gpt2_files",
    "train_bpe",
    "train_merges_simple",
]

# --------------------------------------------------------------------------- GPT-2's files

ENCODER_FILE, MERGES_FILE = "encoder.json", "vocab.bpe"


def _bpe_file_paths(folder: Path, fix: str) -> tuple[Path, Path]:
    """The paths of encoder.json and vocab.bpe in `folder`; FileNotFoundError naming the missing
    ones, and `fix` (what to do), if either is not there."""
    encoder_path, merges_path = folder / ENCODER_FILE, folder / MERGES_FILE
    missing = [path.name for path in (encoder_path, merges_path) if not path.is_file()]
    if missing:
        raise FileNotFoundError(f"{folder} lacks {', '.join(missing)}: {fix}")
    return encoder_path, merges_path


@functools.lru_cache(maxsize=4)
def load_gpt2_vocab(
    folder: str | Path | None = None,
) -> tuple[dict[bytes, int], list[tuple[bytes, bytes]]]:
    """`gpt2lib.bpe.load_gpt2_vocab`, cached, with a clear error when a file is missing.

    (token bytes -> id, merges as byte pairs in rank order); the special token <|endoftext|> is
    left out of the vocabulary. Treat the result as read-only: it is cached and shared.
    """
    folder = gpt2_data_dir() if folder is None else Path(folder)
    _bpe_file_paths(
        folder,
        "GPT-2's files ship in the course repository's data/ folder; install the course from "
        "a clone (pip install -e .) or pass folder=... pointing at a folder with both",
    )
    return bpe.load_gpt2_vocab(folder)


def _utf8(piece: str) -> bytes:
    """The UTF-8 bytes of a piece. A lone surrogate (half of a UTF-16 pair) has no UTF-8 form;
    like tiktoken, encoding and training read it as the replacement character U+FFFD."""
    try:
        return piece.encode("utf-8")
    except UnicodeEncodeError:
        return piece.encode("utf-16", "surrogatepass").decode("utf-16", "replace").encode("utf-8")


# --------------------------------------------------------------------------- the tokenizer


class BPETokenizer(bpe.BPETokenizer):
    """Chapter 1's `gpt2lib.bpe.BPETokenizer`, hardened for use: the same ids, plus checks on
    input, a word cache, a heap merge for long pieces, a fast trainer, streaming and files.

    `BPETokenizer.gpt2()` loads GPT-2's vocabulary and gives the same ids as tiktoken's
    "gpt2" encoding; `BPETokenizer.train(text, vocab_size)` learns a new one.
    """

    # Pieces longer than this many bytes are merged with the heap (`bpe_merge_fast`), the rest
    # with the simple loop, which is faster on short words.
    fast_merge_from = 48

    def __init__(
        self,
        vocab: dict[bytes, int],
        merges: list[tuple[bytes, bytes]],
        special_tokens: dict[str, int] | None = None,
        pattern: str = GPT2_SPLIT_PATTERN,
        cache_limit: int = 100_000,
    ):
        # Every check runs before anything is stored: a refused vocabulary leaves nothing behind.
        checked = _check_vocabulary(dict(vocab), list(merges), dict(special_tokens or {}))
        super().__init__(vocab, merges, special_tokens=special_tokens, pattern=pattern)
        self.bytes_of_id = self._bytes_of_id = checked  # id -> bytes
        self.cache_limit = cache_limit
        self._splitter = regex.compile(pattern)
        self._single_bytes = [bytes([b]) for b in range(256)]
        self._cache: dict[str, tuple[int, ...]] = {}

    @classmethod
    def gpt2(cls, folder: str | Path | None = None) -> BPETokenizer:
        """GPT-2's tokenizer, from encoder.json and vocab.bpe in `folder` (default: the repo's data/)."""
        vocab, merges = load_gpt2_vocab(folder)
        return cls(vocab, merges, special_tokens={ENDOFTEXT: ENDOFTEXT_ID})

    @classmethod
    def train(
        cls,
        text: str,
        vocab_size: int,
        special_tokens: Iterable[str] = (),
        pattern: str = GPT2_SPLIT_PATTERN,
    ) -> BPETokenizer:
        """Learn a tokenizer with `vocab_size` ids in all: 256 bytes, merges, then the special tokens.

        The text is cut on the special tokens before it is split, so no merge crosses one.
        """
        specials = _check_special_token_list(special_tokens)
        if isinstance(vocab_size, bool) or not isinstance(vocab_size, int):
            raise TypeError(f"vocab_size must be an int, got {type(vocab_size).__name__}")
        if vocab_size < 256 + len(specials):
            raise ValueError(
                f"vocab_size must be at least 256 + {len(specials)} (one token per byte plus the "
                f"{len(specials)} special tokens), got {vocab_size}"
            )
        vocab, merges = train_bpe(
            text, vocab_size - len(specials), pattern, special_tokens=specials
        )
        first_free = max(vocab.values()) + 1
        special_ids = {name: first_free + i for i, name in enumerate(specials)}
        return cls(vocab, merges, special_tokens=special_ids, pattern=pattern)

    def __repr__(self) -> str:
        return f"BPETokenizer(n_vocab={self.n_vocab}, merges={len(self.merges)}, special_tokens={sorted(self.special_tokens)})"

    # ----------------------------------------------------------------- encoding

    def encode_ordinary(self, text: str) -> list[int]:
        """Ids for `text`, treating special-token text like any other text."""
        if not isinstance(text, str):
            raise TypeError(f"encode takes a str, got {type(text).__name__}")
        return self._encode_pieces(self._splitter.findall(text))

    def _encode_pieces(self, pieces: list[str]) -> list[int]:
        # The cache may be shared by threads, which may empty it at any time: each piece's ids
        # are read from it once, into this call's own table, and the ids come from that table.
        cache, table = self._cache, {}
        for piece in set(pieces):  # BPE runs once per distinct new piece
            ids = cache.get(piece)
            if ids is None:
                ids = self._encode_piece(piece)
                if len(cache) >= self.cache_limit:
                    cache.clear()  # memory stays bounded
                cache[piece] = ids
            table[piece] = ids
        return list(chain.from_iterable(map(table.__getitem__, pieces)))

    def _encode_piece(self, piece: str) -> tuple[int, ...]:
        data = _utf8(piece)
        merge = bpe_merge if len(data) < self.fast_merge_from else bpe_merge_fast
        tokens = merge(list(map(self._single_bytes.__getitem__, data)), self.ranks)
        return tuple(map(self.vocab.__getitem__, tokens))

    def encode(self, text: str, allowed_special=frozenset(), disallowed_special="all") -> list[int]:
        """Ids for `text`.

        allowed_special: "all", or a set of special tokens (like {"<|endoftext|>"}) that are
            encoded as their special id when they appear in the text. Default: none.
        disallowed_special: "all" (every special token not allowed) or a set; text containing one
            of them raises ValueError. Pass () to encode such text as ordinary characters.
        """
        if not isinstance(text, str):
            raise TypeError(f"encode takes a str, got {type(text).__name__}")
        allowed, disallowed = self._special_sets(allowed_special, disallowed_special)
        _refuse_disallowed_special(text, disallowed)
        if not allowed:
            return self.encode_ordinary(text)
        ids: list[int] = []
        start = 0
        for match in _special_token_regex(allowed).finditer(text):
            ids.extend(self.encode_ordinary(text[start : match.start()]))
            ids.append(self.special_tokens[match.group()])
            start = match.end()
        ids.extend(self.encode_ordinary(text[start:]))
        return ids

    def encode_iterable(
        self, chunks: Iterable[str], allowed_special=frozenset(), disallowed_special="all"
    ) -> Iterator[int]:
        """Yield the ids of the joined `chunks` (for example the lines of an open file), holding
        only a few pieces at a time; the ids are exactly those of `encode("".join(chunks))`."""
        allowed, disallowed = self._special_sets(allowed_special, disallowed_special)
        return _encode_stream(self, chunks, allowed, disallowed)

    def _special_sets(self, allowed_special, disallowed_special) -> tuple[set[str], set[str]]:
        allowed = _special_set(self.special_tokens, allowed_special, "allowed_special")
        if isinstance(disallowed_special, str) and disallowed_special == "all":
            return allowed, set(self.special_tokens) - allowed
        return allowed, _special_set(
            self.special_tokens, disallowed_special, "disallowed_special", known_only=False
        )

    # ----------------------------------------------------------------- decoding

    def decode_single_token_bytes(self, token_id: int) -> bytes:
        """The bytes of one token (special tokens give their text as UTF-8); tiktoken's name."""
        return _lookup_token(self._bytes_of_id, token_id, position=None)

    def decode_bytes(self, ids: Iterable[int]) -> bytes:
        """The bytes of all tokens, joined."""
        if isinstance(ids, (str, bytes)) or not isinstance(ids, Iterable):
            raise TypeError(
                f"decode takes a sequence of token ids (for example a list of ints), got {type(ids).__name__}"
            )
        table = self._bytes_of_id
        pieces = []
        for position, token_id in enumerate(ids):
            # Fast path for plain ints; anything else (bools, floats, numpy or torch
            # integers, out-of-range ids) goes through the careful lookup.
            piece = table.get(token_id) if type(token_id) is int else None
            pieces.append(piece if piece is not None else _lookup_token(table, token_id, position))
        return b"".join(pieces)

    def decode(self, ids: Iterable[int]) -> str:
        """Text for `ids`. Bytes that end inside a character become U+FFFD (�)."""
        # Join all bytes first: one character's bytes may be spread over several tokens.
        return self.decode_bytes(ids).decode("utf-8", errors="replace")

    # ----------------------------------------------------------------- files

    @classmethod
    def from_vocab_and_merges(
        cls,
        vocab: dict[int, bytes],
        merges: list[tuple[bytes, bytes]],
        special_tokens: Iterable[str] | None = None,
        pattern: str = GPT2_SPLIT_PATTERN,
    ) -> BPETokenizer:
        """A tokenizer from an id -> bytes vocabulary and a list of merges in rank order.

        special_tokens: their text; each takes the id whose bytes equal its UTF-8, or else the
        next free id."""
        return _from_vocab_and_merges(cls, vocab, merges, special_tokens, pattern)

    def save(self, folder: str | Path, overwrite: bool = False) -> Path:
        """Write encoder.json and vocab.bpe, GPT-2's own files, into `folder`."""
        return save_gpt2_files(self, folder, overwrite=overwrite)

    @classmethod
    def load(cls, folder: str | Path, pattern: str = GPT2_SPLIT_PATTERN) -> BPETokenizer:
        """A tokenizer from encoder.json and vocab.bpe in `folder` (as written by `save`)."""
        vocab, merges, special_tokens = read_gpt2_files(folder)
        return cls(vocab, merges, special_tokens=special_tokens, pattern=pattern)


def _check_special_token_list(special_tokens: Iterable[str]) -> list[str]:
    """The special tokens as a list; refuses non-strings, empty strings and repeats."""
    if isinstance(special_tokens, str) or not isinstance(special_tokens, Iterable):
        raise TypeError("special_tokens must be a list of strings, for example ['<|endoftext|>']")
    specials = list(special_tokens)
    for special in specials:
        if not isinstance(special, str):
            raise TypeError(f"special_tokens must be a list of strings, got {special!r} in it")
        if not special:
            raise ValueError(
                "a special token cannot be the empty string: it would match between every "
                "two characters. Remove '' from special_tokens."
            )
    repeated = sorted(name for name, n in Counter(specials).items() if n > 1)
    if repeated:
        raise ValueError(
            f"special_tokens lists {repeated[0]!r} more than once; each special token "
            "needs exactly one id, so list it once"
        )
    return specials


def _check_vocabulary(
    vocab: dict[bytes, int], merges: list[tuple[bytes, bytes]], special_tokens: dict[str, int]
) -> dict[int, bytes]:
    """Refuse a vocabulary that cannot encode every text; return id -> bytes for decoding."""
    missing = [b for b in range(256) if bytes([b]) not in vocab]
    if missing:
        raise ValueError(
            f"the vocabulary lacks {len(missing)} of the 256 single bytes (the first is byte "
            f"{missing[0]}); byte-level BPE needs every byte so that any text can be encoded"
        )
    for rank, (first, second) in enumerate(merges):
        for half in (first, second):
            if half not in vocab:
                raise ValueError(
                    f"merge {rank} ({first!r} + {second!r}) names {half!r}, which is not a token of the vocabulary"
                )
        if first + second not in vocab:
            raise ValueError(
                f"merge {rank} ({first!r} + {second!r}) makes a token that is not in the vocabulary"
            )
    bytes_of_id = {token_id: token for token, token_id in vocab.items()}
    if len(bytes_of_id) < len(vocab):
        shared = Counter(vocab.values()).most_common(1)[0][0]
        raise ValueError(
            f"id {shared} is given to more than one token; every token needs its own id"
        )
    _check_special_token_list(special_tokens)
    for name, token_id in special_tokens.items():
        if token_id in bytes_of_id:
            raise ValueError(
                f"special token {name!r} has id {token_id}, which another token already uses"
            )
        bytes_of_id[token_id] = name.encode("utf-8")
    return bytes_of_id


def _special_set(
    special_tokens: dict[str, int], value, name: str, known_only: bool = True
) -> set[str]:
    """`allowed_special` or `disallowed_special` as a set of strings: "all" or a set."""
    if isinstance(value, str):
        if value == "all":
            return set(special_tokens)
        raise ValueError(
            f'{name} must be "all" or a set of special tokens such as {{"{ENDOFTEXT}"}}, got {value!r}'
        )
    try:
        chosen = set(value)
    except TypeError:
        raise TypeError(
            f'{name} must be "all" or a set of strings, got {type(value).__name__}'
        ) from None
    for special in chosen:
        if not isinstance(special, str):
            raise TypeError(f"{name} must contain strings, got {special!r}")
        if known_only and special not in special_tokens:
            raise ValueError(
                f"{name} names {special!r}, which is not a special token here; "
                f"the special tokens are {sorted(special_tokens)}"
            )
    return chosen


def _refuse_disallowed_special(text: str, disallowed: set[str]) -> None:
    for special in disallowed:
        if special in text:
            raise ValueError(
                f"the text contains the special token {special!r}, which is not allowed. To encode "
                f"it as the special token, pass allowed_special={{{special!r}}} (or allowed_special="
                f"'all'); to encode it as ordinary text, pass disallowed_special=()."
            )


def _special_token_regex(specials: Iterable[str]) -> regex.Pattern:
    # Longest first, so that a special token that contains another one wins.
    return regex.compile("|".join(regex.escape(s) for s in sorted(specials, key=len, reverse=True)))


def _lookup_token(bytes_of_id: dict[int, bytes], token_id, position: int | None) -> bytes:
    """The bytes of one id, or a TypeError / ValueError that names the id and its position."""
    where = "" if position is None else f" at position {position}"
    if isinstance(token_id, bool):
        raise TypeError(f"token ids must be ints, got the bool {token_id}{where}")
    try:
        as_int = operator.index(token_id)  # accepts numpy and torch integers, refuses floats
    except TypeError:
        raise TypeError(
            f"token ids must be ints, got {type(token_id).__name__} {token_id!r}{where}"
        ) from None
    piece = bytes_of_id.get(as_int)
    if piece is None:
        raise ValueError(
            f"token id {as_int}{where} is not in the vocabulary: valid ids are 0 to {max(bytes_of_id)}"
        )
    return piece


@functools.lru_cache(maxsize=4)
def get_encoding(folder: str | Path | None = None) -> tiktoken.Encoding:
    """GPT-2's encoding as a `tiktoken.Encoding`, built from data/ without network access."""
    import tiktoken

    vocab, merges = load_gpt2_vocab(folder)
    # tiktoken merges by the rank of the merged token; GPT-2's ids are those ranks.
    for rank, (first, second) in enumerate(merges):
        if vocab.get(first + second) != 256 + rank:
            raise ValueError(
                f"encoder.json and vocab.bpe disagree at merge {rank} ({first!r} + {second!r}); "
                "the files in data/ are not GPT-2's originals"
            )
    return tiktoken.Encoding(
        name="gpt2",
        pat_str=GPT2_SPLIT_PATTERN,
        mergeable_ranks=vocab,
        special_tokens={ENDOFTEXT: ENDOFTEXT_ID},
    )


# --------------------------------------------------------------------------- fast paths


def bpe_merge_fast(symbols: list[bytes], ranks: dict[tuple[bytes, bytes], int]) -> list[bytes]:
    """The same result as `bpe_merge`, in about n log n steps for n symbols instead of n²."""
    original = symbols
    symbols = list(symbols)  # symbols[i] becomes None once it is merged into its left neighbour
    n = len(symbols)
    if n < 2:
        return symbols
    right = list(range(1, n + 1))  # index of the next live symbol; n means none
    left = list(range(-1, n - 1))  # index of the previous live symbol; -1 means none
    get = ranks.get
    pair_rank = [get(pair) for pair in zip(symbols, symbols[1:])]  # rank of the pair starting at i
    pair_rank.append(None)
    positions_of: dict[int, list[int]] = {}  # rank -> positions (left symbol) of its pair
    for i, rank in enumerate(pair_rank):
        if rank is not None:
            positions_of.setdefault(rank, []).append(i)
    waiting = list(positions_of)  # a heap of the ranks that have positions
    heapq.heapify(waiting)

    def add_pair(i: int, current: int) -> bool:
        rank = pair_rank[i] = get((symbols[i], symbols[right[i]])) if right[i] < n else None
        if rank is None:
            return True
        if rank <= current:  # only a table not made by training does this
            return False
        if rank not in positions_of:
            positions_of[rank] = []
            heapq.heappush(waiting, rank)
        positions_of[rank].append(i)
        return True

    while waiting:
        rank = heapq.heappop(waiting)
        for i in sorted(positions_of.pop(rank)):  # left to right
            if pair_rank[i] != rank:
                continue  # out of date: a merge has changed this pair since
            j = right[i]
            symbols[i], symbols[j], pair_rank[j] = symbols[i] + symbols[j], None, None
            right[i] = right[j]
            if right[i] < n:
                left[right[i]] = i
            if not add_pair(i, rank) or (left[i] >= 0 and not add_pair(left[i], rank)):
                return bpe_merge(original, ranks)
    return [symbol for symbol in symbols if symbol is not None]


def _descending(token: bytes) -> tuple[int, ...]:
    # A key that sorts byte strings in reverse: the heap's smallest entry is then the greater pair.
    # (A byte that is lower sorts later; a string that ends sorts after any longer one.)
    return tuple(255 - b for b in token) + (256,)


def train_bpe(
    text: str, vocab_size: int, pattern: str | None = None, special_tokens: Iterable[str] = ()
) -> tuple[dict[bytes, int], list[tuple[bytes, bytes]]]:
    """Learn merges on `text` until the vocabulary has `vocab_size` tokens (256 bytes + merges).

    Returns (token bytes -> id, merges in rank order), the same as `train_merges_simple`.
    Each merge is the pair with the highest count, on a tie the lexicographically greater pair of
    byte strings. The text is cut on `special_tokens` first, so no merge crosses one. Stops early,
    with a warning, when every piece of the text has become a single token.
    """
    if not isinstance(text, str):
        raise TypeError(f"train_bpe needs the training text as a str, got {type(text).__name__}")
    if isinstance(vocab_size, bool) or not isinstance(vocab_size, int):
        raise TypeError(f"vocab_size must be an int, got {type(vocab_size).__name__}")
    if vocab_size < 256:
        raise ValueError(
            f"vocab_size must be at least 256 (one token per byte, so that any text can be "
            f"encoded), got {vocab_size}"
        )
    pieces = pretokenize(text, pattern, _check_special_token_list(special_tokens))
    words = [list(_utf8(piece)) for piece in pieces]  # each word as a list of token ids
    counts = list(pieces.values())
    token_bytes = [bytes([b]) for b in range(256)]  # id -> bytes
    id_of = {token: i for i, token in enumerate(token_bytes)}
    order = [_descending(token) for token in token_bytes]  # id -> sort key for the tie rule

    pair_counts: dict[tuple[int, int], int] = defaultdict(int)
    words_with: dict[tuple[int, int], set[int]] = defaultdict(set)  # pair -> indices of words
    for w, (word, count) in enumerate(zip(words, counts)):
        for pair in zip(word, word[1:]):
            pair_counts[pair] += count
            words_with[pair].add(w)
    heap = [(-c, order[a], order[b], a, b) for (a, b), c in pair_counts.items()]
    heapq.heapify(heap)

    merges: list[tuple[bytes, bytes]] = []
    while len(id_of) < vocab_size:
        while heap and pair_counts.get((heap[0][3], heap[0][4]), 0) != -heap[0][0]:
            heapq.heappop(heap)  # a count that has changed since this entry was pushed
        if not heap:
            warnings.warn(
                f"train_bpe stopped at {len(id_of)} tokens, short of vocab_size={vocab_size}: every "
                "piece of the training text is already a single token. Use a longer text.",
                stacklevel=2,
            )
            break
        _, _, _, a, b = heapq.heappop(heap)
        merges.append((token_bytes[a], token_bytes[b]))
        merged_bytes = token_bytes[a] + token_bytes[b]
        new = id_of.get(merged_bytes)  # two different pairs can spell the same bytes
        if new is None:
            new = id_of[merged_bytes] = len(token_bytes)
            token_bytes.append(merged_bytes)
            order.append(_descending(merged_bytes))
        changed = set()
        for w in words_with.pop((a, b)):
            word, count = words[w], counts[w]
            merged, i = [], 0
            while i < len(word):
                if i + 1 < len(word) and word[i] == a and word[i + 1] == b:
                    merged.append(new)
                    i += 2
                else:
                    merged.append(word[i])
                    i += 1
            if len(merged) == len(word):
                continue  # the index is lazy: this word lost the pair in an earlier merge
            for pair in zip(word, word[1:]):
                pair_counts[pair] -= count
                changed.add(pair)
            for pair in zip(merged, merged[1:]):
                pair_counts[pair] += count
                changed.add(pair)
                words_with[pair].add(w)
            words[w] = merged
        for pair in changed:
            count = pair_counts[pair]
            if count > 0:
                heapq.heappush(heap, (-count, order[pair[0]], order[pair[1]], pair[0], pair[1]))
            else:
                del pair_counts[pair]
    return id_of, merges


def _encode_stream(
    tokenizer: BPETokenizer, chunks: Iterable[str], allowed: set[str], disallowed: set[str]
) -> Iterator[int]:
    """The generator behind `BPETokenizer.encode_iterable`."""
    if isinstance(chunks, (str, bytes)) or not isinstance(chunks, Iterable):
        raise TypeError(
            f"encode_iterable takes an iterable of str (such as an open text file or a list of "
            f"strings), got {type(chunks).__name__}; to encode one string, use encode()"
        )

    def stream() -> Iterator[int]:
        # A special token may start in one chunk and end in the next: keep its length - 1 chars.
        keep = max(map(len, allowed | disallowed), default=1) - 1
        specials = _special_token_regex(allowed) if allowed else None
        buffer, waiting, waiting_length = "", [], 0
        for position, chunk in enumerate(chunks):
            if not isinstance(chunk, str):
                raise TypeError(
                    f"encode_iterable takes str items; item {position} is {type(chunk).__name__} {chunk!r:.40}"
                )
            waiting.append(chunk)
            waiting_length += len(chunk)
            # The text not yet final is scanned again only once as much new text has come: so
            # each character is scanned a few times, however small the chunks (one long word
            # in one-character chunks would otherwise be scanned once per chunk).
            if waiting_length < len(buffer):
                continue
            buffer += "".join(waiting)
            waiting, waiting_length = [], 0
            _refuse_disallowed_special(buffer, disallowed)
            limit = len(buffer) - keep  # nothing from here on is final yet
            start, stop = 0, len(buffer)
            ids: list[int] = []
            for match in specials.finditer(buffer) if specials else ():
                if match.end() > limit:
                    stop = match.start()  # ordinary text ends where this special token starts
                    break
                ids += tokenizer.encode_ordinary(buffer[start : match.start()])
                ids.append(tokenizer.special_tokens[match.group()])
                start = match.end()
            # A special token may be starting at the end: its start ends the ordinary text for now.
            for position in range(max(start, len(buffer) - keep), stop):
                if any(special.startswith(buffer[position:]) for special in allowed):
                    stop = position
                    break
            # The ordinary text after the last special token: all but the last two pieces are final.
            spans = [m.span() for m in tokenizer._splitter.finditer(buffer, start, stop)][:-2]
            final = [(s, e) for s, e in spans if e <= limit]
            if final:
                ids += tokenizer._encode_pieces([buffer[s:e] for s, e in final])
                start = final[-1][1]
            buffer = buffer[start:]
            yield from ids
        buffer += "".join(waiting)
        yield from tokenizer.encode(buffer, allowed_special=allowed, disallowed_special=disallowed)

    return stream()


# --------------------------------------------------------------------------- files


def save_gpt2_files(tokenizer: BPETokenizer, folder: str | Path, overwrite: bool = False) -> Path:
    """Write `tokenizer` as encoder.json and vocab.bpe (GPT-2's format) into `folder`.

    The two files are one unit (gpt2lib.files.save_files): after a crash at any point the
    folder holds the old pair or the new one, never one of each. A folder that already holds
    either file is refused unless overwrite=True."""
    folder = check_path(folder)
    if not isinstance(overwrite, bool):
        raise TypeError(f"overwrite must be True or False, got {overwrite!r}")
    if folder.exists() and not folder.is_dir():
        raise FileExistsError(f"{str(folder)!r} is a file; give a folder for the tokenizer")
    names = (ENCODER_FILE, MERGES_FILE)

    def refuse_existing():
        existing = [n for n in names if os.path.lexists(folder / n)]
        if existing and not overwrite:
            raise FileExistsError(
                f"{folder} already holds {', '.join(existing)}; nothing was written. Pass "
                "overwrite=True to replace them, or save into another folder"
            )

    refuse_existing()
    char_of_byte = bytes_to_unicode()

    def as_text(token: bytes) -> str:
        return "".join(char_of_byte[b] for b in token)

    encoder = {as_text(token): token_id for token, token_id in tokenizer.vocab.items()}
    for special in tokenizer.special_tokens:
        if special in encoder:
            raise ValueError(
                f"the special token {special!r} is written like an ordinary token in encoder.json, "
                "so the files could not tell them apart; rename the special token"
            )
    encoder.update(
        tokenizer.special_tokens
    )  # special tokens keep their own text, as in GPT-2's file
    encoder = dict(sorted(encoder.items(), key=lambda item: item[1]))
    # json.dumps' defaults (ASCII only, ", " and ": ") are how OpenAI wrote GPT-2's encoder.json.
    lines = "".join(f"{as_text(first)} {as_text(second)}\n" for first, second in tokenizer.merges)
    save_files(
        folder,
        {ENCODER_FILE: json.dumps(encoder), MERGES_FILE: "#version: 0.2\n" + lines},
        before=refuse_existing,  # another save may have written here since the first look
    )
    return folder


def read_gpt2_files(
    folder: str | Path,
) -> tuple[dict[bytes, int], list[tuple[bytes, bytes]], dict[str, int]]:
    """(token bytes -> id, merges, special token -> id) from encoder.json and vocab.bpe in `folder`.

    A save into the folder that was killed is finished or undone first (gpt2lib.files), and
    the two files are read under the folder's lock, so they are always a pair one save wrote."""
    folder = check_path(folder)
    if stale_saves(folder):
        with folder_lock(folder, exclusive=True):
            recover_saves(folder)
    with folder_lock(folder, exclusive=False):
        encoder_path, merges_path = _bpe_file_paths(
            folder,
            "a tokenizer folder needs encoder.json and vocab.bpe (BPETokenizer.save writes both)",
        )
        encoder_text = _read_utf8(encoder_path)
        merges_text = _read_utf8(merges_path)
    encoder = json_object(encoder_text, str(encoder_path), hint="; write it with BPETokenizer.save")
    byte_of_char = {char: byte for byte, char in bytes_to_unicode().items()}

    def to_bytes(token: str, where: str) -> bytes:
        try:
            return bytes(byte_of_char[char] for char in token)
        except KeyError as exc:
            raise ValueError(
                f"{where}: {token!r} holds {exc.args[0]!r}, which is not one of GPT-2's 256 "
                "byte characters (see bytes_to_unicode)"
            ) from None

    lines = merges_text.split("\n")
    merges = []
    for number, line in enumerate(lines[1:], start=2):
        if not line:
            continue
        halves = line.split(" ")
        if len(halves) != 2:
            raise ValueError(
                f"{merges_path}, line {number}: expected two tokens separated by one space, got {line!r}"
            )
        merges.append(
            (
                to_bytes(halves[0], f"{merges_path}, line {number}"),
                to_bytes(halves[1], f"{merges_path}, line {number}"),
            )
        )
    made = {bytes([b]) for b in range(256)} | {first + second for first, second in merges}
    vocab, special_tokens = {}, {}
    for token, token_id in encoder.items():
        try:
            check_whole(f"{encoder_path}: the id of {token!r}", token_id, 0)
        except TypeError as exc:
            raise ValueError(str(exc)) from None
        if (
            all(char in byte_of_char for char in token)
            and to_bytes(token, str(encoder_path)) in made
        ):
            vocab[to_bytes(token, str(encoder_path))] = token_id
        else:
            special_tokens[token] = token_id
    _refuse_files_that_disagree(special_tokens, byte_of_char, encoder_path, merges_path)
    return vocab, merges, special_tokens


def _read_utf8(path: Path) -> str:
    try:
        return path.read_bytes().decode("utf-8")
    except UnicodeDecodeError as exc:
        raise ValueError(
            f"{path} is not UTF-8 text ({exc.reason} at byte {exc.start}); write the files "
            "with BPETokenizer.save"
        ) from None
    except OSError as exc:
        raise ValueError(f"{path} cannot be read ({exc.strerror or exc})") from None


# A tokenizer has a few special tokens (GPT-2 one, others up to a few hundred reserved ones).
_MAX_SPECIAL_TOKENS = 1024


def _refuse_files_that_disagree(
    special_tokens: dict[str, int],
    byte_of_char: dict[str, int],
    encoder_path: Path,
    merges_path: Path,
) -> None:
    """In GPT-2's files an entry of encoder.json that no merge makes is a special token. Refuse
    the files when such entries cannot all be special tokens: when one is spelled with GPT-2's
    stand-ins for unprintable bytes (a special token is written as its own text), or when there
    are more of them than any tokenizer has special tokens."""
    stand_ins = {char for char, byte in byte_of_char.items() if ord(char) != byte}
    suspect = [t for t in special_tokens if any(char in stand_ins for char in t)]
    if not suspect and len(special_tokens) <= _MAX_SPECIAL_TOKENS:
        return
    first = (suspect or list(special_tokens))[0]
    raise ValueError(
        f"{encoder_path} and {merges_path} do not belong together: {len(special_tokens)} tokens "
        f"of encoder.json are made by no merge in vocab.bpe, so they would become special "
        f"tokens (the first is {first!r}, id {special_tokens[first]}). Use the vocab.bpe saved "
        f"with this encoder.json; this one may be cut short or come from another tokenizer"
    )


def _from_vocab_and_merges(
    cls,
    vocab: dict[int, bytes],
    merges: list[tuple[bytes, bytes]],
    special_tokens: Iterable[str] | None,
    pattern: str,
) -> BPETokenizer:
    """The work of `BPETokenizer.from_vocab_and_merges` (id -> bytes, merges, special tokens)."""
    if not isinstance(vocab, dict):
        raise TypeError(f"vocab must be a dict of id -> bytes, got {type(vocab).__name__}")
    specials = _check_special_token_list(special_tokens or [])
    id_of: dict[bytes, int] = {}
    for token_id, token in vocab.items():
        if not isinstance(token, bytes):
            raise TypeError(f"vocab must map int ids to bytes, got {token_id!r}: {token!r:.40}")
        check_whole(f"vocab must map int ids to bytes: the id of {token!r:.40}", token_id, 0)
        if token in id_of:
            raise ValueError(
                f"ids {id_of[token]} and {token_id} both hold {token!r}; each token needs one id"
            )
        id_of[token] = token_id
    merge_list = []
    for rank, merge in enumerate(merges):
        if not (
            isinstance(merge, tuple)
            and len(merge) == 2
            and all(isinstance(h, bytes) for h in merge)
        ):
            raise TypeError(f"merge {rank} must be a pair (bytes, bytes), got {merge!r:.60}")
        merge_list.append(merge)
    special_ids, next_free = {}, max(vocab, default=-1) + 1
    for special in specials:
        token_id = id_of.pop(special.encode("utf-8"), None)
        if token_id is None:
            token_id, next_free = next_free, next_free + 1
        special_ids[special] = token_id
    return cls(id_of, merge_list, special_tokens=special_ids, pattern=pattern)
