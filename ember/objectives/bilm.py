"""ELMo's biLM objective (Peters et al. 2018, eq. in §3.1): jointly maximise

    sum_k log p(t_k | t_1..t_{k-1}; forward LM) + log p(t_k | t_{k+1}..t_N; backward LM)

with one softmax over the word vocabulary shared by both directions. A training example is
one sentence ``<s> w_1 .. w_n </s>``: the forward LM's top layer at position k predicts the
word at k+1, the backward LM's at k predicts the word at k-1. Loss = mean forward NLL + mean
backward NLL; ``exp`` of each is that direction's perplexity.

Data (``setup_pretraining``): ``data.prepared`` names raw text (a file, folder or glob, e.g.
../shared/data/wiki-en), read word by word by ``ember.data.word_corpus``; the word vocabulary
of the shared softmax is built from the training part and saved as ``RUN/words.json`` (a
resumed run reloads it). Held-out metrics are the forward/backward NLL and perplexities on
the same held-out sentences each time.
"""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from ember.models.elmo import ElmoBiLM


def pad_sentences(examples: list[tuple[np.ndarray, np.ndarray]]) -> dict[str, torch.Tensor]:
    """[(chars (n, C), word ids (n,)), ...] -> char_ids (B, T, C), word_ids (B, T),
    attention_mask (B, T), right-padded with zeros."""
    t = max(len(ids) for _, ids in examples)
    c = examples[0][0].shape[1]
    chars = np.zeros((len(examples), t, c), dtype=np.int64)
    ids = np.zeros((len(examples), t), dtype=np.int64)
    mask = np.zeros((len(examples), t), dtype=np.int64)
    for i, (ch, w) in enumerate(examples):
        chars[i, : len(w)] = ch
        ids[i, : len(w)] = w
        mask[i, : len(w)] = 1
    return {"char_ids": torch.from_numpy(chars), "word_ids": torch.from_numpy(ids),
            "attention_mask": torch.from_numpy(mask)}


class BiLMObjective(nn.Module):
    def __init__(self, backbone: ElmoBiLM, vocab_size: int, dropout: float) -> None:
        super().__init__()
        self.backbone = backbone
        self.softmax = nn.Linear(backbone.cfg.projection_dim, vocab_size)  # shared by both directions
        self.dropout = nn.Dropout(dropout)

    def make_batch(self, examples, rng: np.random.Generator) -> dict[str, torch.Tensor]:
        return pad_sentences(examples)  # nothing is corrupted: an LM sees its input as is

    def _nll(self, hidden: torch.Tensor, targets: torch.Tensor, where: torch.Tensor) -> torch.Tensor:
        """Mean NLL of targets[where] given hidden[where] (B, T', P)."""
        logits = self.softmax(self.dropout(hidden[where]))  # (N, V)
        return F.cross_entropy(logits.float(), targets[where])

    def forward(self, batch: dict) -> tuple[torch.Tensor, dict]:
        ids, mask = batch["word_ids"], batch["attention_mask"].bool()
        out = self.backbone(batch["char_ids"], batch["attention_mask"])
        pair = mask[:, 1:] & mask[:, :-1]  # (B, T-1): both neighbours are real words
        fwd = self._nll(out.forward[-1][:, :-1], ids[:, 1:], pair)  # position k predicts k+1
        bwd = self._nll(out.backward[-1][:, 1:], ids[:, :-1], pair)  # position k predicts k-1
        loss = fwd + bwd
        n = int(pair.sum())
        return loss, {"loss": (loss.item() * n, n), "fwd_loss": (fwd.item() * n, n),
                      "bwd_loss": (bwd.item() * n, n)}

    @staticmethod
    def derived_metrics(metrics: dict) -> dict:
        """Held-out perplexity of each direction from its mean NLL (nats per word)."""
        return {f"{d}_ppl": math.exp(min(metrics[f"{d}_loss"], 50.0)) for d in ("fwd", "bwd")
                if f"{d}_loss" in metrics}


def build(cfg, special_ids: dict) -> BiLMObjective:
    return BiLMObjective(ElmoBiLM(cfg.elmo), special_ids["vocab_size"], cfg.elmo.dropout)


def setup_pretraining(cfg, run_dir: Path, resume: bool, progress: bool):
    """ELMo's data: words from raw text and a word vocabulary (see the module docstring)."""
    from ember.config import save_yaml
    from ember.data.shards import refuse_token_shards
    from ember.data.word_corpus import WordCorpus
    from ember.errors import EmberError
    from ember.objectives.setup import PretrainingSetup, held_out_metrics
    from ember.tokenizers.words import WordVocab

    if not cfg.data.prepared:
        raise EmberError("ELMo pre-training reads raw text: pass --data PATH (a text/wiki file, "
                         "folder or glob, e.g. ../shared/data/wiki-en)")
    refuse_token_shards(cfg.data.prepared, "ELMo pre-training", "../shared/data/wiki-en")
    e = cfg.elmo
    corpus = WordCorpus(cfg.data.prepared, cfg.data.max_seq_length - 2, e.lowercase, e.max_corpus_words,
                        e.valid_every, progress=progress)
    saved_vocab = Path(run_dir) / "words.json"
    if resume and saved_vocab.is_file():
        vocab = WordVocab.load(saved_vocab)
    else:
        vocab = WordVocab.build(corpus.counts, e.vocab_size, e.lowercase, e.max_word_chars)
    train_data = corpus.dataset("train", vocab)
    valid_data = corpus.dataset("valid", vocab) if e.valid_every else None
    module = build(cfg, {"vocab_size": len(vocab)})

    def evaluate(m):
        return held_out_metrics(m, valid_data, cfg.data.eval_examples, 64, cfg.train.seed, cfg.train.device)

    def write_files(folder: Path) -> None:
        save_yaml(cfg, folder / "config.yaml")
        vocab.save(folder / "words.json")

    params = sum(p.numel() for p in module.backbone.parameters())
    covered = sum(c for w, c in corpus.counts.items() if w in vocab.index) / max(1, sum(corpus.counts.values()))
    return PretrainingSetup(
        cfg, module, train_data, evaluate if valid_data is not None else None, write_files,
        description=f"pre-training ELMo biLM on {corpus.num_words:,} words ({len(train_data):,} sentences, "
                    f"vocabulary {len(vocab):,} words covering {covered:.1%} of training words), biLM "
                    f"{params / 1e6:.1f}M + softmax {module.softmax.weight.numel() / 1e6:.1f}M parameters")
