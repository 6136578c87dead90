"""Chapter 10's classifier: LoRA's accuracy gain against full fine-tuning's, over seeds and splits.

Issue #25 asks that LoRA (under 2% of the parameters) reach at least 90% of full fine-tuning's
gain over the majority baseline, on the same data and steps. The chapter measures one seed on a
test split of 129 speeches, where one speech is 0.8 points. This script repeats the comparison
over seeds, on the chapter's split or a larger one, and adds a method the package does not have
yet: a LoRA adapter on the token table `wte` (peft's `lora_embedding_A/B`; defined here only).

    python benchmarks/lora_gain.py --seeds 0 1 2 --methods full lora wte_lora
    python benchmarks/lora_gain.py --split 60/20/20 --seeds 0 1

Setting: the stand-in (data/standin), 150 steps of batch 16, 48 tokens per speech, as the chapter
at GPT2LIB_QUICK=1. Methods and learning rates: full (every weight, 3e-4, the chapter's); lora
(rank 8, alpha 16 on c_attn, c_proj, c_fc, 1e-3, the chapter's; 0.91% trained); wte_lora (rank 2,
alpha 4 on wte only, 1e-2; 1.39%); wte_lora+ (wte rank 2 and rank 4 on c_attn, c_proj, c_fc,
3e-3; 1.82%). The head trains in every method. `--lr` sets one rate for all (the lora rows
at 3e-3 and 1e-2 below).

Measured on 2026-12-02, one thread of a shared 2-core Xeon (accuracy in %, gain in points over
the majority baseline of that split; val baseline 12.2 and test 20.9 on 80/10/10, 15.2 and 16.7
on 60/20/20):

    split     method      lr     seed 0 val/test  seed 1 val/test  seed 2 val/test  mean test gain
    80/10/10  full        3e-4   28.5 / 34.1      26.0 / 28.7      28.5 / 21.7      +7.3
    80/10/10  lora        1e-3   18.7 / 25.6      -                -                +4.7 (1 seed)
    80/10/10  lora        3e-3   21.1 / 21.7      18.7 / 21.7      13.0 / 22.5      +1.0
    80/10/10  lora        1e-2   12.2 / 22.5      16.3 / 20.9      13.0 / 22.5      +1.0
    80/10/10  wte_lora    1e-2   30.1 / 25.6      18.7 / 30.2      24.4 / 24.8      +6.0 (82%)
    80/10/10  wte_lora+   3e-3   26.0 / 27.1      25.2 / 25.6      25.2 / 34.1      +8.0 (110%)
    60/20/20  full        3e-4   28.7 / 26.2      22.8 / 25.0      -                +8.9
    60/20/20  wte_lora    1e-2   26.2 / 31.4      28.3 / 25.8      -                +11.9 (134%)

Read: LoRA on the blocks alone gains at most +4.7, about +1 at the larger rates (at seed 0 its training loss ends near 1.97,
full fine-tuning's near 1.58); full fine-tuning's gain comes from moving the token table
(frozen, it gains +5.4 at seed 0; the chapter's Exercise 10.9b). An adapter on the table, within
the 2% budget, matches full fine-tuning on average; single runs scatter by about 5 points either
way, so a single-seed comparison on 129 speeches cannot show 90%. On the 60/20/20 split full
fine-tuning's own gain at seed 0 is +9.5, under the chapter's 10-point goal.
"""

import argparse
import copy
import hashlib
import statistics

import torch
import torch.nn as nn
import torch.nn.functional as F

import gpt2lib.finetune as ft
from gpt2lib.loading import from_pretrained
from gpt2lib.tokenizer import get_encoding
from gpt2lib.tuning import classification_loss

BLOCKS = ("c_attn", "c_proj", "c_fc")


class LoRAEmbedding(nn.Module):
    """peft's LoRA on an embedding: base(idx) + B·A[:, idx] · alpha / rank, A starting at zero."""

    def __init__(self, base, rank, alpha):
        super().__init__()
        n_rows, width = base.weight.shape
        self.base, self.scale = base, alpha / rank
        self.lora_embedding_A = nn.Parameter(torch.zeros(rank, n_rows))
        self.lora_embedding_B = nn.Parameter(torch.randn(width, rank))

    @property
    def weight(self):  # the tied readout keeps reading the base table, as in peft
        return self.base.weight

    def forward(self, idx):
        update = F.embedding(idx, self.lora_embedding_A.T) @ self.lora_embedding_B.T  # (B, T, C)
        return self.base(idx) + update * self.scale


def body(base, method):
    gpt = copy.deepcopy(base)
    if method == "lora":
        return ft.apply_lora(gpt, rank=8, alpha=16, targets=BLOCKS), 1e-3
    if method in ("wte_lora", "wte_lora+"):
        if method == "wte_lora+":
            ft.apply_lora(gpt, rank=4, alpha=8, targets=BLOCKS)
        for p in gpt.parameters():
            p.requires_grad_(False)
        for p in ft.lora_layers(gpt).values():
            p.lora_A.weight.requires_grad_(True)
            p.lora_B.weight.requires_grad_(True)
        gpt.wte = LoRAEmbedding(gpt.wte, 2, 4)
        return gpt, (3e-3 if method == "wte_lora+" else 1e-2)
    return gpt, 3e-4  # full


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--seeds", type=int, nargs="+", default=[0])
    parser.add_argument("--methods", nargs="+", default=["full", "lora", "wte_lora"])
    parser.add_argument("--split", default="80/10/10", choices=["80/10/10", "60/20/20"])
    parser.add_argument("--steps", type=int, default=150)
    parser.add_argument("--lr", type=float, default=None, help="one rate for every method")
    args = parser.parse_args()
    torch.set_num_threads(1)
    if args.split == "60/20/20":
        def split_of(key):
            bucket = int(hashlib.sha256(key.encode("utf-8")).hexdigest(), 16) % 10
            return "train" if bucket < 6 else ("val" if bucket < 8 else "test")
        ft._split_of = split_of
    base = from_pretrained("data/standin", device="cpu", dtype=torch.float32).eval()
    tokenizer = get_encoding()
    pad = tokenizer.eot_token
    data = ft.speaker_dataset(top=8)
    rows = {s: ft.encode_speeches(r, tokenizer, max_tokens=48) for s, r in data.splits.items()}
    baselines = {s: data.majority_baseline(s) for s in ("val", "test")}
    print(f"split {args.split}: {({s: len(r) for s, r in rows.items()})}, majority baseline "
          f"val {baselines['val']:.1%}, test {baselines['test']:.1%}")
    gains = {}
    for method in args.methods:
        for seed in args.seeds:
            torch.manual_seed(seed)
            gpt, lr = body(base, method)
            model = ft.classifier(gpt, len(data.speakers))
            ft.fine_tune(model, lambda m, b: classification_loss(m, b, pad), rows["train"], args.steps,
                         batch_size=16, lr=args.lr or lr, seed=seed, progress=False)
            acc = {s: ft.accuracy(model, rows[s], pad, progress=False)[0] for s in ("val", "test")}
            trained, total = ft.trainable_parameters(model)
            gains.setdefault(method, []).append(acc["test"] - baselines["test"])
            print(f"{method:10s} lr {args.lr or lr:.0e} seed {seed}: {trained / total:.2%} trained; "
                  f"val {acc['val']:.1%} ({100 * (acc['val'] - baselines['val']):+.1f}), "
                  f"test {acc['test']:.1%} ({100 * gains[method][-1]:+.1f} points)", flush=True)
    for method, values in gains.items():
        ratio = ""
        if "full" in gains and method != "full":
            ratio = f", {statistics.mean(values) / statistics.mean(gains['full']):.0%} of full's"
        print(f"mean test gain, {method}: {100 * statistics.mean(values):+.1f} points{ratio}")


if __name__ == "__main__":
    main()
