"""Causal language modelling: predict every next token (GPT-1 §3.1, GPT-2 §2).

L = -sum_t log P(x_t | x_<t) over packed blocks of ``data.max_seq_length`` tokens
(``ember.data.blocks``: documents joined by the end-of-text token). A block of T tokens
gives T - 1 predictions; the loss is their mean cross-entropy (``ember.nn.lm_loss``), and
held-out evaluation adds the perplexity exp(loss). The output layer is the input embedding
matrix (tied, no bias), so the objective adds no parameters to the backbone.

The model itself, a decoder with its tied LM head and ``logits(input_ids, attention_mask, cache)``,
is ``ember.models.decoder.CausalLM``: generation (ember.generate) and few-shot scoring load that,
with no pre-training objective; this module's ``CausalLM`` adds the objective's data and loss.
"""

from __future__ import annotations

import math

import numpy as np
import torch
from torch import nn

from ember.errors import EmberError
from ember.models.decoder import CausalLM as DecoderLM
from ember.nn.lm_loss import next_token_loss


def build(cfg, special_ids: dict) -> "CausalLM":
    from ember.config import DECODER_FAMILIES
    from ember.models import build_backbone

    if cfg.model.family not in DECODER_FAMILIES:
        raise EmberError(f"objective clm needs a causal decoder (model family {', '.join(DECODER_FAMILIES)}), "
                         f"not {cfg.model.family!r}; use a gpt2-* or gpt1 preset")
    return CausalLM(build_backbone(cfg.model), special_ids.get("eot"))


class CausalLM(DecoderLM):
    """A decoder backbone with its tied LM head; the pre-training module of objective "clm"."""

    pair_mode = "none"  # no sentence-pair task: data comes in packed blocks

    def __init__(self, backbone: nn.Module, eot_id: int | None = None) -> None:
        super().__init__(backbone)
        self.eot_id = eot_id

    def build_dataset(self, corpus, data_cfg, seed: int):
        """Packed blocks of ``data_cfg.max_seq_length`` tokens (ember.data.blocks)."""
        from ember.data.blocks import TokenBlockDataset

        if self.eot_id is None:
            raise EmberError("objective clm needs the tokenizer's end-of-text token id")
        return TokenBlockDataset(corpus, data_cfg.max_seq_length, self.eot_id)

    def make_batch(self, blocks: list[np.ndarray], rng: np.random.Generator) -> dict[str, torch.Tensor]:
        ids = torch.from_numpy(np.stack(blocks).astype(np.int64))  # (B, T)
        return {"input_ids": ids, "attention_mask": torch.ones_like(ids)}

    def forward(self, batch: dict[str, torch.Tensor]) -> tuple[torch.Tensor, dict]:
        mask = batch.get("attention_mask")
        # Packed blocks have no padding: plain causal attention (SDPA is_causal) is exact.
        full = mask is None or bool(mask.all())
        hidden = self.backbone(batch["input_ids"], None if full else mask).last_hidden_state
        loss, metrics = next_token_loss(self.backbone, hidden, batch["input_ids"], None if full else mask)
        metrics["loss"] = metrics["lm_loss"]
        return loss, metrics

    @staticmethod
    def derived_metrics(metrics: dict) -> dict:
        """Held-out perplexity from the mean held-out loss (nats per token)."""
        return {"ppl": math.exp(min(metrics["lm_loss"], 50.0))} if "lm_loss" in metrics else {}
