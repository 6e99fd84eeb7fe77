"""SQuAD 2.0 metrics against the official evaluation script's own output, on real predictions
for the shipped half-dev (6,078 questions, 3,168 unanswerable).

tests/fixtures/squad2_official/ holds a small model's predictions (span offsets into the
contexts and no-answer scores; benchmarks/tools/squad_official_goldens.py made them) and what the
official `evaluate-v2.0.py`, run as a separate program, printed for them: EM/F1, the
HasAns/NoAns breakdown and the best thresholds. The script itself is not part of ember.
"""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest

from conftest import real_data
from ember.tasks.qa.squad import read_squad
from ember.tasks.metrics.squad import squad_evaluate

FIXTURE = Path(__file__).resolve().parents[2] / "fixtures" / "squad2_official"
OFFICIAL_KEYS = ("exact", "f1", "total", "HasAns_exact", "HasAns_f1", "HasAns_total", "NoAns_exact", "NoAns_f1",
                 "NoAns_total", "best_exact", "best_exact_thresh", "best_f1", "best_f1_thresh")


@pytest.fixture(scope="module")
def half_dev():
    """(gold answers per question, predicted span texts, no-answer scores, goldens)."""
    examples = read_squad(real_data("squad2-dev-half", "dev-v2.0.json"))
    record = json.loads((FIXTURE / "predictions.json").read_text())
    preds, na = {}, {}
    for ex in examples:
        p = record["predictions"][ex.qid]
        preds[ex.qid] = ex.context[p["span"][0]:p["span"][1]] if p["span"] else ""
        na[ex.qid] = p["na"]
    gold = {ex.qid: ex.answer_texts for ex in examples}
    return gold, preds, na, json.loads((FIXTURE / "goldens.json").read_text())


def check(ours: dict, official: dict) -> None:
    assert set(OFFICIAL_KEYS) == set(official)
    for key in OFFICIAL_KEYS:
        assert ours[key] == pytest.approx(official[key], abs=1e-9), key


def test_squad2_metrics_match_the_official_script_with_ember_decision_rule(half_dev):
    """Every question's best span, no answer when null - best > the tuned threshold: the official
    script run with that --na-prob-thresh and those scores as its na_prob."""
    gold, preds, na, goldens = half_dev
    official = goldens["ember"]["output"]
    assert official["total"] == 6078 and official["NoAns_total"] == 3168
    check(squad_evaluate(gold, preds, na, threshold=goldens["ember"]["threshold"]), official)


def test_squad2_metrics_match_the_official_script_on_a_submission_file(half_dev):
    """The usual submission: "" where the model abstains, no-answer probabilities (the scores
    through a logistic centred at the cut), the official default threshold 1.0."""
    gold, preds, na, goldens = half_dev
    cut = goldens["submission"]["abstain_above"]
    submission = {qid: "" if na[qid] > cut else text for qid, text in preds.items()}
    probs = {qid: round(1 / (1 + math.exp(cut - v)), 9) for qid, v in na.items()}
    assert sum(not t for t in submission.values()) > 1000  # both kinds of answers are exercised
    check(squad_evaluate(gold, submission, probs, threshold=goldens["submission"]["threshold"]),
          goldens["submission"]["output"])


def test_squad2_golden_predictions_are_a_mix_worth_testing(half_dev):
    """Right, partly right and wrong spans, and tied no-answer scores: the cases the metric and
    the threshold search have to get right."""
    gold, preds, na, goldens = half_dev
    out = goldens["ember"]["output"]
    assert 0 < out["HasAns_exact"] < out["HasAns_f1"] < 100  # some exact, some partial overlaps
    assert 0 < out["NoAns_exact"] < 100
    assert out["best_f1_thresh"] != 0.0 and out["best_f1"] >= out["f1"]  # the search moved off its start
    assert len(set(na.values())) < len(na)  # ties in the no-answer scores
