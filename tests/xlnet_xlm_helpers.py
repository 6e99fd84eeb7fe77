"""Helpers shared by the XLNet and XLM fine-tuning tests: tokenizers trained on real task text
and tiny random pre-training run folders (what `ember finetune --init` starts from)."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import torch

from conftest import real_data


def _lines(path: Path, column: int, limit: int, csv: bool = False) -> list[str]:
    if csv:
        import csv as csv_module

        with open(path, encoding="utf-8", newline="") as fh:
            return [row[column] for _, row in zip(range(limit), csv_module.reader(fh))][1:]
    return [row.split("\t")[column] for row in path.read_text(encoding="utf-8").splitlines()[1:limit + 1]]


def sst2_wordpiece(folder: Path, vocab: int = 1000) -> Path:
    """A lower-cased WordPiece trained on 3,000 real SST-2 training sentences (BERT's template)."""
    from ember.tokenizers import train_tokenizer

    text = folder / "sst2.txt"
    text.write_text("\n".join(_lines(real_data("glue", "SST-2", "train.tsv"), 0, 3000)), encoding="utf-8")
    path = folder / "sst2-wordpiece.json"
    train_tokenizer([text], vocab_size=vocab, progress=False).save(str(path))
    return path


def en_ru_bpe(folder: Path, vocab: int = 1500) -> Path:
    """A cased byte-level BPE shared by English (SST-2) and Russian (RuSentiment posts), as
    XLM's vocabulary is shared by its languages."""
    from ember.tokenizers import train_tokenizer

    en, ru = folder / "en.txt", folder / "ru.txt"
    en.write_text("\n".join(_lines(real_data("glue", "SST-2", "train.tsv"), 0, 3000)), encoding="utf-8")
    posts = _lines(real_data("rusentiment", "rusentiment_random_posts.csv"), 1, 3000, csv=True)
    ru.write_text("\n".join(p.replace("\n", " ") for p in posts), encoding="utf-8")
    path = folder / "en-ru-bpe.json"
    train_tokenizer({"en": [en], "ru": [ru]}, kind="bpe", vocab_size=vocab, lowercase=False, progress=False,
                    fmt="lines").save(str(path))
    return path


def tiny_model(preset: str, tok, **model):
    """``preset`` at 2 layers x 64 (4H feed-forward, as XLM's transformers class requires) over
    ``tok``'s vocabulary; ``model`` overrides."""
    from ember.config import model_preset
    from ember.tokenizers import special_token_ids

    shape = dict(vocab_size=tok.get_vocab_size(), hidden_size=64, num_layers=2, num_heads=2, intermediate_size=256,
                 max_position=128, pad_token_id=special_token_ids(tok)["pad"])
    return dataclasses.replace(model_preset(preset), **{**shape, **model})


def pretraining_run(folder: Path, tokenizer_path: Path, preset: str, objective: str, seed: int = 0,
                    **model) -> Path:
    """A pre-training run folder holding a tiny random backbone of ``preset``'s family."""
    from ember.config import DataConfig, RunConfig
    from ember.models import build_backbone
    from ember.runs.checkpoint import save_weights
    from ember.runs.folder import write_run_files
    from ember.tokenizers import load_tokenizer

    tok = load_tokenizer(tokenizer_path)
    cfg = tiny_model(preset, tok, **model)
    torch.manual_seed(seed)
    backbone = build_backbone(cfg)
    run = folder / f"{preset}-{objective}"
    write_run_files(run, RunConfig(objective=objective, model=cfg, data=DataConfig(max_seq_length=64)), tokenizer_path)
    save_weights({f"backbone.{k}": v for k, v in backbone.state_dict().items()}, run / "model.safetensors")
    return run


def xlnet_pretraining_run(folder: Path, tokenizer_path: Path) -> Path:
    """A tiny random XLNet permutation-LM run, with a memory (which fine-tuning must drop)."""
    return pretraining_run(folder, tokenizer_path, "xlnet-mini", "plm", mem_len=16)


def xlm_pretraining_run(folder: Path, tokenizer_path: Path) -> Path:
    """A tiny random XLM masked-LM run over English and Russian (en = 0, ru = 1)."""
    return pretraining_run(folder, tokenizer_path, "xlm-mini", "xlm_mlm", num_languages=2, languages="en,ru")


def finetune_args(task: str, init: Path, out: Path, *extra: str) -> list[str]:
    """`ember finetune` on a tiny model: short inputs, a high learning rate, no progress bar."""
    return ["finetune", "--task", task, "--init", str(init), "--out", str(out), "--batch-size", "16",
            "--max-length", "64", "--lr", "2e-3", "--no-progress", *extra]


def task_run(folder: Path, task: str, tokenizer_path: Path, preset: str = "xlnet-mini", seed: int = 0,
             **model) -> Path:
    """A fine-tuned-run folder of ``task`` holding a seeded random model of ``preset``'s family,
    written as ``ember finetune`` writes one (its adapter's model shape, tokenizer and labels)."""
    import json

    from ember.config import RunConfig, TaskConfig
    from ember.models import build_backbone
    from ember.runs.checkpoint import save_weights
    from ember.runs.folder import write_run_files
    from ember.tasks.base import get_adapter
    from ember.tokenizers import load_tokenizer

    tok = load_tokenizer(tokenizer_path)
    cfg = tiny_model(preset, tok, **model)
    adapter = get_adapter(task, cfg)
    if hasattr(adapter, "model_config"):
        cfg = adapter.model_config(cfg)
    if hasattr(adapter, "run_tokenizer"):
        tok = adapter.run_tokenizer(tok)
    torch.manual_seed(seed)
    module = adapter.build_module(build_backbone(cfg), cfg.pad_token_id)
    with torch.no_grad():  # heads start near zero (std 0.02): widen them so predictions are not ties
        for name in ("classifier", "qa_outputs"):
            if hasattr(module, name):
                getattr(module, name).weight.mul_(50)
    run = folder / f"{cfg.family}-{task}"
    tok.save(str(folder / f"{task}-tokenizer.json"))
    write_run_files(run, RunConfig(kind="finetune", model=cfg, task=TaskConfig(name=task, max_length=64)),
                    folder / f"{task}-tokenizer.json")
    if adapter.label_names() is not None:
        (run / "labels.json").write_text(json.dumps(adapter.label_names()))
    save_weights(module.state_dict(), run / "model.safetensors")
    return run
