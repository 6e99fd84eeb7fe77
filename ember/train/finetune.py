"""`ember finetune` / `ember evaluate`: GLUE-style sentence (pair) classification and regression.

One run per seed: train with the task's BERT-paper defaults unless overridden, evaluate on
dev after every epoch, keep the best-on-dev weights in RUN/model.safetensors, and write
RUN/results.json. With several seeds, RUN/seed-N/ holds each run and RUN/summary.json the
mean and standard deviation of each metric (small GLUE tasks swing by points across seeds).
"""

from __future__ import annotations

import dataclasses
import json
import math
from pathlib import Path

import numpy as np
import torch

from ember.config import RunConfig
from ember.errors import EmberError
from ember.models import build_backbone
from ember.tasks.classification import SequenceClassifier, predictions_from_logits
from ember.train.checkpoint import atomic_write_text, load_weights, save_weights
from ember.train.loop import Trainer
from ember.train.rundir import load_run_config, prepare_run_dir, write_run_files


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


def build_classifier(cfg: RunConfig, spec, state: dict | None, pad_id: int) -> SequenceClassifier:
    torch.manual_seed(cfg.train.seed)
    backbone = build_backbone(cfg.model)
    if state is not None:
        missing, unexpected = backbone.load_state_dict(state, strict=False)
        if unexpected or [m for m in missing if not m.startswith("pooler.")]:
            raise EmberError(f"pre-trained weights do not fit the backbone (missing {missing[:3]}, "
                             f"unexpected {unexpected[:3]})")
    return SequenceClassifier(backbone, spec.num_labels, pad_id)


def run_finetuning(cfg: RunConfig, run_dir: Path, state: dict | None, tokenizer_path: Path,
                   train_limit: int | None = None, overwrite: bool = False, resume: bool = False,
                   progress: bool = True) -> dict:
    from ember.tasks.glue import get_task
    from ember.tokenizers import load_tokenizer, special_token_ids

    spec = get_task(cfg.task.name)
    tokenizer = load_tokenizer(tokenizer_path)
    pad_id = special_token_ids(tokenizer)["pad"]
    if cfg.task.max_length > cfg.model.max_position:
        raise EmberError(f"--max-length {cfg.task.max_length} exceeds the model's "
                         f"{cfg.model.max_position} positions")
    if cfg.task.train_split == cfg.task.eval_split:
        raise EmberError(f"training and evaluating on the same split ({cfg.task.train_split}) would "
                         "report training accuracy; choose different --train-split/--eval-split")
    _, train_features = featurize_split(spec, cfg.task.train_split, tokenizer, cfg.task.max_length,
                                        limit=train_limit)
    _, dev_features = featurize_split(spec, cfg.task.eval_split, tokenizer, cfg.task.max_length)
    steps_per_epoch = math.ceil(len(train_features) / cfg.train.batch_size)
    train_cfg = dataclasses.replace(
        cfg.train,
        max_steps=max(1, int(round(cfg.task.epochs * steps_per_epoch))),
        eval_every=cfg.train.eval_every or steps_per_epoch,
        save_every=cfg.train.save_every or steps_per_epoch,
    )
    cfg = dataclasses.replace(cfg, train=train_cfg, kind="finetune")
    prepare_run_dir(run_dir, resume, overwrite)
    write_run_files(run_dir, cfg, tokenizer_path)
    labels = list(spec.label_names or spec.labels) if spec.labels else ["score"]
    atomic_write_text(run_dir / "labels.json", json.dumps(labels))
    module = build_classifier(cfg, spec, state, pad_id)
    device, batch = cfg.train.device, cfg.task.eval_batch_size

    def save_best(m, metrics):
        save_weights(m.state_dict(), run_dir / "model.safetensors", {"task": spec.name})

    trainer = Trainer(module, FeatureData(train_features), train_cfg, run_dir,
                      evaluate=lambda m: score(m, spec, dev_features, batch, device),
                      best_metric=spec.main_metric, on_best=save_best, progress=progress)
    trainer.train(resume=resume)
    module.load_state_dict(load_weights(run_dir / "model.safetensors"))
    final = score(module, spec, dev_features, batch, device)
    results = {"task": spec.display_name, "split": cfg.task.eval_split, "metrics": final,
               "best_step": trainer.best["step"], "steps": trainer.step, "seed": cfg.train.seed,
               "train_examples": len(train_features), "init": cfg.task.init or "random"}
    atomic_write_text(run_dir / "results.json", json.dumps(results, indent=2))
    return results


def summarize_seeds(results: list[dict]) -> dict:
    names = results[0]["metrics"].keys()
    summary = {}
    for name in names:
        values = np.asarray([r["metrics"][name] for r in results], dtype=np.float64)
        summary[name] = {"mean": float(values.mean()), "std": float(values.std(ddof=1)) if len(values) > 1 else 0.0,
                         "median": float(np.median(values)), "values": values.tolist()}
    return summary


def evaluate_run(run_dir: Path, split: str = "", path: str | None = None, task: str = "") -> dict:
    """Score a fine-tuned run folder on a labelled split (or file) with the task's metric."""
    from ember.tasks.glue import get_task
    from ember.tokenizers import load_tokenizer, special_token_ids

    cfg = load_run_config(run_dir, expect_kind="finetune")
    spec = get_task(task or cfg.task.name)
    split = split or cfg.task.eval_split
    tokenizer = load_tokenizer(Path(run_dir) / "tokenizer.json")
    module = load_classifier(run_dir, cfg, spec, special_token_ids(tokenizer)["pad"])
    _, features = featurize_split(spec, split, tokenizer, cfg.task.max_length, path=path)
    return {"task": spec.display_name, "split": split if path is None else str(path),
            "metrics": score(module, spec, features, cfg.task.eval_batch_size, cfg.train.device)}


def load_classifier(run_dir: Path, cfg: RunConfig, spec, pad_id: int) -> SequenceClassifier:
    module = SequenceClassifier(build_backbone(cfg.model), spec.num_labels, pad_id)
    state = load_weights(Path(run_dir) / "model.safetensors")
    try:
        module.load_state_dict(state)
    except RuntimeError as exc:
        raise EmberError(f"{run_dir}/model.safetensors does not fit a {spec.display_name} classifier: "
                         f"{str(exc).splitlines()[0]}") from None
    return module.eval()
