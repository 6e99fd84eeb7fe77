"""results.md, results.json and senses.png of benchmarks/studies/word_senses.py."""

from __future__ import annotations

import json
from pathlib import Path

from ember.fileio import atomic_write_text

METRICS = (("nn_accuracy", "1-NN sense accuracy (LOO, cosine)", True), ("kmeans_purity", "k-means k=2 purity", True),
           ("silhouette", "silhouette of the gold senses (cosine)", False))


def describe(name: str, num_layers: int) -> str:
    if name == "static":
        return "static input embedding of the word (baseline)"
    if name == "bag of words":
        return "bag of words: mean static embedding of the context (baseline)"
    if name == "bag of words, cues removed":
        return "bag of words without the rule's cue words (baseline)"
    k = int(name.split()[1])
    if k == 0:
        return "layer 0: embedding layer output (word + position, LayerNorm)"
    return f"layer {k}" + (" (last)" if k == num_layers else "")


def cell(stat: dict, percent: bool) -> str:
    if percent:
        return f"{100 * stat['mean']:.1f} ± {100 * stat['std']:.1f}"
    return f"{stat['mean']:.3f} ± {stat['std']:.3f}"


def table(result: dict) -> str:
    head = "| vector | " + " | ".join(label for _, label, _ in METRICS) + " |"
    lines = [head, "|" + "---|" * (len(METRICS) + 1)]
    for name, stats in result["summary"].items():
        label = describe(name, result["num_layers"])
        if name == result["best_layer"]:
            label = f"**{label}**"
        lines.append(f"| {label} | " + " | ".join(cell(stats[m], pct) for m, _, pct in METRICS) + " |")
    return "\n".join(lines)


def reading(result: dict) -> list[str]:
    """Plain sentences that follow the numbers (the script writes them; a reader checks them)."""
    s = result["summary"]
    acc = {name: s[name]["nn_accuracy"] for name in s}
    best, last = result["best_layer"], f"layer {result['num_layers']}"
    b, bow, static, l0 = acc[best], acc["bag of words"], acc["static"], acc["layer 0"]
    lines = [
        (f"- The static embedding of the word is one vector for every occurrence, so its 1-NN accuracy is chance "
        f"by construction ({100 * static['mean']:.1f}% = (m - 1) / (2m - 1): leaving one out leaves its own sense "
        "one short), and k-means cannot split it."),
        (f"- The embedding layer's output (layer 0) adds only the word's position: "
        f"{100 * l0['mean']:.1f}% (position tells the senses apart only as far as they sit at different places "
        "in a sentence)."),
        (f"- The best layer is {best}: {100 * b['mean']:.1f} ± {100 * b['std']:.1f}% 1-NN accuracy, "
        f"{100 * (b['mean'] - static['mean']):.1f} points above the static baseline."),
    ]
    gap = b["mean"] - bow["mean"]
    spread = max(b["std"], bow["std"])
    if gap > 2 * spread:
        verdict = "above it by more than twice the spread over seeds"
    elif gap < -2 * spread:
        verdict = "below it by more than twice the spread over seeds"
    else:
        verdict = "within twice the spread over seeds of it (no clear difference)"
    lines.append(f"- The bag-of-words context baseline reaches {100 * bow['mean']:.1f} ± {100 * bow['std']:.1f}%; "
                 f"the best layer is {verdict}. This baseline is favoured by the labelling: the rule labels a "
                 "sentence by its context words, so the bag of words holds the very cue that set the label.")
    nocue = acc["bag of words, cues removed"]
    lines.append(f"- Without the rule's cue words the bag of words falls to {100 * nocue['mean']:.1f} ± "
                 f"{100 * nocue['std']:.1f}% ({100 * (bow['mean'] - nocue['mean']):.1f} points of it were the cues "
                 "themselves). The contextual vectors see the cues too; what they add over the full bag is the "
                 "comparison that counts.")
    inner = [acc[f"layer {k}"]["mean"] for k in range(1, result["num_layers"] + 1)]
    lines.append(f"- Layers 1-{result['num_layers']} span {100 * min(inner):.1f}-{100 * max(inner):.1f}% 1-NN accuracy.")
    lines.append(f"- Spread: each seed redraws {result['per_sense']} per sense from the same pool "
                 f"({', '.join(f'{k} {v}' for k, v in result['labelled'].items())} labelled sentences), so samples "
                 "overlap and the std is the sampling spread within this pool, not that of independent replications.")
    drop = acc[best]["mean"] - acc[last]["mean"]
    if drop > 0:
        lines.append(f"- The last layer ({100 * acc[last]['mean']:.1f}%) is {100 * drop:.1f} points below the best: "
                     "the sense is clearest in a middle/upper layer, not at the output this checkpoint was "
                     "trained to pool into a sentence embedding.")
    if result["smoke"]:
        lines.append("- SMOKE RUN: a tiny random model; the numbers check the script, they measure nothing.")
    return lines


def plot(path: Path, result: dict) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    s, n = result["summary"], result["num_layers"]
    ks = list(range(n + 1))
    fig, axes = plt.subplots(1, 2, figsize=(10, 4))
    for ax, (metric, label, _) in zip(axes, METRICS[:2]):
        mean = [100 * s[f"layer {k}"][metric]["mean"] for k in ks]
        std = [100 * s[f"layer {k}"][metric]["std"] for k in ks]
        ax.errorbar(ks, mean, yerr=std, marker="o", capsize=3, label="contextual (mean of word pieces)")
        for name, style, color in (("bag of words", "--", "tab:orange"), ("bag of words, cues removed", "-.", "tab:green"),
                                   ("static", ":", "grey")):
            m, e = 100 * s[name][metric]["mean"], 100 * s[name][metric]["std"]
            ax.axhline(m, linestyle=style, color=color, label=name + " (baseline)")
            if e:
                ax.axhspan(m - e, m + e, color=color, alpha=0.15)
        ax.set_xticks(ks, ["emb"] + [str(k) for k in ks[1:]])
        ax.set_xlabel("layer")
        ax.set_ylabel(f"{label} (%)")
        ax.set_ylim(40, 100)
        ax.grid(alpha=0.3)
    axes[0].legend(fontsize=8, loc="lower right")
    fig.suptitle(f"'{result['word']}' senses, {Path(result['model']).name}: mean ± std over seeds "
                 f"{','.join(map(str, result['seeds']))}, {result['per_sense']} per sense", fontsize=10)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def rule_text(result: dict) -> list[str]:
    rule = result["rule"]
    lines = [(f"A sentence holding '{result['word']}' exactly once (that form, lower case or capitalised), 6-60 "
             "words, none of the excluded phrases, is labelled with a sense if its other words include a cue of "
             "that sense and none of the other; cues of both or neither: dropped. The word capitalised mid-sentence "
             "is part of a name (World Bank, Dogger Bank, Robert Plant): dropped."), ""]
    for sense, cues in rule["senses"].items():
        lines.append(f"- **{sense}** cues: {', '.join(cues)}")
    lines.append(f"- excluded phrases (proper names when capitalised, matched as written): "
                 f"{', '.join(rule['exclude'])}")
    return lines


def write(out: Path, result: dict) -> None:
    counts = ", ".join(f"{k}: {v}" for k, v in result["counts"].items())
    labelled = ", ".join(f"{k} {v}" for k, v in result["labelled"].items())
    md = [f"# Word senses of '{result['word']}' across layers", "",
          (f"Model: `{result['model']}`. Text: {result['files']} English Wikipedia files. Command: "
          f"`{result['command']}`"), "", (f"Machine: {result['machine']}; {result['load']} at the end; "
          f"{result['total_seconds']} s in all ({result['embed_seconds']} s embedding "
          f"{result['sentences_embedded']} sentences at every layer)."), "",
          "## Labelling rule", "", *rule_text(result), "",
          (f"Sentences read, by outcome: {counts}. Labelled: {labelled}. Each seed draws {result['per_sense']} per "
          f"sense (balanced: chance is 50%)."), "", "Examples (first three of each sense, as read):", ""]
    for sense, texts in result["examples"].items():
        md += [f"- {sense}: {t}" for t in texts]
    md += ["", "## Results", "", "Mean ± sample std over seeds " + ", ".join(map(str, result["seeds"])) +
           ". The word's contextual vector is the mean of its word pieces' vectors at that layer.", "",
           table(result), "", "![senses](senses.png)", "", "## Reading", "", *reading(result), ""]
    atomic_write_text(out / "results.md", "\n".join(md))
    plot(out / "senses.png", result)


def to_json(result: dict) -> str:
    return json.dumps(result, indent=1)
