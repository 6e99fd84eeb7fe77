"""`ember glue RUN_DIR`: fine-tune a model on every GLUE-style task present and write a paper-style table."""

from __future__ import annotations

import argparse

from ember.commands.common import count_arg, int_list_arg

HELP = """\
Fine-tune one pre-trained model on every GLUE-style task whose data is in $EMBER_DATA, once
per seed, and write a results table in the layout of the GLUE tables of BERT/RoBERTa/ELECTRA:

  MNLI-m (here SNLI) | QQP | QNLI | SST-2 | CoLA | STS-B | MRPC | RTE | Average

with the papers' metrics (accuracy, MCC, Pearson/Spearman, F1/accuracy) x 100 as mean ± std
and median over seeds. SNLI stands in for MNLI (train on its dev, score on its test: it has
no train split here); QQP is not available; QNLI runs only with --train-file qnli=PATH.
Missing tasks are shown as "–" with the reason. Settings are BERT's (batch 32, lr 2e-5,
3 epochs, 10% warm-up, max length 128; a T5 run: T5's Adafactor at a constant 1e-3, no
warm-up; an LSTM run: lr 1e-3) unless overridden for all tasks.

OUT/glue.md, OUT/glue.json and OUT/glue.png are rebuilt after every run; OUT/runs/<task>-seed<k>/
hold the fine-tuning runs. Re-running the same command skips finished runs and resumes an
interrupted one, so a long table can be built over several sessions.

examples:
  ember glue runs/bert-mini --out runs/bert-mini-glue
  ember glue runs/bert-mini --tasks sst2,rte --seeds 1 --train-limit 2000 --epochs 1 --out runs/quick
  ember glue random --model bert-mini --tokenizer runs/tok/tokenizer.json --out runs/random-glue
"""


def register(sub) -> None:
    p = sub.add_parser("glue", help="fine-tune on every GLUE-style task present; paper-style table",
                       description=HELP, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("init", metavar="RUN_DIR",
                   help="pre-training run folder, HF checkpoint folder, or 'random' (with --model/--tokenizer)")
    p.add_argument("--out", required=True, help="folder for the runs and the table")
    p.add_argument("--tasks", default="", help="comma-separated subset of snli,qnli,sst2,cola,stsb,mrpc,rte "
                   "(default: all of them)")
    p.add_argument("--seeds", type=int_list_arg, default=[1, 2, 3], help="comma-separated fine-tuning seeds (default 1,2,3)")
    p.add_argument("--train-limit", type=count_arg, help="use only the first N training examples of each task")
    p.add_argument("--epochs", type=float, help="training epochs for every task (default: BERT's 3)")
    p.add_argument("--max-length", type=int, help="max tokens per example (default: BERT's 128)")
    p.add_argument("--lr", type=float, help="peak learning rate for every task (default: BERT's 2e-5, T5's and an LSTM's 1e-3; "
                   "miniature models fine-tune better with ~1e-4, Turc et al. 2019)")
    p.add_argument("--train-file", action="append", default=[], metavar="TASK=PATH",
                   help="training TSV for a task the data folder lacks one for, e.g. qnli=QNLI/train.tsv")
    p.add_argument("--model", default="", help="model preset for RUN_DIR 'random' (e.g. bert-mini)")
    p.add_argument("--tokenizer", default="", help="tokenizer.json for RUN_DIR 'random'")
    p.add_argument("--device", default="cpu", help="torch device (default cpu)")
    p.add_argument("--threads", type=int, default=0, help="CPU threads per run (default: torch's; 1 is "
                   "much faster on a machine shared with other jobs)")
    p.add_argument("--no-progress", action="store_true", help="no progress bars (for logs)")
    p.set_defaults(run=run)


def run(args) -> int:
    from pathlib import Path

    from ember.experiments.glue import parse_train_files, run_glue

    results = run_glue(
        args.init, args.out, tasks=[t.strip() for t in args.tasks.split(",") if t.strip()] or None,
        seeds=args.seeds, train_limit=args.train_limit, epochs=args.epochs,
        max_length=args.max_length, lr=args.lr, train_files=parse_train_files(args.train_file),
        model=args.model, tokenizer=args.tokenizer, device=args.device, num_threads=args.threads,
        progress=not args.no_progress)
    print((Path(args.out) / "glue.md").read_text().split("\n\nNotes:")[0])  # the table itself
    return 0 if results else 1
