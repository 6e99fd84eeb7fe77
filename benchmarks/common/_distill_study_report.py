"""The distillation study's Markdown and chart, from ``distill_study.py``'s result dict alone.

The claims checked (the real-checkpoint issue, item 5): a distilled student beats its directly
trained twin (every seed's paired difference and McNemar's exact test on the dev predictions),
and keeps >= 97% of the teacher's dev accuracy (DistilBERT's figure) while running >= 2x as
fast as the teacher on the same inference path.
"""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np

from _distill_report import KEEP, PATH_NAMES

SPEEDUP = 2.0  # the claim's speed bar: sentences/s over the teacher's, on the same path


def _stats(result: dict, variant: str) -> dict | None:
    return result["table"].get("sst2", {}).get("dev", {}).get(variant)


def speedups(result: dict, variant: str) -> dict[str, float]:
    """Path -> this variant's sentences/s over the teacher's on that path."""
    mine, teacher = result["speed"].get(variant), result["speed"].get("teacher")
    if not mine or not teacher:
        return {}
    return {name: p["sentences_per_s"] / teacher["paths"][name]["sentences_per_s"]
            for name, p in mine["paths"].items() if name in teacher["paths"]}


def _speed_cell(result: dict, label: str, name: str) -> str:
    p = result["speed"].get(label, {}).get("paths", {}).get(name)
    if p is None:
        return "—"
    ratio = "" if label == "teacher" else f" ({speedups(result, label)[name]:.1f}x)"
    return f"{p['sentences_per_s']:,.0f}{ratio}"


def _twin_cell(result: dict, variant: str) -> str:
    pairs = result["twins"].get(variant)
    if not pairs:
        return "—"
    points = np.asarray([p["points"] for p in pairs])
    spread = f" ± {points.std(ddof=1):.2f}" if len(points) > 1 else ""
    wins = sum(p["points"] > 0 for p in pairs)
    ps = ", ".join(f"{p['mcnemar_p']:.2g}" for p in sorted(pairs, key=lambda p: p["seed"]))
    return f"{points.mean():+.2f}{spread} ({wins}/{len(pairs)} seeds; McNemar p {ps})"


def table_lines(result: dict) -> list[str]:
    meta, names = result["meta"], result["meta"]["names"]
    paths = list(PATH_NAMES)
    head = ["student", "layers × hidden", "parameters (w/o emb.)", "dev accuracy", "share of teacher",
            "vs. its gold-label twin (points)"] + [f"{PATH_NAMES[n]} sent/s" for n in paths]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    t = result["speed"]["teacher"]
    lines.append(f"| **teacher** ({Path(meta['teacher']).name}) | {t['shape']['layers']} × {t['shape']['hidden']} | "
                 f"{t['parameters']['total'] / 1e6:.1f}M ({t['parameters']['backbone_without_embeddings'] / 1e6:.1f}M) | "
                 f"{100 * meta['teacher_accuracy']:.2f} | 100% | — | "
                 + " | ".join(_speed_cell(result, "teacher", n) for n in paths) + " |")
    for variant in meta["variants"]:
        s = _stats(result, variant)
        if s is None:
            continue
        speed = result["speed"].get(variant, {})
        shape = speed.get("shape", {})
        params = speed.get("parameters", {})
        spread = f" ± {100 * s['std']:.2f}" if s["std"] is not None else ""
        lines.append(f"| {names[variant]} | {shape.get('layers', '?')} × {shape.get('hidden', '?')} | "
                     f"{params.get('total', 0) / 1e6:.1f}M ({params.get('backbone_without_embeddings', 0) / 1e6:.1f}M) | "
                     f"{100 * s['mean']:.2f}{spread} | {100 * s['mean'] / meta['teacher_accuracy']:.1f}% | "
                     f"{_twin_cell(result, variant)} | " + " | ".join(_speed_cell(result, variant, n) for n in paths) + " |")
    return lines


def claim_lines(result: dict) -> list[str]:
    meta, names = result["meta"], result["meta"]["names"]
    lines = ["1. **Distilled students beat their directly trained twins.**"]
    for variant, pairs in result["twins"].items():
        points = [p["points"] for p in pairs]
        significant = sum(p["mcnemar_p"] < 0.05 and p["points"] > 0 for p in pairs)
        verdict = ("holds" if all(x > 0 for x in points) and significant == len(pairs) else
                   "holds on every seed, not significant on all" if all(x > 0 for x in points) else "does not hold")
        lines.append(f"   - {names[variant]} vs {names[meta['twins'][variant]]}: mean {np.mean(points):+.2f} points, "
                     f"better on {sum(x > 0 for x in points)}/{len(points)} seeds, McNemar p < 0.05 on "
                     f"{significant}: {verdict}.")
    lines.append(f"2. **A distilled student keeps ≥ {KEEP:.0%} of the teacher at ≥ {SPEEDUP:.0f}x its speed** "
                 "(the mean over seeds; speed on the same path as the teacher's).")
    for variant in meta["variants"]:
        s = _stats(result, variant)
        if s is None or meta["twins"].get(variant) is None:
            continue
        share = s["mean"] / meta["teacher_accuracy"]
        fast = speedups(result, variant)
        fp32 = fast.get("pytorch fp32", 0.0)
        verdict = "holds" if share >= KEEP and fp32 >= SPEEDUP else "does not hold"
        lines.append(f"   - {names[variant]}: {100 * share:.1f}% of the teacher, {fp32:.1f}x in PyTorch fp32 "
                     f"({', '.join(f'{v:.1f}x {PATH_NAMES[k]}' for k, v in fast.items() if k != 'pytorch fp32')}): "
                     f"{verdict}.")
    return lines


def render(result: dict) -> str:
    meta = result["meta"]
    lines = [f"# Distillation study on SST-2 ({len(meta['seeds'])} seeds)", "",
             f"{meta['machine']}; {meta['date']}; load after: {meta['load_after']}. Teacher: `{meta['teacher']}` "
             f"(dev accuracy {100 * meta['teacher_accuracy']:.2f}). Transfer set: the first {meta['train_limit']:,} "
             f"SST-2 training sentences, {meta['epochs']} epoch(s) (TinyBERT: that many per stage); random-init "
             f"students lr {meta['lr_random']}, teacher-initialised ones lr {meta['lr']}. Dev accuracy x 100 over "
             f"seeds {', '.join(map(str, meta['seeds']))} (mean ± sample std; each recomputed from the run's weights). "
             "Speeds: the first seed's run, sentences/s over all 872 dev sentences in length-sorted batches of 32, "
             "median of alternating repetitions in one process (speed/table.md has each path's accuracy); in "
             "brackets the ratio to the teacher on the same path.", ""]
    lines += table_lines(result) + ["", "## Claims", ""] + claim_lines(result)
    if meta["smoke"]:
        lines += ["", "(smoke run: a random tiny teacher; these are not measurements)"]
    return "\n".join(lines) + "\n"


def write_chart(result: dict, path: Path) -> Path | None:
    """Dev accuracy (mean, seeds as dots) against PyTorch fp32 sentences/s, teacher and 97% line."""
    try:
        os.environ.setdefault("MPLBACKEND", "Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return None
    meta = result["meta"]
    teacher = 100 * meta["teacher_accuracy"]
    fig, ax = plt.subplots(figsize=(7.5, 4.5))
    t_speed = result["speed"]["teacher"]["paths"]["pytorch fp32"]["sentences_per_s"]
    ax.scatter([t_speed], [teacher], marker="*", s=160, color="black", label="teacher", zorder=3)
    for variant in meta["variants"]:
        s, speed = _stats(result, variant), result["speed"].get(variant)
        if s is None or not speed:
            continue
        x = speed["paths"]["pytorch fp32"]["sentences_per_s"]
        direct = meta["twins"].get(variant) is None
        ax.errorbar([x], [100 * s["mean"]], yerr=[100 * (s["std"] or 0)], fmt="s" if direct else "o", capsize=3,
                    label=meta["names"][variant], mfc="white" if direct else None)
        ax.scatter([x] * s["n"], np.asarray(s["values"]) * 100, s=6, color="black", zorder=3)
    ax.axhline(KEEP * teacher, color="black", linestyle="--", linewidth=0.8, label=f"{KEEP:.0%} of the teacher")
    ax.axvline(SPEEDUP * t_speed, color="gray", linestyle=":", linewidth=0.8, label=f"{SPEEDUP:.0f}x the teacher's speed")
    ax.set_xscale("log")
    ax.set_xlabel("CPU sentences/s, PyTorch fp32 (log)")
    ax.set_ylabel("SST-2 dev accuracy (%)")
    ax.set_title(f"Students of a fine-tuned MiniLM on SST-2 ({len(meta['seeds'])} seeds; open = gold labels only)",
                 fontsize=9)
    ax.legend(fontsize=7, loc="lower left")
    ax.grid(alpha=0.3)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return path
