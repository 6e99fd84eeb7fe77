"""DistilBERT's pre-training distillation (Sanh et al. 2019, §2-3).

A student with half the teacher's layers, initialised from one teacher layer out of two
(``ember.distillation.student.init_from_teacher``, plus the teacher's MLM head), trained with a
linear combination of three losses on masked-LM batches:

    L = a_ce  * KL(softmax(t / T) || softmax(s / T)) T^2   (soft targets at masked positions)
      + a_mlm * CE(s, masked tokens)                        (the ordinary MLM loss)
      + a_cos * mean(1 - cos(h_s, h_t))                     (last hidden states, real tokens)

with T = 2 and (a_ce, a_mlm, a_cos) = (5, 2, 1), the values of the authors' training script.
The masking is ember's MLM objective (``ember.objectives.bert``: dynamic masking, 80/10/10,
no NSP as in DistilBERT/RoBERTa); this module only adds the teacher and the two extra terms.
The soft-target term uses ``soft_cross_entropy`` (same gradients as the KL form).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import nn

from ember.distillation.losses import cosine_hidden_loss, soft_cross_entropy
from ember.objectives.mlm import token_prediction_loss


@dataclass(frozen=True)
class DistilBertWeights:
    ce: float = 5.0
    mlm: float = 2.0
    cos: float = 1.0
    temperature: float = 2.0


class DistilBertDistiller(nn.Module):
    """``student`` and ``teacher`` are ``BertPretraining`` modules (backbone + MLM head)."""

    def __init__(self, student: nn.Module, teacher: nn.Module, weights: DistilBertWeights = DistilBertWeights()) -> None:
        super().__init__()
        self.student = student
        self.weights = weights
        self._teacher = [teacher.eval().requires_grad_(False)]
        self.pair_mode = "none"

    @property
    def teacher(self) -> nn.Module:
        return self._teacher[0]

    def to(self, *args, **kwargs):
        self.teacher.to(*args, **kwargs)
        return super().to(*args, **kwargs)

    def make_batch(self, pairs, rng) -> dict:
        return self.student.make_batch(pairs, rng)  # the MLM objective's own corruption

    def forward(self, batch: dict) -> tuple[torch.Tensor, dict]:
        w = self.weights
        args = (batch["input_ids"], batch["attention_mask"], batch["token_type_ids"])
        s_hidden = self.student.backbone(*args).last_hidden_state  # (B, T, H)
        with torch.no_grad():
            t_hidden = self.teacher.backbone(*args).last_hidden_state
        labels = batch["labels"]
        where = labels != -100
        s_logits = self.student.mlm(s_hidden[where], self.student.backbone.word_embeddings)  # (N, V)
        mlm, metrics = token_prediction_loss(s_logits, labels[where], "mlm")  # = masked_lm_loss
        with torch.no_grad():
            t_logits = self.teacher.mlm(t_hidden[where], self.teacher.backbone.word_embeddings)
        ce = soft_cross_entropy(s_logits, t_logits, w.temperature)
        cos = cosine_hidden_loss(s_hidden, t_hidden, batch["attention_mask"])
        loss = w.ce * ce + w.mlm * mlm + w.cos * cos
        n = int(batch["input_ids"].shape[0])
        n_masked = int(where.sum())
        metrics.update({"ce_loss": (ce.item() * n_masked, n_masked), "cos_loss": (cos.item() * n, n),
                        "loss": (loss.item() * n, n)})
        agree = (s_logits.argmax(-1) == t_logits.argmax(-1)).sum().item()
        metrics["agreement"] = (agree, n_masked)
        return loss, metrics
