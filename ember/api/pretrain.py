"""``ember.pretrain``: a recipe (or config) plus overrides -> a pre-trained run folder.

The settings are checked and completed here, for the shell and for Python alike: the
vocabulary is fitted to the prepared corpus's tokenizer (unless ``model.vocab_size`` is set
explicitly), and a resumed run keeps its saved settings (only the time budget and the device
may change, so the continuation reproduces the uninterrupted run).
"""

from __future__ import annotations

import dataclasses
from pathlib import Path

from ember.api.arguments import folder_arg, strings_arg
from ember.api.caller_state import keeps_caller_state
from ember.api.results import RunResult
from ember.config import RunConfig, to_dict
from ember.errors import EmberError
from ember.runs.folder import check_resume_settings



def fit_vocab_to_corpus(cfg: RunConfig) -> RunConfig:
    """Size the embeddings/softmax to the prepared corpus's tokenizer: a 16k tokenizer under a
    recipe written for 30,522 would otherwise train 14k rows no token ever uses. Only for
    subword corpora from `ember prepare` (meta.json)."""
    from ember.data.shards import TokenCorpus
    from ember.train.distributed import is_first_process

    if not cfg.data.prepared or not (Path(cfg.data.prepared) / "meta.json").is_file():
        return cfg
    vocab = TokenCorpus(cfg.data.prepared, "train").vocab_size
    if vocab == cfg.model.vocab_size:
        return cfg
    if is_first_process():  # every rank sizes its model; one says so
        print(f"model.vocab_size {cfg.model.vocab_size} -> {vocab}, the corpus tokenizer's size "
              "(--set model.vocab_size=N to choose)")
    return dataclasses.replace(cfg, model=dataclasses.replace(cfg.model, vocab_size=vocab))


def resumed_config(saved: RunConfig, wanted: RunConfig, out: Path) -> RunConfig:
    """The saved settings, with the wanted time budget and device; anything else that differs
    is refused, since the continuation would not be the run it continues."""
    check_resume_settings(saved, wanted, out, skip_sections=("task",))
    return dataclasses.replace(saved, train=dataclasses.replace(
        saved.train, max_time=wanted.train.max_time, device=wanted.train.device))


def pretrain_config(recipe: str | Path | RunConfig | None, out: str | Path, data: str | Path | None = None,
                    overrides: list[str] | tuple[str, ...] = (), resume: bool = False,
                    init: str | Path | None = None) -> RunConfig:
    """The RunConfig a pre-training run will use (see the module docstring); ``init``: continue
    that run's model (``ember.api.continued``)."""
    from ember.config import apply_overrides, load_yaml, run_config_from_dict
    from ember.recipes import recipe_path

    out, overrides = Path(out), list(overrides) + ([f"data.prepared={data}"] if data is not None else [])
    saved_path = out / "config.yaml"
    resuming = resume and saved_path.is_file()
    if resume and not resuming and data is None and not any(o.startswith("data.prepared=") for o in overrides):
        # (with --data, --resume on an empty folder starts the run: a torchrun job restarted before
        # its first checkpoint does that)
        raise EmberError(f"--resume: there is no run in {out} to resume (no config.yaml); check --out, or drop "
                         "--resume and give --data to start one")
    if init is not None and not resuming:
        from ember.api.continued import continued_config

        return continued_config(recipe, init, overrides)  # the init's vocabulary, checked against the corpus
    if isinstance(recipe, RunConfig):
        cfg = run_config_from_dict(apply_overrides(to_dict(recipe), overrides), where="settings")
    else:
        base = saved_path if resuming and recipe is None else recipe_path(recipe or "bert-mini")
        cfg = run_config_from_dict(apply_overrides(load_yaml(base), overrides), where=str(base))
    if not any(o.startswith("model.vocab_size=") for o in overrides):
        cfg = fit_vocab_to_corpus(cfg)  # before a resume compares settings: the saved run was fitted too
    if resuming:
        from ember.api.continued import check_resumed_init

        check_resumed_init(run_config_from_dict(load_yaml(saved_path), where=str(saved_path)), init, out)
        cfg = resumed_config(run_config_from_dict(load_yaml(saved_path), where=str(saved_path)), cfg, out)
    if cfg.kind != "pretrain":
        raise EmberError(f"{recipe} is a {cfg.kind} recipe, not a pre-training one")
    if cfg.data.max_seq_length == 0 and not cfg.init:
        raise EmberError(f"data.max_seq_length=0 (recipe {recipe}) means the --init model's positions: give --init "
                         "RUN to continue a model, or --set data.max_seq_length=N")
    return cfg


@keeps_caller_state
def pretrain(recipe: str | Path | RunConfig | None = "bert-mini", out: str | Path = "runs/pretrain",
             data: str | Path | None = None, overrides: list[str] | tuple[str, ...] = (), resume: bool = False,
             overwrite: bool = False, progress: bool = True, init: str | Path | None = None) -> RunResult:
    """Pre-train ``recipe`` (a name in ember/recipes, a YAML path or a RunConfig) on ``data`` (a
    folder written by `ember prepare`; raw text for ELMo) into the run folder ``out``. With
    ``init`` (a run, checkpoint or HF folder) the run continues that model's pre-training: its
    config, weights and tokenizer, its family's objective, a fresh optimizer and schedule (by
    default the family's recipe: ``continue-mlm`` for an encoder, ``gpt2-mini``, ``t5-mini``,
    ``bart-mini``, ...; ``ember.api.continued``).

    >>> result = ember.pretrain("bert-mini", "runs/bert-mini", data="runs/wiki",
    ...                         overrides=["train.max_time=600"])  # doctest: +SKIP
    """
    from ember.runs.folder import last_evaluation
    from ember.train.pretrain import run_pretraining

    out, overrides = folder_arg(out, "out"), strings_arg(overrides, "overrides")
    if init is not None:
        init = folder_arg(init, "init")
    cfg = pretrain_config(recipe, out, data, overrides, resume, init)
    trained = run_pretraining(cfg, out, resume=resume, overwrite=overwrite, progress=progress)
    _record_recipe(out, recipe, data, overrides, resume, init)
    from ember.train.tracking import finish_tracking

    finish_tracking(out)  # train.trackers=mlflow: the folder's files and final metrics, run ended
    return RunResult(out, last_evaluation(out), [trained])


def _record_recipe(out: Path, recipe, data, overrides, resume: bool, init=None) -> None:
    """RUN/recipe.json: the recipe and overrides the run was asked for (config.yaml holds what
    they resolved to); `ember report` shows it. A resumed run keeps the record of its start."""
    import json

    from ember.fileio import atomic_write_text

    path = out / "recipe.json"
    if resume and path.is_file():
        return
    if init is None:
        default = "bert-mini"
    else:  # the recipe the init's family continues with (ember.api.continued), from the run's saved settings
        from ember.api.continued import continuation_recipe
        from ember.runs.folder import load_run_config

        saved = load_run_config(out)
        default = continuation_recipe(saved.model.family, saved.objective)
    name = "a RunConfig given from Python" if isinstance(recipe, RunConfig) else str(recipe or default)
    record = {"recipe": name, "data": None if data is None else str(data), "overrides": list(overrides)}
    if init is not None:
        record["init"] = str(init)
    atomic_write_text(path, json.dumps(record, indent=2))
