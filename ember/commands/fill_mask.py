"""`ember fill-mask`: show what a pre-trained MLM predicts for each [MASK]."""

from __future__ import annotations


def register(sub) -> None:
    p = sub.add_parser("fill-mask", help="predict the [MASK] tokens of a sentence",
                       description="Print the top-k predictions of a pre-training run's MLM head "
                       "for each mask token in TEXT.")
    p.add_argument("run_dir", help="pre-training run folder")
    p.add_argument("text", nargs="+", help="text with one or more mask tokens ([MASK]; <mask> for a "
                   "RoBERTa / byte-level BPE vocabulary)")
    p.add_argument("--top-k", type=int, default=5, help="predictions per mask (default 5)")
    p.set_defaults(run=run)


def run(args) -> int:
    from ember.tasks.inference.fill_mask import FillMask

    fill = FillMask(args.run_dir)
    for text in args.text:
        print(text)
        for i, predictions in enumerate(fill(text, args.top_k)):
            shown = ", ".join(f"{tok} ({p:.2g})" for tok, p in predictions)
            print(f"  mask {i + 1}: {shown}")
    return 0
