"""Multi-task fine-tuning: one shared encoder, a head per task, one optimizer, the one Trainer.

MT-DNN (Liu et al. 2019, §3-4): the encoder is shared, each task keeps its own output layer and
loss, and every mini-batch holds one task's examples. The tasks are drawn by a mixture schedule
(``ember.train.mixture``: T5's examples-proportional / temperature / equal mixing) that feeds the
same loop single-task fine-tuning uses (``ember.train.loop.Trainer``), so grad accumulation,
clipping, schedules, time budgets and exact resume are the same code.

The run folder::

    RUN/config.yaml, tokenizer.json, metrics.jsonl, checkpoints/   the multi-task run (as any run)
    RUN/multitask.json        the tasks (names, kinds, training sizes) and their mixing rates
    RUN/model.safetensors     the final shared model: ``backbone.*`` once, ``heads.<task>.*`` per
                              task; ``ember finetune --init RUN`` starts from its encoder (MT-DNN §4)
    RUN/tasks/<task>/         a complete single-task run folder per task: its best-on-its-own-dev
                              weights (model.safetensors: backbone + its head), config.yaml,
                              tokenizer.json, labels.json, task.json (your own files), results.json
    RUN/results.json, summary.json   every task's metrics, rate asked for and share realised

Each task's folder is an ordinary fine-tuned run, so ``ember evaluate``, ``predict``, ``serve`` and
``ember.load`` read it as they read any run (``ember.tasks.multitask`` finds them).
"""

from __future__ import annotations

import dataclasses
import json
import os
from pathlib import Path

import numpy as np
import torch
from torch import nn
from torch.nn.modules.module import _IncompatibleKeys

from ember.config import RunConfig
from ember.errors import EmberError
from ember.runs.checkpoint import atomic_write_text, load_weights, save_weights
from ember.runs.folder import check_resume_settings, load_run_config, prepare_run_dir, write_run_files
from ember.tasks.base import apply_task_settings
from ember.tasks.multitask import MULTITASK_RECORD, TASKS_DIR
from ember.tasks.task_model import build_task_module, pad_token_id
from ember.train.finetune import (
    check_lengths_and_splits,
    check_options,
    other_splits,
    score_other_splits,
    write_task_files,
)
from ember.train.length_groups import feature_groups, feature_lengths
from ember.train.loop import Trainer, epoch_schedule
from ember.train.mixture import TaskMixture, mixing_rates


class MultiTaskModel(nn.Module):
    """Task modules sharing one backbone object. The state dict names each tensor once
    (``backbone.*``, ``heads.<task>.*``): safetensors refuses tensors that share storage, and a
    pre-trained init reads ``backbone.*`` as it does from a single-task run."""

    def __init__(self, modules: dict[str, nn.Module]) -> None:
        super().__init__()
        backbones = {id(getattr(m, "backbone", None)) for m in modules.values()}
        if len(backbones) != 1 or None in [getattr(m, "backbone", None) for m in modules.values()]:
            raise EmberError("multi-task training needs task heads on one shared backbone")
        self.tasks = nn.ModuleDict(modules)
        self.names = list(modules)
        # one loss term per example in every task: the Trainer may group batches by length
        self.loss_per_example = all(getattr(m, "loss_per_example", False) for m in modules.values())
        # and train.group_by_length=auto groups them only where every task's head would be grouped alone
        self.group_by_length_default = all(getattr(m, "group_by_length_default", False) for m in modules.values())

    def make_batch(self, examples: list[tuple[int, dict]], rng: np.random.Generator | None = None) -> dict:
        task = examples[0][0]
        assert all(t == task for t, _ in examples), "a batch holds one task's examples (ember.train.mixture)"
        batch = self.tasks[self.names[task]].make_batch([f for _, f in examples], rng)
        return {**batch, "task": torch.tensor(task)}

    def forward(self, batch: dict) -> tuple[torch.Tensor, dict]:
        batch = dict(batch)
        name = self.names[int(batch.pop("task"))]
        loss, metrics = self.tasks[name](batch)
        # "loss" across tasks (the training curve) and each task's own, prefixed with its name
        return loss, {"loss": metrics["loss"], **{f"{name}.{k}": v for k, v in metrics.items()}}

    def state_dict(self, *args, destination=None, prefix: str = "", keep_vars: bool = False) -> dict:
        out = {} if destination is None else destination
        for name, module in self.tasks.items():
            for key, value in module.state_dict(keep_vars=keep_vars).items():
                if key.startswith("backbone."):
                    out.setdefault(prefix + key, value)
                else:
                    out[f"{prefix}heads.{name}.{key}"] = value
        return out

    def load_state_dict(self, state: dict, strict: bool = True, assign: bool = False):
        missing, used = [], set()
        for name, module in self.tasks.items():
            own = {}
            for key in module.state_dict():
                stored = key if key.startswith("backbone.") else f"heads.{name}.{key}"
                if stored in state:
                    own[key] = state[stored]
                    used.add(stored)
                elif stored not in missing:
                    missing.append(stored)
            module.load_state_dict(own, strict=False, assign=assign)
        unexpected = sorted(set(state) - used)
        if strict and (missing or unexpected):
            raise RuntimeError(f"multi-task state does not fit: missing {missing[:3]}, unexpected {unexpected[:3]}")
        return _IncompatibleKeys(missing, unexpected)


def check_multitask_options(cfg: RunConfig, names: list[str]) -> None:
    """What multi-task training does not combine with, refused before anything is written."""
    check_options(cfg)
    if len(names) < 2:
        raise EmberError(f"--tasks {','.join(names)}: multi-task training takes two tasks or more; one task is "
                         "ember finetune --task NAME")
    twice = sorted({n for n in names if names.count(n) > 1})
    if twice:
        raise EmberError(f"--tasks names {twice[0]} twice; each task has one head and one folder (RUN/tasks/NAME)")
    task = cfg.task
    if task.features or task.layer_lr_decay != 1.0 or task.gradual_unfreeze or cfg.knowledge.graph \
            or cfg.knowledge.entities:
        raise EmberError("--features, --layer-lr-decay, --gradual-unfreeze, --knowledge and --entities are "
                         "single-task options; multi-task runs train the shared encoder as a whole")
    if cfg.train.parallel == "fsdp":
        raise EmberError("multi-task runs train in one process (train.parallel=ddp, no torchrun)")


def check_inputs_apart(tasks: list[tuple[str, object]], data: dict) -> None:
    """One text-to-text model answers every task of its mixture (T5, Raffel et al. 2020 §3.5): only the
    input's fixed text (the task prefix, a decaNLP question) tells it which task's labels or texts to write.
    Your own tasks get their name as prefix (``ember.api.multitask``); two tasks whose inputs still start with
    the same fixed text (the same prefix given twice, two text2text files fed as written with nothing
    telling them apart) would have their outputs collide in the one model, so they are refused. A task
    fed as written counts by its file's own prefix: the words every training input starts with. Encoder
    tasks each have a head."""
    seen = {}
    for name, adapter in tasks:
        fixed = fixed_text(adapter, data[name][0][0])
        if fixed is None:
            continue
        if fixed in seen:
            raise EmberError(f"tasks {seen[fixed]} and {name} would give the text-to-text model inputs of one form "
                             f"({fixed!r}), so it could not tell which task's output to write; give your own "
                             "task a prefix of its own (NAME=KIND:TRAIN:DEV:prefix=TEXT, or \"prefix\" in its dict), "
                             "or train one of them in its own run")
        seen[fixed] = name


def fixed_text(adapter, examples) -> str | None:
    """The text every text-to-text input of a task starts with (None: an encoder task, with its own head)."""
    from ember.tasks.text2text.templates import input_format, input_text

    template = getattr(adapter, "template", None)
    if template is None:
        return None
    fixed = " ".join(input_format(template))
    if not fixed and template.kind == "generate" and examples:  # inputs as written: the words all of them start with
        fixed = " ".join(os.path.commonprefix([input_text(template, ex).split() for ex in examples]))
    return fixed


def run_multitask(cfg: RunConfig, run_dir: Path, state: dict | None, tokenizer_path: Path,
                  tasks: list[tuple[str, object]], train_limit: int | None = None, overwrite: bool = False,
                  resume: bool = False, progress: bool = True) -> dict:
    """Train ``tasks`` ((name, adapter) pairs) on one encoder; the run folder of the module docstring."""
    from ember.tokenizers import load_tokenizer

    run_dir = Path(run_dir)
    names = [name for name, _ in tasks]
    check_multitask_options(cfg, names)
    for _, adapter in tasks:  # the run's decoding and template set (a text-to-text mixture)
        apply_task_settings(adapter, cfg.task)
    check_lengths_and_splits(cfg)
    tokenizer = load_tokenizer(tokenizer_path)
    pad_id = pad_token_id(tokenizer)
    data = {}
    for name, adapter in tasks:
        train = adapter.load(cfg.task.train_split, tokenizer, cfg.task.max_length, limit=train_limit)
        data[name] = (train, adapter.load(cfg.task.eval_split, tokenizer, cfg.task.max_length))
    check_inputs_apart(tasks, data)  # after reading: a task fed as written counts by its inputs' own prefix
    sizes = {name: len(data[name][0][1]) for name in names}
    rates = mixing_rates(sizes, cfg.task.mixing, cfg.task.mixing_limit, cfg.task.mixing_temperature)
    # An epoch is a pass over all tasks' examples together (MT-DNN, Algorithm 1)
    train_cfg, _ = epoch_schedule(cfg.train, sum(sizes.values()), cfg.task.epochs)
    cfg = dataclasses.replace(cfg, train=train_cfg, kind="finetune", task=dataclasses.replace(
        cfg.task, name="", tasks=",".join(names)))
    modules = {}
    for t, (name, adapter) in enumerate(tasks):
        if not modules:  # the shared backbone, with the pre-trained weights, seeded as a single-task run
            modules[name] = build_task_module(cfg, adapter, state, pad_id)
            backbone = next(iter(modules.values())).backbone
        else:
            torch.manual_seed(cfg.train.seed * 1009 + t)  # each head's initialisation part of the seed
            modules[name] = adapter.build_module(backbone, pad_id)
    module = MultiTaskModel(modules)
    if resume and (run_dir / "config.yaml").is_file():
        check_resume_settings(load_run_config(run_dir), cfg, run_dir)
    prepare_run_dir(run_dir, resume, overwrite, inputs=(tokenizer_path,))
    write_run_files(run_dir, cfg, tokenizer_path)
    record = {"tasks": [{"name": name, "task": adapter.name, "display_name": adapter.display_name,
                         "folder": f"{TASKS_DIR}/{name}", "train_examples": sizes[name], "rate": rates[name]}
                        for name, adapter in tasks],
              "mixing": {"mixing": cfg.task.mixing, "limit": cfg.task.mixing_limit,
                         "temperature": cfg.task.mixing_temperature}}
    atomic_write_text(run_dir / MULTITASK_RECORD, json.dumps(record, indent=2))
    folders = {}
    for name, adapter in tasks:  # each task's folder: an ordinary single-task run folder
        folders[name] = run_dir / TASKS_DIR / name
        write_run_files(folders[name], task_config(cfg, adapter), tokenizer_path)
        write_task_files(folders[name], adapter)
    best = {name: _read_best(folders[name]) if resume else None for name in names}
    batch, device = cfg.task.eval_batch_size, cfg.train.device

    def evaluate(m):
        metrics, mains = {}, []
        for name, adapter in tasks:
            dev_examples, dev_features = data[name][1]
            scores = adapter.score(m.tasks[name], dev_examples, dev_features, batch, device)
            metrics.update({f"{name}.{k}": v for k, v in scores.items()})
            main = _finite(scores[adapter.main_metric])
            mains.append(on_unit_scale(adapter, main))
            if best[name] is None or main > _finite(best[name]["metrics"][adapter.main_metric]):
                # each task's own best checkpoint on its own dev set (MT-DNN selects per task)
                best[name] = {"step": trainer.step, "metrics": scores}
                save_weights(m.tasks[name].state_dict(), folders[name] / "model.safetensors", {"task": adapter.name})
                atomic_write_text(folders[name] / "best.json", json.dumps(best[name], indent=2))
        counts = trainer.order.schedule.counts(trainer.step)
        metrics.update({f"{name}.share": counts[t] / max(trainer.step, 1) for t, name in enumerate(names)})
        metrics["average"] = float(np.mean(mains))  # the GLUE-style score: mean of the main metrics, on [0, 1]
        return metrics

    train_data = TaskMixture([data[n][0][1] for n in names], [rates[n] for n in names],
                             [feature_lengths(data[n][0][1]) for n in names], [feature_groups(data[n][0][1]) for n in names])
    trainer = Trainer(module, train_data, train_cfg, run_dir, evaluate=evaluate, best_metric="average",
                      progress=progress, patience=cfg.task.patience)
    trainer.train(resume=resume)
    save_weights(module.state_dict(), run_dir / "model.safetensors", {"tasks": ",".join(names)})
    counts = trainer.order.schedule.counts(trainer.step)
    results = {}
    for t, (name, adapter) in enumerate(tasks):
        results[name] = task_results(cfg, adapter, module.tasks[name], folders[name], best[name], data[name],
                                     trainer, rates[name], int(counts[t]), tokenizer)
    return write_summary(run_dir, cfg, results, trainer)


def on_unit_scale(adapter, value: float) -> float:
    """A main metric on [0, 1] for the average: SQuAD's official script reports EM and F1 in percent
    (Rajpurkar et al. 2016), as do the text metrics of your own text2text task (token F1, BLEU, ROUGE:
    ember.tasks.metrics.text); the other tasks' metrics are fractions, and the average would be those alone."""
    return value / 100.0 if getattr(adapter, "kind", "") in ("answer", "generate") else value


def _finite(value: float) -> float:
    """A metric for comparing and averaging: an undefined one (Pearson of constant predictions,
    early in training) counts as 0, as no correlation, so it neither wins nor poisons the mean."""
    return float(value) if np.isfinite(value) else 0.0


def task_config(cfg: RunConfig, adapter) -> RunConfig:
    """A task's own run config (RUN/tasks/NAME/config.yaml): the multi-task run's, for its task alone."""
    return dataclasses.replace(cfg, task=dataclasses.replace(cfg.task, name=adapter.name, tasks=""))


def _read_best(folder: Path) -> dict | None:
    path = folder / "best.json"
    return json.loads(path.read_text()) if path.is_file() and (folder / "model.safetensors").is_file() else None


def task_results(cfg, adapter, module, folder: Path, best: dict, data, trainer, rate: float, steps: int,
                 tokenizer) -> dict:
    """RUN/tasks/NAME/results.json, in a single-task run's layout plus the mixture's rate and share; the
    task's further labelled splits (a test file) scored with its kept weights, as a single-task run does."""
    (train_examples, train_features), (dev_examples, dev_features) = data
    batch, device, exact = cfg.task.eval_batch_size, cfg.train.device, cfg.train.dtype in ("float32", "fp32")
    if hasattr(adapter, "tune") or not exact or other_splits(cfg, adapter):
        # the task's best-on-its-dev weights: its head and the shared encoder of that step (the run's final
        # shared model is already written, so overwriting the shared encoder here loses nothing)
        module.load_state_dict(load_weights(folder / "model.safetensors"))
        module.eval()
    tuned = None
    if hasattr(adapter, "tune"):  # SQuAD 2.0's no-answer threshold, tuned with the kept weights (ember.train.finetune)
        with torch.no_grad():
            tuned, metrics, untuned = adapter.tune(module, dev_examples, dev_features, batch, device)
    elif exact:
        metrics = best["metrics"]  # the trainer scored exactly these weights (ember.train.finetune)
    else:  # scored under autocast during training: score the kept weights now
        with torch.no_grad():
            metrics = adapter.score(module, dev_examples, dev_features, batch, device)
    results = {"task": adapter.display_name, "split": cfg.task.eval_split, "metrics": metrics,
               "main_metric": adapter.main_metric, "best_step": best["step"], "steps": trainer.step,
               "task_steps": steps, "rate": rate, "share": steps / max(trainer.step, 1),
               "max_steps": trainer.cfg.max_steps, "seed": cfg.train.seed, "train_examples": len(train_examples),
               "init": cfg.task.init or "random", "multitask_run": str(folder.parent.parent),
               "unit_scale": on_unit_scale(adapter, 1.0)}  # what the average multiplies the main metric by
    if len(train_features) != len(train_examples):  # QA: a long context is several windows, each drawn alone
        results["train_windows"] = len(train_features)
    if tuned:  # used by `ember evaluate` / `predict` on the task's folder (load_run_adapter)
        adapter.apply_tuned(tuned)
        atomic_write_text(folder / "tuned.json", json.dumps({**tuned, "tuned_on": cfg.task.eval_split}, indent=2))
        results["tuned"], results["metrics_untuned"] = tuned, untuned
    with torch.no_grad():
        others = score_other_splits(cfg, adapter, tokenizer, lambda examples, features, split: adapter.score(
            module, examples, features, batch, device))
    if others:  # e.g. CoNLL-2003 test, your own test file: never used to choose anything
        results["other_splits"] = others
    atomic_write_text(folder / "results.json", json.dumps(results, indent=2))
    return results


def write_summary(run_dir: Path, cfg: RunConfig, results: dict, trainer) -> dict:
    """RUN/results.json (everything), RUN/summary.json (one row per task) and the table printed."""
    rows = {name: {"task": r["task"], "main_metric": r["main_metric"], "value": r["metrics"][r["main_metric"]],
                   "best_step": r["best_step"], "rate": r["rate"], "share": r["share"],
                   # the main metric on each further labelled split (test), with the best-on-dev weights
                   **({"other_splits": {split: m[r["main_metric"]] for split, m in r["other_splits"].items()}}
                      if r.get("other_splits") else {})}
            for name, r in results.items()}
    average = float(np.mean([r["value"] * results[name]["unit_scale"] for name, r in rows.items()]))
    summary = {"tasks": rows, "average": average,
               "steps": trainer.step, "mixing": {"mixing": cfg.task.mixing, "limit": cfg.task.mixing_limit,
                                                 "temperature": cfg.task.mixing_temperature}}
    atomic_write_text(run_dir / "summary.json", json.dumps(summary, indent=2))
    everything = {"tasks": results, "average": summary["average"], "steps": trainer.step,
                  "max_steps": trainer.cfg.max_steps, "stopped_early": trainer.stopped_early,
                  "mixing": summary["mixing"], "seed": cfg.train.seed}
    atomic_write_text(run_dir / "results.json", json.dumps(everything, indent=2))
    print(f"{'task':<14}{'metric':<14}{'dev':>8}{'best step':>11}{'rate':>8}{'share':>8}  other splits")
    for name, r in rows.items():
        others = "  ".join(f"{split} {value:.4f}" for split, value in r.get("other_splits", {}).items())
        print(f"{name:<14}{r['main_metric']:<14}{r['value']:>8.4f}{r['best_step']:>11}{r['rate']:>8.3f}"
              f"{r['share']:>8.3f}  {others}".rstrip())
    print(f"{'average':<28}{summary['average']:>8.4f}   ({trainer.step} steps, {cfg.task.mixing} mixing)")
    from ember.train.plots import plot_metrics

    plot_metrics(run_dir)
    return everything
