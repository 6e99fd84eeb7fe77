"""BERT pre-training: masked LM + a sentence-pair task (Devlin et al. 2019, §3.1).

Input: [CLS] A [SEP] B [SEP] with segment ids 0 for [CLS] A [SEP] and 1 for B [SEP].
Loss = mean MLM cross-entropy over masked tokens + mean cross-entropy of the sentence task
on the pooled [CLS]: next-sentence prediction (BERT) or sentence-order prediction (ALBERT,
Lan et al. 2020 §3.2: two consecutive segments of one document, swapped for negatives).
Objective "mlm" (or ``data.nsp: false``) trains MLM alone on [CLS] A [SEP] (RoBERTa).
"""

from __future__ import annotations

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from ember.config import DataConfig
from ember.data.pairs import SegmentPair
from ember.models.encoder import output_at_rows
from ember.nn.heads import MaskedLMHead
from ember.objectives.masking import Masker, MaskedBatch, build_masker
from ember.objectives.mlm import masked_lm_loss


def pack_pairs(pairs: list[SegmentPair], cls_id: int, sep_id: int, pad_id: int):
    """Lay out [CLS] A [SEP] (B [SEP]) per example, padded to the batch's longest.

    Returns numpy (B, T) arrays input_ids, token_type_ids, attention_mask, maskable.
    """
    lengths = [len(p.tokens_a) + 2 + (len(p.tokens_b) + 1 if p.tokens_b is not None else 0) for p in pairs]
    t = max(lengths)
    ids = np.full((len(pairs), t), pad_id, dtype=np.int64)
    types = np.zeros((len(pairs), t), dtype=np.int64)
    maskable = np.zeros((len(pairs), t), dtype=bool)
    for i, p in enumerate(pairs):
        la = len(p.tokens_a)
        ids[i, 0] = cls_id
        ids[i, 1 : 1 + la] = p.tokens_a
        ids[i, 1 + la] = sep_id
        maskable[i, 1 : 1 + la] = True
        if p.tokens_b is not None:
            lb = len(p.tokens_b)
            ids[i, 2 + la : 2 + la + lb] = p.tokens_b
            ids[i, 2 + la + lb] = sep_id
            types[i, 2 + la : 3 + la + lb] = 1
            maskable[i, 2 + la : 2 + la + lb] = True
    mask = np.arange(t)[None, :] < np.asarray(lengths)[:, None]
    return ids, types, mask.astype(np.int64), maskable


def pack_joins(pairs: list[SegmentPair], t: int) -> np.ndarray | None:
    """The pairs' phrase flags (``joins_a``/``joins_b``) in ``pack_pairs``' layout: bool (B, T),
    False at special tokens and padding; None when no example carries flags."""
    if all(p.joins_a is None and p.joins_b is None for p in pairs):
        return None
    joins = np.zeros((len(pairs), t), dtype=bool)
    for i, p in enumerate(pairs):
        la = len(p.tokens_a)
        if p.joins_a is not None:
            joins[i, 1 : 1 + la] = p.joins_a
        if p.tokens_b is not None and p.joins_b is not None:
            joins[i, 2 + la : 2 + la + len(p.tokens_b)] = p.joins_b
    return joins


def build(cfg, special_ids: dict) -> "BertPretraining":
    """Objectives "bert" (MLM + NSP unless data.nsp is false), "mlm" and "albert" (MLM + SOP)."""
    from ember.models import build_backbone

    sentence_task = {"bert": "nsp" if cfg.data.nsp else "none", "mlm": "none", "albert": "sop"}[cfg.objective]
    masker = build_masker(cfg.data, special_ids, cfg.model.vocab_size, cfg.train.seed)
    return BertPretraining(build_backbone(cfg.model), special_ids, cfg.data, sentence_task, masker)


class BertPretraining(nn.Module):
    """Backbone + MLM head (+ NSP or SOP head on the pooled [CLS])."""

    def __init__(self, backbone: nn.Module, special_ids: dict, data: DataConfig,
                 sentence_task: str | None = None, masker: Masker | None = None) -> None:
        super().__init__()
        cfg = backbone.config
        if sentence_task is None:
            sentence_task = "nsp" if data.nsp else "none"
        self.backbone = backbone
        self.mlm = MaskedLMHead(cfg.hidden_size, cfg.vocab_size, cfg.hidden_act, cfg.layer_norm_eps,
                                cfg.embedding_size or None)
        # One head either way; the attribute name says which task it was trained for
        # (and keeps checkpoint names distinct: "nsp.*" vs "sop.*").
        self.nsp = nn.Linear(cfg.hidden_size, 2) if sentence_task == "nsp" else None
        self.sop = nn.Linear(cfg.hidden_size, 2) if sentence_task == "sop" else None
        self.pair_mode = sentence_task  # what the segment-pair sampler must produce
        for module in (self.mlm, self.nsp, self.sop):
            if module is not None:
                for sub in module.modules():
                    if isinstance(sub, nn.Linear):
                        nn.init.normal_(sub.weight, std=cfg.initializer_range)
                        nn.init.zeros_(sub.bias)
        self.special_ids = dict(special_ids)
        self.data = data
        # data.masking decides the units masked together (ember.objectives.masking).
        self.masker = masker or build_masker(data, special_ids, cfg.vocab_size)

    @property
    def sentence_head(self) -> nn.Linear | None:
        return self.nsp if self.nsp is not None else self.sop

    def masked_inputs(self, pairs: list[SegmentPair],
                      rng: np.random.Generator) -> tuple[dict[str, torch.Tensor], MaskedBatch]:
        """Packed, corrupted MLM inputs and the masking result (its units feed SpanBERT's SBO)."""
        ids, types, attention, maskable = pack_pairs(
            pairs, self.special_ids["cls"], self.special_ids["sep"], self.special_ids["pad"]
        )
        masked = self.masker(ids, maskable, rng, joins=pack_joins(pairs, ids.shape[1]),
                             keys=[p.mask_key for p in pairs])
        batch = {
            "input_ids": torch.from_numpy(masked.input_ids),
            "token_type_ids": torch.from_numpy(types),
            "attention_mask": torch.from_numpy(attention),
            "labels": torch.from_numpy(masked.labels),
        }
        return batch, masked

    def make_batch(self, pairs: list[SegmentPair], rng: np.random.Generator) -> dict[str, torch.Tensor]:
        batch, _ = self.masked_inputs(pairs, rng)
        if self.sentence_head is not None:
            batch["sentence_label"] = torch.tensor([p.label for p in pairs], dtype=torch.long)
        return batch

    def logits(self, batch: dict[str, torch.Tensor]) -> tuple[torch.Tensor, torch.Tensor | None]:
        """Full-vocabulary MLM logits (B, T, V) and NSP/SOP logits (B, 2): for inference and parity."""
        out = self.backbone(batch["input_ids"], batch.get("attention_mask"), batch.get("token_type_ids"))
        mlm = self.mlm(out.last_hidden_state, self.backbone.word_embeddings)
        head = self.sentence_head
        return mlm, head(out.pooled) if head is not None else None

    def forward(self, batch: dict[str, torch.Tensor]) -> tuple[torch.Tensor, dict]:
        # The last layer at the masked rows only (ember.nn.query_rows): the loss reads nothing else.
        out = output_at_rows(self.backbone, batch["labels"] != -100, batch["input_ids"], batch["attention_mask"],
                             batch["token_type_ids"])
        loss, metrics = masked_lm_loss(self.mlm, out.last_hidden_state, self.backbone.word_embeddings,
                                       batch["labels"], at_targets=True)
        if self.sentence_head is not None:
            labels = batch["sentence_label"]
            logits = self.sentence_head(out.pooled)  # (B, 2)
            sentence_loss = F.cross_entropy(logits.float(), labels)
            loss = loss + sentence_loss
            n = int(labels.numel())
            name = self.pair_mode  # "nsp" or "sop"
            metrics[f"{name}_loss"] = (sentence_loss.item() * n, n)
            metrics[f"{name}_acc"] = ((logits.argmax(-1) == labels).sum().item(), n)
        n = int(batch["input_ids"].shape[0])
        metrics["loss"] = (loss.item() * n, n)
        return loss, metrics
