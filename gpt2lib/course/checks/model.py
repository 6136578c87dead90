"""Checks for chapter 6 (the whole model): assembling GPT-2, its initialisation, its size, the
memory training needs, and a forward pass with planted bugs.

Each check runs the learner's code on small random cases, compares with the reference
`gpt2lib.model.GPT2`, and names the usual mistake by comparing with the planted wrong answers
in the module-level `Mistake` lists below (the tests are parametrised over those lists).
"""

from __future__ import annotations

import functools
import math
import numbers

import torch
import torch.nn as nn

from gpt2lib.course.checks import _core as core

EX_MODULE = "Exercise 6.1 (assemble GPT-2)"
EX_INIT = "Exercise 6.3 (GPT-2's initialisation)"
EX_COUNT = "Exercise 6.5 (parameter count from the configuration)"
EX_MEMORY = "Exercise 6.6 (training memory)"
EX_DEBUG = "Exercise 6.8 (forward_by_hand)"

_NAMES = ("wte", "wpe", "drop", "h", "ln_f")


def _config(**sizes):
    from gpt2lib.chapters.config import GPT2Config

    return GPT2Config(**sizes)


def _reference(config, seed=0):
    from gpt2lib.chapters.model import GPT2

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


def _blocks(model, x):
    for block in model.h:
        x = block(x)
    return x


def _readout(model, x):
    return x @ model.wte.weight.T


def _positions(model, idx, start=0):
    return model.wpe(torch.arange(start, start + idx.shape[1], device=idx.device))


def _ln_f_after_each(model, x):
    for block in model.h:
        x = model.ln_f(block(x))
    return x


def _right(model, idx):
    return _readout(
        model, model.ln_f(_blocks(model, model.drop(model.wte(idx) + _positions(model, idx))))
    )


def _by_hand(model, idx, *, start=0, residual_twice=False):
    x = model.drop(model.wte(idx) + _positions(model, idx, start=start))
    for block in model.h:
        x = x + block(x) if residual_twice else block(x)
    return _readout(model, model.ln_f(x))


DOUBLE_RESIDUAL = (
    "your blocks' outputs are added to the stream once more (x = x + block(x)): a Block "
    "already returns x plus its update, so that doubles the stream at every block. "
    "Write x = block(x)"
)


# fn(model, idx) -> wrong logits, computed with the model's own wte, wpe, drop, h, ln_f
MODULE_MISTAKES = [
    core.Mistake(
        "double residual", DOUBLE_RESIDUAL, lambda m, idx: _by_hand(m, idx, residual_twice=True)
    ),
    core.Mistake(
        "no ln_f",
        "your logits match the model WITHOUT the final LayerNorm: apply self.ln_f to "
        "the output of the last block, before the readout",
        lambda m, idx: _readout(m, _blocks(m, m.wte(idx) + _positions(m, idx))),
    ),
    core.Mistake(
        "no positions",
        "your logits match the model WITHOUT position embeddings: add "
        "self.wpe(positions) to the token embeddings, or the model cannot tell word order",
        lambda m, idx: _readout(m, m.ln_f(_blocks(m, m.wte(idx)))),
    ),
    core.Mistake(
        "positions from 1",
        "your positions start at 1: the first token's position is 0, so use "
        "torch.arange(T) (0, 1, ..., T-1)",
        lambda m, idx: _readout(m, m.ln_f(_blocks(m, m.wte(idx) + _positions(m, idx, start=1)))),
    ),
    core.Mistake(
        "ids as positions",
        "you looked up the token ids in the position table (self.wpe(idx)): "
        "positions are 0, 1, ..., T-1, torch.arange(T), whatever the tokens are",
        lambda m, idx: _readout(m, m.ln_f(_blocks(m, m.wte(idx) + m.wpe(idx)))),
    ),
    core.Mistake(
        "blocks discarded",
        "your logits match the model with NO blocks: a block returns the new "
        "residual stream, so write x = block(x) (the blocks' output is being thrown away)",
        lambda m, idx: _readout(m, m.ln_f(m.wte(idx) + _positions(m, idx))),
    ),
    core.Mistake(
        "last block only",
        "your logits match the model with only the LAST block applied to the "
        "embeddings: each block takes the previous block's output, x = block(x) in the loop",
        lambda m, idx: _readout(m, m.ln_f(m.h[-1](m.wte(idx) + _positions(m, idx)))),
    ),
    core.Mistake(
        "ln_f in every block",
        "the final LayerNorm ln_f is applied after every block: it comes "
        "once, after the last block",
        lambda m, idx: _readout(m, _ln_f_after_each(m, m.wte(idx) + _positions(m, idx))),
    ),
    core.Mistake(
        "softmax",
        "your output is probabilities (each row sums to 1): return the raw logits; "
        "softmax belongs to the loss and to sampling",
        lambda m, idx: _right(m, idx).softmax(dim=-1),
    ),
    core.Mistake(
        "log-softmax",
        "your output is log-probabilities (log_softmax): return the raw logits; "
        "the loss (F.cross_entropy) applies log_softmax itself",
        lambda m, idx: _right(m, idx).log_softmax(dim=-1),
    ),
    core.Mistake(
        "readout with wpe",
        "the readout multiplies by the position table: the tied readout uses "
        "the TOKEN table, x @ self.wte.weight.T",
        lambda m, idx: m.ln_f(_blocks(m, m.wte(idx) + _positions(m, idx))) @ m.wpe.weight.T,
    ),
]


def _check_dropout(model_cls) -> None:
    """Training mode: dropout on the embeddings (self.drop) acts; eval mode: it does not."""
    config = _config(
        vocab_size=61,
        n_positions=16,
        n_embd=32,
        n_layer=1,
        n_head=4,
        embd_pdrop=0.5,
        attn_pdrop=0.0,
        resid_pdrop=0.0,
    )
    model = core.call_learner(EX_MODULE, model_cls, config)
    model.load_state_dict(_reference(config).state_dict(), strict=False)
    idx = torch.randint(0, config.vocab_size, (2, 8), generator=torch.Generator().manual_seed(2))
    with torch.no_grad():
        model.eval()
        if not torch.equal(model(idx), model(idx)):
            raise core.CheckFailed(
                EX_MODULE,
                "in eval mode two calls gave different logits: use "
                "nn.Dropout (it switches off in .eval()), not F.dropout(x, p) alone",
            )
        evaluated = model(idx)
        model.train()
        torch.manual_seed(0)
        if torch.equal(model(idx), evaluated):
            raise core.CheckFailed(
                EX_MODULE,
                "with embd_pdrop = 0.5, training mode gives the same logits "
                "as eval mode: self.drop is never applied. Apply it to the sum of the "
                "embeddings, x = self.drop(self.wte(idx) + self.wpe(positions))",
            )
    model.eval()


def check_gpt2_module(model_cls) -> None:
    """Exercise 6.1: `model_cls(config)` builds GPT-2 and `forward(idx)` returns logits."""
    config = _config(vocab_size=61, n_positions=16, n_embd=32, n_layer=2, n_head=4)
    ref = _reference(config)
    model = core.call_learner(EX_MODULE, model_cls, config)
    if not isinstance(model, nn.Module):
        raise core.CheckFailed(
            EX_MODULE,
            f"{getattr(model_cls, '__name__', model_cls)}(config) "
            f"should make an nn.Module, got {type(model).__name__}",
        )
    missing = [n for n in _NAMES if not hasattr(model, n)]
    if "ln_f" in missing:
        raise core.CheckFailed(
            EX_MODULE,
            "your model has no `ln_f`: the final LayerNorm is missing; "
            "add self.ln_f = LayerNorm(config.n_embd, config.layer_norm_epsilon)",
        )
    if missing:
        raise core.CheckFailed(
            EX_MODULE,
            f"your model has no attribute(s) {', '.join(missing)}; "
            f"use exactly the names {', '.join(_NAMES)} (the checkpoint's names)",
        )
    if isinstance(model.h, (list, tuple)):
        raise core.CheckFailed(
            EX_MODULE,
            f"self.h is a plain {type(model.h).__name__}: PyTorch does "
            "not see the blocks inside it, so their parameters are missing from "
            "model.parameters(), state_dict() and .to(device); wrap it: "
            "self.h = nn.ModuleList([...])",
        )
    if not isinstance(model.h, nn.ModuleList) or len(model.h) != config.n_layer:
        raise core.CheckFailed(
            EX_MODULE,
            f"self.h should be an nn.ModuleList of config.n_layer "
            f"({config.n_layer}) blocks, got {type(model.h).__name__}"
            + (f" of length {len(model.h)}" if hasattr(model.h, "__len__") else ""),
        )

    if len({id(block) for block in model.h}) < len(model.h):
        raise core.CheckFailed(
            EX_MODULE,
            "self.h holds the same Block object more than once "
            "([Block(config)] * n_layer repeats one block, so all layers share "
            "their weights); build a new block for each layer: "
            "nn.ModuleList([Block(config) for _ in range(config.n_layer)])",
        )

    V, C = config.vocab_size, config.n_embd
    wte_weight = getattr(model.wte, "weight", None)
    untied = [
        n
        for n, p in model.named_parameters()
        if p is not wte_weight and tuple(p.shape) in ((V, C), (C, V))
    ]
    if untied:
        raise core.CheckFailed(
            EX_MODULE,
            f"your model has a separate readout ({', '.join(untied)}, "
            f"{V * C:,} extra parameters here, 38,597,376 in GPT-2 small): GPT-2's "
            "readout is tied, logits = x @ self.wte.weight.T, with no lm_head",
        )
    n_learner = sum(p.numel() for p in model.parameters())
    n_ref = sum(p.numel() for p in ref.parameters())
    if n_learner != n_ref:
        raise core.CheckFailed(
            EX_MODULE,
            f"your model has {n_learner:,} parameters, the reference "
            f"{n_ref:,} for this config; compare your layers with the list above",
        )

    state = ref.state_dict()
    try:
        result = model.load_state_dict(state, strict=False)
    except RuntimeError as exc:
        raise core.CheckFailed(
            EX_MODULE, f"the reference weights do not fit your model: {exc}"
        ) from None
    loaded = {id(p) for n, p in model.named_parameters() if n in state}
    not_loaded = [
        n
        for n in result.missing_keys
        if n in dict(model.named_parameters()) and id(model.get_parameter(n)) not in loaded
    ]
    if result.unexpected_keys or not_loaded:
        raise core.CheckFailed(
            EX_MODULE,
            "parameter names differ from GPT-2's: your model lacks "
            f"{result.unexpected_keys[:4]} and has {not_loaded[:4]}; use Block(config) "
            f"for the blocks and the names {', '.join(_NAMES)}",
        )
    model.eval()

    torch.manual_seed(1)
    cases = [
        torch.randint(0, config.n_positions, (2, 9)),  # ids small enough to be positions too
        torch.randint(0, V, (config.n_positions, 3)).T,  # the full context, a non-contiguous view
        torch.randint(0, V, (1, 1)),  # a single token
    ]
    for idx in cases:
        with torch.no_grad():
            got = core.call_learner(
                EX_MODULE, model.forward, idx
            )  # forward: so a wrong signature is named
            want = _right(ref, idx)
        if isinstance(got, torch.Tensor) and tuple(got.shape) == tuple(idx.shape) + (C,):
            raise core.CheckFailed(
                EX_MODULE,
                f"your output has shape {tuple(got.shape)} = (B, T, n_embd): "
                "the readout is missing; multiply by self.wte.weight.T to get "
                "(B, T, vocab_size)",
            )
        with torch.no_grad():
            mistake = (
                None
                if core.close(got, want, atol=1e-4, rtol=1e-4)
                else core.first_mistake(
                    MODULE_MISTAKES, lambda m: core.close(got, m.fn(ref, idx), atol=1e-4, rtol=1e-4)
                )
            )
        if mistake is not None:
            raise core.CheckFailed(EX_MODULE, mistake.message)
        got = core.expect_tensor(
            EX_MODULE,
            got,
            tuple(want.shape),
            what=f"for idx of shape {tuple(idx.shape)} your output",
        )
        with torch.no_grad():
            if not torch.equal(got, core.call_learner(EX_MODULE, model.forward, idx).double()):
                raise core.CheckFailed(
                    EX_MODULE,
                    "in eval mode two calls gave different logits: use "
                    "nn.Dropout (it switches off in .eval()), not F.dropout(x, p) alone",
                )
        if core.close(got, want, atol=1e-4, rtol=1e-4):
            continue
        worst = (got - want.double()).abs().max().item()
        raise core.CheckFailed(
            EX_MODULE,
            f"for idx of shape {tuple(idx.shape)} your logits differ "
            f"from the reference by up to {worst:.4g}; the order is: wte(idx) + "
            "wpe(arange(T)), dropout, every block, ln_f, @ wte.weight.T",
        )
    _check_dropout(model_cls)
    core.passed(EX_MODULE, "same logits as gpt2lib.GPT2, readout tied to wte")


# --------------------------------------------------------------------------- Exercise 6.3


def _std_of(params):
    flat = torch.cat([p.detach().reshape(-1) for p in params])
    return flat.std().item(), flat.mean().item()


# fn(n_layer) -> the std a wrong scaling gives the residual projections (attn.c_proj, mlp.c_proj)
INIT_SCALE_MISTAKES = [
    core.Mistake(
        "1/sqrt(n_layer)",
        "are scaled by 1/√n_layer: it is 1/√(2 · n_layer), since every block "
        "adds TWO updates to the residual stream (attention and MLP)",
        lambda n_layer: 0.02 / math.sqrt(n_layer),
    ),
    core.Mistake(
        "1/(2 n_layer)",
        "are scaled by 1/(2 · n_layer): take the square root, 0.02 / √(2 · "
        "n_layer) (random updates add up as √count)",
        lambda n_layer: 0.02 / (2 * n_layer),
    ),
    core.Mistake(
        "GPT-2 small's depth",
        "look scaled for GPT-2 small's 12 layers: use the model's own depth, model.config.n_layer",
        lambda n_layer: 0.02 / math.sqrt(2 * 12),
    ),
    core.Mistake(
        "1/sqrt(2) only",
        "are scaled by 1/√2 only: divide by √(2 · n_layer), the number of "
        "updates the residual stream sums over the whole model",
        lambda n_layer: 0.02 / math.sqrt(2),
    ),
]


def check_init_gpt2_weights(init_fn) -> None:
    """Exercise 6.3: `init_fn(model)` sets a gpt2lib.GPT2's weights as GPT-2 does, in place."""
    from gpt2lib.chapters.model import GPT2

    n_layer = 6  # not GPT-2 small's 12, so a hard-coded 12 shows
    config = _config(vocab_size=1000, n_positions=64, n_embd=64, n_layer=n_layer, n_head=4)
    torch.manual_seed(0)
    model = GPT2(config)
    fill = 0.5
    with torch.no_grad():
        for p in model.parameters():
            p.fill_(fill)
    torch.manual_seed(0)
    with torch.no_grad():
        returned = core.call_learner(EX_INIT, init_fn, model)
    if (
        isinstance(returned, nn.Module)
        and returned is not model
        and all((p == fill).all() for p in model.parameters())
    ):
        raise core.CheckFailed(
            EX_INIT,
            "your function returned a new model and left the one it was "
            "given unchanged; set the weights of `model` itself, in place "
            "(nn.init.normal_(module.weight, ...) changes the tensor it is given)",
        )
    named = dict(model.named_parameters())

    def group(predicate):
        return [p for n, p in named.items() if predicate(n)]

    def is_layer_norm(n):
        return ".ln_" in n or n.startswith("ln_f")

    for n, p in named.items():
        if is_layer_norm(n) and not torch.all(p == (1.0 if n.endswith(".weight") else 0.0)):
            raise core.CheckFailed(
                EX_INIT,
                f"{n} is not {'all ones' if n.endswith('.weight') else 'zero'}: "
                "a LayerNorm starts with gain (weight) 1 and bias 0, a plain "
                "normalisation",
            )
    for n, p in named.items():
        if n.endswith(".bias") and not torch.all(p == 0):
            raise core.CheckFailed(EX_INIT, f"{n} is not zero: the layers' biases start at 0")
    for n, p in named.items():
        if torch.all(p == fill):
            raise core.CheckFailed(
                EX_INIT,
                f"{n} still holds the value it had before your function "
                "ran: every parameter must be set (see the list in the exercise)",
            )

    expected = 0.02
    groups = {
        "the token embedding wte": group(lambda n: n == "wte.weight"),
        "the position embedding wpe": group(lambda n: n == "wpe.weight"),
        "attn.c_attn weights": group(lambda n: n.endswith("attn.c_attn.weight")),
        "mlp.c_fc weights": group(lambda n: n.endswith("mlp.c_fc.weight")),
    }
    for label, params in groups.items():
        std, mean = _std_of(params)
        if abs(std - math.sqrt(expected)) < 0.1 * math.sqrt(expected):
            raise core.CheckFailed(
                EX_INIT,
                f"{label} have std {std:.4f} = √0.02: 0.02 is the standard "
                "deviation, not the variance (nn.init.normal_(w, mean=0.0, std=0.02))",
            )
        if abs(std - expected) > 0.1 * expected:
            raise core.CheckFailed(
                EX_INIT, f"{label} have std {std:.4f}; GPT-2 uses std 0.02 for them"
            )
        if abs(mean) > 0.2 * expected:
            raise core.CheckFailed(EX_INIT, f"{label} have mean {mean:.4f}; draw them around 0")

    resid = expected / math.sqrt(2 * n_layer)

    def near(value, target):
        return abs(value - target) <= 0.1 * target

    stds = {
        w: _std_of(group(lambda n, w=w: n.endswith(w + ".weight")))
        for w in ("attn.c_proj", "mlp.c_proj")
    }
    right = {w: near(std, resid) and abs(mean) <= 0.2 * resid for w, (std, mean) in stds.items()}
    if all(right.values()):
        core.passed(EX_INIT, f"std 0.02, residual projections {resid:.4f} for n_layer={n_layer}")
        return
    if sum(right.values()) == 1:
        good = next(w for w, ok in right.items() if ok)
        bad = next(w for w, ok in right.items() if not ok)
        if near(stds[bad][0], expected):
            raise core.CheckFailed(
                EX_INIT,
                f"only {good} is scaled, {bad} is not: both write into the "
                "residual stream, so both use std 0.02 / √(2 · n_layer)",
            )
    where = next(w for w, ok in right.items() if not ok)
    std, mean = stds[where]
    if near(std, expected):
        raise core.CheckFailed(
            EX_INIT,
            "the residual projections (attn.c_proj, mlp.c_proj) are not "
            f"scaled (std {std:.4f}): use std 0.02 / √(2 · n_layer), because the "
            "residual stream adds up 2 · n_layer of their outputs",
        )
    mistake = core.first_mistake(INIT_SCALE_MISTAKES, lambda m: near(std, m.fn(n_layer)))
    if mistake is not None:
        raise core.CheckFailed(
            EX_INIT, f"{where} weights have std {std:.4f}: they " + mistake.message
        )
    raise core.CheckFailed(
        EX_INIT,
        f"{where} weights have std {std:.4f} (mean {mean:.4f}); expected "
        f"0.02 / √(2 · {n_layer}) = {resid:.4f}",
    )


# --------------------------------------------------------------------------- Exercise 6.5


def _right_count(config):
    V, P, C, L = config.vocab_size, config.n_positions, config.n_embd, config.n_layer
    return V * C + P * C + L * (12 * C * C + 13 * C) + 2 * C


def _count_mistake(name, message, delta):
    """A wrong count: the right one plus delta(V, P, C, L)."""
    return core.Mistake(
        name,
        message,
        lambda config: (
            _right_count(config)
            + delta(config.vocab_size, config.n_positions, config.n_embd, config.n_layer)
        ),
    )


# fn(config) -> the count a wrong formula gives
COUNT_MISTAKES = [
    _count_mistake(
        "untied readout",
        "you counted the readout as well as wte: the readout is TIED to "
        "the token table (logits = x @ wte.weight.T), so it adds no parameters",
        lambda V, P, C, L: V * C,
    ),
    _count_mistake(
        "no ln_f",
        "the final LayerNorm ln_f (2 · n_embd: gain and bias) is missing",
        lambda V, P, C, L: -2 * C,
    ),
    _count_mistake(
        "no wpe",
        "the position embedding table wpe (n_positions × n_embd) is missing",
        lambda V, P, C, L: -P * C,
    ),
    _count_mistake(
        "no biases",
        "the biases of c_attn, c_proj, c_fc and the MLP's c_proj "
        "(3C + C + 4C + C per block) are missing",
        lambda V, P, C, L: -9 * C * L,
    ),
    _count_mistake(
        "no block LayerNorms",
        "the blocks' two LayerNorms (ln_1 and ln_2, 2 · n_embd each) are missing",
        lambda V, P, C, L: -4 * C * L,
    ),
    _count_mistake(
        "no LayerNorms",
        "all LayerNorm parameters (ln_1, ln_2 per block and ln_f) are missing",
        lambda V, P, C, L: -4 * C * L - 2 * C,
    ),
    _count_mistake(
        "weights only",
        "only the weight matrices are counted: add the biases and the LayerNorms",
        lambda V, P, C, L: -9 * C * L - 4 * C * L - 2 * C,
    ),
    _count_mistake(
        "one block",
        "only ONE block is counted: there are n_layer of them, each with its own weights",
        lambda V, P, C, L: -(L - 1) * (12 * C * C + 13 * C),
    ),
    _count_mistake(
        "MLP without expansion",
        "the MLP is counted as n_embd → n_embd → n_embd: its hidden layer is 4 · n_embd wide",
        lambda V, P, C, L: -L * (6 * C * C + 3 * C),
    ),
    _count_mistake(
        "MLP c_proj as n × n",
        "the MLP's c_proj is counted as n_embd × n_embd: it brings "
        "the 4 · n_embd hidden values back to n_embd, so its weight is 4 · n_embd × n_embd "
        "(only attention's c_proj is n_embd × n_embd)",
        lambda V, P, C, L: -3 * C * C * L,
    ),
    _count_mistake(
        "one LayerNorm per block",
        "each block has TWO LayerNorms, ln_1 before attention "
        "and ln_2 before the MLP, with 2 · n_embd parameters each",
        lambda V, P, C, L: -2 * C * L,
    ),
    _count_mistake(
        "LayerNorm without bias",
        "a LayerNorm has a gain (weight) AND a bias: 2 · n_embd parameters, not n_embd",
        lambda V, P, C, L: -(2 * L + 1) * C,
    ),
    _count_mistake(
        "c_attn as n × n",
        "c_attn maps n_embd to 3 · n_embd (q, k and v in one layer), "
        "so it has n_embd · 3 · n_embd weights and 3 · n_embd biases",
        lambda V, P, C, L: -L * (2 * C * C + 2 * C),
    ),
    _count_mistake(
        "no attention c_proj",
        "attention's output projection c_proj (n_embd × n_embd and n_embd biases) is missing",
        lambda V, P, C, L: -L * (C * C + C),
    ),
]


@functools.cache
def _meta_count(config_items) -> int:
    """Parameters of gpt2lib.GPT2 for a config, counted on the meta device (no memory)."""
    from gpt2lib.chapters.config import GPT2Config
    from gpt2lib.chapters.model import GPT2

    with torch.device("meta"):
        return sum(p.numel() for p in GPT2(GPT2Config(**dict(config_items))).parameters())


def check_count_gpt2_parameters(count_fn) -> None:
    """Exercise 6.5: `count_fn(config)` returns the parameter count from the sizes alone."""
    from gpt2lib.chapters.config import GPT2Config

    configs = [GPT2Config.from_name(name) for name in GPT2Config.SIZES]
    configs += [
        _config(vocab_size=101, n_positions=7, n_embd=48, n_layer=1, n_head=3),
        _config(vocab_size=5, n_positions=3, n_embd=4, n_layer=3, n_head=2),
    ]
    for config in configs:
        want = _meta_count(tuple(sorted(vars(config).items())))
        got = core.call_learner(EX_COUNT, count_fn, config)
        if isinstance(got, bool) or not isinstance(got, numbers.Real):
            raise core.CheckFailed(EX_COUNT, f"return a number (an int), got {type(got).__name__}")
        if got == want:
            continue
        sizes = (
            f"vocab_size={config.vocab_size}, n_positions={config.n_positions}, "
            f"n_embd={config.n_embd}, n_layer={config.n_layer}"
        )
        if config is not configs[0] and got == _meta_count(tuple(sorted(vars(configs[0]).items()))):
            raise core.CheckFailed(
                EX_COUNT,
                f"for {sizes} you return GPT-2 small's count, 124,439,808; "
                "compute it from the config's fields (config.n_embd, config.n_layer, ...)",
            )
        assert _right_count(config) == want, "the check's formula disagrees with gpt2lib.GPT2"
        mistake = core.first_mistake(COUNT_MISTAKES, lambda m: m.fn(config) == got)
        if mistake is not None:
            raise core.CheckFailed(
                EX_COUNT, f"for {sizes} you get {got:,}, the model has {want:,}: " + mistake.message
            )
        raise core.CheckFailed(
            EX_COUNT,
            f"for {sizes} you get {got:,}, the model has {want:,} "
            f"(off by {got - want:+,}); go through the parts listed in the exercise",
        )
    core.passed(EX_COUNT, "right for gpt2, gpt2-medium, gpt2-large, gpt2-xl and two odd sizes")


# --------------------------------------------------------------------------- Exercise 6.6


def _memory(n_params, bytes_per_number, gradients=1, optimizer=2, scale=1):
    weights = n_params * bytes_per_number * scale
    parts = {"weights": weights, "gradients": gradients * weights, "optimizer": optimizer * weights}
    return {**parts, "total": sum(parts.values())}


# fn(n_params, bytes_per_number) -> the dict a wrong answer returns
MEMORY_MISTAKES = [
    core.Mistake(
        "one optimizer state",
        "your optimizer state is one number per parameter: AdamW keeps "
        "TWO, the running average of the gradient (exp_avg) and of its square (exp_avg_sq)",
        lambda n, b: _memory(n, b, optimizer=1),
    ),
    core.Mistake(
        "no gradients",
        "the gradients are missing: loss.backward() stores one gradient per "
        "parameter, as big as the weights",
        lambda n, b: _memory(n, b, gradients=0),
    ),
    core.Mistake(
        "optimizer with gradients",
        "your optimizer state is three numbers per parameter: AdamW "
        "keeps two (exp_avg, exp_avg_sq); the gradient has its own entry",
        lambda n, b: _memory(n, b, optimizer=3),
    ),
    core.Mistake(
        "bits",
        "your counts are in bits (×8): the answer is in bytes, n_params × bytes_per_number",
        lambda n, b: _memory(n, b, scale=8),
    ),
    core.Mistake(
        "fixed 4 bytes",
        "your counts ignore bytes_per_number (they assume 4, float32): use the "
        "argument, 2 for bfloat16, 8 for float64",
        lambda n, b: _memory(n, 4),
    ),
]


def _check_measured(measured, model, optimizer) -> None:
    """The notebook's `measured` dict against the tensors of the model and optimizer it names."""
    params = list(model.parameters())
    state = [t for s in optimizer.state.values() for t in s.values() if torch.is_tensor(t)]
    steps = sum(
        t.numel() * t.element_size()
        for s in optimizer.state.values()
        for n, t in s.items()
        if n == "step"
    )
    want = {
        "weights": sum(p.numel() * p.element_size() for p in params),
        "gradients": sum(
            p.grad.numel() * p.grad.element_size() for p in params if p.grad is not None
        ),
        "optimizer": sum(t.numel() * t.element_size() for t in state) - steps,
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
    for n_params, bytes_per_number in ((124_439_808, 4), (1_000, 2), (7, 8)):
        got = core.call_learner(
            EX_MEMORY, training_memory, n_params, bytes_per_number=bytes_per_number
        )
        if not isinstance(got, dict):
            raise core.CheckFailed(
                EX_MEMORY,
                f"return a dict with the keys {', '.join(keys)}; got {type(got).__name__}",
            )
        missing = [k for k in keys if k not in got]
        if missing:
            raise core.CheckFailed(
                EX_MEMORY,
                f"your dict lacks the key(s) {', '.join(map(repr, missing))}: "
                f"use exactly {', '.join(map(repr, keys))}",
            )
        for key in keys:
            value = got[key]
            if isinstance(value, bool) or not isinstance(value, numbers.Real):
                raise core.CheckFailed(
                    EX_MEMORY,
                    f"got[{key!r}] should be a number of bytes, got {type(value).__name__}",
                )
        want = _memory(n_params, bytes_per_number)
        if all(got[k] == want[k] for k in keys):
            continue
        case = f"for {n_params:,} parameters of {bytes_per_number} bytes"
        if got["total"] != got["weights"] + got["gradients"] + got["optimizer"] and all(
            got[k] == want[k] for k in keys[:3]
        ):
            raise core.CheckFailed(
                EX_MEMORY,
                f"{case}, 'total' is {got['total']:,}, but it should be the "
                "sum of the other three, weights + gradients + optimizer",
            )
        mistake = core.first_mistake(
            MEMORY_MISTAKES,
            lambda m: all(got[k] == m.fn(n_params, bytes_per_number)[k] for k in keys),
        )
        if mistake is not None:
            raise core.CheckFailed(EX_MEMORY, f"{case}: " + mistake.message)
        wrong = next(k for k in keys if got[k] != want[k])
        if got[wrong] * 2**20 == want[wrong] or got[wrong] * 2**30 == want[wrong]:
            raise core.CheckFailed(
                EX_MEMORY,
                f"{case}, your {wrong!r} looks converted to MiB or GiB: "
                "return bytes (divide by 2**20 only to print)",
            )
        raise core.CheckFailed(
            EX_MEMORY, f"{case}, {wrong!r} should be {want[wrong]:,} bytes, got {got[wrong]:,}"
        )
    core.passed(EX_MEMORY, "weights + gradients + AdamW's two states = 4 copies of the weights")


# --------------------------------------------------------------------------- Challenge

CHALLENGE_BUDGET = "Challenge (the largest GPT-2 you can train in 1 GiB)"
BUDGET = dict(bytes=2**30, min_params=50_000_000, min_layers=8, vocab_size=50257, n_positions=1024)


def check_budget_config(config) -> int:
    """The challenge: a GPT2Config with GPT-2's vocabulary and context, at least 8 blocks, whose
    float32 weights + gradients + AdamW state (16 bytes a parameter) fit in 1 GiB, with at least
    50 million parameters. Counts a model built on the meta device; returns the count."""
    from gpt2lib.chapters.config import GPT2Config
    from gpt2lib.chapters.model import GPT2

    if not isinstance(config, GPT2Config):
        raise core.CheckFailed(CHALLENGE_BUDGET, f"give a GPT2Config, got {type(config).__name__}")
    for name in ("vocab_size", "n_positions"):
        if getattr(config, name) != BUDGET[name]:
            raise core.CheckFailed(
                CHALLENGE_BUDGET,
                f"keep GPT-2's {name} = {BUDGET[name]:,}; got {getattr(config, name):,}",
            )
    if config.n_layer < BUDGET["min_layers"]:
        raise core.CheckFailed(
            CHALLENGE_BUDGET,
            f"n_layer = {config.n_layer}: the goal asks for at least {BUDGET['min_layers']} blocks",
        )
    with torch.device("meta"):
        n = sum(p.numel() for p in GPT2(config).parameters())
    state = 16 * n  # float32 weights, gradients, AdamW's exp_avg and exp_avg_sq
    share = config.vocab_size * config.n_embd / n
    if state > BUDGET["bytes"]:
        raise core.CheckFailed(
            CHALLENGE_BUDGET,
            f"{n:,} parameters need {state / 2**30:.2f} GiB of training "
            "state, more than 1 GiB: make the model narrower or shallower",
        )
    if n < BUDGET["min_params"]:
        raise core.CheckFailed(
            CHALLENGE_BUDGET,
            f"{n:,} parameters ({state / 2**30:.2f} GiB) fit, but the goal is "
            f"at least {BUDGET['min_params']:,}: there is room for more",
        )
    core.passed(
        CHALLENGE_BUDGET,
        f"{n:,} parameters, {state / 2**30:.3f} GiB of training state, "
        f"token table {share:.1%} of the model",
    )
    return n


# --------------------------------------------------------------------------- Exercise 6.8

# fn(model, idx) -> the logits that wrong version gives; the planted bugs first, then Exercise 6.1's
FORWARD_MISTAKES = [
    core.Mistake(
        "both_planted_bugs",
        "both planted bugs are still there: the positions start at 1 and each "
        "block's output is added to the stream a second time",
        lambda m, idx: _by_hand(m, idx, start=1, residual_twice=True),
    ),
    *MODULE_MISTAKES,
]


def check_forward_by_hand(forward_by_hand) -> None:
    """`forward_by_hand(model, idx)` equals `model(idx)` for a gpt2lib.GPT2 in eval mode, on two sizes
    and several lengths (the full context included)."""
    for n_layer, n_embd in ((2, 32), (3, 16)):
        # ids below n_positions, so that looking ids up as positions is a wrong answer, not a crash
        config = _config(vocab_size=16, n_positions=16, n_embd=n_embd, n_layer=n_layer, n_head=4)
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
                        f"for T={T} = n_positions your forward reads a position the "
                        "table does not have: positions are 0 .. T-1, torch.arange(T)",
                    ) from None
            got = core.expect_tensor(
                EX_DEBUG, got, tuple(want.shape), what=f"your logits for T={T}"
            )
            if core.close(got, want, atol=1e-4, rtol=1e-4):
                continue
            with torch.no_grad():
                found = core.first_mistake(
                    FORWARD_MISTAKES,
                    lambda m: core.close(got, m.fn(model, idx), atol=1e-4, rtol=1e-4),
                )
            if found:
                raise core.CheckFailed(EX_DEBUG, found.message)
            raise core.CheckFailed(
                EX_DEBUG,
                f"for T={T} your logits differ from model(idx) by up to "
                f"{(got - want.double()).abs().max().item():.4g}",
            )
    core.passed(
        EX_DEBUG, "equal to model(idx): positions from 0, each block's output is the new stream"
    )


# checks whose planted mistakes have the exercise's own signature (tests/check_cases.planted)


MISTAKES_BY_CHECK = {check_forward_by_hand: FORWARD_MISTAKES}
