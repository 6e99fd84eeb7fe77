"""Argument helpers shared by several verbs."""

from __future__ import annotations

import argparse

from ember.durations import duration_arg


def count_arg(text: str) -> int:
    """A number of examples (--train-limit, --limit) as an argparse ``type=``: 1 or more."""
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a whole number, got {text!r}") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"expected 1 or more, got {value}")
    return value


def int_list_arg(text: str) -> list[int]:
    """'1,2,3' -> [1, 2, 3] as an argparse ``type=`` (--seeds, --shots): a typo is argparse's
    one-line usage error naming the flag."""
    try:
        values = [int(v) for v in text.split(",") if v.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected comma-separated integers, e.g. 1,2,3; got {text!r}") from None
    if not values or min(values) < 0:
        raise argparse.ArgumentTypeError(f"expected non-negative integers, e.g. 1,2,3; got {text!r}")
    repeated = sorted({v for v in values if values.count(v) > 1})
    if repeated:  # a repeat would run the same seed (or k) twice and count it twice in the summary
        raise argparse.ArgumentTypeError(f"{', '.join(map(str, repeated))} given more than once in {text!r}")
    return values


def add_train_options(parser, defaults_note: str = "", overridable: str = "any config field") -> None:
    parser.add_argument("--seed", type=int, help="random seed (weights, data order, masks, dropout)")
    parser.add_argument("--device", help="torch device, e.g. cpu or cuda (default: cpu)")
    parser.add_argument("--dtype", choices=["float32", "bfloat16"],
                        help="float32 (default; right for most CPUs) or bfloat16 autocast: fast on GPUs with bf16 "
                             "and on CPUs with Intel AMX (Xeon 4th gen+, ~2x at bert-mini), slow elsewhere")
    parser.add_argument("--max-time", type=duration_arg,
                        help="wall-clock training budget, e.g. 30m or 2h; stops with a checkpoint")
    parser.add_argument("--resume", action="store_true",
                        help="continue the run in --out from its newest intact checkpoint")
    parser.add_argument("--overwrite", action="store_true", help="delete an existing run in --out first")
    parser.add_argument("--set", dest="overrides", action="append", default=[], metavar="SECTION.KEY=VALUE",
                        help=f"override {overridable}, e.g. --set train.lr=1e-4 (repeatable)")
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


def add_backend_options(parser, start_up: str = "exported on the fly") -> None:
    """--onnx / --int8 / --bf16 / --onnx-int8 (one at a time); ``backend_of`` reads them back."""
    group = parser.add_mutually_exclusive_group()
    group.add_argument("--onnx", action="store_true", help=f"run with ONNX Runtime ({start_up})")
    group.add_argument("--int8", action="store_true", help="run PyTorch int8 dynamic quantization")
    group.add_argument("--bf16", action="store_true",
                       help="run PyTorch in bfloat16: ~2x fp32 on CPUs with AMX (Intel Xeon 4th gen and later) "
                            "and on GPUs, far slower on other CPUs (a warning says so)")
    group.add_argument("--onnx-int8", action="store_true", help="run ONNX Runtime with int8 weights")


def backend_of(args) -> str:
    """The backend name the predictor takes ("" = PyTorch fp32)."""
    for flag in ("onnx", "int8", "bf16", "onnx_int8"):
        if getattr(args, flag, False):
            return flag.replace("_", "-")
    return ""


def add_decoding_options(parser) -> None:
    """How a text-to-text (T5) run decodes its outputs here; ``decoding_of`` reads them back."""
    group = parser.add_argument_group("decoding (text-to-text T5 runs; default: the run's task.* settings)")
    group.add_argument("--num-beams", type=count_arg, metavar="N",
                       help="beams (1 = greedy, the default; T5 used 4 for its long outputs, Raffel et al. §3.7)")
    group.add_argument("--length-penalty", type=float, metavar="A",
                       help="beam score = log p / length^A (T5: 0.6; default 1.0)")
    group.add_argument("--max-new-tokens", type=int, metavar="N",
                       help="the most tokens written per output (default: the task's budget: its longest "
                            "label + 1; SQuAD and your own targets: at least 32, your own twice the longest one "
                            "fine-tuning read)")


def decoding_of(args) -> dict:
    from ember.tasks.task_model import DECODING_SETTINGS

    return {k: getattr(args, k) for k in DECODING_SETTINGS}


def stopped_line(result, out) -> str:
    """The last line of a corpus-level run (pre-training, pre-training distillation): where it
    stopped and its last held-out numbers, so a run with --no-progress still shows how it ended."""
    trained = result.result
    metrics = sorted(result.metrics.items(), key=lambda kv: kv[0] != "loss")  # the loss first
    held_out = ", ".join(f"{k} {v:.4g}" for k, v in metrics if isinstance(v, (int, float)))
    return (f"stopped at step {trained['step']} after {trained['elapsed'] / 60:.1f} min; "
            + (f"held-out {held_out}; " if held_out else "") + f"run folder: {out}")
