"""Run logs: ``metrics.jsonl`` (one JSON object per line) and TensorBoard events."""

from __future__ import annotations

import contextlib
import json
from pathlib import Path

# Who else wants each held-out evaluation in this process (a sweep's trial reports its dev curve
# to Optuna's pruner through this): listener(run_dir, step, metrics, main_metric). A listener may
# raise to stop the run there (a pruned trial); the Trainer's cleanup runs as for any error.
_EVALUATION_LISTENERS: list = []


@contextlib.contextmanager
def evaluations_to(listener):
    """Call ``listener`` after every held-out evaluation of every Trainer run inside the block."""
    _EVALUATION_LISTENERS.append(listener)
    try:
        yield
    finally:
        _EVALUATION_LISTENERS.remove(listener)


def tell_evaluation(run_dir: Path, step: int, metrics: dict, main_metric: str | None) -> None:
    for listener in list(_EVALUATION_LISTENERS):
        listener(Path(run_dir), step, metrics, main_metric)


class MetricsLogger:
    """metrics.jsonl always; TensorBoard, MLflow and W&B as ``trackers`` (train.trackers) ask."""

    def __init__(self, run_dir: Path, enabled: bool = True, trackers: str = "tensorboard", tracking_uri: str = "",
                 experiment: str = "", wandb: dict | None = None) -> None:
        from ember.train.tracking import tracker_names

        self.path = Path(run_dir) / "metrics.jsonl"
        self.enabled = enabled
        self._tb = self._mlflow = self._wandb = None
        names = tracker_names(trackers)
        if enabled:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            if "tensorboard" in names:
                try:
                    from torch.utils.tensorboard import SummaryWriter

                    self._tb = SummaryWriter(str(Path(run_dir) / "tb"))
                except ImportError:  # tensorboard is a dependency, but logging must never kill a run
                    self._tb = None
            if "mlflow" in names:  # asked for by name: a store that cannot be opened is an error, not a silence
                from ember.train.tracking import MlflowTracker

                self._mlflow = MlflowTracker(Path(run_dir), tracking_uri, experiment)
            if "wandb" in names:
                from ember.train.wandb_run import WandbTracker

                self._wandb = WandbTracker(Path(run_dir), wandb)

    def log(self, step: int, split: str, metrics: dict, elapsed: float) -> None:
        if not self.enabled:
            return
        record = {"step": step, "split": split, "elapsed": round(elapsed, 3)}
        record.update({k: float(v) for k, v in metrics.items()})
        with open(self.path, "a", encoding="utf-8") as fh:
            fh.write(json.dumps(record) + "\n")
        if self._tb is not None:
            for name, value in metrics.items():
                self._tb.add_scalar(f"{split}/{name}", float(value), step)
        if self._mlflow is not None:
            self._mlflow.log(step, split, metrics)
        if self._wandb is not None:
            self._wandb.log(step, split, metrics)

    def close(self, stopped: bool = False) -> None:
        """``stopped``: the training ended early (a signal, an error, a pruned trial); a W&B run ends
        here then (a resume continues it), else when the command has its final metrics."""
        if self._tb is not None:
            self._tb.close()
        if self._wandb is not None and stopped:
            self._wandb.end(1)

    @staticmethod
    def read(path: Path) -> list[dict]:
        if not Path(path).is_file():
            return []
        records = []
        for line in Path(path).read_text(encoding="utf-8").splitlines():
            try:
                record = json.loads(line)
            except ValueError:  # a line cut short by a kill mid-write
                continue
            if isinstance(record, dict) and "step" in record and "split" in record:  # not a stray line
                records.append(record)
        return records

    @staticmethod
    def truncate(path: Path, step: int) -> None:
        """Drop records after ``step`` (written by a run that died after its last checkpoint)."""
        from ember.runs.checkpoint import atomic_write_text

        records = [r for r in MetricsLogger.read(path) if r["step"] <= step]
        if Path(path).is_file():
            atomic_write_text(Path(path), "".join(json.dumps(r) + "\n" for r in records))


