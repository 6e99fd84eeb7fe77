"""ERNIE-style phrase units: JSONL spans -> per-token flags, the phrase detector, storage in
the shards, segment pairs carrying the flags, phrase masking, and the ernie-mini recipe."""

from __future__ import annotations

import json
import random

import numpy as np
import pytest

from ember.data.pairs import SegmentPairDataset
from ember.data.phrases import fit_detector, parse_spans, token_joins
from ember.data.prepare import prepare_corpus
from ember.data.shards import TokenCorpus
from ember.errors import EmberError
from ember.objectives.bert import pack_joins
from conftest import make_wordpiece, real_data
from run_helpers import SHORT_RUN, recipe_config, short_run

WORDS = ["barack", "obama", "visited", "new", "york", "##er", "is", "big", "."]


@pytest.fixture
def span_tokenizer(tmp_path):
    path = tmp_path / "tokenizer.json"
    make_wordpiece(WORDS).save(str(path))
    return path


def write_jsonl(path, rows):
    path.write_text("".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8")
    return path


def test_jsonl_spans_become_token_flags(span_tokenizer, tmp_path):
    rows = [
        # "Barack Obama" [2, 14); "New Yo" [23, 29) ends inside "york": the span grows to the
        # whole token, "##er" stays outside (whole-word masking joins it at masking time).
        {"text": "  Barack Obama visited New Yorker.", "spans": [[2, 14], [23, 29]]},
        # Given out of order; "ig. Obama" [13, 22) crosses a sentence end: cut at it.
        {"text": "New York is big. Obama is big.", "spans": [[13, 22], [0, 8]]},
        {"text": "Obama is big."},  # no spans: no phrases
    ]
    out = prepare_corpus([write_jsonl(tmp_path / "docs.jsonl", rows)], span_tokenizer, tmp_path / "prep",
                         valid_fraction=0, progress=False, phrases="spans")
    corpus = TokenCorpus(tmp_path / "prep", "train")
    assert corpus.has_joins and corpus.phrases["source"] == "spans"
    tok = make_wordpiece(WORDS)
    tokens = [tok.id_to_token(int(i)) for i in corpus.sentences(0, corpus.num_sentences)]
    assert tokens == ["barack", "obama", "visited", "new", "york", "##er", ".",
                      "new", "york", "is", "big", ".", "obama", "is", "big", ".",
                      "obama", "is", "big", "."]
    assert corpus.joins(0, corpus.num_sentences).tolist() == [0, 1, 0, 0, 1, 0, 0,
                                                              0, 1, 0, 0, 1, 0, 0, 0, 0,
                                                              0, 0, 0, 0]
    assert corpus.joins(1, 3).tolist() == [0, 1, 0, 0, 1, 0, 0, 0, 0]  # aligned with sentences(1, 3)
    assert out["phrases"]["joined_tokens"] == 4


def test_cli_prepare_with_spans_reports_phrases_and_moves_flags_with_a_held_out_document(
        span_tokenizer, tmp_path, capsys):
    from ember.cli import main

    rows = [{"text": "Barack Obama is big.", "spans": [[0, 12]]},
            {"text": "New York is big.", "spans": [[0, 8]]}]
    path = write_jsonl(tmp_path / "docs.jsonl", rows)
    # Two documents and a tiny valid fraction: the last one is moved to valid after writing.
    assert main(["prepare", str(path), "--tokenizer", str(span_tokenizer), "--out", str(tmp_path / "out"),
                 "--no-progress", "--valid-fraction", "0.001", "--phrases", "spans"]) == 0
    assert "phrases (spans): 2 tokens" in capsys.readouterr().out
    train, valid = TokenCorpus(tmp_path / "out", "train"), TokenCorpus(tmp_path / "out", "valid")
    assert train.joins(0, 1).tolist() == [0, 1, 0, 0, 0] and valid.joins(0, 1).tolist() == [0, 1, 0, 0, 0]
    assert valid.num_docs == 1 and valid.sentence_lengths.tolist() == [5]


@pytest.mark.parametrize("spans, message", [
    ([[0, 5], [3, 8]], r"spans #0 \[0, 5\] and #1 \[3, 8\] overlap"),
    ([[0, 99]], r"span #0 \[0, 99\] is out of range for a text of 13 characters"),
    ([[4, 4]], r"out of range"),
    ([[-1, 3]], r"out of range"),
    ([["0", 3]], r"span #0 \['0', 3\] is not a pair of integers"),
    ([[0.0, 3]], r"not a pair of integers"),
    ([[True, 3]], r"not a pair of integers"),
    ([[0, 1, 2]], r"not a pair of integers"),
    ("0-5", r"must be a list of \[start, end\]"),
])
def test_bad_spans_stop_prepare_with_file_and_line(span_tokenizer, tmp_path, spans, message):
    path = write_jsonl(tmp_path / "docs.jsonl", [{"text": "Obama is big."}, {"text": "Obama is big.", "spans": spans}])
    with pytest.raises(EmberError, match=rf"{path}:2: .*{message}"):
        prepare_corpus([path], span_tokenizer, tmp_path / "prep", valid_fraction=0, progress=False,
                       phrases="spans")
    assert not (tmp_path / "prep").exists()


def test_spans_mode_needs_jsonl_input(span_tokenizer, tmp_path):
    (tmp_path / "plain.txt").write_text("Obama is big.\n", encoding="utf-8")
    with pytest.raises(EmberError, match="JSONL"):
        prepare_corpus([tmp_path / "plain.txt"], span_tokenizer, tmp_path / "prep", progress=False,
                       phrases="spans")


def test_token_alignment_rules():
    # tokens [0,3) [4,8) [8,10) [11,12) [12,12) (zero-width) [13,15); spans [4,9) and [11,15)
    starts, ends = np.array([0, 4, 8, 11, 12, 13]), np.array([3, 8, 10, 12, 12, 15])
    first = np.array([1, 0, 0, 0, 0, 1], dtype=bool)  # a sentence starts at the last token
    joins = token_joins(starts, ends, np.array([4, 11]), np.array([9, 15]), first)
    assert joins.tolist() == [0, 0, 1, 0, 1, 0]
    assert parse_spans([[5, 9], [0, 2]], "x" * 9, "f:1").tolist() == [[0, 2], [5, 9]]


def detector_corpus() -> list[str]:
    """Filler sentences of random lower-case words (so "the", "of", "in" appear everywhere) plus
    sentences with collocations ("prime minister", "New York") and names."""
    rng = random.Random(0)
    fill = "cat dog river stone light house car tree road field music rain city wall song book water fire".split()
    texts = []
    for _ in range(40):
        sentences = []
        for _ in range(6):
            words = [rng.choice(fill) for _ in range(rng.randint(4, 9))]
            for function_word in ("the", "of", "a", "in", "the"):
                words.insert(rng.randrange(len(words)), function_word)
            sentences.append(" ".join(words).capitalize() + ".")
        texts.append(" ".join(sentences))
    return texts + [
        "The Bank of England met the prime minister in New York on a cold day.",
        "He said the prime minister would visit the Bank of England soon.",
        "Rain fell on New York while the prime minister spoke.",
        "In New York a new road was opened by the prime minister.",
        "The prime minister left New York for the Bank of England.",
        "A song by Ada Lovelace played in New York.",
    ]


def test_phrase_detector_finds_collocations_and_capitalised_names():
    texts = detector_corpus()
    detector = fit_detector(texts, sample_docs=1000)  # defaults: min count 5, NPMI >= 0.5
    found = [[t[a:b] for a, b in detector.spans(t)] for t in texts[-6:]]
    assert found == [
        ["Bank of England", "prime minister", "New York"],  # "The" is capitalised only sentence-initially
        ["prime minister", "Bank of England"],
        ["New York", "prime minister"],
        ["New York", "prime minister"],  # "In" is not a name word either
        ["prime minister", "New York", "Bank of England"],
        ["Ada Lovelace", "New York"],
    ]
    assert all(not detector.spans(t).size for t in texts[:40])  # filler has no phrases
    assert detector.summary()["collocations"] == 2


@pytest.fixture(scope="module")
def wiki_phrases(wiki_prepared, tmp_path_factory):
    """The conftest wiki corpus prepared again with detected phrases."""
    source = real_data("wiki-en", "AA", "wiki_00.gz")
    out = tmp_path_factory.mktemp("phrases") / "prepared"
    prepare_corpus([source], wiki_prepared / "tokenizer.json", out, max_docs=150, valid_fraction=0.05,
                   progress=False, phrases="detect")
    return out


def test_prepare_detect_stores_flags_next_to_unchanged_tokens(wiki_prepared, wiki_phrases):
    plain, phrases = TokenCorpus(wiki_prepared, "train"), TokenCorpus(wiki_phrases, "train")
    assert not plain.has_joins and plain.joins(0, 5) is None and plain.phrases == {"source": "none"}
    assert phrases.has_joins and phrases.phrases["source"] == "detect"
    assert phrases.phrases["collocations"] > 50
    everything = phrases.sentences(0, phrases.num_sentences)
    np.testing.assert_array_equal(everything, plain.sentences(0, plain.num_sentences))  # same tokens
    joins = phrases.joins(0, phrases.num_sentences)
    assert joins.shape == everything.shape and set(np.unique(joins)) <= {0, 1}
    first_of_sentence = np.cumsum(phrases.sentence_lengths) - phrases.sentence_lengths
    assert not joins[first_of_sentence].any()  # units never cross sentences
    assert 0.05 < joins.mean() < 0.4
    assert TokenCorpus(wiki_phrases, "valid").has_joins


class ParityJoins:
    """A corpus whose phrase flag is token id mod 2, so alignment is checkable anywhere."""

    has_joins = True

    def __init__(self, corpus):
        self.corpus = corpus

    def __getattr__(self, name):
        return getattr(self.corpus, name)

    def joins(self, start, stop):
        return (self.corpus.sentences(start, stop) % 2).astype(np.uint8)


@pytest.mark.parametrize("mode", ["nsp", "sop", "none"])
def test_segment_pairs_cut_flags_like_their_tokens(wiki_prepared, mode):
    corpus = ParityJoins(TokenCorpus(wiki_prepared, "train"))
    data = SegmentPairDataset(corpus, max_seq_length=48, pair_mode=mode, seed=0)
    for i in range(min(len(data), 300)):
        pair = data.example(i, epoch=i % 3)
        np.testing.assert_array_equal(pair.joins_a, pair.tokens_a % 2)
        if mode == "none":
            assert pair.tokens_b is None and pair.joins_b is None
        else:
            np.testing.assert_array_equal(pair.joins_b, pair.tokens_b % 2)


def test_phrase_masking_masks_whole_phrases(wiki_phrases):
    from ember.config import DataConfig, ModelConfig
    from ember.models import build_backbone
    from ember.objectives.bert import BertPretraining
    from ember.objectives.masking import build_masker, unit_starts, units_of_row

    corpus = TokenCorpus(wiki_phrases, "train")
    special = {**corpus.special_token_ids, "tokenizer_path": str(corpus.tokenizer_path)}
    data = DataConfig(masking="phrase")
    masker = build_masker(data, special, 2000)
    cfg = ModelConfig(vocab_size=2000, hidden_size=32, num_layers=1, num_heads=2, intermediate_size=64)
    module = BertPretraining(build_backbone(cfg), special, data, "nsp", masker)
    pairs = [SegmentPairDataset(corpus, 64, "nsp", seed=0).example(i) for i in range(64)]
    batch = module.make_batch(pairs, np.random.default_rng(0))
    labels = batch["labels"].numpy()
    ids = np.where(labels != -100, labels, batch["input_ids"].numpy())
    maskable = (ids != special["cls"]) & (ids != special["sep"]) & (ids != special["pad"])
    joins = pack_joins(pairs, ids.shape[1])
    starts = unit_starts(ids, maskable, "phrase", masker.continues_word, joins)
    long_units = 0
    for row in range(len(ids)):
        for s, e in zip(*units_of_row(starts[row], maskable[row])):
            chosen = labels[row, s:e] != -100
            assert chosen.all() or not chosen.any()
            long_units += bool(chosen.all() and joins[row, s + 1 : e].any())
    assert long_units >= 5  # multi-word phrases were masked as units


def test_ernie_recipe_loss_goes_down_on_real_text(wiki_phrases, tmp_path):
    cfg = recipe_config("ernie-mini", wiki_phrases, *SHORT_RUN)
    assert cfg.data.masking == "phrase"
    records = short_run(cfg, tmp_path / "run")
    train = [r["mlm_loss"] for r in records if r["split"] == "train"]
    assert np.mean(train[-8:]) < np.mean(train[:5]) - 0.6


def test_phrase_masking_without_stored_phrases_is_a_clear_error(wiki_prepared, tmp_path):
    cfg = recipe_config("ernie-mini", wiki_prepared, "train.max_steps=1")
    with pytest.raises(EmberError, match="--phrases"):
        short_run(cfg, tmp_path / "run")
