"""bf16 against fp32 pre-training in the same CPU time: held-out MLM loss and accuracy against
CPU time for two ember runs that differ only in train.dtype, and the bf16 run's time to the
fp32 run's final loss and accuracy (linearly interpolated between evaluations).

    # the two runs (one thread each, CPU-time budgets, so they may run side by side)
    PYTHONPATH=. OMP_NUM_THREADS=1 python benchmarks/studies/time_to_loss.py --data runs/wiki --budget 10m \\
        --out runs/race-fp32 --side ember --ember-eval-every 200 --set train.dtype=float32 &
    PYTHONPATH=. OMP_NUM_THREADS=1 python benchmarks/studies/time_to_loss.py --data runs/wiki --budget 10m \\
        --out runs/race-bf16 --side ember --ember-eval-every 200 --set train.dtype=bfloat16
    # the table and the plot
    PYTHONPATH=. python benchmarks/studies/precision_race.py runs/race-fp32 runs/race-bf16 --out runs/race

Each run's held-out evaluation runs in its own precision (bf16 under autocast); the table
also gives each final model re-scored in fp32 when --rescore is passed. Worth running only on a
CPU with AMX (or a GPU): elsewhere bf16 products are ~100x slower (ember.train.precision).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "common"))  # the shared helpers
from _bench import run_cli  # noqa: E402
from time_to_loss import curve, plot_held_out, time_to  # noqa: E402

from ember.errors import EmberError  # noqa: E402
from ember.fileio import atomic_write_text  # noqa: E402

SIDES = ("fp32", "bf16")


def rescore_fp32(run: Path) -> dict:
    """The run's final model on its own held-out examples and masks, evaluated in fp32."""
    import tempfile

    import torch

    from ember.objectives.setup import setup_from_shards
    from ember.runs.checkpoint import load_weights
    from ember.runs.folder import load_run_config

    cfg = load_run_config(run)
    cfg = dataclasses.replace(cfg, train=dataclasses.replace(cfg.train, dtype="float32"))
    with tempfile.TemporaryDirectory() as scratch:  # the setup writes nothing, but is handed a folder
        setup = setup_from_shards(cfg, Path(scratch), resume=False, progress=False)
    setup.module.load_state_dict(load_weights(run / "model.safetensors"))
    setup.module.eval()
    with torch.no_grad():
        metrics = setup.evaluate(setup.module)
    return {"mlm_loss": metrics["mlm_loss"], "mlm_acc": metrics["mlm_acc"]}


def race(runs: dict[str, Path], rescore: bool = False) -> dict:
    result: dict = {}
    for side, folder in runs.items():
        run = folder / "ember"
        if not (run / "metrics.jsonl").is_file():
            raise EmberError(f"{run} has no metrics.jsonl: run time_to_loss.py --side ember --out {folder} first")
        rows = curve(run)
        if not rows:
            raise EmberError(f"{run}/metrics.jsonl has no held-out evaluations (split 'eval')")
        result[side] = {"curve": rows, "final": rows[-1]}
        if rescore:
            result[side]["final_fp32"] = rescore_fp32(run)
    final = result["fp32"]["final"]
    result["bf16_time_to_fp32_final_loss"] = time_to(result["bf16"]["curve"], "mlm_loss", final["mlm_loss"])
    result["bf16_time_to_fp32_final_acc"] = time_to(result["bf16"]["curve"], "mlm_acc", final["mlm_acc"], lower=False)
    result["budget_s"] = max(final["elapsed"], result["bf16"]["final"]["elapsed"])
    return result


def table(result: dict) -> str:
    lines = ["| dtype | steps | CPU-min | held-out MLM loss | accuracy | re-scored in fp32 |", "|---|---:|---:|---:|---:|---|"]
    for side in SIDES:
        last = result[side]["final"]
        again = result[side].get("final_fp32")
        again = f"{again['mlm_loss']:.4f}, {100 * again['mlm_acc']:.2f}%" if again else "-"
        lines.append(f"| {side} | {last['step']:,} | {last['elapsed'] / 60:.1f} | {last['mlm_loss']:.4f} | "
                     f"{100 * last['mlm_acc']:.2f}% | {again} |")
    for key, name in (("loss", "loss"), ("acc", "accuracy")):
        hit = result[f"bf16_time_to_fp32_final_{key}"]
        when = "never" if hit is None else (f"{hit['seconds'] / 60:.1f} CPU-min ({hit['seconds'] / result['budget_s']:.2f}x "
                                            f"the budget){' or less' if hit['bound'] else ''}")
        lines.append(f"\nbf16 reaches fp32's final {name}: {when}")
    return "\n".join(lines) + "\n"


def plot(result: dict, path: Path) -> None:
    def draw(ax, key: str) -> None:
        for side, colour in zip(SIDES, ("tab:blue", "tab:red")):
            rows = result[side]["curve"]
            ax.plot([r["elapsed"] / 60 for r in rows], [r[key] for r in rows], "o-", ms=3, color=colour,
                    label=f"{side} ({rows[-1]['step']:,} steps)")
        ax.axhline(result["fp32"]["final"][key], ls="--", color="tab:blue", lw=0.7)
    plot_held_out(path, "bf16 autocast vs fp32, same recipe, data and CPU budget", draw)


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("fp32", type=Path, help="the float32 run's --out folder (time_to_loss.py --side ember)")
    parser.add_argument("bf16", type=Path, help="the bfloat16 run's --out folder")
    parser.add_argument("--out", type=Path, required=True, help="folder for table.md, results.json, curves.png")
    parser.add_argument("--rescore", action="store_true", help="also evaluate both final models in fp32")
    args = parser.parse_args(argv)
    result = race({"fp32": args.fp32, "bf16": args.bf16}, args.rescore)
    args.out.mkdir(parents=True, exist_ok=True)
    text = table(result)
    atomic_write_text(args.out / "table.md", text)
    atomic_write_text(args.out / "results.json", json.dumps(result, indent=2))
    plot(result, args.out / "curves.png")
    print(text, end="")
    return result


if __name__ == "__main__":
    run_cli(main)
