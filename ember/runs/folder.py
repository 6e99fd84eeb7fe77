"""Run folders: what a run writes so it can be continued or reused.

    RUN/config.yaml          the full RunConfig (kind, objective, model, data, train, task)
    RUN/tokenizer.json       the tokenizer the model was trained with
    RUN/model.safetensors    final (pre-training) or best-on-dev (fine-tuning) weights
    RUN/checkpoints/step-N/  model + optimizer + trainer state for --resume
    RUN/metrics.jsonl, RUN/tb/, RUN/*.png
    RUN/recipe.json          pre-training: the recipe, data and overrides asked for (ember.pretrain)
    RUN/inputs/              data given from Python (``ember.finetune(train=...)``), written as
                             files in the task's layout before the run starts; config.yaml names them
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

from ember.config import RunConfig, load_yaml, run_config_from_dict, save_yaml, to_dict
from ember.errors import EmberError

RUN_INPUTS = "inputs"  # the run's own data files, written before the run (see the module docstring)


def write_run_files(run_dir: Path, cfg: RunConfig, tokenizer_path: Path) -> None:
    run_dir.mkdir(parents=True, exist_ok=True)
    save_yaml(cfg, run_dir / "config.yaml")
    target = run_dir / "tokenizer.json"
    if Path(tokenizer_path).resolve() != target.resolve():
        tmp = target.with_name(".tokenizer.json.tmp")
        shutil.copyfile(tokenizer_path, tmp)
        tmp.replace(target)


def load_run_config(run_dir: str | Path, expect_kind: str | None = None) -> RunConfig:
    run_dir = Path(run_dir)
    path = run_dir / "config.yaml"
    if not path.is_file():
        seeds = sorted((d.name for d in run_dir.glob("seed-*") if (d / "config.yaml").is_file()),
                       key=lambda name: (len(name), name)) if run_dir.is_dir() else []
        if seeds:  # `ember finetune --seeds 1,2,3` writes one run per seed under the folder it was given
            raise EmberError(f"{run_dir} holds one fine-tuning run per seed ({', '.join(seeds)}; summary.json has "
                             f"their metrics): pass one of them, e.g. {run_dir / seeds[0]}")
        raise EmberError(
            f"{run_dir} is not an ember run folder (no config.yaml); pass a folder written by "
            "`ember pretrain`/`ember finetune`, or import a Hugging Face checkpoint with `ember convert`"
        )
    cfg = run_config_from_dict(load_yaml(path), where=str(path))
    if expect_kind and cfg.kind != expect_kind:
        hint = ""
        if (cfg.kind, expect_kind) == ("pretrain", "finetune"):
            hint = (f"; fine-tune it first (ember finetune --init {run_dir} ...), or score its embeddings on "
                    f"sentence similarity without training: ember evaluate {run_dir} --zero-shot")
        raise EmberError(f"{run_dir} holds a {cfg.kind} run, but a {expect_kind} run is needed here{hint}")
    return cfg


def check_family(run_dir: Path, cfg: RunConfig, supported: tuple[str, ...]) -> None:
    if cfg.model.family not in supported:
        raise EmberError(
            f"{run_dir} holds a {cfg.model.family!r} model; this command supports "
            f"{', '.join(supported)}. Use a run folder of a supported family."
        )


def holds(folder: str | Path, path: str | Path) -> bool:
    """Whether ``path`` is ``folder`` or lies inside it (replacing ``folder`` would delete it)."""
    folder = Path(folder).resolve()
    return Path(path).resolve() == folder or folder in Path(path).resolve().parents


def changed_settings(old: dict, new: dict, prefix: str = "") -> list[str]:
    """The settings that differ between two nested dicts, named down to the leaf (train.lr)."""
    changed = []
    for key in set(old) | set(new):
        a, b = old.get(key), new.get(key)
        if isinstance(a, dict) and isinstance(b, dict):
            changed += changed_settings(a, b, f"{prefix}{key}.")
        elif a != b:
            changed.append(prefix + key)
    return sorted(changed)


def check_run_dir(run_dir: Path, resume: bool, overwrite: bool, inputs=()) -> bool:
    """Whether ``run_dir`` holds an old run that --overwrite will replace; refuses one without
    --resume or --overwrite, and refuses a ``run_dir`` that is, or holds, one of the command's
    ``inputs`` (its --init, --teacher, --data: --overwrite deleted them). Nothing is changed: a
    verb with minutes of work before it writes (ELMo's features) asks first. The run's own
    inputs (RUN/inputs/) are not an old run."""
    run_dir = Path(run_dir)
    for source in inputs:
        if source and holds(run_dir, source):
            raise EmberError(f"--out {run_dir} is where this command reads {source} from; write the new run to "
                             "another folder")
    existing = run_dir.is_dir() and any(p.name != RUN_INPUTS for p in run_dir.iterdir())
    if not existing or resume:
        return False
    if not overwrite:
        raise EmberError(
            f"{run_dir} already holds a run; pass --resume to continue it or --overwrite to start over "
            "(or choose another --out)"
        )
    return True


def prepare_run_dir(run_dir: Path, resume: bool, overwrite: bool, inputs=()) -> None:
    """Refuse to mix a new run into a folder holding an old one (unless told to), or clear it;
    ``inputs`` as ``check_run_dir``'s."""
    if check_run_dir(run_dir, resume, overwrite, inputs):
        shutil.rmtree(run_dir)


# Settings a resumed run may change: they do not alter what is computed, only when it stops or where
# (a resumed run keeps its checkpoint's batch order whatever train.group_by_length says:
# Trainer.keep_data_order; so a run saved before the setting's "auto" resumes as it was).
RESUMABLE_CHANGES = ("max_time", "device", "pad_token_id", "group_by_length")


def check_resume_settings(saved: RunConfig, wanted: RunConfig, out: Path, skip_sections: tuple[str, ...] = ()) -> None:
    """Refuse a --resume whose command changes a saved setting (the learning rate, the task's
    length, --features ...): the continuation would not be the run it continues, and the
    config.yaml rewritten with the new value would misdescribe the steps already taken."""
    changed = [name for name in changed_settings(to_dict(saved), to_dict(wanted)) if "." in name
               and name.split(".")[0] not in skip_sections and name.split(".")[1] not in RESUMABLE_CHANGES]
    if changed or wanted.objective != saved.objective:
        raise EmberError(f"--resume continues {out} with its saved settings, but this command changes "
                         f"{changed or ['objective']}; drop those options or start a new run")


def last_evaluation(run_dir: str | Path) -> dict:
    """The metrics of a run's last held-out evaluation in RUN/metrics.jsonl (empty when it had none).
    A line that is not a JSON object (a run killed mid-write) is passed over: every reader of a run's
    final numbers (the Python API, the MLflow tracker, the model card) reads them this one way."""
    path, last = Path(run_dir) / "metrics.jsonl", {}
    if path.is_file():
        for line in path.read_text(encoding="utf-8").splitlines():
            try:
                record = json.loads(line)
            except ValueError:
                continue
            if isinstance(record, dict) and record.get("split") == "eval":
                last = {k: v for k, v in record.items() if k not in ("step", "split", "elapsed")}
    return last
