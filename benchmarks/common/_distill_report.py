"""The distillation table's claims, Markdown and chart, computed from ``distill_table.py``'s
result dict alone (so a saved table.json can be re-rendered or re-checked).

The claims are those of the distillation issue, each decided by the numbers in the result:
1. a distilled student keeps >= 97% of the teacher's dev accuracy (DistilBERT's "97% of
   BERT's performance", Sanh et al. 2019);
2. distillation beats pre-training + fine-tuning the same small model without a teacher
   (the rows marked --baseline; Turc et al. 2019 and the PKD/TinyBERT papers compare so);
3. int8 and ONNX keep accuracy within 0.5 points of the fp32 model.
"Beats" is a strictly higher accuracy; next to it stands McNemar's exact test on the paired
dev predictions, since one seed on 872 sentences moves by a point or so (one sentence = 0.11).
"""

from __future__ import annotations

import math
import os
from pathlib import Path

import numpy as np

KEEP = 0.97  # claim 1: share of the teacher's accuracy a distilled student must keep
QUANT_POINTS = 0.5  # claim 3: accuracy points an int8/ONNX path may lose (or gain) against fp32
PATH_NAMES = {"pytorch fp32": "PyTorch fp32", "pytorch int8": "PyTorch int8",
              "onnx fp32": "ONNX fp32", "onnx int8": "ONNX int8"}


def mcnemar_p(only_a: int, only_b: int) -> float:
    """Two-sided exact McNemar p-value: under 'equally accurate' the discordant sentences split
    as Binomial(only_a + only_b, 1/2)."""
    n = only_a + only_b
    if n == 0:
        return 1.0
    tail = sum(math.comb(n, k) for k in range(min(only_a, only_b) + 1)) / 2 ** n
    return min(1.0, 2 * tail)


def _same_shape(a: dict, b: dict) -> bool:
    return a["shape"] == b["shape"] and a["parameters"]["total"] == b["parameters"]["total"]


def claims(result: dict) -> dict:
    rows, gold = result["rows"], np.asarray(result["labels"])
    distilled = [r for r in rows if r["role"] == "student"]
    baselines = [r for r in rows if r["role"] == "baseline"]
    keep = [{"label": r["label"], "role": r["role"], "share": r["share_of_teacher"],
             "keeps": r["share_of_teacher"] is not None and r["share_of_teacher"] >= KEEP}
            for r in distilled + baselines]
    beats = []
    for s in distilled:
        right_s = np.asarray(s["predictions"]) == gold
        for b in baselines:
            right_b = np.asarray(b["predictions"]) == gold
            only_s, only_b = int(np.sum(right_s & ~right_b)), int(np.sum(right_b & ~right_s))
            beats.append({"student": s["label"], "baseline": b["label"], "beats": s["accuracy"] > b["accuracy"],
                          "points": 100 * (s["accuracy"] - b["accuracy"]), "only_student_right": only_s,
                          "only_baseline_right": only_b, "mcnemar_p": mcnemar_p(only_s, only_b),
                          "same_shape": _same_shape(s, b)})
    paths = [{"label": r["label"], "path": name, "points": 100 * (p["accuracy"] - r["accuracy"]),
              "within": abs(p["accuracy"] - r["accuracy"]) * 100 <= QUANT_POINTS + 1e-9}
             for r in rows for name, p in r["paths"].items() if name != "pytorch fp32"]
    return {"keep_threshold": KEEP, "keep": keep, "beats": beats, "quantization_points": QUANT_POINTS,
            "paths": paths}


def _millions(n: int) -> str:
    return f"{n / 1e6:.2f}M"


def _speed(row: dict, name: str) -> str:
    p = row["paths"].get(name)
    if p is None:
        return "—"
    return f"{p['sentences_per_s']:,.0f}/s ({100 * p['accuracy']:.2f})"


def _table(result: dict) -> list[str]:
    names = list(PATH_NAMES)
    head = ["run", "method", "layers × hidden", "parameters", "w/o embeddings", "dev acc.", "results.json",
            "share of teacher", "agrees with teacher"] + [PATH_NAMES[n] for n in names]
    lines = ["| " + " | ".join(head) + " |", "|" + "|".join(["---"] * 2 + ["--:"] * (len(head) - 2)) + "|"]
    for r in result["rows"]:
        share = "—" if r["share_of_teacher"] is None else f"{100 * r['share_of_teacher']:.1f}%"
        label = f"**{r['label']}**" if r["role"] == "teacher" else r["label"] + (
            " (baseline)" if r["role"] == "baseline" else "")
        cells = [label, r["method"], f"{r['shape']['layers']} × {r['shape']['hidden']}",
                 _millions(r["parameters"]["total"]), _millions(r["parameters"]["backbone_without_embeddings"]),
                 f"{100 * r['accuracy']:.2f}", f"{100 * r['results_json_accuracy']:.2f}", share,
                 f"{100 * r['agreement_with_teacher']:.1f}%"] + [_speed(r, n) for n in names]
        lines.append("| " + " | ".join(cells) + " |")
    return lines


def _list(items: list[str]) -> str:
    return ", ".join(items) if items else "none"


def _claim_lines(result: dict) -> list[str]:
    c = result["claims"]
    keep = [k for k in c["keep"] if k["role"] == "student"]
    fmt = [f"{k['label']} ({100 * k['share']:.1f}%)" if k["share"] is not None else k["label"] for k in keep]
    lines = [f"1. **A distilled student keeps ≥ {100 * c['keep_threshold']:.0f}% of the teacher's accuracy.**"]
    if keep:
        lines.append(f"   Holds for: {_list([f for f, k in zip(fmt, keep) if k['keeps']])}. "
                     f"Does not hold for: {_list([f for f, k in zip(fmt, keep) if not k['keeps']])}.")
    else:
        lines.append("   Not checked: every student row is marked --baseline.")
    for k in c["keep"]:
        if k["role"] == "baseline" and k["share"] is not None:
            lines.append(f"   For reference, the baseline {k['label']} keeps {100 * k['share']:.1f}%.")
    lines.append("2. **Distillation beats pre-training + fine-tuning the same small model without a teacher.**")
    if not c["beats"]:
        lines.append("   Not checked: it needs distilled students and at least one row marked --baseline LABEL.")
    for b in c["beats"]:
        verdict = "beats" if b["beats"] else "does not beat"
        shape = "" if b["same_shape"] else " (not the same model: shapes or parameter counts differ)"
        lines.append(f"   - {b['student']} {verdict} {b['baseline']}{shape}: {b['points']:+.2f} points; "
                     f"{b['only_student_right']} vs {b['only_baseline_right']} sentences only one of the two gets "
                     f"right, McNemar exact p = {b['mcnemar_p']:.3g}"
                     f"{'' if b['mcnemar_p'] < 0.05 else ' (not significant at 0.05)'}.")
    outside = [f"{p['label']} {PATH_NAMES.get(p['path'], p['path'])} ({p['points']:+.2f})"
               for p in c["paths"] if not p["within"]]
    lines.append(f"3. **int8 and ONNX keep accuracy within {c['quantization_points']} points of fp32.** "
                 + ("Holds for every run and path." if c["paths"] and not outside else
                    "Not checked: no int8/ONNX path was measured." if not c["paths"] else
                    f"Does not hold for: {_list(outside)}."))
    return lines


def render_markdown(result: dict) -> str:
    lines = [f"# Distillation: {result['task']} {result['split']} ({result['sentences']} sentences)", "",
             f"Machine: {result['machine']}; clock: {result['clock']}; {result['load_before']} before, "
             f"{result['load_after'].removeprefix('load ')} after; {result['date']}.", "",
             *_table(result), "",
             f"Dev accuracy (%) recomputed from each run's weights (equal to its results.json to 1e-6). "
             f"Speed columns: sentences/s over all {result['sentences']} dev sentences in length-sorted batches of "
             f"{result['batch_size']}, median of {result['repeats']} alternating repetitions, then that path's dev "
             "accuracy (%). Parameters without embeddings: the encoder's layers (and pooler), not its token, "
             "position and segment embeddings nor the classifier.", "",
             "Runs: " + "; ".join(f"{r['label']} = `{r['run']}`" for r in result["rows"]) + ".", "",
             "## Claims", "", *_claim_lines(result), ""]
    return "\n".join(lines)


def write_chart(result: dict, path: Path) -> None:
    """Accuracy (left) and sentences/s per inference path (right), one bar group per run."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rows = result["rows"]
    y = np.arange(len(rows))
    fig, (acc_ax, speed_ax) = plt.subplots(1, 2, sharey=True, figsize=(12, 1.8 + 0.7 * len(rows)))
    colours = {"teacher": "tab:gray", "student": "tab:blue", "baseline": "tab:orange"}
    accuracy = [100 * r["accuracy"] for r in rows]
    bars = acc_ax.barh(y, accuracy, color=[colours[r["role"]] for r in rows])
    acc_ax.bar_label(bars, [f"{a:.2f}" for a in accuracy], padding=2, fontsize=8)  # the axis does not start at 0
    teacher = 100 * rows[0]["accuracy"]
    acc_ax.axvline(teacher, color="black", linewidth=0.8, label="teacher")
    acc_ax.axvline(KEEP * teacher, color="black", linestyle="--", linewidth=0.8, label=f"{KEEP:.0%} of teacher")
    acc_ax.set_xlim(max(0.0, min(accuracy + [KEEP * teacher]) - 5), min(100.0, max(accuracy) + 3))
    acc_ax.set_xlabel(f"{result['split']} accuracy (%)")
    acc_ax.legend(fontsize=8, loc="lower right")
    names = [n for n in PATH_NAMES if any(n in r["paths"] for r in rows)]
    height = 0.8 / max(len(names), 1)
    for i, name in enumerate(names):
        speed_ax.barh(y - 0.4 + height * (i + 0.5), [r["paths"].get(name, {}).get("sentences_per_s", 0) for r in rows],
                      height, label=PATH_NAMES[name])
    speed_ax.set_xlabel(f"sentences/s ({result['clock']}, batch {result['batch_size']})")
    speed_ax.legend(fontsize=8, loc="lower right")
    acc_ax.set_yticks(y, [r["label"] for r in rows])
    acc_ax.invert_yaxis()  # the teacher on top, students in the order given
    for ax in (acc_ax, speed_ax):
        ax.grid(axis="x", alpha=0.3)
    fig.suptitle(f"Distillation on {result['task']} {result['split']}: accuracy and CPU speed")
    fig.tight_layout()
    tmp = Path(path).with_name(f".{Path(path).name}.tmp.png")  # no half-written chart on a crash
    fig.savefig(tmp, dpi=110)
    plt.close(fig)
    os.replace(tmp, path)
