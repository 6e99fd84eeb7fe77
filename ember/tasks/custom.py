"""Custom tasks: fine-tune on your own labelled files with the built-in tasks' heads and metrics.

    ember finetune --task classify|pair|regression|tag|qa|text2text --train FILE --dev FILE [--test FILE]

* ``classify`` (one text -> a class), ``pair`` (two texts -> a class), ``regression`` (one or
  two texts -> a number): CSV, TSV or JSON Lines (``ember.tasks.readers.table_files``), columns named
  by ``--text-column`` / ``--text-pair-column`` / ``--label-column`` or found among the usual
  names (``text``, ``sentence``, ``sentence1``/``sentence2``, ``premise``/``hypothesis``,
  ``label``, ...). The head, inference method (``classify``) and metric code are
  ``GlueAdapter``'s: accuracy and macro-F1 for classes, Pearson/Spearman for regression.
* ``tag``: CoNLL column files (word first, tag last, a blank line between sentences) or JSON
  Lines ``{"tokens": [...], "tags": [...]}`` (also ``words`` / ``ner_tags``); the head and
  ``tag`` method are ``ConllNerAdapter``'s. IOB tag sets are scored by entity F1 (conlleval),
  any other tag set (part of speech, ...) by word accuracy.
* ``qa``: SQuAD v1.1/v2.0 JSON; ``SquadAdapter``'s head, decoding and official EM/F1. The
  task has unanswerable questions (SQuAD 2.0 scoring, a tuned no-answer threshold) when the
  training file has any.
* ``text2text``: an input and a target text per row, for an encoder-decoder (T5) run
  (``ember.tasks.text2text.custom``): exact match, token F1, BLEU and ROUGE.

Labels are the values found in the training file (sorted; numerically when they are all
integers), as ``run_glue.py`` / ``run_ner.py`` discover them. A dev or test label the
training file lacks is an error naming its ``file:line``: a head cannot predict a class it
has no output for. Every file is read and checked before anything is written.

The run folder keeps what rebuilds the task, ``RUN/task.json`` (``record()``: kind, columns,
labels, absolute file paths and their SHA-256), so ``ember evaluate``, ``predict``, ``serve``,
``export`` and ``distill`` work on the run as on a built-in task (``from_record``).
"""

from __future__ import annotations

import math
from pathlib import Path

from ember.errors import EmberError
from ember.tasks.readers.custom_files import CustomFiles, content_sha256
from ember.tasks.readers.glue import BertHParams, Example, TaskSpec
from ember.tasks.glue_adapter import GlueAdapter
from ember.tasks.qa.task import HPARAMS as SQUAD_HPARAMS, SquadAdapter
from ember.tasks.readers.table_files import Table, label_cell, pick_column, read_table, text_cell
from ember.tasks.tagging import ConllNerAdapter, is_bio
from ember.tasks.text2text.custom import CustomText2TextAdapter, text2text_columns

KINDS = ("classify", "pair", "regression", "tag", "qa", "text2text")
SPLITS = ("train", "dev", "test")
TEXT_COLUMNS = ("text", "sentence", "sentence1", "review", "content", "document")
PAIR_COLUMNS = (("text", "text_pair"), ("sentence1", "sentence2"), ("premise", "hypothesis"),
                ("question", "sentence"), ("text_a", "text_b"))
LABEL_COLUMNS = ("label", "labels", "score", "target")
WORD_KEYS, TAG_KEYS = ("tokens", "words"), ("tags", "ner_tags", "labels", "label")
RECORD_VERSION = 1


def custom_task(kind: str, train: str | Path, dev: str | Path, test: str | Path | None = None,
                text_column: str | None = None, text_pair_column: str | None = None,
                label_column: str | None = None):
    """The adapter of a custom task on the user's files; every file is read and checked here."""
    if kind not in KINDS:
        raise EmberError(f"unknown custom task kind {kind!r}; choose one of {', '.join(KINDS)}")
    if train is None or dev is None:
        raise EmberError(f"--task {kind} fine-tunes on your own files: give --train FILE and --dev FILE")
    files = {"train": train, "dev": dev, **({"test": test} if test is not None else {})}
    for split, path in files.items():
        if not Path(path).exists():
            raise EmberError(f"--{split} {path}: file not found")
    files = {split: str(Path(path).resolve()) for split, path in files.items()}
    if len(set(files.values())) < len(files):
        raise EmberError(f"--train, --dev and --test must be different files (got {files}); evaluating on "
                         "the training file would report training accuracy")
    record = {"version": RECORD_VERSION, "kind": kind, "files": files,
              "sha256": {split: content_sha256(Path(p)) for split, p in files.items()}}
    if kind in ("classify", "pair", "regression"):
        record.update(_table_columns(kind, read_table(files["train"]), text_column, text_pair_column,
                                     label_column))
    elif kind == "tag":
        record.update(text_column=text_column, label_column=label_column)
    elif kind == "text2text":
        if text_pair_column:
            raise EmberError("--task text2text reads one input column (--text-column) and one target column "
                             "(--label-column); join two texts into the input yourself, as T5 does")
        record.update(text2text_columns(read_table(files["train"]), text_column, label_column))
    elif text_column or text_pair_column or label_column:
        raise EmberError("--task qa reads SQuAD JSON (question, context, answers); the column options "
                         "do not apply to it")
    adapter = from_record(record, check=False)
    adapter.discover()
    for split in files:  # every file checked before anything is written
        adapter.read(split)
    return adapter


def from_record(record: dict, check: bool = True):
    """The adapter a run's ``task.json`` describes."""
    kind = record.get("kind")
    cls = {"classify": CustomClassifyAdapter, "pair": CustomClassifyAdapter, "regression": CustomClassifyAdapter,
           "tag": CustomTagAdapter, "qa": CustomQaAdapter, "text2text": CustomText2TextAdapter}.get(kind)
    if cls is None or "files" not in record:
        raise EmberError(f"task record {record!r} names no custom task kind ({', '.join(KINDS)}) and files")
    adapter = cls(record)
    adapter.check_unchanged = check
    return adapter


def _table_columns(kind: str, table: Table, text: str | None, pair: str | None, label: str | None) -> dict:
    """The columns of a classify/pair/regression file: the named ones, or the usual names."""
    if kind == "classify" and pair:
        raise EmberError("--text-pair-column classifies pairs of texts: use --task pair")
    label = pick_column(table, label, LABEL_COLUMNS, "--label-column", "label")
    wants_pair = kind == "pair" or (kind == "regression" and pair is not None)
    if kind == "regression" and pair is None and text is None:  # STS-B-like files regress on pairs
        wants_pair = any(a in table.columns and b in table.columns for a, b in PAIR_COLUMNS)
    if not wants_pair:
        return {"text_column": pick_column(table, text, TEXT_COLUMNS, "--text-column", "text"),
                "text_pair_column": None, "label_column": label}
    if text is None and pair is None:
        found = [(a, b) for a, b in PAIR_COLUMNS if a in table.columns and b in table.columns]
        if not found:
            raise EmberError(f"{table.source}: no pair of text columns among the usual names "
                             f"({', '.join(f'{a}/{b}' for a, b in PAIR_COLUMNS)}); its columns are: "
                             f"{', '.join(table.columns)}; name them with --text-column and --text-pair-column")
        text, pair = found[0]
    text = pick_column(table, text, TEXT_COLUMNS, "--text-column", "first text")
    if pair is None:
        raise EmberError(f"--task {kind} with --text-column {text}: name the second text with --text-pair-column")
    return {"text_column": text, "text_pair_column": pick_column(table, pair, (), "--text-pair-column", "second text"),
            "label_column": label}


def _sorted_labels(values) -> list[str]:
    """Sorted label strings; numerically when all are integers (so "10" follows "9")."""
    values = set(values)
    try:
        return sorted(values, key=int)
    except ValueError:
        return sorted(values)


# -- classify / pair / regression ---------------------------------------------------------


class CustomClassifyAdapter(CustomFiles, GlueAdapter):
    """One or two text columns and a label (or a number) column of the user's files."""

    def __init__(self, record: dict) -> None:
        self._init_record(record)
        self.tables: dict[Path, Table] = {}
        self._build_spec()

    def _build_spec(self) -> None:
        r = self.record_data
        regression = r["kind"] == "regression"
        labels = tuple(r.get("labels") or ()) or None
        self.spec = TaskSpec(
            name=r["kind"], display_name=self.display,
            folder="", columns=tuple(c for c in (r["text_column"], r["text_pair_column"], r["label_column"]) if c),
            text_a=r["text_column"], text_b=r["text_pair_column"], label_column=r["label_column"],
            labels=None if regression else labels, label_names=None,
            metrics=("pearson", "spearman") if regression else ("accuracy", "f1_macro"),
            main_metric="pearson" if regression else "accuracy", has_header=True, files={},
            bert_hparams=BertHParams())

    def discover(self) -> None:
        """Labels: every value of the training file's label column."""
        if self.record_data["kind"] == "regression":
            return
        table, column = self._table(self.files["train"]), self.record_data["label_column"]
        found = []
        for where, row in table.rows:
            value = label_cell(row, column, where)
            if value is None:
                raise EmberError(f"{where}: empty {column!r} cell; every training row needs a label")
            found.append(value)
        labels = _sorted_labels(found)
        if len(labels) < 2:
            raise EmberError(f"{table.source}: the {column!r} column holds only {labels}; classification needs "
                             "at least two labels (a number to predict? use --task regression)")
        self.record_data["labels"] = labels
        self._build_spec()

    def _table(self, file: Path) -> Table:
        if file not in self.tables:
            self.tables[file] = read_table(file)
        return self.tables[file]

    def label_names(self) -> list[str]:
        return list(self.spec.labels) if self.spec.labels else ["score"]

    def read(self, split, path=None, limit=None) -> list[Example]:
        return self._examples(self.split_file(split, path), require_label=True)[:limit]

    def read_inputs(self, path) -> list[Example]:
        return self._examples(Path(path), require_label=False)

    def _examples(self, file: Path, require_label: bool) -> list[Example]:
        spec, table = self.spec, self._table(file)
        for column in filter(None, (spec.text_a, spec.text_b) + ((spec.label_column,) if require_label else ())):
            pick_column(table, column, (), f"the run's {column!r} column", "")
        ids = {name: i for i, name in enumerate(spec.labels or ())}
        examples = []
        for n, (where, row) in enumerate(table.rows):
            text_a = text_cell(row, spec.text_a, where)
            text_b = text_cell(row, spec.text_b, where) if spec.text_b else None
            raw = label_cell(row, spec.label_column, where)
            if raw is None and require_label:
                raise EmberError(f"{where}: empty {spec.label_column!r} cell; every labelled row needs a label")
            label = None if raw is None else self._label(raw, ids, where)
            guid = str(row.get("id", row.get("guid", f"{file.stem}-{n}")))
            examples.append(Example(guid, text_a, text_b, label))
        if not examples:
            raise EmberError(f"{file}: no rows")
        return examples

    def _label(self, raw: str, ids: dict, where: str) -> int | float:
        if self.spec.is_regression:
            try:
                value = float(raw)
            except ValueError:
                value = math.nan
            if not math.isfinite(value):
                raise EmberError(f"{where}: the {self.spec.label_column!r} cell {raw!r} is not a number; "
                                 "--task regression learns numeric targets (for classes use --task classify)")
            return value
        if raw not in ids:
            raise self._unseen(where, raw)
        return ids[raw]

    def metrics_of(self, predictions, labels) -> dict[str, float]:
        # GLUE's "combined" (mean of the metrics) is a leaderboard convention, not this task's; every
        # head goes through here (a [CLS] classifier, a T5 run's parsed outputs)
        metrics = super().metrics_of(predictions, labels)
        return {k: v for k, v in metrics.items() if k != "combined"}


# -- tag ------------------------------------------------------------------------------------


class CustomTagAdapter(CustomFiles, ConllNerAdapter):
    """Words and a tag per word: CoNLL columns, or JSON Lines with a list of each."""

    def __init__(self, record: dict) -> None:
        self._init_record(record)
        self.name, self.display_name = "tag", self.display
        self._set_labels(record.get("labels") or ())

    def _set_labels(self, labels) -> None:
        self.labels = tuple(labels)
        self.label_ids = {t: i for i, t in enumerate(self.labels)}
        self.bio = bool(self.labels) and is_bio(self.labels)
        self.main_metric = "f1" if self.bio else "accuracy"

    def discover(self) -> None:
        tags = {t for s in self._sentences(self.files["train"]) for t in s.tags}
        if len(tags) < 2:
            raise EmberError(f"{self.files['train']}: every word has the tag {sorted(tags)}; tagging needs at "
                             "least two tags")
        outside = ["O"] if "O" in tags else []  # the usual label order: O first, then by entity type
        self.record_data["labels"] = outside + sorted(tags - {"O"}, key=lambda t: (t[2:], t) if is_bio([t]) else ("", t))
        self._set_labels(self.record_data["labels"])

    def read(self, split, path=None, limit=None) -> list:
        file = self.split_file(split, path)
        sentences = self._sentences(file)
        for s in sentences:
            for i, tag in enumerate(s.tags):
                if tag not in self.label_ids:
                    raise self._unseen(f"{file}:{s.line + i}" if s.line else s.guid, tag)
        return sentences[:limit]

    def _sentences(self, file: Path) -> list:
        from ember.tasks.readers.conll import read_conll

        if file.suffix.lower() in (".jsonl", ".json"):
            return self._jsonl_sentences(file)
        return read_conll(file, labels=None, any_columns=True)

    def _jsonl_sentences(self, file: Path) -> list:
        from ember.tasks.readers.conll import Sentence

        table = read_table(file)
        r = self.record_data
        words_key = pick_column(table, r.get("text_column"), WORD_KEYS, "--text-column", "words")
        tags_key = pick_column(table, r.get("label_column"), TAG_KEYS, "--label-column", "tags")
        out = []
        for n, (where, row) in enumerate(table.rows):
            words, tags = row.get(words_key), row.get(tags_key)
            if not isinstance(words, list) or not words or not all(isinstance(w, str) and w.strip() for w in words):
                raise EmberError(f"{where}: {words_key!r} must be a non-empty list of words")
            if not isinstance(tags, list):
                raise EmberError(f"{where}: {tags_key!r} must be a list with a tag per word")
            if len(tags) != len(words):
                raise EmberError(f"{where}: {len(tags)} tags for {len(words)} words; give exactly one tag per word")
            tags = [label_cell({"t": t}, "t", f"{where} ({tags_key}[{i}])") for i, t in enumerate(tags)]
            if None in tags:
                raise EmberError(f"{where}: {tags_key!r}[{tags.index(None)}] is empty; every word needs a tag")
            out.append(Sentence(f"{file.stem}-{n}", tuple(words), tuple(tags)))
        if not out:
            raise EmberError(f"{file}: no sentences")
        return out

    def score(self, module, examples, features, batch_size, device):
        from ember.tasks.tagging import word_tags

        pred = word_tags(module.predict(features, batch_size, device), self.labels)
        pairs = [(g, p) for s, tags in zip(examples, pred) for g, p in zip(s.tags, tags)]
        metrics = {"accuracy": sum(g == p for g, p in pairs) / max(len(pairs), 1)}  # word-level
        if self.bio:  # entity-level P/R/F1 (conlleval), as CoNLL-2003
            metrics.update(super().score(module, examples, features, batch_size, device))
        return metrics


# -- qa -------------------------------------------------------------------------------------


class CustomQaAdapter(CustomFiles, SquadAdapter):
    """SQuAD-format JSON of the user's; SQuAD 2.0 scoring when the training file has unanswerable
    questions, SQuAD 1.1 otherwise."""

    with_no_answer = False  # an attribute here (SquadAdapter derives it from its name)

    def __init__(self, record: dict) -> None:
        self._init_record(record)
        no_answer = bool(record.get("with_no_answer"))
        super().__init__("squad2" if no_answer else "squad")
        self.with_no_answer = no_answer
        self.name, self.display_name = "qa", self.display
        self.hparams = SQUAD_HPARAMS["squad2" if no_answer else "squad"]

    def discover(self) -> None:
        from ember.tasks.qa.squad import read_squad

        no_answer = any(ex.is_impossible for ex in read_squad(self.files["train"]))
        self.record_data["with_no_answer"] = self.with_no_answer = no_answer
        self.hparams = SQUAD_HPARAMS["squad2" if no_answer else "squad"]

    def read(self, split, path=None, limit=None) -> list:
        from ember.tasks.qa.squad import read_squad

        file = self.split_file(split, path)
        examples = read_squad(file)
        if not self.with_no_answer:
            impossible = [ex.qid for ex in examples if ex.is_impossible]
            if impossible:
                raise EmberError(f"{file}: question {impossible[0]!r} (and {len(impossible) - 1} more) is "
                                 f"unanswerable, but the training file {self.files['train']} has no unanswerable "
                                 "questions, so the model never learns to abstain; add some to it or drop these")
        return examples[:limit]

