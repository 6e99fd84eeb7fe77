"""``ember.finetune``: a task and a starting point -> fine-tuned run folder(s), one per seed.

The task's own defaults come first (BERT's, Devlin et al. 2019 §4 and App. A.3: batch 32,
3 epochs, 10% warm-up, max length 128, lr 2e-5; NER and SQuAD have theirs), then the
keyword settings, then ``section.key=value`` overrides. A pre-trained starting point fixes the
model's shape: ``model.*`` overrides may change only dropout and initialisation then.
`ember finetune`, `ember compare`, `ember glue` and the quickstart all fine-tune through here.
"""

from __future__ import annotations

import json
from pathlib import Path

from ember.api.results import RunResult
from ember.config import ModelConfig, RunConfig
from ember.errors import EmberError

# keyword setting -> the config field it sets
SETTINGS = {
    "lr": "train.lr", "batch_size": "train.batch_size", "warmup_ratio": "train.warmup_ratio",
    "schedule": "train.schedule", "device": "train.device", "dtype": "train.dtype",
    "max_time": "train.max_time", "num_threads": "train.num_threads",
    "epochs": "task.epochs", "max_length": "task.max_length", "train_split": "task.train_split",
    "eval_split": "task.eval_split", "features": "task.features", "feature_layers": "task.feature_layers",
    "layer_lr_decay": "task.layer_lr_decay", "gradual_unfreeze": "task.gradual_unfreeze",
    "patience": "task.patience",
}
# ULMFiT (Howard & Ruder 2018): discriminative lr (divide by 2.6 per layer, §3.2), slanted
# triangular rates (§3.2) and gradual unfreezing (§3.3); explicit settings win.
ULMFIT = {"layer_lr_decay": 1 / 2.6, "schedule": "stlr", "gradual_unfreeze": True}
# Model settings that leave the weights' shapes and meaning alone: the only ones a pre-trained
# init can take from overrides (the rest come from its checkpoint).
FREE_MODEL_SETTINGS = ("dropout", "attention_dropout", "initializer_range")


def model_with_overrides(model_cfg: ModelConfig, overrides: list[str], pretrained: bool) -> ModelConfig:
    """Apply ``model.K=V`` overrides to the starting point's model config (random init: any)."""
    from ember.config import apply_overrides, run_config_from_dict, to_dict

    sets = [o for o in overrides if o.startswith("model.")]
    if not sets:
        return model_cfg
    values = apply_overrides(to_dict(RunConfig(kind="finetune", model=model_cfg)), sets)
    changed = run_config_from_dict(values, where="--set").model
    if pretrained:
        fixed = [k for k in to_dict(model_cfg) if k not in FREE_MODEL_SETTINGS
                 and getattr(changed, k) != getattr(model_cfg, k)]
        if fixed:
            raise EmberError(f"--set model.{fixed[0]}: a pre-trained init fixes the model's shape "
                             f"(its checkpoint has {fixed[0]}={getattr(model_cfg, fixed[0])!r}); only "
                             f"{', '.join('model.' + k for k in FREE_MODEL_SETTINGS)} can change here")
    return changed


def finetune_config(task: str, model_cfg: ModelConfig, init: str = "random", seed: int | None = None,
                    overrides: list[str] | tuple[str, ...] = (), ulmfit: bool = False, **settings) -> RunConfig:
    """The RunConfig of one fine-tuning run (see the module docstring)."""
    import dataclasses

    from ember.config import apply_overrides, run_config_from_dict, to_dict
    from ember.tasks.base import get_adapter
    from ember.tasks.glue import BertHParams

    unknown = sorted(set(settings) - set(SETTINGS))
    if unknown:
        raise EmberError(f"unknown fine-tuning setting(s) {unknown}; known: {', '.join(sorted(SETTINGS))} "
                         "(or pass section.key=value overrides)")
    adapter = get_adapter(task)
    hp = getattr(adapter, "hparams", BertHParams())
    values = to_dict(RunConfig(kind="finetune"))
    values["train"].update(lr=hp.learning_rate, batch_size=hp.batch_size, warmup_ratio=hp.warmup_ratio,
                           weight_decay=0.01, eval_every=0, save_every=0, log_every=20, adam_eps=1e-8)
    values["task"].update(name=adapter.name, max_length=hp.max_length, epochs=hp.epochs, init=str(init))
    chosen = {**(ULMFIT if ulmfit else {}), **{k: v for k, v in settings.items() if v is not None}}
    dotted = [f"{SETTINGS[k]}={v}" for k, v in chosen.items()]
    dotted += [o for o in overrides if not o.startswith("model.")]
    dotted += [f"train.seed={seed}"] if seed is not None else []
    cfg = run_config_from_dict(apply_overrides(values, dotted), where="fine-tuning settings")
    return dataclasses.replace(cfg, model=model_cfg)


def finetune(task: str, out: str | Path, init="random", *, model: str = "", tokenizer: str = "",
             seeds: list[int] | None = None, train_limit: int | None = None,
             overrides: list[str] | tuple[str, ...] = (), resume: bool = False, overwrite: bool = False,
             progress: bool = True, ulmfit: bool = False, train_file: str | Path | None = None,
             dev_file: str | Path | None = None, test_file: str | Path | None = None,
             text_column: str | None = None, text_pair_column: str | None = None,
             label_column: str | None = None, **settings) -> RunResult:
    """Fine-tune on ``task`` from ``init`` (a pre-training run, an HF folder, ``"random"`` with
    ``model``/``tokenizer``, or an ``ember.runs.init.Init``) into ``out``; with several ``seeds``,
    one run per seed in ``out/seed-N`` and their summary in ``out/summary.json``.

    ``task`` is a built-in task (sst2, conll2003, squad2, ...) or one of your own files' kinds
    (classify, pair, regression, tag, qa: ``ember.tasks.custom``) with ``train_file`` and
    ``dev_file`` (``test_file`` is scored once with the best weights) and, for tables, the
    columns (default: the usual names, e.g. text/sentence and label).

    >>> result = ember.finetune("sst2", "runs/sst2", init="runs/bert-mini", lr=1e-4,
    ...                         seeds=[1, 2, 3])  # doctest: +SKIP
    >>> result.summary["accuracy"]["mean"]  # doctest: +SKIP
    >>> ember.finetune("classify", "runs/tickets", init="runs/bert-mini", train_file="train.csv",
    ...                dev_file="dev.csv", text_column="body", label_column="queue")  # doctest: +SKIP
    """
    from ember.runs.init import load_init
    from ember.tasks.metrics import summarize_seeds
    from ember.train.finetune import run_finetuning

    out = Path(out)
    task = task_adapter(task, train_file, dev_file, test_file, text_column, text_pair_column, label_column,
                        resume_from=out if resume else None)
    start = load_init(init, model, tokenizer)
    model_cfg = model_with_overrides(start.model, list(overrides), pretrained=start.state is not None)
    init_id = init if isinstance(init, (str, Path)) else "random" if start.state is None else "given"
    seeds = list(seeds) if seeds else [None]
    if len(set(seeds)) != len(seeds):
        raise EmberError(f"seeds {seeds} repeat a seed; give distinct seeds, e.g. 1,2,3")
    results = []
    for seed in seeds:
        cfg = finetune_config(task, model_cfg, str(init_id), seed, overrides, ulmfit, **settings)
        run_dir = out / f"seed-{cfg.train.seed}" if len(seeds) > 1 else out
        result = run_finetuning(cfg, run_dir, start.state, start.tokenizer, train_limit, overwrite=overwrite,
                                resume=resume, progress=progress, task=None if isinstance(task, str) else task)
        results.append(result)
        _report(result, cfg, run_dir)
    if len(results) == 1:
        return RunResult(out, results[0]["metrics"], results)
    summary = {"task": results[0]["task"], "seeds": seeds, "metrics": summarize_seeds(results)}
    if "other_splits" in results[0]:  # e.g. CoNLL-2003 test
        summary["other_splits"] = {split: summarize_seeds([{"metrics": r["other_splits"][split]} for r in results])
                                   for split in results[0]["other_splits"]}
    out.mkdir(parents=True, exist_ok=True)
    (out / "summary.json").write_text(json.dumps(summary, indent=2))
    splits = {results[0]["split"]: summary["metrics"], **summary.get("other_splits", {})}
    for split, metrics in splits.items():
        for name, s in metrics.items():
            spread = f" ± {s['std']:.4f}" if s["std"] is not None else ""
            print(f"{summary['task']} {split} {name}: mean {s['mean']:.4f}{spread} "
                  f"(median {s['median']:.4f}, {len(seeds)} seeds)")
    means = {name: s["mean"] for name, s in summary["metrics"].items()}
    return RunResult(out, means, results, summary["metrics"])


def task_adapter(task, train_file=None, dev_file=None, test_file=None, text_column=None,
                 text_pair_column=None, label_column=None, resume_from: Path | None = None):
    """``task`` itself, or the adapter of a custom task on the given files (read and checked now,
    before any run folder is touched); resuming without files, the run's own task.json."""
    from ember.tasks.base import CUSTOM_TASKS, get_adapter, read_task_record

    files = (train_file, dev_file, test_file, text_column, text_pair_column, label_column)
    if isinstance(task, str) and task.lower() in CUSTOM_TASKS:
        from ember.tasks.custom import custom_task

        if resume_from is not None and train_file is None and dev_file is None:
            runs = [resume_from, *sorted(resume_from.glob("seed-*"))]  # one run, or one per seed
            record = next((r for r in map(read_task_record, runs) if r is not None), None)
            if record is not None and record.get("kind") == task.lower():
                return get_adapter(record)

        return custom_task(task.lower(), train_file, dev_file, test_file, text_column, text_pair_column,
                           label_column)
    if any(f is not None for f in files):
        raise EmberError(f"--train/--dev/--test and the column options are for your own files with --task "
                         f"{'|'.join(CUSTOM_TASKS)}; {task} reads its own data (a file in its layout: "
                         "--train-split FILE)")
    return task


def _report(result: dict, cfg: RunConfig, run_dir: Path) -> None:
    """The lines `ember finetune` prints after each seed."""
    metrics = "  ".join(f"{k}={v:.4f}" for k, v in result["metrics"].items())
    print(f"{result['task']} {result['split']} (seed {cfg.train.seed}): {metrics}")
    if result.get("stopped_early"):
        print(f"stopped early at step {result['steps']} of {result['max_steps']} (patience "
              f"{cfg.task.patience}); best step {result['best_step']}")
    if "scalar_mix" in result:
        weights = " ".join(f"{w:.3f}" for w in result["scalar_mix"]["weights"])
        print(f"learned layer weights (embeddings first): {weights}  gamma={result['scalar_mix']['gamma']:.3f}")
    if result.get("tuned"):
        settings = "  ".join(f"{k}={v:.4f}" for k, v in result["tuned"].items())
        print(f"tuned on {result['split']}: {settings} (saved in {run_dir}/tuned.json; "
              "ember evaluate/predict use it; the metrics above use it too)")
    for split, other in result.get("other_splits", {}).items():
        metrics = "  ".join(f"{k}={v:.4f}" for k, v in other.items())
        print(f"{result['task']} {split} (seed {cfg.train.seed}, best-on-{result['split']} weights): {metrics}")
