"""Backbones: they map token ids to hidden states and never compute a loss."""

from ember.models.encoder import Encoder, EncoderOutput

__all__ = ["Encoder", "EncoderOutput", "build_backbone"]


def build_backbone(cfg):
    """The backbone for a ``ModelConfig`` (one family today; more plug in here)."""
    from ember.errors import EmberError

    if cfg.family == "bert":
        return Encoder(cfg)
    raise EmberError(f"unknown model family {cfg.family!r}; known: bert")
