"""Output heads shared by objectives and tasks.

``MaskedLMHead`` is BERT's MLM head (dense + act + LayerNorm, then a decoder tied to the
word embeddings plus a bias). It is applied only to the positions that need predicting: the
caller gathers masked positions first, so a batch of 32x128 with 15% masking computes
~600 vocabulary rows instead of 4096 (same loss and gradients as the full head).
With factorized embeddings (ALBERT, ELECTRA) the transform maps H -> E, the embedding size,
so the tied decoder (V, E) applies.
"""

from __future__ import annotations

import torch
from torch import nn

from ember.nn.activations import activation
from ember.nn.onednn import dense, linear


class MaskedLMHead(nn.Module):
    def __init__(self, hidden_size: int, vocab_size: int, act: str, layer_norm_eps: float,
                 embedding_size: int | None = None) -> None:
        super().__init__()
        out = embedding_size or hidden_size
        self.dense = nn.Linear(hidden_size, out)
        self.act = activation(act)
        self.norm = nn.LayerNorm(out, eps=layer_norm_eps)
        self.bias = nn.Parameter(torch.zeros(vocab_size))

    def transform(self, hidden: torch.Tensor) -> torch.Tensor:
        """hidden (N, H) -> (N, E), what the tied decoder reads."""
        return self.norm(self.act(dense(self.dense, hidden)))

    def forward(self, hidden: torch.Tensor, word_embeddings: torch.Tensor) -> torch.Tensor:
        """hidden (N, H), word_embeddings (V, E) -> logits (N, V)."""
        return linear(self.transform(hidden), word_embeddings, self.bias)


class Pooler(nn.Module):
    """BERT pooler: tanh(W h_[CLS] + b), input to NSP and sentence classification."""

    def __init__(self, hidden_size: int) -> None:
        super().__init__()
        self.dense = nn.Linear(hidden_size, hidden_size)

    def forward(self, hidden: torch.Tensor) -> torch.Tensor:  # (B, T, H) -> (B, H)
        return torch.tanh(dense(self.dense, hidden[:, 0]))


class TiedLMHead(nn.Module):
    """XLM's prediction layer (Lample & Conneau 2019; transformers' ``XLMPredLayer``): logits
    = h E^T + b with E the word embeddings (tied) and a bias of its own; no transform layer
    in between, unlike BERT's ``MaskedLMHead``. Used for XLM's MLM, TLM and CLM alike."""

    def __init__(self, vocab_size: int) -> None:
        super().__init__()
        self.bias = nn.Parameter(torch.zeros(vocab_size))

    def forward(self, hidden: torch.Tensor, word_embeddings: torch.Tensor) -> torch.Tensor:
        """hidden (..., H), word_embeddings (V, H) -> logits (..., V)."""
        return linear(hidden, word_embeddings, self.bias)
