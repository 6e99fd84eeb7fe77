"""Korean and Russian sentiment classification: NSMC and RuSentiment.

* ``nsmc`` - Naver Sentiment Movie Corpus (Korean movie reviews, 0 = negative, 1 = positive;
  accuracy, as every NSMC result is reported). ``ratings_train.txt`` / ``ratings_test.txt``,
  a TSV with header ``id<TAB>document<TAB>label``, no quoting, read by the strict GLUE TSV
  reader (``ember.tasks.readers.glue``). 49 reviews keep a bare carriage return from the raw crawl;
  lines are split on "\n" only, so they stay one row each (150,000 and 50,000 rows). A
  reader with universal newlines (Python's text mode, pandas) would cut them in two.
* ``rusentiment`` - RuSentiment (Rogers et al., COLING 2018), Russian VKontakte posts, five
  classes ``positive, negative, neutral, speech, skip``. CSV with header ``label,text`` and
  quoted texts that may span lines. Trained on the random and the preselected posts together
  (both are training data in the release); reported on the test file. Main metric weighted
  F1, the metric the paper reports; macro F1 and accuracy beside it.
* ``rusentiment-binary`` - RuSentiment's positive and negative posts only, labelled as SST-2
  is (0 = negative, 1 = positive), so a head fine-tuned on English SST-2 applies unchanged:
  the zero-shot cross-lingual evaluation of XLM (Lample & Conneau 2019, §5: train on English,
  test on another language without its labels). Accuracy and macro F1 (a third of the binary
  test posts are negative, so a majority-class model scores 67.5% accuracy but 0.40 macro F1).
  Train/dev are carved as for ``rusentiment`` (the same posts land in dev); test is the
  positive/negative rows of the test file (536 + 258). Rows of the other three classes are
  left out by design; a label outside all five is still an error.

Neither corpus has a dev set, and selecting the best epoch on test would report an
optimistic test number. So "dev" is carved from the training files, deterministically:
a row goes to dev when a hash of its text falls below ``dev_fraction`` (blake2b, so the split
is the same on every machine and Python version, and exact duplicates - frequent among short
reviews - always land on the same side instead of leaking from train into dev). Training
selects on that dev split; ``test`` is then scored once with the best-on-dev weights
(``report_splits``).

Readers never skip a row: a malformed one is an ``EmberError`` naming ``file:line`` (for a
CSV record spanning lines, the line where it starts).
"""

from __future__ import annotations

import hashlib
import sys
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from ember import paths
from ember.errors import EmberError
from ember.tasks.glue_adapter import GlueAdapter
from ember.tasks.readers.glue import Example, TaskSpec
from ember.tasks.readers.table_files import csv_records

# CSV records (quoted texts spanning lines) come from ``ember.tasks.readers.table_files.csv_records``,
# which refuses a record over 20,000 characters as an unclosed quote (the longest RuSentiment
# post is 800 characters and 78 lines).


@dataclass(frozen=True)
class SentimentTask:
    spec: TaskSpec  # names, labels, metrics and BERT hyper-parameters, as for GLUE tasks
    fmt: str  # "tsv" (GLUE-style, one row per line) or "csv" (label,text; quoted texts span lines)
    train_files: tuple[str, ...]  # read in this order; dev is carved from them
    test_file: str
    dev_fraction: float
    # The labels the files may hold, when the task keeps only some of them (the spec's
    # labels); rows with another of these are left out. None: the files hold the spec's labels.
    source_labels: tuple[str, ...] | None = None


def _spec(name, display, folder, columns, text, labels, names, metrics, language) -> TaskSpec:
    return TaskSpec(name=name, display_name=display, folder=folder, columns=columns, text_a=text,
                    text_b=None, label_column="label", labels=labels, label_names=names,
                    metrics=metrics, main_metric=metrics[0], has_header=True, files={}, language=language)


RUSENTIMENT_LABELS = ("positive", "negative", "neutral", "speech", "skip")

SENTIMENT_TASKS = {
    "nsmc": SentimentTask(
        spec=_spec("nsmc", "NSMC", "nsmc", ("id", "document", "label"), "document", ("0", "1"),
                   ("negative", "positive"), ("accuracy",), "ko"),
        fmt="tsv", train_files=("ratings_train.txt",), test_file="ratings_test.txt",
        dev_fraction=0.05,  # 7.5k reviews: +-0.6 points of accuracy at 95%, cheap to score
    ),
    "rusentiment": SentimentTask(
        spec=_spec("rusentiment", "RuSentiment", "rusentiment", ("label", "text"), "text",
                   RUSENTIMENT_LABELS, RUSENTIMENT_LABELS, ("f1_weighted", "f1_macro", "accuracy"), "ru"),
        fmt="csv", train_files=("rusentiment_random_posts.csv", "rusentiment_preselected_posts.csv"),
        test_file="rusentiment_test.csv",
        dev_fraction=0.1,  # ~2.8k posts; the rare classes (speech, negative) need the room
    ),
    "rusentimentbinary": SentimentTask(  # SST-2's label names and order: an SST-2 head applies as is
        spec=_spec("rusentiment-binary", "RuSentiment pos/neg", "rusentiment", ("label", "text"), "text",
                   ("negative", "positive"), ("negative", "positive"), ("accuracy", "f1_macro"), "ru"),
        fmt="csv", train_files=("rusentiment_random_posts.csv", "rusentiment_preselected_posts.csv"),
        test_file="rusentiment_test.csv", dev_fraction=0.1, source_labels=RUSENTIMENT_LABELS,
    ),
}


def in_dev(text: str, fraction: float) -> bool:
    """True when ``text`` belongs to the carved dev split (a fixed hash of the text)."""
    digest = hashlib.blake2b(text.encode("utf-8"), digest_size=8).digest()
    return int.from_bytes(digest, "big") / 2.0**64 < fraction


def read_split(task: str | SentimentTask, split: str, data_root: str | Path | None = None,
               limit: int | None = None) -> list[Example]:
    """``train`` (train files minus the carved dev rows), ``dev`` (the carved rows) or ``test``."""
    task = SENTIMENT_TASKS[task] if isinstance(task, str) else task
    spec = task.spec
    if split not in ("train", "dev", "test"):
        raise EmberError(f"{spec.display_name} has splits train, dev (carved from train) and test; "
                         f"not {split!r}")
    root = Path(data_root) if data_root is not None else paths.data_root()
    names = (task.test_file,) if split == "test" else task.train_files
    files = [root / spec.folder / name for name in names]
    for path in files:
        if not path.is_file():
            raise EmberError(f"{spec.display_name} file not found: {path}\nember expects "
                             f"<data root>/{spec.folder}/{path.name}; the data root is $EMBER_DATA "
                             f"(now {root}).")
    examples = []
    for path in files:
        for ex in read_file(path, task, require_label=True):
            if split != "test" and in_dev(ex.text_a, task.dev_fraction) != (split == "dev"):
                continue
            examples.append(ex)
            if limit is not None and len(examples) >= limit:
                return examples
    return examples


def read_file(path: str | Path, task: str | SentimentTask, require_label: bool = True) -> list[Example]:
    """Every row of one file in the task's format (without a label column when not required)."""
    from ember.tasks.readers.glue import read_examples, read_tsv_examples

    task = SENTIMENT_TASKS[task] if isinstance(task, str) else task
    path, spec = Path(path), task.spec
    if task.fmt == "tsv":
        if require_label:
            return read_examples(spec, path.stem, path=path)
        return read_tsv_examples(path, spec)
    rows = csv_records(path)
    header_line, header = next(rows, (1, None))
    if header is None:
        raise EmberError(f"{path}: file is empty")
    needed = [spec.text_a] + ([spec.label_column] if require_label else [])
    if any(c not in header for c in needed) or len(set(header)) != len(header):
        raise EmberError(f"{path}:{header_line}: header {header} does not fit {spec.display_name}; "
                         f"it needs the columns {list(spec.columns)}")
    text_idx = header.index(spec.text_a)
    label_idx = header.index(spec.label_column) if spec.label_column in header else None
    ids = {name: i for i, name in enumerate(spec.labels)}
    valid = task.source_labels or spec.labels
    examples = []
    for line, fields in rows:
        if len(fields) != len(header):
            raise EmberError(f"{path}:{line}: expected {len(header)} comma-separated fields "
                             f"({', '.join(header)}), found {len(fields)}")
        text = fields[text_idx]
        if not text.strip():
            raise EmberError(f"{path}:{line}: empty {spec.text_a!r} field")
        label = None
        if label_idx is not None:
            value = fields[label_idx].strip()
            if value not in valid:
                raise EmberError(f"{path}:{line}: label {value!r} is not a {spec.display_name} label; "
                                 f"valid: {list(valid)}")
            if value not in ids and require_label:
                continue  # a class this task leaves out (rusentiment-binary: neutral, speech, skip)
            label = ids.get(value)  # unlabelled reading (ember predict) keeps every post
        examples.append(Example(guid=f"{path.stem}-{len(examples)}", text_a=text, text_b=None, label=label))
    return examples


class SentimentAdapter(GlueAdapter):
    """NSMC / RuSentiment on the GLUE classification head; dev carved from train, test reported."""

    report_splits = ("test",)

    def __init__(self, name: str) -> None:
        self.task = SENTIMENT_TASKS[name]
        super().__init__(self.task.spec)

    def read(self, split, path=None, limit=None) -> list[Example]:
        if path is not None:
            return read_file(path, self.task)[:limit]
        return read_split(self.task, split, limit=limit)

    def encode(self, examples, tokenizer, max_length):
        warn_if_tokenizer_mangles(tokenizer, examples[:200], self.spec.display_name)
        return super().encode(examples, tokenizer, max_length)

    def metrics_of(self, predictions, labels) -> dict[str, float]:
        from ember.tasks.metrics.classification import METRICS

        preds, labels = np.asarray(predictions, dtype=np.int64), np.asarray(labels, dtype=np.int64)
        classes = range(self.spec.num_labels)  # a class nobody predicted still counts (F1 0)
        return {name: (METRICS[name](preds, labels, classes=classes) if name.startswith("f1_")
                       else METRICS[name](preds, labels)) for name in self.spec.metrics}

    def read_inputs(self, path) -> list[Example]:
        return read_file(path, self.task, require_label=False)

    def predict_file(self, module, tokenizer, max_length, path, batch_size, device):
        from ember.tasks.featurize import encode_examples

        examples = self.read_inputs(path)
        features, n_truncated = encode_examples(examples, tokenizer, max_length)
        logits = module.predict(features, batch_size, device)
        names = self.label_names()
        rows = []
        for ex, row in zip(examples, logits):
            probs = np.exp(row - row.max())
            probs /= probs.sum()
            rows.append({"id": ex.guid, "prediction": names[int(row.argmax())],
                         "probabilities": {n: round(float(p), 6) for n, p in zip(names, probs)}})
        return rows, n_truncated


def mangled_letters(tokenizer, texts) -> str:
    """Letters of ``texts`` that the tokenizer's normalizer destroys ("" when none).

    BERT's accent stripping (NFD, drop combining marks) turns Hangul syllables into jamo and
    "й" into "и"; such a tokenizer cannot tell many Korean or Russian words apart.
    """
    import unicodedata

    normalizer = tokenizer.normalizer
    if normalizer is None:
        return ""
    lost = set()
    for text in texts:
        sample = unicodedata.normalize("NFC", text)
        out = normalizer.normalize_str(sample)
        kept = set(out) | set(out.upper()) | set(out.lower())
        lost.update(ch for ch in sample if ch.isalpha() and ch not in kept)
    return "".join(sorted(lost))


_WARNED: set = set()  # (task, letters) already warned about in this process


def warn_if_tokenizer_mangles(tokenizer, examples, name: str) -> None:
    """Once per task and set of letters: train, dev and test printed the same warning each."""
    lost = mangled_letters(tokenizer, [ex.text_a for ex in examples])
    key = (name, lost[:20])
    if lost and key not in _WARNED:
        _WARNED.add(key)
        print(f"warning: this tokenizer's normalizer changes {name} letters {lost[:20]!r} (accent "
              "stripping decomposes Hangul into jamo and й into и); train a tokenizer with "
              "`ember tokenizer train`, which keeps them", file=sys.stderr)
