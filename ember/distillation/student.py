"""The student's shape and its starting weights.

Three ways to start a student:
- ``random``: a fresh encoder of the requested preset (BERT initialisation);
- a pre-trained run or HF checkpoint folder (``ember.runs.init.load_init``), whose config
  then is the student's shape ("well-read students", Turc et al. 2019);
- ``teacher``: DistilBERT's initialisation (Sanh et al. 2019, §3 "Student initialization"):
  the student has the teacher's width and every k-th of its layers, k = N / M (one layer out
  of two for half the depth), plus the teacher's embeddings and pooler.
"""

from __future__ import annotations

import dataclasses
import re

import torch

from ember.config import ModelConfig, model_preset
from ember.errors import EmberError

_LAYER = re.compile(r"^layers\.(\d+)\.(.*)$")


def student_config(teacher: ModelConfig, preset: str = "", layers: int = 0) -> ModelConfig:
    """The student's ModelConfig: a preset (or the teacher's shape when ``preset`` is empty or
    "teacher"), with ``layers`` layers when given. Vocabulary, padding id, positions and the
    family follow the teacher, since both read the same tokenizer's ids."""
    if preset in ("", "teacher"):
        base = teacher
    else:
        base = dataclasses.replace(model_preset(preset), family=teacher.family,
                                   type_vocab_size=teacher.type_vocab_size, pooler=teacher.pooler,
                                   layer_norm_eps=teacher.layer_norm_eps)
    cfg = dataclasses.replace(base, vocab_size=teacher.vocab_size, pad_token_id=teacher.pad_token_id,
                              max_position=teacher.max_position)
    if layers:
        cfg = dataclasses.replace(cfg, num_layers=layers)
    return cfg


def teacher_layer_choice(student_layers: int, teacher_layers: int) -> list[int]:
    """0-based teacher layers copied into the student: 0, k, 2k, ... with k = N / M.

    For half the depth that is every other layer starting at the first, "taking one layer out
    of two" (Sanh et al. 2019). (The released DistilBERT took 0, 2, 4, 7, 9, 11 of BERT-base.)
    """
    m, n = student_layers, teacher_layers
    if m < 1 or m > n or n % m:
        raise EmberError(f"initialising a {m}-layer student from a {n}-layer teacher needs N to be a "
                         f"multiple of M; use --student-layers {n // 2 or 1}")
    return [i * (n // m) for i in range(m)]


def init_from_teacher(teacher_state: dict[str, torch.Tensor], teacher_cfg: ModelConfig,
                      student_cfg: ModelConfig) -> dict[str, torch.Tensor]:
    """Backbone weights for the student from the teacher's backbone weights (no prefix).

    Embeddings, embedding projection, pooler and final norm are copied as they are; student
    layer i gets teacher layer ``teacher_layer_choice(M, N)[i]``. Widths must match.
    """
    for name in ("hidden_size", "num_heads", "intermediate_size", "embedding_size", "vocab_size",
                 "type_vocab_size", "pre_layer_norm"):
        if getattr(teacher_cfg, name) != getattr(student_cfg, name):
            raise EmberError(
                f"--student-init teacher copies the teacher's layers, so the student needs the teacher's "
                f"{name} ({getattr(teacher_cfg, name)}), not {getattr(student_cfg, name)}; drop "
                "--student PRESET (or pass --student teacher) and set --student-layers")
    if teacher_cfg.share_layers != "none":
        raise EmberError("--student-init teacher needs a teacher without cross-layer sharing (ALBERT "
                         "shares one layer: use its preset with fewer layers instead)")
    chosen = teacher_layer_choice(student_cfg.num_layers, teacher_cfg.num_layers)
    source_of = {t: s for s, t in enumerate(chosen)}
    out = {}
    for name, tensor in teacher_state.items():
        match = _LAYER.match(name)
        if match is None:
            out[name] = tensor.clone()
        elif int(match.group(1)) in source_of:
            out[f"layers.{source_of[int(match.group(1))]}.{match.group(2)}"] = tensor.clone()
    return out


def count_parameters(module: torch.nn.Module) -> int:
    return sum(p.numel() for p in module.parameters())


def check_same_recipe(out, record: dict, resume: bool) -> None:
    """On --resume, refuse settings that differ from the run's distill.json (the continuation
    would silently mix two recipes)."""
    import json
    from pathlib import Path

    from ember.runs.folder import changed_settings

    path = Path(out) / "distill.json"
    if not resume:
        return
    if not path.is_file():
        if (Path(out) / "config.yaml").is_file():  # someone else's run: resuming would rewrite its config
            raise EmberError(f"--resume: {out} holds a run that `ember distill` did not write (no distill.json); "
                             "distil into a new --out")
        return
    saved = json.loads(path.read_text())
    changed = changed_settings(saved, record)
    if changed:
        raise EmberError(f"--resume continues {out} with its own settings, but this command changes "
                         f"{', '.join(changed)}; use the original options or start a new --out")


def check_same_tokenizer(path, teacher_path, what: str) -> None:
    """Teacher and student read the same token ids: their tokenizers' vocabularies must agree."""
    from ember.tokenizers import load_tokenizer

    if load_tokenizer(path).get_vocab() != load_tokenizer(teacher_path).get_vocab():
        raise EmberError(f"{what} uses the tokenizer {path}, which differs from the teacher's {teacher_path}; "
                         "teacher and student must share one tokenizer (prepare/pre-train with the teacher's)")
