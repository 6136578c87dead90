"""Train the stand-in GPT-2 that chapters 8 and 9 use when OpenAI's weights are not available.

    python tools/make_standin.py data/standin            # the committed stand-in (chapter 7's CPU run: about 10 min on 2 cores)
    python tools/make_standin.py /tmp/try --steps 100    # a quick, worse one

The model is chapter 7's CPU setting: gpt2lib.GPT2 with 4 layers, width 128, 4 heads and a
context of 128 tokens, on GPT-2's full 50,257-token vocabulary (so GPT-2's tokenizer reads
it), trained with gpt2lib.training.train on Tiny Shakespeare (the first 90% of its tokens)
with the chapter's CPU setting: the same seed, steps, batches and schedule, so the stand-in
is the model a learner gets from the chapter's run on a CPU. The weights are stored in float16 to keep the folder
under 15 MB; a README.md beside them records the run. The same command on the same machine
type gives the same weights (seeded).
"""

from __future__ import annotations

import argparse
import json
import math
import platform
import sys
from pathlib import Path

import torch

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from gpt2lib.chapters.config import GPT2Config
from gpt2lib.chapters.model import GPT2
from gpt2lib.checkpoint import save_pretrained
from gpt2lib.model import from_pretrained
from gpt2lib.tokenizer import get_encoding
from gpt2lib.training import ngram_baselines, sample, train

CONFIG = {
    "n_layer": 4,
    "n_embd": 128,
    "n_head": 4,
    "n_positions": 128,
    "embd_pdrop": 0.0,
    "attn_pdrop": 0.0,
    "resid_pdrop": 0.0,
}


def shakespeare_splits(enc):
    """Tiny Shakespeare as GPT-2 ids, split 90/10 into training and validation as chapter 7 does."""
    text = (REPO / "data" / "tinyshakespeare.txt").read_text(encoding="utf-8")
    ids = torch.tensor(enc.encode_ordinary(text))
    split = int(0.9 * len(ids))
    return ids[:split], ids[split:]


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("folder", type=Path)
    parser.add_argument("--steps", type=int, default=600)
    parser.add_argument("--batch-size", type=int, default=8)
    parser.add_argument("--max-lr", type=float, default=3e-3)
    parser.add_argument("--warmup-steps", type=int, default=50)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--threads", type=int, default=None, help="torch CPU threads")
    parser.add_argument(
        "--overwrite",
        action="store_true",
        help="replace config.json and model.safetensors if the folder holds them",
    )
    args = parser.parse_args(argv)
    if args.threads:
        torch.set_num_threads(args.threads)

    enc = get_encoding()
    train_ids, val_ids = shakespeare_splits(enc)
    baselines = ngram_baselines(train_ids, val_ids, enc.n_vocab)

    torch.manual_seed(args.seed)
    model = GPT2(GPT2Config(**CONFIG))

    def report(history, model):
        print(
            f"step {history.eval_step[-1]:5d}  train {history.eval_train_loss[-1]:.3f}  "
            f"val {history.eval_val_loss[-1]:.3f}  ({history.seconds:.0f} s)",
            flush=True,
        )

    history = train(
        model,
        train_ids,
        val_ids,
        args.steps,
        batch_size=args.batch_size,
        block_size=CONFIG["n_positions"],
        max_lr=args.max_lr,
        warmup_steps=args.warmup_steps,
        eval_every=max(1, args.steps // 10),
        eval_batches=4,
        seed=args.seed,
        on_eval=report,
        progress=False,
    )
    folder = save_pretrained(model, args.folder, overwrite=args.overwrite, dtype=torch.float16)
    (folder / "model.safetensors").chmod(0o644)

    reloaded = from_pretrained(folder, device="cpu")  # what the chapters will see
    prompt = torch.tensor([enc.encode("ROMEO:\n")])
    greedy = enc.decode(sample(reloaded, prompt, 60, temperature=0)[0].tolist())
    sampled = enc.decode(
        sample(reloaded, prompt, 60, temperature=0.8, generator=torch.Generator().manual_seed(0))[
            0
        ].tolist()
    )
    record = {
        "command": "python tools/make_standin.py "
        + " ".join(argv if argv is not None else sys.argv[1:]),
        "config": CONFIG,
        "steps": args.steps,
        "batch_size": args.batch_size,
        "block_size": CONFIG["n_positions"],
        "max_lr": args.max_lr,
        "warmup_steps": args.warmup_steps,
        "seed": args.seed,
        "final_val_loss": round(history.val_loss, 4),
        "final_val_perplexity": round(math.exp(history.val_loss), 1),
        "baselines": {k: round(v, 4) for k, v in baselines.items()},
        "seconds": round(history.seconds),
        "torch": torch.__version__,
        "machine": f"{platform.machine()}, {torch.get_num_threads()} threads",
    }
    print(json.dumps(record, indent=2))
    print("greedy:", repr(greedy))
    print("sampled:", sampled)
    (folder / "training_record.json").write_text(
        json.dumps(record, indent=2) + "\n", encoding="utf-8"
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
