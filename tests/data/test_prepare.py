"""prepare_corpus → TokenCorpus: content round trip on real wiki text, holdout, atomic
writes, flat memory."""

from __future__ import annotations

import json
import random
import tracemalloc
import unicodedata

import numpy as np
import pytest

from ember.data import prepare as prepare_mod
from ember.data.prepare import encode_documents, is_valid_doc, prepare_corpus
from ember.data.readers import iter_documents
from ember.data.sentences import split_sentences
from ember.data.shards import TokenCorpus
from ember.errors import EmberError
from ember.paths import data_root
from ember.tokenizers import load_tokenizer, special_token_ids, train_tokenizer

WIKI_FILES = sorted((data_root() / "wiki-en" / "AA").glob("wiki_0[0-5].gz"))
needs_wiki = pytest.mark.skipif(not WIKI_FILES, reason="real data missing: wiki-en/AA (set EMBER_DATA)")
MAX_DOCS = 200


def _norm(text: str) -> str:
    """Compare texts modulo case, whitespace (WordPiece decoding re-spaces punctuation) and
    invisible control/format characters such as U+200E, which BERT's pipeline drops."""
    return "".join(ch for ch in text.lower() if not ch.isspace()
                   and not unicodedata.category(ch).startswith("C"))


def _synthetic_jsonl(path, n_docs: int, seed: int = 0, sentences: int = 12) -> None:
    rng = random.Random(seed)
    words = [w for w in "alpha beta gamma delta epsilon zeta theta iota kappa lambda mu nu xi "
             "omicron pi rho sigma tau upsilon phi chi psi omega river stone light".split()]
    with open(path, "w", encoding="utf-8") as f:
        for _ in range(n_docs):
            sents = [" ".join(rng.choice(words) for _ in range(rng.randint(5, 20))).capitalize() + "."
                     for _ in range(sentences)]
            f.write(json.dumps({"text": " ".join(sents)}) + "\n")


@pytest.fixture(scope="module")
def wiki_tokenizer(tmp_path_factory):
    if not WIKI_FILES:
        pytest.skip("real data missing: wiki-en/AA (set EMBER_DATA)")
    tok = train_tokenizer(WIKI_FILES, vocab_size=6000, max_documents=MAX_DOCS, progress=False)
    path = tmp_path_factory.mktemp("tok") / "tokenizer.json"
    tok.save(str(path))
    return path


@pytest.fixture(scope="module")
def wiki_prepared(wiki_tokenizer, tmp_path_factory):
    out = tmp_path_factory.mktemp("prep") / "wiki"
    # Small shards so the corpus spans several: exercises global sentence ids across shards.
    stats = prepare_corpus(WIKI_FILES, wiki_tokenizer, out, valid_fraction=0.05,
                           shard_tokens=150_000, max_docs=MAX_DOCS, progress=False)
    return out, stats


@pytest.fixture(scope="module")
def synthetic_tokenizer(tmp_path_factory):
    d = tmp_path_factory.mktemp("syn")
    _synthetic_jsonl(d / "train.jsonl", 50)
    tok = train_tokenizer([d / "train.jsonl"], vocab_size=200, progress=False)
    tok.save(str(d / "tokenizer.json"))
    return d / "tokenizer.json"


def _expected_splits(files, max_docs, valid_fraction, seed=0):
    """Document texts per split, following prepare's holdout rule."""
    docs = [d.text for _, d in zip(range(max_docs), iter_documents(files))]
    valid = [t for i, t in enumerate(docs) if is_valid_doc(i, valid_fraction, seed)]
    train = [t for i, t in enumerate(docs) if not is_valid_doc(i, valid_fraction, seed)]
    if not valid and valid_fraction > 0 and len(docs) >= 2:
        valid = [train.pop()]
    return {"train": train, "valid": valid}


@needs_wiki
def test_token_corpus_decodes_back_to_the_source_sentences(wiki_prepared):
    out, stats = wiki_prepared
    tok = load_tokenizer(out / "tokenizer.json")
    expected = _expected_splits(WIKI_FILES, MAX_DOCS, 0.05)
    for split, texts in expected.items():
        corpus = TokenCorpus(out, split)
        assert corpus.num_docs == len(texts)
        for d in range(0, corpus.num_docs, 7):
            sents = split_sentences(texts[d])
            got = [tok.decode(corpus.sentence(s).tolist()) for s in corpus.doc_sentences(d)]
            assert [_norm(s) for s in got] == [_norm(s) for s in sents]


@needs_wiki
def test_counts_match_meta_and_source(wiki_prepared):
    out, stats = wiki_prepared
    meta = json.loads((out / "meta.json").read_text())
    train, valid = TokenCorpus(out, "train"), TokenCorpus(out, "valid")
    assert stats["docs"] == train.num_docs + valid.num_docs == MAX_DOCS
    assert stats["tokens"] == train.num_tokens + valid.num_tokens
    assert len(meta["splits"]["train"]["shards"]) > 1
    for corpus in (train, valid):
        assert corpus.doc_offsets.shape == (corpus.num_docs + 1,)
        assert corpus.doc_offsets[-1] == corpus.num_sentences == len(corpus.sentence_lengths)
        assert int(corpus.sentence_lengths.sum()) == corpus.num_tokens
        assert (corpus.sentence_lengths > 0).all()
        assert sum(len(corpus.doc_tokens(d)) for d in range(corpus.num_docs)) == corpus.num_tokens
    expected_sents = sum(len(split_sentences(d.text))
                         for _, d in zip(range(MAX_DOCS), iter_documents(WIKI_FILES)))
    assert train.num_sentences + valid.num_sentences == expected_sents


@needs_wiki
def test_valid_split_is_nonempty_and_disjoint_from_train(wiki_prepared):
    out, _ = wiki_prepared
    train, valid = TokenCorpus(out, "train"), TokenCorpus(out, "valid")
    assert 1 <= valid.num_docs < train.num_docs
    key = lambda c, d: c.doc_tokens(d).tobytes()  # noqa: E731
    train_docs = {key(train, d) for d in range(train.num_docs)}
    assert not any(key(valid, d) in train_docs for d in range(valid.num_docs))


@needs_wiki
def test_meta_records_tokenizer_hash_dtype_and_special_ids(wiki_prepared, wiki_tokenizer):
    import hashlib

    out, _ = wiki_prepared
    corpus = TokenCorpus(out)
    meta = corpus.meta
    assert meta["tokenizer"]["sha256"] == hashlib.sha256(wiki_tokenizer.read_bytes()).hexdigest()
    assert meta["tokenizer"]["kind"] == "wordpiece" and meta["dtype"] == "uint16"
    assert corpus.special_token_ids == special_token_ids(load_tokenizer(wiki_tokenizer))
    assert corpus.sentence(0).dtype == np.uint16
    assert isinstance(corpus._tokens[0], np.memmap)  # opened lazily, not read into RAM


def _reference_encoding(tok, text):
    """Each sentence encoded on its own: what encode_documents must reproduce."""
    parts = [e.ids for e in tok.encode_batch(split_sentences(text), add_special_tokens=False)]
    parts = [p for p in parts if p]
    return [i for p in parts for i in p], np.cumsum([len(p) for p in parts]).tolist()


@needs_wiki
@pytest.mark.parametrize("kind", ["wordpiece", "bpe", "unigram"])
def test_joined_encoding_equals_encoding_each_sentence(kind):
    docs = [d.text for _, d in zip(range(20), iter_documents(WIKI_FILES[:1]))] + ["", " \n "]
    tok = train_tokenizer(WIKI_FILES[:1], kind=kind, vocab_size=800,
                          max_documents=3 if kind == "unigram" else 20, progress=False)
    sep_id = special_token_ids(tok)["sep"]
    sep = tok.id_to_token(sep_id)
    # The second call has a document containing the sep token itself: the fallback path.
    literal = ["A text with a literal [SEP] and </s> in it. Second sentence."]
    for texts in (docs, docs + literal):
        enc = encode_documents(tok, texts, sep, sep_id)
        assert len(enc.doc_sentences) == len(texts)
        for d, text in enumerate(texts):
            ids, ends = enc.document(d)
            assert (ids.tolist(), ends.tolist()) == _reference_encoding(tok, text)


def test_long_documents_are_encoded_in_pieces_with_the_same_result(synthetic_tokenizer, tmp_path,
                                                                   monkeypatch):
    corpus = tmp_path / "c.jsonl"
    _synthetic_jsonl(corpus, 6, sentences=40)
    texts = [d.text for d in iter_documents([corpus])] + ["", "One. Two."]
    tok = load_tokenizer(synthetic_tokenizer)
    sep_id = special_token_ids(tok)["sep"]
    whole = encode_documents(tok, texts, "[SEP]", sep_id)
    monkeypatch.setattr(prepare_mod, "MAX_PIECE_CHARS", 300)  # ~3 sentences per piece
    monkeypatch.setattr(prepare_mod, "BATCH_CHARS", 1000)  # several encode calls per doc
    pieces = encode_documents(tok, texts, "[SEP]", sep_id)
    assert whole.tokens.tolist() == pieces.tokens.tolist()
    assert whole.sentence_lengths.tolist() == pieces.sentence_lengths.tolist()
    assert whole.doc_sentences.tolist() == pieces.doc_sentences.tolist() == [40] * 6 + [0, 2]


def test_shard_writer_rotates_at_document_boundaries_and_can_take_back_the_last(tmp_path):
    from ember.data.shards import ShardWriter

    w = ShardWriter(tmp_path / "train", np.uint16, shard_tokens=10)
    # documents of 7, 5, 6 and 20 tokens (the last larger than a shard)
    w.add_documents(np.arange(38), np.array([3, 4, 5, 2, 2, 2, 20]), np.array([2, 1, 3, 1]))
    assert [s["num_tokens"] for s in w.shards] == [7, 5, 6]  # no document crosses a shard
    ids, ends = w.pop_last_document()
    assert ids.tolist() == list(range(18, 38)) and ends.tolist() == [20]
    w.add_document(np.array([1, 2, 3]), np.array([1, 3]))
    info = w.close()
    assert (info["num_docs"], info["num_sentences"], info["num_tokens"]) == (4, 8, 21)
    assert [s["num_tokens"] for s in info["shards"]] == [7, 5, 6, 3]
    assert sorted(p.name for p in (tmp_path / "train").iterdir())[-3:] == [
        "shard_00003.docs.bin", "shard_00003.sentences.bin", "shard_00003.tokens.bin"]
    assert (tmp_path / "train" / "shard_00003.tokens.bin").read_bytes() == \
        np.array([1, 2, 3], dtype="<u2").tobytes()
    lone = ShardWriter(tmp_path / "lone", np.uint16, shard_tokens=10)
    lone.add_document(np.array([5, 6]), np.array([2]))
    lone.pop_last_document()
    assert lone.close()["shards"] == [] and not any((tmp_path / "lone").iterdir())


def test_holdout_hash_is_fixed_and_close_to_the_fraction():
    from ember.data.prepare import holdout_mask

    mask = holdout_mask(np.arange(100_000), 0.01, seed=0)
    assert 900 < mask.sum() < 1100
    assert mask.tolist() == holdout_mask(np.arange(100_000), 0.01, seed=0).tolist()
    assert mask.tolist() != holdout_mask(np.arange(100_000), 0.01, seed=1).tolist()
    assert [is_valid_doc(i, 0.01, 0) for i in range(2000)] == mask[:2000].tolist()
    assert not holdout_mask(np.arange(10), 0.0, seed=0).any()


def test_existing_output_is_not_overwritten_without_permission(synthetic_tokenizer, tmp_path):
    corpus = tmp_path / "c.jsonl"
    _synthetic_jsonl(corpus, 5)
    out = tmp_path / "out"
    prepare_corpus([corpus], synthetic_tokenizer, out, progress=False)
    with pytest.raises(EmberError, match="already exists.*--overwrite"):
        prepare_corpus([corpus], synthetic_tokenizer, out, progress=False)
    _synthetic_jsonl(corpus, 8, seed=1)
    prepare_corpus([corpus], synthetic_tokenizer, out, progress=False, overwrite=True)
    assert TokenCorpus(out).num_docs + TokenCorpus(out, "valid").num_docs == 8
    assert sorted(p.name for p in tmp_path.iterdir()) == ["c.jsonl", "out"]


def test_failure_midway_leaves_no_partial_output_and_keeps_old_one(synthetic_tokenizer, tmp_path):
    good, bad = tmp_path / "good.jsonl", tmp_path / "bad.jsonl"
    _synthetic_jsonl(good, 4)
    _synthetic_jsonl(bad, 40)
    with open(bad, "a") as f:
        f.write('{"text": broken\n')
    out = tmp_path / "out"
    with pytest.raises(EmberError, match=r"bad\.jsonl:41: malformed JSON"):
        prepare_corpus([bad], synthetic_tokenizer, out, batch_docs=4, progress=False)
    assert not out.exists()
    prepare_corpus([good], synthetic_tokenizer, out, progress=False)
    before = (out / "meta.json").read_text()
    with pytest.raises(EmberError):
        prepare_corpus([bad], synthetic_tokenizer, out, batch_docs=4, overwrite=True, progress=False)
    assert (out / "meta.json").read_text() == before
    assert sorted(p.name for p in tmp_path.iterdir()) == ["bad.jsonl", "good.jsonl", "out"]


def test_interrupt_midway_removes_the_temporary_directory(synthetic_tokenizer, tmp_path, monkeypatch):
    corpus = tmp_path / "c.jsonl"
    _synthetic_jsonl(corpus, 30)
    calls = []
    real = prepare_mod.encode_documents

    def flaky(*args):
        calls.append(1)
        if len(calls) == 3:
            raise KeyboardInterrupt
        return real(*args)

    monkeypatch.setattr(prepare_mod, "encode_documents", flaky)
    with pytest.raises(KeyboardInterrupt):
        prepare_corpus([corpus], synthetic_tokenizer, tmp_path / "out", batch_docs=5, progress=False)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["c.jsonl"]


def test_empty_corpus_error_names_the_inputs(synthetic_tokenizer, tmp_path):
    corpus = tmp_path / "empty.txt"
    corpus.write_text("\n\n   \n", encoding="utf-8")
    with pytest.raises(EmberError, match=r"no text in the input.*empty\.txt"):
        prepare_corpus([corpus], synthetic_tokenizer, tmp_path / "out", progress=False)
    assert not (tmp_path / "out").exists()


def test_holdout_is_deterministic_and_can_be_disabled(synthetic_tokenizer, tmp_path):
    corpus = tmp_path / "c.jsonl"
    _synthetic_jsonl(corpus, 60)
    a = prepare_corpus([corpus], synthetic_tokenizer, tmp_path / "a", valid_fraction=0.2,
                       progress=False)
    b = prepare_corpus([corpus], synthetic_tokenizer, tmp_path / "b", valid_fraction=0.2,
                       progress=False)
    assert a["splits"] == b["splits"] and a["splits"]["valid"]["num_docs"] > 0
    none = prepare_corpus([corpus], synthetic_tokenizer, tmp_path / "n", valid_fraction=0,
                          progress=False)
    assert none["splits"]["valid"]["num_docs"] == 0
    assert TokenCorpus(tmp_path / "n", "valid").num_docs == 0
    assert TokenCorpus(tmp_path / "n").num_docs == 60


def test_two_documents_give_one_valid_document(synthetic_tokenizer, tmp_path):
    corpus = tmp_path / "c.jsonl"
    _synthetic_jsonl(corpus, 2)
    stats = prepare_corpus([corpus], synthetic_tokenizer, tmp_path / "o", valid_fraction=1e-9,
                           progress=False)
    assert stats["splits"]["train"]["num_docs"] == stats["splits"]["valid"]["num_docs"] == 1


def test_token_corpus_rejects_missing_or_mismatched_directories(synthetic_tokenizer, tmp_path):
    with pytest.raises(EmberError, match="not found"):
        TokenCorpus(tmp_path / "nope")
    (tmp_path / "x").mkdir()
    with pytest.raises(EmberError, match="no meta.json"):
        TokenCorpus(tmp_path / "x")
    corpus = tmp_path / "c.jsonl"
    _synthetic_jsonl(corpus, 5)
    prepare_corpus([corpus], synthetic_tokenizer, tmp_path / "o", progress=False)
    with pytest.raises(EmberError, match="no split 'test'"):
        TokenCorpus(tmp_path / "o", "test")
    shard = next((tmp_path / "o" / "train").glob("*.tokens.bin"))
    shard.write_bytes(shard.read_bytes()[:-2])  # truncated shard
    with pytest.raises(EmberError, match="incomplete or mismatched"):
        TokenCorpus(tmp_path / "o")


def test_writer_memory_stays_flat_as_the_corpus_grows(synthetic_tokenizer, tmp_path):
    """The Python-heap peak (tracemalloc; numpy buffers included) for a corpus 4x larger
    grows by less than 256 KiB, while holding the large corpus' ids (~200k tokens) would
    add megabytes: nothing accumulates per document."""

    def peak(n_docs: int) -> int:
        corpus = tmp_path / f"c{n_docs}.jsonl"
        _synthetic_jsonl(corpus, n_docs, sentences=8)
        tracemalloc.start()
        try:
            stats = prepare_corpus([corpus], synthetic_tokenizer, tmp_path / f"o{n_docs}",
                                   batch_docs=32, valid_fraction=0.1, progress=False)
            assert stats["tokens"] > n_docs * 80
            return tracemalloc.get_traced_memory()[1]
        finally:
            tracemalloc.stop()

    small, large = peak(500), peak(2000)
    assert large - small < 256 * 1024, (small, large)


def test_cli_prepare_prints_a_summary_and_refuses_to_overwrite(synthetic_tokenizer, tmp_path, capsys):
    from ember.cli import main

    corpus = tmp_path / "c.jsonl"
    _synthetic_jsonl(corpus, 10)
    args = ["prepare", str(corpus), "--tokenizer", str(synthetic_tokenizer), "--out",
            str(tmp_path / "out"), "--no-progress", "--valid-fraction", "0.1"]
    assert main(args) == 0
    assert "prepared 10 docs" in capsys.readouterr().out
    assert main(args) == 1
    assert "--overwrite" in capsys.readouterr().err
    assert main(args + ["--overwrite"]) == 0
