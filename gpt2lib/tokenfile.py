"""Token files: text tokenized once into uint16 ids on disk, read back with np.memmap.

    python -m gpt2lib prepare data/tinyshakespeare.txt data/shakespeare.bin --val-fraction 0.1

writes `data/shakespeare.bin` (the first 90% of the ids) and `data/shakespeare.val.bin` (the
rest), the split chapter 7 makes in memory. A token file is a 1,024-byte header and then the
ids, two bytes each (little-endian uint16, as in nanoGPT and llm.c: GPT-2's 50,257 ids fit).
The header is the magic `GPT2TOK1`, the length of a JSON object as a 4-byte little-endian
integer, and the JSON itself: vocabulary name, vocab_size, count, the largest id, dtype,
and the SHA-256 of the source text. Training reads the header first and refuses a file of
another vocabulary, or one holding an id the model has no row for, before any step.

Written by hand (not generated from a notebook).
"""

from __future__ import annotations

import hashlib
import json
import os
import struct
from pathlib import Path

import numpy as np

from gpt2lib.files import atomic_write, save_files
from gpt2lib.validation import ENDOFTEXT_ID, check_path, check_real, check_whole

MAGIC = b"GPT2TOK1"
HEADER_BYTES = 1024
VOCABULARY = "gpt2"  # the course's tokenizer: GPT-2's byte-level BPE
VOCAB_SIZE = 50257
EOT = ENDOFTEXT_ID  # <|endoftext|>: put between the files of a folder, never inside one file
DTYPE = np.dtype("<u2")
TEXT_SUFFIXES = (".txt", ".md", ".text")


class TokenFileError(ValueError):
    """A token file that cannot be used: not one, another vocabulary, damaged."""


def val_path(out: str | Path) -> Path:
    """Where `prepare --val-fraction` writes the validation ids: OUT with `.val` before its suffix.

    data/shakespeare.bin -> data/shakespeare.val.bin; data/tokens -> data/tokens.val
    """
    out = Path(out)
    if out.suffix:
        return out.with_name(f"{out.stem}.val{out.suffix}")
    return out.with_name(out.name + ".val")


# --------------------------------------------------------------------------- writing


def _header_bytes(meta: dict) -> bytes:
    body = json.dumps(meta, sort_keys=True).encode("utf-8")
    header = MAGIC + struct.pack("<I", len(body)) + body
    if len(header) > HEADER_BYTES:
        raise ValueError(f"token-file header too long ({len(header)} bytes)")
    return header.ljust(HEADER_BYTES, b"\0")


def write_token_file(
    path: str | Path,
    ids,
    *,
    source_sha256: str = "",
    source: str = "",
    vocabulary: str = VOCABULARY,
    vocab_size: int = VOCAB_SIZE,
) -> Path:
    """Write `ids` (any 1-D integer array) as a token file, atomically. -> the path.

    The file is written beside the target and renamed into place, so an interrupted write
    never leaves half a file under the real name.
    """
    path = check_path(path, "token file")
    vocab_size = check_whole("vocab_size", vocab_size, 1)
    ids = _checked_ids(ids, vocab_size)
    meta = _meta(ids, source_sha256, source, vocabulary, vocab_size)
    path.parent.mkdir(parents=True, exist_ok=True)
    return atomic_write(path, _writer(ids, meta))


def _meta(ids, source_sha256, source, vocabulary=VOCABULARY, vocab_size=VOCAB_SIZE) -> dict:
    return {
        "vocabulary": vocabulary,
        "vocab_size": int(vocab_size),
        "count": int(ids.size),
        "max_id": int(ids.max()) if ids.size else -1,
        "dtype": "uint16",
        "source_sha256": source_sha256,
        "source": source[-300:],  # the header has 1,024 bytes; a very long path keeps its end
    }


def _writer(ids, meta):
    def write(file):
        file.write(_header_bytes(meta))
        file.write(ids.astype(DTYPE, copy=False).tobytes())

    return write


def _path_writer(ids, meta):
    write = _writer(ids, meta)

    def to_path(path):
        with open(path, "wb") as file:
            write(file)

    return to_path


def _checked_ids(ids, vocab_size: int):
    ids = np.asarray(ids)
    if ids.ndim != 1:
        raise ValueError(f"ids must be 1-D, got shape {ids.shape}")
    if ids.size and ids.dtype.kind not in "iu":
        raise TypeError(f"ids must be integers, got dtype {ids.dtype}")
    if ids.size and (int(ids.min()) < 0 or int(ids.max()) >= min(vocab_size, 2**16)):
        raise ValueError(
            f"ids must lie in [0, {min(vocab_size, 2**16)}) to be stored as uint16; "
            f"found {int(ids.min())}..{int(ids.max())}"
        )
    return ids


# --------------------------------------------------------------------------- reading


def read_header(path: str | Path) -> dict:
    """The JSON header of a token file, every field checked; TokenFileError naming the file if
    it is not one, is damaged, or is cut short."""
    path = check_path(path, "token file")
    if not path.is_file():
        if path.exists():
            raise TokenFileError(f"{str(path)!r} is not a regular file, so not a token file")
        raise FileNotFoundError(
            f"no token file at {str(path)!r}; make one with `python -m gpt2lib prepare TEXT {path}`"
        )
    with open(path, "rb") as f:
        head = f.read(HEADER_BYTES)
    if len(head) < 12 or head[:8] != MAGIC:
        raise TokenFileError(
            f"{str(path)!r} is not a gpt2lib token file (no {MAGIC.decode()} header); make one "
            f"with `python -m gpt2lib prepare TEXT {path}`"
        )
    (length,) = struct.unpack("<I", head[8:12])
    damaged = f"{str(path)!r}: the token-file header is damaged"
    if length > HEADER_BYTES - 12:
        raise TokenFileError(f"{damaged} (it claims {length:,} bytes of JSON; at most 1,012 fit)")
    try:
        meta = json.loads(head[12 : 12 + length].decode("utf-8"))
    except (UnicodeDecodeError, ValueError, RecursionError):
        raise TokenFileError(f"{damaged}; run prepare again") from None
    if not isinstance(meta, dict):
        raise TokenFileError(f"{damaged} (it holds a JSON {type(meta).__name__}, not an object)")
    try:
        if not isinstance(meta.get("vocabulary"), str):
            raise TypeError(f"vocabulary must be a name, got {meta.get('vocabulary')!r}")
        check_whole("vocab_size", meta.get("vocab_size"), 1)
        check_whole("count", meta.get("count"), 0, _MAX_COUNT)
        check_whole("max_id", meta.get("max_id", -1), -1)
        if not isinstance(meta.get("source_sha256", ""), str):
            raise TypeError(f"source_sha256 must be text, got {meta.get('source_sha256')!r}")
    except (TypeError, ValueError) as exc:
        raise TokenFileError(f"{damaged}: {exc}; run prepare again") from None
    if meta.get("dtype", "uint16") != "uint16":
        raise TokenFileError(
            f"{str(path)!r} says its ids are {meta.get('dtype')!r}, but token files hold uint16 "
            "ids (two bytes each) and are read that way; this one was written by another tool "
            "or is damaged: tokenize the text again with `python -m gpt2lib prepare`"
        )
    expected = HEADER_BYTES + DTYPE.itemsize * meta["count"]
    size = path.stat().st_size
    if size != expected:
        raise TokenFileError(
            f"{str(path)!r} is {size:,} bytes but its header promises {meta['count']:,} ids "
            f"({expected:,} bytes): the file is cut short or damaged; run prepare again"
        )
    return meta


_MAX_COUNT = 1 << 50  # ids: 2 PiB of them, far past any corpus, and no overflow in the sizes


def is_token_file(path) -> bool:
    """True if `path` is a regular file that starts as gpt2lib's token files do."""
    try:
        with open(path, "rb") as f:
            return Path(path).is_file() and f.read(len(MAGIC)) == MAGIC
    except OSError:
        return False


def open_tokens(
    path: str | Path, vocab_size: int | None = None, vocabulary: str = VOCABULARY
) -> np.memmap:
    """A token file's ids as a read-only np.memmap of uint16 (nothing is read into memory).

    Refused with TokenFileError, before anything trains: a file whose header names another
    vocabulary, or that holds an id at or above `vocab_size` (the model's rows). The id range
    is measured over the whole file (in chunks), not taken from the header.
    """
    meta = read_header(path)
    if meta.get("vocabulary") != vocabulary:
        raise TokenFileError(
            f"{str(path)!r} holds ids of the {meta.get('vocabulary')!r} vocabulary, but this "
            f"model reads {vocabulary!r} ids; tokenize the text again with "
            "`python -m gpt2lib prepare`"
        )
    if meta["count"] == 0:
        return np.zeros(0, dtype=DTYPE)  # np.memmap cannot map nothing
    ids = np.memmap(path, dtype=DTYPE, mode="r", offset=HEADER_BYTES, shape=(meta["count"],))
    if vocab_size is not None:
        largest = max_id(ids)
        if largest >= vocab_size:
            raise TokenFileError(
                f"{str(path)!r} holds the id {largest}, but the model has only {vocab_size} "
                f"token rows (ids 0..{vocab_size - 1}); this file was made for another "
                "vocabulary or is damaged"
            )
    return ids


def max_id(ids, chunk: int = 1 << 26) -> int:
    """The largest id, read in chunks of 64M ids so that a huge memmap is never copied whole."""
    largest = -1
    for start in range(0, len(ids), chunk):
        largest = max(largest, int(ids[start : start + chunk].max()))
    return largest


def windows(ids, starts, block_size):
    """Inputs and targets for the windows that begin at `starts`: (x, y), each (B, T) int64.

    Row b of x is ids[s : s + T] and y the same window one token later, as in
    gpt2lib.training.get_batch; only these rows are read from a memmap.
    """
    import torch

    rows = np.stack(
        [
            np.asarray(ids[s : s + block_size + 1], dtype=np.int64)
            for s in np.asarray(starts).tolist()
        ]
    )  # (B, T + 1)
    rows = torch.from_numpy(rows)
    return rows[:, :-1], rows[:, 1:]


# --------------------------------------------------------------------------- prepare


def _text_files(source: Path) -> list[Path]:
    if source.is_file():
        return [source]
    if source.is_dir():
        files = sorted(p for p in source.rglob("*") if p.is_file() and p.suffix in TEXT_SUFFIXES)
        if not files:
            raise FileNotFoundError(
                f"{str(source)!r} holds no text files ({', '.join(TEXT_SUFFIXES)})"
            )
        return files
    raise FileNotFoundError(f"no text file or folder at {str(source)!r}")


def split_points(text: str, pieces: int) -> list[int]:
    """Cut positions that leave GPT-2's tokens unchanged: just after a newline that has a
    character other than whitespace on both sides.

    There GPT-2's pre-tokenizer always starts a new pre-token (the lone newline is one; only
    a space may lead a word), and BPE works inside pre-tokens, so encoding the pieces apart
    and joining the ids gives the ids of the whole text.
    """
    cuts, n = [0], len(text)
    for k in range(1, pieces):
        at = text.find("\n", max(cuts[-1], k * n // pieces))
        while at != -1 and (
            at == 0 or at + 1 >= n or text[at - 1].isspace() or text[at + 1].isspace()
        ):
            at = text.find("\n", at + 1)
        if at == -1:
            break
        if at + 1 > cuts[-1]:
            cuts.append(at + 1)
    return cuts + [n]


def _refuse_outputs(source: Path, inputs: list[Path], outputs: list[Path]) -> None:
    """Refuse, before any work, to write a token file over anything prepare did not make: an
    input file, a file that is not a token file, a folder; or where the next prepare of the
    same folder would read it as text."""
    read = {os.path.realpath(p) for p in inputs}
    for out in outputs:
        where = f"{str(out)!r}"
        if os.path.realpath(out) in read:
            raise FileExistsError(
                f"{where} is one of the input files; writing token ids there would destroy the "
                "text. Give another OUT (say data/NAME.bin); nothing was written"
            )
        if out.is_dir():
            raise FileExistsError(
                f"{where} is a folder; give OUT as a file path such as data/x.bin"
            )
        if os.path.lexists(out) and not is_token_file(out):
            raise FileExistsError(
                f"{where} already exists and is not a token file; prepare replaces only token "
                "files it wrote. Delete it or give another OUT; nothing was written"
            )
        if (
            source.is_dir()
            and out.suffix in TEXT_SUFFIXES
            and os.path.realpath(out).startswith(os.path.realpath(source) + os.sep)
        ):
            raise FileExistsError(
                f"{where} is a text file name inside the input folder {str(source)!r}: the next "
                "prepare of that folder would read the token file as text. Give OUT a .bin "
                "name, or put it outside the folder; nothing was written"
            )


_ENCODING = None


def _encode(piece: str) -> np.ndarray:
    global _ENCODING
    if _ENCODING is None:
        from gpt2lib.tokenizer import get_encoding

        _ENCODING = get_encoding()
    return np.asarray(_ENCODING.encode_ordinary(piece), dtype=DTYPE)


def prepare(
    source: str | Path,
    out: str | Path,
    val_fraction: float = 0.0,
    processes: int | None = None,
    progress: bool = True,
    chunk_chars: int = 1 << 20,
) -> dict:
    """Tokenize a text file, or every text file in a folder, into token files. -> a summary.

    One file: OUT holds encode_ordinary(text)[: int((1 - val_fraction) * n)] and, when
    val_fraction > 0, val_path(OUT) holds the rest; nothing is added. A folder: its files
    (sorted by path) are joined with <|endoftext|> between them, then split the same way.
    The text is cut into pieces at places that do not change the ids (split_points) and the
    pieces are encoded by `processes` worker processes (default: the CPU count, at most 8).
    """
    from concurrent.futures import ProcessPoolExecutor

    source, out = check_path(source, "input"), check_path(out, "output")
    val_fraction = check_real("--val-fraction", val_fraction, 0, 1, high_inclusive=False)
    if processes is not None:
        processes = check_whole("--processes", processes, 1, 1024)
    chunk_chars = check_whole("chunk_chars", chunk_chars, 1)
    if not isinstance(progress, bool):
        raise TypeError(f"progress must be True or False, got {progress!r}")
    files = _text_files(source)
    _refuse_outputs(source, files, [out] + ([val_path(out)] if val_fraction > 0 else []))
    digest = hashlib.sha256()
    jobs = []  # (file index, text piece)
    for index, path in enumerate(files):
        data = path.read_bytes()
        digest.update(data)
        try:
            text = data.decode("utf-8")
        except UnicodeDecodeError as exc:
            raise ValueError(
                f"{str(path)!r} is not UTF-8 text ({exc.reason} at byte {exc.start})"
            ) from None
        cuts = split_points(text, max(1, len(text) // chunk_chars))
        jobs += [(index, text[a:b]) for a, b in zip(cuts, cuts[1:]) if b > a]
    processes = processes or min(8, os.cpu_count() or 1)
    bar = None
    if progress:
        try:
            from tqdm.auto import tqdm

            bar = tqdm(
                total=sum(len(p) for _, p in jobs), unit="char", unit_scale=True, desc="tokenizing"
            )
        except ImportError:
            pass
    parts = []
    pieces = (p for _, p in jobs)
    if processes > 1 and len(jobs) > 1:
        with ProcessPoolExecutor(processes) as pool:
            for (_, piece), ids in zip(jobs, pool.map(_encode, pieces, chunksize=1)):
                parts.append(ids)
                if bar is not None:
                    bar.update(len(piece))
    else:
        for _, piece in jobs:
            parts.append(_encode(piece))
            if bar is not None:
                bar.update(len(piece))
    if bar is not None:
        bar.close()
    joined = []
    for i, ((index, _), ids) in enumerate(zip(jobs, parts)):
        if i and index != jobs[i - 1][0]:
            joined.append(np.array([EOT], dtype=DTYPE))  # a new document begins
        joined.append(ids)
    ids = np.concatenate(joined) if joined else np.zeros(0, dtype=DTYPE)
    split = int((1 - val_fraction) * len(ids))
    sha = digest.hexdigest()
    parts = {"train": (out, ids[:split])}
    if val_fraction > 0:  # the two files are one unit: a kill leaves the old pair or the new
        parts["val"] = (val_path(out), ids[split:])
    units = {
        path.name: _path_writer(part, _meta(part, sha, str(source)))
        for path, part in parts.values()
    }
    save_files(
        out.parent,
        units,
        before=lambda: _refuse_outputs(source, files, [p for p, _ in parts.values()]),
    )
    written = {name: str(path) for name, (path, _) in parts.items()}
    return {
        "files": len(files),
        "tokens": int(len(ids)),
        "train_tokens": split,
        "val_tokens": int(len(ids) - split),
        "written": written,
        "source_sha256": sha,
    }
