"""The knowledge-effect table and chart, computed from ``knowledge_effect.py``'s records alone (a
saved table.json can be re-rendered).

Per task, split and variant: the mean and sample standard deviation of the main metric over
seeds, and against the baseline the mean *paired* difference (same seed, same data order,
same head initialisation) with its standard deviation and how many seeds it won. K-BERT's
paper reports gains of a point or less on most tasks and none on some (Liu et al. 2020,
Tables 1-2); with three seeds a difference smaller than its spread is no effect.
"""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np

NAMES = {"baseline": "no knowledge", "kbert": "K-BERT (WordNet)", "ernie": "ERNIE fusion (TransE)",
         "ernie-dea": "ERNIE fusion + dEA pre-training", "kbert+ernie": "K-BERT + ERNIE"}


def _stats(values: list[float]) -> dict:
    v = np.asarray(values, dtype=np.float64)
    return {"mean": float(v.mean()), "std": float(v.std(ddof=1)) if len(v) > 1 else None, "n": len(v),
            "values": v.tolist()}


def summarize(records: list[dict]) -> dict:
    """records (one per task, variant, seed) -> {task: {split: {variant: stats (+ vs baseline)}}}."""
    out: dict = {}
    for r in records:
        for split, value in r["scores"].items():
            out.setdefault(r["task"], {}).setdefault(split, {}).setdefault(r["variant"], {})[r["seed"]] = value
    table: dict = {}
    for task, splits in out.items():
        for split, variants in splits.items():
            base = variants.get("baseline", {})
            for variant, by_seed in variants.items():
                row = _stats(list(by_seed.values()))
                common = sorted(set(by_seed) & set(base))
                if variant != "baseline" and common:
                    diffs = [by_seed[s] - base[s] for s in common]
                    row["vs_baseline"] = {**_stats(diffs), "wins": sum(d > 0 for d in diffs)}
                table.setdefault(task, {}).setdefault(split, {})[variant] = row
    return table


def _cell(stats: dict, scale: float) -> str:
    spread = f" ± {stats['std'] * scale:.2f}" if stats["std"] is not None else ""
    return f"{stats['mean'] * scale:.2f}{spread}"


def render_markdown(result: dict) -> str:
    table, meta = result["table"], result["meta"]
    variants = [v for v in meta["variants"] if any(v in s for t in table.values() for s in t.values())]
    lines = [f"# Knowledge in the encoder: {meta['checkpoint']}", "",
             f"{meta['machine']}. Seeds {', '.join(map(str, meta['seeds']))}; train limit "
             f"{meta['train_limit'] or 'none'}, {meta['epochs']} epoch(s), lr {meta['lr']}, max length "
             f"{meta['max_length']}. K-BERT graph: {meta['graph']} (k = {meta['max_triples']}); entities: "
             f"{meta['entities']}. Main metric x 100 (SST-2 accuracy; CoNLL-2003 entity F1), mean ± sample "
             "std over seeds; delta = mean paired difference to the baseline ± its std (seeds won).", ""]
    head = ["task", "split"] + [NAMES.get(v, v) for v in variants]
    lines += ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for task, splits in table.items():
        for split, row in splits.items():
            cells = []
            for v in variants:
                if v not in row:
                    cells.append("")
                    continue
                cell = _cell(row[v], 100)
                d = row[v].get("vs_baseline")
                if d is not None:
                    sign = "+" if d["mean"] >= 0 else ""
                    cell += f" (Δ {sign}{_cell(d, 100)}, {d['wins']}/{d['n']})"
                cells.append(cell)
            lines.append(f"| {task} | {split} | " + " | ".join(cells) + " |")
    if result.get("knowledge"):
        lines += ["", "What the knowledge did to the inputs (training sentences):", ""]
        lines += [f"- {task} {variant}: {line}" for (task, variant), line in
                  ((tuple(k.split("/", 1)), v) for k, v in result["knowledge"].items())]
    lines += ["", "Read honestly: a delta within its spread (or won on fewer than all seeds) is no evidence of "
              "an effect; K-BERT's own gains were about a point on some Chinese tasks and none on others.", ""]
    return "\n".join(lines)


def write_chart(result: dict, path: Path) -> Path | None:
    """Bars of each variant's mean per task/split with the seeds as dots; None without matplotlib."""
    try:
        os.environ.setdefault("MPLBACKEND", "Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return None
    table, variants = result["table"], result["meta"]["variants"]
    groups = [(task, split) for task, splits in table.items() for split in splits]
    fig, ax = plt.subplots(figsize=(1.8 + 1.6 * len(groups), 3.6))
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
        ax.bar(xs, means, width, yerr=stds, capsize=3, label=NAMES.get(variant, variant))
    ax.set_xticks(range(len(groups)), [f"{t}\n{s}" for t, s in groups])
    ax.set_ylabel("accuracy / entity F1 (x100)")
    lows = [min(r["values"]) * 100 for t in table.values() for s in t.values() for r in s.values()]
    ax.set_ylim(max(0.0, min(lows) - 5) if lows else 0, 100)
    ax.legend(fontsize=7, loc="best")
    ax.set_title(f"Knowledge in {result['meta']['checkpoint']} ({len(result['meta']['seeds'])} seeds)", fontsize=9)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return path
