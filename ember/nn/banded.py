"""Banded (sliding-window) attention in O(T x window) memory: Longformer's local attention
(Beltagy et al. 2020, §3.1), with dilation and a few global keys every query also reads.

Query i reads the keys i + dilation * j for |j| <= radius (2 * radius + 1 positions; Longformer's
and transformers' "attention_window" w is 2 * radius), plus the G global keys (§3.1 "Global
Attention": every token attends to them).

Layout. Dilation d splits the sequence into d interleaved sequences (positions m, m + d,
m + 2d, ...), inside which the dilated band is an ordinary band, so d becomes a batch axis.
Each interleaved sequence is cut into blocks of ``radius`` queries; block c's keys are the G
global keys and blocks c - 1, c, c + 1 (3 * radius keys, an ``unfold`` of the zero-padded
keys). Each block is then one small dense attention, (B d T/(d radius), heads, radius, G + 3
radius), run by PyTorch's fused SDPA kernel (``ember.nn.dropout.attend``): no (T, T) matrix
and, on CPU, not even the (radius, 3 radius) scores are kept. That is 1.5x the band's 2 radius
+ 1 entries, traded for one fused call (transformers' chunks of 2w queries against 2w keys
compute 2x the band and copy it into diagonals, forward and backward).

The additive mask (``window_bias``, (blocks, 1, radius, G + 3 radius), shared by the heads and by
every layer with the same window) is 0 where a query may read a key and the dtype's lowest value
outside the band, at padding keys, at global keys (they have their own columns) and past the end:
a query with nothing to read (a pad) gets a finite uniform row, never NaN.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from ember.nn.dropout import attend


def band_mask(radius: int, device=None) -> torch.Tensor:
    """bool (radius, 3 radius): query a of a block may read window column c (key offset
    c - radius - a from the query) when that offset lies in [-radius, radius]."""
    a = torch.arange(radius, device=device)[:, None]
    c = torch.arange(3 * radius, device=device)[None, :]
    return (c >= a) & (c <= a + 2 * radius)


def _sizes(t: int, radius: int, dilation: int) -> tuple[int, int]:
    """(positions per interleaved sequence n, a whole number of blocks; blocks per sequence)."""
    n = -(-t // (dilation * radius)) * radius
    return n, n // radius


def _interleave(x: torch.Tensor, dilation: int, n: int) -> torch.Tensor:
    """(B, T, ...) -> (B, dilation, n, ...), zero-padded to n * dilation positions: row m holds
    positions m, m + dilation, m + 2 dilation, ..."""
    b, t = x.shape[:2]
    x = F.pad(x, (0, 0) * (x.dim() - 2) + (0, n * dilation - t))
    return x.view(b, n, dilation, *x.shape[2:]).transpose(1, 2)


def window_bias(key_ok: torch.Tensor, global_ok: torch.Tensor | None, radius: int, dilation: int,
                dtype: torch.dtype) -> torch.Tensor:
    """Additive mask (B * dilation * blocks, 1, radius, G + 3 radius) of ``band_attention``:
    ``key_ok`` bool (B, T) the keys the band may read, ``global_ok`` bool (B, G) the filled
    global slots."""
    b, t = key_ok.shape
    n, blocks = _sizes(t, radius, dilation)
    ok = F.pad(_interleave(key_ok, dilation, n), (radius, radius)).unfold(-1, 3 * radius, radius)  # (B, dil, blocks, 3r)
    allowed = ok[..., None, :] & band_mask(radius, key_ok.device)  # (B, dil, blocks, r, 3r)
    if global_ok is not None and global_ok.shape[1]:
        g = global_ok[:, None, None, None, :].expand(b, dilation, blocks, radius, -1)
        allowed = torch.cat([g, allowed], dim=-1)
    bias = torch.zeros(allowed.shape, dtype=dtype, device=key_ok.device)
    bias.masked_fill_(~allowed, torch.finfo(dtype).min)
    return bias.view(b * dilation * blocks, 1, radius, -1)


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
) -> torch.Tensor:
    """The context (B, T, h, d) of banded attention (plus global keys): see the module docstring."""
    b, t, h, d = q.shape
    r = radius
    n, blocks = _sizes(t, r, dilation)
    rows = b * dilation * blocks

    def windows(x: torch.Tensor, g: torch.Tensor | None) -> torch.Tensor:  # -> (rows, h, G + 3r, d)
        x = F.pad(_interleave(x, dilation, n), (0, 0, 0, 0, r, r))  # (B, dil, n + 2r, h, d)
        x = x.unfold(2, 3 * r, r).permute(0, 1, 2, 3, 5, 4)  # (B, dil, blocks, h, 3r, d)
        if g is not None:
            g = g.transpose(1, 2)[:, None, None].expand(b, dilation, blocks, h, -1, d)
            x = torch.cat([g, x], dim=-2)
        return x.reshape(rows, h, -1, d)

    qs = _interleave(q, dilation, n).reshape(b, dilation, blocks, r, h, d).transpose(3, 4).reshape(rows, h, r, d)
    context = attend(qs, windows(k, global_k), windows(v, global_v), bias, dropout)  # (rows, h, r, d)
    context = context.view(b, dilation, blocks, h, r, d).transpose(3, 4).reshape(b, dilation, n, h, d)
    return context.transpose(1, 2).reshape(b, n * dilation, h, d)[:, :t]
