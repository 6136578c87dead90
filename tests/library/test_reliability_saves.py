"""Saves: every multi-file save is atomic as a unit (gpt2lib.files.save_files: the tokenizer's
two files, the adapter's and the model's), and every file gets the umask's mode (never 0600)."""

from __future__ import annotations

import json
import os
import stat
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from gpt2lib import files

REPO = Path(__file__).resolve().parents[2]


def mode(path) -> int:
    return stat.S_IMODE(os.stat(path).st_mode)


@pytest.fixture
def umask_022():
    old = os.umask(0o022)
    try:
        yield
    finally:
        os.umask(old)


# --------------------------------------------------------------------------- modes


UMASKS = [(0o022, 0o644), (0o077, 0o600), (0o002, 0o664)]


@pytest.mark.skipif(os.name == "nt", reason="POSIX modes")
@pytest.mark.parametrize("umask, expected", UMASKS)
def test_atomic_write_gives_the_umask_s_mode_new_or_replacing(tmp_path, umask, expected):
    old = os.umask(umask)
    try:
        fresh = files.atomic_write(tmp_path / "fresh.py", "x = 1\n")
        private = tmp_path / "was_private.ipynb"
        private.write_text("{}", encoding="utf-8")
        os.chmod(private, 0o600)
        files.atomic_write(private, "{}")
    finally:
        os.umask(old)
    assert mode(fresh) == mode(private) == expected


@pytest.mark.skipif(os.name == "nt", reason="POSIX modes")
@pytest.mark.parametrize("umask, expected", UMASKS)
def test_a_unit_save_gives_the_umask_s_mode_whoever_wrote_the_bytes(tmp_path, umask, expected):
    def private_writer(path):  # as the safetensors library writes: 0600
        Path(path).write_bytes(b"x")
        os.chmod(path, 0o600)

    old = os.umask(umask)
    try:
        unit = files.save_files(tmp_path / "unit", {"a.json": "{}", "b.bin": private_writer})
    finally:
        os.umask(old)
    assert mode(unit / "a.json") == mode(unit / "b.bin") == expected


@pytest.mark.skipif(os.name == "nt", reason="POSIX modes")
def test_save_pretrained_writes_both_files_with_the_same_mode(tmp_path, umask_022, tiny_model):
    from gpt2lib.checkpoint import save_pretrained

    model = tiny_model(n_layer=1, n_positions=32, vocab_size=101)
    folder = save_pretrained(model, tmp_path / "m")
    assert mode(folder / "config.json") == mode(folder / "model.safetensors") == 0o644


# --------------------------------------------------------------------------- save_files


_KILL_AT = textwrap.dedent("""
    import os, sys
    from gpt2lib import files
    folder, where = sys.argv[1], int(sys.argv[2])
    real_replace, seen = os.replace, [0]
    def replace(src, dst):
        if seen[0] == where:
            os._exit(9)  # as kill -9 would
        seen[0] += 1
        real_replace(src, dst)
    os.replace = replace
    files.save_files(folder, {"a.txt": "new a", "b.txt": "new b", "c.txt": "new c"})
""")


@pytest.mark.parametrize("where", range(5))
def test_a_unit_save_killed_at_any_rename_leaves_the_old_or_the_new_unit(tmp_path, where):
    files.save_files(tmp_path, {"a.txt": "old a", "b.txt": "old b", "c.txt": "old c"})
    out = subprocess.run(
        [sys.executable, "-c", _KILL_AT, str(tmp_path), str(where)],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert out.returncode in (0, 9), out.stderr
    with files.folder_lock(tmp_path, exclusive=True):
        files.recover_saves(tmp_path)
    texts = [(tmp_path / n).read_text(encoding="utf-8") for n in ("a.txt", "b.txt", "c.txt")]
    assert texts in (["old a", "old b", "old c"], ["new a", "new b", "new c"]), (where, texts)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["a.txt", "b.txt", "c.txt"]


def test_an_error_before_the_commit_leaves_the_folder_as_it_was(tmp_path):
    files.save_files(tmp_path, {"a.txt": "old a", "b.txt": "old b"})

    def fails(path):
        raise OSError(28, "No space left on device")

    with pytest.raises(OSError, match="No space left"):
        files.save_files(tmp_path, {"a.txt": "new a", "b.txt": fails})
    assert sorted(p.name for p in tmp_path.iterdir()) == ["a.txt", "b.txt"]
    assert (tmp_path / "a.txt").read_text(encoding="utf-8") == "old a"


def test_save_files_refuses_names_that_are_not_plain(tmp_path):
    for names in ({"../x": ""}, {"a/b": ""}, {}, {".commit": ""}):
        with pytest.raises(ValueError, match="plain file names"):
            files.save_files(tmp_path, names)


# --------------------------------------------------------------------------- the tokenizer


_KILL_TOKENIZER = textwrap.dedent("""
    import os, pathlib, sys
    from gpt2lib.tokenizer import BPETokenizer
    folder = os.path.abspath(sys.argv[1])
    text = "the new tokenizer learns other merges " * 40
    new = BPETokenizer.train(text, 280, special_tokens=["<|endoftext|>"])
    def dies_at_vocab_bpe(path):
        path = os.path.abspath(os.fspath(path))
        if os.path.basename(path) == "vocab.bpe" and os.path.dirname(path) == folder:
            os._exit(9)  # encoder.json is written, vocab.bpe is not: as kill -9 would leave it
    real_replace, real_write = os.replace, pathlib.Path.write_text
    def replace(src, dst):
        dies_at_vocab_bpe(dst)
        real_replace(src, dst)
    def write_text(self, *args, **kwargs):
        dies_at_vocab_bpe(self)
        return real_write(self, *args, **kwargs)
    os.replace, pathlib.Path.write_text = replace, write_text
    new.save(folder, overwrite=True)
""")


def test_a_tokenizer_save_killed_between_its_two_files_keeps_a_whole_tokenizer(tmp_path):
    from gpt2lib.tokenizer import BPETokenizer

    old = BPETokenizer.train("an old tokenizer, trained on this " * 40, 275)
    new = BPETokenizer.train(
        "the new tokenizer learns other merges " * 40, 280, special_tokens=["<|endoftext|>"]
    )
    old.save(tmp_path)
    out = subprocess.run(
        [sys.executable, "-c", _KILL_TOKENIZER, str(tmp_path)],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert out.returncode == 9, out.stderr
    loaded = BPETokenizer.load(tmp_path)  # finishes the killed save
    assert (loaded.vocab, loaded.merges) in ((old.vocab, old.merges), (new.vocab, new.merges))
    assert sorted(p.name for p in tmp_path.iterdir()) == ["encoder.json", "vocab.bpe"]


def test_a_tokenizer_folder_with_damaged_files_is_named(tmp_path):
    from gpt2lib.tokenizer import BPETokenizer

    BPETokenizer.train("some text to learn from " * 20, 270).save(tmp_path)
    merges = (tmp_path / "vocab.bpe").read_bytes()
    (tmp_path / "vocab.bpe").write_bytes(b"#version: 0.2\n\xff\xfe a\n")
    with pytest.raises(ValueError, match="vocab.bpe is not UTF-8 text"):
        BPETokenizer.load(tmp_path)
    (tmp_path / "vocab.bpe").write_bytes(merges)
    encoder = json.loads((tmp_path / "encoder.json").read_text(encoding="utf-8"))
    encoder["!"] = -3
    (tmp_path / "encoder.json").write_text(json.dumps(encoder), encoding="utf-8")
    with pytest.raises(ValueError, match="encoder.json: the id of '!' must be at least 0, got -3"):
        BPETokenizer.load(tmp_path)


def test_json_object_returns_the_object_or_names_the_file_and_what_is_wrong():
    assert files.json_object(b'{"n_layer": 2}', "'c.json'") == {"n_layer": 2}

    class SaveError(ValueError):
        pass

    cases = {  # what the file holds: what the error says
        b"{not json": "'c.json' is not valid JSON (Expecting property name",
        b"\xff\xfe\xfd": "'c.json' is not valid JSON (",
        b"[" * 100_000: "'c.json' is not valid JSON (nested too deeply); see the docs",
        b"[1, 2]": "'c.json' must hold one JSON object, got list; see the docs",
    }
    for text, message in cases.items():
        with pytest.raises(SaveError) as caught:
            files.json_object(text, "'c.json'", SaveError, hint="; see the docs")
        assert str(caught.value).startswith(message), (text[:10], str(caught.value))
