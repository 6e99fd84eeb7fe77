"""SQuAD EM / F1 exactly as the official v2.0 evaluation script computes them.

Normalisation (Rajpurkar et al. 2016, §5; ``evaluate-v2.0.py``): lower-case, drop ASCII
punctuation, drop the articles a/an/the as whole words, collapse whitespace. EM is 1 when the
normalised strings are equal; F1 is the harmonic mean of token precision and recall over the
bag of normalised tokens. Both take the maximum over the reference answers.

Unanswerable questions (SQuAD 2.0, Rajpurkar et al. 2018, §5): references whose normalised
text is empty are dropped and an unanswerable question's only reference is ``""``, so an
empty prediction scores 1 and any other prediction 0 (EM and F1 alike).

No-answer threshold: a system gives, per question, its best span and a no-answer score
``na`` (here the score difference null - best span). It answers "no answer" when
``na > threshold``. ``best_thresh`` walks the questions in increasing ``na`` order and keeps
the threshold that maximises the total, as the official ``find_best_thresh`` does (which
starts from "every question unanswered" with threshold 0.0 and only moves on a strict gain).
"""

from __future__ import annotations

import collections
import re
import string
from typing import Collection, Mapping, Sequence

_PUNCTUATION = set(string.punctuation)
_ARTICLES = re.compile(r"\b(a|an|the)\b", re.UNICODE)


def normalize_answer(text: str) -> str:
    """Lower-case, strip punctuation, articles and extra whitespace (official order)."""
    text = "".join(ch for ch in text.lower() if ch not in _PUNCTUATION)
    text = _ARTICLES.sub(" ", text)
    return " ".join(text.split())


def _tokens(text: str) -> list[str]:
    return normalize_answer(text).split() if text else []


def exact_match(gold: str, pred: str) -> int:
    return int(normalize_answer(gold) == normalize_answer(pred))


def f1_score(gold: str, pred: str) -> float:
    gold_toks, pred_toks = _tokens(gold), _tokens(pred)
    if not gold_toks or not pred_toks:  # no-answer: 1 if both are empty, else 0
        return float(gold_toks == pred_toks)
    common = collections.Counter(gold_toks) & collections.Counter(pred_toks)
    same = sum(common.values())
    if same == 0:
        return 0.0
    precision, recall = same / len(pred_toks), same / len(gold_toks)
    return 2 * precision * recall / (precision + recall)


def raw_scores(gold: Mapping[str, Sequence[str]], preds: Mapping[str, str], wrong: Collection[str] = ()
               ) -> tuple[dict[str, float], dict[str, float]]:
    """Per-question EM and F1, maxima over the references (``[]`` = unanswerable). Questions in
    ``wrong`` score 0 whatever their text (a generated answer that is no valid answer)."""
    missing = [qid for qid in gold if qid not in preds]
    if missing:
        raise ValueError(f"no prediction for {len(missing)} question(s), e.g. {missing[:3]}")
    exact, f1 = {}, {}
    for qid, answers in gold.items():
        references = [a for a in answers if normalize_answer(a)] or [""]
        exact[qid] = 0.0 if qid in wrong else float(max(exact_match(a, preds[qid]) for a in references))
        f1[qid] = 0.0 if qid in wrong else max(f1_score(a, preds[qid]) for a in references)
    return exact, f1


def apply_no_answer_threshold(scores: Mapping[str, float], na: Mapping[str, float],
                              has_answer: Mapping[str, bool], threshold: float) -> dict[str, float]:
    """Questions with ``na > threshold`` are answered "no answer": 1 if right, else 0."""
    return {qid: float(not has_answer[qid]) if na[qid] > threshold else score
            for qid, score in scores.items()}


def best_threshold(preds: Mapping[str, str], scores: Mapping[str, float], na: Mapping[str, float],
                   has_answer: Mapping[str, bool], realizable: bool = False) -> tuple[float, float]:
    """(best total in %, its threshold), sweeping na ascending from "everything no answer".

    ``realizable=False`` is the official ``find_best_thresh``. It can report a total no
    threshold achieves: it may stop inside a group of tied no-answer scores (a barely trained
    model gives many ties), and its "everything unanswered" start keeps threshold 0.0, which
    leaves questions with na <= 0 answered. ``realizable=True`` only takes a candidate after a
    whole tie group and starts below every score, so applying the threshold with ``na > t``
    gives exactly the total; this is the threshold `ember finetune` keeps (RUN/tuned.json).
    """
    ordered = sorted(scores, key=lambda q: na[q])
    current = best = sum(not has_answer[qid] for qid in scores)  # everything "no answer"
    threshold = (na[ordered[0]] - 1.0) if realizable and ordered else 0.0
    for i, qid in enumerate(ordered):
        if has_answer[qid]:
            current += scores[qid]
        elif preds[qid]:
            current -= 1  # answering an unanswerable question loses its point
        end_of_ties = i + 1 == len(ordered) or na[ordered[i + 1]] != na[qid]
        if current > best and (end_of_ties or not realizable):
            best, threshold = current, na[qid]
    return 100.0 * best / len(scores), threshold


def _summary(exact: Mapping[str, float], f1: Mapping[str, float], qids: list[str],
             prefix: str = "") -> dict[str, float]:
    n = len(qids)
    return {f"{prefix}exact": 100.0 * sum(exact[q] for q in qids) / n,
            f"{prefix}f1": 100.0 * sum(f1[q] for q in qids) / n,
            f"{prefix}total": float(n)}


def squad_evaluate(gold: Mapping[str, Sequence[str]], preds: Mapping[str, str],
                   na: Mapping[str, float] | None = None, threshold: float = 0.0,
                   wrong: Collection[str] = ()) -> dict[str, float]:
    """The official report: exact, f1, total, HasAns_*/NoAns_*, and with ``na`` best_*.

    ``gold``: qid -> reference answer texts (empty for unanswerable). ``preds``: qid -> the
    system's best non-null span text. ``na``: qid -> no-answer score; when given, a question
    with ``na > threshold`` counts as answered "no answer", and best_exact / best_f1 (with
    their thresholds) report the threshold tuned on these very questions, as the official
    script does; tuned_f1 / tuned_f1_thresh are the realizable version (tie-aware). ``wrong``:
    questions whose prediction counts as wrong (EM = F1 = 0) whatever its text, e.g. a
    text-to-text model's output that is no span of the context (ember.tasks.text2text.task).
    """
    if not gold:
        raise ValueError("no questions to score")
    exact, f1 = raw_scores(gold, preds, wrong)
    has_answer = {qid: any(normalize_answer(a) for a in answers) for qid, answers in gold.items()}
    if na is not None:
        exact_t = apply_no_answer_threshold(exact, na, has_answer, threshold)
        f1_t = apply_no_answer_threshold(f1, na, has_answer, threshold)
    else:
        exact_t, f1_t = exact, f1
    qids = list(gold)
    out = _summary(exact_t, f1_t, qids)
    for name, wanted in (("HasAns_", True), ("NoAns_", False)):
        subset = [q for q in qids if has_answer[q] == wanted]
        if subset:
            out.update(_summary(exact_t, f1_t, subset, name))
    if na is not None:
        out["best_exact"], out["best_exact_thresh"] = best_threshold(preds, exact, na, has_answer)
        out["best_f1"], out["best_f1_thresh"] = best_threshold(preds, f1, na, has_answer)
        # what tuning can actually deliver (equal to best_f1 unless scores tie; see best_threshold)
        out["tuned_f1"], out["tuned_f1_thresh"] = best_threshold(preds, f1, na, has_answer, realizable=True)
    return out
