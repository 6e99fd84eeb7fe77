"""The LSTM of Dai & Le 2015 ("Semi-supervised Sequence Learning"): word embeddings -> LSTM layers.

    x_t = dropout(E[w_t])                                   (B, T, E)  word embeddings
    h_t^(1..L), c_t^(1..L) = LSTM layers over x_1..x_t       (B, T, H)  causal, left to right

The same network is pre-trained as a language model (LM-LSTM) or as the encoder and decoder of a
sequence autoencoder (SA-LSTM; the decoder starts from the encoder's final state, §2), then
fine-tuned as a classifier on its last state (ember.objectives.dai_le, ember.tasks.families.lstm).
Inputs are the subword ids of the prepared corpus's tokenizer, framed as that tokenizer frames a
sentence (``[CLS] text [SEP]``), so pre-training, fine-tuning and serving read the same sequences.

Sequences are right-padded; each row steps over its own tokens only (``ember.nn.lstm``), so its
final state is the state after its last real token. No loss lives here.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import nn

from ember.config import ModelConfig
from ember.errors import EmberError
from ember.nn.dropout import Dropout
from ember.nn.lstm import StackedLSTM, State


@dataclass
class LSTMOutput:
    last_hidden_state: torch.Tensor  # (B, T, H) the top layer's outputs, zeros at padding
    final_state: State  # (h_n, c_n) each (L, B, H): every layer's state after each row's last token
    hidden_states: tuple[torch.Tensor, ...] | None = None  # L + 1 x (B, T, H) on request
    pooled: None = None  # no [CLS] pooler: classifiers read the final state
    attentions: None = None


class LSTMBackbone(nn.Module):
    """Embedding (V -> E) and ``num_layers`` LSTM layers of ``hidden_size`` cells."""

    def __init__(self, config: ModelConfig) -> None:
        super().__init__()
        self.config = config
        e = config.embedding_size or config.hidden_size
        self.embeddings = nn.Embedding(config.vocab_size, e)
        nn.init.uniform_(self.embeddings.weight, -config.initializer_range, config.initializer_range)
        self.embedding_dropout = Dropout(config.embedding_dropout)
        self.lstm = StackedLSTM(e, config.hidden_size, config.num_layers, config.dropout)

    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor | None = None,
                token_type_ids: torch.Tensor | None = None, output_hidden_states: bool = False,
                initial_state: State | None = None) -> LSTMOutput:
        """input_ids (B, T), attention_mask (B, T) 1 = token (right padding). ``token_type_ids``
        are ignored: the LSTM reads a pair as one sequence. ``initial_state`` (h_0, c_0), each
        (L, B, H), starts every layer (a sequence autoencoder's decoder); None = zeros."""
        if attention_mask is None:
            attention_mask = torch.ones_like(input_ids)
        lengths = attention_mask.long().sum(dim=1).clamp(min=1)  # packing needs >= 1 step
        x = self.embeddings(input_ids)  # (B, T, E)
        outputs, final = self.lstm(self.embedding_dropout(x), lengths, initial_state)
        hidden = None
        if output_hidden_states:
            hidden = (self._as_layer(x * attention_mask.unsqueeze(-1).to(x.dtype)), *outputs)
        return LSTMOutput(outputs[-1], final, hidden)

    def _as_layer(self, x: torch.Tensor) -> torch.Tensor:
        """The embeddings (B, T, E) as layer 0 of the hidden states (B, T, H): zero-padded to H
        when E < H, so every layer stacks into one (L + 1, B, T, H) tensor for serving."""
        e, h = x.shape[-1], self.config.hidden_size
        if e > h:
            raise EmberError(f"an LSTM with embeddings wider than its states (embedding_size {e} > "
                             f"hidden_size {h}) cannot return its embeddings as a hidden-state layer")
        return nn.functional.pad(x, (0, h - e))

    # ULMFiT's layer-wise learning rates and gradual unfreezing (ember.train.layerwise) place
    # parameters by these: embeddings at depth 0, LSTM layer i at depth i.
    embed_project = final_norm = pooler = None

    def layer_sequence(self):
        return [(layer, None) for layer in self.lstm.layers]
