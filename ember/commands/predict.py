"""`ember predict`: run a fine-tuned model over a file and write its predictions."""

from __future__ import annotations

from ember.commands.common import add_decoding_options, decoding_of


def register(sub) -> None:
    p = sub.add_parser("predict", help="write predictions for a file",
                       description="Run a fine-tuned model over a file and write one prediction per row: "
                       "JSONL when --out ends in .jsonl, CSV when it ends in .csv, TSV otherwise. "
                       "Classification and regression (GLUE tasks, your own --task classify/pair/regression "
                       "runs): read a TSV in the task's layout (your own runs: CSV/TSV/JSONL with the run's "
                       "text columns; label column optional) or JSONL (.jsonl: one object per line with the "
                       "task's text keys, e.g. {\"sentence\": ...}, or \"text\"/\"text_pair\") and write id, "
                       "prediction and per-label probabilities (a score for regression). "
                       "CoNLL-2003 NER and --task tag runs: read plain text (one sentence per line), a CoNLL "
                       "file (.conll/.iob, one word per line) or JSONL ({\"words\": [...]} or {\"text\": ...} "
                       "per line) and write word-level tags and entities as JSONL, or word<TAB>tag lines "
                       "otherwise. SQuAD and --task qa runs: read a SQuAD JSON file (answers optional) and "
                       "write one answer per question; SQuAD 2.0 runs answer \"\" (no answer) with the "
                       "no-answer threshold tuned on dev (RUN/tuned.json). Text-to-text (T5) runs: read the "
                       "task's inputs as above (--task text2text: the run's input column) and write each "
                       "decoded output with the prediction it parses to (--num-beams and friends below).")
    p.add_argument("run_dir", help="fine-tuned run folder")
    p.add_argument("--input", required=True, help="input file in the task's layout (see above)")
    p.add_argument("--out", required=True, help="predictions file (.jsonl, .csv, or .tsv)")
    add_decoding_options(p)
    p.add_argument("--no-progress", action="store_true", help="no progress bar (for logs)")
    p.set_defaults(run=run)


def run(args) -> int:
    from ember.api.predict import run_predictions

    done = run_predictions(args.run_dir, args.input, decoding_of(args), not args.no_progress, args.out)
    note = f" ({done.truncated} truncated to {done.max_length} tokens)" if done.truncated else ""
    print(f"wrote {len(done.rows)} predictions to {args.out}{note}")
    if done.no_answer_threshold is not None:
        print(f"no-answer threshold {done.no_answer_threshold:.4f} ("
              f"{'tuned on dev, from tuned.json' if done.threshold_tuned else 'default'}): "
              "a question is unanswered when its no_answer_score exceeds it")
    return 0
