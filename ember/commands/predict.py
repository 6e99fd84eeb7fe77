"""`ember predict`: run a fine-tuned model over a file and write its predictions."""

from __future__ import annotations

import csv
import io
import json
from pathlib import Path

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
    from ember.errors import EmberError
    from ember.runs.checkpoint import atomic_write_text
    from ember.runs.folder import load_run_config
    from ember.tasks.batching import inference_progress
    from ember.tasks.task_model import load_run_adapter, load_task_module, pad_token_id, with_decoding
    from ember.tokenizers import load_tokenizer

    run_dir, out = Path(args.run_dir), Path(args.out)
    if out.is_dir():  # found now, not after the model has run over the whole file
        raise EmberError(f"--out {out} is a folder; name the predictions file, e.g. {out / 'predictions.jsonl'}")
    cfg = with_decoding(load_run_config(run_dir, expect_kind="finetune"), decoding_of(args))
    adapter = load_run_adapter(run_dir, cfg)
    if not hasattr(adapter, "predict_file"):
        raise EmberError(f"`ember predict` does not support {adapter.display_name} yet; "
                         "use `ember evaluate` to score a labelled file")
    tokenizer = load_tokenizer(run_dir / "tokenizer.json")
    module = load_task_module(run_dir, cfg, adapter, pad_token_id(tokenizer))
    with inference_progress(f"predicting {Path(args.input).name}", not args.no_progress):
        rows, n_truncated = adapter.predict_file(module, tokenizer, cfg.task.max_length, args.input,
                                                 cfg.task.eval_batch_size, cfg.train.device)
    if out.suffix == ".jsonl":
        text = "".join(json.dumps(r, ensure_ascii=False) + "\n" for r in rows)
    elif out.suffix == ".csv":
        text = tsv_to_csv(adapter.rows_to_tsv(rows))
    else:
        text = adapter.rows_to_tsv(rows)
    atomic_write_text(out, text)
    note = f" ({n_truncated} truncated to {cfg.task.max_length} tokens)" if n_truncated else ""
    print(f"wrote {len(rows)} predictions to {out}{note}")
    if getattr(adapter, "with_no_answer", False):
        print(f"no-answer threshold {adapter.null_threshold:.4f} ("
              f"{'tuned on dev, from tuned.json' if (run_dir / 'tuned.json').is_file() else 'default'}): "
              "a question is unanswered when its no_answer_score exceeds it")
    return 0


def tsv_to_csv(tsv: str) -> str:
    """The adapters' TSV rows (no tab or newline inside a cell) as CSV, quoted where a cell needs it."""
    buffer = io.StringIO()
    writer = csv.writer(buffer, lineterminator="\n")
    for line in tsv.splitlines():
        writer.writerow(line.split("\t") if line else [])
    return buffer.getvalue()
