"""Helpers shared by the GPT tests: tiny random decoders and a run folder with a real BPE."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import torch

from hf_interop_helpers import perturb
from ember.config import model_preset
from ember.models import build_backbone
from ember.objectives.clm import CausalLM

TINY = dataclasses.replace(model_preset("gpt2-tiny"), vocab_size=97, hidden_size=32, num_heads=4,
                           intermediate_size=64, max_position=64, dropout=0.0, attention_dropout=0.0)


def tiny_model(family: str = "gpt2", seed: int = 0, vocab: int = 97, max_position: int = 64) -> CausalLM:
    """A 3-layer random decoder whose weights are moved well off the 0.02 init, so logits are
    far from uniform and argmax ties cannot occur."""
    torch.manual_seed(seed)
    cfg = dataclasses.replace(TINY, family=family, pre_layer_norm=family == "gpt2", num_layers=3,
                              vocab_size=vocab, max_position=max_position)
    return perturb(CausalLM(build_backbone(cfg)), seed, scale=0.2)


def make_gpt_run(root: Path, max_position: int = 64, text: Path | None = None, vocab: int = 300,
                 fmt: str = "lines", max_documents: int = 5000) -> Path:
    """A run folder with a tiny random GPT-2 and a byte-level BPE trained on a few sentences
    (or on the first ``max_documents`` documents of ``text``, read as ``fmt``: one per line
    by default, "auto" for e.g. WikiExtractor files)."""
    from ember.config import DataConfig, RunConfig
    from ember.tokenizers import train_tokenizer
    from ember.runs.checkpoint import save_weights
    from ember.runs.folder import write_run_files

    corpus = root / "corpus.txt"
    corpus.write_text("The river runs by the old town. The bank opened a new office. It was good.\n\n"
                      "A summary: the town is old. The film is bad and the review is positive or negative.\n" * 20)
    tok = train_tokenizer([text or corpus], kind="bpe", vocab_size=vocab, lowercase=False, progress=False,
                          fmt=fmt if text else "text", max_documents=max_documents)
    tok.save(str(root / "tok.json"))
    model = tiny_model(vocab=tok.get_vocab_size(), max_position=max_position)
    run = root / "run"
    write_run_files(run, RunConfig(objective="clm", model=model.backbone.config,
                                   data=DataConfig(max_seq_length=max_position)), root / "tok.json")
    save_weights(model.state_dict(), run / "model.safetensors")
    return run
