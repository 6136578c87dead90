"""Speed for the one forward (chapter 9, section 4): module choices and a captured CUDA graph.

Nothing here computes a block, an attention or an MLP of its own: generation always runs the
model's forward. What this module adds is how that forward runs fast:

- On a CPU, `SplitConv1D` is gpt2lib's `Conv1D` with its few-row multiplies done by
  `gpt2lib.kernels.matmul_bias`, and `SplitReadout` is chapter 6's `TiedReadout` with
  `gpt2lib.kernels.readout_matmul` (each a split, where one was measured faster on this
  machine). `use_split_conv1d(model)` and `use_split_readout(model)` switch a model's layers
  to them in place: same weights, same parameter names, same hooks; only the class changes.
- On CUDA, `capture_decode_step` captures one decode step, `model(token, kv_cache=cache)`
  with a static cache whose position is a tensor, as a CUDA graph, and replays it per token.
"""

__all__ = [
    "CapturedDecodeStep",
    "SplitConv1D",
    "SplitReadout",
    "capture_decode_step",
    "swappable",
    "use_split_conv1d",
    "use_split_readout",
]


import threading
import warnings

import torch

from gpt2lib.chapters.layers import Conv1D
from gpt2lib.chapters.model import TiedReadout
from gpt2lib.speed import kernels


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


_SWAP_LOCK = threading.Lock()

# gpt2lib's own class -> its forward as the chapter wrote it, read when this module is imported.
# A module is switched only while its class is exactly that class and still runs that forward.
_AS_WRITTEN = {Conv1D: Conv1D.forward, TiedReadout: TiedReadout.forward}


def swappable(module, cls) -> bool:
    """Whether `module` may be switched to a faster subclass of gpt2lib's `cls`, in place.

    Only an instance whose class is exactly `cls` (a learner's subclass keeps its own class),
    whose class still has the forward the chapter wrote (nobody patched `cls.forward`), and
    whose instance has no `forward` of its own (an experimenter's replacement keeps running).
    """
    return type(module) is cls and cls.forward is _AS_WRITTEN[cls] and "forward" not in vars(module)


def use_split_conv1d(model) -> int:
    """Switch every plain Conv1D of `model` to SplitConv1D, in place, if the split was measured
    faster on this machine (kernels.split_measured_faster). Returns how many were switched.

    Only the class of each layer changes: its weights, name, hooks and state_dict stay. A
    learner's Conv1D subclass, or a layer whose forward was replaced, is left as it is
    (`swappable`).
    """
    return _switch(model, Conv1D, SplitConv1D)


def use_split_readout(model) -> int:
    """Switch the model's plain TiedReadout to SplitReadout, in place, where a split was
    measured faster on this machine; returns how many were switched (0 or 1). As for
    use_split_conv1d, a learner's subclass or a replaced forward is left as it is."""
    return _switch(model, TiedReadout, SplitReadout)


def _switch(model, cls, faster_cls) -> int:
    if torch.get_num_threads() < 2 or not kernels.split_measured_faster():
        return 0
    switched = 0
    with _SWAP_LOCK:
        for module in model.modules():
            if swappable(module, cls):
                module.__class__ = faster_cls
                switched += 1
    return switched


class CapturedDecodeStep:
    """One decode step of the model's own forward, captured once as a CUDA graph.

    `cache` is a static KVCache (gpt2lib.kvcache, static=True): attention writes at
    `cache.position` and reads the whole buffers with a mask, so every step is the same
    computation and only two tensors change, the token and the position. The model computes
    its positions from an int; while capturing, a pre-hook on `model.wpe` feeds it the
    position tensor instead. The graph records the kernels of the model's modules and hooks as
    they are at capture; Python code in them runs only then.
    """

    def __init__(self, model, cache, batch_size, **forward_kwargs):
        device = cache.position.device
        self.cache = cache
        self.token = torch.zeros(batch_size, 1, dtype=torch.long, device=device)
        kwargs = {"kv_cache": cache, **forward_kwargs}  # e.g. last_only=True
        length = cache.length

        def positions(module, args):  # (T,) positions read from the cache's tensor
            return (cache.position + torch.arange(args[0].shape[0], device=device),)

        def run():
            cache.length = length
            cache.position.fill_(length)
            return model(self.token, **kwargs)[:, -1]  # (B, V)

        hook = model.wpe.register_forward_pre_hook(positions)
        try:
            side = torch.cuda.Stream(device)
            side.wait_stream(torch.cuda.current_stream(device))
            with torch.cuda.stream(side), torch.no_grad():  # warm up: kernels, workspaces
                for _ in range(2):
                    run()
            torch.cuda.current_stream(device).wait_stream(side)
            self.graph = torch.cuda.CUDAGraph()
            cache.length = length
            cache.position.fill_(length)
            with torch.cuda.graph(self.graph), torch.no_grad():
                self.logits = model(self.token, **kwargs)[:, -1]
        finally:
            hook.remove()
            cache.length = length
            cache.position.fill_(length)

    def __call__(self, token):
        """The token just chosen (B,) -> logits for the next one (B, V), overwritten next call."""
        self.token.copy_(token[:, None])
        self.cache.position.fill_(self.cache.length)
        self.graph.replay()  # writes this token's keys and values at the position
        self.cache.length += 1
        return self.logits


def capture_decode_step(model, cache, batch_size, **forward_kwargs):
    """A CapturedDecodeStep, or None (with a warning) where the forward cannot be captured:
    then generation runs the same steps eagerly."""
    if getattr(model, "wpe", None) is None:
        warnings.warn(
            "compile=True: the model has no `wpe` position table to feed the "
            "captured graph; decoding eagerly",
            stacklevel=4,
        )
        return None
    try:
        return CapturedDecodeStep(model, cache, batch_size, **forward_kwargs)
    except RuntimeError as exc:  # e.g. a module that reads a value on the host
        warnings.warn(
            f"compile=True: could not capture the decode step as a CUDA graph "
            f"({exc}); decoding eagerly",
            stacklevel=4,
        )
        return None
