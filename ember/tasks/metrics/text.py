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
  punctuation and the articles a/an/the (``ember.tasks.metrics.squad``), averaged over pairs.
- ``exact_match``: the share of predictions equal to their reference after collapsing runs of
  whitespace and stripping the ends (case and punctuation count).
- ``rouge1``, ``rouge2``, ``rougeL``: ROUGE-1, ROUGE-2 and sentence-level ROUGE-L F-measures
  (Lin 2004, "ROUGE: A Package for Automatic Evaluation of Summaries"; clipped n-gram overlap,
  longest common subsequence), averaged over pairs, equal to Google's ``rouge-score`` with its
  defaults (no stemmer): lowercase, every run of characters other than a-z and 0-9 is a space
  (so non-ASCII letters split words or vanish: "Café" is "caf"), split on whitespace.
- ``rougeLsum``: summary-level ROUGE-L (Lin 2004, §3.2), what summarisation papers and Hugging
  Face's summarisation scripts report: texts are split into sentences at newlines, and each
  reference sentence counts the union of its LCS tokens with every predicted sentence (a token
  counted at most as often as it occurs on both sides, as ROUGE-1.5.5 and ``rouge-score`` do).
  A text without newlines is one sentence, and then it equals ``rougeL``.
"""

from __future__ import annotations

import math
import re
from collections import Counter
from typing import Sequence

from ember.tasks.metrics.squad import f1_score

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


# rouge-score's default tokenizer (its tokenize.py) keeps only lower-case ASCII letters and digits
_NON_ALPHANUMERIC = re.compile(r"[^a-z0-9]+")


def tokenize_rouge(text: str) -> list[str]:
    """rouge-score's default tokens: lower-cased runs of a-z and 0-9 ("Café!" -> ["caf"])."""
    # Python's full Unicode lower() comes first, as in rouge-score: the Kelvin sign (U+212A) becomes
    # "k" and "İ" becomes "i" plus a combining dot; every other non-ASCII character is a separator.
    return _NON_ALPHANUMERIC.sub(" ", text.lower()).split()


def _lcs_positions(reference: list[str], prediction: list[str]) -> set[int]:
    """Indices into ``reference`` of one longest common subsequence with ``prediction`` (as many as
    the LCS is long; ROUGE-L counts them): the O(len * len) table read back from its end, dropping a reference token on ties (rouge-score's reading; which
    LCS is picked decides which tokens a summary-level union counts)."""
    table = [[0] * (len(prediction) + 1) for _ in range(len(reference) + 1)]
    for i, x in enumerate(reference, 1):
        for j, y in enumerate(prediction, 1):
            table[i][j] = table[i - 1][j - 1] + 1 if x == y else max(table[i - 1][j], table[i][j - 1])
    i, j, kept = len(reference), len(prediction), set()
    while i and j:
        if reference[i - 1] == prediction[j - 1]:
            kept.add(i - 1)
            i, j = i - 1, j - 1
        elif table[i][j - 1] > table[i - 1][j]:
            j -= 1
        else:
            i -= 1
    return kept


def _summary_lcs_hits(predicted: list[list[str]], reference: list[list[str]]) -> int:
    """Lin 2004 §3.2: per reference sentence, the union of its LCS tokens with each predicted
    sentence; a token is counted while it has occurrences left on both sides (ROUGE-1.5.5 guards
    against counting one predicted token for several reference sentences this way)."""
    left_predicted = Counter(t for sentence in predicted for t in sentence)
    left_reference = Counter(t for sentence in reference for t in sentence)
    hits = 0
    for sentence in reference:
        union = set().union(*(_lcs_positions(sentence, p) for p in predicted))
        for token in (sentence[i] for i in sorted(union)):
            if left_predicted[token] > 0 and left_reference[token] > 0:
                hits += 1
                left_predicted[token] -= 1
                left_reference[token] -= 1
    return hits


def _sentences(text: str) -> list[list[str]]:
    """rougeLsum's sentences: the text's non-empty lines, each tokenized."""
    return [tokenize_rouge(line) for line in text.split("\n") if line]


def _f_measure(overlap: int, prediction_count: int, reference_count: int) -> float:
    # Lin 2004 with beta = 1 (rouge-score's F): an empty side has precision or recall 0
    precision, recall = overlap / max(prediction_count, 1), overlap / max(reference_count, 1)
    return 2 * precision * recall / (precision + recall) if precision + recall > 0 else 0.0


def rouge_scores(prediction: str, reference: str) -> dict[str, float]:
    """{"rouge1", "rouge2", "rougeL", "rougeLsum"} F-measures in [0, 1], equal to rouge-score's
    defaults (``RougeScorer(["rouge1", "rouge2", "rougeL", "rougeLsum"]).score(reference, prediction)``)."""
    pred, ref = tokenize_rouge(prediction), tokenize_rouge(reference)
    scores = {}
    for n in (1, 2):  # ROUGE-N (Lin 2004, §2): clipped n-gram matches over each side's n-grams
        pred_ngrams, ref_ngrams = _ngram_counts(pred, n), _ngram_counts(ref, n)
        overlap = sum((pred_ngrams & ref_ngrams).values())
        scores[f"rouge{n}"] = _f_measure(overlap, sum(pred_ngrams.values()), sum(ref_ngrams.values()))
    # ROUGE-L (Lin 2004, §3.1): the LCS over the prediction's and the reference's lengths
    scores["rougeL"] = _f_measure(len(_lcs_positions(ref, pred)), len(pred), len(ref))
    predicted, referenced = _sentences(prediction), _sentences(reference)
    scores["rougeLsum"] = _f_measure(_summary_lcs_hits(predicted, referenced), sum(map(len, predicted)),
                                     sum(map(len, referenced)))
    return scores


def generation_metrics(predictions: Sequence[str], references: Sequence[str]) -> dict[str, float]:
    """{"exact_match", "f1", "bleu", "rouge1", "rouge2", "rougeL", "rougeLsum"}, each on a 0-100 scale (all but
    BLEU averaged over pairs; ROUGE as Hugging Face ``evaluate``'s without bootstrapping, x 100)."""
    _check_pairs(predictions, references)
    pairs = list(zip(predictions, references))
    rouge = [rouge_scores(p, r) for p, r in pairs]
    return {"exact_match": 100.0 * sum(exact_match(p, r) for p, r in pairs) / len(pairs),
            "f1": 100.0 * sum(token_f1(p, r) for p, r in pairs) / len(pairs),
            "bleu": corpus_bleu(predictions, references),
            **{key: 100.0 * sum(r[key] for r in rouge) / len(pairs)
               for key in ("rouge1", "rouge2", "rougeL", "rougeLsum")}}
