"""A task model of a run: build it for fine-tuning, load a fine-tuned one, score a run folder.

Everything here reads run folders through ``ember.runs`` and tasks through their adapters
(``ember.tasks.base``), never through the trainer, so evaluation, prediction, serving and
distillation load a fine-tuned model without importing ``ember.train``.
"""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import torch
from torch import nn

from ember.config import RunConfig
from ember.model_config import SEQ2SEQ_FAMILIES
from ember.errors import EmberError
from ember.models import build_backbone
from ember.runs.checkpoint import load_weights
from ember.runs.folder import load_run_config
from ember.tasks.base import TaskAdapter, get_adapter, read_task_record


def _fresh_backbone(cfg: RunConfig) -> nn.Module:
    """The run's backbone with fresh weights: ERNIE's fusion encoder when the run fuses
    entities (knowledge.entities), else its family's backbone."""
    from ember.tasks.families.knowledge import knowledge_backbone

    backbone = knowledge_backbone(cfg)
    return build_backbone(cfg.model) if backbone is None else backbone


def _backbone(cfg: RunConfig) -> nn.Module:
    """A fresh backbone, wrapped for feature-based transfer when the run is one (--features)."""
    backbone = _fresh_backbone(cfg)
    if cfg.task.features:
        from ember.tasks.families.feature_transfer import FeatureBackbone

        backbone = FeatureBackbone.for_task(backbone, cfg.task)
    return backbone


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
    backbone = _fresh_backbone(cfg)
    if state is not None:
        missing, unexpected = backbone.load_state_dict(state, strict=False)
        fresh = ("pooler.",) + getattr(backbone, "NEW_PARAMETERS", ())  # e.g. ERNIE's fusion layers
        if unexpected or [m for m in missing if not m.startswith(fresh)]:
            from ember.knowledge.ernie import FusionEncoder

            hint = ("; they hold ERNIE's fusion layers (objective ernie): fine-tune with --entities DIR"
                    if any(u.startswith(FusionEncoder.NEW_PARAMETERS) for u in unexpected) else "")
            raise EmberError(f"pre-trained weights do not fit the backbone (missing {missing[:3]}, "
                             f"unexpected {unexpected[:3]}){hint}")
    if cfg.task.features:
        from ember.tasks.families.feature_transfer import FeatureBackbone

        backbone = FeatureBackbone.for_task(backbone, cfg.task)
    return adapter.build_module(backbone, pad_id)


DECODING_SETTINGS = ("num_beams", "length_penalty", "max_new_tokens")  # TaskConfig fields a T5 run decodes with


def with_decoding(cfg: RunConfig, decoding: dict | None) -> RunConfig:
    """``cfg`` with a text-to-text (T5) run's decoding settings (``DECODING_SETTINGS``; None
    values keep the run's) replaced for this evaluation or prediction; refused for other runs."""
    given = {k: v for k, v in (decoding or {}).items() if v is not None}
    if not given:
        return cfg
    if cfg.model.family not in SEQ2SEQ_FAMILIES:
        flags = ", ".join("--" + k.replace("_", "-") for k in given)
        raise EmberError(f"{flags}: only a text-to-text (T5) run decodes its outputs; this run is a "
                         f"{cfg.model.family} model, whose predictions come from its head")
    return dataclasses.replace(cfg, task=dataclasses.replace(cfg.task, **given))


def check_decodes(adapter: TaskAdapter, decoding: dict | None) -> None:
    """Decoding settings for a seq2seq run whose predictions come from a head (BART's classifier
    or span layer, ember.tasks.families.bart) are one clear line, not silently ignored."""
    given = [k for k, v in (decoding or {}).items() if v is not None]
    if given and not hasattr(adapter, "set_decoding"):
        flags = ", ".join("--" + k.replace("_", "-") for k in given)
        raise EmberError(f"{flags}: this run's predictions come from its {adapter.display_name} head, not from "
                         "decoding; only a text-to-text run decodes (T5, or BART fine-tuned with task.text2text=true)")


def load_run_adapter(run_dir: Path, cfg: RunConfig, task: str = "") -> TaskAdapter:
    """The run's task adapter (a custom task's from RUN/task.json) with the settings tuned during
    fine-tuning (RUN/tuned.json).

    Another ``task`` (evaluating an SST-2 run on Russian sentiment) comes in its own language
    (XLM's language ids), and needs the run's output labels, in the same order.
    """
    own = read_task_record(run_dir) or cfg.task.name
    other = bool(task) and (not own or get_adapter(task).name != get_adapter(own).name)
    from ember.tasks.families.knowledge import run_knowledge

    adapter = run_knowledge(run_dir, cfg, get_adapter(task or own, cfg.model, "" if other else cfg.task.language,
                                                      cfg.task))
    if other:
        if own:  # an imported classifier (`ember convert --from-hf`) names no task to compare with
            _check_labels(run_dir, cfg, adapter)
        return adapter  # settings tuned for the run's own task do not carry over
    tuned_path = Path(run_dir) / "tuned.json"
    if tuned_path.is_file() and hasattr(adapter, "apply_tuned"):
        try:
            adapter.apply_tuned(json.loads(tuned_path.read_text()))
        except (ValueError, KeyError, TypeError) as exc:
            raise EmberError(f"{tuned_path}: unreadable ({exc}); delete it to use the task's defaults") from None
    return adapter


def _check_labels(run_dir: Path, cfg: RunConfig, adapter: TaskAdapter) -> None:
    labels_file = Path(run_dir) / "labels.json"
    own = json.loads(labels_file.read_text()) if labels_file.is_file() else get_adapter(cfg.task.name).label_names()
    theirs = adapter.label_names()
    if own != theirs:
        raise EmberError(f"{run_dir} was fine-tuned on {cfg.task.name} with output labels {own}; "
                         f"{adapter.display_name} has labels {theirs}, so the run's head cannot be scored on it "
                         "(a task with the same labels in the same order can, e.g. an SST-2 run on "
                         "rusentiment-binary)")


def load_task_module(run_dir: Path, cfg: RunConfig, adapter: TaskAdapter, pad_id: int) -> nn.Module:
    """The fine-tuned model of a run folder (RUN/model.safetensors), in eval mode."""
    module = adapter.build_module(_backbone(cfg), pad_id)
    state = load_weights(Path(run_dir) / "model.safetensors")
    try:
        module.load_state_dict(state)
    except RuntimeError as exc:
        raise EmberError(f"{run_dir}/model.safetensors does not fit a {adapter.display_name} model: "
                         f"{str(exc).splitlines()[0]}") from None
    return module.eval()


def with_max_length(cfg: RunConfig, max_length: int | None) -> RunConfig:
    """``cfg`` evaluating ``max_length`` tokens per input; refused past the model's positions."""
    if max_length is None:
        return cfg
    if max_length < 8:
        raise EmberError(f"--max-length {max_length}: an input needs at least 8 tokens")
    if cfg.model.max_position and max_length > cfg.model.max_position:
        raise EmberError(f"--max-length {max_length} is beyond the model's {cfg.model.max_position} positions; "
                         f"give at most {cfg.model.max_position}, or make the model long first "
                         "(ember convert --from-run RUN --long N)")
    return dataclasses.replace(cfg, task=dataclasses.replace(cfg.task, max_length=max_length))


def evaluate_run(run_dir: Path, split: str = "", path: str | None = None, task: str = "",
                 progress: bool = False, decoding: dict | None = None, max_length: int | None = None) -> dict:
    """Score a fine-tuned run folder on a labelled split (or file) with the task's metric
    (``progress``: a bar over the rows while the model runs; ``decoding``: a T5 run's
    ``with_decoding`` settings for this evaluation; ``max_length``: tokens per input instead of
    the run's ``task.max_length``, e.g. a long model's whole documents in one window)."""
    from ember.tasks.batching import inference_progress
    from ember.tasks.multitask import is_multitask_run, task_names, task_run
    from ember.tokenizers import load_tokenizer

    if is_multitask_run(run_dir):  # every task on its own best weights (RUN/tasks/NAME), or the one named
        if task:
            return evaluate_run(task_run(run_dir, task), split, path, "", progress, decoding, max_length)
        if path is not None:
            raise EmberError(f"--file is one task's file; {run_dir} holds several tasks: name one with --task "
                             f"({', '.join(task_names(run_dir))})")
        results = {name: evaluate_run(task_run(run_dir, name), split, None, "", progress, decoding, max_length)
                   for name in task_names(run_dir)}
        return {"tasks": results, "split": split or "dev"}
    cfg = with_max_length(with_decoding(load_run_config(run_dir, expect_kind="finetune"), decoding), max_length)
    adapter = load_run_adapter(run_dir, cfg, task)
    check_decodes(adapter, decoding)
    split = split or cfg.task.eval_split
    tokenizer = load_tokenizer(Path(run_dir) / "tokenizer.json")
    module = load_task_module(run_dir, cfg, adapter, pad_token_id(tokenizer))
    examples, features = adapter.load(split, tokenizer, cfg.task.max_length, path=path)
    where = split if path is None else str(path)
    if not features:  # a file with a header and nothing under it: nothing to score
        raise EmberError(f"{where} has no examples to score (only a header?)")
    with inference_progress(f"evaluating {Path(where).name if path else where}", progress):
        metrics = adapter.score(module, examples, features, cfg.task.eval_batch_size, cfg.train.device)
    result = {"task": adapter.display_name, "split": where, "metrics": metrics}
    if getattr(adapter, "with_no_answer", False):  # SQuAD 2.0: say which threshold was used
        result["null_threshold"] = adapter.null_threshold
    if hasattr(adapter, "decode_budget"):  # a T5 run: how its outputs were decoded (greedy or beams)
        budget = adapter.decode_budget(adapter.encoder(tokenizer, cfg.task.max_length))
        result["decoding"] = {**adapter.decoding, "max_new_tokens": budget}
    return result
