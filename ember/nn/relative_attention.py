"""Multi-head attention with relative positions and relative segments (Transformer-XL, Dai
et al. 2019 §3.3; XLNet, Yang et al. 2019 §2.4-2.5).

The score of query i against key j is the sum of three terms, scaled by 1/sqrt(d):

    content   (q_i + r_w) . k_j            r_w: learned content bias ("u" in Transformer-XL)
    position  (q_i + r_r) . W_r R_{i-j}    r_r: learned position bias ("v"), R: sinusoids
    segment   (q_i + r_s) . s_ij           s_ij: learned "same" / "different segment" vector

The segment term (XLNet §2.5, "Relative Segment Encodings") only asks whether i and j are in
the same segment, so the model is not tied to two segments. The queries come from one stream
and the keys/values from another (the content stream, memory first): ``keys`` computes the
keys once per layer and ``attend`` runs for the content stream h and for the query stream g of
XLNet's two-stream attention (ember.nn.two_stream).

Projections are bias-free (H -> heads x d), stored as ``nn.Linear``; ``o`` maps the heads back
to H. Masks are bool (B|1, T, K), True = may attend.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
from torch import nn

from ember.nn.dropout import dropout
from ember.nn.relative_position import rel_shift


class RelativeSegmentEncoding(nn.Module):
    """XLNet's relative segment term: bias r_s (heads, d) and the two segment vectors
    ``embed`` (2, heads, d): row 0 "same segment", row 1 "different segment"."""

    def __init__(self, num_heads: int, head_dim: int) -> None:
        super().__init__()
        self.bias = nn.Parameter(torch.zeros(num_heads, head_dim))
        self.embed = nn.Parameter(torch.zeros(2, num_heads, head_dim))

    def forward(self, q: torch.Tensor, different: torch.Tensor) -> torch.Tensor:
        """q (B, n, T, d), different bool (B, T, K) -> scores (B, n, T, K)."""
        # (B, n, T, d) x (n, d, 2) -> (B, n, T, 2): each query against "same" and "different"
        both = (q + self.bias[:, None]) @ self.embed.permute(1, 2, 0)
        return torch.where(different[:, None], both[..., 1:2], both[..., 0:1])


def segment_difference(token_type_ids: torch.Tensor | None, mlen: int) -> torch.Tensor | None:
    """(B, T) segment ids -> bool (B, T, mlen + T): key in another segment than the query.
    Memory positions count as segment 0, as in XLNet's code (the memory continues segment A)."""
    if token_type_ids is None:
        return None
    if mlen:
        memory = torch.zeros(token_type_ids.shape[0], mlen, dtype=token_type_ids.dtype,
                             device=token_type_ids.device)
        keys = torch.cat([memory, token_type_ids], dim=1)
    else:
        keys = token_type_ids
    return token_type_ids[:, :, None] != keys[:, None, :]


@dataclass
class TargetPlacement:
    """Where the N queries of XLNet's query stream sit: ``mapping`` (B, N, T), row n the
    position of query n. When every row is one-hot or all zero (a padded target) - always, for
    ember's objective - ``positions`` (B, N) and ``valid`` (B, N) let attention compute only
    the N query rows instead of all T."""

    mapping: torch.Tensor
    positions: torch.Tensor | None = None
    valid: torch.Tensor | None = None

    @classmethod
    def of(cls, mapping: torch.Tensor) -> TargetPlacement:
        if bool(((mapping == 0) | (mapping == 1)).all()) and bool((mapping.sum(-1) <= 1).all()):
            return cls(mapping, mapping.argmax(-1), mapping.sum(-1))
        return cls(mapping)


def _rows(t: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
    """(B|1, T, K) -> (B, N, K): the rows at ``positions`` (B, N)."""
    t = t.expand(positions.shape[0], -1, -1)
    return t.gather(1, positions[..., None].expand(-1, -1, t.shape[-1]))


class RelativeAttention(nn.Module):
    def __init__(self, hidden_size: int, num_heads: int, dropout_p: float) -> None:
        super().__init__()
        self.num_heads, self.head_dim = num_heads, hidden_size // num_heads
        inner = self.num_heads * self.head_dim
        self.q = nn.Linear(hidden_size, inner, bias=False)
        self.k = nn.Linear(hidden_size, inner, bias=False)
        self.v = nn.Linear(hidden_size, inner, bias=False)
        self.r = nn.Linear(hidden_size, inner, bias=False)  # W_r: sinusoids -> position keys
        self.o = nn.Linear(inner, hidden_size, bias=False)
        self.r_w_bias = nn.Parameter(torch.zeros(num_heads, self.head_dim))
        self.r_r_bias = nn.Parameter(torch.zeros(num_heads, self.head_dim))
        self.segment = RelativeSegmentEncoding(num_heads, self.head_dim)
        self.dropout_p = dropout_p

    def _heads(self, x: torch.Tensor) -> torch.Tensor:  # (B, L, n*d) -> (B, n, L, d)
        return x.view(*x.shape[:-1], self.num_heads, self.head_dim).transpose(-3, -2)

    def keys(self, context: torch.Tensor, positions: torch.Tensor, batch: int):
        """context (B, K, H) (memory then segment), positions (D, P, H) ->
        keys, values (B, n, K, d) and position keys (B|1, n, P, d)."""
        k, v = self._heads(self.k(context)), self._heads(self.v(context))
        kr = self._heads(self.r(positions))  # (D, n, P, d)
        if kr.shape[0] == 2:  # bi_data: first half of the batch forward, second half mirrored
            kr = kr.repeat_interleave(batch // 2, dim=0)
        return k, v, kr

    def attend(
        self,
        x: torch.Tensor,  # (B, N, H) the stream whose queries these are
        kv: tuple[torch.Tensor, torch.Tensor, torch.Tensor],  # from ``keys``
        mask: torch.Tensor | None = None,  # bool (B|1, T, K), True = may attend
        different: torch.Tensor | None = None,  # bool (B, T, K) from segment_difference
        placement: TargetPlacement | None = None,  # where the queries sit (query stream)
        need_weights: bool = False,
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        """-> (B, N, H) attention output (after ``o``), probabilities (B, n, T, K) if asked.

        Without ``placement`` query n is position n (N = T). With it (XLNet's query stream,
        §2.3), query n attends from the position its mapping row names: that position's
        relative distances, mask row and segment. The general form (as transformers computes
        it) places the queries with the mapping, attends at all T positions and maps back -
        linear both ways, so an all-zero row (a padded target) gets no attention output; for
        one-hot rows only the N query rows are computed, the same numbers at N/T of the cost."""
        k, v, kr = kv
        q = self._heads(self.q(x))  # (B, n, N, d)
        rows = placement is not None and placement.positions is not None and not need_weights
        if placement is not None and not rows:
            q = torch.einsum("bhnd,bnt->bhtd", q, placement.mapping.to(q.dtype))  # (B, n, T, d)
        content = (q + self.r_w_bias[:, None]) @ k.transpose(-1, -2)  # (B, n, T|N, K)
        position = (q + self.r_r_bias[:, None]) @ kr.transpose(-1, -2)  # (B, n, T|N, P)
        if rows:  # query n at position p uses table row j + T - p for key j (see rel_shift)
            t = placement.mapping.shape[-1]
            index = torch.arange(k.shape[-2], device=q.device) + t - placement.positions[..., None]  # (B, N, K)
            position = position.gather(-1, index[:, None].expand(-1, q.shape[1], -1, -1))
            mask = _rows(mask, placement.positions) if mask is not None else None
            different = _rows(different, placement.positions) if different is not None else None
        else:
            position = rel_shift(position, k.shape[-2])
        scores = content + position
        if different is not None:
            scores = scores + self.segment(q, different)
        scores = scores * (1.0 / math.sqrt(self.head_dim))
        if mask is not None:
            scores = scores.masked_fill(~mask[:, None], torch.finfo(scores.dtype).min)
        probs = scores.softmax(-1)
        context = dropout(probs, self.dropout_p, self.training) @ v  # (B, n, T|N, d)
        if rows:
            context = context * placement.valid[:, None, :, None].to(context.dtype)
        elif placement is not None:
            context = torch.einsum("bhtd,bnt->bhnd", context, placement.mapping.to(context.dtype))
        context = context.transpose(-3, -2).flatten(-2)  # (B, N, n*d)
        return self.o(context), probs if need_weights else None
