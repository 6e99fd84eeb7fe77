"""ember.tasks.text_metrics against sacrebleu (BLEU, 13a) and hand-computed golden values."""

from __future__ import annotations

import math
import random

import pytest

from conftest import real_data
from ember.tasks.text_metrics import (
    corpus_bleu,
    exact_match,
    generation_metrics,
    token_f1,
    tokenize_13a,
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
    assert scores["bleu"] == 0.0 and set(scores) == {"exact_match", "f1", "bleu"}
