"""Masking schemes (ember.objectives.masking): golden seeded corruption of hand-made batches,
whole-word grouping, SpanBERT span lengths, coverage, 80/10/10 per span, static masks, and a
whole-word-masking pre-training run on real text."""

from __future__ import annotations

import numpy as np
import pytest
from scipy import stats
from tokenizers import Tokenizer, models, pre_tokenizers

from ember.config import DataConfig
from ember.errors import EmberError
from ember.objectives.masking import (
    Masker, build_masker, select_spans, span_length_probs, unit_starts, units_of_row,
    word_continuation_table,
)
from ember.objectives.mlm import mask_tokens
from conftest import make_wordpiece
from run_helpers import SHORT_RUN, recipe_config, short_run

MASK, V = 4, 100
CONT = np.zeros(V, dtype=bool)
CONT[50:60] = True  # ids 50..59 are continuation pieces ("##x")

# [CLS] A B ##b C ##c ##c D [SEP] [PAD]: four words of 1, 2, 3 and 1 tokens at 1, 2-3, 4-6, 7.
ROW = np.array([[2, 10, 11, 50, 12, 51, 52, 13, 3, 0]])
MASKABLE = np.zeros_like(ROW, dtype=bool)
MASKABLE[0, 1:8] = True


def test_word_continuation_table_for_wordpiece_bpe_and_unigram():
    wp = make_wordpiece(["new", "york", "##er", "##s"])
    table = word_continuation_table(wp)
    assert [bool(table[wp.token_to_id(t)]) for t in ["[CLS]", "[MASK]", "new", "york", "##er", "##s"]] == \
        [False, False, False, False, True, True]
    bpe = Tokenizer(models.BPE({"<s>": 0, "<mask>": 1, "Ġnew": 2, "Ġy": 3, "ork": 4, ",": 5}, []))
    bpe.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=True)
    bpe.add_special_tokens(["<s>", "<mask>"])
    assert word_continuation_table(bpe).tolist() == [False, False, False, False, True, True]
    uni = Tokenizer(models.Unigram([("[CLS]", 0.0), ("▁new", -1.0), ("▁y", -2.0), ("ork", -2.0), ("▁", -3.0)], 0))
    uni.add_special_tokens(["[CLS]"])
    assert word_continuation_table(uni).tolist() == [False, False, False, True, False]


def test_units_follow_words_and_never_cross_special_tokens():
    # A segment that starts with a continuation piece (cut inside a word) starts a unit there.
    ids = np.array([[2, 51, 10, 50, 3, 52, 11, 3]])
    maskable = np.array([[0, 1, 1, 1, 0, 1, 1, 0]], dtype=bool)
    starts = unit_starts(ids, maskable, "whole_word", CONT)
    assert starts.astype(int).tolist() == [[0, 1, 1, 0, 0, 1, 1, 0]]
    assert [a.tolist() for a in units_of_row(starts[0], maskable[0])] == [[1, 2, 5, 6], [2, 4, 6, 7]]
    joins = np.array([[0, 0, 0, 0, 0, 0, 1, 0]], dtype=bool)  # phrase "##c2 B" across nothing special
    starts = unit_starts(ids, maskable, "phrase", CONT, joins)
    assert [a.tolist() for a in units_of_row(starts[0], maskable[0])] == [[1, 2, 5], [2, 4, 7]]
    assert unit_starts(ids, maskable, "token").tolist() == maskable.tolist()


def test_token_masking_is_bert_mask_tokens_unchanged():
    rng_ids = np.random.default_rng(1)
    ids = rng_ids.integers(5, V, size=(8, 30))
    maskable = np.ones_like(ids, dtype=bool)
    maskable[:, 0] = maskable[:, -1] = False
    out = Masker("token", MASK, V, 0.15, 20)(ids, maskable, np.random.default_rng(5))
    corrupted, labels = mask_tokens(ids, maskable, np.random.default_rng(5), MASK, V, 0.15, 20)
    np.testing.assert_array_equal(out.input_ids, corrupted)
    np.testing.assert_array_equal(out.labels, labels)
    chosen = labels != -100
    np.testing.assert_array_equal(out.unit_start[chosen], np.nonzero(chosen)[1])
    np.testing.assert_array_equal(out.unit_end - out.unit_start, np.where(chosen, 1, 0))


def test_whole_word_golden_positions_for_a_seeded_batch():
    """Budget = round(0.45 x 7) = 3 tokens. By the documented draw order with seed 3:
    permutation(4) visits the units D, C##c##c, B##b, A: D is taken (1 token), C##c##c would
    overflow (1 + 3 > 3) and is skipped, B##b fills the budget. One replacement draw per
    chosen token in position order (2, 3, 7): random() = [0.801, 0.582, 0.094] -> random
    token, [MASK], [MASK]; the random token is integers(0, 100) = 33."""
    r = np.random.default_rng(3)
    assert r.permutation(4).tolist() == [3, 2, 1, 0]
    action = r.random(3)
    assert 0.8 <= action[0] < 0.9 and (action[1:] < 0.8).all()
    assert r.integers(0, V, 1).tolist() == [33]
    out = Masker("whole_word", MASK, V, 0.45, 0, CONT)(ROW, MASKABLE, np.random.default_rng(3))
    assert out.labels.tolist() == [[-100, -100, 11, 50, -100, -100, -100, 13, -100, -100]]
    assert out.input_ids.tolist() == [[2, 10, 33, MASK, 12, 51, 52, MASK, 3, 0]]
    assert out.unit_start[0].tolist() == [-1, -1, 2, 2, -1, -1, -1, 7, -1, -1]
    assert out.unit_end[0].tolist() == [-1, -1, 4, 4, -1, -1, -1, 8, -1, -1]


def test_span_golden_positions_for_a_seeded_batch():
    """Seed 0: the length draw random() = 0.637 falls in CDF bucket 4 (0.547 <= u < 0.661)
    -> l = 4 words; the only start with 4 free words after it is A (word 0), integers(1) = 0:
    take A, B##b and stop, since C##c##c would overflow the 3-token budget. One replacement
    draw for the whole span: 0.270 -> all three tokens become [MASK]."""
    r = np.random.default_rng(0)
    u = r.random()
    assert np.searchsorted(np.cumsum(span_length_probs(0.2, 10)), u, side="right") + 1 == 4
    assert r.integers(1) == 0 and r.random() < 0.8
    out = Masker("span", MASK, V, 0.45, 0, CONT)(ROW, MASKABLE, np.random.default_rng(0))
    assert out.labels.tolist() == [[-100, 10, 11, 50, -100, -100, -100, -100, -100, -100]]
    assert out.input_ids.tolist() == [[2, MASK, MASK, MASK, 12, 51, 52, 13, 3, 0]]
    assert out.unit_start[0, 1:4].tolist() == [1, 1, 1] and out.unit_end[0, 1:4].tolist() == [4, 4, 4]


def test_a_unit_that_would_overflow_the_budget_is_skipped():
    joins = np.zeros_like(MASKABLE)
    joins[0, 4] = True  # phrase "B ##b C ##c ##c": 5 tokens, budget 3
    masker = Masker("phrase", MASK, V, 0.45, 0, CONT)
    for seed in range(50):
        out = masker(ROW, MASKABLE, np.random.default_rng(seed), joins=joins)
        chosen = out.labels[0] != -100
        assert not chosen[2:7].any()  # never part of the long phrase, never half of it
        assert chosen.sum() == 2  # A and D: all that fits beside it


def random_words(rng, rows: int, words: int, max_pieces: int = 3):
    """Rows of [CLS] words [SEP] where each word has 1..max_pieces tokens."""
    out, word_ids = [], []
    for _ in range(rows):
        pieces = rng.integers(1, max_pieces + 1, size=words)
        ids = np.concatenate([[rng.integers(10, 50)] + list(rng.integers(50, 60, size=p - 1)) for p in pieces])
        out.append(np.concatenate([[2], ids, [3]]))
        word_ids.append(np.concatenate([[-1], np.repeat(np.arange(words), pieces), [-1]]))
    t = max(map(len, out))
    ids = np.zeros((rows, t), dtype=np.int64)
    word = np.full((rows, t), -1)
    for i, (row, w) in enumerate(zip(out, word_ids)):
        ids[i, : len(row)] = row
        word[i, : len(w)] = w
    maskable = word >= 0
    return ids, maskable, word


@pytest.mark.parametrize("scheme", ["whole_word", "span"])
def test_whole_words_are_never_split_and_the_budget_holds(scheme):
    ids, maskable, word = random_words(np.random.default_rng(0), 64, 60)
    out = Masker(scheme, MASK, V, 0.15, 0, CONT)(ids, maskable, np.random.default_rng(1))
    budget = np.rint(maskable.sum(1) * 0.15)
    chosen = out.labels != -100
    assert (chosen.sum(1) <= budget).all()
    for i in range(len(ids)):
        for w in range(60):
            in_word = chosen[i][word[i] == w]
            assert in_word.all() or not in_word.any()
    coverage = chosen.sum() / maskable.sum()
    assert 0.145 < coverage <= 0.15  # ~15%: only words that no longer fit leave a gap


def test_span_lengths_follow_truncated_geometric_in_words():
    """Long rows (so a row's last, budget-cut span barely matters): span lengths counted in
    whole words match Geometric(0.2) truncated at 10 (mean 3.8), chi-square over 10 bins."""
    ids, maskable, word = random_words(np.random.default_rng(2), 40, 1500, max_pieces=2)
    out = Masker("span", MASK, V, 0.15, 0, CONT)(ids, maskable, np.random.default_rng(3))
    lengths = []
    for i in range(len(ids)):
        for s, e in {(int(a), int(b)) for a, b in zip(out.unit_start[i], out.unit_end[i]) if a >= 0}:
            lengths.append(len(set(word[i, s:e].tolist())))
    lengths = np.array(lengths)
    probs = span_length_probs(0.2, 10)
    assert lengths.min() >= 1 and lengths.max() <= 10
    assert abs(lengths.mean() - 3.797) < 0.15, lengths.mean()
    observed = np.bincount(lengths, minlength=11)[1:]
    assert stats.chisquare(observed, probs * len(lengths)).pvalue > 0.001


def test_span_sampler_respects_runs_and_budget():
    # Two maskable runs of single-token words (segments A and B); spans never cross them.
    word_start = np.array([1, 2, 3, 4, 6, 7, 8])
    word_end = word_start + 1
    for seed in range(200):
        s, e = select_spans(word_start, word_end, 4, np.random.default_rng(seed), span_length_probs(0.2, 10))
        assert (e - s).sum() == 4
        assert not ((s < 5) & (e > 5)).any()  # position 5 is the [SEP] between the runs
        assert (s[1:] >= e[:-1]).all()  # sorted, no overlap


@pytest.mark.parametrize("scheme", ["span", "phrase"])
def test_80_10_10_is_decided_per_span(scheme):
    # SpanBERT §3.1 for spans; ERNIE's phrases likewise (here without phrase flags: whole words)
    ids, maskable, _ = random_words(np.random.default_rng(4), 400, 120)
    vocab = 1_000_000  # random replacements practically never equal [MASK] or the original
    joins = np.zeros_like(maskable) if scheme == "phrase" else None
    out = Masker(scheme, MASK, vocab, 0.15, 0, CONT)(ids, maskable, np.random.default_rng(5), joins=joins)
    kinds = []
    for i in range(len(ids)):
        for s, e in {(int(a), int(b)) for a, b in zip(out.unit_start[i], out.unit_end[i]) if a >= 0}:
            new, old = out.input_ids[i, s:e], ids[i, s:e]
            kind = {"mask" if n == MASK else "keep" if n == o else "random" for n, o in zip(new, old)}
            assert len(kind) == 1  # all tokens of a span get the same treatment
            kinds.append(kind.pop())
    kinds = np.array(kinds)
    assert len(kinds) > 2000
    assert abs((kinds == "mask").mean() - 0.8) < 0.03
    assert abs((kinds == "random").mean() - 0.1) < 0.02
    assert abs((kinds == "keep").mean() - 0.1) < 0.02


@pytest.mark.parametrize("scheme", ["token", "whole_word", "span"])
def test_static_masks_repeat_every_n_epochs(scheme):
    ids, maskable, _ = random_words(np.random.default_rng(6), 4, 40)
    masker = Masker(scheme, MASK, V, 0.15, 0, CONT, static_masks=3, seed=11)

    def mask_of(row: int, index: int, epoch: int, batch_seed: int, position: int = 0):
        # The example sits at ``position`` in a batch drawn with an unrelated batch RNG.
        order = np.roll(np.arange(len(ids)), position - row)
        keys = [(index if r == row else 1000 + r, epoch) for r in order]
        out = masker(ids[order], maskable[order], np.random.default_rng(batch_seed), keys=keys)
        at = int(np.flatnonzero(order == row)[0])
        return out.labels[at], out.input_ids[at]

    for row in range(len(ids)):
        first = mask_of(row, 7, 2, batch_seed=0)
        again = mask_of(row, 7, 5, batch_seed=99, position=3)  # epoch 5 = 2 mod 3, other batch
        np.testing.assert_array_equal(first[0], again[0])
        np.testing.assert_array_equal(first[1], again[1])
        assert not np.array_equal(first[0], mask_of(row, 7, 3, batch_seed=0)[0])  # next epoch
        assert not np.array_equal(first[0], mask_of(row, 8, 2, batch_seed=0)[0])  # other example


def test_dynamic_masks_differ_between_draws_of_one_sequence():
    ids, maskable, _ = random_words(np.random.default_rng(7), 1, 40)
    masker = Masker("whole_word", MASK, V, 0.15, 0, CONT)
    a = masker(ids, maskable, np.random.default_rng([0, 1]), keys=[(0, 0)])
    b = masker(ids, maskable, np.random.default_rng([0, 2]), keys=[(0, 0)])
    assert not np.array_equal(a.labels, b.labels)


def test_a_word_at_the_start_of_a_row_is_one_unit():
    # [CLS] A ##a ##a B [SEP]: the first maskable token starts a unit and its pieces join it
    ids = np.array([[2, 10, 50, 51, 11, 3]])
    maskable = np.array([[0, 1, 1, 1, 1, 0]], dtype=bool)
    starts = unit_starts(ids, maskable, "whole_word", CONT)
    assert [a.tolist() for a in units_of_row(starts[0], maskable[0])] == [[1, 4], [4, 5]]


def test_whole_word_masking_ignores_phrase_flags():
    # phrase flags only group tokens under data.masking=phrase; whole_word keeps to words
    joins = np.zeros_like(MASKABLE)
    joins[0, 2] = joins[0, 4] = True
    assert unit_starts(ROW, MASKABLE, "whole_word", CONT, joins).tolist() == \
        unit_starts(ROW, MASKABLE, "whole_word", CONT).tolist()
    assert unit_starts(ROW, MASKABLE, "phrase", CONT, joins)[0, [2, 4]].tolist() == [False, False]


def test_span_start_is_uniform_over_the_words_where_the_span_fits():
    # SpanBERT §3.1: the span's starting word is drawn uniformly. Ten one-token words, spans of
    # exactly 3 words, budget 3: every start 0..7 is possible and equally likely.
    word_start = np.arange(1, 11)
    probs = np.array([0.0, 0.0, 1.0])
    starts = [int(select_spans(word_start, word_start + 1, 3, np.random.default_rng(seed), probs)[0][0])
              for seed in range(1600)]
    counts = np.bincount(np.array(starts) - 1, minlength=8)
    assert len(counts) == 8 and stats.chisquare(counts).pvalue > 0.001


def test_continuation_table_covers_special_tokens_added_after_the_vocabulary():
    wp = make_wordpiece(["new", "##er"])
    wp.add_special_tokens(["[EXTRA]"])  # a new id past every vocabulary entry
    table = word_continuation_table(wp)
    assert len(table) > wp.token_to_id("[EXTRA]") and not table[wp.token_to_id("[EXTRA]")]
    assert table[wp.token_to_id("##er")]


def test_random_replacements_are_uniform_over_the_whole_vocabulary():
    # BERT §3.1 / SpanBERT: "a random token" from the vocabulary, id 0 included. Words use ids
    # >= 10 and the vocabulary is 8 ids, so any changed token that is not [MASK] (4) is a draw.
    ids, maskable, _ = random_words(np.random.default_rng(7), 300, 80)
    for scheme in ("whole_word", "span"):
        out = Masker(scheme, MASK, 8, 0.15, 0, CONT)(ids, maskable, np.random.default_rng(8))
        drawn = out.input_ids[(out.input_ids != ids) & (out.input_ids != MASK)]
        counts = np.bincount(drawn, minlength=8)[[0, 1, 2, 3, 5, 6, 7]]
        assert len(np.bincount(drawn)) <= 8 and stats.chisquare(counts).pvalue > 0.001, counts


def test_mask_prob_must_be_strictly_between_0_and_1():
    for bad in (0.0, 1.0):
        with pytest.raises(EmberError, match="data.mask_prob"):
            Masker("token", MASK, V, mask_prob=bad)
    Masker("token", MASK, V, mask_prob=0.99)


def test_spans_may_touch_so_the_whole_budget_is_spent():
    # Spans never overlap, but nothing keeps a gap between them: four one-token words, spans
    # of exactly one word, a budget of four -> every word is masked.
    word_start = np.arange(1, 5)
    for seed in range(20):
        s, e = select_spans(word_start, word_start + 1, 4, np.random.default_rng(seed), np.array([1.0]))
        assert s.tolist() == [1, 2, 3, 4] and e.tolist() == [2, 3, 4, 5]


def test_span_settings_at_their_boundaries():
    # span_p = 1 and max_span = 1 are allowed (every span one word); max_span 0 is not
    masker = Masker("span", MASK, V, continues_word=CONT, span_p=1.0, max_span=1)
    assert masker.span_probs.tolist() == [1.0]
    with pytest.raises(EmberError, match="span_p=1.5"):
        Masker("span", MASK, V, continues_word=CONT, span_p=1.5)
    with pytest.raises(EmberError, match="max_span=0"):
        Masker("span", MASK, V, continues_word=CONT, max_span=0)


def test_a_row_with_one_maskable_token_still_predicts_it():
    # the budget is at least one prediction per sequence (mlm.prediction_budget)
    ids, maskable = np.array([[2, 10, 3]]), np.array([[0, 1, 0]], dtype=bool)
    for scheme in ("whole_word", "span"):
        out = Masker(scheme, MASK, V, 0.15, 0, CONT)(ids, maskable, np.random.default_rng(0))
        assert out.labels.tolist() == [[-100, 10, -100]], scheme


def test_static_token_masks_corrupt_only_the_predicted_positions():
    ids, maskable, _ = random_words(np.random.default_rng(9), 4, 40)
    out = Masker("token", MASK, V, 0.15, 0, CONT, static_masks=2, seed=1)(
        ids, maskable, np.random.default_rng(0), keys=[(i, 0) for i in range(4)])
    chosen = out.labels != -100
    assert chosen.any() and (out.labels[chosen] == ids[chosen]).all()
    assert (out.input_ids[~chosen] == ids[~chosen]).all() and (out.input_ids[chosen] == MASK).mean() > 0.6


def test_a_row_without_maskable_tokens_draws_no_random_numbers():
    # the documented RNG contract: rows draw in order, an empty (all-padding) row draws nothing,
    # so the next row is masked as if the empty row were not there
    empty = np.zeros_like(ROW)
    for scheme in ("whole_word", "span"):
        masker = Masker(scheme, MASK, V, 0.45, 0, CONT)
        alone = masker(ROW, MASKABLE, np.random.default_rng(3))
        after = masker(np.concatenate([empty, ROW]), np.concatenate([np.zeros_like(MASKABLE), MASKABLE]),
                       np.random.default_rng(3))
        assert after.labels[1].tolist() == alone.labels[0].tolist(), scheme
        assert after.input_ids[1].tolist() == alone.input_ids[0].tolist(), scheme


def test_token_masking_needs_no_tokenizer():
    masker = build_masker(DataConfig(masking="token"), {"mask": MASK}, V)
    assert masker.scheme == "token" and masker.continues_word is None


def test_bad_masking_settings_are_clear_errors():
    with pytest.raises(EmberError, match="data.masking='words'"):
        Masker("words", MASK, V)
    with pytest.raises(EmberError, match="span_p"):
        Masker("span", MASK, V, continues_word=CONT, span_p=0.0)
    with pytest.raises(EmberError, match="tokenizer"):
        build_masker(DataConfig(masking="whole_word"), {"mask": MASK}, V)
    with pytest.raises(EmberError, match="carry no phrase flags"):
        Masker("phrase", MASK, V, continues_word=CONT)(ROW, MASKABLE, np.random.default_rng(0))
    with pytest.raises(EmberError, match="mask_key"):
        Masker("token", MASK, V, static_masks=2)(ROW, MASKABLE, np.random.default_rng(0))


def test_bert_wwm_recipe_loss_goes_down_on_real_text(wiki_prepared, tmp_path):
    cfg = recipe_config("bert-mini-wwm", wiki_prepared, *SHORT_RUN)
    assert cfg.data.masking == "whole_word"
    records = short_run(cfg, tmp_path / "run")
    train = [r["mlm_loss"] for r in records if r["split"] == "train"]
    assert np.mean(train[-8:]) < np.mean(train[:5]) - 0.6
