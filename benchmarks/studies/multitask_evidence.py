"""Do the small GLUE tasks gain from the large ones? MT-DNN's question (Liu et al. 2019, §4) asked
of one real checkpoint at an equal training budget per side, over seeds.

    PYTHONPATH=. OMP_NUM_THREADS=1 .venv/bin/python benchmarks/studies/multitask_evidence.py \\
        --out runs/multitask-evidence --seeds 1,2,3

Three sides, each from the imported checkpoint (default ``DATA/checkpoints/all-MiniLM-L6-v2``),
each spending the same number of optimiser steps of the same batch size and length:

- ``single``: every small task (RTE, MRPC, STS-B, CoLA) fine-tuned alone for ``--epochs`` over its
  full training set; the side's steps are the sum of the four runs' steps;
- ``multi``: one shared encoder with a head per task (``ember finetune --tasks``) on the small
  tasks and the large ones (SST-2, and SNLI as the stand-in for MT-DNN's MNLI), examples-proportional mixing with size limit
  ``--mixing-limit`` (T5 §3.5.2), for as many steps as the single side took: the small tasks get
  fewer updates of their own and the large tasks' in exchange;
- ``multi+ft``: MT-DNN's two stages: the mixture for ``--stage1-share`` of those steps, then each
  small task fine-tuned alone from its shared encoder (``--init MULTI_RUN``) for the rest, each
  task the same share of its single-side epochs.

Per task the dev score of the run's kept weights (best on dev; with one evaluation per run this is
the end of training) is compared with the single side's on the same seed (same head
initialisation and data order where the sides share them); the table gives means, sample
standard deviations and the paired differences with their spread. Every run also records its CPU
seconds (one thread), so the budgets can be checked side by side. Runs are kept in
OUT/runs/SIDE/seed-N and skipped when done (re-running resumes). OUT/table.md, table.json and
multitask.png hold the result. --smoke: a random small model, a few examples, seconds (CI).
"""

from __future__ import annotations

import argparse
import json
import math
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "common"))  # the shared helpers
import _seed_table  # noqa: E402
from _bench import load, machine, run_cli  # noqa: E402
from _checkpoint_study import prepare_init, start_study  # noqa: E402

import ember  # noqa: E402
from ember.errors import EmberError  # noqa: E402
from ember.fileio import atomic_write_text  # noqa: E402
from ember.tasks.readers.glue import get_task, read_examples  # noqa: E402

SIDES = ("single", "multi", "multi+ft")
# SNLI (the data folder's stand-in for MNLI, MT-DNN's largest source of NLI) has no train split here:
# in a mixture it trains on its dev file and is scored on its test file, as `ember glue` does.
SPLITS_AS_FILES = {"snli": ("dev", "test")}
NAMES = {"single": "single-task", "multi": "multi-task", "multi+ft": "multi-task + per-task"}


def parse_args(argv):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--out", required=True)
    p.add_argument("--checkpoint", help="HF checkpoint folder (default: DATA/checkpoints/all-MiniLM-L6-v2)")
    p.add_argument("--small", default="rte,mrpc,stsb,cola", help="the tasks whose gain is asked about")
    p.add_argument("--large", default="sst2,snli", help="the tasks only the mixtures add (SNLI: trained on its "
                   "dev file, scored on test; the data folder has no SNLI train split)")
    p.add_argument("--large-dev-limit", type=int, default=2000,
                   help="score SNLI (trained from files) on its first N test rows only (0 = all)")
    p.add_argument("--seeds", default="1,2,3")
    p.add_argument("--epochs", type=float, default=1.0, help="single-side epochs per small task (sets the budget)")
    p.add_argument("--stage1-share", type=float, default=0.5, help="share of the budget the multi+ft mixture takes")
    p.add_argument("--mixing-limit", type=int, default=10000, help="examples-proportional size limit K")
    p.add_argument("--lr", type=float, default=1e-4)
    p.add_argument("--batch-size", type=int, default=32)
    p.add_argument("--max-length", type=int, default=128)
    p.add_argument("--train-limit", type=int, default=0, help="training examples per task (0 = all)")
    p.add_argument("--smoke", action="store_true", help="a random small model and a few examples (CI)")
    args = p.parse_args(argv)
    args.seeds = [int(s) for s in args.seeds.split(",") if s.strip()]
    args.small = [t.strip() for t in args.small.split(",") if t.strip()]
    args.large = [t.strip() for t in args.large.split(",") if t.strip()]
    if not args.small or not args.large or set(args.small) & set(args.large):
        raise EmberError("--small and --large each name at least one task, and no task is in both")
    if not 0 < args.stage1_share < 1:
        raise EmberError(f"--stage1-share {args.stage1_share}: a share of the budget, between 0 and 1 (exclusive)")
    args.checkpoint_name = "random (smoke)" if args.smoke else Path(args.checkpoint or "all-MiniLM-L6-v2").name
    return args


def mixture_task(task: str, out: Path | None = None, dev_limit: int = 0):
    """A task as ``ember.finetune(tasks=...)`` takes it: a name, or SNLI as your own pair files."""
    if task not in SPLITS_AS_FILES:
        return task
    from ember.paths import data_root

    spec = get_task(task)
    train, dev = (data_root() / spec.folder / spec.files[split] for split in SPLITS_AS_FILES[task])
    if out is not None and dev_limit:  # a large task's dev score is context, not the question: score a part
        lines = dev.read_text(encoding="utf-8").splitlines(keepends=True)
        part = out / f"{task}-{SPLITS_AS_FILES[task][1]}-first-{dev_limit}.tsv"
        if not part.is_file():
            atomic_write_text(part, "".join(lines[:dev_limit + 1]))  # the header and dev_limit rows
        dev = part
    train, dev = str(train), str(dev)
    return {"name": task, "kind": "pair", "train": train, "dev": dev, "column": spec.text_a,
            "pair_column": spec.text_b, "label_column": spec.label_column}


def train_sizes(tasks: list[str], limit: int) -> dict[str, int]:
    sizes = {t: len(read_examples(t, SPLITS_AS_FILES.get(t, ("train",))[0])) for t in tasks}
    return {t: min(n, limit) if limit else n for t, n in sizes.items()}


def steps_of(examples: float, batch: int) -> int:
    return math.ceil(examples / batch)


def common_settings(args, from_checkpoint: bool = False) -> dict:
    """The settings every run shares; --smoke's random model where a run starts from nothing."""
    smoke = {"model": "bert-mini", "tokenizer": args.smoke_tokenizer,
             "overrides": ["model.hidden_size=32", "model.num_heads=2", "model.intermediate_size=64"]} \
        if args.smoke and not from_checkpoint else {}
    return {"lr": args.lr, "batch_size": args.batch_size, "max_length": args.max_length, "num_threads": 1,
            "train_limit": args.train_limit or None, "progress": False, **smoke}


def finetune_once(run: Path, **kwargs) -> float:
    """One ember.finetune into ``run`` (resumed if a checkpoint is there); its CPU seconds, kept in
    RUN/study-cpu.json so a resumed study still counts runs finished before the interruption."""
    timed = run / "study-cpu.json"
    if (run / "results.json").is_file() and timed.is_file():
        return json.loads(timed.read_text())["cpu_seconds"]
    resume = (run / "checkpoints").is_dir()
    start = time.process_time()
    ember.finetune(out=run, resume=resume, overwrite=not resume, **kwargs)
    cpu = time.process_time() - start
    atomic_write_text(timed, json.dumps({"cpu_seconds": cpu, "resumed": resume}))
    return cpu


def task_score(results: Path, task: str) -> float:
    data = json.loads(results.read_text())
    return data["metrics"][get_task(task).main_metric]


def single_side(args, init, seed, out) -> dict:
    side = out / "runs" / "single" / f"seed-{seed}"
    cpu, scores = 0.0, {}
    for task in args.small:
        cpu += finetune_once(side / task, task=task, init=init, seed=seed, epochs=args.epochs, **common_settings(args))
        scores[task] = task_score(side / task / "results.json", task)
    return {"scores": scores, "cpu": cpu}


def mixture(args, init, seed, out: Path, run: Path, epochs: float) -> tuple[dict, float]:
    cpu = finetune_once(run, tasks=[mixture_task(t, out, args.large_dev_limit)
                                    for t in args.small + args.large], init=init, seed=seed, epochs=epochs,
                        mixing="proportional", mixing_limit=args.mixing_limit, **common_settings(args))
    scores = {t: task_score(run / "tasks" / t / "results.json", t) for t in args.small + args.large}
    shares = {t: json.loads((run / "tasks" / t / "results.json").read_text())["share"] for t in args.small + args.large}
    return {"scores": scores, "shares": shares, "steps": json.loads((run / "results.json").read_text())["steps"]}, cpu


def multi_side(args, init, seed, out, epochs: float) -> dict:
    done, cpu = mixture(args, init, seed, out, out / "runs" / "multi" / f"seed-{seed}", epochs)
    return {**done, "cpu": cpu}


def two_stage_side(args, init, seed, out, epochs: float) -> dict:
    side = out / "runs" / "multi+ft" / f"seed-{seed}"
    stage1, cpu = mixture(args, init, seed, out, side / "stage1", epochs * args.stage1_share)
    scores = {}
    for task in args.small:  # MT-DNN §4: each task further from the shared encoder
        cpu += finetune_once(side / task, task=task, init=str(side / "stage1"), seed=seed,
                             epochs=args.epochs * (1 - args.stage1_share), **common_settings(args, True))
        scores[task] = task_score(side / task / "results.json", task)
    return {"scores": scores, "cpu": cpu, "stage1": stage1}


def run_seed(args, init, seed, out, multi_epochs) -> list[dict]:
    """The three sides of one seed, as records; each record kept in OUT/records/ once done."""
    records = []
    for name, side in (("single", single_side), ("multi", multi_side), ("multi+ft", two_stage_side)):
        path = out / "records" / f"{name}-seed-{seed}.json"
        if not path.is_file():
            done = side(args, init, seed, out) if name == "single" else side(args, init, seed, out, multi_epochs)
            atomic_write_text(path, json.dumps({"variant": name, "seed": seed, **done, "load": load()}, indent=2))
            print(f"seed {seed} {name}: " + ", ".join(f"{t} {v:.4f}" for t, v in done["scores"].items())
                  + f" ({done['cpu']:.0f} CPU s; {load()})", flush=True)
        records.append(json.loads(path.read_text()))
    return records


def budget(args) -> dict:
    """Steps per side: the single side's, and the mixture's epochs that spend as many."""
    sizes = train_sizes(args.small + args.large, args.train_limit)
    single = sum(steps_of(args.epochs * sizes[t], args.batch_size) for t in args.small)
    total = sum(sizes.values())
    multi_epochs = single * args.batch_size / total  # ember's mixture epoch is a pass over every task's examples
    return {"sizes": sizes, "single_steps": single, "multi_epochs": multi_epochs,
            "multi_steps": steps_of(multi_epochs * total, args.batch_size)}


def render(result: dict) -> str:
    meta, b = result["meta"], result["budget"]
    loads = [float(r["load"].split()[1]) for r in result["records"] if r.get("load", "").startswith("load ")]
    during = f"load average {min(loads):.1f}-{max(loads):.1f} as the sides finished" if loads else meta["load_after"]
    lines = [f"# Multi-task vs single-task fine-tuning: {meta['checkpoint']}", "",
             f"{meta['machine']}; {during}. Seeds {', '.join(map(str, meta['seeds']))}; batch "
             f"{meta['batch_size']}, max length {meta['max_length']}, peak lr {meta['lr']} (10% warm-up, linear "
             f"decay) everywhere. Budget per side: {b['single_steps']} steps (single: {meta['epochs']} epoch(s) of "
             f"each small task; multi: {b['multi_epochs']:.4f} of a mixture epoch over {', '.join(meta['small'] + meta['large'])}, "
             f"proportional, K = {meta['mixing_limit']}; multi+ft: {meta['stage1_share']:.0%} mixture, then each small task "
             f"{meta['epochs'] * (1 - meta['stage1_share']):g} epoch(s) alone). Dev score x 100 (RTE accuracy, MRPC F1, "
             "STS-B Spearman, CoLA Matthews corr.); Δ is the paired difference to single-task on the same seed, "
             "with its spread and the seeds it won.", ""]
    lines += _seed_table.table_lines(result["table"], list(SIDES), NAMES)
    lines += ["", "| side | CPU seconds per seed (mean, one thread) |", "|---|---|"]
    for side, cpu in result["cpu"].items():
        lines.append(f"| {NAMES[side]} | {cpu:.0f} |")
    large = result["large_in_multi"]
    if large:
        lines += ["", "The large tasks in the multi-task runs (dev x 100, mean over seeds): "
                  + ", ".join(f"{t} {v * 100:.2f}" for t, v in large.items()) + "."]
    if meta["smoke"]:
        lines += ["", "(smoke run: a random small model; these are not measurements)"]
    return "\n".join(lines) + "\n"


def main(argv=None) -> dict:
    args = parse_args(argv)
    if args.smoke:
        args.seeds, args.train_limit, args.epochs, args.mixing_limit = args.seeds[:1], 24, 2.0, 16
    out = start_study(args)
    init = prepare_init(args, out)
    b = budget(args)
    print(f"budget per side: {b['single_steps']} steps; mixture epochs {b['multi_epochs']:.4f}", flush=True)
    records = [r for seed in args.seeds for r in run_seed(args, init, seed, out, b["multi_epochs"])]
    small = [{"task": t, "variant": r["variant"], "seed": r["seed"], "scores": {"dev": r["scores"][t]}}
             for r in records for t in args.small]
    multi = [r for r in records if r["variant"] == "multi"]
    meta = {"checkpoint": args.checkpoint_name, "machine": machine(), "load_after": load(), "seeds": args.seeds,
            "small": args.small, "large": args.large, "epochs": args.epochs, "stage1_share": args.stage1_share,
            "mixing_limit": args.mixing_limit, "lr": args.lr, "batch_size": args.batch_size,
            "max_length": args.max_length, "train_limit": args.train_limit, "smoke": args.smoke}
    timed = {side: [r["cpu"] for r in records if r["variant"] == side] for side in SIDES}
    result = {"meta": meta, "budget": b, "records": records,
              "table": _seed_table.summarize(small, reference="single"),
              "cpu": {side: sum(v) / len(v) for side, v in timed.items() if v},
              "large_in_multi": {t: sum(r["scores"][t] for r in multi) / len(multi) for t in args.large} if multi else {}}
    atomic_write_text(out / "table.json", json.dumps(result, indent=2))
    text = render(result)
    atomic_write_text(out / "table.md", text)
    _seed_table.bar_chart(result["table"], list(SIDES), NAMES, out / "multitask.png",
                          f"Small tasks' dev score over {len(args.seeds)} seeds from {meta['checkpoint']}, "
                          f"{b['single_steps']} steps per side", "dev score (x100)")
    print(text)
    return result


if __name__ == "__main__":
    run_cli(main)
