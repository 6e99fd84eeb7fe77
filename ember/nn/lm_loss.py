"""Next-token cross-entropy: the causal LM loss (GPT-1 §3.1 eq. 1, GPT-2 §2).

Shared by the ``clm`` pre-training objective (ember.objectives.clm) and GPT-1 fine-tuning's
auxiliary LM loss (ember.tasks.gpt_classification, §3.2 eq. 5); it lives in ``nn`` so
tasks need not import from objectives (DESIGN: nn <- models <- objectives/tasks).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F


def next_token_loss(logits: torch.Tensor, input_ids: torch.Tensor,
                    attention_mask: torch.Tensor | None = None) -> tuple[torch.Tensor, dict]:
    """Mean cross-entropy of logits (B, T, V) at t against input_ids at t + 1; padding
    (attention_mask 0) is never a target. Metrics ``lm_loss``/``lm_acc`` as (sum, count)."""
    targets = input_ids[:, 1:].clone()  # (B, T-1)
    if attention_mask is not None:
        targets[attention_mask[:, 1:] == 0] = -100
    flat = logits[:, :-1].reshape(-1, logits.shape[-1]).float()
    loss = F.cross_entropy(flat, targets.reshape(-1), ignore_index=-100)
    where = targets != -100
    n = int(where.sum())
    correct = int((logits[:, :-1].argmax(-1)[where] == targets[where]).sum())
    return loss, {"lm_loss": (loss.item() * n, n), "lm_acc": (correct, n)}
