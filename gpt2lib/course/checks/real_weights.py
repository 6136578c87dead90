"""Checks for chapter 8's exercises: reading safetensors, mapping a checkpoint onto the model, the
recording hooks, the logit lens, head scores, the copies' losses, ablations and the challenge."""

from __future__ import annotations

import functools
import json
import math
import mmap
import tempfile
import types
import warnings
from pathlib import Path

import torch
import torch.nn.functional as F
from safetensors.torch import load_file, save_file

from gpt2lib import inspection
from gpt2lib.chapters import interpret
from gpt2lib.chapters.attention import attention_weights
from gpt2lib.chapters.model import GPT2
from gpt2lib.course.checks import _core as core
from gpt2lib.validation import SAFETENSORS_DTYPES

EX_READ = "Exercise 8.0 (iter_safetensors)"
EX_MAPPING = "Exercise 8.1 (checkpoint_to_model, load_weights)"
EX_RECORD = "Exercise 8.2 (run_with_cache's hooks)"
EX_LENS = "Exercise 8.3 (logit_lens)"
EX_NEXT = "Exercise 8.3 (next_token_logprobs)"
EX_PREVIOUS = "Exercise 8.4 (previous_token_score)"
EX_INDUCTION = "Exercise 8.5 (induction_score, repeated_tokens, induction_scores)"
EX_COPY = "Exercise 8.6 (copy_losses)"
EX_ZERO = "Exercise 8.7 (zero_heads)"
EX_EFFECTS = "Exercise 8.8 (mean_head_outputs, ablation_effects)"
CH_HEAD = "Challenge (the head the copying needs most)"

# the checks' GPT-2: 2 layers of 3 heads, width 12, 23 token ids, 16 positions
_tiny = functools.partial(core.tiny_gpt2, n_layer=2, n_head=3, n_embd=12, vocab_size=23)


def _call(exercise, fn, *args, changed, watch=None):
    """The learner's fn(*args); CheckFailed(changed) if it wrote to a tensor of `watch` (its
    tensor arguments by default). `changed` may be a function that gives the message."""
    watch = [a for a in args if isinstance(a, torch.Tensor)] if watch is None else watch
    given = [t.clone() for t in watch]
    got = core.call_learner(exercise, fn, *args)
    if not all(torch.equal(t, g) for t, g in zip(watch, given)):
        raise core.CheckFailed(exercise, changed() if callable(changed) else changed)
    return got


def _rounded(t):
    return [round(v, 4) for v in t.tolist()]


# --------------------------------------------------------------------------- 8.0 reading the file


def _read(path, keep=None, *, mistake=""):
    """A safetensors reader, yielding (name, tensor); `mistake` plants one of READ_MISTAKES by
    its name."""
    mapped = mistake == "memory map"
    with open(path, "rb") as f:
        header_len = int.from_bytes(f.read(8), "little")
        header = json.loads(f.read(header_len))
        header.pop("__metadata__", None)
        whole = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) if mapped else None
        for name, info in header.items():
            if mistake != "keep ignored" and keep is not None and not keep(name):
                continue
            begin, end = info["data_offsets"]
            start = begin if mistake == "offsets from the file's start" else 8 + header_len + begin
            if mapped:  # a view of the mapped file: no copy (torch warns that it is read-only)
                with warnings.catch_warnings():
                    warnings.simplefilter("ignore", UserWarning)
                    raw = torch.frombuffer(
                        whole, dtype=torch.uint8, count=end - begin, offset=start
                    )
            else:
                f.seek(start)
                raw = torch.frombuffer(bytearray(f.read(end - begin)), dtype=torch.uint8)
            tensor = raw.view(SAFETENSORS_DTYPES[info["dtype"]])
            yield name, tensor if mistake == "flat" else tensor.view(info["shape"])


READ_MISTAKES = core.variants(
    _read,
    {
        "offsets from the file's start": "the values are wrong although names, dtypes and shapes are right: data_offsets count from the end of the header, so a tensor starts at byte 8 + header length + its first offset",
        "keep ignored": "with keep=... you still yielded tensors that keep(name) refused; test each name before reading its bytes",
        "flat": "every tensor came back flat (1-D): view it with the shape from its header entry",
        "memory map": "your tensors changed when the file was rewritten after reading: they are views of the file (a memory map), not tensors of their own; copy the bytes into fresh memory (this is what lets a new download replace the file under a loaded model)",
    },
)


def _read_all(iter_safetensors, path, keep=None):
    """{name: tensor} from the learner's reader (a generator's stub raises only once read)."""
    tensors = core.call_learner(EX_READ, iter_safetensors, path, keep=keep)
    return core.call_learner(EX_READ, dict, tensors)


def check_iter_safetensors(iter_safetensors) -> None:
    """Exercise 8.0: `iter_safetensors(path, keep=None)` yields (name, tensor) of its own memory."""
    torch.manual_seed(0)
    tensors = {
        "h.0.attn.c_attn.weight": torch.randn(3, 4),
        "wte.weight": torch.randn(2, 5).half(),
        "count": torch.arange(6).view(2, 3),
        "ln.bias": torch.randn(4).bfloat16(),
    }
    need = functools.partial(core.require, EX_READ)
    with tempfile.TemporaryDirectory() as folder:
        path = Path(folder) / "model.safetensors"
        save_file(tensors, str(path), metadata={"format": "pt"})
        want = load_file(str(path))
        got = _read_all(iter_safetensors, path)
        need(
            "__metadata__" not in got,
            "you yielded the header's __metadata__ entry: it describes the file and holds no tensor; leave it out",
        )
        need(set(got) == set(want), f"names read: {sorted(got)}; the file holds {sorted(want)}")
        for name, tensor in got.items():
            need(
                isinstance(tensor, torch.Tensor),
                f"{name}: yield (name, tensor) pairs, not {type(tensor).__name__}",
            )
            need(
                tensor.dtype == want[name].dtype,
                f"{name} came back as {tensor.dtype}, the file stores {want[name].dtype}: take the dtype from its header entry",
            )
        for name, tensor in got.items():
            if tensor.shape != want[name].shape or not torch.equal(tensor, want[name]):
                core.fail_with(
                    EX_READ,
                    READ_MISTAKES,
                    lambda m: all(
                        torch.equal(got[n].view(-1), t.view(-1)) and got[n].shape == t.shape
                        for n, t in dict(m.fn(path)).items()
                    ),
                    f"{name}: the shape or values differ from the file's (shape {tuple(tensor.shape)}, expected {tuple(want[name].shape)})",
                )
        kept = _read_all(iter_safetensors, path, keep=lambda n: n.startswith("h."))
        need(
            set(kept) == {"h.0.attn.c_attn.weight"},
            core.named(READ_MISTAKES, "keep ignored").message
            + f" (with keep, you yielded {sorted(kept)})",
        )
        before = {n: t.clone() for n, t in got.items()}
        with open(path, "r+b") as f:  # same layout, every tensor's bytes set to zero
            size = path.stat().st_size
            f.seek(8 + int.from_bytes(path.read_bytes()[:8], "little"))
            f.write(bytes(size - f.tell()))
        need(
            all(torch.equal(got[n], before[n]) for n in got),
            core.named(READ_MISTAKES, "memory map").message,
        )
    core.passed(
        EX_READ, "four dtypes, the metadata left out, keep honoured, and tensors of their own"
    )


# --------------------------------------------------------------------------- 8.1 checkpoint -> model


def _checkpoint_file(model, prefixed):
    """What a GPT-2 checkpoint holds for `model`: the hub layout, or save_pretrained's."""
    n = model.config.n_positions
    tensors = {}
    for name, tensor in model.state_dict().items():
        tensors[name] = tensor.detach().clone()
        if name.endswith("attn.c_attn.weight"):  # OpenAI's checkpoints carry the masks too
            layer = name.split(".")[1]
            tensors[f"h.{layer}.attn.bias"] = torch.ones(n, n).tril().view(1, 1, n, n)
            tensors[f"h.{layer}.attn.masked_bias"] = torch.tensor(-1e4)
    if prefixed:
        tensors = {f"transformer.{k}": v for k, v in tensors.items()}
        tensors["lm_head.weight"] = model.wte.weight.detach().clone()
    return tensors


def _mapped(tensors, *, mistake=""):
    """The state dict our GPT2 loads from a checkpoint; `mistake` plants one of MAPPING_MISTAKES
    by its name."""
    out = {}
    for name, tensor in tensors.items():
        short = name.removeprefix("transformer.")
        if name == "lm_head.weight" and mistake != "kept_lm_head":
            continue
        if short.endswith((".attn.bias", ".attn.masked_bias")) and mistake != "kept_masks":
            continue
        if short.endswith(("c_attn.bias", "attn.c_proj.bias")) and mistake == "dropped_c_attn_bias":
            continue
        conv = short.endswith(("c_attn.weight", "c_proj.weight", "c_fc.weight"))
        transposed = mistake == "transposed" and conv and tensor.dim() == 2
        out[name if mistake == "kept_prefix" else short] = tensor.T if transposed else tensor
    return out


MAPPING_MISTAKES = core.variants(
    _mapped,
    {
        "kept_masks": "you kept h.N.attn.bias and h.N.attn.masked_bias: they are the causal masks (n_positions x n_positions of ones below the diagonal), which our attention builds on the fly; our model has no place for them, so leave them out",
        "kept_lm_head": "you kept lm_head.weight: GPT-2's readout is tied to wte (the same tensor), so our model has no separate lm_head; leave it out",
        "kept_prefix": "names written by save_pretrained start with `transformer.`; drop that prefix, our modules are named without it",
        "dropped_c_attn_bias": "you dropped h.N.attn.c_attn.bias (and c_proj.bias) too: a name that ends in 'attn.bias' is not always a mask. Only h.N.attn.bias itself (and masked_bias) is one",
        "transposed": "you transposed the Conv1D weights: the file stores them [in, out], and our Conv1D (chapter 3) keeps that layout, so they load as they are. (A shape test cannot tell: c_proj's weight is square)",
    },
)


def _same_state(a, b) -> bool:
    return (
        isinstance(a, dict)
        and set(a) == set(b)
        and all(
            isinstance(a[k], torch.Tensor) and a[k].shape == b[k].shape and torch.equal(a[k], b[k])
            for k in b
        )
    )


def check_checkpoint_to_model(checkpoint_to_model, load_weights=None) -> None:
    """Exercise 8.1: `checkpoint_to_model(tensors)` -> GPT2's state dict; `load_weights` -> GPT2."""
    model = _tiny()
    need = functools.partial(core.require, EX_MAPPING)
    for prefixed in (False, True):
        tensors = _checkpoint_file(model, prefixed)
        given = {k: v.clone() for k, v in tensors.items()}
        got = core.call_learner(EX_MAPPING, checkpoint_to_model, tensors)
        need(isinstance(got, dict), f"return a dict {{name: tensor}}, got {type(got).__name__}")
        need(
            _same_state(tensors, given),
            "your function changed the dict it was given; build a new dict instead",
        )
        want = _mapped(given)
        if not _same_state(got, want):
            missing, extra = sorted(set(want) - set(got)), sorted(set(got) - set(want))
            found = (f"missing {missing[:4]}; " if missing else "") + (
                f"names our model does not have {extra[:4]}; " if extra else ""
            )
            layout = "save_pretrained's layout" if prefixed else "the hub's layout"
            core.fail_with(
                EX_MAPPING,
                MAPPING_MISTAKES,
                lambda m: _same_state(got, m.fn(given)),
                f"on a checkpoint in {layout}: "
                + (found or "some tensors differ from the file's (keep each tensor as it is)"),
            )
    with torch.device("meta"):
        probe = type(model)(model.config)
    probe.load_state_dict(got, strict=True, assign=True)  # the mapping loads strictly
    if load_weights is not None:
        _check_load_weights(load_weights, model)
    core.passed(
        EX_MAPPING,
        "both layouts load into GPT2 with strict=True"
        + ("; load_weights gives the same model" if load_weights else ""),
    )


def _check_load_weights(load_weights, model):
    need = functools.partial(core.require, EX_MAPPING)
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "model.safetensors"
        tensors = _checkpoint_file(model, prefixed=True)
        save_file({k: v.contiguous() for k, v in tensors.items()}, str(path))
        idx = torch.tensor([[1, 5, 7, 2]])
        for dtype in (torch.float32, torch.float64):
            kwargs = dict(device="cpu", dtype=dtype, model_cls=GPT2)
            got = core.call_learner(EX_MAPPING, load_weights, path, model.config, **kwargs)
            need(
                isinstance(got, torch.nn.Module),
                f"load_weights must return the model, got {type(got).__name__}",
            )
            left = [n for n, t in [*got.named_parameters(), *got.named_buffers()] if t.is_meta]
            need(
                not left,
                f"after load_weights, {left[:3]} are still on the meta device: pass assign=True to load_state_dict, so the file's tensors become the parameters",
            )
            need(not got.training, "return the model in eval mode (model.eval()): dropout off")
            need(
                got.wte.weight.dtype == dtype,
                f"asked for dtype={dtype}, the weights are {got.wte.weight.dtype}: convert each tensor as it is read",
            )
            with torch.no_grad():
                need(
                    core.close(got(idx), model(idx).to(dtype), atol=1e-4),
                    "the loaded model computes other logits than the model the checkpoint was written from",
                )


# --------------------------------------------------------------------------- 8.2 recording hooks


def _record_right(model, idx):
    """resid, attn, head_out of a forward pass, computed here without hooks."""
    resid, attn, head_out = [], [], []
    with torch.no_grad():
        x = model.wte(idx) + model.wpe(torch.arange(idx.shape[1]))
        resid.append(x)
        for block in model.h:
            attn.append(attention_weights(block.attn, block.ln_1(x)))
            outs = []
            hook = block.attn.c_proj.register_forward_pre_hook(lambda m, a: outs.append(a[0]))
            try:
                x = block(x)
            finally:
                hook.remove()
            B, T, C = outs[0].shape
            head_out.append(outs[0].reshape(B, T, block.attn.n_head, -1).transpose(1, 2))
            resid.append(x)
    return resid, attn, head_out


RECORD_MISTAKES = [
    core.Mistake(
        "no_embeddings",
        "cache.resid has n_layer entries: the stream entering block 0 (token plus position embeddings) is missing; record it once, in the first block's pre-hook",
        lambda r, a, h: (r[1:], a, h),
    ),
    core.Mistake(
        "inputs_twice",
        "cache.resid holds each block's input *and* output, so every stream between two blocks is there twice: record the input only for the first block",
        lambda r, a, h: ([t for x in zip(r[:-1], r[1:]) for t in x], a, h),
    ),
    core.Mistake(
        "head_out_layout",
        "cache.head_out must be (B, n_head, T, head_dim): reshape c_proj's input (B, T, C) to (B, T, n_head, head_dim), then transpose(1, 2)",
        None,
    ),
]


def _same_list(got, want) -> bool:
    return len(got) == len(want) and all(core.close(x, y, atol=1e-5) for x, y in zip(got, want))


def _hooks_left(model):
    return [name for name, m in model.named_modules() if m._forward_pre_hooks or m._forward_hooks]


def check_run_with_cache(run_with_cache) -> None:
    """Exercise 8.2: `run_with_cache(model, idx, capture)` -> (logits, cache), hooks recorded."""
    model = _tiny(2, n_layer=3)
    need = functools.partial(core.require, EX_RECORD)
    for B, T in [(2, 5), (1, 7)]:
        gen = torch.Generator().manual_seed(T)
        idx = torch.randint(0, model.config.vocab_size, (B, T), generator=gen)
        want_r, want_a, want_h = _record_right(model, idx)
        with torch.enable_grad():  # recorded tensors must be cut off from autograd
            logits, cache = core.call_learner(
                EX_RECORD, run_with_cache, model, idx, capture=("resid", "attn", "head_out")
            )
        need(not _hooks_left(model), "hooks are left on the model after run_with_cache")
        r, a, h = list(cache.resid), list(cache.attn), list(cache.head_out)
        need(
            not any(t.requires_grad for t in r + a + h),
            "the recorded tensors still carry autograd history: record t.detach()",
        )
        if not _same_list(r, want_r):
            core.fail_with(
                EX_RECORD,
                RECORD_MISTAKES[:2],
                lambda m: _same_list(r, m.fn(want_r, want_a, want_h)[0]),
                f"cache.resid should be n_layer + 1 = {len(want_r)} streams (B, T, C): the embeddings, then the stream after each block; got {len(r)} tensors",
            )
        need(
            _same_list(a, want_a),
            f"cache.attn should hold n_layer = {len(want_a)} patterns (B, n_head, T, T), one per block: the tensor that passes the block's attn.hook_pattern, recorded once per forward pass",
        )
        need(_same_list(h, want_h), core.named(RECORD_MISTAKES, "head_out_layout").message)
        _, only = core.call_learner(EX_RECORD, run_with_cache, model, idx, capture="resid")
        need(
            not (only.attn or only.head_out),
            "with capture='resid' only the stream is asked for: record attn and head_out only when they are in `wanted`",
        )
    core.passed(
        EX_RECORD, "the stream, the patterns and the heads' outputs, detached, hooks removed"
    )


# --------------------------------------------------------------------------- 8.3 the logit lens


def _lens_model(seed=0):
    """A tiny random GPT-2 of 3 layers whose ln_f has a gain and a shift far from 1 and 0."""
    model = _tiny(seed, n_layer=3)
    with torch.no_grad():
        model.ln_f.weight.copy_(1.0 + 0.5 * torch.randn(12))
        model.ln_f.bias.copy_(0.5 * torch.randn(12))
    return model


def _lens(model, resid, *, mistake=""):
    """Every stream's logits, model.ln_f(stream) @ model.wte.weight.T; `mistake` plants one of
    LENS_MISTAKES by its name."""
    x = torch.stack(resid)
    if mistake == "plain_norm":
        x = F.layer_norm(x, (resid[0].shape[-1],), eps=model.ln_f.eps)
    elif mistake != "no_ln_f":
        x = model.ln_f(model.ln_f(x) if mistake == "ln_f_twice" else x)
    logits = x @ model.wte.weight.T
    if mistake == "probabilities":
        return logits.softmax(-1)
    return logits.log_softmax(-1) if mistake == "log_probabilities" else logits


LENS_MISTAKES = core.variants(
    _lens,
    {
        "no_ln_f": "the final LayerNorm is missing: apply model.ln_f to each stream before the readout, as the model does before its logits",
        "plain_norm": "you normalise without ln_f's learned gain and shift; call model.ln_f(...) itself rather than F.layer_norm without its weight and bias",
        "ln_f_twice": "ln_f is applied twice; once, right before the readout, is enough",
        "probabilities": "you return probabilities (softmax); return the logits, as the model does",
        "log_probabilities": "you return log-probabilities (log_softmax); return the logits, as the model does",
    },
)


def check_logit_lens(logit_lens) -> None:
    """Exercise 8.3: `logit_lens(model, cache)` -> (n_layer + 1, B, T, V) logits."""
    model = _lens_model()
    C, V, L = model.config.n_embd, model.config.vocab_size, model.config.n_layer
    B, T = 2, 5
    # wrong answers' shapes, for their hints
    one_layer, one_short, streams = (B, T, V), (L, B, T, V), (L + 1, B, T, C)
    gen = torch.Generator().manual_seed(1)
    # streams of growing size, as in a real model; the last one is what the model reads out
    resid = [torch.randn(B, T, C, generator=gen) * (1 + i) for i in range(L + 1)]
    with torch.no_grad():
        got = _call(
            EX_LENS,
            logit_lens,
            model,
            types.SimpleNamespace(resid=resid),  # the check's cache: only `resid` is read
            watch=resid,
            changed="your function changed cache.resid; read it without writing to it",
        )
        want = _lens(model, resid)
    core.require(
        EX_LENS,
        not (isinstance(got, tuple) and len(got) == 2),
        "you return top-k values and indices; return the full logits (n_layer + 1, B, T, V)",
    )
    core.judge(
        EX_LENS,
        got,
        want,
        LENS_MISTAKES,
        lambda m: m.fn(model, resid),
        "the logits differ from model.ln_f(stream) @ model.wte.weight.T for each stream in cache.resid",
        what="the lens logits",
        atol=1e-4,
        hints={
            one_layer: "that is one layer's logits: stack all n_layer + 1 entries of cache.resid (torch.stack) and read out each",
            one_short: "one entry is missing: cache.resid has n_layer + 1 entries (the embeddings and the stream after each block); use them all",
            streams: "these are still streams of width C: multiply by model.wte.weight.T to get one logit per vocabulary entry",
            (B, T, L + 1, V): "stack along a new first dimension: (n_layer + 1, B, T, V)",
        },
    )
    core.passed(EX_LENS, "the last layer's lens equals the model's logits")


def _next(lens, idx, *, mistake=""):
    """At every layer, the log-probability of the token that comes next: (n_layer + 1, B, T - 1);
    `mistake` plants one of NEXT_MISTAKES by its name."""
    late = mistake == "backwards"  # position t + 1's logits
    x = (lens[:, :, 1:] if late else lens[:, :, :-1]).double()
    values = {
        "raw logits": x,
        "probabilities": x.softmax(-1),
        "softmax over positions": x.log_softmax(-2),
    }.get(mistake, x.log_softmax(-1))
    # position t's logits predict token t + 1; the mistake "unshifted" scores them against token t
    tokens = idx[:, :-1] if late or mistake == "unshifted" else idx[:, 1:]
    return values.gather(-1, tokens[None, :, :, None].expand(lens.shape[0], -1, -1, 1))[..., 0]


NEXT_MISTAKES = core.variants(
    _next,
    {
        "unshifted": "you scored each position's logits against its own token; the logits at position t predict the token at t + 1 (and the last position has nothing to predict)",
        "backwards": "you scored position t + 1's logits against token t: the shift runs the other way, the logits at t predict the token at t + 1",
        "raw logits": "these are raw logits, not log-probabilities: apply log_softmax over the vocabulary first",
        "probabilities": "these are probabilities; the exercise asks for log-probabilities (log_softmax, not softmax)",
        "softmax over positions": "your log_softmax runs over the wrong dimension: normalise over the vocabulary (the last one), not over the positions",
    },
)


def check_next_token_logprobs(next_token_logprobs) -> None:
    """Exercise 8.3: `next_token_logprobs(lens (L + 1, B, T, V), idx (B, T))` -> (L + 1, B, T-1)."""
    gen = torch.Generator().manual_seed(3)
    for layers, B, T, V in [(3, 1, 6, 11), (5, 2, 4, 7), (2, 3, 2, 5)]:  # T = 2: one prediction
        lens = torch.randn(layers, B, T, V, generator=gen) * 3
        idx = torch.randint(0, V, (B, T), generator=gen)
        # wrong answers' shapes, for their hints
        per_position, every_token = (layers, B, T), (layers, B, T - 1, V)
        distribution = (layers, B, T, V)
        got = _call(
            EX_NEXT,
            next_token_logprobs,
            lens,
            idx,
            watch=[lens],
            changed="your function changed the lens logits in place; read them without writing to them",
        )
        got = core.judge(
            EX_NEXT,
            got,
            _next(lens, idx),
            NEXT_MISTAKES,
            lambda m: m.fn(lens, idx),
            f"with {layers} layers, batch {B}, {T} tokens, your values differ from the log-probability, under each layer's lens, of the token that comes next",
            what="the log-probabilities",
            atol=1e-4,
            hints={
                per_position: "one value a position, T of them: the last position predicts no token of the text, so there are T - 1",
                every_token: "that is every token's log-probability: keep only the one of the token that really comes next (gather)",
                distribution: "that is the whole distribution at every position: keep only the log-probability of the token that comes next, at T - 1 positions",
            },
        )
    core.require(
        EX_NEXT,
        bool((got <= 1e-6).all()),
        "a log-probability above 0: apply log_softmax over the vocabulary",
    )
    core.passed(
        EX_NEXT, "each layer's log-probability of the next token, for several batches and lengths"
    )


# --------------------------------------------------------------------------- 8.4, 8.5 head scores


def _diagonal(pattern, offset=-1):
    """pattern[..., q, q + offset] for every query q that has that key: (B, n_head, queries)."""
    return pattern.diagonal(offset=offset, dim1=-2, dim2=-1)


def _averaged(scores, mistake):
    """Per-token scores (B, n_head, queries) averaged over the batch and the queries, one per
    head; the mistakes "sum" and "first_example" add them up, or keep the first sequence only."""
    if mistake == "sum":
        return scores.sum(dim=(0, -1))
    return scores[0].mean(dim=-1) if mistake == "first_example" else scores.mean(dim=(0, -1))


def _previous(p, *, mistake=""):
    """Each head's mean attention to the previous token, pattern[..., q, q - 1]; `mistake`
    plants one of PREVIOUS_MISTAKES by its name."""
    diagonal = _diagonal(p, {"itself": 0, "two_back": -2, "transposed": 1}.get(mistake, -1))
    if mistake == "counts_position_0":
        return diagonal.sum(-1).mean(0) / p.shape[-1]
    return _averaged(diagonal, mistake)


def _induction(p, L, *, mistake=""):
    """For query q in the second copy (L + 1 .. 2L), the attention to key q - L + 1, averaged;
    `mistake` plants one of INDUCTION_MISTAKES by its name."""
    p = p.transpose(-1, -2) if mistake == "transposed" else p
    offset = {"same_token": L, "two_after": L - 2, "previous_token": 1}.get(mistake, L - 1)
    if mistake == "whole_stripe":  # every query, the first copy's too
        return _diagonal(p, -offset).mean(dim=(0, -1))
    q = torch.arange(L + 1, 2 * L + 1)
    return _averaged(p[:, :, q, q - offset], mistake)  # (B, nh, L) averaged


def _patterns(B=3, nh=4, L=5, seed=0):
    """Causal attention probabilities with a boost on the induction and previous-token keys."""
    T = 2 * L + 1
    gen = torch.Generator().manual_seed(seed)
    scores = torch.randn(B, nh, T, T, generator=gen, dtype=torch.float64)
    q = torch.arange(L + 1, T)
    scores[:, 0, q, q - L + 1] += 4.0  # head 0: an induction head
    scores[:, 1, torch.arange(1, T), torch.arange(0, T - 1)] += 4.0  # head 1: previous token
    scores[:, 2, q, q - L] += 4.0  # head 2: duplicate-token head
    future = torch.ones(T, T, dtype=torch.bool).triu(diagonal=1)
    return scores.masked_fill(future, float("-inf")).softmax(dim=-1)


def _judge_scores(exercise, score_fn, right, mistakes, B, nh, L, seed) -> None:
    """A head score's check on one test pattern: `score_fn(pattern)` -> (n_head,) as `right`
    computes it, the planted `mistakes` named; with `_induction`, both take seq_len too."""
    pattern = _patterns(B, nh, L, seed)
    args, queries, case = (pattern,), pattern.shape[-1] - 1, ""
    if right is _induction:
        args, queries, case = (pattern, L), L, f"for seq_len={L} "
    want = right(*args)
    got = _call(
        exercise,
        score_fn,
        *args,
        changed="your function changed the pattern it was given; read it without writing to it",
    )
    one = "one score per head"  # expect_tensor's hints: scores that kept or lost dimensions
    hints = {
        (): f"you return one number: keep {one} (average over dims 0 and the queries, not over the heads)",
        (B, nh): f"average over the batch too: {one}",
        (nh, queries): f"average over the queries too: {one}",
        (B, nh, queries): f"average over the batch and the queries: {one}",
    }
    core.judge(
        exercise,
        got,
        want,
        mistakes,
        lambda m: m.fn(*args),
        lambda got: f"{case}the scores should be {_rounded(want)}, got {_rounded(got)}",
        what="the scores",
        hints=hints,
        atol=1e-6,
    )


PREVIOUS_MISTAKES = core.variants(
    _previous,
    {
        "itself": "you score the attention of each token to *itself* (the main diagonal); the previous token is key q - 1, one below it",
        "two_back": "off by one: key q - 2 is two tokens back; the previous token is key q - 1",
        "transposed": "rows are queries and columns keys: the previous token of query q is pattern[..., q, q - 1], below the diagonal (you read above it, where the causal mask leaves zeros)",
        "counts_position_0": "you average over all T queries, counting position 0 (which has no previous token) as a zero; average over the T - 1 queries that have one",
        "sum": "you add the attention up instead of averaging it: a perfect previous-token head should score 1",
        "first_example": "you use only the first sequence of the batch; average over the batch too",
    },
)


def check_previous_token_score(previous_token_score) -> None:
    """Exercise 8.4: `previous_token_score(pattern (B, n_head, T, T))` -> (n_head,) scores."""
    for B, nh, L, seed in [(3, 4, 5, 0), (2, 3, 6, 1)]:
        _judge_scores(
            EX_PREVIOUS, previous_token_score, _previous, PREVIOUS_MISTAKES, B, nh, L, seed
        )
    core.passed(EX_PREVIOUS, "head 1 of the test pattern (a previous-token head) scores highest")


INDUCTION_MISTAKES = core.variants(
    _induction,
    {
        "same_token": "you score the attention to the earlier copy of the *same* token (key q - seq_len). An induction head attends to the token *after* it: key q - seq_len + 1",
        "two_after": "off by one the other way: key q - seq_len + 2 is two tokens after the earlier copy; the induction key is q - seq_len + 1",
        "previous_token": "this is the attention to the previous token (key q - 1), the previous-token score; the induction key is q - seq_len + 1",
        "whole_stripe": "you average the whole stripe key = q - seq_len + 1, including queries of the first copy (where there is nothing to repeat yet); average over the seq_len queries of the second copy only (q = seq_len + 1 .. 2 * seq_len)",
        "transposed": "rows are queries and columns keys: pattern[..., q, k]. You read pattern[..., k, q], which the causal mask makes 0 above the diagonal",
        "sum": "you add the attention up instead of averaging it: a perfect induction head should score 1, so take the mean over the batch and the queries",
        "first_example": "you use only the first sequence of the batch; average over the batch dimension too",
    },
)


def check_induction_score(induction_score, repeated_tokens=None, induction_scores=None) -> None:
    """Exercise 8.5: `induction_score(pattern, seq_len)` -> (n_head,); `repeated_tokens` ->
    (batch, 2 * seq_len + 1) ids and `induction_scores(model)` -> (n_layer, n_head), if given."""
    for B, nh, L, seed in [(3, 4, 5, 0), (2, 3, 7, 1)]:
        _judge_scores(EX_INDUCTION, induction_score, _induction, INDUCTION_MISTAKES, B, nh, L, seed)
    if repeated_tokens is not None:
        _check_repeated_tokens(repeated_tokens)
    if induction_scores is not None:
        _check_induction_scores(induction_scores, repeated_tokens)
    core.passed(
        EX_INDUCTION,
        "head 0 of the test pattern (an induction head) scores highest"
        + ("; the repeated input and the model's scores are right" if induction_scores else ""),
    )


def _check_repeated_tokens(repeated_tokens):
    need = functools.partial(core.require, EX_INDUCTION)
    for batch, L, V, seed, bos, pool in [
        (3, 5, 50, 0, None, None),
        (2, 7, 40, 1, 7, torch.tensor([3, 11, 30])),
    ]:
        got = core.call_learner(EX_INDUCTION, repeated_tokens, batch, L, V, seed, bos, pool)
        got = core.expect_tensor(
            EX_INDUCTION,
            got,
            (batch, 2 * L + 1),
            what="repeated_tokens' ids",
            hints={
                (batch, 2 * L): "the start token is missing: 2 * seq_len + 1 ids per row",
                (batch, L + 1): "the second copy is missing: the L ids come twice",
            },
        )
        need(
            not got.dtype.is_floating_point, "repeated_tokens must return integer ids (torch.long)"
        )
        want_bos = V - 1 if bos is None else bos
        need(
            bool((got[:, 0] == want_bos).all()),
            f"every row must start with bos_token_id ({want_bos}; by default vocab_size - 1, <|endoftext|> in GPT-2)",
        )
        need(
            torch.equal(got[:, 1 : L + 1], got[:, L + 1 :]),
            "the second half must repeat the first: ids 1 .. L and L + 1 .. 2L are the same",
        )
        need(
            bool(torch.isin(got[:, 1:], torch.arange(V) if pool is None else pool).all()),
            "draw the ids from `tokens` when it is given (else from 0 .. vocab_size - 1)",
        )
        again = core.call_learner(EX_INDUCTION, repeated_tokens, batch, L, V, seed, bos, pool)
        need(
            torch.equal(torch.as_tensor(again), torch.as_tensor(got).long()),
            "two calls with the same seed give different ids: draw with the generator seeded from `seed`",
        )
        other = core.call_learner(EX_INDUCTION, repeated_tokens, batch, L, V, seed + 1, bos, pool)
        need(
            pool is not None
            or not torch.equal(torch.as_tensor(other), torch.as_tensor(got).long()),
            "another seed gives the same ids: use `seed`",
        )
        need(
            pool is not None or len(set(got[0, 1 : L + 1].tolist())) >= 2,
            "the ids of a row should be random, not one id repeated",
        )


def _check_induction_scores(induction_scores, repeated_tokens):
    make = repeated_tokens or interpret.repeated_tokens
    model = _tiny(3, n_positions=32)
    need = functools.partial(core.require, EX_INDUCTION)
    for L, batch in [(5, 2), (7, 3)]:
        idx = make(batch, L, model.config.vocab_size, 0)
        _, cache = inspection.run_with_cache(model, torch.as_tensor(idx).long(), capture="attn")
        want = torch.stack([_induction(p, L) for p in cache.attn])
        want_prev = torch.stack([interpret.previous_token_score(p) for p in cache.attn])
        got = core.call_learner(EX_INDUCTION, induction_scores, model, seq_len=L, batch=batch)
        got = core.expect_tensor(
            EX_INDUCTION,
            got,
            tuple(want.shape),
            what="induction_scores' result",
            hints={tuple(want.shape[1:]): "one row per layer: stack the scores of every layer"},
        )
        need(
            core.close(got, want, atol=1e-5),
            "induction_scores(model) differs from your induction_score applied to each layer's attention on repeated_tokens(batch, seq_len, vocab_size, seed): score cache.attn of run_with_cache, one layer a row",
        )
        both = core.call_learner(
            EX_INDUCTION, induction_scores, model, seq_len=L, batch=batch, previous=True
        )
        need(
            isinstance(both, tuple)
            and len(both) == 2
            and core.close(both[1], want_prev, atol=1e-5),
            "with previous=True return (induction scores, previous-token scores), each (n_layer, n_head)",
        )


# --------------------------------------------------------------------------- 8.6 the two copies' losses


def _per_token(logits, idx, shifted=True):
    """The loss of each prediction of idx[:, 1:], (B, 2L); unshifted: a mistake."""
    logits = logits[:, :-1] if shifted else logits[:, 1:]
    return F.cross_entropy(logits.transpose(1, 2), idx[:, 1:], reduction="none")


def _copies(logits, idx, L, *, mistake=""):
    """(the first copy's loss, the second's) over the predictions of tokens 2 .. L of each copy;
    `mistake` plants one of COPY_MISTAKES by its name."""
    per = _per_token(logits, idx, shifted=mistake != "no_shift")
    first, late = int(mistake != "first_tokens_counted"), int(mistake == "split_late")
    losses = per[:, first:L].mean().item(), per[:, L + first + late :].mean().item()
    if mistake == "bits":
        return tuple(v / math.log(2) for v in losses)
    return losses[::-1] if mistake == "swapped" else losses


COPY_MISTAKES = core.variants(
    _copies,
    {
        "first_tokens_counted": "you count the first token of each copy too; it follows <|endoftext|> or the end of the first copy, and nothing can predict it: count the predictions of tokens 2 .. L of each copy",
        "no_shift": "the logits at position t predict the token at t + 1: compare logits[:, :-1] with idx[:, 1:], not the same positions",
        "swapped": "you return (second, first); return the first copy's loss first",
        "split_late": "the second copy starts one prediction late: after the start token and the L tokens of the first copy, per-token losses 0 .. L - 1 predict the first copy and L .. 2L - 1 the second (so tokens 2 .. L are 1 .. L - 1 and L + 1 .. 2L - 1)",
        "bits": "you measure in bits (log base 2); the loss of the course is in nats (natural log, as F.cross_entropy gives)",
    },
)


def check_copy_losses(copy_losses) -> None:
    """Exercise 8.6: `copy_losses(logits (B, 2L + 1, V), idx, seq_len)` -> (first loss, second)."""

    def same(a, b):
        return all(math.isclose(x, y, abs_tol=1e-4) for x, y in zip(a, b))

    for B, L, V, seed in [(3, 5, 13, 0), (2, 7, 17, 1)]:
        idx = interpret.repeated_tokens(B, L, V, seed=seed)
        gen = torch.Generator().manual_seed(seed)
        logits = torch.randn(B, 2 * L + 1, V, generator=gen) * 3
        got = core.call_learner(EX_COPY, copy_losses, logits.clone(), idx.clone(), L)
        core.require(
            EX_COPY,
            isinstance(got, (tuple, list)) and len(got) == 2,
            "return two numbers, (first copy's loss, second copy's loss)",
        )
        try:
            got = tuple(float(v) for v in got)
        except (TypeError, ValueError, RuntimeError):
            raise core.CheckFailed(
                EX_COPY, "each of the two values must be one number (use .item())"
            ) from None
        want = _copies(logits, idx, L)
        if not same(got, want):
            core.fail_with(
                EX_COPY,
                COPY_MISTAKES,
                lambda m: same(got, m.fn(logits, idx, L)),
                f"for seq_len={L} the losses should be ({want[0]:.4f}, {want[1]:.4f}), got ({got[0]:.4f}, {got[1]:.4f})",
            )
    core.passed(EX_COPY, "both copies measured on the predictions of their tokens 2 .. L")


# --------------------------------------------------------------------------- 8.7 zero heads


def _zero(y, heads, n_head, *, mistake=""):
    """y with each listed head's channels h * head_dim .. (h + 1) * head_dim - 1 zeroed; `mistake`
    plants one of ZERO_MISTAKES by its name."""
    if mistake == "positions":
        return y.index_fill(1, torch.tensor(heads), 0)
    if mistake == "kept_instead":
        heads = [h for h in range(n_head) if h not in heads]
    out, width = y.clone(), n_head if mistake == "n_head_width" else y.shape[-1] // n_head
    for h in list(heads)[:1] if mistake == "first_only" else heads:
        if mistake == "head_fastest":  # y viewed as (B, T, head_dim, n_head)
            out[..., h::n_head] = 0
        else:
            out[..., h * width : (h + 1) * width] = 0
    return out


ZERO_MISTAKES = core.variants(
    _zero,
    {
        "kept_instead": "you zero every head except the listed ones; zero the listed heads and keep the others",
        "n_head_width": "you zero n_head channels per head; each head owns head_dim = C // n_head channels: h * head_dim to (h + 1) * head_dim",
        "head_fastest": "the channels of head h are one block, h * head_dim .. (h + 1) * head_dim - 1: view y as (B, T, n_head, head_dim), not (B, T, head_dim, n_head)",
        "positions": "you zero time positions (dimension 1); a head is a group of channels in the last dimension",
        "first_only": "only the first listed head is zeroed; zero all of them",
    },
)


def check_zero_heads(zero_heads) -> None:
    """Exercise 8.7: `zero_heads(y (B, T, C), heads, n_head)` -> (B, T, C), those heads zeroed."""
    gen = torch.Generator().manual_seed(0)
    # n_head=3, C=12: head_dim=4, so an n_head-wide or head-fastest slice differs from the right one
    for B, T, C, n_head, heads in [(2, 4, 12, 3, [1]), (2, 3, 12, 3, [0, 2]), (1, 5, 8, 4, [3, 1])]:
        y = torch.randn(B, T, C, generator=gen) + 0.5  # no zeros of its own
        want = _zero(y, heads, n_head)
        got = _call(
            EX_ZERO,
            zero_heads,
            y,
            list(heads),
            n_head,
            changed=lambda: (
                "you zeroed y in place; work on a copy (y.clone()) and return it, so that the caller's tensor is unchanged"
                if core.close(y, want, atol=0)
                else "your function changed y; work on a copy (y.clone())"
            ),
        )
        core.judge(
            EX_ZERO,
            got,
            want,
            ZERO_MISTAKES,
            lambda m: m.fn(y, heads, n_head),
            f"with n_head={n_head} and heads={heads}, channels h * {C // n_head} .. (h + 1) * {C // n_head} - 1 of each listed head must be 0 and every other value unchanged",
            what="the result",
            hints={(B, T, n_head, C // n_head): "reshape the result back to (B, T, C)"},
            atol=0,
        )
    core.passed(EX_ZERO, "the listed heads' channels are 0, the rest untouched, y unchanged")


# --------------------------------------------------------------------------- 8.8 ablation effects


def _effects(model, idx, L, head_means=None, *, mistake=""):
    """The second copy's loss rise with each head replaced (by 0, or by its mean), one at a time;
    `mistake` plants one of EFFECTS_MISTAKES by its name."""
    n_layer, n_head = model.config.n_layer, model.config.n_head
    hd = model.config.n_embd // n_head
    head_means = None if mistake == "means_ignored" else head_means
    sign = -1.0 if mistake == "sign" else 1.0

    def loss(logits):
        per = _per_token(logits, idx)
        return per.mean().item() if mistake == "whole_sequence" else per[:, L + 1 :].mean().item()

    with torch.no_grad():
        base = loss(model(idx))
        out = torch.zeros(n_layer, n_head)
        for layer in range(n_layer):
            for head in range(n_head):
                heads = range(n_head) if mistake == "whole_layer" else [head]

                def hook(module, args, layer=layer, heads=heads):
                    y = args[0].clone()
                    for h in heads:
                        y[..., h * hd : (h + 1) * hd] = (
                            0.0 if head_means is None else head_means[layer][h]
                        )
                    return (y,)

                handle = model.h[layer].attn.c_proj.register_forward_pre_hook(hook)
                try:
                    out[layer, head] = sign * (loss(model(idx)) - base)
                finally:
                    handle.remove()
    return out


EFFECTS_MISTAKES = core.variants(
    _effects,
    {
        "sign": "your effects have the wrong sign: report the ablated loss minus the normal loss, so that a head the model needs shows a rise (a positive number)",
        "whole_sequence": "you measure the loss over the whole sequence; measure the second copy only (copy_losses' second value), where copying is what helps",
        "means_ignored": "with head_means given, your function still zeroes the head: set its channels to head_means[layer][head] (a (head_dim,) vector) instead",
        "whole_layer": "you ablate every head of the layer at once; ablate one head at a time, leaving the others as they are",
    },
)


def _effects_model(seed=0):
    model = _tiny(seed, n_positions=32)
    with torch.no_grad():  # larger weights, so that every head's ablation moves the loss
        for block in model.h:
            block.attn.c_proj.weight.mul_(8.0)
            block.attn.c_attn.weight.mul_(4.0)
    return model


def _check_mean_head_outputs(mean_head_outputs, model, idx, means):
    n_layer, n_head = model.config.n_layer, model.config.n_head
    hd = model.config.n_embd // n_head
    got = core.call_learner(EX_EFFECTS, mean_head_outputs, model, idx)
    need = functools.partial(core.require, EX_EFFECTS)
    need(
        isinstance(got, (list, tuple)) and len(got) == n_layer,
        f"mean_head_outputs must return a list of n_layer = {n_layer} tensors, one per layer",
    )
    for layer, (g, w) in enumerate(zip(got, means)):
        g = core.expect_tensor(
            EX_EFFECTS,
            g,
            (n_head, hd),
            what=f"layer {layer}'s means",
            hints={
                (hd,): "keep one mean per head: average over the batch and positions only",
                (n_head,): "keep the head_dim channels: average over the batch and positions only",
            },
        )
        need(
            core.close(g, w, atol=1e-5),
            f"layer {layer}'s means differ: average cache.head_out[layer], (B, n_head, T, head_dim), over the batch and the positions (dims 0 and 2)",
        )


def check_ablation_effects(ablation_effects, mean_head_outputs=None) -> None:
    """Exercise 8.8: `mean_head_outputs(model, idx)` -> per layer (n_head, head_dim), if given;
    `ablation_effects(model, idx, seq_len, head_means=None)` -> (n_layer, n_head)."""
    model = _effects_model()
    for L, seed in [(5, 0), (7, 1)]:
        idx = interpret.repeated_tokens(2, L, model.config.vocab_size, seed=seed)
        with torch.no_grad():
            _, cache = inspection.run_with_cache(model, idx, capture="head_out")
        means = [h.mean(dim=(0, 2)) for h in cache.head_out]  # per layer (nh, hd)
        if mean_head_outputs is not None:
            _check_mean_head_outputs(mean_head_outputs, model, idx, means)
        for head_means in (None, means):
            try:
                got = core.call_learner(
                    EX_EFFECTS, ablation_effects, model, idx, L, head_means=head_means
                )
            finally:
                left = _hooks_left(model)
                for m in model.modules():
                    m._forward_pre_hooks.clear()
                    m._forward_hooks.clear()
            core.require(
                EX_EFFECTS,
                not left,
                f"your function left hooks on {left[:3]}: remove each hook after its forward pass (handle.remove(), in a finally)",
            )
            want = _effects(model, idx, L, head_means)
            how = "zeroed" if head_means is None else "set to their means"
            core.judge(
                EX_EFFECTS,
                got,
                want,
                EFFECTS_MISTAKES,
                lambda m: m.fn(model, idx, L, head_means=head_means),
                lambda got: (
                    f"with the heads {how}, seq_len={L}: the effects should be {want.round(decimals=4).tolist()}, got {got.round(decimals=4).tolist()}"
                ),
                what="the effects",
                atol=1e-4,
                rtol=1e-4,
            )
    core.passed(
        EX_EFFECTS,
        "zeroed and mean-ablated heads, one at a time, on the second copy. Reading the printout: a head whose loss rises both ways computes from this input something the copy needs; one that costs much more zeroed than mean-ablated matters through its constant output, which later layers expect; small both ways, neither",
    )


# --------------------------------------------------------------------------- the challenge


def _zero_effects(model, idx, seq_len):
    return _effects(model, idx, seq_len)


def check_copying_head(model, head, idx, seq_len, share=0.9, floor=0.05) -> None:
    """Challenge: `head` = (layer, head) raises the second copy's loss by >= share of the best head's."""
    n_layer, n_head = model.config.n_layer, model.config.n_head
    if head is None:
        raise core.NotDoneYet(CH_HEAD, "not done yet: set CHOSEN_HEAD = (layer, head)")
    need = functools.partial(core.require, CH_HEAD)
    need(
        isinstance(head, (tuple, list))
        and len(head) == 2
        and all(isinstance(v, int) and not isinstance(v, bool) for v in head),
        f"CHOSEN_HEAD must be a pair of whole numbers (layer, head), got {head!r}",
    )
    layer, h = head
    need(
        0 <= layer < n_layer and 0 <= h < n_head,
        f"({layer}, {h}) is not a head of this model: layers 0 .. {n_layer - 1}, heads 0 .. {n_head - 1}",
    )
    effects = _zero_effects(model, idx, seq_len)
    best = effects.max().item()
    where = divmod(int(effects.argmax()), n_head)
    mine = effects[layer, h].item()
    if best < floor:
        core.passed(
            CH_HEAD,
            f"no head of this model raises the second copy's loss by {floor} nats or more (the largest rise is {best:+.4f}, head {where[0]}.{where[1]}; yours {mine:+.4f}): it does not rely on one head for copying",
        )
        return
    need(
        mine >= share * best,
        f"zeroing head {layer}.{h} raises the second copy's loss by {mine:+.4f} nats; the best head raises it by {best:+.4f}, and the goal is at least {share:.0%} of that ({share * best:.4f}). Keep looking",
    )
    core.passed(
        CH_HEAD,
        f"head {layer}.{h} raises the second copy's loss by {mine:+.4f} nats, {mine / best:.0%} of the best head's ({best:+.4f})",
    )


MISTAKES_BY_CHECK = {
    check_iter_safetensors: READ_MISTAKES,
    check_checkpoint_to_model: MAPPING_MISTAKES,
    check_next_token_logprobs: NEXT_MISTAKES,
    check_previous_token_score: PREVIOUS_MISTAKES,
    check_induction_score: INDUCTION_MISTAKES,
    check_copy_losses: COPY_MISTAKES,
    check_zero_heads: ZERO_MISTAKES,
    check_ablation_effects: EFFECTS_MISTAKES,
}
