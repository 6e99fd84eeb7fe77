"""Scores for free-form text generation (e.g. a T5 model's outputs against reference texts).

All scores are on a 0-100 scale.

- ``bleu``: corpus-level BLEU-4 (Papineni et al. 2002, "BLEU: a Method for Automatic
  Evaluation of Machine Translation"): the geometric mean of the clipped 1..4-gram precisions
  pooled over the corpus, times a brevity penalty. It equals sacrebleu's default
  ``corpus_bleu(hyps, [refs]).score`` (Post 2018, "A Call for Clarity in Reporting BLEU
  Scores"): one reference per hypothesis, the "13a" tokenization of mteval-v13a.pl,
  case-sensitive, and mteval's "exp" smoothing of n-gram orders without a match.
- ``f1``: SQuAD's token-level F1 (Rajpurkar et al. 2016, official evaluation script): the
  harmonic mean of precision and recall over the bag of tokens after lower-casing and dropping
  punctuation and the articles a/an/the (``ember.tasks.squad_metrics``), averaged over pairs.
- ``exact_match``: the share of predictions equal to their reference after collapsing runs of
  whitespace and stripping the ends (case and punctuation count).
"""

from __future__ import annotations

import math
import re
from collections import Counter
from typing import Sequence

from ember.tasks.squad_metrics import f1_score

MAX_ORDER = 4  # BLEU-4

# mteval-v13a.pl's language-dependent tokenization (as sacrebleu's "13a" tokenizer runs it).
# Applied in order with non-overlapping, left-to-right substitution, like Perl's s///g: the
# rules that look at a neighbouring character consume it, so e.g. "a.,5" gives "a . ,5"
# (the comma's left neighbour was eaten by the period's match). Lookarounds would differ.
_13A_RULES = [
    # punctuation and symbols: { | } ~  [ \ ] ^ _ `  space ! " # $ % &  ( ) * +  : ; < = > ? @  /
    (re.compile(r"([{-~\[-` -&(-+:-@/])"), r" \1 "),
    (re.compile(r"([^0-9])([.,])"), r"\1 \2 "),  # period/comma unless preceded by a digit
    (re.compile(r"([.,])([^0-9])"), r" \1 \2"),  # period/comma unless followed by a digit
    (re.compile(r"([0-9])(-)"), r"\1 \2 "),  # a dash preceded by a digit
]


def tokenize_13a(line: str) -> str:
    """The "13a" tokenization of mteval-v13a.pl (sacrebleu's default BLEU tokenizer)."""
    # language-independent part: skipped-segment markers, hyphenated line breaks, newlines
    line = line.replace("<skipped>", "").replace("-\n", "").replace("\n", " ")
    if "&" in line:  # the four SGML entities mteval unescapes
        for entity, char in (("&quot;", '"'), ("&amp;", "&"), ("&lt;", "<"), ("&gt;", ">")):
            line = line.replace(entity, char)
    line = f" {line} "  # so that the rules see a neighbour at both ends
    for pattern, replacement in _13A_RULES:
        line = pattern.sub(replacement, line)
    return " ".join(line.split())  # one space between tokens, none at the ends


def _check_pairs(predictions: Sequence[str], references: Sequence[str]) -> None:
    if not predictions and not references:
        raise ValueError("nothing to score: no predictions and no references")
    if len(predictions) != len(references):
        raise ValueError(f"{len(predictions)} predictions but {len(references)} references: "
                         "need exactly one reference per prediction")


def _ngram_counts(tokens: list[str], n: int) -> Counter:
    return Counter(tuple(tokens[i:i + n]) for i in range(len(tokens) - n + 1))


def corpus_bleu(hypotheses: Sequence[str], references: Sequence[str]) -> float:
    """Corpus BLEU-4 in 0-100, equal to ``sacrebleu.corpus_bleu(hypotheses, [references]).score``."""
    _check_pairs(hypotheses, references)
    correct, total = [0] * MAX_ORDER, [0] * MAX_ORDER
    sys_len = ref_len = 0
    for hyp, ref in zip(hypotheses, references):
        # sacrebleu strips trailing whitespace before tokenizing (BLEU._preprocess_segment),
        # which matters for a trailing "-\n": "well-\n" stays "well-" rather than "well".
        hyp_tokens, ref_tokens = tokenize_13a(hyp.rstrip()).split(), tokenize_13a(ref.rstrip()).split()
        sys_len, ref_len = sys_len + len(hyp_tokens), ref_len + len(ref_tokens)
        for n in range(1, MAX_ORDER + 1):
            hyp_ngrams = _ngram_counts(hyp_tokens, n)
            total[n - 1] += sum(hyp_ngrams.values())
            # clipped matches: a hypothesis n-gram counts at most as often as in the reference
            correct[n - 1] += sum((hyp_ngrams & _ngram_counts(ref_tokens, n)).values())
    if not any(correct):
        return 0.0
    # brevity penalty (Papineni et al. 2002, §2.2.2); sys_len > 0 here since something matched
    brevity = 1.0 if sys_len >= ref_len else math.exp(1 - ref_len / sys_len)
    log_precisions = 0.0
    halvings = 0
    for n in range(MAX_ORDER):
        if total[n] == 0:
            # No n-grams of this order at all (every hypothesis is shorter than n tokens):
            # sacrebleu stops, leaves this precision at 0 and floors log(0) at -9999999999,
            # so the geometric mean, and the score, is 0.
            return 0.0
        if correct[n] == 0:
            # mteval's "exp" smoothing (Chen & Cherry 2014, method 3): the k-th order without a
            # match gets precision 1 / (2^k * total)
            halvings += 1
            precision = 100.0 / (2.0 ** halvings * total[n])
        else:
            precision = 100.0 * correct[n] / total[n]
        log_precisions += math.log(precision)
    return brevity * math.exp(log_precisions / MAX_ORDER)


def exact_match(prediction: str, reference: str) -> float:
    """1.0 if equal after collapsing whitespace runs and stripping (case-sensitive), else 0.0."""
    return float(" ".join(prediction.split()) == " ".join(reference.split()))


def token_f1(prediction: str, reference: str) -> float:
    """SQuAD's token F1 in [0, 1] after ``squad_metrics.normalize_answer`` (official script).

    As in the SQuAD 2.0 script, if either side normalises to nothing the score is 1.0 when both
    do and 0.0 otherwise (e.g. "The." against "a" scores 1.0).
    """
    return f1_score(reference, prediction)


def generation_metrics(predictions: Sequence[str], references: Sequence[str]) -> dict[str, float]:
    """{"exact_match", "f1", "bleu"}, each on a 0-100 scale (EM and F1 averaged over pairs)."""
    _check_pairs(predictions, references)
    pairs = list(zip(predictions, references))
    return {"exact_match": 100.0 * sum(exact_match(p, r) for p, r in pairs) / len(pairs),
            "f1": 100.0 * sum(token_f1(p, r) for p, r in pairs) / len(pairs),
            "bleu": corpus_bleu(predictions, references)}
