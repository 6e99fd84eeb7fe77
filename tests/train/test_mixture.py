"""The task mixture of multi-task training (ember.train.mixture): T5's mixing rates (§3.5.2), the
realised share of each task against the rate asked for, one task per batch, and a schedule that is
a function of (seed, step) alone (what exact resume rests on)."""

from __future__ import annotations

import numpy as np
import pytest

from ember.errors import EmberError
from ember.train.mixture import MixtureSchedule, TaskMixture, mixing_rates

SIZES = {"mnli": 1000, "rte": 100, "stsb": 10}


def test_multitask_mixing_rates_follow_t5_formulas():
    # examples-proportional with an artificial limit K = 200: r_m = min(e_m, K) / sum_n min(e_n, K)
    capped = np.array([200, 100, 10]) / 310
    assert list(mixing_rates(SIZES, "proportional", 200, 1.0).values()) == pytest.approx(capped)
    assert list(mixing_rates(SIZES, "proportional", 2 ** 21, 1.0).values()) == pytest.approx(
        np.array([1000, 100, 10]) / 1110)
    # temperature T: each rate ^ (1/T), renormalised; T = 1 is proportional
    for t in (1.0, 2.0, 8.0):
        scaled = capped ** (1 / t) / (capped ** (1 / t)).sum()
        assert list(mixing_rates(SIZES, "temperature", 200, t).values()) == pytest.approx(scaled)
    t8 = list(mixing_rates(SIZES, "temperature", 200, 8.0).values())
    assert max(t8) - min(t8) < max(capped) - min(capped)  # a higher temperature is closer to equal
    assert list(mixing_rates(SIZES, "equal", 0, 1.0).values()) == pytest.approx([1 / 3] * 3)


@pytest.mark.parametrize("mixing,limit,temperature", [("proportional", 200, 1.0), ("temperature", 2 ** 21, 2.0),
                                                      ("temperature", 200, 8.0), ("equal", 1, 1.0)])
@pytest.mark.parametrize("seed", [0, 7])
def test_multitask_mixing_shares_match_the_rates(mixing, limit, temperature, seed):
    rates = mixing_rates(SIZES, mixing, limit, temperature)
    steps = 20_000
    counts = MixtureSchedule(list(rates.values()), seed).counts(steps)
    assert counts.sum() == steps
    for count, rate in zip(counts, rates.values()):
        # each step draws its task independently: the count is Binomial(steps, rate); 4.5 standard
        # deviations leave a false failure about once in 150,000 checks
        assert abs(count - steps * rate) <= 4.5 * np.sqrt(steps * rate * (1 - rate)), (mixing, counts, rates)


def test_mixture_schedule_is_a_function_of_seed_and_step():
    rates = [0.5, 0.3, 0.2]
    walked = MixtureSchedule(rates, 3)
    steps = [walked.task(s) for s in range(9000)]  # across blocks, in training order
    jumped = MixtureSchedule(rates, 3)  # a resumed run asks for a late step first
    assert jumped.task(8999) == steps[8999] and [jumped.task(s) for s in range(9000)] == steps
    tasks = np.array([t for t, _ in steps])
    for t in range(3):  # "steps of this task before it" counts them
        assert [b for task, b in steps if task == t] == list(range(int((tasks == t).sum())))
    assert [MixtureSchedule(rates, 4).task(s)[0] for s in range(200)] != list(tasks[:200])


def test_mixture_order_gives_each_batch_one_task_and_each_task_its_epochs():
    features = [[{"id": (t, i)} for i in range(n)] for t, n in enumerate((10, 7, 3))]
    lengths = [[1 + i % 4 for i in range(len(f))] for f in features]
    mixture = TaskMixture(features, [0.5, 0.3, 0.2], lengths)
    batch = 4
    for grouped in (False, True):
        order = mixture.data_order(seed=1, grouped=grouped, batch_size=batch)
        seen: dict[int, list] = {0: [], 1: [], 2: []}
        for step in range(60):
            examples = [mixture.example(*order(step * batch + k)) for k in range(batch)]
            tasks = {t for t, _ in examples}
            assert len(tasks) == 1  # one batch, one task (MT-DNN)
            task = tasks.pop()
            assert task == order.schedule.task(step)[0]
            seen[task] += [f["id"][1] for _, f in examples]
        for task, ids in seen.items():
            n = len(features[task])
            full = len(ids) // n
            assert full >= 2
            for epoch in range(full):  # every pass over a task's data visits each example once
                assert sorted(ids[epoch * n:(epoch + 1) * n]) == list(range(n))


@pytest.mark.parametrize("sizes,mixing,limit,temperature,message", [
    (SIZES, "proportional", 0, 1.0, "mixing_limit=0"),
    (SIZES, "temperature", 200, 0.5, "mixing_temperature=0.5"),
    ({"rte": 100, "stsb": 0}, "equal", 200, 1.0, "task stsb has no training examples"),
    (SIZES, "uniform", 200, 1.0, "task.mixing='uniform'"),
])
def test_multitask_mixing_that_leaves_a_task_out_is_refused(sizes, mixing, limit, temperature, message):
    with pytest.raises(EmberError, match=message.replace("(", r"\(").replace(".", r"\.")):
        mixing_rates(sizes, mixing, limit, temperature)
