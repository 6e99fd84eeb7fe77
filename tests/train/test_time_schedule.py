"""train.schedule=time: warm-up/decay laid over the wall-clock budget (cramming-style).

The schedule must be a pure function of the elapsed training seconds, so a resumed run
(which restores the elapsed seconds from its checkpoint) continues it where it stopped.
A fake clock makes elapsed time deterministic here.
"""

from __future__ import annotations

import dataclasses
from types import SimpleNamespace

import pytest
import torch
from torch import nn

from ember.config import TrainConfig
from ember.errors import EmberError
from ember.train import clock, loop
from ember.train.logging import MetricsLogger
from ember.train.optim import lr_factor, time_lr_factor


def test_time_schedule_warms_up_then_decays_to_zero_at_the_budget():
    budget, warm = 100.0, 0.2
    assert time_lr_factor(0.0, budget, warm) == 0.0
    assert time_lr_factor(10.0, budget, warm) == pytest.approx(0.5)
    assert time_lr_factor(20.0, budget, warm) == pytest.approx(1.0)
    assert time_lr_factor(60.0, budget, warm) == pytest.approx(0.5)
    assert time_lr_factor(100.0, budget, warm) == 0.0
    assert time_lr_factor(250.0, budget, warm) == 0.0  # past the budget: never negative
    # a pure function of elapsed time: the step number does not enter
    cfg = TrainConfig(schedule="time", max_time=budget, warmup_ratio=warm, max_steps=7)
    assert {lr_factor(step, cfg, 30.0) for step in (0, 5, 10_000)} == {time_lr_factor(30.0, budget, warm)}


def test_time_schedule_without_a_budget_is_refused_before_training(tmp_path):
    cfg = TrainConfig(schedule="time", max_time=0.0)
    with pytest.raises(EmberError, match="max_time"):
        loop.Trainer(_Toy(), _Data(), cfg, tmp_path / "run", progress=False)


class _Toy(nn.Module):
    """Least squares on fixed points: enough of an objective to drive the Trainer."""

    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.lin = nn.Linear(2, 1)

    def make_batch(self, examples, rng):
        return {"x": torch.tensor(examples, dtype=torch.float32)}

    def forward(self, batch):
        x = batch["x"]
        loss = ((self.lin(x[:, :2]).squeeze(-1) - x[:, 2]) ** 2).mean()
        return loss, {"loss": (loss.item() * len(x), len(x))}


class _Data:
    points = [[i * 0.1, 1.0 - i * 0.05, i * 0.3] for i in range(16)]

    def __len__(self) -> int:
        return len(self.points)

    def example(self, index: int, epoch: int):
        return self.points[index]


class _Clock:
    """perf_counter advancing one second per call: every step takes the same fake time."""

    def __init__(self) -> None:
        self.now = 0.0

    def perf_counter(self) -> float:
        self.now += 1.0
        return self.now


def _train(run, cfg, monkeypatch, resume=False) -> dict[int, tuple[float, float]]:
    monkeypatch.setattr(clock, "time", SimpleNamespace(perf_counter=_Clock().perf_counter))  # step_clock("wall")
    loop.Trainer(_Toy(), _Data(), cfg, run, progress=False).train(resume=resume)
    return {r["step"]: (r["lr"], r["elapsed"]) for r in MetricsLogger.read(run / "metrics.jsonl")
            if r["split"] == "train"}


def test_time_schedule_follows_elapsed_time_and_survives_resume(tmp_path, monkeypatch):
    cfg = TrainConfig(schedule="time", max_time=30.0, warmup_ratio=0.2, max_steps=10_000, lr=1e-2,
                      batch_size=4, log_every=1, eval_every=0, save_every=4)
    full = _train(tmp_path / "full", cfg, monkeypatch)
    # The run stops when its budget is spent, whatever max_steps says.
    assert max(full) < 100 and full[max(full)][1] >= cfg.max_time
    # Each logged lr is the peak times the schedule at that step's elapsed seconds.
    for step, (lr, elapsed) in full.items():
        step_seconds = full[1][1]
        before = elapsed - step_seconds  # training seconds when the step started
        assert lr == pytest.approx(cfg.lr * time_lr_factor(before + 1.0, cfg.max_time, cfg.warmup_ratio))
    lrs = [full[s][0] for s in sorted(full)]
    peak = lrs.index(max(lrs))
    assert lrs[:peak + 1] == sorted(lrs[:peak + 1]) and lrs[peak:] == sorted(lrs[peak:], reverse=True)

    # Interrupted after 4 steps (a max_steps cap), then resumed: same schedule, same steps.
    run = tmp_path / "resumed"
    _train(run, dataclasses.replace(cfg, max_steps=4), monkeypatch)
    resumed = _train(run, cfg, monkeypatch, resume=True)
    assert sorted(resumed) == sorted(full)
    for step in full:
        assert resumed[step][0] == pytest.approx(full[step][0])
