"""The tokenizer under stress: files that do not belong together, threads sharing one tokenizer,
a stream of tiny chunks, and training text that encode() accepts (issue 24)."""

from __future__ import annotations

import shutil
import sys
import threading
from pathlib import Path

import pytest

from gpt2lib.tokenizer import BPETokenizer, gpt2_data_dir


@pytest.fixture(scope="module")
def gpt2() -> BPETokenizer:
    return BPETokenizer.gpt2()


def gpt2_files_with(tmp_path: Path, merge_lines: slice | None = None) -> Path:
    folder = tmp_path / "tok"
    folder.mkdir()
    shutil.copy(gpt2_data_dir() / "encoder.json", folder / "encoder.json")
    lines = (gpt2_data_dir() / "vocab.bpe").read_text(encoding="utf-8").split("\n")
    header, merges = lines[0], [line for line in lines[1:] if line]
    kept = merges[merge_lines] if merge_lines is not None else merges
    (folder / "vocab.bpe").write_text("\n".join([header, *kept]) + "\n", encoding="utf-8")
    return folder


def test_gpt2s_own_files_load_with_one_special_token(tmp_path, gpt2):
    loaded = BPETokenizer.load(gpt2_files_with(tmp_path))
    assert loaded.special_tokens == {"<|endoftext|>": 50256}
    assert loaded.encode("Hello world, how are you?") == gpt2.encode("Hello world, how are you?")


@pytest.mark.parametrize(
    "kept",
    [slice(0, 25_000), slice(0, 49_990), slice(10, None)],
    ids=["first-half", "all-but-ten", "first-ten-missing"],
)
def test_a_merges_file_that_does_not_fit_the_vocabulary_is_refused(tmp_path, kept):
    folder = gpt2_files_with(tmp_path, kept)
    with pytest.raises(ValueError, match=r"do not belong together") as caught:
        BPETokenizer.load(folder)
    message = str(caught.value)
    assert "encoder.json" in message and "vocab.bpe" in message
    assert "no merge" in message  # says what does not fit


def test_a_saved_tokenizer_with_its_special_tokens_still_loads(tmp_path):
    text = (gpt2_data_dir() / "bpe_training_text.txt").read_text(encoding="utf-8")
    trained = BPETokenizer.train(text, 320, special_tokens=["<|endoftext|>", "<|pad|>"])
    loaded = BPETokenizer.load(trained.save(tmp_path / "small"))
    assert loaded.special_tokens == trained.special_tokens
    sample = "the tokenizer<|pad|> reads"
    assert loaded.encode(sample, allowed_special="all") == trained.encode(
        sample, allowed_special="all"
    )


def test_threads_sharing_one_tokenizer_get_the_same_ids_as_one_thread(gpt2):
    words = [f"word{i} and {i * 7}x{i % 13} " for i in range(3000)]
    texts = ["".join(words[i : i + 40]) for i in range(0, len(words), 40)]
    expected = [BPETokenizer.gpt2().encode(text) for text in texts]
    shared = BPETokenizer.gpt2()
    shared.cache_limit = 64  # clear the shared cache all the time, as a long run would
    errors: list[BaseException] = []
    results: dict[int, list[list[int]]] = {}

    def work(worker: int) -> None:
        try:
            results[worker] = [shared.encode(text) for _ in range(3) for text in texts]
        except BaseException as exc:  # noqa: BLE001 - reported below
            errors.append(exc)

    old = sys.getswitchinterval()
    sys.setswitchinterval(1e-6)  # switch threads as often as possible
    try:
        threads = [threading.Thread(target=work, args=(w,)) for w in range(4)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
    finally:
        sys.setswitchinterval(old)
    assert not errors, f"{type(errors[0]).__name__}: {errors[0]}"
    for worker in range(4):
        assert results[worker] == expected * 3
    assert len(shared._cache) <= shared.cache_limit


class CountingSplitter:
    """The tokenizer's compiled pattern, counting the characters every search is given."""

    def __init__(self, compiled):
        self.compiled, self.scanned = compiled, 0

    def finditer(self, text, pos=0, endpos=None):
        self.scanned += (len(text) if endpos is None else endpos) - pos
        return self.compiled.finditer(text, pos, endpos if endpos is not None else len(text))

    def findall(self, text, *args):
        self.scanned += len(text)
        return self.compiled.findall(text, *args)


@pytest.mark.parametrize(
    "text",
    ["a" * 40_000, " " * 40_000, "1" * 40_000, ("The quick brown fox, isn't it? " * 1300)[:40_000]],
    ids=["letters", "spaces", "digits", "prose"],
)
def test_streaming_one_character_chunks_scans_each_character_a_few_times(text, gpt2):
    tok = BPETokenizer.gpt2()
    tok._splitter = CountingSplitter(tok._splitter)
    ids = list(tok.encode_iterable(iter(text)))
    assert ids == gpt2.encode(text)
    # Linear: a bounded number of scans per character (a quadratic stream scans ~n²/2 = 8e8).
    assert tok._splitter.scanned <= 10 * len(text), tok._splitter.scanned


def test_a_disallowed_special_token_split_over_chunks_is_still_refused(gpt2):
    chunks = list("some text <|endoftext|> more")
    with pytest.raises(ValueError, match="special token '<\\|endoftext\\|>'"):
        list(gpt2.encode_iterable(chunks))
    allowed = list(gpt2.encode_iterable(chunks, allowed_special="all"))
    assert allowed == gpt2.encode("".join(chunks), allowed_special="all")


def test_training_on_a_lone_surrogate_treats_it_as_encode_does(gpt2):
    text = "ab\ud800cd ab\ud800cd ab\ud800cd xy"
    trained = BPETokenizer.train(text, 262)
    # encode() turns the lone surrogate into U+FFFD; training learned from the same bytes.
    replaced = text.replace("\ud800", "\ufffd")
    assert trained.encode(text) == trained.encode(replaced)
    assert "\ufffd".encode("utf-8") in trained.vocab or any(
        b"\xef\xbf\xbd" in token for token in trained.vocab
    )
    assert trained.decode(trained.encode(text)) == replaced
