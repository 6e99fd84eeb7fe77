"""What does the BERT paper's hyper-parameter grid buy over ember's defaults, and how much of it is
the seed? (Devlin et al. 2019, App. A.3: "we select the best fine-tuning hyperparameters on the dev
set"; Dodge et al. 2020 on how far the seed alone moves the same numbers.)

    PYTHONPATH=. OMP_NUM_THREADS=1 .venv/bin/python benchmarks/studies/grid_evidence.py \\
        --out runs/grid-evidence --tasks rte,mrpc,cola

Per task, from the imported checkpoint (default ``DATA/checkpoints/all-MiniLM-L6-v2``), one thread:

1. **the search**, as a practitioner runs it: ``ember sweep --grid bert-paper --no-prune`` (lr
   5e-5 / 3e-5 / 2e-5 x batch 16 / 32 x 2 / 3 / 4 epochs: 18 runs) at ``--grid-seed``, the winner
   chosen on dev;
2. **the defaults** (``ember finetune`` given no lr, batch or epochs) at ``--seeds`` (fresh seeds,
   not the grid's);
3. **the winner** re-run with its settings at the same fresh seeds.

The winner's dev score at the seed it was chosen on is the maximum of 18 noisy numbers, so it is
reported beside, not instead of, its score at fresh seeds: the difference between the two is the
part of the search's gain that was the seed. The grid's own spread (18 settings, one seed) is set
against the seeds' spread (one setting, several seeds). Runs are kept under OUT/TASK and skipped
when done (the sweep resumes itself; re-running the command resumes the study). OUT/table.md,
table.json and grid.png hold the result. --smoke: a random small model, two grid points, a few
examples, seconds (CI).
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import yaml

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "common"))  # the shared helpers
import _seed_table  # noqa: E402
from _bench import SMOKE_NOTE, load, machine, pyplot, run_cli  # noqa: E402
from _checkpoint_study import choices, prepare_init, start_study  # noqa: E402

import ember  # noqa: E402
from ember.errors import EmberError  # noqa: E402
from ember.experiments.sweep_space import GRIDS, check_fixed_overrides, search_space  # noqa: E402
from ember.fileio import atomic_write_text  # noqa: E402
from ember.tasks.readers.glue import get_task  # noqa: E402

TASKS = ("rte", "mrpc", "cola", "stsb", "sst2")
KEYS = tuple(GRIDS["bert-paper"])  # what the grid searches, as config.yaml spells it
NAMES = {"default": "defaults", "winner": "grid winner"}


def parse_args(argv):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--out", required=True)
    p.add_argument("--checkpoint", help="HF checkpoint folder (default: DATA/checkpoints/all-MiniLM-L6-v2)")
    p.add_argument("--tasks", default="rte,mrpc,cola")
    p.add_argument("--grid-seed", type=int, default=0,
                   help="the training seed of the grid's runs (default 0, finetune's own default)")
    p.add_argument("--seeds", default="2,3,4", help="fresh seeds for the defaults and the winner")
    p.add_argument("--train-limit", type=int, default=0, help="training examples per task (0 = all)")
    p.add_argument("--set", dest="sets", action="append", default=[], metavar="KEY=VALUE",
                   help="a setting every run of the study shares (repeatable), e.g. train.group_by_length=true "
                        "to keep one batch order across runs started under different defaults")
    p.add_argument("--smoke", action="store_true", help="a random small model, two grid points, a few examples (CI)")
    args = p.parse_args(argv)
    args.tasks = choices(args.tasks, TASKS, "task")
    args.seeds = [int(s) for s in args.seeds.split(",") if s.strip()]
    if not args.tasks or not args.seeds:
        raise EmberError("--tasks and --seeds each name at least one")
    if any("=" not in s for s in args.sets):
        raise EmberError(f"--set takes KEY=VALUE, e.g. train.group_by_length=true; got {args.sets}")
    if any(s.split("=", 1)[0].strip() == "train.seed" for s in args.sets):
        raise EmberError("--set train.seed: the study sets the seeds itself (--grid-seed, --seeds)")
    # the same check `ember sweep` makes: a real finetune setting, not one the grid searches
    check_fixed_overrides(args.sets, search_space("finetune", grid="bert-paper"), "finetune")
    if args.grid_seed in args.seeds:
        raise EmberError(f"--seeds must be fresh: seed {args.grid_seed} is the one the grid was chosen on")
    args.checkpoint_name = "random (smoke)" if args.smoke else Path(args.checkpoint or "all-MiniLM-L6-v2").name
    return args


def common(args) -> dict:
    """What every run of the study shares (the smoke run's small random model among them)."""
    smoke = {"model": "bert-mini", "tokenizer": args.smoke_tokenizer,
             "overrides": ["model.hidden_size=32", "model.num_heads=2", "model.intermediate_size=64"]} \
        if args.smoke else {}
    shared = {"num_threads": 1, "train_limit": args.train_limit or None, "progress": False, **smoke}
    if args.sets:
        shared["overrides"] = [*shared.get("overrides", []), *args.sets]
    return shared


def timed(record: Path, work) -> float:
    """Run ``work()`` unless ``record`` says it ran; its CPU seconds (one thread), kept in ``record``."""
    if record.is_file():
        return json.loads(record.read_text())["cpu_seconds"]
    start = time.process_time()
    work()
    cpu = time.process_time() - start
    atomic_write_text(record, json.dumps({"cpu_seconds": cpu, "load": load()}))
    return cpu


def search(args, task: str, init: str, out: Path) -> dict:
    """The grid at one seed (resumed by the sweep itself when interrupted); its trials, as rows."""
    folder = out / task / f"grid-seed-{args.grid_seed}"
    grid = {"params": {"train.lr": [5e-5, 2e-5]}} if args.smoke else {"grid": "bert-paper"}
    record = out / task / "grid-cpu.json"  # CPU seconds summed over the calls a resumed sweep took
    spent = json.loads(record.read_text()) if record.is_file() else {"cpu_seconds": 0.0, "complete": False}
    if not spent["complete"]:
        start, complete = time.process_time(), False
        try:
            # The training seed goes in as an override: the sweep's own ``seed=`` orders the grid's
            # points (Optuna's sampler), it does not seed the runs.
            shared = common(args)
            overrides = [*shared.pop("overrides", []), f"train.seed={args.grid_seed}"]
            ember.sweep("finetune", folder, prune=False, task=task, init=init, overrides=overrides, **grid, **shared)
            complete = True
        finally:  # an interrupted call's CPU counts too: the next call resumes the sweep
            spent = {"cpu_seconds": spent["cpu_seconds"] + time.process_time() - start, "complete": complete,
                     "load": load()}
            atomic_write_text(record, json.dumps(spent))
    cpu = spent["cpu_seconds"]
    summary = json.loads((folder / "results.json").read_text())
    trials = [{"settings": settings(Path(t["run_dir"])), "dev": t["value"]}
              for t in summary["trials"] if t["state"] == "complete"]
    return {"trials": trials, "winner": max(trials, key=lambda t: t["dev"]), "cpu": cpu}


def settings(run: Path) -> dict:
    """The searched settings as the run resolved them (config.yaml), so defaults compare with grid points."""
    config = yaml.safe_load((run / "config.yaml").read_text())
    return {key: config[key.split(".")[0]][key.split(".")[1]] for key in KEYS}


def fresh_runs(args, task: str, init: str, out: Path, name: str, chosen: dict | None) -> dict:
    """``name`` at every fresh seed: the defaults (``chosen`` None) or the grid winner's settings."""
    given = {} if chosen is None else {"lr": chosen["train.lr"], "batch_size": chosen["train.batch_size"],
                                       "epochs": chosen["task.epochs"]}
    scores, cpu, resolved = {}, 0.0, None
    for seed in args.seeds:
        run = out / task / name / f"seed-{seed}"
        cpu += timed(run.with_name(f"seed-{seed}-cpu.json"),
                     lambda: ember.finetune(out=run, resume=(run / "checkpoints").is_dir(),
                                            overwrite=not (run / "checkpoints").is_dir(), task=task, init=init,
                                            seed=seed, **given, **common(args)))
        results = json.loads((run / "results.json").read_text())
        scores[seed] = results["metrics"][get_task(task).main_metric]
        resolved = settings(run)
    return {"scores": scores, "settings": resolved, "cpu": cpu}


def study_task(args, task: str, init: str, out: Path) -> dict:
    grid = search(args, task, init, out)
    default = fresh_runs(args, task, init, out, "default", None)
    winner_is_default = grid["winner"]["settings"] == default["settings"]
    winner = default if winner_is_default else fresh_runs(args, task, init, out, "winner", grid["winner"]["settings"])
    at_grid_seed = next((t["dev"] for t in grid["trials"] if t["settings"] == default["settings"]), None)
    return {"task": task, "metric": get_task(task).main_metric, "grid": grid, "default": default, "winner": winner,
            "winner_is_default": winner_is_default, "default_at_grid_seed": at_grid_seed}


def summarize(result: dict) -> dict:
    """Per task: the seed-paired table rows, the selection's optimism, and the two spreads."""
    records = [{"task": r["task"], "variant": side, "seed": seed, "scores": {"dev": score}}
               for r in result["tasks"] for side in ("default", "winner") for seed, score in r[side]["scores"].items()]
    table = _seed_table.summarize(records, reference="default")
    extra = {}
    for r in result["tasks"]:
        grid = [t["dev"] for t in r["grid"]["trials"]]
        winner = _seed_table.stats(list(r["winner"]["scores"].values()))
        extra[r["task"]] = {"grid": _seed_table.stats(grid), "grid_range": max(grid) - min(grid),
                            "winner_at_grid_seed": r["grid"]["winner"]["dev"],
                            "optimism": r["grid"]["winner"]["dev"] - winner["mean"],
                            "seed_spread_default": table[r["task"]]["dev"]["default"]["std"],
                            "seed_spread_winner": winner["std"]}
    return {"table": table, "extra": extra}


def setting_text(s: dict) -> str:
    return f"lr {s['train.lr']:g}, batch {s['train.batch_size']}, {s['task.epochs']:g} epochs"


def render(result: dict) -> str:
    meta, summary = result["meta"], result["summary"]
    lines = [f"# The BERT paper's grid against ember's defaults: {meta['checkpoint']}", "",
             f"{meta['machine']}; {meta['loads']}. Grid searched at seed {meta['grid_seed']} ({meta['grid']}; chosen on "
             f"dev, no pruning); the defaults and the winner then re-run at fresh seeds {', '.join(map(str, meta['seeds']))}. "
             "Dev score x 100 (RTE accuracy, MRPC F1, CoLA Matthews corr.); Δ is the winner minus the defaults on "
             "the same seed, with its spread and the seeds it won."
             + (f" Every run shares `--set {' '.join(meta['sets'])}`." if meta.get("sets") else ""), ""]
    lines += _seed_table.table_lines(summary["table"], ["default", "winner"], NAMES)
    lines += ["", "| task | defaults | winner | winner at the grid's seed | of it, the seed's luck | grid spread "
              "(sd, range) over its settings | seed spread (sd) of the defaults / winner | CPU s (grid; all) |",
              "|---|---|---|---|---|---|---|---|"]
    for r in result["tasks"]:
        e = summary["extra"][r["task"]]
        sd = lambda v: f"{v * 100:.2f}" if v is not None else "-"  # noqa: E731
        lines.append(f"| {r['task']} | {setting_text(r['default']['settings'])} | {setting_text(r['grid']['winner']['settings'])} | "
                     f"{e['winner_at_grid_seed'] * 100:.2f} | {e['optimism'] * 100:+.2f} | {sd(e['grid']['std'])}, "
                     f"{e['grid_range'] * 100:.2f} | {sd(e['seed_spread_default'])} / {sd(e['seed_spread_winner'])} | "
                     f"{r['grid']['cpu']:.0f}; {r['grid']['cpu'] + r['default']['cpu'] + (0 if r['winner_is_default'] else r['winner']['cpu']):.0f} |")
    if meta["smoke"]:
        lines += SMOKE_NOTE
    return "\n".join(lines) + "\n"


def chart(result: dict, path: Path) -> None:
    """Each task: the grid's settings at one seed (dots), the defaults and the winner at fresh seeds."""
    plt = pyplot()
    if plt is None:
        return
    fig, ax = plt.subplots(figsize=(2.2 + 2.0 * len(result["tasks"]), 3.6))
    for k, r in enumerate(result["tasks"]):
        columns = [("grid", [t["dev"] for t in r["grid"]["trials"]], "tab:gray"),
                   ("defaults", list(r["default"]["scores"].values()), "tab:blue"),
                   ("winner", list(r["winner"]["scores"].values()), "tab:orange")]
        for j, (label, values, color) in enumerate(columns):
            x = k + (j - 1) * 0.25
            ax.scatter([x] * len(values), [v * 100 for v in values], s=12, color=color,
                       label=label if k == 0 else None, zorder=3)
            ax.hlines(sum(values) / len(values) * 100, x - 0.09, x + 0.09, color=color)
        ax.scatter([k - 0.25], [r["grid"]["winner"]["dev"] * 100], marker="*", s=60, color="tab:orange", zorder=4)
    ax.set_xticks(range(len(result["tasks"])), [f"{r['task']}\n{r['metric']}" for r in result["tasks"]])
    ax.set_ylabel("dev score (x100)")
    ax.legend(fontsize=7)
    ax.set_title(f"{result['meta']['checkpoint']}: the 18-point grid at one seed (star: its winner) vs "
                 "defaults and winner at fresh seeds", fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def main(argv=None) -> dict:
    args = parse_args(argv)
    if args.smoke:
        args.train_limit = args.train_limit or 24
    out = start_study(args)
    init = prepare_init(args, out)
    loads, tasks = [], []
    for task in args.tasks:
        tasks.append(study_task(args, task, init, out))
        loads.append(load())
        print(f"{task} done ({loads[-1]})", flush=True)
    meta = {"checkpoint": args.checkpoint_name, "machine": machine(), "loads": "; ".join(
        f"{t}: {x}" for t, x in zip(args.tasks, loads)), "grid_seed": args.grid_seed, "seeds": args.seeds,
        "grid": "lr 5e-5 / 2e-5 (smoke)" if args.smoke else f"bert-paper: {GRIDS['bert-paper']}",
        "train_limit": args.train_limit, "smoke": args.smoke, "sets": args.sets}
    result = {"meta": meta, "tasks": tasks}
    result["summary"] = summarize(result)
    atomic_write_text(out / "table.json", json.dumps(result, indent=2, default=str))
    text = render(result)
    atomic_write_text(out / "table.md", text)
    chart(result, out / "grid.png")
    print(text)
    return result


if __name__ == "__main__":
    run_cli(main)
