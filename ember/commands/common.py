"""Argument helpers shared by several verbs."""

from __future__ import annotations

from ember.durations import parse_duration

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
