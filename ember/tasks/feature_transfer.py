"""Feature-based transfer (ELMo, Peters et al. 2018 §3.2-3.3) for any encoder backbone.

The pre-trained encoder is frozen: no gradients, kept in eval mode (no dropout), and not in
the optimizer. Its num_layers + 1 hidden states (embedding output first) are combined by a
learned ``ScalarMix`` (softmax-normalised weights s_j and a scale gamma, eq. 1), optionally
passed through ``feature_layers`` small per-token layers (Linear H->H, GELU, dropout), and
handed to the task's usual head as if they were the encoder's output:

* ``last_hidden_state`` (B, T, H) = the mixed (and projected) states: NER's per-token linear
  layer and SQuAD's start/end layer read them unchanged;
* ``pooled`` (B, H) = their mean over the non-padded tokens: the classification head uses it
  instead of BERT's [CLS] pooler (a frozen [CLS] vector was trained for NSP, not the task).

``FeatureBackbone`` has the encoder's interface (``config``, ``forward`` -> EncoderOutput), so
every task adapter's ``build_module(backbone, pad_id)`` takes it as is.
"""

from __future__ import annotations

import torch
from torch import nn

from ember.models.encoder import EncoderOutput, init_weights
from ember.nn.activations import activation
from ember.nn.scalar_mix import ScalarMix
from ember.tasks.featurize import EXTRA_INPUTS


class FeatureBackbone(nn.Module):
    def __init__(self, encoder: nn.Module, feature_layers: int = 1) -> None:
        super().__init__()
        cfg = encoder.config
        self.encoder = encoder
        for p in self.encoder.parameters():
            p.requires_grad_(False)
        self.mix = ScalarMix(cfg.num_layers + 1)
        layers = []
        for _ in range(feature_layers):
            layers += [nn.Linear(cfg.hidden_size, cfg.hidden_size), activation("gelu"), nn.Dropout(cfg.dropout)]
        self.project = nn.Sequential(*layers)
        self.project.apply(lambda m: init_weights(m, cfg.initializer_range))
        self.encoder.eval()

    @property
    def config(self):
        return self.encoder.config

    def train(self, mode: bool = True) -> "FeatureBackbone":
        super().train(mode)
        self.encoder.eval()  # frozen features: no dropout in the encoder, ever
        return self

    def layer_weights(self) -> list[float]:
        """The learned s_j (embeddings first), for reports."""
        return [float(w) for w in self.mix.layer_weights().detach().cpu()]

    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor | None = None,
                token_type_ids: torch.Tensor | None = None, output_hidden_states: bool = False,
                **extra) -> EncoderOutput:
        if attention_mask is None:
            attention_mask = torch.ones_like(input_ids)
        inputs = {k: v for k, v in extra.items() if k in EXTRA_INPUTS and v is not None}  # e.g. XLM's language_ids
        with torch.no_grad():
            out = self.encoder(input_ids, attention_mask, token_type_ids, output_hidden_states=True, **inputs)
        # The top entry is the encoder's final output (after a pre-LN model's final LayerNorm).
        layers = list(out.hidden_states[:-1]) + [out.last_hidden_state]  # L+1 x (B, T, H)
        x = self.project(self.mix(layers, attention_mask))  # (B, T, H)
        m = attention_mask.to(x.dtype)[..., None]  # (B, T, 1)
        pooled = (x * m).sum(1) / m.sum(1).clamp(min=1.0)  # (B, H) masked mean
        # The frozen encoder's own layers are what embeddings of this run are made of.
        return EncoderOutput(last_hidden_state=x, pooled=pooled,
                             hidden_states=out.hidden_states if output_hidden_states else None)
