"""Key/value caches for incremental decoding.

A causal decoder's keys and values at earlier positions never change, so generation keeps
them per layer and feeds only the new token(s): each step then costs one query position
instead of re-running the whole prefix (the standard trick of GPT-2's sampler, Radford et
al. 2019's released code, and of every decoder since).

The keys and values live in buffers allocated once for ``capacity`` positions (generation knows
prompt + new tokens up front) and each step writes its position in place; attention reads a
view of the filled part. Growing by concatenation instead copied the whole prefix every step
(17% of a GPT-2 12 x 768 batch-1 step at 96 positions, growing with the prefix). A call beyond
the capacity doubles the buffer (one copy), so a cache without a hint still works. Beam search
reorders rows with ``index_select`` of the filled part into a second buffer, which then swaps
with the first: no allocation per step.
"""

from __future__ import annotations

import torch


class LayerKV:
    """One layer's keys and values, (B, heads, L, d) views of (B, heads, capacity, d) buffers."""

    def __init__(self, capacity: int = 0) -> None:
        self.capacity = capacity  # positions to allocate at the first update (at least its own)
        self.length = 0
        self._k: torch.Tensor | None = None  # the buffers
        self._v: torch.Tensor | None = None
        self._spare: tuple[torch.Tensor, torch.Tensor] | None = None  # reorder targets

    @property
    def k(self) -> torch.Tensor | None:
        return None if self._k is None else self._k[:, :, : self.length]

    @property
    def v(self) -> torch.Tensor | None:
        return None if self._v is None else self._v[:, :, : self.length]

    def update(self, k: torch.Tensor, v: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Write this call's (B, heads, T, d) keys/values after the cached ones; return all
        L = past + T of them (views of the buffers)."""
        end = self.length + k.shape[2]
        if self._k is None or end > self._k.shape[2] or self._k.shape[0] != k.shape[0]:
            self._allocate(k, v, end)
        self._k[:, :, self.length: end].copy_(k)
        self._v[:, :, self.length: end].copy_(v)
        self.length = end
        return self.k, self.v

    def _allocate(self, k: torch.Tensor, v: torch.Tensor, end: int) -> None:
        """New buffers of the capacity (doubled when a call outgrows it) holding the cached part."""
        if self._k is not None and self._k.shape[0] != k.shape[0]:
            raise ValueError(f"the cache holds {self._k.shape[0]} rows but {k.shape[0]} came; select rows first")
        size = max(end, self.capacity, 2 * self._k.shape[2] if self._k is not None else 0)
        b, heads, _, d = k.shape
        new_k, new_v = k.new_empty(b, heads, size, d), v.new_empty(b, heads, size, v.shape[-1])
        if self.length:
            new_k[:, :, : self.length].copy_(self.k)
            new_v[:, :, : self.length].copy_(self.v)
        self._k, self._v, self._spare = new_k, new_v, None
        self.capacity = size

    def select(self, rows: torch.Tensor) -> None:
        """Keep batch rows ``rows`` (LongTensor) only, in that order, repeated or dropped (beam
        search's reorder, dropping finished sequences)."""
        if self._k is None:
            return
        if rows.numel() != self._k.shape[0]:  # another batch size: new buffers of that size
            self._k, self._v, self._spare = self._k[rows], self._v[rows], None
            return
        if self._spare is None:
            self._spare = (torch.empty_like(self._k), torch.empty_like(self._v))
        k, v = self._spare
        torch.index_select(self.k, 0, rows, out=k[:, :, : self.length])
        torch.index_select(self.v, 0, rows, out=v[:, :, : self.length])
        self._spare = (self._k, self._v)
        self._k, self._v = k, v


class KVCache:
    """The caches of every layer application of a decoder, plus how many positions they hold.
    ``capacity``: the positions to allocate up front (prompt + new tokens; 0 = as they come)."""

    def __init__(self, num_layers: int, capacity: int = 0) -> None:
        self.layers = [LayerKV(capacity) for _ in range(num_layers)]

    @property
    def length(self) -> int:
        """Positions already cached (0 before the first forward)."""
        return self.layers[0].length

    @property
    def capacity(self) -> int:
        return self.layers[0].capacity

    def select(self, rows: torch.Tensor) -> None:
        for layer in self.layers:
            layer.select(rows)


class EncoderDecoderCache:
    """A seq2seq decoder's caches (T5, Raffel et al. 2020): per layer, the self-attention
    keys/values of the tokens generated so far (grown each step) and the cross-attention
    keys/values of the encoder output (filled on the first step, then only read, since the
    encoder output does not change while decoding).

    Two more things do not change while decoding, so the decoder stack keeps them here too, made at
    the first step: the encoder's key mask (``memory_mask``, bool (B, 1, 1, S) or None) and T5's
    causal self-attention bias for every (query, key) pair of the capacity (``self_bias``, (1,
    heads, C, C)), of which a step reads its query's row (the bias depends on positions only)."""

    def __init__(self, num_layers: int, capacity: int = 0) -> None:
        self.self_attention = KVCache(num_layers, capacity)
        self.cross_attention = KVCache(num_layers)
        self.memory_mask: torch.Tensor | None = None
        self.self_bias: torch.Tensor | None = None

    @property
    def length(self) -> int:
        """Decoder positions already cached."""
        return self.self_attention.length

    def select(self, rows: torch.Tensor, cross: bool = True) -> None:
        """Keep (or reorder, repeat) batch rows ``rows``. Beam search reorders beams within
        each input, whose encoder rows are identical: it passes ``cross=False``."""
        self.self_attention.select(rows)
        if cross:
            self.cross_attention.select(rows)
            if self.memory_mask is not None:
                self.memory_mask = self.memory_mask[rows]
