"""Checks for chapter 7 (training): targets, cross-entropy, batches, weight decay, one
training step, the learning-rate schedule and a plain sampling loop.

Each check runs the learner's code on small cases and compares it with the right answer;
when they differ, it compares with the planted mistakes below (the usual wrong versions)
and names the one that matches. The lists are module-level so that the tests can run every
planted mistake through its check.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F

from gpt2lib.course.checks._core import (
    CheckFailed,
    Mistake,
    call_learner,
    close,
    expect_tensor,
    first_mistake,
    named,
    passed,
)

EX_TARGETS = "Exercise 7.1 (inputs and targets)"
EX_LOSS = "Exercise 7.2 (cross-entropy from log-softmax)"
EX_BATCH = "Exercise 7.3 (random batches)"
EX_DECAY = "Exercise 7.4 (which parameters get weight decay)"
EX_STEP = "Exercise 7.5 (one training step)"
EX_LR = "Exercise 7.6 (warm-up and cosine)"
EX_SAMPLE = "Exercise 7.7 (sample without a cache)"


def _tiny_model(seed=0, n_positions=16, vocab_size=37, dropout=0.0):
    from gpt2lib.config import GPT2Config
    from gpt2lib.model import GPT2

    torch.manual_seed(seed)
    config = GPT2Config(n_layer=2, n_head=2, n_embd=16, n_positions=n_positions,
                        vocab_size=vocab_size, embd_pdrop=dropout, attn_pdrop=dropout,
                        resid_pdrop=dropout)
    return GPT2(config)


def _as_pair(exercise, got, what="your function"):
    if not isinstance(got, (tuple, list)) or len(got) != 2:
        raise CheckFailed(exercise, f"{what} should return two tensors (x, y), got {type(got).__name__}")
    return got


# --------------------------------------------------------------------------- Exercise 7.1

TARGET_MISTAKES = [
    Mistake("not_shifted",
            "your targets equal your inputs: the model would learn to copy the token it is "
            "given. The target at position t is the NEXT token: y = chunk[:, 1:]",
            lambda chunk: (chunk[:, :-1], chunk[:, :-1])),
    Mistake("shifted_wrong_way",
            "your targets are shifted the wrong way: y[t] is the token BEFORE x[t], so the "
            "model would predict the past. Use x = chunk[:, :-1] and y = chunk[:, 1:]",
            lambda chunk: (chunk[:, 1:], chunk[:, :-1])),
    Mistake("whole_chunk_as_target",
            "your targets keep all T + 1 tokens of the chunk: drop the first one (y = chunk[:, 1:])",
            lambda chunk: (chunk[:, :-1], chunk)),
    Mistake("whole_chunk_as_input",
            "your inputs keep all T + 1 tokens of the chunk: the last token has no target, so "
            "drop it (x = chunk[:, :-1])",
            lambda chunk: (chunk, chunk[:, 1:])),
]


def check_inputs_and_targets(fn):
    gen = torch.Generator().manual_seed(0)
    chunk = torch.randint(0, 1000, (3, 9), generator=gen)  # (B, T + 1)
    want = (chunk[:, :-1], chunk[:, 1:])
    got = _as_pair(EX_TARGETS, call_learner(EX_TARGETS, fn, chunk.clone()))
    if all(isinstance(g, torch.Tensor) and torch.equal(g, w) for g, w in zip(got, want)):
        # a second shape, so that a hard-coded length does not pass
        other = torch.randint(0, 1000, (1, 4), generator=gen)
        again = _as_pair(EX_TARGETS, call_learner(EX_TARGETS, fn, other.clone()))
        if all(isinstance(g, torch.Tensor) and torch.equal(g, w)
               for g, w in zip(again, (other[:, :-1], other[:, 1:]))):
            return passed(EX_TARGETS, "x is the chunk without its last token, y without its first")
    mistake = first_mistake(TARGET_MISTAKES, lambda m: all(
        isinstance(g, torch.Tensor) and torch.equal(g, w) for g, w in zip(got, m.fn(chunk))))
    if mistake is not None:
        raise CheckFailed(EX_TARGETS, mistake.message)
    x, y = got
    for name, tensor in (("x", x), ("y", y)):
        expect_tensor(EX_TARGETS, tensor, (3, 8), what=f"your {name}")
    raise CheckFailed(EX_TARGETS, "x should be chunk[:, :-1] and y should be chunk[:, 1:] "
                                  "(each row keeps its own tokens, in order)")


# --------------------------------------------------------------------------- Exercise 7.2


def _nll(log_probs, targets):
    return -log_probs.gather(-1, targets.unsqueeze(-1)).squeeze(-1)


LOSS_MISTAKES = [
    Mistake("log_softmax_over_time",
            "your log-softmax normalises over the wrong dimension (the positions, dim=1): "
            "probabilities must sum to 1 over the vocabulary, the last dimension (dim=-1)",
            lambda logits, targets: _nll(logits.log_softmax(dim=1), targets).mean()),
    Mistake("log_softmax_over_batch",
            "your log-softmax normalises over the batch (dim=0): normalise over the "
            "vocabulary, the last dimension (dim=-1)",
            lambda logits, targets: _nll(logits.log_softmax(dim=0), targets).mean()),
    Mistake("sum_not_mean",
            "your loss is the SUM over positions: take the mean, so that the loss does not "
            "grow with the batch size or the context length",
            lambda logits, targets: _nll(logits.log_softmax(dim=-1), targets).sum()),
    Mistake("sign",
            "your loss has the wrong sign: it is MINUS the mean log-probability of the targets "
            "(a loss is positive and falls as the model improves)",
            lambda logits, targets: -_nll(logits.log_softmax(dim=-1), targets).mean()),
    Mistake("softmax_not_log",
            "you gathered probabilities, not log-probabilities: use log_softmax (taking "
            "softmax then .log() also works, but is less stable)",
            lambda logits, targets: _nll(logits.softmax(dim=-1), targets).mean()),
    Mistake("no_normalisation",
            "you gathered the raw logits without log_softmax: the loss must use "
            "log-probabilities, which depend on every logit of the row",
            lambda logits, targets: _nll(logits, targets).mean()),
]


def check_cross_entropy(fn):
    gen = torch.Generator().manual_seed(0)
    cases = [(2, 5, 11), (3, 4, 7)]
    for B, T, V in cases:
        logits = 3 * torch.randn(B, T, V, generator=gen)
        targets = torch.randint(0, V, (B, T), generator=gen)
        want = F.cross_entropy(logits.flatten(0, 1), targets.flatten())
        got = call_learner(EX_LOSS, fn, logits.clone(), targets.clone())
        if isinstance(got, torch.Tensor) and got.numel() == 1 and close(got.reshape(()), want):
            continue
        def matches(m, got=got, logits=logits, targets=targets):
            return isinstance(got, torch.Tensor) and close(
                got.reshape(()) if got.numel() == 1 else got, m.fn(logits, targets))

        mistake = first_mistake(LOSS_MISTAKES, matches)
        if mistake is not None:
            raise CheckFailed(EX_LOSS, mistake.message)
        got = expect_tensor(EX_LOSS, got, what="your loss")
        if got.numel() != 1:
            raise CheckFailed(EX_LOSS, f"your loss has shape {tuple(got.shape)}: return ONE number, "
                                       "the mean over every position of every sequence")
        raise CheckFailed(EX_LOSS, f"your loss is {float(got):.4f}, F.cross_entropy gives "
                                   f"{float(want):.4f} (logits of shape {(B, T, V)})")
    # gradients must flow: a loss computed from a detached copy cannot train anything
    logits = torch.randn(2, 3, 5, generator=gen, requires_grad=True)
    targets = torch.randint(0, 5, (2, 3), generator=gen)
    got = call_learner(EX_LOSS, fn, logits, targets)
    if not got.requires_grad:
        raise CheckFailed(EX_LOSS, "your loss carries no gradient (.detach(), .item() or numpy "
                                   "inside?): return a tensor computed from the logits")
    passed(EX_LOSS, "equal to F.cross_entropy")


# --------------------------------------------------------------------------- Exercise 7.3


def _windows_ok(ids, x, y, block_size):
    """For each row, the start s with x == ids[s:s+T] and y == ids[s+1:s+T+1], or None."""
    starts = []
    N = len(ids)
    for row_x, row_y in zip(x, y):
        found = None
        for s in range(N - block_size):
            if torch.equal(ids[s:s + block_size], row_x) and torch.equal(ids[s + 1:s + block_size + 1], row_y):
                found = s
                break
        if found is None:
            return None
        starts.append(found)
    return starts


def _batch(start_range, shift=1, rows="random"):
    """A batch function; the arguments plant one mistake each (the defaults are right)."""

    def run(ids, batch_size, block_size, generator=None):
        high = len(ids) - block_size + start_range
        if rows == "first":
            starts = [0] * batch_size
        elif rows == "one":
            starts = [int(torch.randint(high, (1,), generator=generator))] * batch_size
        else:
            starts = torch.randint(high, (batch_size,), generator=generator).tolist()
        x = torch.stack([ids[s:s + block_size] for s in starts])
        y = torch.stack([ids[s + shift:s + shift + block_size] for s in starts])
        return x, y

    return run


_batch_right = _batch(0)

BATCH_MISTAKES = [
    Mistake("not_shifted", "your y equals your x: y must be the same window one token later "
            "(ids[s + 1 : s + block_size + 1])", _batch(0, shift=0)),
    Mistake("one_window", "every row of your batch is the same window: draw one random start "
            "per row (torch.randint(..., (batch_size,)))", _batch(0, rows="one")),
    Mistake("not_random", "your windows always start at the beginning of ids: draw random "
            "starts with torch.randint(..., generator=generator)", _batch(0, rows="first")),
    Mistake("range_too_long", "a window ran past the end of ids: the last possible start is "
            "len(ids) - block_size - 1 (the targets need one more token), and torch.randint's "
            "upper end is excluded, so use torch.randint(len(ids) - block_size, ...)", _batch(1)),
    Mistake("range_too_short", "with 8 ids and block_size 5 the starts 0, 1 and 2 are all "
            "possible, but 2 never came up, so the very last token is never a target: "
            "torch.randint's upper end is excluded, use torch.randint(len(ids) - block_size, ...)",
            _batch(-1)),
]
_BATCH = {m.name: m for m in BATCH_MISTAKES}


def _call_batch(fn, ids, batch_size, block_size, seed):
    try:
        got = call_learner(EX_BATCH, fn, ids, batch_size, block_size,
                           torch.Generator().manual_seed(seed))
    except (IndexError, RuntimeError):  # a window past the end: a short row or a bad index
        raise CheckFailed(EX_BATCH, _BATCH["range_too_long"].message) from None
    x, y = _as_pair(EX_BATCH, got)
    x = expect_tensor(EX_BATCH, x, (batch_size, block_size), what="your x")
    y = expect_tensor(EX_BATCH, y, (batch_size, block_size), what="your y")
    return x.long(), y.long()


def check_random_batch(fn):
    ids = torch.arange(100, 130)  # distinct ids: each window is easy to find
    B, T = 64, 5
    x, y = _call_batch(fn, ids, B, T, seed=0)
    for name in ("not_shifted", "one_window", "not_random"):
        wrong = _BATCH[name].fn(ids, B, T, torch.Generator().manual_seed(0))
        if torch.equal(x, wrong[0]) and torch.equal(y, wrong[1]):
            raise CheckFailed(EX_BATCH, _BATCH[name].message)
    if torch.equal(x, y):
        raise CheckFailed(EX_BATCH, _BATCH["not_shifted"].message)
    if torch.equal(y[:, 1:], x[:, :-1]):
        raise CheckFailed(EX_BATCH, "your y is x shifted the wrong way (one token EARLIER): y "
                                    "is the window starting one token later")
    starts = _windows_ok(ids, x, y, T)
    if starts is None:
        raise CheckFailed(EX_BATCH, "each row of x must be a stretch of ids, ids[s : s + "
                                    "block_size], and the same row of y must be ids[s + 1 : s + "
                                    "block_size + 1]")
    if len(set(starts)) == 1:
        raise CheckFailed(EX_BATCH, _BATCH["one_window" if starts[0] else "not_random"].message)
    # many draws from 8 ids with block_size 5: every start 0, 1, 2 must come up, and no other
    small = torch.arange(200, 208)
    seen = set()
    for seed in range(20):
        bx, by = _call_batch(fn, small, 16, 5, seed=100 + seed)
        rows = _windows_ok(small, bx, by, 5)
        if rows is None:
            raise CheckFailed(EX_BATCH, _BATCH["range_too_long"].message)
        seen.update(rows)
    if seen != {0, 1, 2}:
        raise CheckFailed(EX_BATCH, _BATCH["range_too_short"].message)
    first = _call_batch(fn, ids, 8, T, seed=5)
    again = _call_batch(fn, ids, 8, T, seed=5)
    if not (torch.equal(first[0], again[0]) and torch.equal(first[1], again[1])):
        raise CheckFailed(EX_BATCH, "the same seed gave different batches: pass "
                                    "generator=generator to torch.randint")
    passed(EX_BATCH, "random windows, y one token later, every start possible, repeatable")


# --------------------------------------------------------------------------- Exercise 7.4


def _groups(decay, no_decay, wd):
    return [{"params": decay, "weight_decay": wd}, {"params": no_decay, "weight_decay": 0.0}]


DECAY_MISTAKES = [
    Mistake("decay_everything",
            "your groups put weight decay on the LayerNorm gains and the biases too: those "
            "are 1-D (p.dim() == 1) and get weight_decay 0.0",
            lambda model, wd: _groups(list(model.parameters()), [], wd)),
    Mistake("decay_nothing",
            "no parameter gets weight decay: the 2-D weight matrices (p.dim() >= 2) go in "
            "the group with weight_decay=weight_decay",
            lambda model, wd: _groups([], list(model.parameters()), wd)),
    Mistake("swapped",
            "your groups are swapped: the 2-D weight matrices get weight decay, the 1-D gains "
            "and biases get 0.0",
            lambda model, wd: _groups([p for p in model.parameters() if p.dim() < 2],
                                      [p for p in model.parameters() if p.dim() >= 2], wd)),
    Mistake("by_name_weight",
            "you chose by name: every parameter called '...weight' is decayed, but LayerNorm's "
            "gain is also called weight. Choose by shape instead: p.dim() >= 2",
            lambda model, wd: _groups([p for n, p in model.named_parameters() if n.endswith("weight")],
                                      [p for n, p in model.named_parameters() if not n.endswith("weight")], wd)),
]


def _decay_of_each(exercise, groups, model):
    """{parameter index: weight decay} from the learner's groups; refuses duplicates and gaps."""
    if not isinstance(groups, (list, tuple)) or not all(isinstance(g, dict) for g in groups):
        raise CheckFailed(exercise, "return a list of dicts, each with 'params' and 'weight_decay'")
    index = {id(p): i for i, p in enumerate(model.parameters())}
    names = [n for n, _ in model.named_parameters()]
    decay = {}
    for group in groups:
        if "params" not in group or "weight_decay" not in group:
            raise CheckFailed(exercise, "each group needs the keys 'params' and 'weight_decay'")
        for p in list(group["params"]):
            i = index.get(id(p))
            if i is None:
                raise CheckFailed(exercise, "a group holds something that is not a parameter of the "
                                            "model (a copy? use the tensors from model.parameters())")
            if i in decay:
                raise CheckFailed(exercise, f"{names[i]} is in two groups: each parameter goes into "
                                            "exactly one")
            decay[i] = float(group["weight_decay"])
    missing = [names[i] for i in range(len(names)) if i not in decay]
    if missing:
        raise CheckFailed(exercise, f"{len(missing)} parameters are in no group (first: {missing[0]}): "
                                    "AdamW would never train them")
    return decay


def check_decay_groups(fn):
    model = _tiny_model()
    wd = 0.1
    groups = call_learner(EX_DECAY, fn, model, wd)
    try:
        got = _decay_of_each(EX_DECAY, groups, model)
    except CheckFailed:
        got = None
    if got is not None:
        want = {i: (wd if p.dim() >= 2 else 0.0) for i, p in enumerate(model.parameters())}
        if got == want:
            torch.optim.AdamW(groups, lr=1e-3)  # the groups must be usable as they are
            n_decay = sum(1 for v in got.values() if v)
            return passed(EX_DECAY, f"{n_decay} weight matrices decayed, "
                                    f"{len(got) - n_decay} gains and biases not")
    mistake = first_mistake(DECAY_MISTAKES, lambda m: got == _decay_of_each(EX_DECAY, m.fn(model, wd), model))
    if mistake is not None:
        raise CheckFailed(EX_DECAY, mistake.message)
    _decay_of_each(EX_DECAY, groups, model)  # raises with the structural problem, if any
    names = [n for n, _ in model.named_parameters()]
    params = list(model.parameters())
    wrong = [names[i] for i, v in got.items() if v != (wd if params[i].dim() >= 2 else 0.0)]
    raise CheckFailed(EX_DECAY, f"wrong weight decay for {len(wrong)} parameters (first: {wrong[0]}): "
                                f"2-D weights get {wd}, 1-D gains and biases 0.0")


# --------------------------------------------------------------------------- Exercise 7.5


def _loss(model, x, y):
    return F.cross_entropy(model(x).flatten(0, 1), y.flatten())


_STEP_OPERATIONS = {  # what a training step does besides the forward and backward pass
    "zero_grad": lambda model, optimizer, max_grad_norm: optimizer.zero_grad(),
    "clip": lambda model, optimizer, max_grad_norm: torch.nn.utils.clip_grad_norm_(
        model.parameters(), max_grad_norm),
    "step": lambda model, optimizer, max_grad_norm: optimizer.step(),
}


def _training_step(*operations):
    """A training step that runs `operations` in this order: "zero_grad", "backward" (the
    forward pass, the loss and loss.backward()), "clip" and "step". The right step runs all
    four in that order; each planted mistake changes the order or leaves one out."""

    def training_step(model, optimizer, x, y, max_grad_norm=1.0):
        loss = None
        for operation in operations:
            if operation == "backward":
                loss = _loss(model, x, y)
                loss.backward()
            else:
                _STEP_OPERATIONS[operation](model, optimizer, max_grad_norm)
        return loss.item()

    return training_step


_step_right = _training_step("zero_grad", "backward", "clip", "step")

STEP_MISTAKES = [
    Mistake("no_zero_grad",
            "your gradients pile up from step to step: call optimizer.zero_grad() at the start "
            "of each step (PyTorch ADDS each backward pass into .grad)",
            _training_step("backward", "clip", "step")),
    Mistake("clip_after_step",
            "you clip the gradients after optimizer.step(): the step has already used the "
            "unclipped gradients. Clip between loss.backward() and optimizer.step()",
            _training_step("zero_grad", "backward", "step", "clip")),
    Mistake("no_clip",
            "your step does not clip the gradients: call torch.nn.utils.clip_grad_norm_("
            "model.parameters(), max_grad_norm) before optimizer.step()",
            _training_step("zero_grad", "backward", "step")),
    Mistake("zero_grad_before_step",
            "you call optimizer.zero_grad() between backward and step: the step then sees no "
            "gradients. Clear them at the START of the step",
            _training_step("backward", "clip", "zero_grad", "step")),
    Mistake("no_step",
            "your step never changes the weights: call optimizer.step() after clipping",
            _training_step("zero_grad", "backward", "clip")),
]


def _run_steps(step_fn, exercise=None, steps=2, max_grad_norm=0.05):
    """Two SGD steps from the same start; -> (losses, parameters after)."""
    model = _tiny_model(seed=3).train()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.5)
    gen = torch.Generator().manual_seed(4)
    losses = []
    for _ in range(steps):
        x = torch.randint(0, model.config.vocab_size, (2, 6), generator=gen)
        y = torch.randint(0, model.config.vocab_size, (2, 6), generator=gen)
        if exercise is None:
            losses.append(step_fn(model, optimizer, x, y, max_grad_norm))
        else:
            losses.append(call_learner(exercise, step_fn, model, optimizer, x, y, max_grad_norm))
    grads = [p.grad for p in model.parameters() if p.grad is not None]
    # after the step, .grad still holds the last gradients: clipped or not tells clipping
    # after the step apart from no clipping (both update the weights with unclipped gradients)
    clipped = bool(grads) and float(torch.linalg.vector_norm(
        torch.stack([torch.linalg.vector_norm(g) for g in grads]))) <= max_grad_norm * (1 + 1e-4)
    return losses, [p.detach().clone() for p in model.parameters()], clipped


def _same_params(a, b):
    return len(a) == len(b) and all(torch.allclose(p, q, atol=1e-6, rtol=1e-5) for p, q in zip(a, b))


def check_training_step(fn):
    losses, params, clipped = _run_steps(fn, EX_STEP)
    want_losses, want, _ = _run_steps(_step_right)
    for loss in losses:
        if isinstance(loss, torch.Tensor):
            if loss.numel() != 1:
                raise CheckFailed(EX_STEP, "return the loss as one number (loss.item())")
            loss = float(loss)
        if not isinstance(loss, (int, float)) or isinstance(loss, bool):
            raise CheckFailed(EX_STEP, f"return the loss as a float (loss.item()), got {type(loss).__name__}")
        if not math.isfinite(loss):
            raise CheckFailed(EX_STEP, f"your step returned a loss of {loss}")
    if _same_params(params, want):
        if not math.isclose(float(losses[0]), want_losses[0], rel_tol=1e-5):
            raise CheckFailed(EX_STEP, f"the weights are right but the returned loss is "
                                       f"{float(losses[0]):.4f}, not {want_losses[0]:.4f}: return "
                                       "the loss of this step's batch, computed before the update")
        return passed(EX_STEP, "zero_grad, forward, backward, clip, step, in that order")
    def matches(m):
        _, wrong_params, wrong_clipped = _run_steps(m.fn)
        return _same_params(params, wrong_params) and clipped == wrong_clipped

    mistake = first_mistake(STEP_MISTAKES, matches)
    if mistake is not None:
        raise CheckFailed(EX_STEP, mistake.message)
    raise CheckFailed(EX_STEP, "after two steps your weights differ from the expected ones: "
                               "zero_grad, forward with F.cross_entropy, backward, clip_grad_norm_"
                               " with max_grad_norm, optimizer.step()")


# --------------------------------------------------------------------------- Exercise 7.6


def _lr_right(step, max_lr, warmup_steps, total_steps, min_lr):
    if step < warmup_steps:
        return max_lr * (step + 1) / warmup_steps
    if step >= total_steps:
        return min_lr
    progress = (step - warmup_steps) / (total_steps - warmup_steps)
    return min_lr + (max_lr - min_lr) * 0.5 * (1 + math.cos(math.pi * progress))


def _lr_warmup_from_zero(step, max_lr, warmup_steps, total_steps, min_lr):
    if step < warmup_steps:
        return max_lr * step / warmup_steps
    return _lr_right(step, max_lr, warmup_steps, total_steps, min_lr)


def _lr_cosine_to_zero(step, max_lr, warmup_steps, total_steps, min_lr):
    return _lr_right(step, max_lr, warmup_steps, total_steps, 0.0)


def _lr_no_floor_after_end(step, max_lr, warmup_steps, total_steps, min_lr):
    if step < warmup_steps:
        return max_lr * (step + 1) / warmup_steps
    progress = (step - warmup_steps) / (total_steps - warmup_steps)
    return min_lr + (max_lr - min_lr) * 0.5 * (1 + math.cos(math.pi * progress))


def _lr_no_warmup(step, max_lr, warmup_steps, total_steps, min_lr):
    return _lr_right(step, max_lr, 0, total_steps, min_lr)


def _lr_progress_from_zero(step, max_lr, warmup_steps, total_steps, min_lr):
    if step < warmup_steps:
        return max_lr * (step + 1) / warmup_steps
    if step >= total_steps:
        return min_lr
    progress = step / total_steps
    return min_lr + (max_lr - min_lr) * 0.5 * (1 + math.cos(math.pi * progress))


def _lr_linear(step, max_lr, warmup_steps, total_steps, min_lr):
    if step < warmup_steps:
        return max_lr * (step + 1) / warmup_steps
    if step >= total_steps:
        return min_lr
    progress = (step - warmup_steps) / (total_steps - warmup_steps)
    return max_lr - (max_lr - min_lr) * progress


LR_MISTAKES = [
    Mistake("warmup_off_by_one",
            "your warm-up is off by one: step 0 gets a rate of 0, so the first step does "
            "nothing. Use max_lr * (step + 1) / warmup_steps", _lr_warmup_from_zero),
    Mistake("cosine_to_zero",
            "your cosine ends at 0 instead of min_lr: the rate is min_lr + (max_lr - min_lr) * "
            "0.5 * (1 + cos(pi * progress))", _lr_cosine_to_zero),
    Mistake("no_floor_after_end",
            "after total_steps your rate climbs back up (the cosine goes on): return min_lr "
            "for every step >= total_steps", _lr_no_floor_after_end),
    Mistake("no_warmup",
            "there is no warm-up: for step < warmup_steps the rate rises linearly, "
            "max_lr * (step + 1) / warmup_steps", _lr_no_warmup),
    Mistake("progress_from_zero",
            "your cosine starts counting at step 0 instead of at the end of the warm-up: "
            "progress = (step - warmup_steps) / (total_steps - warmup_steps)",
            _lr_progress_from_zero),
    Mistake("linear_decay",
            "your rate falls in a straight line: after the warm-up it follows half a cosine, "
            "0.5 * (1 + cos(pi * progress))", _lr_linear),
]

_LR_CASES = [{"max_lr": 6e-4, "warmup_steps": 10, "total_steps": 50, "min_lr": 6e-5},
             {"max_lr": 1.0, "warmup_steps": 3, "total_steps": 12, "min_lr": 0.25}]


def _lr_curve(fn, case, exercise=None):
    out = []
    for step in range(case["total_steps"] + 6):
        if exercise is None:
            out.append(fn(step, **case))
        else:
            value = call_learner(exercise, fn, step, case["max_lr"], case["warmup_steps"],
                                 case["total_steps"], case["min_lr"])
            if isinstance(value, torch.Tensor) and value.numel() == 1:
                value = float(value)
            if isinstance(value, bool) or not isinstance(value, (int, float)):
                raise CheckFailed(exercise, f"return the rate as a float, got {type(value).__name__} "
                                            f"at step {step}")
            out.append(float(value))
    return out


def _same_curve(a, b):
    return len(a) == len(b) and all(math.isclose(p, q, rel_tol=1e-6, abs_tol=1e-12) for p, q in zip(a, b))


def check_cosine_lr(fn):
    for case in _LR_CASES:
        got = _lr_curve(fn, case, EX_LR)
        want = _lr_curve(_lr_right, case)
        if _same_curve(got, want):
            continue
        mistake = first_mistake(LR_MISTAKES,
                                lambda m, got=got, case=case: _same_curve(got, _lr_curve(m.fn, case)))
        if mistake is not None:
            raise CheckFailed(EX_LR, mistake.message)
        step = next(i for i, (g, w) in enumerate(zip(got, want)) if not math.isclose(g, w, rel_tol=1e-6, abs_tol=1e-12))
        raise CheckFailed(EX_LR, f"with {case}, step {step} should get {want[step]:.6g}, yours gives "
                                 f"{got[step]:.6g}")
    passed(EX_LR, "warm-up from the first step, cosine down to min_lr, then flat")


# --------------------------------------------------------------------------- Exercise 7.7


def _pick(logits, temperature, generator):
    if temperature == 0:
        return logits.argmax(dim=-1, keepdim=True)  # (B, 1)
    return torch.multinomial((logits / temperature).softmax(dim=-1), 1, generator=generator)


def _sampler(window, position=-1, scale=None, use_generator=True, greedy=False):
    """A sampling loop; the arguments plant one mistake each (the defaults are right)."""

    def run(model, idx, max_new_tokens, temperature=1.0, generator=None):
        context = model.config.n_positions
        with torch.no_grad():
            for _ in range(max_new_tokens):
                logits = model(window(idx, context))[:, position, :]  # (B, V)
                t = 0.0 if greedy else temperature
                if scale == "multiply" and t != 0:
                    next_id = torch.multinomial((logits * t).softmax(dim=-1), 1,
                                                generator=generator if use_generator else None)
                else:
                    next_id = _pick(logits, t, generator if use_generator else None)
                idx = torch.cat([idx, next_id], dim=1)
        return idx

    return run


def _last(idx, context):
    return idx[:, -context:]


_sample_right = _sampler(_last)

SAMPLE_MISTAKES = [
    Mistake("no_crop",
            "your loop feeds the whole sequence to the model even when it is longer than the "
            "model's context (n_positions): crop each input to the last n_positions tokens, "
            "idx[:, -model.config.n_positions:]",
            _sampler(lambda idx, context: idx)),
    Mistake("crop_front",
            "you crop to the FIRST n_positions tokens (idx[:, :n_positions]): the model then "
            "never sees the newest tokens. Keep the last ones: idx[:, -n_positions:]",
            _sampler(lambda idx, context: idx[:, :context])),
    Mistake("first_position",
            "you pick the next token from the logits of the FIRST position: the prediction "
            "for the next token is at the last position, logits[:, -1, :]",
            _sampler(_last, position=0)),
    Mistake("temperature_multiplied",
            "with temperature 0.00001 your samples are not the greedy ones: divide the logits by "
            "the temperature (logits / temperature), then softmax and torch.multinomial",
            _sampler(_last, scale="multiply")),
    Mistake("generator_ignored",
            "the same generator seed gave different samples: pass generator=generator to "
            "torch.multinomial",
            _sampler(_last, use_generator=False)),
    Mistake("always_greedy",
            "with temperature 3 your loop still picks the most likely token every time: for a "
            "temperature above 0, draw from the probabilities with torch.multinomial",
            _sampler(_last, greedy=True)),
]


def check_sample_tokens(fn):
    model = _tiny_model(seed=5, n_positions=8).eval()
    gen = torch.Generator().manual_seed(6)
    with torch.no_grad():  # larger weights: the greedy text then depends on the whole context
        for p in model.parameters():
            p.add_(0.3 * torch.randn(p.shape, generator=gen))
    prompt = torch.randint(0, model.config.vocab_size, (2, 6), generator=gen)  # (B, T)
    new = 7  # the sequence grows past the context of 8
    want = _sample_right(model, prompt, new, 0.0)

    def run(temperature, seed=None):
        generator = None if seed is None else torch.Generator().manual_seed(seed)
        try:
            out = call_learner(EX_SAMPLE, fn, model, prompt.clone(), new, temperature, generator)
        except (ValueError, AssertionError) as exc:  # the model asserts its context
            if "n_positions" in str(exc) or "context" in str(exc):
                raise CheckFailed(EX_SAMPLE, named(SAMPLE_MISTAKES, "no_crop").message) from None
            raise
        return expect_tensor(EX_SAMPLE, out, (2, 6 + new), what="your output (prompt + 7 new tokens)",
                             hints={(2, new): "return the prompt AND the new tokens: "
                                              "torch.cat([idx, next_id], dim=1) each step"})

    got = run(0.0)
    if not torch.equal(got[:, :6], prompt):
        raise CheckFailed(EX_SAMPLE, "the output should start with the prompt, unchanged")
    if not torch.equal(got, want):
        mistake = first_mistake(SAMPLE_MISTAKES[:3],
                                lambda m: torch.equal(got, m.fn(model, prompt, new, 0.0)))
        if mistake is not None:
            raise CheckFailed(EX_SAMPLE, mistake.message)
        if torch.equal(got[:, :8], want[:, :8]):
            raise CheckFailed(EX_SAMPLE, "your tokens are right until the sequence outgrows the "
                                         "context, then differ: crop to the LAST n_positions tokens")
        raise CheckFailed(EX_SAMPLE, "with temperature 0 each new token must be the argmax of the "
                                     "logits at the last position")
    # a tiny temperature sharpens the distribution to the argmax; `* temperature` flattens it
    if not torch.equal(run(1e-5, seed=0), want):
        raise CheckFailed(EX_SAMPLE, named(SAMPLE_MISTAKES, "temperature_multiplied").message)
    draws = [run(3.0, seed=s) for s in (0, 0, 1, 2)]  # hot: the draws spread out
    if not torch.equal(draws[0], draws[1]):
        raise CheckFailed(EX_SAMPLE, named(SAMPLE_MISTAKES, "generator_ignored").message)
    if all(torch.equal(d, want) for d in draws):
        raise CheckFailed(EX_SAMPLE, named(SAMPLE_MISTAKES, "always_greedy").message)
    passed(EX_SAMPLE, "greedy and temperature sampling, cropped to the context")


# Each check with the planted mistakes it names (the tests run every one through its check).
MISTAKES_BY_CHECK = {
    check_inputs_and_targets: TARGET_MISTAKES,
    check_cross_entropy: LOSS_MISTAKES,
    check_random_batch: BATCH_MISTAKES,
    check_decay_groups: DECAY_MISTAKES,
    check_training_step: STEP_MISTAKES,
    check_cosine_lr: LR_MISTAKES,
    check_sample_tokens: SAMPLE_MISTAKES,
}
