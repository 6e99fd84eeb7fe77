"""Performer attention, FAVOR+ (Choromanski et al. 2021, "Rethinking Attention with Performers"):
softmax attention approximated by positive orthogonal random features, in time and memory
linear in the length, as an attention variant of the encoder (``model.attention=performer``).

The softmax kernel exp(q.k) equals E_w[phi(q) phi(k)] for w ~ N(0, I_d) and the positive
features phi(x) = exp(w.x - |x|^2 / 2) (Lemma 1, "positive random features"; unbiased, and
their variance vanishes as the kernel does, unlike sin/cos features). With m features w_1..w_m
(rows of ``projection``, drawn as orthogonal blocks with chi-distributed norms, §2.4 ORFs):

    Att(Q, K, V) ~= D^-1 phi(Q) (phi(K)^T V),  D = diag(phi(Q) (phi(K)^T 1))       (§2.2, eq. 5)

with q and k scaled by d^-1/4 each, so q.k carries softmax attention's 1/sqrt(d). Padding keys
get phi = 0. Bidirectional: two products through the (m, d) summary phi(K)^T V, O(T m d).
Causal (§2.3, "prefix sums"): query i reads sum_{j<=i} phi(k_j) v_j^T, a cumulative sum over
positions, O(T m d) memory here (the paper's chunked kernel would bound it further).

Features are redrawn at every training call (each draw is an unbiased estimate) and fixed in
eval mode, drawn from a seed of the layer's own, so an evaluation is reproducible. Stabilising
constants (the maxima subtracted inside exp) cancel between numerator and D.
"""

from __future__ import annotations

import math

import torch

from ember.errors import EmberError
from ember.nn.attention import SelfAttention, refuse_unformed
from ember.nn.onednn import dense


def orthogonal_features(m: int, d: int, generator: torch.Generator | None = None, orthogonal: bool = True,
                        device=None, dtype=torch.float32) -> torch.Tensor:
    """(m, d) projection: Gaussian rows, made orthogonal in blocks of d (QR) and rescaled to the
    norms of Gaussian vectors (chi_d), so each row is still marginally N(0, I_d) (§2.4)."""
    rows = torch.randn(m, d, generator=generator, dtype=torch.float64)
    if orthogonal:
        blocks = []
        for start in range(0, m, d):
            q, r = torch.linalg.qr(torch.randn(d, d, generator=generator, dtype=torch.float64))
            q = q * torch.sign(torch.diagonal(r))  # the signs that make Q Haar-uniform (QR alone is not)
            blocks.append(q.T[: m - start])
        norms = rows.norm(dim=1, keepdim=True)  # chi_d lengths from independent Gaussian rows
        rows = torch.cat(blocks) * norms
    return rows.to(device=device, dtype=dtype)


def positive_features(x: torch.Tensor, projection: torch.Tensor, is_query: bool) -> torch.Tensor:
    """phi(x) (..., T, m) of (..., T, d) inputs already scaled by d^-1/4: exp(w.x - |x|^2/2 - c)/sqrt(m),
    with c the row's maximum for queries and the maximum over all keys of a sequence for keys
    (constants that cancel in D^-1 phi(Q)(...))."""
    wx = x @ projection.T  # (..., T, m)
    wx = wx - x.pow(2).sum(-1, keepdim=True) / 2
    c = wx.amax(-1, keepdim=True) if is_query else wx.amax((-2, -1), keepdim=True)
    return torch.exp(wx - c.detach()) / math.sqrt(projection.shape[0])


def favor_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, projection: torch.Tensor,
                    key_ok: torch.Tensor | None = None, causal: bool = False) -> torch.Tensor:
    """FAVOR+ context (B, h, T, d) of (B, h, T, d) queries, keys, values (not scaled);
    ``key_ok`` bool (B, T) keys that exist (padding: False)."""
    scale = q.shape[-1] ** -0.25
    qf = positive_features(q * scale, projection, True)  # (B, h, T, m)
    kf = positive_features(k * scale, projection, False)
    if key_ok is not None:
        kf = kf * key_ok[:, None, :, None].to(kf.dtype)
    if causal:  # prefix sums over positions (§2.3)
        summary = torch.einsum("bhtm,bhtd->bhtmd", kf, v).cumsum(2)  # (B, h, T, m, d)
        numerator = torch.einsum("bhtm,bhtmd->bhtd", qf, summary)
        denominator = torch.einsum("bhtm,bhtm->bht", qf, kf.cumsum(2))
    else:
        numerator = qf @ (kf.transpose(-1, -2) @ v)  # (B, h, T, d) through the (m, d) summary
        denominator = qf @ kf.sum(2, keepdim=True).transpose(-1, -2)  # (B, h, T, 1)
        denominator = denominator.squeeze(-1)
    return numerator / denominator.clamp_min(torch.finfo(q.dtype).tiny)[..., None]


class PerformerAttention(SelfAttention):
    """FAVOR+ self-attention with ``features`` random features per head (the paper's m; 256 in its
    experiments) over the layer's usual fused q/k/v projection."""

    def __init__(self, hidden_size: int, num_heads: int, dropout: float, features: int, causal: bool = False,
                 seed: int = 0, bias: bool = True) -> None:
        super().__init__(hidden_size, num_heads, dropout, bias)
        if features < 1:
            raise EmberError(f"Performer needs at least one random feature; got {features}")
        self.features, self.causal, self.seed = features, causal, seed

    def projection(self, device, dtype) -> torch.Tensor:
        """A fresh draw in training; the layer's fixed one (from its seed) in eval mode."""
        generator = None if self.training else torch.Generator().manual_seed(self.seed)
        return orthogonal_features(self.features, self.head_dim, generator, device=device, dtype=dtype)

    def forward(self, x: torch.Tensor, mask=None, need_weights: bool = False, **_) -> tuple[torch.Tensor, None]:
        refuse_unformed("performer", need_weights, mask, "Performer attends to every token")
        b, t, hs = x.shape
        q, k, v = dense(self.qkv, x).view(b, t, 3, self.num_heads, self.head_dim).permute(2, 0, 3, 1, 4)
        key_ok = None if mask is None or mask.padding is None else mask.real
        context = favor_attention(q, k, v, self.projection(x.device, q.dtype), key_ok, self.causal)
        if self.training and self.dropout_p:  # no probabilities to drop: dropout on the context instead
            context = torch.nn.functional.dropout(context, self.dropout_p, True)
        return dense(self.out, context.transpose(1, 2).reshape(b, t, hs)), None
