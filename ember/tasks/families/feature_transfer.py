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

``combine`` picks the features instead of the learned mix, for the BERT paper's feature-based
ablation (Devlin et al. 2019, Table 7, CoNLL-2003): ``embeddings`` (the embedding output),
``second-to-last`` or ``last`` hidden layer, ``sum-last-4`` (an unweighted sum) and
``concat-last-4`` (4H wide; the first per-token layer maps it back to H, or one Linear layer does
when ``feature_layers`` is 0). ``mix`` (the default) is the learned weighted sum of all layers.

``FeatureBackbone`` has the encoder's interface (``config``, ``forward`` -> EncoderOutput), so
every task adapter's ``build_module(backbone, pad_id)`` takes it as is.
"""

from __future__ import annotations

import torch
from torch import nn

from ember.errors import EmberError
from ember.models.encoder import EncoderOutput, init_weights
from ember.nn.activations import activation
from ember.nn.scalar_mix import ScalarMix
from ember.tasks.featurize import EXTRA_INPUTS


FEATURE_COMBINES = ("mix", "embeddings", "second-to-last", "last", "sum-last-4", "concat-last-4")


def combine_layers(layers: list[torch.Tensor], combine: str) -> torch.Tensor:
    """The fixed (not learned) feature choices of BERT's Table 7 from the L+1 hidden states."""
    if combine == "embeddings":
        return layers[0]
    if combine == "second-to-last":
        return layers[-2]
    if combine == "last":
        return layers[-1]
    if combine == "sum-last-4":
        return torch.stack(layers[-4:]).sum(0)
    if combine == "concat-last-4":
        return torch.cat(layers[-4:], dim=-1)
    raise ValueError(combine)


class FeatureBackbone(nn.Module):
    def __init__(self, encoder: nn.Module, feature_layers: int = 1, combine: str = "mix") -> None:
        super().__init__()
        cfg = encoder.config
        if combine not in FEATURE_COMBINES:
            raise EmberError(f"task.feature_combine={combine!r}; choose one of {', '.join(FEATURE_COMBINES)}")
        if combine.endswith("-4") and cfg.num_layers < 4:
            raise EmberError(f"task.feature_combine={combine} needs 4 layers; this encoder has {cfg.num_layers}")
        self.encoder, self.combine = encoder, combine
        for p in self.encoder.parameters():
            p.requires_grad_(False)
        if combine == "mix":
            self.mix = ScalarMix(cfg.num_layers + 1)
        width = 4 * cfg.hidden_size if combine == "concat-last-4" else cfg.hidden_size
        layers = [nn.Linear(width, cfg.hidden_size)] if width != cfg.hidden_size and feature_layers == 0 else []
        for i in range(feature_layers):
            layers += [nn.Linear(width if i == 0 else cfg.hidden_size, cfg.hidden_size), activation("gelu"),
                       nn.Dropout(cfg.dropout)]
        self.project = nn.Sequential(*layers)
        self.project.apply(lambda m: init_weights(m, cfg.initializer_range))
        self.encoder.eval()

    @classmethod
    def for_task(cls, encoder: nn.Module, task) -> "FeatureBackbone":
        """The wrapper a run's ``task`` settings ask for (``--features``)."""
        return cls(encoder, task.feature_layers, task.feature_combine)

    @property
    def config(self):
        return self.encoder.config

    def train(self, mode: bool = True) -> "FeatureBackbone":
        super().train(mode)
        self.encoder.eval()  # frozen features: no dropout in the encoder, ever
        return self

    def layer_weights(self) -> list[float] | None:
        """The learned s_j (embeddings first), for reports; None for a fixed choice of layers."""
        if self.combine != "mix":
            return None
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
        mixed = self.mix(layers, attention_mask) if self.combine == "mix" else combine_layers(layers, self.combine)
        x = self.project(mixed)  # (B, T, H)
        m = attention_mask.to(x.dtype)[..., None]  # (B, T, 1)
        pooled = (x * m).sum(1) / m.sum(1).clamp(min=1.0)  # (B, H) masked mean
        # The frozen encoder's own layers are what embeddings of this run are made of.
        return EncoderOutput(last_hidden_state=x, pooled=pooled,
                             hidden_states=out.hidden_states if output_hidden_states else None)
