"""Dai & Le 2015's two ways to pre-train an LSTM on unlabeled text ("Semi-supervised Sequence
Learning", §2), on the token shards of `ember prepare`.

* ``lstm_lm`` (LM-LSTM): a recurrent language model, L = -mean_t log p(x_{t+1} | x_1..x_t).
* ``seq_autoencoder`` (SA-LSTM): the LSTM reads the sequence into its final state, then the same
  LSTM (encoder and decoder share their weights, Fig. 1) starts from that state and reconstructs
  the sequence, teacher-forced: L = -mean_t log p(x_t | state, x_1..x_{t-1}).

A training example is one document of the corpus (a movie review), cut into pieces of at most
``data.max_seq_length`` tokens with the tokenizer's own framing (``[CLS] w_1..w_n [SEP]`` for
WordPiece), the sequences fine-tuning and serving feed the classifier (ember.tasks.featurize),
so the classifier starts from states it has seen. Rows are right-padded; the LSTM never reads
the padding (ember.nn.lstm). Both objectives put one softmax (H -> V, dropout ``model.dropout``
before it) on the LSTM's outputs.

The autoencoder's decoder reads ``[SEP] w_1..w_n`` and predicts ``w_1..w_n [SEP]``: its first
input is the end token the encoder stopped on (the paper's decoder emits w_1 right after
<eos>), and every one of its layers starts from the encoder's final (h, c) of that layer.

Held-out metrics: ``lm_loss`` and its perplexity ``ppl`` (LM); ``rec_loss`` (nats per token) and
``rec_ppl`` (SA); ``*_acc`` is the share of tokens predicted right.
"""

from __future__ import annotations

import math

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from ember.errors import EmberError
from ember.nn.dropout import Dropout


def template_ids(tokenizer) -> tuple[list[int], list[int]]:
    """(prefix, suffix): the special tokens the tokenizer puts before and after one sentence
    (``[CLS]`` / ``[SEP]`` for WordPiece, none / ``</s>`` for T5's unigram)."""
    enc = tokenizer.encode("a", add_special_tokens=True)
    special = enc.special_tokens_mask  # 1 = added special token
    first = special.index(0) if 0 in special else len(special)
    last = len(special) - special[::-1].index(0) if 0 in special else len(special)
    return list(enc.ids[:first]), list(enc.ids[last:])


def pad_rows(rows: list[np.ndarray], pad: int) -> tuple[torch.Tensor, torch.Tensor]:
    """int64 rows of different lengths -> (ids (B, T) right-padded with ``pad``, mask (B, T))."""
    t = max(len(r) for r in rows)
    ids = np.full((len(rows), t), pad, dtype=np.int64)
    mask = np.zeros((len(rows), t), dtype=np.int64)
    for i, r in enumerate(rows):
        ids[i, : len(r)] = r
        mask[i, : len(r)] = 1
    return torch.from_numpy(ids), torch.from_numpy(mask)


class LstmPretraining(nn.Module):
    """What both objectives share: the data (framed documents), the softmax and its loss."""

    pair_mode = "none"  # documents, not sentence pairs

    def __init__(self, backbone: nn.Module, prefix: list[int], suffix: list[int], pad_id: int) -> None:
        super().__init__()
        if not suffix:
            raise EmberError("the corpus tokenizer adds no end token to a sentence (its template has no "
                             "[SEP] or </s>); Dai & Le's LSTM objectives need one to end each sequence")
        cfg = backbone.config
        self.backbone = backbone
        self.prefix, self.suffix, self.pad_id = list(prefix), list(suffix), pad_id
        self.dropout = Dropout(cfg.dropout)
        self.softmax = nn.Linear(cfg.hidden_size, cfg.vocab_size)  # (H) -> (V)

    def build_dataset(self, corpus, data_cfg, seed: int):
        """Each document cut into pieces that fit ``data.max_seq_length`` with the framing."""
        from ember.data.blocks import DocumentSegmentDataset

        room = data_cfg.max_seq_length - len(self.prefix) - len(self.suffix)
        if room < 1:
            raise EmberError(f"data.max_seq_length={data_cfg.max_seq_length} leaves no room for text beside "
                             f"the {len(self.prefix) + len(self.suffix)} framing tokens")
        return DocumentSegmentDataset(corpus, room)

    def frame(self, piece: np.ndarray) -> np.ndarray:
        return np.concatenate([self.prefix, piece, self.suffix]).astype(np.int64)

    def _nll(self, hidden: torch.Tensor, targets: torch.Tensor, where: torch.Tensor, name: str):
        """Mean NLL of targets[where] (B, T) given hidden[where] (B, T, H), and its metrics
        ``{name}_loss`` / ``{name}_acc`` as (sum, count) over the predicted tokens."""
        logits = self.softmax(self.dropout(hidden[where])).float()  # (N, V): real positions only
        gold = targets[where]
        loss = F.cross_entropy(logits, gold)
        n = int(gold.numel())
        correct = int((logits.argmax(-1) == gold).sum())
        stats = {"loss": (loss.item() * n, n), f"{name}_loss": (loss.item() * n, n), f"{name}_acc": (correct, n)}
        return loss, stats


class LstmLanguageModel(LstmPretraining):
    """LM-LSTM: every position predicts the next token of its framed document."""

    def make_batch(self, pieces: list[np.ndarray], rng: np.random.Generator) -> dict[str, torch.Tensor]:
        ids, mask = pad_rows([self.frame(p) for p in pieces], self.pad_id)  # nothing is corrupted
        return {"input_ids": ids, "attention_mask": mask}

    def forward(self, batch: dict[str, torch.Tensor]) -> tuple[torch.Tensor, dict]:
        ids, mask = batch["input_ids"], batch["attention_mask"]
        out = self.backbone(ids, mask)
        pair = (mask[:, 1:] * mask[:, :-1]).bool()  # (B, T-1): position t and t+1 are tokens
        return self._nll(out.last_hidden_state[:, :-1], ids[:, 1:], pair, "lm")

    @staticmethod
    def derived_metrics(metrics: dict) -> dict:
        """Held-out perplexity exp(mean NLL per token)."""
        return {"ppl": math.exp(min(metrics["lm_loss"], 50.0))} if "lm_loss" in metrics else {}


class SequenceAutoencoder(LstmPretraining):
    """SA-LSTM: encode the framed document, decode it again from the encoder's final state."""

    def make_batch(self, pieces: list[np.ndarray], rng: np.random.Generator) -> dict[str, torch.Tensor]:
        end = self.suffix[-1]
        ids, mask = pad_rows([self.frame(p) for p in pieces], self.pad_id)
        dec_in, dec_mask = pad_rows([np.concatenate([[end], p]).astype(np.int64) for p in pieces], self.pad_id)
        labels, _ = pad_rows([np.concatenate([p, [end]]).astype(np.int64) for p in pieces], -100)
        return {"input_ids": ids, "attention_mask": mask, "decoder_input_ids": dec_in,
                "decoder_attention_mask": dec_mask, "labels": labels}

    def forward(self, batch: dict[str, torch.Tensor]) -> tuple[torch.Tensor, dict]:
        encoded = self.backbone(batch["input_ids"], batch["attention_mask"])
        decoded = self.backbone(batch["decoder_input_ids"], batch["decoder_attention_mask"],
                                initial_state=encoded.final_state)  # shared weights, §2 / Fig. 1
        labels = batch["labels"]
        return self._nll(decoded.last_hidden_state, labels, labels != -100, "rec")

    @staticmethod
    def derived_metrics(metrics: dict) -> dict:
        """Held-out reconstruction perplexity exp(mean NLL per token)."""
        return {"rec_ppl": math.exp(min(metrics["rec_loss"], 50.0))} if "rec_loss" in metrics else {}


OBJECTIVE_CLASSES = {"lstm_lm": LstmLanguageModel, "seq_autoencoder": SequenceAutoencoder}


def build(cfg, special_ids: dict) -> LstmPretraining:
    from ember.models import build_backbone
    from ember.tokenizers import load_tokenizer

    if cfg.model.family != "lstm":
        raise EmberError(f"objective {cfg.objective} trains Dai & Le's LSTM (model family lstm), not a "
                         f"{cfg.model.family!r} model; use --recipe lm-lstm or sa-lstm (model.preset lstm-mini)")
    if "tokenizer_path" not in special_ids:
        raise EmberError(f"objective {cfg.objective} needs the corpus tokenizer (for its sentence framing)")
    prefix, suffix = template_ids(load_tokenizer(special_ids["tokenizer_path"]))
    return OBJECTIVE_CLASSES[cfg.objective](build_backbone(cfg.model), prefix, suffix, special_ids["pad"])
