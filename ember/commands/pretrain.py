"""`ember pretrain`: pre-train a model from a recipe on a prepared corpus."""

from __future__ import annotations

from pathlib import Path

from ember.commands.common import add_train_options, train_overrides

from ember.recipes import recipe_path


def register(sub) -> None:
    p = sub.add_parser(
        "pretrain",
        help="pre-train BERT, RoBERTa, ALBERT, SpanBERT, ELECTRA, GPT-2, ... on a prepared corpus",
        description="Pre-train from a recipe (ember/recipes/*.yaml or a path) on token shards "
        "written by `ember prepare`. Writes a run folder with config, tokenizer, checkpoints, "
        "metrics.jsonl, TensorBoard events and curves.png. Runs under torchrun for DDP. "
        "Recipes: bert-*, bert-mini-wwm, ernie-mini, roberta-*, albert-*, spanbert-mini, "
        "electra-*, distilbert, gpt2-tiny, gpt2-mini, gpt1, gpt1-mini (causal LM, objective clm), elmo-mini (see "
        "README). ELMo (objective bilm) reads raw text instead: `ember pretrain --recipe elmo-mini "
        "--data ../shared/data/wiki-en --out runs/elmo --max-time 15m`.",
    )
    p.add_argument("--recipe", help="recipe name or YAML path (default: bert-mini; with --resume, "
                   "the run's saved settings)")
    p.add_argument("--data", help="prepared corpus folder (from `ember prepare`); for "
                   "ELMo (objective bilm) raw text: a file, folder or glob")
    p.add_argument("--out", required=True, help="run folder to write")
    p.add_argument("--max-steps", type=int, help="optimizer steps (the LR schedule spans these)")
    p.add_argument("--batch-size", type=int, help="sequences per optimizer step, over all ranks")
    p.add_argument("--grad-accum", type=int, help="micro-batches accumulated per step")
    p.add_argument("--lr", type=float, help="peak learning rate")
    add_train_options(p)
    p.set_defaults(run=run)


def fit_vocab_to_corpus(cfg):
    """Size the embeddings/softmax to the prepared corpus's tokenizer: a 16k tokenizer under a
    recipe written for 30,522 would otherwise train 14k rows no token ever uses. Only for
    subword corpora from `ember prepare` (meta.json); --set model.vocab_size=N wins."""
    import dataclasses

    from ember.data.shards import TokenCorpus

    if not cfg.data.prepared or not (Path(cfg.data.prepared) / "meta.json").is_file():
        return cfg
    vocab = TokenCorpus(cfg.data.prepared, "train").vocab_size
    if vocab == cfg.model.vocab_size:
        return cfg
    print(f"model.vocab_size {cfg.model.vocab_size} -> {vocab}, the corpus tokenizer's size "
          "(--set model.vocab_size=N to choose)")
    return dataclasses.replace(cfg, model=dataclasses.replace(cfg.model, vocab_size=vocab))


def run(args) -> int:
    import dataclasses

    from ember.config import apply_overrides, load_yaml, run_config_from_dict, to_dict
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
    saved_path = out / "config.yaml"
    resuming = args.resume and saved_path.is_file()
    base = saved_path if resuming and args.recipe is None else recipe_path(args.recipe or "bert-mini")
    cfg = run_config_from_dict(apply_overrides(load_yaml(base), overrides), where=str(base))
    if resuming:
        # Continue with the run's own settings so the continuation is exact: the same command
        # line plus --resume is fine, but only the time budget and device may change.
        saved = run_config_from_dict(load_yaml(saved_path), where=str(saved_path))
        changed = [f"{section}.{key}" for section in ("model", "data", "train", "elmo")
                   for key, value in to_dict(getattr(cfg, section)).items()
                   if key not in ("max_time", "device", "pad_token_id")
                   and value != to_dict(getattr(saved, section))[key]]
        if changed or cfg.objective != saved.objective:
            raise EmberError(f"--resume continues {out} with its saved settings, but this command "
                             f"changes {changed or ['objective']}; drop those options or start a new run")
        cfg = dataclasses.replace(saved, train=dataclasses.replace(
            saved.train, max_time=cfg.train.max_time, device=cfg.train.device))
    elif not any(o.startswith("model.vocab_size=") for o in overrides):
        cfg = fit_vocab_to_corpus(cfg)
    if cfg.kind != "pretrain":
        raise EmberError(f"{base} is a {cfg.kind} recipe, not a pre-training one")
    result = run_pretraining(cfg, out, resume=args.resume, overwrite=args.overwrite,
                             progress=not args.no_progress)
    print(f"stopped at step {result['step']} after {result['elapsed'] / 60:.1f} min; run folder: {out}")
    return 0
