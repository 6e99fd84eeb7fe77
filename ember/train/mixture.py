"""A task mixture as the Trainer's data: which task each step trains, and that task's examples.

Multi-task training (``ember.train.multitask``) feeds the one training loop (``ember.train.loop``)
from several tasks' training sets. One optimizer step is one task (MT-DNN, Liu et al. 2019,
Algorithm 1: "pack the datasets into mini-batches, each from one task"), drawn at the mixing
rates of T5 (Raffel et al. 2020, §3.5.2):

* examples-proportional with an artificial size limit K: r_m = min(e_m, K) / sum_n min(e_n, K),
  so a huge task does not crowd out the small ones;
* temperature-scaled: each proportional rate raised to 1/T and renormalised (T = 1 is
  proportional, T -> infinity equal mixing; T5 tried T = 2, 4, 8);
* equal: r_m = 1/M.

Determinism, which exact resume rests on (the Trainer's contract, ``ember.train.loop``): the task
of step s is a pure function of (seed, s) (blocks of steps drawn from generators keyed by the seed
and the block), and the b-th batch of task t takes positions b*G .. b*G+G-1 of that task's own
endless stream (a ``DataOrder`` per task: one seeded permutation per pass over its data, batches
grouped by length where the Trainer groups). So the Trainer's global position p = s*G + o maps to
(task of s, the number of earlier steps of that task, o), whatever the micro-batch layout.
"""

from __future__ import annotations

import math

import numpy as np

from ember.errors import EmberError
from ember.train.length_groups import SPREAD

MIXINGS = ("proportional", "temperature", "equal")
BLOCK = 4096  # steps drawn per generator: the schedule of step s needs blocks 0 .. s // BLOCK


def mixing_rates(sizes: dict[str, int], mixing: str, limit: int, temperature: float) -> dict[str, float]:
    """The sampling rate of each task (T5 §3.5.2; the module docstring); refuses rates that leave a
    task out (a size limit K of 0, an empty training set) with one line naming it."""
    if mixing not in MIXINGS:
        raise EmberError(f"task.mixing={mixing!r}: choose one of {', '.join(MIXINGS)}")
    if mixing == "equal":
        rates = {name: 1.0 for name in sizes}
    else:
        if limit < 1:
            raise EmberError(f"task.mixing_limit={limit} caps every task's size at {limit} examples, so "
                             f"{mixing} mixing would never sample {', '.join(sizes)}; K must be >= 1 "
                             "(T5 §3.5.2 tried 2^16 .. 2^21)")
        if mixing == "temperature" and not (temperature >= 1.0 and math.isfinite(temperature)):
            raise EmberError(f"task.mixing_temperature={temperature}: T must be a finite number >= 1 "
                             "(1 = proportional; T5 §3.5.2 tried 2, 4, 8; task.mixing=equal is the limit)")
        t = temperature if mixing == "temperature" else 1.0
        capped = {name: min(size, limit) for name, size in sizes.items()}
        total = sum(capped.values())
        rates = {name: (c / total) ** (1.0 / t) if total else 0.0 for name, c in capped.items()}
    empty = [name for name, size in sizes.items() if size == 0 or rates[name] <= 0.0]
    if empty:
        raise EmberError(f"task {empty[0]} has no training examples, so the mixture would never sample it; "
                         "give it training data or leave it out of --tasks")
    total = sum(rates.values())
    return {name: r / total for name, r in rates.items()}


class MixtureSchedule:
    """The task of every step, and how many steps of the same task came before it (module docstring)."""

    def __init__(self, rates: list[float], seed: int) -> None:
        self.rates = np.asarray(rates, dtype=np.float64)
        self.seed = seed
        self._tasks = np.zeros(0, dtype=np.int64)  # task of steps 0 .. len-1
        self._before = np.zeros(0, dtype=np.int64)  # steps of the same task before each step
        self._counts = np.zeros(len(rates), dtype=np.int64)  # steps of each task in the drawn blocks

    def _extend(self, steps: int) -> None:
        while len(self._tasks) < steps:
            block = len(self._tasks) // BLOCK
            rng = np.random.default_rng([self.seed, block, 15485863])
            tasks = rng.choice(len(self.rates), size=BLOCK, p=self.rates)
            onehot = np.eye(len(self.rates), dtype=np.int64)[tasks]  # (BLOCK, M)
            before = (np.cumsum(onehot, axis=0) - onehot + self._counts)[np.arange(BLOCK), tasks]
            self._counts += onehot.sum(axis=0)
            self._tasks = np.concatenate([self._tasks, tasks])
            self._before = np.concatenate([self._before, before])

    def task(self, step: int) -> tuple[int, int]:
        """(task index of ``step``, steps of that task before it)."""
        self._extend(step + 1)
        return int(self._tasks[step]), int(self._before[step])

    def counts(self, steps: int) -> np.ndarray:
        """Steps of each task among steps 0 .. steps-1 (the realised mixture)."""
        self._extend(steps)
        return np.bincount(self._tasks[:steps], minlength=len(self.rates))


class MixtureOrder:
    """The Trainer's data order over a ``TaskMixture``: global position -> (index, the task's epoch)."""

    def __init__(self, mixture: "TaskMixture", seed: int, grouped: bool, batch_size: int, kind: str = SPREAD) -> None:
        from ember.train.loop import DataOrder

        self.batch_size, self.offsets = batch_size, mixture.offsets
        self.schedule = MixtureSchedule(mixture.rates, seed)
        # each task its own stream, seeded apart so two tasks of one size do not share an order
        self.orders = [DataOrder(len(feats), seed * 1009 + t, mixture.task_lengths[t] if grouped else None, batch_size,
                                 mixture.task_groups[t], kind) for t, feats in enumerate(mixture.features)]
        self.name = self.orders[0].name

    def __call__(self, position: int) -> tuple[int, int]:
        step, offset = divmod(position, self.batch_size)
        task, before = self.schedule.task(step)
        index, epoch = self.orders[task](before * self.batch_size + offset)
        return self.offsets[task] + index, epoch


class TaskMixture:
    """Several tasks' features as one dataset (``len``, ``example``, ``lengths``) whose order (the
    Trainer asks ``data_order``) gives every step one task's examples, as ``(task index, feature)``."""

    def __init__(self, features: list[list[dict]], rates: list[float], lengths: list[list[int]],
                 groups: list[list[int] | None] | None = None) -> None:
        """``groups``: per task, which examples share a text (``ember.train.length_groups``), or None."""
        self.features, self.rates, self.task_lengths = features, rates, lengths
        self.task_groups = groups or [None] * len(features)
        self.offsets = [0]
        for feats in features[:-1]:
            self.offsets.append(self.offsets[-1] + len(feats))
        self._where = np.concatenate([np.full(len(f), t) for t, f in enumerate(features)])

    def __len__(self) -> int:
        return int(sum(len(f) for f in self.features))

    def lengths(self) -> list[int]:
        return [n for task in self.task_lengths for n in task]

    def example(self, index: int, epoch: int):
        task = int(self._where[index])
        return task, self.features[task][index - self.offsets[task]]

    def data_order(self, seed: int, grouped: bool, batch_size: int, kind: str = SPREAD) -> MixtureOrder:
        return MixtureOrder(self, seed, grouped, batch_size, kind)
