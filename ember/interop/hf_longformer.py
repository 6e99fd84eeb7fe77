"""Longformer <-> Hugging Face ``transformers`` (LongformerModel / LongformerForMaskedLM /
LongformerForSequenceClassification).

Longformer (Beltagy et al. 2020) is RoBERTa's encoder with Longformer attention in every layer
(§3) and three more projections per layer for the global positions. In ember it is not a
family: it is an encoder with ``model.attention=longformer`` (ember.nn.longformer), so an
import is a RoBERTa-family model with that attention, and any encoder family (BERT, RoBERTa,
ELECTRA, the imported MiniLM) made long (``ember convert --long``) exports to this layout.

- Names: RoBERTa's (ember.interop.hf_roberta) under ``longformer.``, plus
  ``attention.self.{query,key,value}_global`` <-> ``attention.{query,key,value}_global``.
- Positions: numbered from ``pad + 1`` as RoBERTa's (fairseq's ``make_positions``); import
  drops the ``pad + 1`` reserved rows and export prepends zero rows (only pads read them).
  A BERT-family model (pad 0) therefore exports with one extra row.
- ``attention_window``: transformers' int or per-layer list <-> ``model.attention_window``.
  transformers has no dilation (its dilated kernel was CUDA-only in the paper's code), so a
  dilated model is refused on export. transformers pads inputs to a multiple of the window
  itself; ember's band needs no padding (ember.nn.banded), and the outputs agree at real tokens.
- Global positions travel with each call (``global_attention_mask``), not in the weights;
  LongformerForSequenceClassification puts one on <s> itself, as ember's
  ``model.attention_global=1`` does.
- Heads: LongformerForQuestionAnswering's ``qa_outputs`` is ember's QA head (ember.interop.families
  carries it for every encoder family); its rule "the tokens before the first ``sep_token_id``
  attend globally" is the QA head's on a Longformer (ember.tasks.qa.head), so ``sep_token_id``
  travels with the config.
"""

from __future__ import annotations

import dataclasses
import re

import torch

from ember.config import ModelConfig
from ember.errors import EmberError
from ember.interop import hf_roberta

MODEL_TYPE = "longformer"
_PREFIX = "longformer."
_GLOBAL = ("query_global", "key_global", "value_global")
_FROM_HF_GLOBAL = re.compile(r"(?:longformer\.)?encoder\.layer\.(\d+)\.attention\.self\.(\w+_global)\.(weight|bias)")
_TO_HF_GLOBAL = re.compile(r"backbone\.layers\.(\d+)\.attention\.(\w+_global)\.(weight|bias)")


def config_from_hf(hf: dict) -> ModelConfig:
    if hf.get("model_type") != MODEL_TYPE:
        raise EmberError(f"config.json has model_type={hf.get('model_type')!r}; this importer reads Longformer")
    # LongformerConfig's own defaults where a field is absent (they differ from RobertaConfig's)
    hf = {"type_vocab_size": 2, "layer_norm_eps": 1e-12, "pad_token_id": 1, **hf}
    window = hf.get("attention_window", 512)
    windows = [window] if isinstance(window, int) else list(window)
    if len(windows) not in (1, hf["num_hidden_layers"]):
        raise EmberError(f"config.json's attention_window has {len(windows)} values for "
                         f"{hf['num_hidden_layers']} layers")
    cfg = hf_roberta.config_from_hf({**hf, "model_type": hf_roberta.MODEL_TYPE})
    same = len(set(windows)) == 1
    return dataclasses.replace(cfg, attention="longformer", sep_token_id=_sep_id(hf),
                               attention_window=str(windows[0]) if same else ",".join(map(str, windows)))


def _sep_id(hf: dict) -> int:
    sep = hf.get("sep_token_id", 2)  # LongformerConfig's default: RoBERTa's </s>
    return -1 if sep is None else int(sep)


def config_to_hf(cfg: ModelConfig, architectures: list[str], extra: dict | None = None) -> dict:
    _check(cfg)
    windows = list(cfg.attention_windows)
    return {
        **hf_roberta.config_to_hf(cfg, architectures),
        "model_type": MODEL_TYPE,
        "attention_window": windows,
        # LongformerForQuestionAnswering puts the tokens before it under global attention
        "sep_token_id": cfg.sep_token_id if cfg.sep_token_id >= 0 else None,
        **(extra or {}),
    }


def state_from_hf(hf_state: dict[str, torch.Tensor], cfg: ModelConfig) -> dict[str, torch.Tensor]:
    """HF Longformer state dict -> ember names: the global projections, then RoBERTa's names."""
    own, rest = {}, {}
    for key, value in hf_state.items():
        match = _FROM_HF_GLOBAL.fullmatch(key)
        if match:
            own[f"backbone.layers.{match[1]}.attention.{match[2]}.{match[3]}"] = value
        else:
            rest["roberta." + key[len(_PREFIX):] if key.startswith(_PREFIX) else key] = value
    return {**hf_roberta.state_from_hf(rest, cfg), **own}


def state_to_hf(state: dict[str, torch.Tensor], cfg: ModelConfig) -> dict[str, torch.Tensor]:
    _check(cfg)
    own, rest = {}, {}
    for key, value in state.items():
        match = _TO_HF_GLOBAL.fullmatch(key)
        if match:
            own[f"{_PREFIX}encoder.layer.{match[1]}.attention.self.{match[2]}.{match[3]}"] = value.contiguous()
        else:
            rest[key] = value
    hf = hf_roberta.state_to_hf(rest, cfg)
    hf = {_PREFIX + k[len("roberta."):] if k.startswith("roberta.") else k: v for k, v in hf.items()}
    return {**hf, **own}


def hf_architecture(state: dict[str, torch.Tensor]) -> str:
    return hf_roberta.hf_architecture(state).replace("Roberta", "Longformer")


def _check(cfg: ModelConfig) -> None:
    if cfg.attention != "longformer":
        raise EmberError(f"this model has model.attention={cfg.attention}; the Longformer layout holds "
                         "Longformer attention (make it long first: ember convert --long)")
    if any(d != 1 for d in cfg.attention_dilations):
        raise EmberError(f"model.attention_dilation={cfg.attention_dilation!r}: transformers' Longformer "
                         "has no dilated windows, so this model has no HF counterpart")
