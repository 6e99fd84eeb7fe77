"""`ember distill --method distilbert` and `--method tinybert --stage general`: distillation on a
pre-training corpus (token shards from `ember prepare`), teacher = a pre-trained run.

The output is a pre-training run folder (kind "pretrain"): ``model.safetensors`` holds the
student's ``backbone.*`` weights (and ``mlm.*`` for DistilBERT, so `ember fill-mask` works),
ready for ``ember finetune --init OUT`` or ``ember distill --student-init OUT``.
"""

from __future__ import annotations

import dataclasses
import json
from dataclasses import dataclass, field
from pathlib import Path

import torch

from ember.config import RunConfig, TrainConfig
from ember.distillation.distilbert import DistilBertDistiller, DistilBertWeights
from ember.distillation.student import (
    check_same_recipe, check_same_tokenizer, count_parameters, init_from_teacher, student_config,
)
from ember.errors import EmberError
from ember.runs.checkpoint import atomic_write_text, load_weights, save_weights
from ember.train.checks import check_train_settings


@dataclass
class PretrainDistillOptions:
    teacher: Path
    data: Path
    out: Path
    method: str = "distilbert"  # or "tinybert" (general stage)
    student: str = ""
    student_layers: int = 0
    student_init: str = ""  # distilbert: "teacher" (default) or "random"; tinybert: "random"
    weights: DistilBertWeights = field(default_factory=DistilBertWeights)
    train: TrainConfig = field(default_factory=TrainConfig)
    resume: bool = False
    overwrite: bool = False
    progress: bool = True


def run_pretrain_distillation(opts: PretrainDistillOptions) -> dict:
    from ember.data.packing import build_pretraining_dataset
    from ember.data.shards import TokenCorpus
    from ember.models import build_backbone
    from ember.objectives.bert import BertPretraining
    from ember.tokenizers import load_tokenizer, special_token_ids
    from ember.train.loop import Trainer
    from ember.objectives.setup import held_out_batch_size, held_out_metrics
    from ember.runs.folder import load_run_config, prepare_run_dir, write_run_files

    teacher_dir, out = Path(opts.teacher), Path(opts.out)
    teacher_cfg = load_run_config(teacher_dir, expect_kind="pretrain")
    teacher_state = load_weights(teacher_dir / "model.safetensors")
    corpus = TokenCorpus(opts.data, "train")
    check_same_tokenizer(corpus.tokenizer_path, teacher_dir / "tokenizer.json", "the corpus (--data)")
    special = special_token_ids(load_tokenizer(corpus.tokenizer_path))
    # Single segments, no NSP (DistilBERT drops it, as RoBERTa); TinyBERT's general stage reads plain text.
    data_cfg = dataclasses.replace(teacher_cfg.data, prepared=str(opts.data), nsp=False, static_masks=0)
    if data_cfg.max_seq_length > teacher_cfg.model.max_position:
        raise EmberError(f"data.max_seq_length={data_cfg.max_seq_length} exceeds the teacher's positions")
    torch.manual_seed(opts.train.seed)
    backbone_state = {k[len("backbone."):]: v for k, v in teacher_state.items() if k.startswith("backbone.")}
    if opts.method == "distilbert":
        if "mlm.dense.weight" not in teacher_state:
            raise EmberError(f"{teacher_dir} has no masked-LM head (objective {teacher_cfg.objective!r}); "
                             "DistilBERT distils the teacher's MLM distribution - use a BERT/RoBERTa-style run")
        init = opts.student_init or "teacher"
        layers = opts.student_layers or max(1, teacher_cfg.model.num_layers // 2)
        scfg = student_config(teacher_cfg.model, opts.student, layers)
        teacher = BertPretraining(build_backbone(teacher_cfg.model), special, data_cfg, "none")
        missing, _ = teacher.load_state_dict(teacher_state, strict=False)  # nsp/sop heads are unused
        if [m for m in missing if not m.startswith("backbone.pooler.")]:
            raise EmberError(f"{teacher_dir}/model.safetensors does not fit its config (missing {missing[:3]})")
        from ember.objectives.masking import build_masker

        masker = build_masker(data_cfg, {**special, "tokenizer_path": str(corpus.tokenizer_path)},
                              scfg.vocab_size, opts.train.seed)
        student = BertPretraining(build_backbone(scfg), special, data_cfg, "none", masker)
        if init == "teacher":
            state = {f"backbone.{k}": v for k, v in init_from_teacher(backbone_state, teacher_cfg.model, scfg).items()}
            state.update({k: v.clone() for k, v in teacher_state.items() if k.startswith("mlm.")})
            student.load_state_dict(state, strict=False)
        elif init != "random":
            raise EmberError(f"--student-init {init!r}: DistilBERT starts from the teacher or random")
        module = DistilBertDistiller(student, teacher, opts.weights)
        objective, saved = "mlm", lambda: student.state_dict()
        params = (count_parameters(student.backbone), count_parameters(teacher.backbone))
    elif opts.method == "tinybert":
        from ember.distillation.tinybert import GeneralDistiller

        if opts.student_init not in ("", "random"):
            raise EmberError("TinyBERT's general stage trains a randomly initialised student")
        init = "random"
        scfg = student_config(teacher_cfg.model, opts.student, opts.student_layers)
        teacher = build_backbone(teacher_cfg.model)
        missing, unexpected = teacher.load_state_dict(backbone_state, strict=False)
        if unexpected or [m for m in missing if not m.startswith("pooler.")]:
            raise EmberError(f"{teacher_dir}/model.safetensors does not fit its config (missing {missing[:3]})")
        module = GeneralDistiller(build_backbone(scfg), teacher, special)
        objective = "tinybert-general"
        saved = lambda: {f"backbone.{k}": v for k, v in module.backbone.state_dict().items()}  # noqa: E731
        params = (count_parameters(module.backbone), count_parameters(teacher))
    else:
        raise EmberError(f"--method {opts.method!r} does not distil on a corpus; choose distilbert or tinybert")

    cfg = RunConfig(model=scfg, data=data_cfg, train=opts.train, kind="pretrain", objective=objective)
    train_data = build_pretraining_dataset(corpus, data_cfg, "none", opts.train.seed, special["sep"])
    evaluate = None
    try:
        valid = build_pretraining_dataset(TokenCorpus(opts.data, "valid"), data_cfg, "none", opts.train.seed + 1,
                                          special["sep"])
    except EmberError as exc:
        print(f"warning: no held-out evaluation ({exc})")
    else:
        def held_out(m):
            return held_out_metrics(m, valid, data_cfg.eval_examples, held_out_batch_size(data_cfg.max_seq_length),
                                    opts.train.seed, opts.train.device)

        evaluate = held_out

    record = {"method": opts.method, "stage": "general", "teacher": str(teacher_dir), "data": str(opts.data),
              "student_init": init, "student_layers": scfg.num_layers,
              "parameters": {"student_backbone": params[0], "teacher_backbone": params[1]},
              "train": {k: v for k, v in dataclasses.asdict(opts.train).items() if k not in ("max_time", "device")}}
    if opts.method == "distilbert":
        record["weights"] = dataclasses.asdict(opts.weights)
    check_same_recipe(out, json.loads(json.dumps(record)), opts.resume)  # before anything is rewritten
    check_train_settings(opts.train, "distill")
    prepare_run_dir(out, opts.resume, opts.overwrite, inputs=(teacher_dir, opts.data))
    write_run_files(out, cfg, corpus.tokenizer_path)
    atomic_write_text(out / "distill.json", json.dumps(record, indent=2))
    print(f"distilling ({opts.method}, general) on {corpus.num_tokens:,} tokens: teacher backbone "
          f"{params[1] / 1e6:.2f}M -> student {params[0] / 1e6:.2f}M parameters, run folder {out}")
    trainer = Trainer(module, train_data, opts.train, out, evaluate=evaluate, progress=opts.progress)
    result = trainer.train(resume=opts.resume)
    save_weights(saved(), out / "model.safetensors", {"step": trainer.step, "kind": "pretrain"})
    return result
