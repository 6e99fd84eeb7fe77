"""Time to a pre-training loss: held-out MLM loss and accuracy against CPU time for ember's
recipe and a run_mlm-style transformers loop, same model, same data, same budget (issue 18,
item 4). The target: ember reaches the loss the reference ends its budget with in half the
time or less.

    # the sides on the two cores (one thread each), then the table and the plot
    PYTHONPATH=. .venv/bin/python benchmarks/studies/time_to_loss.py --data runs/wiki --budget 30m --out runs/ttl --side ember &
    PYTHONPATH=. .venv/bin/python benchmarks/studies/time_to_loss.py --data runs/wiki --budget 30m --out runs/ttl --side reference
    wait; PYTHONPATH=. .venv/bin/python benchmarks/studies/time_to_loss.py --out runs/ttl --report

Without --side, ember and the reference run in turn in one process and the report follows.

  ember      `ember pretrain --recipe bert-mini --set objective=mlm` (MLM only, as run_mlm) with
             the budget as train.max_time and train.schedule=time (warm-up and linear decay
             laid over the budget, as cramming does), held-out evaluation every
             --ember-eval-every steps
  reference  transformers.BertForMaskedLM by a plain loop (benchmarks/common/_hf_reference.py) with
             run_mlm's full-vocabulary head, the recipe's lr, warm-up, AdamW settings and
             clipping, and ember's time schedule over the same budget; held-out evaluation
             every budget/--evals seconds of training
  reference-masked  the same loop with logits at the masked rows only (the informed user;
             optional, --side reference-masked): the report adds it as a second yardstick
Every side draws the same examples with the same masks at every step, and all are scored by
ember's held-out function on the same examples with the same fixed masks. Each runs on one
thread and counts the CPU seconds of its training steps (train.clock=cpu), evaluation
excluded, so a busy machine cannot make the budgets unequal. ember's time to a reference's
final loss is read off its curve, linearly interpolated between evaluations.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "common"))  # the shared helpers
from _bench import load, machine  # noqa: E402
from _hf_reference import train_reference  # noqa: E402
from time_to_accuracy import SMOKE_MODEL, recipe_config  # noqa: E402

import ember  # noqa: E402
from ember.durations import parse_duration  # noqa: E402
from ember.fileio import atomic_write_text  # noqa: E402
from ember.runs.folder import load_run_config  # noqa: E402
from ember.train.logging import MetricsLogger  # noqa: E402

# the reference loops and their heads (benchmarks/common/_hf_reference.py)
REFERENCES = {"reference": "full", "reference-masked": "masked"}
SIDES = ("ember", *REFERENCES)
LABELS = {"ember": "ember", "reference": "transformers, full head (run_mlm)",
          "reference-masked": "transformers, head at masked rows"}


def run_ember(args, out: Path, overrides: list[str], budget: float) -> dict:
    sets = overrides + [f"train.max_time={budget}", "train.schedule=time", "train.max_steps=100000000",
                        f"train.eval_every={args.ember_eval_every}", "train.save_every=0"]
    trained = ember.pretrain(args.recipe, out / "ember", data=args.data, overrides=sets, overwrite=True,
                             progress=False).runs[0]
    info = {"steps": trained["step"], "elapsed": trained["elapsed"], "tokens": trained["tokens"]}
    atomic_write_text(out / "ember" / "pretrain.json", json.dumps(info, indent=2))
    return info


def run_reference(args, out: Path, cfg, budget: float, side: str) -> dict:
    def show(row: dict) -> None:
        print(f"  {side} step {row['step']}, {row['elapsed']:.0f} s: held-out MLM loss {row['mlm_loss']:.3f}",
              flush=True)

    return train_reference(cfg, out / side, budget, head=REFERENCES[side], evaluate_every=budget / args.evals,
                           on_eval=None if args.smoke else show)


def curve(run: Path) -> list[dict]:
    """A side's held-out evaluations in time order: elapsed (s), mlm_loss, mlm_acc, step."""
    rows = [r for r in MetricsLogger.read(run / "metrics.jsonl") if r.get("split") == "eval"]
    return sorted(({k: r[k] for k in ("step", "elapsed", "mlm_loss", "mlm_acc")} for r in rows),
                  key=lambda r: r["elapsed"])


def time_to(rows: list[dict], key: str, target: float, lower: bool = True) -> dict | None:
    """The first time a curve reaches ``target`` (loss: at or below; accuracy: at or above),
    linearly interpolated between the two evaluations around it. None when it never does;
    ``bound`` is true when the first evaluation was already there (the time is an upper bound)."""
    def reached(v: float) -> bool:
        return v <= target if lower else v >= target

    for i, row in enumerate(rows):
        if reached(row[key]):
            if i == 0:
                return {"seconds": row["elapsed"], "bound": True}
            a = rows[i - 1]
            share = (a[key] - target) / (a[key] - row[key]) if a[key] != row[key] else 1.0
            return {"seconds": a["elapsed"] + share * (row["elapsed"] - a["elapsed"]), "bound": False}
    return None


def report(out: Path) -> dict:
    """results.json, table.md and curves.png from the finished sides in OUT: ember's time to
    each reference's final held-out loss and accuracy (the issue's target is set by run_mlm's
    full-head loop, "reference")."""
    done = [s for s in SIDES if (out / s / "pretrain.json").is_file()]
    if "ember" not in done or len(done) < 2:
        wanted = "ember" if "ember" not in done else "reference"
        raise SystemExit(f"no finished {wanted} run in {out}: run --side {wanted} first")
    setup = json.loads((out / "setup.json").read_text()) if (out / "setup.json").is_file() else {}
    # every side draws the Trainer's batches, so sequences seen = steps x ember's batch size
    result = {"setup": setup, "load": load(), "sides": done, "batch_size": load_run_config(out / "ember").train.batch_size}
    for side in done:
        rows = curve(out / side)
        if not rows:
            raise SystemExit(f"{out / side} has no held-out evaluation: was --data prepared with a valid split?")
        result[side] = {"pretrain": json.loads((out / side / "pretrain.json").read_text()), "curve": rows}
    for side in done[1:]:
        final = result[side]["curve"][-1]
        for key, lower in (("mlm_loss", True), ("mlm_acc", False)):
            hit = time_to(result["ember"]["curve"], key, final[key], lower)
            # the share of the reference's own budget (the elapsed of its last evaluation)
            result[side][f"ember_time_to_{key}"] = hit and {**hit, "ratio": hit["seconds"] / final["elapsed"]}
    target = result.get("reference", result[done[1]])["ember_time_to_mlm_loss"]
    result["target_met"] = target is not None and target["ratio"] <= 0.5
    atomic_write_text(out / "results.json", json.dumps(result, indent=2))
    atomic_write_text(out / "table.md", render(result))
    plot(result, out / "curves.png")
    print(render(result))
    return result


def _reach(hit: dict | None) -> str:
    if hit is None:
        return "not reached"
    return f"{'<= ' if hit['bound'] else ''}{hit['seconds'] / 60:.1f} min ({hit['ratio']:.2f}x)"


def render(result: dict) -> str:
    setup = result["setup"]
    lines = [f"Held-out MLM loss/accuracy ({setup.get('recipe', '?')}, objective mlm, "
             f"{setup.get('budget_s', 0) / 60:.0f} CPU-min per side, one thread, {setup.get('eval_examples', '?')} "
             f"held-out sequences with fixed masks). {setup.get('machine', '')}; {result['load']}", "",
             "| side | steps | sequences seen | final held-out MLM loss | final MLM accuracy | "
             "ember reaches its final loss after (x its budget) | ... its final accuracy after |",
             "|---|---:|---:|---:|---:|---:|---:|"]
    for side in result["sides"]:
        r, last = result[side], result[side]["curve"][-1]
        reach = ["-", "-"] if side == "ember" else [_reach(r["ember_time_to_mlm_loss"]), _reach(r["ember_time_to_mlm_acc"])]
        lines.append(f"| {LABELS[side]} | {r['pretrain']['steps']:,} | {r['pretrain']['steps'] * result['batch_size']:,} | "
                     f"{last['mlm_loss']:.3f} | {100 * last['mlm_acc']:.2f}% | {reach[0]} | {reach[1]} |")
    lines += ["", f"Target (ember reaches the run_mlm-style loop's final loss in <= 0.5x the budget): "
                  f"{'met' if result['target_met'] else 'not met'}."]
    return "\n".join(lines) + "\n"


HELD_OUT_PANELS = (("mlm_loss", "held-out MLM loss"), ("mlm_acc", "held-out MLM accuracy"))


def plot_held_out(path: Path, title: str, draw) -> None:
    """Loss and accuracy panels against CPU-minutes; ``draw(ax, key)`` puts the curves on each."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 2, figsize=(11, 4))
    for ax, (key, name) in zip(axes, HELD_OUT_PANELS):
        draw(ax, key)
        ax.set_xlabel("CPU-minutes of training (one thread)")
        ax.set_ylabel(name)
        ax.grid(alpha=0.3)
    axes[0].legend(fontsize=8)
    axes[0].set_title(title, fontsize=9)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def plot(result: dict, path: Path) -> None:
    colours = {"ember": "tab:red", "reference": "tab:blue", "reference-masked": "tab:green"}

    def draw(ax, key: str) -> None:
        for side in result["sides"]:
            rows = result[side]["curve"]
            ax.plot([r["elapsed"] / 60 for r in rows], [r[key] for r in rows], "o-", ms=3, color=colours[side],
                    label=LABELS[side])
            if side != "ember":
                ax.axhline(rows[-1][key], ls="--", color=colours[side], lw=0.7)
                hit = result[side][f"ember_time_to_{key}"]
                if hit:
                    ax.axvline(hit["seconds"] / 60, ls=":", color=colours[side], lw=0.9)
    plot_held_out(path, "dashed: a reference's final value; dotted: ember reaches it", draw)


def main(argv: list[str] | None = None) -> dict | None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--data", help="prepared corpus folder (`ember prepare`) with a valid split")
    parser.add_argument("--out", required=True, help="folder for both runs, results.json, table.md, curves.png")
    parser.add_argument("--budget", type=parse_duration, default="30m", help="CPU time of training steps per side")
    parser.add_argument("--recipe", default="bert-mini", help="ember recipe for both sides (run with objective=mlm)")
    parser.add_argument("--side", choices=SIDES,
                        help="train one side only (run them in parallel); default: ember and reference in turn. "
                             "reference: run_mlm's full-vocabulary head; reference-masked: logits at masked rows only")
    parser.add_argument("--report", action="store_true", help="only make the table and plot from OUT")
    parser.add_argument("--evals", type=int, default=15, help="reference: held-out evaluations over the budget")
    parser.add_argument("--ember-eval-every", type=int, default=100, help="ember: steps between held-out evaluations")
    parser.add_argument("--set", dest="overrides", action="append", default=[], help="recipe override for both")
    parser.add_argument("--smoke", action="store_true", help="tiny model, seconds-long budget (CI)")
    args = parser.parse_args(argv)
    out = Path(args.out)
    if args.report:
        return report(out)
    if not args.data:
        parser.error("--data is required (a folder written by `ember prepare`)")
    budget = float(args.budget)
    overrides = ["objective=mlm"] + list(args.overrides)
    if args.smoke:
        from ember.data.shards import TokenCorpus

        budget, args.ember_eval_every, args.evals = 4.0, 3, 3
        overrides = SMOKE_MODEL + [f"model.vocab_size={TokenCorpus(args.data, 'train').vocab_size}"] + overrides
    overrides += ["train.clock=cpu", "train.num_threads=1"]
    torch.set_num_threads(1)
    cfg = recipe_config(args.recipe, overrides)
    cfg = dataclasses.replace(cfg, data=dataclasses.replace(cfg.data, prepared=str(args.data)))
    out.mkdir(parents=True, exist_ok=True)
    atomic_write_text(out / "setup.json", json.dumps({
        "machine": machine(), "recipe": args.recipe, "budget_s": budget, "overrides": overrides,
        "eval_examples": cfg.data.eval_examples, "data": str(args.data)}, indent=2))
    print(f"{machine()}; {load()}")
    for side in [args.side] if args.side else SIDES[:2]:
        info = (run_ember(args, out, overrides, budget) if side == "ember"
                else run_reference(args, out, cfg, budget, side))
        print(f"{side}: {info['steps']} steps in {info['elapsed']:.0f} CPU-s; {load()}", flush=True)
    if all((out / s / "pretrain.json").is_file() for s in SIDES[:2]):
        return report(out)
    return None


if __name__ == "__main__":
    main()
