"""One Transformer layer, post-LN (BERT, original Transformer) or pre-LN (GPT-2).

post-LN:  x = LN(x + Drop(Attn(x)));  x = LN(x + Drop(FFN(x)))
pre-LN:   x = x + Drop(Attn(LN(x)));  x = x + Drop(FFN(LN(x)))

GPT-1 is the post-LN layer and GPT-2 the pre-LN one, run with causal attention
(``is_causal`` / ``kv_cache`` are passed through to the attention only when used, so an
attention module without them still serves the encoder).

ALBERT's cross-layer sharing (Lan et al. 2020, §3.1) builds some layers without their own
attention or feed-forward sub-layer (``own_attention`` / ``own_ffn`` False); such a layer
borrows the missing sub-layer, with its LayerNorm, from a ``donor`` layer at call time. That
keeps each shared tensor stored once in the state dict.

Long-input attention variants (Longformer) come in as ``attention``, a module with the same
call (x, mask, need_weights) whose ``mask`` is what the encoder built for it (a LongMask).
"""

from __future__ import annotations

import torch
from torch import nn

from ember.nn.attention import SelfAttention
from ember.nn.dropout import Dropout, dropout_at_rows
from ember.nn.feedforward import FeedForward


class TransformerLayer(nn.Module):
    def __init__(
        self,
        hidden_size: int,
        num_heads: int,
        intermediate_size: int,
        act: str,
        dropout: float,
        attention_dropout: float,
        layer_norm_eps: float,
        pre_layer_norm: bool = False,
        own_attention: bool = True,
        own_ffn: bool = True,
        attention: nn.Module | None = None,  # another attention variant (ember.nn.longformer); None = full
    ) -> None:
        super().__init__()
        if own_attention:
            self.attention = attention or SelfAttention(hidden_size, num_heads, attention_dropout)
            self.attention_norm = nn.LayerNorm(hidden_size, eps=layer_norm_eps)
        if own_ffn:
            self.ffn = FeedForward(hidden_size, intermediate_size, act)
            self.ffn_norm = nn.LayerNorm(hidden_size, eps=layer_norm_eps)
        self.own_attention, self.own_ffn = own_attention, own_ffn
        self.dropout = Dropout(dropout)  # CPU-cheap dropout (ember.nn.dropout)
        self.pre_layer_norm = pre_layer_norm

    def forward(
        self, x: torch.Tensor, mask: torch.Tensor | None = None, need_weights: bool = False,
        donor: "TransformerLayer | None" = None, is_causal: bool = False, kv_cache=None, rows=None,
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        a = self if self.own_attention else donor  # where the attention sub-layer lives
        f = self if self.own_ffn else donor  # where the feed-forward sub-layer lives
        if rows is not None:
            return self._at_rows(x, mask, rows, a, f), None
        causal = {"is_causal": is_causal, "kv_cache": kv_cache} if is_causal or kv_cache is not None else {}
        if self.pre_layer_norm:
            attn, probs = a.attention(a.attention_norm(x), mask, need_weights, **causal)
            x = x + self.dropout(attn)
            x = x + self.dropout(f.ffn(f.ffn_norm(x)))
        else:
            attn, probs = a.attention(x, mask, need_weights, **causal)
            x = a.attention_norm(x + self.dropout(attn))
            x = f.ffn_norm(x + self.dropout(f.ffn(x)))
        return x, probs

    def _at_rows(self, x: torch.Tensor, mask: torch.Tensor | None, rows, a: "TransformerLayer",
                 f: "TransformerLayer") -> torch.Tensor:
        """The layer's output (B, Q, H) at ``rows`` only (ember.nn.query_rows): every position is
        still a key and a value; dropout applies the full layer's random draws at the rows."""
        full = x.shape

        def drop(y: torch.Tensor) -> torch.Tensor:
            return dropout_at_rows(y, self.dropout.p, self.training, full, rows)

        if self.pre_layer_norm:
            x_rows = rows.gather(x) + drop(a.attention(a.attention_norm(x), mask, rows=rows)[0])
            return x_rows + drop(f.ffn(f.ffn_norm(x_rows)))
        x_rows = a.attention_norm(rows.gather(x) + drop(a.attention(x, mask, rows=rows)[0]))
        return f.ffn_norm(x_rows + drop(f.ffn(x_rows)))
