"""README.md model cards for exported Hugging Face folders (`ember convert --to-hf`, `ember export --format hf`).

The card follows the Hub's convention (https://huggingface.co/docs/hub/model-cards): YAML
metadata between ``---`` lines (language, license, library_name, pipeline_tag, tags, datasets and
a ``model-index`` whose metrics carry the values of the run's results.json), then Markdown: what
the model is, how it was trained (recipe, data, steps, time, hardware as the run recorded them),
the evaluation table and how to load it. Only what the run folder records is written; the
license is left for the user (it depends on the data and the starting checkpoint, which ember
cannot know), as a commented line to fill in before sharing.
"""

from __future__ import annotations

import json
from pathlib import Path

import yaml

from ember.runs.folder import last_evaluation

# built-in task -> (language, HF dataset id, dataset config, the Hub's task type, a readable name)
TASKS = {
    "sst2": ("en", "nyu-mll/glue", "sst2", "text-classification", "GLUE SST-2"),
    "cola": ("en", "nyu-mll/glue", "cola", "text-classification", "GLUE CoLA"),
    "mrpc": ("en", "nyu-mll/glue", "mrpc", "text-classification", "GLUE MRPC"),
    "rte": ("en", "nyu-mll/glue", "rte", "text-classification", "GLUE RTE"),
    "stsb": ("en", "nyu-mll/glue", "stsb", "text-classification", "GLUE STS-B"),
    "qnli": ("en", "nyu-mll/glue", "qnli", "text-classification", "GLUE QNLI"),
    "snli": ("en", "stanfordnlp/snli", None, "text-classification", "SNLI"),
    "nsmc": ("ko", "e9t/nsmc", None, "text-classification", "NSMC"),
    "rusentiment": ("ru", None, None, "text-classification", "RuSentiment"),
    "conll2003": ("en", "eriktks/conll2003", None, "token-classification", "CoNLL-2003"),
    "squad": ("en", "rajpurkar/squad", None, "question-answering", "SQuAD v1.1"),
    "squad2": ("en", "rajpurkar/squad_v2", None, "question-answering", "SQuAD v2.0"),
}
# ember's metric names -> the Hub's metric ids (https://huggingface.co/metrics)
METRIC_IDS = {"mcc": "matthews_correlation", "pearson": "pearsonr", "spearman": "spearmanr", "em": "exact_match",
              "exact": "exact_match", "f1_macro": "f1"}
SPLITS = {"dev": "validation", "test": "test", "train": "train"}
AUTO_CLASSES = {"text-classification": "AutoModelForSequenceClassification",
                "token-classification": "AutoModelForTokenClassification",
                "question-answering": "AutoModelForQuestionAnswering", "fill-mask": "AutoModelForMaskedLM",
                "text-generation": "AutoModelForCausalLM", "text2text-generation": "AutoModelForSeq2SeqLM"}


def pipeline_tag(architecture: str) -> str:
    """The Hub's pipeline for an exported architecture name."""
    for suffix, tag in (("ForSequenceClassification", "text-classification"),
                        ("ForTokenClassification", "token-classification"),
                        ("ForQuestionAnswering", "question-answering"), ("ForMaskedLM", "fill-mask"),
                        ("ForPreTraining", "fill-mask"), ("LMHeadModel", "text-generation"),
                        ("ForCausalLM", "text-generation"), ("ForConditionalGeneration", "text2text-generation")):
        if architecture.endswith(suffix):
            return tag
    return "feature-extraction"


def _read(path: Path) -> dict:
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return {}


def _trainer_state(run_dir: Path) -> dict:
    """The newest checkpoint's trainer_state.json (steps, time, tokens, hardware), if any."""
    steps = sorted((p for p in (run_dir / "checkpoints").glob("step-*") if p.name[5:].isdigit()),
                   key=lambda p: int(p.name[5:]))
    if steps:
        return _read(steps[-1] / "trainer_state.json")
    from ember.runs.checkpoint import ENDED_TRAINER_STATE  # a sweep trial's, its checkpoints removed

    return _read(run_dir / ENDED_TRAINER_STATE)


def export_name(out_dir: Path) -> str:
    """The folder's name; inside ``ember.fileio.atomic_folder``'s ".NAME.XXXX.tmp", the NAME it becomes."""
    name = out_dir.name
    if name.startswith(".") and name.endswith(".tmp"):
        return name[1:-4].rsplit(".", 1)[0]
    return name


def _number(value) -> str:
    return f"{value:.4f}" if isinstance(value, float) else str(value)


def write_model_card(run_dir: Path, out_dir: Path, cfg, hf_config: dict) -> Path:
    """OUT/README.md for the export of ``run_dir`` (its RunConfig ``cfg``) as ``hf_config``."""
    results = _read(run_dir / "results.json")
    state = _trainer_state(run_dir)
    architecture = (hf_config.get("architectures") or ["?"])[0]
    pipeline = pipeline_tag(architecture)
    task = cfg.task.name if cfg.kind == "finetune" else ""
    corpus = f"{Path(cfg.data.prepared).name} (`ember prepare`)" if cfg.data.prepared else "its corpus"
    language, dataset, config, _, dataset_name = TASKS.get(task, (cfg.task.language or None, None, None, pipeline,
                                                                  task or corpus))
    name = export_name(out_dir)
    meta: dict = {}
    if cfg.task.language or language:
        meta["language"] = [cfg.task.language or language]
    meta.update({"library_name": "transformers", "pipeline_tag": pipeline,
                 "tags": sorted({"ember", cfg.model.family, pipeline} | ({task} if task else set())
                                | ({"glue"} if dataset == "nyu-mll/glue" else set()))})
    if dataset:
        meta["datasets"] = [dataset]
    evaluations = _evaluations(results, state, run_dir)
    if evaluations:
        dataset_entry = {"name": dataset_name, "type": dataset or task or "custom"}
        if config:
            dataset_entry["config"] = config
        meta["model-index"] = [{"name": name, "results": [
            {"task": {"type": pipeline}, "dataset": {**dataset_entry, "split": SPLITS.get(split, split)},
             "metrics": [{"type": METRIC_IDS.get(k, k), "value": float(v), "name": k} for k, v in metrics.items()]}
            for split, metrics in evaluations.items()]}]
    front = yaml.safe_dump(meta, sort_keys=False, allow_unicode=True)
    card = ["---", front.rstrip(), "# license: fill in before sharing (it depends on the data and the starting "
            "checkpoint's licence), e.g. apache-2.0", "---", "", f"# {name}", ""]
    what = (f"A {cfg.model.family} model ({cfg.model.num_layers} layers, hidden size {cfg.model.hidden_size}, "
            f"{cfg.model.num_heads} heads) exported by ember as `{architecture}`")
    if cfg.kind == "finetune":
        what += f", fine-tuned on {dataset_name} from `{cfg.task.init or 'random'}`."
    else:
        what += f", pre-trained with the `{cfg.objective}` objective."
    card += [what, "", "## Training", ""] + _recipe(cfg, results, state) + [""]
    if evaluations:
        card += ["## Evaluation", "", "| split | metric | value |", "|---|---|---|"]
        for split, metrics in evaluations.items():
            card += [f"| {split} | {k} | {_number(v)} |" for k, v in metrics.items()]
        if results:
            card += ["", f"The weights are the best on {results.get('split', 'dev')} by "
                     f"{results.get('main_metric', 'its main metric')} (evaluated after each epoch); other splits "
                     "were scored once with those weights."]
        card.append("")
    auto = AUTO_CLASSES.get(pipeline, "AutoModel")
    card += ["## How to use", "", "```python", f"from transformers import {auto}, AutoTokenizer", "",
             f'tokenizer = AutoTokenizer.from_pretrained("{name}")  # this folder',
             f'model = {auto}.from_pretrained("{name}")  # {architecture}', "```", ""]
    path = out_dir / "README.md"
    path.write_text("\n".join(card), encoding="utf-8")
    return path


def _evaluations(results: dict, state: dict, run_dir: Path) -> dict:
    """split -> {metric: value}: results.json's (fine-tuning), else the last held-out evaluation."""
    out = {}
    if results.get("metrics"):
        out[results.get("split", "dev")] = {k: v for k, v in results["metrics"].items() if isinstance(v, (int, float))}
        for split, metrics in results.get("other_splits", {}).items():
            out[split] = {k: v for k, v in metrics.items() if isinstance(v, (int, float))}
        return out
    last = last_evaluation(run_dir)
    return {"held-out": last} if last else {}


def _recipe(cfg, results: dict, state: dict) -> list[str]:
    t = cfg.train
    rows = [("learning rate", f"{t.lr:g} ({t.optimizer}, {t.schedule} schedule, warm-up "
             + (f"{t.warmup_steps} steps" if t.warmup_steps else f"{t.warmup_ratio:g} of the steps") + ")"),
            ("batch size", t.batch_size), ("weight decay", t.weight_decay), ("seed", t.seed)]
    if cfg.kind == "finetune":
        rows += [("epochs", f"{cfg.task.epochs:g}"), ("max length", cfg.task.max_length),
                 ("data", f"{cfg.task.train_split} ({results.get('train_examples', '?')} examples); selected on "
                          f"{cfg.task.eval_split}")]
    else:
        rows += [("sequence length", cfg.data.max_seq_length), ("data", cfg.data.prepared or "?")]
    steps = results.get("steps", state.get("step"))
    if steps is not None:
        rows.append(("steps", f"{steps}" + (f" (best at {results['best_step']})" if results.get("best_step") else "")))
    if state.get("elapsed"):
        seconds = state["elapsed"]
        rows.append(("training time", f"{seconds / 60:.1f} min" if seconds >= 60 else f"{seconds:.1f} s"))
    if state.get("tokens"):
        rows.append(("tokens seen", f"{state['tokens']:,}"))
    hardware = state.get("hardware") or {}
    device = hardware.get("device", t.device)
    detail = ", ".join(f"{v}" for v in (hardware.get("cpu"), hardware.get("threads") and f"{hardware['threads']} "
                                        "thread(s)", hardware.get("torch") and f"torch {hardware['torch']}") if v)
    rows.append(("hardware", f"{device}, {t.dtype}" + (f" ({detail})" if detail else "")))
    return ["| setting | value |", "|---|---|"] + [f"| {k} | {v} |" for k, v in rows]
