"""What the library functions return: the run folder and its numbers, as plain Python."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path


@dataclass
class RunResult:
    """A finished (or resumed-to-finish) run.

    ``metrics``: the held-out metrics of a pre-training run's last evaluation, the dev metrics
    of a fine-tuning run (the mean over seeds when there are several), a distilled student's
    dev metrics. ``runs``: one dict per run folder written (results.json's content for
    fine-tuning, the trainer's summary for pre-training). ``summary``: per metric over seeds
    (mean, std, median, values) when several seeds ran.
    """

    run_dir: Path
    metrics: dict[str, float]
    runs: list[dict] = field(default_factory=list)
    summary: dict | None = None

    @property
    def result(self) -> dict:
        """The one run's own record (the first seed's when there are several)."""
        return self.runs[0] if self.runs else {}
