"""XLNet's two-stream self-attention layer and Transformer-XL segment memory (Yang et al. 2019
§2.3 and Fig. 1; Dai et al. 2019 §3.2).

Two streams run through the same layer weights:
- the content stream h_i (initialised with the token embeddings) sees its own token and the
  positions before it in the factorisation order: it is a normal Transformer state;
- the query stream g_i (initialised with one learned vector w, the "mask embedding") sees
  only the positions before it in the order, never its own content, but knows its own
  position (its queries sit at position i, so the relative position term is i's). It is what
  predicts x_i (eq. 4): g_{z_t} = Attn(Q = g_{z_t}, KV = h_{z<t}).
Both streams take keys and values from the content stream (memory first), so one key/value
projection per layer serves both.

Masks (``two_stream_masks``) follow XLNet's conventions: ``perm_mask[b, i, j]`` true/1 means
position i may NOT see position j (the order puts j at or after i); padding is never seen;
memory is always seen. The query stream uses that mask as is; the content stream additionally
sees itself. Each layer is post-LN (Transformer-XL/XLNet, like BERT):

    a = LN(x + Drop(Attn(x)));   out = LN(a + Drop(W2 act(W1 a)))

The paper's Table 7 lists "GeLU dropout 0.0", so there is no dropout after the activation
(transformers' XLNet applies its hidden dropout there in training; evaluation is identical).

Segment recurrence (``update_memory``, Transformer-XL §3.2): the input of every layer is kept,
without gradient, as that layer's memory for the next segment - the last ``mem_len`` positions
of (old memory, this segment), or with ``reuse_len`` only this segment's first reuse_len.
"""

from __future__ import annotations

import torch
from torch import nn

from ember.nn.dropout import Dropout
from ember.nn.feedforward import FeedForward
from ember.nn.relative_attention import RelativeAttention, TargetPlacement


def two_stream_masks(
    qlen: int,
    mlen: int,
    perm_mask: torch.Tensor | None = None,  # (B, T, T), nonzero = may not attend
    attention_mask: torch.Tensor | None = None,  # (B, T), 1 = real token, 0 = padding
    causal: bool = False,  # attn_type "uni": keys after the query are hidden too
    device=None,
) -> tuple[torch.Tensor | None, torch.Tensor | None]:
    """(content-stream mask, query-stream mask), bool (B|1, T, M+T), True = may attend;
    (None, None) when every position may see every other."""
    blocked = None  # (B|1, T, T) over this segment's keys; memory keys are never blocked
    if perm_mask is not None:
        blocked = perm_mask != 0
    if attention_mask is not None and not bool(attention_mask.bool().all()):
        padding = ~attention_mask.bool()[:, None, :]  # (B, 1, T): padded keys
        blocked = padding if blocked is None else blocked | padding
    if causal:
        later = torch.ones(qlen, qlen, dtype=torch.bool, device=device).triu(1)[None]
        blocked = later if blocked is None else blocked | later
    if blocked is None:
        return None, None
    query = ~blocked
    if mlen:
        memory = torch.ones(*query.shape[:-1], mlen, dtype=torch.bool, device=query.device)
        query = torch.cat([memory, query], dim=-1)
    itself = torch.zeros(qlen, mlen + qlen, dtype=torch.bool, device=query.device)
    # i == j by comparison, not a bool torch.eye: ONNX Runtime has no EyeLike kernel for bool,
    # and a fine-tuned XLNet's graph is exported to ONNX (ember export).
    positions = torch.arange(qlen, device=query.device)
    itself[:, mlen:] = positions[:, None] == positions[None, :]
    return query | itself[None], query


def update_memory(previous: torch.Tensor | None, current: torch.Tensor, mem_len: int,
                  reuse_len: int = 0) -> torch.Tensor:
    """Next memory of one layer: previous (B, M, H) or None, current layer input (B, T, H) ->
    (B, <= mem_len, H), detached (no gradient flows into an earlier segment)."""
    if reuse_len > 0:
        current = current[:, :reuse_len]
    joined = current if previous is None else torch.cat([previous, current], dim=1)
    return joined[:, -mem_len:].detach()


class TwoStreamLayer(nn.Module):
    def __init__(self, hidden_size: int, num_heads: int, intermediate_size: int, act: str,
                 dropout: float, attention_dropout: float, layer_norm_eps: float) -> None:
        super().__init__()
        self.attention = RelativeAttention(hidden_size, num_heads, attention_dropout)
        self.attention_norm = nn.LayerNorm(hidden_size, eps=layer_norm_eps)
        self.ffn = FeedForward(hidden_size, intermediate_size, act)
        self.ffn_norm = nn.LayerNorm(hidden_size, eps=layer_norm_eps)
        self.dropout = Dropout(dropout)

    def _attention_block(self, x, kv, mask, different, placement, need_weights):
        out, probs = self.attention.attend(x, kv, mask, different, placement, need_weights)
        return self.attention_norm(x + self.dropout(out)), probs

    def _ffn_block(self, x: torch.Tensor) -> torch.Tensor:
        return self.ffn_norm(x + self.dropout(self.ffn(x)))

    def forward(
        self,
        h: torch.Tensor,  # (B, T, H) content stream
        g: torch.Tensor | None,  # (B, N, H) query stream, or None (content stream only)
        memory: torch.Tensor | None,  # (B, M, H) this layer's memory
        positions: torch.Tensor,  # (D, P, H) relative position table
        masks: tuple[torch.Tensor | None, torch.Tensor | None],  # (content, query) from two_stream_masks
        different: torch.Tensor | None = None,  # (B, T, M+T) segment difference
        placement: TargetPlacement | None = None,  # the query stream's positions
        need_weights: bool = False,
    ):
        """-> (h, g, content probs, query probs); g and its probs None without a query stream."""
        context = h if memory is None else torch.cat([memory, h], dim=1)  # (B, M+T, H)
        kv = self.attention.keys(context, positions, h.shape[0])
        h, probs_h = self._attention_block(h, kv, masks[0], different, None, need_weights)
        probs_g = None
        if g is not None:
            g, probs_g = self._attention_block(g, kv, masks[1], different, placement, need_weights)
            g = self._ffn_block(g)
        return self._ffn_block(h), g, probs_h, probs_g
