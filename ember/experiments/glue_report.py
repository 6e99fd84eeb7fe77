"""`ember glue`'s report: glue.json, glue.md, glue.png and report.html (every run's curves, settings
and checkpoints: ``ember.experiments.run_report``), rebuilt from OUT/runs.

The markdown table has the layout of the GLUE tables in BERT (Table 1), RoBERTa and ELECTRA:
one row per system, the tasks as columns in the papers' order, then the average. Cells
carry the papers' metrics x 100: accuracy, F1/accuracy for MRPC (and QQP), Matthews
correlation for CoLA, Pearson/Spearman for STS-B. The "Average" is the mean of each task's
main metric (BERT's Table 1: F1 for MRPC, Spearman for STS-B, MCC for CoLA, accuracy
otherwise) over the tasks run here. A task with a labelled test split (MRPC's test.tsv here)
gets a further row of its test scores, each run's best-on-dev weights scored once (results.json
``other_splits.test``): reported, never chosen on, and left out of the Average. Every number is
read back from the run folders' results.json, so the report is right after any resume and can be
rebuilt at any time.
"""

from __future__ import annotations

import json
from pathlib import Path

from ember.fileio import atomic_write_text
from ember.experiments.report_common import clean, format_score, glue_average, grouped_bar_chart, read_seed_metrics, task_summary
from ember.experiments.run_report import slug, write_report

METRIC_NAMES = {"accuracy": "acc", "f1": "F1", "mcc": "MCC", "pearson": "Pearson", "spearman": "Spearman"}
DASH = "–"

# (column as the papers head it, ember task or None when ember has no such task here,
#  metrics printed in the cell: BERT's Table 1 metric first, then the GLUE companion one)
PAPER_COLUMNS = (
    ("MNLI-m (SNLI)", "snli", ("accuracy",)),  # SNLI stands in for MNLI, absent here
    ("QQP", None, ("f1", "accuracy")),
    ("QNLI", "qnli", ("accuracy",)),
    ("SST-2", "sst2", ("accuracy",)),
    ("CoLA", "cola", ("mcc",)),
    ("STS-B", "stsb", ("pearson", "spearman")),
    ("MRPC", "mrpc", ("f1", "accuracy")),
    ("RTE", "rte", ("accuracy",)),
)
GLUE_TASKS = tuple(task for _, task, _ in PAPER_COLUMNS if task)
# The fine-tuning settings an encoder's table names (glue.json written before the family's own were kept)
BERT_RECIPE = "BERT's settings (Devlin et al. 2019, §4.1: batch 32, lr 2e-5, 3 epochs, 10% warm-up, max length 128)"


def collect_results(out: Path, plans: list, meta: dict) -> dict:
    """glue.json's content: one entry per paper column, the average, and the settings."""
    from ember.tasks.readers.glue import get_task

    plans = {p.name: p for p in plans}
    columns, done = [], {}
    for column, task, shown in PAPER_COLUMNS:
        entry = {"column": column, "task": task, "metrics_shown": list(shown), "status": "missing"}
        if task is None:
            entry["note"] = "not in the data folder (ember has no reader for it)"
        elif task not in plans:
            entry["note"] = "not requested (--tasks)"
        elif plans[task].missing:
            entry["note"] = plans[task].missing
        if task is None or task not in plans or plans[task].missing:
            columns.append(entry)
            continue
        spec, plan = get_task(task), plans[task]
        entry.update(display_name=spec.display_name, main_metric=spec.main_metric,
                     train_split=plan.train_split, eval_split=plan.eval_split,
                     train_examples=plan.n_train, eval_examples=plan.n_eval)
        found = read_seed_metrics({str(s): out / "runs" / f"{task}-seed{s}" for s in meta["seeds"]})
        entry["runs"] = {s: {"metrics": r["metrics"], "best_step": r["best_step"], "steps": r["steps"],
                             "run_dir": f"runs/{task}-seed{s}",
                             **({"test": r["other_splits"]["test"]} if "test" in r.get("other_splits", {}) else {})}
                         for s, r in found.items()}
        if found:
            summary = task_summary(spec.display_name, spec.main_metric, {s: r["metrics"] for s, r in found.items()})
            entry["summary"] = summary["metrics"]
            done[task] = summary
            tested = {s: r["test"] for s, r in entry["runs"].items() if "test" in r}
            if tested:  # a labelled test split (MRPC): scored with each run's best-on-dev weights, never chosen on
                entry["test_summary"] = task_summary(spec.display_name, spec.main_metric, tested)["metrics"]
                entry["test_seeds"] = len(tested)
        entry["status"] = "done" if len(found) == len(meta["seeds"]) else ("partial" if found else "pending")
        columns.append(entry)
    present = [p for p in plans.values() if not p.missing]
    average = glue_average(done, {"tasks": [p.name for p in present], "seeds": meta["seeds"]})
    per_seed = None
    if average["glue_average"] is not None:
        # Median of the per-seed averages (seeds shared by every task), as the mean's companion.
        seeds = [str(s) for s in meta["seeds"] if all(str(s) in t["seeds"] for t in done.values())]
        per_seed = [sum(t["seeds"][s][t["main_metric"]] for t in done.values()) / len(done) for s in seeds]
    return {**meta, "columns": columns,
            "average": {"mean": average["glue_average"], "std": average["glue_average_std"],
                        "median": _median(per_seed) if per_seed else None, "per_seed": per_seed,
                        "tasks": sorted(done) if average["glue_average"] is not None else []}}


def _median(values: list[float]) -> float:
    ordered = sorted(values)
    mid = len(ordered) // 2
    return ordered[mid] if len(ordered) % 2 else (ordered[mid - 1] + ordered[mid]) / 2


def _cell(entry: dict, stat: str, key: str = "summary") -> str:
    """'88.1 ± 0.4' (stat='mean') or '88.2' (stat='median'); F1/acc pairs joined by ' / '. ``key``:
    "summary" (the evaluation split) or "test_summary" (a further labelled test split, MRPC's)."""
    summary = entry.get(key)
    if not summary:
        return DASH
    parts = []
    for metric in entry["metrics_shown"]:
        s = summary[metric]
        parts.append(format_score(s["mean"], s["std"], DASH) if stat == "mean" else format_score(s["median"], None, DASH))
    return " / ".join(parts)


def render_markdown(results: dict) -> str:
    s, cols, avg = results["settings"], results["columns"], results["average"]
    seeds = results["seeds"]
    overrides = [f"{k.replace('_', ' ')} {s[k]}" for k in ("lr", "epochs", "max_length") if s[k] is not None]
    if s["train_limit"]:
        overrides.append(f"first {s['train_limit']:,} training examples per task")
    header = ["System"] + [c["column"] for c in cols] + ["Average"]
    metrics = [""] + ["/".join(METRIC_NAMES[m] for m in c["metrics_shown"]) for c in cols] + [""]
    name = results["model"]
    mean_row = [f"{name} (mean ± std)"] + [_cell(c, "mean") for c in cols] + [
        format_score(avg["mean"], avg["std"], DASH)]
    median_row = [f"{name} (median)"] + [_cell(c, "median") for c in cols] + [format_score(avg["median"], None, DASH)]
    rows = [mean_row, median_row]
    if any(c.get("test_summary") for c in cols):  # no average: only some tasks have a labelled test split
        rows.append([f"{name}, test (mean ± std)"] + [_cell(c, "mean", "test_summary") for c in cols] + [DASH])
    lines = [
        "# GLUE-style results", "",
        f"Model `{s['init']}`{' (' + s['model'] + ')' if s['model'] else ''}, fine-tuned on each task with "
        + results.get("recipe", BERT_RECIPE)
        + (f", overridden: {', '.join(overrides)}" if overrides else "")
        + f"; {len(seeds)} seed(s) ({', '.join(map(str, seeds))}), best epoch on the evaluation split. "
        "Scores x 100 on the dev sets (SNLI: test), mean ± sample std over seeds, then the median.", "",
        "| " + " | ".join(header) + " |", "|---" * len(header) + "|",
        "| " + " | ".join(metrics) + " |", *("| " + " | ".join(row) + " |" for row in rows),
        "", "Notes:", "",
    ]
    for c in cols:
        if c["status"] == "missing":
            lines.append(f"* {c['column']}: {DASH}, {c['note']}.")
            continue
        if c["task"] == "snli":
            lines.append(f"* {c['column']}: SNLI stands in for MNLI, which is not in the data folder; SNLI has only "
                         f"dev and test here, so it trains on dev ({c['train_examples']:,} pairs used) and is "
                         f"scored on test ({c['eval_examples']:,} pairs).")
        if c.get("test_summary"):
            lines.append(f"* {c['column']}: its test split has labels here, so every run also scores test once with "
                         f"its best-on-dev weights ({c['test_seeds']} seed(s)); test is reported, never used to choose "
                         "an epoch or a setting.")
        if c["status"] != "done":
            lines.append(f"* {c['column']}: {len(c['runs'])} of {len(seeds)} seeds finished so far.")
    if avg["mean"] is not None:
        mains = ", ".join(f"{c['column']} {METRIC_NAMES[c['main_metric']]}" for c in cols if c.get("summary"))
        lines.append(f"* Average: mean of each task's main metric ({mains}) over the {len(avg['tasks'])} "
                     "tasks above; ± is the std over seeds of the per-seed average. The papers average 8 "
                     "(BERT, no WNLI) or 9 tasks, so it is not comparable with their Average column.")
    elif all(c["status"] == "done" for c in cols if c["status"] != "missing"):
        undefined = [f"{c['column']} {METRIC_NAMES[c['main_metric']]}" for c in cols if c.get("summary")
                     and c["summary"][c["main_metric"]]["mean"] is None]
        lines.append(f"* Average: {DASH}: {', '.join(undefined) or 'a main metric'} is undefined (a correlation of "
                     "outputs that are all the same, or all invalid, has no value).")
    else:
        lines.append(f"* Average: {DASH} until every task shown has a finished run.")
    lines += ["", "## Runs", "", "| task | seed | trained on | scored on | metrics | best step / steps | folder |",
              "|---" * 7 + "|"]
    for c in cols:
        for seed, run in sorted(c.get("runs", {}).items(), key=lambda kv: int(kv[0])):
            shown = ", ".join(f"{METRIC_NAMES.get(k, k)} {format_score(v)}" for k, v in run["metrics"].items())
            if "test" in run:
                shown += "; test " + ", ".join(f"{METRIC_NAMES.get(k, k)} {format_score(v)}" for k, v in run["test"].items())
            train = Path(c["train_split"]).name
            folder = f"[{run['run_dir']}](report.html#{slug(Path(run['run_dir']).name)})"
            lines.append(f"| {c['display_name']} | {seed} | {train} ({c['train_examples']:,}) | {c['eval_split']} "
                         f"({c['eval_examples']:,}) | {shown} | {run['best_step']} / {run['steps']} | {folder} |")
    lines += ["", "Every run's curves, settings, per-seed spread and checkpoints: [report.html](report.html) "
              "(`ember report`)."]
    return "\n".join(lines) + "\n"


def render_chart(results: dict, path: Path) -> None:
    """One bar per column (+ the average): main metric mean ± std, single seeds as dots."""
    groups, values = [], []
    for c in results["columns"]:
        summary = c.get("summary")
        if summary is None:
            groups.append(f"{c['column']}\n(n/a)")
            values.append(None)
            continue
        main = summary[c["main_metric"]]
        groups.append(f"{c['column']}\n({METRIC_NAMES[c['main_metric']]})")
        values.append({"mean": main["mean"], "std": main["std"], "points": main["values"]})
    avg = results["average"]
    groups.append("Average")
    values.append({"mean": avg["mean"], "std": avg["std"], "points": avg["per_seed"] or ()} if avg["mean"] is not None else None)
    grouped_bar_chart(path, groups, [(results["model"], values)], "score x 100 (mean ± std over seeds)",
                      f"GLUE-style fine-tuning of {results['model']} ({len(results['seeds'])} seeds)")


def write_reports(out: Path, plans: list, meta: dict) -> dict:
    results = clean(collect_results(out, plans, meta))
    atomic_write_text(out / "glue.json", json.dumps(results, indent=2))
    atomic_write_text(out / "glue.md", render_markdown(results))
    render_chart(results, out / "glue.png")
    runs = sorted(p for p in (out / "runs").glob("*-seed*") if (p / "config.yaml").is_file())
    if runs:  # named "<task>-seed<k>", as the Runs table links them
        write_report(runs, out / "report.html", title=f"ember glue: {results['model']}")
    return results
