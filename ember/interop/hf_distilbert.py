"""DistilBERT <-> Hugging Face ``transformers`` (DistilBertModel / DistilBertForMaskedLM).

DistilBERT (Sanh et al. 2019, §3) is BERT with half the layers, no token-type embeddings
and no pooler; transformers spells its config differently (dim, n_layers, n_heads,
hidden_dim, activation) and names its modules after the original code:
``transformer.layer.{i}.attention.{q_lin,k_lin,v_lin,out_lin}``, ``sa_layer_norm``,
``ffn.{lin1,lin2}``, ``output_layer_norm``. The MLM head is ``vocab_transform`` ->
activation -> ``vocab_layer_norm`` -> ``vocab_projector`` (tied to the word embeddings,
own bias) == ember's ``mlm.{dense, norm, bias}``.

Not exchangeable, with a clear error: sinusoidal position embeddings
(``sinusoidal_pos_embds``; ember learns its position table), LayerNorm eps other than the
1e-12 transformers hard-codes, and sequence classifiers - ``DistilBertForSequenceClassification``
puts ``pre_classifier`` + ReLU between [CLS] and the output layer, which ember's
classifier (dropout + one linear layer on [CLS]) does not have.
"""

from __future__ import annotations

import torch

from ember.config import ModelConfig
from ember.errors import EmberError
from ember.interop.families import (
    check_exportable, drop_unused_pooler, hf_tensors, module_rules, pop_tied_decoder,
    rename_from_hf, rename_to_hf,
)

MODEL_TYPE = "distilbert"
_PREFIX = "distilbert."
_QKV = ("q_lin", "k_lin", "v_lin")
_LAYER = "transformer.layer.{i}."
_EPS = 1e-12  # transformers' DistilBERT LayerNorms are built with eps=1e-12, not from the config

_ENCODER = [
    ("embeddings.word_embeddings", "backbone.embeddings.word"),
    ("embeddings.position_embeddings", "backbone.embeddings.position"),
    ("embeddings.LayerNorm", "backbone.embeddings.norm"),
    *[(f"{_LAYER}attention.{n}", f"qkv.{{i}}.{n}") for n in _QKV],
    (_LAYER + "attention.out_lin", "backbone.layers.{i}.attention.out"),
    (_LAYER + "sa_layer_norm", "backbone.layers.{i}.attention_norm"),
    (_LAYER + "ffn.lin1", "backbone.layers.{i}.ffn.up"),
    (_LAYER + "ffn.lin2", "backbone.layers.{i}.ffn.down"),
    (_LAYER + "output_layer_norm", "backbone.layers.{i}.ffn_norm"),
]
_HEADS = [("vocab_transform", "mlm.dense"), ("vocab_layer_norm", "mlm.norm")]
_FROM_ENCODER, _TO_ENCODER = module_rules(_ENCODER, _PREFIX)
_FROM_HEADS, _TO_HEADS = module_rules(_HEADS)
_FROM_HF = _FROM_ENCODER + _FROM_HEADS + [(r"vocab_projector\.bias", "mlm.bias")]
_TO_HF = _TO_ENCODER + _TO_HEADS + [(r"mlm\.bias", "vocab_projector.bias")]

_CLASSIFIER_ERROR = (
    "DistilBertForSequenceClassification applies pre_classifier + ReLU to [CLS] before its output "
    "layer; ember's classifier is one linear layer on [CLS], so {what}. Use the base model or "
    "DistilBertForMaskedLM weights")


def config_from_hf(hf: dict) -> ModelConfig:
    if hf.get("model_type") != MODEL_TYPE:
        raise EmberError(f"config.json has model_type={hf.get('model_type')!r}; this importer reads DistilBERT")
    if hf.get("sinusoidal_pos_embds", False):
        raise EmberError("this DistilBERT checkpoint uses fixed sinusoidal position embeddings "
                         "(sinusoidal_pos_embds=true); ember's encoder has learned positions only")
    return ModelConfig(
        family="distilbert",
        vocab_size=hf["vocab_size"],
        hidden_size=hf.get("dim", 768),
        num_layers=hf.get("n_layers", 6),
        num_heads=hf.get("n_heads", 12),
        intermediate_size=hf.get("hidden_dim", 3072),
        max_position=hf.get("max_position_embeddings", 512),
        type_vocab_size=0,
        hidden_act=hf.get("activation", "gelu"),
        dropout=hf.get("dropout", 0.1),
        attention_dropout=hf.get("attention_dropout", 0.1),
        layer_norm_eps=_EPS,
        initializer_range=hf.get("initializer_range", 0.02),
        pad_token_id=hf.get("pad_token_id", 0) or 0,
        pooler=False,
    )


def config_to_hf(cfg: ModelConfig, architectures: list[str], extra: dict | None = None) -> dict:
    return {
        "architectures": architectures,
        "model_type": MODEL_TYPE,
        "vocab_size": cfg.vocab_size,
        "dim": cfg.hidden_size,
        "n_layers": cfg.num_layers,
        "n_heads": cfg.num_heads,
        "hidden_dim": cfg.intermediate_size,
        "max_position_embeddings": cfg.max_position,
        "sinusoidal_pos_embds": False,
        "activation": cfg.hidden_act,
        "dropout": cfg.dropout,
        "attention_dropout": cfg.attention_dropout,
        "initializer_range": cfg.initializer_range,
        "pad_token_id": cfg.pad_token_id,
        "tie_word_embeddings": True,
        **(extra or {}),
    }


def state_from_hf(hf_state: dict[str, torch.Tensor], cfg: ModelConfig) -> dict[str, torch.Tensor]:
    """HF DistilBERT state dict -> ember names."""
    hf = hf_tensors(hf_state, _PREFIX)
    if "pre_classifier.weight" in hf:
        raise EmberError(_CLASSIFIER_ERROR.format(what="this checkpoint's head cannot be imported"))
    pop_tied_decoder(hf, "vocab_projector.weight", "embeddings.word_embeddings.weight")
    return rename_from_hf(hf, _FROM_HF, _QKV, cfg.num_layers, "DistilBERT")


def state_to_hf(state: dict[str, torch.Tensor], cfg: ModelConfig) -> dict[str, torch.Tensor]:
    check_exportable(cfg, "DistilBERT")
    if cfg.type_vocab_size:
        raise EmberError(f"DistilBERT has no token-type (segment) embeddings; this model has "
                         f"type_vocab_size={cfg.type_vocab_size}. Train DistilBERT models with "
                         "model.type_vocab_size=0 (the distilbert preset does)")
    if cfg.layer_norm_eps != _EPS:
        raise EmberError(f"transformers' DistilBERT uses LayerNorm eps {_EPS}; this model was trained "
                         f"with model.layer_norm_eps={cfg.layer_norm_eps}")
    if any(k.startswith("classifier.") for k in state):
        raise EmberError(_CLASSIFIER_ERROR.format(what="this fine-tuned classifier cannot be exported"))
    return rename_to_hf(drop_unused_pooler(state), _TO_HF, _QKV, cfg.num_layers, "DistilBERT")


def hf_architecture(state: dict[str, torch.Tensor]) -> str:
    """The transformers class whose weights an ember state dict corresponds to."""
    if any(k.startswith("classifier.") for k in state):
        return "DistilBertForSequenceClassification"  # refused by state_to_hf, with the reason
    if any(k.startswith("mlm.") for k in state):
        return "DistilBertForMaskedLM"
    return "DistilBertModel"
