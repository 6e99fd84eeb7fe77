"""SQuAD EM/F1 against hand-computed cases (official evaluate-v2.0.py behaviour)."""

from __future__ import annotations

import random

import pytest

from ember.tasks.metrics.squad import (
    apply_no_answer_threshold,
    best_threshold,
    exact_match,
    f1_score,
    normalize_answer,
    raw_scores,
    squad_evaluate,
)


def test_squad_normalization_lowercases_strips_punctuation_articles_and_spaces():
    assert normalize_answer("The  Quick, brown fox!") == "quick brown fox"
    assert normalize_answer("an apple a day") == "apple day"
    # Articles only as whole words; punctuation goes before articles are matched.
    assert normalize_answer("Theater anthem") == "theater anthem"
    assert normalize_answer("the-end") == "theend"
    assert normalize_answer("(A) 10th  century.") == "10th century"
    assert normalize_answer("") == ""


def test_squad_f1_is_bag_of_tokens_overlap():
    # gold [cat, sat, on, mat], pred [cat, sat]: P = 1, R = 1/2, F1 = 2/3.
    assert f1_score("the cat sat on the mat", "cat sat") == pytest.approx(2 / 3)
    # Multiplicity counts: gold [x, y, y], pred [y, y, y] share 2 -> P = R = 2/3.
    assert f1_score("x y y", "y y y") == pytest.approx(2 / 3)
    assert f1_score("Paris", "London") == 0.0
    assert exact_match("The Eiffel Tower.", "eiffel tower") == 1


def test_squad_scores_take_max_over_references():
    exact, f1 = raw_scores({"q": ["Denver Broncos", "Broncos"]}, {"q": "the Broncos"})
    assert exact["q"] == 1.0 and f1["q"] == 1.0
    # Best reference for F1 need not be the one for EM: "blue whale" gives 2/3 to "whale".
    exact, f1 = raw_scores({"q": ["blue whale", "a large mammal"]}, {"q": "whale"})
    assert exact["q"] == 0.0 and f1["q"] == pytest.approx(2 / 3)


def test_squad2_no_answer_edge_cases():
    gold = {"empty_vs_none": [], "span_vs_none": [], "empty_vs_span": ["x"],
            "gold_normalizes_to_nothing": ["the", "."]}
    preds = {"empty_vs_none": "", "span_vs_none": "Paris", "empty_vs_span": "",
             "gold_normalizes_to_nothing": ""}
    exact, f1 = raw_scores(gold, preds)
    # Empty prediction vs no-answer gold = 1; any prediction vs no-answer gold = 0.
    assert exact["empty_vs_none"] == f1["empty_vs_none"] == 1.0
    assert exact["span_vs_none"] == f1["span_vs_none"] == 0.0
    assert exact["empty_vs_span"] == f1["empty_vs_span"] == 0.0
    # The official script drops references that normalise to "", leaving a no-answer gold.
    assert exact["gold_normalizes_to_nothing"] == 1.0


def test_squad2_report_has_hasans_and_noans_breakdown():
    gold = {"q1": ["Paris"], "q2": ["blue whale"], "q3": [], "q4": []}
    preds = {"q1": "Paris", "q2": "whale", "q3": "", "q4": "x"}
    out = squad_evaluate(gold, preds)
    assert out["exact"] == pytest.approx(50.0)
    assert out["f1"] == pytest.approx(100 * (1 + 2 / 3 + 1 + 0) / 4)
    assert out["HasAns_exact"] == pytest.approx(50.0)
    assert out["HasAns_f1"] == pytest.approx(100 * (1 + 2 / 3) / 2)
    assert out["NoAns_exact"] == out["NoAns_f1"] == pytest.approx(50.0)
    assert out["total"] == 4 and out["HasAns_total"] == 2 and out["NoAns_total"] == 2
    assert "best_f1" not in out  # no no-answer scores given


def _threshold_case():
    # Predictions are each question's best non-null span; na = null score - span score.
    gold = {"q1": ["Paris"], "q2": ["Rome"], "q3": [], "q4": [], "q5": ["Oslo"]}
    preds = {"q1": "Paris", "q2": "Madrid", "q3": "x", "q4": "y", "q5": "Oslo"}
    na = {"q1": -2.0, "q2": 0.5, "q3": 1.0, "q4": -1.0, "q5": 3.0}
    return gold, preds, na


def test_squad2_best_threshold_search_by_hand():
    gold, preds, na = _threshold_case()
    exact, _ = raw_scores(gold, preds)
    has = {q: bool(a) for q, a in gold.items()}
    # Walk na ascending from "all no-answer" (2 right): q1 +1 -> 3 (best, thresh -2),
    # q4 -1 -> 2, q2 +0 -> 2, q3 -1 -> 1, q5 +1 -> 2. Best 3/5 at threshold -2.
    assert best_threshold(preds, exact, na, has) == (pytest.approx(60.0), -2.0)
    # Check by applying it: null iff na > -2 -> q1 answered right, q3/q4 null right, q2/q5 wrong.
    out = squad_evaluate(gold, preds, na, threshold=-2.0)
    assert out["exact"] == pytest.approx(60.0)


def test_squad2_report_applies_threshold_and_reports_best():
    gold, preds, na = _threshold_case()
    out = squad_evaluate(gold, preds, na, threshold=0.0)
    # null iff na > 0: q1 right, q4 answers "y" (0), q2 null on an answerable (0), q3 null right,
    # q5 null on an answerable (0): 2/5.
    assert out["exact"] == pytest.approx(40.0) and out["f1"] == pytest.approx(40.0)
    assert out["NoAns_exact"] == pytest.approx(50.0) and out["HasAns_exact"] == pytest.approx(100 / 3)
    assert out["best_exact"] == pytest.approx(60.0) and out["best_exact_thresh"] == -2.0
    assert out["best_f1"] == pytest.approx(60.0) and out["best_f1_thresh"] == -2.0


def test_squad2_best_threshold_keeps_all_null_when_nothing_gains():
    # Two unanswerable questions with spans predicted: answering either loses, so the
    # official search keeps its starting point, "all no-answer" at threshold 0.0 (whatever the
    # scores: find_best_thresh starts from best_thresh = 0.0, not from below the lowest score).
    gold, preds, na = {"a": [], "b": []}, {"a": "x", "b": "y"}, {"a": 3.0, "b": 5.0}
    exact, _ = raw_scores(gold, preds)
    assert best_threshold(preds, exact, na, {"a": False, "b": False}) == (100.0, 0.0)


def test_squad2_tuned_threshold_is_realizable_when_no_answer_scores_tie():
    # Four questions with the same no-answer score (a barely trained model ties a lot).
    # Ascending order puts the two answerable, right ones first: the official sweep stops
    # inside the tie group (+2 over "all null") and reports a best no threshold can give,
    # since every threshold treats the four alike.
    gold = {"a": ["x"], "b": ["y"], "c": [], "d": []}
    preds = {"a": "x", "b": "y", "c": "z", "d": "w"}
    na = dict.fromkeys(gold, 0.5)
    has = {q: bool(v) for q, v in gold.items()}
    exact, _ = raw_scores(gold, preds)
    official, official_t = best_threshold(preds, exact, na, has)
    assert official == pytest.approx(100.0)  # 4/4: not achievable
    for t in (official_t, 0.4, 0.6):  # answer all (2/4) or none (2/4)
        assert squad_evaluate(gold, preds, na, threshold=t)["exact"] == pytest.approx(50.0)
    tuned, tuned_t = best_threshold(preds, exact, na, has, realizable=True)
    assert tuned == pytest.approx(50.0)
    assert squad_evaluate(gold, preds, na, threshold=tuned_t)["exact"] == pytest.approx(tuned)


def test_squad2_tuned_threshold_equals_official_without_ties_and_can_answer_nothing():
    gold, preds, na = _threshold_case()
    exact, _ = raw_scores(gold, preds)
    has = {q: bool(a) for q, a in gold.items()}
    assert best_threshold(preds, exact, na, has, realizable=True) == best_threshold(preds, exact, na, has)
    # nothing gains: "all no-answer" needs a threshold below every score (0.0 would answer "a")
    gold, preds, na = {"a": [], "b": []}, {"a": "x", "b": "y"}, {"a": -1.0, "b": 2.0}
    score, t = best_threshold(preds, raw_scores(gold, preds)[0], na, {"a": False, "b": False}, realizable=True)
    assert score == 100.0 and squad_evaluate(gold, preds, na, threshold=t)["exact"] == 100.0


def test_squad_missing_prediction_is_an_error():
    with pytest.raises(ValueError, match="no prediction for 1 question"):
        squad_evaluate({"q1": ["a"], "q2": ["b"]}, {"q1": "a"})


def test_squad_questions_marked_wrong_score_zero_whatever_their_text():
    # A text-to-text answer that is no span of its context counts as wrong even if it matches.
    exact, f1 = raw_scores({"q1": ["Paris"], "q2": ["Rome"]}, {"q1": "Paris", "q2": "Rome"}, wrong={"q2"})
    assert exact == {"q1": 1.0, "q2": 0.0} and f1 == {"q1": 1.0, "q2": 0.0}


def test_squad2_default_threshold_answers_no_answer_when_the_null_score_wins():
    # na = null score - best span score: by default the null answer is taken exactly when it
    # scores higher than the best span (na > 0), as HF's null_score_diff_threshold = 0.0.
    gold, preds = {"q1": [], "q2": ["Oslo"]}, {"q1": "x", "q2": "Oslo"}
    out = squad_evaluate(gold, preds, na={"q1": 0.5, "q2": -0.5})
    assert out["exact"] == pytest.approx(100.0)


def _all_threshold_totals(scores, na, has):
    """Total (%) at every threshold that gives a different decision: below all, and each na."""
    candidates = [min(na.values()) - 1.0, *sorted(set(na.values()))]
    return {t: 100.0 * sum(apply_no_answer_threshold(scores, na, has, t).values()) / len(scores)
            for t in candidates}


def test_squad2_tuned_threshold_is_the_best_any_threshold_achieves_with_ties():
    # Brute force over every threshold on seeded random cases whose no-answer scores tie
    # often: the realizable search finds the maximum and its threshold gives exactly it; the
    # official search never reports less (it may report more: the unreachable tie case).
    rng = random.Random(0)
    for _ in range(200):
        n = rng.randint(1, 7)
        has = {f"q{i}": rng.random() < 0.5 for i in range(n)}
        preds = {q: rng.choice(["", "x"]) for q in has}
        scores = {q: (rng.choice([0.0, 0.5, 1.0]) if has[q] else float(not preds[q])) for q in has}
        na = {q: float(rng.randint(-2, 2)) for q in has}
        totals = _all_threshold_totals(scores, na, has)
        tuned, tuned_t = best_threshold(preds, scores, na, has, realizable=True)
        assert tuned == pytest.approx(max(totals.values()))
        assert 100.0 * sum(apply_no_answer_threshold(scores, na, has, tuned_t).values()) / n == pytest.approx(tuned)
        assert best_threshold(preds, scores, na, has)[0] >= tuned - 1e-9


def test_squad2_best_threshold_keeps_the_running_maximum_not_the_last_gain():
    # +1 at na = 0.1 (best, 2/3), then answering the unanswerable q2 loses one, then +1 again
    # only ties the best: the search keeps the first maximum and its threshold.
    gold, preds = {"q1": ["a"], "q2": [], "q3": ["c"]}, {"q1": "a", "q2": "x", "q3": "c"}
    na = {"q1": 0.1, "q2": 0.2, "q3": 0.3}
    exact, _ = raw_scores(gold, preds)
    has = {q: bool(a) for q, a in gold.items()}
    for realizable in (False, True):
        assert best_threshold(preds, exact, na, has, realizable) == (pytest.approx(200 / 3), 0.1)


def test_squad2_report_tuned_f1_is_the_tie_aware_search():
    # The tie case above through the report: best_f1 is the official (unreachable) figure,
    # tuned_f1 the one its own threshold gives.
    gold = {"a": ["x"], "b": ["y"], "c": [], "d": []}
    preds = {"a": "x", "b": "y", "c": "z", "d": "w"}
    out = squad_evaluate(gold, preds, na=dict.fromkeys(gold, 0.5))
    assert out["best_f1"] == pytest.approx(100.0) and out["tuned_f1"] == pytest.approx(50.0)
    assert squad_evaluate(gold, preds, na=dict.fromkeys(gold, 0.5),
                          threshold=out["tuned_f1_thresh"])["f1"] == pytest.approx(50.0)
