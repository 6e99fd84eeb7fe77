"""Golden outputs of the official SQuAD v2.0 evaluation script on real predictions for the
shipped half-dev (tests/tasks/metrics/test_squad_official.py compares ember's metrics with them).

    PYTHONPATH=. .venv/bin/python benchmarks/tools/squad_official_goldens.py \\
        --official /path/to/evaluate-v2.0.py --init random --model bert-tiny \\
        --tokenizer ../shared/data/checkpoints/all-MiniLM-L6-v2/tokenizer.json --epochs 2 --lr 1e-3

1. Predictions (once; kept in tests/fixtures/squad2_official/predictions.json): a small model
   is fine-tuned on all 16 articles (`--task qa`, a custom task; the goldens test the metric,
   not the model, and a tiny model trained on the 12-article split abstains everywhere, which
   would leave them nothing to check) and answers all
   6,078 questions of the half-dev. Stored per question: the best span as character offsets
   into its context (the data's text is not committed) and the no-answer score (null - best).
2. Goldens: the official script (Rajpurkar et al. 2018; the CodaLab `evaluate-v2.0.py`, which
   the user supplies: it is not part of ember) is run as a separate program on two prediction
   files built from those offsets, and its JSON output is stored as it printed it:
   * ``ember``: the best span for every question, its no-answer score as the "na_prob" and
     the threshold tuned on dev as ``--na-prob-thresh`` (ember's rule: no answer when
     null - best > threshold);
   * ``submission``: the usual submission form, "" where the model abstains (here: the half of
     the questions with the highest no-answer scores), the scores squashed into (0, 1) as
     probabilities (a logistic centred there), with the official default ``--na-prob-thresh 1.0``.
"""

from __future__ import annotations

import argparse
import json
import math
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
FIXTURE = ROOT / "tests" / "fixtures" / "squad2_official"
DATA = ("squad2-dev-half", "dev-v2.0.json")


def make_predictions(task: str, init: str, model: str, tokenizer: str, out: Path, max_length: int, epochs: float,
                     lr: float) -> dict:
    """Fine-tune (into $TMPDIR/ember-squad-goldens/run, reused if there) and answer every question."""
    import ember
    from ember.paths import data_path
    from ember.runs.folder import load_run_config
    from ember.tasks.qa.squad import featurize_squad, read_squad
    from ember.tasks.task_model import load_run_adapter, load_task_module, pad_token_id
    from ember.tokenizers import load_tokenizer

    work = Path(tempfile.gettempdir()) / "ember-squad-goldens"  # outside the repository: the data's text
    run = work / "run"  # kept between attempts: a failure after training need not train again
    if not (run / "results.json").is_file():
        files = {}
        if task == "qa":  # a custom task on the whole half-dev (dev: its first article, only to pick an epoch)
            data = json.loads(data_path(*DATA).read_text(encoding="utf-8"))
            folder = work / "data"
            folder.mkdir(parents=True, exist_ok=True)
            (folder / "train.json").write_text(json.dumps(data))
            (folder / "dev.json").write_text(json.dumps({**data, "data": data["data"][:1]}))
            files = {"train_file": folder / "train.json", "dev_file": folder / "dev.json"}
        ember.finetune(task, run, init, model=model, tokenizer=tokenizer, max_length=max_length, epochs=epochs,
                       lr=lr, batch_size=32, overrides=["train.num_threads=1"], progress=True, overwrite=True,
                       **files)
    cfg = load_run_config(run)
    adapter = load_run_adapter(run, cfg)
    tok = load_tokenizer(run / "tokenizer.json")
    module = load_task_module(run, cfg, adapter, pad_token_id(tok))
    examples = read_squad(data_path(*DATA))  # all 16 articles: the goldens test the metric, not the model
    features = featurize_squad(examples, tok, max_length, adapter.doc_stride, adapter.max_query_length)
    answers = adapter.answers(module, examples, features)
    predictions = {}
    for ex, a in zip(examples, answers):
        start = ex.context.find(a.text) if a.text else -1
        predictions[ex.qid] = {"span": [start, start + len(a.text)] if start >= 0 else None,
                               "na": round(float(a.null_minus_best), 6)}
    record = {"model": {"task": task, "init": str(init), "model": model, "tokenizer": Path(tokenizer).name if tokenizer else "",
                        "max_length": max_length, "epochs": epochs, "lr": lr,
                        "trained_on": f"{task} train split (12 of the 16 articles)"},
              "threshold_tuned": adapter.null_threshold, "predictions": predictions}
    out.write_text(json.dumps(record, indent=0, sort_keys=True))
    return record


def prediction_texts(record: dict) -> tuple[dict, dict]:
    """qid -> best span text, qid -> no-answer score, from the stored offsets and the real data."""
    from ember.paths import data_path
    from ember.tasks.qa.squad import read_squad

    contexts = {ex.qid: ex.context for ex in read_squad(data_path(*DATA))}
    texts, na = {}, {}
    for qid, p in record["predictions"].items():
        texts[qid] = contexts[qid][p["span"][0]:p["span"][1]] if p["span"] else ""
        na[qid] = p["na"]
    return texts, na


def run_official(official: Path, preds: dict, na: dict, threshold: float) -> dict:
    from ember.paths import data_path

    with tempfile.TemporaryDirectory() as tmp:
        pred_file, na_file, out = Path(tmp) / "pred.json", Path(tmp) / "na.json", Path(tmp) / "eval.json"
        pred_file.write_text(json.dumps(preds))
        na_file.write_text(json.dumps(na))
        subprocess.run([sys.executable, str(official), str(data_path(*DATA)), str(pred_file), "--na-prob-file",
                        str(na_file), "--na-prob-thresh", repr(threshold), "--out-file", str(out)], check=True)
        return json.loads(out.read_text())


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--official", required=True, type=Path, help="the official evaluate-v2.0.py")
    p.add_argument("--init", default="", help="model to fine-tune for the predictions (if not stored yet): a run, "
                   "an HF folder, or 'random' with --model and --tokenizer")
    p.add_argument("--model", default="", help="preset for --init random (e.g. bert-tiny)")
    p.add_argument("--tokenizer", default="", help="tokenizer.json for --init random")
    p.add_argument("--task", default="qa", choices=["qa", "squad", "squad2"],
                   help="fine-tuning task: qa (default) = all 16 articles as a custom task, so a small model "
                   "gets a realistic mix of right, partial and wrong spans and of abstentions (on the "
                   "12-article split a tiny model abstains everywhere, leaving the goldens nothing to check)")
    p.add_argument("--max-length", type=int, default=256)
    p.add_argument("--epochs", type=float, default=1.0)
    p.add_argument("--lr", type=float, default=1e-4)
    args = p.parse_args()
    FIXTURE.mkdir(parents=True, exist_ok=True)
    stored = FIXTURE / "predictions.json"
    if stored.is_file():
        record = json.loads(stored.read_text())
    elif args.init:
        record = make_predictions(args.task, args.init, args.model, args.tokenizer, stored, args.max_length, args.epochs, args.lr)
    else:
        raise SystemExit(f"{stored} is missing: give --init MODEL to make the predictions")
    texts, na = prediction_texts(record)
    tuned = record["threshold_tuned"]
    cut = statistics.median(na.values())  # the submission abstains on half of the questions
    submission = {qid: "" if na[qid] > cut else text for qid, text in texts.items()}
    probs = {qid: round(1 / (1 + math.exp(cut - v)), 9) for qid, v in na.items()}  # na scores as probabilities
    goldens = {"official_script": "evaluate-v2.0.py (SQuAD 2.0, CodaLab), run as a separate program",
               "ember": {"threshold": tuned, "output": run_official(args.official, texts, na, tuned)},
               "submission": {"threshold": 1.0, "abstain_above": cut,
                              "output": run_official(args.official, submission, probs, 1.0)}}
    (FIXTURE / "goldens.json").write_text(json.dumps(goldens, indent=2))
    print(json.dumps(goldens, indent=2))


if __name__ == "__main__":
    main()
