"""``ember.evaluate``: a fine-tuned run's official metrics on a labelled split or file."""

from __future__ import annotations

from pathlib import Path


def evaluate(run: str | Path, split: str = "", file: str | Path | None = None, task: str = "") -> dict:
    """{"task", "split", "metrics"} of ``run`` on ``split`` (default: the split it was selected
    on) or on a labelled ``file`` in the task's layout; SQuAD 2.0 uses the run's tuned threshold.

    >>> ember.evaluate("runs/sst2")["metrics"]["accuracy"]  # doctest: +SKIP
    """
    from ember.tasks.task_model import evaluate_run

    return evaluate_run(Path(run), split, str(file) if file is not None else None, task)
