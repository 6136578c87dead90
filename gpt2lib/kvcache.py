"""The KV cache that `generate` and the benchmarks use: per-layer buffers that own their position.

Hand-written (not generated). Chapter 9's learner writes `write_kv` and a plain cache
(`gpt2lib.chapters.decoding.SimpleKVCache`) with the protocol the model speaks: the model
starts its positions at `cache.position` and hands `cache[i]` to block i, whose attention
calls `k, v, visible = cache[i].update(k, v)`. This cache speaks the same protocol through the
same `write_kv` and adds what a library needs: its size checked against the model's context, a
clear error when it is full, and a static mode (`static=True`) whose position lives in a tensor,
so that a decode step is the same computation at every position and `gpt2lib.speed` can replay
it as a CUDA graph.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator

import torch
import torch.nn as nn

from gpt2lib.chapters.attention import causal_mask
from gpt2lib.chapters.config import GPT2Config
from gpt2lib.chapters.decoding import write_kv  # chapter 9, the learner's

__all__ = ["KVCache", "LayerKVCache"]


class LayerKVCache:
    """One layer's keys and values in buffers allocated once, (B, n_head, max_len, head_dim),
    and its position: how many tokens it holds.

    `update(k, v)` writes the new keys and values after the ones held, moves the position on,
    and returns every key and value so far with `visible`, which keys each new query may see
    (None while nothing was held: attention then uses its plain causal mask). In a static
    cache the position is a 0-d tensor moved in place, and `update` returns the whole buffers
    with a mask that hides the slots not yet written: the shapes never change.
    """

    def __init__(
        self,
        k_buf: torch.Tensor,
        v_buf: torch.Tensor,
        static: bool = False,
        write: Callable | None = None,
    ):
        self.k, self.v = k_buf, v_buf
        self.static = static
        self.position = torch.zeros((), dtype=torch.long, device=k_buf.device) if static else 0
        self._write = write_kv if write is None else write

    @property
    def max_len(self) -> int:
        return self.k.shape[2]

    def update(self, k: torch.Tensor, v: torch.Tensor):
        """k, v: (B, nh, T, hd) -> (keys, values, visible): (B, nh, L, hd) twice and (T, L) or
        None, where L is every token held so far (the whole buffer in a static cache)."""
        T = k.shape[2]
        if self.static:  # write at the position tensor, read everything
            slots = self.position + torch.arange(T, device=k.device)  # (T,)
            self.k.index_copy_(2, slots, k)
            self.v.index_copy_(2, slots, v)
            visible = torch.arange(self.max_len, device=k.device)[None, :] <= slots[:, None]
            self.position += T  # in place: a captured graph moves it too
            return self.k, self.v, visible  # visible: (T, max_len)
        past = self.position
        if past + T > self.max_len:
            raise ValueError(
                f"KV cache is full: it holds {self.max_len} positions, {past} are used and "
                f"{T} more were written; make the cache with a larger max_len"
            )
        keys, values = self._write(self.k, self.v, k, v, past)
        self.position = past + T
        return keys, values, None if past == 0 else causal_mask(T, past, device=k.device)


class KVCache:
    """A cache for the whole model: one LayerKVCache per block (`cache[i]`), all at the same
    position. `write` replaces write_kv (to try your own version of it). static=True keeps
    each position in a tensor, so that one decode step is the same computation at every
    position: what a CUDA graph replays (the host keeps `length`, the same count as an int)."""

    def __init__(
        self,
        config: GPT2Config,
        batch_size: int,
        max_len: int,
        device: torch.device | str | None = None,
        dtype: torch.dtype = torch.float32,
        write: Callable | None = None,
        static: bool = False,
    ):
        if max_len > config.n_positions:
            raise ValueError(
                f"max_len {max_len} is longer than the model's context of "
                f"{config.n_positions} positions (n_positions)"
            )
        if batch_size < 1 or max_len < 1:
            raise ValueError(
                f"batch_size and max_len must be at least 1, got {batch_size} and {max_len}"
            )
        self.max_len = max_len
        self.static = bool(static)
        shape = (batch_size, config.n_head, max_len, config.n_embd // config.n_head)
        self.layers = [
            LayerKVCache(
                torch.zeros(shape, device=device, dtype=dtype),
                torch.zeros(shape, device=device, dtype=dtype),
                static=self.static,
                write=write,
            )
            for _ in range(config.n_layer)
        ]

    def __getitem__(self, i: int) -> LayerKVCache:
        return self.layers[i]

    def __len__(self) -> int:
        return len(self.layers)

    def __iter__(self) -> Iterator[LayerKVCache]:
        return iter(self.layers)

    @property
    def position(self):
        """Tokens held before the next forward pass: an int, or a 0-d tensor when static."""
        return self.layers[0].position

    @property
    def length(self) -> int:
        """Tokens held, as an int (in a static cache this reads the position off the device)."""
        return int(self.position)

    def reset(self, length: int = 0) -> None:
        """Hold `length` tokens (0: forget them all); the buffers are reused, not freed."""
        for layer in self.layers:
            if self.static:
                layer.position.fill_(length)
            else:
                layer.position = length

    @property
    def nbytes(self) -> int:
        return sum(layer.k.nbytes + layer.v.nbytes for layer in self.layers)

    @staticmethod
    def bytes_per_position(config: GPT2Config, dtype: torch.dtype = torch.float32) -> int:
        """Memory one token needs in the cache, all layers, keys and values, one sequence."""
        itemsize = torch.empty((), dtype=dtype).element_size()
        return config.n_layer * 2 * config.n_embd * itemsize

    @classmethod
    def for_model(
        cls,
        model: nn.Module,
        batch_size: int,
        max_len: int,
        write: Callable | None = None,
        static: bool = False,
    ) -> KVCache:
        """A cache on the model's device and in its dtype."""
        p = next(model.parameters())
        return cls(
            model.config,
            batch_size,
            max_len,
            device=p.device,
            dtype=p.dtype,
            write=write,
            static=static,
        )
