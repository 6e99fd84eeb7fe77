"""`ember evaluate`: score a fine-tuned run on a labelled split with the task's official metric."""

from __future__ import annotations

import json


def register(sub) -> None:
    p = sub.add_parser("evaluate", help="score a fine-tuned run on dev (or a labelled file)",
                       description="Score a fine-tuned run folder with the task's official metric "
                       "(accuracy; MCC for CoLA; F1+accuracy for MRPC; Pearson/Spearman for STS-B).")
    p.add_argument("run_dir", help="fine-tuned run folder")
    p.add_argument("--split", default="", help="split of the task's data (default: the run's eval split)")
    p.add_argument("--file", help="a labelled TSV in the task's layout instead of a split")
    p.add_argument("--task", default="", help="task name (default: the one the run was trained on)")
    p.set_defaults(run=run)


def run(args) -> int:
    from ember.train.finetune import evaluate_run

    result = evaluate_run(args.run_dir, args.split, args.file, args.task)
    print(json.dumps(result, indent=2))
    return 0
