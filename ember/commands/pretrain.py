"""`ember pretrain`: pre-train a model from a recipe on a prepared corpus."""

from __future__ import annotations

from pathlib import Path

from ember.commands.common import add_train_options, recipe_path, train_overrides


def register(sub) -> None:
    p = sub.add_parser(
        "pretrain",
        help="pre-train a model (BERT MLM+NSP, ...) on a prepared corpus",
        description="Pre-train from a recipe (ember/recipes/*.yaml or a path) on token shards "
        "written by `ember prepare`. Writes a run folder with config, tokenizer, checkpoints, "
        "metrics.jsonl, TensorBoard events and curves.png. Runs under torchrun for DDP.",
    )
    p.add_argument("--recipe", default="bert-mini", help="recipe name or YAML path (default: bert-mini)")
    p.add_argument("--data", help="prepared corpus folder (from `ember prepare`)")
    p.add_argument("--out", required=True, help="run folder to write")
    p.add_argument("--max-steps", type=int, help="optimizer steps (the LR schedule spans these)")
    p.add_argument("--batch-size", type=int, help="sequences per optimizer step, over all ranks")
    p.add_argument("--grad-accum", type=int, help="micro-batches accumulated per step")
    p.add_argument("--lr", type=float, help="peak learning rate")
    add_train_options(p)
    p.set_defaults(run=run)


def run(args) -> int:
    from ember.config import apply_overrides, load_yaml, run_config_from_dict
    from ember.errors import EmberError
    from ember.train.pretrain import run_pretraining

    out = Path(args.out)
    overrides = train_overrides(args)
    for flag, key in (("data", "data.prepared"), ("max_steps", "train.max_steps"),
                      ("batch_size", "train.batch_size"), ("grad_accum", "train.grad_accum"),
                      ("lr", "train.lr")):
        value = getattr(args, flag)
        if value is not None:
            overrides.append(f"{key}={value}")
    if args.resume and (out / "config.yaml").is_file():
        # Resume with the run's own settings so the continuation is exact; only the time
        # budget and device may change.
        values = load_yaml(out / "config.yaml")
        changed = [o for o in overrides if not o.startswith(("train.max_time", "train.device", "data.prepared"))]
        if changed:
            raise EmberError(f"--resume continues {out} with its saved settings; drop {changed} "
                             "(or start a new run)")
        values = apply_overrides(values, overrides)
    else:
        values = apply_overrides(load_yaml(recipe_path(args.recipe)), overrides)
    cfg = run_config_from_dict(values, where=f"recipe {args.recipe}")
    if cfg.kind != "pretrain":
        raise EmberError(f"recipe {args.recipe} is a {cfg.kind} recipe, not a pre-training one")
    result = run_pretraining(cfg, out, resume=args.resume, overwrite=args.overwrite,
                             progress=not args.no_progress)
    print(f"stopped at step {result['step']} after {result['elapsed'] / 60:.1f} min; run folder: {out}")
    return 0
