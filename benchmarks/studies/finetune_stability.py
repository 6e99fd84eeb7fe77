"""Fine-tuning stability on small data (BERT, Devlin et al. 2019, §5: "fine-tuning was sometimes
unstable on small datasets"; ULMFiT, Howard & Ruder 2018, §3.2): plain fine-tuning against
layer-wise learning-rate decay and gradual unfreezing, over many seeds, on RTE, MRPC and CoLA.

    PYTHONPATH=. OMP_NUM_THREADS=1 nice -n 19 .venv/bin/python benchmarks/studies/finetune_stability.py \\
        --out runs/finetune-stability --seeds 1,2,3,4,5 --train-limit 1000

Every run is ``ember.finetune(task, ...)`` from the imported checkpoint (``ember convert
--from-hf``; default ``DATA/checkpoints/all-MiniLM-L6-v2``) with BERT's GLUE recipe (batch 32,
the task's default lr, 10% warm-up, best epoch on dev) and one change per method:

- ``plain``: nothing else;
- ``lld``: ``--layer-lr-decay`` (0.8, ELECTRA's value): the head at the peak lr, each layer below
  0.8 times the one above (the same peak lr, so only the decay differs);
- ``unfreeze``: ``--gradual-unfreeze``: epoch 1 trains the head and the top layer, each further
  epoch one more layer (ULMFiT §3.2).

Per task and method: the dev score's mean, sample std, min and max over seeds, and how many runs
*collapsed*: their dev predictions are (almost) all one class — at least ``--collapse-share`` of
them — the degenerate solution BERT's §5 restarts guard against. The majority-class score of
the dev set is printed beside them. Each run is kept in OUT/runs/TASK/METHOD/seed-N and skipped
when done (re-running resumes). OUT/table.md, table.json and stability.png hold the result.
--smoke: a random 4-layer model, a few examples, seconds (CI).
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from collections import Counter
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "common"))  # the shared helpers
import _seed_table  # noqa: E402
from _bench import load, machine, run_cli  # noqa: E402
from _checkpoint_study import choices, prepare_init, start_study  # noqa: E402

import ember  # noqa: E402
from ember.errors import EmberError  # noqa: E402
from ember.fileio import atomic_write_text  # noqa: E402
from ember.tasks.readers.glue import get_task, read_examples  # noqa: E402
from ember.tasks.metrics.classification import compute_metrics  # noqa: E402

METHODS = ("plain", "lld", "unfreeze")
NAMES = {"plain": "plain", "lld": "layer-wise lr decay", "unfreeze": "gradual unfreezing"}
TASKS = ("rte", "mrpc", "cola")


def parse_args(argv):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--out", required=True)
    p.add_argument("--checkpoint", help="HF checkpoint folder (default: DATA/checkpoints/all-MiniLM-L6-v2)")
    p.add_argument("--tasks", default=",".join(TASKS))
    p.add_argument("--methods", default=",".join(METHODS), help=f"comma-separated, of {', '.join(METHODS)}")
    p.add_argument("--seeds", default="1,2,3,4,5")
    p.add_argument("--train-limit", type=int, default=1000, help="training examples per task (0 = all)")
    p.add_argument("--epochs", type=float, default=3.0)
    p.add_argument("--lr", type=float, default=None, help="peak learning rate (default: the task's BERT value, 2e-5)")
    p.add_argument("--layer-lr-decay", type=float, default=0.8)
    p.add_argument("--collapse-share", type=float, default=0.99,
                   help="a run whose most frequent dev prediction has at least this share collapsed")
    p.add_argument("--smoke", action="store_true", help="a random small model and a few examples (CI)")
    args = p.parse_args(argv)
    args.seeds = [int(s) for s in args.seeds.split(",") if s.strip()]
    args.tasks = [t.strip() for t in args.tasks.split(",") if t.strip()]
    args.methods = choices(args.methods, METHODS, "method")
    for task in args.tasks:
        if get_task(task).is_regression:
            raise EmberError(f"{task} is a regression task; the stability study counts collapses to one class")
    args.checkpoint_name = "random (smoke)" if args.smoke else Path(args.checkpoint or "all-MiniLM-L6-v2").name
    return args


def dev_predictions(run: Path, task: str) -> tuple[list[int], list[int]]:
    """The run's dev predictions (its best-epoch weights) and the gold labels, as class ids."""
    examples = read_examples(task, "dev")
    model = ember.load(run)
    label_ids = {name: i for i, name in enumerate(json.loads((run / "labels.json").read_text()))}
    pairs = {"text_pair": [e.text_b for e in examples]} if examples[0].text_b is not None else {}
    answers = model.classify([e.text_a for e in examples], **pairs)
    return [label_ids[a["label"]] for a in answers], [e.label for e in examples]


def run_one(task: str, method: str, seed: int, init: str, args, out: Path) -> dict:
    run = out / "runs" / task / method / f"seed-{seed}"
    record_path = run / "record.json"
    if record_path.is_file():
        return json.loads(record_path.read_text())
    settings = {"lld": {"layer_lr_decay": args.layer_lr_decay}, "unfreeze": {"gradual_unfreeze": True}}.get(method, {})
    if args.lr is not None:
        settings["lr"] = args.lr
    smoke = {"model": "bert-mini", "tokenizer": args.smoke_tokenizer,
             "overrides": ["model.hidden_size=32", "model.num_heads=2", "model.intermediate_size=64"]} if args.smoke else {}
    resume = (run / "checkpoints").is_dir()
    start = time.process_time()
    ember.finetune(task, run, init, seeds=[seed], train_limit=args.train_limit or None, epochs=args.epochs,
                   resume=resume, overwrite=not resume, progress=False, **settings, **smoke)
    predictions, labels = dev_predictions(run, task)
    spec = get_task(task)
    score = compute_metrics(spec, np.asarray(predictions), np.asarray(labels))[spec.main_metric]
    recorded = json.loads((run / "results.json").read_text())
    top_share = Counter(predictions).most_common(1)[0][1] / len(predictions)
    record = {"task": task, "variant": method, "seed": seed, "run": str(run), "scores": {"dev": score},
              "recorded_dev": recorded["metrics"][spec.main_metric], "top_prediction_share": top_share,
              "collapsed": top_share >= args.collapse_share, "cpu_seconds": time.process_time() - start}
    atomic_write_text(record_path, json.dumps(record, indent=2))
    print(f"{task} {method} seed {seed}: dev {spec.main_metric} {score:.4f} (top class {top_share:.0%} of predictions"
          f"{', collapsed' if record['collapsed'] else ''}; {record['cpu_seconds']:.0f} CPU s; {load()})", flush=True)
    return record


def majority_scores(tasks: list[str]) -> dict:
    """Each task's dev score when every prediction is the training set's most frequent class."""
    out = {}
    for task in tasks:
        spec = get_task(task)
        majority = Counter(e.label for e in read_examples(task, "train")).most_common(1)[0][0]
        labels = np.asarray([e.label for e in read_examples(task, "dev")])
        out[task] = {"metric": spec.main_metric,
                     "score": compute_metrics(spec, np.full_like(labels, majority), labels)[spec.main_metric]}
    return out


def stability_rows(records: list[dict], tasks: list[str], methods: list[str]) -> list[dict]:
    rows = []
    for task in tasks:
        for method in methods:
            runs = [r for r in records if r["task"] == task and r["variant"] == method]
            if not runs:
                continue
            scores = np.asarray([r["scores"]["dev"] for r in runs])
            rows.append({"task": task, "method": method, "n": len(runs), "mean": float(scores.mean()),
                         "std": float(scores.std(ddof=1)) if len(runs) > 1 else None,
                         "min": float(scores.min()), "max": float(scores.max()),
                         "collapsed": sum(r["collapsed"] for r in runs)})
    return rows


def render(result: dict) -> str:
    meta = result["meta"]
    lines = [f"# Fine-tuning stability on small data: {meta['checkpoint']}", "",
             f"{meta['machine']}. Seeds {', '.join(map(str, meta['seeds']))}; first {meta['train_limit'] or 'all'} "
             f"training examples per task, {meta['epochs']} epochs, BERT's recipe at peak lr {meta['lr']} (batch 32, "
             f"10% warm-up, linear decay, best epoch on dev); layer-wise decay {meta['layer_lr_decay']}. Dev score x 100 "
             "(RTE accuracy, MRPC F1, CoLA Matthews corr.); a run *collapsed* when at least "
             f"{meta['collapse_share']:.0%} of its dev predictions are one class.", "",
             "| task | method | mean ± std | min | max | collapsed | majority class |", "|---|---|---|---|---|---|---|"]
    for row in result["rows"]:
        spread = f" ± {row['std'] * 100:.2f}" if row["std"] is not None else ""
        majority = result["majority"][row["task"]]["score"] * 100
        lines.append(f"| {row['task']} | {NAMES[row['method']]} | {row['mean'] * 100:.2f}{spread} | "
                     f"{row['min'] * 100:.2f} | {row['max'] * 100:.2f} | {row['collapsed']}/{row['n']} | {majority:.2f} |")
    lines += ["", "Paired differences to plain fine-tuning (same seed: same data order and head initialisation):", ""]
    lines += _seed_table.table_lines(result["table"], meta["methods"], NAMES)
    if meta["smoke"]:
        lines += ["", "(smoke run: a random small model; these are not measurements)"]
    return "\n".join(lines) + "\n"


def main(argv=None) -> dict:
    args = parse_args(argv)
    if args.smoke:
        args.seeds, args.train_limit, args.epochs = args.seeds[:2], 24, 1.0
    out = start_study(args)
    init = prepare_init(args, out)
    # Seed-major order: an interrupted study has every task and method at the same number of seeds.
    records = [run_one(t, m, s, init, args, out) for s in args.seeds for t in args.tasks for m in args.methods]
    meta = {"checkpoint": args.checkpoint_name, "machine": machine(), "load_after": load(), "seeds": args.seeds,
            "tasks": args.tasks, "methods": args.methods, "train_limit": args.train_limit, "epochs": args.epochs,
            "lr": args.lr or "the task's default (2e-5)",
            "layer_lr_decay": args.layer_lr_decay, "collapse_share": args.collapse_share, "smoke": args.smoke}
    result = {"meta": meta, "records": records, "rows": stability_rows(records, args.tasks, args.methods),
              "majority": majority_scores(args.tasks), "table": _seed_table.summarize(records, reference="plain")}
    atomic_write_text(out / "table.json", json.dumps(result, indent=2))
    text = render(result)
    atomic_write_text(out / "table.md", text)
    _seed_table.bar_chart(result["table"], args.methods, NAMES, out / "stability.png",
                          f"Dev score over {len(args.seeds)} seeds from {meta['checkpoint']}, "
                          f"{args.train_limit or 'all'} training examples", "dev score (x100)")
    print(text)
    return result


if __name__ == "__main__":
    run_cli(main)
