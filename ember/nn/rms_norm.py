"""Scale-only layer normalisation (T5; Zhang & Sennrich 2019 "Root Mean Square Layer Normalization").

T5 (Raffel et al. 2020, §2.1): "we use a simplified version of layer normalization where the
activations are only rescaled and no additive bias is applied". The mean is not subtracted:
y = x / sqrt(mean(x^2) + eps) * g, with one learned gain g per feature and eps 1e-6.
The mean square is computed in fp32 whatever the input dtype (bf16/fp16 sums of squares lose
the small activations; the released code and transformers do the same), the scaling in fp32 or
wider, and the result goes back to the input's dtype.
"""

from __future__ import annotations

import torch
from torch import nn


class RMSNorm(nn.Module):
    def __init__(self, hidden_size: int, eps: float = 1e-6) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.ones(hidden_size))
        self.eps = eps

    def forward(self, x: torch.Tensor) -> torch.Tensor:  # (..., H) -> (..., H)
        mean_square = x.float().pow(2).mean(-1, keepdim=True)  # (..., 1), fp32
        return (self.weight * (x * torch.rsqrt(mean_square + self.eps))).to(x.dtype)

    def extra_repr(self) -> str:
        return f"{self.weight.shape[0]}, eps={self.eps}"


def make_norm(kind: str, hidden_size: int, eps: float) -> nn.Module:
    """An encoder-decoder's norm by ``ModelConfig.norm_kind``: "rms" (T5's scale-only RMSNorm)
    or "layer" (LayerNorm with gain and bias: BART, Lewis et al. 2020, the standard Transformer)."""
    return RMSNorm(hidden_size, eps) if kind == "rms" else nn.LayerNorm(hidden_size, eps=eps)
