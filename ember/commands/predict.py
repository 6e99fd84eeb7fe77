"""`ember predict`: label every row of a TSV file with a fine-tuned model."""

from __future__ import annotations

import json
from pathlib import Path


def register(sub) -> None:
    p = sub.add_parser("predict", help="write predictions for a TSV file",
                       description="Read a TSV in the task's layout (label column optional) and write "
                       "one prediction per row: TSV (index, prediction, and per-label probabilities) "
                       "or JSONL when --out ends in .jsonl.")
    p.add_argument("run_dir", help="fine-tuned run folder")
    p.add_argument("--input", required=True, help="TSV file in the task's column layout")
    p.add_argument("--out", required=True, help="predictions file (.tsv or .jsonl)")
    p.set_defaults(run=run)


def run(args) -> int:
    import numpy as np

    from ember.tasks.featurize import encode_examples
    from ember.tasks.glue import get_task, read_tsv_examples
    from ember.tokenizers import load_tokenizer, special_token_ids
    from ember.train.checkpoint import atomic_write_text
    from ember.train.finetune import load_classifier
    from ember.train.rundir import load_run_config

    run_dir = Path(args.run_dir)
    cfg = load_run_config(run_dir, expect_kind="finetune")
    spec = get_task(cfg.task.name)
    tokenizer = load_tokenizer(run_dir / "tokenizer.json")
    module = load_classifier(run_dir, cfg, spec, special_token_ids(tokenizer)["pad"])
    examples = read_tsv_examples(args.input, spec)
    features, n_truncated = encode_examples(examples, tokenizer, cfg.task.max_length)
    logits = module.predict(features, cfg.task.eval_batch_size, cfg.train.device)
    names = json.loads((run_dir / "labels.json").read_text())
    rows = []
    for ex, row in zip(examples, logits):
        if module.is_regression:
            rows.append({"id": ex.guid, "prediction": float(row[0])})
        else:
            probs = np.exp(row - row.max())
            probs /= probs.sum()
            rows.append({"id": ex.guid, "prediction": names[int(row.argmax())],
                         "probabilities": {n: round(float(p), 6) for n, p in zip(names, probs)}})
    out = Path(args.out)
    if out.suffix == ".jsonl":
        text = "".join(json.dumps(r, ensure_ascii=False) + "\n" for r in rows)
    else:
        header = ["id", "prediction"] + ([] if module.is_regression else [f"p_{n}" for n in names])
        lines = ["\t".join(header)]
        for r in rows:
            probs = [] if module.is_regression else [str(r["probabilities"][n]) for n in names]
            lines.append("\t".join([r["id"], str(r["prediction"])] + probs))
        text = "\n".join(lines) + "\n"
    atomic_write_text(out, text)
    note = f" ({n_truncated} truncated to {cfg.task.max_length} tokens)" if n_truncated else ""
    print(f"wrote {len(rows)} predictions to {out}{note}")
    return 0
