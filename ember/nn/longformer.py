"""Longformer attention (Beltagy et al. 2020, §3): a sliding window per layer, optionally
dilated, plus global attention on chosen positions, as an attention variant of the encoder.

- Local: every token reads its window (ember.nn.banded) through the layer's usual fused q/k/v
  projection (``qkv``, the same weights and state-dict keys as full attention, so a trained
  encoder continues with them, §5).
- Global (§3.1): the chosen positions are keys every token reads (through the local k/v
  projections, as in the paper's released code and transformers), and their own queries read
  every token through separate projections ``query_global``, ``key_global``, ``value_global``
  (§3.1 "Linear Projections for Global Attention"), initialised from the local ones when a
  trained encoder is made long (§5).

``LongMask.of`` turns the encoder's (B, T) padding mask and global-attention mask into what
every layer reads (built once per forward): which keys the band may read, the global positions
gathered into G slots (G = most globals in any row) and the padding mask of the global rows.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch
from torch import nn

from ember.errors import EmberError
from ember.nn.attention import SelfAttention, attention, refuse_unformed
from ember.nn.banded import band_attention, window_bias
from ember.nn.onednn import dense


@dataclass
class LongMask:
    """What long-input attention layers read instead of a (B, 1, T, T) mask."""

    real: torch.Tensor  # bool (B, T): real tokens (not padding)
    local_keys: torch.Tensor  # bool (B, T): keys the window may read: real and not global
    index: torch.Tensor  # long (B, G): the global positions, then filler slots
    global_ok: torch.Tensor  # bool (B, G): slots holding a global position
    padding: torch.Tensor | None  # bool (B, 1, 1, T) for the global rows' attention; None = no padding
    _biases: dict = field(default_factory=dict, repr=False)  # (radius, dilation, dtype) -> window_bias

    def bias(self, radius: int, dilation: int, dtype: torch.dtype) -> torch.Tensor:
        """The band's additive mask, built once per forward for every layer with this window."""
        key = (radius, dilation, dtype)
        if key not in self._biases:
            self._biases[key] = window_bias(self.local_keys, self.global_ok, radius, dilation, dtype)
        return self._biases[key]

    @property
    def num_global(self) -> int:
        return self.index.shape[1]

    @classmethod
    def of(cls, attention_mask: torch.Tensor | None, global_mask: torch.Tensor | None, batch: int,
           length: int, device: torch.device, global_first: int = 0) -> "LongMask":
        """From a (B, T) 1/0 padding mask and a (B, T) 1/0 global-attention mask (transformers'
        ``global_attention_mask``); without one, the first ``global_first`` positions are global
        (1 = [CLS] / <s>, as Longformer's classifiers, §4)."""
        if attention_mask is not None and attention_mask.dim() != 2:
            raise EmberError("long-input attention takes a (batch, length) padding mask; a (B, T, T) "
                             "visibility mask (K-BERT) needs model.attention=full")
        real = (torch.ones(batch, length, dtype=torch.bool, device=device) if attention_mask is None
                else attention_mask.bool())
        if global_mask is None and global_first:
            if global_first > length:
                raise EmberError(f"model.attention_global={global_first} global positions lie beyond the "
                                 f"input of {length} tokens; use at most {length} (or pass a global mask)")
            global_mask = torch.zeros(batch, length, dtype=torch.bool, device=device)
            global_mask[:, :global_first] = True
        if global_mask is not None and tuple(global_mask.shape) != (batch, length):
            raise EmberError(f"global_attention_mask has shape {tuple(global_mask.shape)} but the input is "
                             f"({batch}, {length}); give one 1/0 flag per token")
        glob = real & global_mask.bool() if global_mask is not None else torch.zeros_like(real)
        counts = glob.sum(1)
        g = int(counts.max()) if glob.any() else 0  # the shapes depend on it: one host sync per forward
        # stable sort puts each row's global positions first, in order; the rest fill the slots
        index = torch.sort((~glob).to(torch.uint8), dim=1, stable=True).indices[:, :g]
        global_ok = torch.arange(g, device=device) < counts[:, None]
        padding = None if bool(real.all()) else real[:, None, None, :]
        return cls(real, real & ~glob, index, global_ok, padding)


class LongformerAttention(SelfAttention):
    """Sliding-window (+ dilation) + global self-attention; ``window`` is Longformer's w'
    (even: w'/2 keys on each side), ``dilation`` its d (§3.1 "Dilated Sliding Window")."""

    def __init__(self, hidden_size: int, num_heads: int, dropout: float, window: int, dilation: int = 1,
                 bias: bool = True) -> None:
        super().__init__(hidden_size, num_heads, dropout, bias)
        if window <= 0 or window % 2:
            raise EmberError(f"Longformer's attention window must be a positive even number (w/2 keys "
                             f"on each side of a token); got {window}")
        self.radius, self.dilation = window // 2, dilation
        self.query_global = nn.Linear(hidden_size, hidden_size, bias=bias)
        self.key_global = nn.Linear(hidden_size, hidden_size, bias=bias)
        self.value_global = nn.Linear(hidden_size, hidden_size, bias=bias)

    def forward(self, x: torch.Tensor, mask: LongMask | None = None, need_weights: bool = False,
                **_) -> tuple[torch.Tensor, None]:
        refuse_unformed("longformer", need_weights)
        b, t, hs = x.shape
        if mask is None:
            mask = LongMask.of(None, None, b, t, x.device)
        heads, d = self.num_heads, self.head_dim
        qkv = dense(self.qkv, x).view(b, t, 3, heads, d)
        q, k, v = qkv[:, :, 0], qkv[:, :, 1], qkv[:, :, 2]  # 3 x (B, T, h, d) views
        dropout = self.dropout_p if self.training else 0.0
        g = mask.num_global
        gk = gv = None
        if g:  # the global positions' local keys/values: G extra columns for every query
            at = mask.index[:, :, None, None].expand(b, g, heads, d)
            gk, gv = k.gather(1, at), v.gather(1, at)
        bias = mask.bias(self.radius, self.dilation, q.dtype)  # q's: autocast may have changed it
        context = band_attention(q, k, v, bias, self.radius, self.dilation, gk, gv, dropout).reshape(b, t, hs)
        if g:
            context = self._global_rows(x, context, mask, dropout)
        return dense(self.out, context), None

    def _global_rows(self, x: torch.Tensor, context: torch.Tensor, mask: LongMask, dropout: float) -> torch.Tensor:
        """context (B, T, H) with the global positions' rows replaced: their global queries read
        every real token through the global keys and values (O(G T) scores)."""
        b, t, hs = x.shape
        at = mask.index[..., None].expand(b, mask.num_global, hs)  # (B, G, H)

        def split(y: torch.Tensor) -> torch.Tensor:  # (B, L, H) -> (B, h, L, d)
            return y.view(b, -1, self.num_heads, self.head_dim).transpose(1, 2)

        q = split(dense(self.query_global, x.gather(1, at)))
        k, v = split(dense(self.key_global, x)), split(dense(self.value_global, x))
        rows, _ = attention(q, k, v, mask.padding, dropout, False)  # (B, h, G, d)
        rows = rows.transpose(1, 2).reshape(b, -1, hs)
        rows = torch.where(mask.global_ok[..., None], rows, context.gather(1, at))  # filler slots keep theirs
        return context.scatter(1, at, rows)
