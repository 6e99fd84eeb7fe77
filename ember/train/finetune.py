"""`ember finetune` / `ember evaluate` for any task adapter (``ember.tasks.base``).

GLUE-style sentence (pair) classification and regression, CoNLL-2003 NER, SQuAD: the task's
adapter reads and featurizes the data, builds the head and scores; this module trains.
One run per seed: train with the task's BERT-paper defaults unless overridden, evaluate on
dev after every epoch, keep the best-on-dev weights in RUN/model.safetensors, and write
RUN/results.json. With several seeds, RUN/seed-N/ holds each run and RUN/summary.json the
mean and standard deviation of each metric (small GLUE tasks swing by points across seeds).

Options (``TaskConfig``/``TrainConfig``), for every backbone and task:
* ``task.features``: feature-based transfer - frozen encoder, learned ScalarMix, small head
  (``ember.tasks.feature_transfer``); the learned layer weights go to results.json.
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

import numpy as np
import torch
from torch import nn

from ember.config import RunConfig
from ember.errors import EmberError
from ember.models import build_backbone
from ember.tasks.base import GlueAdapter, TaskAdapter, get_adapter
from ember.tasks.classification import SequenceClassifier, predictions_from_logits
from ember.runs.checkpoint import atomic_write_text, load_weights, save_weights
from ember.train.layerwise import gradual_unfreezing, lr_scale_fn
from ember.train.loop import Trainer
from ember.runs.folder import load_run_config, prepare_run_dir, write_run_files


class FeatureData:
    def __init__(self, features: list[dict]) -> None:
        self.features = features

    def __len__(self) -> int:
        return len(self.features)

    def example(self, index: int, epoch: int) -> dict:
        return self.features[index]


def featurize_split(spec, split: str, tokenizer, max_length: int, path: str | None = None,
                    limit: int | None = None) -> tuple[list, list[dict]]:
    from ember.tasks.featurize import encode_examples
    from ember.tasks.glue import read_examples

    examples = read_examples(spec, split, path=path, limit=limit)
    features, n_truncated = encode_examples(examples, tokenizer, max_length)
    if n_truncated:
        print(f"{spec.display_name} {split}: truncated {n_truncated} of {len(examples)} examples "
              f"to {max_length} tokens (raise --max-length to keep more)")
    return examples, features


def score(module: SequenceClassifier, spec, features: list[dict], batch_size: int, device: str) -> dict:
    from ember.tasks.metrics import compute_metrics

    logits = module.predict(features, batch_size, device)
    preds = predictions_from_logits(logits, module.is_regression)
    labels = np.asarray([f["label"] for f in features])
    return compute_metrics(spec, preds, labels)


def pad_token_id(tokenizer) -> int:
    """The padding id; GPT-2's vocabulary has no pad token and pads with end-of-text
    (padding is masked, so any id works)."""
    from ember.tokenizers import end_of_text_id, special_token_ids

    try:
        return special_token_ids(tokenizer)["pad"]
    except EmberError:
        if tokenizer.token_to_id("<pad>") is not None:
            return tokenizer.token_to_id("<pad>")
        return end_of_text_id(tokenizer)


def build_task_module(cfg: RunConfig, adapter: TaskAdapter, state: dict | None, pad_id: int) -> nn.Module:
    """The task head on a fresh backbone, loaded with pre-trained ``state`` when given.

    Seeded with ``train.seed`` so the head's initialisation is part of the run's seed.
    Pooler weights may be missing (ELECTRA, DistilBERT and RoBERTa checkpoints have none).
    """
    torch.manual_seed(cfg.train.seed)
    backbone = build_backbone(cfg.model)
    if state is not None:
        missing, unexpected = backbone.load_state_dict(state, strict=False)
        if unexpected or [m for m in missing if not m.startswith("pooler.")]:
            raise EmberError(f"pre-trained weights do not fit the backbone (missing {missing[:3]}, "
                             f"unexpected {unexpected[:3]})")
    if cfg.task.features:
        from ember.tasks.feature_transfer import FeatureBackbone

        backbone = FeatureBackbone(backbone, cfg.task.feature_layers)
    return adapter.build_module(backbone, pad_id)


def check_options(cfg: RunConfig) -> None:
    """Refuse option combinations that cannot mean anything, before any work is done."""
    task = cfg.task
    if task.features and (task.layer_lr_decay != 1.0 or task.gradual_unfreeze):
        raise EmberError("--features freezes the whole encoder, so --layer-lr-decay and --gradual-unfreeze "
                         "have nothing to act on; drop them or drop --features")
    if task.feature_layers < 0 or task.patience < 0:
        raise EmberError(f"task.feature_layers ({task.feature_layers}) and task.patience ({task.patience}) "
                         "must be >= 0")
    if not 0.0 < task.layer_lr_decay <= 1.0:
        raise EmberError(f"--layer-lr-decay {task.layer_lr_decay} must be in (0, 1]: the factor each layer "
                         "below the head is multiplied by (ULMFiT's 'divide by 2.6' is 0.385)")


def build_classifier(cfg: RunConfig, spec, state: dict | None, pad_id: int) -> SequenceClassifier:
    """GLUE shortcut of ``build_task_module`` (``spec`` needs only ``num_labels``)."""
    return build_task_module(cfg, GlueAdapter(spec), state, pad_id)


def run_finetuning(cfg: RunConfig, run_dir: Path, state: dict | None, tokenizer_path: Path,
                   train_limit: int | None = None, overwrite: bool = False, resume: bool = False,
                   progress: bool = True) -> dict:
    from ember.tokenizers import load_tokenizer

    check_options(cfg)
    adapter = get_adapter(cfg.task.name, cfg.model)
    tokenizer = load_tokenizer(tokenizer_path)
    pad_id = pad_token_id(tokenizer)
    if cfg.task.max_length > cfg.model.max_position:
        raise EmberError(f"--max-length {cfg.task.max_length} exceeds the model's "
                         f"{cfg.model.max_position} positions")
    if cfg.task.train_split == cfg.task.eval_split:
        raise EmberError(f"training and evaluating on the same split ({cfg.task.train_split}) would "
                         "report training accuracy; choose different --train-split/--eval-split")
    _, train_features = adapter.load(cfg.task.train_split, tokenizer, cfg.task.max_length, limit=train_limit)
    dev_examples, dev_features = adapter.load(cfg.task.eval_split, tokenizer, cfg.task.max_length)
    steps_per_epoch = math.ceil(len(train_features) / cfg.train.batch_size)
    train_cfg = dataclasses.replace(
        cfg.train,
        max_steps=max(1, int(round(cfg.task.epochs * steps_per_epoch))),
        eval_every=cfg.train.eval_every or steps_per_epoch,
        save_every=cfg.train.save_every or steps_per_epoch,
    )
    cfg = dataclasses.replace(cfg, train=train_cfg, kind="finetune")
    if cfg.task.gradual_unfreeze and cfg.task.epochs < cfg.model.num_layers + 1:
        print(f"note: gradual unfreezing over {cfg.task.epochs:g} epochs trains only the head and the top "
              f"{math.ceil(cfg.task.epochs)} of {cfg.model.num_layers} layers; --epochs "
              f"{cfg.model.num_layers + 1} or more reaches the embeddings")
    prepare_run_dir(run_dir, resume, overwrite)
    write_run_files(run_dir, cfg, tokenizer_path)
    labels = adapter.label_names()
    if labels is not None:
        atomic_write_text(run_dir / "labels.json", json.dumps(labels))
    module = build_task_module(cfg, adapter, state, pad_id)
    device, batch = cfg.train.device, cfg.task.eval_batch_size

    def evaluate(m, examples=dev_examples, features=dev_features):
        return adapter.score(m, examples, features, batch, device)

    def save_best(m, metrics):
        save_weights(m.state_dict(), run_dir / "model.safetensors", {"task": adapter.name})

    # ULMFiT options: per-layer lr scales and the unfreezing hook, both functions of the step only.
    lr_scale = lr_scale_fn(module, cfg.task.layer_lr_decay) if cfg.task.layer_lr_decay != 1.0 else None
    unfreeze = gradual_unfreezing(module, steps_per_epoch) if cfg.task.gradual_unfreeze else None
    trainer = Trainer(module, FeatureData(train_features), train_cfg, run_dir, evaluate=evaluate,
                      best_metric=adapter.main_metric, on_best=save_best, progress=progress,
                      lr_scale=lr_scale, before_step=unfreeze, patience=cfg.task.patience)
    trainer.train(resume=resume)
    module.load_state_dict(load_weights(run_dir / "model.safetensors"))
    tuned = None
    if hasattr(adapter, "tune"):  # e.g. SQuAD 2.0's no-answer threshold, tuned with the best weights
        module.eval()
        with torch.no_grad():
            tuned, final, untuned = adapter.tune(module, dev_examples, dev_features, batch, device)
        if tuned:
            adapter.apply_tuned(tuned)
    else:
        final = evaluate(module)
    results = {"task": adapter.display_name, "split": cfg.task.eval_split, "metrics": final,
               "best_step": trainer.best["step"], "steps": trainer.step, "max_steps": train_cfg.max_steps,
               "stopped_early": trainer.stopped_early, "seed": cfg.train.seed,
               "train_examples": len(train_features), "init": cfg.task.init or "random"}
    if cfg.task.features:
        # ELMo's s_j (embedding output first, then layers 1..L) and gamma, as learned.
        results["scalar_mix"] = {"weights": module.backbone.layer_weights(),
                                 "gamma": float(module.backbone.mix.gamma.detach())}
    if tuned:
        # Kept with the weights and used by `ember evaluate`/`predict` (load_run_adapter); the
        # reported metrics use the tuned settings, the untuned ones are kept beside them.
        atomic_write_text(run_dir / "tuned.json", json.dumps({**tuned, "tuned_on": cfg.task.eval_split}, indent=2))
        results["tuned"], results["metrics_untuned"] = tuned, untuned
    # Further labelled splits (CoNLL-2003 test) scored once with the best-on-dev weights.
    others = [s for s in getattr(adapter, "report_splits", ()) if s not in (cfg.task.eval_split, cfg.task.train_split)]
    if others:
        results["other_splits"] = {
            split: evaluate(module, *adapter.load(split, tokenizer, cfg.task.max_length)) for split in others}
    atomic_write_text(run_dir / "results.json", json.dumps(results, indent=2))
    return results


def summarize_seeds(results: list[dict]) -> dict:
    names = results[0]["metrics"].keys()
    summary = {}
    for name in names:
        values = np.asarray([r["metrics"][name] for r in results], dtype=np.float64)
        # one seed has no spread: std None (shown as no "±", as glue_average does), not 0.0
        summary[name] = {"mean": float(values.mean()), "std": float(values.std(ddof=1)) if len(values) > 1 else None,
                         "median": float(np.median(values)), "values": values.tolist()}
    return summary


def evaluate_run(run_dir: Path, split: str = "", path: str | None = None, task: str = "") -> dict:
    """Score a fine-tuned run folder on a labelled split (or file) with the task's metric."""
    from ember.tokenizers import load_tokenizer

    cfg = load_run_config(run_dir, expect_kind="finetune")
    adapter = load_run_adapter(run_dir, cfg, task)
    split = split or cfg.task.eval_split
    tokenizer = load_tokenizer(Path(run_dir) / "tokenizer.json")
    module = load_task_module(run_dir, cfg, adapter, pad_token_id(tokenizer))
    examples, features = adapter.load(split, tokenizer, cfg.task.max_length, path=path)
    result = {"task": adapter.display_name, "split": split if path is None else str(path),
              "metrics": adapter.score(module, examples, features, cfg.task.eval_batch_size, cfg.train.device)}
    if getattr(adapter, "with_no_answer", False):  # SQuAD 2.0: say which threshold was used
        result["null_threshold"] = adapter.null_threshold
    return result


def load_run_adapter(run_dir: Path, cfg: RunConfig, task: str = "") -> TaskAdapter:
    """The run's task adapter with the settings tuned during fine-tuning (RUN/tuned.json)."""
    adapter = get_adapter(task or cfg.task.name, cfg.model)
    tuned_path = Path(run_dir) / "tuned.json"
    if tuned_path.is_file() and hasattr(adapter, "apply_tuned"):
        try:
            adapter.apply_tuned(json.loads(tuned_path.read_text()))
        except (ValueError, KeyError, TypeError) as exc:
            raise EmberError(f"{tuned_path}: unreadable ({exc}); delete it to use the task's defaults") from None
    return adapter


def load_task_module(run_dir: Path, cfg: RunConfig, adapter: TaskAdapter, pad_id: int) -> nn.Module:
    """The fine-tuned model of a run folder (RUN/model.safetensors), in eval mode."""
    backbone = build_backbone(cfg.model)
    if cfg.task.features:
        from ember.tasks.feature_transfer import FeatureBackbone

        backbone = FeatureBackbone(backbone, cfg.task.feature_layers)
    module = adapter.build_module(backbone, pad_id)
    state = load_weights(Path(run_dir) / "model.safetensors")
    try:
        module.load_state_dict(state)
    except RuntimeError as exc:
        raise EmberError(f"{run_dir}/model.safetensors does not fit a {adapter.display_name} model: "
                         f"{str(exc).splitlines()[0]}") from None
    return module.eval()


def load_classifier(run_dir: Path, cfg: RunConfig, spec, pad_id: int) -> nn.Module:
    return load_task_module(run_dir, cfg, get_adapter(spec, cfg.model), pad_id)
