"""Helpers for the Dai & Le LSTM tests: real NSMC reviews prepared as token shards, a tiny LSTM,
a tiny pre-trained run, and an LSTM step written out by hand (the reference the losses are
checked against)."""

from __future__ import annotations

from pathlib import Path

import torch

from conftest import real_data

# A 1-layer LSTM of 64 cells over 32-wide embeddings, 3,000-piece vocabulary, 64-token pieces.
TINY_LSTM = ["model.embedding_size=32", "model.hidden_size=64", "model.vocab_size=3000",
             "data.max_seq_length=64", "data.eval_examples=64"]
_CACHE: dict[str, Path] = {}


def nsmc_prepared(root: Path) -> Path:
    """A 3k WordPiece (Hangul syllables alone take ~2.3k) trained on, and token shards of, the first 3,000 unlabeled NSMC reviews
    (one review per line of unlabeled.txt.gz; 5% held out). Built once per session."""
    if "prepared" not in _CACHE:
        from ember.data.prepare import prepare_corpus
        from ember.tokenizers import train_tokenizer

        source = real_data("nsmc", "unlabeled.txt.gz")
        root.mkdir(parents=True, exist_ok=True)
        tok = train_tokenizer([source], vocab_size=3000, max_documents=3000, fmt="lines", progress=False)
        tok.save(str(root / "tokenizer.json"))
        prepare_corpus([source], root / "tokenizer.json", root / "prepared", fmt="lines", max_docs=3000,
                       valid_fraction=0.05, progress=False)
        _CACHE["prepared"] = root / "prepared"
    return _CACHE["prepared"]


def pretrained_lm(root: Path) -> Path:
    """The tiny LSTM pre-trained as an LM (lm-lstm recipe) for 80 steps on ``nsmc_prepared``."""
    if "lm" not in _CACHE:
        from ember.recipes import load_recipe
        from ember.train.pretrain import run_pretraining

        prepared = nsmc_prepared(root / "nsmc")
        cfg = load_recipe("lm-lstm", TINY_LSTM + [f"data.prepared={prepared}", "train.max_steps=80",
                                                  "train.batch_size=32", "train.lr=5e-3", "train.warmup_steps=5",
                                                  "train.eval_every=0", "train.save_every=0", "train.log_every=10"])
        run_pretraining(cfg, root / "lm", progress=False)
        _CACHE["lm"] = root / "lm"
    return _CACHE["lm"]


def tiny_lstm_config(layers: int = 2, vocab: int = 7, **extra):
    from ember.config import ModelConfig

    return ModelConfig(family="lstm", vocab_size=vocab, embedding_size=3, hidden_size=4, num_layers=layers,
                       num_heads=1, intermediate_size=0, type_vocab_size=0, pooler=False, dropout=0.0,
                       initializer_range=0.5, **extra)


def lstm_by_hand(layers, x: torch.Tensor, state=None):
    """The LSTM equations step by step (PyTorch's gate order i, f, g, o): x (T, E) -> (top outputs
    (T, H), [(h, c) per layer]). ``layers``: single-layer nn.LSTMs, bottom first; ``state``: a
    (h, c) per layer to start from (None: zeros)."""
    finals = []
    for i, lstm in enumerate(layers):
        hidden = lstm.hidden_size
        h, c = state[i] if state is not None else (torch.zeros(hidden), torch.zeros(hidden))
        outs = []
        for x_t in x:
            gates = lstm.weight_ih_l0 @ x_t + lstm.bias_ih_l0 + lstm.weight_hh_l0 @ h + lstm.bias_hh_l0
            i_g, f_g, g_g, o_g = gates.split(hidden)
            c = torch.sigmoid(f_g) * c + torch.sigmoid(i_g) * torch.tanh(g_g)
            h = torch.sigmoid(o_g) * torch.tanh(c)
            outs.append(h)
        x = torch.stack(outs)
        finals.append((h, c))
    return x, finals
