"""ELECTRA's replaced-token-detection head (Clark et al. 2020, §2).

For every position t the discriminator predicts whether x_t is the original token or a
replacement: D(x, t) = sigmoid(w^T act(W h_t + b) + c). Two dense layers, as in the
reference implementation (``discriminator_predictions`` in google-research/electra
run_pretraining.py) and Hugging Face's ``ElectraDiscriminatorPredictions`` - the attribute
names ``dense`` / ``dense_prediction`` follow the latter so checkpoints map one to one.
"""

from __future__ import annotations

import torch
from torch import nn

from ember.nn.activations import activation


class ReplacedTokenHead(nn.Module):
    def __init__(self, hidden_size: int, act: str) -> None:
        super().__init__()
        self.dense = nn.Linear(hidden_size, hidden_size)
        self.act = activation(act)
        self.dense_prediction = nn.Linear(hidden_size, 1)

    def forward(self, hidden: torch.Tensor) -> torch.Tensor:
        """hidden (..., H) -> logits (...); > 0 means "replaced"."""
        return self.dense_prediction(self.act(self.dense(hidden))).squeeze(-1)
