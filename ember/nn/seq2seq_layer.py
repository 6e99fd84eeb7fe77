"""One encoder or decoder block of T5 (Raffel et al. 2020, §2.1) or BART (Lewis et al. 2020, §2.1).

Each sub-layer is x = x + Drop(f(RMSNorm(x))) ("layer normalization is applied to the input
of each subcomponent ... a residual skip connection adds each subcomponent's input to its
output", with dropout "on the feed-forward network, the skip connection, the attention
weights and at the input and output of the entire stack"):

    encoder block:  self-attention (bidirectional), feed-forward
    decoder block:  causal self-attention, cross-attention over the encoder output, feed-forward

Attention and feed-forward have no biases, and attention logits are not scaled by
1/sqrt(d) (the released code folds that factor into the query initialisation). The position
bias is not a parameter of the block: the stack computes it once and passes it in the masks.

BART's block is the standard (Vaswani et al. 2017) post-norm one, x = LN(x + Drop(f(x))),
with LayerNorm (gain and bias), biases on every projection and attention logits scaled by
1/sqrt(d) (``pre_layer_norm=False, norm="layer", bias=True, scale=None``); mBART (Liu et al.
2020) keeps those projections and norms but places the norm first, as T5.
"""

from __future__ import annotations

import torch
from torch import nn

from ember.nn.attention import MultiHeadAttention
from ember.nn.dropout import Dropout
from ember.nn.feedforward import FeedForward
from ember.nn.rms_norm import make_norm


class Seq2SeqLayer(nn.Module):
    def __init__(self, hidden_size: int, num_heads: int, head_dim: int, intermediate_size: int,
                 act: str, dropout: float, attention_dropout: float, layer_norm_eps: float,
                 cross_attention: bool, pre_layer_norm: bool = True, norm: str = "rms", bias: bool = False,
                 scale: float | None = 1.0) -> None:
        super().__init__()

        def attention() -> MultiHeadAttention:
            return MultiHeadAttention(hidden_size, num_heads, head_dim, attention_dropout, bias=bias, scale=scale)

        self.pre_layer_norm = pre_layer_norm
        self.self_attention = attention()
        self.self_attention_norm = make_norm(norm, hidden_size, layer_norm_eps)
        self.cross_attention = attention() if cross_attention else None
        self.cross_attention_norm = make_norm(norm, hidden_size, layer_norm_eps) if cross_attention else None
        # dropout on the activations: T5's FFN dropout, BART's activation_dropout (both = dropout here)
        self.ffn = FeedForward(hidden_size, intermediate_size, act, bias=bias, dropout=dropout)
        self.ffn_norm = make_norm(norm, hidden_size, layer_norm_eps)
        self.dropout = Dropout(dropout)  # on each sub-layer's output, before the residual sum

    def forward(
        self,
        x: torch.Tensor,  # (B, T, H)
        mask: torch.Tensor | None,  # self-attention: position bias + mask, float (B|1, heads, T, L)
        memory: torch.Tensor | None = None,  # (B, S, H) encoder output (decoder blocks)
        memory_mask: torch.Tensor | None = None,  # bool (B, 1, 1, S), True = real encoder token
        need_weights: bool = False,
        cache=None,  # LayerKV of the self-attention (decoding with a cache)
        memory_cache=None,  # LayerKV of the cross-attention's encoder keys/values
    ) -> tuple[torch.Tensor, torch.Tensor | None, torch.Tensor | None]:
        """(x, self-attention probabilities, cross-attention probabilities); the
        probabilities are None unless ``need_weights``."""
        pre = self.pre_layer_norm
        attn, probs = self.self_attention(self.self_attention_norm(x) if pre else x, mask=mask,
                                          need_weights=need_weights, kv_cache=cache)
        x = self._residual(x, attn, self.self_attention_norm)
        cross_probs = None
        if self.cross_attention is not None:
            attn, cross_probs = self.cross_attention(self.cross_attention_norm(x) if pre else x, memory, memory_mask,
                                                     need_weights, kv_cache=memory_cache)
            x = self._residual(x, attn, self.cross_attention_norm)
        x = self._residual(x, self.ffn(self.ffn_norm(x) if pre else x), self.ffn_norm)
        return x, probs, cross_probs

    def _residual(self, x: torch.Tensor, y: torch.Tensor, norm: nn.Module) -> torch.Tensor:
        """pre-LN: x + Drop(y) (y read the normed x); post-LN: LN(x + Drop(y))."""
        x = x + self.dropout(y)
        return x if self.pre_layer_norm else norm(x)
