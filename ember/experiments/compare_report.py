"""`ember compare`'s report: results.json, results.md, comparison.png and report.html (every run's
curves, settings and checkpoints: ``ember.experiments.run_report``), rebuilt from OUT/runs.

Everything is read back from the run folders, so the report is right after any resume and
can be regenerated at any time. Scores are the dev set's main metric of each task (accuracy,
MCC for CoLA, F1 for MRPC, Spearman for STS-B), shown x 100 as GLUE reports them.
"""

from __future__ import annotations

import json
from pathlib import Path

from ember.durations import format_duration
from ember.fileio import atomic_write_text
from ember.experiments.report_common import clean, format_count as _count, format_score as _score
from ember.experiments.run_report import has_runs, slug, write_report
from ember.experiments.report_common import glue_average, grouped_bar_chart, read_seed_metrics, task_summary


def collect_results(out: Path, models: list[tuple[str, str]], meta: dict) -> dict:
    """results.json's content, read back from the run folders (so it is right after any resume)."""
    from ember.tasks.readers.glue import get_task

    rows = []
    for label, recipe in models:
        label_dir = out / "runs" / label
        pre = label_dir / "pretrain.json"
        tasks = {}
        for name in meta["tasks"]:
            spec = get_task(name)
            found = read_seed_metrics({str(s): label_dir / f"{name}-seed{s}" for s in meta["seeds"]})
            if found:
                summary = task_summary(spec.display_name, spec.main_metric,
                                       {s: r["metrics"] for s, r in found.items()})
                tasks[name] = {k: v for k, v in summary.items() if k != "median"}
        rows.append({"label": label, "recipe": recipe or f"random init, shape of {models[0][0]}",
                     "pretrain": json.loads(pre.read_text()) if pre.is_file() else None,
                     "tasks": tasks, **glue_average(tasks, meta)})
    return {**meta, "models": rows}


def render_markdown(results: dict) -> str:
    from ember.tasks.readers.glue import get_task

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
        label = f"[{row['label']}](report.html#{slug(row['label'] + '/pretrain')})" if pre else row["label"]
        lines.append(f"| {label} | " + " | ".join(cells)
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
        link = f"[{row['label']}](report.html#{slug(row['label'] + '/pretrain')})"
        lines.append(f"| {link} | {row['recipe']} | {pre['objective']} | {_count(pre['parameters'])} | "
                     f"{pre['probe']['steps_per_s']:.2f} | {pre['max_steps']} | {pre['steps']} | "
                     f"{format_duration(pre['train_seconds'])} | {pre['stopped_by']} | "
                     f"{pre['tokens_per_s']:.0f} | {held or '—'} |")
    lines += ["", "Every run's curves (training and held-out), throughput, settings, data, fine-tuning seeds and "
              "checkpoints: [report.html](report.html) (`ember report`)."]
    return "\n".join(lines) + "\n"


def render_chart(results: dict, path: Path) -> None:
    """Grouped bars: one group per task (+ the average), one bar per model, std error bars."""
    from ember.tasks.readers.glue import get_task

    groups = [get_task(t).display_name + f"\n({get_task(t).main_metric})" for t in results["tasks"]]
    series = []
    for row in results["models"]:
        values = [row["tasks"].get(t) for t in results["tasks"]]
        values.append({"mean": row["glue_average"], "std": row["glue_average_std"]})
        series.append((row["label"], values))
    grouped_bar_chart(path, groups + ["average"], series, "dev score x 100 (mean ± std over seeds)",
                      f"{format_duration(results['settings']['budget_seconds'])} of pre-training per recipe")


def write_reports(out: Path, models: list[tuple[str, str]], meta: dict) -> dict:
    results = clean(collect_results(out, models, meta))
    atomic_write_text(out / "results.json", json.dumps(results, indent=2))
    atomic_write_text(out / "results.md", render_markdown(results))
    render_chart(results, out / "comparison.png")
    runs = [out / "runs" / label for label, _ in models if has_runs(out / "runs" / label)]
    if runs:  # runs named "<label>/pretrain", "<label>/<task>-seed<k>"
        write_report(runs, out / "report.html", title="ember compare")
    return results
