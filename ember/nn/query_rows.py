"""The positions whose last-layer output a caller reads, for a last layer computed only there.

A masked LM reads the encoder's output at its ~15% masked positions only (the sparse head,
``ember.objectives.mlm``). In the last layer every position still serves as a key and a value
of the attention, but a position's query, its attention output, residual, LayerNorm and
feed-forward feed nothing but its own output row. So the last layer can compute keys and values
everywhere and the rest at the read rows only: the same outputs at those rows (to float
rounding), with 1/3 of the QKV projection, the attention's query side, the output projection
and the feed-forward done for ~15% of the rows. Dropout draws its random numbers for the whole
layer, as the full computation does, and applies them at the read rows (``dropout_at_rows``), so
the same seed gives the same masks and a run resumes to the losses it logged before.

``QueryRows`` lays the read rows out per sequence as (B, Q) indices, Q the most any sequence
reads, in increasing position order; a sequence that reads fewer is padded with positions it
does not read (``valid`` False), computed and thrown away.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch


@dataclass
class QueryRows:
    index: torch.Tensor  # (B, Q) int64: positions, increasing within each sequence
    valid: torch.Tensor  # (B, Q) bool: False at the padding of a sequence that reads fewer
    length: int  # T, the sequences' length

    @classmethod
    def of(cls, where: torch.Tensor) -> "QueryRows":
        """From a bool (B, T) mask of the positions read."""
        counts = where.sum(1)
        q = int(counts.max()) if where.numel() else 0
        # a stable sort of "not read" puts each sequence's read positions first, in order
        index = torch.sort((~where).to(torch.uint8), dim=1, stable=True).indices[:, :q]
        valid = torch.arange(q, device=where.device) < counts[:, None]
        return cls(index, valid, where.shape[1])

    def gather(self, x: torch.Tensor, dim: int = 1) -> torch.Tensor:
        """x's entries at the rows along ``dim`` (of length T): (B, ..., T, ...) -> (B, ..., Q, ...)."""
        shape = [1] * x.dim()
        shape[0], shape[dim] = self.index.shape
        index = self.index.view(shape).expand(*x.shape[:dim], self.index.shape[1], *x.shape[dim + 1:])
        return x.gather(dim, index)
