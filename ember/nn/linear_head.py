"""A backbone with dropout and one linear layer on top: the fine-tuning head of BERT (Devlin et
al. 2019, §4): sentence classification/regression reads it at [CLS], token tagging at every
position. The subclasses decide where; the parameters (and their state-dict names
``backbone.*``, ``classifier.*``) are the same for both, as in the HF checkpoints."""

from __future__ import annotations

from torch import nn


class BackboneWithLinearHead(nn.Module):
    def __init__(self, backbone: nn.Module, num_labels: int, pad_id: int, dropout: float | None = None) -> None:
        super().__init__()
        cfg = backbone.config
        self.backbone = backbone
        self.num_labels = num_labels
        self.pad_id = pad_id
        self.dropout = nn.Dropout(cfg.dropout if dropout is None else dropout)
        self.classifier = nn.Linear(cfg.hidden_size, num_labels)  # (H) -> (num_labels)
        nn.init.normal_(self.classifier.weight, std=cfg.initializer_range)  # BERT's initialiser
        nn.init.zeros_(self.classifier.bias)
