"""Run folders for the export/serving tests: a tiny SST-2 model fine-tuned on real data, and
tiny random runs of the other kinds (NER, SQuAD, MLM pre-training) written directly."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import torch

from ember.config import DataConfig, ModelConfig, RunConfig, TaskConfig, TrainConfig, save_yaml

TINY = ModelConfig(vocab_size=2000, hidden_size=64, num_layers=2, num_heads=2, intermediate_size=128,
                   max_position=128)
_CACHE: dict[str, Path] = {}


def sst2_run(root: Path, tokenizer_path: Path) -> Path:
    """A tiny BERT fine-tuned for one epoch on 256 real SST-2 sentences (built once per session)."""
    if "sst2" not in _CACHE:
        from ember.train.finetune import run_finetuning

        cfg = RunConfig(kind="finetune", model=TINY,
                        task=TaskConfig(name="sst2", max_length=64, epochs=1.0, init="random"),
                        train=TrainConfig(lr=1e-3, batch_size=32, eval_every=0, save_every=0, log_every=10))
        run = root / "sst2"
        run_finetuning(cfg, run, None, tokenizer_path, train_limit=256, progress=False)
        _CACHE["sst2"] = run
    return _CACHE["sst2"]


def random_run(root: Path, kind: str, tokenizer_path: Path, seed: int = 0) -> Path:
    """A run folder holding a seeded random model: kind "conll2003", "squad2" or "mlm"."""
    from ember.models import build_backbone
    from ember.serve.graph import describe
    from ember.tokenizers import load_tokenizer, special_token_ids
    from ember.runs.checkpoint import save_weights

    run = root / kind
    run.mkdir(parents=True, exist_ok=True)
    shutil.copyfile(tokenizer_path, run / "tokenizer.json")
    torch.manual_seed(seed)
    special = special_token_ids(load_tokenizer(tokenizer_path))
    if kind == "mlm":
        from ember.objectives.bert import BertPretraining

        cfg = RunConfig(kind="pretrain", objective="bert", model=TINY, data=DataConfig(max_seq_length=64))
        module = BertPretraining(build_backbone(TINY), special, DataConfig(), "nsp")
    else:
        from ember.tasks.base import get_adapter

        cfg = RunConfig(kind="finetune", model=TINY, task=TaskConfig(name=kind, max_length=64))
        adapter = get_adapter(kind)
        module = adapter.build_module(build_backbone(TINY), special["pad"])
        if adapter.label_names() is not None:
            (run / "labels.json").write_text(json.dumps(adapter.label_names()))
    # Heads start near zero (std 0.02); widen them so predictions are not ties of noise.
    with torch.no_grad():
        for name in ("classifier", "qa_outputs"):
            if hasattr(module, name):
                getattr(module, name).weight.mul_(50)
    save_yaml(cfg, run / "config.yaml")
    save_weights(module.state_dict(), run / "model.safetensors")
    describe(run)  # fails early if the folder is not servable
    return run


def assert_same_answer(got, want, rtol: float = 1e-5, atol: float = 1e-5, where: str = "answer") -> None:
    """Two JSON answers hold the same keys, lists, strings, ints and flags exactly, and floats to
    ``rtol``/``atol``: for answers computed in different batches, whose sums the BLAS may round
    differently (a float is compared by value, so 1e-9 apart passes and 0.1 apart fails)."""
    import math

    if isinstance(want, dict):
        assert isinstance(got, dict) and got.keys() == want.keys(), (where, got, want)
        for key in want:
            assert_same_answer(got[key], want[key], rtol, atol, f"{where}.{key}")
    elif isinstance(want, (list, tuple)):
        assert isinstance(got, (list, tuple)) and len(got) == len(want), (where, got, want)
        for i, (a, b) in enumerate(zip(got, want)):
            assert_same_answer(a, b, rtol, atol, f"{where}[{i}]")
    elif isinstance(want, float):
        assert isinstance(got, float) and math.isclose(got, want, rel_tol=rtol, abs_tol=atol), (where, got, want)
    else:
        assert type(got) is type(want) and got == want, (where, got, want)
