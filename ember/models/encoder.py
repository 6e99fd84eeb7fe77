"""Bidirectional Transformer encoder (BERT, Devlin et al. 2019).

forward(input_ids, attention_mask, token_type_ids) -> EncoderOutput with
last_hidden_state (B, T, H), pooled (B, H) when the config has a pooler, and on request
every layer's hidden states (num_layers + 1 tensors, embeddings first) and attentions.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import nn

from ember.config import ModelConfig
from ember.nn.embeddings import InputEmbeddings
from ember.nn.heads import Pooler
from ember.nn.transformer import TransformerLayer


@dataclass
class EncoderOutput:
    last_hidden_state: torch.Tensor  # (B, T, H)
    pooled: torch.Tensor | None = None  # (B, H)
    hidden_states: tuple[torch.Tensor, ...] | None = None
    attentions: tuple[torch.Tensor, ...] | None = None


def attention_mask_4d(attention_mask: torch.Tensor | None) -> torch.Tensor | None:
    """(B, T) 1/0 padding mask -> bool (B, 1, 1, T) that SDPA broadcasts over heads/queries."""
    if attention_mask is None:
        return None
    return attention_mask.bool()[:, None, None, :]


def init_weights(module: nn.Module, std: float) -> None:
    """BERT initialisation: N(0, 0.02) weights, zero biases, unit LayerNorm."""
    if isinstance(module, (nn.Linear, nn.Embedding)):
        nn.init.normal_(module.weight, mean=0.0, std=std)
        if isinstance(module, nn.Linear) and module.bias is not None:
            nn.init.zeros_(module.bias)
        if isinstance(module, nn.Embedding) and module.padding_idx is not None:
            with torch.no_grad():
                module.weight[module.padding_idx].zero_()
    elif isinstance(module, nn.LayerNorm):
        nn.init.ones_(module.weight)
        nn.init.zeros_(module.bias)


class Encoder(nn.Module):
    def __init__(self, cfg: ModelConfig) -> None:
        super().__init__()
        self.config = cfg
        self.embeddings = InputEmbeddings(
            cfg.vocab_size, cfg.hidden_size, cfg.max_position, cfg.type_vocab_size,
            cfg.dropout, cfg.layer_norm_eps, cfg.pad_token_id,
        )
        self.layers = nn.ModuleList(
            TransformerLayer(
                cfg.hidden_size, cfg.num_heads, cfg.intermediate_size, cfg.hidden_act,
                cfg.dropout, cfg.attention_dropout, cfg.layer_norm_eps, cfg.pre_layer_norm,
            )
            for _ in range(cfg.num_layers)
        )
        self.final_norm = nn.LayerNorm(cfg.hidden_size, eps=cfg.layer_norm_eps) if cfg.pre_layer_norm else None
        self.pooler = Pooler(cfg.hidden_size) if cfg.pooler else None
        self.apply(lambda m: init_weights(m, cfg.initializer_range))

    @property
    def word_embeddings(self) -> torch.Tensor:  # (V, H), tied to the MLM decoder
        return self.embeddings.word.weight

    def forward(
        self,
        input_ids: torch.Tensor,
        attention_mask: torch.Tensor | None = None,
        token_type_ids: torch.Tensor | None = None,
        position_ids: torch.Tensor | None = None,
        output_hidden_states: bool = False,
        output_attentions: bool = False,
    ) -> EncoderOutput:
        x = self.embeddings(input_ids, token_type_ids, position_ids)
        mask = attention_mask_4d(attention_mask)
        hidden_states = [x] if output_hidden_states else None
        attentions = [] if output_attentions else None
        for layer in self.layers:
            x, probs = layer(x, mask, need_weights=output_attentions)
            if hidden_states is not None:
                hidden_states.append(x)
            if attentions is not None:
                attentions.append(probs)
        if self.final_norm is not None:
            x = self.final_norm(x)
        return EncoderOutput(
            last_hidden_state=x,
            pooled=self.pooler(x) if self.pooler is not None else None,
            hidden_states=tuple(hidden_states) if hidden_states is not None else None,
            attentions=tuple(attentions) if attentions is not None else None,
        )
