"""The readers a user's file reaches, under any bytes (hypothesis): each gives its rows or raises
one ``EmberError`` whose message names the file - never another exception (a traceback).

Readers: task tables (CSV / TSV / JSONL / JSON), GLUE-layout TSVs and JSONL of `ember predict`,
CoNLL columns, SQuAD JSON, triples TSV, `ember generate`'s prompts files, `ember embed`'s inputs
(.txt / .jsonl / .tsv / .csv), and `ember prepare`'s documents (plain text, JSONL, WikiExtractor,
each also .gz / .bz2, and corrupt archives). Inputs are random bytes, and random lines made of the
characters these formats give meaning to (tabs, quotes, commas, braces, "<doc", "-DOCSTART-"), so
that most examples get past the first check. Derandomized: the same examples on every run.
"""

from __future__ import annotations

import bz2
import gzip
import importlib
import os
import tempfile
from pathlib import Path

import pytest

hypothesis = pytest.importorskip("hypothesis")
from hypothesis import HealthCheck, given, settings, strategies as st  # noqa: E402

from ember.errors import EmberError  # noqa: E402

# READER_EXAMPLES=400 searches deeper (~3 min for the file instead of ~30 s)
SETTINGS = settings(max_examples=int(os.environ.get("READER_EXAMPLES", 60)), deadline=None, derandomize=True,
                    database=None,
                    suppress_health_check=[HealthCheck.too_slow])


def reader(dotted: str):
    """A reader by its current module path ("ember.tasks.readers.conll:read_conll"); one place to fix
    when modules move."""
    module, name = dotted.split(":")
    return getattr(importlib.import_module(module), name)


# Lines built from what the formats give meaning to, so that most files get past the first check.
PIECES = ["\t", ",", '"', "'", "{", "}", "[", "]", ":", " ", "\\", "\r", "\ufeff", "é", "\x00", "0", "1",
          "-1", "2.5", "null", "true", "text", "label", "sentence", "sentence1", "sentence2", "question",
          "context", "prompt", "id", "tokens", "B-PER", "I-ORG", "O", "-DOCSTART-", "<doc id=\"1\">", "</doc>",
          '{"text": "a"}', '{"prompt": 1}', '{"data": []}', '"paragraphs"', '"qas"', '"answers"',
          '"answer_start"', "/m/0", "is_a", "film"]
LINE = st.lists(st.sampled_from(PIECES), max_size=8).map("".join)
TEXT = st.lists(LINE, max_size=12).map("\n".join)
CONTENT = st.one_of(st.binary(max_size=300), TEXT.map(lambda t: t.encode("utf-8", "surrogatepass")),
                    st.text(max_size=200).map(lambda t: t.encode("utf-8", "surrogatepass")))


WORD = st.sampled_from(["film", "a", "fine", "the", "é", '"', "x" * 30, "", " ", "\t", "B-PER", "O", "0", "1"])
CELL = st.lists(WORD, max_size=4).map(" ".join)


def rows_file(header: str, columns: int) -> st.SearchStrategy[bytes]:
    """A header and rows of ``columns`` tab-separated cells, some with too few / many cells or
    empty: files that mostly parse, so the readers' row checks are reached."""
    row = st.lists(CELL, min_size=max(columns - 1, 0), max_size=columns + 1).map("\t".join)
    return st.lists(row, min_size=1, max_size=6).map(lambda rows: "\n".join([header, *rows]).encode())


def label_rows(columns: int, label_at: int) -> st.SearchStrategy[list]:
    """Rows whose label cell is usually 0 / 1 (a valid label) and sometimes not."""
    cell = st.lists(st.sampled_from(["film", "a", "fine", "é"]), min_size=1, max_size=4).map(" ".join)
    label = st.sampled_from(["0", "1", "1", "0", "", "2", "x"])
    return st.lists(st.tuples(*[label if i == label_at else cell for i in range(columns)]), min_size=1,
                    max_size=5)


def jsonl_rows(keys: list[str]) -> st.SearchStrategy[bytes]:
    import json

    good = st.lists(st.sampled_from(["film", "a", "fine", "é"]), min_size=1, max_size=3).map(" ".join)
    value = st.one_of(*[good] * 8, CELL, st.none(), st.integers(0, 3))  # mostly a valid text
    row = st.one_of(st.fixed_dictionaries({k: value for k in keys}), st.dictionaries(st.sampled_from(keys), value))
    return st.lists(row, min_size=1, max_size=4).map(lambda rows: "\n".join(map(json.dumps, rows)).encode())


def conll_file() -> st.SearchStrategy[bytes]:
    tag = st.sampled_from(["O", "B-PER", "I-PER", "B-LOC", "I-ORG", "B-MISC", "X", ""])
    token = st.tuples(st.sampled_from(["EU", "rejects", "German", "-DOCSTART-", "é"]), tag, st.integers(1, 4))
    line = token.map(lambda t: " ".join([t[0], "NNP", "I-NP", t[1]][: t[2]]))
    sentence = st.lists(line, min_size=1, max_size=4).map("\n".join)
    return st.lists(sentence, min_size=1, max_size=4).map(lambda s: "\n\n".join(s).encode())


NEAR_VALID = {
    "table": st.one_of(rows_file("text\tlabel", 2), rows_file("text,label", 1).map(lambda b: b.replace(b"\t", b",")),
                       jsonl_rows(["text", "label"])),
    "glue tsv (single)": label_rows(2, 1).map(lambda rows: "\n".join(
        ["sentence\tlabel"] + ["\t".join(r) for r in rows]).encode()),
    "glue tsv (pairs)": label_rows(4, 1).map(lambda rows: "\n".join(
        ["index\tlabel\tsentence1\tsentence2"] + ["\t".join(r) for r in rows]).encode()),
    "predict jsonl": jsonl_rows(["sentence1", "sentence2", "text", "text_pair", "id"]),
    "conll": conll_file(),
    "conll (any columns)": conll_file(),
    "triples": rows_file("head\trelation\ttail", 3),
    "prompts": st.one_of(jsonl_rows(["prompt", "text"]), TEXT.map(str.encode)),
    "embed input": st.one_of(rows_file("text\tid", 2), jsonl_rows(["text"]), TEXT.map(str.encode)),
}


def squad_json() -> st.SearchStrategy[bytes]:
    """SQuAD-shaped JSON with wrong types and missing keys here and there."""
    import json

    scalar = st.one_of(st.none(), st.booleans(), st.integers(-3, 50), st.text(max_size=12))
    answer = st.fixed_dictionaries({}, optional={"text": scalar, "answer_start": scalar})
    qa = st.fixed_dictionaries({}, optional={"id": scalar, "question": scalar, "is_impossible": scalar,
                                             "answers": st.one_of(scalar, st.lists(answer, max_size=2))})
    paragraph = st.fixed_dictionaries({}, optional={"context": scalar,
                                                    "qas": st.one_of(scalar, st.lists(qa, max_size=2))})
    article = st.fixed_dictionaries({}, optional={"title": scalar,
                                                  "paragraphs": st.one_of(scalar, st.lists(paragraph, max_size=2))})
    top = st.one_of(scalar, st.lists(scalar, max_size=2),
                    st.fixed_dictionaries({}, optional={"data": st.one_of(scalar, st.lists(article, max_size=2)),
                                                        "version": scalar}))
    return top.map(lambda value: json.dumps(value).encode())


def read_all(read, path: Path):
    """Call ``read``; an iterator is consumed (a reader may fail on its last line)."""
    out = read(path)
    if out is not None and not isinstance(out, (list, tuple, dict, str)) and hasattr(out, "__iter__"):
        out = list(out)
    return out


def holds(read, name: str, data: bytes, outcomes: list | None = None) -> None:
    """Rows, or one EmberError naming the file; anything else fails the property. ``outcomes``
    collects "rows" / "error" per example (a test checks both happened, so it is not vacuous)."""
    with tempfile.TemporaryDirectory() as folder:
        path = Path(folder) / name
        path.write_bytes(data)
        try:
            read_all(read, path)
        except EmberError as exc:
            assert path.name in str(exc), f"the message does not name the file: {exc}"
            outcome = "error"
        else:
            outcome = "rows"
    if outcomes is not None:
        outcomes.append(outcome)


def glue_tsv(task: str):
    return lambda path: reader("ember.tasks.readers.glue:read_tsv_examples")(path, task)


def jsonl_examples(task: str):
    def read(path):
        from ember.tasks.readers.glue import get_task

        return reader("ember.tasks.readers.jsonl_input:read_jsonl_examples")(path, get_task(task))
    return read


TEXT_READERS = {
    # name: (reader, file names it is given)
    "table": (reader("ember.tasks.readers.table_files:read_table"), ["t.csv", "t.tsv", "t.jsonl", "t.json"]),
    "glue tsv (single)": (glue_tsv("sst2"), ["sst.tsv"]),
    "glue tsv (pairs)": (glue_tsv("mrpc"), ["pairs.tsv"]),
    "predict jsonl": (jsonl_examples("mrpc"), ["rows.jsonl"]),
    "conll": (reader("ember.tasks.readers.conll:read_conll"), ["ner.conll", "ner.txt"]),
    "conll (any columns)": (lambda p: reader("ember.tasks.readers.conll:read_conll")(p, require_tags=False,
                                                                           any_columns=True), ["tags.txt"]),
    "triples": (reader("ember.knowledge.graph:read_triples"), ["kg.tsv"]),
    "prompts": (reader("ember.commands.generate:read_prompts"), ["prompts.txt", "prompts.jsonl"]),
    "embed input": (reader("ember.tasks.readers.embed_input:read_texts"), ["in.txt", "in.jsonl", "in.tsv", "in.csv"]),
}


@pytest.mark.parametrize("kind", list(TEXT_READERS))
def test_any_bytes_give_rows_or_one_ember_error_naming_the_file(kind):
    read, names = TEXT_READERS[kind]
    outcomes: list[str] = []

    @SETTINGS
    @given(name=st.sampled_from(names), data=st.one_of(CONTENT, NEAR_VALID[kind]))
    def check(name, data):
        holds(read, name, data, outcomes)

    check()
    assert set(outcomes) == {"rows", "error"}, kind  # both ways out were reached


def test_any_squad_json_gives_questions_or_one_ember_error_naming_the_file():
    read = reader("ember.tasks.qa.squad:read_squad")
    outcomes: list[str] = []

    @SETTINGS
    @given(data=st.one_of(squad_json(), TEXT.map(str.encode)), labelled=st.booleans())
    def check(data, labelled):
        holds(lambda path: read(path, labelled=labelled), "dev.json", data, outcomes)

    check()
    assert "error" in outcomes  # (random JSON rarely holds a whole valid question: rows are not required)


def test_a_squad_file_that_is_not_utf8_is_one_ember_error_naming_the_file(tmp_path):
    path = tmp_path / "dev.json"
    path.write_bytes(b'{"data": [], "version": "' + bytes([0x80]) + b'"}')  # 0x80: never UTF-8 alone
    with pytest.raises(EmberError, match=r"dev\.json: not UTF-8 text \(byte 0x80 at offset 25\)"):
        reader("ember.tasks.qa.squad:read_squad")(path)


def compressions(data: bytes) -> st.SearchStrategy[tuple[str, bytes]]:
    return st.sampled_from([("", data), (".gz", gzip.compress(data)), (".bz2", bz2.compress(data)),
                            (".gz", data), (".bz2", data)])  # the last two: not an archive at all


@pytest.mark.parametrize("fmt, suffix", [("auto", ".txt"), ("text", ".txt"), ("lines", ".txt"),
                                         ("jsonl", ".jsonl"), ("wiki", ""), ("auto", ".jsonl")])
def test_prepare_inputs_give_documents_or_one_ember_error_naming_the_file(fmt, suffix):
    read = reader("ember.data.readers:iter_documents")

    @SETTINGS
    @given(data=st.one_of(CONTENT, TEXT.map(lambda t: f'<doc id="1" title="t">\n{t}\n</doc>'.encode())).flatmap(
        compressions))
    def check(data):
        packing, content = data
        holds(lambda path: read(path, fmt=fmt), f"wiki_00{suffix}{packing}", content, outcomes)

    outcomes: list[str] = []
    check()
    assert set(outcomes) == {"rows", "error"}, (fmt, suffix)
