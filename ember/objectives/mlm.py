"""Masked language modelling (BERT, Devlin et al. 2019, §3.1 Task #1 and App. A.1).

Per sequence, 15% of the maskable tokens (not [CLS]/[SEP]/padding) are chosen - exactly
round(15% of n), at least 1, at most ``max_predictions`` as in BERT's data generator.
Of the chosen: 80% become [MASK], 10% a random token, 10% stay unchanged. Labels hold the
original ids at chosen positions and -100 elsewhere.

This is the ``data.masking: token`` scheme; ``ember.objectives.masking`` groups tokens into
larger units (whole words, phrases, SpanBERT spans) with the same budget.
"""

from __future__ import annotations

import numpy as np
import torch
import torch.nn.functional as F

from ember.nn.heads import MaskedLMHead
from ember.nn.lm_loss import token_loss


def prediction_budget(n_maskable: np.ndarray, mask_prob: float,
                      max_predictions: int | None = None) -> np.ndarray:
    """Tokens to predict per sequence: round(mask_prob * n), at least 1, at most
    ``max_predictions`` (0/None = no cap) and at most n. n_maskable (B,) -> (B,) int64."""
    n_maskable = np.asarray(n_maskable, dtype=np.int64)
    budget = np.maximum(1, np.rint(n_maskable * mask_prob)).astype(np.int64)
    if max_predictions:
        budget = np.minimum(budget, max_predictions)
    return np.minimum(budget, n_maskable)


def mask_tokens(
    input_ids: np.ndarray,  # (B, T) int64
    maskable: np.ndarray,  # (B, T) bool, False at special tokens and padding
    rng: np.random.Generator,
    mask_id: int,
    vocab_size: int,
    mask_prob: float = 0.15,
    max_predictions: int | None = None,
) -> tuple[np.ndarray, np.ndarray]:
    """Returns (corrupted input_ids, labels), both (B, T) int64."""
    n_pick = prediction_budget(maskable.sum(axis=1), mask_prob, max_predictions)  # (B,)
    # A random rank for every maskable position; the n_pick lowest ranks are chosen.
    scores = np.where(maskable, rng.random(input_ids.shape), np.inf)
    ranks = scores.argsort(axis=1).argsort(axis=1)
    chosen = ranks < n_pick[:, None]
    labels = np.where(chosen, input_ids, -100)
    action = rng.random(input_ids.shape)
    corrupted = input_ids.copy()
    corrupted[chosen & (action < 0.8)] = mask_id
    random_slots = chosen & (action >= 0.8) & (action < 0.9)
    corrupted[random_slots] = rng.integers(0, vocab_size, size=int(random_slots.sum()))
    return corrupted, labels


def token_prediction_loss(logits: torch.Tensor, targets: torch.Tensor,
                          name: str) -> tuple[torch.Tensor, dict]:
    """Mean cross-entropy of logits (N, V) against targets (N,), with ``{name}_loss`` and
    ``{name}_acc`` metrics as (sum, count). Shared by the MLM and SpanBERT's SBO heads."""
    loss = F.cross_entropy(logits.float(), targets)
    n = int(targets.numel())
    correct = (logits.argmax(-1) == targets).sum().item()
    return loss, {f"{name}_loss": (loss.item() * n, n), f"{name}_acc": (correct, n)}


def masked_lm_loss(head: MaskedLMHead, hidden: torch.Tensor, word_embeddings: torch.Tensor,
                   labels: torch.Tensor, at_targets: bool = False) -> tuple[torch.Tensor, dict]:
    """Cross-entropy at masked positions only (sparse head; same loss as the full head).

    hidden (B, T, H), or with ``at_targets`` already (N, H), its rows where labels != -100 (an
    encoder run with ``rows=``); labels (B, T) with -100 where nothing is predicted. The head's
    tied decoder and the loss run as one step (``token_loss``: the (N, V) logits are never kept).
    """
    where = labels != -100
    rows = hidden if at_targets else hidden[where]
    return token_loss(head.transform(rows), word_embeddings, head.bias, labels[where], "mlm")
