"""Patient Knowledge Distillation (Sun et al. 2019, "Patient Knowledge Distillation for BERT
Model Compression").

The student learns from the teacher's intermediate layers as well as its predictions:

    L_PKD = (1 - alpha) L_CE(gold) + alpha L_DS(teacher soft targets, T) + beta L_PT

where L_PT compares L2-normalised [CLS] states of mapped layers (``patience_loss``) under
PKD-skip (teacher layers k, 2k, ...) or PKD-last (the last M - 1 below the top); see
``ember.distillation.losses.pkd_layer_map``. The prediction part is ``TaskDistiller``'s.

Defaults: beta = 100 (the paper searches {10, 100, 500, 1000}; with the reference's mean
reduction over hidden units, 100 makes L_PT about as large as the KD loss for 128-768-wide
models), alpha = 0.5 and T = 5 (from the paper's grids {0.2, 0.5, 0.7} and {5, 10, 20}).
When the widths differ (a student narrower than its teacher) a learned linear map brings
the student's [CLS] to the teacher's width first - PKD assumes equal widths; the map is our
extension, as in TinyBERT.
"""

from __future__ import annotations

import torch
from torch import nn

from ember.distillation.losses import patience_loss, pkd_layer_map

DEFAULT_BETA = 100.0
DEFAULT_ALPHA = 0.5
DEFAULT_TEMPERATURE = 5.0


class PatienceLoss(nn.Module):
    needs_attentions = False
    loss_per_example = True  # on each example's [CLS] states (TinyBERT's per-token losses are not)

    def __init__(self, student_layers: int, teacher_layers: int, student_width: int, teacher_width: int,
                 strategy: str = "skip", beta: float = DEFAULT_BETA) -> None:
        super().__init__()
        self.pairs = pkd_layer_map(student_layers, teacher_layers, strategy)
        self.beta = beta
        self.proj = nn.Linear(student_width, teacher_width) if student_width != teacher_width else None

    def forward(self, s_out, t_out, attention_mask: torch.Tensor) -> tuple[torch.Tensor, dict]:
        # hidden_states[0] is the embedding output, so layer j's output is hidden_states[j].
        s = torch.stack([s_out.hidden_states[i][:, 0] for i, _ in self.pairs])  # (L, B, Hs)
        t = torch.stack([t_out.hidden_states[j][:, 0] for _, j in self.pairs])  # (L, B, Ht)
        if self.proj is not None:
            s = self.proj(s)
        pt = patience_loss(s, t)
        n = int(s.shape[1])
        return self.beta * pt, {"pt_loss": (pt.item() * n, n)}
