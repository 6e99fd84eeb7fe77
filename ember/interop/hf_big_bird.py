"""BigBird <-> Hugging Face ``transformers`` (BigBirdModel / BigBirdForPreTraining /
BigBirdForMaskedLM), block-sparse or full.

BigBird (Zaheer et al. 2020) is BERT's encoder with block-sparse attention; in ember it is an
encoder with ``model.attention=bigbird`` (ember.nn.bigbird), so an import is a BERT-family
model with that attention, and a BERT-family model with BigBird attention exports here.
Names are BERT's (ember.interop.hf_bert) except the pooler, a bare Linear (``pooler.weight``).
``attention_type: original_full`` imports as full attention. Refused: ``rescale_embeddings``
(embeddings x sqrt(H), which ember's encoder does not do), ``use_bias: false`` (q/k/v without
bias) and the classification head (transformers' is RoBERTa-style dense + out_proj without a
pooler, not BERT's).
"""

from __future__ import annotations

import dataclasses

import torch

from ember.config import ModelConfig
from ember.errors import EmberError
from ember.interop import hf_bert

MODEL_TYPE = "big_bird"


def config_from_hf(hf: dict) -> ModelConfig:
    if hf.get("model_type") != MODEL_TYPE:
        raise EmberError(f"config.json has model_type={hf.get('model_type')!r}; this importer reads BigBird")
    if hf.get("rescale_embeddings") or hf.get("use_bias") is False:
        raise EmberError("this BigBird checkpoint sets rescale_embeddings or use_bias=false, which ember's "
                         "encoder does not reproduce")
    if hf.get("is_decoder") or hf.get("add_cross_attention"):
        raise EmberError("this BigBird checkpoint is a decoder; ember imports the bidirectional encoder")
    hf = {"hidden_act": "gelu_new", "max_position_embeddings": 4096, **hf}  # BigBirdConfig's defaults
    cfg = hf_bert.config_from_hf({**hf, "model_type": hf_bert.MODEL_TYPE})
    if hf.get("attention_type", "block_sparse") == "original_full":
        return cfg
    return dataclasses.replace(cfg, attention="bigbird", attention_block=hf.get("block_size", 64),
                               attention_random_blocks=hf.get("num_random_blocks", 3))


def config_to_hf(cfg: ModelConfig, architectures: list[str], extra: dict | None = None) -> dict:
    if cfg.attention != "bigbird":
        raise EmberError(f"this model has model.attention={cfg.attention}; the BigBird layout holds BigBird "
                         "attention (model.attention=bigbird)")
    bert = hf_bert.config_to_hf(cfg, architectures)
    bert.pop("position_embedding_type")
    return {**bert, "model_type": MODEL_TYPE, "attention_type": "block_sparse",
            "block_size": cfg.attention_block, "num_random_blocks": cfg.attention_random_blocks,
            "rescale_embeddings": False, "use_bias": True, **(extra or {})}


def state_from_hf(hf_state: dict[str, torch.Tensor], cfg: ModelConfig) -> dict[str, torch.Tensor]:
    if any(k.startswith("classifier.") for k in hf_state):
        raise EmberError("BigBirdForSequenceClassification's head (dense + out_proj, no pooler) has no "
                         "BERT-style counterpart in ember; save its base model and fine-tune on it")
    renamed = {}
    for key, value in hf_state.items():
        stem = key.removeprefix("bert.")
        if stem in ("pooler.weight", "pooler.bias"):
            key = key.replace("pooler.", "pooler.dense.")
        renamed[key] = value
    return hf_bert.state_from_hf(renamed, cfg)


def state_to_hf(state: dict[str, torch.Tensor], cfg: ModelConfig) -> dict[str, torch.Tensor]:
    if any(k.startswith("classifier.") for k in state):
        raise EmberError("a BigBird classifier has no BERT-style counterpart in transformers (its head is "
                         "dense + out_proj without a pooler); export the pre-trained run instead")
    hf = hf_bert.state_to_hf(state, cfg)
    return {k.replace("bert.pooler.dense.", "bert.pooler."): v for k, v in hf.items()}


def hf_architecture(state: dict[str, torch.Tensor]) -> str:
    return hf_bert.hf_architecture(state).replace("Bert", "BigBird")
