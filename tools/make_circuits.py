"""Train the small "circuits" GPT-2 that chapter 8 analyses when OpenAI's weights are not available.

    python tools/make_circuits.py data/circuits --threads 1      # 3-8 min on one CPU thread

The stand-in (`data/standin`, tools/make_standin.py) is chapter 7's CPU run: it writes
Shakespeare-shaped text but has no induction head, because nothing in a few minutes of Tiny
Shakespeare rewards copying. This model is trained to have the circuits chapter 8 looks for.
It is an ordinary gpt2lib.GPT2 in GPT-2's format (GPT-2's 50,257 ids, so gpt2lib.from_pretrained
and transformers both read it): 2 layers, 4 heads, width 128, a context of 32 tokens,
attention-only (every MLP's weights and biases are zero and frozen, and GELU(0) = 0, so each
block adds only its attention; ARENA analyses a 2-layer attention-only model). Its rows are
ids of the `--common` (2,000) most frequent Tiny Shakespeare training tokens (they make 90% of
the training split's tokens), in two stages:

1. `--stage1-steps` (400) steps of skip rows: each id is a fixed random function of the id two
   back (20% noise). Predicting them needs the previous token: layer 0 becomes a
   previous-token head (0.98 on Shakespeare text by step 200).
2. Layer 0's output is scaled (its c_proj weight and bias times one factor, about 0.08) to the
   size of the token and position embeddings; its attention, the previous-token pattern, does
   not change. Then layer 0 and both embedding tables are frozen, and the rest trains on rows of
   random filler in which a segment of distinct ids (length 2 .. 15, drawn per row) appears
   twice: 30% in the measured layout (<|endoftext|>, segment, segment), the others with
   random-length filler before and between the copies, so that no position or fixed offset says
   where the earlier copy is. Each step draws a row length of 16, 24 or 32 tokens.

The loss is next-token cross-entropy on every position, over the pool's ids (all targets are
pool ids). The model's token table holds the ids that occur in the training text (and
<|endoftext|>), but only the pool's rows and <|endoftext|>'s are ever used, so only they train;
the others keep their random initial rows. `widen_vocabulary` then writes the table out with
all 50,257 rows. Every `--eval-every` steps the script logs the best induction (layer >= 1) and
previous-token scores and the two copies' losses, measured with plain tensor code (not
gpt2lib.inspection), to training_log.json; after saving it reloads the float16 file and records
the scores in the full softmax in training_record.json, on the pool and on the 64 commonest ids.

STATUS: the command above makes data/circuits. The committed run took 7 min 18 s (438 s wall,
214 s of CPU time; training 426 s) on one thread of a shared 2-core machine whose other core
and more were busy (load average 5); the same command trained in 175 s when the machine was
quiet. Its tensors are identical run to run (two more runs, one of them 5 min 58 s, gave the
same values); the file's bytes can differ in its header, whose two metadata keys safetensors
0.8 writes in an order that changes from process to process.
The induction head appears in a phase change about 300 steps into stage 2 (see
training_log.json): induction 0.19 -> 0.63 -> 0.78 at steps 600, 700, 800 of 3,000; the second
copy's loss (pool softmax) 7.4 -> 4.8 -> 2.1 nats, the first copy's staying near
log 2,000 = 7.6. Final, float16, full 50,257-way softmax, on 8 rows of 15 pool ids repeated
(copy losses over tokens 2 .. 15 of each copy): induction 0.96 (head 1.1; head 1.2 0.94),
previous-token 0.99 (layer 0, all four heads 0.96-0.99), first copy 10.77 against second copy
1.13 nats. On the 64 commonest ids (the earlier pool): induction 0.90, copies 10.78 / 1.38.
Seeds 1 and 2 (`--seed`) gave the same picture: phase change at steps 700-900 and 800-1,000,
induction 0.94 and 0.93, previous-token 0.99 and 0.98 at step 3,000.

The first copy costs about log 50,257 = 10.8 nats in the full softmax, no better than a uniform
guess: the training softmax ran over the pool only, which nothing pushes above the other ids
(in the pool softmax the first copy costs log 2,000 = 7.6). Tried after training and not
kept: setting the rows of all ids outside the pool as `widen_vocabulary` sets those never seen
(opposite the mean final hidden state of Shakespeare text) left the first copy at 10.8 nats;
opposite the mean final hidden state of repeated rows, at a pool row's length, 10.1 nats
(second copy 1.0 instead of 1.4, Shakespeare validation loss 10.4 instead of 10.0); at four
times that length 8.5 nats, but the second copy then cost 1.6 nats, the validation loss rose to
11.9 and the previous-token score fell from 0.97 to 0.92 (all on the test's 16 rows). Neither
was worth a second special case in `widen_vocabulary`, so those rows keep their random
initial values.

Limits: the copying works on the pool only. On repeats of ids ranked 2,000-11,265 in the
training split (each seen, but never trained) the best induction score is 0.31 and the second
copy is 0.2 nats cheaper; on ids drawn from the whole vocabulary, 0.12-0.14 and 0.1. A run with the
pool set to all 11,265 ids of the training text was stopped: its readout over 11,265 ids took
about 1.2 s a step on the shared machine, so 3,000 steps would pass the 30-minute budget.

History. Until this version the pool was the 64 commonest ids (3,000 steps, 199 s): induction
0.91 and the copies 9.68 / 5.35 nats on its own 64 ids, but on repeats of the 2,000 commonest
(tests/library/test_circuits.py's 16 rows) only 0.20, and the second copy cost more than the first
(10.39 against 9.79 nats). The same
recipe with `--common 2000` and nothing else changed gave the model above: the token pool, not
the recipe, was what confined the head to 64 ids.

Why earlier attempts failed (about 20 runs, 2-layer attention-only, widths 64-128, pools of
30-2,000 ids, layouts with fixed and random places, skip rows, sinusoidal positions, 1-8 heads,
lr 1e-3 to 1e-2, up to 12,000 steps; none passed 0.25, most stayed at 0.00-0.06): either no
previous-token head formed (layer 1 then parks on fixed positions, or the model guesses among
the ids it has seen), or, with skip rows mixed in, layer 0 became a clean previous-token head
(0.6-0.9) whose output grew to about 25 times the size of the embeddings: skip rows reward it
for writing the earlier token straight into the readout, against the tied embeddings' pull
towards the current token. After ln_1, layer 1's query then hardly holds its own token, so it
cannot match it against the previous token held at the key. Measured on one such model (pool
64, width 128): embeddings' norm 0.82, layer 0's output 19.9; each layer-1 head put all its
attention on one arbitrary key. Scaling that output down to the embeddings' size and freezing
layer 0 (stage 2 above) was the one change that made the head form, at once. Further
negative results, all with layer 0 and the embeddings trainable throughout (none formed an
induction head): pool 1,000, width 64, context 128, random layouts and 16 identity skip rows,
800 steps: induction 0.01; rows that repeat a short period (2..15) to the end: no
previous-token head; rows of 16-24 tokens only: 0.19 after 1,600 steps.
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

from make_standin import shakespeare_splits  # noqa: E402  (tools/ is the script's folder)

from gpt2lib import GPT2, GPT2Config, from_pretrained, save_pretrained  # noqa: E402
from gpt2lib.tokenizer import get_encoding  # noqa: E402

BOS = 50256  # <|endoftext|>
MEASURE_LEN = (
    50  # repeated sequences of 50 tokens (101 with the start token), as chapter 8's default
)


def common_tokens(train_ids, n):
    """The n most frequent ids of the training text, most frequent first."""
    counts = torch.bincount(train_ids, minlength=BOS + 1)
    return counts.argsort(descending=True)[:n]


def segment_rows(n_rows, T, pool, gen, min_len=2, exact=0.3):
    """(n_rows, T + 1): <|endoftext|>, random ids of `pool`, and in them a segment of distinct
    pool ids written twice. The segment's length L (min_len .. (T - 1) // 2) is drawn per row;
    a share `exact` of the rows is the measured layout (<|endoftext|>, segment, segment, filler),
    the others put a random-length filler before the first copy and between the copies, so
    neither an absolute position nor a fixed offset says where the earlier copy is."""
    rows = pool[torch.randint(0, len(pool), (n_rows, T + 1), generator=gen)]
    for r in range(n_rows):
        L = int(torch.randint(min_len, (T - 1) // 2 + 1, (1,), generator=gen))
        seg = pool[torch.randperm(len(pool), generator=gen)[:L]]  # no id twice in a segment
        if torch.rand(1, generator=gen).item() < exact:
            s1, s2 = 1, 1 + L
        else:
            room = T - 2 * L  # filler positions left
            pre = int(torch.randint(0, room + 1, (1,), generator=gen))
            gap = int(torch.randint(0, room - pre + 1, (1,), generator=gen))
            s1, s2 = 1 + pre, 1 + pre + L + gap
        rows[r, s1 : s1 + L] = seg
        rows[r, s2 : s2 + L] = seg
    return rows


def skip_rows(n_rows, T, pool, perm, gen, noise=0.2):
    """(n_rows, T + 1): <|endoftext|>, then pool ids where each is `perm` of the id two back
    (a random id with probability `noise`). Predicting them pays for a previous-token head:
    at position t the model must see the id at t - 1 to name the id at t + 1."""
    rows = torch.randint(0, len(pool), (n_rows, T + 1), generator=gen)  # indices into pool
    keep = torch.rand(n_rows, T + 1, generator=gen) >= noise
    for t in range(3, T + 1):
        rows[:, t] = torch.where(keep[:, t], perm[rows[:, t - 2]], rows[:, t])
    rows = pool[rows]
    rows[:, 0] = BOS
    return rows


def make_attention_only(model):
    """Zero every MLP's weights and biases and freeze them: GELU(0) = 0, so each block adds
    only its attention's output (block(x) = x + attn(ln_1(x)) exactly), in GPT-2's format."""
    with torch.no_grad():
        for block in model.h:
            for p in block.mlp.parameters():
                p.zero_()
                p.requires_grad_(False)
            for p in block.ln_2.parameters():  # unused once the MLP is zero: freeze as well
                p.requires_grad_(False)


def hidden(model, idx, attention_only=False, offset=None):
    """The final hidden states (B, T, C), through the model's own modules.

    offset: (B,) first position of each row (None: 0), for rows placed at random positions."""
    B, T = idx.shape
    positions = torch.arange(T)[None, :] + (0 if offset is None else offset[:, None])  # (B, T)
    x = model.wte(idx) + model.wpe(positions)
    for block in model.h:
        # with the MLP zero, block(x) == x + attn(ln_1(x)); skipping the zero MLP saves time
        x = x + block.attn(block.ln_1(x)) if attention_only else block(x)
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
def measure(
    model, val_ids, pool, seq_len=None, batch=8, seed=1234, bos=BOS, readout=None, val_targets=None
):
    """Validation loss, induction and previous-token scores (n_layer, n_head), repeat losses.

    Ids are in the model's own numbering (`bos` is its <|endoftext|>). `readout`: the ids the
    softmax of the repeat losses runs over (None: all of them, the full softmax). `val_targets`:
    the validation targets if they differ from the inputs `val_ids` (-1: not scored)."""
    model.eval()
    if seq_len is None:  # the longest two copies that fit the context, at most MEASURE_LEN
        seq_len = min(MEASURE_LEN, (model.config.n_positions - 1) // 2)
    gen = torch.Generator().manual_seed(seed)
    seg = pool[torch.randint(0, len(pool), (batch, seq_len), generator=gen)]
    idx = torch.cat([torch.full((batch, 1), bos), seg, seg], dim=1)  # (B, 2L + 1)
    pats = attention_patterns(model, idx)
    # query at position i in the second copy (i = L+1 .. 2L) attends to key i - L + 1
    induction = torch.stack(
        [
            p.diagonal(offset=-(seq_len - 1), dim1=-2, dim2=-1)[..., -seq_len:].mean(dim=(0, -1))
            for p in pats
        ]
    )
    if readout is not None:
        index = torch.full((model.config.vocab_size,), -1, dtype=torch.long)
        index[readout] = torch.arange(len(readout))
        logits, targets = (
            hidden(model, idx)[:, :-1] @ model.wte.weight[readout].T,
            index[idx[:, 1:]],
        )
    else:  # the full softmax
        logits, targets = model(idx)[:, :-1], idx[:, 1:]
    nll = F.cross_entropy(logits.transpose(1, 2), targets, reduction="none")
    # tokens 2 .. L of each copy, as chapter 8's copy_losses: no head can guess a copy's first
    first, second = nll[:, 1:seq_len].mean().item(), nll[:, seq_len + 1 :].mean().item()
    T = model.config.n_positions
    starts = range(0, 8 * (T + 1) * 4, (T + 1) * 4)  # 8 windows spread over the validation text
    text = torch.stack([val_ids[s : s + T + 1] for s in starts])
    targets = (
        text if val_targets is None else torch.stack([val_targets[s : s + T + 1] for s in starts])
    )
    pats_text = attention_patterns(model, text[:, :-1])
    previous = torch.stack(
        [p.diagonal(offset=-1, dim1=-2, dim2=-1).mean(dim=(0, -1)) for p in pats_text]
    )
    val = F.cross_entropy(
        model(text[:, :-1]).flatten(0, 1), targets[:, 1:].flatten(), ignore_index=-1
    ).item()
    model.train()
    return {
        "val_loss": val,
        "induction": induction,
        "previous": previous,
        "first_copy_loss": first,
        "second_copy_loss": second,
    }


@torch.no_grad()
def widen_vocabulary(small, seen, val_ids):
    """The trained model (its rows: the `seen` ids only) as a GPT-2 with all 50,257 ids.

    Rows of ids that do not occur in the training text are set to minus the mean final hidden
    direction on Shakespeare text, scaled to a typical row's length: the readout gives them low
    logits (they are never inputs in the chapter). The rows of `seen` ids outside the pool are
    copied as they are: never used in training, they hold their random initial values."""
    config = GPT2Config(**{**small.config.__dict__, "vocab_size": BOS + 1})
    model = GPT2(config)
    state = {k: v for k, v in small.state_dict().items() if k != "wte.weight"}
    model.load_state_dict(state, strict=False)
    model.wte.weight[seen] = small.wte.weight
    unseen = torch.ones(BOS + 1, dtype=torch.bool)
    unseen[seen] = False
    T = config.n_positions
    h = hidden(model, val_ids[: 8 * T].view(8, T))
    direction = h.mean(dim=(0, 1))
    direction = direction / direction.norm()
    norm = small.wte.weight.norm(dim=1).mean()
    model.wte.weight[unseen] = -norm * direction
    return model


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("folder", type=Path)
    parser.add_argument("--steps", type=int, default=3000, help="all steps, stage 1 included")
    parser.add_argument(
        "--stage1-steps",
        type=int,
        default=400,
        help="steps of skip rows only, which make layer 0 a previous-token head",
    )
    parser.add_argument(
        "--rescale",
        type=float,
        default=1.0,
        help="after stage 1, scale layer 0's output to this multiple of the embeddings' size",
    )
    parser.add_argument("--batch-size", type=int, default=64, help="rows per step")
    parser.add_argument("--lr", type=float, default=3e-3)
    parser.add_argument("--warmup-steps", type=int, default=50)
    parser.add_argument("--lengths", default="16,24,32", help="row lengths, one drawn per step")
    parser.add_argument("--min-len", type=int, default=2, help="shortest repeated segment")
    parser.add_argument(
        "--exact",
        type=float,
        default=0.3,
        help="share of rows in the measured layout (<|endoftext|>, segment, segment)",
    )
    parser.add_argument("--eval-every", type=int, default=100)
    parser.add_argument("--n-layer", type=int, default=2)
    parser.add_argument("--n-head", type=int, default=4)
    parser.add_argument("--n-embd", type=int, default=128)
    parser.add_argument("--n-positions", type=int, default=32)
    parser.add_argument("--common", type=int, default=2000, help="size of the token pool")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--threads", type=int, default=None, help="torch CPU threads")
    parser.add_argument("--overwrite", action="store_true")
    args = parser.parse_args(argv)
    began = time.time()  # the whole command's time, tokenizing and saving included
    if args.threads:
        torch.set_num_threads(args.threads)
    lengths = [int(v) for v in args.lengths.split(",")]
    if max(lengths) > args.n_positions:
        parser.error(f"--lengths {args.lengths} does not fit --n-positions {args.n_positions}")

    enc = get_encoding()
    train_ids, val_ids = shakespeare_splits(enc)
    pool_full = common_tokens(train_ids, args.common)  # GPT-2 ids
    # The model trains on the ids that occur in the training text (and <|endoftext|>) only:
    # its token table has those rows, numbered 0 .. n_seen - 1, and is widened to GPT-2's
    # 50,257 rows at the end (widen_vocabulary).
    seen = torch.unique(torch.cat([train_ids, torch.tensor([BOS])]))  # sorted GPT-2 ids
    to_small = torch.full((BOS + 1,), -1, dtype=torch.long)
    to_small[seen] = torch.arange(len(seen))
    pool = to_small[pool_full]
    bos_small = int(to_small[BOS])
    val_small = to_small[val_ids]
    val_small_in = val_small.clamp(
        min=0
    )  # inputs: a validation id unseen in training reads as id 0
    val_small_tgt = val_small  # targets: -1 (ignored) for ids unseen in training

    config = {
        "n_layer": args.n_layer,
        "n_embd": args.n_embd,
        "n_head": args.n_head,
        "n_positions": args.n_positions,
        "embd_pdrop": 0.0,
        "attn_pdrop": 0.0,
        "resid_pdrop": 0.0,
    }
    torch.manual_seed(args.seed)
    model = GPT2(GPT2Config(**{**config, "vocab_size": len(seen)}))
    make_attention_only(model)
    params = [p for p in model.parameters() if p.requires_grad]
    opt = torch.optim.AdamW(params, lr=args.lr, betas=(0.9, 0.98), weight_decay=0.0)
    perm = torch.randperm(len(pool), generator=torch.Generator().manual_seed(args.seed + 1))
    pool_index = torch.full((len(seen),), -1, dtype=torch.long)
    pool_index[pool] = torch.arange(len(pool))
    gen = torch.Generator().manual_seed(args.seed)
    log = []
    start = time.time()

    def log_entry(step):
        m = measure(
            model, val_small_in, pool, bos=bos_small, readout=pool, val_targets=val_small_tgt
        )
        entry = {
            "step": step,
            "seconds": round(time.time() - start, 1),
            "val_loss": round(m["val_loss"], 4),
            "induction": round(m["induction"][1:].max().item(), 4),
            "previous": round(m["previous"].max().item(), 4),
            "first_copy_loss": round(m["first_copy_loss"], 4),
            "second_copy_loss": round(m["second_copy_loss"], 4),
        }
        log.append(entry)
        print(json.dumps(entry), flush=True)

    def pool_loss(rows):
        """Next-token loss over the pool (every target of these rows is a pool id: exact)."""
        h = hidden(model, rows[:, :-1], attention_only=True)
        logits = h @ model.wte.weight[pool].T
        return F.cross_entropy(logits.flatten(0, 1), pool_index[rows[:, 1:]].flatten())

    model.train()
    for step in range(args.steps + 1):
        if step % args.eval_every == 0 or step == args.steps:
            log_entry(step)
        if step == args.steps:
            break
        if step == args.stage1_steps:
            # Stage 2. Layer 0's output, grown to dominate the readout on the skip rows, is
            # scaled to the embeddings' size (its attention, the previous-token pattern, does
            # not change): else it swamps the token in layer 1's input and layer 1 cannot see
            # which token its query is. Then layer 0 and the embeddings are frozen.
            with torch.no_grad():
                rows = segment_rows(32, max(lengths), pool, gen)[:, :-1]
                rows[:, 0] = bos_small
                x = model.wte(rows) + model.wpe(torch.arange(rows.shape[1]))
                out = model.h[0].attn(model.h[0].ln_1(x))
                factor = args.rescale * x.norm(dim=-1).mean() / out.norm(dim=-1).mean()
                model.h[0].attn.c_proj.weight.mul_(factor)
                model.h[0].attn.c_proj.bias.mul_(factor)
            print(f"stage 2: layer 0's output scaled by {factor.item():.4f}", flush=True)
            for p in [*model.h[0].parameters(), model.wte.weight, model.wpe.weight]:
                p.requires_grad_(False)
            params = [p for p in model.parameters() if p.requires_grad]
            opt = torch.optim.AdamW(params, lr=args.lr, betas=(0.9, 0.98), weight_decay=0.0)
        stage_step = step if step < args.stage1_steps else step - args.stage1_steps
        lr = args.lr * min(1.0, (stage_step + 1) / args.warmup_steps)
        for group in opt.param_groups:
            group["lr"] = lr
        T = lengths[int(torch.randint(0, len(lengths), (1,), generator=gen))]
        if step < args.stage1_steps:  # stage 1: each id a fixed function of the id two back
            rows = skip_rows(args.batch_size, T, pool, perm, gen)
        else:  # stage 2: a segment written twice in random filler
            rows = segment_rows(args.batch_size, T, pool, gen, args.min_len, args.exact)
        rows[:, 0] = bos_small
        loss = pool_loss(rows)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(params, 1.0)
        opt.step()
        if step % 100 == 0:
            print(
                f"step {step} T {T} loss {loss.item():.3f} ({time.time() - start:.0f} s)",
                flush=True,
            )
    seconds = time.time() - start

    model.eval()
    full = widen_vocabulary(model, seen, val_ids)
    folder = save_pretrained(full, args.folder, overwrite=args.overwrite, dtype=torch.float16)
    (folder / "model.safetensors").chmod(0o644)
    reloaded = from_pretrained(folder, device="cpu")
    m16 = measure(reloaded, val_ids, pool_full)
    m64 = measure(reloaded, val_ids, pool_full[:64])  # the pool of the model before this one
    seq_len = min(MEASURE_LEN, (args.n_positions - 1) // 2)
    record = {
        "command": "python tools/make_circuits.py "
        + " ".join(argv if argv is not None else sys.argv[1:]),
        "config": config,
        "attention_only": True,
        "steps": args.steps,
        "stage1_steps": args.stage1_steps,
        "rescale": args.rescale,
        "batch_size": args.batch_size,
        "lr": args.lr,
        "warmup_steps": args.warmup_steps,
        "row_lengths": lengths,
        "exact_share": args.exact,
        "min_segment_len": args.min_len,
        "seed": args.seed,
        "common_tokens": args.common,
        "seconds": round(seconds),
        "seconds_whole_command": round(time.time() - began),
        "measured_on": f"8 rows of <|endoftext|> + {seq_len} random ids of the {args.common} "
        "commonest training tokens, twice (copy losses: tokens 2 .. L of each "
        "copy); previous-token on 8 validation windows",
        "final (float16, full softmax)": {
            "val_loss": round(m16["val_loss"], 4),
            "best_induction_layer_ge_1": round(m16["induction"][1:].max().item(), 4),
            "best_previous_token": round(m16["previous"].max().item(), 4),
            "first_copy_loss": round(m16["first_copy_loss"], 4),
            "second_copy_loss": round(m16["second_copy_loss"], 4),
            "induction": [[round(v, 3) for v in row] for row in m16["induction"].tolist()],
            "previous": [[round(v, 3) for v in row] for row in m16["previous"].tolist()],
        },
        "on the 64 commonest tokens (float16, full softmax)": {
            "best_induction_layer_ge_1": round(m64["induction"][1:].max().item(), 4),
            "first_copy_loss": round(m64["first_copy_loss"], 4),
            "second_copy_loss": round(m64["second_copy_loss"], 4),
        },
        "torch": torch.__version__,
        "machine": f"{platform.machine()}, {torch.get_num_threads()} threads (a shared 2-core machine)",
    }
    print(json.dumps(record, indent=2))
    (folder / "training_record.json").write_text(
        json.dumps(record, indent=2) + "\n", encoding="utf-8"
    )
    (folder / "training_log.json").write_text(
        json.dumps({"columns": list(log[0]), "rows": [list(e.values()) for e in log]}, indent=1)
        + "\n",
        encoding="utf-8",
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
