"""ELECTRA <-> Hugging Face ``transformers`` (ElectraModel / ElectraForPreTraining /
ElectraForMaskedLM) checkpoints.

What maps to what (ember names on the left):
- ``backbone.*`` + ``rtd_head.*`` (an ember ELECTRA run's discriminator) <-> ElectraForPreTraining
  (``electra.*`` + ``discriminator_predictions.{dense,dense_prediction}``). The generator
  (``generator.*``, ``generator_head.*``) is left out on export: the released ELECTRA
  discriminators ship without it, and HF keeps generators as separate ElectraForMaskedLM
  checkpoints - ``ember.objectives.electra.standalone_generator`` turns it into one.
- ``backbone.*`` + ``mlm.*`` (BertPretraining with an "mlm" head whose transform maps H -> E)
  <-> ElectraForMaskedLM (a generator with its own embeddings: ``generator_predictions.{dense,
  LayerNorm}`` and ``generator_lm_head``, whose weight is tied to the word embeddings).
- ``backbone.*`` <-> ElectraModel.

transformers' ELECTRA encoder is BERT's (same module names) without a pooler, plus
``embeddings_project`` (E -> H) when the embedding size differs from the hidden size
(Clark et al. 2020, App. C: ELECTRA-Small has E 128, H 256) == ember's ``embed_project``.
ElectraForSequenceClassification is not mapped: its head is dropout -> dense -> GELU ->
dropout -> out_proj on the first token, while ember's classifier is one linear layer (after
a tanh pooler when there is one), so no conversion would give the same outputs.
"""

from __future__ import annotations

import dataclasses

import torch

from ember.config import ModelConfig
from ember.errors import EmberError
from ember.interop import hf_bert
from ember.interop.families import (
    check_exportable, hf_tensors, module_rules, pop_tied_decoder, rename_from_hf, rename_to_hf,
)
from ember.interop.hf_roberta import _ENCODER as _BERT_ENCODER  # transformers' BERT encoder layout

MODEL_TYPE = "electra"
_PREFIX = "electra."
_QKV = ("query", "key", "value")

_ENCODER = [(hf, ours) for hf, ours in _BERT_ENCODER if not hf.startswith("pooler")] + [
    ("embeddings_project", "backbone.embed_project"),
]
_HEADS = [
    ("discriminator_predictions.dense", "rtd_head.dense"),
    ("discriminator_predictions.dense_prediction", "rtd_head.dense_prediction"),
    ("generator_predictions.dense", "mlm.dense"),
    ("generator_predictions.LayerNorm", "mlm.norm"),
]
_FROM_ENCODER, _TO_ENCODER = module_rules(_ENCODER, _PREFIX)
_FROM_HEADS, _TO_HEADS = module_rules(_HEADS)
_FROM_HF = _FROM_ENCODER + _FROM_HEADS + [(r"generator_lm_head\.bias", "mlm.bias")]
_TO_HF = _TO_ENCODER + _TO_HEADS + [(r"mlm\.bias", "generator_lm_head.bias")]

_GENERATOR = ("generator.", "generator_head.")  # an ember ELECTRA run's generator


def config_from_hf(hf: dict) -> ModelConfig:
    if hf.get("model_type") != MODEL_TYPE:
        raise EmberError(f"config.json has model_type={hf.get('model_type')!r}; this importer reads ELECTRA")
    bert = hf_bert.config_from_hf({**hf, "model_type": hf_bert.MODEL_TYPE})  # shared field names
    embedding = hf.get("embedding_size", bert.hidden_size)
    return dataclasses.replace(
        bert, family="electra", pooler=False,  # ELECTRA has no pooler; classifiers read the first token
        embedding_size=embedding if embedding != bert.hidden_size else 0,
    )


def config_to_hf(cfg: ModelConfig, architectures: list[str], extra: dict | None = None) -> dict:
    if cfg.type_vocab_size == 0:
        raise EmberError("transformers' ELECTRA always has segment embeddings; this model has "
                         "type_vocab_size=0 and cannot be exported as ELECTRA")
    return {
        **hf_bert.config_to_hf(cfg, architectures),
        "model_type": MODEL_TYPE,
        "embedding_size": cfg.embedding_size or cfg.hidden_size,
        **(extra or {}),
    }


def state_from_hf(hf_state: dict[str, torch.Tensor], cfg: ModelConfig) -> dict[str, torch.Tensor]:
    """HF ELECTRA state dict -> ember names (``backbone.*`` + ``rtd_head.*`` or ``mlm.*``)."""
    hf = hf_tensors(hf_state, _PREFIX)
    if any(k.startswith("classifier.") for k in hf):
        raise EmberError("this is an ElectraForSequenceClassification checkpoint; its head (dense -> GELU -> "
                         "out_proj) has no exact ember counterpart. Fine-tune from the pre-trained "
                         "discriminator (ElectraForPreTraining) or generator (ElectraForMaskedLM) instead")
    if "generator_lm_head.bias" in hf and cfg.hidden_act != "gelu":
        # transformers' ElectraGeneratorPredictions always applies GELU; ember's head follows hidden_act.
        raise EmberError(f"this ElectraForMaskedLM has hidden_act={cfg.hidden_act!r}, but transformers' "
                         "generator head always uses gelu while ember's follows hidden_act; the converted "
                         "model would not give the same outputs")
    pop_tied_decoder(hf, "generator_lm_head.weight", "embeddings.word_embeddings.weight")
    return rename_from_hf(hf, _FROM_HF, _QKV, cfg.num_layers, "ELECTRA")


def state_to_hf(state: dict[str, torch.Tensor], cfg: ModelConfig) -> dict[str, torch.Tensor]:
    """ember -> HF names (encoder under ``electra.``). An ELECTRA run's generator is left out;
    the tied ``generator_lm_head.weight`` is not written (transformers re-ties it on load)."""
    check_exportable(cfg, "ELECTRA", factorized=True)
    if any(k.startswith("classifier.") for k in state):
        raise EmberError("ember's fine-tuned classifier (a linear layer on the first token) has no exact "
                         "counterpart in transformers' ELECTRA, whose ElectraForSequenceClassification head "
                         "adds a dense + GELU layer; export the pre-training run instead")
    if any(k.startswith("backbone.pooler.") for k in state):
        raise EmberError("this model has a pooler, which transformers' ELECTRA does not have; build ELECTRA "
                         "models with model.pooler=false (the electra-* presets do)")
    generator = [k for k in state if k.startswith(_GENERATOR)]
    if generator:
        print(f"note: leaving out the ELECTRA generator ({len(generator)} tensors): only the discriminator "
              "is exported (ember.objectives.electra.standalone_generator makes an ElectraForMaskedLM of it)")
    kept = {k: v for k, v in state.items() if not k.startswith(_GENERATOR)}
    return rename_to_hf(kept, _TO_HF, _QKV, cfg.num_layers, "ELECTRA")


def hf_architecture(state: dict[str, torch.Tensor]) -> str:
    """The transformers class whose weights an ember state dict corresponds to."""
    keys = set(state)
    if any(k.startswith("classifier.") for k in keys):
        return "ElectraForSequenceClassification"  # state_to_hf explains why it does not export
    if any(k.startswith("rtd_head.") for k in keys):
        return "ElectraForPreTraining"
    if any(k.startswith("mlm.") for k in keys):
        return "ElectraForMaskedLM"
    return "ElectraModel"
