"""`ember compare`'s report: results.json, results.md and comparison.png, rebuilt from OUT/runs.

Everything is read back from the run folders, so the report is right after any resume and
can be regenerated at any time. Scores are the dev set's main metric of each task (accuracy,
MCC for CoLA, F1 for MRPC, Spearman for STS-B), shown x 100 as GLUE reports them.
"""

from __future__ import annotations

import json
import math
from pathlib import Path

from ember.compare import clean, format_duration
from ember.fileio import atomic_write_text


def collect_results(out: Path, models: list[tuple[str, str]], meta: dict) -> dict:
    """results.json's content, read back from the run folders (so it is right after any resume)."""
    from ember.tasks.glue import get_task
    from ember.train.finetune import summarize_seeds

    rows = []
    for label, recipe in models:
        label_dir = out / "runs" / label
        pre = label_dir / "pretrain.json"
        tasks = {}
        for name in meta["tasks"]:
            spec = get_task(name)
            runs = {}
            for seed in meta["seeds"]:
                path = label_dir / f"{name}-seed{seed}" / "results.json"
                if path.is_file():
                    runs[str(seed)] = json.loads(path.read_text())["metrics"]
            if runs:
                summary = summarize_seeds([{"metrics": m} for m in runs.values()])
                main = summary[spec.main_metric]
                tasks[name] = {"task": spec.display_name, "main_metric": spec.main_metric,
                               "mean": main["mean"], "std": main["std"], "seeds": runs, "metrics": summary}
        rows.append({"label": label, "recipe": recipe or f"random init, shape of {models[0][0]}",
                     "pretrain": json.loads(pre.read_text()) if pre.is_file() else None,
                     "tasks": tasks, **glue_average(tasks, meta)})
    return {**meta, "models": rows}


def glue_average(tasks: dict, meta: dict) -> dict:
    """Mean over tasks of the main metric (as BERT's Table 1 averages F1/Spearman/MCC/accuracy).

    Its spread is the std over seeds of the per-seed average, seeds being shared by tasks.
    Only defined once every task has results.
    """
    if len(tasks) < len(meta["tasks"]):
        return {"glue_average": None, "glue_average_std": None}
    average = sum(t["mean"] for t in tasks.values()) / len(tasks)
    seeds = [s for s in map(str, meta["seeds"]) if all(s in t["seeds"] for t in tasks.values())]
    per_seed = [sum(tasks[n]["seeds"][s][tasks[n]["main_metric"]] for n in tasks) / len(tasks) for s in seeds]
    std = None
    if len(per_seed) > 1:
        mean = sum(per_seed) / len(per_seed)
        std = math.sqrt(sum((v - mean) ** 2 for v in per_seed) / (len(per_seed) - 1))
    return {"glue_average": average, "glue_average_std": std}


def _score(mean, std) -> str:
    if mean is None or not math.isfinite(mean):
        return "—" if mean is None else "nan"
    return f"{100 * mean:.1f}" + (f" ± {100 * std:.1f}" if std is not None and math.isfinite(std) else "")


def _count(n) -> str:
    if n is None:
        return "—"
    for size, suffix in ((1e9, "G"), (1e6, "M"), (1e3, "k")):
        if n >= size:
            return f"{n / size:.1f}{suffix}"
    return str(int(n))


def render_markdown(results: dict) -> str:
    from ember.tasks.glue import get_task

    s = results["settings"]
    ft = s["finetune"]
    specs = [get_task(t) for t in results["tasks"]]
    lines = [
        "# Equal-compute comparison", "",
        f"Each recipe pre-trained for {format_duration(s['budget_seconds'])} of training steps on "
        f"`{s['data']}` (seed {s['pretrain_seed']}; max_steps = budget x speed measured by a probe, "
        "max_time = budget). Fine-tuned with lr "
        f"{ft['lr']:g}, {ft['epochs'] or 'the task default'} epochs, max length {ft['max_length'] or 128}"
        f"{', first %d training examples' % ft['train_limit'] if ft['train_limit'] else ''}; "
        f"seeds {', '.join(map(str, results['seeds']))}. Dev-set main metric x 100, mean ± std over seeds.",
        "",
        "| model | " + " | ".join(f"{sp.display_name} ({sp.main_metric})" for sp in specs)
        + " | average | pre-train steps | tokens |",
        "|---" * (len(specs) + 4) + "|",
    ]
    for row in results["models"]:
        pre = row["pretrain"] or {}
        cells = [_score(row["tasks"].get(sp.name, {}).get("mean"), row["tasks"].get(sp.name, {}).get("std"))
                 for sp in specs]
        lines.append(f"| {row['label']} | " + " | ".join(cells)
                     + f" | {_score(row['glue_average'], row['glue_average_std'])}"
                     + f" | {pre.get('steps', '—') if pre else '—'} | {_count(pre.get('tokens'))} |")
    lines += ["", "## Pre-training", "",
              "| model | recipe | objective | parameters | probe steps/s | max steps | steps | "
              "train time | stopped by | tokens/s | held-out |", "|---" * 11 + "|"]
    for row in results["models"]:
        pre = row["pretrain"]
        if pre is None:
            continue
        held = ", ".join(f"{k} {v:.3f}" for k, v in pre["held_out"].items() if isinstance(v, (int, float)))
        lines.append(f"| {row['label']} | {row['recipe']} | {pre['objective']} | {_count(pre['parameters'])} | "
                     f"{pre['probe']['steps_per_s']:.2f} | {pre['max_steps']} | {pre['steps']} | "
                     f"{format_duration(pre['train_seconds'])} | {pre['stopped_by']} | "
                     f"{pre['tokens_per_s']:.0f} | {held or '—'} |")
    return "\n".join(lines) + "\n"


def render_chart(results: dict, path: Path) -> None:
    """Grouped bars: one group per task (+ the average), one bar per model, std error bars."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from ember.tasks.glue import get_task

    groups = [(get_task(t).display_name + f"\n({get_task(t).main_metric})", t) for t in results["tasks"]]
    groups.append(("average", None))
    models = results["models"]
    width = 0.8 / max(len(models), 1)
    fig, ax = plt.subplots(figsize=(2.6 + 1.3 * len(groups) * max(1, len(models) / 3), 4.2))
    for m, row in enumerate(models):
        xs, heights, errors = [], [], []
        for g, (_, task) in enumerate(groups):
            mean, std = ((row["glue_average"], row["glue_average_std"]) if task is None else
                         (row["tasks"].get(task, {}).get("mean"), row["tasks"].get(task, {}).get("std")))
            if mean is None or not math.isfinite(mean):
                continue
            xs.append(g - 0.4 + width * (m + 0.5))
            heights.append(100 * mean)
            errors.append(100 * std if std is not None and math.isfinite(std) else 0.0)
        ax.bar(xs, heights, width, yerr=errors, capsize=3, label=row["label"])
    ax.set_xticks(range(len(groups)), [name for name, _ in groups])
    ax.axhline(0, color="black", linewidth=0.6)
    ax.set_ylabel("dev score x 100 (mean ± std over seeds)")
    ax.set_title(f"{format_duration(results['settings']['budget_seconds'])} of pre-training per recipe")
    ax.legend(fontsize=8, loc="upper left", bbox_to_anchor=(1.0, 1.0))  # beside the bars, not on them
    ax.grid(axis="y", alpha=0.3)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def write_reports(out: Path, models: list[tuple[str, str]], meta: dict) -> dict:
    results = clean(collect_results(out, models, meta))
    atomic_write_text(out / "results.json", json.dumps(results, indent=2))
    atomic_write_text(out / "results.md", render_markdown(results))
    render_chart(results, out / "comparison.png")
    return results
