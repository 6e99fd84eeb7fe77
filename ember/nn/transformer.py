"""One Transformer layer, post-LN (BERT, original Transformer) or pre-LN (GPT-2).

post-LN:  x = LN(x + Drop(Attn(x)));  x = LN(x + Drop(FFN(x)))
pre-LN:   x = x + Drop(Attn(LN(x)));  x = x + Drop(FFN(LN(x)))
"""

from __future__ import annotations

import torch
from torch import nn

from ember.nn.attention import SelfAttention
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
    ) -> None:
        super().__init__()
        self.attention = SelfAttention(hidden_size, num_heads, attention_dropout)
        self.attention_norm = nn.LayerNorm(hidden_size, eps=layer_norm_eps)
        self.ffn = FeedForward(hidden_size, intermediate_size, act)
        self.ffn_norm = nn.LayerNorm(hidden_size, eps=layer_norm_eps)
        self.dropout = nn.Dropout(dropout)
        self.pre_layer_norm = pre_layer_norm

    def forward(
        self, x: torch.Tensor, mask: torch.Tensor | None = None, need_weights: bool = False
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        if self.pre_layer_norm:
            attn, probs = self.attention(self.attention_norm(x), mask, need_weights)
            x = x + self.dropout(attn)
            x = x + self.dropout(self.ffn(self.ffn_norm(x)))
        else:
            attn, probs = self.attention(x, mask, need_weights)
            x = self.attention_norm(x + self.dropout(attn))
            x = self.ffn_norm(x + self.dropout(self.ffn(x)))
        return x, probs
