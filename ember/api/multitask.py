"""``ember.finetune(tasks=[...])``: several tasks on one shared encoder (``ember.train.multitask``).

A task is a built-in name (``"rte"``) or your own files: ``"NAME=KIND:TRAIN:DEV"`` (the CLI's
spelling; KIND is classify, pair, regression, tag or qa) or a dict ``{"name", "kind", "train", "dev",
"column", "pair_column", "label_column"}``. Every task is read and checked, and every option
refused, before the run folder is touched (docs/multitask.md).
"""

from __future__ import annotations

import re
from pathlib import Path

from ember.api.results import RunResult
from ember.errors import EmberError

CUSTOM_KINDS = ("classify", "pair", "regression", "tag", "qa")  # the heads a custom task of a mixture may have
NAME = re.compile(r"^[a-z0-9][a-z0-9_-]*$")  # a folder name and a state-dict key part (no dots)


def parse_tasks(tasks) -> list[dict | str]:
    """The task list: names and custom-task dicts (a comma-separated string is split)."""
    if isinstance(tasks, str):
        tasks = [t for t in tasks.split(",") if t.strip()]
    parsed = []
    for task in tasks:
        if isinstance(task, str) and "=" in task:
            name, _, rest = task.partition("=")
            parts = rest.split(":")
            if len(parts) < 3 or not all(parts[:3]):
                raise EmberError(f"--tasks {task}: your own task is NAME=KIND:TRAIN:DEV (KIND {'|'.join(CUSTOM_KINDS)}); "
                                 "a dev file picks the task's best checkpoint and reports its metric")
            parsed.append({"name": name.strip(), "kind": parts[0], "train": parts[1], "dev": parts[2]})
        elif isinstance(task, (str, dict)):
            parsed.append(task.strip() if isinstance(task, str) else dict(task))
        else:
            raise EmberError(f"tasks=: {task!r} is neither a task name nor a dict describing your own files")
    return parsed


def task_adapters(tasks: list, model_cfg) -> tuple[list[tuple[str, object]], list]:
    """(name, adapter for the model's family) per task, and each task as ``get_adapter`` takes it
    (a name or a custom task's adapter); your own files are read and checked here."""
    from ember.tasks.base import get_adapter
    from ember.tasks.custom import custom_task

    names = [t if isinstance(t, str) else str(t.get("name", "")) for t in tasks]
    names = [get_adapter(n).name if isinstance(t, str) else n.lower() for n, t in zip(names, tasks)]
    twice = sorted({n for n in names if names.count(n) > 1})
    if twice:  # before any file is read
        raise EmberError(f"--tasks names {twice[0]} twice; each task has one head and one folder (RUN/tasks/NAME)")
    adapters, raw = [], []
    for name, task in zip(names, tasks):
        if isinstance(task, dict):
            if not NAME.match(name):
                raise EmberError(f"task name {name!r}: use lower-case letters, digits, '-' and '_' (it names the "
                                 "task's folder, RUN/tasks/NAME)")
            kind = task.get("kind")
            if kind not in CUSTOM_KINDS:
                raise EmberError(f"task {name}: kind {kind!r}; a task of a mixture on your own files is "
                                 f"{', '.join(CUSTOM_KINDS)}")
            if not task.get("dev"):
                raise EmberError(f"task {name} has no dev file: each task of a mixture keeps its best checkpoint "
                                 "on its own dev set (NAME=KIND:TRAIN:DEV)")
            task = custom_task(kind, task.get("train"), task["dev"], None, task.get("column"),
                               task.get("pair_column"), task.get("label_column"))
        adapters.append((name, get_adapter(task, model_cfg)))
        raw.append(task)
    return adapters, raw


def run_tasks(cfg, out: Path, start, adapters: list, train_limit, resume: bool, overwrite: bool,
              progress: bool) -> RunResult:
    """Train the multi-task run ``cfg`` (built by ``ember.api.finetune``) and sum it up as a RunResult."""
    from ember.train.multitask import run_multitask

    result = run_multitask(cfg, out, start.state, start.tokenizer, adapters, train_limit, overwrite=overwrite,
                           resume=resume, progress=progress)
    metrics = {f"{name}.{k}": v for name, r in result["tasks"].items() for k, v in r["metrics"].items()}
    return RunResult(out, {**metrics, "average": result["average"]}, [result])
