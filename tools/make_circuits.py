"""Train the small "circuits" GPT-2 that chapter 8 analyses when OpenAI's weights are not available.

    python tools/make_circuits.py data/circuits --overwrite --threads 1   # the committed model
    python tools/make_circuits.py /tmp/try --steps 300                    # a quick, worse one

The stand-in (`data/standin`, tools/make_standin.py) is chapter 7's CPU run: it writes
Shakespeare-shaped text but has no induction head, because nothing in a few minutes of Tiny
Shakespeare rewards copying. This model is trained to have the circuits chapter 8 looks for.
It is an ordinary gpt2lib.GPT2 (2 layers, width 128, 8 heads, context 128, GPT-2's 50,257
ids), so gpt2lib.from_pretrained and transformers both read it. Half of every batch is
windows of Tiny Shakespeare (the first 90% of its tokens, as chapter 7 trains on); the other
half is rows of <|endoftext|> and then a random segment of 8 to 60 common Tiny Shakespeare
tokens, repeated until the row is full. Predicting the repeats pays only for an induction
head: a previous-token head in layer 0 feeding a head in layer 1 that attends to the token
after the current token's earlier copy.

Only the tokens that occur in the training text can be targets, so the softmax of the
training loss runs over those 11,706 or so ids (about a quarter of the vocabulary, four times
cheaper on a CPU). The other rows of the tied token table are then set so that the full
softmax puts almost no probability on them (see `lower_unseen_rows`). Every `--eval-every`
steps the script logs the validation loss on Tiny Shakespeare and the best induction and
previous-token scores, measured here with plain tensor code (not gpt2lib.interpret), to
training_log.json: chapter 8 plots the induction score against the step, a phase change.

STATUS (work in progress, not yet shipped): no run so far reached the targets (an induction
head in layer >= 1 scoring >= 0.5, a previous-token head >= 0.5, the second copy >= 2 nats
cheaper). Measured on a shared 2-core machine, one thread, best induction score (layer >= 1):
- 8 heads, pool 2000, batch 12 (8 repeated rows), lr 3e-3, 1500 steps (14 min): 0.015,
  previous-token 0.06, second copy 7.58 vs first 7.62 nats (pool softmax).
- 4 heads, pool 500, batch 24 (20 repeated rows), lr 2e-3 (the defaults): 0.018 after 400
  steps (9 min), second copy 6.05 vs 6.31.
- repeated rows only, pool 300, batch 32, lr 1e-3, 4 heads: 0.008 after 400 steps, although
  the second copy got cheaper (4.92 vs 5.85): the model found another way than the induction
  stripe. Next to try: attention-only blocks, far more steps, or a larger batch.
"""

from __future__ import annotations

import argparse
import json
import math
import platform
import sys
import time
from pathlib import Path

import torch
import torch.nn.functional as F

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from gpt2lib.config import GPT2Config  # noqa: E402
from gpt2lib.loading import from_pretrained  # noqa: E402
from gpt2lib.model import GPT2  # noqa: E402
from gpt2lib.tokenizer import get_encoding  # noqa: E402
from gpt2lib.training import save_pretrained  # noqa: E402
from make_standin import shakespeare_splits  # noqa: E402  (tools/ is the script's folder)

CONFIG = {"n_layer": 2, "n_embd": 128, "n_head": 4, "n_positions": 128,
          "embd_pdrop": 0.0, "attn_pdrop": 0.0, "resid_pdrop": 0.0}
BOS = 50256  # <|endoftext|>
COMMON = 500  # random segments draw from this many most frequent training tokens


def common_tokens(train_ids, n=COMMON):
    """The n most frequent ids of the training text, most frequent first."""
    counts = torch.bincount(train_ids, minlength=BOS + 1)
    return counts.argsort(descending=True)[:n]


def repeated_rows(n_rows, T, pool, gen, min_len=8, max_len=60):
    """(n_rows, T + 1): <|endoftext|>, then a random segment of `pool` ids repeated to fill."""
    rows = torch.empty(n_rows, T + 1, dtype=torch.long)
    for r in range(n_rows):
        L = int(torch.randint(min_len, max_len + 1, (1,), generator=gen))
        seg = pool[torch.randint(0, len(pool), (L,), generator=gen)]
        reps = math.ceil(T / L)
        rows[r, 0] = BOS
        rows[r, 1:] = seg.repeat(reps)[:T]
    return rows


def text_rows(n_rows, T, ids, gen):
    starts = torch.randint(0, len(ids) - T - 1, (n_rows,), generator=gen)
    return torch.stack([ids[s:s + T + 1] for s in starts.tolist()])


def hidden(model, idx):
    """The final hidden states (B, T, C), through the model's own modules."""
    T = idx.shape[1]
    x = model.wte(idx) + model.wpe(torch.arange(T))
    for block in model.h:
        x = block(x)
    return model.ln_f(x)


def attention_patterns(model, idx):
    """Per layer (B, nh, T, T) attention probabilities, recomputed from q and k."""
    T = idx.shape[1]
    x = model.wte(idx) + model.wpe(torch.arange(T))
    patterns = []
    for block in model.h:
        attn = block.attn
        C, nh = attn.n_embd, attn.n_head
        q, k, _ = attn.c_attn(block.ln_1(x)).split(C, dim=2)
        q = q.view(*q.shape[:2], nh, C // nh).transpose(1, 2)
        k = k.view(*k.shape[:2], nh, C // nh).transpose(1, 2)
        scores = q @ k.transpose(-2, -1) / math.sqrt(C // nh)
        mask = torch.ones(T, T, dtype=torch.bool).triu(1)
        patterns.append(scores.masked_fill(mask, float("-inf")).softmax(-1))
        x = block(x)
    return patterns


@torch.no_grad()
def measure(model, val_ids, pool, seq_len=50, batch=8, seed=1234, within_pool=False):
    """Validation loss, induction and previous-token scores (n_layer, n_head), repeat losses."""
    model.eval()
    gen = torch.Generator().manual_seed(seed)
    seg = pool[torch.randint(0, len(pool), (batch, seq_len), generator=gen)]
    idx = torch.cat([torch.full((batch, 1), BOS), seg, seg], dim=1)  # (B, 2L + 1)
    pats = attention_patterns(model, idx)
    # query at position i in the second copy (i = L+1 .. 2L) attends to key i - L + 1
    induction = torch.stack([p.diagonal(offset=-(seq_len - 1), dim1=-2, dim2=-1)[..., -seq_len:]
                             .mean(dim=(0, -1)) for p in pats])
    if within_pool:  # during training: the softmax over the pool, as the training loss has it
        index = torch.full((BOS + 1,), -1, dtype=torch.long)
        index[pool] = torch.arange(len(pool))
        logits, targets = hidden(model, idx)[:, :-1] @ model.wte.weight[pool].T, index[idx[:, 1:]]
    else:  # the full softmax over GPT-2's 50,257 ids
        logits, targets = model(idx)[:, :-1], idx[:, 1:]
    nll = F.cross_entropy(logits.transpose(1, 2), targets, reduction="none")
    first, second = nll[:, :seq_len].mean().item(), nll[:, seq_len:].mean().item()
    text = torch.stack([val_ids[s:s + 129] for s in range(0, 8 * 129 * 4, 129 * 4)])
    pats_text = attention_patterns(model, text[:, :-1])
    previous = torch.stack([p.diagonal(offset=-1, dim1=-2, dim2=-1).mean(dim=(0, -1))
                            for p in pats_text])
    val = F.cross_entropy(model(text[:, :-1]).flatten(0, 1), text[:, 1:].flatten()).item()
    model.train()
    return {"val_loss": val, "induction": induction, "previous": previous,
            "first_copy_loss": first, "second_copy_loss": second}


@torch.no_grad()
def lower_unseen_rows(model, seen, val_ids):
    """Rows of wte for ids never seen in training: put them where the readout scores them low.

    Training never moved them (their logits were never computed), so they are still the
    N(0, 0.02) initialisation and would each take a small share of the full softmax. Setting
    them to minus the mean final hidden direction, scaled to a typical row's length, gives
    them the lowest logits (and they are never inputs in the chapter)."""
    unseen = torch.ones(model.config.vocab_size, dtype=torch.bool)
    unseen[seen] = False
    h = hidden(model, val_ids[:1024].view(8, 128))
    direction = h.mean(dim=(0, 1))
    direction = direction / direction.norm()
    norm = model.wte.weight[seen].norm(dim=1).mean()
    model.wte.weight[unseen] = -norm * direction


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("folder", type=Path)
    parser.add_argument("--steps", type=int, default=1800)
    parser.add_argument("--batch-size", type=int, default=24)
    parser.add_argument("--lr", type=float, default=2e-3)
    parser.add_argument("--warmup-steps", type=int, default=30)
    parser.add_argument("--repeat-fraction", type=float, default=0.83)
    parser.add_argument("--eval-every", type=int, default=50)
    parser.add_argument("--n-head", type=int, default=CONFIG["n_head"])
    parser.add_argument("--common", type=int, default=COMMON, help="size of the token pool")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--threads", type=int, default=None, help="torch CPU threads")
    parser.add_argument("--overwrite", action="store_true")
    args = parser.parse_args(argv)
    if args.threads:
        torch.set_num_threads(args.threads)

    enc = get_encoding()
    train_ids, val_ids = shakespeare_splits(enc)
    pool = common_tokens(train_ids, args.common)
    seen = torch.unique(torch.cat([train_ids, torch.tensor([BOS])]))  # the training softmax
    target_index = torch.full((BOS + 1,), -1, dtype=torch.long)
    target_index[seen] = torch.arange(len(seen))
    pool_index = torch.full((BOS + 1,), -1, dtype=torch.long)
    pool_index[pool] = torch.arange(len(pool))

    torch.manual_seed(args.seed)
    CONFIG["n_head"] = args.n_head
    model = GPT2(GPT2Config(**CONFIG))
    decay = [p for n, p in model.named_parameters() if p.dim() >= 2]
    no_decay = [p for n, p in model.named_parameters() if p.dim() < 2]
    opt = torch.optim.AdamW([{"params": decay, "weight_decay": 0.01},
                             {"params": no_decay, "weight_decay": 0.0}],
                            lr=args.lr, betas=(0.9, 0.95))
    gen = torch.Generator().manual_seed(args.seed)
    T = CONFIG["n_positions"]
    n_rep = round(args.batch_size * args.repeat_fraction)
    log = []
    start = time.time()
    model.train()
    for step in range(args.steps + 1):
        if step % args.eval_every == 0 or step == args.steps:
            m = measure(model, val_ids, pool, within_pool=True)
            entry = {"step": step, "seconds": round(time.time() - start, 1),
                     "val_loss": round(m["val_loss"], 4),
                     "induction": round(m["induction"][1:].max().item(), 4),
                     "previous": round(m["previous"].max().item(), 4),
                     "first_copy_loss": round(m["first_copy_loss"], 4),
                     "second_copy_loss": round(m["second_copy_loss"], 4)}
            log.append(entry)
            print(json.dumps(entry), flush=True)
        if step == args.steps:
            break
        lr = args.lr * min(1.0, (step + 1) / args.warmup_steps)
        lr *= 0.5 * (1 + math.cos(math.pi * step / args.steps)) * 0.9 + 0.1
        for group in opt.param_groups:
            group["lr"] = lr
        rows = torch.cat([repeated_rows(n_rep, T, pool, gen),
                          text_rows(args.batch_size - n_rep, T, train_ids, gen)])
        x, y = rows[:, :-1], rows[:, 1:]
        h = hidden(model, x)  # (B, T, C)
        # the repeated rows' targets are all in the pool, the text rows' in `seen`: each row's
        # softmax runs over the ids its targets can be (exact for those rows, and cheap)
        rep_logits = h[:n_rep] @ model.wte.weight[pool].T  # (n_rep, T, COMMON)
        text_logits = h[n_rep:] @ model.wte.weight[seen].T  # (B - n_rep, T, n_seen)
        loss = (F.cross_entropy(rep_logits.flatten(0, 1), pool_index[y[:n_rep]].flatten(),
                                reduction="sum")
                + F.cross_entropy(text_logits.flatten(0, 1), target_index[y[n_rep:]].flatten(),
                                  reduction="sum")) / y.numel()
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        if step % 10 == 0:
            print(f"step {step} loss {loss.item():.3f} ({time.time() - start:.0f} s)", flush=True)
    seconds = time.time() - start

    lower_unseen_rows(model, seen, val_ids)
    m = measure(model, val_ids, pool)
    folder = save_pretrained(model, args.folder, overwrite=args.overwrite, dtype=torch.float16)
    (folder / "model.safetensors").chmod(0o644)
    reloaded = from_pretrained(folder, device="cpu")
    m16 = measure(reloaded, val_ids, pool)
    record = {
        "command": "python tools/make_circuits.py " + " ".join(argv if argv is not None else sys.argv[1:]),
        "config": CONFIG, "steps": args.steps, "batch_size": args.batch_size, "lr": args.lr,
        "warmup_steps": args.warmup_steps, "repeat_fraction": args.repeat_fraction,
        "seed": args.seed, "common_tokens": args.common, "seconds": round(seconds),
        "final (float16, full softmax)": {
            "val_loss": round(m16["val_loss"], 4),
            "best_induction_layer_ge_1": round(m16["induction"][1:].max().item(), 4),
            "best_previous_token": round(m16["previous"].max().item(), 4),
            "first_copy_loss": round(m16["first_copy_loss"], 4),
            "second_copy_loss": round(m16["second_copy_loss"], 4),
            "induction": m16["induction"].round(decimals=3).tolist(),
            "previous": m16["previous"].round(decimals=3).tolist(),
        },
        "val_loss_before_lowering_unseen_rows": round(log[-1]["val_loss"], 4),
        "torch": torch.__version__,
        "machine": f"{platform.machine()}, {torch.get_num_threads()} threads",
    }
    print(json.dumps(record, indent=2))
    (folder / "training_record.json").write_text(json.dumps(record, indent=2) + "\n", encoding="utf-8")
    (folder / "training_log.json").write_text(
        json.dumps({"columns": list(log[0]), "rows": [list(e.values()) for e in log]}, indent=1) + "\n",
        encoding="utf-8")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
