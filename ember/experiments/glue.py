"""`ember glue RUN_DIR`: fine-tune one model on every GLUE-style task present, over seeds.

What a GLUE table in the BERT-era papers reports, made with what is here:

* Tasks, in the papers' column order: MNLI-m, QQP, QNLI, SST-2, CoLA, STS-B, MRPC, RTE.
  MNLI and QQP are not in the data folder; SNLI stands in for MNLI (same three labels, same
  kind of sentence pairs). SNLI here has only dev and test, so it trains on dev and is
  scored on test (the only held-out labels left). QNLI has only its dev split here, so it
  runs only when a training file is given (``--train-file qnli=PATH``). Every other task
  trains on train and is scored on dev, as the papers report GLUE dev results; MRPC's test
  split, which has its labels here, is also scored once with the best-on-dev weights and shown
  in a row of its own (never chosen on).
* Settings: each task's ``BertHParams`` (Devlin et al. 2019, §4.1 and appendix A.3: batch
  32, 3 epochs, 10% warm-up, max length 128, lr 2e-5 from the paper's grid), with
  ``--lr/--epochs/--max-length/--train-limit`` applied to every task alike, through
  ``ember.finetune`` as every fine-tuning in ember.
* Seeds: one run per task and seed (``ember.finetune``: best-on-dev
  weights over the epochs), summarised as mean ± sample std and median.

Layout of OUT::

    OUT/glue_settings.json         the settings (a re-run must use the same ones)
    OUT/runs/<task>-seed<k>/       one fine-tuning run folder (results.json when finished)
    OUT/glue.md, glue.json, glue.png   rebuilt from the run folders after every run
                                   (``ember.experiments.glue_report``)

Re-running the same command skips finished runs and resumes an interrupted one from its
last checkpoint; adding seeds or tasks later runs only the new ones.
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass
from pathlib import Path

from ember.errors import EmberError
from ember.experiments.glue_report import BERT_RECIPE, GLUE_TASKS
from ember.fileio import atomic_write_text

# Tasks whose data lacks a train split: (train split, eval split) to use instead.
SPLITS = {"snli": ("dev", "test")}


@dataclass(frozen=True)
class TaskPlan:
    name: str
    train_split: str  # a split name, or a TSV file (--train-file)
    eval_split: str
    n_train: int = 0  # training examples used (after --train-limit)
    n_eval: int = 0
    missing: str = ""  # why the task is not run ("" when it is)


def parse_train_files(items: list[str]) -> dict[str, str]:
    """['qnli=/data/qnli/train.tsv'] -> {'qnli': '/data/qnli/train.tsv'} (checked)."""
    from ember.tasks.readers.glue import get_task

    out = {}
    for item in items:
        name, sep, path = item.partition("=")
        if not sep or not name or not path:
            raise EmberError(f"--train-file {item!r}: write TASK=PATH, e.g. qnli=data/QNLI/train.tsv")
        spec = get_task(name)
        if spec.name not in GLUE_TASKS:
            raise EmberError(f"--train-file {item!r}: {spec.display_name} is not a GLUE-table task")
        if not Path(path).is_file():
            raise EmberError(f"--train-file {item!r}: file not found: {path}")
        out[spec.name] = str(Path(path).resolve())
    return out


def plan_tasks(tasks: list[str], train_files: dict[str, str], train_limit: int | None,
               data_root: Path | None = None) -> list[TaskPlan]:
    """One plan per requested task: its splits and sizes, or why it cannot run here.

    A missing file makes a task "missing" (shown as "–" with the reason); a present but
    malformed file is an error, as everywhere in ember.
    """
    from ember import paths
    from ember.tasks.readers.glue import get_task, read_examples

    root = Path(data_root) if data_root is not None else paths.data_root()
    plans = []
    for name in tasks:
        spec = get_task(name)
        train, dev = SPLITS.get(spec.name, ("train", "dev"))
        train = train_files.get(spec.name, train)
        missing = ""
        if train not in spec.files and not Path(train).is_file():
            missing = (f"no training split here ({spec.display_name} has only "
                       f"{' and '.join(spec.files)}); pass --train-file {spec.name}=PATH to include it")
        else:
            for split in (train, dev):
                if split in spec.files and not (root / spec.folder / spec.files[split]).is_file():
                    missing = f"{spec.folder}/{spec.files[split]} not found under the data root {root}"
                    break
        if missing:
            plans.append(TaskPlan(spec.name, train, dev, missing=missing))
            continue
        n_train = len(read_examples(spec, train, data_root=root, limit=train_limit))
        n_eval = len(read_examples(spec, dev, data_root=root))
        plans.append(TaskPlan(spec.name, train, dev, n_train, n_eval))
    return plans


def check_settings(out: Path, settings: dict) -> None:
    """A re-run must continue the same table: same model and fine-tuning settings."""
    path = out / "glue_settings.json"
    if path.is_file():
        saved = json.loads(path.read_text())
        changed = [f"{k}: {saved.get(k)!r} then, {v!r} now" for k, v in settings.items() if saved.get(k) != v]
        if changed:
            raise EmberError(f"{out} holds GLUE runs made with other settings ({'; '.join(changed)}). "
                             "Re-run with the same settings to continue it, or choose another --out.")
    atomic_write_text(path, json.dumps(settings, indent=2))


def fine_tuning_recipe(model_cfg, task: str) -> str:
    """What the runs are fine-tuned with when no flag overrides it, in the report's words: the
    family's own defaults (a T5 run takes T5's Adafactor at a constant rate, not BERT's AdamW)."""
    from ember.tasks.base import get_adapter

    adapter = get_adapter(task, model_cfg)
    hp, train = adapter.hparams, getattr(adapter, "train_defaults", {})
    if train.get("optimizer") == "adafactor":
        return (f"T5's settings (Raffel et al. 2020, §3.1.3: Adafactor at a constant lr {hp.learning_rate:g}, no "
                f"warm-up; batch {hp.batch_size}, {hp.epochs:g} epochs, max length {hp.max_length}, outputs "
                "decoded as text and parsed back)")
    if model_cfg.family == "lstm":  # Dai & Le's LSTMs: BERT's schedule at an LSTM's learning rate
        return (f"an LSTM's settings (lr {hp.learning_rate:g}, batch {hp.batch_size}, {hp.epochs:g} epochs, "
                f"{hp.warmup_ratio:.0%} warm-up, max length {hp.max_length})")
    return BERT_RECIPE


def run_glue(init: str, out: str | Path, tasks: list[str] | None = None, seeds: list[int] = (1, 2, 3),
             train_limit: int | None = None, epochs: float | None = None, max_length: int | None = None,
             lr: float | None = None, train_files: dict[str, str] | None = None, model: str = "",
             tokenizer: str = "", device: str = "cpu", num_threads: int = 0, progress: bool = True) -> dict:
    """Fine-tune ``init`` on every requested task present, for every seed; write the report.

    Returns glue.json's content plus ``ran``: how many fine-tuning runs this call ran.
    """
    from ember.api import finetune
    from ember.experiments.common import Clock, prepare_folder
    from ember.experiments.glue_report import write_reports
    from ember.runs.init import load_init
    from ember.tasks.readers.glue import get_task

    out = Path(out)
    tasks = [get_task(t).name for t in (tasks or GLUE_TASKS)]
    unknown = [t for t in tasks if t not in GLUE_TASKS]
    if unknown or len(set(tasks)) != len(tasks):
        raise EmberError(f"--tasks must list distinct GLUE-table tasks ({', '.join(GLUE_TASKS)}); "
                         f"got {', '.join(tasks)}")
    seeds = list(seeds)
    if not seeds or len(set(seeds)) != len(seeds):
        raise EmberError(f"give distinct seeds, e.g. --seeds 1,2,3 (got {seeds})")
    if train_limit is not None and train_limit <= 0:
        raise EmberError("--train-limit must be positive")
    model_cfg = load_init(init, model, tokenizer).model
    train_files = train_files or {}
    plans = plan_tasks(tasks, train_files, train_limit)
    for plan in plans:
        length = max_length or get_task(plan.name).bert_hparams.max_length
        if not plan.missing and length > model_cfg.max_position:
            raise EmberError(f"max length {length} exceeds the model's {model_cfg.max_position} positions; "
                             "pass a smaller --max-length")
    init_id = "random" if init in ("", "random") else str(Path(init).resolve())
    settings = {"init": init_id, "model": model if init_id == "random" else "", "lr": lr, "epochs": epochs,
                "max_length": max_length, "train_limit": train_limit, "train_files": train_files}
    check_settings(out, settings)
    label = f"random {model}" if init_id == "random" else Path(init_id).name
    if label == "pretrain":  # `ember compare` names every pre-training folder so: say whose it is
        label = f"{Path(init_id).parent.name}/{label}"
    meta = {"model": label, "settings": settings, "seeds": seeds, "tasks": tasks,
            "recipe": fine_tuning_recipe(model_cfg, tasks[0])}

    def report():
        return write_reports(out, plans, meta)

    runnable = [p for p in plans if not p.missing]
    if not runnable:  # nothing to fine-tune: an all-dash table and exit 0 said nothing was wrong
        raise EmberError("no task's data was found: " + "; ".join(
            f"{get_task(p.name).display_name}: {p.missing}" for p in plans) + " (EMBER_DATA points at the data root)")
    todo = [(label, p.name, seed) for p in runnable for seed in seeds
            if not (out / "runs" / f"{p.name}-seed{seed}" / "results.json").is_file()]
    clock = Clock(0.0, {p.name: p.n_train for p in runnable}, epochs, name="glue")
    clock.say(f"{label}: {len(runnable)} tasks present ({', '.join(p.name for p in runnable) or 'none'}), "
              f"{len(todo)} of {len(runnable) * len(seeds)} runs to do")
    for plan in plans:
        if plan.missing:
            clock.say(f"{get_task(plan.name).display_name}: skipped, {plan.missing}")
    by_name = {p.name: p for p in runnable}
    for i, (_, task, seed) in enumerate(todo, 1):
        plan, spec = by_name[task], get_task(task)
        clock.status(f"fine-tuning {i}/{len(todo)}: {spec.display_name}, seed {seed}", 0, todo[i - 1:])
        run_dir = out / "runs" / f"{task}-seed{seed}"
        resume = prepare_folder(run_dir)
        started = time.time()
        result = finetune(task, run_dir, init_id, model=model, tokenizer=tokenizer, seeds=[seed],
                          train_limit=train_limit, resume=resume, progress=progress, lr=lr, epochs=epochs,
                          max_length=max_length, train_split=plan.train_split, eval_split=plan.eval_split,
                          device=device, num_threads=num_threads).result
        clock.finished_finetune(task, time.time() - started)
        shown = "  ".join(f"{k}={v:.4f}" for k, v in result["metrics"].items())
        tested = result.get("other_splits", {}).get("test")  # MRPC's labelled test: reported, not chosen on
        shown += ("; test " + "  ".join(f"{k}={v:.4f}" for k, v in tested.items())) if tested else ""
        clock.say(f"{spec.display_name} {result['split']} seed {seed}: {shown}")
        report()
    results = report()
    clock.say(f"ran {len(todo)} fine-tuning runs; table: {out / 'glue.md'} (also glue.json, glue.png)")
    return {**results, "ran": len(todo)}
