"""`ember pretrain` for ELMo (objective ``bilm``): words from raw text, not sub-word shards.

``data.prepared`` names raw text (a file, folder or glob, e.g. ../shared/data/wiki-en), read
by ``ember.data.word_corpus``; the word vocabulary of the shared softmax is built from the
training part and saved as ``RUN/words.json`` (a resumed run reloads it). Held-out metrics
are the forward/backward NLL and their perplexities on the same held-out sentences each time.
"""

from __future__ import annotations

import math
from pathlib import Path

import torch

from ember.config import RunConfig, save_yaml
from ember.errors import EmberError
from ember.objectives import build_objective
from ember.tokenizers.words import WordVocab
from ember.train.distributed import init_distributed, shutdown
from ember.train.loop import Trainer
from ember.train.pretrain import train_and_save
from ember.runs.folder import prepare_run_dir


def bilm_held_out(module, dataset, n_examples: int, batch_size: int, seed: int, device: str) -> dict:
    from ember.train.pretrain import evaluate_pretraining

    metrics = evaluate_pretraining(module, dataset, n_examples, batch_size, seed, device)
    for direction in ("fwd", "bwd"):
        metrics[f"{direction}_ppl"] = math.exp(min(metrics[f"{direction}_loss"], 50.0))
    return metrics


def run_elmo_pretraining(cfg: RunConfig, run_dir: Path, resume: bool = False, overwrite: bool = False,
                         progress: bool = True) -> dict:
    from ember.data.word_corpus import WordCorpus

    run_dir = Path(run_dir)
    if not cfg.data.prepared:
        raise EmberError("ELMo pre-training reads raw text: pass --data PATH (a text/wiki file, "
                         "folder or glob, e.g. ../shared/data/wiki-en)")
    dist_info = init_distributed(cfg.train.device)
    try:
        e = cfg.elmo
        corpus = WordCorpus(cfg.data.prepared, cfg.data.max_seq_length - 2, e.lowercase,
                            e.max_corpus_words, e.valid_every, progress=progress and dist_info.is_main)
        saved_vocab = run_dir / "words.json"
        if resume and saved_vocab.is_file():
            vocab = WordVocab.load(saved_vocab)
        else:
            vocab = WordVocab.build(corpus.counts, e.vocab_size, e.lowercase, e.max_word_chars)
        train_data = corpus.dataset("train", vocab)
        valid_data = corpus.dataset("valid", vocab) if e.valid_every else None

        def held_out(m):
            return bilm_held_out(m, valid_data, cfg.data.eval_examples, 64, cfg.train.seed,
                                 cfg.train.device)

        torch.manual_seed(cfg.train.seed)
        module = build_objective(cfg, {"vocab_size": len(vocab)})
        if dist_info.is_main:  # only now that data and model work is the run folder written
            prepare_run_dir(run_dir, resume, overwrite)
            run_dir.mkdir(parents=True, exist_ok=True)
            save_yaml(cfg, run_dir / "config.yaml")
            vocab.save(saved_vocab)
        trainer = Trainer(module, train_data, cfg.train, run_dir, dist_info,
                          held_out if valid_data is not None else None, progress=progress)
        if dist_info.is_main:
            params = sum(p.numel() for p in module.backbone.parameters())
            covered = sum(c for w, c in corpus.counts.items() if w in vocab.index) / max(1, sum(corpus.counts.values()))
            print(f"pre-training ELMo biLM on {corpus.num_words:,} words ({len(train_data):,} sentences, "
                  f"vocabulary {len(vocab):,} words covering {covered:.1%} of training words), "
                  f"biLM {params / 1e6:.1f}M + softmax {module.softmax.weight.numel() / 1e6:.1f}M "
                  f"parameters, run folder {run_dir}")
        return train_and_save(trainer, module, run_dir, dist_info, resume)
    finally:
        shutdown(dist_info)
