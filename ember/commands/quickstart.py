"""`ember quickstart`: the whole path from raw text to a fine-tuned classifier."""

from __future__ import annotations

from pathlib import Path

from ember.durations import duration_arg, format_duration
from ember.experiments.quickstart import PRETRAIN_STEPS, SAFETY_STOP


def register(sub) -> None:
    p = sub.add_parser(
        "quickstart",
        help="tokenizer -> shards -> pre-train bert-mini (300 steps) -> fill-mask -> SST-2 (+ the real checkpoint "
        "on the same sentences)",
        description="Train a WordPiece tokenizer on $EMBER_DATA/wiki-en, prepare shards, pre-train "
        "bert-mini for a fixed number of steps (the same model on any machine; a wall-clock cap only "
        "stops a far too slow run, and says so), show fill-mask predictions, fine-tune on SST-2 and "
        "print dev accuracy next to the majority-class rate; then, when the real checkpoint is present, "
        "fine-tune it on the same sentences and print both accuracies side by side. Without the data "
        "folder it falls back to Python standard-library docstrings.",
    )
    p.add_argument("--out", default="runs/quickstart",
                   help="folder for everything (replaced on each run; a folder with other files in it is refused)")
    p.add_argument("--pretrain-steps", type=int, default=PRETRAIN_STEPS,
                   help=f"pre-training steps: the budget that defines the model (default {PRETRAIN_STEPS})")
    p.add_argument("--pretrain-time", type=duration_arg, default=SAFETY_STOP,
                   help="pre-training wall-clock safety stop; when it fires before --pretrain-steps the run "
                   f"warns that its model is not the quickstart's (default {format_duration(SAFETY_STOP)})")
    p.add_argument("--max-docs", type=int, default=1500, help="documents to use from the corpus (default 1,500)")
    p.add_argument("--finetune-epochs", type=float, default=1.0, help="SST-2 epochs (default 1)")
    p.add_argument("--finetune-limit", type=int, default=20000,
                   help="SST-2 training sentences to use (default 20000; 0 = all 67,349)")
    p.add_argument("--checkpoint", type=Path, default=None,
                   help="a real pre-trained encoder (HF or sentence-transformers folder) fine-tuned on the same "
                   "SST-2 sentences at the end, for comparison (default: $EMBER_DATA/checkpoints/"
                   "all-MiniLM-L6-v2 when present; '' skips it)")
    p.add_argument("--no-progress", action="store_true", help="no progress bars")
    p.set_defaults(run=run)


def run(args) -> int:
    from ember.experiments.quickstart import run_quickstart

    run_quickstart(Path(args.out), args.pretrain_steps, args.pretrain_time, args.max_docs,
                   args.finetune_epochs, args.finetune_limit or None, progress=not args.no_progress,
                   checkpoint=args.checkpoint)
    return 0
