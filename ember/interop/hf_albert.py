"""ALBERT <-> Hugging Face ``transformers`` (AlbertModel / AlbertForPreTraining /
AlbertForMaskedLM / AlbertForSequenceClassification).

ALBERT (Lan et al. 2020) changes BERT in three ways, each with its own names in HF:

- Factorized embeddings (§3.1): a V x E table then ``encoder.embedding_hidden_mapping_in``
  (E -> H) == ember's ``backbone.embed_project``. transformers always has the projection;
  ember has none when E == H, so export writes an identity projection and import accepts
  only an identity one in that case.
- Cross-layer sharing (§3.1): HF applies ``num_hidden_layers`` layers drawn from
  ``num_hidden_groups`` groups of ``inner_group_num`` layers each (layer i uses group
  ``i * groups // layers``). Released models use one group of one layer == ember's
  ``share_layers="all"`` (``backbone.layers.0`` applied num_layers times). One group per
  layer is unshared == ember's ``"none"``. ember's "attention"/"ffn" sharing and HF's
  other group layouts have no counterpart on the other side and are refused.
- Sentence-order prediction (§3.2): ``sop_classifier.classifier`` on the pooled [CLS]
  == ember's ``sop`` head. The MLM head is ``predictions.{dense (H -> E), LayerNorm,
  bias}`` with the decoder (V, E) tied to the word embeddings.

Inside a layer: ``attention.{query,key,value,dense,LayerNorm}``, ``ffn`` (up),
``ffn_output`` (down), ``full_layer_layer_norm``; post-LN like BERT. Activation gelu_new.
"""

from __future__ import annotations

import dataclasses

import torch

from ember.config import ModelConfig
from ember.errors import EmberError
from ember.interop import hf_bert
from ember.interop.families import (
    check_exportable, drop_unused_pooler, hf_tensors, module_rules, pop_tied_decoder,
    rename_from_hf, rename_to_hf,
)

MODEL_TYPE = "albert"
_PREFIX = "albert."
_QKV = ("query", "key", "value")
_LAYER = "encoder.albert_layer_groups.{i}.albert_layers.0."  # group i, its only layer

_ENCODER = [
    ("embeddings.word_embeddings", "backbone.embeddings.word"),
    ("embeddings.position_embeddings", "backbone.embeddings.position"),
    ("embeddings.token_type_embeddings", "backbone.embeddings.token_type"),
    ("embeddings.LayerNorm", "backbone.embeddings.norm"),
    ("encoder.embedding_hidden_mapping_in", "backbone.embed_project"),
    *[(f"{_LAYER}attention.{n}", f"qkv.{{i}}.{n}") for n in _QKV],
    (_LAYER + "attention.dense", "backbone.layers.{i}.attention.out"),
    (_LAYER + "attention.LayerNorm", "backbone.layers.{i}.attention_norm"),
    (_LAYER + "ffn", "backbone.layers.{i}.ffn.up"),
    (_LAYER + "ffn_output", "backbone.layers.{i}.ffn.down"),
    (_LAYER + "full_layer_layer_norm", "backbone.layers.{i}.ffn_norm"),
    ("pooler", "backbone.pooler.dense"),
]
_HEADS = [
    ("predictions.dense", "mlm.dense"),
    ("predictions.LayerNorm", "mlm.norm"),
    ("sop_classifier.classifier", "sop"),
    ("classifier", "classifier"),
]
_FROM_ENCODER, _TO_ENCODER = module_rules(_ENCODER, _PREFIX)
_FROM_HEADS, _TO_HEADS = module_rules(_HEADS)
_FROM_HF = _FROM_ENCODER + _FROM_HEADS + [(r"predictions\.bias", "mlm.bias")]
_TO_HF = _TO_ENCODER + _TO_HEADS + [(r"mlm\.bias", "predictions.bias")]

# ember sharing modes with an HF layout: "all" = 1 group, "none" = num_layers groups.
_SHARING = ("all", "none")


def _stored_layers(cfg: ModelConfig) -> int:
    return 1 if cfg.share_layers == "all" else cfg.num_layers


def config_from_hf(hf: dict) -> ModelConfig:
    if hf.get("model_type") != MODEL_TYPE:
        raise EmberError(f"config.json has model_type={hf.get('model_type')!r}; this importer reads ALBERT")
    layers = hf.get("num_hidden_layers", 12)
    groups, inner = hf.get("num_hidden_groups", 1), hf.get("inner_group_num", 1)
    if inner != 1 or groups not in (1, layers):
        raise EmberError(
            f"this ALBERT checkpoint has num_hidden_groups={groups}, inner_group_num={inner}; ember "
            "reads one group of one layer shared by all layers (the released models, "
            "share_layers='all') or one group per layer (unshared, share_layers='none')")
    bert = hf_bert.config_from_hf({**hf, "model_type": hf_bert.MODEL_TYPE})  # shared field names
    return dataclasses.replace(
        bert, family="albert", embedding_size=hf.get("embedding_size", 128),
        share_layers="all" if groups == 1 else "none",
        hidden_act=hf.get("hidden_act", "gelu_new"),
        dropout=hf.get("hidden_dropout_prob", 0.0), attention_dropout=hf.get("attention_probs_dropout_prob", 0.0),
    )


def config_to_hf(cfg: ModelConfig, architectures: list[str], extra: dict | None = None) -> dict:
    bert = hf_bert.config_to_hf(cfg, architectures)
    bert.pop("position_embedding_type")
    return {
        **bert,
        "model_type": MODEL_TYPE,
        "embedding_size": cfg.embedding_size or cfg.hidden_size,
        "num_hidden_groups": 1 if cfg.share_layers == "all" else cfg.num_layers,
        "inner_group_num": 1,
        **(extra or {}),
    }


def state_from_hf(hf_state: dict[str, torch.Tensor], cfg: ModelConfig) -> dict[str, torch.Tensor]:
    """HF ALBERT state dict -> ember names (``backbone.layers.0.*`` only when shared)."""
    hf = hf_tensors(hf_state, _PREFIX)
    pop_tied_decoder(hf, "predictions.decoder.weight", "embeddings.word_embeddings.weight",
                     "predictions.decoder.bias", "predictions.bias")
    if (cfg.embedding_size or cfg.hidden_size) == cfg.hidden_size:
        _drop_identity_projection(hf, cfg.hidden_size)
    return rename_from_hf(hf, _FROM_HF, _QKV, _stored_layers(cfg), "ALBERT")


def _drop_identity_projection(hf: dict[str, torch.Tensor], hidden: int) -> None:
    """With E == H ember has no E -> H projection; accept HF's only if it does nothing."""
    w = hf.pop("encoder.embedding_hidden_mapping_in.weight", None)
    b = hf.pop("encoder.embedding_hidden_mapping_in.bias", None)
    if w is None:
        return
    if not (torch.equal(w, torch.eye(hidden, dtype=w.dtype)) and (b is None or not b.any())):
        raise EmberError("this ALBERT checkpoint has embedding_size == hidden_size but a trained "
                         "embedding_hidden_mapping_in; ember's encoder projects embeddings only "
                         "when embedding_size < hidden_size, so it cannot hold this checkpoint")


def state_to_hf(state: dict[str, torch.Tensor], cfg: ModelConfig) -> dict[str, torch.Tensor]:
    if cfg.share_layers not in _SHARING:
        raise EmberError(
            f"model.share_layers={cfg.share_layers!r} shares only the {cfg.share_layers} sub-layers "
            "across layers; transformers' ALBERT shares whole layers (groups), so only "
            "share_layers='all' (one shared layer) or 'none' exports")
    check_exportable(cfg, "ALBERT", factorized=True, sharing=_SHARING)
    state = dict(drop_unused_pooler(state))
    if "backbone.embed_project.weight" not in state and "backbone.embeddings.word.weight" in state:
        # E == H: transformers' ALBERT always projects; the identity keeps outputs unchanged.
        word = state["backbone.embeddings.word.weight"]
        state["backbone.embed_project.weight"] = torch.eye(cfg.hidden_size, dtype=word.dtype)
        state["backbone.embed_project.bias"] = word.new_zeros(cfg.hidden_size)
    return rename_to_hf(state, _TO_HF, _QKV, _stored_layers(cfg), "ALBERT")


def hf_architecture(state: dict[str, torch.Tensor]) -> str:
    """The transformers class whose weights an ember state dict corresponds to."""
    keys = set(state)
    if any(k.startswith("classifier.") for k in keys):
        return "AlbertForSequenceClassification"
    if any(k.startswith("sop.") for k in keys):
        return "AlbertForPreTraining"
    if any(k.startswith("mlm.") for k in keys):
        return "AlbertForMaskedLM"
    return "AlbertModel"
