"""Encode throughput of the chapter-1 tokenizer against tiktoken, on a few MB of English.

    python benchmarks/tokenizer_speed.py            # about 2 MB, 3 repeats
    python benchmarks/tokenizer_speed.py --mb 1 --repeats 5 --clock cpu

The text is Python's own documentation, which ships with every CPython: the reference topics
in `pydoc_data.topics` and, to reach the requested size, the docstrings of the standard
library (both under the PSF licence; nothing is copied into the repository).

Measured, single thread:
- BPETokenizer, cold: a fresh tokenizer (empty word cache) encodes the whole text once;
- BPETokenizer, warm: the same tokenizer encodes the text again (every piece is cached);
- tiktoken: `gpt2lib.tokenizer.get_encoding()`, built from the same files.
Both must give identical ids before anything is timed. Each figure is the median of the repeats.

`measure(text, repeats=...)` returns the numbers as a dict for other benchmarks to import.
"""

from __future__ import annotations

import argparse
import ast
import statistics
import sys
import sysconfig
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # run from a clone without installing

from gpt2lib.tokenizer import BPETokenizer, get_encoding  # noqa: E402


def english_text(megabytes: float = 2.0) -> str:
    """About `megabytes` MB of English prose from CPython's documentation and docstrings."""
    import pydoc_data.topics

    target = int(megabytes * 1_000_000)
    parts = [pydoc_data.topics.topics[key] for key in sorted(pydoc_data.topics.topics)]
    size = sum(len(p.encode("utf-8")) for p in parts)
    stdlib = Path(sysconfig.get_paths()["stdlib"])
    for path in sorted(stdlib.rglob("*.py")):
        if size >= target:
            break
        if "site-packages" in path.parts:
            continue
        try:
            tree = ast.parse(path.read_text(encoding="utf-8"))
        except (SyntaxError, UnicodeDecodeError, ValueError, OSError):
            continue
        for node in ast.walk(tree):
            if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)):
                doc = ast.get_docstring(node)
                if doc and len(doc) > 80:  # skip one-liners: keep prose, not signatures
                    parts.append(doc)
                    size += len(doc.encode("utf-8"))
    text = "\n\n".join(parts)
    data = text.encode("utf-8")[:target]
    return data.decode("utf-8", errors="ignore")


CLOCKS = {"wall": time.perf_counter, "cpu": time.process_time}


def _median_seconds(fn, repeats: int, clock) -> float:
    times = []
    for _ in range(repeats):
        start = clock()
        fn()
        times.append(clock() - start)
    return statistics.median(times)


def measure(text: str, repeats: int = 3, clock: str = "wall") -> dict:
    """Encode `text` with BPETokenizer (cold and warm cache) and tiktoken; MB/s for each.

    clock: "wall" (elapsed time) or "cpu" (this process's CPU time: steadier on a busy machine;
    every encoder timed here runs on one thread). Raises AssertionError if the two tokenizers
    disagree on the ids.
    """
    if repeats < 1:
        raise ValueError(f"repeats must be at least 1, got {repeats}")
    if clock not in CLOCKS:
        raise ValueError(f"clock must be one of {sorted(CLOCKS)}, got {clock!r}")
    timer = CLOCKS[clock]
    megabytes = len(text.encode("utf-8")) / 1e6
    encoding = get_encoding()
    reference_ids = encoding.encode_ordinary(text)
    checked = BPETokenizer.gpt2()
    ids = checked.encode_ordinary(text)
    if ids != reference_ids:
        first = next(i for i, (a, b) in enumerate(zip(ids, reference_ids)) if a != b) if len(ids) == len(reference_ids) else None
        raise AssertionError(f"BPETokenizer and tiktoken disagree (first difference at token {first})")

    cold_times = []
    for _ in range(repeats):
        fresh = BPETokenizer.gpt2()  # loading the files is not part of the time
        start = timer()
        fresh.encode_ordinary(text)
        cold_times.append(timer() - start)
    cold = statistics.median(cold_times)
    warm = _median_seconds(lambda: checked.encode_ordinary(text), repeats, timer)
    fast = _median_seconds(lambda: encoding.encode_ordinary(text), repeats, timer)
    return {
        "megabytes": megabytes,
        "tokens": len(reference_ids),
        "repeats": repeats,
        "clock": clock,
        "bpe_cold_mb_s": megabytes / cold,
        "bpe_warm_mb_s": megabytes / warm,
        "tiktoken_mb_s": megabytes / fast,
        "tiktoken_vs_cold": cold / fast,
        "tiktoken_vs_warm": warm / fast,
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--mb", type=float, default=2.0, help="megabytes of text (default 2; about 2.4 is available)")
    parser.add_argument("--repeats", type=int, default=3, help="timed repeats; the median is shown (default 3)")
    parser.add_argument("--clock", choices=sorted(CLOCKS), default="wall",
                        help="wall: elapsed time (default); cpu: CPU time, steadier on a busy machine")
    args = parser.parse_args(argv)
    text = english_text(args.mb)
    result = measure(text, repeats=args.repeats, clock=args.clock)
    print(f"{result['megabytes']:.2f} MB of English, {result['tokens']:,} tokens, identical ids; "
          f"median of {result['repeats']} runs, {args.clock} clock")
    print(f"{'tokenizer':28} {'MB/s':>8} {'tiktoken is':>14}")
    print(f"{'BPETokenizer, cold cache':28} {result['bpe_cold_mb_s']:8.2f} {result['tiktoken_vs_cold']:13.1f}x")
    print(f"{'BPETokenizer, warm cache':28} {result['bpe_warm_mb_s']:8.2f} {result['tiktoken_vs_warm']:13.1f}x")
    print(f"{'tiktoken (get_encoding())':28} {result['tiktoken_mb_s']:8.2f} {'1.0':>13}x")
    return 0


if __name__ == "__main__":
    sys.exit(main())
