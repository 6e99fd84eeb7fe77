"""`ember evaluate`: score a fine-tuned run on a labelled split with the task's official metric."""

from __future__ import annotations

import json


def register(sub) -> None:
    p = sub.add_parser("evaluate", help="score a fine-tuned run on dev (or a labelled file)",
                       description="Score a fine-tuned run folder with the task's official metric "
                       "(accuracy; MCC for CoLA; F1+accuracy for MRPC; Pearson/Spearman for STS-B; "
                       "entity-level precision/recall/F1 for CoNLL-2003; EM/F1 with HasAns/NoAns for SQuAD, "
                       "SQuAD 2.0 with the no-answer threshold tuned on dev during fine-tuning, RUN/tuned.json).")
    p.add_argument("run_dir", help="fine-tuned run folder")
    p.add_argument("--split", default="", help="split of the task's data (default: the run's eval split)")
    p.add_argument("--file", help="a labelled file in the task's layout instead of a split "
                   "(TSV for GLUE tasks, CoNLL columns for conll2003)")
    p.add_argument("--task", default="", help="task name (default: the one the run was trained on); another "
                   "task with the run's labels is scored in its own language, e.g. an SST-2 run on "
                   "rusentiment-binary (zero-shot cross-lingual transfer)")
    p.set_defaults(run=run)


def run(args) -> int:
    from ember.api import evaluate

    result = evaluate(args.run_dir, args.split, args.file, args.task)
    print(json.dumps(result, indent=2))
    return 0
