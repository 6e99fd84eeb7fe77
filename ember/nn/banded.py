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
them again from the keys and values and adds their gradients back (``_Windows.add_adjoint``), so a
stack of layers does not hold every layer's 5 copies of its keys, and forward and backward take
the query blocks a few at a time, so no window and no probabilities-sized temporary exists whole
(one layer at 4,096 tokens, H = 384: peak 620 -> 470 MB, 4.4x less than full attention; six
layers: -19% against keeping the windows).
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch.autograd.function import once_differentiable

from ember.nn.dropout import (attend, attention_scores, dropped_product, forms_probabilities, keep_mask,
                              softmax_dropout_backward)


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
    """The key/value windows of ``band_attention`` and their adjoint. ``pad``: (B, T, h, d) keys ->
    the B x dilation interleaved sequences, zero-padded by radius at both ends. ``of_blocks``: the
    windows of some blocks, (rows, h, G + b + 2 radius, d): block c's G global keys and the
    positions from radius before its first query to radius after its last (an unfold of the padded
    sequence); calling the object gives every block's. ``add_adjoint`` adds such windows' gradient
    back where they were read (overlap-add) and ``unpad`` turns the sum into the keys' gradient:
    the backward of the training band walks the blocks a few at a time with them, never holding
    every window at once."""

    def __init__(self, batch: int, length: int, heads: int, dim: int, radius: int, dilation: int) -> None:
        self.batch, self.length, self.heads, self.dim = batch, length, heads, dim
        self.radius, self.dilation = radius, dilation
        self.block, self.n, self.blocks = _sizes(length, radius, dilation)
        self.sequences = batch * dilation
        self.spans = (self.block + 2 * radius) // self.block  # a window is this many blocks (5 or 3: query_block)

    def pad(self, x: torch.Tensor) -> torch.Tensor:
        """(B, T, h, d) -> (B x dilation, n + 2 radius, h, d): sequence i x dilation + m holds the
        positions m, m + dilation, ... of batch row i, between radius zeros at each end."""
        x = F.pad(_interleave(x, self.dilation, self.n), (0, 0, 0, 0, self.radius, self.radius))
        return x.view(self.sequences, self.n + 2 * self.radius, self.heads, self.dim)

    def __call__(self, x: torch.Tensor, g: torch.Tensor | None) -> torch.Tensor:
        return self.of_blocks(self.pad(x), g, (0, self.sequences, 0, self.blocks))

    def chunks(self, rows: int):
        """(first sequence, stop, first block, stop) covering every block about ``rows`` at a time:
        whole sequences together while a sequence has fewer blocks, else blocks of one sequence."""
        if rows >= self.blocks:
            step = rows // self.blocks
            for first in range(0, self.sequences, step):
                yield first, min(self.sequences, first + step), 0, self.blocks
        else:
            for sequence in range(self.sequences):
                for first in range(0, self.blocks, rows):
                    yield sequence, sequence + 1, first, min(self.blocks, first + rows)

    def rows(self, part) -> slice:
        """The rows (of the queries, the windows, the probabilities) of one of ``chunks``."""
        s0, s1, first, stop = part
        return slice(s0 * self.blocks + first, (s1 - 1) * self.blocks + stop)

    def of_blocks(self, padded: torch.Tensor, g: torch.Tensor | None, part) -> torch.Tensor:
        """The windows of one of ``chunks`` from ``pad``'s output [+ the (B, G, h, d) global keys]."""
        r, s = self.radius, self.block
        s0, s1, first, stop = part
        x = padded[s0:s1, first * s:(stop - 1) * s + s + 2 * r].unfold(1, s + 2 * r, s).transpose(-1, -2)
        if g is not None:  # (sequences, blocks, h, s + 2r, d) after the sequences' global keys
            g = g[torch.arange(s0, s1, device=g.device) // self.dilation].transpose(1, 2)  # (sequences, h, G, d)
            x = torch.cat([g[:, None].expand(-1, stop - first, -1, -1, -1), x], dim=-2)
        return x.reshape(-1, self.heads, x.shape[-2], self.dim)

    def add_adjoint(self, grad: torch.Tensor, grad_padded: torch.Tensor, grad_g: torch.Tensor | None, part) -> None:
        """Adds the gradient of one chunk's windows (``of_blocks``' shape) into ``grad_padded``
        (``pad``'s shape) and ``grad_g`` (B, G, h, d), in place."""
        s = self.block
        s0, s1, first, stop = part
        grad = grad.view(s1 - s0, stop - first, self.heads, -1, self.dim)
        globals_ = grad.shape[3] - s - 2 * self.radius
        if globals_:
            index = torch.arange(s0, s1, device=grad.device) // self.dilation
            grad_g.index_add_(0, index, grad[:, :, :, :globals_].sum(1).transpose(1, 2))
        for j in range(self.spans):  # the windows' j-th blocks of positions start j blocks further on
            part_j = grad[:, :, :, globals_ + j * s:globals_ + (j + 1) * s].transpose(2, 3)  # (seqs, c, s, h, d)
            grad_padded[s0:s1, (first + j) * s:(stop + j) * s] += part_j.reshape(s1 - s0, -1, self.heads, self.dim)

    def unpad(self, grad_padded: torch.Tensor) -> torch.Tensor:
        """``pad``'s adjoint: (B x dilation, n + 2 radius, h, d) -> (B, T, h, d)."""
        inner = grad_padded.view(self.batch, self.dilation, -1, self.heads, self.dim)[:, :, self.radius:self.radius + self.n]
        return inner.transpose(1, 2).reshape(self.batch, self.n * self.dilation, self.heads, self.dim)[:, :self.length]


def _chunk_rows(probs: torch.Tensor) -> int:
    """Query blocks per step of ``_WindowAttention``'s forward and backward: ~16 MB of probabilities."""
    return max(1, (16 << 20) // max(1, probs[0].numel() * probs.element_size()))


class _WindowAttention(torch.autograd.Function):
    """Query blocks against their key/value windows, training with dropout on CPU: the arithmetic
    of ``attend`` (``ember.nn.dropout``), keeping for the backward the keys and values themselves
    rather than their windows, which hold each key (b + 2 radius) / b times (5 with b = radius / 2)
    and are unfolded again in the backward: a 384-wide layer at 4,096 tokens keeps 60 MB less per
    layer, for two unfold copies more. Both passes go ``_Windows.chunks`` at a time. The forward's
    outputs are ``attend``'s, bit for bit; the gradients agree to float rounding (the windows'
    gradients are added back here, not by autograd)."""

    @staticmethod
    def forward(ctx, qs, k, v, global_k, global_v, bias, p, windows):
        # A few query blocks at a time (``_chunk_rows``), as in the backward: the windows and the
        # dropped probabilities of every block at once would be the forward's peak (at 4,096
        # tokens, H = 384: 2 x 31 + 126 MB). The keep mask is drawn whole, before, so the random
        # stream and every number are ``attend``'s.
        padded_k, padded_v = windows.pad(k), windows.pad(v)
        width = bias.shape[-1]
        probs = qs.new_empty(qs.shape[0], qs.shape[1], qs.shape[2], width)
        keep = keep_mask(probs.shape, p, probs.device)
        out = torch.empty_like(qs)
        for part in windows.chunks(_chunk_rows(probs)):
            at = windows.rows(part)
            scores = attention_scores(qs[at], windows.of_blocks(padded_k, global_k, part), bias[at])
            torch.ops.aten._softmax.out(scores, -1, False, out=probs[at])
            dropped_product(probs[at], keep[at], windows.of_blocks(padded_v, global_v, part), p, out=out[at])
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
        scale = 1.0 / math.sqrt(qs.shape[-1])
        scaled_q = qs * scale  # scores = scaled_q @ kw^T (attention_scores)
        padded_k, padded_v = windows.pad(k), windows.pad(v)
        grad_q, grad_pk, grad_pv = torch.empty_like(qs), torch.zeros_like(padded_k), torch.zeros_like(padded_v)
        grad_gk, grad_gv = (None, None) if global_k is None else (torch.zeros_like(global_k), torch.zeros_like(global_v))
        # A few query blocks at a time: their key and value windows (each key 5 times), the
        # windows' gradients, the probabilities' gradient and the rebuilt dropped probabilities,
        # whole, were the layer's peak (at 4,096 tokens, H = 384: 4 x 31 + 2 x 126 MB); in
        # chunks of ~16 MB of probabilities they are not.
        for part in windows.chunks(_chunk_rows(probs)):
            at = windows.rows(part)
            kw, vw = windows.of_blocks(padded_k, global_k, part), windows.of_blocks(padded_v, global_v, part)
            grad_scores, grad_vw = softmax_dropout_backward(grad[at], probs[at], vw, keep[at], ctx.p)
            windows.add_adjoint(grad_vw, grad_pv, grad_gv, part)
            torch.matmul(grad_scores, kw, out=grad_q[at]).mul_(scale)
            windows.add_adjoint(grad_scores.transpose(-1, -2) @ scaled_q[at], grad_pk, grad_gk, part)
        grad_k, grad_v = windows.unpad(grad_pk), windows.unpad(grad_pv)
        return grad_q, grad_k, grad_v, grad_gk, grad_gv, None, None, None
