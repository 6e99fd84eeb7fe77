"""ember.tasks.metrics.text against sacrebleu (BLEU, 13a), rouge-score (ROUGE) and hand-computed
golden values."""

from __future__ import annotations

import json
import math
import random

import pytest

from conftest import real_data
from ember.tasks.metrics.text import (
    corpus_bleu,
    exact_match,
    generation_metrics,
    rouge_scores,
    token_f1,
    tokenize_13a,
    tokenize_rouge,
)


def _sentence_pairs(limit: int | None = None) -> list[tuple[str, str]]:
    """(sentence1, sentence2) of GLUE STS-B dev: raw, untokenized English sentence pairs."""
    path = real_data("glue", "STS-B", "dev.tsv")
    lines = path.read_text(encoding="utf-8").splitlines()[1:]  # header first
    pairs = [tuple(line.split("\t")[-3:-1]) for line in lines]  # ... sentence1 sentence2 score
    return pairs[:limit]


def _real_lines() -> list[str]:
    """Sentences of STS-B, MRPC (with its TSV quoting left in) and SNLI dev, as they are on disk."""
    lines = [s for pair in _sentence_pairs() for s in pair]
    for parts, columns in ((("glue", "MRPC", "dev.tsv"), slice(2, 4)), (("snli", "dev.tsv"), slice(0, 2))):
        rows = real_data(*parts).read_text(encoding="utf-8").splitlines()[1:2001]
        lines += [s for row in rows for s in row.split("\t")[columns]]
    return lines


def test_bleu_matches_sacrebleu_on_real_sentences():
    sacrebleu = pytest.importorskip("sacrebleu")
    pairs = _sentence_pairs(400)
    hyps, refs = [h for h, _ in pairs], [r for _, r in pairs]
    cases = {
        "paraphrases": (hyps, refs),
        "swapped": (refs, hyps),
        "identical": (refs, refs),
        # the first third of each sentence's words: far shorter than the references
        "short": ([" ".join(h.split()[: max(1, len(h.split()) // 3)]) for h in hyps], refs),
        # hyphenated line breaks, which 13a joins, and a trailing "-\n", which it does not:
        # sacrebleu strips trailing whitespace first, so "dancing.-\n" scores as "dancing . -"
        "line breaks": ([h.replace(" ", "-\n", 2) + "-\n" for h in hyps], refs),
    }
    for name, (h, r) in cases.items():
        expected = sacrebleu.corpus_bleu(h, [r])
        assert corpus_bleu(h, r) == pytest.approx(expected.score, abs=1e-9), name
    assert 0 < corpus_bleu(hyps, refs) < 100
    assert corpus_bleu(refs, refs) == pytest.approx(100.0, abs=1e-9)
    short = sacrebleu.corpus_bleu(cases["short"][0], [refs])
    assert short.bp < 0.5 and corpus_bleu(*cases["short"]) > 0  # the brevity penalty is at work
    # one pair at a time: tiny corpora hit the smoothing and the "no n-grams of order n" paths
    for hyp, ref in pairs[:150]:
        assert corpus_bleu([hyp], [ref]) == pytest.approx(
            sacrebleu.corpus_bleu([hyp], [[ref]]).score, abs=1e-9), (hyp, ref)


def test_13a_tokenization_matches_sacrebleu():
    pytest.importorskip("sacrebleu")
    from sacrebleu.tokenizers.tokenizer_13a import Tokenizer13a

    reference = Tokenizer13a()
    crafted = [
        "Pi is 3.14, not 3,14 or 3 . 14.", "It costs $1,000.50 (approx.).", "Score: 5-4, then 10-20.",
        "e.g. this, i.e. that... etc.", 'He said "no" and \'yes\'.', "Tom &amp; Jerry &quot;live&quot;",
        "a &lt;b&gt; c & d", "&amp;quot;", "[brackets] {braces} (parens) <angles>", "path/to/file_name",
        "Café naïve — “quotes” … ½ 東京", "well-\nknown <skipped> line\nbreak", "a.,5 x,.y 1.,2 .5 5.",
        "well-known state-of-the-art 2-3-4 -5 5--4", "  spaced\t\tout  ", "", "...", "U.S.A. 1,2,3.",
        "email@host.com #tag 100% a+b=c ~x^y|z", "non\u00a0breaking\u2009spaces",
    ]
    rng = random.Random(0)  # punctuation-heavy random strings for the rules' edge cases
    alphabet = list("ab19 .,-&;<>\"'()[]{}/:@!?$%\n\té") + ["&amp;", "&lt;", "-\n", "<skipped>"]
    fuzz = ["".join(rng.choice(alphabet) for _ in range(rng.randint(1, 30))) for _ in range(2000)]
    lines = _real_lines() + crafted + fuzz
    assert len(lines) > 8000
    mismatches = [(line, tokenize_13a(line), reference(line))
                  for line in lines if tokenize_13a(line) != reference(line)]
    assert mismatches == []
    # the rules themselves, on a few hand-checked cases
    assert tokenize_13a("Pi is 3.14, or 1,000.") == "Pi is 3.14 , or 1,000 ."
    assert tokenize_13a("5-4 (e.g.)") == "5 - 4 ( e . g . )"
    assert tokenize_13a("a.,5") == "a . ,5"  # non-overlapping matches, as in Perl's s///g


def test_bleu_zero_matches_use_exponential_smoothing():
    # hyp "one two three four five six" vs ref "one two three seven four five six":
    # 1-grams 6/6, 2-grams 4/5 (not "three four"), 3-grams 2/4 ("one two three", "four five
    # six"), 4-grams 0/3 -> smoothed to 1 / (2^1 * 3). Precisions 1, 4/5, 1/2, 1/6: their
    # product is 1/15. sys_len 6 < ref_len 7: BP = exp(1 - 7/6).
    # BLEU = 100 * 15^(-1/4) * exp(-1/6).
    hyp, ref = "one two three four five six", "one two three seven four five six"
    assert corpus_bleu([hyp], [ref]) == pytest.approx(100 * 15 ** -0.25 * math.exp(-1 / 6), abs=1e-9)
    # hyp "one two three four" vs ref "one x two y three z four": 1-grams 4/4, then three
    # orders without a match, smoothed by 2, 4 and 8: 2-grams 1/(2*3), 3-grams 1/(4*2),
    # 4-grams 1/(8*1); product 1/384. BP = exp(1 - 7/4). BLEU = 100 * 384^(-1/4) * exp(-3/4).
    hyp, ref = "one two three four", "one x two y three z four"
    assert corpus_bleu([hyp], [ref]) == pytest.approx(100 * 384 ** -0.25 * math.exp(-0.75), abs=1e-9)
    # no match at all, or no 4-gram anywhere in the system output: 0, even for perfect matches
    assert corpus_bleu(["alpha beta gamma delta"], [hyp]) == 0.0
    assert corpus_bleu(["one two three", "four"], ["one two three", "four"]) == 0.0
    assert corpus_bleu(["", hyp], ["one", hyp]) == pytest.approx(100 * math.exp(1 - 5 / 4), abs=1e-9)


def test_bleu_refuses_empty_and_mismatched_inputs():
    with pytest.raises(ValueError, match="nothing to score"):
        corpus_bleu([], [])
    with pytest.raises(ValueError, match="2 predictions but 1 references"):
        corpus_bleu(["a b c d", "e"], ["a b c d"])
    with pytest.raises(ValueError, match="0 predictions but 1 references"):
        generation_metrics([], ["a"])


def test_token_f1_and_exact_match_follow_squad_normalisation():
    # articles, punctuation and case are ignored by F1: both sides are "eiffel tower"
    assert token_f1("The Eiffel Tower!", "eiffel tower") == 1.0
    # pred [cat, sat], ref [cat, sat, on, mat]: P = 1, R = 1/2, F1 = 2/3
    assert token_f1("cat sat", "The cat sat on a mat.") == pytest.approx(2 / 3)
    assert token_f1("Paris", "London") == 0.0
    # nothing left after normalisation: SQuAD 2.0's no-answer rule, 1 only if both are empty
    assert token_f1("The.", "a") == 1.0 and token_f1("", "") == 1.0 and token_f1("", "Paris") == 0.0
    # EM: whitespace runs collapse and ends are stripped, but case and punctuation count
    assert exact_match("  New \t York\n", "New York") == 1.0
    assert exact_match("new york", "New York") == 0.0
    assert exact_match("New York.", "New York") == 0.0
    # EM 1/3, F1 (1 + 1 + 2/3) / 3 = 8/9; BLEU 0: no hypothesis has 4 tokens, so no 4-grams
    scores = generation_metrics(["New York", "the eiffel tower", "cat sat"],
                                ["New  York", "Eiffel Tower", "The cat sat on a mat."])
    assert scores["exact_match"] == pytest.approx(100 / 3)
    assert scores["f1"] == pytest.approx(800 / 9)
    assert scores["bleu"] == 0.0
    assert set(scores) == {"exact_match", "f1", "bleu", "rouge1", "rouge2", "rougeL", "rougeLsum"}


ROUGE_CRAFTED = [  # (prediction, reference)
    ("Hello, World!!! 42 times.", "hello world -- 42 TIMES"),
    ("state-of-the-art U.S.A. e-mail", "state of the art usa email"),
    ("Pi = 3.14; e = 2.718", "pi is 3 14 and e is 2 718"),
    ("Café naïve résumé", "cafe naive resume"),  # é, ï split words: caf, na ve, r sum
    ("Caf\u00e9 au lait", "Cafe\u0301 au lait"),  # precomposed é vs e + combining accent
    ("서울은 한국의 수도 Seoul", "Seoul is the capital"),  # Hangul vanishes
    ("Москва — столица России", "Moscow is the capital of Russia"),  # so does Cyrillic
    ("Москва", "Москва"),  # nothing left on either side: 0, not 1
    ("\u212a is the Kelvin sign", "k is the kelvin sign"),  # lower() maps it to ASCII k
    ("\u0130stanbul", "i stanbul"),  # İ lowers to i + combining dot
    ("", "the cat sat on the mat"), ("the cat", ""), ("", ""), ("...", "!!!"),
    ("the the the the cat", "the cat the cat"), ("a a a a a a", "a a"),  # clipping
    ("cat", "cat"), ("cat", "dog"), ("mat the on sat cat the", "the cat sat on the mat"),
    ("one\ttwo\nthree  four", "one two three four five"),
]


def _squad_texts() -> list[str]:
    """Multi-sentence paragraphs: the contexts of the SQuAD 2.0 dev half."""
    data = json.loads(real_data("squad2-dev-half", "dev-v2.0.json").read_text(encoding="utf-8"))
    return [par["context"] for article in data["data"] for par in article["paragraphs"]]


def _rouge_reference():
    pytest.importorskip("rouge_score")
    from rouge_score import rouge_scorer

    return rouge_scorer.RougeScorer(["rouge1", "rouge2", "rougeL", "rougeLsum"], use_stemmer=False)


def test_rouge_tokenization_matches_rouge_score():
    pytest.importorskip("rouge_score")
    from rouge_score.tokenize import tokenize

    rng = random.Random(0)  # letters around the ASCII range, digits, punctuation, case
    alphabet = list("aZ9 .,-'_\t\néÉßİıﬁ²①Ｆ한글ЖжΣς") + ["\u212a", "\u0301", "\u00a0"]
    fuzz = ["".join(rng.choice(alphabet) for _ in range(rng.randint(0, 20))) for _ in range(2000)]
    lines = _real_lines()[:4000] + [s for pair in ROUGE_CRAFTED for s in pair] + fuzz
    assert [tokenize_rouge(line) for line in lines] == [tokenize(line, None) for line in lines]
    # non-ASCII letters are separators, after Python's Unicode lower-casing
    assert tokenize_rouge("Café au LAIT, 2-for-1!") == ["caf", "au", "lait", "2", "for", "1"]
    assert tokenize_rouge("Привет, 세계") == []
    assert tokenize_rouge("\u212aelvin \u0130stanbul") == ["kelvin", "i", "stanbul"]


def test_rouge_matches_rouge_score_on_real_sentences():
    scorer = _rouge_reference()
    pairs = _sentence_pairs(500)
    texts = _squad_texts()[:60]
    for i, text in enumerate(texts):  # paragraphs "summarised" by truncated paragraphs
        words = text.split()
        pairs += [(" ".join(words[: len(words) // 4]), text),  # the lead: high precision
                  (text, " ".join(words[: 30 + 7 * i % 50])),  # the reverse
                  (" ".join(words[::2]), " ".join(words[1::2])),  # interleaved halves
                  (text, texts[i - 1])]  # a neighbouring paragraph, often of the same article
        # summaries as summarisation data writes them, a sentence per line (rougeLsum's input):
        # the paragraph's sentences against every other one of them, reversed, and a neighbour's
        sentences = [s for s in text.replace(". ", ".\n").split("\n")]
        pairs += [("\n".join(sentences[::2]), "\n".join(sentences)),
                  ("\n".join(sentences[::-1]), "\n".join(sentences[1:] or sentences)),
                  ("\n".join(sentences), texts[i - 1].replace(". ", ".\n") + "\n\n")]
    pairs += ROUGE_CRAFTED
    assert len(pairs) > 800 and sum("\n" in r for _, r in pairs) > 150
    for prediction, reference in pairs:
        expected = scorer.score(reference, prediction)  # rouge-score takes the target first
        ours = rouge_scores(prediction, reference)
        assert set(ours) == {"rouge1", "rouge2", "rougeL", "rougeLsum"}
        for key, value in ours.items():
            assert value == pytest.approx(expected[key].fmeasure, abs=1e-12), \
                (key, prediction, reference)
    assert all(v == 0.0 for v in rouge_scores("", "").values())  # unlike token_f1's 1.0


def test_rouge_golden_values():
    # "the cat sat on the mat" vs "the cat lay on the mat", 6 tokens each.
    # ROUGE-1: the x2, cat, on, mat match (clipped: "the" twice on both sides) -> 5/6 both ways.
    # ROUGE-2: 5 bigrams each; "the cat", "on the", "the mat" match -> P = R = F = 3/5.
    # ROUGE-L: LCS "the cat on the mat", 5 tokens -> P = R = F = 5/6.
    scores = rouge_scores("the cat sat on the mat", "the cat lay on the mat")
    assert scores == pytest.approx({"rouge1": 5 / 6, "rouge2": 3 / 5, "rougeL": 5 / 6, "rougeLsum": 5 / 6}, abs=1e-15)
    # pred "the the the cat" (4 tokens) vs ref "the cat sat on the mat" (6 tokens).
    # ROUGE-1: "the" clipped to the reference's 2, plus "cat": 3 -> P = 3/4, R = 1/2,
    #   F = 2 * 3/8 / (5/4) = 3/5 (unclipped, 4 matches would give P = 1, R = 2/3).
    # ROUGE-2: pred "the the" x2, "the cat"; only "the cat" matches -> P = 1/3, R = 1/5,
    #   F = 2 * 1/15 / (8/15) = 1/4.
    # ROUGE-L: LCS is 2 ("the cat", or "the ... the") -> P = 1/2, R = 1/3, F = (1/3) / (5/6) = 2/5.
    scores = rouge_scores("the the the cat", "the cat sat on the mat")
    assert scores == pytest.approx({"rouge1": 3 / 5, "rouge2": 1 / 4, "rougeL": 2 / 5, "rougeLsum": 2 / 5}, abs=1e-15)
    # the tokenizer: "Café, 2-for-1!" is caf 2 for 1, "cafe 2 for 1" is cafe 2 for 1:
    # ROUGE-1 3/4, ROUGE-2 2/3 ("2 for", "for 1"), ROUGE-L 3/4 ("2 for 1").
    scores = rouge_scores("Café, 2-for-1!", "cafe 2 for 1")
    assert scores == pytest.approx({"rouge1": 3 / 4, "rouge2": 2 / 3, "rougeL": 3 / 4, "rougeLsum": 3 / 4}, abs=1e-15)
    # an empty prediction scores 0. Reversed word order keeps ROUGE-1 at 1 and drops ROUGE-2 to 0;
    # pred "mat the on sat cat the" and ref "the cat sat on the mat" still share the subsequence
    # "the on the" (or "the sat the"), so ROUGE-L is 3/6 = 1/2.
    assert rouge_scores("", "the cat") == {"rouge1": 0.0, "rouge2": 0.0, "rougeL": 0.0, "rougeLsum": 0.0}
    reordered = rouge_scores("mat the on sat cat the", "the cat sat on the mat")
    assert reordered == {"rouge1": 1.0, "rouge2": 0.0, "rougeL": 0.5, "rougeLsum": 0.5}  # one line: = rougeL


def test_rouge_lsum_golden_values():
    # Lin 2004 §3.2's example: reference sentence "w1 w2 w3 w4 w5", predicted sentences
    # "w1 w2 w6 w7 w8" and "w1 w3 w8 w9 w5": LCS with each is "w1 w2" and "w1 w3 w5", their
    # union "w1 w2 w3 w5" -> 4 hits; R = 4/5, P = 4/10, F = 2 * (8/25) / (6/5) = 8/15.
    # Order of the predicted sentences does not matter; the one-sequence ROUGE-L of the swapped
    # order finds only "w1 w3 w5" (3): P = 3/10, R = 3/5, F = 2/5.
    reference = "w1 w2 w3 w4 w5"
    for prediction in ("w1 w2 w6 w7 w8\nw1 w3 w8 w9 w5", "w1 w3 w8 w9 w5\nw1 w2 w6 w7 w8"):
        assert rouge_scores(prediction, reference)["rougeLsum"] == pytest.approx(8 / 15, abs=1e-15)
    assert rouge_scores("w1 w3 w8 w9 w5\nw1 w2 w6 w7 w8", reference)["rougeL"] == pytest.approx(2 / 5, abs=1e-15)
    # a predicted token counts once even when two reference sentences would take it: "a b"
    # against "a b" twice hits 2 (not 4): P = 2/2, R = 2/4, F = 2/3
    assert rouge_scores("a b", "a b\na b")["rougeLsum"] == pytest.approx(2 / 3, abs=1e-15)
    # empty lines are no sentences; a prediction of empty lines scores 0
    assert rouge_scores("\n\na b\n", "a b")["rougeLsum"] == 1.0
    assert rouge_scores("\n\n", "a b")["rougeLsum"] == 0.0


def test_rouge_lsum_matches_rouge_score_where_many_lcs_tie():
    """Texts of three to four words over a four-word vocabulary, in one to three lines: most
    pairs have several longest common subsequences, and which one the table's read-back picks
    (rouge-score drops a reference token on ties) decides the summary-level union. Fast enough
    for every run (the real-sentence comparison above takes seconds)."""
    scorer = _rouge_reference()
    rng = random.Random(1)

    def text():
        return "\n".join(" ".join(rng.choice("abcd") for _ in range(rng.randint(1, 4))) for _ in range(rng.randint(1, 3)))

    for _ in range(200):
        prediction, reference = text(), text()
        expected = scorer.score(reference, prediction)
        ours = rouge_scores(prediction, reference)
        for key in ("rougeL", "rougeLsum"):
            assert ours[key] == pytest.approx(expected[key].fmeasure, abs=1e-12), (key, prediction, reference)


def test_generation_metrics_rouge_is_the_mean_f_measure_times_100():
    predictions = ["the cat sat on the mat", "the the the cat", "", "Paris"]
    references = ["the cat lay on the mat", "the cat sat on the mat", "anything", "paris."]
    scores = generation_metrics(predictions, references)
    assert set(scores) == {"exact_match", "f1", "bleu", "rouge1", "rouge2", "rougeL", "rougeLsum"}
    # per pair (golden values above; "Paris" vs "paris." is one matching token, no bigrams):
    # ROUGE-1 5/6, 3/5, 0, 1; ROUGE-2 3/5, 1/4, 0, 0; ROUGE-L 5/6, 2/5, 0, 1
    assert scores["rouge1"] == pytest.approx(100 * (5 / 6 + 3 / 5 + 0 + 1) / 4)
    assert scores["rouge2"] == pytest.approx(100 * (3 / 5 + 1 / 4 + 0 + 0) / 4)
    assert scores["rougeL"] == pytest.approx(100 * (5 / 6 + 2 / 5 + 0 + 1) / 4)
    pairs = _sentence_pairs(200)  # and on real pairs, against rouge-score's per-pair F-measures
    predictions, references = [p for p, _ in pairs], [r for _, r in pairs]
    scores = generation_metrics(predictions, references)
    for key in ("rouge1", "rouge2", "rougeL", "rougeLsum"):
        per_pair = [rouge_scores(p, r)[key] for p, r in pairs]
        assert scores[key] == pytest.approx(100 * sum(per_pair) / len(per_pair), abs=1e-12)
        assert 0 < scores[key] < 100
    scorer = _rouge_reference()
    expected = [scorer.score(r, p) for p, r in pairs]
    for key in ("rouge1", "rouge2", "rougeL", "rougeLsum"):
        mean = 100 * sum(e[key].fmeasure for e in expected) / len(expected)
        assert scores[key] == pytest.approx(mean, abs=1e-9)
