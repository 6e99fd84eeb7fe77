"""Reformer's LSH attention (Kitaev et al. 2020, "Reformer: The Efficient Transformer", §2), an
attention variant of the encoder (``model.attention=reformer``).

- Shared QK (§2 "Shared-QK Transformer"): one projection gives the queries, and the keys are the
  queries normalised to unit length (k_j = q_j / |q_j|; computed as transformers does, q times
  rsqrt(mean(q^2) + 1e-6) / sqrt(d)), so a query and its key fall in the same bucket.
- Hashing (§2 "LSH attention", after Andoni et al. 2015): h(x) = argmax([xR; -xR]) for a random
  rotation R (d, buckets/2), one per hash round and head; ``buckets`` must be even.
- Each round sorts the positions by (bucket, position), cuts the sorted sequence into chunks of
  ``chunk`` and lets every query read its own chunk and the one before it (the chunk before the
  first is the last, as in the paper's code and transformers). The rounds are laid end to end,
  so a round's first chunk reads the previous round's last chunk.
- A token does not attend to itself (its logit replaced by -1e5, the paper's "except when it has
  no other valid attention target": then it alone is left), padding keys are replaced by -1e9.
- The rounds are combined by their softmax normalisers (§2 "Multi-round LSH attention"): each
  round's output weighted by exp(lse_r - logsumexp_r lse_r), which is softmax attention over the
  union of the keys the rounds found (up to keys found more than once).

Padding. A length that is not a multiple of ``chunk`` is padded internally (the padding is a
masked key in a bucket of its own after every real bucket, as transformers' padding bucket) and
the output cut back; inputs of at most ``chunk`` tokens attend to every token (same shared-QK
logits and masks), as transformers does.

Rotations are drawn anew at every training call (from torch's default generator, so
``torch.manual_seed`` reproduces them and a reversible layer's backward redraws the same ones)
and fixed in eval mode, from the layer's ``seed`` through a generator of its own: the same numbers
as transformers' ``ReformerConfig(hash_seed=seed)`` (``torch.manual_seed(seed)`` then ``randn``).

Memory O(rounds * T * 2 chunk) per head: the (chunk, 2 chunk) logits of each chunk.
"""

from __future__ import annotations

import torch
from torch import nn

from ember.errors import EmberError
from ember.nn.attention import refuse_unformed
from ember.nn.dropout import dropout as drop
from ember.nn.onednn import dense


def _mask_values(dtype: torch.dtype) -> tuple[float, float]:
    """(padding, self) logits: transformers' values, within fp16's range for fp16."""
    return (-1e4, -1e3) if dtype == torch.float16 else (-1e9, -1e5)


def shared_keys(q: torch.Tensor) -> torch.Tensor:
    """The keys of shared-QK attention: q / |q| (through RMS, as transformers: eps 1e-6)."""
    return q * torch.rsqrt(q.pow(2).mean(-1, keepdim=True) + 1e-6) / q.shape[-1] ** 0.5


def hash_buckets(q: torch.Tensor, rotations: torch.Tensor) -> torch.Tensor:
    """long (B, h, rounds, T) buckets of (B, h, T, d) vectors under (h, d, rounds, buckets/2)
    rotations: argmax over [xR; -xR]."""
    rotated = torch.einsum("bhtd,hdrk->bhrtk", q.detach(), rotations.to(q.dtype))
    return torch.cat([rotated, -rotated], dim=-1).argmax(-1)


def chunk_attend(q, k, v, q_pos, k_pos, key_ok, dropout: float) -> tuple[torch.Tensor, torch.Tensor]:
    """(context (..., c, d), logsumexp (..., c)) of queries (..., c, d) over keys/values (..., n, d)
    with positions q_pos (..., c) and k_pos (..., n): padding keys (key_ok False) and a query's own
    position are replaced by large negative logits (see the module docstring)."""
    pad_value, self_value = _mask_values(q.dtype)
    dots = q @ k.transpose(-1, -2)
    dots = dots.masked_fill(~key_ok[..., None, :], pad_value)
    dots = dots.masked_fill(q_pos[..., :, None] == k_pos[..., None, :], self_value)
    probs = dots.softmax(-1)  # one fused pass
    # log-sum-exp from the softmax: at the row's largest logit m, p = exp(m - lse), so lse = m - log p
    # (exact, and its gradient is the softmax, as logsumexp's; ~3x cheaper on CPU than logsumexp)
    lse = dots.amax(-1) - probs.amax(-1).log()
    return drop(probs, dropout, dropout > 0) @ v, lse


def lsh_attention(
    q: torch.Tensor,  # (B, h, T, d): the shared query/key projection
    v: torch.Tensor,  # (B, h, T, d)
    rotations: torch.Tensor,  # (h, d, rounds, buckets / 2)
    chunk: int,
    real: torch.Tensor | None = None,  # bool (B, T): real tokens; None = no padding
    dropout: float = 0.0,  # the rate in effect (0 in eval mode)
) -> torch.Tensor:
    """The context (B, h, T, d) of multi-round LSH attention (see the module docstring)."""
    b, h, t, d = q.shape
    device = q.device
    k = shared_keys(q)
    if t <= chunk:  # short input: every token, with the same logits and masks
        pos = torch.arange(t, device=device).expand(b, h, t)
        ok = (torch.ones(b, t, dtype=torch.bool, device=device) if real is None else real)[:, None].expand(b, h, t)
        return chunk_attend(q, k, v, pos, pos, ok, dropout)[0]
    pad = -t % chunk
    if pad:  # internal padding to whole chunks: masked keys, in a bucket after every real one
        q, k, v = (torch.nn.functional.pad(y, (0, 0, 0, pad)) for y in (q, k, v))
        real = torch.ones(b, t, dtype=torch.bool, device=device) if real is None else real
        real = torch.nn.functional.pad(real, (0, pad), value=False)
    n = t + pad
    rounds, half = rotations.shape[2], rotations.shape[3]
    buckets = hash_buckets(q, rotations)  # (B, h, rounds, n)
    if real is not None:
        buckets = buckets.masked_fill(~real[:, None, None, :], 2 * half)
    order = torch.argsort(buckets * n + torch.arange(n, device=device), dim=-1)  # (bucket, position), per round
    sorted_pos = order.reshape(b, h, rounds * n)  # positions, the rounds end to end
    flat = (order + torch.arange(rounds, device=device)[:, None] * n).reshape(b, h, rounds * n)
    undo = torch.empty_like(flat).scatter_(-1, flat, torch.arange(rounds * n, device=device).expand_as(flat))

    rows = torch.arange(b * h, device=device).view(b, h, 1)

    def take(y: torch.Tensor, index: torch.Tensor, length: int) -> torch.Tensor:
        """y (B, h, length, d) at positions index (B, h, L) -> (B, h, L, d): whole rows through
        index_select (much faster than gather with an expanded index on CPU)."""
        picked = y.reshape(b * h * length, d).index_select(0, (index + rows * length).flatten())
        return picked.view(b, h, -1, d)

    def sort(y: torch.Tensor) -> torch.Tensor:  # (B, h, n, d) -> (B, h, chunks, chunk, d), sorted
        return take(y, sorted_pos, n).view(b, h, -1, chunk, d)

    def with_previous(y: torch.Tensor) -> torch.Tensor:  # (B, h, C, c, ...) -> (B, h, C, 2c, ...)
        return torch.cat([y.roll(1, dims=2), y], dim=3)

    pos = sorted_pos.view(b, h, -1, chunk)
    ok = (torch.ones(b, n, dtype=torch.bool, device=device) if real is None else real)
    ok = ok[:, None].expand(b, h, n).gather(2, sorted_pos).view(b, h, -1, chunk)
    context, lse = chunk_attend(sort(q), with_previous(sort(k)), with_previous(sort(v)), pos, with_previous(pos),
                                with_previous(ok), dropout)  # (B, h, C, c, d), (B, h, C, c)
    context = take(context.reshape(b, h, rounds * n, d), undo, rounds * n)
    lse = lse.reshape(b, h, rounds * n).gather(2, undo)
    weights = torch.softmax(lse.view(b, h, rounds, n), dim=2)  # §2: each round by its share of the mass
    context = (context.view(b, h, rounds, n, d) * weights[..., None]).sum(2)
    return context[:, :, :t]


def check_buckets(buckets: int) -> None:
    if buckets < 0 or buckets % 2:
        raise EmberError(f"Reformer's LSH needs an even number of buckets (argmax over [xR; -xR] gives two per "
                         f"rotation column), or 0 to pick 2 T / chunk; got {buckets}")


def auto_buckets(length: int, chunk: int) -> int:
    """The paper's and transformers' choice when none is given: about 2 T / chunk buckets (a power
    of two, at least 2), so a bucket is about half a chunk."""
    return max(2, 1 << (max(1, 2 * (-(-length // chunk)))).bit_length() - 1)


class LSHAttention(nn.Module):
    """Shared-QK LSH self-attention: ``query_key``, ``value`` and ``out`` projections (transformers'
    LSHSelfAttention + ReformerSelfOutput names), ``buckets`` (even; 0 = about 2 T / chunk),
    ``rounds`` hash rounds, chunks of ``chunk`` tokens, ``seed`` for the eval-mode rotations."""

    def __init__(self, hidden_size: int, num_heads: int, dropout: float, buckets: int = 0, rounds: int = 2,
                 chunk: int = 64, seed: int = 0, bias: bool = True) -> None:
        super().__init__()
        check_buckets(buckets)
        if rounds < 1 or chunk < 1:
            raise EmberError(f"Reformer needs at least one hash round and a chunk of at least one token; "
                             f"got {rounds} rounds, chunk {chunk}")
        self.num_heads, self.head_dim = num_heads, hidden_size // num_heads
        self.query_key = nn.Linear(hidden_size, hidden_size, bias=bias)
        self.value = nn.Linear(hidden_size, hidden_size, bias=bias)
        self.out = nn.Linear(hidden_size, hidden_size, bias=bias)
        self.dropout_p, self.buckets, self.rounds, self.chunk, self.seed = dropout, buckets, rounds, chunk, seed

    def rotations(self, length: int, device, dtype) -> torch.Tensor:
        """(h, d, rounds, buckets/2): a fresh draw in training, the layer's fixed one in eval mode."""
        buckets = self.buckets or auto_buckets(length, self.chunk)
        shape = (self.num_heads, self.head_dim, self.rounds, buckets // 2)
        if self.training:
            return torch.randn(shape, device=device, dtype=dtype)
        return torch.randn(shape, generator=torch.Generator().manual_seed(self.seed), dtype=dtype).to(device)

    def forward(self, x: torch.Tensor, mask=None, need_weights: bool = False, **_) -> tuple[torch.Tensor, None]:
        refuse_unformed("reformer", need_weights, mask, "Reformer's tokens find each other by hashing")
        b, t, hs = x.shape

        def heads(y: torch.Tensor) -> torch.Tensor:
            return y.view(b, t, self.num_heads, self.head_dim).transpose(1, 2)

        q, v = heads(dense(self.query_key, x)), heads(dense(self.value, x))
        real = None if mask is None or mask.padding is None else mask.real
        dropout = self.dropout_p if self.training else 0.0
        context = lsh_attention(q, v, self.rotations(t, x.device, q.dtype), self.chunk, real, dropout)
        return dense(self.out, context.transpose(1, 2).reshape(b, t, hs)), None
