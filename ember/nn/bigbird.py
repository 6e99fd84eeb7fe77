"""BigBird block-sparse attention (Zaheer et al. 2020, §2 and App. D), the ITC variant: an
attention variant of the encoder (``model.attention=bigbird``), with the layer's usual fused
q/k/v projection (same weights and state-dict keys as full attention).

The sequence is cut into blocks of ``block`` tokens (zero-padded to a whole number of them;
padding keys are masked). With nb blocks:

- the first and last blocks are global (internal transformer construction, ITC): their
  queries read every key, and every query reads their keys;
- every other query block c reads its sliding window (blocks c-1, c, c+1) and ``random``
  further blocks (App. D "random attention": ``r`` blocks per query block, per head).
  Blocks 1 and nb-2, whose window already holds a global block, read 4 + r blocks; transformers'
  layout, kept here, gives every row 5 + r key slots and masks the unused one.

Which random blocks. Training draws them anew every call (per head and query block, uniformly
among the blocks outside the row's window and the global blocks, with ``torch.rand`` on the
device, so ``torch.manual_seed`` reproduces them). In eval mode transformers' BigBirdModel draws
none: its random-block indices are all 0 ("During inference (eval) no randomness",
``_bigbird_block_rand_mask``), so each row reads the first block r more times. ember does the
same in eval mode (``eval_random="first"``), which is what a checkpoint trained with
transformers is evaluated with and what parity needs; the duplicated block then carries (1 + r)x
the weight of a single copy in the softmax, exactly as in transformers.

Short inputs. Block-sparse attention only pays once the input holds more than the
(5 + 2r) * block tokens one row reads; like transformers, shorter inputs run full attention
(the same weights, every pair).

Each query block is one small dense attention against its gathered (5 + r) * block keys, run by
PyTorch's fused SDPA kernel (``ember.nn.dropout.attend``); memory O(T (5 + r) block).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from ember.errors import EmberError
from ember.nn.attention import SelfAttention, refuse_unformed
from ember.nn.dropout import attend
from ember.nn.onednn import dense


def key_blocks(num_blocks: int, random_ids: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(index (h, nb-2, 5+r), used bool (nb-2, 5+r)): the key blocks each middle query block
    (1 .. nb-2) reads, in transformers' order, from its random blocks ``random_ids`` (h, nb-2, r)."""
    nb = num_blocks
    h, rows, r = random_ids.shape
    device = random_ids.device
    c = torch.arange(1, nb - 1, device=device)[:, None]  # (rows, 1)
    fixed = torch.cat([torch.zeros_like(c), c - 1, c, c + 1, torch.full_like(c, nb - 1)], dim=1)  # (rows, 5)
    fixed[0] = torch.tensor([0, 1, 2, nb - 1, 0], device=device)  # block 1: first, 1, 2, last (+ unused)
    fixed[-1] = torch.tensor([0, nb - 3, nb - 2, nb - 1, 0], device=device)  # block nb-2: first, window, last
    used = torch.ones(rows, 5 + r, dtype=torch.bool, device=device)
    used[0, 4] = used[-1, 4] = False
    index = torch.cat([fixed.expand(h, rows, 5), random_ids], dim=2)
    return index, used


def draw_random_blocks(num_blocks: int, heads: int, r: int, device, training: bool) -> torch.Tensor:
    """(h, nb-2, r) random key blocks of the middle query blocks: in training uniform without
    replacement among the blocks outside the row's window and the global ones; in eval block 0
    (transformers' eval mode, see the module docstring)."""
    rows = num_blocks - 2
    if not training or r == 0:
        return torch.zeros(heads, rows, r, dtype=torch.long, device=device)
    scores = torch.rand(heads, rows, num_blocks, device=device)
    c = torch.arange(1, num_blocks - 1, device=device)[:, None]
    b = torch.arange(num_blocks, device=device)[None, :]
    taken = ((b - c).abs() <= 1) | (b == 0) | (b == num_blocks - 1)  # window and global blocks
    return scores.masked_fill(taken, -1.0).topk(r, dim=-1).indices


class BigBirdAttention(SelfAttention):
    """Block-sparse self-attention: ``block`` tokens per block, ``random`` random blocks per query block."""

    def __init__(self, hidden_size: int, num_heads: int, dropout: float, block: int, random: int,
                 bias: bool = True) -> None:
        super().__init__(hidden_size, num_heads, dropout, bias)
        if block < 1 or random < 0:
            raise EmberError(f"BigBird needs a block size >= 1 and >= 0 random blocks; got {block} and {random}")
        self.block, self.random = block, random

    def forward(self, x: torch.Tensor, mask=None, need_weights: bool = False, **_) -> tuple[torch.Tensor, None]:
        refuse_unformed("bigbird", need_weights, mask, "BigBird's global tokens are its first and last blocks (ITC)")
        b, t, hs = x.shape
        heads, d, bs = self.num_heads, self.head_dim, self.block
        real = mask.real if mask is not None else torch.ones(b, t, dtype=torch.bool, device=x.device)
        q, k, v = dense(self.qkv, x).view(b, t, 3, heads, d).permute(2, 0, 3, 1, 4)  # 3 x (B, h, T, d)
        dropout = self.dropout_p if self.training else 0.0
        if t <= (5 + 2 * self.random) * bs:  # too short for block-sparse to pay: every pair (as transformers)
            padding = None if mask is None or mask.padding is None else mask.padding
            context = attend(q, k, v, padding, dropout)
        else:
            context = self._block_sparse(q, k, v, real, dropout)
        return dense(self.out, context.transpose(1, 2).reshape(b, t, hs)), None

    def _block_sparse(self, q, k, v, real, dropout: float) -> torch.Tensor:
        b, h, t, d = q.shape
        bs, r = self.block, self.random
        nb = -(-t // bs)
        pad = nb * bs - t
        q, k, v = (F.pad(y, (0, 0, 0, pad)) for y in (q, k, v))  # (B, h, nb*bs, d)
        real = F.pad(real, (0, pad))  # (B, nb*bs): padding keys are masked
        low = torch.finfo(q.dtype).min
        key_bias = torch.zeros(real.shape, dtype=q.dtype, device=q.device).masked_fill_(~real, low)
        # global rows (first and last block): every key
        ends = torch.cat([q[:, :, :bs], q[:, :, -bs:]], dim=2)  # (B, h, 2 bs, d)
        glob = attend(ends, k, v, key_bias[:, None, None, :], dropout)
        # middle rows: their 5 + r gathered key blocks each
        index, used = key_blocks(nb, draw_random_blocks(nb, h, r, q.device, self.training))  # (h, nb-2, 5+r)
        heads = torch.arange(h, device=q.device)[:, None, None]

        def gather(y: torch.Tensor) -> torch.Tensor:  # (B, h, nb*bs, d) -> (B*h, nb-2, (5+r) bs, d)
            blocks = y.view(b, h, nb, bs, d)[:, heads, index]  # (B, h, nb-2, 5+r, bs, d)
            return blocks.reshape(b * h, nb - 2, (5 + r) * bs, d)

        bias = key_bias.view(b, nb, bs)[:, index]  # (B, h, nb-2, 5+r, bs)
        bias = bias.masked_fill(~used[None, None, :, :, None], low)
        bias = bias.reshape(b * h, nb - 2, 1, (5 + r) * bs)
        middle = q[:, :, bs:-bs].reshape(b * h, nb - 2, bs, d)
        context = attend(middle, gather(k), gather(v), bias, dropout).view(b, h, (nb - 2) * bs, d)
        context = torch.cat([glob[:, :, :bs], context, glob[:, :, bs:]], dim=2)
        return context[:, :, :t]
