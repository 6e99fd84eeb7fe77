"""Position-wise feed-forward block: Linear(H -> I), activation, Linear(I -> H)."""

from __future__ import annotations

import torch
from torch import nn

from ember.nn.activations import activation


class FeedForward(nn.Module):
    def __init__(self, hidden_size: int, intermediate_size: int, act: str) -> None:
        super().__init__()
        self.up = nn.Linear(hidden_size, intermediate_size)
        self.act = activation(act)
        self.down = nn.Linear(intermediate_size, hidden_size)

    def forward(self, x: torch.Tensor) -> torch.Tensor:  # (B, T, H) -> (B, T, H)
        return self.down(self.act(self.up(x)))
