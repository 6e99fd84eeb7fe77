"""`ember distill --method kd|pkd|tinybert --stage task`: a fine-tuned teacher run -> a student run.

The output is an ordinary fine-tuned run folder (config.yaml of kind "finetune", tokenizer,
best-on-dev ``model.safetensors`` of the student classifier, results.json), so
``ember evaluate`` / ``ember predict`` / ``ember finetune --init`` work on it. Extra files:
``distill.json`` (how it was distilled), ``teacher-logits.npz`` (the cached soft targets) and,
for TinyBERT, ``intermediate/`` (the intermediate-layer stage, itself resumable).

Training goes through the shared ``Trainer`` (exact resume, SIGTERM-safe): the trained module
is a ``TaskDistiller`` whose state holds the student and any learned projection.
"""

from __future__ import annotations

import dataclasses
import json
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from ember.config import RunConfig, TaskConfig, TrainConfig
from ember.distillation.kd import KDSettings, TaskDistiller
from ember.distillation.student import (
    check_same_recipe, check_same_tokenizer, count_parameters, init_from_teacher, student_config,
)
from ember.distillation.transfer_set import build_transfer_set, cached_teacher_logits
from ember.errors import EmberError
from ember.runs.checkpoint import atomic_write_text, load_weights, save_weights
from ember.data.in_memory import InMemoryData
from ember.train.checks import check_train_settings
from ember.train.length_groups import feature_groups, feature_lengths

# Per-method defaults (temperature, alpha); see each method's module for the sources.
METHOD_DEFAULTS = {"kd": (2.0, 1.0), "pkd": (5.0, 0.5), "tinybert": (1.0, 1.0)}


@dataclass
class TaskDistillOptions:
    teacher: Path
    out: Path
    method: str = "kd"
    student: str = ""  # preset name; "" / "teacher" = the teacher's shape
    student_layers: int = 0
    student_init: str = "random"  # random | teacher | a pre-trained run / HF folder
    unlabeled: list[str] = field(default_factory=list)
    max_unlabeled: int = 100_000
    train_limit: int | None = None
    task_unlabeled: int | None = None
    temperature: float | None = None
    alpha: float | None = None
    soft_loss: str = "ce"
    beta: float = 100.0
    pkd_strategy: str = "skip"
    epochs: float = 3.0
    intermediate_epochs: float | None = None
    train: TrainConfig = field(default_factory=TrainConfig)
    logits_cache: Path | None = None
    resume: bool = False
    overwrite: bool = False
    progress: bool = True


def _student_start(opts: TaskDistillOptions, teacher_cfg: RunConfig, teacher_module):
    """(student ModelConfig, classifier state dict to start from, or None for random init)."""
    from ember.runs.init import load_init

    if opts.student_init in ("random", "teacher"):
        cfg = student_config(teacher_cfg.model, opts.student, opts.student_layers)
        if opts.student_init == "random":
            return cfg, None
        from ember.runs.init import backbone_weights

        teacher_state = teacher_module.state_dict()
        state = {f"backbone.{k}": v for k, v in init_from_teacher(
            backbone_weights(teacher_state), teacher_cfg.model, cfg).items()}
        state.update({k: v.clone() for k, v in teacher_state.items() if k.startswith("classifier.")})
        return cfg, state
    if opts.student or opts.student_layers:
        raise EmberError("--student-init RUN takes the student's shape from RUN; drop --student/--student-layers")
    cfg, backbone, tokenizer = load_init(opts.student_init)
    check_same_tokenizer(tokenizer, Path(opts.teacher) / "tokenizer.json", "--student-init")
    return cfg, {f"backbone.{k}": v for k, v in backbone.items()}


def _build_student(cfg: RunConfig, adapter, state: dict | None, pad_id: int):
    from ember.tasks.task_model import build_task_module

    module = build_task_module(cfg, adapter, None, pad_id)
    if state is not None:
        missing, unexpected = module.load_state_dict(state, strict=False)
        bad = [m for m in missing if not m.startswith(("classifier.", "backbone.pooler."))]
        if bad or unexpected:
            raise EmberError(f"student weights do not fit (missing {bad[:3]}, unexpected {unexpected[:3]})")
    return module


def _layer_loss(method: str, opts: TaskDistillOptions, s, t):
    if method == "pkd":
        from ember.distillation.pkd import PatienceLoss

        return PatienceLoss(s.num_layers, t.num_layers, s.hidden_size, t.hidden_size, opts.pkd_strategy, opts.beta)
    from ember.distillation.tinybert import TinyBertLayerLoss

    return TinyBertLayerLoss(s.num_layers, t.num_layers, s.hidden_size, t.hidden_size)


def run_task_distillation(opts: TaskDistillOptions) -> dict:
    from ember.tasks.glue_adapter import GlueAdapter
    from ember.tasks.base import get_adapter, read_task_record, write_task_record
    from ember.tasks.batching import inference_progress
    from ember.tokenizers import load_tokenizer, special_token_ids
    from ember.config import ENCODER_FAMILIES
    from ember.tasks.task_model import load_task_module
    from ember.train.loop import Trainer, epoch_schedule
    from ember.runs.folder import load_run_config, prepare_run_dir, write_run_files

    if opts.method not in METHOD_DEFAULTS:
        raise EmberError(f"--method {opts.method!r} is not a task-level method; choose kd, pkd or tinybert")
    teacher_dir, out = Path(opts.teacher), Path(opts.out)
    teacher_cfg = load_run_config(teacher_dir, expect_kind="finetune")
    # Teacher and student read the same encoded transfer set, so both must take the encoders'
    # input layout: no family-specific inputs (XLNet's, GPT's) and no language ids (XLM's).
    knowledge = teacher_cfg.knowledge.graph or teacher_cfg.knowledge.entities
    if teacher_cfg.model.family not in ENCODER_FAMILIES or teacher_cfg.model.num_languages or knowledge:
        raise EmberError(f"{teacher_dir} holds a fine-tuned {teacher_cfg.model.family} model; task distillation "
                         "takes encoder teachers without language embeddings or knowledge inputs (BERT, "
                         "RoBERTa, ALBERT, ELECTRA, DistilBERT)")
    # a custom task: its task.json
    adapter = get_adapter(read_task_record(teacher_dir) or teacher_cfg.task.name, teacher_cfg.model)
    if not isinstance(adapter, GlueAdapter):
        raise EmberError(f"{teacher_dir} was fine-tuned on {adapter.display_name}; task distillation "
                         "supports sentence (pair) classification and regression tasks (GLUE-style)")
    tokenizer_path = teacher_dir / "tokenizer.json"
    tokenizer = load_tokenizer(tokenizer_path)
    pad_id = special_token_ids(tokenizer)["pad"]
    device = opts.train.device
    teacher = load_task_module(teacher_dir, teacher_cfg, adapter, pad_id).to(device)

    default_t, default_alpha = METHOD_DEFAULTS[opts.method]
    if opts.temperature is not None and opts.temperature <= 0:  # 0 was read as "the default" (2)
        raise EmberError(f"--temperature {opts.temperature:g}: the softmax temperature must be above 0")
    if opts.epochs <= 0:
        raise EmberError(f"--epochs {opts.epochs:g}: give a positive number of epochs over the transfer set")
    settings = KDSettings(temperature=default_t if opts.temperature is None else opts.temperature,
                          alpha=default_alpha if opts.alpha is None else opts.alpha, soft_loss=opts.soft_loss)
    model_cfg, start_state = _student_start(opts, teacher_cfg, teacher)
    max_length = teacher_cfg.task.max_length
    features, counts = build_transfer_set(adapter, tokenizer, max_length, opts.unlabeled, opts.max_unlabeled,
                                          opts.train_limit, keep_labels=settings.alpha < 1.0,
                                          task_unlabeled=opts.task_unlabeled)
    dev_examples, dev_features = adapter.load(teacher_cfg.task.eval_split, tokenizer, max_length)
    train_cfg, _ = epoch_schedule(opts.train, len(features), opts.epochs)
    task_cfg = TaskConfig(name=adapter.name, max_length=max_length, init=opts.student_init, epochs=opts.epochs,
                          eval_batch_size=teacher_cfg.task.eval_batch_size, eval_split=teacher_cfg.task.eval_split)
    cfg = RunConfig(model=model_cfg, train=train_cfg, kind="finetune", task=task_cfg)

    record = {"method": opts.method, "teacher": str(teacher_dir), "student": opts.student or "teacher",
              "student_layers": model_cfg.num_layers, "student_init": opts.student_init,
              "settings": dataclasses.asdict(settings), "transfer_set": counts, "unlabeled": opts.unlabeled,
              "train": {k: v for k, v in dataclasses.asdict(train_cfg).items() if k not in ("max_time", "device")}}
    if opts.method == "pkd":
        record.update(beta=opts.beta, pkd_strategy=opts.pkd_strategy)
    if opts.method == "tinybert":
        record["intermediate_epochs"] = opts.intermediate_epochs
    check_same_recipe(out, json.loads(json.dumps(record)), opts.resume)  # before anything is rewritten
    check_train_settings(train_cfg, "distill")
    init_dir = () if opts.student_init in ("random", "teacher") else (opts.student_init,)
    prepare_run_dir(out, opts.resume, opts.overwrite, inputs=(teacher_dir, *init_dir))
    write_run_files(out, cfg, tokenizer_path)
    atomic_write_text(out / "labels.json", json.dumps(adapter.label_names()))
    write_task_record(out, adapter)  # the student serves and evaluates on the teacher's custom task
    atomic_write_text(out / "distill.json", json.dumps(record, indent=2))

    batch = teacher_cfg.task.eval_batch_size

    def score(model):
        with inference_progress(f"evaluating {teacher_cfg.task.eval_split}", opts.progress):
            return adapter.score(model, dev_examples, dev_features, batch, device)

    def evaluate(m):  # the trainer's dev evaluations: the distiller's student
        return score(m.student)

    def save_best(m, metrics):
        save_weights(m.student.state_dict(), out / "model.safetensors", {"task": adapter.name})

    student = _build_student(cfg, adapter, start_state, pad_id)
    if opts.method == "tinybert":
        student = _tinybert_intermediate(opts, cfg, student, teacher, features, out)
    # Prediction-layer distillation. KD and TinyBERT's second step read cached soft targets;
    # PKD runs the teacher live (it needs its hidden states anyway).
    layer_loss, live_teacher = None, None
    if opts.method == "pkd":
        layer_loss, live_teacher = _layer_loss("pkd", opts, model_cfg, teacher_cfg.model), teacher
    else:
        cache = Path(opts.logits_cache) if opts.logits_cache else out / "teacher-logits.npz"
        logits = cached_teacher_logits(teacher, features, cache, teacher_dir / "model.safetensors", batch,
                                       device, opts.progress)
        features = [dict(f, teacher_logits=row) for f, row in zip(features, logits)]
    distiller = TaskDistiller(student, settings, teacher=live_teacher, layer_loss=layer_loss)
    params = {"student": count_parameters(student), "teacher": count_parameters(teacher)}
    print(f"distilling ({opts.method}) {adapter.display_name}: teacher {params['teacher'] / 1e6:.2f}M -> student "
          f"{params['student'] / 1e6:.2f}M parameters, {len(features):,} transfer examples, "
          f"{train_cfg.max_steps} steps, run folder {out}")
    trainer = Trainer(distiller, InMemoryData(features, feature_lengths(features), feature_groups(features)), train_cfg, out, evaluate=evaluate,
                      best_metric=adapter.main_metric, on_best=save_best, progress=opts.progress)
    trainer.train(resume=opts.resume)

    student.load_state_dict(load_weights(out / "model.safetensors"))
    final = score(student)
    teacher_metrics = score(teacher)
    main = adapter.main_metric
    results = {"task": adapter.display_name, "split": teacher_cfg.task.eval_split, "metrics": final,
               "main_metric": main,
               "teacher_metrics": teacher_metrics,
               "retained": final[main] / teacher_metrics[main] if teacher_metrics[main] else None,
               "parameters": params, "method": opts.method, "best_step": trainer.best["step"],
               "steps": trainer.step, "seed": train_cfg.seed, "train_examples": len(features),
               "init": opts.student_init}
    if not student.is_regression:
        s_pred = student.predict(dev_features, batch, device).argmax(-1)
        t_pred = teacher.predict(dev_features, batch, device).argmax(-1)
        results["dev_agreement"] = float(np.mean(s_pred == t_pred))
    atomic_write_text(out / "results.json", json.dumps(results, indent=2))
    return results


def _tinybert_intermediate(opts: TaskDistillOptions, cfg: RunConfig, student, teacher, features, out: Path):
    """TinyBERT task stage, step 1: intermediate layers only (prediction loss off), in OUT/intermediate.

    A finished step leaves OUT/intermediate/student.safetensors; a resumed run skips it then.
    """
    from ember.train.loop import Trainer, epoch_schedule

    stage_dir = out / "intermediate"
    done = stage_dir / "student.safetensors"
    if not done.is_file():
        epochs = opts.epochs if opts.intermediate_epochs is None else opts.intermediate_epochs
        stage_cfg, _ = epoch_schedule(cfg.train, len(features), epochs)
        stage_cfg = dataclasses.replace(stage_cfg, eval_every=0)
        steps = stage_cfg.max_steps
        settings = KDSettings(prediction_weight=0.0)
        distiller = TaskDistiller(student, settings, teacher=teacher,
                                  layer_loss=_layer_loss("tinybert", opts, cfg.model, teacher.backbone.config))
        print(f"TinyBERT step 1/2: intermediate-layer distillation, {steps} steps, in {stage_dir}")
        resume = opts.resume and (stage_dir / "checkpoints").is_dir()
        Trainer(distiller, InMemoryData(features), stage_cfg, stage_dir, progress=opts.progress).train(resume=resume)
        save_weights(student.state_dict(), done, {"stage": "tinybert-intermediate"})
    student.load_state_dict(load_weights(done))
    print("TinyBERT step 2/2: prediction-layer distillation")
    return student

