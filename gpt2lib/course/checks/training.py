"""Checks for chapter 7 (training), exercises 7.1 to 7.9 and the challenge, and the helpers the
chapter runs (`your_pieces`, `tiny_run`, `broken_runs`)."""

from __future__ import annotations

import math
from unittest import mock

import torch
import torch.nn.functional as F

from gpt2lib.course.checks import _core as core

EX_LOSS = "Exercise 7.1 (the loss)"
EX_UNIFORM = "Exercise 7.2 (the loss before any training)"
EX_BATCH = "Exercise 7.3 (random batches)"
EX_UNIGRAM = "Exercise 7.4 (the unigram and bigram lines)"
EX_STEP = "Exercise 7.5 (one training step, and which weights decay)"
EX_LR = "Exercise 7.6 (find what is wrong with the schedule)"
EX_LOOP = "Exercise 7.7 (the evaluation and the loop)"
EX_DIAGNOSIS = "Exercise 7.8 (which bug made which curve?)"
EX_RATES = "Exercise 7.9 (measure the learning rate)"
CHALLENGE = "Challenge (beat the bigram line in half the steps)"


def _tiny_model(seed=0, n_positions=16, vocab_size=37, dropout=0.0):
    """The reference GPT2 with 2 layers, in train mode."""
    sizes = dict(n_layer=2, n_positions=n_positions, vocab_size=vocab_size)
    return core.tiny_gpt2(seed, pdrop=dropout, **sizes).train()


def _call(exercise, fn, *args, **kwargs):
    """fn(*args, **kwargs): through core.call_learner when it is the learner's (exercise given)."""
    if exercise is None:
        return fn(*args, **kwargs)
    return core.call_learner(exercise, fn, *args, **kwargs)


def _near(a, b):
    return math.isclose(a, b, rel_tol=1e-6)


def _as_float(exercise, value, what):
    if isinstance(value, torch.Tensor):
        raise core.CheckFailed(
            exercise,
            f"{what} is a tensor ({value!r:.40}): return a Python float (.item() or float(...))",
        )
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise core.CheckFailed(
            exercise, f"{what} should be a number (a float), got {type(value).__name__}"
        )
    return float(value)


def _as_pair(exercise, got, what="your function"):
    if not isinstance(got, (tuple, list)) or len(got) != 2:
        raise core.CheckFailed(
            exercise, f"{what} should return two tensors (x, y), got {type(got).__name__}"
        )
    return got


def _loss(model, x, y):
    return F.cross_entropy(model(x).flatten(0, 1), y.flatten())


# --------------------------------------------------------------------------- Exercise 7.1


def _loss_right(logits, targets, *, mistake=""):
    """The mean cross-entropy from log-probabilities in float32; `mistake` plants one of
    LOSS_MISTAKES or LOSS_RULES by its name."""
    if mistake == "uses_cross_entropy":
        return F.cross_entropy(logits.float().flatten(0, 1), targets.flatten())
    logits = logits if mistake == "not_float32" else logits.float()
    if mistake == "softmax_not_log":
        log_probs = logits.softmax(dim=-1)
    elif mistake == "log_of_softmax":
        log_probs = logits.softmax(dim=-1).log()
    elif mistake == "no_normalisation":
        log_probs = logits
    else:
        dim = {"log_softmax_over_time": 1, "log_softmax_over_batch": 0}.get(mistake, -1)
        log_probs = logits.log_softmax(dim=dim)
    nll = -log_probs.gather(-1, targets.unsqueeze(-1)).squeeze(-1)
    if mistake == "sum_not_mean":
        return nll.sum()
    return -nll.mean() if mistake == "sign" else nll.mean()


LOSS_MISTAKES = core.variants(
    _loss_right,
    {
        "log_softmax_over_time": "your log-softmax normalises over the wrong dimension (the positions, dim=1): probabilities must sum to 1 over the vocabulary, the last dimension (dim=-1)",
        "log_softmax_over_batch": "your log-softmax normalises over the batch (dim=0): normalise over the vocabulary, the last dimension (dim=-1)",
        "sum_not_mean": "your loss is the SUM over positions: take the mean, so that the loss does not grow with the batch size or the context length",
        "sign": "your loss has the wrong sign: it is MINUS the mean log-probability of the targets (a loss is positive and falls as the model improves)",
        "softmax_not_log": "you gathered probabilities, not log-probabilities: use log_softmax",
        "no_normalisation": "you gathered the raw logits without log_softmax: the loss must use log-probabilities, which depend on every logit of the row",
    },
)

# The three rules the exercise states; each has its own case in the check, not a value to match.
LOSS_RULES = core.variants(
    _loss_right,
    {
        "uses_cross_entropy": "your loss calls F.cross_entropy or F.nll_loss (or nn.CrossEntropyLoss, which calls it), which this exercise does not allow: write it from log-probabilities",
        "log_of_softmax": "with a logit of 100 and a target 220 below it your loss is not finite: in float32 softmax rounds that probability to 0 (log(0) = -inf) and e^100 overflows. Take the log-softmax in one step (log_softmax), which never forms either number",
        "not_float32": "with bfloat16 logits your loss is computed in bfloat16 (about 3 significant digits): cast the logits to float32 (logits.float()) before the log-softmax",
    },
)


def _call_loss(fn, logits, targets):
    """The learner's loss with F.cross_entropy and F.nll_loss refused; inputs unchanged."""

    def refused(*args, **kwargs):
        raise core.named_failure(EX_LOSS, LOSS_RULES, "uses_cross_entropy")

    kept = logits.detach().clone(), targets.clone()
    with mock.patch.object(F, "cross_entropy", refused), mock.patch.object(F, "nll_loss", refused):
        got = core.call_learner(EX_LOSS, fn, logits, targets)
    if not (torch.equal(logits.detach(), kept[0]) and torch.equal(targets, kept[1])):
        raise core.CheckFailed(
            EX_LOSS, "your loss changed its inputs in place: work on new tensors"
        )
    return got


def _same_loss(got, want):
    return isinstance(got, torch.Tensor) and core.close(
        got.reshape(()) if got.numel() == 1 else got, want
    )


def check_cross_entropy(fn):
    """`fn(logits (B, T, V), targets (B, T))` -> the mean cross-entropy, a one-number tensor."""
    gen = torch.Generator().manual_seed(0)
    for B, T, V in ((2, 5, 11), (3, 4, 7)):
        logits = 3 * torch.randn(B, T, V, generator=gen)
        targets = torch.randint(0, V, (B, T), generator=gen)
        want = F.cross_entropy(logits.flatten(0, 1), targets.flatten())
        got = _call_loss(fn, logits, targets)
        if _same_loss(got, want):
            continue
        core.expect_tensor(EX_LOSS, got, what="your loss", finite=False)
        core.fail_with(
            EX_LOSS,
            LOSS_MISTAKES,
            lambda m: _same_loss(got, m.fn(logits, targets)),
            f"your loss has shape {tuple(got.shape)}: return ONE number, the mean over every position of every sequence"
            if got.numel() != 1
            else f"your loss is {float(got):.4f}, the cross-entropy is {float(want):.4f} (logits of shape {(B, T, V)})",
        )
    unlikely = torch.zeros(1, 2, 5)
    unlikely[0, 0, 3], unlikely[0, 0, 1] = -120.0, 100.0  # e^-220 is 0 in float32, e^100 inf
    got = _call_loss(fn, unlikely, torch.tensor([[3, 0]]))
    if not (isinstance(got, torch.Tensor) and bool(torch.isfinite(got).all())):
        raise core.named_failure(EX_LOSS, LOSS_RULES, "log_of_softmax")
    coarse = (3 * torch.randn(2, 8, 50, generator=gen)).bfloat16()
    targets = torch.randint(0, 50, (2, 8), generator=gen)
    got = _call_loss(fn, coarse, targets)
    want = F.cross_entropy(coarse.float().flatten(0, 1), targets.flatten())
    if got.dtype not in (torch.float32, torch.float64) or not core.close(got.float(), want):
        raise core.named_failure(EX_LOSS, LOSS_RULES, "not_float32")
    logits = torch.randn(2, 3, 5, generator=gen, requires_grad=True)
    got = _call_loss(fn, logits, torch.randint(0, 5, (2, 3), generator=gen))
    if not got.requires_grad:
        raise core.CheckFailed(
            EX_LOSS,
            "your loss carries no gradient (.detach(), .item() or numpy inside?): return a tensor computed from the logits",
        )
    core.passed(EX_LOSS, "the cross-entropy, finite for a very unlikely target, in float32")


# --------------------------------------------------------------------------- Exercise 7.2


def _uniform_right(vocab_size, *, mistake=""):
    """ln V, the uniform guess's loss; `mistake` plants one of UNIFORM_MISTAKES by its name."""
    v = vocab_size
    wrong = dict(probability=1 / v, sign=-math.log(v), bits=math.log2(v), base_10=math.log10(v))
    return float(v) if mistake == "perplexity" else wrong.get(mistake, math.log(v))


UNIFORM_MISTAKES = core.variants(
    _uniform_right,
    {
        "probability": "you returned the probability of each token, 1 / V: the loss is MINUS the logarithm of that probability",
        "sign": "your loss is negative: it is minus the log of the probability 1 / V, which is positive",
        "bits": "your loss is in bits (log base 2): the loss of F.cross_entropy, and of this course, is in nats, the natural logarithm (math.log)",
        "base_10": "you used the base-10 logarithm: the loss is in nats, the natural logarithm (math.log)",
        "perplexity": "you returned V itself: that is e^loss, the perplexity of the uniform guess. The loss is its natural logarithm",
    },
)


def check_uniform_loss(fn):
    """`fn(vocab_size)` -> the loss (a float) of the uniform guess over vocab_size tokens."""
    for vocab_size in (2, 7, 50257):
        value = _as_float(EX_UNIFORM, core.call_learner(EX_UNIFORM, fn, vocab_size), "your loss")
        if not _near(value, math.log(vocab_size)):
            core.fail_with(
                EX_UNIFORM,
                UNIFORM_MISTAKES,
                lambda m: _near(value, m.fn(vocab_size)),
                f"with {vocab_size} equally likely tokens your loss is {value:.4f}: work out -ln p for p = 1 / {vocab_size}",
            )
    core.passed(EX_UNIFORM, "the uniform guess over V tokens costs ln V at every position")


# --------------------------------------------------------------------------- Exercise 7.3


def _windows_ok(ids, x, y, block_size):
    """For each row, the start s with x == ids[s:s+T] and y == ids[s+1:s+T+1]; None if a row has
    none."""
    starts = []
    for row_x, row_y in zip(x, y):
        found = [
            s
            for s in range(len(ids) - block_size)
            if torch.equal(ids[s : s + block_size], row_x)
            and torch.equal(ids[s + 1 : s + block_size + 1], row_y)
        ]
        if not found:
            return None
        starts.append(found[0])
    return starts


def _batch_right(ids, batch_size, block_size, generator=None, device=None, *, mistake=""):
    """Random windows x and y one token later, as torch.long on `device`; `mistake` plants one
    of BATCH_MISTAKES or DEVICE_MISTAKES by its name."""
    high = len(ids) - block_size + {"range_too_long": 1, "range_too_short": -1}.get(mistake, 0)
    if mistake == "not_random":
        starts = [0] * batch_size
    elif mistake == "one_window":
        starts = [int(torch.randint(high, (1,), generator=generator))] * batch_size
    else:
        starts = torch.randint(high, (batch_size,), generator=generator).tolist()
    shift = 0 if mistake == "not_shifted" else 1
    x = torch.stack([ids[s : s + block_size] for s in starts])
    y = torch.stack([ids[s + shift : s + shift + block_size] for s in starts])
    if mistake != "int32_kept":
        dtype = torch.float32 if mistake == "float_ids" else torch.long
        x, y = x.to(dtype), y.to(dtype)
    if device is None or mistake == "device_ignored":
        return x, y
    return x.to(device), y.to(device)


BATCH_MISTAKES = core.variants(
    _batch_right,
    {
        "not_shifted": "your y equals your x: y must be the same window one token later (ids[s + 1 : s + block_size + 1])",
        "one_window": "every row of your batch is the same window: draw one random start per row (torch.randint(..., (batch_size,)))",
        "not_random": "your windows always start at the beginning of ids: draw random starts with torch.randint(..., generator=generator)",
        "range_too_long": "a window ran past the end of ids: the last possible start is len(ids) - block_size - 1 (the targets need one more token), and torch.randint's upper end is excluded, so use torch.randint(len(ids) - block_size, ...)",
        "range_too_short": "with 8 ids and block_size 5 the starts 0, 1 and 2 are all possible, but 2 never came up, so the very last token is never a target: torch.randint's upper end is excluded, use torch.randint(len(ids) - block_size, ...)",
    },
)

DEVICE_MISTAKES = core.variants(
    _batch_right,
    {
        "device_ignored": "your batch stays where ids are: when a device is given, move x and y there (x.to(device)), so that the model on a GPU gets its batch on the GPU",
        "int32_kept": "given int32 ids (a token file holds uint16 or int32), your x is not torch.long: nn.Embedding and cross_entropy's targets want int64 ids. Return x.long(), y.long()",
        "float_ids": "your x is a float tensor: token ids are integers, and nn.Embedding refuses floats. Return them as torch.long",
    },
)


def _call_batch(fn, ids, batch_size, block_size, seed):
    try:
        got = core.call_learner(
            EX_BATCH, fn, ids, batch_size, block_size, torch.Generator().manual_seed(seed)
        )
    except (IndexError, RuntimeError):  # a window past the end: a short row or a bad index
        raise core.named_failure(EX_BATCH, BATCH_MISTAKES, "range_too_long") from None
    x, y = _as_pair(EX_BATCH, got)
    x = core.expect_tensor(EX_BATCH, x, (batch_size, block_size), what="your x")
    y = core.expect_tensor(EX_BATCH, y, (batch_size, block_size), what="your y")
    if x.dtype.is_floating_point or y.dtype.is_floating_point:
        raise core.named_failure(EX_BATCH, DEVICE_MISTAKES, "float_ids")
    if x.dtype != torch.long or y.dtype != torch.long:
        raise core.named_failure(EX_BATCH, DEVICE_MISTAKES, "int32_kept")
    return x, y


def check_random_batch(fn):
    """`fn(ids (N,), batch_size, block_size, generator, device=None)` -> x, y of shape
    (batch_size, block_size), torch.long, y one token later."""
    ids = torch.arange(100, 130)  # distinct ids: each window is easy to find
    B, T = 64, 5
    x, y = _call_batch(fn, ids, B, T, seed=0)
    for name in ("not_shifted", "one_window", "not_random"):
        wrong = _batch_right(ids, B, T, torch.Generator().manual_seed(0), mistake=name)
        if torch.equal(x, wrong[0]) and torch.equal(y, wrong[1]):
            raise core.named_failure(EX_BATCH, BATCH_MISTAKES, name)
    if torch.equal(x, y):
        raise core.named_failure(EX_BATCH, BATCH_MISTAKES, "not_shifted")
    if torch.equal(y[:, 1:], x[:, :-1]):
        raise core.CheckFailed(
            EX_BATCH,
            "your y is x shifted the wrong way (one token EARLIER): y is the window starting one token later",
        )
    starts = _windows_ok(ids, x, y, T)
    if starts is None:
        raise core.CheckFailed(
            EX_BATCH,
            "each row of x must be a stretch of ids, ids[s : s + block_size], and the same row of y must be ids[s + 1 : s + block_size + 1]",
        )
    if len(set(starts)) == 1:
        raise core.named_failure(
            EX_BATCH, BATCH_MISTAKES, "one_window" if starts[0] else "not_random"
        )
    # many draws from 8 ids with block_size 5: every start 0, 1, 2 must come up, and no other
    small, seen = torch.arange(200, 208), set()
    for seed in range(20):
        rows = _windows_ok(small, *_call_batch(fn, small, 16, 5, seed=100 + seed), 5)
        if rows is None:
            raise core.named_failure(EX_BATCH, BATCH_MISTAKES, "range_too_long")
        seen.update(rows)
    if seen != {0, 1, 2}:
        raise core.named_failure(EX_BATCH, BATCH_MISTAKES, "range_too_short")
    first, again = _call_batch(fn, ids, 8, T, seed=5), _call_batch(fn, ids, 8, T, seed=5)
    if not (torch.equal(first[0], again[0]) and torch.equal(first[1], again[1])):
        raise core.CheckFailed(
            EX_BATCH,
            "the same seed gave different batches: pass generator=generator to torch.randint",
        )
    _call_batch(fn, ids.int(), 4, T, seed=0)  # int32 ids in, torch.long out
    try:  # device='meta' (a device that holds shapes only): both tensors must land there
        meta = torch.device("meta")
        got = core.call_learner(EX_BATCH, fn, ids, 2, 5, torch.Generator().manual_seed(0), meta)
    except RuntimeError:
        raise core.CheckFailed(
            EX_BATCH,
            "with device given, your function failed: draw the starts on the CPU with the generator, then move x and y to the device",
        ) from None
    x, y = _as_pair(EX_BATCH, got)
    if x.device.type != "meta" or y.device.type != "meta":
        raise core.named_failure(EX_BATCH, DEVICE_MISTAKES, "device_ignored")
    core.passed(
        EX_BATCH,
        "random windows of torch.long ids, y one token later, every start possible, repeatable, on the device",
    )


# --------------------------------------------------------------------------- Exercise 7.4


def _unigram_right(train_ids, val_ids, vocab_size, smoothing=0.01, *, mistake=""):
    """The unigram line's loss; `mistake` plants one of UNIGRAM_MISTAKES by its name."""
    counts = torch.bincount(train_ids, minlength=vocab_size).double()
    counts = counts if mistake == "no_smoothing" else counts + smoothing
    probs = counts if mistake == "not_normalised" else counts / counts.sum()
    ids = train_ids if mistake == "scored_on_train" else val_ids
    loss = float(-(torch.log2 if mistake == "bits" else torch.log)(probs[ids]).mean())
    return torch.tensor(loss) if mistake == "tensor_not_float" else loss


UNIGRAM_MISTAKES = core.variants(
    _unigram_right,
    {
        "no_smoothing": "a validation token that never occurs in the training part got probability 0, so its loss, and the mean, is infinite: add `smoothing` to every count before you turn the counts into probabilities",
        "scored_on_train": "you scored the training tokens: the line is measured on val_ids, text the counts never saw",
        "not_normalised": "your counts are not probabilities: divide them by their sum, so that they add up to 1 over the vocabulary",
        "bits": "your loss is in bits (log base 2): use the natural logarithm, as the model's loss does",
        "tensor_not_float": "return a Python float (.item() or float(...))",
    },
)


def check_unigram_loss(fn):
    """`fn(train_ids, val_ids, vocab_size, smoothing)` -> the unigram line's loss (a float)."""
    gen = torch.Generator().manual_seed(0)
    for train_high, n_train, val_high, n_val, vocab_size, smoothing in (
        (6, 200, 9, 60, 9, 0.01),
        (4, 50, 5, 40, 5, 0.5),
    ):
        train_ids = torch.randint(0, train_high, (n_train,), generator=gen)
        val_ids = torch.randint(0, val_high, (n_val,), generator=gen)
        args = (train_ids, val_ids, vocab_size, smoothing)
        try:
            got = core.call_learner(EX_UNIGRAM, fn, train_ids.clone(), val_ids.clone(), *args[2:])
        except (IndexError, RuntimeError):  # a count table shorter than the vocabulary
            raise core.CheckFailed(
                EX_UNIGRAM,
                "torch.bincount counts only up to the largest id it sees: pass minlength=vocab_size, so that every id of the vocabulary has a count",
            ) from None
        value = _as_float(EX_UNIGRAM, got, "your loss")
        want = _unigram_right(*args)
        if _near(value, want):
            continue
        if not math.isfinite(value):
            raise core.named_failure(EX_UNIGRAM, UNIGRAM_MISTAKES, "no_smoothing")
        core.fail_with(
            EX_UNIGRAM,
            UNIGRAM_MISTAKES,
            lambda m: _near(value, m.fn(*args)),
            f"with vocab_size={vocab_size} and smoothing={smoothing} your loss is {value:.4f}, the unigram line is {want:.4f}",
        )
    core.passed(
        EX_UNIGRAM,
        "counts plus smoothing, normalised, scored on the validation part",
        part="the unigram line",
    )


def _bigram_right(train_ids, val_ids, vocab_size, smoothing=0.01, bigram_weight=0.6, *, mistake=""):
    """The three lines, the bigram's from a full V x V table of pair counts; `mistake` plants one
    of BIGRAM_MISTAKES by its name."""
    counted = val_ids if mistake == "counted_on_val" else train_ids
    table = torch.zeros(vocab_size, vocab_size, dtype=torch.double)
    ones = torch.ones(len(counted) - 1, dtype=torch.double)
    table.index_put_((counted[:-1], counted[1:]), ones, accumulate=True)
    prev, nxt = val_ids[:-1], val_ids[1:]
    if mistake == "joint":
        denominator = table.sum()
    elif mistake == "prev_counts_all":
        denominator = torch.bincount(counted, minlength=vocab_size).double()[prev]
    else:
        denominator = table.sum(1)[prev]  # how often prev is followed by anything
    # "reversed" looks up the pair (next, previous): its key is b * V + a
    looked_up = table[nxt, prev] if mistake == "reversed" else table[prev, nxt]
    p_bi = looked_up / denominator.clamp(min=1)
    counts = torch.bincount(train_ids, minlength=vocab_size).double()
    p_uni = (counts + smoothing) / (counts.sum() + smoothing * vocab_size)
    weight = 1.0 if mistake == "no_mix" else bigram_weight
    p = weight * p_bi + (1 - weight) * p_uni[nxt]
    return {
        "uniform": math.log(vocab_size),
        "unigram": float(-p_uni[val_ids].log().mean()),
        "bigram": float(-p.log().mean()),
    }


BIGRAM_MISTAKES = core.variants(
    _bigram_right,
    {
        "no_mix": "your bigram ignores bigram_weight: a validation pair never seen in training gets probability 0 and an infinite loss. Mix bigram_weight * p_bigram with (1 - bigram_weight) * the unigram probability of the next token",
        "joint": "you divided a pair's count by the number of all pairs: that is how common the pair is, not how often b follows a. Divide by the number of times a is followed by anything",
        "reversed": "your pairs are read backwards: you scored how often a follows b. The key of a pair (previous a, next b) must be the same when you count and when you look up",
        "counted_on_val": "you counted the pairs of val_ids: the line measures counts from train_ids on text they never saw",
        "prev_counts_all": "you divided by how often a occurs anywhere in train_ids, the last token included, which is followed by nothing: count a only among the first N - 1 tokens",
    },
)


def check_bigram(fn):
    """`fn(train_ids, val_ids, vocab_size, smoothing, bigram_weight)` -> {"uniform", "unigram",
    "bigram": loss}, counting only the pairs that occur."""
    gen = torch.Generator().manual_seed(1)
    skewed = torch.tensor([0, 1, 1, 2, 2, 2, 3, 4, 4, 5])
    train_0 = skewed[torch.randint(0, 10, (300,), generator=gen)]
    cases = [(train_0, torch.randint(0, 7, (80,), generator=gen), 7, 0.01, 0.6)]
    train_1 = torch.randint(0, 4, (60,), generator=gen)
    cases.append((train_1, torch.randint(0, 5, (50,), generator=gen), 5, 0.5, 0.8))
    for args in cases:
        vocab_size, weight = args[2], args[4]
        got = core.call_learner(EX_UNIGRAM, fn, args[0].clone(), args[1].clone(), *args[2:])
        if not isinstance(got, dict) or "bigram" not in got:
            raise core.CheckFailed(
                EX_UNIGRAM, "return the dict of the three lines, with your loss under 'bigram'"
            )
        value = _as_float(EX_UNIGRAM, got["bigram"], "your bigram loss")
        want = _bigram_right(*args)["bigram"]
        if _near(value, want):
            continue
        if math.isnan(value):
            raise core.CheckFailed(
                EX_UNIGRAM,
                "your bigram loss is NaN: a previous token that never occurs in train_ids has count 0, and 0 / 0 is NaN. Its bigram probability is 0 (clamp the count to at least 1)",
            )
        if not math.isfinite(value):
            raise core.named_failure(EX_UNIGRAM, BIGRAM_MISTAKES, "no_mix")
        core.fail_with(
            EX_UNIGRAM,
            BIGRAM_MISTAKES,
            lambda m: _near(value, m.fn(*args)["bigram"]),
            f"with vocab_size={vocab_size} and bigram_weight={weight} your bigram loss is {value:.4f}, the line is {want:.4f}",
        )
    # a vocabulary of 2 million: a table of all pairs would hold 4 * 10^12 numbers
    try:
        got = core.call_learner(
            EX_UNIGRAM, fn, cases[0][0] * 300_000, cases[0][1] * 300_000, 2_000_000, 0.01, 0.6
        )
    except (RuntimeError, MemoryError):
        raise core.CheckFailed(
            EX_UNIGRAM,
            "with a vocabulary of 2 million your function ran out of memory: a table of all pairs is too large. Count only the pairs that occur (one integer a * V + b per pair)",
        ) from None
    loss = got["bigram"] if isinstance(got, dict) else got
    if not math.isfinite(_as_float(EX_UNIGRAM, loss, "your loss")):
        raise core.CheckFailed(
            EX_UNIGRAM, "with a vocabulary of 2 million your bigram loss is not finite"
        )
    core.passed(
        EX_UNIGRAM,
        "pairs counted from the training part, conditional on the previous token, mixed with the unigram, without a table of all pairs",
    )


# --------------------------------------------------------------------------- Exercise 7.5


def _decay_right(model, wd, *, mistake=""):
    """AdamW's groups: the 2-D weights decay by `wd`, the rest not at all; `mistake` plants one of
    DECAY_MISTAKES by its name."""
    decayed, other = [], []
    for name, p in model.named_parameters():
        decays = {
            "decay_everything": True,
            "decay_nothing": False,
            "swapped": p.dim() < 2,
            "by_name_weight": name.endswith("weight"),
        }.get(mistake, p.dim() >= 2)
        (decayed if decays else other).append(p)
    rate = 0.1 if mistake == "fixed_rate" else wd
    return [{"params": decayed, "weight_decay": rate}, {"params": other, "weight_decay": 0.0}]


DECAY_MISTAKES = core.variants(
    _decay_right,
    {
        "decay_everything": "your groups put weight decay on the LayerNorm gains and the biases too: those are 1-D (p.dim() == 1) and get weight_decay 0.0",
        "decay_nothing": "no parameter gets weight decay: the 2-D weight matrices (p.dim() >= 2) go in the group with weight_decay=weight_decay",
        "swapped": "your groups are swapped: the 2-D weight matrices get weight decay, the 1-D gains and biases get 0.0",
        "by_name_weight": "you chose by name: every parameter called '...weight' is decayed, but LayerNorm's gain is also called weight. Choose by shape instead: p.dim() >= 2",
        "fixed_rate": "your decayed group's weight decay stays 0.1 when decay_groups is given another weight_decay: use the argument, so that make_optimizer and train can set it",
    },
)


def _decay_of_each(groups, model):
    """{parameter index: weight decay} from the learner's groups; refuses duplicates and gaps."""
    if not isinstance(groups, (list, tuple)) or not all(isinstance(g, dict) for g in groups):
        raise core.CheckFailed(
            EX_STEP, "return a list of dicts, each with 'params' and 'weight_decay'"
        )
    index = {id(p): i for i, p in enumerate(model.parameters())}
    names = [n for n, _ in model.named_parameters()]
    decay = {}
    for group in groups:
        if "params" not in group or "weight_decay" not in group:
            raise core.CheckFailed(EX_STEP, "each group needs the keys 'params' and 'weight_decay'")
        for p in list(group["params"]):
            i = index.get(id(p))
            if i is None:
                raise core.CheckFailed(
                    EX_STEP,
                    "a group holds something that is not a parameter of the model (a copy? use the tensors from model.parameters())",
                )
            if i in decay:
                raise core.CheckFailed(
                    EX_STEP, f"{names[i]} is in two groups: each parameter goes into exactly one"
                )
            decay[i] = float(group["weight_decay"])
    missing = [names[i] for i in range(len(names)) if i not in decay]
    if missing:
        raise core.CheckFailed(
            EX_STEP,
            f"{len(missing)} parameters are in no group (first: {missing[0]}): AdamW would never train them",
        )
    return decay


def check_decay_groups(fn):
    """`fn(model, weight_decay)` -> AdamW's param groups: matrices decay by weight_decay, gains
    and biases not at all; tried on two models and two rates."""
    for model, wd in (
        (_tiny_model(), 0.1),
        (_tiny_model(seed=1, n_positions=8, vocab_size=23), 0.3),
    ):
        groups = core.call_learner(EX_STEP, fn, model, wd)
        got = _decay_of_each(groups, model)
        params, names = list(model.parameters()), [n for n, _ in model.named_parameters()]
        want = {i: (wd if p.dim() >= 2 else 0.0) for i, p in enumerate(params)}
        if got != want:
            wrong = [names[i] for i in got if got[i] != want[i]]
            core.fail_with(
                EX_STEP,
                DECAY_MISTAKES,
                lambda m: got == _decay_of_each(m.fn(model, wd), model),
                f"wrong weight decay for {len(wrong)} parameters (first: {wrong[0]}): 2-D weights get weight_decay ({wd} here), 1-D gains and biases 0.0",
            )
        torch.optim.AdamW(groups, lr=1e-3)  # the groups must be usable as they are
    n_decay = sum(1 for p in params if p.dim() >= 2)
    core.passed(
        EX_STEP,
        f"{n_decay} weight matrices decayed, {len(params) - n_decay} gains and biases not, for two models and two rates",
        part="which weights decay",
    )


_STEP_ORDERS = {  # the right order (""), and each planted mistake's: one operation moved or gone
    "": "zero_grad backward clip step",
    "no_zero_grad": "backward clip step",
    "clip_after_step": "zero_grad backward step clip",
    "no_clip": "zero_grad backward step",
    "zero_grad_before_step": "backward clip zero_grad step",
    "no_step": "zero_grad backward clip",
}


def _step_right(model, optimizer, x, y, max_grad_norm=1.0, *, mistake=""):
    """A training step in the order _STEP_ORDERS[mistake] ("backward": forward, loss, backward);
    `mistake` plants one of STEP_MISTAKES by its name."""
    for operation in _STEP_ORDERS[mistake].split():
        if operation == "zero_grad":
            optimizer.zero_grad()
        elif operation == "backward":
            loss = _loss(model, x, y)
            loss.backward()
        elif operation == "clip":
            torch.nn.utils.clip_grad_norm_(model.parameters(), max_grad_norm)
        else:
            optimizer.step()
    return loss.item()


STEP_MISTAKES = core.variants(
    _step_right,
    {
        "no_zero_grad": "your gradients pile up from step to step: call optimizer.zero_grad() at the start of each step (PyTorch ADDS each backward pass into .grad)",
        "clip_after_step": "you clip the gradients after optimizer.step(): the step has already used the unclipped gradients. Clip between loss.backward() and optimizer.step()",
        "no_clip": "your step does not clip the gradients: call torch.nn.utils.clip_grad_norm_(model.parameters(), max_grad_norm) before optimizer.step()",
        "zero_grad_before_step": "you call optimizer.zero_grad() between backward and step: the step then sees no gradients. Clear them at the START of the step",
        "no_step": "your step never changes the weights: call optimizer.step() after clipping",
    },
)


def _run_steps(step_fn, exercise=None, steps=2, max_grad_norm=0.05):
    """Two SGD steps from the same start -> (losses, parameters after, .grad left clipped?)."""
    model = _tiny_model(seed=3)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.5)
    gen = torch.Generator().manual_seed(4)
    losses = []
    for _ in range(steps):
        x = torch.randint(0, model.config.vocab_size, (2, 6), generator=gen)
        y = torch.randint(0, model.config.vocab_size, (2, 6), generator=gen)
        losses.append(_call(exercise, step_fn, model, optimizer, x, y, max_grad_norm))
    grads = [p.grad for p in model.parameters() if p.grad is not None]
    # .grad after the step, clipped or not, tells clipping after the step from no clipping
    clipped = bool(grads) and float(
        torch.linalg.vector_norm(torch.stack([torch.linalg.vector_norm(g) for g in grads]))
    ) <= max_grad_norm * (1 + 1e-4)
    return losses, [p.detach().clone() for p in model.parameters()], clipped


def _same_params(a, b):
    return len(a) == len(b) and all(
        torch.allclose(p, q, atol=1e-6, rtol=1e-5) for p, q in zip(a, b)
    )


def check_training_step(fn):
    """`fn(model, optimizer, x (B, T), y (B, T), max_grad_norm)` -> the batch's loss, a float."""
    losses, params, clipped = _run_steps(fn, EX_STEP)
    want_losses, want, _ = _run_steps(_step_right)
    for loss in losses:
        if isinstance(loss, torch.Tensor):
            if loss.numel() != 1:
                raise core.CheckFailed(EX_STEP, "return the loss as one number (loss.item())")
            loss = float(loss)
        if not isinstance(loss, (int, float)) or isinstance(loss, bool):
            raise core.CheckFailed(
                EX_STEP, f"return the loss as a float (loss.item()), got {type(loss).__name__}"
            )
        if not math.isfinite(loss):
            raise core.CheckFailed(EX_STEP, f"your step returned a loss of {loss}")
    if not _same_params(params, want):

        def matches(m):
            _, wrong_params, wrong_clipped = _run_steps(m.fn)
            return _same_params(params, wrong_params) and clipped == wrong_clipped

        core.fail_with(
            EX_STEP,
            STEP_MISTAKES,
            matches,
            "after two steps your weights differ from the expected ones: zero_grad, forward with F.cross_entropy, backward, clip_grad_norm_ with max_grad_norm, optimizer.step()",
        )
    if not math.isclose(float(losses[0]), want_losses[0], rel_tol=1e-5):
        raise core.CheckFailed(
            EX_STEP,
            f"the weights are right but the returned loss is {float(losses[0]):.4f}, not {want_losses[0]:.4f}: return the loss of this step's batch, computed before the update",
        )
    core.passed(EX_STEP, "zero_grad, forward, backward, clip, step, in that order")


# --------------------------------------------------------------------------- Exercise 7.6


def _lr_right(step, max_lr, warmup_steps, total_steps, min_lr, *, mistake=""):
    """Warm-up from the first step, cosine down to min_lr, then flat; `mistake` plants one of
    LR_MISTAKES by its name (the colleague's schedule: warm-up off by one and one step late, and
    no floor after total_steps)."""
    colleague = mistake == "colleagues_schedule"
    warmup_steps = 0 if mistake == "no_warmup" else warmup_steps
    min_lr = 0.0 if mistake == "cosine_to_zero" else min_lr
    if step < warmup_steps + colleague:
        first = 0 if colleague or mistake == "warmup_off_by_one" else 1
        rate = max_lr * (step + first) / warmup_steps
    elif step >= total_steps and not (colleague or mistake == "no_floor_after_end"):
        rate = min_lr
    else:
        start = 0 if mistake == "progress_from_zero" else warmup_steps
        progress = (step - start) / (total_steps - start)
        cosine = 0.5 * (1 + math.cos(math.pi * progress))
        rate = min_lr + (max_lr - min_lr) * (1 - progress if mistake == "linear_decay" else cosine)
    return torch.tensor(rate) if mistake == "tensor_not_float" else rate


LR_MISTAKES = core.variants(
    _lr_right,
    {
        "colleagues_schedule": "this is still the colleague's schedule, with both of its bugs: the warm-up starts at 0 (step 0 does nothing) and reaches max_lr one step late, and after total_steps the cosine climbs back up instead of staying at min_lr",
        "warmup_off_by_one": "your warm-up is off by one: step 0 gets a rate of 0, so the first step does nothing. Use max_lr * (step + 1) / warmup_steps",
        "cosine_to_zero": "your cosine ends at 0 instead of min_lr: the rate is min_lr + (max_lr - min_lr) * 0.5 * (1 + cos(pi * progress))",
        "no_floor_after_end": "after total_steps your rate climbs back up (the cosine goes on): return min_lr for every step >= total_steps",
        "no_warmup": "there is no warm-up: for step < warmup_steps the rate rises linearly, max_lr * (step + 1) / warmup_steps",
        "progress_from_zero": "your cosine starts counting at step 0 instead of at the end of the warm-up: progress = (step - warmup_steps) / (total_steps - warmup_steps)",
        "linear_decay": "your rate falls in a straight line: after the warm-up it follows half a cosine, 0.5 * (1 + cos(pi * progress))",
        "tensor_not_float": "return a Python float (.item() or float(...))",
    },
)

_LR_CASES = [  # (max_lr, warmup_steps, total_steps, min_lr)
    (6e-4, 10, 50, 6e-5),
    (1.0, 3, 12, 0.25),
]


def _lr_curve(fn, case, exercise=None):
    curve = []
    for step in range(case[2] + 6):
        value = _call(exercise, fn, step, *case)
        curve.append(
            value if exercise is None else _as_float(exercise, value, f"your rate at step {step}")
        )
    return curve


def _same_rate(a, b):
    return math.isclose(a, b, rel_tol=1e-6, abs_tol=1e-12)


def check_cosine_lr(fn):
    """`fn(step, max_lr, warmup_steps, total_steps, min_lr)` -> the step's rate, a float."""
    for case in _LR_CASES:
        got = _lr_curve(fn, case, EX_LR)
        want = _lr_curve(_lr_right, case)
        if all(map(_same_rate, got, want)):
            continue
        step = next(i for i, (g, w) in enumerate(zip(got, want)) if not _same_rate(g, w))
        named = dict(zip(("max_lr", "warmup_steps", "total_steps", "min_lr"), case))
        core.fail_with(
            EX_LR,
            LR_MISTAKES,
            lambda m: all(map(_same_rate, got, _lr_curve(m.fn, case))),
            f"with {named}, step {step} should get {want[step]:.6g}, yours gives {got[step]:.6g}",
        )
    core.passed(
        EX_LR,
        "warm-up from the first step, cosine down to min_lr, then flat. The colleague's warm-up started at 0 (its first step did nothing) and reached max_lr one step late, and past total_steps its cosine climbed back up. A schedule bug never raises an error: it shows only in the numbers",
    )


# --------------------------------------------------------------------------- Exercise 7.7


class _Recorder(torch.nn.Module):
    """A tiny model that records, at each forward, its input, its mode and the grad switch."""

    def __init__(self, inner):
        super().__init__()
        self.inner, self.config, self.calls = inner, inner.config, []

    def forward(self, idx):
        self.calls.append((idx.detach().clone(), self.inner.training, torch.is_grad_enabled()))
        return self.inner(idx)


def _estimate_right(model, ids, batch_size, block_size, batches=10, seed=0, *, mistake=""):
    """The mean loss of `batches` seeded batches, in eval mode without gradients, the mode put
    back; `mistake` plants one of ESTIMATE_MISTAKES by its name."""
    was_training = model.training
    if mistake != "dropout_on":
        model.eval()
    if mistake == "unseeded":
        seed = int(torch.randint(2**31, (1,)))
    generator = torch.Generator().manual_seed(0 if mistake == "seed_hard_coded" else seed)
    total = 0.0
    with torch.set_grad_enabled(mistake == "grad_on"):
        for _ in range(batches):
            x, y = _batch_right(ids, batch_size, block_size, generator)
            total += float(_loss(model, x, y).detach())
    if mistake != "mode_not_restored":
        model.train(was_training)
    loss = total if mistake == "sum_not_mean" else total / batches
    return torch.tensor(loss) if mistake == "tensor_not_float" else loss


ESTIMATE_MISTAKES = core.variants(
    _estimate_right,
    {
        "mode_not_restored": "after your estimate the model is left in eval mode: the training that follows would run without dropout. Put back the mode it came in (model.train(was_training))",
        "dropout_on": "your estimate ran the model in train mode, with dropout on: call model.eval() first, so that it measures the model, not the noise",
        "grad_on": "gradients were on during your estimate's forward passes: it builds a graph for a backward that never comes. Decorate it with @torch.no_grad() or use `with torch.no_grad():`",
        "sum_not_mean": "your estimate is the SUM of the batch losses: divide by the number of batches",
        "unseeded": "two calls on the same model gave different numbers: draw the batches from their own generator, torch.Generator().manual_seed(seed), and pass it to get_batch",
        "seed_hard_coded": "seed=0 and seed=1 gave the same batches: your estimate ignores its `seed` argument. Seed the generator with it, torch.Generator().manual_seed(seed)",
        "tensor_not_float": "your estimate is a tensor: return a Python float (.item() or float(...)), so that the history holds numbers, not tensors tied to the model",
    },
)


def check_estimate_loss(fn):
    """`fn(model, ids, batch_size, block_size, batches, seed)` -> the mean loss of `batches`
    seeded batches (a float), in eval mode without gradients, the model's mode put back."""
    ids = torch.arange(40)  # distinct ids: the targets of every window are its ids + 1
    for start_in_train_mode, batches in ((True, 4), (False, 3)):
        model = _Recorder(_tiny_model(seed=2, n_positions=16, vocab_size=41, dropout=0.3))
        model.train(start_in_train_mode)
        got = core.call_learner(EX_LOOP, fn, model, ids, 3, 6, batches, 0)
        if isinstance(got, torch.Tensor):
            raise core.named_failure(EX_LOOP, ESTIMATE_MISTAKES, "tensor_not_float")
        value = _as_float(EX_LOOP, got, "your estimate")
        calls = list(model.calls)
        if model.training != start_in_train_mode:
            raise core.named_failure(EX_LOOP, ESTIMATE_MISTAKES, "mode_not_restored")
        if any(training for _, training, _ in calls):
            raise core.named_failure(EX_LOOP, ESTIMATE_MISTAKES, "dropout_on")
        if any(grad for _, _, grad in calls):
            raise core.named_failure(EX_LOOP, ESTIMATE_MISTAKES, "grad_on")
        if len(calls) != batches:
            raise core.CheckFailed(
                EX_LOOP,
                f"with batches={batches} your estimate ran the model {len(calls)} times: one forward pass per batch",
            )
        with torch.no_grad():
            model.inner.eval()
            want = sum(float(_loss(model.inner, x, x + 1)) for x, _, _ in calls) / batches
            model.inner.train(start_in_train_mode)
        if math.isclose(value, want * batches, rel_tol=1e-4):
            raise core.named_failure(EX_LOOP, ESTIMATE_MISTAKES, "sum_not_mean")
        if not math.isclose(value, want, rel_tol=1e-4):
            raise core.CheckFailed(
                EX_LOOP,
                f"your estimate is {value:.4f}, but the mean loss of the batches it ran is {want:.4f}",
            )
        again = core.call_learner(EX_LOOP, fn, model, ids, 3, 6, batches, 0)
        if _as_float(EX_LOOP, again, "your estimate") != value:
            raise core.named_failure(EX_LOOP, ESTIMATE_MISTAKES, "unseeded")
    model.calls.clear()
    core.call_learner(EX_LOOP, fn, model, ids, 3, 6, 1, 1)
    if torch.equal(model.calls[0][0], calls[0][0]):
        raise core.named_failure(EX_LOOP, ESTIMATE_MISTAKES, "seed_hard_coded")
    core.passed(
        EX_LOOP,
        "eval mode, no gradients, the same seeded batches every call, mode put back",
        part="the evaluation",
    )


def _reference_pieces():
    from gpt2lib.chapters import training

    return {
        "get_batch": getattr(training.get_batch, "unchecked", training.get_batch),
        "train_step": training.training_step,
        "lr_at": getattr(training.lr_schedule, "unchecked", training.lr_schedule),
    }


def _loop_right(model, train_ids, val_ids, steps, *, history, eval_every, mistake="", **run):
    """The chapter's train_loop for the settings `_run_loop` gives it (min_lr max_lr / 10,
    weight decay 0.1, max_grad_norm 1.0); `mistake` plants one of LOOP_MISTAKES by its name."""
    from gpt2lib.chapters import training

    seed = 0 if mistake == "seed_hard_coded" else run["seed"]
    torch.manual_seed(seed)
    generator = torch.Generator().manual_seed(seed)
    optimizer = training.make_optimizer(model, run["max_lr"], 0.1)
    batches = 10 if mistake == "eval_batches_ignored" else run["eval_batches"]
    shape = (run["batch_size"], run["block_size"])
    offset = 0 if mistake == "eval_off_by_one" else 1

    def evaluate(step):
        history.eval_step.append(step)
        train_loss = training.estimate_loss(model, train_ids, *shape, batches)
        history.eval_train_loss.append(train_loss)
        history.eval_val_loss.append(training.estimate_loss(model, val_ids, *shape, batches))

    model.train()
    for step in range(steps):
        lr = run["lr_at"](step, run["max_lr"], run["warmup_steps"], steps, run["max_lr"] / 10)
        if mistake != "rate_not_set":
            for group in optimizer.param_groups:
                group["lr"] = lr
        drawing = None if mistake == "generator_not_passed" else generator
        x, y = run["get_batch"](train_ids, *shape, drawing, None)
        loss = float(run["train_step"](model, optimizer, x, y, 1.0))
        history.step.append(step)
        history.train_loss.append(loss)
        history.lr.append(lr)
        if (step + offset) % eval_every == 0 and step + 1 < steps:
            evaluate(step + offset)
    if mistake != "no_final_eval":
        evaluate(steps)
    if mistake != "left_in_train_mode":
        model.eval()
    return history


LOOP_MISTAKES = core.variants(
    _loop_right,
    {
        "rate_not_set": "your loop asks the schedule for a rate but never gives it to the optimizer, so every step ran at max_lr: set group['lr'] for every group of optimizer.param_groups before the step",
        "no_final_eval": "your loop does not estimate the loss after the last step: the history must end with an estimate at step `steps`",
        "eval_off_by_one": "your estimates come one step early: after the update of step s the model has taken s + 1 steps, so evaluate(step + 1) when (step + 1) is a multiple of eval_every",
        "left_in_train_mode": "after the run the model is still in train mode: end with model.eval(), as the reference does",
        "generator_not_passed": "your batches do not come from the run's generator: two runs with the same seed would train differently. Pass `generator` to get_batch",
        "seed_hard_coded": "with seed=3 your run drew the batches of another seed: seed torch.manual_seed and the run's generator with the `seed` argument, not a number of your own",
        "eval_batches_ignored": "your estimates do not use eval_batches batches: pass eval_batches to estimate_loss (its default, 10, is not the run's setting)",
    },
)


def _run_loop(fn, exercise=None):
    from gpt2lib.chapters import training

    # dropout draws from the global random stream, so batches drawn from it (the generator not
    # passed) differ from the run's own generator's
    model = _tiny_model(seed=1, n_positions=16, vocab_size=37, dropout=0.1)
    gen = torch.Generator().manual_seed(0)
    ids = torch.randint(0, 37, (15,), generator=gen).repeat(20)  # a learnable text
    kwargs = dict(batch_size=2, block_size=8, max_lr=1e-2, warmup_steps=3, eval_every=4)
    kwargs.update(eval_batches=1, seed=3, history=training.History(), **_reference_pieces())
    torch.manual_seed(1234)  # a loop that forgets its seeds still gives the same draws twice
    history = _call(exercise, fn, model, ids[:240], ids[240:], 10, **kwargs)
    return history, model.training


def _loop_signature(history, training):
    return (
        tuple(round(v, 5) for v in history.train_loss),
        tuple(history.eval_step),
        tuple(history.lr),
        training,
        tuple(round(v, 3) for v in history.eval_train_loss + history.eval_val_loss),
    )


def check_train_loop(fn):
    """`fn(model, train_ids, val_ids, steps, **settings)` -> the History it filled."""
    got_history, got_training = _run_loop(fn, EX_LOOP)
    if got_history is None or not hasattr(got_history, "train_loss"):
        raise core.CheckFailed(EX_LOOP, "return the history (the History the loop filled)")
    got = _loop_signature(got_history, got_training)
    want = _loop_signature(*_run_loop(_loop_right))
    if got == want:
        return core.passed(
            EX_LOOP,
            "the rate set, your pieces called, estimates every eval_every steps and at the end",
        )
    mistake = core.first_mistake(LOOP_MISTAKES, lambda m: got == _loop_signature(*_run_loop(m.fn)))
    if mistake is not None:
        raise core.CheckFailed(EX_LOOP, mistake.message)
    if len(got[0]) != 10:
        raise core.CheckFailed(
            EX_LOOP, f"10 steps recorded {len(got[0])} batch losses: record one per step"
        )
    if got[1] != want[1]:
        raise core.CheckFailed(
            EX_LOOP,
            f"with 10 steps and eval_every=4 the estimates belong at steps {list(want[1])}, yours are at {list(got[1])}",
        )
    raise core.CheckFailed(
        EX_LOOP,
        "your run's batch losses differ from the reference loop's with the same pieces and seed: each step sets the rate, draws a batch with the run's generator and calls train_step; the estimates use eval_batches",
    )


# --------------------------------------------------------------------------- the chapter's runs


TINY_VOCAB = 1000  # the tiny runs keep the 999 commonest tokens and fold the rest into one


def _compact(train_ids, val_ids):
    """The ids mapped to TINY_VOCAB ids: 0.. for the commonest tokens, the last for the rest."""
    counts = torch.bincount(train_ids.long())
    commonest = counts.argsort(descending=True)[: TINY_VOCAB - 1]
    table = torch.full((max(int(train_ids.max()), int(val_ids.max())) + 1,), TINY_VOCAB - 1)
    table[commonest] = torch.arange(len(commonest))
    return table[train_ids.long()], table[val_ids.long()]


def tiny_run(train_ids, val_ids, max_lr=3e-2, steps=40, **pieces):
    """A tiny GPT-2 (2 layers, width 32) trained `steps` steps through gpt2lib.training.train,
    on the tokens folded into TINY_VOCAB ids (so that a run takes a second). `pieces`
    (get_batch, train_step, lr_at) replace the reference ones. -> its History, model in .model.
    """
    from gpt2lib.training import train

    train_ids, val_ids = _compact(train_ids, val_ids)
    sizes = dict(n_layer=2, n_embd=32, n_positions=32, vocab_size=TINY_VOCAB)
    model = core.tiny_gpt2(0, **sizes).train()
    settings = dict(batch_size=8, block_size=32, max_lr=max_lr, warmup_steps=4, eval_every=steps)
    settings.update(eval_batches=2, seed=0, progress=False)
    history = train(model, train_ids, val_ids, steps, **settings, **pieces)
    history.model = model  # the trained model, for a closer look
    return history


def _warmup_forever(step, max_lr, warmup_steps, total_steps, min_lr):
    return max_lr * (step + 1) / warmup_steps


SUSPECTS = (
    "targets not shifted",
    "gradients cleared before the step",
    "warm-up never ends",
    "gradients never cleared",
)
_NOT_SHIFTED, _CLEARED_EARLY, _ENDLESS_WARMUP, _NEVER_CLEARED = SUSPECTS
_BROKEN = {  # A and B plant mistakes the checks of 7.3 and 7.5 name
    "A": (_NOT_SHIFTED, {"get_batch": core.named(BATCH_MISTAKES, "not_shifted").fn}),
    "B": (_CLEARED_EARLY, {"train_step": core.named(STEP_MISTAKES, "zero_grad_before_step").fn}),
    "C": (_ENDLESS_WARMUP, {"lr_at": _warmup_forever}),
}


def broken_runs(train_ids, val_ids, steps=60):
    """{"healthy": History, "A": ..., "B": ..., "C": ...}: tiny runs, each with one planted bug."""
    runs = {"healthy": tiny_run(train_ids, val_ids, steps=steps)}
    for label, (_, pieces) in _BROKEN.items():
        runs[label] = tiny_run(train_ids, val_ids, steps=steps, **pieces)
    return runs


def _diagnosis_right(*, mistake=""):
    """Which bug broke which run; `mistake` plants one of DIAGNOSIS_MISTAKES by its name."""
    guesses = {
        "a_and_b_swapped": (_CLEARED_EARLY, _NOT_SHIFTED, _ENDLESS_WARMUP),
        "none_right": (_ENDLESS_WARMUP, _NOT_SHIFTED, _CLEARED_EARLY),
        "unused_suspect": (_NOT_SHIFTED, _CLEARED_EARLY, _NEVER_CLEARED),
    }
    return dict(zip("ABC", guesses.get(mistake, [bug for bug, _ in _BROKEN.values()])))


DIAGNOSIS_MISTAKES = core.variants(
    _diagnosis_right,
    {
        "a_and_b_swapped": "1 of the 3 runs is named right. Think about what each bug does to one step, then to 60 of them; the History also records each step's rate (.lr)",
        "none_right": "none of the 3 runs is named right. Which run's training loss is too good to be true, and what does its validation loss say?",
        "unused_suspect": "'gradients never cleared' broke none of these runs. With AdamW it would train almost like the healthy run (Adam rescales the piled-up gradients), which is how such a bug can hide for a long time",
    },
)


def check_diagnosis(fn):
    """`fn()` -> {"A": suspect, "B": suspect, "C": suspect}, each one of SUSPECTS."""
    got = core.call_learner(EX_DIAGNOSIS, fn)
    if not isinstance(got, dict) or set(got) != {"A", "B", "C"}:
        raise core.CheckFailed(EX_DIAGNOSIS, 'return a dict with the keys "A", "B" and "C"')
    for label, suspect in got.items():
        if suspect not in SUSPECTS:
            raise core.CheckFailed(
                EX_DIAGNOSIS,
                f"{suspect!r} (run {label}) is not one of the suspects: {', '.join(SUSPECTS)}",
            )
    if _NEVER_CLEARED in got.values():
        raise core.named_failure(EX_DIAGNOSIS, DIAGNOSIS_MISTAKES, "unused_suspect")
    right = sum(got[label] == bug for label, (bug, _) in _BROKEN.items())
    if right == 3:
        return core.passed(
            EX_DIAGNOSIS,
            "A's training loss dives below the healthy run's while its validation loss does not: with targets equal to inputs it learns to copy the token it is given, useless on real next tokens (too good to be true is a symptom). B stays at ln 1000: its gradients are gone before the step, so AdamW has nothing to follow. C's rate ends many times max_lr, as its warm-up never stops rising",
        )
    if right == 2:  # two right and one wrong cannot happen with three different names
        raise core.CheckFailed(EX_DIAGNOSIS, "each run has a different suspect: name each one once")
    raise core.named_failure(
        EX_DIAGNOSIS, DIAGNOSIS_MISTAKES, "a_and_b_swapped" if right else "none_right"
    )


def check_challenge(model, history, val_ids, *, goal, max_steps, max_tokens, block_size):
    """The challenge: a validation loss below `goal` in at most max_steps steps."""
    from gpt2lib.chapters.training import estimate_loss

    steps = len(history.step)
    if steps > max_steps:
        raise core.CheckFailed(CHALLENGE, f"your run took {steps} steps; the limit is {max_steps}")
    tokens = getattr(history, "largest_batch", 0)
    if tokens > max_tokens:
        raise core.CheckFailed(
            CHALLENGE,
            f"your batches held {tokens} tokens a step; the limit is {max_tokens} (batch_size x block_size)",
        )
    loss = estimate_loss(model, val_ids, 8, block_size, batches=8)
    if not loss < goal:
        raise core.CheckFailed(
            CHALLENGE,
            f"validation loss {loss:.4f} after {steps} steps: {loss - goal:.4f} above the goal {goal:.4f}",
        )
    core.passed(
        CHALLENGE,
        f"validation loss {loss:.4f} after {steps} steps, {goal - loss:.4f} below the goal {goal:.4f}",
    )


def _sweep(train_ids, val_ids, rates, *, mistake=""):
    """{rate: the final validation loss of a tiny run}; `mistake` plants RATE_MISTAKES' one."""
    runs = {rate: tiny_run(train_ids, val_ids, max_lr=rate) for rate in rates}
    read = (lambda h: h.train_loss[0]) if mistake == "first_loss" else (lambda h: h.val_loss)
    return {rate: read(history) for rate, history in runs.items()}


RATE_MISTAKES = core.variants(
    _sweep,
    {
        "first_loss": "your numbers are far from the final validation loss of a fresh run: they look like the loss at the START of each run. Read the end, history.val_loss",
    },
)


def check_rate_sweep(sweep, train_ids, val_ids):
    """The learner's {rate: final validation loss}; two of its numbers are remeasured."""
    if not isinstance(sweep, dict) or len(sweep) < 3:
        raise core.CheckFailed(
            EX_RATES,
            "measure_rates should return a dict {rate: loss} with one entry per rate (at least 3)",
        )
    losses = {
        float(rate): _as_float(EX_RATES, loss, f"the loss for rate {rate}")
        for rate, loss in sweep.items()
    }
    rates = sorted(losses)
    if rates[-1] < 100 * rates[0]:
        raise core.CheckFailed(
            EX_RATES,
            "your rates should span at least a factor of 100 (say 3e-4 to 3e-2): close rates give close losses",
        )
    for rate in (rates[0], rates[-1]):
        want = tiny_run(train_ids, val_ids, max_lr=rate).val_loss
        if not abs(losses[rate] - want) < 0.3:
            raise core.CheckFailed(
                EX_RATES,
                f"at max_lr {rate:g} your loss is {losses[rate]:.4f}, a fresh tiny_run ends at {want:.4f}. "
                + core.named(RATE_MISTAKES, "first_loss").message,
            )
    best = min(losses, key=losses.get)
    core.passed(EX_RATES, f"the lowest validation loss came at max_lr {best:g}")


def your_pieces(get_batch, training_step, lr_schedule, estimate_loss, train_loop):
    """Chapter 7's run with your pieces -> (train, pieces, estimate).

    Each piece is yours if its exercise is done, else the reference (with a note). `train` is
    your train_loop behind gpt2lib.training's entry point (every argument checked, a NaN loss
    stops the run naming the step, a progress bar); `pieces` are the keyword arguments that
    plug your get_batch, training_step and lr_schedule into it.
    """
    from gpt2lib.chapters.training import History
    from gpt2lib.course.mine import yours
    from gpt2lib.training import guarded_train

    pieces = dict(
        get_batch=yours("7.3", get_batch),
        train_step=yours("7.5", training_step),
        lr_at=yours("7.6", lr_schedule),
    )
    estimate = yours("7.7", estimate_loss)
    return guarded_train(yours("7.7", train_loop), History), pieces, estimate


# Each check with the planted mistakes it names (the tests run every one through its check).
MISTAKES_BY_CHECK = {
    check_cross_entropy: LOSS_MISTAKES + LOSS_RULES,
    check_uniform_loss: UNIFORM_MISTAKES,
    check_unigram_loss: UNIGRAM_MISTAKES,
    check_random_batch: BATCH_MISTAKES + DEVICE_MISTAKES,
    check_bigram: BIGRAM_MISTAKES,
    check_decay_groups: DECAY_MISTAKES,
    check_training_step: STEP_MISTAKES,
    check_cosine_lr: LR_MISTAKES,
    check_estimate_loss: ESTIMATE_MISTAKES,
    check_train_loop: LOOP_MISTAKES,
    check_diagnosis: DIAGNOSIS_MISTAKES,
}
