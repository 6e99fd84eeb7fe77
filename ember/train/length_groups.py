"""Length-grouped batches for fine-tuning: each batch holds examples of similar length, and no
two examples of one group (one paragraph's questions and windows) where the pool allows it.

A fine-tuning batch is padded to its longest row, so a random batch of SST-2 sentences (3 to
~60 tokens) computes mostly on padding. As ``transformers``' ``group_by_length`` does, each
epoch is still a fresh seeded shuffle, cut into pools of ``POOL_BATCHES`` batches; each pool is
sorted by length, so its batches are of near-equal rows, and the batches of the whole epoch
are then shuffled, so lengths do not come in a trend over the epoch. Which examples are seen
is unchanged (every example once per epoch); only their grouping into batches is.

Sorting by length also sorts by whatever shares a length. SQuAD's windows of one paragraph do:
every question on a long paragraph gets full-length windows (the window fills to max_length
whatever the question), so a sorted pool's full-length batches are drawn from the few long
paragraphs, and 32 windows came from ~24 paragraphs instead of the ~31 of a random batch (issue
46: short QA runs scored 7 F1 lower grouped). Examples may therefore name a ``group``
(``feature_groups``: QA features name their paragraph), and the default order (``SPREAD``) fills
each batch, in length order, with at most one example per group: an example whose group is
already in the batch waits for the next batch, which starts with it, so padding hardly grows
(an ascending sort: the one that waits is no longer than the next batch's rows). Only where the
next ``LOOKAHEAD`` batches' worth of the pool hold too few groups does a batch take repeats.

``GROUPED`` is the earlier order (pools sorted longest first, groups ignored), kept so a run
checkpointed with it resumes exactly. ``ember.train.loop.DataOrder`` applies these orders to its
seeded permutation of each epoch, so the order stays a pure function of (seed, epoch, lengths,
groups, batch), which exact resume rests on.
"""

from __future__ import annotations

from typing import Sequence

import numpy as np

POOL_BATCHES = 50  # transformers' LengthGroupedSampler sorts "megabatches" of 50 batches
LOOKAHEAD = 4  # batches' worth of a sorted pool a batch may look ahead to keep its groups apart
# the orders, as checkpoints name them: a plain shuffle, the first grouping (issue 46), the default
SHUFFLED, GROUPED, SPREAD = "shuffled", "length-grouped", "length-grouped-spread"


def wants_length_groups(setting: str, module) -> bool:
    """Whether ``train.group_by_length`` (``ember.config.length_grouping``'s auto / true / false)
    groups this module's batches. Only a loss of one term per example may be grouped
    (``loss_per_example``: a per-token loss averages over a batch's tokens, so grouping would
    reweight them); "auto" groups only a module that opts in (``group_by_length_default = True``),
    where grouped batches were measured as accurate as shuffled ones: task distillation (level over
    3 seeds, 1.55x). Fine-tuning heads do not: grouped batches cost SST-2 0.43-0.50 dev points from
    MiniLM and could not be shown to cost QA nothing (issue 46; BENCHMARKS.md, "Classification and
    distillation batch order", "QA's default becomes shuffled batches")."""
    if setting == "false" or not getattr(module, "loss_per_example", False):
        return False
    return setting == "true" or getattr(module, "group_by_length_default", False)


def group_by_length(perm: np.ndarray, lengths: np.ndarray, batch_size: int, rng: np.random.Generator) -> np.ndarray:
    """``GROUPED``: an epoch's shuffled dataset indices ``perm`` regrouped into batches of similar
    length, each pool sorted longest first (the order before groups were kept apart)."""
    pools = [chunk[np.argsort(-lengths[chunk], kind="stable")] for chunk in _pools(perm, batch_size)]
    return _shuffle_batches(np.concatenate(pools), batch_size, rng)


def spread_by_length(perm: np.ndarray, lengths: np.ndarray, batch_size: int, rng: np.random.Generator,
                     groups: np.ndarray | None = None) -> np.ndarray:
    """``SPREAD``: ``perm`` in batches of similar length with at most one example of each of
    ``groups`` per batch where the pool allows it (no groups: every example its own)."""
    pools = []
    for chunk in _pools(perm, batch_size):
        ordered = chunk[np.argsort(lengths[chunk], kind="stable")]  # shortest first; ties keep the shuffle
        pools.append(ordered if groups is None else _keep_groups_apart(ordered, groups, batch_size))
    return _shuffle_batches(np.concatenate(pools), batch_size, rng)


def _pools(perm: np.ndarray, batch_size: int) -> list[np.ndarray]:
    pool = POOL_BATCHES * batch_size
    return np.split(perm, range(pool, len(perm), pool))


def _keep_groups_apart(ordered: np.ndarray, groups: np.ndarray, batch_size: int) -> np.ndarray:
    """A length-sorted pool cut into batches in order, each taking the next examples whose group
    it does not hold yet; the ones passed over open the next batch."""
    pending, out = list(ordered), []
    while pending:
        taken, skipped, seen = [], [], set()
        for j in range(min(len(pending), LOOKAHEAD * batch_size)):
            if len(taken) == batch_size:
                break
            g = groups[pending[j]]
            (skipped if g in seen else taken).append(j)
            seen.add(g)
        if len(taken) < batch_size:  # too few groups within reach: the nearest repeats fill the batch
            taken += skipped[: batch_size - len(taken)]
        chosen = set(taken)
        out += [pending[j] for j in sorted(taken)]
        pending = [p for j, p in enumerate(pending) if j not in chosen]
    return np.asarray(out, dtype=ordered.dtype)


def _shuffle_batches(order: np.ndarray, batch_size: int, rng: np.random.Generator) -> np.ndarray:
    size = len(order)
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


def feature_groups(features: Sequence) -> list[int] | None:
    """The ``group`` each feature names (examples that share a text: one paragraph's questions and
    windows), numbered 0.. in order of appearance, or None when no feature names one."""
    if not any(isinstance(f, dict) and "group" in f for f in features):
        return None
    numbers: dict = {}
    # a feature without a group is a group of its own (a key no named group can equal)
    return [numbers.setdefault(f.get("group", ("own", i)) if isinstance(f, dict) else ("own", i), len(numbers))
            for i, f in enumerate(features)]
