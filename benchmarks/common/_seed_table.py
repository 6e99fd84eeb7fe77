"""Seeds -> a table and a chart, for the studies that compare variants of one recipe over seeds
(knowledge_effect.py, features_vs_finetune.py). Records are dicts with ``task``, ``variant``,
``seed`` and ``scores`` ({split: main metric}); everything here is computed from them alone, so a
saved JSON can be re-rendered.

Per task, split and variant: the mean and sample standard deviation over seeds, and against the
reference variant the mean *paired* difference (same seed: same data order and head
initialisation) with its standard deviation and how many seeds it won. With three seeds a
difference smaller than its spread is no evidence of an effect.
"""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np


def stats(values: list[float]) -> dict:
    v = np.asarray(values, dtype=np.float64)
    return {"mean": float(v.mean()), "std": float(v.std(ddof=1)) if len(v) > 1 else None, "n": len(v),
            "values": v.tolist()}


def summarize(records: list[dict], reference: str) -> dict:
    """records -> {task: {split: {variant: stats (+ "vs_reference": paired difference stats)}}}."""
    out: dict = {}
    for r in records:
        for split, value in r["scores"].items():
            out.setdefault(r["task"], {}).setdefault(split, {}).setdefault(r["variant"], {})[r["seed"]] = value
    table: dict = {}
    for task, splits in out.items():
        for split, variants in splits.items():
            base = variants.get(reference, {})
            for variant, by_seed in variants.items():
                row = stats(list(by_seed.values()))
                common = sorted(set(by_seed) & set(base))
                if variant != reference and common:
                    diffs = [by_seed[s] - base[s] for s in common]
                    row["vs_reference"] = {**stats(diffs), "wins": sum(d > 0 for d in diffs)}
                table.setdefault(task, {}).setdefault(split, {})[variant] = row
    return table


def cell(s: dict, scale: float = 100) -> str:
    spread = f" ± {s['std'] * scale:.2f}" if s["std"] is not None else ""
    return f"{s['mean'] * scale:.2f}{spread}"


def table_lines(table: dict, variants: list[str], names: dict) -> list[str]:
    """A markdown table: one row per task and split, one column per variant (x100, with deltas)."""
    shown = [v for v in variants if any(v in s for t in table.values() for s in t.values())]
    head = ["task", "split"] + [names.get(v, v) for v in shown]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for task, splits in table.items():
        for split, row in splits.items():
            cells = []
            for v in shown:
                if v not in row:
                    cells.append("")
                    continue
                text = cell(row[v])
                d = row[v].get("vs_reference")
                if d is not None:
                    text += f" (Δ {'+' if d['mean'] >= 0 else ''}{cell(d)}, {d['wins']}/{d['n']})"
                cells.append(text)
            lines.append(f"| {task} | {split} | " + " | ".join(cells) + " |")
    return lines


def bar_chart(table: dict, variants: list[str], names: dict, path: Path, title: str, ylabel: str) -> Path | None:
    """Bars of each variant's mean per task/split with the seeds as dots; None without matplotlib."""
    try:
        os.environ.setdefault("MPLBACKEND", "Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return None
    groups = [(task, split) for task, splits in table.items() for split in splits]
    fig, ax = plt.subplots(figsize=(1.8 + 1.6 * len(groups) * max(1, len(variants) / 4), 3.6))
    width = 0.8 / max(len(variants), 1)
    for k, variant in enumerate(variants):
        xs, means, stds = [], [], []
        for g, (task, split) in enumerate(groups):
            row = table[task][split].get(variant)
            if row is None:
                continue
            x = g + (k - (len(variants) - 1) / 2) * width
            xs.append(x)
            means.append(row["mean"] * 100)
            stds.append((row["std"] or 0) * 100)
            ax.scatter([x] * row["n"], np.asarray(row["values"]) * 100, s=8, color="black", zorder=3)
        ax.bar(xs, means, width, yerr=stds, capsize=3, label=names.get(variant, variant))
    ax.set_xticks(range(len(groups)), [f"{t}\n{s}" for t, s in groups])
    ax.set_ylabel(ylabel)
    lows = [min(r["values"]) * 100 for t in table.values() for s in t.values() for r in s.values()]
    ax.set_ylim(max(0.0, min(lows) - 5) if lows else 0, 100)
    ax.legend(fontsize=7, loc="best")
    ax.set_title(title, fontsize=9)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return path
