"""Argument helpers shared by several verbs."""

from __future__ import annotations

import re
from pathlib import Path

from ember.errors import EmberError

RECIPES_DIR = Path(__file__).resolve().parent.parent / "recipes"


def parse_duration(text: str) -> float:
    """'90', '90s', '20m', '1.5h' -> seconds."""
    match = re.fullmatch(r"\s*([0-9]*\.?[0-9]+)\s*([smh]?)\s*", str(text))
    if not match:
        raise EmberError(f"cannot read duration {text!r}; write e.g. 90s, 20m or 1.5h")
    value, unit = float(match.group(1)), match.group(2) or "s"
    return value * {"s": 1, "m": 60, "h": 3600}[unit]


def recipe_path(name: str) -> Path:
    path = Path(name)
    if path.suffix in (".yaml", ".yml") and path.is_file():
        return path
    candidate = RECIPES_DIR / f"{name}.yaml"
    if candidate.is_file():
        return candidate
    known = sorted(p.stem for p in RECIPES_DIR.glob("*.yaml"))
    raise EmberError(f"unknown recipe {name!r}; known recipes: {', '.join(known)} (or pass a .yaml path)")


def add_train_options(parser, defaults_note: str = "") -> None:
    parser.add_argument("--seed", type=int, help="random seed (weights, data order, masks, dropout)")
    parser.add_argument("--device", help="torch device, e.g. cpu or cuda (default: cpu)")
    parser.add_argument("--dtype", choices=["float32", "bfloat16"],
                        help="float32 (right for CPUs) or bfloat16 autocast (GPUs that support it)")
    parser.add_argument("--max-time", type=parse_duration,
                        help="wall-clock training budget, e.g. 30m or 2h; stops with a checkpoint")
    parser.add_argument("--resume", action="store_true",
                        help="continue the run in --out from its newest intact checkpoint")
    parser.add_argument("--overwrite", action="store_true", help="delete an existing run in --out first")
    parser.add_argument("--set", dest="overrides", action="append", default=[], metavar="SECTION.KEY=VALUE",
                        help="override any config field, e.g. --set train.lr=1e-4 (repeatable)")
    parser.add_argument("--no-progress", action="store_true", help="no progress bar (for logs)")


def train_overrides(args) -> list[str]:
    """Translate the common flags into dotted overrides."""
    out = list(args.overrides)
    for flag, key in (("seed", "train.seed"), ("device", "train.device"), ("dtype", "train.dtype"),
                      ("max_time", "train.max_time")):
        value = getattr(args, flag, None)
        if value is not None:
            out.append(f"{key}={value}")
    return out
