"""``ember.finetune``: a task and a starting point -> fine-tuned run folder(s), one per seed.

The task's own defaults come first (BERT's, Devlin et al. 2019 §4 and App. A.3: batch 32,
3 epochs, 10% warm-up, max length 128, lr 2e-5; NER and SQuAD have theirs; a T5 model's
text-to-text tasks T5's, ember.tasks.text2text.task), then the
keyword settings, then ``section.key=value`` overrides. A pre-trained starting point fixes the
model's shape: ``model.*`` overrides may change only dropout and initialisation then.
`ember finetune`, `ember compare`, `ember glue` and the quickstart all fine-tune through here.
"""

from __future__ import annotations

import json
from pathlib import Path

from ember.api.arguments import folder_arg, strings_arg
from ember.api.caller_state import keeps_caller_state
from ember.api.results import RunResult
from ember.config import ModelConfig, RunConfig
from ember.errors import EmberError
from ember.fileio import atomic_write_text

# keyword setting -> the config field it sets
SETTINGS = {
    "lr": "train.lr", "batch_size": "train.batch_size", "warmup_ratio": "train.warmup_ratio",
    "schedule": "train.schedule", "device": "train.device", "dtype": "train.dtype",
    "max_time": "train.max_time", "num_threads": "train.num_threads",
    "epochs": "task.epochs", "max_length": "task.max_length", "train_split": "task.train_split",
    "eval_split": "task.eval_split", "features": "task.features", "feature_layers": "task.feature_layers",
    "feature_combine": "task.feature_combine",
    "layer_lr_decay": "task.layer_lr_decay", "gradual_unfreeze": "task.gradual_unfreeze",
    "patience": "task.patience",
    # multi-task mixtures (ember.train.mixture; T5 §3.5.2)
    "mixing": "task.mixing", "mixing_limit": "task.mixing_limit", "mixing_temperature": "task.mixing_temperature",
    # knowledge graphs (ember.tasks.families.knowledge): K-BERT's triples, ERNIE's entity embeddings
    "knowledge": "knowledge.graph", "relations": "knowledge.relations", "max_triples": "knowledge.max_triples",
    "entities": "knowledge.entities", "fusion_layers": "knowledge.fusion_layers",
}
# ULMFiT (Howard & Ruder 2018): discriminative lr (divide by 2.6 per layer, §3.2), slanted
# triangular rates (§3.2) and gradual unfreezing (§3.3); explicit settings win.
ULMFIT = {"layer_lr_decay": 1 / 2.6, "schedule": "stlr", "gradual_unfreeze": True}
# Model settings that leave the weights' shapes and meaning alone: the only ones a pre-trained
# init can take from overrides (the rest come from its checkpoint).
FREE_MODEL_SETTINGS = ("dropout", "attention_dropout", "initializer_range",
                       "embedding_dropout", "lstm_pooling")  # the LSTM's (Dai & Le): a regulariser, its read-out


def model_with_overrides(model_cfg: ModelConfig, overrides: list[str], pretrained: bool,
                         free: tuple[str, ...] = FREE_MODEL_SETTINGS) -> ModelConfig:
    """Apply ``model.K=V`` overrides to the starting point's model config (random init: any; a
    pre-trained one: only the ``free`` settings)."""
    from ember.config import apply_overrides, run_config_from_dict, to_dict

    sets = [o for o in overrides if o.startswith("model.")]
    if not sets:
        return model_cfg
    values = apply_overrides(to_dict(RunConfig(kind="finetune", model=model_cfg)), sets)
    changed = run_config_from_dict(values, where="--set").model
    if pretrained:
        fixed = [k for k in to_dict(model_cfg) if k not in free and getattr(changed, k) != getattr(model_cfg, k)]
        if fixed:
            raise EmberError(f"--set model.{fixed[0]}: a pre-trained init fixes the model's shape "
                             f"(its checkpoint has {fixed[0]}={getattr(model_cfg, fixed[0])!r}); only "
                             f"{', '.join('model.' + k for k in free)} can change here")
    return changed


def finetune_config(task: str, model_cfg: ModelConfig, init: str = "random", seed: int | None = None,
                    overrides: list[str] | tuple[str, ...] = (), ulmfit: bool = False, **settings) -> RunConfig:
    """The RunConfig of one fine-tuning run (see the module docstring)."""
    import dataclasses

    from ember.config import apply_overrides, run_config_from_dict, to_dict
    from ember.tasks.base import get_adapter
    from ember.tasks.readers.glue import BertHParams
    from ember.train.checks import refuse_step_budget

    unknown = sorted(set(settings) - set(SETTINGS))
    if unknown:
        raise EmberError(f"unknown fine-tuning setting(s) {unknown}; known: {', '.join(sorted(SETTINGS))} "
                         "(or pass section.key=value overrides)")
    refuse_step_budget(overrides, None, "fine-tuning")
    chosen = {**(ULMFIT if ulmfit else {}), **{k: v for k, v in settings.items() if v is not None}}
    dotted = [f"{SETTINGS[k]}={v}" for k, v in chosen.items()]
    dotted += [o for o in overrides if not o.startswith("model.")]
    dotted += [f"train.seed={seed}"] if seed is not None else []
    values = to_dict(RunConfig(kind="finetune"))
    # the family's form of the task (GPT-1's, T5's text-to-text), which may depend on the task
    # settings asked for (BART: task.text2text), so its defaults are those of the run's form
    asked = run_config_from_dict(apply_overrides(values, dotted), where="fine-tuning settings").task
    adapter = get_adapter(task, model_cfg, settings=asked)
    hp = getattr(adapter, "hparams", BertHParams())
    values["train"].update(lr=hp.learning_rate, batch_size=hp.batch_size, warmup_ratio=hp.warmup_ratio,
                           weight_decay=0.01, eval_every=0, save_every=0, log_every=20, adam_eps=1e-8)
    # A family's own optimisation defaults (T5: Adafactor at a constant rate, Raffel et al. 2020 §3.1.3)
    values["train"].update(getattr(adapter, "train_defaults", {}))
    values["task"].update(name=adapter.name, max_length=hp.max_length, epochs=hp.epochs, init=str(init))
    cfg = run_config_from_dict(apply_overrides(values, dotted), where="fine-tuning settings")
    return dataclasses.replace(cfg, model=model_cfg)


@keeps_caller_state
def finetune(task: str | list = "", out: str | Path | None = None, init="random", *, tasks=None,
             model: str = "", tokenizer: str = "",
             seeds: list[int] | None = None, train_limit: int | None = None,
             overrides: list[str] | tuple[str, ...] = (), resume: bool = False, overwrite: bool = False,
             progress: bool = True, ulmfit: bool = False, train=None, dev=None, test=None,
             column: str | None = None, pair_column: str | None = None, label_column: str | None = None,
             **settings) -> RunResult:
    """Fine-tune on ``task`` from ``init`` (a pre-training run, an HF folder, ``"random"`` with
    ``model``/``tokenizer``, or an ``ember.runs.init.Init``) into ``out``; with several ``seeds``,
    one run per seed in ``out/seed-N`` and their summary in ``out/summary.json``.

    ``task`` is a built-in task (sst2, conll2003, squad2, ...) or one of your own data's kinds
    (classify, pair, regression, tag, qa, text2text: ``ember.tasks.custom``), whose labels are discovered
    from the training data and kept in the run (RUN/task.json); text2text (input -> target texts)
    needs a T5 run.

    ``train`` / ``dev`` / ``test``: a file (CSV, TSV, JSONL; CoNLL columns for tag, SQuAD JSON for
    qa) or data from Python (a pandas DataFrame, a ``datasets.Dataset``, a dict of columns, a list
    of (text, label) or (text, text_pair, label) tuples or of dicts). A custom kind needs
    ``train`` and ``dev`` (``test`` is scored once with the best weights); a built-in task takes
    them in place of its own splits. Columns: ``column`` / ``pair_column`` / ``label_column``
    (defaults: the usual names, e.g. text/sentence, text_pair/sentence2, label). Data from Python
    is written to ``out/inputs/`` first (``ember.api.task_data``), so the run can be resumed,
    evaluated and served like any other.

    >>> result = ember.finetune("sst2", "runs/sst2", init="runs/bert-mini", lr=1e-4,
    ...                         seeds=[1, 2, 3])  # doctest: +SKIP
    >>> result.summary["accuracy"]["mean"]  # doctest: +SKIP
    >>> ember.finetune("classify", "runs/tickets", init="runs/bert-mini", train="train.csv",
    ...                dev="dev.csv", column="body", label_column="queue")  # doctest: +SKIP

    Multi-task (docs/multitask.md): ``tasks=["sst2", "rte", "stsb"]`` (or ``task`` as a list) trains one
    shared encoder with a head per task, one task per batch, drawn by ``mixing`` ("proportional",
    "temperature", "equal"; ``mixing_limit``, ``mixing_temperature``: T5 §3.5.2); each task's best
    weights and results land in ``out/tasks/NAME``. Your own files join as ``"NAME=KIND:TRAIN:DEV[:TEST][:prefix=TEXT]"``.

    Knowledge (docs/knowledge.md): ``knowledge="wordnet.tsv"`` injects triples K-BERT's way
    (``max_triples``, ``relations``), ``entities="wordnet-transe"`` fuses TransE entity
    embeddings into the top ``fusion_layers`` ERNIE's way; either or both, any encoder.
    """
    from ember.runs.init import load_init
    from ember.tasks.metrics.classification import summarize_seeds
    from ember.train.finetune import run_finetuning
    from ember.train.tracking import finish_tracking

    from ember.train.distributed import one_process

    one_process("finetune")  # before a custom task's inputs are copied into out
    out, overrides = folder_arg(out, "out"), strings_arg(overrides, "overrides")
    seed = settings.pop("seed", None)  # one run's seed, as the CLI's --seed
    if seed is not None:
        if seeds:
            raise EmberError("pass seed= (one run) or seeds= (one run each), not both")
        seeds = [seed]
    if tasks is not None or isinstance(task, (list, tuple)):
        if tasks is not None and task:
            raise EmberError("pass task= (one task) or tasks= (several sharing one encoder), not both")
        if any(d is not None for d in (train, dev, test, column, pair_column, label_column)):
            raise EmberError("train= / dev= / test= and the column options are for one task; in tasks= your own "
                             "files are \"NAME=KIND:TRAIN:DEV[:TEST]\" or a dict with name, kind, train, dev, test")
        return _finetune_tasks(task if tasks is None else tasks, out, init, model, tokenizer, seeds, train_limit,
                               overrides, resume, overwrite, progress, ulmfit, settings)
    if not task:
        raise EmberError("finetune() needs a task (task=\"sst2\") or several (tasks=[\"sst2\", \"rte\"])")
    seeds = list(seeds) if seeds else [None]
    if len(set(seeds)) != len(seeds):
        raise EmberError(f"seeds {seeds} repeat a seed; give distinct seeds, e.g. 1,2,3")
    if not overwrite:
        _check_seed_layout(out, len(seeds))
    if any(d is not None and not _is_table_file(d) for d in (train, dev, test)) and len(seeds) == 1:
        # out is the run folder: clear an old run now, before data from Python goes into out/inputs
        from ember.runs.folder import prepare_run_dir

        prepare_run_dir(out, resume, overwrite)
        overwrite = False
    custom = task_adapter(task, out, train, dev, test, column, pair_column, label_column, resume)
    start = load_init(init, model, tokenizer)
    model_cfg = model_with_overrides(start.model, list(overrides), pretrained=start.state is not None)
    init_id = init if isinstance(init, (str, Path)) else "random" if start.state is None else "given"
    if custom is not task:  # your own data: the adapter holds it
        task = custom
    elif train is not None or dev is not None:
        settings.update(_write_inputs(task, out, train, dev, settings, resume, column, pair_column, label_column))
    elif (column, pair_column, label_column) != (None, None, None):
        raise EmberError("column= / pair_column= / label_column= name the columns of train= / dev= data; "
                         "pass the data too")
    results = []
    for seed in seeds:
        cfg = finetune_config(task, model_cfg, str(init_id), seed, overrides, ulmfit, **settings)
        run_dir = out / f"seed-{cfg.train.seed}" if len(seeds) > 1 else out
        result = run_finetuning(cfg, run_dir, start.state, start.tokenizer, train_limit, overwrite=overwrite,
                                resume=resume, progress=progress, task=None if isinstance(task, str) else task)
        results.append(result)
        finish_tracking(run_dir)  # train.trackers=mlflow: the folder's files and final metrics, run ended
        _report(result, cfg, run_dir)
    if len(results) == 1:
        return RunResult(out, results[0]["metrics"], results)
    summary = {"task": results[0]["task"], "seeds": seeds, "metrics": summarize_seeds(results)}
    if "other_splits" in results[0]:  # e.g. CoNLL-2003 test
        summary["other_splits"] = {split: summarize_seeds([{"metrics": r["other_splits"][split]} for r in results])
                                   for split in results[0]["other_splits"]}
    out.mkdir(parents=True, exist_ok=True)
    atomic_write_text(out / "summary.json", json.dumps(summary, indent=2))
    splits = {results[0]["split"]: summary["metrics"], **summary.get("other_splits", {})}
    for split, metrics in splits.items():
        for name, s in metrics.items():
            spread = f" ± {s['std']:.4f}" if s["std"] is not None else ""
            print(f"{summary['task']} {split} {name}: mean {s['mean']:.4f}{spread} "
                  f"(median {s['median']:.4f}, {len(seeds)} seeds)")
    means = {name: s["mean"] for name, s in summary["metrics"].items()}
    return RunResult(out, means, results, summary["metrics"])


def _finetune_tasks(tasks, out: Path, init, model: str, tokenizer: str, seeds, train_limit, overrides,
                    resume: bool, overwrite: bool, progress: bool, ulmfit: bool, settings: dict) -> RunResult:
    """The multi-task form of ``finetune`` (``ember.api.multitask``, ``ember.train.multitask``)."""
    from ember.api.multitask import parse_tasks, run_tasks, task_adapters
    from ember.runs.init import load_init
    from ember.tasks.base import get_adapter

    if seeds and len(seeds) > 1:
        raise EmberError("a multi-task run trains one seed; run one --out per seed (--seed N)")
    if ulmfit:
        raise EmberError("--ulmfit is a single-task option; multi-task runs train the shared encoder as a whole")
    parsed = parse_tasks(tasks)
    start = load_init(init, model, tokenizer)
    model_cfg = model_with_overrides(start.model, list(overrides), pretrained=start.state is not None)
    adapters, raw = task_adapters(parsed, model_cfg)
    init_id = init if isinstance(init, (str, Path)) else "random" if start.state is None else "given"
    # the first task's defaults (BERT's for every GLUE task: Devlin et al. 2019, §4), then the settings
    cfg = finetune_config(raw[0], model_cfg, str(init_id), seeds[0] if seeds else None, overrides, False, **settings)
    # each task in the form the run's task settings ask for (BART: task.text2text picks text to text over heads)
    adapters = [(name, get_adapter(task, model_cfg, settings=cfg.task)) for (name, _), task in zip(adapters, raw)]
    return run_tasks(cfg, out, start, adapters, train_limit, resume, overwrite, progress)


def _check_seed_layout(out: Path, n_seeds: int) -> None:
    """One seed's run is ``out`` itself, several seeds' runs are ``out/seed-N``: a folder laid out one
    way is refused to the other (``--seeds 1 --resume`` into a multi-seed folder trained a new run
    beside its seed folders, and the next --resume compared against that stray run)."""
    if not out.is_dir():
        return
    seed_runs = sorted(p.name for p in out.glob("seed-*") if (p / "config.yaml").is_file())
    if n_seeds == 1 and (seed_runs or (out / "summary.json").is_file()):
        one = out / (seed_runs[0] if seed_runs else "seed-1")
        raise EmberError(f"{out} holds the runs of several seeds ({', '.join(seed_runs) or 'summary.json'}); one "
                         f"seed's run is its own folder (--out {one}), or pass all the seeds (e.g. --seeds 1,2,3) "
                         "to resume or extend them")
    if n_seeds > 1 and (out / "config.yaml").is_file():
        raise EmberError(f"{out} holds the run of one seed; the runs of several seeds go in seed-N folders of a "
                         "folder of their own: choose another --out (or --overwrite)")


def _is_file(data) -> bool:
    """A path (a file, or a custom task's `datasets` folder) rather than rows from Python."""
    return isinstance(data, (str, Path))


def _is_table_file(data) -> bool:
    """A file for a built-in task to read as its split (a `datasets` folder is read as rows)."""
    return _is_file(data) and not Path(data).is_dir()


def _write_inputs(task: str, out: Path, train, dev, settings: dict, resume: bool, *columns) -> dict:
    """Write train= / dev= data (or name train= / dev= files) for a built-in task; the split
    settings that read them."""
    from ember.api.task_data import task_spec, write_split
    from ember.runs.folder import RUN_INPUTS

    splits = {}
    for data, name, setting in ((train, "train", "train_split"), (dev, "dev", "eval_split")):
        if data is None:
            continue
        if settings.get(setting) is not None:
            raise EmberError(f"{name}= and {setting}= both give the {name} data; pass one of them")
        if _is_table_file(data):  # a file in the task's own layout, as --train-split FILE
            splits[setting] = str(Path(data).resolve())
            continue
        path = write_split(task_spec(task), data, out / RUN_INPUTS / f"{name}.tsv", f"{name}= data", *columns,
                           resume=resume)
        splits[setting] = str(path.resolve())
    return splits


def _custom_file(kind: str, data, out: Path, name: str, resume: bool, column, pair_column, label_column):
    """A custom task's ``name`` split as a file: a path as given; rows from Python written to
    out/inputs/NAME.jsonl (table kinds only) under the column names the task then reads: those
    given, else text / text_pair / label (the custom tasks' first defaults)."""
    if data is None or _is_file(data):
        return data
    from ember.api.data import rows
    from ember.api.task_data import write_input
    from ember.runs.folder import RUN_INPUTS

    if kind == "text2text":  # an input and a target text per row
        from ember.tasks.text2text.custom import INPUT_COLUMNS, TARGET_COLUMNS

        roles = {column or "input": (column, INPUT_COLUMNS, True),
                 label_column or "target": (label_column, TARGET_COLUMNS, True)}
    elif kind not in ("classify", "pair", "regression"):
        raise EmberError(f"{name}= data from Python works for classify, pair, regression and text2text; a {kind} "
                         f"task reads its own file format ({'CoNLL columns or JSONL' if kind == 'tag' else 'SQuAD JSON'})")
    else:
        roles = {column or "text": (column, ("text", "sentence", "sentence1"), True)}
        if kind != "classify" or pair_column is not None:
            roles[pair_column or "text_pair"] = (pair_column, ("text_pair", "sentence2", "hypothesis"), kind == "pair")
        roles[label_column or "label"] = (label_column, ("label", "score", "target"), True)
    lines = "".join(json.dumps(row, ensure_ascii=False) + "\n" for row in rows(data, roles, f"{name}= data"))
    return write_input(out / RUN_INPUTS / f"{name}.jsonl", lines, f"{name}= data", resume)


def task_adapter(task, out: Path, train=None, dev=None, test=None, column=None, pair_column=None,
                 label_column=None, resume: bool = False):
    """``task`` itself, or the adapter of a custom task on the given data (read and checked now,
    before any run folder is touched); resuming without data, the run's own task.json."""
    from ember.tasks.base import CUSTOM_TASKS, get_adapter, read_task_record

    kind = task.lower() if isinstance(task, str) else ""
    if kind not in CUSTOM_TASKS:
        if test is not None:
            raise EmberError(f"test= is for your own data (--task {'|'.join(CUSTOM_TASKS)}); {task} scores its "
                             "own test split where it has one")
        for data, name in ((train, "train"), (dev, "dev")):
            if _is_table_file(data) and not Path(data).is_file():
                raise EmberError(f"{name}={data}: no such file (a {task} file in its own layout, or data from "
                                 "Python: a DataFrame, a datasets.Dataset, a list of rows)")
        return task
    if resume and train is None and dev is None:
        runs = [out, *sorted(out.glob("seed-*"))]  # one run, or one per seed
        record = next((r for r in map(read_task_record, runs) if r is not None), None)
        if record is not None and record.get("kind") == kind:
            return get_adapter(record)
    from ember.tasks.custom import custom_task

    files = [_custom_file(kind, data, out, name, resume, column, pair_column, label_column)
             for data, name in ((train, "train"), (dev, "dev"), (test, "test"))]
    return custom_task(kind, *files, column, pair_column, label_column)


def _report(result: dict, cfg: RunConfig, run_dir: Path) -> None:
    """The lines `ember finetune` prints after each seed."""
    metrics = "  ".join(f"{k}={v:.4f}" for k, v in result["metrics"].items())
    print(f"{result['task']} {result['split']} (seed {cfg.train.seed}): {metrics}")
    if result.get("stopped_early"):
        print(f"stopped early at step {result['steps']} of {result['max_steps']} (patience "
              f"{cfg.task.patience}); best step {result['best_step']}")
    if result.get("scalar_mix", {}).get("weights"):
        weights = " ".join(f"{w:.3f}" for w in result["scalar_mix"]["weights"])
        print(f"learned layer weights (embeddings first): {weights}  gamma={result['scalar_mix']['gamma']:.3f}")
    if result.get("tuned"):
        settings = "  ".join(f"{k}={v:.4f}" for k, v in result["tuned"].items())
        print(f"tuned on {result['split']}: {settings} (saved in {run_dir}/tuned.json; "
              "ember evaluate/predict use it; the metrics above use it too)")
    for split, other in result.get("other_splits", {}).items():
        metrics = "  ".join(f"{k}={v:.4f}" for k, v in other.items())
        print(f"{result['task']} {split} (seed {cfg.train.seed}, best-on-{result['split']} weights): {metrics}")
