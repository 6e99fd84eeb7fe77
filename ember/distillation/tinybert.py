"""TinyBERT's layer-level losses (Jiao et al. 2020, "TinyBERT: Distilling BERT for Natural
Language Understanding", §3.1-3.2).

Student layer m learns from teacher layer g(m) = m N / M (uniform mapping; m = 0 is the
embedding layer). For each mapped pair:

    L_embd = MSE(E^S W_e, E^T)            embeddings (hidden_states[0])
    L_hidn = MSE(H^S_m W_h, H^T_g(m))     layer outputs, through a learned projection W_h
    L_attn = 1/h sum_i MSE(A^S_i, A^T_i)  attention maps of each head

summed over layers. As the authors' code does, one projection serves embeddings and layers
(the paper writes W_e and W_h; with equal widths both are unnecessary and left out).
Prediction-layer distillation (soft cross-entropy, T = 1 in the paper) follows as a second
step; it is ``TaskDistiller``'s prediction loss. TinyBERT runs both in two stages: general
distillation on a pre-training corpus (intermediate layers only) and task-specific
distillation (intermediate layers, then predictions). See ``ember.distillation.runs``.

MSEs are taken over real (non-padding) tokens only; attention maps are the softmax
probabilities returned by ``Encoder(output_attentions=True)`` (see ``attention_mse``).
"""

from __future__ import annotations

import torch
from torch import nn

from ember.distillation.losses import attention_mse, masked_mse, uniform_layer_map


class TinyBertLayerLoss(nn.Module):
    needs_attentions = True

    def __init__(self, student_layers: int, teacher_layers: int, student_width: int, teacher_width: int,
                 attention: bool = True, hidden: bool = True) -> None:
        super().__init__()
        self.layer_map = uniform_layer_map(student_layers, teacher_layers)  # [g(0), ..., g(M)]
        self.proj = nn.Linear(student_width, teacher_width) if student_width != teacher_width else None
        self.attention, self.hidden = attention, hidden
        self.needs_attentions = attention

    def _project(self, x: torch.Tensor) -> torch.Tensor:
        return self.proj(x) if self.proj is not None else x

    def forward(self, s_out, t_out, attention_mask: torch.Tensor) -> tuple[torch.Tensor, dict]:
        n = int(attention_mask.shape[0])
        loss = attention_mask.new_zeros((), dtype=torch.float32)
        metrics = {}
        if self.hidden:
            # m = 0 is the embedding loss; m >= 1 the hidden-state losses.
            emb = masked_mse(self._project(s_out.hidden_states[0]), t_out.hidden_states[0], attention_mask)
            hid = sum(masked_mse(self._project(s_out.hidden_states[m]), t_out.hidden_states[g], attention_mask)
                      for m, g in enumerate(self.layer_map) if m > 0)
            loss = loss + emb + hid
            metrics["emb_loss"] = (emb.item() * n, n)
            metrics["hidden_loss"] = (hid.item() * n, n)
        if self.attention:
            # attentions[k] belongs to layer k + 1.
            att = sum(attention_mse(s_out.attentions[m - 1], t_out.attentions[g - 1], attention_mask)
                      for m, g in enumerate(self.layer_map) if m > 0)
            loss = loss + att
            metrics["attention_loss"] = (att.item() * n, n)
        return loss, metrics


class GeneralDistiller(nn.Module):
    """TinyBERT's general distillation: a student encoder matches a pre-trained teacher
    encoder's embeddings, hidden states and attentions on unmasked corpus text.

    ``make_batch`` takes the segment pairs of ``ember.data`` (single segments here) and lays
    them out as [CLS] A [SEP]. The teacher is not registered (frozen, not checkpointed).
    """

    def __init__(self, backbone: nn.Module, teacher: nn.Module, special_ids: dict) -> None:
        super().__init__()
        s, t = backbone.config, teacher.config
        self.backbone = backbone  # named as in pre-training runs, so `finetune --init` reads it
        self.layer_loss = TinyBertLayerLoss(s.num_layers, t.num_layers, s.hidden_size, t.hidden_size)
        self._teacher = [teacher.eval().requires_grad_(False)]
        self.special_ids = dict(special_ids)

    def to(self, *args, **kwargs):
        self._teacher[0].to(*args, **kwargs)
        return super().to(*args, **kwargs)

    def make_batch(self, pairs, rng=None) -> dict:
        from ember.objectives.bert import pack_pairs

        ids, types, attention, _ = pack_pairs(pairs, self.special_ids["cls"], self.special_ids["sep"],
                                              self.special_ids["pad"])
        return {"input_ids": torch.from_numpy(ids), "token_type_ids": torch.from_numpy(types),
                "attention_mask": torch.from_numpy(attention)}

    def forward(self, batch: dict) -> tuple[torch.Tensor, dict]:
        args = (batch["input_ids"], batch["attention_mask"], batch["token_type_ids"])
        s_out = self.backbone(*args, output_hidden_states=True, output_attentions=True)
        with torch.no_grad():
            t_out = self._teacher[0](*args, output_hidden_states=True, output_attentions=True)
        loss, metrics = self.layer_loss(s_out, t_out, batch["attention_mask"])
        n = int(batch["input_ids"].shape[0])
        metrics["loss"] = (loss.item() * n, n)
        return loss, metrics
