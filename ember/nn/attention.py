"""Multi-head attention (Vaswani et al. 2017): a fused-QKV self-attention (BERT, GPT) and a
general one with separate projections that also attends over another sequence (T5).

``SelfAttention``: one (H -> 3H) matmul instead of three; checkpoints from other libraries
with separate query/key/value weights are concatenated on import (ember.interop).
``MultiHeadAttention``: q/k/v/out projections with any head size (T5's d_kv need not be
H / heads), optional biases and logit scale; as cross-attention (``memory`` given) its keys
and values come from the encoder output, computed once per generation (see ``kv_cache``).
Beam search's G beams of an input share its encoder output: ``memory`` may have 1/G of the
query rows (query rows g * G .. g * G + G - 1 read memory row g), and the G beams' queries
attend as one (G * T)-query block, so the keys and values are projected and read once per input
instead of G times (4x less cross-attention memory traffic at beam 4: SDPA over 32 rows x 128
keys, one query each, took 2.3 ms per layer and step on one EPYC core).

Both use PyTorch's scaled_dot_product_attention unless the caller asks for the attention
probabilities, which SDPA does not return, or trains with dropout on CPU (see
ember.nn.dropout.attend). A mask is bool (True = may attend) or float (added to the logits,
e.g. T5's position bias with -inf-like entries at masked keys).

Causal decoders (GPT) pass ``is_causal=True`` (no other mask) or an explicit (B, 1, T, L)
mask, and for generation a ``kv_cache`` (ember.nn.kv_cache.LayerKV) that appends this call's
keys/values to the earlier ones, so a new token costs one query position.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn
from torch.autograd.function import once_differentiable

from ember.errors import EmberError
from ember.nn.dropout import attend, attention_scores, dropout_at_rows, forms_probabilities
from ember.nn.onednn import dense, is_recording, linear


def attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: torch.Tensor | None,
              dropout: float, need_weights: bool, is_causal: bool = False,
              scale: float | None = None) -> tuple[torch.Tensor, torch.Tensor | None]:
    """(context (B, heads, T, d), probabilities (B, heads, T, L) or None) of (B, heads, T|L, d)
    queries, keys and values; ``dropout`` is the rate in effect (0 in eval mode)."""
    if not need_weights:  # SDPA, except while training with dropout on CPU (ember.nn.dropout)
        return attend(q, k, v, attn_mask=mask, dropout_p=dropout, is_causal=is_causal, scale=scale), None
    if is_causal:  # the explicit path needs the triangle as a mask (no other mask is given)
        mask = torch.ones(q.shape[-2], k.shape[-2], dtype=torch.bool, device=q.device).tril()
    probs = attention_scores(q, k, mask, scale).softmax(-1)
    return F.dropout(probs, dropout, dropout > 0) @ v, probs


def refuse_unformed(variant: str, need_weights: bool, mask=None, why_no_globals: str = "") -> None:
    """The efficient-attention variants' refusals, one line each: attention probabilities (none of
    them forms the (T, T) matrix) and, where ``why_no_globals`` says why, Longformer's global
    positions (``mask``: the encoder's LongMask)."""
    if need_weights:
        raise EmberError(f"attention probabilities are not available with model.attention={variant} "
                         "(it never forms the (T, T) matrix); ask for hidden states instead")
    if why_no_globals and mask is not None and mask.num_global:
        raise EmberError(f"global_attention_mask or model.attention_global is Longformer's "
                         f"(model.attention=longformer); {why_no_globals}")


class _PackedHeads(torch.autograd.Function):
    """(B, T, 3, heads, d) fused-QKV output -> contiguous (B, heads, T, d) q * scale, k and v, for
    attention that forms its probabilities with batched products (``attend`` with dropout on CPU).

    Taken as strided views, q was scaled into a tensor of q's own order and copied again by the
    product, k was copied transposed (the slowest of the copies), and the backward stacked dq,
    dk, dv and permuted the stack. Here each is copied once, q scaled on the way, k enters the
    scores' product as a transposed operand, and the backward writes the three gradients
    straight into one (B, T, 3, heads, d) tensor. Same arithmetic, so the same numbers."""

    @staticmethod
    def forward(ctx, qkv: torch.Tensor, scale: float):
        b, t, _, heads, d = qkv.shape
        ctx.scale = scale
        q, k, v = (qkv.new_empty(b, heads, t, d) for _ in range(3))
        torch.mul(qkv[:, :, 0].transpose(1, 2), scale, out=q)
        k.copy_(qkv[:, :, 1].transpose(1, 2))
        v.copy_(qkv[:, :, 2].transpose(1, 2))
        return q, k, v

    @staticmethod
    @once_differentiable
    def backward(ctx, dq: torch.Tensor, dk: torch.Tensor, dv: torch.Tensor):
        b, heads, t, d = dq.shape
        grad = dq.new_empty(b, t, 3, heads, d)
        torch.mul(dq.transpose(1, 2), ctx.scale, out=grad[:, :, 0])
        grad[:, :, 1].copy_(dk.transpose(1, 2))
        grad[:, :, 2].copy_(dv.transpose(1, 2))
        return grad, None


class SelfAttention(nn.Module):
    def __init__(self, hidden_size: int, num_heads: int, dropout: float, bias: bool = True) -> None:
        super().__init__()
        self.num_heads = num_heads
        self.head_dim = hidden_size // num_heads
        self.qkv = nn.Linear(hidden_size, 3 * hidden_size, bias=bias)
        self.out = nn.Linear(hidden_size, hidden_size, bias=bias)
        self.dropout_p = dropout

    def forward(
        self,
        x: torch.Tensor,  # (B, T, H)
        mask: torch.Tensor | None = None,  # bool (B, 1, 1|T, T), True = may attend
        need_weights: bool = False,
        is_causal: bool = False,  # position i attends to positions <= i (mask must be None)
        kv_cache=None,  # ember.nn.kv_cache.LayerKV: keys/values of earlier positions
        rows=None,  # ember.nn.query_rows.QueryRows: queries only there -> (B, Q, H)
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        if rows is not None:
            return self._at_rows(x, mask, rows), None
        b, t, h = x.shape
        qkv = dense(self.qkv, x).view(b, t, 3, self.num_heads, self.head_dim)
        dropout = self.dropout_p if self.training else 0.0
        packed = kv_cache is None and not need_weights and not is_recording()  # compilers: plain ops
        if packed and forms_probabilities(x.device, dropout):
            q, k, v = _PackedHeads.apply(qkv, 1.0 / math.sqrt(self.head_dim))  # contiguous, q scaled
            context, probs = attend(q, k, v, mask, dropout, is_causal, scale=1.0), None
        else:
            q, k, v = qkv.permute(2, 0, 3, 1, 4)  # 3 x (B, heads, T, d) views
            if kv_cache is not None:
                k, v = kv_cache.update(k, v)  # (B, heads, L, d) with L = earlier + T positions
            context, probs = attention(q, k, v, mask, dropout, need_weights, is_causal)
        return dense(self.out, context.transpose(1, 2).reshape(b, t, h)), probs

    def _at_rows(self, x: torch.Tensor, mask: torch.Tensor | None, rows) -> torch.Tensor:
        """The attention output at ``rows`` only (ember.nn.query_rows): keys and values from every
        position, queries from the rows, through the fused weight's query and key/value slices."""
        b, t, h = x.shape
        if type(self.qkv) is nn.Linear:
            w, bias = self.qkv.weight, self.qkv.bias
            q = linear(rows.gather(x), w[:h], None if bias is None else bias[:h])  # (B, Q, H)
            kv = linear(x, w[h:], None if bias is None else bias[h:])  # (B, T, 2H)
        else:  # e.g. an int8 layer, whose weight cannot be sliced: every query, then the rows'
            qkv = dense(self.qkv, x)
            q, kv = rows.gather(qkv[..., :h]), qkv[..., h:]
        k, v = kv.view(b, t, 2, self.num_heads, self.head_dim).permute(2, 0, 3, 1, 4)  # (B, heads, T, d)
        q = q.view(b, -1, self.num_heads, self.head_dim).transpose(1, 2)  # (B, heads, Q, d)
        if mask is not None and mask.shape[-2] != 1:  # a per-query mask (visibility, causal padding)
            mask = rows.gather(mask, 2)
        dropout = self.dropout_p if self.training else 0.0
        if forms_probabilities(x.device, dropout):  # the full (B, heads, T, T) draw, used at the rows
            probs = attention_scores(q, k, mask).softmax(-1)
            context = dropout_at_rows(probs, dropout, True, (b, self.num_heads, t, t), rows, dim=2) @ v
        else:
            context = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, dropout_p=dropout)
        return dense(self.out, context.transpose(1, 2).reshape(b, q.shape[2], h))


class MultiHeadAttention(nn.Module):
    """Self- or cross-attention with separate q/k/v/out projections of ``num_heads * head_dim``."""

    def __init__(self, hidden_size: int, num_heads: int, head_dim: int = 0, dropout: float = 0.0,
                 bias: bool = True, scale: float | None = None) -> None:
        super().__init__()
        self.num_heads = num_heads
        self.head_dim = head_dim or hidden_size // num_heads
        inner = num_heads * self.head_dim
        self.q = nn.Linear(hidden_size, inner, bias=bias)
        self.k = nn.Linear(hidden_size, inner, bias=bias)
        self.v = nn.Linear(hidden_size, inner, bias=bias)
        self.out = nn.Linear(inner, hidden_size, bias=bias)
        self.dropout_p = dropout
        self.scale = scale  # None: 1/sqrt(head_dim); T5 uses 1 (folded into the q init)

    def _heads(self, x: torch.Tensor) -> torch.Tensor:  # (B, T, heads * d) -> (B, heads, T, d)
        return x.view(x.shape[0], x.shape[1], self.num_heads, self.head_dim).transpose(1, 2)

    def forward(
        self,
        x: torch.Tensor,  # (B, T, H): the queries' sequence
        memory: torch.Tensor | None = None,  # (B / G, S, H): cross-attention over it; None = self
        mask: torch.Tensor | None = None,  # bool or additive float, broadcastable to (B, heads, T, L)
        need_weights: bool = False,
        kv_cache=None,  # LayerKV: self-attention appends to it; cross-attention fills it once
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        b, t, _ = x.shape
        q = self._heads(dense(self.q, x))
        if memory is None:
            k, v = self._heads(dense(self.k, x)), self._heads(dense(self.v, x))
            if kv_cache is not None:
                k, v = kv_cache.update(k, v)  # (B, heads, past + T, d)
        elif kv_cache is not None and kv_cache.k is not None:
            k, v = kv_cache.k, kv_cache.v  # the encoder's keys/values, from the first step
        else:
            k, v = self._heads(dense(self.k, memory)), self._heads(dense(self.v, memory))  # (B, heads, S, d)
            if kv_cache is not None:
                kv_cache.update(k, v)
        dropout = self.dropout_p if self.training else 0.0
        group = b // k.shape[0]  # query rows per memory row: beam search's beams of one input
        if group > 1:  # (B * G, heads, T, d) -> (B, heads, G * T, d): each input's K/V read once
            q = q.view(k.shape[0], group, self.num_heads, t, -1).transpose(1, 2).reshape(
                k.shape[0], self.num_heads, group * t, -1)
        context, probs = attention(q, k, v, mask, dropout, need_weights, scale=self.scale)
        if group > 1:  # back to (B * G, heads, T, d)
            context = context.view(k.shape[0], self.num_heads, group, t, -1).transpose(1, 2).reshape(
                b, self.num_heads, t, -1)
            if probs is not None:
                probs = probs.view(k.shape[0], self.num_heads, group, t, -1).transpose(1, 2).reshape(
                    b, self.num_heads, t, -1)
        return dense(self.out, context.transpose(1, 2).reshape(b, t, -1)), probs
