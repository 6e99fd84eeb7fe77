"""T5's SentencePiece-style unigram vocabulary: <pad>/</s>/<unk> first, 100 sentinels last."""

from __future__ import annotations

import json

import pytest

from conftest import real_data
from ember.errors import EmberError
from ember.tokenizers import sentinel_ids, special_token_ids, train_tokenizer

VOCAB = 1000  # 900 learnt pieces + 3 specials counted in them + 100 sentinels


@pytest.fixture(scope="module")
def t5_tok():
    source = real_data("wiki-en", "AA", "wiki_00.gz")
    # T5's vocabulary is cased
    return train_tokenizer([source], kind="unigram", vocab_size=VOCAB, max_documents=5, lowercase=False,
                           progress=False)


def _wiki_sentences(n: int) -> list[str]:
    from ember.data.readers import iter_documents
    from ember.data.sentences import split_sentences

    doc = next(iter(iter_documents([real_data("wiki-en", "AA", "wiki_00.gz")])))
    return [s for s in split_sentences(doc.text) if len(s) > 40][:n]


def test_t5_unigram_layout_pad_eos_unk_first_sentinels_last_counting_down(t5_tok):
    assert t5_tok.get_vocab_size() == VOCAB
    assert [t5_tok.id_to_token(i) for i in range(3)] == ["<pad>", "</s>", "<unk>"]
    assert special_token_ids(t5_tok) == {"pad": 0, "unk": 2, "sep": 1}  # no cls, no mask
    ids = sentinel_ids(t5_tok)
    assert ids == list(range(VOCAB - 1, VOCAB - 101, -1))  # <extra_id_0> is the last id
    assert t5_tok.id_to_token(VOCAB - 1) == "<extra_id_0>"
    assert t5_tok.id_to_token(VOCAB - 100) == "<extra_id_99>"


def test_t5_unigram_appends_eos_and_keeps_sentinels_whole(t5_tok):
    sentence = _wiki_sentences(1)[0]
    plain = t5_tok.encode(sentence, add_special_tokens=False).ids
    assert t5_tok.encode(sentence).ids == plain + [1]
    pair = t5_tok.encode(sentence, "Second part.")
    assert pair.ids[len(plain)] == 1 and pair.ids[-1] == 1 and set(pair.type_ids) == {0}
    enc = t5_tok.encode("Thank you <extra_id_0> me to your party <extra_id_1> week.")
    assert enc.ids.count(VOCAB - 1) == 1 and enc.ids.count(VOCAB - 2) == 1
    before = [enc.tokens[i - 1] for i, t in enumerate(enc.ids) if t in (VOCAB - 1, VOCAB - 2)]
    assert "▁" not in before  # no stray word marker before a sentinel
    decoded = t5_tok.decode(enc.ids, skip_special_tokens=False)
    assert decoded == "Thank you<extra_id_0> me to your party<extra_id_1> week.</s>"
    assert t5_tok.decode(enc.ids) == "Thank you me to your party week."


def test_t5_unigram_matches_transformers_t5_tokenizer_on_wiki_text(t5_tok):
    """The same pieces and scores in transformers' T5Tokenizer (its T5 layout: sentinels
    reversed at the end, </s> appended) give the same ids on real sentences."""
    from transformers import T5Tokenizer

    pieces = [tuple(v) for v in json.loads(t5_tok.to_str())["model"]["vocab"]]
    vocab = pieces + [(f"<extra_id_{i}>", 0.0) for i in reversed(range(100))]
    hf = T5Tokenizer(vocab=vocab, extra_ids=100)
    assert (hf.pad_token_id, hf.eos_token_id, hf.unk_token_id) == (0, 1, 2)
    assert hf.convert_tokens_to_ids([f"<extra_id_{i}>" for i in range(100)]) == sentinel_ids(t5_tok)
    sentences = _wiki_sentences(20) + ["The <extra_id_0> of <extra_id_7> anarchism."]
    assert len(sentences) > 10
    for sentence in sentences:
        assert t5_tok.encode(sentence).ids == hf(sentence).input_ids, sentence


def test_t5_sentinels_for_any_kind_and_none_means_a_clear_error(tmp_path):
    corpus = tmp_path / "c.txt"
    corpus.write_text("some words here and there\n\nmore words in a second document\n", encoding="utf-8")
    wp = train_tokenizer([corpus], kind="wordpiece", vocab_size=120, min_frequency=1, progress=False)
    message = "c.txt has no sentinel tokens.*cannot be used for span corruption.*--kind unigram.*--sentinels 100"
    with pytest.raises(EmberError, match=message):
        sentinel_ids(wp, where=str(corpus))
    wp = train_tokenizer([corpus], kind="wordpiece", vocab_size=120, min_frequency=1, progress=False, sentinels=10)
    v = wp.get_vocab_size()  # a tiny corpus fills fewer than 110 pieces
    assert sentinel_ids(wp) == list(range(v - 1, v - 11, -1))
    assert special_token_ids(wp)["mask"] == 4  # BERT's layout kept, sentinels appended
    with pytest.raises(EmberError, match="no cls token.*needs sentinels"):
        train_tokenizer([corpus], kind="unigram", vocab_size=150, sentinels=0, progress=False)
    with pytest.raises(EmberError, match="no room"):
        train_tokenizer([corpus], kind="unigram", vocab_size=102, progress=False)


def test_t5_unigram_with_bert_special_tokens_keeps_albert_layout(tmp_path):
    corpus = tmp_path / "c.txt"
    corpus.write_text("albert uses a sentencepiece vocabulary\n\nwith cls and sep tokens\n", encoding="utf-8")
    tok = train_tokenizer([corpus], kind="unigram", vocab_size=150, sentinels=0, progress=False,
                          special_tokens=["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"])
    ids = special_token_ids(tok)
    assert ids == {"pad": 0, "unk": 1, "cls": 2, "sep": 3, "mask": 4}
    assert tok.encode("albert").ids[0] == 2 and tok.encode("albert").ids[-1] == 3
