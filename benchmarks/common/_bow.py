"""The bag-of-words baseline of benchmarks/studies/dai_le_nsmc.py: multinomial logistic regression on
token counts, in numpy (scikit-learn is not one of ember's dependencies).

A document is the counts of its subword tokens (the tokenizer the LSTMs read, without special
tokens), kept sparse as (row, token, count) triples, so 150k reviews x 8k features cost a few MB.
The model minimises mean cross-entropy + (l2 / 2) ||W||^2 (the bias is not penalised) by
full-batch Adam; X W and X^T G are bincounts over the triples. ``fit_on_dev`` picks l2 from a
grid by dev accuracy, as one tunes any baseline. Deterministic: no seed.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np


@dataclass
class Counts:
    rows: np.ndarray  # (nnz,) int64 document of each entry
    tokens: np.ndarray  # (nnz,) int64 token id
    counts: np.ndarray  # (nnz,) float64
    n_docs: int
    n_features: int


def token_counts(docs: list[list[int]], n_features: int) -> Counts:
    """Token-id lists -> sparse counts (one entry per distinct token of a document)."""
    lengths = np.fromiter((len(d) for d in docs), dtype=np.int64, count=len(docs))
    flat_rows = np.repeat(np.arange(len(docs)), lengths)
    flat_tokens = np.fromiter((t for d in docs for t in d), dtype=np.int64, count=int(lengths.sum()))
    keys, counts = np.unique(flat_rows * n_features + flat_tokens, return_counts=True)
    return Counts(keys // n_features, keys % n_features, counts.astype(np.float64), len(docs), n_features)


def _scores(x: Counts, w: np.ndarray, b: np.ndarray) -> np.ndarray:
    """X W + b: (n_docs, C)."""
    return np.stack([np.bincount(x.rows, weights=x.counts * w[x.tokens, c], minlength=x.n_docs)
                     for c in range(w.shape[1])], axis=1) + b


def _softmax(z: np.ndarray) -> np.ndarray:
    e = np.exp(z - z.max(axis=1, keepdims=True))
    return e / e.sum(axis=1, keepdims=True)


class LogisticRegression:
    def __init__(self, n_classes: int, l2: float = 1e-4, steps: int = 400, lr: float = 0.05) -> None:
        self.n_classes, self.l2, self.steps, self.lr = n_classes, l2, steps, lr
        self.w = self.b = None

    def fit(self, x: Counts, y: np.ndarray) -> "LogisticRegression":
        c, n = self.n_classes, x.n_docs
        w, b = np.zeros((x.n_features, c)), np.zeros(c)
        m = [np.zeros_like(w), np.zeros_like(b)]
        v = [np.zeros_like(w), np.zeros_like(b)]
        onehot = np.eye(c)[y]
        for t in range(1, self.steps + 1):
            g = (_softmax(_scores(x, w, b)) - onehot) / n  # d(mean CE)/dz  (n, C)
            grad_w = np.stack([np.bincount(x.tokens, weights=x.counts * g[x.rows, k], minlength=x.n_features)
                               for k in range(c)], axis=1) + self.l2 * w
            for i, (param, grad) in enumerate(((w, grad_w), (b, g.sum(axis=0)))):  # Adam (0.9, 0.999)
                m[i] = 0.9 * m[i] + 0.1 * grad
                v[i] = 0.999 * v[i] + 0.001 * grad ** 2
                param -= self.lr * (m[i] / (1 - 0.9 ** t)) / (np.sqrt(v[i] / (1 - 0.999 ** t)) + 1e-8)
        self.w, self.b = w, b
        return self

    def predict_proba(self, x: Counts) -> np.ndarray:
        return _softmax(_scores(x, self.w, self.b))

    def predict(self, x: Counts) -> np.ndarray:
        return self.predict_proba(x).argmax(axis=1)


L2_GRID = (1e-1, 1e-2, 1e-3, 1e-4, 1e-5)


def fit_on_dev(train: Counts, y_train: np.ndarray, dev: Counts, y_dev: np.ndarray, n_classes: int,
               grid=L2_GRID, steps: int = 400) -> tuple[LogisticRegression, dict]:
    """The model of the grid's l2 with the best dev accuracy, and every l2's dev accuracy."""
    best, scores = None, {}
    for l2 in grid:
        model = LogisticRegression(n_classes, l2, steps).fit(train, y_train)
        scores[l2] = float((model.predict(dev) == y_dev).mean())
        if best is None or scores[l2] > scores[best.l2]:
            best = model
    return best, scores
