"""Position-wise feed-forward block: Linear(H -> I), activation, Linear(I -> H).

``act="gated-<name>"`` is the gated linear unit variant (Shazeer 2020, "GLU Variants Improve
Transformer"): down(act(gate(x)) * up(x)). T5 v1.1 uses it with the tanh GELU
("gated-gelu_new"); T5 v1.0 (Raffel et al. 2020, §2.1) is the plain ReLU block without
biases (``bias=False``) and with dropout on the activations (``dropout``).
"""

from __future__ import annotations

import torch
from torch import nn

from ember.nn.activations import activation
from ember.nn.dropout import Dropout
from ember.nn.onednn import dense

GATED = "gated-"


class FeedForward(nn.Module):
    def __init__(self, hidden_size: int, intermediate_size: int, act: str, bias: bool = True,
                 dropout: float = 0.0) -> None:
        super().__init__()
        self.gated = act.startswith(GATED)
        self.gate = nn.Linear(hidden_size, intermediate_size, bias=bias) if self.gated else None
        self.up = nn.Linear(hidden_size, intermediate_size, bias=bias)
        self.act = activation(act.removeprefix(GATED))
        self.dropout = Dropout(dropout) if dropout else None
        self.down = nn.Linear(intermediate_size, hidden_size, bias=bias)

    def forward(self, x: torch.Tensor) -> torch.Tensor:  # (B, T, H) -> (B, T, H)
        h = self.act(dense(self.gate, x)) * dense(self.up, x) if self.gated else self.act(dense(self.up, x))  # (B, T, I)
        if self.dropout is not None:
            h = self.dropout(h)
        return dense(self.down, h)
