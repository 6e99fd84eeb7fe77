"""The cramming search's outputs (cram_search.py), from its trial records alone: OUT/table.md and
table.json (every trial, ranked by bits per character within its stage and budget), OUT/curves.png
(held-out MLM loss against CPU-minutes of the full-budget runs), OUT/bert-cram-cpu.yaml (the
winner as an ember recipe) and, after fine-tuning, the winner against a random start of its shape
per task (mean ± std over seeds and the paired difference, via _seed_table).
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import yaml

import _seed_table
from ember.config import apply_overrides, load_yaml
from ember.durations import format_duration
from ember.fileio import atomic_write_text
from ember.recipes import recipe_path
from ember.train.logging import MetricsLogger

KNOB_COLUMNS = [("shape", "shape"), ("vocab", "vocab"), ("seq", "length"), ("batch", "batch"), ("lr", "peak lr"),
                ("warmup", "warm-up"), ("pre_ln", "LN"), ("dropout", "dropout")]
NAMES = {"pretrained": "winner, pre-trained", "random": "random init, same shape"}


def ranked(records: list[dict]) -> list[dict]:
    """One row per trial: its knobs and numbers, and its rank by bits/char among the trials of
    its stage and budget (diverged trials unranked); screening first, then the budgets."""
    rows = []
    for r in records:
        row = {k: r.get(k) for k in ("name", "stage", "budget", "status", "steps", "tokens", "cpu_s", "mlm_loss",
                                     "mlm_acc", "heldout_ce", "heldout_acc", "bits_per_char", "heldout_masked")}
        rows.append({**row, "config": r["config"], "rank": None})
    groups: dict = {}
    for row in rows:
        groups.setdefault((row["stage"] != "screen", row["budget"]), []).append(row)
    ordered = []
    for key in sorted(groups):
        group = sorted(groups[key], key=lambda row: (row["status"] != "done", row["bits_per_char"] or 0.0))
        for i, row in enumerate(group):
            row["rank"] = i + 1 if row["status"] == "done" else None
        ordered += group
    return ordered


def describe(record: dict) -> str:
    """A progress line for a finished job."""
    if record["kind"] == "finetune":
        return f"{record['variant']} {record['task']}: {record['metric']} {record['scores']}"
    if record["status"] != "done":
        return f"{record['name']}: {record['status']} ({record.get('error', '')})"
    return (f"{record['name']}: bits/char {record['bits_per_char']:.4f}, MLM loss {record['mlm_loss']:.3f}, "
            f"{record['steps']} steps in {record['cpu_s']:.0f} CPU-s")


def _number(value, fmt: str) -> str:
    return "—" if value is None else format(value, fmt)


def table_lines(rows: list[dict]) -> list[str]:
    head = (["rank", "stage", "budget"] + [title for _, title in KNOB_COLUMNS]
            + ["steps", "tokens", "MLM loss", "MLM acc", "protocol CE", "bits/char"])
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * 3 + "---|" * len(KNOB_COLUMNS) + "---:|" * 6]
    for row in rows:
        knobs = [row["config"].get(k) for k, _ in KNOB_COLUMNS]
        knobs[6] = "pre" if knobs[6] else "post"
        numbers = ([_number(row["steps"], ","), _number(row["tokens"], ","), _number(row["mlm_loss"], ".3f"),
                    _number(row["mlm_acc"], ".3f"), _number(row["heldout_ce"], ".3f"),
                    _number(row["bits_per_char"], ".4f")] if row["status"] == "done"
                   else ["—"] * 5 + [row["status"]])
        lines.append("| " + " | ".join([str(row["rank"] or "—"), row["stage"], format_duration(row["budget"])]
                                        + [f"{k:g}" if isinstance(k, float) else str(k) for k in knobs]
                                        + numbers) + " |")
    return lines


def write_screening(out: Path, screened: list[dict], budget: float) -> str:
    """OUT/screening.md: the screening trials alone, ranked (the search's first stage)."""
    text = "\n".join([f"# CPU cramming search: screening at {format_duration(budget)} per trial", "",
                      "Ranked by bits/char of the masked held-out text (lower is better); the coordinate "
                      "search's order is the trials' order in OUT/trials.", ""]
                     + table_lines(ranked(screened))) + "\n"
    atomic_write_text(out / "screening.md", text)
    return text


def render(result: dict) -> str:
    meta, winner = result["meta"], result["winner"]
    protocol = (f"{meta['eval_examples'] or 'all'} held-out sequences of {meta['eval_length']} tokens with fixed "
                "masks; cross-entropy of the masked tokens in bits per character of their text")
    lines = [f"# CPU cramming search ({'smoke' if meta['smoke'] else meta['date']})", "",
             f"{meta['machine']}. Recipe {meta['recipe']} with {', '.join(meta['base'])}; one thread per trial, "
             "budgets in CPU seconds of training steps (train.clock=cpu), train.schedule=time.",
             f"Coordinate search over {', '.join(meta['order'])} from the baseline "
             f"{json.dumps(meta['baseline'])} at {format_duration(meta['screen_budget'])} per trial, then the top "
             f"configurations at {', '.join(map(format_duration, meta['budgets']))}.",
             f"Ranked by bits/char (protocol: {protocol}; comparable across vocabularies and lengths). "
             "MLM loss/acc: ember's held-out evaluation at the trial's own length (data.eval_examples).", "",
             f"**Winner** at {format_duration(winner['budget'])}: `{winner['name']}`, bits/char "
             f"{winner['bits_per_char']:.4f}, held-out MLM loss {winner['mlm_loss']:.3f}, {winner['steps']:,} steps, "
             f"{winner['tokens']:,} tokens; recipe: bert-cram-cpu.yaml.", ""] + table_lines(result["trials"])
    if "finetune" in result:
        lines += ["", f"## Fine-tuning the winner against a random init of its shape (dev, ×100; peak lr "
                      f"{meta['finetune_lr']:g}, dropout {meta['finetune_dropout']:g}; "
                      f"seeds {', '.join(map(str, result['finetune']['seeds']))})", ""]
        lines += _seed_table.table_lines(result["finetune"]["table"], list(NAMES), NAMES)
    return "\n".join(lines) + "\n"


def config_label(record: dict) -> str:
    return record["name"].removeprefix("screen-").split("-", 1)[1]


def plot_curves(records: list[dict], winner: dict, path: Path) -> None:
    """Held-out MLM loss over CPU-minutes: a colour per configuration, a line style per budget."""
    os.environ.setdefault("MPLBACKEND", "Agg")
    import matplotlib.pyplot as plt

    runs = sorted((r for r in records if r["stage"] == "budget" and r["status"] == "done"), key=lambda r: -r["budget"])
    longest = runs[0]["budget"] if runs else 0
    colours = {}
    fig, ax = plt.subplots(figsize=(8, 4.5))
    for r in runs:
        evals = [e for e in MetricsLogger.read(Path(r["dir"]) / "run" / "metrics.jsonl") if e["split"] == "eval"]
        key = config_label(r)
        colour = colours.setdefault(key, f"C{len(colours)}")
        ax.plot([e["elapsed"] / 60 for e in evals], [e["mlm_loss"] for e in evals], "o-" if r["budget"] == longest
                else "s--", ms=3, color=colour, lw=2.2 if key == config_label(winner) else 1.2,
                label=f"{key} ({format_duration(r['budget'])}, {r['bits_per_char']:.3f} bits/char)")
    ax.set_xlabel("CPU-minutes of training (one thread)")
    ax.set_ylabel("held-out MLM loss (own length and vocabulary)")
    ax.set_title("the top configurations at each budget; thick: the winner", fontsize=9)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=6)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def write_recipe(path: Path, winner: dict, meta: dict) -> None:
    """The winner's settings as a recipe: the base recipe with the winning overrides applied."""
    sets = [o for o in winner["overrides"] if not o.startswith(("train.eval_every=", "train.save_every="))]
    values = apply_overrides(load_yaml(recipe_path(meta["recipe"])), sets)
    vocab = winner["config"]["vocab"]
    header = [f"bert-cram-cpu: found by benchmarks/studies/cram_search.py (issue 18, item 5) on {meta['date']},",
              f"{meta['machine']}.",
              f"The lowest held-out bits/char of the search at {format_duration(winner['budget'])} of CPU time on one "
              f"thread: {winner['bits_per_char']:.4f} bits/char, held-out MLM loss {winner['mlm_loss']:.3f} "
              f"(accuracy {winner['mlm_acc']:.3f}) after {winner['steps']:,} steps.",
              f"Trial {winner['name']}; the search table is table.md beside this file.",
              f"Its data: {winner['data']}, a {vocab}-piece vocabulary of {meta['corpus'] or 'a corpus given'};",
              "to make such data from a corpus:",
              f"  ember tokenizer train CORPUS --kind wordpiece --vocab-size {vocab} "
              "--out runs/cram-tok/tokenizer.json",
              "  ember prepare CORPUS --tokenizer runs/cram-tok/tokenizer.json --out runs/cram-data",
              f"  ember pretrain --recipe {path.name} --data runs/cram-data --out runs/bert-cram-cpu",
              "The budget counts CPU seconds (train.clock=cpu, one thread) and the learning rate decays to 0 at it",
              "(train.schedule=time); --max-time changes it, --set train.clock=wall counts wall time instead."]
    text = "".join(f"# {line}\n" for line in header) + yaml.safe_dump(values, sort_keys=False)
    atomic_write_text(path, text)


def finetune_result(records: list[dict], seeds: list[int]) -> dict:
    rows = [{"task": r["task"], "variant": r["variant"], "seed": int(s), "scores": {"dev": v}}
            for r in records for s, v in r["scores"].items()]
    return {"seeds": seeds, "metrics": {r["task"]: r["metric"] for r in records}, "records": rows,
            "table": _seed_table.summarize(rows, reference="random")}


def write(out: Path, records: list[dict], winner: dict, meta: dict, finetune: list[dict] | None = None) -> dict:
    """table.json, table.md, curves.png and bert-cram-cpu.yaml (and finetune.png); the result."""
    result = {"meta": meta, "winner": {k: v for k, v in winner.items() if k != "overrides"},
              "trials": ranked(records)}
    if finetune:
        result["finetune"] = finetune_result(finetune, sorted({int(s) for r in finetune for s in r["scores"]}))
        _seed_table.bar_chart(result["finetune"]["table"], list(NAMES), NAMES, out / "finetune.png",
                              "winner vs random init", "dev score (x100)")
    text = render(result)
    atomic_write_text(out / "table.json", json.dumps(result, indent=2))
    atomic_write_text(out / "table.md", text)
    plot_curves(records, winner, out / "curves.png")
    write_recipe(out / "bert-cram-cpu.yaml", winner, meta)
    return {**result, "text": text}
