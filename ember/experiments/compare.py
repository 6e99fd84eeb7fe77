"""`ember compare`: pre-train several recipes for the same compute, fine-tune each the same way.

The question this answers is the one ELECTRA (Clark et al. 2020, §3.3 and Table 1/Fig. 3)
and ALBERT (Lan et al. 2020, §4.6) ask: which pre-training recipe gives the best downstream
model *for a fixed amount of compute*? Here compute is wall time on this machine:

1. Same data, same seed. Every recipe reads the same prepared corpus (``data.prepared``),
   its ``model.vocab_size`` follows that corpus's tokenizer, and ``train.seed`` is the same
   for all; ``--set key=value`` overrides are applied to every recipe alike.
2. Same time. The learning-rate schedule (linear warm-up + decay) needs a step count, and
   recipes differ in speed (ELECTRA runs a generator too, ALBERT shares weights but not
   FLOPs). So each recipe is first *probed*: a throw-away in-process run of a couple of
   warm-up steps plus ~10 timed steps, through the very same ``ember.pretrain`` path.
   Then ``train.max_steps = budget x measured steps/s`` (the schedule decays to zero at the
   budget) and ``train.max_time = budget`` is a hard cap in case the machine slows down.
   The budget counts training-step time as the Trainer measures it (held-out evaluation and
   checkpoint writes are not charged to a recipe). Measured speed, planned steps, actual
   steps, training seconds and tokens seen are all recorded.
3. Same fine-tuning. Each pre-trained backbone is fine-tuned on each task for each seed
   with one shared setting (``ember.finetune``; the task's official metric from
   ``ember.tasks.metrics.classification``); ``baseline="random"`` adds a randomly initialised model of the
   first recipe's shape as the floor.

Everything lands in OUT::

    OUT/compare.json                    the settings (a re-run must use the same ones)
    OUT/runs/<label>/probe.json         measured speed (kept, so a resumed run keeps max_steps)
    OUT/runs/<label>/pretrain/          the pre-training run folder
    OUT/runs/<label>/pretrain.json      its summary (steps, tokens, time, held-out metrics)
    OUT/runs/<label>/<task>-seed<k>/    one fine-tuning run folder (results.json when done)
    OUT/results.json, results.md, comparison.png   rebuilt from the run folders after each
                                        run (ember.experiments.compare_report)

Re-running the same command skips finished runs and resumes an interrupted one from its last
checkpoint, so a killed comparison loses at most the run that was in progress.
"""

from __future__ import annotations

import dataclasses
import json
import math
import shutil
import time
from dataclasses import dataclass
from pathlib import Path

from ember.config import RunConfig, TrainConfig, to_dict
from ember.durations import format_duration
from ember.errors import EmberError
from ember.experiments.report_common import clean
from ember.experiments.common import Clock, prepare_folder
from ember.fileio import atomic_write_text

DEFAULT_TASKS = ("sst2", "cola", "mrpc", "rte", "stsb")
BASELINE_LABEL = "random"
PROBE_WARMUP_STEPS = 2  # first steps pay for allocator/thread-pool warm-up; not timed
PROBE_STEPS = 10


def parse_budget(text: str) -> float:
    """'90s', '20m', '1.5h' or plain seconds -> seconds (> 0)."""
    from ember.durations import parse_duration

    try:
        seconds = parse_duration(text)
    except EmberError:
        raise EmberError(f"--budget {text!r}: cannot read it; write a duration such as 90s, 20m, 1.5h "
                         "or plain seconds") from None
    if seconds <= 0:
        raise EmberError(f"--budget {text!r}: the pre-training budget must be more than zero")
    return seconds


@dataclass(frozen=True)
class FinetuneSettings:
    """One fine-tuning setting for every recipe; None takes the task's BERT default.

    lr 1e-4: Turc et al. (2019, §6) fine-tune their miniature BERTs with lr in
    {1e-4, 5e-5, 3e-5}; BERT-base's 2e-5 barely moves a 4-layer model in 3 epochs of a
    small task. Use 2e-5..5e-5 when comparing base-sized recipes.
    """

    lr: float = 1e-4
    epochs: float | None = None  # BERT: 3
    max_length: int | None = None  # BERT: 128
    train_limit: int | None = None  # first N training examples (quick runs)
    # (recipe or label, lr) pairs for a model whose optimiser wants another rate: T5 fine-tunes
    # with Adafactor at 1e-3 (Raffel et al. 2020, §3.1.3), where AdamW's 1e-4 suits the encoders.
    lr_for: tuple[tuple[str, float], ...] = ()

    def lr_of(self, label: str, recipe: str = "") -> float:
        rates = dict(self.lr_for)
        return rates.get(label, rates.get(recipe, self.lr))

    def record(self) -> dict:
        """The settings as compare.json keeps them (without per-model rates when none are given,
        so comparisons made before they existed still resume)."""
        values = dataclasses.asdict(self)
        values["lr_for"] = dict(self.lr_for)
        if not values["lr_for"]:
            del values["lr_for"]
        return values


@dataclass(frozen=True)
class Entry:
    label: str  # folder name under OUT/runs and the row name in the table
    recipe: str  # as given on the command line (a recipe name or a YAML path)
    cfg: RunConfig  # the pre-training config, before max_steps/max_time are derived


# -- setting up ----------------------------------------------------------------------------

def assign_labels(recipes: list[str], labels: list[str]) -> list[tuple[str, str]]:
    """[(label, recipe)]: the recipe's name (file stem) unless ``--label NAME=RECIPE`` says otherwise."""
    if not recipes:
        raise EmberError("name at least one recipe to compare, e.g. `ember compare bert-mini electra-mini`")
    if len(set(recipes)) != len(recipes):
        raise EmberError(f"a recipe is listed twice in {recipes}; list each once")
    chosen = {}
    for item in labels:
        name, sep, recipe = item.partition("=")
        if not sep or not name or recipe not in recipes:
            raise EmberError(f"--label {item!r}: write NAME=RECIPE where RECIPE is one of {', '.join(recipes)}")
        chosen[recipe] = name
    pairs = [(chosen.get(r, Path(r).stem if r.endswith((".yaml", ".yml")) else r), r) for r in recipes]
    seen = set()
    for label, recipe in pairs:
        if not label.replace("-", "").replace("_", "").replace(".", "").replace("+", "").isalnum():
            raise EmberError(f"label {label!r} (for {recipe}) must be letters, digits and -_.+ only "
                             "(it names a folder); choose one with --label NAME=RECIPE")
        if label in seen or label == BASELINE_LABEL:
            raise EmberError(f"two models would be called {label!r}; tell them apart with --label NAME=RECIPE")
        seen.add(label)
    return pairs


def parse_data(items: list[str] | str | Path) -> tuple[Path, dict[str, Path]]:
    """``--data`` values -> (the corpus of every recipe, {recipe or label: its own corpus}).

    A recipe whose vocabulary must differ (T5's sentinels, GPT's byte-level BPE) gets its own
    prepared corpus with NAME=PATH; the text should be the same for the comparison to be fair."""
    items = [items] if isinstance(items, (str, Path)) else list(items)
    default, own = None, {}
    for item in map(str, items):
        name, sep, path = item.partition("=")
        if sep and name and not Path(item).exists():
            own[name] = Path(path).resolve()
        elif default is None:
            default = Path(item).resolve()
        else:
            raise EmberError(f"--data {item!r}: one shared corpus is given already ({default}); name the "
                             "recipe a second corpus is for, e.g. --data t5-mini=runs/wiki-t5")
    if default is None:
        raise EmberError("--data needs the corpus the recipes share (a folder from `ember prepare`)")
    return default, own


def build_entries(recipes: list[str], labels: list[str], data: Path, overrides: list[str],
                  seed: int, own_data: dict[str, Path] | None = None) -> list[Entry]:
    from ember.config import apply_overrides, load_yaml, run_config_from_dict
    from ember.data.shards import TokenCorpus
    from ember.recipes import recipe_path

    own_data = own_data or {}
    pairs = assign_labels(recipes, labels)
    unknown = sorted(set(own_data) - {n for pair in pairs for n in pair})
    if unknown:
        raise EmberError(f"--data {unknown[0]}=...: no recipe or label of that name in this comparison")
    entries = []
    for label, recipe in pairs:
        path = recipe_path(recipe)
        corpus = own_data.get(label, own_data.get(recipe, data))
        vocab = TokenCorpus(corpus, "train").vocab_size  # also checks that it is a prepared corpus
        # Shared settings first, then the user's --set (applied to every recipe alike).
        values = apply_overrides(load_yaml(path), [f"data.prepared={corpus}", f"model.vocab_size={vocab}",
                                                   f"train.seed={seed}", *overrides])
        cfg = run_config_from_dict(values, where=str(path))
        if cfg.kind != "pretrain":
            raise EmberError(f"{path} is a {cfg.kind} recipe; `ember compare` needs pre-training recipes")
        entries.append(Entry(label, recipe, cfg))
    return entries


def check_settings(out: Path, settings: dict, labels: dict[str, str]) -> None:
    """A re-run must continue the same comparison: same budget, data and fine-tuning settings."""
    path = out / "compare.json"
    if path.is_file():
        saved = json.loads(path.read_text())
        changed = [f"{k}: {saved['settings'].get(k)!r} then, {v!r} now" for k, v in settings.items()
                   if saved["settings"].get(k) != v]
        changed += [f"label {k}: recipe {saved['labels'][k]!r} then, {v!r} now" for k, v in labels.items()
                    if saved["labels"].get(k, v) != v]
        if changed:
            raise EmberError(f"{out} holds a comparison made with other settings ({'; '.join(changed)}). "
                             "Re-run with the same settings to continue it, or choose another --out.")
        labels = {**saved["labels"], **labels}
    atomic_write_text(path, json.dumps({"settings": settings, "labels": labels}, indent=2))


def config_differences(saved: RunConfig, wanted: RunConfig) -> list[str]:
    """Dotted names of settings that differ (pad id and device are not part of a run's identity)."""
    a, b = to_dict(saved), to_dict(wanted)
    a["model"].pop("pad_token_id"), b["model"].pop("pad_token_id")
    a["train"].pop("device"), b["train"].pop("device")
    out = []
    for section in a:
        if isinstance(a[section], dict):
            out += [f"{section}.{k}" for k in a[section] if a[section][k] != b[section].get(k)]
        elif a[section] != b[section]:
            out.append(section)
    return out


# -- pre-training ----------------------------------------------------------------------------

def measure_speed(cfg: RunConfig, work_dir: Path, warmup: int = PROBE_WARMUP_STEPS,
                  steps: int = PROBE_STEPS) -> dict:
    """Optimizer steps per second of training-step time, from a throw-away run of ``cfg``.

    The Trainer logs its cumulative step time (``elapsed``, the clock ``max_time`` is checked
    against) with every record; log_every=1 gives it per step, and steps warmup+1..warmup+steps
    are timed. No held-out evaluation (eval_examples=0); the folder is deleted afterwards.
    """
    from ember.api import pretrain
    from ember.train.logging import MetricsLogger

    probe = dataclasses.replace(
        cfg, data=dataclasses.replace(cfg.data, eval_examples=0),
        train=dataclasses.replace(cfg.train, max_steps=warmup + steps, max_time=0.0, log_every=1,
                                  eval_every=0, save_every=0, keep_checkpoints=1))
    if work_dir.exists():
        shutil.rmtree(work_dir)
    try:
        pretrain(probe, work_dir, progress=False)
        elapsed = {r["step"]: r["elapsed"] for r in MetricsLogger.read(work_dir / "metrics.jsonl")
                   if r["split"] == "train"}
    finally:
        shutil.rmtree(work_dir, ignore_errors=True)
    seconds = elapsed[warmup + steps] - elapsed.get(warmup, 0.0)
    return {"steps_per_s": steps / max(seconds, 1e-3), "timed_steps": steps, "warmup_steps": warmup,
            "timed_seconds": seconds}


def planned_config(entry: Entry, probe: dict, budget: float) -> RunConfig:
    """The recipe with the equal-compute rule applied: max_steps from the probe, max_time = budget."""
    max_steps = max(1, int(budget * probe["steps_per_s"]))
    return dataclasses.replace(entry.cfg, train=dataclasses.replace(entry.cfg.train, max_steps=max_steps,
                                                                     max_time=budget))


def backbone_parameters(weights: Path) -> int:
    """Stored backbone parameters (ALBERT's shared layers count once, as in its Table 1)."""
    from safetensors import safe_open

    with safe_open(str(weights), "pt") as fh:
        return sum(math.prod(fh.get_slice(k).get_shape()) for k in fh.keys() if k.startswith("backbone."))


def pretrain_entry(entry: Entry, budget: float, label_dir: Path, probe_steps: int, progress: bool,
                   say) -> dict:
    """Probe (once), then pre-train (or resume) under the budget; returns pretrain.json's content."""
    from ember.api import pretrain
    from ember.runs.folder import load_run_config

    probe_path = label_dir / "probe.json"
    if probe_path.is_file():  # a resumed run must keep the max_steps its LR schedule was built for
        probe = json.loads(probe_path.read_text())
    else:
        say(f"{entry.label}: probing speed ({PROBE_WARMUP_STEPS} warm-up + {probe_steps} timed steps)")
        probe = measure_speed(entry.cfg, label_dir / "probe", steps=probe_steps)
        atomic_write_text(probe_path, json.dumps(probe, indent=2))
    cfg = planned_config(entry, probe, budget)
    run_dir = label_dir / "pretrain"
    if (run_dir / "config.yaml").is_file():
        changed = config_differences(load_run_config(run_dir), cfg)
        if changed:
            raise EmberError(f"{run_dir} was pre-trained with other settings ({', '.join(changed)} differ "
                             f"from recipe {entry.recipe} now); delete {label_dir} to redo it, or "
                             "choose another --out")
    resume = prepare_folder(run_dir)
    say(f"{entry.label}: {probe['steps_per_s']:.2f} steps/s measured -> max_steps {cfg.train.max_steps} "
        f"(max_time {format_duration(budget)}){', resuming' if resume else ''}")
    started = time.time()
    trained = pretrain(cfg, run_dir, resume=resume, progress=progress)
    result = trained.result
    summary = {
        "recipe": entry.recipe, "objective": cfg.objective, "family": cfg.model.family,
        "parameters": backbone_parameters(run_dir / "model.safetensors"),
        "budget_seconds": budget, "probe": probe, "max_steps": cfg.train.max_steps,
        "steps": result["step"], "train_seconds": result["elapsed"], "tokens": result["tokens"],
        "tokens_per_s": result["tokens"] / max(result["elapsed"], 1e-9),
        "wall_seconds_last_session": time.time() - started, "resumed": resume,
        "stopped_by": "max_steps" if result["step"] >= cfg.train.max_steps else "max_time",
        "held_out": trained.metrics,
    }
    atomic_write_text(label_dir / "pretrain.json", json.dumps(clean(summary), indent=2))
    return summary


# -- fine-tuning -------------------------------------------------------------------------------

def finetune_inits(entries: list[Entry], root: Path, baseline: bool) -> dict:
    """label -> where its fine-tuning starts: the pre-training run folder, or for the baseline a
    random model of the first recipe's shape, vocabulary and pad id (``ember.runs.init.Init``)."""
    from ember.runs.folder import load_run_config
    from ember.runs.init import Init

    inits = {entry.label: str(root / entry.label / "pretrain") for entry in entries}
    if baseline:
        first = root / entries[0].label / "pretrain"
        inits[BASELINE_LABEL] = Init(load_run_config(first).model, None, first / "tokenizer.json")
    return inits


def finetune_settings(settings: FinetuneSettings, base: TrainConfig, label: str = "", recipe: str = "") -> dict:
    """The comparison's fine-tuning setting as ``ember.finetune`` keywords (None: the task's)."""
    return {"lr": settings.lr_of(label, recipe), "epochs": settings.epochs, "max_length": settings.max_length,
            "device": base.device, "dtype": base.dtype, "num_threads": base.num_threads}


# -- the whole comparison --------------------------------------------------------------------

def run_compare(recipes: list[str], data: str | Path | list[str], budget: float, out: str | Path,
                tasks: list[str] = DEFAULT_TASKS, seeds: list[int] = (1, 2, 3), overrides: list[str] = (),
                labels: list[str] = (), finetune: FinetuneSettings = FinetuneSettings(),
                baseline: bool = False, pretrain_seed: int = 0, probe_steps: int = PROBE_STEPS,
                progress: bool = True) -> dict:
    """Pre-train each recipe for ``budget`` seconds, fine-tune each on each task and seed, report.

    Returns the content of OUT/results.json plus ``ran``: how many probes, pre-trainings and
    fine-tunings this call actually ran (the rest were found finished in OUT).
    """
    from ember.api import finetune as finetune_run
    from ember.experiments.compare_report import write_reports
    from ember.tasks.readers.glue import get_task, read_examples

    out = Path(out)
    data, own_data = parse_data(data)
    specs = [get_task(t) for t in tasks]
    if len({s.name for s in specs}) != len(specs):
        raise EmberError(f"a task is listed twice in {list(tasks)}")
    if not seeds:
        raise EmberError("give at least one fine-tuning seed, e.g. --seeds 1,2,3")
    entries = build_entries(list(recipes), list(labels), data, list(overrides), pretrain_seed, own_data)
    known = {n for e in entries for n in (e.label, e.recipe)} | ({BASELINE_LABEL} if baseline else set())
    stray = sorted(name for name, _ in finetune.lr_for if name not in known)
    if stray:
        raise EmberError(f"--finetune-lr {stray[0]}=...: no recipe or label of that name in this comparison")
    # Fail now, not after hours of pre-training: the task files must be readable and fit.
    n_train = {}
    for spec in specs:
        n_train[spec.name] = len(read_examples(spec, "train", limit=finetune.train_limit))
        length = finetune.max_length or spec.bert_hparams.max_length
        for e in entries:
            if length > e.cfg.model.max_position:
                raise EmberError(f"fine-tuning max length {length} exceeds {e.label}'s {e.cfg.model.max_position} "
                                 "positions; pass a smaller --max-length")
    settings = {"budget_seconds": budget, "data": str(data), "overrides": list(overrides),
                **({"data_for": {k: str(v) for k, v in sorted(own_data.items())}} if own_data else {}),
                "pretrain_seed": pretrain_seed, "finetune": finetune.record()}
    check_settings(out, settings, {e.label: e.recipe for e in entries})
    root = out / "runs"
    models = [(e.label, e.recipe) for e in entries] + ([(BASELINE_LABEL, "")] if baseline else [])
    meta = {"settings": settings, "tasks": [s.name for s in specs], "seeds": list(seeds)}

    def report():
        return write_reports(out, models, meta)

    clock = Clock(budget, n_train, finetune.epochs)
    ran = {"probe": 0, "pretrain": 0, "finetune": 0}
    # done = its summary and its weights (weights deleted by hand: pre-training resumes and writes them)
    todo_pre = [e for e in entries if not ((root / e.label / "pretrain.json").is_file()
                                           and (root / e.label / "pretrain" / "model.safetensors").is_file())]
    todo_ft = [(label, spec.name, seed) for spec in specs for seed in seeds for label, _ in models
               if not (root / label / f"{spec.name}-seed{seed}" / "results.json").is_file()]
    say = clock.say
    say(f"{len(entries)} recipes, {len(entries) - len(todo_pre)} already pre-trained; "
        f"{len(todo_ft)} of {len(specs) * len(seeds) * len(models)} fine-tuning runs to do")
    for i, entry in enumerate(todo_pre, 1):
        clock.status(f"pre-training {i}/{len(todo_pre)}: {entry.label} ({entry.recipe})",
                     len(todo_pre) - i + 1, todo_ft)
        ran["probe"] += not (root / entry.label / "probe.json").is_file()
        pretrain_entry(entry, budget, root / entry.label, probe_steps, progress, say)
        ran["pretrain"] += 1
        report()
    inits = finetune_inits(entries, root, baseline) if todo_ft else {}
    recipes_by_label = {e.label: e.recipe for e in entries}
    for i, (label, task, seed) in enumerate(todo_ft, 1):
        clock.status(f"fine-tuning {i}/{len(todo_ft)}: {label} on {get_task(task).display_name}, seed {seed}",
                     0, todo_ft[i - 1:])
        base = next((e.cfg.train for e in entries if e.label == label), entries[0].cfg.train)
        run_dir = root / label / f"{task}-seed{seed}"
        resume = prepare_folder(run_dir)
        started = time.time()
        result = finetune_run(task, run_dir, inits[label], seeds=[seed], train_limit=finetune.train_limit,
                              resume=resume, progress=progress,
                              **finetune_settings(finetune, base, label, recipes_by_label.get(label, ""))).result
        clock.finished_finetune(task, time.time() - started)
        ran["finetune"] += 1
        shown = "  ".join(f"{k}={v:.4f}" for k, v in result["metrics"].items())
        say(f"{label} {result['task']} seed {seed}: {shown}")
        report()
    results = report()
    say(f"done: {out / 'results.md'}, {out / 'results.json'}, {out / 'comparison.png'}")
    return {**results, "ran": ran}
