"""`ember quickstart`: raw text to a fine-tuned classifier in one command.

1. train a WordPiece tokenizer on English Wikipedia ($EMBER_DATA/wiki-en)
2. prepare token shards
3. pre-train bert-mini (MLM + NSP) for a few minutes
4. show fill-mask predictions
5. fine-tune on SST-2 and print dev accuracy

Without the data folder it says where data is expected and uses a corpus built from the
docstrings of Python's standard library (and a class-vs-function docstring task in place of
SST-2), so the whole path still runs.
"""

from __future__ import annotations

import dataclasses
import os
import shutil
import time
from pathlib import Path

from ember.paths import data_root


def banner(text: str) -> None:
    print(f"\n== {text}", flush=True)


def run_quickstart(out: Path, pretrain_steps: int = 300, pretrain_time: float = 360.0,
                   max_docs: int = 1500, finetune_epochs: float = 1.0, finetune_limit: int | None = 20000,
                   progress: bool = True) -> dict:
    from ember.recipes import recipe_path
    from ember.config import apply_overrides, load_yaml, run_config_from_dict
    from ember.data.prepare import prepare_corpus
    from ember.tasks.fill_mask import FillMask
    from ember.tokenizers import train_tokenizer
    from ember.train.finetune import run_finetuning
    from ember.runs.init import backbone_weights
    from ember.runs.checkpoint import load_weights
    from ember.train.pretrain import run_pretraining

    started = time.time()
    if out.exists():
        shutil.rmtree(out)
    out.mkdir(parents=True)
    wiki = data_root() / "wiki-en"
    sst2_root = data_root()
    if wiki.is_dir() and (data_root() / "glue" / "SST-2").is_dir():
        inputs, vocab = [str(wiki)], 30522
        print(f"using English Wikipedia from {wiki} (first {max_docs} articles) and SST-2")
    else:
        from ember.data.stdlib_corpus import build_stdlib_corpus

        print(f"no data folder at {data_root()} (expected wiki-en/ and glue/SST-2/ there; set "
              "EMBER_DATA to point elsewhere).\nFalling back to a corpus built from the docstrings of "
              "Python's standard library, and a class-vs-function docstring task instead of SST-2.")
        corpus, sst2_root = build_stdlib_corpus(out / "fallback")
        inputs, vocab = [str(corpus)], 8000

    banner("1/5 training a WordPiece tokenizer")
    tok = train_tokenizer(inputs, kind="wordpiece", vocab_size=vocab, max_documents=max_docs, progress=progress)
    tok.save(str(out / "tokenizer.json"))
    print(f"vocabulary: {tok.get_vocab_size()} tokens -> {out / 'tokenizer.json'}")

    banner("2/5 preparing token shards")
    prepare_corpus(inputs, out / "tokenizer.json", out / "prepared", max_docs=max_docs, progress=progress)

    banner(f"3/5 pre-training bert-mini (MLM + NSP), {pretrain_steps} steps or {pretrain_time / 60:.0f} min")
    values = apply_overrides(load_yaml(recipe_path("bert-mini")), [
        f"data.prepared={out / 'prepared'}", f"model.vocab_size={tok.get_vocab_size()}",
        f"train.max_steps={pretrain_steps}", f"train.max_time={pretrain_time}", "train.lr=1e-3",
        "train.warmup_ratio=0.06", f"train.eval_every={max(pretrain_steps // 3, 1)}",
        f"train.save_every={max(pretrain_steps // 3, 1)}",
    ])
    cfg = run_config_from_dict(values, where="quickstart")
    run_pretraining(cfg, out / "pretrain", progress=progress)

    banner("4/5 fill-mask with the pre-trained model")
    fill = FillMask(out / "pretrain")
    for text in ("the capital of france is [MASK].", "he was born in the [MASK] of london."):
        shown = ", ".join(f"{t} ({p:.2f})" for t, p in fill(text, 5)[0])
        print(f"  {text}  ->  {shown}")

    banner(f"5/5 fine-tuning on SST-2 ({finetune_limit or 'all'} training sentences)")
    previous = os.environ.get("EMBER_DATA")
    os.environ["EMBER_DATA"] = str(sst2_root)
    try:
        ft_values = apply_overrides({"kind": "finetune"}, [
            "task.name=sst2", f"task.epochs={finetune_epochs}", "task.max_length=66",
            f"task.init={out / 'pretrain'}", "train.lr=1e-4", "train.batch_size=32",
            "train.warmup_ratio=0.1", "train.eval_every=0", "train.save_every=0", "train.log_every=50",
        ])
        ft_cfg = dataclasses.replace(run_config_from_dict(ft_values), model=cfg.model)
        state = backbone_weights(load_weights(out / "pretrain" / "model.safetensors"))
        result = run_finetuning(ft_cfg, out / "sst2", state, out / "pretrain" / "tokenizer.json",
                                train_limit=finetune_limit, progress=progress)
    finally:
        if previous is None:
            os.environ.pop("EMBER_DATA", None)
        else:
            os.environ["EMBER_DATA"] = previous
    acc = result["metrics"]["accuracy"]
    print(f"\nSST-2 dev accuracy: {acc:.4f}  ({(time.time() - started) / 60:.1f} min in all)")
    print(f"run folders: {out / 'pretrain'} (curves.png, metrics.jsonl), {out / 'sst2'} (results.json)")
    return result
