"""Task-level distillation module: a student classifier taught by a teacher's predictions.

Hinton et al. 2015: loss = alpha * L_soft + (1 - alpha) * L_hard, where L_soft is the
cross-entropy against the teacher's softened distribution (T^2-scaled, ``soft_cross_entropy``)
or the MSE between logits, and L_hard the usual cross-entropy on gold labels. Examples of the
transfer set without a gold label (label -100 here) contribute only to L_soft.

The teacher's logits come either from the batch (``teacher_logits``, cached once on disk by
``ember.distillation.transfer_set``) or from a teacher run on the fly, which layer-level methods
need (Patient KD, TinyBERT: ``layer_loss`` compares hidden states / attentions).

The teacher is deliberately *not* a registered sub-module: it is frozen, must not enter the
optimizer, checkpoints or ``train()``/``eval()`` switches of the Trainer.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from ember.distillation.losses import logit_mse, soft_cross_entropy
from ember.errors import EmberError
from ember.tasks.featurize import collate


@dataclass(frozen=True)
class KDSettings:
    temperature: float = 2.0
    alpha: float = 1.0  # weight of the soft loss; 1 - alpha goes to the hard-label loss
    soft_loss: str = "ce"  # "ce" (soft cross-entropy, T^2-scaled) or "mse" (on logits)
    prediction_weight: float = 1.0  # 0 turns prediction-layer distillation off (TinyBERT stage 1)

    def __post_init__(self) -> None:
        if self.soft_loss not in ("ce", "mse"):
            raise EmberError(f"--soft-loss {self.soft_loss!r}; choose ce or mse")
        if not 0.0 <= self.alpha <= 1.0:
            raise EmberError(f"--alpha {self.alpha} must lie in [0, 1]")
        if self.temperature <= 0:
            raise EmberError(f"--temperature {self.temperature} must be positive")


def classifier_forward(clf: nn.Module, batch: dict, states: bool = False, attentions: bool = False):
    """(logits (B, C), EncoderOutput) of a SequenceClassifier, optionally with every layer."""
    out = clf.backbone(batch["input_ids"], batch["attention_mask"], batch.get("token_type_ids"),
                       output_hidden_states=states, output_attentions=attentions)
    pooled = out.pooled if out.pooled is not None else out.last_hidden_state[:, 0]
    return clf.classifier(clf.dropout(pooled)), out


def gold_label_loss(logits: torch.Tensor, labels: torch.Tensor, regression: bool) -> tuple[torch.Tensor | None, int]:
    """Cross-entropy (MSE for regression) over the examples that have a gold label: labels
    -100 (NaN for regression) mark the rest. Returns (None, 0) when none has one."""
    has = ~torch.isnan(labels) if regression else labels != -100
    n = int(has.sum())
    if n == 0:
        return None, 0
    if regression:
        return F.mse_loss(logits[has].squeeze(-1).float(), labels[has]), n
    return F.cross_entropy(logits[has].float(), labels[has]), n


class TaskDistiller(nn.Module):
    """Trains ``student`` (a SequenceClassifier) from cached or live teacher logits."""

    # train.group_by_length=auto groups its batches by length (where its loss is one term per
    # example): KD into 3 layers from MiniLM was level with shuffled batches over 3 seeds
    # (-0.04 dev points) at 1.55x less CPU (issue 46; BENCHMARKS.md, "Classification and
    # distillation batch order")
    group_by_length_default = True

    def __init__(self, student: nn.Module, settings: KDSettings, teacher: nn.Module | None = None,
                 layer_loss: nn.Module | None = None) -> None:
        super().__init__()
        self.student = student
        self.settings = settings
        self.layer_loss = layer_loss  # registered: TinyBERT's projection W_h is trained with the student
        self._teacher = [teacher.eval().requires_grad_(False)] if teacher is not None else []
        if layer_loss is not None and teacher is None:
            raise EmberError("layer-level distillation needs the teacher model, not only its logits")

    @property
    def loss_per_example(self) -> bool:
        """Whether the loss is one term per example (the logits' losses, PKD's [CLS] states), so
        training may group examples of similar length into batches (ember.train.length_groups);
        TinyBERT's per-token layer losses average over a batch's tokens and may not."""
        return self.layer_loss is None or getattr(self.layer_loss, "loss_per_example", False)

    @property
    def teacher(self) -> nn.Module | None:
        return self._teacher[0] if self._teacher else None

    def to(self, *args, **kwargs):  # the unregistered teacher follows the student's device
        if self.teacher is not None:
            self.teacher.to(*args, **kwargs)
        return super().to(*args, **kwargs)

    def make_batch(self, features: list[dict], rng: np.random.Generator | None = None) -> dict:
        """Pads the batch; ``labels`` is -100 for examples without a gold label and
        ``teacher_logits`` (B, C) is present when the features carry cached ones."""
        batch = collate([{**f, "label": None} for f in features], self.student.pad_id)
        if not self.student.is_regression:
            batch["labels"] = torch.tensor([-100 if f.get("label") is None else f["label"] for f in features],
                                           dtype=torch.long)
        else:
            batch["labels"] = torch.tensor([float("nan") if f.get("label") is None else f["label"]
                                            for f in features], dtype=torch.float32)
        if "teacher_logits" in features[0]:
            batch["teacher_logits"] = torch.tensor(np.stack([f["teacher_logits"] for f in features]),
                                                   dtype=torch.float32)
        return batch

    def prediction_loss(self, student_logits: torch.Tensor, teacher_logits: torch.Tensor,
                        labels: torch.Tensor) -> tuple[torch.Tensor, dict]:
        s = self.settings
        n = int(student_logits.shape[0])
        if self.student.is_regression or s.soft_loss == "mse":  # regression: match the teacher's score
            soft = logit_mse(student_logits, teacher_logits)
        else:
            soft = soft_cross_entropy(student_logits, teacher_logits, s.temperature)
        metrics = {"soft_loss": (soft.item() * n, n)}
        loss = s.alpha * soft
        hard, n_hard = gold_label_loss(student_logits, labels, self.student.is_regression)
        if s.alpha < 1.0 and hard is not None:
            loss = loss + (1.0 - s.alpha) * hard
            metrics["hard_loss"] = (hard.item() * n_hard, n_hard)
        if not self.student.is_regression:
            agree = (student_logits.argmax(-1) == teacher_logits.argmax(-1)).sum().item()
            metrics["agreement"] = (agree, n)
        return loss, metrics

    def forward(self, batch: dict) -> tuple[torch.Tensor, dict]:
        layered = self.layer_loss is not None
        attentions = layered and getattr(self.layer_loss, "needs_attentions", False)
        logits, s_out = classifier_forward(self.student, batch, states=layered, attentions=attentions)
        logits = logits.float()
        t_out = None
        if self.teacher is not None:
            with torch.no_grad():
                t_logits, t_out = classifier_forward(self.teacher, batch, states=layered, attentions=attentions)
            t_logits = t_logits.float()
        elif "teacher_logits" in batch:
            t_logits = batch["teacher_logits"]
        else:
            raise EmberError("no teacher logits in the batch and no teacher model to compute them")
        n = int(logits.shape[0])
        loss = logits.new_zeros(())
        metrics: dict = {}
        if self.settings.prediction_weight:
            pred, metrics = self.prediction_loss(logits, t_logits, batch["labels"])
            loss = loss + self.settings.prediction_weight * pred
        if layered:
            extra, extra_metrics = self.layer_loss(s_out, t_out, batch["attention_mask"])
            loss = loss + extra
            metrics.update(extra_metrics)
        metrics["loss"] = (loss.item() * n, n)
        return loss, metrics
