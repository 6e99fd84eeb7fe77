"""BART's Table 1 at CPU scale (Lewis et al. 2020, §4 and Table 1; issue 41, item 6): the five
noising functions and §5.1's combination, each pre-trained for the same CPU time by `ember
compare`, then fine-tuned on SST-2 and on the Wikipedia lead-generation task.

    PYTHONPATH=. OMP_NUM_THREADS=1 .venv/bin/python benchmarks/studies/bart_noising.py --out runs/bart-noising
    ... --smoke      # tiny everything, under a minute: a check, not a measurement
    ... --control rotate:927   # also rotation run for exactly 927 steps (masking's plan): noise or steps?

Rows (recipe YAMLs written to OUT/recipes/, bart-mini at the bart-tiny shape, differing ONLY in
``noising.kinds``): mask (token masking), delete (token deletion), infill (text infilling),
permute (sentence permutation), rotate (document rotation), infill+permute (§5.1's final model).
Every run reconstructs the whole document, so its held-out loss on its OWN noise is a number per
objective (undoing a rotation is easier than undoing 30% deletion); the table adds one common
yardstick: each model's held-out loss on the SAME infilling-noised held-out blocks. Beside them:
a random-init row (`ember compare --baseline random`: what pre-training bought) and the lead
baseline of the generation task.

Data: the tokenizer (byte-level BPE with <mask>) and the pre-training corpus come from
$EMBER_DATA/wiki-en/AA as benchmarks/studies/lead_generation.py builds them; its task is built
from AB (held out by article), so no article of the task was seen in pre-training.
Steps: (1) corpus, (2) recipes, (3) `ember compare` (pre-training at an equal CPU budget on one
thread + SST-2), (4) lead generation per pre-trained model, (5) OUT/table.md, table.json,
curves.png. A rerun reuses every finished part (compare's runs, OUT/lead/<row>-side.json).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import sys
import tempfile
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "common"))  # the shared helpers
import lead_generation as lead  # noqa: E402  (a study of the same room: its task, fine-tuning, ROUGE)
from _bench import load, machine, run_cli  # noqa: E402

from ember.errors import EmberError  # noqa: E402
from ember.paths import data_root  # noqa: E402

# Table 1's rows: label -> noising.kinds (labels name compare's folders and the table's rows)
VARIANTS = {"mask": "mask", "delete": "delete", "infill": "infill", "permute": "permute", "rotate": "rotate",
            "infill+permute": "infill,permute"}
YARDSTICK = "infill"  # the common held-out noise every model is also scored on
PAPER = {  # Table 1, BART-base-sized models (ppl on ELI5 / XSum; SST-2 is not in Table 1, MNLI acc is)
    "mask": "SQuAD 90.4, MNLI 84.1, ELI5 25.05, XSum 7.08", "delete": "90.4, 84.1, 24.61, 6.90",
    "infill": "90.8, 84.0, 24.26, 6.61", "permute": "85.4, 81.5, 41.87, 10.93", "rotate": "77.2, 75.3, 53.69, 17.14",
    "infill+permute": "90.8, 83.8, 24.17, 6.62"}

# The budgets. Real: ~52 CPU-minutes on one thread, measured (5 CPU-min of pre-training per variant
# + held-out evaluations, ~36; SST-2 ~0.5 min and lead generation ~2 min per model, 7 models); the
# corpus and the lead task are lead_generation's REAL ones, the shape bart-tiny's (2 + 2 layers x 128) as there.
REAL = {"corpus": lead.REAL, "lead": lead.REAL, "budget": "300s", "probe_steps": 10, "block": 128,
        "batch": 16, "eval_examples": 256, "eval_every": 50, "save_every": 200, "sst2_limit": 4000,
        "sst2_epochs": 2, "sst2_length": 64, "model": ["model.preset=bart-tiny", "model.max_position=256"]}
SMOKE = {"corpus": lead.SMOKE, "lead": lead.SMOKE, "budget": "2s", "probe_steps": 2, "block": 64,
         "batch": 4, "eval_examples": 8, "eval_every": 2, "save_every": 4, "sst2_limit": 16, "sst2_epochs": 1,
         "sst2_length": 32, "model": ["model.preset=bart-tiny", "model.max_position=256", *lead.SMOKE["shape"]]}


def write_recipes(out: Path, b: dict) -> dict[str, Path]:
    """label -> OUT/recipes/<label>.yaml: bart-mini with the study's shape, batch and evaluation
    (the same for all), and the row's noising.kinds (the one difference)."""
    import yaml

    from ember.config import apply_overrides, load_yaml, run_config_from_dict
    from ember.recipes import recipe_path

    shared = [*b["model"], f"data.max_seq_length={b['block']}", f"data.eval_examples={b['eval_examples']}",
              f"train.batch_size={b['batch']}", "train.grad_accum=1", f"train.eval_every={b['eval_every']}",
              f"train.save_every={b['save_every']}", "train.log_every=10"]
    out.mkdir(parents=True, exist_ok=True)
    paths = {}
    for label, kinds in VARIANTS.items():
        values = apply_overrides(load_yaml(recipe_path("bart-mini")), [*shared, f"noising.kinds={kinds}"])
        run_config_from_dict(json.loads(json.dumps(values)), where=label)  # refuse a bad setting before any run
        path = out / f"{label}.yaml"
        text = (f"# bart-mini with noising.kinds={kinds} (BART Table 1 row {label!r}), written by "
                f"benchmarks/studies/bart_noising.py\n" + yaml.safe_dump(values, sort_keys=False))
        if not path.is_file() or path.read_text() != text:  # unchanged files keep compare's resume check quiet
            path.write_text(text)
        paths[label] = path
    return paths


def compare_argv(recipes: dict[str, Path], prepared: Path, out: Path, b: dict) -> list[str]:
    """`ember compare`'s arguments: six recipes at one CPU budget on one thread, SST-2, one seed."""
    argv = ["compare", *map(str, recipes.values()), "--data", str(prepared), "--budget", b["budget"],
            "--tasks", "sst2", "--seeds", "1", "--out", str(out), "--baseline", "random",
            "--set", "train.clock=cpu", "--set", "train.num_threads=1", "--train-limit", str(b["sst2_limit"]),
            "--finetune-epochs", str(b["sst2_epochs"]), "--max-length", str(b["sst2_length"]),
            "--probe-steps", str(b["probe_steps"]), "--no-progress"]
    for label, path in recipes.items():
        argv += ["--label", f"{label}={path}"]
    return argv


def yardstick_loss(run: Path, kinds: str = YARDSTICK) -> dict:
    """Held-out metrics of the pre-trained ``run`` on its corpus's held-out blocks noised by
    ``kinds`` instead of its own noise: the same blocks, and for one ``kinds`` the same noise
    draws, for every model (held_out_metrics seeds each batch by train.seed, equal for all)."""
    from ember.objectives.setup import setup_pretraining
    from ember.runs.folder import load_run_config

    cfg = load_run_config(run)
    cfg = dataclasses.replace(cfg, init=str(run), noising=dataclasses.replace(cfg.noising, kinds=kinds))
    with tempfile.TemporaryDirectory() as scratch:  # setup writes nothing; the folder is only named
        setup = setup_pretraining(cfg, Path(scratch) / "run", resume=False, progress=False)
    setup.module.eval()
    with torch.no_grad():
        return setup.evaluate(setup.module)


def unigram_loss(prepared: Path, block: int, n_held_out: int) -> float:
    """The held-out loss of a model that ignores its input and its prefix: cross-entropy of the
    held-out targets (<s> block </s>, the blocks held_out_metrics scores) under the training
    blocks' token frequencies (add-one). The plateau a from-scratch model sits on first."""
    import numpy as np

    from ember.data.sentence_blocks import SentenceBlockDataset
    from ember.data.shards import TokenCorpus

    train = TokenCorpus(prepared, "train")
    specials = train.special_token_ids
    counts = np.ones(train.vocab_size)
    data = SentenceBlockDataset(train, block - 2)  # the objective's blocks: room for <s> and </s>
    for i in range(len(data)):
        counts += np.bincount(data.example(i).tokens, minlength=train.vocab_size)
    counts[specials["cls"]] += len(data)
    counts[specials["sep"]] += len(data)
    log_p = np.log(counts / counts.sum())
    held = SentenceBlockDataset(TokenCorpus(prepared, "valid"), block - 2)
    targets = [np.concatenate([[specials["cls"]], held.example(i).tokens, [specials["sep"]]])
               for i in range(min(n_held_out, len(held)))]
    return float(-log_p[np.concatenate(targets)].mean())


def lead_rows(models: dict, out: Path, b: dict) -> tuple[list[dict], dict, int]:
    """The lead-generation task (lead_generation's, AB files), each model fine-tuned on it and
    scored, plus the lead baseline; (rows, task counts, how many fine-tunings ran now)."""
    wiki = data_root() / "wiki-en"
    files = sorted((wiki / "AB").glob("wiki_*.gz"))[: b["task_files"]]
    counts, dev = lead.scored_task(files, out / "task", b["dev_pairs"])
    counts["scored_dev_pairs"] = len(dev)
    targets = [r["target"] for r in dev]
    rows, ran = [{"label": "lead baseline", **lead.scores(lead.lead_outputs([r["input"] for r in dev]), targets)}], 0
    for label, init in models.items():
        cache = out / f"{label}-side.json"  # a finished side is kept: a rerun only rescores it
        saved = json.loads(cache.read_text()) if cache.is_file() else {}
        if saved.get("budget") != b or saved.get("targets") != targets:
            print(f"lead generation: fine-tuning {label}", flush=True)
            saved = {"budget": b, "targets": targets, "side": lead.finetune_side(init, out / "task", out / label, b)}
            cache.write_text(json.dumps(saved, ensure_ascii=False))
            ran += 1
        side = dict(saved["side"])
        rows.append({"label": label, **{k: v for k, v in side.items() if k != "outputs"},
                     **lead.scores(side["outputs"], targets)})
    return rows, counts, ran


def control_row(spec: str, recipes: dict[str, Path], prepared: Path, out: Path, b: dict) -> dict:
    """``--control LABEL:STEPS``: LABEL's recipe pre-trained for exactly STEPS steps with no time cap
    (another row's planned steps, so the same learning-rate schedule), then fine-tuned on SST-2
    and lead generation as the rows are: whether a row's gap is its noise or the steps its budget
    bought. Finished parts are reused (the lead side is decoded again, ~10 CPU s)."""
    import ember
    from ember.data.shards import TokenCorpus
    from ember.runs.folder import load_run_config

    label, _, steps = spec.partition(":")  # checked by parse_args
    run, tuned, side = (out / f"{label}-{steps}{tail}" for tail in ("", "-sst2", "-lead"))
    if not (run / "model.safetensors").is_file():
        vocab = TokenCorpus(prepared, "train").vocab_size  # as ember compare sets them
        ember.pretrain(str(recipes[label]), run, data=str(prepared), overwrite=True, progress=False,
                       overrides=[f"train.max_steps={steps}", "train.num_threads=1", "train.clock=cpu",
                                  "train.seed=0", f"model.vocab_size={vocab}"])
    if not (tuned / "results.json").is_file():  # compare's fine-tuning settings
        ember.finetune("sst2", tuned, init=str(run), seeds=[1], train_limit=b["sst2_limit"], lr=1e-4,
                       epochs=b["sst2_epochs"], max_length=b["sst2_length"], num_threads=1, overwrite=True,
                       progress=False)
    task = out.parent / "lead" / "task"
    dev = lead.read_jsonl(task / "dev-scored.jsonl")
    if not (side / "results.json").is_file():
        outputs = lead.finetune_side(str(run), task, side, b["lead"])["outputs"]
    else:
        outputs = lead.decode(side, [r["input"] for r in dev], b["lead"]["beams"])
    curve = held_out_curve(run)
    return {"label": f"{label} @ {steps} steps (control)", "run": str(run), "kinds": VARIANTS[label],
            "steps": curve[-1][0],
            "max_steps": int(steps), "cpu_s": curve[-1][1], "own_loss": curve[-1][2],
            "common_loss": yardstick_loss(run)["loss"], "recipe_kinds": load_run_config(run).noising.kinds,
            "sst2": 100.0 * json.loads((tuned / "results.json").read_text())["metrics"]["accuracy"],
            **lead.scores(outputs, [r["target"] for r in dev])}


def held_out_curve(run: Path) -> list[tuple[int, float, float]]:
    """(step, training CPU s, held-out loss) of each evaluation of a pre-training run."""
    from ember.train.logging import MetricsLogger

    return [(r["step"], r["elapsed"], r["loss"]) for r in MetricsLogger.read(run / "metrics.jsonl")
            if r["split"] == "eval" and "loss" in r]


def plot_curves(curves: dict, path: Path, title: str, unigram: float) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 2, figsize=(11, 4.2))
    for label, points in curves.items():
        axes[0].plot([p[1] for p in points], [p[2] for p in points], marker=".", label=label)
        axes[1].plot([p[0] for p in points], [p[2] for p in points], marker=".", label=label)
    axes[0].set_xlabel("pre-training CPU seconds (one thread)")
    axes[1].set_xlabel("pre-training step")
    for ax in axes:
        ax.axhline(unigram, color="grey", linestyle="--", linewidth=1, label="token frequencies alone")
        ax.set_ylabel("held-out reconstruction loss, own noise (nats)")
        ax.grid(alpha=0.3)
    axes[1].legend(title="noising.kinds")
    fig.suptitle(title, fontsize=10)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def table_markdown(rows: list[dict], note: str) -> str:
    def num(value, fmt):
        return "—" if value is None else format(value, fmt)

    lines = [note, "", "| noising | pre-train steps (planned / run) | pre-train CPU s | held-out loss, own noise | "
             "held-out loss, "
             f"{YARDSTICK} noise (common) | SST-2 dev acc | ROUGE-1 | ROUGE-2 | ROUGE-Lsum | distinct outputs |",
             "|---|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        steps = f"{r['max_steps']} / {r['steps']}" if "steps" in r else "—"
        lines.append(f"| {r['label']} | {steps} | {num(r.get('cpu_s'), '.0f')} | "
                     f"{num(r.get('own_loss'), '.3f')} | {num(r.get('common_loss'), '.3f')} | "
                     f"{num(r.get('sst2'), '.2f')} | {num(r.get('rouge1'), '.2f')} | {num(r.get('rouge2'), '.2f')} | "
                     f"{num(r.get('rougeLsum'), '.2f')} | {r.get('distinct_outputs', '—')} |")
    return "\n".join(lines) + "\n"


def parse_args(argv=None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", required=True, help="output folder (corpus, recipes, compare/, lead/, table.*)")
    parser.add_argument("--smoke", action="store_true", help="tiny everything: a check, not a measurement")
    parser.add_argument("--control", action="append", default=[], metavar="LABEL:STEPS",
                        help="also pre-train LABEL's recipe for exactly STEPS steps (e.g. rotate:927, masking's "
                        "planned steps) and fine-tune it as the rows: noise or steps? (repeatable)")
    args = parser.parse_args(argv)
    for spec in args.control:
        label, _, steps = spec.partition(":")
        if label not in VARIANTS or not steps.isdigit() or int(steps) < 1:
            raise EmberError(f"--control {spec!r}: write LABEL:STEPS with LABEL one of {', '.join(VARIANTS)} and "
                             "STEPS a positive number, e.g. rotate:927")
    return args


def main(argv=None) -> dict:
    from ember.cli import main as ember_cli

    args = parse_args(argv)
    b = SMOKE if args.smoke else REAL
    torch.set_num_threads(1)
    out = Path(args.out)
    started = time.process_time()
    files = sorted((data_root() / "wiki-en" / "AA").glob("wiki_*.gz"))[: b["corpus"]["pretrain_files"]]
    if not files:
        raise EmberError(f"no wiki_*.gz under {data_root() / 'wiki-en' / 'AA'}: set EMBER_DATA to the data folder")
    prepared = lead.corpus("bpe", files, out / "corpus", b["corpus"])
    recipes = write_recipes(out / "recipes", b)
    argv = compare_argv(recipes, prepared, out / "compare", b)
    print("ember " + " ".join(argv), flush=True)
    if ember_cli(argv) != 0:
        raise EmberError("ember compare failed (its error is above)")
    compared = {m["label"]: m for m in json.loads((out / "compare" / "results.json").read_text())["models"]}
    runs = out / "compare" / "runs"
    inits = {label: str(runs / label / "pretrain") for label in VARIANTS}
    from ember.runs.folder import load_run_config
    from ember.runs.init import Init

    first = runs / next(iter(VARIANTS)) / "pretrain"  # compare's random baseline has the first recipe's shape
    inits["random"] = Init(load_run_config(first).model, None, first / "tokenizer.json")
    generation, task_counts, lead_ran = lead_rows(inits, out / "lead", b["lead"])
    by_label = {r["label"]: r for r in generation}

    rows, curves = [], {}
    for label in [*VARIANTS, "random"]:
        pre = compared[label]["pretrain"] or {}
        sst2 = compared[label]["tasks"].get("sst2", {}).get("mean")  # accuracy, 0-1
        row = {"label": label, "kinds": VARIANTS.get(label, "none (random init)"),
               "sst2": None if sst2 is None else 100.0 * sst2,
               **{k: by_label[label][k] for k in (*lead.ROUGE_KEYS, "distinct_outputs", "finetune_steps")}}
        if pre:
            run = runs / label / "pretrain"
            curves[label] = held_out_curve(run)
            row.update(steps=pre["steps"], max_steps=pre["max_steps"], cpu_s=pre["train_seconds"],
                       budget_s=pre["budget_seconds"], stopped_by=pre["stopped_by"], tokens=pre["tokens"],
                       own_loss=pre["held_out"].get("loss"), common_loss=yardstick_loss(run)["loss"],
                       recipe_kinds=load_run_config(run).noising.kinds, paper=PAPER[label])
        rows.append(row)
    for spec in args.control:
        rows.append(control_row(spec, recipes, prepared, out / "control", b))
        curves[rows[-1]["label"]] = held_out_curve(Path(rows[-1]["run"]))
    rows.append({"label": "lead baseline", "kinds": "(copy the input's first sentence)",
                 **{k: by_label["lead baseline"][k] for k in (*lead.ROUGE_KEYS, "distinct_outputs")}})
    unigram = unigram_loss(prepared, b["block"], b["eval_examples"])
    budget = compared["mask"]["pretrain"]["budget_seconds"]
    note = (f"{'smoke' if args.smoke else 'real'} budget: {budget:.0f} CPU s of pre-training per variant (one thread, "
            f"train.clock=cpu), batch {b['batch']} x {b['block']} tokens; SST-2: first {b['sst2_limit']} training "
            f"sentences, {b['sst2_epochs']} epoch(s), max length {b['sst2_length']}, seed 1, dev accuracy x 100 "
            f"(872 sentences, majority class 50.9); lead generation: {b['lead']['epochs']} epochs of "
            f"{min(b['lead']['train_pairs'], task_counts['train_pairs'])} pairs, beam {b['lead']['beams']}, "
            f"{task_counts['scored_dev_pairs']} dev pairs. Held-out loss of token frequencies alone (the "
            f"unigram plateau): {unigram:.3f}. {machine()}, {load()}")
    markdown = table_markdown(rows, note)
    print(markdown)
    (out / "table.md").write_text(markdown)
    plot_curves(curves, out / "curves.png", f"BART noising at {budget:.0f} CPU s each (bart-tiny shape, one seed)",
                unigram)
    result = {"note": note, "unigram_loss": unigram, "rows": rows, "curves": curves,
              "compare_command": "ember " + " ".join(argv),
              "lead_task": task_counts, "lead_finetunes_run": lead_ran,
              "cpu_s_this_call": time.process_time() - started}
    (out / "table.json").write_text(json.dumps(result, indent=1, ensure_ascii=False))
    return result


if __name__ == "__main__":
    run_cli(lambda: main(sys.argv[1:]))
