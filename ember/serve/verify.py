"""Compare an exported model with its original on real inputs, and time both.

Reported: the largest and mean absolute logit difference over real (non-padding)
positions, the fraction of predictions that agree (as the inference model's ``compare_view``
defines them: arg-max label per sentence, per token for tagging and fill-mask, start/end token
for QA; none for regression or embeddings), and each model's
sentences per second. Batches (sorted by length, padded per batch as the server does) go
through the two models alternately, so a busy machine slows both alike.
"""

from __future__ import annotations

import time
from typing import Sequence

import numpy as np

from ember.serve.inputs import pad_arrays
from ember.tasks.batching import length_sorted_batches


def compare(reference, candidate, rows: Sequence[tuple[list, list]], view, pad_id: int,
            batch_size: int = 32, regression: bool = False) -> dict:
    """``view(logits, attention_mask, regression) -> (real positions, predictions or None)`` is the
    inference model's ``compare_view``: which logits are real and what they predict."""
    max_diff, diff_sum, n_values, agree, n_preds = 0.0, 0.0, 0, 0, 0
    seconds = {"reference": 0.0, "candidate": 0.0}
    for chunk in length_sorted_batches([len(ids) for ids, _ in rows], batch_size):
        arrays = pad_arrays([rows[i] for i in chunk], pad_id)
        outs = {}
        for name, runner in (("reference", reference), ("candidate", candidate)):
            t0 = time.perf_counter()
            outs[name], _ = runner(arrays)
            seconds[name] += time.perf_counter() - t0
        ref, cand = outs["reference"], outs["candidate"]
        valid, p_ref = view(ref, arrays["attention_mask"], regression)
        diff = np.abs(ref.astype(np.float64) - cand)[valid]
        max_diff = max(max_diff, float(diff.max()))
        diff_sum, n_values = diff_sum + float(diff.sum()), n_values + diff.size
        if p_ref is not None:
            _, p_cand = view(cand, arrays["attention_mask"], regression)
            agree, n_preds = agree + int((p_ref == p_cand).sum()), n_preds + p_ref.size
    n = len(rows)
    return {
        "inputs": n,
        "batch_size": batch_size,
        "max_abs_diff": max_diff,
        "mean_abs_diff": diff_sum / max(n_values, 1),
        "prediction_agreement": agree / n_preds if n_preds else None,
        "reference_per_s": n / seconds["reference"] if seconds["reference"] else None,
        "candidate_per_s": n / seconds["candidate"] if seconds["candidate"] else None,
    }
