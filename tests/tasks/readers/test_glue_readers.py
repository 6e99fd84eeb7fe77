"""GLUE readers: real files (counts from the data README) and malformed inputs."""

from __future__ import annotations

import statistics
from collections import Counter

import pytest

from ember.errors import EmberError
from ember.paths import data_root
from ember.tasks.readers.glue import TASKS, get_task, read_examples, read_tsv_examples

needs_data = pytest.mark.skipif(
    not (data_root() / "glue").is_dir(), reason="shared GLUE data not available"
)

# Counts as /work/shared/data/README.md states them.
REAL_COUNTS = [
    ("sst2", "train", 67_349), ("sst2", "dev", 872),
    ("cola", "train", 8_551), ("cola", "dev", 527),
    ("mrpc", "train", 3_668), ("mrpc", "dev", 408), ("mrpc", "test", 1_725),
    ("rte", "train", 2_490), ("rte", "dev", 277),
    ("stsb", "train", 5_749), ("stsb", "dev", 1_500),
    ("qnli", "dev", 5_463),
    ("snli", "dev", 9_842), ("snli", "test", 9_824),
]


@needs_data
@pytest.mark.parametrize("task,split,count", REAL_COUNTS)
def test_real_split_has_readme_count_and_sane_labels(task, split, count):
    spec = get_task(task)
    examples = read_examples(task, split)
    assert len(examples) == count
    assert all(ex.text_a.strip() for ex in examples)
    assert all((ex.text_b is not None) == spec.is_pair for ex in examples)
    if spec.is_regression:
        scores = [ex.label for ex in examples]
        assert all(isinstance(s, float) and 0.0 <= s <= 5.0 for s in scores)
        assert 2.0 < statistics.mean(scores) < 3.5 and statistics.stdev(scores) > 1.0
    else:
        counts = Counter(ex.label for ex in examples)
        assert set(counts) == set(range(spec.num_labels))  # every class occurs
        assert max(counts.values()) / count < 0.75  # CoLA, the most skewed, is ~70% / 30%


@needs_data
def test_quoted_tasks_are_unquoted_like_datasets():
    first = read_examples("mrpc", "train", limit=1)[0]
    assert first.text_a == (
        'Amrozi accused his brother , whom he called " the witness " , '
        "of deliberately distorting his evidence ."
    )
    assert read_examples("mrpc", "dev", limit=1)[0].text_b.startswith('" The foodservice')


@needs_data
def test_unquoted_tasks_keep_literal_quotes():
    # QNLI dev line 660 has a sentence that begins with a lone '"': not CSV quoting.
    qnli = read_examples("qnli", "dev")
    assert qnli[658].text_b.startswith('" This term describes cells')


@needs_data
def test_rte_file_uses_zero_for_entailment():
    # dev row 0: "Christopher Reeve had an accident." is not entailed -> stored 1.
    ex = read_examples("rte", "dev", limit=1)[0]
    assert ex.text_b == "Christopher Reeve had an accident." and ex.label == 1
    assert get_task("rte").label_names[ex.label] == "not_entailment"


@needs_data
def test_stsb_reads_named_columns_and_float_scores():
    ex = read_examples("STS-B", "dev", limit=2)
    assert ex[0].text_a == "A man with a hard hat is dancing."
    assert ex[0].text_b == "A man wearing a hard hat is dancing."
    assert ex[0].label == 5.0 and ex[1].label == 4.75


@needs_data
def test_limit_stops_early():
    assert [e.guid for e in read_examples("sst2", "train", limit=3)] == [
        "train-0", "train-1", "train-2"
    ]


def test_get_task_is_case_and_punctuation_insensitive():
    assert get_task("SST-2") is TASKS["sst2"]
    assert get_task("sts-b") is get_task("STSB") is TASKS["stsb"]
    assert get_task(TASKS["cola"]) is TASKS["cola"]


def test_unknown_task_lists_valid_names():
    with pytest.raises(EmberError, match="unknown task 'mnli'.*SST-2.*SNLI"):
        get_task("mnli")


def test_missing_split_names_available_splits():
    with pytest.raises(EmberError, match="no 'train' split.*available: dev"):
        read_examples("qnli", "train")


def test_missing_data_file_points_at_ember_data(tmp_path):
    with pytest.raises(EmberError, match=r"(?s)SST-2 train file not found.*EMBER_DATA"):
        read_examples("sst2", "train", data_root=tmp_path)


def test_missing_user_file_is_named(tmp_path):
    with pytest.raises(EmberError, match="file not found: .*nope.tsv"):
        read_tsv_examples(tmp_path / "nope.tsv", "sst2")


def write(tmp_path, content: bytes | str, name="f.tsv"):
    path = tmp_path / name
    path.write_bytes(content if isinstance(content, bytes) else content.encode("utf-8"))
    return path


def test_wrong_field_count_names_file_line_and_columns(tmp_path):
    path = write(tmp_path, "sentence\tlabel\ngood film\t1\nbad\tfilm\t0\n")
    with pytest.raises(EmberError) as err:
        read_examples("sst2", path=path)
    assert f"{path}:3: expected 2 tab-separated fields (sentence, label), found 3" in str(
        err.value
    )


def test_headerless_wrong_field_count(tmp_path):
    path = write(tmp_path, "src\t1\t\tFine.\nsrc\t0\tBad.\n")
    with pytest.raises(EmberError, match=r"f.tsv:2: expected 4 .*source, label.*found 3"):
        read_examples("cola", path=path)


def test_label_outside_label_set_is_reported(tmp_path):
    path = write(tmp_path, "sentence\tlabel\ngood\t1\nmeh\t2\n")
    with pytest.raises(EmberError, match=r"f.tsv:3: label '2' is not a SST-2 label.*'0'"):
        read_examples("sst2", path=path)


def test_label_names_are_accepted_as_aliases(tmp_path):
    # The original GLUE RTE release stores strings instead of 0/1.
    path = write(tmp_path, "index\tsentence1\tsentence2\tlabel\n0\tA b.\tA.\tentailment\n"
                           "1\tC d.\tE.\tnot_entailment\n")
    assert [e.label for e in read_examples("rte", path=path)] == [0, 1]


@pytest.mark.parametrize("score", ["high", "5.5", "-0.1", "nan"])
def test_bad_stsb_score_is_reported(tmp_path, score):
    path = write(tmp_path, f"sentence1\tsentence2\tscore\nA.\tB.\t1.0\nC.\tD.\t{score}\n")
    with pytest.raises(EmberError, match=rf"f.tsv:3: score '{score}' is not a number in \[0, 5\]"):
        read_examples("stsb", path=path)


def test_non_utf8_names_the_line(tmp_path):
    path = write(tmp_path, b"sentence\tlabel\ngood\t1\ncaf\xe9 film\t1\n")
    with pytest.raises(EmberError, match=r"f.tsv:3: not valid UTF-8"):
        read_examples("sst2", path=path)


@pytest.mark.parametrize("content", ["", "\n\n"])
def test_empty_file_is_an_error(tmp_path, content):
    with pytest.raises(EmberError, match="f.tsv: file is empty"):
        read_examples("sst2", path=write(tmp_path, content))


def test_header_only_file_gives_no_examples(tmp_path):
    assert read_examples("sst2", path=write(tmp_path, "sentence\tlabel\n")) == []


def test_blank_line_inside_file_is_an_error(tmp_path):
    path = write(tmp_path, "sentence\tlabel\ngood\t1\n\nbad\t0\n")
    with pytest.raises(EmberError, match="f.tsv:3: blank line"):
        read_examples("sst2", path=path)


def test_empty_text_field_is_an_error(tmp_path):
    path = write(tmp_path, "premise\thypothesis\tlabel\nA man.\t \t0\n")
    with pytest.raises(EmberError, match="f.tsv:2: empty 'hypothesis' field"):
        read_examples("snli", path=path)


def test_header_missing_a_column_is_an_error(tmp_path):
    path = write(tmp_path, "text\tlabel\ngood\t1\n")
    with pytest.raises(EmberError, match=r"f.tsv:1: header .*missing: \['sentence'\]"):
        read_examples("sst2", path=path)


def test_unterminated_quote_in_quoted_task_is_an_error(tmp_path):
    path = write(tmp_path, 'index\tlabel\tsentence1\tsentence2\n0\t1\t"He said\tNo .\n')
    with pytest.raises(EmberError, match="f.tsv:2: bad CSV-style quoting"):
        read_examples("mrpc", path=path)


def test_crlf_and_bom_are_tolerated(tmp_path):
    path = write(tmp_path, "\ufeffsentence\tlabel\r\ngood\t1\r\nbad\t0\r\n")
    assert [(e.text_a, e.label) for e in read_examples("sst2", path=path)] == [
        ("good", 1), ("bad", 0)
    ]


def test_predict_file_without_label_column_gives_none_labels(tmp_path):
    path = write(tmp_path, "index\tsentence\n0\tgood film\n1\tbad film\n", name="test.tsv")
    examples = read_tsv_examples(path, "SST-2")
    assert [(e.guid, e.text_a, e.label) for e in examples] == [
        ("test-0", "good film", None), ("test-1", "bad film", None)
    ]


def test_headerless_predict_file_may_drop_label_column(tmp_path):
    path = write(tmp_path, "src\t\tFine.\nsrc\t*\tBad it.\n")
    assert [(e.text_a, e.label) for e in read_tsv_examples(path, "cola")] == [
        ("Fine.", None), ("Bad it.", None)
    ]


def test_predict_file_with_labels_keeps_them(tmp_path):
    path = write(tmp_path, "premise\thypothesis\tlabel\nA.\tB.\t2\n")
    assert read_tsv_examples(path, "snli")[0].label == 2
