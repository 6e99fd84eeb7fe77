"""The distillation study over seeds: a real teacher (all-MiniLM-L6-v2 fine-tuned on SST-2) and
small students trained with and without it, each method against its directly trained twin.

    PYTHONPATH=. OMP_NUM_THREADS=1 nice -n 19 .venv/bin/python benchmarks/studies/distill_study.py \\
        --out runs/distill --seeds 1,2,3 --train-limit 20000 --epochs 2

The teacher is OUT/teacher: ``ember.finetune("sst2", ...)`` from the imported checkpoint on the
whole SST-2 training set (``--teacher-epochs``), trained once and reused (or ``--teacher RUN``).
Every student sees the same transfer set: the first ``--train-limit`` SST-2 training sentences,
gold labels for the directly trained twins, the teacher's soft targets (cached once in
OUT/teacher-logits.npz) for the distilled ones. The variants (``--variants``):

- ``tiny-direct`` / ``mini-direct``: bert-tiny (2 x 128) / bert-mini (4 x 256), random init,
  fine-tuned on the gold labels (``ember finetune --model``, the teacher's vocabulary);
- ``tiny-kd`` / ``mini-kd``: the same students trained on the teacher's soft targets only
  (Hinton et al. 2015; "label a large unlabeled set with the teacher", alpha 1);
- ``tiny-tinybert``: bert-tiny by TinyBERT's task stage (Jiao et al. 2020): embedding, hidden
  and attention MSE, then the predictions (no data augmentation; TinyBERT's uniform layer map
  needs the teacher's 6 layers to be a multiple of the student's, so bert-tiny's 2, not bert-mini's 4);
- ``distil3-direct``: 3 x 384 initialised from every other teacher layer (DistilBERT, Sanh et al.
  2019) and fine-tuned on the gold labels (the KD tool with alpha 0, so only the gold loss);
- ``distil3-kd`` / ``distil3-pkd``: that student trained by KD / Patient KD (Sun et al. 2019, skip).
Random-init students train at ``--lr-random`` (3e-4), teacher-initialised ones at ``--lr``
(5e-5); a method and its twin always share the learning rate, epochs and data.

Per variant: dev accuracy mean ± std over seeds, share of the teacher, parameters, the paired
difference to its twin with McNemar's exact test per seed, and (first seed's run, via
``distill_table``) CPU sentences/s in PyTorch fp32/int8 and ONNX Runtime fp32/int8 beside the
teacher's. Runs are kept in OUT/runs/VARIANT/seed-N and skipped when done (re-running resumes);
OUT/study.md, study.json, study.png hold the result, OUT/speed/ the speed table.
--smoke: a random tiny teacher and a few sentences, seconds (CI).
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "common"))  # the shared helpers
import _seed_table  # noqa: E402
import distill_table  # noqa: E402
from _bench import load, machine, run_cli  # noqa: E402
from _distill_report import mcnemar_p  # noqa: E402
from _distill_study_report import render, write_chart  # noqa: E402
from _checkpoint_study import choices, prepare_init, start_study  # noqa: E402

import ember  # noqa: E402
from ember.errors import EmberError  # noqa: E402
from ember.fileio import atomic_write_text  # noqa: E402

# variant -> (how it trains, its student settings, the twin it is compared with)
VARIANTS = {
    "tiny-direct": ("finetune", {"model": "bert-tiny"}, None),
    "tiny-kd": ("kd", {"student": "bert-tiny"}, "tiny-direct"),
    "tiny-tinybert": ("tinybert", {"student": "bert-tiny"}, "tiny-direct"),
    "mini-direct": ("finetune", {"model": "bert-mini"}, None),
    "mini-kd": ("kd", {"student": "bert-mini"}, "mini-direct"),
    "distil3-direct": ("kd", {"student_layers": 3, "student_init": "teacher", "alpha": 0.0}, None),
    "distil3-kd": ("kd", {"student_layers": 3, "student_init": "teacher"}, "distil3-direct"),
    "distil3-pkd": ("pkd", {"student_layers": 3, "student_init": "teacher"}, "distil3-direct"),
}
NAMES = {"tiny-direct": "bert-tiny, gold labels", "tiny-kd": "bert-tiny, KD", "mini-direct": "bert-mini, gold labels",
         "mini-kd": "bert-mini, KD", "tiny-tinybert": "bert-tiny, TinyBERT",
         "distil3-direct": "3-layer DistilBERT-init, gold labels", "distil3-kd": "3-layer DistilBERT-init, KD",
         "distil3-pkd": "3-layer DistilBERT-init, PKD"}


def parse_args(argv):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--out", required=True)
    p.add_argument("--checkpoint", help="HF checkpoint the teacher starts from (default: DATA/checkpoints/all-MiniLM-L6-v2)")
    p.add_argument("--teacher", help="a fine-tuned SST-2 run to use as the teacher (default: OUT/teacher, trained if absent)")
    p.add_argument("--teacher-epochs", type=float, default=1.0, help="epochs of the teacher over all of SST-2")
    p.add_argument("--variants", default=",".join(VARIANTS), help=f"comma-separated, of {', '.join(VARIANTS)}")
    p.add_argument("--seeds", default="1,2,3")
    p.add_argument("--train-limit", type=int, default=20000, help="transfer set: the first N SST-2 training sentences")
    p.add_argument("--epochs", type=float, default=2.0, help="epochs over the transfer set (TinyBERT: per stage)")
    p.add_argument("--lr-random", type=float, default=3e-4, help="learning rate of randomly initialised students")
    p.add_argument("--lr", type=float, default=5e-5, help="learning rate of teacher-initialised students")
    p.add_argument("--repeats", type=int, default=5, help="timed repetitions of the speed table")
    p.add_argument("--train-only", action="store_true",
                   help="train the runs and stop (several processes can share the seeds or variants; "
                        "a last call without it makes the tables)")
    p.add_argument("--smoke", action="store_true", help="a random tiny teacher and a few sentences (CI)")
    args = p.parse_args(argv)
    args.seeds = [int(s) for s in args.seeds.split(",") if s.strip()]
    args.variants = choices(args.variants, VARIANTS, "variant")
    missing = sorted({VARIANTS[v][2] for v in args.variants} - set(args.variants) - {None})
    if missing:
        raise EmberError(f"--variants needs the twins the methods are compared with: add {', '.join(missing)}")
    return args


def ensure_teacher(args, out: Path) -> Path:
    if args.teacher:
        return Path(args.teacher)
    teacher = out / "teacher"
    if (teacher / "results.json").is_file():
        return teacher
    init = prepare_init(args, out)
    smoke = {"model": "bert-mini", "tokenizer": args.smoke_tokenizer, "train_limit": 64,
             "overrides": ["model.hidden_size=32", "model.num_heads=2", "model.intermediate_size=64",
                           "model.num_layers=6"]} if args.smoke else {}
    resume = (teacher / "checkpoints").is_dir()
    print(f"training the teacher in {teacher} ({load()})", flush=True)
    ember.finetune("sst2", teacher, init, seeds=[1], epochs=args.teacher_epochs, resume=resume,
                   overwrite=not resume, progress=False, **smoke)
    return teacher


def train_variant(variant: str, seed: int, run: Path, teacher: Path, args, out: Path) -> None:
    how, student, _ = VARIANTS[variant]
    lr = args.lr if student.get("student_init") == "teacher" else args.lr_random
    resume = (run / "checkpoints").is_dir()
    common = dict(resume=resume, overwrite=not resume, progress=False)
    if how == "finetune":
        from ember.runs.folder import load_run_config

        ember.finetune("sst2", run, "random", tokenizer=str(teacher / "tokenizer.json"), seeds=[seed],
                       train_limit=args.train_limit, epochs=args.epochs, lr=lr,
                       max_length=load_run_config(teacher).task.max_length, **student, **common)
        return
    options = dict(student)
    if how == "tinybert":
        options["intermediate_epochs"] = args.epochs
    ember.distill(how, teacher, run, unlabeled=["task"], train_limit=args.train_limit, epochs=args.epochs, lr=lr,
                  logits_cache=out / "teacher-logits.npz", overrides=[f"train.seed={seed}"], **options, **common)


def run_one(variant: str, seed: int, teacher: Path, args, out: Path) -> dict:
    run = out / "runs" / variant / f"seed-{seed}"
    record_path = run / "record.json"
    if record_path.is_file():
        return json.loads(record_path.read_text())
    start = time.process_time()
    train_variant(variant, seed, run, teacher, args, out)
    cpu = time.process_time() - start
    entry = distill_table.load_entry(variant, run, "student")
    accuracy, predictions = distill_table.dev_accuracy(entry)  # recomputed; must equal results.json
    record = {"task": "sst2", "variant": variant, "seed": seed, "run": str(run), "scores": {"dev": accuracy},
              "predictions": predictions.tolist(), "parameters": distill_table.parameter_counts(entry.module),
              "cpu_seconds": cpu}
    atomic_write_text(record_path, json.dumps(record))
    print(f"{variant} seed {seed}: dev accuracy {accuracy:.4f} ({cpu:.0f} CPU s; {load()})", flush=True)
    return record


def twin_comparisons(records: list[dict], labels: np.ndarray) -> dict:
    """variant -> per seed: points over its twin and McNemar's exact p on the paired dev predictions."""
    by_key = {(r["variant"], r["seed"]): r for r in records}
    out: dict = {}
    for r in records:
        twin = VARIANTS[r["variant"]][2]
        other = by_key.get((twin, r["seed"]))
        if other is None:
            continue
        right, right_twin = np.asarray(r["predictions"]) == labels, np.asarray(other["predictions"]) == labels
        only, only_twin = int(np.sum(right & ~right_twin)), int(np.sum(right_twin & ~right))
        out.setdefault(r["variant"], []).append(
            {"seed": r["seed"], "twin": twin, "points": 100 * (r["scores"]["dev"] - other["scores"]["dev"]),
             "only_this_right": only, "only_twin_right": only_twin,
             "mcnemar_p": mcnemar_p(only, only_twin)})
    return out


def speed_table(teacher: Path, records: list[dict], args, out: Path) -> dict:
    """distill_table on the teacher and the first seed's run of every variant (one process, alternating)."""
    first = {}
    for r in records:
        first.setdefault(r["variant"], r["run"])
    argv = ["--teacher", str(teacher), "--repeats", str(args.repeats), "--out", str(out / "speed")]
    for variant, run in first.items():
        argv += ["--student", f"{variant}={run}"] + (["--baseline", variant] if VARIANTS[variant][2] is None else [])
    return distill_table.main(argv + (["--smoke"] if args.smoke else []))


def main(argv=None) -> dict:
    args = parse_args(argv)
    if args.smoke:
        args.seeds, args.train_limit, args.epochs, args.teacher_epochs = args.seeds[:2], 48, 1.0, 1.0
    out = start_study(args)
    teacher = ensure_teacher(args, out)
    # Twins first, so a method's comparison is available as soon as it finishes.
    order = sorted(args.variants, key=lambda v: VARIANTS[v][2] is not None)
    records = [run_one(v, s, teacher, args, out) for s in args.seeds for v in order]
    if args.train_only:
        return {"records": records}
    speed = speed_table(teacher, records, args, out)
    teacher_row = speed["rows"][0]
    labels = np.asarray(speed["labels"])
    meta = {"machine": machine(), "load_after": load(), "date": time.strftime("%Y-%m-%d %H:%M"),
            "teacher": str(teacher), "teacher_accuracy": teacher_row["accuracy"],
            "teacher_parameters": teacher_row["parameters"], "seeds": args.seeds, "variants": args.variants,
            "train_limit": args.train_limit, "epochs": args.epochs, "lr_random": args.lr_random, "lr": args.lr,
            "smoke": args.smoke, "names": NAMES, "twins": {v: VARIANTS[v][2] for v in args.variants}}
    result = {"meta": meta, "records": records, "table": _seed_table.summarize(records, reference="none"),
              "twins": twin_comparisons(records, labels),
              "speed": {r["label"]: {"shape": r["shape"], "parameters": r["parameters"], "paths": {
                  name: {k: v for k, v in p.items() if k != "repetitions"} for name, p in r["paths"].items()}}
                  for r in speed["rows"]}}
    atomic_write_text(out / "study.json", json.dumps({k: v for k, v in result.items() if k != "records"} | {
        "records": [{k: v for k, v in r.items() if k != "predictions"} for r in records]}, indent=2))
    text = render(result)
    atomic_write_text(out / "study.md", text)
    write_chart(result, out / "study.png")
    print(text)
    return result


if __name__ == "__main__":
    run_cli(main)
