"""BERT pre-training: masked LM + next-sentence prediction (Devlin et al. 2019, §3.1).

Input: [CLS] A [SEP] B [SEP] with segment ids 0 for [CLS] A [SEP] and 1 for B [SEP].
Loss = mean MLM cross-entropy over masked tokens + mean NSP cross-entropy over sequences.
With ``nsp=False`` the input is [CLS] A [SEP] and only MLM is trained (RoBERTa style).
"""

from __future__ import annotations

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from ember.config import DataConfig
from ember.data.pairs import SegmentPair
from ember.nn.heads import MaskedLMHead
from ember.objectives.mlm import mask_tokens, masked_lm_loss


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


class BertPretraining(nn.Module):
    """Backbone + MLM head (+ NSP head on the pooled [CLS])."""

    pair_mode = "nsp"

    def __init__(self, backbone: nn.Module, special_ids: dict, data: DataConfig) -> None:
        super().__init__()
        cfg = backbone.config
        self.backbone = backbone
        self.mlm = MaskedLMHead(cfg.hidden_size, cfg.vocab_size, cfg.hidden_act, cfg.layer_norm_eps)
        self.nsp = nn.Linear(cfg.hidden_size, 2) if data.nsp else None
        for module in (self.mlm, self.nsp):
            if module is not None:
                for sub in module.modules():
                    if isinstance(sub, nn.Linear):
                        nn.init.normal_(sub.weight, std=cfg.initializer_range)
                        nn.init.zeros_(sub.bias)
        self.special_ids = dict(special_ids)
        self.data = data
        if not data.nsp:
            self.pair_mode = "none"

    def make_batch(self, pairs: list[SegmentPair], rng: np.random.Generator) -> dict[str, torch.Tensor]:
        ids, types, attention, maskable = pack_pairs(
            pairs, self.special_ids["cls"], self.special_ids["sep"], self.special_ids["pad"]
        )
        ids, labels = mask_tokens(
            ids, maskable, rng, self.special_ids["mask"], self.backbone.config.vocab_size,
            self.data.mask_prob, self.data.max_predictions,
        )
        batch = {
            "input_ids": torch.from_numpy(ids),
            "token_type_ids": torch.from_numpy(types),
            "attention_mask": torch.from_numpy(attention),
            "labels": torch.from_numpy(labels),
        }
        if self.nsp is not None:
            batch["next_sentence_label"] = torch.tensor([p.label for p in pairs], dtype=torch.long)
        return batch

    def logits(self, batch: dict[str, torch.Tensor]) -> tuple[torch.Tensor, torch.Tensor | None]:
        """Full-vocabulary MLM logits (B, T, V) and NSP logits (B, 2): for inference and parity."""
        out = self.backbone(batch["input_ids"], batch.get("attention_mask"), batch.get("token_type_ids"))
        mlm = self.mlm(out.last_hidden_state, self.backbone.word_embeddings)
        nsp = self.nsp(out.pooled) if self.nsp is not None else None
        return mlm, nsp

    def forward(self, batch: dict[str, torch.Tensor]) -> tuple[torch.Tensor, dict]:
        out = self.backbone(batch["input_ids"], batch["attention_mask"], batch["token_type_ids"])
        loss, metrics = masked_lm_loss(
            self.mlm, out.last_hidden_state, self.backbone.word_embeddings, batch["labels"]
        )
        if self.nsp is not None:
            labels = batch["next_sentence_label"]
            logits = self.nsp(out.pooled)  # (B, 2)
            nsp_loss = F.cross_entropy(logits.float(), labels)
            loss = loss + nsp_loss
            n = int(labels.numel())
            metrics["nsp_loss"] = (nsp_loss.item() * n, n)
            metrics["nsp_acc"] = ((logits.argmax(-1) == labels).sum().item(), n)
        n = int(batch["input_ids"].shape[0])
        metrics["loss"] = (loss.item() * n, n)
        return loss, metrics
