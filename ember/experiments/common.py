"""Pieces the experiment runners share: resuming a run folder, and progress lines with a
time-left estimate."""

from __future__ import annotations

import shutil
import time
from pathlib import Path

from ember.durations import format_duration


def prepare_folder(run_dir: Path) -> bool:
    """True to resume (a checkpoint exists); otherwise clears a run that died before its first one."""
    from ember.runs.checkpoint import list_checkpoints

    if list_checkpoints(run_dir):
        return True
    if run_dir.exists():
        shutil.rmtree(run_dir)
    return False


class Clock:
    """Progress lines with a time-left estimate: pre-training costs its budget; fine-tuning time
    is taken as proportional to training examples x epochs, at the rate measured on this
    session's finished runs (so it is known after the first one)."""

    def __init__(self, budget: float, n_train: dict[str, int], epochs: float | None, name: str = "compare") -> None:
        self.budget, self.n_train, self.epochs, self.name = budget, n_train, epochs or 3.0, name
        self.ft_seconds, self.ft_work = 0.0, 0.0

    def say(self, message: str) -> None:
        print(f"[{self.name} {time.strftime('%H:%M:%S')}] {message}", flush=True)

    def finished_finetune(self, task: str, seconds: float) -> None:
        self.ft_seconds, self.ft_work = self.ft_seconds + seconds, self.ft_work + self.n_train[task] * self.epochs

    def status(self, what: str, pretrain_left: int, finetune_left: list[tuple[str, str, int]]) -> None:
        left = pretrain_left * self.budget
        if finetune_left and not self.ft_work:
            head = f"over {format_duration(left)}; " if left else ""
            return self.say(f"{what}; time left: {head}fine-tuning time is known after its first run")
        rate = self.ft_seconds / self.ft_work if self.ft_work else 0.0
        left += sum(self.n_train[task] * self.epochs * rate for _, task, _ in finetune_left)
        self.say(f"{what}; time left: ~{format_duration(left)}")
