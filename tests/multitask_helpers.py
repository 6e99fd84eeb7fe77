"""Helpers of the multi-task tests: a WordPiece vocabulary of real GLUE words (so the tiny models
read words, not [UNK]s) and a custom classify task written from real SST-2 rows."""

from __future__ import annotations

import collections
import csv

from conftest import make_wordpiece, real_data

TINY_MODEL = ["model.hidden_size=32", "model.num_layers=2", "model.num_heads=2", "model.intermediate_size=64",
              "model.max_position=64"]


def glue_tokenizer(path, tasks=("SST-2", "RTE", "STS-B"), rows: int = 2000, size: int = 1500):
    """A lower-cased WordPiece tokenizer over the most frequent words of the tasks' training rows."""
    words = collections.Counter()
    for task in tasks:
        with open(real_data("glue", task, "train.tsv"), encoding="utf-8") as fh:
            for i, line in enumerate(fh):
                if i > rows:
                    break
                words.update(w.lower().strip('.,!?"\'():;') for w in line.split())
    make_wordpiece([w for w, _ in words.most_common(size) if w.isalpha()]).save(str(path))
    return path


def sst2_csv_task(folder, train_n: int = 120, dev_n: int = 60, name: str = "",
                  words: tuple[str, str] = ("positive", "negative")) -> tuple:
    """(train.csv, dev.csv) - NAME-train.csv / NAME-dev.csv with a ``name`` - with text,label columns
    from the real SST-2 dev rows (a custom classify task), labels ``words`` for 1 / 0."""
    with open(real_data("glue", "SST-2", "dev.tsv"), encoding="utf-8") as fh:
        rows = list(csv.reader(fh, delimiter="\t", quoting=csv.QUOTE_NONE))[1:]
    paths = []
    for split, part in (("train", rows[:train_n]), ("dev", rows[train_n:train_n + dev_n])):
        path = folder / (f"{name}-{split}.csv" if name else f"{split}.csv")
        with open(path, "w", newline="", encoding="utf-8") as fh:
            writer = csv.writer(fh)
            writer.writerow(["text", "label"])
            writer.writerows([(text, words[0] if label == "1" else words[1]) for text, label in part])
        paths.append(path)
    return tuple(paths)
