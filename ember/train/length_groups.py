"""Length-grouped batches for fine-tuning: each batch holds examples of similar length.

A fine-tuning batch is padded to its longest row, so a random batch of SST-2 sentences (3 to
~60 tokens) computes mostly on padding. As ``transformers``' ``group_by_length`` does, each
epoch is still a fresh seeded shuffle, cut into pools of ``POOL_BATCHES`` batches; each pool is
sorted by length, so its batches are of near-equal rows, and the batches of the whole epoch
are then shuffled, so lengths do not come in a trend over the epoch. Which examples are seen
is unchanged (every example once per epoch); only their grouping into batches is.

Like ``ember.train.loop.DataOrder`` it maps a global example position to (dataset index,
epoch), a pure function of (seed, epoch, lengths, batch), which exact resume rests on.
"""

from __future__ import annotations

from typing import Sequence

import numpy as np

from ember.errors import EmberError

POOL_BATCHES = 50  # transformers' LengthGroupedSampler sorts "megabatches" of 50 batches


class LengthGroupedOrder:
    name = "length-grouped"

    def __init__(self, lengths: Sequence[int], seed: int, batch_size: int) -> None:
        if len(lengths) == 0:
            raise EmberError("the training data has no examples")
        self.lengths = np.asarray(lengths, dtype=np.int64)
        self.size, self.seed, self.batch_size = len(self.lengths), seed, batch_size
        self._epoch, self._order = -1, None

    def epoch_order(self, epoch: int) -> np.ndarray:
        """The dataset indices of one epoch, in training order."""
        rng = np.random.default_rng([self.seed, epoch, 7919])
        perm = rng.permutation(self.size)
        pool = POOL_BATCHES * self.batch_size
        # longest first within a pool (stable: ties keep the shuffle's order)
        pools = [chunk[np.argsort(-self.lengths[chunk], kind="stable")]
                 for chunk in np.split(perm, range(pool, self.size, pool))]
        order = np.concatenate(pools)
        whole = self.size // self.batch_size * self.batch_size
        batches = order[:whole].reshape(-1, self.batch_size)[rng.permutation(self.size // self.batch_size)]
        # a last partial batch stays last (the stream goes on into the next epoch's first batch)
        return np.concatenate([batches.reshape(-1), order[whole:]])

    def __call__(self, position: int) -> tuple[int, int]:
        epoch, offset = divmod(position, self.size)
        if epoch != self._epoch:
            self._order, self._epoch = self.epoch_order(epoch), epoch
        return int(self._order[offset]), epoch


def feature_lengths(features: Sequence) -> list[int] | None:
    """Tokens per example of a fine-tuning feature list (dicts with ``input_ids``, plus the
    target's ``labels`` ids of a text-to-text example), or None when the features do not say."""
    lengths = []
    for f in features:
        ids = f.get("input_ids") if isinstance(f, dict) else None
        if ids is None:
            return None
        labels = f.get("labels")
        lengths.append(len(ids) + (len(labels) if isinstance(labels, (list, tuple, np.ndarray)) else 0))
    return lengths
