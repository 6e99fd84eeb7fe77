"""Featurization: the tokenizer's BERT template, pair-aware truncation, collation."""

from __future__ import annotations

import pytest
import torch
from tokenizers import Tokenizer, normalizers, pre_tokenizers, processors, trainers
from tokenizers.models import WordPiece

from ember.errors import EmberError
from ember.paths import data_root
from ember.tasks.featurize import collate, encode_examples
from ember.tasks.readers.glue import Example, read_examples

SPECIALS = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"]

needs_data = pytest.mark.skipif(
    not (data_root() / "glue" / "SST-2").is_dir(), reason="shared GLUE data not available"
)


@pytest.fixture(scope="module")
def sst2_dev():
    if not (data_root() / "glue" / "SST-2").is_dir():
        pytest.skip("shared GLUE data not available")
    return read_examples("sst2", "dev")


@pytest.fixture(scope="module")
def tokenizer(sst2_dev):
    """A tiny BERT-style WordPiece tokenizer trained on real SST-2 sentences."""
    tok = Tokenizer(WordPiece(unk_token="[UNK]"))
    tok.normalizer = normalizers.BertNormalizer(lowercase=True)
    tok.pre_tokenizer = pre_tokenizers.BertPreTokenizer()
    trainer = trainers.WordPieceTrainer(vocab_size=600, special_tokens=SPECIALS)
    tok.train_from_iterator([ex.text_a for ex in sst2_dev[:400]], trainer)
    cls_id, sep_id = tok.token_to_id("[CLS]"), tok.token_to_id("[SEP]")
    tok.post_processor = processors.TemplateProcessing(
        single="[CLS] $A [SEP]",
        pair="[CLS] $A [SEP] $B:1 [SEP]:1",
        special_tokens=[("[CLS]", cls_id), ("[SEP]", sep_id)],
    )
    return tok


def tokens(tok, ids):
    return [tok.id_to_token(i) for i in ids]


def test_single_sentence_gets_cls_and_sep(tokenizer):
    (feat,), n = encode_examples([Example("x-0", "a good film", None, 1)], tokenizer)
    assert tokens(tokenizer, feat["input_ids"]) == ["[CLS]", "a", "good", "film", "[SEP]"]
    assert feat["token_type_ids"] == [0] * 5 and feat["label"] == 1 and n == 0


def test_pair_follows_template_with_segment_ids(tokenizer):
    ex = Example("x-0", "a good film", "the movie", 0)
    (feat,), _ = encode_examples([ex], tokenizer)
    assert tokens(tokenizer, feat["input_ids"]) == [
        "[CLS]", "a", "good", "film", "[SEP]", "the", "movie", "[SEP]"
    ]
    assert feat["token_type_ids"] == [0, 0, 0, 0, 0, 1, 1, 1]


def test_truncation_keeps_special_tokens_and_is_counted(tokenizer):
    long = " ".join(["the film is good"] * 10)  # 40 words
    examples = [
        Example("x-0", long, "a film", 1),
        Example("x-1", "a film", "the movie", 0),
        Example("x-2", long, long, 1),
    ]
    feats, n_truncated = encode_examples(examples, tokenizer, max_length=16)
    assert n_truncated == 2
    for f in feats:
        toks = tokens(tokenizer, f["input_ids"])
        assert len(toks) <= 16 and toks[0] == "[CLS]" and toks[-1] == "[SEP]"
        assert toks.count("[SEP]") == 2
        assert len(f["token_type_ids"]) == len(toks)
    # longest_first trims the longer segment and leaves the short one whole.
    first = tokens(tokenizer, feats[0]["input_ids"])
    assert len(first) == 16 and first[-3:] == ["a", "film", "[SEP]"]
    # Equal lengths are trimmed evenly: 13 text tokens split 7 + 6 or 6 + 7.
    assert sorted(feats[2]["token_type_ids"].count(s) for s in (0, 1)) == [8, 8]


def test_callers_tokenizer_settings_are_untouched(tokenizer):
    tokenizer.enable_truncation(512)
    tokenizer.enable_padding(pad_id=0, pad_token="[PAD]", length=64)
    try:
        before = (tokenizer.truncation, tokenizer.padding)
        (feat,), _ = encode_examples([Example("x", "good", None, 1)], tokenizer, max_length=8)
        assert len(feat["input_ids"]) == 3  # neither the caller's padding nor its length
        assert (tokenizer.truncation, tokenizer.padding) == before
    finally:
        tokenizer.no_truncation()
        tokenizer.no_padding()


def test_max_length_without_room_for_text_is_rejected(tokenizer):
    with pytest.raises(EmberError, match="max_length=3 leaves no room.*3 special tokens"):
        encode_examples([Example("x", "a", "b", 0)], tokenizer, max_length=3)


def test_impossible_only_first_truncation_is_an_ember_error(tokenizer):
    ex = Example("x", "a film", " ".join(["good"] * 20), 0)
    with pytest.raises(EmberError, match="cannot truncate to max_length=8"):
        encode_examples([ex], tokenizer, max_length=8, truncation="only_first")


def test_unknown_truncation_strategy_is_rejected(tokenizer):
    with pytest.raises(EmberError, match="unknown truncation 'left'"):
        encode_examples([Example("x", "a", None, 0)], tokenizer, truncation="left")


@needs_data
def test_real_sst2_dev_encodes_with_labels(tokenizer, sst2_dev):
    feats, n_truncated = encode_examples(sst2_dev, tokenizer, max_length=64)
    assert len(feats) == 872
    assert [f["label"] for f in feats] == [ex.label for ex in sst2_dev]
    full = tokenizer.encode_batch([ex.text_a for ex in sst2_dev])  # fixture: no truncation
    assert n_truncated == sum(len(e.ids) > 64 for e in full) > 0
    assert max(len(f["input_ids"]) for f in feats) == 64


def test_collate_pads_to_longest_row_with_mask():
    feats = [
        {"input_ids": [2, 7, 8, 3], "token_type_ids": [0, 0, 0, 0], "label": 1},
        {"input_ids": [2, 9, 3, 5, 3, 6], "token_type_ids": [0, 0, 0, 1, 1, 1], "label": 0},
    ]
    batch = collate(feats, pad_id=0)
    assert batch["input_ids"].tolist() == [[2, 7, 8, 3, 0, 0], [2, 9, 3, 5, 3, 6]]
    assert batch["attention_mask"].tolist() == [[1, 1, 1, 1, 0, 0], [1] * 6]
    assert batch["token_type_ids"].tolist() == [[0] * 6, [0, 0, 0, 1, 1, 1]]
    assert batch["labels"].tolist() == [1, 0]
    assert all(batch[k].dtype == torch.long for k in batch)


def test_collate_regression_labels_are_float():
    feats = [{"input_ids": [2, 3], "token_type_ids": [0, 0], "label": 4.25},
             {"input_ids": [2, 5, 3], "token_type_ids": [0, 0, 0], "label": 0.0}]
    labels = collate(feats, pad_id=0)["labels"]
    assert labels.dtype == torch.float32 and labels.tolist() == [4.25, 0.0]


def test_collate_unlabelled_batch_has_no_labels_and_mixed_is_rejected():
    unlabelled = [{"input_ids": [2, 3], "token_type_ids": [0, 0], "label": None}]
    assert "labels" not in collate(unlabelled, pad_id=0)
    mixed = unlabelled + [{"input_ids": [2, 3], "token_type_ids": [0, 0], "label": 1}]
    with pytest.raises(ValueError, match="1 of 2 features have no label"):
        collate(mixed, pad_id=0)
