"""``ember.distill``: a teacher run -> a smaller student run (KD, DistilBERT, TinyBERT, Patient KD).

Task-level methods (``kd``, ``pkd``, ``tinybert`` with ``stage="task"``) take a fine-tuned teacher
and write a fine-tuned student (``ember.distillation.task_run``); corpus-level ones (``distilbert``,
``tinybert`` with ``stage="general"``) take a pre-trained teacher and a prepared corpus and write
a pre-training run for ``ember.finetune(init=...)`` (``ember.distillation.pretrain_run``). Training
defaults differ by level: task-level as fine-tuning (lr 5e-5, 10% warm-up, evaluation each
epoch), corpus-level as pre-training (lr 5e-4, 10k steps, 1% warm-up).
"""

from __future__ import annotations

from pathlib import Path

from ember.api.arguments import folder_arg, strings_arg
from ember.api.caller_state import keeps_caller_state
from ember.api.results import RunResult
from ember.errors import EmberError

TASK_METHODS = ("kd", "pkd", "tinybert")
CORPUS_DEFAULTS = {"lr": 5e-4, "max_steps": 10000, "warmup_ratio": 0.01, "eval_every": 500, "save_every": 500}
TASK_DEFAULTS = {"lr": 5e-5, "warmup_ratio": 0.1, "eval_every": 0, "save_every": 0, "log_every": 20,
                 "adam_eps": 1e-8}


def is_corpus_level(method: str, stage: str = "task") -> bool:
    if method not in TASK_METHODS + ("distilbert",):
        raise EmberError(f"unknown distillation method {method!r}; choose kd, distilbert, tinybert or pkd")
    return method == "distilbert" or (method == "tinybert" and stage == "general")


def distill_train_config(corpus_level: bool, overrides: list[str] | tuple[str, ...] = (), **train):
    """The TrainConfig of a distillation run: the level's defaults, ``train`` keywords
    (lr, batch_size, warmup_ratio, max_steps), then ``train.K=V`` overrides."""
    from ember.config import TrainConfig, apply_overrides, run_config_from_dict, to_dict

    values = {"train": {**to_dict(TrainConfig()), **(CORPUS_DEFAULTS if corpus_level else TASK_DEFAULTS),
                        **{k: v for k, v in train.items() if v is not None}}}
    ignored = [o for o in overrides if not o.startswith("train.")]
    if ignored:  # they were dropped without a word (--set data.eval_examples=8 did nothing)
        raise EmberError(f"distillation takes train.* overrides only; {', '.join(ignored)} would not be used (the "
                         "student's shape comes from --student / --student-layers, its inputs from the teacher)")
    values = apply_overrides(values, overrides)
    return run_config_from_dict(values, where="distill settings").train


@keeps_caller_state
def distill(method: str, teacher: str | Path, out: str | Path, *, stage: str = "task", data: str | Path | None = None,
            unlabeled: list[str] | tuple[str, ...] = (), overrides: list[str] | tuple[str, ...] = (),
            lr: float | None = None, batch_size: int | None = None, warmup_ratio: float | None = None,
            max_steps: int | None = None, distilbert_weights: tuple[float, float, float] = (5.0, 2.0, 1.0),
            resume: bool = False, overwrite: bool = False, progress: bool = True, **options) -> RunResult:
    """Distil ``teacher`` into a student in ``out``. ``options`` are the method's settings
    (``ember.distillation.task_run.TaskDistillOptions``: student, student_layers, student_init,
    max_unlabeled, train_limit, task_unlabeled, temperature, alpha, soft_loss, beta, pkd_strategy,
    epochs, intermediate_epochs, logits_cache; corpus level: student, student_layers, student_init).

    >>> result = ember.distill("kd", "runs/sst2", "runs/sst2-kd", student="bert-tiny",
    ...                        unlabeled=["task"])  # doctest: +SKIP
    """
    from ember.train.loop import use_threads
    from ember.train.tracking import finish_tracking

    teacher, out = folder_arg(teacher, "teacher"), folder_arg(out, "out")
    overrides, unlabeled = strings_arg(overrides, "overrides"), strings_arg(unlabeled, "unlabeled")
    corpus_level = is_corpus_level(method, stage)
    if not corpus_level:
        from ember.train.checks import refuse_step_budget

        refuse_step_budget(overrides, max_steps, f"task-level distillation ({method})")
    check_teacher_family(teacher)
    train = distill_train_config(corpus_level, overrides, lr=lr, batch_size=batch_size,
                                 warmup_ratio=warmup_ratio, max_steps=max_steps)
    use_threads(train.num_threads)  # now, not at the Trainer: the teacher labels the transfer set first
    common = dict(teacher=Path(teacher), out=Path(out), method=method, train=train, resume=resume,
                  overwrite=overwrite, progress=progress)
    if corpus_level:
        from ember.distillation.distilbert import DistilBertWeights
        from ember.distillation.pretrain_run import PretrainDistillOptions, run_pretrain_distillation
        from ember.runs.folder import last_evaluation

        if not data:
            raise EmberError(f"--method {method} distils on a corpus: pass --data PREPARED (from `ember prepare`)")
        if unlabeled:
            raise EmberError("--unlabeled is for task-level methods; corpus-level ones read --data")
        temperature = options.pop("temperature", None) or 2.0
        weights = DistilBertWeights(*distilbert_weights, temperature)
        result = run_pretrain_distillation(PretrainDistillOptions(data=Path(data), weights=weights, **common,
                                                                  **_known(options, PretrainDistillOptions)))
        finish_tracking(out)
        return RunResult(Path(out), last_evaluation(out), [result])
    from ember.distillation.task_run import TaskDistillOptions, run_task_distillation

    if data:
        raise EmberError("--data is for distilbert / tinybert --stage general; task-level methods read "
                         "--unlabeled and the task's training set")
    options.setdefault("student_init", "random")
    result = run_task_distillation(TaskDistillOptions(unlabeled=list(unlabeled), **common,
                                                      **_known(options, TaskDistillOptions)))
    finish_tracking(out)  # train.trackers=mlflow: the folder's files and final metrics, run ended
    return RunResult(Path(out), result["metrics"], [result])


def check_teacher_family(teacher: Path) -> None:
    """Every method distils a Transformer encoder (its logits, hidden states, attentions, MLM
    head) into an encoder student built from a BERT preset: refuse other families up front."""
    from ember.config import ENCODER_FAMILIES
    from ember.runs.folder import load_run_config

    family = load_run_config(teacher).model.family
    if family not in ENCODER_FAMILIES:
        raise EmberError(f"{teacher} holds a {family!r} model; distillation (KD, DistilBERT, TinyBERT, Patient KD) "
                         f"teaches an encoder student from a Transformer-encoder teacher ({', '.join(ENCODER_FAMILIES)}). "
                         "Fine-tune an encoder run on the task and distil that")


def _known(options: dict, cls) -> dict:
    """The options ``cls`` takes (None = the method's default); an unknown one is an error."""
    import dataclasses

    names = {f.name for f in dataclasses.fields(cls)}
    unknown = sorted(set(options) - names)
    if unknown:
        raise EmberError(f"unknown distillation option(s) {unknown} for this method")
    return {k: v for k, v in options.items() if v is not None}
