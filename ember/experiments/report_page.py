"""The HTML page of `ember report`: run summaries (``ember.experiments.run_report``) -> one
self-contained document (inline CSS and SVG; no scripts, fonts or images from elsewhere).

Sections: an overview table (one row per run, linked to its section), training curves per
group of runs (the pre-training runs together, the fine-tuning runs of each task together: one
chart per metric, training as lines, held-out evaluations as dashed lines with dots, the
learning rate), throughput (tokens/s over training time), fine-tuning results per seed with
their spread (table: each seed, mean, sample std, min, max; chart: the main metric's seeds,
mean and ± 1 std per group), every task's dev curve of a multi-task run
(``ember.experiments.multitask_report``), then per run its settings (config.yaml, the recipe), data, tokens
seen and checkpoints.
"""

from __future__ import annotations

import datetime
import math
from html import escape

from ember.experiments.multitask_report import is_task_key, multitask_sections
from ember.experiments.report_common import format_count as _count
from ember.experiments.svg_chart import Series, color, line_chart, spread_chart

CSS = """
body { margin: 0 auto; max-width: 1180px; padding: 1rem 1.4rem 3rem; color: #1d2330; background: #f7f8fa;
       font: 14px/1.45 -apple-system, "Segoe UI", Roboto, "Helvetica Neue", Arial, sans-serif; }
h1 { font-size: 1.45rem; margin: .2rem 0; } h2 { margin-top: 2rem; border-bottom: 1px solid #d9dee5; }
h3 { margin: 1.2rem 0 .4rem; }
.muted { color: #5f6b7a; }
table { border-collapse: collapse; margin: .4rem 0 1rem; background: #fff; }
td, th { border: 1px solid #d9dee5; padding: .3rem .55rem; text-align: left; font-variant-numeric: tabular-nums; }
th { background: #f1f4f8; }
td.num { text-align: right; }
.charts { display: flex; flex-wrap: wrap; gap: .8rem; }
.charts svg { background: #fff; border: 1px solid #d9dee5; border-radius: 6px; }
section.run { background: #fff; border: 1px solid #d9dee5; border-radius: 8px; padding: .2rem 1rem 1rem; margin: 1rem 0; }
pre { background: #f4f6f9; padding: .6rem; border-radius: 5px; overflow-x: auto; font-size: .85em; }
"""
SKIP_CURVES = ("lr", "tokens_per_s")  # drawn in their own charts


def _num(value, digits: int = 4) -> str:
    if value is None or (isinstance(value, float) and not math.isfinite(value)):
        return "—"
    if isinstance(value, int) or (isinstance(value, float) and value.is_integer() and abs(value) >= 100):
        return f"{int(value):,}"
    return f"{value:.{digits}g}"


def _duration(seconds) -> str:
    from ember.durations import format_duration

    return "—" if seconds is None else format_duration(seconds)


def _table(header: list[str] | None, rows: list[list[str]], cls: str = "") -> str:
    """Cells are HTML already (escaped by the caller); no header row when ``header`` is None."""
    head = "<tr>" + "".join(f"<th>{h}</th>" for h in header) + "</tr>" if header else ""
    body = "".join("<tr>" + "".join(row) + "</tr>" for row in rows)
    return f'<table class="{cls}">{head}{body}</table>'


def _td(value, numeric: bool = False) -> str:
    return f'<td class="num">{value}</td>' if numeric else f"<td>{value}</td>"


def _metrics_text(metrics: dict) -> str:
    return ", ".join(f"{escape(k)} {_num(v)}" for k, v in metrics.items() if isinstance(v, (int, float))) or "—"


def _final(run: dict) -> dict:
    return (run["results"] or {}).get("metrics") or run["final_eval"]


def overview(runs: list[dict]) -> str:
    rows = []
    for r in runs:
        what = r["objective"] if r["kind"] == "pretrain" else (r["task"] or "fine-tuning")
        rows.append([_td(f'<a href="#{r["id"]}">{escape(r["name"])}</a>'), _td(escape(r["kind"])),
                     _td(escape(f'{r["family"]} · {what}')), _td(escape(r["recipe"] or "—")),
                     _td(_count(r["parameters"]), True), _td(_num(r["steps"]), True), _td(_count(r["tokens"]), True),
                     _td(_duration(r["seconds"]), True), _td(_count(r["tokens_per_s"]), True),
                     _td(_metrics_text(_final(r)))])
    return _table(["run", "kind", "model", "recipe", "parameters", "steps", "tokens seen", "training time",
                   "tokens/s", "final held-out / dev metrics"], rows, "overview")


def groups_of(runs: list[dict]) -> dict[str, list[dict]]:
    """Runs drawn together: the pre-training runs, then the fine-tuning runs of each task."""
    out: dict[str, list[dict]] = {}
    for r in runs:
        out.setdefault("pre-training" if r["kind"] == "pretrain" else f"fine-tuning: {r['task'] or '?'}", []).append(r)
    return out


def _series(runs: list[dict], key: str, split: str, x: str = "step", scale: float = 1.0) -> list[Series]:
    out = []
    for i, r in enumerate(runs):
        records = r["train"] if split == "train" else r["evals"]
        points = [(rec[x] * scale, rec[key]) for rec in records if isinstance(rec.get(key), (int, float))]
        if points:
            held_out = split == "eval"
            label = r["name"] + (" (held-out)" if held_out and any(key in t for t in r["train"]) else "")
            out.append(Series(label, points, color(i), dots=held_out, dashed=held_out))
    return out


def curves(runs: list[dict]) -> str:
    """One chart per metric (training line + held-out points), the learning rate, throughput."""
    keys: list[str] = []
    for r in runs:
        for rec in r["train"] + r["evals"]:
            keys += [k for k, v in rec.items() if k not in ("step", "split", "elapsed", *SKIP_CURVES)
                     and isinstance(v, (int, float)) and k not in keys and not is_task_key(k, r)]
    keys = sorted(keys, key=lambda k: (k != "loss", not k.endswith("loss"), k))[:8]
    charts = [line_chart(k, _series(runs, k, "train") + _series(runs, k, "eval"), "step", k) for k in keys]
    lr = _series(runs, "lr", "train")
    if lr:
        charts.append(line_chart("learning rate", lr, "step", "lr"))
    longest = max((rec["elapsed"] for r in runs for rec in r["train"] if "elapsed" in rec), default=0.0)
    unit, scale = next((u, s) for u, s, limit in (("seconds", 1, 120), ("minutes", 1 / 60, 3 * 3600),
                                                  ("hours", 1 / 3600, math.inf)) if longest < limit)
    speed = _series(runs, "tokens_per_s", "train", x="elapsed", scale=scale)
    if speed:
        charts.append(line_chart("throughput", speed, f"training time ({unit})", "tokens/s"))
    return '<div class="charts">' + "".join(charts) + "</div>" if charts else '<p class="muted">no metrics logged</p>'


def seed_results(runs: list[dict]) -> str:
    """Fine-tuning results per seed with their spread, per task and starting point."""
    # a multi-task run's results are per task (its own section, ember.experiments.multitask_report)
    tuned = [r for r in runs if r["kind"] == "finetune" and r["results"] and "metrics" in r["results"]]
    if not tuned:
        return ""
    by: dict[str, list[dict]] = {}
    for r in tuned:
        by.setdefault(f"{r['task']} from {r['data'].get('init', 'random')}", []).append(r)
    html, spread = [], []
    for group, members in by.items():
        metrics = [k for k, v in members[0]["results"]["metrics"].items() if isinstance(v, (int, float))]
        rows = [[_td(f'<a href="#{r["id"]}">{escape(r["name"])}</a>'), _td(escape(str(r["seed"])), True)]
                + [_td(_num(r["results"]["metrics"].get(m)), True) for m in metrics] for r in members]
        values = {m: [r["results"]["metrics"].get(m) for r in members] for m in metrics}
        for stat in ("mean", "std", "min", "max"):
            rows.append([_td(f"<b>{stat}</b>"), _td("")] + [_td(_num(_stat(values[m], stat)), True) for m in metrics])
        html.append(f"<h3>{escape(group)}</h3>" + _table(["run", "seed"] + [escape(m) for m in metrics], rows, "seeds"))
        main = members[0]["main_metric"] if members[0]["main_metric"] in metrics else (metrics or [None])[0]
        if main:
            spread.append((f"{members[0]['task']} {main}", [(str(r["seed"]), r["results"]["metrics"][main])
                                                             for r in members]))
    chart = spread_chart("main metric over seeds (mean and ± 1 std)", spread, "dev score") if spread else ""
    return "<h2>Fine-tuning results per seed</h2>" + "".join(html) + f'<div class="charts">{chart}</div>'


def _stat(values: list, stat: str):
    v = [x for x in values if isinstance(x, (int, float)) and math.isfinite(x)]
    if not v:
        return None
    mean = sum(v) / len(v)
    if stat == "std":
        return math.sqrt(sum((x - mean) ** 2 for x in v) / (len(v) - 1)) if len(v) > 1 else None
    return {"mean": mean, "min": min(v), "max": max(v)}[stat]


def run_section(r: dict) -> str:
    facts = {"folder": r["path"], "kind": r["kind"], "family": r["family"], "shape": r["shape"],
             "objective": r["objective"], "recipe": r["recipe"],
             "overrides": " ".join(r["overrides"]) if r["overrides"] else None, "task": r["task"], "seed": r["seed"],
             "steps": f'{_num(r["steps"])} of {_num(r["max_steps"])}' if r["max_steps"] else _num(r["steps"]),
             "tokens seen": _count(r["tokens"]), "training time": _duration(r["seconds"]), **r["data"]}
    rows = [[f"<th>{escape(k)}</th>", _td(escape(_num(v) if isinstance(v, int) else str(v)))]
            for k, v in facts.items() if v not in (None, "")]
    ckpts = [[_td(escape(c["name"])), _td(_num(c["step"]), True), _td(_count(c["tokens"]), True),
              _td(f'{c["bytes"] / 2**20:.1f} MiB', True),
              _td(datetime.datetime.fromtimestamp(c["modified"]).strftime("%Y-%m-%d %H:%M") if c["modified"] else "—"),
              _td(escape(c["state"]))] for c in r["checkpoints"]]
    evals = "".join(f"<li>step {_num(e['step'])}: {_metrics_text({k: v for k, v in e.items() if k not in ('step', 'split', 'elapsed')})}</li>"
                    for e in r["evals"])
    return (f'<section class="run" id="{r["id"]}"><h3>{escape(r["name"])}</h3>' + _table(None, rows, "facts")
            + (f"<p><b>Held-out evaluations</b></p><ul>{evals}</ul>" if evals else "")
            + ("<p><b>Checkpoints</b></p>" + _table(["folder", "step", "tokens", "size", "written", "state"], ckpts,
                                                   "checkpoints") if ckpts else '<p class="muted">no checkpoints kept</p>')
            + f"<details><summary>config.yaml</summary><pre>{escape(r['config_yaml'])}</pre></details></section>")


def render_report(runs: list[dict], title: str) -> str:
    now = datetime.datetime.now().strftime("%Y-%m-%d %H:%M")
    body = [f"<h1>ember report: {escape(title)}</h1>",
            f'<p class="muted">{len(runs)} run(s), written {now} by <code>ember report</code>.</p>',
            "<h2>Overview</h2>", overview(runs)]
    for group, members in groups_of(runs).items():
        body += [f"<h2>Training: {escape(group)}</h2>", curves(members)]
    body.append(multitask_sections(runs, _num))
    body.append(seed_results(runs))
    body += ["<h2>Runs</h2>"] + [run_section(r) for r in runs]
    return ("<!DOCTYPE html>\n<html lang=\"en\"><head><meta charset=\"utf-8\">"
            f"<title>ember report · {escape(title)}</title><style>{CSS}</style></head><body>"
            + "".join(body) + "</body></html>\n")
