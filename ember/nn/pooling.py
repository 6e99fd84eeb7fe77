"""Concat pooling for recurrent classifiers (ULMFiT, Howard & Ruder 2018, §3.3).

The classifier sees [h_T, maxpool(H), meanpool(H)] over the hidden states H = (h_1..h_T):
the last state alone may forget what mattered early in a long document, so the max and the
mean over all (non-padded) time steps are concatenated to it.
"""

from __future__ import annotations

import torch


def last_positions(mask: torch.Tensor) -> torch.Tensor:
    """Index of the last real token per row: mask (B, T) 1/0 -> (B,) long (right padding)."""
    return (mask.long().sum(dim=1) - 1).clamp(min=0)


def concat_pool(hidden: torch.Tensor, mask: torch.Tensor,
                last: torch.Tensor | None = None) -> torch.Tensor:
    """hidden (B, T, H), mask (B, T) -> (B, 3H) = [h_T, max over t, mean over t].

    ``last`` (B, H) overrides h_T, e.g. for a bidirectional LSTM, the forward state at the
    last token next to the backward state at the first (each direction's final state).
    """
    m = mask.to(hidden.dtype).unsqueeze(-1)  # (B, T, 1)
    if last is None:
        idx = last_positions(mask)
        last = hidden[torch.arange(hidden.shape[0], device=hidden.device), idx]  # (B, H)
    maxed = hidden.masked_fill(m == 0, float("-inf")).amax(dim=1)
    maxed = torch.where(torch.isfinite(maxed), maxed, torch.zeros_like(maxed))  # empty rows
    mean = (hidden * m).sum(dim=1) / m.sum(dim=1).clamp(min=1)
    return torch.cat([last, maxed, mean], dim=-1)


def linear_gain_weights(mask: torch.Tensor) -> torch.Tensor:
    """Dai & Le 2015's "linear label gain" (§3): a prediction at every step t = 1..n of a row,
    weighted t/n - rising linearly to 1 at the last token - and normalised to sum to 1 per row.
    mask (B, T) 1/0, right padding -> (B, T) float weights, 0 at padding."""
    m = mask.float()
    steps = m.cumsum(dim=1) * m  # (B, T): 1..n at tokens, 0 at padding
    return steps / steps.sum(dim=1, keepdim=True).clamp(min=1.0)
