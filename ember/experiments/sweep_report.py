"""A sweep's results: the table of trials, the best trial, Optuna's plots and one HTML page.

Written after every start of the sweep (so a resumed or shared study's folder always shows all its
trials, whoever ran them):

* SWEEP/results.json and SWEEP/results.tsv: one row per trial (state, objective, settings, dev
  metrics, seconds, run folder); results.json also names the best trial;
* SWEEP/best: a link to the best trial's run folder (`ember evaluate SWEEP/best`, `ember export`);
* SWEEP/plots/*.png: Optuna's optimisation history, parameter importances (fANOVA) and parallel
  coordinates, drawn with matplotlib (``optuna.visualization.matplotlib``; plotly is not needed);
* SWEEP/report.html: the table, the best trial and the plots in one self-contained page.
"""

from __future__ import annotations

import base64
import json
import os
import warnings
from html import escape
from pathlib import Path

from ember.experiments.report_page import CSS, _num
from ember.fileio import atomic_write_text

PLOTS = {"history": "plot_optimization_history", "importance": "plot_param_importances",
         "parallel": "plot_parallel_coordinate"}


def trial_rows(study, optuna) -> list[dict]:
    rows = []
    for t in study.get_trials(deepcopy=False):
        if t.state == optuna.trial.TrialState.WAITING:
            continue
        state = t.state.name.lower()
        if state == "fail" and t.user_attrs.get("interrupted"):  # stopped by a signal or a kill: run again
            state = "interrupted"
        rows.append({"trial": t.number, "state": state, "value": t.value,
                     "params": dict(t.params), "metrics": t.user_attrs.get("metrics", {}),
                     "other_splits": t.user_attrs.get("other_splits", {}),
                     "dev_curve": [t.intermediate_values[k] for k in sorted(t.intermediate_values)],
                     "seconds": t.user_attrs.get("seconds"), "run_dir": t.user_attrs.get("run_dir"),
                     "retry_of": t.system_attrs.get("failed_trial"), "error": t.user_attrs.get("error")})
    return rows


def write_results(out: Path, study, record: dict, optuna) -> dict:
    rows = trial_rows(study, optuna)
    complete = [r for r in rows if r["state"] == "complete"]
    best = None
    if complete:
        pick = max if record["direction"] == "maximize" else min
        best = pick(complete, key=lambda r: r["value"])
    metric = next((study.trials[r["trial"]].user_attrs.get("metric") for r in complete), record["metric"])
    summary = {"command": record["command"], "metric": metric, "direction": record["direction"],
               "sampler": record["sampler"], "space": record["space"], "finished": len(complete),
               "pruned": sum(r["state"] == "pruned" for r in rows), "failed": sum(r["state"] == "fail" for r in rows),
               "interrupted": sum(r["state"] == "interrupted" for r in rows),
               "best": best, "trials": rows}
    atomic_write_text(out / "results.json", json.dumps(summary, indent=2))
    keys = list(record["space"])
    lines = ["\t".join(["trial", "state", metric or "value", *keys, "seconds", "run_dir"])]
    for r in rows:
        lines.append("\t".join(map(str, [r["trial"], r["state"], _num(r["value"]),
                                          *[r["params"].get(k, "") for k in keys], r["seconds"] or "",
                                          r["run_dir"] or ""])))
    atomic_write_text(out / "results.tsv", "\n".join(lines) + "\n")
    if best is not None and best["run_dir"]:
        _link(out / "best", best["run_dir"])
    plots = draw_plots(out, study, optuna) if complete else {}
    atomic_write_text(out / "report.html", render(summary, plots, out))
    print_table(summary, keys)
    return summary


def _link(link: Path, target: str) -> None:
    """SWEEP/best -> trials/trial-N (relative, so the folder can move); replaced atomically."""
    tmp = link.with_name(f".best-{os.getpid()}")
    if tmp.is_symlink() or tmp.exists():
        tmp.unlink()
    os.symlink(target, tmp)
    os.replace(tmp, link)


def print_table(summary: dict, keys: list[str]) -> None:
    metric = summary["metric"] or "value"
    print(f"{'trial':>5}  {'state':<11} {metric:>10}  " + "  ".join(keys))
    for r in summary["trials"]:
        params = "  ".join(str(r["params"].get(k, "-")) for k in keys)
        retry = f"  (retries trial {r['retry_of']})" if r["retry_of"] is not None else ""
        print(f"{r['trial']:>5}  {r['state']:<11} {_num(r['value']):>10}  {params}{retry}")
    best = summary["best"]
    if best:
        print(f"best: trial {best['trial']}, dev {metric} {best['value']:.4f} ({summary['direction']}); run folder "
              f"{best['run_dir']}; {summary['finished']} finished, {summary['pruned']} pruned, "
              f"{summary['failed']} failed")
        for split, metrics in best["other_splits"].items():  # e.g. MRPC test: reported, never chosen on
            shown = ", ".join(f"{k} {_num(v)}" for k, v in metrics.items())
            print(f"best trial on {split}, with its best-on-dev weights (not used to choose): {shown}")


def draw_plots(out: Path, study, optuna) -> dict[str, Path]:
    """The plots Optuna can draw for this study (importance needs two finished trials and a varied
    setting; a plot it refuses is left out, with its reason in the page)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from optuna.visualization import matplotlib as ovm

    folder = out / "plots"
    folder.mkdir(exist_ok=True)
    drawn = {}
    for name, function in PLOTS.items():
        try:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                # fANOVA with 16 trees, not Optuna's 64: a quarter of the time (seconds on a busy
                # CPU) for a plot read by eye; seeded, so the page is the same each time
                extra = ({"evaluator": optuna.importance.FanovaImportanceEvaluator(n_trees=16, seed=0)}
                         if name == "importance" else {})
                axes = getattr(ovm, function)(study, **extra)
            figure = (axes.flat[0] if hasattr(axes, "flat") else axes).get_figure()
            figure.set_size_inches(7, 4.2)
            figure.tight_layout()
            figure.savefig(folder / f"{name}.png", dpi=90)
            plt.close(figure)
            drawn[name] = folder / f"{name}.png"
        except Exception as exc:  # e.g. importance of one trial: Optuna's own message says why
            drawn[name] = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
    return drawn


def render(summary: dict, plots: dict, out: Path) -> str:
    keys = list(summary["space"])
    metric = escape(summary["metric"] or "value")
    head = "".join(f"<th>{escape(h)}</th>" for h in ["trial", "state", f"dev {metric}", *keys, "dev curve",
                                                      "minutes", "run folder"])
    body = []
    best = summary["best"]["trial"] if summary["best"] else None
    for r in summary["trials"]:
        style = ' style="background:#eaf6ea"' if r["trial"] == best else ""
        curve = " ".join(_num(v, 3) for v in r["dev_curve"])
        minutes = "—" if r["seconds"] is None else f"{r['seconds'] / 60:.1f}"
        cells = [r["trial"], r["state"], _num(r["value"]), *[r["params"].get(k, "—") for k in keys], curve,
                 minutes, r["run_dir"] or "—"]
        body.append(f"<tr{style}>" + "".join(f"<td>{escape(str(c))}</td>" for c in cells) + "</tr>")
    parts = [f"<h1>ember sweep: {escape(out.resolve().name)}</h1>",
             f"<p class='muted'>ember sweep of <code>{escape(summary['command'])}</code>, {escape(summary['sampler'])} "
             f"sampler; objective: dev {metric} ({escape(summary['direction'])}), the run's own best epoch. "
             f"{summary['finished']} finished, {summary['pruned']} pruned, {summary['failed']} failed.</p>",
             "<h2>Search space</h2><table>" + "".join(f"<tr><th>{escape(k)}</th><td>{escape(str(v))}</td></tr>"
                                                      for k, v in summary["space"].items()) + "</table>"]
    if summary["best"]:
        b = summary["best"]
        metrics = ", ".join(f"{escape(k)} {_num(v)}" for k, v in b["metrics"].items())
        others = "; ".join(f"{escape(s)}: " + ", ".join(f"{escape(k)} {_num(v)}" for k, v in m.items())
                           for s, m in b["other_splits"].items())
        parts.append(f"<h2>Best trial</h2><p>trial {b['trial']} ({escape(str(b['run_dir']))}, linked as "
                     f"<code>best</code>): dev {metrics}"
                     + (f"; with its best-on-dev weights, {others}" if others else "")
                     + "</p>")
    parts.append(f"<h2>Trials</h2><table><tr>{head}</tr>{''.join(body)}</table>")
    if plots:
        parts.append("<h2>Plots</h2>")
    for name, path in plots.items():
        if isinstance(path, Path):
            data = base64.b64encode(path.read_bytes()).decode()
            parts.append(f'<h3>{name}</h3><img alt="{name}" src="data:image/png;base64,{data}">')
        else:
            parts.append(f"<h3>{name}</h3><p class='muted'>not drawn: {escape(path)}</p>")
    return ("<!DOCTYPE html>\n<html lang=\"en\"><head><meta charset=\"utf-8\">"
            f"<title>ember sweep · {escape(out.resolve().name)}</title><style>{CSS}</style></head><body>"
            + "".join(parts) + "</body></html>\n")


