"""What a sweep searches: ``section.key`` settings (any `--set` key of the command) and their values.

A search space maps a dotted key to either a list of values (a categorical choice, the only
kind a grid takes) or a range: ``float:LO:HI``, ``log:LO:HI`` (log-uniform, for learning rates)
or ``int:LO:HI``. On the command line: ``--param train.lr=5e-5,3e-5,2e-5``,
``--param train.lr=log:1e-5:1e-4``; from Python the same strings, or a list for a choice.

Every key and value is checked against the config's own dataclasses before anything is
written (``--set`` would have accepted ``train.lrr`` only to fail later, or a float batch size
only at the first step): a key that does not exist and a range of the wrong type are one line.
Nothing here imports optuna; ``suggest`` takes the trial it is handed.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass

from ember.errors import EmberError

# The papers' fine-tuning grids, chosen on dev (the settings each paper reports searching).
GRIDS = {
    # Devlin et al. 2019, App. A.3: "batch size 16, 32; learning rate (Adam) 5e-5, 3e-5, 2e-5;
    # number of epochs 2, 3, 4", the best on dev kept.
    "bert-paper": {"train.lr": [5e-5, 3e-5, 2e-5], "train.batch_size": [16, 32], "task.epochs": [2, 3, 4]},
    # Liu et al. 2019 (RoBERTa), Table 10: lr {1e-5, 2e-5, 3e-5}, batch {16, 32}; 10 epochs, 6% warm-up.
    "roberta-paper": {"train.lr": [1e-5, 2e-5, 3e-5], "train.batch_size": [16, 32]},
}
# The config sections each command's overrides reach (distillation takes train.* only; fine-tuning
# builds its model from the starting point, so model.* changes only what that allows).
SECTIONS = {
    "finetune": ("train", "task", "model", "knowledge"),
    "distill": ("train",),
    "pretrain": ("model", "data", "train", "electra", "elmo", "denoising", "plm", "xlm", "knowledge"),
}
RANGE_KINDS = ("float", "log", "int")


@dataclass(frozen=True)
class Param:
    """One searched setting: ``choices`` (a list) or ``kind`` in RANGE_KINDS with ``low``/``high``."""

    key: str
    choices: tuple = ()
    kind: str = "choice"
    low: float = 0.0
    high: float = 0.0

    def describe(self) -> str:
        if self.kind == "choice":
            return ",".join(map(str, self.choices))
        return f"{self.kind}:{self.low:g}:{self.high:g}"

    def suggest(self, trial):
        """The trial's value (an optuna Trial; distributions as optuna names them)."""
        if self.kind == "choice":
            return trial.suggest_categorical(self.key, list(self.choices))
        if self.kind == "int":
            return trial.suggest_int(self.key, int(self.low), int(self.high))
        return trial.suggest_float(self.key, self.low, self.high, log=self.kind == "log")


def field_default(key: str, command: str):
    """The default of config field ``key`` (its type decides what values it takes); a key that does
    not exist, or that ``command`` does not read, is one line."""
    from ember.config import RunConfig

    sections = SECTIONS[command]
    parts = key.split(".")
    if len(parts) != 2:
        raise EmberError(f"--param {key}: name a setting as section.key, e.g. train.lr (a --set key of {command})")
    section, name = parts
    if section not in sections:
        raise EmberError(f"--param {key}: {command} takes settings of {', '.join(s + '.*' for s in sections)}, "
                         f"not {section}.*")
    node = getattr(RunConfig(), section)
    names = [f.name for f in dataclasses.fields(node)]
    if name not in names:
        import difflib

        near = difflib.get_close_matches(name, names, n=1)
        hint = f" (did you mean {section}.{near[0]}?)" if near else ""
        raise EmberError(f"--param {key}: there is no setting {name} in {section}{hint}")
    return getattr(node, name)


def _coerce(key: str, value, default):
    from ember.config import _coerce

    return _coerce(value, default, f"--param {key}")


def parse_param(key: str, spec, command: str) -> Param:
    """``spec``: a list of values, or a string "a,b,c" / "float:LO:HI" / "log:LO:HI" / "int:LO:HI"."""
    default = field_default(key, command)
    if isinstance(spec, (list, tuple)):
        values = list(spec)
    elif isinstance(spec, str) and spec.split(":", 1)[0] in RANGE_KINDS:
        return _range(key, spec, default)
    elif isinstance(spec, str):
        values = [v.strip() for v in spec.split(",") if v.strip()]
        import yaml

        values = [yaml.safe_load(v) for v in values]  # "5e-5" -> float, "true" -> bool, as --set reads them
    else:
        values = [spec]
    if not values:
        raise EmberError(f"--param {key}: no values; give a,b,c or float:LO:HI / log:LO:HI / int:LO:HI")
    choices = tuple(_coerce(key, v, default) for v in values)
    if len(set(choices)) != len(choices):
        raise EmberError(f"--param {key}: a value is given twice ({spec})")
    return Param(key, choices)


def _range(key: str, spec: str, default) -> Param:
    kind, *bounds = spec.split(":")
    if len(bounds) != 2:
        raise EmberError(f"--param {key}={spec}: a range is {kind}:LOW:HIGH")
    if isinstance(default, bool) or not isinstance(default, (int, float)):
        raise EmberError(f"--param {key}={spec}: {key} is a {type(default).__name__} setting; a range needs a "
                         "number setting (give its values as a,b,c)")
    if kind == "int" and not isinstance(default, int):
        raise EmberError(f"--param {key}={spec}: {key} is a float setting; use float:LO:HI or log:LO:HI")
    if kind != "int" and isinstance(default, int):
        raise EmberError(f"--param {key}={spec}: {key} is a whole-number setting; use int:LO:HI (or values a,b,c)")
    try:
        low, high = (int(b) if kind == "int" else float(b) for b in bounds)
    except ValueError:
        whole = "whole " if kind == "int" else ""
        raise EmberError(f"--param {key}={spec}: the bounds must be {whole}numbers") from None
    if not (math.isfinite(low) and math.isfinite(high)) or low >= high:
        raise EmberError(f"--param {key}={spec}: LOW must be below HIGH")
    if kind == "log" and low <= 0:
        raise EmberError(f"--param {key}={spec}: a log range needs LOW > 0")
    return Param(key, kind=kind, low=low, high=high)


def search_space(command: str, params: dict | None = None, grid: str | None = None) -> list[Param]:
    """The checked space: a named grid's settings, then ``params`` (which win over the grid's)."""
    if command not in SECTIONS:
        raise EmberError(f"ember sweep runs finetune, pretrain or distill, not {command!r}")
    space: dict = {}
    if grid:
        if grid not in GRIDS:
            raise EmberError(f"--grid {grid}: no such grid; known: {', '.join(GRIDS)}")
        space.update(GRIDS[grid])
    space.update(params or {})
    if not space:
        raise EmberError("nothing to search: give --grid NAME or --param section.key=VALUES (repeatable)")
    return [parse_param(key, spec, command) for key, spec in space.items()]


def parse_param_args(items: list[str]) -> dict:
    """``--param KEY=SPEC`` arguments -> {KEY: SPEC}; a repeated key is refused."""
    out: dict = {}
    for item in items:
        key, sep, spec = item.partition("=")
        if not sep or not key.strip() or not spec.strip():
            raise EmberError(f"--param {item!r}: write section.key=VALUES, e.g. train.lr=5e-5,3e-5 or "
                             "train.lr=log:1e-5:1e-4")
        if key.strip() in out:
            raise EmberError(f"--param {key.strip()} is given twice")
        out[key.strip()] = spec.strip()
    return out


def check_fixed_overrides(overrides: list[str], space: list[Param], command: str) -> None:
    """The command's own ``--set`` keys: real settings, none also searched, and never selection on test."""
    searched = {p.key for p in space}
    for item in overrides:
        key, _, value = item.partition("=")
        key = key.strip()
        if key in searched:
            raise EmberError(f"--set {key} is also searched (--param/--grid); give it one way")
        if key.startswith("train.") or key.startswith("task.") or command == "pretrain":
            field_default(key, command)
        if key == "task.eval_split" and value.strip() == "test":
            raise EmberError("a sweep chooses its best trial on dev; task.eval_split=test would choose on test")
