"""Backbones: they map token ids to hidden states and never compute a loss.

``BACKBONES`` maps each model family (``ModelConfig.family``) to its backbone class, imported
on first use; a new family is one line here plus its module. Every encoder variant is one
``Encoder`` class (XLM's language embeddings are an Encoder option), GPT-1 and GPT-2 one
causal ``Decoder``, T5 and BART the ``EncoderDecoder``, XLNet its own ``XLNet``.
"""

from __future__ import annotations

import importlib

from ember.models.decoder import Decoder, DecoderOutput
from ember.models.encoder import Encoder, EncoderOutput

__all__ = ["BACKBONES", "Decoder", "DecoderOutput", "Encoder", "EncoderOutput", "backbone_class",
           "build_backbone"]

_ENCODER, _DECODER = "ember.models.encoder:Encoder", "ember.models.decoder:Decoder"
BACKBONES: dict[str, str] = {
    "bert": _ENCODER, "roberta": _ENCODER, "albert": _ENCODER, "electra": _ENCODER, "distilbert": _ENCODER,
    "xlm": _ENCODER,  # + language embeddings (Lample & Conneau 2019)
    "gpt": _DECODER, "gpt2": _DECODER,
    "t5": "ember.models.encoder_decoder:EncoderDecoder",
    "bart": "ember.models.encoder_decoder:EncoderDecoder",  # BART / mBART / MASS: other options (Lewis et al. 2020)
    "xlnet": "ember.models.xlnet:XLNet",  # Transformer-XL layers, two-stream attention (Yang et al. 2019)
    "lstm": "ember.models.lstm:LSTMBackbone",  # embeddings + LSTM layers (Dai & Le 2015)
}


def backbone_class(family: str) -> type:
    from ember.errors import EmberError

    try:
        module_name, _, class_name = BACKBONES[family].partition(":")
    except KeyError:
        raise EmberError(f"unknown model family {family!r}; known: {', '.join(BACKBONES)}") from None
    return getattr(importlib.import_module(module_name), class_name)


def build_backbone(cfg):
    """The backbone for a ``ModelConfig``, chosen by its family."""
    return backbone_class(cfg.family)(cfg)
