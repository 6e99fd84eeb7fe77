"""Held-out evaluation of long models: its batches never hold more tokens than a 512-token
model's batch of 32 did, so evaluating a 1,024- or 4,096-token model needs no more activation
memory than evaluating a short one (32 full-attention sequences of 4,096 tokens would hold
32 x 12 x 4,096^2 fp32 scores per layer: 25 GB)."""

from __future__ import annotations

import numpy as np
import torch

from ember.objectives.setup import HELD_OUT_TOKENS, held_out_batch_size, held_out_metrics


def test_held_out_batches_keep_32_short_sequences_and_at_most_32x512_tokens_of_long_ones():
    for length in (16, 128, 512):
        assert held_out_batch_size(length) == 32  # short models evaluate as they always did
    for length in (513, 1024, 2048, 4096, 16384, 40000):
        size = held_out_batch_size(length)
        assert 1 <= size < 32 and (size * length <= HELD_OUT_TOKENS or size == 1)
        assert (size + 1) * length > HELD_OUT_TOKENS  # the largest batch under the cap, not a smaller one


class CountingObjective(torch.nn.Module):
    """Records each held-out batch's sequences and lengths; its 'loss' sums the token ids."""

    def __init__(self):
        super().__init__()
        self.batches = []

    def make_batch(self, examples, rng):
        return {"input_ids": torch.as_tensor(np.stack(examples))}

    def forward(self, batch):
        ids = batch["input_ids"]
        self.batches.append(tuple(ids.shape))
        return None, {"loss": (float(ids.sum()), float(ids.numel()))}


class Examples:
    def __init__(self, n, length):
        self.rows = np.random.default_rng(0).integers(0, 1000, (n, length))

    def __len__(self):
        return len(self.rows)

    def example(self, index, epoch):
        return self.rows[index]


def test_held_out_metrics_of_1024_token_sequences_read_every_example_in_batches_of_16():
    data, module = Examples(40, 1024), CountingObjective()
    metrics = held_out_metrics(module, data, 40, held_out_batch_size(1024), seed=0, device="cpu")
    assert module.batches == [(16, 1024), (16, 1024), (8, 1024)]
    assert metrics["loss"] == data.rows.mean()  # every example once: the batching changes nothing else
