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
    summarize_seeds,
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


@pytest.mark.parametrize("seed", range(6))
def test_classification_metrics_match_sklearn_on_random_labels(seed):
    """accuracy, binary / macro / weighted F1 and MCC against sklearn on random predictions,
    binary and multi-class, including classes that are never predicted or never present."""
    sk = pytest.importorskip("sklearn.metrics")
    rng = np.random.default_rng(seed)
    k = [2, 2, 3, 3, 5, 5][seed]
    n = int(rng.integers(3, 40))
    y = rng.integers(0, k, n)
    p = np.where(rng.random(n) < 0.5, y, rng.integers(0, k - 1 if seed % 2 else k, n))  # class k-1 may go unpredicted
    assert accuracy(p, y) == pytest.approx(sk.accuracy_score(y, p), abs=1e-12)
    for positive in range(k):
        assert f1_binary(p, y, positive=positive) == pytest.approx(
            sk.f1_score(y, p, labels=[positive], average="macro", zero_division=0.0), abs=1e-12)
    assert f1_macro(p, y) == pytest.approx(sk.f1_score(y, p, average="macro", zero_division=0.0), abs=1e-12)
    assert f1_weighted(p, y) == pytest.approx(sk.f1_score(y, p, average="weighted", zero_division=0.0), abs=1e-12)
    named = list(range(k + 1))  # one class named that is absent everywhere
    assert f1_macro(p, y, classes=named) == pytest.approx(
        sk.f1_score(y, p, labels=named, average="macro", zero_division=0.0), abs=1e-12)
    assert f1_weighted(p, y, classes=named) == pytest.approx(
        sk.f1_score(y, p, labels=named, average="weighted", zero_division=0.0), abs=1e-12)
    assert matthews_corrcoef(p, y) == pytest.approx(sk.matthews_corrcoef(y, p), abs=1e-12)


def test_weighted_f1_of_classes_without_support_is_zero_like_sklearn():
    sk = pytest.importorskip("sklearn.metrics")
    # only classes that no label has: every weight is 0, sklearn's zero_division gives 0.0
    assert f1_weighted([0, 1], [0, 1], classes=[2, 3]) == 0.0
    assert f1_weighted([1], [1]) == 1.0 == sk.f1_score([1], [1], average="weighted")  # support 1 is support
    assert sk.f1_score([0, 1], [0, 1], labels=[2, 3], average="weighted", zero_division=0.0) == 0.0


def test_mcc_with_one_sided_constant_vectors_is_zero_and_matches_sklearn():
    sk = pytest.importorskip("sklearn.metrics")
    for p, y in (([2, 2, 2], [0, 1, 2]), ([0, 1, 2], [1, 1, 1]), ([0, 1], [1, 0]), ([0, 2, 1, 2], [2, 0, 1, 1])):
        assert matthews_corrcoef(p, y) == pytest.approx(sk.matthews_corrcoef(y, p), abs=1e-12)


def test_correlations_of_two_and_three_points_and_nan_match_scipy():
    """The smallest inputs (2 points: always +-1), perfect anti-correlation, NaNs, and the
    refusal of a single point."""
    for a, b in (([1.0, 2.0], [3.0, 1.0]), ([1.0, 2.0, 3.0], [6.0, 4.0, 2.0]), ([0.0, 1.0, 5.0], [1.0, 0.0, 2.0])):
        assert pearson(a, b) == pytest.approx(stats.pearsonr(a, b)[0], abs=1e-12)
        assert spearman(a, b) == pytest.approx(stats.spearmanr(a, b)[0], abs=1e-12)
    assert pearson([1.0, 2.0, 3.0], [6.0, 4.0, 2.0]) == -1.0
    # a linear relation whose rounding gives 1 + 2^-52 before the clip; scipy clips too
    x = np.array([-0.7, -0.1, 0.8, 1.5])
    assert pearson(x, 3 * x + 1) == 1.0 == stats.pearsonr(x, 3 * x + 1)[0]
    x = np.array([0.78, 1.49, -1.26, 1.51])  # and -1 - 2^-52 here (scipy's own rounding gives -1 + 2^-53)
    assert pearson(x, 1 - 3 * x) == -1.0 and stats.pearsonr(x, 1 - 3 * x)[0] == pytest.approx(-1.0, abs=1e-15)
    for a, b in (([1.0, np.nan, 3.0], [1.0, 2.0, 3.0]), ([1.0, 2.0, 3.0], [1.0, np.nan, 3.0])):
        assert math.isnan(pearson(a, b)) and math.isnan(spearman(a, b))
        assert math.isnan(stats.pearsonr(a, b)[0]) and math.isnan(stats.spearmanr(a, b)[0])
    with pytest.raises(ValueError, match="at least 2 points"):
        pearson([1.0], [2.0])
    with pytest.raises(ValueError, match="no predictions"):
        accuracy([], [])


@pytest.mark.parametrize("seed", range(3))
def test_rankdata_matches_scipy_on_random_ties_and_orders(seed):
    rng = np.random.default_rng(seed)
    a = rng.integers(0, 6, int(rng.integers(1, 30))).astype(float)  # many ties, any first/last value
    np.testing.assert_array_equal(rankdata(a), stats.rankdata(a))


def test_compute_metrics_regression_reads_column_scores_and_classification_float_labels():
    sts = compute_metrics("sts-b", np.array([[0.5], [1.0], [4.0], [2.0]]), [0.0, 1.0, 5.0, 3.0])
    assert sts["pearson"] == pytest.approx(stats.pearsonr([0.5, 1.0, 4.0, 2.0], [0.0, 1.0, 5.0, 3.0])[0], abs=1e-12)
    assert sts["pearson"] < 0.99 and sts["spearman"] == pytest.approx(1.0)  # same order, not linear
    assert sts["combined"] == pytest.approx((sts["pearson"] + 1.0) / 2)
    # labels read from a file as floats are class ids; one metric -> no "combined"
    logits = np.array([[0.2, 0.9], [0.8, 0.1], [0.3, 0.4]])  # (N, classes): arg-max per row
    assert compute_metrics("sst2", logits, [1.0, 1.0, 1.0]) == {"accuracy": pytest.approx(2 / 3)}


def test_summarize_seeds_mean_sample_std_and_median():
    results = [{"metrics": {"accuracy": v, "f1": 2 * v}} for v in (0.5, 0.9, 0.6)]
    summary = summarize_seeds(results)
    assert summary["accuracy"]["mean"] == pytest.approx(2.0 / 3)
    assert summary["accuracy"]["std"] == pytest.approx(np.std([0.5, 0.9, 0.6], ddof=1))  # sample std
    assert summary["accuracy"]["median"] == pytest.approx(0.6)
    assert summary["f1"]["values"] == pytest.approx([1.0, 1.8, 1.2])
    assert summarize_seeds(results[:2])["accuracy"]["std"] == pytest.approx(np.std([0.5, 0.9], ddof=1))
    assert summarize_seeds(results[:1])["accuracy"]["std"] is None
