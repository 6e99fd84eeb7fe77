"""`ember finetune`: fine-tune on a task (GLUE-style, CoNLL-2003 NER, SQuAD) and keep the best-on-dev weights."""

from __future__ import annotations

import argparse
import json
import textwrap
from pathlib import Path

from ember.errors import EmberError
from ember.commands.common import add_train_options, train_overrides


def register(sub) -> None:
    p = sub.add_parser(
        "finetune",
        help="fine-tune on a classification, NER or question-answering task",
        description=textwrap.fill("Fine-tune a pre-trained (or random) encoder on SST-2, CoLA, MRPC, RTE, STS-B, "
        "QNLI, SNLI (sentence classification/regression), CoNLL-2003 (named entities, entity-level "
        "F1, also reported on test) or SQuAD read from $EMBER_DATA. Defaults follow the BERT paper "
        "(lr 2e-5 - 5e-5 for NER -, batch 32, 3 epochs, 10% warm-up, max length 128). Evaluates on "
        "dev after each epoch and keeps the best weights in OUT/model.safetensors; OUT/results.json "
        "holds the dev metrics. Transfer options for any backbone and task: --features (ELMo-style "
        "frozen encoder + learned layer mix + small head), --layer-lr-decay / --schedule stlr / "
        "--gradual-unfreeze (ULMFiT; --ulmfit sets all three), --patience (early stopping).", 100),
        epilog="examples:\n"
        "  ember finetune --task sst2 --init runs/bert-mini --out runs/sst2 --features\n"
        "  ember finetune --task conll2003 --init runs/bert-mini --out runs/ner --layer-lr-decay 0.8 --patience 2\n"
        "  ember finetune --task sst2 --init runs/bert-mini --out runs/sst2-ulmfit --ulmfit --epochs 6",
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("--task", required=True,
                   help="sst2, cola, mrpc, rte, stsb, qnli, snli, nsmc, rusentiment, conll2003, squad or squad2 (GPT runs: the GLUE-style ones)")
    p.add_argument("--init", default="random",
                   help="pre-training run folder, HF checkpoint folder, or 'random' (default)")
    p.add_argument("--model", default="", help="model preset for --init random (e.g. bert-mini)")
    p.add_argument("--tokenizer", default="", help="tokenizer.json for --init random")
    p.add_argument("--out", required=True, help="run folder to write")
    p.add_argument("--lr", type=float, help="peak learning rate (default: the task's BERT value)")
    p.add_argument("--epochs", type=float, help="training epochs (default 3)")
    p.add_argument("--batch-size", type=int, help="sequences per step (default 32)")
    p.add_argument("--max-length", type=int, help="max tokens per example (default 128)")
    p.add_argument("--warmup-ratio", type=float, help="fraction of steps for LR warm-up (default 0.1)")
    p.add_argument("--seeds", default="", help="comma-separated seeds, e.g. 1,2,3: one run each, "
                   "mean and std reported (overrides --seed)")
    p.add_argument("--train-split", help="split to train on (default train; SNLI here: dev) or a TSV file in the task's layout")
    p.add_argument("--eval-split", help="split to select and report on (default dev; SNLI here: test)")
    p.add_argument("--train-limit", type=int, help="use only the first N training examples (quick runs)")
    g = p.add_argument_group("transfer options (any backbone, any task)")
    g.add_argument("--features", action="store_true",
                   help="feature-based transfer (ELMo): freeze the encoder, learn a softmax-weighted mix of "
                   "its layers (reported in results.json) and a small head on top")
    g.add_argument("--feature-layers", type=int,
                   help="with --features: per-token GELU layers between the mix and the head (default 1; 0 = "
                   "linear probe)")
    g.add_argument("--layer-lr-decay", type=float,
                   help="discriminative fine-tuning: the head gets --lr, the top layer lr*X, the next lr*X^2, "
                   "..., the embeddings lr*X^(L+1) (e.g. 0.8; ULMFiT's 'divide by 2.6' is 0.385)")
    g.add_argument("--schedule", choices=["linear", "constant", "stlr"],
                   help="lr schedule: linear warm-up/decay (BERT, default), constant after warm-up, or stlr "
                   "(ULMFiT slanted triangular: rise over 10%% of steps, decay to lr/32)")
    g.add_argument("--gradual-unfreeze", action="store_true",
                   help="epoch 1 trains the head and the top layer, each further epoch one more layer down, "
                   "embeddings last (all layers train from epoch L+1 on)")
    g.add_argument("--ulmfit", action="store_true",
                   help="ULMFiT preset: --layer-lr-decay 0.385 (1/2.6) --schedule stlr --gradual-unfreeze "
                   "(explicit flags win)")
    g.add_argument("--patience", type=int,
                   help="early stopping: stop after N dev evaluations without a better main metric "
                   "(the best weights are kept either way)")
    add_train_options(p)
    p.set_defaults(run=run)


def finetune_config(args, seed: int | None):
    from ember.config import RunConfig, apply_overrides, run_config_from_dict, to_dict
    from ember.tasks.base import get_adapter
    from ember.tasks.glue import BertHParams

    adapter = get_adapter(args.task)
    hp = getattr(adapter, "hparams", BertHParams())
    values = to_dict(RunConfig(kind="finetune"))
    values["train"].update(lr=hp.learning_rate, batch_size=hp.batch_size, warmup_ratio=hp.warmup_ratio,
                           weight_decay=0.01, eval_every=0, save_every=0, log_every=20, adam_eps=1e-8)
    values["task"].update(name=adapter.name, max_length=hp.max_length, epochs=hp.epochs, init=args.init)
    for flag, key in (("lr", "train.lr"), ("batch_size", "train.batch_size"), ("epochs", "task.epochs"),
                      ("max_length", "task.max_length"), ("warmup_ratio", "train.warmup_ratio"),
                      ("train_split", "task.train_split"), ("eval_split", "task.eval_split")):
        if getattr(args, flag) is not None:
            values = apply_overrides(values, [f"{key}={getattr(args, flag)}"])
    values = apply_overrides(values, transfer_overrides(args))
    values = apply_overrides(values, train_overrides(args) + ([f"train.seed={seed}"] if seed is not None else []))
    return run_config_from_dict(values, where="finetune settings")


# Model settings that leave the weights' shapes and meaning alone: the only ones a pre-trained
# init can take from --set (the rest come from its checkpoint).
FREE_MODEL_SETTINGS = ("dropout", "attention_dropout", "initializer_range")


def model_with_overrides(model_cfg, overrides: list[str], pretrained: bool):
    """Apply ``--set model.K=V`` to the init's model config (``--init random``: any setting)."""
    from ember.config import RunConfig, apply_overrides, run_config_from_dict, to_dict

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


ULMFIT = {"task.layer_lr_decay": 1 / 2.6, "train.schedule": "stlr", "task.gradual_unfreeze": True}


def transfer_overrides(args) -> list[str]:
    """Dotted overrides of the transfer flags (absent attributes = not given, for other callers)."""
    values = dict(ULMFIT) if getattr(args, "ulmfit", False) else {}
    for flag, key in (("features", "task.features"), ("gradual_unfreeze", "task.gradual_unfreeze")):
        if getattr(args, flag, False):
            values[key] = True
    for flag, key in (("feature_layers", "task.feature_layers"), ("layer_lr_decay", "task.layer_lr_decay"),
                      ("schedule", "train.schedule"), ("patience", "task.patience")):
        if getattr(args, flag, None) is not None:
            values[key] = getattr(args, flag)
    return [f"{k}={v}" for k, v in values.items()]


def run(args) -> int:
    import dataclasses

    from ember.train.finetune import run_finetuning

    from ember.tasks.metrics import summarize_seeds
    from ember.runs.init import load_init

    model_cfg, state, tokenizer_path = load_init(args.init, args.model, args.tokenizer)
    model_cfg = model_with_overrides(model_cfg, args.overrides, pretrained=state is not None)
    seeds = [int(s) for s in args.seeds.split(",") if s.strip()] if args.seeds else [None]
    out = Path(args.out)
    results = []
    for seed in seeds:
        cfg = finetune_config(args, seed)
        cfg = dataclasses.replace(cfg, model=model_cfg)
        run_dir = out / f"seed-{cfg.train.seed}" if len(seeds) > 1 else out
        result = run_finetuning(cfg, run_dir, state, tokenizer_path, args.train_limit,
                                overwrite=args.overwrite, resume=args.resume, progress=not args.no_progress)
        results.append(result)
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
    if len(results) > 1:
        summary = {"task": results[0]["task"], "seeds": seeds, "metrics": summarize_seeds(results)}
        if "other_splits" in results[0]:  # e.g. CoNLL-2003 test
            summary["other_splits"] = {split: summarize_seeds([{"metrics": r["other_splits"][split]} for r in results])
                                       for split in results[0]["other_splits"]}
        out.mkdir(parents=True, exist_ok=True)
        (out / "summary.json").write_text(json.dumps(summary, indent=2))
        splits = {results[0]["split"]: summary["metrics"], **summary.get("other_splits", {})}
        for split, metrics in splits.items():
            for name, s in metrics.items():
                print(f"{summary['task']} {split} {name}: mean {s['mean']:.4f} ± {s['std']:.4f} "
                      f"(median {s['median']:.4f}, {len(seeds)} seeds)")
    return 0
