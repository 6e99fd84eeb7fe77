"""CoNLL-2003 column reader: sentences, -DOCSTART-, IOB1 -> IOB2, and file:line errors."""

from __future__ import annotations

import pytest

from conftest import real_data
from ember.errors import EmberError
from ember.tasks.readers.conll import LABELS, iob1_to_iob2, is_iob1, read_conll, read_split

GOOD = """-DOCSTART- -X- -X- O

EU NNP B-NP B-ORG
rejects VBZ B-VP O
German JJ B-NP B-MISC
call NN I-NP O

Peter NNP B-NP B-PER
Blackburn NNP I-NP I-PER


-DOCSTART- -X- -X- O

BRUSSELS NNP B-NP B-LOC
"""


def write(tmp_path, text, name="x.txt"):
    path = tmp_path / name
    path.write_text(text)
    return path


def test_conll_reader_splits_sentences_and_skips_docstart(tmp_path):
    sentences = read_conll(write(tmp_path, GOOD))
    assert [s.words for s in sentences] == [("EU", "rejects", "German", "call"), ("Peter", "Blackburn"),
                                            ("BRUSSELS",)]
    assert sentences[0].tags == ("B-ORG", "O", "B-MISC", "O")
    assert sentences[0].pos == ("NNP", "VBZ", "JJ", "NN") and sentences[1].chunk == ("B-NP", "I-NP")
    assert [s.line for s in sentences] == [3, 8, 14]
    assert read_conll(write(tmp_path, GOOD), limit=2)[-1].words == ("Peter", "Blackburn")


def test_conll_reader_without_trailing_blank_line_and_crlf(tmp_path):
    sentences = read_conll(write(tmp_path, GOOD.rstrip("\n").replace("\n", "\r\n")))
    assert sentences[-1].words == ("BRUSSELS",) and sentences[-1].tags == ("B-LOC",)


def test_conll_reader_accepts_word_tag_and_word_only_files(tmp_path):
    two = read_conll(write(tmp_path, "Peter B-PER\nBlackburn I-PER\n\nhi O\n"))
    assert two[0].tags == ("B-PER", "I-PER") and two[0].pos == ()
    words_only = read_conll(write(tmp_path, "Peter\nBlackburn\n"), require_tags=False)
    assert words_only[0].words == ("Peter", "Blackburn") and words_only[0].tags is None
    with pytest.raises(EmberError, match=r"x.txt:1: expected 4 or 2 .*found 1"):
        read_conll(write(tmp_path, "Peter\nBlackburn\n"))


def test_conll_reader_converts_iob1_to_iob2(tmp_path):
    # IOB1 (the original 2003 release): I- opens entities, B- only splits same-type neighbours.
    iob1 = "Peter I-PER\nBlackburn I-PER\nAnn B-PER\nBob I-PER\nin O\nUK I-LOC\n"
    sentences = read_conll(write(tmp_path, iob1))
    assert sentences[0].tags == ("B-PER", "I-PER", "B-PER", "I-PER", "O", "B-LOC")
    assert is_iob1([("I-PER", "B-PER")]) and not is_iob1([("B-PER", "I-PER")])
    assert iob1_to_iob2(("I-LOC", "I-PER", "I-PER", "B-PER")) == ("B-LOC", "B-PER", "I-PER", "B-PER")


@pytest.mark.parametrize("text, message", [
    ("EU NNP B-NP B-ORG\nrejects VBZ O\n", r"x.txt:2: expected 4 columns like the lines before, found 3"),
    ("EU NNP B-NP B-ORG\nrejects VBZ B-VP B-PERSON\n", r"x.txt:2: NER tag 'B-PERSON' is not a CoNLL-2003 label"),
    ("EU NNP B-NP B-ORG\n-DOCSTART- -X- -X- O\n", r"x.txt:2: -DOCSTART- inside a sentence"),
    ("EU NNP B-NP\n", r"x.txt:1: expected 4 or 2 space-separated columns .*found 3"),
    ("-DOCSTART- -X- -X- O\n\n\n", r"x.txt: no sentences"),
    ("\n\n", r"x.txt: file is empty"),
])
def test_conll_reader_malformed_files_name_file_and_line(tmp_path, text, message):
    with pytest.raises(EmberError, match=message):
        read_conll(write(tmp_path, text))


def test_conll_reader_rejects_non_utf8_with_line(tmp_path):
    path = tmp_path / "x.txt"
    path.write_bytes(b"EU NNP B-NP B-ORG\n\nM\xfcller NNP B-NP B-PER\n")
    with pytest.raises(EmberError, match=r"x.txt:3: not valid UTF-8"):
        read_conll(path)


def test_conll2003_real_splits_have_published_sizes_and_iob2_tags():
    real_data("conll2003", "dev.txt")
    sizes = {split: len(read_split(split)) for split in ("dev", "test")}
    assert sizes == {"dev": 3250, "test": 3453}  # Tjong Kim Sang & De Meulder 2003, Table 1
    dev = read_split("dev")
    assert not is_iob1([s.tags for s in dev])
    assert {t for s in dev for t in s.tags} == set(LABELS)
    assert sum(len(s.words) for s in dev) == 51362
    with pytest.raises(EmberError, match="no split 'valid'"):
        read_split("valid")
