"""Shared fixtures: a tiny WordPiece tokenizer and access to the real data root."""

from __future__ import annotations

import pytest

from ember.paths import data_root


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
