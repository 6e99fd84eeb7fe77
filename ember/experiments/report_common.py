"""Pieces shared by the fine-tuning reports of `ember compare` and `ember glue`.

Both read results back from run folders (``<task>-seed<k>/results.json``), summarise each
task over seeds (mean, sample std, median: papers report medians because single-seed GLUE
numbers on RTE/MRPC/CoLA swing by points), average the tasks' main metrics as BERT's
Table 1 does, and draw grouped bars. Scores are fractions in the JSON and x 100 in tables
and charts, as the GLUE papers print them.
"""

from __future__ import annotations

import json
import math
import os
from pathlib import Path


def read_seed_metrics(run_dirs: dict[str, Path]) -> dict[str, dict]:
    """seed -> results.json content, for the finished runs among ``run_dirs`` (seed -> folder)."""
    out = {}
    for seed, run_dir in run_dirs.items():
        path = Path(run_dir) / "results.json"
        if path.is_file():
            out[str(seed)] = json.loads(path.read_text())
    return out


def task_summary(display_name: str, main_metric: str, seed_metrics: dict[str, dict]) -> dict:
    """Mean/std/median of every metric over seeds, with the main metric's mean and std on top.

    ``seed_metrics``: seed -> {metric: value} (at least one seed).
    """
    from ember.tasks.metrics.classification import summarize_seeds

    summary = summarize_seeds([{"metrics": m} for m in seed_metrics.values()])
    main = summary[main_metric]
    return {"task": display_name, "main_metric": main_metric, "mean": main["mean"], "std": main["std"],
            "median": main["median"], "seeds": seed_metrics, "metrics": summary}


def glue_average(tasks: dict, meta: dict) -> dict:
    """Mean over tasks of the main metric (as BERT's Table 1 averages F1/Spearman/MCC/accuracy).

    ``tasks``: name -> ``task_summary`` result; ``meta["tasks"]`` the tasks that must all be
    present (a partial average would flatter an unfinished model), ``meta["seeds"]`` the seeds.
    Its spread is the std over seeds of the per-seed average, seeds being shared by tasks.
    """
    if not tasks or len(tasks) < len(meta["tasks"]):
        return {"glue_average": None, "glue_average_std": None}
    average = sum(t["mean"] for t in tasks.values()) / len(tasks)
    seeds = [s for s in map(str, meta["seeds"]) if all(s in t["seeds"] for t in tasks.values())]
    per_seed = [sum(tasks[n]["seeds"][s][tasks[n]["main_metric"]] for n in tasks) / len(tasks) for s in seeds]
    std = None
    if len(per_seed) > 1:
        mean = sum(per_seed) / len(per_seed)
        std = math.sqrt(sum((v - mean) ** 2 for v in per_seed) / (len(per_seed) - 1))
    return {"glue_average": average, "glue_average_std": std}


def format_count(n, missing: str = "—") -> str:
    """4_512_000 -> '4.5M', 40_650 -> '40.6k', None -> ``missing``."""
    if n is None:
        return missing
    for size, suffix in ((1e9, "G"), (1e6, "M"), (1e3, "k")):
        if n >= size:
            return f"{n / size:.1f}{suffix}"
    return str(int(n))


def format_score(mean, std=None, missing: str = "—") -> str:
    """0.8812, 0.0043 -> '88.1 ± 0.4'; None -> ``missing``; NaN (undefined correlation) -> 'nan'."""
    if mean is None or not math.isfinite(mean):
        return missing if mean is None else "nan"
    return f"{100 * mean:.1f}" + (f" ± {100 * std:.1f}" if std is not None and math.isfinite(std) else "")


def grouped_bar_chart(path: Path, groups: list[str], series: list[tuple[str, list]], ylabel: str,
                      title: str) -> None:
    """One group of bars per ``groups`` entry, one bar per series, std error bars.

    ``series``: (label, values) with one value per group: None (no bar) or a dict with
    ``mean`` and optionally ``std`` and ``points`` (per-seed values, drawn as dots), fractions.
    """
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    width = 0.8 / max(len(series), 1)
    fig, ax = plt.subplots(figsize=(2.6 + 1.3 * len(groups) * max(1, len(series) / 3), 4.2))
    for m, (label, values) in enumerate(series):
        xs, heights, errors, dots = [], [], [], []
        for g, value in enumerate(values):
            if value is None or value.get("mean") is None or not math.isfinite(value["mean"]):
                continue
            x = g - 0.4 + width * (m + 0.5)
            std = value.get("std")
            xs.append(x)
            heights.append(100 * value["mean"])
            errors.append(100 * std if std is not None and math.isfinite(std) else 0.0)
            dots += [(x, 100 * p) for p in value.get("points", ()) if p is not None and math.isfinite(p)]
        ax.bar(xs, heights, width, yerr=errors, capsize=3, label=label)
        if dots:
            ax.plot(*zip(*dots), "o", color="black", markersize=2.5, alpha=0.6,
                    label="single seeds" if m == 0 else None)
    ax.set_xticks(range(len(groups)), groups)
    ax.axhline(0, color="black", linewidth=0.6)
    ax.set_ylabel(ylabel)
    ax.set_title(title)
    ax.legend(fontsize=8, loc="upper left", bbox_to_anchor=(1.0, 1.0))  # beside the bars, not on them
    ax.grid(axis="y", alpha=0.3)
    fig.tight_layout()
    tmp = Path(path).with_name(f".{Path(path).name}.tmp.png")  # no half-written chart on a crash
    fig.savefig(tmp, dpi=110)
    plt.close(fig)
    os.replace(tmp, path)


def clean(value):
    """JSON-safe copy: NaN/inf (an undefined correlation) become null."""
    if isinstance(value, dict):
        return {k: clean(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [clean(v) for v in value]
    if isinstance(value, float) and not math.isfinite(value):
        return None
    return value
