"""Input embeddings: token + learned absolute position (+ segment), then LayerNorm and dropout.

BERT (Devlin et al. 2019, §3, Fig. 2): the input representation is the sum of token,
segment and position embeddings. ``type_vocab_size=0`` drops segment embeddings.
GPT-1/GPT-2 (Radford et al. 2018, 2019) sum token and position embeddings without a
LayerNorm (``layer_norm=False``) and without a padding row (``pad_token_id=None``).
XLM (Lample & Conneau 2019, §3.4 and Fig. 2) adds a learned language embedding
(``num_languages`` rows), given per token as ``language_ids``; without ids none is added,
as in transformers' XLMModel. ``sinusoidal=True`` replaces the learned position table by
the fixed sin/cos one of Vaswani et al. 2017 §3.5 (XLM's option).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from ember.errors import EmberError
from ember.nn.dropout import Dropout


def sinusoidal_table(positions: int, dim: int) -> torch.Tensor:
    """(positions, dim): angle pos / 10000^(2*(j//2)/dim), sin in even columns, cos in odd
    ones (Vaswani et al. 2017 §3.5, the layout XLM's code uses)."""
    pos = torch.arange(positions, dtype=torch.float64)[:, None]  # (P, 1)
    j = torch.arange(dim, dtype=torch.float64)[None, :]  # (1, D)
    angle = pos / torch.pow(10000.0, 2 * torch.div(j, 2, rounding_mode="floor") / dim)  # (P, D)
    table = torch.where(j.long() % 2 == 0, torch.sin(angle), torch.cos(angle))
    return table.float()


class SinusoidalPositions(nn.Module):
    """A fixed position table, stored as a buffer named ``weight`` (so checkpoints name it
    like a learned table) that no optimizer updates and no weight init overwrites."""

    def __init__(self, positions: int, dim: int) -> None:
        super().__init__()
        self.register_buffer("weight", sinusoidal_table(positions, dim))

    def forward(self, position_ids: torch.Tensor) -> torch.Tensor:
        return F.embedding(position_ids, self.weight)


class InputEmbeddings(nn.Module):
    def __init__(
        self,
        vocab_size: int,
        hidden_size: int,
        max_position: int,
        type_vocab_size: int,
        dropout: float,
        layer_norm_eps: float,
        pad_token_id: int | None = 0,
        layer_norm: bool = True,
        num_languages: int = 0,
        sinusoidal: bool = False,
    ) -> None:
        super().__init__()
        self.word = nn.Embedding(vocab_size, hidden_size, padding_idx=pad_token_id)
        self.position = (SinusoidalPositions(max_position, hidden_size) if sinusoidal
                         else nn.Embedding(max_position, hidden_size))
        self.token_type = nn.Embedding(type_vocab_size, hidden_size) if type_vocab_size else None
        self.language = nn.Embedding(num_languages, hidden_size) if num_languages else None
        self.norm = nn.LayerNorm(hidden_size, eps=layer_norm_eps) if layer_norm else nn.Identity()
        self.dropout = Dropout(dropout)  # CPU-cheap dropout (ember.nn.dropout)
        self.max_position = max_position

    def forward(
        self,
        input_ids: torch.Tensor,  # (B, T)
        token_type_ids: torch.Tensor | None = None,  # (B, T)
        position_ids: torch.Tensor | None = None,  # (B, T) or (T,)
        language_ids: torch.Tensor | None = None,  # (B, T), XLM
    ) -> torch.Tensor:  # (B, T, H)
        seq_len = input_ids.shape[1]
        if seq_len > self.max_position:
            raise EmberError(
                f"sequence of {seq_len} tokens is longer than the model's {self.max_position} "
                "positions; truncate inputs (e.g. --max-length) to at most that"
            )
        if position_ids is None:
            position_ids = torch.arange(seq_len, device=input_ids.device)
        x = self.word(input_ids) + self.position(position_ids)
        if self.token_type is not None:
            if token_type_ids is None:
                x = x + self.token_type.weight[0]
            else:
                x = x + self.token_type(token_type_ids)
        if language_ids is not None:
            if self.language is None:
                raise EmberError("language ids were given but this model has no language embeddings "
                                 "(model.num_languages=0); drop them or use an XLM model")
            x = x + self.language(language_ids)
        return self.dropout(self.norm(x))


class OffsetPositions(nn.Embedding):
    """BART's learned absolute positions (Lewis et al. 2020; fairseq's LearnedPositionalEmbedding
    as released): a table of ``max_position + 2`` rows where position p reads row p + 2. The two
    first rows are a fairseq legacy (positions counted from padding_idx + 1 with pad = 1); they
    are kept, unused, so released checkpoints load row for row."""

    OFFSET = 2

    def __init__(self, max_position: int, dim: int) -> None:
        super().__init__(max_position + self.OFFSET, dim)
        self.max_position = max_position

    def forward(self, length: int, past: int = 0) -> torch.Tensor:  # -> (1, length, dim)
        """Positions past .. past + length - 1 (a decoder with ``past`` cached tokens)."""
        if past + length > self.max_position:
            raise EmberError(f"position {past + length - 1} is beyond the model's {self.max_position} learned "
                             "positions (model.max_position); shorten the input or ask for fewer new tokens")
        ids = torch.arange(past, past + length, device=self.weight.device) + self.OFFSET
        return F.embedding(ids, self.weight)[None]
