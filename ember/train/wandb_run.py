"""``train.trackers=...,wandb``: one Weights & Biases run per ember run folder, offline by default.

W&B is asked for by name and writes, unless ``train.wandb_mode=online``, nothing but local files:
``RUN/wandb/offline-run-*/run-ID.wandb`` (or under ``train.wandb_dir``), which ``wandb sync`` uploads
later from a machine that may reach the server. What goes in:

* when training starts: the run (project ``train.wandb_project`` or "ember", name
  ``train.wandb_name`` or the run folder's, group ``train.wandb_group``; ``ember sweep`` groups its
  trials under the sweep's name), with config.yaml as its config;
* every metrics.jsonl record at its step (``train/loss``, ``eval/accuracy``, ...);
* when the command finishes (``finish_tracking``): the final metrics as ``final/NAME`` in the summary
  and the run's end (exit code 1 for a failed or pruned trial).

A resumed run folder continues the same W&B run: its id is kept in RUN/wandb.json. wandb is imported
only when a run asks for it; its service process is shared by the runs of one process.
"""

from __future__ import annotations

import contextlib
import json
import os
from pathlib import Path

from ember.errors import EmberError

RECORD = "wandb.json"
MODES = ("offline", "online")
_OPEN: dict[str, object] = {}  # run folder -> its open wandb Run (one at a time: wandb's global run)
_GROUP: list[str] = []  # the group new runs join (a sweep's name)


def check_wandb(mode: str) -> None:
    """Asked before a run folder is written: wandb installed, a mode it knows."""
    import importlib.util

    if mode not in MODES:
        raise EmberError(f"train.wandb_mode={mode!r}: choose offline (the default: local files, `wandb sync` "
                         "uploads them later) or online")
    if importlib.util.find_spec("wandb") is None:
        raise EmberError("train.trackers=wandb needs Weights & Biases: pip install wandb (or 'ember[tracking]')")


def options(cfg) -> dict:
    """The W&B settings of a TrainConfig."""
    return {"project": cfg.wandb_project, "name": cfg.wandb_name, "group": cfg.wandb_group,
            "dir": cfg.wandb_dir, "mode": cfg.wandb_mode}


@contextlib.contextmanager
def wandb_group(name: str):
    """W&B runs started inside the block join group ``name`` unless train.wandb_group names one."""
    _GROUP.append(name)
    try:
        yield
    finally:
        _GROUP.remove(name)


@contextlib.contextmanager
def _mode_env(mode: str):
    # wandb.init's mode= already wins over a stray WANDB_MODE=online in the shell (wandb 0.31); the
    # environment says the same while the run starts, for whatever else wandb starts reads it there
    before = os.environ.get("WANDB_MODE")
    os.environ["WANDB_MODE"] = mode
    try:
        yield
    finally:
        if before is None:
            os.environ.pop("WANDB_MODE", None)
        else:
            os.environ["WANDB_MODE"] = before


class WandbTracker:
    """The W&B run of one ember run folder (started, continued on resume, or still open)."""

    def __init__(self, run_dir: Path, settings: dict | None = None) -> None:
        import wandb
        import yaml

        self.run_dir = Path(run_dir).resolve()
        key = str(self.run_dir)
        if key in _OPEN:  # a second Trainer over the same folder (e.g. a later stage): same run
            self.run = _OPEN[key]
            return
        for other in list(_OPEN):  # wandb keeps one current run per process
            _finish(other, 0)
        s = {"project": "", "name": "", "group": "", "dir": "", "mode": "offline", **(settings or {})}
        record = _read(self.run_dir / RECORD)
        config_path = self.run_dir / "config.yaml"
        config = yaml.safe_load(config_path.read_text(encoding="utf-8")) if config_path.is_file() else {}
        folder = Path(s["dir"]).expanduser() if s["dir"] else self.run_dir
        folder.mkdir(parents=True, exist_ok=True)
        with _mode_env(s["mode"]):
            self.run = wandb.init(
                mode=s["mode"], dir=str(folder), project=s["project"] or "ember", name=s["name"] or self.run_dir.name,
                group=s["group"] or (_GROUP[-1] if _GROUP else None), config=config or None,
                id=record.get("id"), resume="allow" if record.get("id") else None,
                # ember prints its own progress: no capture of stdout, no banner, no code or git snapshot
                settings=wandb.Settings(console="off", silent=True, save_code=False, disable_git=True))
        _OPEN[key] = self.run
        from ember.fileio import atomic_write_text

        atomic_write_text(self.run_dir / RECORD, json.dumps(
            {"id": self.run.id, "project": self.run.project, "mode": s["mode"], "dir": str(folder)}, indent=2))

    def log(self, step: int, split: str, metrics: dict) -> None:
        self.run.log({f"{split}/{k}": float(v) for k, v in metrics.items()}, step=step)

    def end(self, exit_code: int) -> None:
        _finish(str(self.run_dir), exit_code)


def _read(path: Path) -> dict:
    try:
        return json.loads(Path(path).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return {}


def _finish(key: str, exit_code: int) -> None:
    run = _OPEN.pop(key, None)
    if run is not None:
        run.finish(exit_code=exit_code)


def finish_wandb(run_dir: Path, final: dict, status: str = "FINISHED") -> str | None:
    """End the open W&B run of ``run_dir`` with its final metrics; returns its id (None if none is open)."""
    key = str(Path(run_dir).resolve())
    run = _OPEN.get(key)
    if run is None:
        return None
    for name, value in final.items():
        if isinstance(value, (int, float)):
            run.summary[f"final/{name}"] = float(value)
    run_id = run.id
    _finish(key, 0 if status == "FINISHED" else 1)
    return run_id
