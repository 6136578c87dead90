"""Speed of the chapter-1 tokenizer: encoding against tiktoken, training against Hugging Face.

    python benchmarks/tokenizer_speed.py                 # everything, pinned to one core
    python benchmarks/tokenizer_speed.py --skip-encode   # training only
    python benchmarks/tokenizer_speed.py --shakespeare /work/shared/data/tinyshakespeare.txt

Encoding (single thread, ids checked identical to tiktoken's before anything is timed):
- BPETokenizer, cold: a fresh tokenizer (empty word cache) encodes about 2 MB of English once;
- BPETokenizer, warm: the same tokenizer encodes the text again (every piece is cached);
- tiktoken: `gpt2lib.tokenizer.get_encoding()`, built from the same files;
- long runs of one character, each a single pre-token: "é" * 8000 and 1 MB of "a".
The English is Python's own documentation, which ships with every CPython: the reference topics
in `pydoc_data.topics` and, to reach the requested size, the docstrings of the standard
library (both under the PSF licence; nothing is copied into the repository).

Training (`BPETokenizer.train`, GPT-2's split pattern, byte-level), beside Hugging Face
`tokenizers`' BpeTrainer with its ByteLevel pre-tokenizer (GPT-2's pattern too) on the same text:
- vocab 500 on the first 130 KB of that English;
- vocab 10,000 on Tiny Shakespeare (data/tinyshakespeare.txt, else ../shared/data/ beside the
  repository, else --shakespeare PATH).
The simple loop of the chapter (`train_merges_simple`) is timed on the 130 KB text too.

The process pins itself to one core (os.sched_setaffinity) and sets RAYON_NUM_THREADS=1, so
that Hugging Face's trainer also runs on one core; --all-cores turns this off. Each figure is
the median of the repeats; CPU time and wall time are both shown, and on a busy machine the CPU
time is the steadier one.

`measure(text, repeats=...)` returns the encoding numbers as a dict for other benchmarks to
import; `measure_training(...)` the training numbers.
"""

from __future__ import annotations

import argparse
import ast
import json
import os
import platform
import statistics
import sys
import sysconfig
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))  # run from a clone without installing

from gpt2lib.speed.measure import median_seconds  # noqa: E402  (the timer the other benchmarks use)
from gpt2lib.tokenizer import BPETokenizer, get_encoding, train_merges_simple  # noqa: E402


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
    return median_seconds(fn, repeats=repeats, warmup=0, clock=clock)


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
        first = (
            next(i for i, (a, b) in enumerate(zip(ids, reference_ids)) if a != b)
            if len(ids) == len(reference_ids)
            else None
        )
        raise AssertionError(
            f"BPETokenizer and tiktoken disagree (first difference at token {first})"
        )

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


def pin_to_one_core() -> str:
    """Run this process, and the threads libraries start, on one core. Returns what was done."""
    os.environ["RAYON_NUM_THREADS"] = (
        "1"  # Hugging Face tokenizers' thread pool (read at first use)
    )
    os.environ["TOKENIZERS_PARALLELISM"] = "false"
    if hasattr(os, "sched_setaffinity"):
        core = min(os.sched_getaffinity(0))
        os.sched_setaffinity(0, {core})
        return f"pinned to core {core}"
    return "not pinned (no sched_setaffinity on this system)"


def _timed(fn, repeats: int) -> dict:
    """Median CPU and wall seconds of `fn()` over `repeats` runs, and the last result."""
    cpu, wall, result = [], [], None
    for _ in range(repeats):
        c, w = time.process_time(), time.perf_counter()
        result = fn()
        cpu.append(time.process_time() - c)
        wall.append(time.perf_counter() - w)
    return {"cpu_s": statistics.median(cpu), "wall_s": statistics.median(wall), "result": result}


def measure_long_runs(repeats: int = 1) -> list[dict]:
    """Encode long runs of one character (single pre-tokens) with BPETokenizer and tiktoken."""
    encoding = get_encoding()
    rows = []
    for name, text in [('"é" * 8000', "é" * 8000), ('"a" * 1,000,000', "a" * 1_000_000)]:
        tokenizer = BPETokenizer.gpt2()  # loading the files is not part of the time

        def cold_encode(text=text, tokenizer=tokenizer):
            tokenizer._cache.clear()  # every repeat starts with an empty word cache
            return tokenizer.encode(text)

        ours = _timed(cold_encode, repeats)
        theirs = _timed(lambda text=text: encoding.encode(text), repeats)
        if ours.pop("result") != theirs.pop("result"):
            raise AssertionError(f"BPETokenizer and tiktoken disagree on {name}")
        rows.append({"text": name, "gpt2lib": ours, "tiktoken": theirs})
    return rows


def shakespeare_path(given: str | None = None) -> Path:
    candidates = [Path(given)] if given else []
    candidates += [
        REPO / "data" / "tinyshakespeare.txt",
        REPO.parent / "shared" / "data" / "tinyshakespeare.txt",
    ]
    for path in candidates:
        if path.is_file():
            return path
    raise SystemExit(
        "Tiny Shakespeare not found; looked at "
        + ", ".join(map(str, candidates))
        + ". Pass --shakespeare PATH, or --skip-shakespeare."
    )


def hf_train(text: str, vocab_size: int):
    """Hugging Face tokenizers' BPE trainer, byte-level like GPT-2, on one text."""
    from tokenizers import Tokenizer, models, pre_tokenizers, trainers

    tokenizer = Tokenizer(models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tokenizer.train_from_iterator([text], trainer)
    return tokenizer


def measure_training(text: str, vocab_size: int, repeats: int = 1, simple: bool = False) -> dict:
    """Train a `vocab_size` BPE on `text` with gpt2lib and with Hugging Face (and the simple loop)."""
    ours = _timed(lambda: BPETokenizer.train(text, vocab_size), repeats)
    trained = ours.pop("result")
    hf = _timed(lambda: hf_train(text, vocab_size), repeats)
    hf_vocab = hf.pop("result").get_vocab_size()
    row = {
        "bytes": len(text.encode("utf-8")),
        "vocab_size": vocab_size,
        "gpt2lib": ours,
        "huggingface": hf,
        "gpt2lib_vocab": trained.n_vocab,
        "huggingface_vocab": hf_vocab,
    }
    if simple:
        slow = _timed(lambda: train_merges_simple(text, vocab_size), 1)
        if slow.pop("result") != (trained.vocab, trained.merges):
            raise AssertionError(
                "the simple loop and the incremental trainer learned different merges"
            )
        row["simple_loop"] = slow
    return row


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument(
        "--mb",
        type=float,
        default=2.0,
        help="megabytes of text to encode (default 2; about 2.4 is available)",
    )
    parser.add_argument(
        "--repeats", type=int, default=3, help="timed repeats; the median is shown (default 3)"
    )
    parser.add_argument(
        "--clock",
        choices=sorted(CLOCKS),
        default="cpu",
        help="clock of the encoding table: cpu (default, steadier on a busy machine) or wall",
    )
    parser.add_argument("--skip-encode", action="store_true", help="skip the encoding measurements")
    parser.add_argument("--skip-train", action="store_true", help="skip the training measurements")
    parser.add_argument(
        "--skip-shakespeare", action="store_true", help="skip the vocab-10,000 training"
    )
    parser.add_argument(
        "--shakespeare", help="path of tinyshakespeare.txt (default: data/, then ../shared/data/)"
    )
    parser.add_argument(
        "--all-cores", action="store_true", help="do not pin the process to one core"
    )
    parser.add_argument("--json", help="also write the numbers to this JSON file")
    args = parser.parse_args(argv)
    pinned = "all cores" if args.all_cores else pin_to_one_core()
    load = os.getloadavg()[0] if hasattr(os, "getloadavg") else float("nan")
    print(
        f"{platform.processor() or platform.machine()}, {os.cpu_count()} cores, {pinned}; "
        f"load average {load:.1f} at the start; Python {platform.python_version()}"
    )
    record: dict = {"pinned": pinned, "load_average_at_start": load}

    if not args.skip_encode:
        text = english_text(args.mb)
        result = measure(text, repeats=args.repeats, clock=args.clock)
        record["encode"] = result
        print(
            f"\nEncoding {result['megabytes']:.2f} MB of English, {result['tokens']:,} tokens, identical ids; "
            f"median of {result['repeats']} runs, {args.clock} clock"
        )
        print(f"{'tokenizer':28} {'MB/s':>8} {'tiktoken is':>14}")
        print(
            f"{'BPETokenizer, cold cache':28} {result['bpe_cold_mb_s']:8.2f} {result['tiktoken_vs_cold']:13.1f}x"
        )
        print(
            f"{'BPETokenizer, warm cache':28} {result['bpe_warm_mb_s']:8.2f} {result['tiktoken_vs_warm']:13.1f}x"
        )
        print(f"{'tiktoken (get_encoding())':28} {result['tiktoken_mb_s']:8.2f} {'1.0':>13}x")
        runs = measure_long_runs()
        record["long_runs"] = runs
        print(
            "\nLong runs of one character (one pre-token each), identical ids; seconds, CPU / wall"
        )
        for row in runs:
            ours, theirs = row["gpt2lib"], row["tiktoken"]
            print(
                f"{row['text']:18} BPETokenizer {ours['cpu_s']:6.2f} / {ours['wall_s']:6.2f}   "
                f"tiktoken {theirs['cpu_s']:6.2f} / {theirs['wall_s']:6.2f}   "
                f"ratio {ours['cpu_s'] / max(theirs['cpu_s'], 1e-9):6.1f}x (CPU)"
            )

    if not args.skip_train:
        jobs = [("130 KB of English", english_text(0.13), 500, True)]
        if not args.skip_shakespeare:
            path = shakespeare_path(args.shakespeare)
            jobs.append(("Tiny Shakespeare", path.read_text(encoding="utf-8"), 10_000, False))
        print("\nTraining BPE, seconds, CPU / wall (one run each)")
        record["training"] = []
        for name, text, vocab_size, simple in jobs:
            row = measure_training(text, vocab_size, repeats=1, simple=simple)
            row["text"] = name
            record["training"].append(row)
            ours, hf = row["gpt2lib"], row["huggingface"]
            line = (
                f"{name:34} vocab {vocab_size:6,}: gpt2lib {ours['cpu_s']:6.2f} / {ours['wall_s']:6.2f}   "
                f"Hugging Face {hf['cpu_s']:6.2f} / {hf['wall_s']:6.2f}   "
                f"gpt2lib / HF {ours['cpu_s'] / max(hf['cpu_s'], 1e-9):5.1f}x (CPU)"
            )
            if simple:
                slow = row["simple_loop"]
                line += f"\n{'':34} the chapter's simple loop {slow['cpu_s']:6.2f} / {slow['wall_s']:6.2f} (same merges)"
            print(line)
    if args.json:
        Path(args.json).write_text(json.dumps(record, indent=1), encoding="utf-8")
    return 0


if __name__ == "__main__":
    sys.exit(main())
