"""Generating text: `generate`, `decode_tokens`, `stream_text`, `sample_next`, `next_token_probs`.

Hand-written (not generated). Chapter 9's learner writes the plain pieces in
`gpt2lib.decoding` (the filters, a sampling step, the cache's buffers, a decode loop); this
module is the entry point around them. `generate` validates its arguments once, then runs the
one decoding loop (`decode_steps`) through the model's own forward: its modules, its hooks and
any module a learner or an experimenter replaced. It never changes the model's train/eval mode
(a model in training mode gets a warning: dropout is on), nor the caller's grad mode as seen
between steps.
"""

__all__ = [
    "cache_reaches_every_layer",
    "check_sampling_args",
    "decode_all",
    "decode_steps",
    "decode_tokens",
    "generate",
    "next_token_probs",
    "sample_next",
    "stream_text",
]


import codecs
import inspect
import operator
import warnings
from collections.abc import Iterator
from typing import Protocol

import torch
import torch.nn as nn
from torch import Tensor

from gpt2lib import speed
from gpt2lib.chapters.decoding import apply_temperature, top_k_filter, top_p_filter
from gpt2lib.kvcache import KVCache
from gpt2lib.speed import kernels
from gpt2lib.validation import ENDOFTEXT_ID, check_real, check_token_ids, check_whole


def check_sampling_args(
    temperature: float = 1.0, top_k: int | None = None, top_p: float | None = None
) -> tuple[float, int | None, float | None]:
    """Raise a clear error for settings that have no meaning; return them as plain numbers.

    numpy scalars are accepted (np.float32(0.7), np.int64(40)).
    """
    temperature = check_real("temperature", temperature, 0, why=" (0 means greedy)")
    if top_k is not None:
        top_k = check_whole("top_k", top_k, 1, why=" (1 is greedy; None keeps every token)")
    if top_p is not None:
        top_p = check_real("top_p", top_p, 0, 1, low_inclusive=False, why=" (1 keeps every token)")
    return temperature, top_k, top_p


def _probs(logits, temperature, top_k, top_p):  # arguments already checked
    logits = logits.float()
    if temperature == 0:
        return torch.nn.functional.one_hot(logits.argmax(-1), logits.shape[-1]).float()
    if temperature < 1e-30:  # logits / temperature would overflow float32: shift, then float64
        logits = (logits - logits.amax(-1, keepdim=True)).double()
    logits = apply_temperature(logits, temperature)
    if top_k is not None and top_k < logits.shape[-1]:
        logits = top_k_filter(logits, top_k)
    if top_p is not None and top_p < 1:  # a p too small for the dtype would drop every token
        logits = top_p_filter(logits, max(top_p, torch.finfo(logits.dtype).tiny))
    return torch.softmax(logits, dim=-1).float()


def _sample(logits, temperature, top_k, top_p, generator):  # arguments already checked
    if temperature == 0:
        return logits.argmax(dim=-1)
    probs = _probs(logits, temperature, top_k, top_p)
    return torch.multinomial(probs, 1, generator=generator).squeeze(-1)


def next_token_probs(
    logits: Tensor, temperature: float = 1.0, top_k: int | None = None, top_p: float | None = None
) -> Tensor:
    """The distribution that sampling draws from: temperature, then top-k, then top-p.

    logits (..., V) -> probabilities (..., V) in float32. temperature=0 puts all mass on the
    argmax (greedy).
    """
    return _probs(logits, *check_sampling_args(temperature, top_k, top_p))


def sample_next(
    logits: Tensor,
    temperature: float = 1.0,
    top_k: int | None = None,
    top_p: float | None = None,
    generator: torch.Generator | None = None,
) -> Tensor:
    """One token per row: logits (B, V) -> ids (B,). Greedy (argmax) when temperature == 0."""
    return _sample(logits, *check_sampling_args(temperature, top_k, top_p), generator)


def _check_prompt(model, idx, max_new_tokens):
    # chapter 2's validator: type, shape, vocabulary (the one host read of a generation)
    check_token_ids(idx, model.config)
    if isinstance(max_new_tokens, bool):
        raise TypeError("max_new_tokens must be an int >= 0, got a bool")
    try:
        max_new_tokens = operator.index(max_new_tokens)
    except TypeError:
        raise TypeError(f"max_new_tokens must be an int >= 0, got {max_new_tokens!r}") from None
    if max_new_tokens < 0:
        raise ValueError(f"max_new_tokens must be >= 0, got {max_new_tokens}")
    config = model.config
    T = idx.shape[1]
    if T + max_new_tokens > config.n_positions:
        raise ValueError(
            f"prompt of {T} tokens + max_new_tokens={max_new_tokens} = {T + max_new_tokens} is "
            f"more than the model's context of {config.n_positions} positions (n_positions); "
            + (
                f"keep only the last {config.n_positions - max_new_tokens} prompt tokens or ask "
                "for fewer new ones"
                if max_new_tokens < config.n_positions
                else f"max_new_tokens must be below {config.n_positions}"
            )
        )
    return max_new_tokens


def _prepare(
    model,
    idx,
    max_new_tokens,
    temperature,
    top_k,
    top_p,
    use_cache,
    generator,
    seed,
    eos_token_id,
    stop_at_eos,
    compile,
):
    """Every argument checked once, before any work: returns the plan of one generation."""
    device = next(model.parameters()).device
    if isinstance(idx, torch.Tensor) and idx.device != device:
        idx = idx.to(device)
    max_new_tokens = _check_prompt(model, idx, max_new_tokens)
    idx = idx.long()  # any integer dtype passed the check; the lookups and outputs use int64
    sampling = check_sampling_args(temperature, top_k, top_p)
    vocab = model.config.vocab_size
    if stop_at_eos and eos_token_id is None:
        eos_token_id = ENDOFTEXT_ID
    if eos_token_id is not None:
        eos_token_id = check_whole(
            "eos_token_id", eos_token_id, 0, vocab - 1, why=" (an id of the model's vocabulary)"
        )
    if generator is not None and seed is not None:
        raise ValueError("pass either generator or seed, not both")
    if generator is not None:
        if not isinstance(generator, torch.Generator):
            raise TypeError(f"generator must be a torch.Generator, got {type(generator).__name__}")
        if generator.device.type != device.type:
            raise ValueError(
                f"generator is on {generator.device} but the model is on {device}: "
                f"make it with torch.Generator(device={str(device)!r})"
            )
    if seed is not None:
        seed = check_whole("seed", seed, 0, 2**64 - 1)
        generator = torch.Generator(device=device).manual_seed(seed)
    for name, flag in (
        ("use_cache", use_cache),
        ("stop_at_eos", stop_at_eos),
        ("compile", compile),
    ):
        if not isinstance(flag, bool):
            raise TypeError(f"{name} must be True or False, got {flag!r}")
    if model.training:
        warnings.warn(
            "generate: the model is in training mode, so dropout is on and the tokens "
            "are noisier; call model.eval() first (generate leaves the mode to you)",
            stacklevel=3,
        )
    if compile and device.type != "cuda":
        warnings.warn(
            f"compile=True captures a CUDA graph, which needs a CUDA device; on "
            f"{device.type} the model runs eagerly",
            stacklevel=3,
        )
    return dict(
        model=model,
        idx=idx,
        max_new_tokens=max_new_tokens,
        sampling=sampling,
        generator=generator,
        eos_token_id=eos_token_id,
        use_cache=use_cache,
        compile=compile and device.type == "cuda",
    )


def _takes(fn, name):
    """Whether fn accepts the keyword argument `name` (by name or through **kwargs)."""
    try:
        params = inspect.signature(fn).parameters.values()
    except (TypeError, ValueError):
        return False
    return any(p.name == name or p.kind is p.VAR_KEYWORD for p in params)


def cache_reaches_every_layer(model: nn.Module) -> bool:
    """Whether model(ids, kv_cache=...) can hand the cache to every block and its attention.

    A learner's block or attention without a kv_cache argument (chapters 3 and 5 allow it) makes
    generation fall back to full forward passes: the same tokens, without the cache.
    """
    blocks = getattr(model, "h", None)
    if not _takes(model.forward, "kv_cache") or blocks is None:
        return False
    for block in blocks:
        attn = getattr(block, "attn", None)
        if not _takes(block.forward, "kv_cache") or (
            attn is not None and not _takes(attn.forward, "kv_cache")
        ):
            return False
    return True


def _sample_on(generator, logits, sampling):
    """_sample, drawn where the generator lives (chapter 7 lets a CPU generator drive a GPU)."""
    if generator is not None and generator.device != logits.device and sampling[0] != 0:
        return _sample(logits.to(generator.device), *sampling, generator).to(logits.device)
    return _sample(logits, *sampling, generator)


def decode_steps(
    model: nn.Module,
    idx: Tensor,
    max_new_tokens: int,
    sampling: tuple[float, int | None, float | None] = (1.0, None, None),
    generator: torch.Generator | None = None,
    eos_token_id: int | None = None,
    use_cache: bool = True,
    compile: bool = False,
    out: Tensor | None = None,
    crop: bool = False,
    static: bool | None = None,
) -> Iterator[Tensor]:
    """The generation loop, for arguments already checked: yields each new token (B,).

    Every step calls the model's own forward: the prompt once (the prefill), then the new
    token with the cache, or, without one, the whole sequence again (only its last
    n_positions tokens if crop=True, chapter 7's sampler). sampling: (temperature, top_k,
    top_p). compile=True (CUDA) captures the decode step as a graph over a static cache;
    static=True alone runs that static cache's steps eagerly (any device; the default follows
    compile). `out` (B, T + max_new_tokens) receives the prompt and the tokens. Gradients are off
    only inside each computation, never across a `yield`.
    """
    device = idx.device
    B, T = idx.shape
    if out is None:
        out = torch.empty(B, T + max_new_tokens, dtype=torch.long, device=device)
    out[:, :T] = idx
    if max_new_tokens == 0:
        return
    context = model.config.n_positions
    last_only = {"last_only": True} if _takes(model.forward, "last_only") else {}
    cache = step = None
    with torch.no_grad():
        if use_cache and cache_reaches_every_layer(model):
            static = compile if static is None else static
            cache = KVCache.for_model(model, B, T + max_new_tokens, static=static)
            logits = model(out[:, :T], kv_cache=cache, **last_only)[:, -1]  # (B, V)
            if (
                compile and static and max_new_tokens > 1
            ):  # one decode step, captured as a CUDA graph
                step = speed.capture_decode_step(model, cache, B, **last_only)
        else:
            logits = model(out[:, max(0, T - context) if crop else 0 : T], **last_only)[:, -1]
        finished = torch.zeros(B, dtype=torch.bool, device=device)
    for i in range(max_new_tokens):
        with torch.no_grad():
            token = _sample_on(generator, logits, sampling)  # (B,)
            if eos_token_id is not None:
                token = token.masked_fill(finished, eos_token_id)
                finished |= token == eos_token_id
            pos = T + i
            out[:, pos] = token
        yield token
        if i == max_new_tokens - 1:
            return
        # the one value read on the host in the loop, and only with an EOS id: have all stopped?
        if eos_token_id is not None and bool(finished.all()):
            return
        with torch.no_grad():
            if step is not None:  # replay the captured step
                logits = step(out[:, pos])
            elif cache is not None:  # feed only the new token
                logits = model(out[:, pos : pos + 1], kv_cache=cache, **last_only)[:, -1]
            else:  # no cache: run the whole sequence again
                first = max(0, pos + 1 - context) if crop else 0
                logits = model(out[:, first : pos + 1], **last_only)[:, -1]


def decode_all(model: nn.Module, idx: Tensor, max_new_tokens: int, **loop) -> Tensor:
    """Run decode_steps to the end: the prompt followed by the new tokens, (B, T + made)."""
    B, T = idx.shape
    out = torch.empty(B, T + max_new_tokens, dtype=torch.long, device=idx.device)
    made = sum(1 for _ in decode_steps(model, idx, max_new_tokens, out=out, **loop))
    return out[:, : T + made]


def _decoding_model(model, device):
    """The model, or a view of it with the split multiplies where a measurement kept on disk
    says they pay on this CPU (gpt2lib.speed.tune); the model itself is never changed, and
    nothing is measured here."""
    if device.type == "cpu" and torch.get_num_threads() > 1 and kernels.split_measured_faster():
        return speed.fast_view(model)
    return model


def decode_tokens(
    model: nn.Module,
    idx: Tensor,
    max_new_tokens: int,
    *,
    temperature: float = 1.0,
    top_k: int | None = None,
    top_p: float | None = None,
    use_cache: bool = True,
    generator: torch.Generator | None = None,
    seed: int | None = None,
    eos_token_id: int | None = None,
    stop_at_eos: bool = False,
    compile: bool = False,
    out: Tensor | None = None,
) -> Iterator[Tensor]:
    """An iterator over the new tokens, one step at a time, each (B,): generate() step by step.

    The arguments are checked now, before the first step. If `out` (a (B, T + max_new_tokens)
    long tensor) is given, the prompt and tokens are written into it as they are produced.
    """
    plan = _prepare(
        model,
        idx,
        max_new_tokens,
        temperature,
        top_k,
        top_p,
        use_cache,
        generator,
        seed,
        eos_token_id,
        stop_at_eos,
        compile,
    )
    if out is not None:
        B, T = plan["idx"].shape
        if (
            not isinstance(out, torch.Tensor)
            or out.dtype != torch.long
            or tuple(out.shape) != (B, T + plan["max_new_tokens"])
        ):
            raise ValueError(
                f"out must be a long tensor of shape {(B, T + plan['max_new_tokens'])}"
            )
    plan["model"] = _decoding_model(model, plan["idx"].device)
    return decode_steps(**plan, out=out)


def generate(
    model: nn.Module,
    idx: Tensor,
    max_new_tokens: int,
    temperature: float = 1.0,
    top_k: int | None = None,
    top_p: float | None = None,
    use_cache: bool = True,
    generator: torch.Generator | None = None,
    seed: int | None = None,
    eos_token_id: int | None = None,
    stop_at_eos: bool = False,
    compile: bool = False,
) -> Tensor:
    """Continue each prompt: idx (B, T) -> (B, T + new), the prompt followed by new tokens.

    temperature: 0 is greedy (argmax); otherwise sample from softmax(logits / temperature),
      restricted to the top_k most likely tokens and/or the top_p nucleus.
    generator / seed: make sampling repeatable (one or the other).
    use_cache: reuse keys and values (KVCache); False recomputes the whole sequence each step
      (same tokens, slower).
    stop_at_eos / eos_token_id: stop a sequence once it produces <|endoftext|> (50256, or the
      id given). Sequences that stopped are padded with that id until every sequence has
      stopped or max_new_tokens are made; the result can then be shorter than T + new.
    compile: on CUDA, capture the model's decode step (its own forward, at a position held in a
      tensor) as a CUDA graph and replay it; elsewhere a warning, and eager steps.
    Every step runs the model's own forward, so hooks, ablations and replaced modules apply.
    The model is never changed: on a CPU where `python -m gpt2lib.speed tune` measured a split
    multiply faster, the steps run on a view of it whose gpt2lib Conv1D and TiedReadout layers
    are SplitConv1D and SplitReadout (gpt2lib.speed.fast_view), the same function of the input.
    A prompt plus max_new_tokens longer than the context (n_positions) is an error, not
    silently cropped.
    """
    plan = _prepare(
        model,
        idx,
        max_new_tokens,
        temperature,
        top_k,
        top_p,
        use_cache,
        generator,
        seed,
        eos_token_id,
        stop_at_eos,
        compile,
    )
    plan["model"] = _decoding_model(model, plan["idx"].device)
    return decode_all(**plan)


class Tokenizer(Protocol):
    """What stream_text needs of a tokenizer: a tiktoken Encoding, gpt2lib's BPETokenizer, ..."""

    def encode(self, text: str) -> list[int]: ...

    def decode(self, ids: list[int]) -> str: ...


def _encode(tokenizer, text):
    try:
        if "allowed_special" in inspect.signature(tokenizer.encode).parameters:
            return list(tokenizer.encode(text, allowed_special="all"))
    except (TypeError, ValueError):
        pass
    return list(tokenizer.encode(text))


def stream_text(
    model: nn.Module, tokenizer: Tokenizer, prompt: str, max_new_tokens: int = 50, **kwargs
) -> Iterator[str]:
    """Yield the continuation of `prompt` as text, piece by piece, as tokens are produced.

    A token can end in the middle of a UTF-8 character (emoji, CJK): those bytes are held back
    until the character is complete, so no replacement character (U+FFFD) appears mid-stream.
    The pieces joined equal tokenizer.decode(new ids). Keyword arguments go to generate().
    tokenizer: a tiktoken Encoding (gpt2lib.tokenizer.get_encoding()) or anything with
    encode/decode (decode_bytes / decode_single_token_bytes are used when present).
    """
    if not isinstance(prompt, str):
        raise TypeError(f"prompt must be a str, got {type(prompt).__name__}")
    if prompt == "":
        raise ValueError(
            "empty prompt: give some text (to start from nothing, use '<|endoftext|>')"
        )
    ids = _encode(tokenizer, prompt)
    device = next(model.parameters()).device
    idx = torch.tensor([ids], dtype=torch.long, device=device)
    steps = decode_tokens(model, idx, max_new_tokens, **kwargs)  # checks everything now
    return _stream_pieces(tokenizer, steps)


def _stream_pieces(tokenizer, steps):
    token_bytes = getattr(tokenizer, "decode_single_token_bytes", None)
    if token_bytes is None and hasattr(tokenizer, "decode_bytes"):
        token_bytes = lambda t: tokenizer.decode_bytes([t])  # noqa: E731
    if token_bytes is not None:
        utf8 = codecs.getincrementaldecoder("utf-8")(errors="replace")
        for token in steps:
            piece = utf8.decode(token_bytes(int(token[0])))
            if piece:
                yield piece
        tail = utf8.decode(b"", final=True)
        if tail:
            yield tail
        return
    new_ids, shown = [], ""
    for token in steps:  # a tokenizer that only decodes whole lists: decode all, emit the rest
        new_ids.append(int(token[0]))
        text = tokenizer.decode(new_ids)
        if not text.endswith("\ufffd") and len(text) > len(shown):
            yield text[len(shown) :]
            shown = text
    text = tokenizer.decode(new_ids)
    if len(text) > len(shown):
        yield text[len(shown) :]
