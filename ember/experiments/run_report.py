"""`ember report`: what a run folder (or several) holds, read back for a person to look at.

``find_runs(path)`` accepts a run folder, or any folder holding runs (the seed folders of
``ember finetune --seeds``, the OUT of ``ember compare`` or ``ember glue``); ``summarize`` reads
one run: its config.yaml, the recipe (``ember compare`` records it beside the run), the data
(the prepared corpus's meta.json, or the task's splits), tokens seen, steps and training time
(the newest checkpoint's trainer state), metrics.jsonl (training curves, held-out
evaluations, tokens/s over time), results.json (fine-tuning) and the checkpoints. Nothing is
loaded into a model: a report of a large run is as quick as one of a tiny run.
``write_report`` renders them as one self-contained HTML file (``ember.experiments.report_page``).
"""

from __future__ import annotations

import json
import math
import re
from pathlib import Path

from ember.errors import EmberError

NOT_RUNS = ("checkpoints", "probe", "inputs", "tb")  # folders inside a run or a comparison that are no runs
RECORD_KEYS = ("step", "split", "elapsed")


def find_runs(path: str | Path, depth: int = 3) -> list[Path]:
    """Run folders at or under ``path`` (a folder with config.yaml is a run), sorted."""
    path = Path(path)
    if not path.is_dir():
        raise EmberError(f"{path} is not a folder; pass a run folder (or a folder of runs: the OUT of "
                         "`ember finetune --seeds`, `ember compare`, `ember glue`)")
    found = _runs_under(path, depth)
    if not found:
        raise EmberError(f"{path} holds no run folder (a folder with config.yaml) within {depth} levels; pass "
                         "the folder `ember pretrain` / `ember finetune` wrote")
    return found


def has_runs(path: Path) -> bool:
    return Path(path).is_dir() and bool(_runs_under(Path(path), 3))


def _runs_under(path: Path, depth: int) -> list[Path]:
    if (path / "config.yaml").is_file():
        return [path]
    if depth == 0:
        return []
    found: list[Path] = []
    for child in sorted(p for p in path.iterdir() if p.is_dir() and p.name not in NOT_RUNS):
        if child.is_symlink() and path.resolve() in child.resolve().parents:
            continue  # a link to a run listed anyway (a sweep's best -> trials/trial-N)
        found += _runs_under(child, depth - 1)
    return found


def slug(name: str) -> str:
    """An HTML id for a run name ("bert-mini/sst2-seed1" -> "run-bert-mini-sst2-seed1")."""
    return "run-" + re.sub(r"[^A-Za-z0-9_-]+", "-", name).strip("-")


def _json(path: Path):
    try:
        return json.loads(path.read_text(encoding="utf-8")) if path.is_file() else None
    except ValueError:
        return None


def _parameters(weights: Path) -> int | None:
    if not weights.is_file():
        return None
    from safetensors import safe_open

    try:
        with safe_open(str(weights), "pt") as fh:
            return sum(math.prod(fh.get_slice(k).get_shape()) for k in fh.keys())
    except Exception as exc:  # safetensors' own error types for a truncated or foreign file
        raise EmberError(f"{weights}: cannot read weights ({exc}); the file is damaged or partial") from None


def _checkpoints(run_dir: Path) -> list[dict]:
    """Each checkpoint: step, size, time, and whether its files have the manifest's sizes (the
    SHA-256 check of `--resume` reads every byte; a report only looks)."""
    from ember.runs.checkpoint import list_checkpoints

    out = []
    for path in list_checkpoints(run_dir):
        manifest = _json(path / "manifest.json")
        files = [p for p in path.iterdir() if p.is_file()]
        if manifest is None:
            state = "incomplete (no manifest.json)"
        elif any(not (path / n).is_file() or (path / n).stat().st_size != m["bytes"] for n, m in manifest.items()):
            state = "damaged (a file differs from manifest.json)"
        else:
            state = "complete"
        trainer = _json(path / "trainer_state.json") or {}
        out.append({"name": path.name, "step": trainer.get("step"), "tokens": trainer.get("tokens"),
                    "bytes": sum(p.stat().st_size for p in files), "modified": max((p.stat().st_mtime for p in files),
                                                                                  default=None), "state": state})
    return out


def _data(run_dir: Path, cfg, results: dict | None) -> dict:
    """What the run trained on: the prepared corpus (pre-training) or the task's splits."""
    if cfg.kind == "finetune":
        info = {"train split": cfg.task.train_split, "evaluation split": cfg.task.eval_split,
                "max length": cfg.task.max_length, "epochs": cfg.task.epochs, "init": cfg.task.init or "random"}
        if results:
            info["training examples"] = results.get("train_examples")
        return info
    info = {"corpus": cfg.data.prepared or "(none recorded)", "sequence length": cfg.data.max_seq_length}
    meta = _json(Path(cfg.data.prepared) / "meta.json") if cfg.data.prepared else None
    if meta:
        for split, counts in meta.get("splits", {}).items():
            info[f"{split} tokens"] = counts.get("num_tokens")
            info[f"{split} documents"] = counts.get("num_docs")
        tok = meta.get("tokenizer", {})
        info["tokenizer"] = f"{tok.get('kind', '?')}, {tok.get('vocab_size', '?')} tokens"
        info["sources"] = ", ".join(meta.get("inputs", []))
    return info


def summarize(run_dir: str | Path, name: str) -> dict:
    """Everything the report shows of one run (plain data)."""
    from ember.runs.checkpoint import ENDED_TRAINER_STATE
    from ember.runs.folder import load_run_config
    from ember.train.logging import MetricsLogger

    run_dir = Path(run_dir)
    cfg = load_run_config(run_dir)
    records = MetricsLogger.read(run_dir / "metrics.jsonl")
    results = _json(run_dir / "results.json")
    checkpoints = _checkpoints(run_dir)
    last = next((c for c in reversed(checkpoints) if c["state"] == "complete"), None)
    # without checkpoints (a sweep trial's are removed when it ends) the newest one's state is kept in the run
    trainer = _json(run_dir / "checkpoints" / last["name"] / "trainer_state.json") if last else \
        _json(run_dir / ENDED_TRAINER_STATE)
    pretrain = _json(run_dir.parent / "pretrain.json") if run_dir.name == "pretrain" else None  # ember compare
    asked = _json(run_dir / "recipe.json") or {}  # ember.pretrain's record of the recipe and overrides
    train = [r for r in records if r.get("split") == "train"]
    evals = [r for r in records if r.get("split") == "eval"]
    rates = [r["tokens_per_s"] for r in train if "tokens_per_s" in r]
    from ember.experiments.multitask_report import task_info

    tasks = task_info(run_dir, results)  # a multi-task run's tasks ({} for any other run)
    return {
        "name": name, "id": slug(name), "path": str(run_dir.resolve()), "kind": cfg.kind,
        "objective": cfg.objective if cfg.kind == "pretrain" else None, "family": cfg.model.family,
        "task": ("tasks " + ", ".join(tasks)) if tasks else results.get("task") if results else (cfg.task.name or None),
        "tasks": tasks,
        "recipe": (pretrain or {}).get("recipe") or asked.get("recipe"), "overrides": asked.get("overrides"),
        "config_yaml": (run_dir / "config.yaml").read_text(encoding="utf-8"),
        "shape": f"{cfg.model.num_layers} layers, hidden {cfg.model.hidden_size}, {cfg.model.num_heads} heads",
        "parameters": _parameters(run_dir / "model.safetensors"),
        "data": _data(run_dir, cfg, results),
        "steps": (trainer or {}).get("step", train[-1]["step"] if train else None),
        "max_steps": cfg.train.max_steps if cfg.kind == "pretrain" else (results or {}).get("max_steps"),
        "tokens": (trainer or {}).get("tokens", (pretrain or {}).get("tokens")),
        "seconds": (trainer or {}).get("elapsed", train[-1].get("elapsed") if train else None),
        "tokens_per_s": sum(rates) / len(rates) if rates else None,
        "train": train, "evals": evals, "final_eval": {k: v for k, v in evals[-1].items() if k not in RECORD_KEYS}
        if evals else {}, "results": results, "checkpoints": checkpoints,
        "seed": cfg.train.seed, "main_metric": _main_metric(cfg),
    }


def _main_metric(cfg) -> str | None:
    if cfg.kind != "finetune" or not cfg.task.name:
        return None
    try:
        from ember.tasks.base import get_adapter

        return get_adapter(cfg.task.name, cfg.model, settings=cfg.task).main_metric
    except EmberError:
        return None


def collect(paths: list[str | Path]) -> list[dict]:
    """Summaries of the runs at or under ``paths``. A run found inside a given folder is named by
    its path from that folder's parent ("sst2/seed-1"); clashing names fall back to the paths
    from the runs' common folder."""
    import os

    runs, names = [], []
    for path in map(Path, paths):
        for run in find_runs(path):
            if run.resolve() not in [r.resolve() for r in runs]:
                runs.append(run)
                names.append(run.name if run == path else str(run.relative_to(path.parent)))
    if len(set(names)) != len(names):
        root = Path(os.path.commonpath([str(r.resolve()) for r in runs]))
        names = [str(r.resolve().relative_to(root)) if r.resolve() != root else r.name for r in runs]
    return [summarize(r, n) for r, n in zip(runs, names)]


def write_report(paths: list[str | Path] | str | Path, out: str | Path, title: str | None = None) -> Path:
    """One self-contained HTML page for the runs at or under ``paths`` (one path, or a list; written
    atomically)."""
    from ember.experiments.report_page import render_report
    from ember.fileio import atomic_write_text

    summaries = collect([paths] if isinstance(paths, (str, Path)) else paths)  # a str, not its characters
    out = Path(out)
    if not title:
        title = summaries[0]["name"] if len(summaries) == 1 else f"{len(summaries)} runs"
    out.parent.mkdir(parents=True, exist_ok=True)
    atomic_write_text(out, render_report(summaries, title))
    return out
