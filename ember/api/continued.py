"""Continued pre-training: ``ember pretrain --init RUN`` starts from a trained model, not random weights.

Longformer §5 (Beltagy et al. 2020) made RoBERTa long and then *continued* its MLM pre-training
on long documents, with a fresh optimizer and schedule (warm-up, then decay); DAPT (Gururangan
et al. 2020) continues a model on a new domain the same way. Here the run given to ``--init`` (an
ember run, one of its checkpoints, or an HF folder) fixes:

- the model: its config (family, sizes, attention variant, window, positions, ``sep_token_id``)
  and all its weights, heads included when it has them (an MLM head trained before goes on
  training; a model without one, like the sentence-transformers MiniLM, gets a fresh head);
- the tokenizer: the prepared shards must have been tokenized with it (checked here, before
  anything is written; ``ember prepare --tokenizer INIT/tokenizer.json``).

The recipe (``continue-mlm`` unless ``--recipe`` names another) gives the objective, the data
layout and the optimizer; its ``model`` section is ignored. A ``--set model.*`` may change only
what leaves the weights' shapes and meaning alone (dropout: ``FREE_MODEL_SETTINGS``, as for
fine-tuning); anything else contradicts the init and is refused. ``data.max_seq_length: 0``
means the init model's positions (``max_position``: 4,096 for ``convert --long 4096``).
"""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

from ember.config import RunConfig
from ember.errors import EmberError

# Families and objectives continued pre-training is built and tested for: masked LM on an encoder
# (objective mlm; bert/albert add NSP/SOP, spanbert SBO, each with a fresh head when the init has none).
INIT_FAMILIES = ("bert", "roberta", "albert", "electra", "distilbert")
INIT_OBJECTIVES = ("mlm", "bert", "albert", "spanbert")
DEFAULT_RECIPE = "continue-mlm"


def continued_config(recipe, init: str | Path, overrides: list[str]) -> RunConfig:
    """The RunConfig of a run continuing ``init``: the recipe's training settings (``overrides``
    applied) around the init's model. Refuses what would contradict the init (module docstring)."""
    from ember.api.finetune import model_with_overrides
    from ember.config import apply_overrides, load_yaml, run_config_from_dict
    from ember.recipes import recipe_path
    from ember.runs.init import load_start

    if isinstance(recipe, RunConfig):
        raise EmberError("--init takes its model from the init run: pass a recipe name or YAML path, not a RunConfig")
    start = load_start(init)
    family = start.model.family
    if family not in INIT_FAMILIES:
        raise EmberError(f"--init {init}: continued pre-training is for encoders ({', '.join(INIT_FAMILIES)}: "
                         f"masked LM); this is a {family} run")
    base = recipe_path(recipe or DEFAULT_RECIPE)
    values = load_yaml(base)
    values.pop("model", None)  # the recipe's architecture is for a run from scratch; the init's replaces it
    values = apply_overrides(values, [o for o in overrides if not o.startswith("model.")])
    cfg = run_config_from_dict(values, where=str(base))
    if cfg.kind != "pretrain":
        raise EmberError(f"{recipe} is a {cfg.kind} recipe, not a pre-training one")
    if cfg.objective not in INIT_OBJECTIVES:
        raise EmberError(f"--init continues pre-training with masked LM: objective {cfg.objective!r} (from "
                         f"{base.name}) is not one of {', '.join(INIT_OBJECTIVES)}; use --recipe {DEFAULT_RECIPE}")
    model = model_with_overrides(start.model, [o for o in overrides if o.startswith("model.")], pretrained=True)
    length = cfg.data.max_seq_length or model.max_position
    if cfg.data.prepared:
        check_corpus_tokenizer(cfg.data.prepared, start.tokenizer, init)
    return dataclasses.replace(cfg, model=model, init=str(init),
                               data=dataclasses.replace(cfg.data, max_seq_length=length))


def check_corpus_tokenizer(prepared: str | Path, tokenizer: Path, init) -> None:
    """Refuse shards tokenized with another tokenizer than the init's: their ids would index the
    wrong embedding rows. Same file (sha256) or the same rules and vocabulary (``_json``) pass."""
    from ember.data.shards import TokenCorpus
    from ember.fileio import sha256_file
    from ember.tokenizers import load_tokenizer

    if not (Path(prepared) / "meta.json").is_file():
        return  # not `ember prepare` shards: setup names what it expected
    corpus = TokenCorpus(prepared, "train")
    theirs = corpus.meta["tokenizer"].get("sha256") or sha256_file(corpus.tokenizer_path)
    ours = sha256_file(tokenizer)
    if theirs == ours:
        return
    fix = f"re-run `ember prepare ... --tokenizer {tokenizer}` for this model"
    size = load_tokenizer(tokenizer).get_vocab_size()
    if corpus.vocab_size != size:
        raise EmberError(f"--data {prepared} was tokenized with a {corpus.vocab_size:,}-token vocabulary, --init "
                         f"{init} uses {size:,} tokens; {fix}")
    if _json(corpus.tokenizer_path) != _json(tokenizer):
        raise EmberError(f"--data {prepared} was tokenized with another tokenizer (sha256 {theirs[:12]}) than --init "
                         f"{init}'s (sha256 {ours[:12]}), both {size:,} tokens; {fix}")


def _json(path: Path) -> dict:
    """tokenizer.json without its call-time settings (truncation, padding: `ember prepare` sets its
    own; an HF folder's often differ from its import's), i.e. what decides the ids."""
    with open(path, encoding="utf-8") as fh:
        return {k: v for k, v in json.load(fh).items() if k not in ("truncation", "padding")}


def check_resumed_init(saved: RunConfig, init: str | Path | None, out: Path) -> None:
    """A resumed run continues from its checkpoints, so its --init is only a check: it must be the
    one the run started from (or left out)."""
    if init is None:
        return
    if not saved.init:
        raise EmberError(f"--resume: {out} was pre-trained from random weights, not from --init {init}; "
                         "drop --init")
    if Path(saved.init).resolve() != Path(init).resolve():
        raise EmberError(f"--resume: {out} continues {saved.init}, not --init {init}; drop --init or give that one")
