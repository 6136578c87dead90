"""The first `generate` of a process against the second: what a learner's first call costs.

    python benchmarks/first_generate.py                   # stand-in, 2 threads, 5 new tokens
    python benchmarks/first_generate.py --threads 1 --new-tokens 20 --model data/standin

Each run starts a fresh Python process (the first call is only first once per process), loads
the model, then times `generate` twice on the same prompt and prints both and their difference.
`generate` measures nothing by itself (split routes are measured only by
`python -m gpt2lib.speed tune`), so the difference is PyTorch's own warm-up. `--tuned` runs with
the routes measured and kept on disk beforehand (in a temporary cache folder), `--untuned`
(the default) with none. Issue 35's goal: the first call at most 1 s slower than the second on
a quiet 2-core machine.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent

CHILD = """
import json, sys, time
import torch
torch.set_num_threads({threads})
from gpt2lib import from_pretrained, generate
if {tuned}:
    from gpt2lib import speed
    speed.tune()
model = from_pretrained({model!r}, device="cpu")
ids = torch.tensor([[464, 2068, 7586, 21831, 18045, 625, 262]])
times = []
for _ in range(2):
    began = time.perf_counter()
    generate(model, ids, {new}, temperature=0)
    times.append(time.perf_counter() - began)
print(json.dumps(dict(first=times[0], second=times[1])))
"""


def run_once(model: str, threads: int, new: int, tuned: bool) -> dict:
    with tempfile.TemporaryDirectory() as cache:
        env = {**os.environ, "GPT2LIB_CACHE_DIR": cache, "OMP_NUM_THREADS": str(threads)}
        code = CHILD.format(threads=threads, tuned=tuned, model=model, new=new)
        done = subprocess.run(
            [sys.executable, "-c", code],
            capture_output=True,
            text=True,
            cwd=REPO,
            env=env,
            check=True,
        )
    return json.loads(done.stdout.strip().splitlines()[-1])


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="data/standin")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--new-tokens", type=int, default=5)
    parser.add_argument("--repeats", type=int, default=3, help="fresh processes to run")
    tuning = parser.add_mutually_exclusive_group()
    tuning.add_argument("--tuned", action="store_true", help="routes measured beforehand")
    tuning.add_argument("--untuned", action="store_true", help="no routes measured (default)")
    args = parser.parse_args(argv)
    print(
        f"{args.model}, {args.threads} threads, {args.new_tokens} new tokens, "
        f"{'tuned' if args.tuned else 'untuned'}; one fresh process a row:"
    )
    for _ in range(args.repeats):
        row = run_once(args.model, args.threads, args.new_tokens, args.tuned)
        print(
            f"  first {row['first']:.3f} s, second {row['second']:.3f} s, "
            f"first - second {row['first'] - row['second']:+.3f} s"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
