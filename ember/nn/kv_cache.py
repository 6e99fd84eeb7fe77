"""Key/value caches for incremental decoding.

A causal decoder's keys and values at earlier positions never change, so generation keeps
them per layer and feeds only the new token(s): each step then costs one query position
instead of re-running the whole prefix (the standard trick of GPT-2's sampler, Radford et
al. 2019's released code, and of every decoder since).
"""

from __future__ import annotations

import torch


class LayerKV:
    """One layer's keys and values, (B, heads, L, d) each, grown along L."""

    def __init__(self) -> None:
        self.k: torch.Tensor | None = None
        self.v: torch.Tensor | None = None

    def update(self, k: torch.Tensor, v: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Append this call's (B, heads, T, d) keys/values; return all L = past + T of them."""
        if self.k is not None:
            k = torch.cat([self.k, k], dim=2)
            v = torch.cat([self.v, v], dim=2)
        self.k, self.v = k, v
        return k, v

    def select(self, rows: torch.Tensor) -> None:
        """Keep batch rows ``rows`` (LongTensor) only, e.g. to drop finished sequences."""
        if self.k is not None:
            self.k, self.v = self.k[rows], self.v[rows]


class KVCache:
    """The caches of every layer application of a decoder, plus how many positions they hold."""

    def __init__(self, num_layers: int) -> None:
        self.layers = [LayerKV() for _ in range(num_layers)]

    @property
    def length(self) -> int:
        """Positions already cached (0 before the first forward)."""
        k = self.layers[0].k
        return 0 if k is None else int(k.shape[2])

    def select(self, rows: torch.Tensor) -> None:
        for layer in self.layers:
            layer.select(rows)


class EncoderDecoderCache:
    """A seq2seq decoder's caches (T5, Raffel et al. 2020): per layer, the self-attention
    keys/values of the tokens generated so far (grown each step) and the cross-attention
    keys/values of the encoder output (filled on the first step, then only read, since the
    encoder output does not change while decoding)."""

    def __init__(self, num_layers: int) -> None:
        self.self_attention = KVCache(num_layers)
        self.cross_attention = KVCache(num_layers)

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
