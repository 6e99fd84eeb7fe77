"""Sinusoidal relative position encodings and the relative shift (Transformer-XL, Dai et al.
2019 §3.3; used by XLNet, Yang et al. 2019 §2.4).

Attention between query i and key j depends on their distance i - j, not on absolute
positions: one sinusoid table R (P, H) covers every distance the segment can see, and the
position term of the score, (q_i + r_r) . W_r R_{i-j} (term (b)+(d) of Transformer-XL eq. in
§3.3), is computed for all P distances of every query and then shifted into (query, key)
alignment by ``rel_shift`` - a reshape, no gather.

Distances, for T queries after M memory positions (K = M + T keys; query i sits at absolute
position M + i):
- ``attn_type="bi"`` (XLNet): K, K-1, ..., -T+1 (P = K + T): every key, before or after.
- ``attn_type="uni"`` (Transformer-XL): K, K-1, ..., 0 (P = K + 1): keys at or before the query
  (later keys are masked, so their shifted scores, which are not meaningful, are never used).
``clamp_len > 0`` clips distances to [-clamp_len, clamp_len]. ``bi_data`` (XLNet's
bidirectional data pipeline) gives a second table with every distance negated, used by the
second half of a batch: that half reads its text with mirrored positions.
"""

from __future__ import annotations

import torch

from ember.errors import EmberError


def relative_distances(qlen: int, klen: int, attn_type: str, device=None) -> torch.Tensor:
    """float (P,): the distance of each row of the position table, largest first."""
    if attn_type == "bi":
        stop = -qlen
    elif attn_type == "uni":
        stop = -1
    else:
        raise EmberError(f"attention type {attn_type!r}; choose 'bi' or 'uni'")
    return torch.arange(klen, stop, -1, device=device, dtype=torch.int64).float()


def sinusoid_table(distances: torch.Tensor, dim: int) -> torch.Tensor:
    """(P,) distances -> (P, dim) [sin(d w_k) | cos(d w_k)], w_k = 1 / 10000^(2k/dim)
    (Vaswani et al. 2017 §3.5, applied to distances; sines then cosines, not interleaved)."""
    inv_freq = 1.0 / torch.pow(10000, torch.arange(0, dim, 2, device=distances.device,
                                                   dtype=torch.int64).float() / dim)  # (dim/2,)
    angles = distances[:, None] * inv_freq[None, :]  # (P, dim/2)
    return torch.cat([angles.sin(), angles.cos()], dim=-1)


def relative_positions(qlen: int, klen: int, dim: int, attn_type: str = "bi", clamp_len: int = -1,
                       bi_data: bool = False, device=None) -> torch.Tensor:
    """(D, P, dim) position table, D = 2 with ``bi_data`` (forward, then mirrored) else 1."""
    forward = relative_distances(qlen, klen, attn_type, device)
    tables = [forward, -forward] if bi_data else [forward]
    if clamp_len > 0:
        tables = [d.clamp(-clamp_len, clamp_len) for d in tables]
    return torch.stack([sinusoid_table(d, dim) for d in tables])


def rel_shift(x: torch.Tensor, klen: int) -> torch.Tensor:
    """(..., T, P) scores against the P table rows -> (..., T, klen) scores against the keys.

    Row i of the output takes x[..., i, j + T - i] for key j: the table row whose distance is
    (M + i) - j, the query's absolute position minus the key's. Done as Transformer-XL does
    (App. B): view the (T, P) block as (P, T), drop its first row, view it back as (T, P - 1),
    so each query row slides left by one more than the row above; keep the first klen columns.
    """
    *lead, t, p = x.shape
    x = x.reshape(*lead, p, t)[..., 1:, :].reshape(*lead, t, p - 1)
    return x[..., :klen]
