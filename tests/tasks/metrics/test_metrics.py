"""Metrics against hand-computed confusion matrices and scipy."""

from __future__ import annotations

import math

import numpy as np
import pytest
from scipy import stats

from ember.tasks.readers.glue import TASKS
from ember.tasks.metrics.classification import (
    METRICS,
    accuracy,
    compute_metrics,
    f1_binary,
    f1_macro,
    f1_weighted,
    matthews_corrcoef,
    pearson,
    rankdata,
    spearman,
)

# TP=3, FP=1, FN=2, TN=4
PREDS = [1, 1, 1, 1, 0, 0, 0, 0, 0, 0]
LABELS = [1, 1, 1, 0, 1, 1, 0, 0, 0, 0]


def test_accuracy_counts_matches():
    assert accuracy(PREDS, LABELS) == pytest.approx(0.7)


def test_f1_from_confusion_counts():
    # P = 3/4, R = 3/5 -> F1 = 2PR/(P+R) = 2/3
    assert f1_binary(PREDS, LABELS) == pytest.approx(2 / 3)
    # Class 0 as positive: TP=4, FP=2, FN=1 -> 8/11
    assert f1_binary(PREDS, LABELS, positive=0) == pytest.approx(8 / 11)


def test_f1_without_any_positive_is_zero():
    assert f1_binary([0, 0, 0], [0, 0, 0]) == 0.0
    assert f1_binary([0, 0, 0], [1, 0, 1]) == 0.0


def test_mcc_from_confusion_counts():
    # (TP*TN - FP*FN) / sqrt((TP+FP)(TP+FN)(TN+FP)(TN+FN)) = 10 / sqrt(600)
    assert matthews_corrcoef(PREDS, LABELS) == pytest.approx(10 / math.sqrt(600))


def test_mcc_extremes_and_degenerate_cases():
    y = [0, 1, 1, 0, 1]
    assert matthews_corrcoef(y, y) == pytest.approx(1.0)
    assert matthews_corrcoef([1 - v for v in y], y) == pytest.approx(-1.0)
    assert matthews_corrcoef([1] * 5, y) == 0.0  # all one class predicted: undefined -> 0
    assert matthews_corrcoef([0, 1, 0, 1, 0], [1] * 5) == 0.0  # constant labels
    assert matthews_corrcoef([1] * 4, [1] * 4) == 0.0


def test_mcc_multiclass_matches_gorodkin_formula():
    # Confusion (rows true): [[2,1,0],[0,2,1],[1,0,3]]; t=(3,3,4) p=(3,3,4) c=7 s=10
    y = [0, 0, 0, 1, 1, 1, 2, 2, 2, 2]
    p = [0, 0, 1, 1, 1, 2, 0, 2, 2, 2]
    expected = (7 * 10 - (9 + 9 + 16)) / math.sqrt((100 - 34) * (100 - 34))
    assert matthews_corrcoef(p, y) == pytest.approx(expected)


def test_macro_and_weighted_f1_hand_computed():
    y = [0, 0, 0, 1, 1, 2]
    p = [0, 0, 1, 1, 2, 2]
    # class 0: TP2 FP0 FN1 -> 0.8; class 1: TP1 FP1 FN1 -> 0.5; class 2: TP1 FP1 FN0 -> 2/3
    f1s = np.array([0.8, 0.5, 2 / 3])
    assert f1_macro(p, y) == pytest.approx(f1s.mean())
    assert f1_weighted(p, y) == pytest.approx((f1s * [3, 2, 1]).sum() / 6)
    # A class named but absent everywhere contributes 0 to the macro mean.
    assert f1_macro(p, y, classes=[0, 1, 2, 3]) == pytest.approx(f1s.sum() / 4)


def test_rankdata_averages_ties_like_scipy():
    a = [3.0, 1.0, 4.0, 1.0, 5.0, 9.0, 2.0, 6.0, 5.0, 3.0, 5.0]
    np.testing.assert_allclose(rankdata(a), stats.rankdata(a))


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_correlations_match_scipy(seed):
    rng = np.random.default_rng(seed)
    x = rng.normal(size=200)
    y = 0.5 * x + rng.normal(size=200)
    # Rounded copies create many ties for Spearman.
    xr, yr = np.round(x), np.round(y * 2) / 2
    for a, b in ((x, y), (xr, yr)):
        assert pearson(a, b) == pytest.approx(stats.pearsonr(a, b)[0], abs=1e-12)
        assert spearman(a, b) == pytest.approx(stats.spearmanr(a, b)[0], abs=1e-12)


def test_correlation_of_constant_input_is_nan_like_scipy():
    assert math.isnan(pearson([1.0, 1.0, 1.0], [1.0, 2.0, 3.0]))
    assert math.isnan(spearman([2.0, 2.0, 2.0], [1.0, 2.0, 3.0]))


def test_mismatched_lengths_are_rejected():
    with pytest.raises(ValueError, match="3 predictions vs 2 labels"):
        accuracy([0, 1, 1], [0, 1])


def test_every_task_metric_is_implemented():
    for spec in TASKS.values():
        assert set(spec.metrics) <= set(METRICS)
        assert spec.main_metric in spec.metrics


def test_compute_metrics_gives_official_glue_metrics():
    assert set(compute_metrics("sst2", [1, 0], [1, 1])) == {"accuracy"}
    assert compute_metrics("CoLA", PREDS, LABELS) == {
        "mcc": pytest.approx(10 / math.sqrt(600))
    }
    mrpc = compute_metrics("mrpc", PREDS, LABELS)
    assert mrpc["f1"] == pytest.approx(2 / 3) and mrpc["accuracy"] == pytest.approx(0.7)
    assert mrpc["combined"] == pytest.approx((2 / 3 + 0.7) / 2)
    sts = compute_metrics("sts-b", [[0.1], [2.0], [4.5]], [0.0, 3.0, 5.0])
    assert set(sts) == {"pearson", "spearman", "combined"}
    assert sts["spearman"] == pytest.approx(1.0)


def test_compute_metrics_argmaxes_logits():
    logits = np.array([[2.0, -1.0, 0.0], [0.0, 3.0, 1.0], [0.0, 0.0, 5.0]])
    assert compute_metrics("snli", logits, [0, 1, 1]) == {"accuracy": pytest.approx(2 / 3)}
