"""The report of benchmarks/studies/dai_le_nsmc.py, computed from its result dict alone (a saved
results.json can be re-rendered): the accuracy table, the claim read off it, and two charts.

The claim is the paper's (Dai & Le 2015, §4): a pre-trained LSTM (LM-LSTM, SA-LSTM) classifies
better than the same LSTM trained from random init, and the gap is widest with few labels. It
is decided per number of labels by the mean test accuracy over seeds, with each side's seed
spread beside it (a difference inside the spread is reported as such, not as a win).
"""

from __future__ import annotations

import json
import statistics
from pathlib import Path

NAMES = {"random": "LSTM, random init", "lm": "LM-LSTM", "sa": "SA-LSTM", "bow": "bag of words (LR)"}
# what each task's "test" is: (task name, the scored set, the training rows)
TASKS = {"nsmc": ("NSMC", "NSMC test reviews", "labelled training reviews"),
         "sst2": ("SST-2", "sentences of SST-2 dev's held-out half", "labelled training sentences")}


def perplexity_curves(runs: dict, curves: dict) -> dict:
    """Held-out loss and perplexity at every evaluation of each pre-training run, with its CPU time."""
    out = {}
    for name, run in runs.items():
        loss_key, ppl_key = curves[name]
        rows = [json.loads(line) for line in (Path(run) / "metrics.jsonl").read_text().splitlines() if line]
        evals = [r for r in rows if r["split"] == "eval"]
        out[name] = {"metric": ppl_key, "steps": [r["step"] for r in evals], "cpu_s": [r["elapsed"] for r in evals],
                     "loss": [r[loss_key] for r in evals], "ppl": [r[ppl_key] for r in evals]}
    return out


def _stats(values: list[float]) -> dict:
    return {"mean": statistics.fmean(values), "std": statistics.stdev(values) if len(values) > 1 else 0.0,
            "values": values}


def summary(report: dict) -> dict:
    """Per number of labels: test and dev accuracy of each contender (mean, std over seeds)."""
    rows = {}
    for n in map(str, report["labels"]):
        row = {}
        for label, by_n in report["finetune"].items():
            runs = by_n[n]
            row[label] = {"test": _stats([r["other_splits"]["test"]["accuracy"] for r in runs]),
                          "dev": _stats([r["metrics"]["accuracy"] for r in runs]),
                          "train_examples": runs[0]["train_examples"]}
        bow = report["bag_of_words"]["by_labels"][n]
        row["bow"] = {"test": _stats([bow["test_accuracy"]]), "dev": _stats([bow["dev_accuracy"]]),
                      "train_examples": bow["train_examples"]}
        rows[n] = row
    return rows


def claims(rows: dict) -> list[dict]:
    """For each pre-training and number of labels: its gain over random init in points, and
    whether it exceeds the larger of the two seed spreads (std); None (no claim) with one seed,
    which has no spread to judge a gain against."""
    out = []
    for n, row in rows.items():
        base = row["random"]["test"]
        for label in ("lm", "sa"):
            if label in row:
                mine = row[label]["test"]
                gain = 100 * (mine["mean"] - base["mean"])
                noise = 100 * max(mine["std"], base["std"])
                seeds = min(len(mine["values"]), len(base["values"]))
                out.append({"labels": int(n), "pretraining": label, "gain_points": gain, "spread_points": noise,
                            "holds": gain > noise if seeds > 1 else None})
    return out


def _cell(s: dict) -> str:
    return f"{100 * s['mean']:.2f} ± {100 * s['std']:.2f}" if len(s["values"]) > 1 else f"{100 * s['mean']:.2f}"


def markdown(report: dict, rows: dict, decided: list[dict]) -> str:
    order = [k for k in ("bow", "random", "lm", "sa") if k in next(iter(rows.values()))]
    name, scored, _ = TASKS[report.get("task", "nsmc")]
    lines = [f"# Dai & Le 2015 on {name}: pre-trained LSTM vs random init vs bag of words", "",
             f"Test accuracy (%) on the {report['bag_of_words']['test_examples']:,} {scored}, mean ± std "
             f"over seeds {report['seeds']} (bag of words: deterministic, l2 picked on dev); pre-training "
             f"{report['pretrain_budget_cpu_s'] / 60:.1f} CPU-min each on one thread. "
             f"Machine: {report['machine']}.", "",
             "| labels | " + " | ".join(NAMES[k] for k in order) + " |",
             "|---|" + "---|" * len(order)]
    for n, row in rows.items():
        shown = row["random"]["train_examples"]
        lines.append(f"| {shown:,} | " + " | ".join(_cell(row[k]["test"]) for k in order) + " |")
    lines += ["", "Held-out pre-training curves (perplexity per subword token):", ""]
    for name, curve in report["pretraining"].items():
        if curve["ppl"]:
            lines.append(f"- {NAMES[name]}: {curve['metric']} {curve['ppl'][0]:.1f} at step {curve['steps'][0]} "
                         f"-> {curve['ppl'][-1]:.1f} at step {curve['steps'][-1]} "
                         f"({curve['cpu_s'][-1] / 60:.1f} CPU-min)")
    lines += ["", "## Claims", "", "Pre-training beats the same LSTM from random init (gain in test accuracy "
              "points; 'holds' when the gain exceeds the larger seed std):", ""]
    for c in decided:
        verdict = {True: "holds", False: "does not hold", None: "one seed: no spread, no claim"}[c["holds"]]
        lines.append(f"- {NAMES[c['pretraining']]}, {c['labels']:,} labels: {c['gain_points']:+.2f} points "
                     f"(spread {c['spread_points']:.2f}): {verdict}")
    if report.get("smoke"):
        lines += ["", "(smoke run: a tiny LSTM on a few thousand reviews; these are not measurements)"]
    return "\n".join(lines) + "\n"


def _chart(path: Path, xlabel: str, ylabel: str, log: str, draw) -> None:
    """One PNG: ``draw(ax)`` plots the lines; ``log`` names the log-scaled axis ("x" or "y")."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6, 4))
    draw(ax)
    getattr(ax, f"set_{log}scale")("log")
    ax.set_xlabel(xlabel)
    ax.set_ylabel(ylabel)
    ax.grid(alpha=0.3)
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)


def plots(report: dict, rows: dict, out: Path) -> None:
    def accuracy(ax):
        for key in [k for k in ("bow", "random", "lm", "sa") if k in next(iter(rows.values()))]:
            xs = [row[key]["train_examples"] for row in rows.values()]
            means = [100 * row[key]["test"]["mean"] for row in rows.values()]
            stds = [100 * row[key]["test"]["std"] for row in rows.values()]
            ax.errorbar(xs, means, yerr=stds, marker="o", capsize=3, label=NAMES[key])

    def perplexity(ax):
        for name, curve in report["pretraining"].items():
            ax.plot([s / 60 for s in curve["cpu_s"]], curve["ppl"], "o-", markersize=3,
                    label=f"{NAMES[name]} ({curve['metric']})")

    name, _, rows_name = TASKS[report.get("task", "nsmc")]
    _chart(out / "accuracy_vs_labels.png", rows_name, f"{name} test accuracy (%)", "x", accuracy)
    _chart(out / "perplexity.png", "pre-training CPU minutes (one thread)", "held-out perplexity", "y", perplexity)


def write_report(report: dict, out: Path) -> None:
    """results.json (with the summary and claims), results.md and the two PNGs, into ``out``."""
    rows = summary(report)
    decided = claims(rows)
    report["summary"], report["claims"] = rows, decided
    (out / "results.json").write_text(json.dumps(report, indent=2))
    text = markdown(report, rows, decided)
    (out / "results.md").write_text(text)
    plots(report, rows, out)
    print(text)
