"""`ember evaluate`: score a fine-tuned run on a labelled split with the task's official metric, or
any encoder run's zero-shot similarity (--zero-shot)."""

from __future__ import annotations

import json

from ember.commands.common import add_decoding_options, decoding_of


def register(sub) -> None:
    p = sub.add_parser("evaluate", help="score a fine-tuned run on dev (or a labelled file); --zero-shot: any encoder's embeddings on STS",
                       description="Score a fine-tuned run folder with the task's official metric "
                       "(accuracy; MCC for CoLA; F1+accuracy for MRPC; Pearson/Spearman for STS-B; "
                       "entity-level precision/recall/F1 for CoNLL-2003; EM/F1 with HasAns/NoAns for SQuAD, "
                       "SQuAD 2.0 with the no-answer threshold tuned on dev during fine-tuning, RUN/tuned.json). "
                       "--zero-shot scores any encoder run's embeddings on sentence similarity instead.")
    p.add_argument("run_dir", help="fine-tuned run folder (with --zero-shot: any encoder run)")
    p.add_argument("--split", default="", help="split of the task's data (default: the run's eval split)")
    p.add_argument("--file", help="a labelled file in the task's layout instead of a split "
                   "(TSV for GLUE tasks, CoNLL columns for conll2003, SQuAD JSON for squad/squad2; a custom "
                   "task: a file like its --dev)")
    p.add_argument("--task", default="", help="task name (default: the one the run was trained on); another "
                   "task with the run's labels is scored in its own language, e.g. an SST-2 run on "
                   "rusentiment-binary (zero-shot cross-lingual transfer)")
    zero = p.add_argument_group("zero-shot similarity (any encoder run, no fine-tuning)")
    zero.add_argument("--zero-shot", action="store_true",
                      help="score the cosine similarity of the two sentences' pooled embeddings against the "
                      "gold scores, Pearson/Spearman x100 (as sentence-transformers reports STS-B): "
                      "--task stsb (dev by default), or --file PAIRS.tsv with sentence1, sentence2 and score "
                      "columns")
    zero.add_argument("--pooling", choices=["mean", "cls"], help="default: the run's (RUN/embedding.json; else mean)")
    zero.add_argument("--layer", type=int, help="hidden layer to pool (0 = embeddings, -1 = last, the default)")

    p.add_argument("--max-length", type=int, help="tokens per input (default: the run's task.max_length; "
                   "at most the model's positions, e.g. a long model's whole documents; --zero-shot: per sentence)")
    add_decoding_options(p)
    p.add_argument("--no-progress", action="store_true", help="no progress bar (for logs)")
    p.set_defaults(run=run)


def run(args) -> int:
    from ember.api import evaluate

    options = {k: getattr(args, k) for k in ("pooling", "layer", "max_length") if getattr(args, k) is not None}
    result = evaluate(args.run_dir, args.split, args.file, args.task, zero_shot=args.zero_shot,
                      progress=not args.no_progress, **decoding_of(args), **options)
    print(json.dumps(result, indent=2))
    return 0
