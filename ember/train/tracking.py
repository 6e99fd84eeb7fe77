"""Experiment tracking beside metrics.jsonl: ``train.trackers=tensorboard,mlflow,wandb``.

TensorBoard events go to RUN/tb as they always did (``ember.train.logging``). MLflow gets, in the
store ``train.tracking_uri`` names (else MLFLOW_TRACKING_URI, else MLflow's own default, a SQLite
``mlflow.db`` in the working folder; no server is started):

* when training starts, one MLflow run per ember run folder, named after it, with every setting of
  config.yaml as a param (``train.lr``, ``task.epochs``, ...); a resumed run folder continues the
  same MLflow run (its id is kept in RUN/mlflow.json);
* every metrics.jsonl record as metrics ``train/loss``, ``eval/accuracy``, ... at its step;
* when the command finishes (``finish_tracking``), the run folder's files as artifacts (the
  final weights model.safetensors, config.yaml, tokenizer.json, results.json, metrics.jsonl,
  curves.png, ...; not checkpoints/ or tb/), the final metrics as ``final/NAME``, and its status.

Inside ``ember sweep`` each trial's run is a child of the sweep's run (``parent_run``).
MLflow is imported only when a run asks for it. Weights & Biases (offline by default) is
``ember.train.wandb_run``; ``finish_tracking`` ends its run too.
"""

from __future__ import annotations

import contextlib
import json
import time
from pathlib import Path

from ember.errors import EmberError
from ember.runs.folder import last_evaluation

TRACKERS = ("tensorboard", "mlflow", "wandb")
RECORD = "mlflow.json"
# large or rebuilt; a sweep's trials (and its best link) are runs of their own, its study.db Optuna's
NOT_ARTIFACTS = ("checkpoints", "tb", "trials", "inputs", "best", "wandb")
_PARENT: list[str] = []  # the MLflow run id new runs are children of (a sweep's)


def tracker_names(value: str) -> list[str]:
    names = [n.strip().lower() for n in str(value or "").split(",") if n.strip()]
    unknown = [n for n in names if n not in TRACKERS]
    if unknown:
        raise EmberError(f"train.trackers={value}: unknown tracker {unknown[0]!r}; choose from {', '.join(TRACKERS)} "
                         "(comma-separated, e.g. tensorboard,mlflow; empty for metrics.jsonl only)")
    return names


def check_trackers(value: str, wandb_mode: str = "offline") -> None:
    """Asked before a run folder is written: a tracker that does not exist or is not installed."""
    import importlib.util

    names = tracker_names(value)
    if "mlflow" in names and importlib.util.find_spec("mlflow") is None:
        raise EmberError("train.trackers=mlflow needs MLflow: pip install 'ember[track]'")
    if "wandb" in names:
        from ember.train.wandb_run import check_wandb

        check_wandb(wandb_mode)


def _client(uri: str):
    from mlflow import MlflowClient
    from mlflow.tracking import get_tracking_uri

    return MlflowClient(uri or get_tracking_uri()), uri or get_tracking_uri()


def _experiment_id(client, name: str, uri: str) -> str:
    found = client.get_experiment_by_name(name)
    if found is not None:
        return found.experiment_id
    # A SQLite store keeps its artifacts beside the database (MLflow's default is ./mlruns in whatever
    # folder the run happened to start from)
    location = None
    if uri.startswith("sqlite:///"):
        location = (Path(uri.removeprefix("sqlite:///")).parent / "mlruns" / name).resolve().as_uri()
    try:
        return client.create_experiment(name, artifact_location=location)
    except Exception:  # created meanwhile by another process sharing the store
        return client.get_experiment_by_name(name).experiment_id


def _flatten(values: dict, prefix: str = "") -> dict:
    out = {}
    for key, value in values.items():
        if isinstance(value, dict):
            out.update(_flatten(value, f"{prefix}{key}."))
        else:
            out[f"{prefix}{key}"] = "" if value is None else str(value)[:6000]  # MLflow's longest param value
    return out


class MlflowTracker:
    """One ember run folder's MLflow run (created, or continued on resume)."""

    def __init__(self, run_dir: Path, uri: str = "", experiment: str = "") -> None:
        from mlflow.entities import Param

        self.run_dir = Path(run_dir)
        record = _read(self.run_dir / RECORD)
        self.client, self.uri = _client(uri)
        if record.get("tracking_uri") == self.uri and record.get("run_id"):
            self.run_id = record["run_id"]
            self.client.update_run(self.run_id, status="RUNNING")
            return
        tags = {"ember.run_dir": str(self.run_dir.resolve())}
        if _PARENT:
            tags["mlflow.parentRunId"] = _PARENT[-1]
        experiment_id = _experiment_id(self.client, experiment or "ember", self.uri)
        run = self.client.create_run(experiment_id, run_name=self.run_dir.name, tags=tags)
        self.run_id = run.info.run_id
        config = self.run_dir / "config.yaml"
        if config.is_file():
            import yaml

            params = [Param(k, v) for k, v in _flatten(yaml.safe_load(config.read_text(encoding="utf-8"))).items()]
            for i in range(0, len(params), 100):  # MLflow takes at most 100 params a batch
                self.client.log_batch(self.run_id, params=params[i:i + 100])
        from ember.fileio import atomic_write_text

        atomic_write_text(self.run_dir / RECORD, json.dumps({"tracking_uri": self.uri, "run_id": self.run_id,
                                                              "experiment": experiment or "ember"}, indent=2))

    def log(self, step: int, split: str, metrics: dict) -> None:
        from mlflow.entities import Metric

        now = int(time.time() * 1000)
        batch = [Metric(f"{split}/{k}", float(v), now, step) for k, v in metrics.items()]
        self.client.log_batch(self.run_id, metrics=batch)


def _read(path: Path) -> dict:
    try:
        return json.loads(Path(path).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return {}


def finish_tracking(run_dir: str | Path, status: str = "FINISHED", final: dict | None = None) -> str | None:
    """End the MLflow run of ``run_dir`` (if it has one): its files as artifacts, its final metrics
    (``final`` if given - a multi-task run's per-task metrics -, else results.json's, else the last
    held-out evaluation) and ``status``. Returns the run id. An open W&B run of ``run_dir`` ends
    here too, with the same final metrics."""
    run_dir = Path(run_dir)
    record = _read(run_dir / RECORD)
    if not record.get("run_id") and not (run_dir / "wandb.json").is_file():
        return None
    final = final or _read(run_dir / "results.json").get("metrics") or {}
    if not final:  # a corpus-level run: its last held-out evaluation in metrics.jsonl
        final = last_evaluation(run_dir)
    from ember.train.wandb_run import _OPEN, finish_wandb

    if _OPEN:  # imported only when this process started a W&B run
        finish_wandb(run_dir, final, status)
    if not record.get("run_id"):
        return None
    from mlflow.entities import Metric

    client, _ = _client(record["tracking_uri"])
    run_id = record["run_id"]
    if client.get_run(run_id).info.status == "FINISHED":
        return run_id
    now = int(time.time() * 1000)
    metrics = [Metric(f"final/{k}", float(v), now, 0) for k, v in final.items() if isinstance(v, (int, float))]
    if metrics:
        client.log_batch(run_id, metrics=metrics)
    for path in sorted(run_dir.iterdir()):
        if path.is_file() and path.name != RECORD and path.suffix != ".db":
            client.log_artifact(run_id, str(path))
        elif path.is_dir() and path.name not in NOT_ARTIFACTS:
            client.log_artifacts(run_id, str(path), artifact_path=path.name)
    client.set_terminated(run_id, status=status)
    return run_id


@contextlib.contextmanager
def parent_run(run_id: str):
    """MLflow runs started inside the block are children of ``run_id`` (a sweep's trials)."""
    _PARENT.append(run_id)
    try:
        yield
    finally:
        _PARENT.remove(run_id)


def start_sweep_run(out: Path, uri: str, experiment: str, name: str, params: dict) -> str:
    """The sweep's own MLflow run (kept in SWEEP/mlflow.json, so a resumed sweep continues it)."""
    record = _read(out / RECORD)
    client, uri = _client(uri)
    if record.get("tracking_uri") == uri and record.get("run_id"):
        client.update_run(record["run_id"], status="RUNNING")
        return record["run_id"]
    from mlflow.entities import Param

    run = client.create_run(_experiment_id(client, experiment or "ember", uri), run_name=name,
                            tags={"ember.sweep": str(out.resolve())})
    client.log_batch(run.info.run_id, params=[Param(k, str(v)[:6000]) for k, v in params.items()])
    from ember.fileio import atomic_write_text

    atomic_write_text(out / RECORD, json.dumps({"tracking_uri": uri, "run_id": run.info.run_id,
                                                 "experiment": experiment or "ember"}, indent=2))
    return run.info.run_id


def log_value(run_dir: Path, key: str, value: float) -> None:
    """One more metric on the MLflow run of ``run_dir`` (a sweep's best value)."""
    from mlflow.entities import Metric

    record = _read(Path(run_dir) / RECORD)
    client, _ = _client(record["tracking_uri"])
    client.log_batch(record["run_id"], metrics=[Metric(key, float(value), int(time.time() * 1000), 0)])


def hardware(device: str) -> dict:
    """The device, the CPU's model name (Linux: /proc/cpuinfo), torch's threads and version."""
    import platform

    import torch

    cpu = ""
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as f:
            cpu = next((line.split(":", 1)[1].strip() for line in f if line.startswith("model name")), "")
    except OSError:
        pass
    info = {"device": device, "cpu": cpu or platform.processor() or platform.machine(),
            "threads": torch.get_num_threads(), "torch": torch.__version__}
    if device.startswith("cuda") and torch.cuda.is_available():
        info["gpu"] = torch.cuda.get_device_name(torch.device(device))
    return info
