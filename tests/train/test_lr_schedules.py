"""Learning-rate schedules (ember.train.optim.lr_factor) against their definitions: BERT's linear
warm-up + linear decay and the constant schedule against transformers' own schedule functions
(built locally, nothing downloaded), ULMFiT's STLR and the time schedule at their boundaries."""

from __future__ import annotations

import pytest
import torch
from transformers import get_constant_schedule_with_warmup, get_linear_schedule_with_warmup

from ember.config import TrainConfig
from ember.errors import EmberError
from ember.train.optim import lr_factor, stlr_factor, time_lr_factor, warmup_steps


def _hf_factors(make, steps: int, **kwargs) -> list[float]:
    optimizer = torch.optim.SGD([torch.nn.Parameter(torch.zeros(1))], lr=1.0)
    schedule = make(optimizer, **kwargs)
    return [schedule.lr_lambdas[0](step) for step in range(steps)]


@pytest.mark.parametrize("warm,total", [(10, 100), (1, 7), (3, 4)])
def test_linear_schedule_bert_warmup_then_decay_matches_transformers(warm, total):
    # ember's factor is for the update that *ends* step t, HF's lambda for the one that starts
    # at t: the same ramp one step ahead during warm-up (ember's first update is not lr 0),
    # the same decay afterwards, reaching 0 at max_steps.
    cfg = TrainConfig(schedule="linear", warmup_steps=warm, max_steps=total)
    hf = _hf_factors(get_linear_schedule_with_warmup, total + 3, num_warmup_steps=warm,
                     num_training_steps=total)
    for step in range(total + 2):
        expected = hf[step + 1] if step < warm else hf[step]
        assert lr_factor(step, cfg) == pytest.approx(expected, abs=1e-12), step
    assert lr_factor(warm - 1, cfg) == 1.0 and lr_factor(total, cfg) == 0.0


def test_constant_schedule_warms_up_then_holds_the_peak_as_transformers():
    cfg = TrainConfig(schedule="constant", warmup_steps=4, max_steps=50)
    hf = _hf_factors(get_constant_schedule_with_warmup, 60, num_warmup_steps=4)
    assert [lr_factor(s, cfg) for s in range(55)] == pytest.approx([hf[s + 1] if s < 4 else hf[s] for s in range(55)])


def test_warmup_ratio_is_a_fraction_of_max_steps_unless_warmup_steps_is_given():
    assert warmup_steps(TrainConfig(warmup_steps=0, warmup_ratio=0.06, max_steps=1000)) == 60
    assert warmup_steps(TrainConfig(warmup_steps=0, warmup_ratio=0.1, max_steps=25)) == 2  # round(2.5), to even
    assert warmup_steps(TrainConfig(warmup_steps=7, warmup_ratio=0.5, max_steps=1000)) == 7
    # no warm-up at all: the first update already has the peak rate
    assert lr_factor(0, TrainConfig(warmup_steps=0, warmup_ratio=0.0, max_steps=10)) == 1.0


def test_unknown_schedule_is_a_clear_error():
    with pytest.raises(EmberError, match="train.schedule='cosine'; choose one of"):
        lr_factor(5, TrainConfig(schedule="cosine", warmup_steps=1, max_steps=10))


def test_inverse_sqrt_without_warmup_steps_is_one_over_sqrt_step():
    # T5 (Raffel et al. 2020, §3.1.2) with k = 1: 1/sqrt(max(step, 1)), never a division by 0
    cfg = TrainConfig(schedule="inverse_sqrt", warmup_steps=0, warmup_ratio=0.0, max_steps=100)
    assert [lr_factor(s, cfg) for s in (0, 1, 4, 100)] == pytest.approx([1.0, 1.0, 0.5, 0.1])


def test_stlr_short_run_still_reaches_its_peak_and_bounds_are_checked():
    # ULMFiT eq. 3: cut = floor(T * cut_frac) would be 0 for T = 5; one step of rise keeps a peak
    factors = [stlr_factor(t, 5) for t in range(5)]
    assert factors[0] == pytest.approx(1 / 32) and max(factors) == 1.0 and factors[1] == 1.0
    # the decay ends at eta_max / ratio at t = T, never below it
    assert stlr_factor(100, 100) == pytest.approx(1 / 32) and stlr_factor(500, 100) == pytest.approx(1 / 32)
    assert stlr_factor(7, 10, ratio=1.0) == 1.0  # ratio 1: a constant rate, allowed
    for bad in ({"cut_frac": 0.0}, {"cut_frac": 1.0}, {"ratio": 0.5}):
        with pytest.raises(EmberError, match="STLR needs 0 < cut_frac < 1 and ratio >= 1"):
            stlr_factor(0, 10, **bad)


def test_time_schedule_boundaries():
    # no warm-up: the peak at the start; before the start (a clock read early) no negative rate
    assert time_lr_factor(0.0, 100.0, 0.0) == 1.0
    assert time_lr_factor(-5.0, 100.0, 0.5) == 0.0
    assert time_lr_factor(50.0, 100.0, 0.5) == pytest.approx(1.0)  # the triangle's top
    assert time_lr_factor(99.0, 100.0, 1.0) == pytest.approx(0.99)  # all warm-up: never decays
    assert time_lr_factor(0.25, 0.5, 0.5) == pytest.approx(1.0)  # a budget under a second is a budget
    for budget in (0.0, -1.0):
        with pytest.raises(EmberError, match="needs a wall-clock budget"):
            time_lr_factor(1.0, budget, 0.1)
