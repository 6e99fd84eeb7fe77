"""Length-grouped batches for fine-tuning: each batch holds examples of similar length.

A fine-tuning batch is padded to its longest row, so a random batch of SST-2 sentences (3 to
~60 tokens) computes mostly on padding. As ``transformers``' ``group_by_length`` does, each
epoch is still a fresh seeded shuffle, cut into pools of ``POOL_BATCHES`` batches; each pool is
sorted by length, so its batches are of near-equal rows, and the batches of the whole epoch
are then shuffled, so lengths do not come in a trend over the epoch. Which examples are seen
is unchanged (every example once per epoch); only their grouping into batches is.

``ember.train.loop.DataOrder`` applies it to its seeded permutation of each epoch when given the
examples' lengths, so the order stays a pure function of (seed, epoch, lengths, batch), which
exact resume rests on.
"""

from __future__ import annotations

from typing import Sequence

import numpy as np

POOL_BATCHES = 50  # transformers' LengthGroupedSampler sorts "megabatches" of 50 batches
SHUFFLED, GROUPED = "shuffled", "length-grouped"  # the two orders, as checkpoints name them


def group_by_length(perm: np.ndarray, lengths: np.ndarray, batch_size: int, rng: np.random.Generator) -> np.ndarray:
    """An epoch's shuffled dataset indices ``perm`` regrouped into batches of similar length."""
    size = len(perm)
    pool = POOL_BATCHES * batch_size
    # longest first within a pool (stable: ties keep the shuffle's order)
    pools = [chunk[np.argsort(-lengths[chunk], kind="stable")] for chunk in np.split(perm, range(pool, size, pool))]
    order = np.concatenate(pools)
    whole = size // batch_size * batch_size
    batches = order[:whole].reshape(-1, batch_size)[rng.permutation(size // batch_size)]
    # a last partial batch stays last (the stream goes on into the next epoch's first batch)
    return np.concatenate([batches.reshape(-1), order[whole:]])


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
