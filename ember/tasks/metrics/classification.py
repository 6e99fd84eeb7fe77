"""Evaluation metrics in plain numpy (no sklearn/scipy at run time).

Conventions follow the references the published numbers were computed with:
  * ``f1_binary`` / ``f1_macro`` / ``f1_weighted`` and ``matthews_corrcoef`` match sklearn,
    including its 0.0 for undefined cases (no positive predictions and labels; a constant
    prediction or label vector for MCC).
  * ``pearson`` / ``spearman`` match ``scipy.stats.pearsonr`` / ``spearmanr``; like scipy they
    return NaN when a correlation is undefined (constant input) -- NaN never wins a
    "best checkpoint" comparison, which is the behaviour we want.
Values are fractions in [0, 1] (correlations in [-1, 1]), not percentages.
"""

from __future__ import annotations

from typing import Callable

import numpy as np

from ember.tasks.readers.glue import TaskSpec, get_task


def _pair(preds, labels, dtype=None) -> tuple[np.ndarray, np.ndarray]:
    p = np.asarray(preds, dtype=dtype).reshape(-1)
    y = np.asarray(labels, dtype=dtype).reshape(-1)
    if p.shape != y.shape:
        raise ValueError(f"{p.size} predictions vs {y.size} labels")
    if p.size == 0:
        raise ValueError("no predictions to score")
    return p, y


def accuracy(preds, labels) -> float:
    p, y = _pair(preds, labels)
    return float(np.mean(p == y))


def _prf_counts(p: np.ndarray, y: np.ndarray, cls) -> tuple[int, int, int]:
    tp = int(np.sum((p == cls) & (y == cls)))
    fp = int(np.sum((p == cls) & (y != cls)))
    fn = int(np.sum((p != cls) & (y == cls)))
    return tp, fp, fn


def _f1(tp: int, fp: int, fn: int) -> float:
    # 2TP / (2TP + FP + FN) equals 2PR/(P+R) and is 0.0 (sklearn's zero_division) when the
    # class is neither predicted nor present.
    denom = 2 * tp + fp + fn
    return 0.0 if denom == 0 else 2 * tp / denom


def f1_binary(preds, labels, positive=1) -> float:
    p, y = _pair(preds, labels)
    return _f1(*_prf_counts(p, y, positive))


def _per_class_f1(preds, labels, classes=None) -> tuple[np.ndarray, np.ndarray]:
    p, y = _pair(preds, labels)
    # sklearn's default class set is the union of true and predicted labels.
    classes = np.union1d(p, y) if classes is None else np.asarray(classes)
    f1s = np.array([_f1(*_prf_counts(p, y, c)) for c in classes], dtype=np.float64)
    support = np.array([np.sum(y == c) for c in classes], dtype=np.float64)
    return f1s, support


def f1_macro(preds, labels, classes=None) -> float:
    """Unweighted mean of per-class F1 (RuSentiment reports this)."""
    f1s, _ = _per_class_f1(preds, labels, classes)
    return float(f1s.mean())


def f1_weighted(preds, labels, classes=None) -> float:
    """Per-class F1 weighted by true-class support."""
    f1s, support = _per_class_f1(preds, labels, classes)
    total = support.sum()
    return 0.0 if total == 0 else float((f1s * support).sum() / total)


def matthews_corrcoef(preds, labels) -> float:
    """MCC (CoLA's metric); Gorodkin's multi-class form, which reduces to the binary one.

    From the confusion matrix C: t = true counts, p = predicted counts, c = trace, s = total;
    MCC = (c*s - t.p) / sqrt((s^2 - p.p) (s^2 - t.t)), defined as 0.0 when the denominator
    is 0 (e.g. every prediction is the same class), as sklearn does.
    """
    p, y = _pair(preds, labels)
    classes, inverse = np.unique(np.concatenate([p, y]), return_inverse=True)
    k = len(classes)
    pi, yi = inverse[: p.size], inverse[p.size :]
    conf = np.zeros((k, k), dtype=np.float64)  # rows: true class, columns: predicted
    np.add.at(conf, (yi, pi), 1.0)
    t, q = conf.sum(axis=1), conf.sum(axis=0)
    c, s = np.trace(conf), conf.sum()
    cov_yp = c * s - t @ q
    denom = np.sqrt((s * s - q @ q) * (s * s - t @ t))
    return 0.0 if denom == 0 else float(cov_yp / denom)


def pearson(x, y) -> float:
    a, b = _pair(x, y, dtype=np.float64)
    if a.size < 2:
        raise ValueError("a correlation needs at least 2 points")
    if np.isnan(a).any() or np.isnan(b).any():
        return float("nan")
    a = a - a.mean()
    b = b - b.mean()
    denom = np.sqrt((a @ a) * (b @ b))
    if denom == 0:
        return float("nan")
    return float(np.clip((a @ b) / denom, -1.0, 1.0))


def rankdata(a) -> np.ndarray:
    """1-based ranks with ties given their average rank (scipy's method='average')."""
    a = np.asarray(a).reshape(-1)
    order = np.argsort(a, kind="mergesort")
    sorted_a = a[order]
    starts_group = np.r_[True, sorted_a[1:] != sorted_a[:-1]]
    group = np.cumsum(starts_group) - 1  # tie-group id of each sorted position
    starts = np.flatnonzero(starts_group)
    counts = np.diff(np.r_[starts, a.size])
    mean_rank = starts + (counts + 1) / 2.0  # average of 1-based ranks start+1..start+count
    ranks = np.empty(a.size, dtype=np.float64)
    ranks[order] = mean_rank[group]
    return ranks


def spearman(x, y) -> float:
    a, b = _pair(x, y, dtype=np.float64)
    if np.isnan(a).any() or np.isnan(b).any():
        return float("nan")  # NaNs have no rank; scipy propagates them too
    return pearson(rankdata(a), rankdata(b))


METRICS: dict[str, Callable[..., float]] = {
    "accuracy": accuracy,
    "f1": f1_binary,
    "f1_macro": f1_macro,
    "f1_weighted": f1_weighted,
    "mcc": matthews_corrcoef,
    "pearson": pearson,
    "spearman": spearman,
}


def compute_metrics(spec: TaskSpec | str, preds, labels) -> dict[str, float]:
    """The task's official metrics, e.g. ``{"f1": .., "accuracy": .., "combined": ..}``.

    ``preds`` may be class ids, logits of shape (N, num_labels) (arg-maxed here) or, for
    regression, scores of shape (N,) or (N, 1). With more than one metric, ``combined`` is
    their mean, which is how the GLUE leaderboard scores MRPC and STS-B.
    """
    spec = get_task(spec)
    p = np.asarray(preds)
    if spec.is_regression:
        p = p.astype(np.float64).reshape(-1)
        y = np.asarray(labels, dtype=np.float64).reshape(-1)
    else:
        if p.ndim == 2:
            p = p.argmax(axis=-1)
        p = p.astype(np.int64).reshape(-1)
        y = np.asarray(labels).astype(np.int64).reshape(-1)
    out = {name: METRICS[name](p, y) for name in spec.metrics}
    if len(out) > 1:
        out["combined"] = float(np.mean(list(out.values())))
    return out


def summarize_seeds(results: list[dict]) -> dict:
    """Per metric over seeds: mean, sample std (None for one seed), median and the values."""
    names = results[0]["metrics"].keys()
    summary = {}
    for name in names:
        values = np.asarray([r["metrics"][name] for r in results], dtype=np.float64)
        # one seed has no spread: std None (shown as no "±", as glue_average does), not 0.0
        summary[name] = {"mean": float(values.mean()), "std": float(values.std(ddof=1)) if len(values) > 1 else None,
                         "median": float(np.median(values)), "values": values.tolist()}
    return summary
