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
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from ember.nn.dropout import attend


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
) -> torch.Tensor:
    """The context (B, T, h, d) of banded attention (plus global keys): see the module docstring."""
    b, t, h, d = q.shape
    r = radius
    s, n, blocks = _sizes(t, r, dilation)  # s queries per block
    rows = b * dilation * blocks

    def windows(x: torch.Tensor, g: torch.Tensor | None) -> torch.Tensor:  # -> (rows, h, G + s + 2r, d)
        x = F.pad(_interleave(x, dilation, n), (0, 0, 0, 0, r, r))  # (B, dil, n + 2r, h, d)
        x = x.unfold(2, s + 2 * r, s).permute(0, 1, 2, 3, 5, 4)  # (B, dil, blocks, h, s + 2r, d)
        if g is not None:
            g = g.transpose(1, 2)[:, None, None].expand(b, dilation, blocks, h, -1, d)
            x = torch.cat([g, x], dim=-2)
        return x.reshape(rows, h, -1, d)

    qs = _interleave(q, dilation, n).reshape(b, dilation, blocks, s, h, d).transpose(3, 4).reshape(rows, h, s, d)
    context = attend(qs, windows(k, global_k), windows(v, global_v), bias, dropout)  # (rows, h, s, d)
    context = context.view(b, dilation, blocks, h, s, d).transpose(3, 4).reshape(b, dilation, n, h, d)
    return context.transpose(1, 2).reshape(b, n * dilation, h, d)[:, :t]
