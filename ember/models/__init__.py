"""Backbones: they map token ids to hidden states and never compute a loss."""

from ember.models.encoder import Encoder, EncoderOutput

__all__ = ["Encoder", "EncoderOutput", "build_backbone"]


def build_backbone(cfg):
    """The backbone for a ``ModelConfig``; every encoder variant is one ``Encoder`` class."""
    from ember.config import ENCODER_FAMILIES
    from ember.errors import EmberError

    if cfg.family in ENCODER_FAMILIES:
        return Encoder(cfg)
    raise EmberError(f"unknown model family {cfg.family!r}; known: {', '.join(ENCODER_FAMILIES)}")
