"""Multi-task training steps against single-task steps on the same batches (issue 43, item 6).

    OMP_NUM_THREADS=1 PYTHONPATH=. .venv/bin/python benchmarks/speed/multitask_step.py --cpu-time \
        [--init ../shared/data/checkpoints/all-MiniLM-L6-v2] [--tasks rte mrpc stsb sst2] [--steps 48] [--reps 3]

Goal: a multi-task run (``ember finetune --tasks``: ``ember.train.multitask``'s ``MultiTaskModel``
over a ``TaskMixture``, one task per step, every head in one optimizer) trains as fast per step as
the single-task loop (``ember finetune --task``: one task module over ``InMemoryData``), within
+- 5%. Both sides run ember's one ``Trainer`` (same settings: AdamW, batch 32, max length 128, the
whole batch in one forward pass, length-grouped batches) and see *the same batches*:

  multitask   one Trainer, ``--steps`` steps drawn at proportional rates (T5 §3.5.2) over the tasks
  single      per task, its own Trainer for exactly the steps the mixture gave that task, seeded as the
              mixture seeds that task's stream (seed*1009 + t), so its batches are the mixture's
              batches of that task, in the same order (checked before timing: ``same_batches``)

The time of a side is the Trainer's step time (``Trainer.elapsed``: data order, batch building,
forward, backward, optimizer; not construction, not the final save), in CPU seconds of the
process on one thread with ``--cpu-time``. Both sides start from the same weights each repetition
and run in turn (the order alternating), so the machine's drift falls on both. The figure: for every
batch (a task and its batch number, the same on both sides), single-task seconds / multi-task
seconds of its step, and the median over all batches of all repetitions = multi-task steps/s
relative to single-task steps/s (1.0 = as fast; 0.95 = 5% slower). Per repetition, the ratio of the
two sides' total step time is printed as well (one burst of load on a busy machine moves it a lot).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import shutil
import sys
import tempfile
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "common"))  # the shared helpers
from _bench import load, machine, median  # noqa: E402

MINILM = Path(__file__).resolve().parents[3] / "shared" / "data" / "checkpoints" / "all-MiniLM-L6-v2"
SETTINGS = {"lr": 1e-4, "batch_size": 32, "max_length": 128, "seed": 1}


@dataclasses.dataclass
class Setup:
    cfg: object  # the RunConfig both sides train with
    start: object  # ember.runs.init.Init: model config, weights, tokenizer
    tasks: list  # (name, adapter)
    features: dict  # name -> training features
    rates: list
    counts: list  # steps the mixture gives each task


def setup(init: str, tasks: list[str], steps: int, limit: int, cpu_time: bool, model: str = "",
          tokenizer: str = "", overrides: tuple = ()) -> Setup:
    from ember.config import RunConfig, TaskConfig, TrainConfig, apply_overrides, run_config_from_dict, to_dict
    from ember.runs.init import load_init
    from ember.tasks.base import get_adapter
    from ember.tokenizers import load_tokenizer
    from ember.train.mixture import MixtureSchedule, mixing_rates

    start = load_init(init, model, tokenizer)
    train = TrainConfig(lr=SETTINGS["lr"], batch_size=SETTINGS["batch_size"], micro_batch_size=SETTINGS["batch_size"],
                        seed=SETTINGS["seed"], warmup_ratio=0.0, max_steps=steps, log_every=1,
                        save_every=0, eval_every=0, num_threads=1 if cpu_time else 0,
                        clock="cpu" if cpu_time else "wall")
    base = RunConfig(kind="finetune", model=start.model, train=train,
                     task=TaskConfig(name=tasks[0], max_length=SETTINGS["max_length"], init=str(init)))
    cfg = run_config_from_dict(apply_overrides(to_dict(base), list(overrides)), where="multitask_step")
    tok = load_tokenizer(start.tokenizer)
    adapters = [(name, get_adapter(name, cfg.model)) for name in tasks]
    features = {name: a.load("train", tok, cfg.task.max_length, limit=limit)[1] for name, a in adapters}
    rates = mixing_rates({n: len(f) for n, f in features.items()}, "proportional", 2 ** 21, 1.0)
    rates = [rates[n] for n in tasks]
    counts = [int(c) for c in MixtureSchedule(rates, cfg.train.seed).counts(steps)]
    return Setup(cfg, start, adapters, features, rates, counts)


def _modules(s: Setup) -> dict:
    """Each task's module on one shared backbone, from the same weights every time (as run_multitask)."""
    from ember.tasks.task_model import build_task_module, pad_token_id
    from ember.tokenizers import load_tokenizer

    pad = pad_token_id(load_tokenizer(s.start.tokenizer))
    modules = {}
    for t, (name, adapter) in enumerate(s.tasks):
        torch.manual_seed(s.cfg.train.seed * 1009 + t)
        if not modules:
            modules[name] = build_task_module(s.cfg, adapter, s.start.state, pad)
        else:
            modules[name] = adapter.build_module(modules[s.tasks[0][0]].backbone, pad)
    return modules


def _single_module(s: Setup, t: int):
    from ember.tasks.task_model import build_task_module, pad_token_id
    from ember.tokenizers import load_tokenizer

    torch.manual_seed(s.cfg.train.seed * 1009 + t)
    return build_task_module(s.cfg, s.tasks[t][1], s.start.state, pad_token_id(load_tokenizer(s.start.tokenizer)))


def _mixture(s: Setup):
    from ember.train.length_groups import feature_lengths
    from ember.train.mixture import TaskMixture

    feats = [s.features[n] for n, _ in s.tasks]
    return TaskMixture(feats, s.rates, [feature_lengths(f) for f in feats])


def _single_data(s: Setup, t: int):
    from ember.data.in_memory import InMemoryData
    from ember.train.length_groups import feature_lengths

    feats = s.features[s.tasks[t][0]]
    return InMemoryData(feats, feature_lengths(feats))


def _single_cfg(s: Setup, t: int):
    # the mixture seeds task t's stream with seed*1009 + t (ember.train.mixture.MixtureOrder)
    return dataclasses.replace(s.cfg.train, seed=s.cfg.train.seed * 1009 + t, max_steps=s.counts[t])


def same_batches(s: Setup) -> None:
    """The single-task trainers take exactly the mixture's batches of their task, in order; else raise."""
    from ember.train.loop import Trainer
    from ember.train.multitask import MultiTaskModel

    with tempfile.TemporaryDirectory(prefix="ember-mt-bench-") as tmp:
        multi = Trainer(MultiTaskModel(_modules(s)), _mixture(s), s.cfg.train, Path(tmp) / "m", progress=False)
        batch = s.cfg.train.batch_size
        streams = [[] for _ in s.tasks]
        for step in range(s.cfg.train.max_steps):
            positions = [multi.order(step * batch + o) for o in range(batch)]
            task = multi.data.example(positions[0][0], 0)[0]
            streams[task].append([i - multi.data.offsets[task] for i, _ in positions])
        for t in range(len(s.tasks)):
            single = Trainer(_single_module(s, t), _single_data(s, t), _single_cfg(s, t), Path(tmp) / f"s{t}",
                             progress=False)
            mine = [[single.order(b * batch + o)[0] for o in range(batch)] for b in range(s.counts[t])]
            if mine != streams[t]:
                raise RuntimeError(f"task {s.tasks[t][0]}: the single-task batches differ from the mixture's; "
                                   "the two sides would not time the same work")


def _step_seconds(run_dir: Path) -> list[tuple[dict, float]]:
    """(record, seconds) of every training step, from the Trainer's log (elapsed is cumulative step time)."""
    from ember.train.logging import MetricsLogger

    records = [r for r in MetricsLogger.read(run_dir / "metrics.jsonl") if r["split"] == "train"]
    return [(r, r["elapsed"] - (records[i - 1]["elapsed"] if i else 0.0)) for i, r in enumerate(records)]


def time_multitask(s: Setup, tmp: Path) -> tuple[float, dict]:
    """(step seconds in all, {(task, its batch number): seconds})."""
    from ember.train.loop import Trainer
    from ember.train.multitask import MultiTaskModel

    trainer = Trainer(MultiTaskModel(_modules(s)), _mixture(s), s.cfg.train, tmp / "multi", progress=False)
    trainer.train()
    steps, seen = {}, {name: 0 for name, _ in s.tasks}
    for record, seconds in _step_seconds(tmp / "multi"):
        name = next(n for n in seen if f"{n}.loss" in record)  # the task this step trained
        steps[(name, seen[name])] = seconds
        seen[name] += 1
    return trainer.elapsed, steps


def time_single(s: Setup, tmp: Path) -> tuple[float, dict]:
    from ember.train.loop import Trainer

    total, steps = 0.0, {}
    for t, (name, _) in enumerate(s.tasks):
        if s.counts[t]:
            trainer = Trainer(_single_module(s, t), _single_data(s, t), _single_cfg(s, t), tmp / f"single-{t}",
                              progress=False)
            trainer.train()
            total += trainer.elapsed
            steps.update({(name, b): seconds for b, (_, seconds) in enumerate(_step_seconds(tmp / f"single-{t}"))})
    return total, steps


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--init", default=str(MINILM), help="an HF checkpoint folder or an ember run")
    parser.add_argument("--tasks", nargs="+", default=["rte", "mrpc", "stsb", "sst2"])
    parser.add_argument("--steps", type=int, default=48, help="multi-task steps per repetition")
    parser.add_argument("--reps", type=int, default=3)
    parser.add_argument("--train-limit", type=int, default=400, help="training rows read per task")
    parser.add_argument("--cpu-time", action="store_true", help="one thread, CPU seconds of the process")
    parser.add_argument("--json")
    parser.add_argument("--smoke", action="store_true", help="a tiny random BERT, few steps (CI)")
    parser.add_argument("--tokenizer", default="", help="with --smoke: the tiny model's tokenizer.json")
    args = parser.parse_args(argv)
    if args.cpu_time:
        torch.set_num_threads(1)
    init, model, overrides = args.init, "", ()
    if args.smoke:
        init, model = "random", "bert-tiny"
        overrides = ("model.hidden_size=32", "model.num_layers=2", "model.num_heads=2", "model.intermediate_size=64",
                     "task.max_length=48")
        args.steps, args.reps, args.train_limit = 12, 2, 48
    print(f"{machine()}; {load()}", flush=True)
    s = setup(init, args.tasks, args.steps, args.train_limit, args.cpu_time, model, args.tokenizer, overrides)
    same_batches(s)
    print(f"tasks {', '.join(n for n, _ in s.tasks)}: {args.steps} steps, per task "
          f"{dict(zip([n for n, _ in s.tasks], s.counts))}; the same batches on both sides (checked)", flush=True)
    reps, paired = [], []
    with tempfile.TemporaryDirectory(prefix="ember-mt-bench-") as tmp:
        for rep in range(args.reps):
            sides = [("multitask", time_multitask), ("single", time_single)]
            seconds, steps = {}, {}
            for name, fn in (sides if rep % 2 == 0 else sides[::-1]):  # alternate who goes first
                seconds[name], steps[name] = fn(s, Path(tmp) / f"rep{rep}")
            # the same batch on both sides: a ratio per batch, so a burst of load on a few steps
            # moves the median little (a shared machine's CPU time drifts with cache pressure)
            paired += [steps["single"][k] / steps["multitask"][k] for k in steps["multitask"]
                       if steps["multitask"][k] > 0 and k in steps["single"]]
            shutil.rmtree(Path(tmp) / f"rep{rep}", ignore_errors=True)  # the trainers' final checkpoints
            ratio = seconds["single"] / seconds["multitask"]
            reps.append({**seconds, "ratio": ratio, "load": load()})
            print(f"  rep {rep}: multitask {seconds['multitask']:.2f} s, single {seconds['single']:.2f} s "
                  f"({args.steps} steps each): multi-task steps/s = {ratio:.3f} x single-task; {load()}", flush=True)
    results = {"machine": machine(), "clock": "cpu (process, 1 thread)" if args.cpu_time else "wall",
               "init": str(init), "tasks": [n for n, _ in s.tasks], "steps": args.steps, "task_steps": s.counts,
               "settings": dict(SETTINGS), "reps": reps, "median_ratio": median([r["ratio"] for r in reps]),
               "ratio_of_medians": median([r["single"] for r in reps]) / median([r["multitask"] for r in reps]),
               "paired_steps": len(paired), "median_step_ratio": median(paired) if paired else None}
    figure = results["median_step_ratio"] or results["median_ratio"]
    verdict = "within" if figure >= 0.95 else "outside"
    print(f"multi-task steps/s / single-task steps/s: median over the {len(paired)} paired batches "
          f"{figure:.3f}; per repetition: median {results['median_ratio']:.3f}, ratio of medians "
          f"{results['ratio_of_medians']:.3f}; goal >= 0.95 (no slower than single-task, +-5%): {verdict}", flush=True)
    if args.json:
        Path(args.json).write_text(json.dumps(results, indent=2))
    return results


if __name__ == "__main__":
    main()
