"""The KV cache: static key/value buffers per layer, the one `generate` and the benchmarks use.

Hand-written (not generated). Chapter 9's learner writes `write_kv` and a plain cache
(`gpt2lib.decoding.SimpleKVCache`); this one writes through the same `write_kv` and adds what a
library needs: its size checked against the model's context, a clear error when it is full, and
a static mode (`static=True`) whose position lives in a tensor, so that a decode step is the
same computation at every position and `gpt2lib.speed` can replay it as a CUDA graph.
"""

__all__ = [
    "KVCache",
    "LayerKVCache",
    "attend_with_offset",
    "write_kv",
]


import torch

from gpt2lib.chapters.decoding import attend_with_offset, write_kv  # chapter 9, the learner's


class LayerKVCache:
    """One layer's keys and values, in buffers allocated once: (B, n_head, max_len, head_dim).

    Attention reads `length` (tokens cached before this step) and calls `update(k, v)`. The
    position only moves when the whole model calls `KVCache.advance`, because every layer of
    one forward pass writes at the same positions. In a static cache (`static=True`, for a
    CUDA graph) `length` is the position as a 0-d tensor and `update` hands back the whole
    buffers: the shapes never change, and attention's mask hides the slots not yet written.
    """

    def __init__(self, parent, k_buf, v_buf, write=None):
        self._parent = parent
        self.k = k_buf
        self.v = v_buf
        self._write = write_kv if write is None else write

    @property
    def length(self):
        return self._parent.position if self._parent.static else self._parent.length

    def update(self, k, v):
        """k, v: (B, nh, T, hd) -> all keys and values so far, (B, nh, length + T, hd)
        (the whole buffers, (B, nh, max_len, hd), in a static cache)."""
        start, T = self._parent.length, k.shape[2]  # a Python int: no value read on the GPU
        if start + T > self.k.shape[2]:
            raise ValueError(
                f"KV cache is full: it holds {self.k.shape[2]} positions, {start} are used and "
                f"{T} more were written; make the cache with a larger max_len"
            )
        if self._parent.static:  # write at the position tensor, read everything
            slots = self._parent.position + torch.arange(T, device=k.device)  # (T,)
            self.k.index_copy_(2, slots, k)
            self.v.index_copy_(2, slots, v)
            return self.k, self.v
        return self._write(self.k, self.v, k, v, start)


class KVCache:
    """A static cache for the whole model: one LayerKVCache per block, one shared position.

    The model calls `layers[i]` for block i and `advance(T)` once after all blocks.
    `write` replaces write_kv (to try your own version of it). static=True keeps the
    position in a tensor as well (`position`, 0-d) and has attention read the whole buffers,
    so that one decode step is the same computation at every position: what a CUDA graph
    replays.
    """

    def __init__(
        self,
        config,
        batch_size: int,
        max_len: int,
        device=None,
        dtype=torch.float32,
        write=None,
        static=False,
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
        self.length = 0
        self.static = bool(static)
        self.position = torch.zeros((), dtype=torch.long, device=device)  # = length, on device
        shape = (batch_size, config.n_head, max_len, config.n_embd // config.n_head)
        self.layers = [
            LayerKVCache(
                self,
                torch.zeros(shape, device=device, dtype=dtype),
                torch.zeros(shape, device=device, dtype=dtype),
                write,
            )
            for _ in range(config.n_layer)
        ]

    def advance(self, T: int) -> None:
        self.length += T
        if self.static:
            self.position += T  # in place: a captured graph moves it too

    def reset(self) -> None:
        """Forget every cached token (the buffers are reused, not freed)."""
        self.length = 0
        self.position.zero_()

    @property
    def nbytes(self) -> int:
        return sum(layer.k.nbytes + layer.v.nbytes for layer in self.layers)

    @staticmethod
    def bytes_per_position(config, dtype=torch.float32) -> int:
        """Memory one token needs in the cache, all layers, keys and values, one sequence."""
        itemsize = torch.empty((), dtype=dtype).element_size()
        return config.n_layer * 2 * config.n_embd * itemsize

    @classmethod
    def for_model(cls, model, batch_size: int, max_len: int, write=None, static=False):
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
