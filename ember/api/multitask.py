"""``ember.finetune(tasks=[...])``: several tasks on one shared encoder (``ember.train.multitask``).

A task is a built-in name (``"rte"``) or your own files: ``"NAME=KIND:TRAIN:DEV[:TEST][:prefix=TEXT]"``
(the CLI's spelling; KIND is classify, pair, regression, tag, qa or text2text) or a dict ``{"name",
"kind", "train", "dev", "test", "prefix", "column", "pair_column", "label_column"}``. A test file is
scored once with the task's best-on-dev weights; the prefix starts the task's inputs in a text-to-text
(T5, BART) mixture, by default the task's name (``ember.tasks.text2text.templates``). Every task is
read and checked, and every option refused, before the run folder is touched (docs/multitask.md).
"""

from __future__ import annotations

import re
from pathlib import Path

from ember.api.results import RunResult
from ember.errors import EmberError

CUSTOM_KINDS = ("classify", "pair", "regression", "tag", "qa", "text2text")  # your own tasks a mixture takes
NAME = re.compile(r"^[a-z0-9][a-z0-9_-]*$")  # a folder name and a state-dict key part (no dots)
SPELLING = "NAME=KIND:TRAIN:DEV[:TEST][:prefix=TEXT]"


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
                raise EmberError(f"--tasks {task}: your own task is {SPELLING} (KIND {'|'.join(CUSTOM_KINDS)}); "
                                 "a dev file picks the task's best checkpoint and reports its metric")
            spec = {"name": name.strip(), "kind": parts[0], "train": parts[1], "dev": parts[2]}
            for part in parts[3:]:  # a test file and a prefix, in either order
                key = "prefix" if part.startswith("prefix=") else "test"
                if key in spec or (key == "test" and not part):
                    raise EmberError(f"--tasks {task}: after TRAIN:DEV come at most a TEST file and prefix=TEXT "
                                     f"({SPELLING})")
                spec[key] = part[len("prefix="):] if key == "prefix" else part
            parsed.append(spec)
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
            prefix = task.get("prefix", name)
            if not isinstance(prefix, str) or prefix != " ".join(prefix.split()):
                raise EmberError(f"task {name}: prefix {prefix!r}: give the words that start the task's text-to-text "
                                 "inputs as one line with single spaces (\"\" feeds them as written)")
            unknown = sorted(set(task) - {"name", "kind", "train", "dev", "test", "prefix", "column", "pair_column",
                                          "label_column"})
            if unknown:
                raise EmberError(f"task {name}: unknown key {unknown[0]!r}; a task on your own files takes name, "
                                 "kind, train, dev, test, prefix, column, pair_column, label_column")
            task = custom_task(kind, task.get("train"), task["dev"], task.get("test"), task.get("column"),
                               task.get("pair_column"), task.get("label_column"))
            # kept in the task's task.json, so evaluate / predict / serve write its inputs as training did
            task.record_data["prefix"] = prefix
        adapters.append((name, get_adapter(task, model_cfg)))
        raw.append(task)
    return adapters, raw


def run_tasks(cfg, out: Path, start, adapters: list, train_limit, resume: bool, overwrite: bool,
              progress: bool) -> RunResult:
    """Train the multi-task run ``cfg`` (built by ``ember.api.finetune``) and sum it up as a RunResult."""
    from ember.train.multitask import run_multitask
    from ember.train.tracking import finish_tracking

    result = run_multitask(cfg, out, start.state, start.tokenizer, adapters, train_limit, overwrite=overwrite,
                           resume=resume, progress=progress)
    metrics = {f"{name}.{k}": v for name, r in result["tasks"].items() for k, v in r["metrics"].items()}
    metrics.update({f"{name}.{split}.{k}": v for name, r in result["tasks"].items()  # e.g. "conll2003.test.f1"
                    for split, other in r.get("other_splits", {}).items() for k, v in other.items()})
    metrics["average"] = result["average"]
    finish_tracking(out, final=metrics)  # train.trackers: every task's final metrics, the run ended
    return RunResult(out, metrics, [result])
