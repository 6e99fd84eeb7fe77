"""Shared fixtures: a tiny WordPiece tokenizer and access to the real data root."""

from __future__ import annotations

import os
from pathlib import Path

# The README's test command spreads the suite over the cores (pytest-xdist, one worker per core).
# Each worker then computes with one thread: two workers with torch's default of a thread per
# core would each spin OpenMP threads on the other's core. Set before torch is imported, so the
# subprocesses the tests start (ember's CLI, torchrun) inherit it too.
if int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "1")) > 1:
    os.environ["OMP_NUM_THREADS"] = "1"

import pytest

from ember.paths import data_root


# Real WordNet 3.0 triples for the words of SST-2 dev and some CoNLL-2003 sentences (< 1 MB;
# tests/fixtures/kg/make_sample.py rebuilds it).
KG_SAMPLE = Path(__file__).resolve().parent / "fixtures" / "kg" / "wordnet-sample.tsv"


def real_data(*parts: str):
    """Path under the shared data root; skips the test with a reason if it is absent."""
    path = data_root().joinpath(*parts)
    if not path.exists():
        pytest.skip(f"real data not found at {path} (set EMBER_DATA)")
    return path


def make_wordpiece(words: list[str], lowercase: bool = True):
    """A WordPiece tokenizer over a fixed vocabulary, BERT-style special tokens and template."""
    from tokenizers import Tokenizer, decoders, models, normalizers, pre_tokenizers, processors

    vocab = {t: i for i, t in enumerate(["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"] + words)}
    tok = Tokenizer(models.WordPiece(vocab, unk_token="[UNK]"))
    tok.normalizer = normalizers.BertNormalizer(lowercase=lowercase, strip_accents=False)
    tok.pre_tokenizer = pre_tokenizers.BertPreTokenizer()
    tok.decoder = decoders.WordPiece()
    tok.post_processor = processors.TemplateProcessing(
        single="[CLS] $A [SEP]", pair="[CLS] $A [SEP] $B:1 [SEP]:1",
        special_tokens=[("[CLS]", 2), ("[SEP]", 3)],
    )
    return tok


@pytest.fixture
def tiny_tokenizer_path(tmp_path):
    words = [f"w{i}" for i in range(90)] + ["the", "a", "##s"]
    path = tmp_path / "tokenizer.json"
    make_wordpiece(words).save(str(path))
    return path


@pytest.fixture(scope="session")
def wiki_prepared(tmp_path_factory):
    """A WordPiece tokenizer (2k vocab) and token shards from ~150 real Wikipedia articles."""
    from ember.data.prepare import prepare_corpus
    from ember.tokenizers import train_tokenizer

    source = real_data("wiki-en", "AA", "wiki_00.gz")
    root = tmp_path_factory.mktemp("wiki")
    tok = train_tokenizer([source], vocab_size=2000, max_documents=150, progress=False)
    tok.save(str(root / "tokenizer.json"))
    prepare_corpus([source], root / "tokenizer.json", root / "prepared", max_docs=150,
                   valid_fraction=0.05, progress=False)
    return root / "prepared"


@pytest.fixture(scope="session")
def wiki_t5_prepared(tmp_path_factory):
    """T5's layout (ember tokenizer train --kind unigram: <pad> </s> <unk>, 100 sentinels; 2k
    vocabulary, cased) and token shards of the ~40 real Wikipedia articles of wiki_00."""
    from ember.data.prepare import prepare_corpus
    from ember.tokenizers import train_tokenizer

    source = real_data("wiki-en", "AA", "wiki_00.gz")
    root = tmp_path_factory.mktemp("wiki-t5")
    tok = train_tokenizer([source], kind="unigram", vocab_size=2000, max_documents=50, lowercase=False,
                          progress=False)
    tok.save(str(root / "tokenizer.json"))
    prepare_corpus([source], root / "tokenizer.json", root / "prepared", max_docs=150,
                   valid_fraction=0.05, progress=False)
    return root / "prepared"


TINY_MODEL = [
    "model.hidden_size=32", "model.num_layers=2", "model.num_heads=2", "model.intermediate_size=64",
    "model.max_position=64", "model.vocab_size=2000", "data.max_seq_length=64", "data.eval_examples=32",
]


def bpe_corpus(root, vocab_size: int, max_docs: int, valid_fraction: float):
    """A byte-level BPE (cased, with <|endoftext|>) trained on and preparing ``max_docs`` real
    Wikipedia articles of wiki_00 under ``root``; the prepared folder."""
    from ember.data.prepare import prepare_corpus
    from ember.tokenizers import train_tokenizer

    source = real_data("wiki-en", "AA", "wiki_00.gz")
    tok = train_tokenizer([source], kind="bpe", vocab_size=vocab_size, lowercase=False, max_documents=max_docs,
                          progress=False)
    tok.save(str(root / "tokenizer.json"))
    prepare_corpus([source], root / "tokenizer.json", root / "prepared", max_docs=max_docs,
                   valid_fraction=valid_fraction, progress=False)
    return root / "prepared"


@pytest.fixture(scope="session")
def wiki_bpe(tmp_path_factory):
    """A byte-level BPE (1k vocab, with <|endoftext|>) and token shards of 60 real articles."""
    return bpe_corpus(tmp_path_factory.mktemp("wiki-bpe"), 1000, 60, 0.1)


@pytest.fixture(scope="session")
def en_ru(tmp_path_factory):
    """A shared byte-level BPE (alpha 0.5) and a prepared corpus with en and ru streams, from
    real Wikipedia articles and Chekhov's prose."""
    from ember.data.language_mix import LanguageBalancedSentences
    from ember.data.multilingual import prepare_multilingual
    from ember.tokenizers import train_tokenizer

    root = tmp_path_factory.mktemp("en-ru")
    langs = {"en": [str(real_data("wiki-en", "AA", "wiki_00.gz"))], "ru": [str(real_data("ruslit", "Chekhov") / "*.txt")]}
    tok = train_tokenizer(LanguageBalancedSentences(langs, 0.5, max_documents=12), kind="bpe", vocab_size=800,
                          lowercase=False, progress=False)
    tok.save(str(root / "tokenizer.json"))
    prepare_multilingual(langs, [], root / "tokenizer.json", root / "prepared", max_docs=12, valid_fraction=0.1,
                         progress=False)
    return root / "prepared"
