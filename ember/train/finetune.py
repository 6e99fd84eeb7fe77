"""`ember finetune` / `ember evaluate` for any task adapter (``ember.tasks.base``).

GLUE-style sentence (pair) classification and regression, CoNLL-2003 NER, SQuAD: the task's
adapter reads and featurizes the data, builds the head and scores; this module trains.
One run per seed: train with the task's BERT-paper defaults unless overridden, evaluate on
dev after every epoch, keep the best-on-dev weights in RUN/model.safetensors, and write
RUN/results.json. With several seeds, RUN/seed-N/ holds each run and RUN/summary.json the
mean and standard deviation of each metric (small GLUE tasks swing by points across seeds).

Options (``TaskConfig``/``TrainConfig``), for every backbone and task:
* ``task.features``: feature-based transfer - frozen encoder, learned ScalarMix, small head
  (``ember.tasks.families.feature_transfer``); the learned layer weights go to results.json.
* ``task.layer_lr_decay``, ``task.gradual_unfreeze`` (``ember.train.layerwise``) and
  ``train.schedule=stlr`` (``ember.train.optim``): ULMFiT's discriminative fine-tuning,
  gradual unfreezing and slanted triangular learning rates.
* ``task.patience``: early stopping after N dev evaluations without a better main metric.
* SQuAD 2.0: the no-answer threshold tuned on dev is kept in RUN/tuned.json and used by
  ``ember evaluate`` / ``ember predict``.
"""

from __future__ import annotations

import dataclasses
import json
import math
from pathlib import Path

import torch

from ember.config import RunConfig
from ember.data.in_memory import InMemoryData
from ember.errors import EmberError
from ember.tasks.base import get_adapter, write_task_record
from ember.tasks.batching import inference_progress
from ember.tasks.families.knowledge import with_knowledge
from ember.tasks.task_model import build_task_module, pad_token_id
from ember.runs.checkpoint import atomic_write_text, load_weights, save_weights
from ember.train.layerwise import gradual_unfreezing, lr_scale_fn
from ember.train.length_groups import feature_groups, feature_lengths
from ember.train.loop import Trainer, epoch_schedule
from ember.runs.folder import check_resume_settings, load_run_config, prepare_run_dir, write_run_files


def check_options(cfg: RunConfig) -> None:
    """Refuse option combinations that cannot mean anything, before any work is done."""
    from ember.train.checks import check_train_settings

    check_train_settings(cfg.train)  # (one process only: ember.api.finetune refuses torchrun first)
    task = cfg.task
    if task.features and (task.layer_lr_decay != 1.0 or task.gradual_unfreeze):
        raise EmberError("--features freezes the whole encoder, so --layer-lr-decay and --gradual-unfreeze "
                         "have nothing to act on; drop them or drop --features")
    if task.feature_combine != "mix" and not task.features:
        raise EmberError(f"--feature-combine {task.feature_combine} chooses the frozen features of --features; "
                         "add --features")
    if task.feature_layers < 0 or task.patience < 0:
        raise EmberError(f"task.feature_layers ({task.feature_layers}) and task.patience ({task.patience}) "
                         "must be >= 0")
    if not 0.0 < task.layer_lr_decay <= 1.0:
        raise EmberError(f"--layer-lr-decay {task.layer_lr_decay} must be in (0, 1]: the factor each layer "
                         "below the head is multiplied by (ULMFiT's 'divide by 2.6' is 0.385)")


def check_lengths_and_splits(cfg: RunConfig) -> None:
    """Refuse inputs longer than the model's positions and a run scored on the split it trains on."""
    if cfg.task.max_length > cfg.model.max_position:
        raise EmberError(f"--max-length {cfg.task.max_length} exceeds the model's "
                         f"{cfg.model.max_position} positions")
    if cfg.task.train_split == cfg.task.eval_split:
        raise EmberError(f"training and evaluating on the same split ({cfg.task.train_split}) would "
                         "report training accuracy; choose different --train-split/--eval-split")


def write_task_files(run_dir: Path, adapter) -> None:
    """What rebuilds a run's task: RUN/task.json (a custom task) and RUN/labels.json (its output labels)."""
    write_task_record(run_dir, adapter)
    labels = adapter.label_names()
    if labels is not None:
        atomic_write_text(run_dir / "labels.json", json.dumps(labels))


def score_other_splits(cfg: RunConfig, adapter, tokenizer, score) -> dict:
    """Every further labelled split of a task (CoNLL-2003 test, NSMC test, your own --test file), each
    scored once by ``score(examples, features, split)`` with the best-on-dev weights; the split trained
    on and the split selected on are left out. Single-task and multi-task runs report them alike."""
    return {split: score(*adapter.load(split, tokenizer, cfg.task.max_length), split)
            for split in other_splits(cfg, adapter)}


def other_splits(cfg: RunConfig, adapter) -> list[str]:
    """The further labelled splits ``score_other_splits`` scores."""
    return [s for s in getattr(adapter, "report_splits", ()) if s not in (cfg.task.eval_split, cfg.task.train_split)]


def run_finetuning(cfg: RunConfig, run_dir: Path, state: dict | None, tokenizer_path: Path,
                   train_limit: int | None = None, overwrite: bool = False, resume: bool = False,
                   progress: bool = True, task=None) -> dict:
    """``task``: an adapter (a custom task on the user's files) instead of ``cfg.task.name``'s."""
    from ember.tokenizers import load_tokenizer

    check_options(cfg)
    # K-BERT / ERNIE inputs, if asked (ember.tasks.families.knowledge); a custom task's adapter from its files
    cfg, adapter = with_knowledge(cfg, get_adapter(task if task is not None else cfg.task.name, cfg.model,
                                                   cfg.task.language, cfg.task))
    if hasattr(adapter, "model_config"):  # a family that fine-tunes another shape (XLNet: no memory)
        cfg = dataclasses.replace(cfg, model=adapter.model_config(cfg.model))
    tokenizer = load_tokenizer(tokenizer_path)
    if hasattr(adapter, "run_tokenizer"):  # a family's own input layout (XLNet), kept in the run
        tokenizer = adapter.run_tokenizer(tokenizer)
    pad_id = pad_token_id(tokenizer)
    check_lengths_and_splits(cfg)
    train_examples, train_features = adapter.load(cfg.task.train_split, tokenizer, cfg.task.max_length,
                                                  limit=train_limit)
    dev_examples, dev_features = adapter.load(cfg.task.eval_split, tokenizer, cfg.task.max_length)
    train_cfg, steps_per_epoch = epoch_schedule(cfg.train, len(train_features), cfg.task.epochs)
    cfg = dataclasses.replace(cfg, train=train_cfg, kind="finetune")
    module = build_task_module(cfg, adapter, state, pad_id)  # a model that cannot be built: no folder written
    # ULMFiT options: per-layer lr scales and the unfreezing hook, both functions of the step only; built
    # here, so a model without layers to scale (T5's Text2TextModel) is refused before anything is written.
    lr_scale = lr_scale_fn(module, cfg.task.layer_lr_decay) if cfg.task.layer_lr_decay != 1.0 else None
    unfreeze = gradual_unfreezing(module, steps_per_epoch) if cfg.task.gradual_unfreeze else None
    if cfg.task.gradual_unfreeze and cfg.task.epochs < cfg.model.num_layers + 1:
        print(f"note: gradual unfreezing over {cfg.task.epochs:g} epochs trains only the head and the top "
              f"{math.ceil(cfg.task.epochs)} of {cfg.model.num_layers} layers; --epochs "
              f"{cfg.model.num_layers + 1} or more reaches the embeddings")
    if resume and (Path(run_dir) / "config.yaml").is_file():  # before config.yaml is rewritten
        check_resume_settings(load_run_config(run_dir), cfg, run_dir)
    prepare_run_dir(run_dir, resume, overwrite, inputs=(tokenizer_path,))  # the --init folder's tokenizer
    write_run_files(run_dir, cfg, tokenizer_path)
    if hasattr(adapter, "run_tokenizer"):
        atomic_write_text(run_dir / "tokenizer.json", tokenizer.to_str())
    if hasattr(adapter, "write_run_files"):  # what the adapter needs to rebuild its inputs (RUN/knowledge.tsv)
        adapter.write_run_files(run_dir)
    write_task_files(run_dir, adapter)
    device, batch = cfg.train.device, cfg.task.eval_batch_size

    def evaluate(m, examples=dev_examples, features=dev_features, split=cfg.task.eval_split):
        # a bar under the training bar while dev runs (minutes for SQuAD's questions or T5's decoding)
        with inference_progress(f"evaluating {split}", progress):
            return adapter.score(m, examples, features, batch, device)

    best_seen: dict = {}  # the metrics of the weights on disk, when this process evaluated them

    def save_best(m, metrics):
        save_weights(m.state_dict(), run_dir / "model.safetensors", {"task": adapter.name})
        best_seen["metrics"] = dict(metrics)

    # The trainer groups batches by length where the head's loss is one term per example
    # (classification, regression, QA's windows), not for a per-token loss (tagging, text-to-text:
    # a CoNLL tagger grouped stayed at all-O on one seed of three).
    train_data = InMemoryData(train_features, feature_lengths(train_features), feature_groups(train_features))
    trainer = Trainer(module, train_data, train_cfg, run_dir, evaluate=evaluate,
                      best_metric=adapter.main_metric, on_best=save_best, progress=progress,
                      lr_scale=lr_scale, before_step=unfreeze, patience=cfg.task.patience)
    trainer.train(resume=resume)
    module.load_state_dict(load_weights(run_dir / "model.safetensors"))
    tuned = None
    if hasattr(adapter, "tune"):  # e.g. SQuAD 2.0's no-answer threshold, tuned with the best weights
        module.eval()
        with torch.no_grad(), inference_progress(f"tuning on {cfg.task.eval_split}", progress):
            tuned, final, untuned = adapter.tune(module, dev_examples, dev_features, batch, device)
        if tuned:
            adapter.apply_tuned(tuned)
    elif "metrics" in best_seen and cfg.train.dtype in ("float32", "fp32"):
        # The trainer scored exactly these weights (fp32, eval mode, same data): a second pass
        # over the dev set would give the same numbers (test_evaluate_reloads_best_checkpoint_...).
        final = best_seen["metrics"]
    else:  # resumed after the best was saved, or trained under autocast: score the best weights now
        final = evaluate(module)
    results = {"task": adapter.display_name, "split": cfg.task.eval_split, "metrics": final,
               "main_metric": adapter.main_metric,  # the one the best epoch was chosen by (a sweep's objective)
               "best_step": trainer.best["step"], "steps": trainer.step, "max_steps": train_cfg.max_steps,
               "stopped_early": trainer.stopped_early, "seed": cfg.train.seed,
               "train_examples": len(train_examples), "init": cfg.task.init or "random"}
    if len(train_features) != len(train_examples):  # QA: a long context is several windows
        results["train_windows"] = len(train_features)
    if cfg.task.features:
        # ELMo's s_j (embedding output first, then layers 1..L) and gamma, as learned.
        backbone = module.backbone
        results["scalar_mix"] = {"combine": backbone.combine, "weights": backbone.layer_weights(),
                                 "gamma": float(backbone.mix.gamma.detach()) if backbone.combine == "mix" else None}
    if tuned:
        # Kept with the weights and used by `ember evaluate`/`predict` (load_run_adapter); the
        # reported metrics use the tuned settings, the untuned ones are kept beside them.
        atomic_write_text(run_dir / "tuned.json", json.dumps({**tuned, "tuned_on": cfg.task.eval_split}, indent=2))
        results["tuned"], results["metrics_untuned"] = tuned, untuned
    others = score_other_splits(cfg, adapter, tokenizer, lambda examples, features, split: evaluate(
        module, examples, features, split=split))
    if others:
        results["other_splits"] = others
    atomic_write_text(run_dir / "results.json", json.dumps(results, indent=2))
    from ember.train.plots import plot_metrics

    plot_metrics(run_dir)  # RUN/curves.png: the training loss and the dev metric, as a pre-training run has
    return results
