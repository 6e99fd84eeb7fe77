"""Banded (sliding-window) attention in O(T x window) memory: Longformer's local attention
(Beltagy et al. 2020, §3.1), with dilation and a few global keys every query also reads.

Query i reads the keys i + dilation * j for |j| <= radius (2 * radius + 1 positions; Longformer's
and transformers' "attention_window" w is 2 * radius), plus the G global keys (§3.1 "Global
Attention": every token attends to them).

Layout. Dilation d splits the sequence into d interleaved sequences (positions m, m + d,
m + 2d, ...), inside which the dilated band is an ordinary band, so d becomes a batch axis.
Each interleaved sequence is cut into blocks of b queries (``query_block``: radius / 2 when
radius is even, else radius); block c's keys are the G global keys and the b + 2 radius
positions from radius before its first query to radius after its last (an ``unfold`` of the
zero-padded keys). Each block is then one small dense attention, (B d T/(d b), heads, b, G + b
+ 2 radius), run by PyTorch's fused SDPA kernel (``ember.nn.dropout.attend``): no (T, T) matrix
and, on CPU, not even a block's scores are kept. That is (b + 2 radius) / (2 radius + 1) of the
band's entries, 1.25x with b = radius / 2 (1.5x with b = radius, this module's first layout;
the half-size blocks hold 5 copies of each key in their windows instead of 3, so the saving is
small: a 768-wide training layer at 4,096 tokens 1-2% faster, peak memory 1,045 against 1,083 MB on
a Zen 4 EPYC), traded for one fused call (transformers' chunks of 2w queries against 2w keys
compute 2x the band and copy it into diagonals).

The additive mask (``window_bias``, (blocks, 1, b, G + b + 2 radius), shared by the heads and by
every layer with the same window) is 0 where a query may read a key and the dtype's lowest value
outside the band, at padding keys, at global keys (they have their own columns) and past the end:
a query with nothing to read (a pad) gets a finite uniform row, never NaN.

Training with dropout on CPU the probabilities are formed explicitly (``ember.nn.dropout``); the
windows are then kept out of the autograd graph (``_WindowAttention``): the backward unfolds
them again from the keys and values and adds their gradients back (``_Windows.adjoint``), so a
stack of layers does not hold every layer's 5 copies of its keys (six layers at 4,096 tokens:
-32% peak memory at H = 384).
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch.autograd.function import once_differentiable

from ember.nn.dropout import (attend, attention_scores, forms_probabilities, softmax_dropout_backward,
                              softmax_dropout_forward)


def query_block(radius: int) -> int:
    """Queries per block: half the radius when it halves evenly (the window then computes 1.25x
    the band instead of 1.5x), else the radius."""
    return radius // 2 if radius % 2 == 0 and radius >= 2 else radius


def band_mask(radius: int, device=None) -> torch.Tensor:
    """bool (b, b + 2 radius), b = ``query_block(radius)``: query a of a block may read window
    column c (key offset c - radius - a from the query) when that offset lies in [-radius, radius]."""
    b = query_block(radius)
    a = torch.arange(b, device=device)[:, None]
    c = torch.arange(b + 2 * radius, device=device)[None, :]
    return (c >= a) & (c <= a + 2 * radius)


def _sizes(t: int, radius: int, dilation: int) -> tuple[int, int, int]:
    """(queries per block b; positions per interleaved sequence n, a whole number of blocks;
    blocks per sequence)."""
    b = query_block(radius)
    n = -(-t // (dilation * b)) * b
    return b, n, n // b


def _interleave(x: torch.Tensor, dilation: int, n: int) -> torch.Tensor:
    """(B, T, ...) -> (B, dilation, n, ...), zero-padded to n * dilation positions: row m holds
    positions m, m + dilation, m + 2 dilation, ..."""
    b, t = x.shape[:2]
    x = F.pad(x, (0, 0) * (x.dim() - 2) + (0, n * dilation - t))
    return x.view(b, n, dilation, *x.shape[2:]).transpose(1, 2)


def window_bias(key_ok: torch.Tensor, global_ok: torch.Tensor | None, radius: int, dilation: int,
                dtype: torch.dtype) -> torch.Tensor:
    """Additive mask (B * dilation * blocks, 1, b, G + b + 2 radius) of ``band_attention``:
    ``key_ok`` bool (B, T) the keys the band may read, ``global_ok`` bool (B, G) the filled
    global slots."""
    b, t = key_ok.shape
    s, n, blocks = _sizes(t, radius, dilation)  # s queries per block
    ok = F.pad(_interleave(key_ok, dilation, n), (radius, radius)).unfold(-1, s + 2 * radius, s)  # (B, dil, blocks, s+2r)
    allowed = ok[..., None, :] & band_mask(radius, key_ok.device)  # (B, dil, blocks, s, s+2r)
    if global_ok is not None and global_ok.shape[1]:
        g = global_ok[:, None, None, None, :].expand(b, dilation, blocks, s, -1)
        allowed = torch.cat([g, allowed], dim=-1)
    bias = torch.zeros(allowed.shape, dtype=dtype, device=key_ok.device)
    bias.masked_fill_(~allowed, torch.finfo(dtype).min)
    return bias.view(b * dilation * blocks, 1, s, -1)


def band_attention(
    q: torch.Tensor,  # (B, T, h, d): not scaled (SDPA scales by 1/sqrt(d))
    k: torch.Tensor,  # (B, T, h, d)
    v: torch.Tensor,  # (B, T, h, d)
    bias: torch.Tensor,  # window_bias(...) for these B, T, radius, dilation and G
    radius: int,
    dilation: int = 1,
    global_k: torch.Tensor | None = None,  # (B, G, h, d): keys every query reads
    global_v: torch.Tensor | None = None,  # (B, G, h, d)
    dropout: float = 0.0,  # the rate in effect (0 in eval mode)
    rebuild_windows: bool = True,  # training with dropout: keep k and v, not their windows (_WindowAttention)
) -> torch.Tensor:
    """The context (B, T, h, d) of banded attention (plus global keys): see the module docstring."""
    b, t, h, d = q.shape
    r = radius
    s, n, blocks = _sizes(t, r, dilation)  # s queries per block
    rows = b * dilation * blocks
    windows = _Windows(b, t, h, d, r, dilation)
    qs = _interleave(q, dilation, n).reshape(b, dilation, blocks, s, h, d).transpose(3, 4).reshape(rows, h, s, d)
    if rebuild_windows and forms_probabilities(q.device, dropout) and torch.is_grad_enabled() \
            and not torch.is_autocast_enabled("cpu"):
        context = _WindowAttention.apply(qs, k, v, global_k, global_v, bias, dropout, windows)
    else:
        context = attend(qs, windows(k, global_k), windows(v, global_v), bias, dropout)  # (rows, h, s, d)
    context = context.view(b, dilation, blocks, h, s, d).transpose(3, 4).reshape(b, dilation, n, h, d)
    return context.transpose(1, 2).reshape(b, n * dilation, h, d)[:, :t]


class _Windows:
    """The key/value windows of ``band_attention`` and their adjoint. Calling it: (B, T, h, d) keys
    [+ (B, G, h, d) global keys] -> (rows, h, G + b + 2 radius, d), block c's G global keys and the
    positions from radius before its first query to radius after its last (an unfold of the
    interleaved, zero-padded keys). ``adjoint``: a gradient of that shape -> the keys' (and global
    keys') gradients, each window added back where it was read (overlap-add, in place)."""

    def __init__(self, batch: int, length: int, heads: int, dim: int, radius: int, dilation: int) -> None:
        self.batch, self.length, self.heads, self.dim = batch, length, heads, dim
        self.radius, self.dilation = radius, dilation
        self.block, self.n, self.blocks = _sizes(length, radius, dilation)

    def __call__(self, x: torch.Tensor, g: torch.Tensor | None) -> torch.Tensor:
        b, h, d, r, s, dil = self.batch, self.heads, self.dim, self.radius, self.block, self.dilation
        blocks = self.blocks
        x = F.pad(_interleave(x, dil, self.n), (0, 0, 0, 0, r, r))  # (B, dil, n + 2r, h, d)
        x = x.unfold(2, s + 2 * r, s).permute(0, 1, 2, 3, 5, 4)  # (B, dil, blocks, h, s + 2r, d)
        if g is not None:
            g = g.transpose(1, 2)[:, None, None].expand(b, dil, blocks, h, -1, d)
            x = torch.cat([g, x], dim=-2)
        return x.reshape(b * dil * blocks, h, -1, d)

    def adjoint(self, grad: torch.Tensor, globals_: int) -> tuple[torch.Tensor, torch.Tensor | None]:
        b, h, d, r, s, dil = self.batch, self.heads, self.dim, self.radius, self.block, self.dilation
        blocks = self.blocks
        grad = grad.view(b, dil, blocks, h, -1, d)
        grad_g = grad[..., :globals_, :].sum(dim=(1, 2)).transpose(1, 2) if globals_ else None  # (B, G, h, d)
        spans = (s + 2 * r) // s  # a window is this many blocks of s positions (5 or 3: query_block)
        local = grad[..., globals_:, :].unflatten(4, (spans, s))  # (B, dil, blocks, h, spans, s, d)
        padded = grad.new_zeros(b, dil, blocks + spans - 1, s, h, d)  # the n + 2r padded positions
        for j in range(spans):  # window c's j-th block of positions is padded block c + j
            padded[:, :, j:j + blocks] += local[:, :, :, :, j].transpose(3, 4)
        padded = padded.view(b, dil, (blocks + spans - 1) * s, h, d)[:, :, r:r + self.n]  # (B, dil, n, h, d)
        grad_x = padded.transpose(1, 2).reshape(b, self.n * dil, h, d)[:, :self.length]
        return grad_x, grad_g


class _WindowAttention(torch.autograd.Function):
    """Query blocks against their key/value windows, training with dropout on CPU: the arithmetic
    of ``attend`` (``ember.nn.dropout``), keeping for the backward the keys and values themselves
    rather than their windows, which hold each key (b + 2 radius) / b times (5 with b = radius / 2)
    and are unfolded again in the backward: a 384-wide layer at 4,096 tokens keeps 60 MB less per
    layer, for two unfold copies more. The forward's outputs are ``attend``'s, bit for bit; the
    gradients agree to float rounding (the windows' gradients are added back here, not by autograd)."""

    @staticmethod
    def forward(ctx, qs, k, v, global_k, global_v, bias, p, windows):
        out, probs, keep = softmax_dropout_forward(attention_scores(qs, windows(k, global_k), bias),
                                                   windows(v, global_v), p)
        ctx.save_for_backward(qs, k, v, global_k, global_v)
        # intermediates, not inputs or outputs: held as attributes so the backward can let them go
        # as soon as it has used them
        ctx.probs, ctx.keep, ctx.p, ctx.windows = probs, keep, p, windows
        return out

    @staticmethod
    @once_differentiable  # no double backward: a create_graph=True caller gets an error, not wrong numbers
    def backward(ctx, grad):
        qs, k, v, global_k, global_v = ctx.saved_tensors
        if not hasattr(ctx, "probs"):
            raise RuntimeError("a second backward through a training Longformer attention (retain_graph=True): it "
                               "lets its probabilities go in the first; run one backward per forward")
        probs, keep, windows = ctx.probs, ctx.keep, ctx.windows
        del ctx.probs, ctx.keep
        globals_ = 0 if global_k is None else global_k.shape[1]
        grad_scores, grad_vw = softmax_dropout_backward(grad, probs, windows(v, global_v), keep, ctx.p)
        del probs, keep
        grad_v, grad_gv = windows.adjoint(grad_vw, globals_)
        del grad_vw
        scale = 1.0 / math.sqrt(qs.shape[-1])
        grad_q = (grad_scores @ windows(k, global_k)).mul_(scale)  # scores = (qs x scale) @ kw^T (attention_scores)
        grad_k, grad_gk = windows.adjoint(grad_scores.transpose(-1, -2) @ (qs * scale), globals_)
        return grad_q, grad_k, grad_v, grad_gk, grad_gv, None, None, None
