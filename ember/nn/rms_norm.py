"""Scale-only layer normalisation (T5; Zhang & Sennrich 2019 "Root Mean Square Layer Normalization").

T5 (Raffel et al. 2020, §2.1): "we use a simplified version of layer normalization where the
activations are only rescaled and no additive bias is applied". The mean is not subtracted:
y = x / sqrt(mean(x^2) + eps) * g, with one learned gain g per feature and eps 1e-6.
The statistic is computed in fp32 whatever the input dtype (bf16/fp16 sums of squares lose
the small activations), then the result goes back to the input's dtype before the gain.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn


class RMSNorm(nn.Module):
    def __init__(self, hidden_size: int, eps: float = 1e-6) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.ones(hidden_size))
        self.eps = eps

    def forward(self, x: torch.Tensor) -> torch.Tensor:  # (..., H) -> (..., H)
        h = x.float()
        normed = (h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + self.eps)).to(x.dtype)
        return normed * self.weight

    def extra_repr(self) -> str:
        return f"{self.weight.shape[0]}, eps={self.eps}"
