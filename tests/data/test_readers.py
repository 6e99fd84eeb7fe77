"""Document readers (text / lines / jsonl / wiki, gz / bz2, folders, globs) and the sentence
splitter. All inputs are generated in tmp_path."""

from __future__ import annotations

import bz2
import gzip
import json

import pytest

from ember.data.readers import DocumentReader, detect_format, expand_inputs, iter_documents
from ember.data.sentences import split_sentences
from ember.errors import EmberError

WIKI = """<doc id="1" url="http://x/1" title="Alpha">
Alpha

Alpha is the first letter.
It has a second paragraph.

</doc>
<doc id="2" url="http://x/2" title="Beta">
Beta

Beta comes next.
</doc>
<doc id="3" url="http://x/3" title="Empty">
Empty

</doc>
"""


def texts(inputs, **kw):
    return [d.text for d in iter_documents(inputs, **kw)]


# --- formats -----------------------------------------------------------------------------


def test_plain_text_documents_are_separated_by_blank_lines(tmp_path):
    f = tmp_path / "a.txt"
    f.write_text("first doc line one\nline two\n\n\n  second doc  \n\n", encoding="utf-8")
    docs = list(iter_documents([f]))
    assert [d.text for d in docs] == ["first doc line one\nline two", "second doc"]
    assert [d.line for d in docs] == [1, 5]
    assert docs[0].source == str(f)


def test_lines_format_gives_one_document_per_line(tmp_path):
    f = tmp_path / "reviews.txt"
    f.write_text("좋은 영화\n\n별로였다\n", encoding="utf-8")
    assert texts([f], fmt="lines") == ["좋은 영화", "별로였다"]


def test_jsonl_reads_the_text_field_and_skips_empty_documents(tmp_path):
    f = tmp_path / "c.jsonl"
    rows = [{"text": "one"}, {"text": ""}, {"body": "x", "text": "two"}]
    f.write_text("\n".join(json.dumps(r) for r in rows) + "\n\n", encoding="utf-8")
    reader = DocumentReader([f])
    assert [d.text for d in reader] == ["one", "two"]
    assert reader.empty_skipped == 1 and reader.documents == 2


def test_jsonl_other_text_field(tmp_path):
    f = tmp_path / "c.jsonl"
    f.write_text('{"body": "hello"}\n', encoding="utf-8")
    assert texts([f], text_field="body") == ["hello"]


def test_wiki_drops_title_line_and_keeps_paragraph_breaks(tmp_path):
    f = tmp_path / "wiki_00"
    f.write_text(WIKI, encoding="utf-8")
    assert detect_format(f) == "wiki"
    reader = DocumentReader([f])
    docs = list(reader)
    assert [d.text for d in docs] == [
        "Alpha is the first letter.\nIt has a second paragraph.",
        "Beta comes next.",
    ]
    assert [d.line for d in docs] == [1, 8]
    assert reader.empty_skipped == 1


def test_gzip_and_bz2_files_are_decompressed_while_streaming(tmp_path):
    with gzip.open(tmp_path / "w.gz", "wt", encoding="utf-8") as f:
        f.write(WIKI)
    with bz2.open(tmp_path / "t.txt.bz2", "wt", encoding="utf-8") as f:
        f.write("plain one\n\nplain two\n")
    with gzip.open(tmp_path / "j.jsonl.gz", "wt", encoding="utf-8") as f:
        f.write('{"text": "json one"}\n')
    assert texts([tmp_path / "w.gz"]) == ["Alpha is the first letter.\nIt has a second paragraph.",
                                          "Beta comes next."]
    assert texts([tmp_path / "t.txt.bz2"]) == ["plain one", "plain two"]
    assert texts([tmp_path / "j.jsonl.gz"]) == ["json one"]


def test_folder_is_recursive_sorted_and_skips_hidden_files(tmp_path):
    (tmp_path / "b").mkdir()
    (tmp_path / ".git").mkdir()
    (tmp_path / "b" / "2.txt").write_text("two\n")
    (tmp_path / "a.txt").write_text("one\n")
    (tmp_path / ".hidden.txt").write_text("hidden\n")
    (tmp_path / ".git" / "x.txt").write_text("git\n")
    assert texts([tmp_path]) == ["one", "two"]


def test_glob_patterns_match_files(tmp_path):
    for name in ("x1.txt", "x2.txt", "y.txt"):
        (tmp_path / name).write_text(name + "\n")
    assert texts([str(tmp_path / "x*.txt")]) == ["x1.txt", "x2.txt"]


def test_reader_counts_text_and_disk_bytes(tmp_path):
    f = tmp_path / "a.txt"
    f.write_text("abc\n\ndef\n")
    reader = DocumentReader([f])
    list(reader)
    assert reader.text_bytes == 9 and reader.disk_bytes == reader.disk_total == 9


def test_byte_order_mark_is_dropped(tmp_path):
    f = tmp_path / "bom.txt"
    f.write_bytes("\ufeffhello\n".encode("utf-8"))
    assert texts([f]) == ["hello"]


# --- errors ------------------------------------------------------------------------------


def test_non_utf8_bytes_name_file_line_and_offset(tmp_path):
    f = tmp_path / "latin1.txt"
    f.write_bytes(b"fine line\ncaf\xe9 au lait\n")
    with pytest.raises(EmberError) as err:
        list(iter_documents([f]))
    msg = str(err.value)
    assert f"{f}:2" in msg and "UTF-8" in msg and "byte offset 13" in msg and "re-encode" in msg


def test_non_utf8_inside_gzip_is_reported(tmp_path):
    f = tmp_path / "bad.txt.gz"
    with gzip.open(f, "wb") as g:
        g.write(b"ok\n\nok\n\xff\xfe\n")
    with pytest.raises(EmberError, match=r"bad\.txt\.gz:4"):
        list(iter_documents([f]))


def test_malformed_jsonl_line_reports_line_number(tmp_path):
    f = tmp_path / "c.jsonl"
    f.write_text('{"text": "a"}\n{"text": "b"}\n{"text": \n', encoding="utf-8")
    with pytest.raises(EmberError, match=r"c\.jsonl:3: malformed JSON"):
        list(iter_documents([f]))


def test_missing_text_field_is_an_error_naming_the_field(tmp_path):
    f = tmp_path / "c.jsonl"
    f.write_text('{"content": "a"}\n', encoding="utf-8")
    with pytest.raises(EmberError, match=r"c\.jsonl:1: no field 'text'.*content"):
        list(iter_documents([f]))


def test_unclosed_wiki_doc_is_an_error(tmp_path):
    f = tmp_path / "w.txt"
    f.write_text('<doc id="1">\nT\n\nbody\n<doc id="2">\nT2\nx\n</doc>\n', encoding="utf-8")
    with pytest.raises(EmberError, match=r"w\.txt:1: <doc> opened here is not closed"):
        list(iter_documents([f]))
    f.write_text('<doc id="1">\nT\n\nbody\n', encoding="utf-8")
    with pytest.raises(EmberError, match="never closed"):
        list(iter_documents([f]))


def test_no_files_matched_names_the_pattern(tmp_path):
    pattern = str(tmp_path / "nothing*.txt")
    with pytest.raises(EmberError, match=r"no input files matched .*nothing\*\.txt"):
        iter_documents([pattern])
    with pytest.raises(EmberError, match="input not found"):
        expand_inputs([tmp_path / "missing.txt"])
    (tmp_path / "empty").mkdir()
    with pytest.raises(EmberError, match="no input files matched"):
        expand_inputs([tmp_path / "empty"])


def test_empty_corpus_yields_nothing_and_counts_empty_documents(tmp_path):
    f = tmp_path / "e.jsonl"
    f.write_text('{"text": ""}\n{"text": "   "}\n', encoding="utf-8")
    reader = DocumentReader([f])
    assert list(reader) == [] and reader.empty_skipped == 2
    assert "e.jsonl" in reader.describe_inputs()


def test_unknown_format_is_rejected(tmp_path):
    (tmp_path / "a.txt").write_text("x\n")
    with pytest.raises(EmberError, match="unknown format"):
        iter_documents([tmp_path / "a.txt"], fmt="csv")


# --- sentences ---------------------------------------------------------------------------


def test_sentences_split_on_terminal_punctuation():
    assert split_sentences("It rained. Then it stopped! Did it? Yes.") == [
        "It rained.", "Then it stopped!", "Did it?", "Yes."]


def test_sentences_do_not_split_after_abbreviations():
    text = "Mr. Smith met Dr. Jones at St. Paul's, i.e. the church. The U.S. Army left in Jan. 1990."
    assert split_sentences(text) == [
        "Mr. Smith met Dr. Jones at St. Paul's, i.e. the church.",
        "The U.S. Army left in Jan. 1990."]


def test_abbreviation_after_no_break_space_is_recognised():
    assert split_sentences("It left at 7:51\u00a0a.m. Everyone cheered. Then quiet.") == [
        "It left at 7:51\u00a0a.m. Everyone cheered.", "Then quiet."]


def test_sentences_do_not_split_after_initials():
    assert split_sentences("It was written by J. R. R. Tolkien. He was British.") == [
        "It was written by J. R. R. Tolkien.", "He was British."]


def test_sentences_do_not_split_inside_decimals():
    assert split_sentences("Pi is 3.14159 roughly. It costs $2.50 today.") == [
        "Pi is 3.14159 roughly.", "It costs $2.50 today."]


def test_sentences_split_before_quotes_brackets_and_digits():
    assert split_sentences('He left. "Why?" she asked. (It was late.) 1990 was a year.') == [
        "He left.", '"Why?" she asked.', "(It was late.)", "1990 was a year."]
    assert split_sentences('She said "stop." Then he stopped.') == [
        'She said "stop."', "Then he stopped."]


def test_sentences_do_not_split_before_lower_case():
    assert split_sentences("See the figure. and more text here.") == [
        "See the figure. and more text here."]


def test_cyrillic_sentences_split_on_upper_case():
    assert split_sentences("Он пришёл домой. Всё было тихо... Потом? Ночь.") == [
        "Он пришёл домой.", "Всё было тихо...", "Потом?", "Ночь."]


def test_text_without_punctuation_gives_one_sentence_per_line():
    text = "정말 재미있는 영화\n  \n배우들 연기가 좋았다\n"
    assert split_sentences(text) == ["정말 재미있는 영화", "배우들 연기가 좋았다"]


def test_empty_and_whitespace_text_gives_no_sentences():
    assert split_sentences("") == [] and split_sentences(" \n\t\n ") == []
