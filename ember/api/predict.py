"""``ember.predict``: a fine-tuned run over an input file, one prediction per row (what `ember
predict` writes), as Python rows and optionally a file."""

from __future__ import annotations

import csv
import io
import json
from dataclasses import dataclass
from pathlib import Path

from ember.api.arguments import folder_arg
from ember.api.caller_state import keeps_caller_state
from ember.errors import EmberError


@dataclass
class Predictions:
    """The rows of one prediction pass and what the command line says about them."""

    rows: list[dict]
    truncated: int  # inputs cut to the run's max length
    max_length: int
    no_answer_threshold: float | None = None  # SQuAD 2.0 runs: the threshold applied
    threshold_tuned: bool = False  # ... and whether it was tuned on dev (RUN/tuned.json)


def run_predictions(run: str | Path, input: str | Path, decoding: dict | None = None, progress: bool = False,
                    out: str | Path | None = None) -> Predictions:
    """Predict every row of ``input``; write ``out`` (.jsonl, .csv, else TSV) atomically when given."""
    from ember.runs.checkpoint import atomic_write_text
    from ember.runs.folder import load_run_config
    from ember.tasks.batching import inference_progress
    from ember.tasks.task_model import (check_decodes, load_run_adapter, load_task_module, pad_token_id,
                                         with_decoding)
    from ember.tokenizers import load_tokenizer

    run_dir = Path(run)
    if out is not None and Path(out).is_dir():  # found now, not after the model has run over the whole file
        raise EmberError(f"--out {out} is a folder; name the predictions file, e.g. {Path(out) / 'predictions.jsonl'}")
    if out is not None and Path(out).suffix.lower() == ".json":  # would have been TSV under a .json name
        raise EmberError(f"--out {out}: predictions are written one JSON object per row; name the file .jsonl "
                         "(or .csv, .tsv)")
    from ember.tasks.multitask import is_multitask_run, task_names

    if is_multitask_run(run_dir):  # a file is one task's: predict with that task's own run folder
        names = task_names(run_dir)
        raise EmberError(f"{run_dir} is a multi-task run of {', '.join(names)}; predict with one task's run folder, "
                         f"e.g. ember predict {Path(run_dir) / 'tasks' / names[0]}")
    cfg = with_decoding(load_run_config(run_dir, expect_kind="finetune"), decoding)
    adapter = load_run_adapter(run_dir, cfg)
    check_decodes(adapter, decoding)
    if not hasattr(adapter, "predict_file"):
        raise EmberError(f"`ember predict` does not support {adapter.display_name} yet; "
                         "use `ember evaluate` to score a labelled file")
    tokenizer = load_tokenizer(run_dir / "tokenizer.json")
    module = load_task_module(run_dir, cfg, adapter, pad_token_id(tokenizer))
    with inference_progress(f"predicting {Path(input).name}", progress):
        rows, n_truncated = adapter.predict_file(module, tokenizer, cfg.task.max_length, input,
                                                 cfg.task.eval_batch_size, cfg.train.device)
    if out is not None:
        out = Path(out)
        if out.suffix == ".jsonl":
            text = "".join(json.dumps(r, ensure_ascii=False) + "\n" for r in rows)
        elif out.suffix == ".csv":
            text = tsv_to_csv(adapter.rows_to_tsv(rows))
        else:
            text = adapter.rows_to_tsv(rows)
        atomic_write_text(out, text)
    result = Predictions(rows, n_truncated, cfg.task.max_length)
    if getattr(adapter, "with_no_answer", False):
        result.no_answer_threshold = adapter.null_threshold
        result.threshold_tuned = (run_dir / "tuned.json").is_file()
    return result


@keeps_caller_state
def predict(run: str | Path, input: str | Path, out: str | Path | None = None, *, num_beams: int | None = None,
            length_penalty: float | None = None, max_new_tokens: int | None = None,
            progress: bool = False) -> list[dict]:
    """One prediction per row of ``input`` (a file in the task's layout, as `ember predict` reads
    it), in the file's order: {"id", "prediction", ...} as `ember predict --out x.jsonl` writes
    them (per-label probabilities, tags and entities, answers with their no-answer score, a T5
    run's raw output). ``out`` also writes them (.jsonl, .csv, else TSV). A T5 run decodes as its
    config says unless ``num_beams`` / ``length_penalty`` / ``max_new_tokens`` are given.

    >>> ember.predict("runs/sst2/seed-1", "reviews.tsv")[0]["prediction"]  # doctest: +SKIP
    """
    decoding = {"num_beams": num_beams, "length_penalty": length_penalty, "max_new_tokens": max_new_tokens}
    return run_predictions(folder_arg(run, "run"), input, decoding, progress, out).rows


def tsv_to_csv(tsv: str) -> str:
    """The adapters' TSV rows (no tab or newline inside a cell) as CSV, quoted where a cell needs it."""
    buffer = io.StringIO()
    writer = csv.writer(buffer, lineterminator="\n")
    for line in tsv.splitlines():
        writer.writerow(line.split("\t") if line else [])
    return buffer.getvalue()
