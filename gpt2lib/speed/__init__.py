"""Opt-in speed for the one forward (chapter 9, section 4): module swaps and a CUDA graph.

Nothing here computes a block, an attention or an MLP of its own: generation always runs the
model's forward. What this package adds is how that forward runs fast, on request:

- On a CPU, `SplitConv1D` is gpt2lib's `Conv1D` with its few-row multiplies done by
  `gpt2lib.speed.kernels.matmul_bias`, and `SplitReadout` is chapter 6's `TiedReadout` with
  `kernels.readout_matmul` (each a split where one was measured faster on this machine).
  `tune()` (or `python -m gpt2lib.speed tune`) measures the routes once and keeps them on
  disk; `fast_view(model)` is then a view of the model (`gpt2lib.views`) with those layers
  swapped: same weights, parameter names and hooks, and the caller's model unchanged.
  `gpt2lib.generate` decodes through such a view by itself where a measurement kept on disk
  says a split pays; it never measures.
- On CUDA, `capture_decode_step` captures one decode step, `model(token, kv_cache=cache)`
  with a static cache whose position is a tensor, as a CUDA graph, and replays it per token
  (`generate(..., compile=True)`).
"""

__all__ = [
    "CapturedDecodeStep",
    "SplitConv1D",
    "SplitReadout",
    "capture_decode_step",
    "fast_view",
    "swappable",
    "tune",
]


import warnings

import torch
import torch.nn as nn

from gpt2lib.chapters.layers import Conv1D
from gpt2lib.chapters.model import TiedReadout
from gpt2lib.speed import kernels
from gpt2lib.views import model_view


class SplitConv1D(Conv1D):
    """Conv1D (y = x @ W + b) with the multiply of gpt2lib.kernels: the split for few rows on a
    CPU where it was measured faster, torch.addmm otherwise. The same function of the input."""

    def forward(self, x):  # (..., n_in) -> (..., n_out)
        rows = x.reshape(-1, x.shape[-1])  # (rows, n_in)
        return kernels.matmul_bias(rows, self.weight, self.bias).view(*x.shape[:-1], -1)


class SplitReadout(TiedReadout):
    """TiedReadout (logits = x @ wte.T) with the multiply of gpt2lib.kernels: a split for few
    rows on a CPU where one was measured faster, x @ wte.T otherwise. The same function."""

    def forward(self, x, wte_weight):  # (..., C), (V, C) -> (..., V)
        rows = x.reshape(-1, x.shape[-1])  # (rows, C)
        return kernels.readout_matmul(rows, wte_weight).view(*x.shape[:-1], -1)


# gpt2lib's own class -> its forward as the chapter wrote it, read when this module is imported.
# A module is swapped only while its class is exactly that class and still runs that forward.
_AS_WRITTEN = {Conv1D: Conv1D.forward, TiedReadout: TiedReadout.forward}
_FASTER = {Conv1D: SplitConv1D, TiedReadout: SplitReadout}


def swappable(module: nn.Module, cls: type) -> bool:
    """Whether `module` may be swapped for the faster subclass of gpt2lib's `cls`.

    Only an instance whose class is exactly `cls` (a learner's subclass keeps its own class),
    whose class still has the forward the chapter wrote (nobody patched `cls.forward`), and
    whose instance has no `forward` of its own (an experimenter's replacement keeps running).
    """
    return type(module) is cls and cls.forward is _AS_WRITTEN[cls] and "forward" not in vars(module)


def fast_view(model: nn.Module) -> nn.Module:
    """A view of `model` (gpt2lib.views.model_view) whose gpt2lib Conv1D and TiedReadout
    layers are SplitConv1D and SplitReadout: the same function of the input, with the split
    multiplies where this machine measured them faster. The model itself is not changed; where
    there is nothing to swap it is returned as it is."""
    if not any(swappable(m, cls) for m in model.modules() for cls in _FASTER):
        return model
    view = model_view(model)
    for module in view.modules():
        for cls, faster in _FASTER.items():
            if swappable(module, cls):
                module.__class__ = faster  # the view's own copy: the model keeps its class
    return view


def tune() -> dict:
    """Measure this machine's fastest few-row multiplies at torch's thread count (about a
    second) and keep them on disk, so that later generation takes the splits that pay."""
    return kernels.measure_routes(save=True)


class CapturedDecodeStep:
    """One decode step of the model's own forward, captured once as a CUDA graph.

    `cache` is a static KVCache (gpt2lib.kvcache, static=True): each layer writes at its
    position tensor, moves it on in place and reads the whole buffers with a mask, and the
    model's positions come from that tensor, so every step is the same computation and only
    the token and the positions change. The graph records the kernels of the model's modules
    and hooks as they are at capture; Python code in them runs only then.
    """

    def __init__(self, model, cache, batch_size, **forward_kwargs):
        device = cache.position.device
        self.cache = cache
        self.token = torch.zeros(batch_size, 1, dtype=torch.long, device=device)
        kwargs = {"kv_cache": cache, **forward_kwargs}  # e.g. last_only=True
        length = cache.length

        def run():
            cache.reset(length)
            return model(self.token, **kwargs)[:, -1]  # (B, V)

        try:
            side = torch.cuda.Stream(device)
            side.wait_stream(torch.cuda.current_stream(device))
            with torch.cuda.stream(side), torch.no_grad():  # warm up: kernels, workspaces
                for _ in range(2):
                    run()
            torch.cuda.current_stream(device).wait_stream(side)
            self.graph = torch.cuda.CUDAGraph()
            cache.reset(length)
            with torch.cuda.graph(self.graph), torch.no_grad():
                self.logits = model(self.token, **kwargs)[:, -1]
        finally:
            cache.reset(length)

    def __call__(self, token):
        """The token just chosen (B,) -> logits for the next one (B, V), overwritten next call."""
        self.token.copy_(token[:, None])
        self.graph.replay()  # writes this token's keys and values, moves the positions on
        return self.logits


def capture_decode_step(model, cache, batch_size, **forward_kwargs):
    """A CapturedDecodeStep, or None (with a warning) where the forward cannot be captured:
    then generation runs the same steps eagerly."""
    try:
        return CapturedDecodeStep(model, cache, batch_size, **forward_kwargs)
    except RuntimeError as exc:  # e.g. a module that reads a value on the host
        warnings.warn(
            f"compile=True: could not capture the decode step as a CUDA graph "
            f"({exc}); decoding eagerly",
            stacklevel=4,
        )
        return None
