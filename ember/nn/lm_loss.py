"""Language-model losses shared by objectives and tasks; they live in ``nn`` so tasks need not
import from objectives (DESIGN: nn <- models <- objectives/tasks).

* ``next_token_loss``: the causal LM loss (GPT-1 §3.1 eq. 1, GPT-2 §2), for the ``clm``
  pre-training objective (ember.objectives.clm) and GPT-1 fine-tuning's auxiliary LM loss
  (ember.tasks.gpt_classification, §3.2 eq. 5).
* ``seq2seq_loss``: an encoder-decoder's teacher-forced loss on target tokens (Raffel et al.
  2020, §3.1.4: "maximum likelihood"), for T5's denoising objectives
  (ember.objectives.span_corruption) and text-to-text fine-tuning (ember.tasks.text2text).
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


def seq2seq_loss(backbone, batch: dict[str, torch.Tensor]) -> tuple[torch.Tensor, dict]:
    """Mean cross-entropy over the target tokens of an encoder-decoder ``backbone`` (``shift_right``,
    ``lm_logits``, keyword decoder inputs: ember.models.encoder_decoder).

    ``batch``: input_ids / attention_mask (B, S) and labels (B, T), each row's targets a
    prefix followed by -100. The decoder reads the targets shifted right behind the start
    token (teacher forcing); the LM head runs on target positions only. Metrics ``loss`` and
    ``token_acc`` as (sum, count)."""
    labels = batch["labels"]  # (B, T)
    mask = batch["attention_mask"]
    targets = labels != -100  # (B, T); a prefix of each row
    full = bool(targets.all())
    out = backbone(batch["input_ids"], None if bool(mask.all()) else mask,
                   decoder_input_ids=backbone.shift_right(labels),
                   decoder_attention_mask=None if full else targets.long())
    hidden = out.last_hidden_state[targets]  # (N, H): only positions with a target
    logits = backbone.lm_logits(hidden.unsqueeze(0)).squeeze(0).float()  # (N, V)
    gold = labels[targets]
    loss = F.cross_entropy(logits, gold)
    n = int(gold.numel())
    correct = int((logits.argmax(-1) == gold).sum())
    return loss, {"loss": (loss.item() * n, n), "token_acc": (correct, n)}
