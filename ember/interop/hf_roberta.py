"""RoBERTa <-> Hugging Face ``transformers`` (RobertaModel / RobertaForMaskedLM /
RobertaForSequenceClassification).

RoBERTa (Liu et al. 2019, §2 and §4) is BERT's architecture with different training, so the
encoder names are BERT's under a ``roberta.`` prefix. Three things differ:

- Positions. fairseq, and transformers after it, number real tokens from
  ``padding_idx + 1`` (``create_position_ids_from_input_ids``: pads keep position
  ``padding_idx``), so with <pad> = 1 the first token reads row 2 of a 514-row table. ember
  numbers positions 0..T-1, so import drops the first ``pad + 1`` rows (514 -> 512
  positions) and export prepends ``pad + 1`` zero rows. Those rows are only ever read at
  pad positions, whose outputs are masked out; zeros also match the HF table's
  ``padding_idx`` row. Outputs agree at every non-pad position of right-padded batches
  (left padding shifts HF's numbering, not ours).
- Heads. The MLM head is ``lm_head.{dense, layer_norm, bias}`` with the decoder tied to the
  word embeddings. ``RobertaForSequenceClassification`` has no pooler; its head is
  dense -> tanh -> out_proj on <s>, which is exactly ember's pooler (tanh(W h_<s> + b)) then
  the classifier, so ``classifier.dense`` <-> ``backbone.pooler.dense`` and
  ``classifier.out_proj`` <-> ``classifier``.
- One segment embedding (type_vocab_size 1) and LayerNorm eps 1e-5.
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

MODEL_TYPE = "roberta"
_PREFIX = "roberta."
_QKV = ("query", "key", "value")

# The BERT encoder layout (transformers' BertModel / RobertaModel), shared by RoBERTa.
_ENCODER = [
    ("embeddings.word_embeddings", "backbone.embeddings.word"),
    ("embeddings.position_embeddings", "backbone.embeddings.position"),
    ("embeddings.token_type_embeddings", "backbone.embeddings.token_type"),
    ("embeddings.LayerNorm", "backbone.embeddings.norm"),
    *[(f"encoder.layer.{{i}}.attention.self.{n}", f"qkv.{{i}}.{n}") for n in _QKV],
    ("encoder.layer.{i}.attention.output.dense", "backbone.layers.{i}.attention.out"),
    ("encoder.layer.{i}.attention.output.LayerNorm", "backbone.layers.{i}.attention_norm"),
    ("encoder.layer.{i}.intermediate.dense", "backbone.layers.{i}.ffn.up"),
    ("encoder.layer.{i}.output.dense", "backbone.layers.{i}.ffn.down"),
    ("encoder.layer.{i}.output.LayerNorm", "backbone.layers.{i}.ffn_norm"),
    ("pooler.dense", "backbone.pooler.dense"),
]
_HEADS = [
    ("lm_head.dense", "mlm.dense"),
    ("lm_head.layer_norm", "mlm.norm"),
    ("classifier.out_proj", "classifier"),
]
_FROM_ENCODER, _TO_ENCODER = module_rules(_ENCODER, _PREFIX)
_FROM_HEADS, _TO_HEADS = module_rules(_HEADS)
# The classification head's dense layer is ember's pooler (see the module docstring).
_FROM_CLS_DENSE, _TO_CLS_DENSE = module_rules([("classifier.dense", "backbone.pooler.dense")])
_FROM_HF = _FROM_ENCODER + _FROM_HEADS + _FROM_CLS_DENSE + [(r"lm_head\.bias", "mlm.bias")]
_TO_HF = _TO_ENCODER + _TO_HEADS + [(r"mlm\.bias", "lm_head.bias")]


def _offset(pad_token_id: int) -> int:
    """Rows of the HF position table before the first real token's position."""
    return pad_token_id + 1


def config_from_hf(hf: dict) -> ModelConfig:
    if hf.get("model_type") != MODEL_TYPE:
        raise EmberError(f"config.json has model_type={hf.get('model_type')!r}; this importer reads RoBERTa")
    if hf.get("is_decoder") or hf.get("add_cross_attention"):
        raise EmberError("this RoBERTa checkpoint is a decoder (is_decoder/add_cross_attention); "
                         "ember imports the bidirectional encoder only")
    pad = hf.get("pad_token_id", 1)
    pad = 1 if pad is None else pad
    positions = hf.get("max_position_embeddings", 514) - _offset(pad)
    if positions <= 0:
        raise EmberError(f"max_position_embeddings={hf.get('max_position_embeddings')} leaves no "
                         f"positions after the {_offset(pad)} reserved by pad_token_id={pad}")
    # Every other field is spelled as in BertConfig.
    bert = hf_bert.config_from_hf({**hf, "model_type": hf_bert.MODEL_TYPE})
    return dataclasses.replace(
        bert, family="roberta", max_position=positions, pad_token_id=pad,
        type_vocab_size=hf.get("type_vocab_size", 1), layer_norm_eps=hf.get("layer_norm_eps", 1e-5),
    )


def config_to_hf(cfg: ModelConfig, architectures: list[str], extra: dict | None = None) -> dict:
    return {
        **hf_bert.config_to_hf(cfg, architectures),
        "model_type": MODEL_TYPE,
        "max_position_embeddings": cfg.max_position + _offset(cfg.pad_token_id),
        "type_vocab_size": max(1, cfg.type_vocab_size),
        **(extra or {}),
    }


def state_from_hf(hf_state: dict[str, torch.Tensor], cfg: ModelConfig) -> dict[str, torch.Tensor]:
    """HF RoBERTa state dict -> ember names; drops the reserved position rows."""
    hf = hf_tensors(hf_state, _PREFIX)
    pop_tied_decoder(hf, "lm_head.decoder.weight", "embeddings.word_embeddings.weight",
                     "lm_head.decoder.bias", "lm_head.bias")
    if "pooler.dense.weight" in hf and "classifier.dense.weight" in hf:
        raise EmberError("this checkpoint has both a pooler and a classification head; ember's "
                         "RoBERTa classifier uses one dense+tanh layer (the pooler) before out_proj")
    state = rename_from_hf(hf, _FROM_HF, _QKV, cfg.num_layers, "RoBERTa")
    key = "backbone.embeddings.position.weight"
    if key in state:
        state[key] = state[key][_offset(cfg.pad_token_id):]  # (514, H) -> (512, H)
    return state


def state_to_hf(state: dict[str, torch.Tensor], cfg: ModelConfig) -> dict[str, torch.Tensor]:
    check_exportable(cfg, "RoBERTa")
    state = dict(drop_unused_pooler(state))
    rules = _TO_HF
    if any(k.startswith("classifier.") for k in state):
        if "backbone.pooler.dense.weight" not in state:
            raise EmberError("RobertaForSequenceClassification applies dense -> tanh to <s> before "
                             "its output layer; this classifier was trained without a pooler, so it "
                             "has no exact HF counterpart. Fine-tune with model.pooler=true to export it")
        rules = _TO_CLS_DENSE + _TO_HF  # first match wins: the pooler becomes classifier.dense
    key = "backbone.embeddings.position.weight"
    if key in state:  # (512, H) -> (514, H): rows read only at pad positions
        pos = state[key]
        state[key] = torch.cat([pos.new_zeros(_offset(cfg.pad_token_id), pos.shape[1]), pos])
    if cfg.type_vocab_size == 0 and "backbone.embeddings.word.weight" in state:
        # No segment embeddings == one segment embedding of zeros (transformers always has one).
        word = state["backbone.embeddings.word.weight"]
        state["backbone.embeddings.token_type.weight"] = word.new_zeros(1, word.shape[1])
    return rename_to_hf(state, rules, _QKV, cfg.num_layers, "RoBERTa")


def hf_architecture(state: dict[str, torch.Tensor]) -> str:
    """The transformers class whose weights an ember state dict corresponds to."""
    if any(k.startswith("classifier.") for k in state):
        return "RobertaForSequenceClassification"
    if any(k.startswith("mlm.") for k in state):
        return "RobertaForMaskedLM"
    return "RobertaModel"
