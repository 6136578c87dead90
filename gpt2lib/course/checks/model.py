"""Checks for chapter 6, the whole model: Exercises 6.1 (assemble GPT-2), 6.3 (initialisation),
6.5 (parameter count), 6.6 (training memory), 6.8 (forward_by_hand) and the 1 GiB challenge."""

from __future__ import annotations

import functools
import math
import numbers

import torch
import torch.nn as nn

from gpt2lib.chapters.config import GPT2Config
from gpt2lib.chapters.model import GPT2
from gpt2lib.course.checks import _core as core

EX_MODULE = "Exercise 6.1 (assemble GPT-2)"
EX_INIT = "Exercise 6.3 (GPT-2's initialisation)"
EX_COUNT = "Exercise 6.5 (parameter count from the configuration)"
EX_MEMORY = "Exercise 6.6 (training memory)"
EX_DEBUG = "Exercise 6.8 (forward_by_hand)"

_NAMES = ("wte", "wpe", "drop", "h", "ln_f")
NOT_DETERMINISTIC = "in eval mode two calls gave different logits: use nn.Dropout (it switches off in .eval()), not F.dropout(x, p) alone"


def _reference(config, seed=0):
    torch.manual_seed(seed)
    model = GPT2(config).eval()
    with torch.no_grad():  # LayerNorm gains and biases away from 1 and 0, so skipping one shows
        for name, p in model.named_parameters():
            if name.endswith(("ln_1.weight", "ln_2.weight", "ln_f.weight")):
                p.copy_(1 + 0.5 * torch.randn_like(p))
            elif name.endswith(".bias"):
                p.copy_(0.1 * torch.randn_like(p))
    return model


# --------------------------------------------------------------------------- Exercise 6.1
def _logits(m, idx, *, mistake=""):
    """Model m's logits from its own wte, wpe, drop, h and ln_f; `mistake` plants one of
    MODULE_MISTAKES or FORWARD_MISTAKES by its name."""
    x = m.wte(idx)
    if mistake == "ids as positions":
        x = x + m.wpe(idx)
    elif mistake != "no positions":
        start = 1 if mistake in ("positions from 1", "both_planted_bugs") else 0
        x = x + m.wpe(torch.arange(start, start + idx.shape[1], device=idx.device))
    x = m.drop(x)
    for block in {"blocks discarded": [], "last block only": m.h[-1:]}.get(mistake, m.h):
        x = x + block(x) if mistake in ("double residual", "both_planted_bugs") else block(x)
        x = m.ln_f(x) if mistake == "ln_f in every block" else x
    x = x if mistake in ("no ln_f", "ln_f in every block") else m.ln_f(x)
    logits = x @ (m.wpe if mistake == "readout with wpe" else m.wte).weight.T
    if mistake == "softmax":
        return logits.softmax(dim=-1)
    return logits.log_softmax(dim=-1) if mistake == "log-softmax" else logits


MODULE_MISTAKES = core.variants(
    _logits,
    {
        "double residual": "your blocks' outputs are added to the stream once more (x = x + block(x)): a Block already returns x plus its update, so that doubles the stream at every block. Write x = block(x)",
        "no ln_f": "your logits match the model WITHOUT the final LayerNorm: apply self.ln_f to the output of the last block, before the readout",
        "no positions": "your logits match the model WITHOUT position embeddings: add self.wpe(positions) to the token embeddings, or the model cannot tell word order",
        "positions from 1": "your positions start at 1: the first is 0, so use torch.arange(T) (0, 1, ..., T-1)",
        "ids as positions": "you looked up the token ids in the position table (self.wpe(idx)): positions are 0, 1, ..., T-1, torch.arange(T), whatever the tokens are",
        "blocks discarded": "your logits match the model with NO blocks: a block returns the new residual stream, so write x = block(x) (the blocks' output is being thrown away)",
        "last block only": "your logits match the model with only the LAST block applied to the embeddings: each block takes the previous block's output, x = block(x) in the loop",
        "ln_f in every block": "the final LayerNorm ln_f is applied after every block: it comes once, after the last",
        "softmax": "your output is probabilities (each row sums to 1): return the raw logits; softmax belongs to the loss and to sampling",
        "log-softmax": "your output is log-probabilities (log_softmax): return the raw logits; the loss (F.cross_entropy) applies log_softmax itself",
        "readout with wpe": "the readout multiplies by the position table: the tied readout uses the TOKEN table, x @ self.wte.weight.T",
    },
)


def _check_dropout(model_cls) -> None:
    """Training mode: dropout on the embeddings (self.drop) acts; eval mode: it does not."""
    config = core.tiny_config(vocab_size=61, n_embd=32, n_head=4, embd_pdrop=0.5)
    model = core.call_learner(EX_MODULE, model_cls, config)
    model.load_state_dict(_reference(config).state_dict(), strict=False)
    idx = torch.randint(0, config.vocab_size, (2, 8), generator=torch.Generator().manual_seed(2))
    with torch.no_grad():
        evaluated = model.eval()(idx)
        core.require(EX_MODULE, torch.equal(model(idx), evaluated), NOT_DETERMINISTIC)
        torch.manual_seed(0)
        core.require(
            EX_MODULE,
            not torch.equal(model.train()(idx), evaluated),
            "with embd_pdrop = 0.5, training mode gives the same logits as eval mode: self.drop is never applied. Apply it to the sum of the embeddings, x = self.drop(self.wte(idx) + self.wpe(positions))",
        )
    model.eval()


def _check_parts(model, model_cls, ref) -> None:
    """The model's modules, their names and sizes, and that the reference weights load."""
    config = ref.config
    fail = functools.partial(core.CheckFailed, EX_MODULE)
    if not isinstance(model, nn.Module):
        name = getattr(model_cls, "__name__", model_cls)
        raise fail(f"{name}(config) should make an nn.Module, got {type(model).__name__}")
    missing = [n for n in _NAMES if not hasattr(model, n)]
    if "ln_f" in missing:
        raise fail(
            "your model has no `ln_f`: the final LayerNorm is missing; add self.ln_f = LayerNorm(config.n_embd, config.layer_norm_epsilon)"
        )
    if missing:
        raise fail(
            f"your model has no attribute(s) {', '.join(missing)}; use exactly the names {', '.join(_NAMES)} (the checkpoint's names)"
        )
    if isinstance(model.h, (list, tuple)):
        raise fail(
            f"self.h is a plain {type(model.h).__name__}: PyTorch does not see the blocks inside it, so their parameters are missing from model.parameters(), state_dict() and .to(device); wrap it: self.h = nn.ModuleList([...])"
        )
    if not isinstance(model.h, nn.ModuleList) or len(model.h) != config.n_layer:
        length = f" of length {len(model.h)}" if hasattr(model.h, "__len__") else ""
        raise fail(
            f"self.h should be an nn.ModuleList of config.n_layer ({config.n_layer}) blocks, got {type(model.h).__name__}{length}"
        )
    if len({id(block) for block in model.h}) < len(model.h):
        raise fail(
            "self.h holds the same Block object more than once ([Block(config)] * n_layer repeats one block, so all layers share their weights); build a new block for each layer: nn.ModuleList([Block(config) for _ in range(config.n_layer)])"
        )
    V, C = config.vocab_size, config.n_embd
    wte = getattr(model.wte, "weight", None)
    params = dict(model.named_parameters())
    untied = [n for n, p in params.items() if p is not wte and tuple(p.shape) in ((V, C), (C, V))]
    if untied:
        raise fail(
            f"your model has a separate readout ({', '.join(untied)}, {V * C:,} extra parameters here, 38,597,376 in GPT-2 small): GPT-2's readout is tied, logits = x @ self.wte.weight.T, with no lm_head"
        )
    n_learner, n_ref = (sum(p.numel() for p in m.parameters()) for m in (model, ref))
    if n_learner != n_ref:
        raise fail(
            f"your model has {n_learner:,} parameters, the reference {n_ref:,} for this config; compare your layers with the list above"
        )
    state = ref.state_dict()
    try:
        result = model.load_state_dict(state, strict=False)
    except RuntimeError as exc:
        raise fail(f"the reference weights do not fit your model: {exc}") from None
    loaded = {id(p) for n, p in params.items() if n in state}
    not_loaded = [n for n in result.missing_keys if n in params and id(params[n]) not in loaded]
    if result.unexpected_keys or not_loaded:
        raise fail(
            f"parameter names differ from GPT-2's: your model lacks {result.unexpected_keys[:4]} and has {not_loaded[:4]}; use Block(config) for the blocks and the names {', '.join(_NAMES)}"
        )


def check_gpt2_module(model_cls) -> None:
    """Exercise 6.1: `model_cls(config)` builds GPT-2; its forward(idx) (B, T) -> logits
    (B, T, vocab_size)."""
    config = GPT2Config(vocab_size=61, n_positions=16, n_embd=32, n_layer=2, n_head=4)
    ref = _reference(config)
    model = core.call_learner(EX_MODULE, model_cls, config)
    _check_parts(model, model_cls, ref)
    model.eval()
    torch.manual_seed(1)
    cases = [
        torch.randint(0, config.n_positions, (2, 9)),  # ids small enough to be positions too
        torch.randint(0, config.vocab_size, (config.n_positions, 3)).T,  # full, non-contiguous
        torch.randint(0, config.vocab_size, (1, 1)),  # a single token
    ]
    for idx in cases:
        with torch.no_grad():  # forward: so that a wrong signature is named
            got = core.call_learner(EX_MODULE, model.forward, idx)
            want = _logits(ref, idx)
            if isinstance(got, torch.Tensor) and tuple(got.shape) == (*idx.shape, config.n_embd):
                raise core.CheckFailed(
                    EX_MODULE,
                    f"your output has shape {tuple(got.shape)} = (B, T, n_embd): the readout is missing; multiply by self.wte.weight.T to get (B, T, vocab_size)",
                )
            if not core.close(got, want, atol=1e-4, rtol=1e-4):
                mistake = core.first_mistake(
                    MODULE_MISTAKES, lambda m: core.close(got, m.fn(ref, idx), 1e-4, 1e-4)
                )
                if mistake is not None:
                    raise core.CheckFailed(EX_MODULE, mistake.message)
            shape = tuple(idx.shape)
            got = core.expect_tensor(
                EX_MODULE, got, want.shape, what=f"for idx of shape {shape} your output"
            )
            again = core.call_learner(EX_MODULE, model.forward, idx).double()
            core.require(EX_MODULE, torch.equal(got, again), NOT_DETERMINISTIC)
        core.require(
            EX_MODULE,
            core.close(got, want, atol=1e-4, rtol=1e-4),
            f"for idx of shape {shape} your logits differ from the reference by up to {(got - want.double()).abs().max().item():.4g}; the order is: wte(idx) + wpe(arange(T)), dropout, every block, ln_f, @ wte.weight.T",
        )
    _check_dropout(model_cls)
    core.passed(EX_MODULE, "same logits as gpt2lib.GPT2, readout tied to wte")


# --------------------------------------------------------------------------- Exercise 6.3
def _residual_std(n_layer, *, mistake=""):
    """The std of the residual projections (attn.c_proj, mlp.c_proj), 0.02 / √(2 · n_layer);
    `mistake` plants one of INIT_SCALE_MISTAKES by its name."""
    divisor = {
        "1/sqrt(n_layer)": math.sqrt(n_layer),
        "1/(2 n_layer)": 2 * n_layer,
        "GPT-2 small's depth": math.sqrt(2 * 12),
        "1/sqrt(2) only": math.sqrt(2),
    }.get(mistake, math.sqrt(2 * n_layer))
    return 0.02 / divisor


INIT_SCALE_MISTAKES = core.variants(
    _residual_std,
    {
        "1/sqrt(n_layer)": "are scaled by 1/√n_layer: it is 1/√(2 · n_layer), since every block adds TWO updates to the residual stream (attention and MLP)",
        "1/(2 n_layer)": "are scaled by 1/(2 · n_layer): take the square root, 0.02 / √(2 · n_layer) (random updates add up as √count)",
        "GPT-2 small's depth": "look scaled for GPT-2 small's 12 layers: use the model's own depth, model.config.n_layer",
        "1/sqrt(2) only": "are scaled by 1/√2 only: divide by √(2 · n_layer), the number of updates the residual stream sums over the whole model",
    },
)


def _std_and_mean(named, suffix):
    flat = torch.cat([p.detach().reshape(-1) for n, p in named.items() if n.endswith(suffix)])
    return flat.std().item(), flat.mean().item()


def _near(value, target):
    return abs(value - target) <= 0.1 * target


def check_init_gpt2_weights(init_fn) -> None:
    """Exercise 6.3: `init_fn(model)` sets a gpt2lib.GPT2's weights as GPT-2 does, in place."""
    n_layer, fill = 6, 0.5  # not GPT-2 small's 12, so a hard-coded 12 shows
    torch.manual_seed(0)
    model = GPT2(GPT2Config(vocab_size=1000, n_positions=64, n_embd=64, n_layer=n_layer, n_head=4))
    with torch.no_grad():
        for p in model.parameters():
            p.fill_(fill)
        torch.manual_seed(0)
        returned = core.call_learner(EX_INIT, init_fn, model)
    named = dict(model.named_parameters())
    need = functools.partial(core.require, EX_INIT)
    new = isinstance(returned, nn.Module) and returned is not model
    need(
        not (new and all((p == fill).all() for p in named.values())),
        "your function returned a new model and left the one it was given unchanged; set the weights of `model` itself, in place (nn.init.normal_(module.weight, ...) changes the tensor it is given)",
    )
    for n, p in named.items():
        ones = n.endswith(".weight")  # a LayerNorm's gain; its bias is 0
        need(
            not (".ln_" in n or n.startswith("ln_f")) or torch.all(p == float(ones)),
            f"{n} is not {'all ones' if ones else 'zero'}: a LayerNorm starts with gain (weight) 1 and bias 0, a plain normalisation",
        )
    for n, p in named.items():
        if n.endswith(".bias") and not torch.all(p == 0):
            raise core.CheckFailed(EX_INIT, f"{n} is not zero: the layers' biases start at 0")
    for n, p in named.items():
        need(
            not torch.all(p == fill),
            f"{n} still holds the value it had before your function ran: every parameter must be set (see the list in the exercise)",
        )
    groups = {
        "the token embedding wte": "wte.weight",
        "the position embedding wpe": "wpe.weight",
        "attn.c_attn weights": "attn.c_attn.weight",
        "mlp.c_fc weights": "mlp.c_fc.weight",
    }
    for label, suffix in groups.items():
        std, mean = _std_and_mean(named, suffix)
        need(
            not abs(std - math.sqrt(0.02)) < 0.1 * math.sqrt(0.02),
            f"{label} have std {std:.4f} = √0.02: 0.02 is the standard deviation, not the variance (nn.init.normal_(w, mean=0.0, std=0.02))",
        )
        need(_near(std, 0.02), f"{label} have std {std:.4f}; GPT-2 uses std 0.02 for them")
        need(not abs(mean) > 0.2 * 0.02, f"{label} have mean {mean:.4f}; draw them around 0")
    resid = _residual_std(n_layer)
    stds = {w: _std_and_mean(named, w + ".weight") for w in ("attn.c_proj", "mlp.c_proj")}
    right = {w: _near(std, resid) and abs(mean) <= 0.2 * resid for w, (std, mean) in stds.items()}
    if all(right.values()):
        core.passed(EX_INIT, f"std 0.02, residual projections {resid:.4f} for n_layer={n_layer}")
        return
    bad = next(w for w, ok in right.items() if not ok)
    good = next((w for w, ok in right.items() if ok), None)
    need(
        not (good and _near(stds[bad][0], 0.02)),
        f"only {good} is scaled, {bad} is not: both write into the residual stream, so both use std 0.02 / √(2 · n_layer)",
    )
    std, mean = stds[bad]
    need(
        not _near(std, 0.02),
        f"the residual projections (attn.c_proj, mlp.c_proj) are not scaled (std {std:.4f}): use std 0.02 / √(2 · n_layer), because the residual stream adds up 2 · n_layer of their outputs",
    )
    core.fail_with(
        EX_INIT,
        INIT_SCALE_MISTAKES,
        lambda m: _near(std, m.fn(n_layer)),
        f"{bad} weights have std {std:.4f} (mean {mean:.4f}); expected 0.02 / √(2 · {n_layer}) = {resid:.4f}",
        prefix=f"{bad} weights have std {std:.4f}: they ",
    )


# --------------------------------------------------------------------------- Exercise 6.5
def _count(config, *, mistake=""):
    """GPT-2's parameter count from the config's sizes; `mistake` plants one of COUNT_MISTAKES
    by its name (the right count plus that mistake's delta)."""
    V, P, C, L = config.vocab_size, config.n_positions, config.n_embd, config.n_layer
    delta = {
        "untied readout": V * C,
        "no ln_f": -2 * C,
        "no wpe": -P * C,
        "no biases": -9 * C * L,
        "no block LayerNorms": -4 * C * L,
        "no LayerNorms": -4 * C * L - 2 * C,
        "weights only": -9 * C * L - 4 * C * L - 2 * C,
        "one block": -(L - 1) * (12 * C * C + 13 * C),
        "MLP without expansion": -L * (6 * C * C + 3 * C),
        "MLP c_proj as n × n": -3 * C * C * L,
        "one LayerNorm per block": -2 * C * L,
        "LayerNorm without bias": -(2 * L + 1) * C,
        "c_attn as n × n": -L * (2 * C * C + 2 * C),
        "no attention c_proj": -L * (C * C + C),
    }
    return V * C + P * C + L * (12 * C * C + 13 * C) + 2 * C + delta.get(mistake, 0)


COUNT_MISTAKES = core.variants(
    _count,
    {
        "untied readout": "you counted the readout as well as wte: the readout is TIED to the token table (logits = x @ wte.weight.T), so it adds no parameters",
        "no ln_f": "the final LayerNorm ln_f (2 · n_embd: gain and bias) is missing",
        "no wpe": "the position embedding table wpe (n_positions × n_embd) is missing",
        "no biases": "the biases of c_attn, c_proj, c_fc and the MLP's c_proj (3C + C + 4C + C per block) are missing",
        "no block LayerNorms": "the blocks' two LayerNorms (ln_1 and ln_2, 2 · n_embd each) are missing",
        "no LayerNorms": "all LayerNorm parameters (ln_1, ln_2 per block and ln_f) are missing",
        "weights only": "only the weight matrices are counted: add the biases and the LayerNorms",
        "one block": "only ONE block is counted: there are n_layer of them, each with its own weights",
        "MLP without expansion": "the MLP is counted as n_embd → n_embd → n_embd: its hidden layer is 4 · n_embd wide",
        "MLP c_proj as n × n": "the MLP's c_proj is counted as n_embd × n_embd: it brings the 4 · n_embd hidden values back to n_embd, so its weight is 4 · n_embd × n_embd (attention's is n_embd × n_embd)",
        "one LayerNorm per block": "each block has TWO LayerNorms, ln_1 before attention and ln_2 before the MLP, with 2 · n_embd parameters each",
        "LayerNorm without bias": "a LayerNorm has a gain (weight) AND a bias: 2 · n_embd parameters, not n_embd",
        "c_attn as n × n": "c_attn maps n_embd to 3 · n_embd (q, k and v in one layer), so it has n_embd · 3 · n_embd weights and 3 · n_embd biases",
        "no attention c_proj": "attention's output projection c_proj (n_embd × n_embd and n_embd biases) is missing",
    },
)


@functools.cache
def _meta_count(config_items) -> int:
    """Parameters of gpt2lib.GPT2 for a config, counted on the meta device (no memory)."""
    with torch.device("meta"):
        return sum(p.numel() for p in GPT2(GPT2Config(**dict(config_items))).parameters())


def _count_of(config):
    return _meta_count(tuple(sorted(vars(config).items())))


def check_count_gpt2_parameters(count_fn) -> None:
    """Exercise 6.5: `count_fn(config)` -> the parameter count (an int), from the sizes alone."""
    configs = [GPT2Config.from_name(name) for name in GPT2Config.SIZES] + [
        GPT2Config(vocab_size=101, n_positions=7, n_embd=48, n_layer=1, n_head=3),
        GPT2Config(vocab_size=5, n_positions=3, n_embd=4, n_layer=3, n_head=2),
    ]
    for config in configs:
        want = _count_of(config)
        got = core.call_learner(EX_COUNT, count_fn, config)
        if isinstance(got, bool) or not isinstance(got, numbers.Real):
            raise core.CheckFailed(EX_COUNT, f"return a number (an int), got {type(got).__name__}")
        if got == want:
            continue
        sizes = f"vocab_size={config.vocab_size}, n_positions={config.n_positions}, n_embd={config.n_embd}, n_layer={config.n_layer}"
        if config is not configs[0] and got == _count_of(configs[0]):
            raise core.CheckFailed(
                EX_COUNT,
                f"for {sizes} you return GPT-2 small's count, 124,439,808; compute it from the config's fields (config.n_embd, config.n_layer, ...)",
            )
        assert _count(config) == want, "the check's formula disagrees with gpt2lib.GPT2"
        case = f"for {sizes} you get {got:,}, the model has {want:,}"
        core.fail_with(
            EX_COUNT,
            COUNT_MISTAKES,
            lambda m: m.fn(config) == got,
            f"{case} (off by {got - want:+,}); go through the parts listed in the exercise",
            prefix=f"{case}: ",
        )
    core.passed(EX_COUNT, "right for gpt2, gpt2-medium, gpt2-large, gpt2-xl and two odd sizes")


# --------------------------------------------------------------------------- Exercise 6.6
def _memory(n_params, bytes_per_number, *, mistake=""):
    """The bytes that training takes: weights, their gradients, AdamW's two states, and the
    total; `mistake` plants one of MEMORY_MISTAKES by its name."""
    bytes_per_number = 4 if mistake == "fixed 4 bytes" else bytes_per_number
    weights = n_params * bytes_per_number * (8 if mistake == "bits" else 1)
    states = {"one optimizer state": 1, "optimizer with gradients": 3}.get(mistake, 2)
    parts = {
        "weights": weights,
        "gradients": (0 if mistake == "no gradients" else 1) * weights,
        "optimizer": states * weights,
    }
    return {**parts, "total": sum(parts.values())}


MEMORY_MISTAKES = core.variants(
    _memory,
    {
        "one optimizer state": "your optimizer state is one number per parameter: AdamW keeps TWO, the running average of the gradient (exp_avg) and of its square (exp_avg_sq)",
        "no gradients": "gradients are missing: loss.backward() stores one per parameter, as big as the weights",
        "optimizer with gradients": "your optimizer state is three numbers per parameter: AdamW keeps two (exp_avg, exp_avg_sq); the gradient has its own entry",
        "bits": "your counts are in bits (×8): the answer is in bytes, n_params × bytes_per_number",
        "fixed 4 bytes": "your counts ignore bytes_per_number (they assume 4, float32): use the argument, 2 for bfloat16, 8 for float64",
    },
)


def _bytes(tensors):
    return sum(t.numel() * t.element_size() for t in tensors)


def _check_measured(measured, model, optimizer) -> None:
    """The notebook's `measured` dict against the tensors of the model and optimizer it names."""
    params = list(model.parameters())
    states = [s for state in optimizer.state.values() for s in state.items()]
    steps = _bytes(t for n, t in states if n == "step")
    want = {
        "weights": _bytes(params),
        "gradients": _bytes(p.grad for p in params if p.grad is not None),
        "optimizer": _bytes(t for n, t in states if torch.is_tensor(t)) - steps,
    }
    if not isinstance(measured, dict) or set(measured) != set(want):
        raise core.CheckFailed(
            EX_MEMORY, f"`measured` should be a dict with the keys {', '.join(want)}"
        )
    for key, value in want.items():
        if measured[key] == value:
            continue
        if key == "optimizer" and measured[key] == value + steps:
            raise core.CheckFailed(
                EX_MEMORY, "measured['optimizer'] counts AdamW's `step` counters: leave them out"
            )
        if measured[key] * 8 == value or measured[key] == sum(t.numel() for t in params):
            raise core.CheckFailed(
                EX_MEMORY, f"measured[{key!r}] counts numbers, not bytes: times element_size()"
            )
        raise core.CheckFailed(
            EX_MEMORY, f"measured[{key!r}] is {measured[key]:,} bytes; the tensors hold {value:,}"
        )


def check_training_memory(training_memory, measured=None, model=None, optimizer=None) -> None:
    """Exercise 6.6: the notebook's `measured` bytes (when given, with the model and optimizer
    they come from) and `training_memory(n_params, bytes_per_number=4)` -> dict of byte counts."""
    if model is not None:
        _check_measured(measured, model, optimizer)
    keys = ("weights", "gradients", "optimizer", "total")
    need = functools.partial(core.require, EX_MEMORY)
    for n_params, bytes_per_number in ((124_439_808, 4), (1_000, 2), (7, 8)):
        got = core.call_learner(
            EX_MEMORY, training_memory, n_params, bytes_per_number=bytes_per_number
        )
        need(
            isinstance(got, dict),
            f"return a dict with the keys {', '.join(keys)}; got {type(got).__name__}",
        )
        missing = ", ".join(repr(k) for k in keys if k not in got)
        need(
            not missing,
            f"your dict lacks the key(s) {missing}: use exactly {', '.join(map(repr, keys))}",
        )
        for key in keys:
            number = isinstance(got[key], numbers.Real) and not isinstance(got[key], bool)
            need(number, f"got[{key!r}] should be a number of bytes, got {type(got[key]).__name__}")
        want = _memory(n_params, bytes_per_number)
        wrong = [k for k in keys if got[k] != want[k]]
        if not wrong:
            continue
        case = f"for {n_params:,} parameters of {bytes_per_number} bytes"
        if wrong == ["total"] and got["total"] != sum(got[k] for k in keys[:3]):
            raise core.CheckFailed(
                EX_MEMORY,
                f"{case}, 'total' is {got['total']:,}, but it should be the sum of the other three, weights + gradients + optimizer",
            )
        mistake = core.first_mistake(
            MEMORY_MISTAKES,
            lambda m: all(got[k] == m.fn(n_params, bytes_per_number)[k] for k in keys),
        )
        if mistake is not None:
            raise core.CheckFailed(EX_MEMORY, f"{case}: " + mistake.message)
        key = wrong[0]
        if want[key] in (got[key] * 2**20, got[key] * 2**30):
            raise core.CheckFailed(
                EX_MEMORY,
                f"{case}, your {key!r} looks converted to MiB or GiB: return bytes (divide by 2**20 only to print)",
            )
        raise core.CheckFailed(
            EX_MEMORY, f"{case}, {key!r} should be {want[key]:,} bytes, got {got[key]:,}"
        )
    core.passed(EX_MEMORY, "weights + gradients + AdamW's two states = 4 copies of the weights")


# --------------------------------------------------------------------------- Challenge
CHALLENGE_BUDGET = "Challenge (the largest GPT-2 you can train in 1 GiB)"
BUDGET = dict(bytes=2**30, min_params=50_000_000, min_layers=8, vocab_size=50257, n_positions=1024)


def check_budget_config(config) -> int:
    """The challenge: a GPT2Config with GPT-2's vocabulary and context, at least 8 blocks, whose
    float32 weights + gradients + AdamW state (16 bytes a parameter) fit in 1 GiB, with at least
    50 million parameters. Counts a model built on the meta device; returns the count."""
    fail = functools.partial(core.CheckFailed, CHALLENGE_BUDGET)
    if not isinstance(config, GPT2Config):
        raise fail(f"give a GPT2Config, got {type(config).__name__}")
    for name in ("vocab_size", "n_positions"):
        if getattr(config, name) != BUDGET[name]:
            raise fail(f"keep GPT-2's {name} = {BUDGET[name]:,}; got {getattr(config, name):,}")
    if config.n_layer < BUDGET["min_layers"]:
        raise fail(f"n_layer = {config.n_layer}: the goal asks for at least 8 blocks")
    with torch.device("meta"):
        n = sum(p.numel() for p in GPT2(config).parameters())
    gib = 16 * n / 2**30  # float32 weights, gradients, AdamW's exp_avg and exp_avg_sq
    if 16 * n > BUDGET["bytes"]:
        raise fail(
            f"{n:,} parameters need {gib:.2f} GiB of training state, more than 1 GiB: make the model narrower or shallower"
        )
    if n < BUDGET["min_params"]:
        raise fail(
            f"{n:,} parameters ({gib:.2f} GiB) fit, but the goal is at least {BUDGET['min_params']:,}: there is room for more"
        )
    share = config.vocab_size * config.n_embd / n
    core.passed(
        CHALLENGE_BUDGET,
        f"{n:,} parameters, {gib:.3f} GiB of training state, token table {share:.1%} of the model",
    )
    return n


# --------------------------------------------------------------------------- Exercise 6.8
BOTH_BUGS = "both planted bugs are still there: the positions start at 1 and each block's output is added to the stream a second time"
# the planted bugs first, then Exercise 6.1's
FORWARD_MISTAKES = [*core.variants(_logits, {"both_planted_bugs": BOTH_BUGS}), *MODULE_MISTAKES]


def check_forward_by_hand(forward_by_hand) -> None:
    """Exercise 6.8: `forward_by_hand(model, idx)` (B, T) -> logits (B, T, V) equal to
    `model(idx)` for a gpt2lib.GPT2 in eval mode, on two sizes and several lengths."""
    for n_layer, n_embd in ((2, 32), (3, 16)):
        # ids below n_positions, so that looking ids up as positions is a wrong answer, not a crash
        config = GPT2Config(vocab_size=16, n_positions=16, n_embd=n_embd, n_layer=n_layer, n_head=4)
        model = _reference(config, seed=n_layer)
        gen = torch.Generator().manual_seed(n_layer)
        for T in (5, 16, 1):
            idx = torch.randint(0, 16, (2, T), generator=gen)
            with torch.no_grad():
                want = model(idx)
                try:
                    got = core.call_learner(EX_DEBUG, forward_by_hand, model, idx)
                except IndexError:
                    raise core.CheckFailed(
                        EX_DEBUG,
                        f"for T={T} = n_positions your forward reads a position the table does not have: positions are 0 .. T-1, torch.arange(T)",
                    ) from None
                got = core.expect_tensor(EX_DEBUG, got, want.shape, what=f"your logits for T={T}")
                if not core.close(got, want, atol=1e-4, rtol=1e-4):
                    core.fail_with(
                        EX_DEBUG,
                        FORWARD_MISTAKES,
                        lambda m: core.close(got, m.fn(model, idx), atol=1e-4, rtol=1e-4),
                        f"for T={T} your logits differ from model(idx) by up to {(got - want.double()).abs().max().item():.4g}",
                    )
    core.passed(
        EX_DEBUG, "equal to model(idx): positions from 0, each block's output is the new stream"
    )


MISTAKES_BY_CHECK = {check_forward_by_hand: FORWARD_MISTAKES}
