"""ERNIE's aggregator: a Transformer layer whose feed-forward block also fuses entity embeddings
(Zhang et al. 2019, "ERNIE: Enhanced Language Representation with Informative Entities", §3.3,
Fig. 2, eq. 3-6).

In the i-th aggregator, tokens {w} and the entities aligned to them {e} first go through their
own multi-head self-attention (eq. 3): w~ = MH-ATT(w), e~ = MH-ATT(e). The information fusion
layer then mixes the two for a token w_j aligned to entity e_k (its first token, §3.3):

    h_j = sigma(W~_t w~_j + W~_e e~_k + b~)                 (eq. 4)
    w_j = sigma(W_t h_j + b_t),  e_k = sigma(W_e h_j + b_e)  (eq. 5)

and for a token without an entity, h_j = sigma(W~_t w~_j + b~), w_j = sigma(W_t h_j + b_t)
(eq. 6). sigma is GELU. The released code writes eq. 5 as BERT's feed-forward output does:
w_j = LN(w~_j + W_t h_j + b_t), e_k = LN(e~_k + W_e h_j + b_e), with dropout. That form is used
here, and it is what lets the fusion sit in a *pre-trained* layer: W~_t, W_t and their biases
are the layer's own feed-forward weights (up and down projections), its attention is the
token MH-ATT, and only the entity side (entity attention, W~_e, W_e and their norms) is new.
A token with no entity then gets exactly the pre-trained layer's output (eq. 6), so a
sentence without entities is encoded exactly as the pre-trained encoder encodes it.

Shapes: tokens x (B, T, H), entities e (B, T, D) aligned to token positions (zero where none),
``has_entity`` (B, T) bool; the feed-forward's inner size is I.
"""

from __future__ import annotations

import torch
from torch import nn

from ember.errors import EmberError
from ember.nn.attention import MultiHeadAttention
from ember.nn.dropout import Dropout


class InformationFusion(nn.Module):
    """The entity side of one aggregator, applied around a ``TransformerLayer``'s sub-layers."""

    def __init__(self, intermediate_size: int, entity_dim: int, entity_heads: int, dropout: float,
                 attention_dropout: float, layer_norm_eps: float) -> None:
        super().__init__()
        if entity_dim % entity_heads:
            raise EmberError(f"entity embeddings of {entity_dim} dimensions cannot be split into "
                             f"{entity_heads} attention heads")
        self.entity_attention = MultiHeadAttention(entity_dim, entity_heads, dropout=attention_dropout)
        self.entity_attention_norm = nn.LayerNorm(entity_dim, eps=layer_norm_eps)
        self.entity_in = nn.Linear(entity_dim, intermediate_size)  # W~_e of eq. 4: D -> I
        self.entity_out = nn.Linear(intermediate_size, entity_dim)  # W_e of eq. 5: I -> D
        self.entity_out_norm = nn.LayerNorm(entity_dim, eps=layer_norm_eps)
        self.dropout = Dropout(dropout)

    def forward(self, layer: nn.Module, x: torch.Tensor, mask: torch.Tensor | None, entities: torch.Tensor,
                has_entity: torch.Tensor, donor: nn.Module | None = None,
                need_weights: bool = False) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor | None]:
        """(tokens (B, T, H), entities (B, T, D), attention probabilities or None) after one
        aggregator built on ``layer`` (its attention, feed-forward and norms; ALBERT-style
        shared sub-layers come from ``donor`` as in ``TransformerLayer``)."""
        a = layer if layer.own_attention else donor
        f = layer if layer.own_ffn else donor
        if f.ffn.gated:
            raise EmberError("the information fusion layer needs a plain feed-forward block (up, act, down); "
                             "this layer's is gated")
        # eq. 3, tokens: the layer's own attention sub-layer (post-LN or pre-LN as it was trained)
        if layer.pre_layer_norm:
            attn, probs = a.attention(a.attention_norm(x), mask, need_weights)
            tokens = x + layer.dropout(attn)
            inner = f.ffn.up(f.ffn_norm(tokens))  # W~_t w~_j + b~, (B, T, I)
        else:
            attn, probs = a.attention(x, mask, need_weights)
            tokens = a.attention_norm(x + layer.dropout(attn))
            inner = f.ffn.up(tokens)
        # eq. 3, entities: attention among the sentence's aligned entities only (each query also
        # sees itself, so a sentence without entities has no empty softmax row)
        eye = torch.eye(x.shape[1], dtype=torch.bool, device=x.device)
        entity_mask = (has_entity[:, None, None, :] | eye)  # (B, 1, T, T)
        attended, _ = self.entity_attention(entities, mask=entity_mask)
        entities_att = self.entity_attention_norm(entities + self.dropout(attended))  # e~ (B, T, D)
        # eq. 4 (eq. 6 where no entity is aligned: the entity term is left out)
        gate = has_entity[..., None].to(inner.dtype)  # (B, T, 1)
        h = f.ffn.act(inner + self.entity_in(entities_att) * gate)  # (B, T, I)
        if f.ffn.dropout is not None:  # as the layer's own feed-forward block
            h = f.ffn.dropout(h)
        # eq. 5 in the released code's residual form
        down = layer.dropout(f.ffn.down(h))
        tokens = tokens + down if layer.pre_layer_norm else f.ffn_norm(tokens + down)
        entities_out = self.entity_out_norm(entities_att + self.dropout(self.entity_out(h))) * gate
        return tokens, entities_out, probs
