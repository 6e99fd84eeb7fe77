"""Feature-based transfer with a frozen ELMo (Peters et al. 2018, §3.3): a small BiLSTM
over [x_k; ELMo_k] for sentence classification (SST-2) or tagging (CoNLL-2003 NER).

    x_k       task word embedding, learned from scratch on the task (the "static" input)
    ELMo_k    = gamma * sum_j s_j h_{k,j}: a ScalarMix (softmax weights s_j and scale gamma,
              learned per task) over the frozen biLM's L+1 layers, computed beforehand
    BiLSTM    over [x_k; ELMo_k], then ULMFiT concat pooling [h_T, maxpool, meanpool]
              (Howard & Ruder 2018, §3.3) -> dropout -> linear -> labels; for tagging
              each word's BiLSTM state -> dropout -> linear -> tags instead

Without ELMo (``use_elmo=False``) the same model sees x_k alone: the baseline the paper
compares against. Examples are dicts {"word_ids": (n,), "elmo": (n, L+1, 2P) or absent,
"label": int (classification) or (n,) tag ids (tagging)}.
"""

from __future__ import annotations

from collections import Counter

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn
from torch.nn.utils.rnn import pack_padded_sequence, pad_packed_sequence

from ember.nn.pooling import concat_pool
from ember.nn.scalar_mix import ScalarMix

PAD, UNK = "<pad>", "<unk>"


def task_vocabulary(sentences: list[list[str]], max_size: int = 20000) -> dict[str, int]:
    """Word -> id for the task's static embeddings: <pad> 0, <unk> 1, then by frequency."""
    counts = Counter(w for s in sentences for w in s)
    ranked = sorted(counts, key=lambda w: (-counts[w], w))[: max_size - 2]
    return {w: i for i, w in enumerate([PAD, UNK] + ranked)}


class ElmoClassifier(nn.Module):
    def __init__(self, vocab_size: int, num_labels: int, embedding_dim: int = 100,
                 hidden_size: int = 128, elmo_layers: int = 0, elmo_dim: int = 0,
                 dropout: float = 0.5, tagging: bool = False) -> None:
        super().__init__()
        self.embed = nn.Embedding(vocab_size, embedding_dim, padding_idx=0)
        self.use_elmo = elmo_layers > 0
        self.scalar_mix = ScalarMix(elmo_layers) if self.use_elmo else None
        self.dropout = nn.Dropout(dropout)
        self.lstm = nn.LSTM(embedding_dim + elmo_dim, hidden_size, batch_first=True, bidirectional=True)
        self.tagging = tagging
        self.classifier = nn.Linear((1 if tagging else 3) * 2 * hidden_size, num_labels)
        self.hidden_size = hidden_size

    def make_batch(self, examples: list[dict], rng: np.random.Generator | None = None) -> dict:
        t = max(1, max(len(e["word_ids"]) for e in examples))
        ids = torch.zeros(len(examples), t, dtype=torch.long)
        mask = torch.zeros(len(examples), t, dtype=torch.long)
        batch = {}
        if self.use_elmo:
            first = examples[0]["elmo"]
            elmo = torch.zeros(len(examples), t, *first.shape[1:])
        for i, e in enumerate(examples):
            n = len(e["word_ids"])
            ids[i, :n] = torch.as_tensor(e["word_ids"])
            mask[i, :n] = 1
            if self.use_elmo:
                elmo[i, :n] = e["elmo"].float()
        if self.tagging:  # (B, T), -100 at padding
            labels = torch.full((len(examples), t), -100, dtype=torch.long)
            for i, e in enumerate(examples):
                labels[i, : len(e["label"])] = torch.as_tensor(e["label"])
        else:
            labels = torch.tensor([e["label"] for e in examples], dtype=torch.long)
        batch.update(input_ids=ids, attention_mask=mask, labels=labels)
        if self.use_elmo:
            batch["elmo"] = elmo  # (B, T, L+1, 2P)
        return batch

    def logits(self, batch: dict) -> torch.Tensor:
        """(B, labels) for classification, (B, T, tags) for tagging."""
        mask = batch["attention_mask"]
        x = self.embed(batch["input_ids"])  # (B, T, E)
        if self.use_elmo:
            layers = batch["elmo"].unbind(dim=2)  # L+1 x (B, T, 2P)
            x = torch.cat([x, self.scalar_mix(layers, mask)], dim=-1)  # [x_k; ELMo_k]
        lengths = mask.sum(dim=1).clamp(min=1)
        packed = pack_padded_sequence(self.dropout(x), lengths.cpu(), batch_first=True, enforce_sorted=False)
        h, _ = pad_packed_sequence(self.lstm(packed)[0], batch_first=True, total_length=x.shape[1])
        if self.tagging:
            return self.classifier(self.dropout(h))  # (B, T, tags)
        # h_T of a BiLSTM: each direction's final state (forward at the last word, backward at
        # the first), then max and mean over all words.
        b = torch.arange(h.shape[0], device=h.device)
        last = torch.cat([h[b, lengths - 1, : self.hidden_size], h[:, 0, self.hidden_size :]], dim=-1)
        return self.classifier(self.dropout(concat_pool(h, mask, last=last)))  # (B, labels)

    def forward(self, batch: dict) -> tuple[torch.Tensor, dict]:
        logits, labels = self.logits(batch), batch["labels"]
        if self.tagging:
            where = labels != -100
            logits, labels = logits[where], labels[where]
        loss = F.cross_entropy(logits, labels)
        n = int(labels.numel())
        correct = int((logits.argmax(-1) == labels).sum())
        return loss, {"loss": (loss.item() * n, n), "accuracy": (correct, n)}
