"""Tiny run folders of every servable kind, for the API, page and report tests (and the docs'
examples): an SST-2 classifier fine-tuned on real sentences, random NER / SQuAD 2.0 / MLM runs,
and a random GPT-2 with a byte-level BPE trained on real Wikipedia text."""

from __future__ import annotations

import shutil
from pathlib import Path

from conftest import real_data


def tiny_runs(root: Path, tokenizer_path: Path) -> dict[str, Path]:
    """{"sst2", "conll2003", "squad2", "mlm", "gpt"} -> run folder, all under ``root``."""
    from gpt_helpers import make_gpt_run
    from serve_helpers import random_run, sst2_run

    real_data("glue", "SST-2")
    runs = {"sst2": sst2_run(root / "built", tokenizer_path)}
    if runs["sst2"].parent != root:  # sst2_run caches one run per session: give this root its copy
        shutil.copytree(runs["sst2"], root / "sst2", dirs_exist_ok=True)
        runs["sst2"] = root / "sst2"
    for kind in ("conll2003", "squad2", "mlm"):
        runs[kind] = random_run(root, kind, tokenizer_path)
    gpt_root = root / "gpt-build"
    gpt_root.mkdir(parents=True, exist_ok=True)
    source = real_data("wiki-en", "AA", "wiki_00.gz")
    runs["gpt"] = make_gpt_run(gpt_root, max_position=64, text=source, vocab=1000, fmt="auto", max_documents=40)
    return runs
