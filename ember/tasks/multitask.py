"""A multi-task run folder, read without the trainer: its tasks and each task's own run folder.

``ember.train.multitask`` writes RUN/multitask.json and one ordinary fine-tuned run folder per task
in RUN/tasks/NAME (best weights on that task's dev set, config.yaml, tokenizer.json, labels.json);
evaluation, prediction, serving and ``ember.load`` reach a task through ``task_run``.
"""

from __future__ import annotations

import json
from pathlib import Path

from ember.errors import EmberError

MULTITASK_RECORD = "multitask.json"
TASKS_DIR = "tasks"


def is_multitask_run(run_dir: str | Path) -> bool:
    return (Path(run_dir) / MULTITASK_RECORD).is_file()


def task_names(run_dir: str | Path) -> list[str]:
    """The tasks of a multi-task run, in the order they were given."""
    path = Path(run_dir) / MULTITASK_RECORD
    try:
        return [t["name"] for t in json.loads(path.read_text(encoding="utf-8"))["tasks"]]
    except (OSError, ValueError, KeyError, TypeError) as exc:
        raise EmberError(f"{path}: unreadable ({exc}); it lists the run's tasks") from None


def task_run(run_dir: str | Path, task: str) -> Path:
    """RUN/tasks/TASK, the run folder of one task of a multi-task run (its best weights on its dev set)."""
    names = task_names(run_dir)
    if not task:
        raise EmberError(f"{run_dir} is a multi-task run of {', '.join(names)}: name the task (task=\"{names[0]}\", "
                         f"--task {names[0]}, or \"task\": \"{names[0]}\" in a request)")
    key = task.lower()
    if key not in names:
        raise EmberError(f"{run_dir} has no task {task!r}; its tasks: {', '.join(names)}")
    folder = Path(run_dir) / TASKS_DIR / key
    if not (folder / "model.safetensors").is_file():
        raise EmberError(f"{folder} has no weights yet: its first evaluation on dev has not run (is the training "
                         "still running?)")
    return folder
