"""BERT <-> Hugging Face ``transformers`` (BertModel / BertForPreTraining / BertForMaskedLM /
BertForSequenceClassification) checkpoints.

ember keeps one fused QKV projection per layer; HF keeps query/key/value separately, so
they are concatenated on import and split on export. The MLM decoder is tied to the word
embeddings on both sides, so only the decoder bias travels.
"""

from __future__ import annotations

import torch

from ember.config import ModelConfig
from ember.errors import EmberError
from ember.interop.common import fuse_qkv, rename, split_qkv

MODEL_TYPE = "bert"  # HF config.json "model_type" (ember.interop.families dispatches on it)

# HF (after stripping a leading "bert.") -> ember module names. Old TF-converted
# checkpoints name LayerNorm parameters gamma/beta.
_HF_TO_EMBER = [
    (r"embeddings\.word_embeddings\.weight", r"backbone.embeddings.word.weight"),
    (r"embeddings\.position_embeddings\.weight", r"backbone.embeddings.position.weight"),
    (r"embeddings\.token_type_embeddings\.weight", r"backbone.embeddings.token_type.weight"),
    (r"embeddings\.LayerNorm\.(weight|gamma)", r"backbone.embeddings.norm.weight"),
    (r"embeddings\.LayerNorm\.(bias|beta)", r"backbone.embeddings.norm.bias"),
    (r"encoder\.layer\.(\d+)\.attention\.self\.(query|key|value)\.(weight|bias)", r"qkv.\1.\2.\3"),
    (r"encoder\.layer\.(\d+)\.attention\.output\.dense\.(weight|bias)", r"backbone.layers.\1.attention.out.\2"),
    (r"encoder\.layer\.(\d+)\.attention\.output\.LayerNorm\.(weight|gamma)", r"backbone.layers.\1.attention_norm.weight"),
    (r"encoder\.layer\.(\d+)\.attention\.output\.LayerNorm\.(bias|beta)", r"backbone.layers.\1.attention_norm.bias"),
    (r"encoder\.layer\.(\d+)\.intermediate\.dense\.(weight|bias)", r"backbone.layers.\1.ffn.up.\2"),
    (r"encoder\.layer\.(\d+)\.output\.dense\.(weight|bias)", r"backbone.layers.\1.ffn.down.\2"),
    (r"encoder\.layer\.(\d+)\.output\.LayerNorm\.(weight|gamma)", r"backbone.layers.\1.ffn_norm.weight"),
    (r"encoder\.layer\.(\d+)\.output\.LayerNorm\.(bias|beta)", r"backbone.layers.\1.ffn_norm.bias"),
    (r"pooler\.dense\.(weight|bias)", r"backbone.pooler.dense.\1"),
    (r"cls\.predictions\.transform\.dense\.(weight|bias)", r"mlm.dense.\1"),
    (r"cls\.predictions\.transform\.LayerNorm\.(weight|gamma)", r"mlm.norm.weight"),
    (r"cls\.predictions\.transform\.LayerNorm\.(bias|beta)", r"mlm.norm.bias"),
    (r"cls\.predictions\.bias", r"mlm.bias"),
    (r"cls\.seq_relationship\.(weight|bias)", r"nsp.\1"),
    (r"classifier\.(weight|bias)", r"classifier.\1"),
]

# ember -> HF; qkv is split separately.
_EMBER_TO_HF = [
    (r"backbone\.embeddings\.word\.weight", r"bert.embeddings.word_embeddings.weight"),
    (r"backbone\.embeddings\.position\.weight", r"bert.embeddings.position_embeddings.weight"),
    (r"backbone\.embeddings\.token_type\.weight", r"bert.embeddings.token_type_embeddings.weight"),
    (r"backbone\.embeddings\.norm\.(weight|bias)", r"bert.embeddings.LayerNorm.\1"),
    (r"backbone\.layers\.(\d+)\.attention\.qkv\.(weight|bias)", r"qkv.\1.\2"),
    (r"backbone\.layers\.(\d+)\.attention\.out\.(weight|bias)", r"bert.encoder.layer.\1.attention.output.dense.\2"),
    (r"backbone\.layers\.(\d+)\.attention_norm\.(weight|bias)", r"bert.encoder.layer.\1.attention.output.LayerNorm.\2"),
    (r"backbone\.layers\.(\d+)\.ffn\.up\.(weight|bias)", r"bert.encoder.layer.\1.intermediate.dense.\2"),
    (r"backbone\.layers\.(\d+)\.ffn\.down\.(weight|bias)", r"bert.encoder.layer.\1.output.dense.\2"),
    (r"backbone\.layers\.(\d+)\.ffn_norm\.(weight|bias)", r"bert.encoder.layer.\1.output.LayerNorm.\2"),
    (r"backbone\.pooler\.dense\.(weight|bias)", r"bert.pooler.dense.\1"),
    (r"mlm\.dense\.(weight|bias)", r"cls.predictions.transform.dense.\1"),
    (r"mlm\.norm\.(weight|bias)", r"cls.predictions.transform.LayerNorm.\1"),
    (r"mlm\.bias", r"cls.predictions.bias"),
    (r"nsp\.(weight|bias)", r"cls.seq_relationship.\1"),
    (r"classifier\.(weight|bias)", r"classifier.\1"),
]

_IGNORED_HF = ("position_ids", "cls.predictions.decoder.bias")


def config_from_hf(hf: dict) -> ModelConfig:
    if hf.get("model_type", "bert") != "bert":
        raise EmberError(f"config.json has model_type={hf.get('model_type')!r}; this importer reads BERT")
    if hf.get("position_embedding_type", "absolute") != "absolute":
        raise EmberError("only absolute position embeddings are supported for BERT checkpoints")
    return ModelConfig(
        family="bert",
        vocab_size=hf["vocab_size"],
        hidden_size=hf["hidden_size"],
        num_layers=hf["num_hidden_layers"],
        num_heads=hf["num_attention_heads"],
        intermediate_size=hf["intermediate_size"],
        max_position=hf.get("max_position_embeddings", 512),
        type_vocab_size=hf.get("type_vocab_size", 2),
        hidden_act=hf.get("hidden_act", "gelu"),
        dropout=hf.get("hidden_dropout_prob", 0.1),
        attention_dropout=hf.get("attention_probs_dropout_prob", 0.1),
        layer_norm_eps=hf.get("layer_norm_eps", 1e-12),
        initializer_range=hf.get("initializer_range", 0.02),
        pad_token_id=hf.get("pad_token_id", 0) or 0,
    )


def config_to_hf(cfg: ModelConfig, architectures: list[str], extra: dict | None = None) -> dict:
    return {
        "architectures": architectures,
        "model_type": "bert",
        "vocab_size": cfg.vocab_size,
        "hidden_size": cfg.hidden_size,
        "num_hidden_layers": cfg.num_layers,
        "num_attention_heads": cfg.num_heads,
        "intermediate_size": cfg.intermediate_size,
        "max_position_embeddings": cfg.max_position,
        "type_vocab_size": cfg.type_vocab_size,
        "hidden_act": cfg.hidden_act,
        "hidden_dropout_prob": cfg.dropout,
        "attention_probs_dropout_prob": cfg.attention_dropout,
        "layer_norm_eps": cfg.layer_norm_eps,
        "initializer_range": cfg.initializer_range,
        "pad_token_id": cfg.pad_token_id,
        "position_embedding_type": "absolute",
        "tie_word_embeddings": True,
        **(extra or {}),
    }


def state_from_hf(hf_state: dict[str, torch.Tensor], cfg: ModelConfig) -> dict[str, torch.Tensor]:
    """HF BERT state dict -> ember names (prefix ``backbone.`` for the encoder)."""
    stripped = {k[len("bert."):] if k.startswith("bert.") else k: v for k, v in hf_state.items()}
    decoder = stripped.pop("cls.predictions.decoder.weight", None)
    word = stripped.get("embeddings.word_embeddings.weight")
    if decoder is not None and word is not None and not torch.equal(decoder, word):
        raise EmberError("this checkpoint's MLM decoder is not tied to the word embeddings; "
                         "ember's BERT ties them (as the original BERT does)")
    stripped = {k: v for k, v in stripped.items() if not k.endswith(_IGNORED_HF)}
    state, unmatched = rename(stripped, _HF_TO_EMBER)
    if unmatched:
        raise EmberError(f"unrecognised weights in the HF checkpoint: {unmatched[:5]}")
    fuse_qkv(state, "qkv.{i}", "backbone.layers.{i}.attention.qkv", cfg.num_layers)
    return state


def state_to_hf(state: dict[str, torch.Tensor], cfg: ModelConfig) -> dict[str, torch.Tensor]:
    renamed, unmatched = rename(state, _EMBER_TO_HF)
    if unmatched:
        raise EmberError(f"these weights have no BERT counterpart in transformers: {unmatched[:5]}")
    split_qkv(renamed, "qkv.{i}", "bert.encoder.layer.{i}.attention.self", cfg.num_layers)
    return {k: v.contiguous() for k, v in renamed.items()}


def hf_architecture(state: dict[str, torch.Tensor]) -> str:
    """The transformers class whose weights an ember state dict corresponds to."""
    keys = set(state)
    if any(k.startswith("classifier.") for k in keys):
        return "BertForSequenceClassification"
    if any(k.startswith("nsp.") for k in keys):
        return "BertForPreTraining"
    if any(k.startswith("mlm.") for k in keys):
        return "BertForMaskedLM"
    return "BertModel"
