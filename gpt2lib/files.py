"""Writing files so that a crash never leaves half of one: the package's one atomic write.

Hand-written. Every file the package writes for a user (a notebook, a generated module, a
token file, a training checkpoint, a log, an adapter's or a model's files) goes through
`atomic_write`: the data goes into a new temporary file beside the target, is flushed to disk,
and then replaces the target in one rename. A reader sees the old file or the new one, never a
mix. Saves of several files that must change together build on it (`gpt2lib.checkpoint`).
"""

from __future__ import annotations

import contextlib
import os
import secrets
from collections.abc import Callable
from pathlib import Path
from typing import BinaryIO

__all__ = ["atomic_write", "fsync_dir", "fsync_file"]


def atomic_write(path: str | os.PathLike, data: bytes | str | Callable[[BinaryIO], object]) -> Path:
    """Write `data` to `path` atomically and return the path.

    data: bytes, text (written as UTF-8), or a function that writes into the open binary file
    it is given (for `torch.save`, or a header followed by an array). The file gets the
    permissions a new file gets from the umask (0644 under the usual 022), whether it is new
    or replaces an older one. On any error the target keeps what it held and the temporary
    file is removed.
    """
    path = Path(path)
    temporary = path.with_name(f".{path.name}.{secrets.token_hex(4)}.tmp")
    # O_EXCL: never write through a file someone else made; 0o666 & ~umask, like open()
    fd = os.open(
        temporary, os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_BINARY", 0), 0o666
    )
    try:
        with os.fdopen(fd, "wb") as file:
            if isinstance(data, str):
                file.write(data.encode("utf-8"))
            elif isinstance(data, (bytes, bytearray, memoryview)):
                file.write(data)
            else:
                data(file)
            file.flush()
            os.fsync(file.fileno())
        os.replace(temporary, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(temporary)
        raise
    fsync_dir(path.parent)
    return path


def fsync_file(path: str | os.PathLike) -> None:
    """Flush a file that is already written to the disk."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def fsync_dir(folder: str | os.PathLike) -> None:
    """Flush a folder's entries (a rename in it) to the disk, where the system allows it."""
    try:
        fd = os.open(folder, os.O_RDONLY)
    except OSError:
        return  # Windows cannot open a folder; its renames are flushed by the file system
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)
