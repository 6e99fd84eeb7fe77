"""Banded (sliding-window) attention in O(T x window) memory: Longformer's local attention
(Beltagy et al. 2020, §3.1), with dilation and a few global keys every query also reads.

Query i reads the keys i + dilation * j for |j| <= radius (the window w = 2 * radius + 1
positions, "attention_window" w' = 2 * radius in Longformer's and transformers' naming), plus
the G global keys (§3.1 "Global Attention": every token attends to them).

Layout. Dilation d splits the sequence into d interleaved sequences (positions m, m + d,
m + 2d, ...), inside which the dilated band is an ordinary band, so d becomes a batch axis.
Each interleaved sequence is cut into blocks of ``radius`` queries; block c's keys are blocks
c - 1, c, c + 1 (3 * radius keys), an ``unfold`` view of the zero-padded keys. Scores are
(B, heads, d, T / (d radius), radius, 3 radius): 1.5x the band's 2 radius + 1 entries, but two
plain batched products and no diagonal re-packing (transformers' chunks of 2w' queries against
2w' keys compute 2x the band and copy it into diagonals twice). Entries outside the band, keys
that are padding or global (global keys have their own columns) and positions past the end are
set to the dtype's lowest value before the softmax, so a query with nothing to read (a pad)
gets a finite uniform row, never NaN.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F


def _interleave(x: torch.Tensor, dilation: int, n: int) -> torch.Tensor:
    """(B, h, T, d) -> (B, h, dilation, n, d), zero-padded to n * dilation positions: row m holds
    positions m, m + dilation, m + 2 dilation, ..."""
    b, h, t, d = x.shape
    x = F.pad(x, (0, 0, 0, n * dilation - t))
    return x.view(b, h, n, dilation, d).transpose(2, 3)


def _key_windows(x: torch.Tensor, radius: int) -> torch.Tensor:
    """(..., n, d) -> (..., n / radius, d, 3 radius): block c's keys are blocks c-1, c, c+1
    (zeros before the start and after the end), a strided view of the padded tensor."""
    return F.pad(x, (0, 0, radius, radius)).unfold(-2, 3 * radius, radius)


def band_mask(radius: int, device=None) -> torch.Tensor:
    """bool (radius, 3 radius): query a of a block may read window column c (key offset
    c - radius - a from the query) when that offset lies in [-radius, radius]."""
    a = torch.arange(radius, device=device)[:, None]
    c = torch.arange(3 * radius, device=device)[None, :]
    return (c >= a) & (c <= a + 2 * radius)


def band_attention(
    q: torch.Tensor,  # (B, h, T, d), already scaled by 1/sqrt(d)
    k: torch.Tensor,  # (B, h, T, d)
    v: torch.Tensor,  # (B, h, T, d)
    key_ok: torch.Tensor,  # bool (B, T): keys the band may read (real tokens, not global)
    radius: int,
    dilation: int = 1,
    global_k: torch.Tensor | None = None,  # (B, h, G, d): keys every query reads
    global_v: torch.Tensor | None = None,  # (B, h, G, d)
    global_ok: torch.Tensor | None = None,  # bool (B, G): which of the G slots hold a key
    dropout: float = 0.0,  # the rate in effect (0 in eval mode)
) -> torch.Tensor:
    """The context (B, h, T, d) of banded attention (plus global keys), see the module docstring.
    The softmax runs in at least fp32 (as transformers' Longformer) and returns to the inputs' dtype."""
    b, h, t, d = q.shape
    r = radius
    n = -(-t // (dilation * r)) * r  # positions per interleaved sequence: whole blocks of r
    blocks = n // r
    qs = _interleave(q, dilation, n).reshape(b, h, dilation, blocks, r, d)
    ks, vs = _interleave(k, dilation, n), _interleave(v, dilation, n)
    scores = qs @ _key_windows(ks, r)  # (B, h, dil, blocks, r, 3r)
    ok = F.pad(key_ok, (0, n * dilation - t)).view(b, n, dilation).transpose(1, 2)  # (B, dil, n)
    ok = F.pad(ok, (r, r)).unfold(-1, 3 * r, r)  # (B, dil, blocks, 3r)
    allowed = ok[:, None, :, :, None, :] & band_mask(r, q.device)  # (B, 1, dil, blocks, r, 3r)
    low = torch.finfo(scores.dtype).min
    scores = scores.masked_fill_(~allowed, low)
    g = 0 if global_k is None else global_k.shape[2]
    if g:  # (B, h, dil, n, G) -> blocked, then in front of the window's columns
        gs = (qs.view(b, h, dilation, n, d) @ global_k[:, :, None].transpose(-1, -2))
        gs = gs.masked_fill_(~global_ok[:, None, None, None, :], low).view(b, h, dilation, blocks, r, g)
        scores = torch.cat([gs, scores], dim=-1)
    probs = scores.softmax(-1, dtype=torch.promote_types(q.dtype, torch.float32)).to(q.dtype)
    if dropout > 0:
        probs = F.dropout(probs, dropout, True)
    context = probs[..., g:] @ _key_windows(vs, r).transpose(-1, -2)  # (B, h, dil, blocks, r, d)
    if g:
        context = context + probs[..., :g] @ global_v[:, :, None, None]
    context = context.view(b, h, dilation, n, d).transpose(2, 3).reshape(b, h, n * dilation, d)
    return context[:, :, :t]
