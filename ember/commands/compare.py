"""`ember compare`: equal-compute comparison of pre-training recipes (see ember/compare.py)."""

from __future__ import annotations

import argparse
import textwrap

from ember.commands.common import count_arg
from ember.errors import EmberError


PARAGRAPHS = (
    "Pre-train every RECIPE on the same prepared corpus for the same time budget, fine-tune each "
    "pre-trained model on the same tasks and seeds, and write OUT/results.md (rows: models; columns: "
    "mean ± std over seeds of each task's official metric, their average, pre-training steps and "
    "tokens), OUT/results.json and OUT/comparison.png. Runs live in OUT/runs/<label>/.",
    "Equal compute: recipes run at different speeds and the learning-rate schedule needs a step "
    "count, so each recipe is first probed (2 warm-up + --probe-steps timed steps, in-process, "
    "discarded); then max_steps = budget x measured steps/s, and max_time = budget is a hard cap. "
    "The budget counts training-step time (held-out evaluation and checkpoint writes are not "
    "charged). Measured speed, planned and actual steps, time and tokens are all recorded.",
    "On a shared or busy machine wall time is not equal compute: add --set train.clock=cpu "
    "--set train.num_threads=1 and the budget (probe, max_steps and cap) counts this process's "
    "CPU time on one thread instead, which other programs cannot eat.",
    "Resumable: run the same command again and finished runs in OUT are reused; an interrupted "
    "one resumes from its last checkpoint.",
)


def register(sub) -> None:
    p = sub.add_parser(
        "compare",
        help="pre-train several recipes for the same wall time, fine-tune each, tabulate and plot",
        formatter_class=argparse.RawDescriptionHelpFormatter,
        description="\n\n".join(textwrap.fill(text, 88) for text in PARAGRAPHS),
        epilog="example:\n  ember compare bert-mini electra-mini spanbert-mini albert-mini --data "
        "runs/wiki-prepared \\\n    --budget 20m --seeds 1,2,3 --baseline random --out runs/compare",
    )
    p.add_argument("recipes", nargs="+", metavar="RECIPE", help="recipe names (ember/recipes) or YAML paths")
    p.add_argument("--data", required=True, action="append", metavar="PATH | RECIPE=PATH",
                   help="prepared corpus folder (from `ember prepare`) shared by all recipes; repeat as "
                   "RECIPE=PATH for a recipe that needs its own vocabulary (T5's sentinels, GPT's BPE)")
    p.add_argument("--budget", required=True, help="pre-training time per recipe: 90s, 20m, 1.5h or seconds")
    p.add_argument("--tasks", default="sst2,cola,mrpc,rte,stsb", help="fine-tuning tasks (default: %(default)s)")
    p.add_argument("--seeds", default="1,2,3", help="fine-tuning seeds, one run each (default: %(default)s)")
    p.add_argument("--out", required=True, help="folder for the runs and the report (re-use it to resume)")
    p.add_argument("--set", dest="overrides", action="append", default=[], metavar="SECTION.KEY=VALUE",
                   help="override a setting of every recipe, e.g. --set train.batch_size=64 (repeatable)")
    p.add_argument("--label", action="append", default=[], metavar="NAME=RECIPE",
                   help="name a recipe's row and folder (default: the recipe's name) (repeatable)")
    p.add_argument("--baseline", choices=["random"],
                   help="also fine-tune a randomly initialised model of the first recipe's shape")
    p.add_argument("--finetune-epochs", type=float, help="fine-tuning epochs (default: the task's, 3)")
    p.add_argument("--finetune-lr", action="append", default=[], metavar="LR | RECIPE=LR",
                   help="fine-tuning peak learning rate for every model (default 1e-4, suits mini sizes); repeat "
                   "as RECIPE=LR for a model whose optimiser wants another (T5: t5-mini=1e-3, Adafactor)")
    p.add_argument("--train-limit", type=count_arg, help="fine-tune on the first N training examples only")
    p.add_argument("--max-length", type=int, help="fine-tuning max tokens per example (default 128)")
    p.add_argument("--pretrain-seed", type=int, default=0, help="pre-training seed for every recipe (default 0)")
    p.add_argument("--probe-steps", type=int, default=10, help="timed steps of the speed probe (default 10)")
    p.add_argument("--no-progress", action="store_true", help="no progress bars (for logs)")
    p.set_defaults(run=run)


def parse_list(text: str, what: str, cast=str) -> list:
    items = [t.strip() for t in text.split(",") if t.strip()]
    try:
        values = [cast(t) for t in items]
    except ValueError:
        raise EmberError(f"--{what} {text!r}: expected a comma-separated list, e.g. 1,2,3") from None
    if not values:
        raise EmberError(f"--{what} is empty; give at least one")
    return values


def parse_rates(items: list[str]) -> tuple[float, tuple[tuple[str, float], ...]]:
    """--finetune-lr values -> (the rate of every model, ((recipe or label, rate), ...))."""
    default, own = 1e-4, []
    for item in items:
        name, sep, value = item.rpartition("=")
        try:
            rate = float(value)
        except ValueError:
            raise EmberError(f"--finetune-lr {item!r}: write a number (1e-4) or RECIPE=NUMBER (t5-mini=1e-3)") from None
        if sep:
            own.append((name, rate))
        else:
            default = rate
    return default, tuple(own)


def run(args) -> int:
    from ember.experiments.compare import FinetuneSettings, parse_budget, run_compare

    if args.probe_steps < 1:
        raise EmberError("--probe-steps must be at least 1")
    if args.train_limit is not None and args.train_limit < 1:
        raise EmberError("--train-limit must be a positive number of examples")
    lr, lr_for = parse_rates(args.finetune_lr)
    results = run_compare(
        args.recipes, args.data, parse_budget(args.budget), args.out,
        tasks=parse_list(args.tasks, "tasks"), seeds=parse_list(args.seeds, "seeds", int),
        overrides=args.overrides, labels=args.label,
        finetune=FinetuneSettings(lr=lr, lr_for=lr_for, epochs=args.finetune_epochs,
                                  max_length=args.max_length, train_limit=args.train_limit),
        baseline=args.baseline == "random", pretrain_seed=args.pretrain_seed, probe_steps=args.probe_steps,
        progress=not args.no_progress)
    ran = results["ran"]
    print(f"ran {ran['pretrain']} pre-training and {ran['finetune']} fine-tuning runs "
          f"(finished ones in {args.out} were reused)")
    return 0
