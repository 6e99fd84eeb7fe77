"""LSTM layers over right-padded batches: step only over each row's real tokens, start from a
given state, hand back the state each row ends in.

``run_packed`` runs one ``nn.LSTM`` on a padded batch through ``pack_padded_sequence``, so the
recurrence never reads padding and the returned final state (h_n, c_n) is each row's state after
its own last real token (not after the padding). ``StackedLSTM`` is L single-layer LSTMs with
dropout between them, keeping every layer's outputs and final state: a language model and a
classifier read the top layer, a sequence autoencoder's decoder starts from the encoder's final
state of every layer (Dai & Le 2015, §2), and serving returns every layer's states.
Used by ELMo's biLM (ember.models.elmo) and the Dai & Le LSTM (ember.models.lstm).
"""

from __future__ import annotations

import torch
from torch import nn
from torch.nn.utils.rnn import pack_padded_sequence, pad_packed_sequence

from ember.nn.dropout import Dropout

State = tuple[torch.Tensor, torch.Tensor]  # (h, c), each (layers, B, H)


def run_packed(lstm: nn.LSTM, x: torch.Tensor, lengths: torch.Tensor,
               state: State | None = None) -> tuple[torch.Tensor, State]:
    """x (B, T, E) right-padded to ``lengths`` (B,), all >= 1 -> (outputs (B, T, H), zeros at
    padding; (h_n, c_n) each (layers, B, H) after each row's last real step). ``state``: the
    initial (h_0, c_0) in batch order (None: zeros); PyTorch reorders it with the packing."""
    packed = pack_padded_sequence(x, lengths.cpu(), batch_first=True, enforce_sorted=False)
    out, final = lstm(packed, state)
    h, _ = pad_packed_sequence(out, batch_first=True, total_length=x.shape[1])
    return h, final


class StackedLSTM(nn.Module):
    """``num_layers`` single-layer LSTMs (input E -> H cells), dropout ``dropout`` on the input of
    each layer after the first. One module per layer (not nn.LSTM(num_layers=L)) so every
    layer's outputs are kept."""

    def __init__(self, input_size: int, hidden_size: int, num_layers: int, dropout: float) -> None:
        super().__init__()
        self.layers = nn.ModuleList(
            nn.LSTM(input_size if i == 0 else hidden_size, hidden_size, batch_first=True)
            for i in range(num_layers))
        self.dropout = Dropout(dropout)

    def forward(self, x: torch.Tensor, lengths: torch.Tensor,
                state: State | None = None) -> tuple[list[torch.Tensor], State]:
        """x (B, T, E), lengths (B,) -> (L outputs (B, T, H), bottom first; (h_n, c_n) each
        (L, B, H)). ``state`` (h_0, c_0) each (L, B, H) starts the layers (None: zeros)."""
        outputs, hs, cs = [], [], []
        for i, lstm in enumerate(self.layers):
            start = None if state is None else (state[0][i : i + 1], state[1][i : i + 1])
            x, (h, c) = run_packed(lstm, self.dropout(x) if i else x, lengths, start)
            outputs.append(x)
            hs.append(h)
            cs.append(c)
        return outputs, (torch.cat(hs), torch.cat(cs))
