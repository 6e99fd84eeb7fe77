"""The multi-task part of `ember report` (``ember.experiments.report_page``): for a run of
``ember finetune --tasks`` (``ember.train.multitask``), every task's dev curve and its row.

A multi-task run logs each task's dev metrics at every evaluation as ``<task>.<metric>`` and each
step's loss under the task it trained (``<task>.loss``; MT-DNN, Liu et al. 2019: one task per
mini-batch). The page shows a table (task, main metric, best dev value and step, the mixing rate
asked for and the share realised; RUN/results.json), one chart per task of its main dev metric
over steps (which task peaks when is what per-task checkpoints keep), and one chart of every
task's training loss. The run's own curves (``report_page.curves``) keep the shared keys: the
loss over all tasks, the average and the learning rate.
"""

from __future__ import annotations

from html import escape

from ember.experiments.svg_chart import Series, color, line_chart


def task_info(run_dir, results: dict | None) -> dict[str, dict]:
    """{task: {"main_metric", "rate", "share", "best_step", "value", "other_splits"}} of a multi-task run, in task
    order; {} for any other run (read from RUN/multitask.json and RUN/results.json)."""
    import json

    from ember.tasks.multitask import MULTITASK_RECORD, is_multitask_run

    if not is_multitask_run(run_dir):
        return {}
    try:
        record = json.loads((run_dir / MULTITASK_RECORD).read_text(encoding="utf-8"))["tasks"]
    except (OSError, ValueError, KeyError, TypeError):
        return {}
    done = (results or {}).get("tasks") or {}
    out = {}
    for task in record:
        name, own = task.get("name"), done.get(task.get("name")) or {}
        if not isinstance(name, str):
            continue
        main = own.get("main_metric") or _main_metric(run_dir, name)
        out[name] = {"main_metric": main, "rate": task.get("rate"), "share": own.get("share"),
                     "best_step": own.get("best_step"), "value": (own.get("metrics") or {}).get(main),
                     # the main metric on each further labelled split (a test set), scored once at the end
                     "other_splits": {split: (m or {}).get(main) for split, m in (own.get("other_splits") or {}).items()}}
    return out


def _main_metric(run_dir, name: str) -> str | None:
    """A task's main metric before the run finished (its folder's config names the task)."""
    from ember.errors import EmberError

    try:
        from ember.runs.folder import load_run_config
        from ember.tasks.task_model import load_run_adapter

        folder = run_dir / "tasks" / name
        return load_run_adapter(folder, load_run_config(folder)).main_metric
    except (EmberError, OSError, ValueError):
        return None


def is_task_key(key: str, run: dict) -> bool:
    """A metric logged for one task of a multi-task run (drawn in the tasks' charts instead)."""
    return any(key.startswith(f"{task}.") for task in run.get("tasks") or {})


def multitask_sections(runs: list[dict], num) -> str:
    """The tasks of each multi-task run: a table and the curves (module docstring); ``num`` formats
    a number as the page does."""
    html = []
    for run in runs:
        tasks = run.get("tasks") or {}
        if not tasks:
            continue
        rows = "".join(
            f"<tr><td>{escape(t)}</td><td>{escape(i['main_metric'] or '—')}</td>"
            f'<td class="num">{num(i["value"])}</td><td class="num">{num(i["best_step"])}</td>'
            f'<td class="num">{num(i["rate"], 3)}</td><td class="num">{num(i["share"], 3)}</td>'
            f'<td>{escape(", ".join(f"{s} {num(v)}" for s, v in i.get("other_splits", {}).items()))}</td></tr>'
            for t, i in tasks.items())
        table = ("<table><tr><th>task</th><th>main metric</th><th>best dev</th><th>best step</th>"
                 f"<th>rate asked</th><th>share realised</th><th>other splits</th></tr>{rows}</table>")
        charts = [_task_chart(run, t, i["main_metric"], k) for k, (t, i) in enumerate(tasks.items())]
        losses = [Series(t, [(r["step"], r[f"{t}.loss"]) for r in run["train"] if f"{t}.loss" in r], color(k))
                  for k, t in enumerate(tasks)]
        losses = [s for s in losses if s.points]
        if losses:
            charts.append(line_chart("training loss per task", losses, "step", "loss"))
        html.append(f"<h2>Tasks: {escape(run['name'])}</h2>{table}"
                    f'<div class="charts">{"".join(c for c in charts if c)}</div>')
    return "".join(html)


def _task_chart(run: dict, task: str, main: str | None, k: int) -> str:
    key = f"{task}.{main}"
    points = [(r["step"], r[key]) for r in run["evals"] if isinstance(r.get(key), (int, float))]
    if not main or not points:
        return f'<p class="muted">{escape(task)}: no dev evaluation logged yet</p>'
    return line_chart(f"{task}: dev {main}", [Series(f"{task} (dev)", points, color(k), dots=True, dashed=True)],
                      "step", main)
