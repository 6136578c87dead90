"""Writing files so that a crash never leaves half of one: the package's one atomic write, and
the one atomic save of several files that must change together.

Hand-written. Every file the package writes for a user (a notebook, a generated module, a
token file, a training checkpoint, a log, an adapter's or a model's files) goes through
`atomic_write` or `save_files`.

`atomic_write`: the data goes into a new temporary file beside the target, is flushed to disk,
and then replaces the target in one rename. A reader sees the old file or the new one, never a
mix.

`save_files`: several files of one folder (a model's config.json and model.safetensors, an
adapter's two files, a tokenizer's encoder.json and vocab.bpe) as one unit. They are written
into a hidden folder inside the target folder, `.gpt2lib-save.<pid>.<random>`, flushed, and
then a commit record naming them is written there (atomically, last). Only then are they
renamed into place, one by one. A save killed before its commit record leaves the old files;
one killed after it is finished by the next save or load of the folder (`recover_saves`), which
renames what is left: the folder holds the old unit or the new one. Saves and loads of a
folder take its lock (`folder_lock`): a save exclusive, a load shared.

A file gets the permissions a new file gets from the umask (0644 under the usual 022) in both,
whoever wrote its bytes (the safetensors library writes 0600 on its own).
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import secrets
import shutil
from collections.abc import Callable
from pathlib import Path
from typing import BinaryIO

__all__ = [
    "SAVE_DIR_PATTERN",
    "atomic_write",
    "folder_lock",
    "fsync_dir",
    "fsync_file",
    "read_small_file",
    "recover_saves",
    "save_files",
    "stale_saves",
]

# what a save writes into: its own hidden folder inside the target folder (the same file
# system, so its renames are atomic); the pid says whether its writer is still alive
SAVE_DIR_PATTERN = re.compile(r"^\.gpt2lib-save\.(\d+)\.[0-9a-f]+$")
_COMMIT = ".commit"  # inside a save folder: the names to move into place, written last


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
            _write_into(file, data)
            file.flush()
            os.fsync(file.fileno())
        os.replace(temporary, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(temporary)
        raise
    fsync_dir(path.parent)
    return path


def read_small_file(
    path: str | os.PathLike, limit: int, error: type[Exception], where: str, what_it_is: str
) -> bytes:
    """The bytes of a file that is only ever small (a settings file, a config), never reading
    more than `limit` + 1 bytes of it. Raises `error` when the file cannot be read or is over
    `limit`: "{where} is over N KiB; {what_it_is}, so this is not one"."""
    try:
        with open(path, "rb") as file:
            data = file.read(limit + 1)
    except OSError as exc:
        raise error(f"{where} cannot be read ({exc.strerror or exc})") from None
    if len(data) > limit:
        raise error(f"{where} is over {limit // 1024} KiB; {what_it_is}, so this is not one")
    return data


def json_object(
    text: str | bytes,
    where: str,
    error: type[Exception] = ValueError,
    what: str = "valid JSON",
    hint: str = "",
) -> dict:
    """The one JSON object `text` must hold, else `error` naming `where`: "{where} is not {what}
    (why){hint}", or "{where} must hold one JSON object, got list{hint}". Bytes are decoded as
    JSON text is (UTF-8 unless marked); nesting too deep to parse is an error, not a crash."""
    try:
        values = json.loads(text)
    except RecursionError:
        raise error(f"{where} is not {what} (nested too deeply){hint}") from None
    except ValueError as exc:  # JSONDecodeError, and UnicodeDecodeError from bytes
        raise error(f"{where} is not {what} ({exc}){hint}") from None
    if not isinstance(values, dict):
        raise error(f"{where} must hold one JSON object, got {type(values).__name__}{hint}")
    return values


def _write_into(file: BinaryIO, data) -> None:
    if isinstance(data, str):
        file.write(data.encode("utf-8"))
    elif isinstance(data, (bytes, bytearray, memoryview)):
        file.write(data)
    else:
        data(file)


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


# --------------------------------------------------------------------------- several files


@contextlib.contextmanager
def folder_lock(folder: str | os.PathLike, exclusive: bool):
    """flock on the folder itself: saves exclusive, loads shared (where the OS has flock).

    No lock file is left in the folder (a model folder holds its two files and nothing else of
    ours). Threads of one process exclude each other as processes do: each takes its own lock."""
    try:
        import fcntl
    except ImportError:  # Windows: no lock; the renames are still atomic
        yield
        return
    try:
        fd = os.open(folder, os.O_RDONLY)
    except OSError:
        yield
        return
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX if exclusive else fcntl.LOCK_SH)
        except OSError:  # a file system without locks
            pass
        yield
    finally:
        os.close(fd)


def _alive(pid: int) -> bool:
    if pid == os.getpid() or os.name == "nt":
        return True  # another thread of this process; on Windows os.kill would end the process
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except (PermissionError, OSError):
        return True
    return True


def stale_saves(folder: str | os.PathLike, legacy_names=()) -> list[Path]:
    """What dead saves left in `folder`: their save folders (and any of `legacy_names`, the
    temporary files of earlier versions)."""
    folder = Path(folder)
    try:
        names = os.listdir(folder)
    except OSError:
        return []
    found = []
    for name in names:
        match = SAVE_DIR_PATTERN.match(name)
        if (match and not _alive(int(match.group(1)))) or name in legacy_names:
            found.append(folder / name)
    return found


def _committed(save_dir: Path) -> list[str] | None:
    """The names a save folder's commit record lists, or None if it has none (or a bad one)."""
    try:
        names = json.loads((save_dir / _COMMIT).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    if not isinstance(names, list) or not all(_plain_name(n) for n in names):
        return None
    return names


def _plain_name(name) -> bool:
    return (
        isinstance(name, str)
        and name not in ("", ".", "..", _COMMIT)
        and "/" not in name
        and "\\" not in name
        and "\0" not in name
        and not SAVE_DIR_PATTERN.match(name)
    )


def recover_saves(
    folder: str | os.PathLike,
    legacy: Callable[[Path], None] | None = None,
    legacy_names=(),
) -> None:
    """Finish or undo the saves that were killed in `folder` (call it holding the folder's
    exclusive lock). A dead save with a commit record is finished: what it had not yet renamed
    into place is renamed now. One without is undone: its folder is removed, and the old files
    were never touched. `legacy(save_dir)` is called first on a save folder without a commit
    record (the saves of earlier versions had none); `legacy_names` are the temporary files of
    earlier versions, removed."""
    folder = Path(folder)
    for path in stale_saves(folder, legacy_names):
        try:
            names = _committed(path) if path.is_dir() and not path.is_symlink() else None
            if names is not None:
                for name in names:
                    if os.path.lexists(path / name):
                        os.replace(path / name, folder / name)
                fsync_dir(folder)
            elif legacy is not None and path.is_dir() and not path.is_symlink():
                legacy(path)
            if path.is_dir() and not path.is_symlink():
                shutil.rmtree(path)
            else:
                path.unlink(missing_ok=True)
        except OSError:
            pass  # a read-only folder: nothing of ours can be there to clean


def save_files(
    folder: str | os.PathLike,
    files: dict,
    *,
    before: Callable[[], None] | None = None,
    legacy: Callable[[Path], None] | None = None,
    legacy_names=(),
) -> Path:
    """Write `files` ({name: data}) into `folder` as one unit, and return the folder.

    data: bytes, text (UTF-8), or a function that writes the file at the path it is given
    (safetensors' save_file). The files are renamed into place in the order given. Creates the
    folder. Under the folder's exclusive lock: killed saves are recovered first (see
    `recover_saves`; `legacy` and `legacy_names` as there), then `before()` runs (a last
    check that may raise, say that the folder gained a file meanwhile), then the save. After a
    crash at any point the folder holds the old files or the new ones. An error before the
    commit leaves the folder as it was and is raised as it came.
    """
    folder = Path(folder)
    names = list(files)
    if not names or not all(_plain_name(n) for n in names):
        raise ValueError(f"save_files needs plain file names, got {names!r}")
    folder.mkdir(parents=True, exist_ok=True)
    with folder_lock(folder, exclusive=True):
        recover_saves(folder, legacy, legacy_names)
        if before is not None:
            before()
        staging = folder / f".gpt2lib-save.{os.getpid()}.{secrets.token_hex(4)}"
        committed = False
        try:
            os.mkdir(staging)
            mode = os.stat(staging).st_mode & 0o666  # a new file's mode under this umask
            for name, data in files.items():
                target = staging / name
                if callable(data) and not isinstance(data, (bytes, str)):
                    data(target)
                    os.chmod(target, mode)
                    fsync_file(target)
                else:
                    fd = os.open(
                        target,
                        os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_BINARY", 0),
                        0o666,
                    )
                    with os.fdopen(fd, "wb") as file:
                        _write_into(file, data)
                        file.flush()
                        os.fsync(file.fileno())
            fsync_dir(staging)
            atomic_write(staging / _COMMIT, json.dumps(names))  # the point of no return
            committed = True
            for name in names:
                os.replace(staging / name, folder / name)
            fsync_dir(folder)
        except BaseException:
            if committed:  # finish the save rather than leave a mixed folder
                with contextlib.suppress(OSError):
                    for name in names:
                        if os.path.lexists(staging / name):
                            os.replace(staging / name, folder / name)
                    fsync_dir(folder)
            if not committed or not any(os.path.lexists(staging / n) for n in names):
                shutil.rmtree(staging, ignore_errors=True)
            raise  # (a committed save left unfinished is finished by the next load or save)
        shutil.rmtree(staging, ignore_errors=True)
    return folder
