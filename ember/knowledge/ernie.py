"""ERNIE's knowledgeable encoder on any pre-trained encoder backbone (Zhang et al. 2019, §3).

ERNIE stacks N text layers (the T-Encoder) under M aggregators (the K-Encoder) that fuse entity
embeddings into the tokens (eq. 3-6, ``ember.nn.fusion.InformationFusion``). Here the
T-Encoder is the bottom num_layers - M layers of a (pre-trained) encoder and the K-Encoder
its top M layers, each given the entity side of an aggregator; the entity vectors are the
fixed TransE table (§4.1: "the embeddings of entities are ... trained by TransE" and not
updated), kept as a buffer so a run folder carries the table it was trained with.

Inputs: the encoder's usual ones plus ``entity_ids`` (B, T), the table row of the entity
aligned to a token (the first token of each mention) and -1 elsewhere
(``ember.knowledge.inputs``). Without entity ids, or with none aligned, the output is exactly
the pre-trained encoder's (eq. 6 uses the layer's own feed-forward weights).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from ember.config import ModelConfig
from ember.errors import EmberError
from ember.models import backbone_class
from ember.models.encoder import Encoder, init_weights
from ember.nn.fusion import InformationFusion


def check_encoder_family(model: ModelConfig, what: str) -> None:
    """Knowledge goes into bidirectional ``Encoder`` backbones only: K-BERT's visible matrix is
    an attention mask over the whole sentence tree and ERNIE's aggregators are encoder layers."""
    if not issubclass(backbone_class(model.family), Encoder) or model.causal:
        kind = "a causal encoder" if model.causal else f"a {model.family} model"
        raise EmberError(f"{what} needs a bidirectional encoder (bert, roberta, albert, electra, distilbert, "
                         f"xlm): {kind} cannot take a visible matrix over the sentence tree nor fuse entities "
                         "into encoder layers; start from an encoder run or checkpoint")


class FusionEncoder(Encoder):
    """An ``Encoder`` whose top ``fusion_layers`` layers are ERNIE aggregators."""

    takes_rows = False  # its last layer is an aggregator, computed at every position

    def __init__(self, cfg: ModelConfig, num_entities: int, entity_dim: int, fusion_layers: int = 0,
                 entity_heads: int = 4) -> None:
        check_encoder_family(cfg, "ERNIE's entity fusion")
        super().__init__(cfg)
        fusion_layers = fusion_layers or max(1, cfg.num_layers // 2)  # ERNIE: M = 6 of 12
        if not 1 <= fusion_layers <= cfg.num_layers:
            raise EmberError(f"knowledge.fusion_layers={fusion_layers}: the encoder has {cfg.num_layers} layers")
        if num_entities < 1 or entity_dim < 1:
            raise EmberError("ERNIE's fusion needs an entity table (knowledge.entities)")
        # The fixed TransE table (§4.1), (N, D); filled from the embeddings file or a checkpoint.
        self.register_buffer("entity_vectors", torch.zeros(num_entities, entity_dim))
        self.fusion = nn.ModuleList(
            InformationFusion(cfg.intermediate_size, entity_dim, entity_heads, cfg.dropout, cfg.attention_dropout,
                              cfg.layer_norm_eps) for _ in range(fusion_layers))
        self.fusion.apply(lambda m: init_weights(m, cfg.initializer_range))

    # Parameters a plain encoder checkpoint does not have (fine-tuning starts them fresh).
    NEW_PARAMETERS = ("fusion.", "entity_vectors")

    def set_entity_vectors(self, vectors: torch.Tensor) -> None:
        if tuple(vectors.shape) != tuple(self.entity_vectors.shape):
            raise EmberError(f"entity table of shape {tuple(vectors.shape)} does not fit this model's "
                             f"{tuple(self.entity_vectors.shape)} (knowledge.num_entities / entity_dim)")
        with torch.no_grad():
            self.entity_vectors.copy_(vectors)

    def forward(self, input_ids, attention_mask=None, token_type_ids=None, position_ids=None,
                output_hidden_states: bool = False, output_attentions: bool = False, inputs_embeds=None,
                language_ids=None, entity_ids: torch.Tensor | None = None):
        x, mask, is_causal = self.embed(input_ids, attention_mask, token_type_ids, position_ids,
                                        inputs_embeds, language_ids)
        if entity_ids is None:
            entity_ids = torch.full(x.shape[:2], -1, dtype=torch.long, device=x.device)
        has_entity = entity_ids >= 0  # (B, T)
        entities = F.embedding(entity_ids.clamp(min=0), self.entity_vectors) * has_entity[..., None]  # (B, T, D)
        hidden_states = [x] if output_hidden_states else None
        attentions = [] if output_attentions else None
        sequence = self.layer_sequence()
        first_fused = len(sequence) - len(self.fusion)  # T-Encoder below, K-Encoder above
        for i, (layer, donor) in enumerate(sequence):
            if i < first_fused:
                x, probs = layer(x, mask, need_weights=output_attentions, donor=donor, is_causal=is_causal)
            else:
                x, entities, probs = self.fusion[i - first_fused](layer, x, mask, entities, has_entity, donor,
                                                                  output_attentions)
            self.record(x, probs, hidden_states, attentions)
        return self.finish(x, hidden_states, attentions)


def fusion_backbone(model: ModelConfig, knowledge) -> FusionEncoder:
    """A FusionEncoder of the shape a ``KnowledgeConfig`` records (entity table left at zeros)."""
    return FusionEncoder(model, knowledge.num_entities, knowledge.entity_dim, knowledge.fusion_layers,
                         knowledge.entity_heads)
