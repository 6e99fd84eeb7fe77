"""T5's relative position bias (Raffel et al. 2020, §2.1; after Shaw et al. 2018).

Instead of position embeddings added to the input, each attention head adds a learned
scalar b[bucket(j - i)] to the logit of query i attending to key j. "We use 32 embeddings for
all of our models with ranges that increase in size logarithmically up to an offset of 128
beyond which we assign all relative positions to the same embedding" (§2.1):

- bidirectional (encoder): half of the buckets for keys before the query, half for keys
  after it; causal (decoder): all buckets for keys at or before the query (later keys are
  masked anyway and share bucket 0 with distance 0);
- within a direction, the first half of its buckets are exact distances 0, 1, ..., n/2 - 1,
  the rest cover n/2 .. max_distance on a log scale, and farther keys share the last bucket.

One bias table per stack, computed once per forward and shared by every layer of it (the
paper: "each layer" uses the same position embeddings; the released models store them in
the first layer only).
"""

from __future__ import annotations

import math

import torch
from torch import nn


def relative_position_bucket(relative_position: torch.Tensor, bidirectional: bool = True,
                             num_buckets: int = 32, max_distance: int = 128) -> torch.Tensor:
    """Bucket ids in [0, num_buckets) of ``relative_position = key - query`` (an int tensor)."""
    if bidirectional:
        num_buckets //= 2
        offset = (relative_position > 0).long() * num_buckets  # keys after the query: upper half
        distance = relative_position.abs()
    else:
        offset = torch.zeros_like(relative_position)
        distance = (-relative_position).clamp(min=0)  # keys after the query fall in bucket 0
    exact = num_buckets // 2
    # distance in [exact, max_distance) spread over the remaining buckets on a log scale;
    # the clamp keeps log() finite for the exact distances, which do not use this value
    scaled = torch.log(distance.clamp(min=exact).float() / exact) / math.log(max_distance / exact)
    far = (exact + (scaled * (num_buckets - exact)).long()).clamp(max=num_buckets - 1)
    return offset + torch.where(distance < exact, distance, far)


class RelativePositionBias(nn.Module):
    """Learned per-head bias of every (query, key) pair from their bucketed offset."""

    def __init__(self, num_heads: int, bidirectional: bool, num_buckets: int = 32,
                 max_distance: int = 128) -> None:
        super().__init__()
        self.embedding = nn.Embedding(num_buckets, num_heads)
        self.bidirectional = bidirectional
        self.num_buckets = num_buckets
        self.max_distance = max_distance

    def forward(self, query_length: int, key_length: int, query_offset: int = 0) -> torch.Tensor:
        """(1, heads, T, L) bias for queries at positions offset .. offset + T - 1 (a decoder
        step with a cache of ``query_offset`` positions) and keys at 0 .. L - 1."""
        device = self.embedding.weight.device
        query = torch.arange(query_offset, query_offset + query_length, device=device)[:, None]
        key = torch.arange(key_length, device=device)[None, :]
        buckets = relative_position_bucket(key - query, self.bidirectional, self.num_buckets,
                                           self.max_distance)  # (T, L)
        return self.embedding(buckets).permute(2, 0, 1).unsqueeze(0)  # (1, heads, T, L)
