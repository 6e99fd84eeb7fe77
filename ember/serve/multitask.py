"""Serving a multi-task run: one route per method, the request's ``"task"`` field picks the task.

A multi-task run (``ember.train.multitask``) keeps one ordinary run folder per task (RUN/tasks/NAME,
its best weights on its own dev set). ``MultiTaskPredictor`` holds one ``Predictor`` per task and
offers the Predictor interface the app and ``ember.load`` use: ``POST /classify {"task": "rte",
"text": ..., "text_pair": ...}`` is parsed by RTE's own classify method and answered by RTE's
model; a micro-batch mixing tasks runs as one batch per task.
"""

from __future__ import annotations

from pathlib import Path

from ember.errors import RequestError


class TaskRoutedMethod:
    """One inference method of several tasks' predictors, routed by the request's "task"."""

    def __init__(self, name: str, predictors: dict) -> None:
        self.name, self.predictors = name, predictors
        first = next(p.methods[name] for p in predictors.values() if name in p.methods)
        self.inputs = getattr(first, "inputs", {"text": "texts"})
        self.limits = getattr(first, "limits", ())
        tasks = [t for t, p in predictors.items() if name in p.methods]
        form = getattr(first, "form", None)
        if form is not None:  # the page's form gains the task field
            self.form = {**form, "fields": [{"name": "task", "label": f"Task ({', '.join(tasks)})", "type": "select",
                                             "options": tasks, "default": tasks[0]}] + list(form["fields"])}
        schema = getattr(first, "request_schema", None)
        if schema:
            self.request_schema = {**schema, "description": f"{schema.get('description', '')} The \"task\" field "
                                   f"names the task that answers: {', '.join(tasks)}."}

    def parse(self, data: dict, limits) -> dict:
        task = data.get("task")
        served = [t for t, p in self.predictors.items() if self.name in p.methods]
        if not isinstance(task, str) or task not in served:
            raise RequestError(400, f'this multi-task model answers /{self.name} for {", ".join(served)}: add "task": '
                               f'one of them (got {task!r})')
        rest = {k: v for k, v in data.items() if k != "task"}
        return {"task": task, "request": self.predictors[task].parse(self.name, rest, limits)}

    def __call__(self, requests, forward) -> list:
        out: list = [None] * len(requests)
        for task in dict.fromkeys(r["task"] for r in requests):  # one batch per task, in arrival order
            idx = [i for i, r in enumerate(requests) if r["task"] == task]
            for i, response in zip(idx, self.predictors[task].run(self.name, [requests[i]["request"] for i in idx])):
                out[i] = response
        return out


class MultiTaskInfo:
    def __init__(self, run_dir: Path, predictors: dict) -> None:
        self.predictors = predictors
        self.display_name = f"multi-task run {Path(run_dir).name} ({', '.join(predictors)})"

    def summary(self) -> dict:
        return {"kind": "multitask", "display_name": self.display_name,
                "tasks": {t: p.info.summary() for t, p in self.predictors.items()}}


class MultiTaskPredictor:
    def __init__(self, run_dir: Path, predictors: dict) -> None:
        self.predictors = predictors
        self.info = MultiTaskInfo(run_dir, predictors)
        names = list(dict.fromkeys(m for p in predictors.values() for m in p.methods))
        self.methods = {name: TaskRoutedMethod(name, predictors) for name in names}
        first = next(iter(predictors.values()))
        self.tokenizer, self.max_length, self.max_batch, self.runner = (first.tokenizer, first.max_length,
                                                                        first.max_batch, first.runner)

    backend = property(lambda self: next(iter(self.predictors.values())).backend)
    forwards = property(lambda self: sum(p.forwards for p in self.predictors.values()))
    endpoints = property(lambda self: [f"/{name}" for name in self.methods])

    def parse(self, name: str, data: dict, limits) -> dict:
        return self.methods[name].parse(data, limits)

    def run(self, name: str, requests) -> list:
        return self.methods[name](requests, None)


def load_multitask_predictor(run_dir: Path, load_one) -> MultiTaskPredictor:
    """``load_one(folder)``: the Predictor of one task's run folder (``load_predictor``'s settings)."""
    from ember.tasks.multitask import task_names, task_run

    return MultiTaskPredictor(Path(run_dir), {name: load_one(task_run(run_dir, name)) for name in task_names(run_dir)})
