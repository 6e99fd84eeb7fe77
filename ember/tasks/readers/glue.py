"""GLUE-style sentence(-pair) tasks: task specs and strict TSV readers.

A ``TaskSpec`` says where a task's files live, which columns hold the texts and the label,
the fixed label set (stored label strings map to ids ``0..n-1`` in the order given) and the
task's official metrics. ``read_examples`` reads a split of the shared data;
``read_tsv_examples`` reads a user's file in the same layout (the label column may be absent,
e.g. for ``ember predict``).

The readers never skip a row: a malformed row is an ``EmberError`` naming ``file:line``.

Two quoting conventions occur in the shared files (checked against the real data):
  * SST-2, CoLA, QNLI, STS-B: the original GLUE release, no quoting at all -- a ``"`` is
    part of the text (QNLI and STS-B have fields that begin with a lone ``"``).
  * MRPC, RTE, SNLI: exported the Hugging Face ``datasets`` way, with CSV-style quoting
    (``"a ""b"" c"``); unquoting gives the same texts as ``datasets``.
Hence ``TaskSpec.quoting``. Quoted fields never span lines in these files, so every
physical line is one row, which keeps line numbers exact.
"""

from __future__ import annotations

import csv
import dataclasses
import math
from dataclasses import dataclass, field
from pathlib import Path

from ember import paths
from ember.errors import EmberError


@dataclass(frozen=True)
class BertHParams:
    """Fine-tuning defaults after BERT (Devlin et al., 2019, §4 / appendix A.3).

    The paper uses batch 32 and 3 epochs for GLUE and picks lr from {5e-5, 4e-5, 3e-5, 2e-5}
    on dev; 2e-5 is the most robust single choice. Warm-up over 10% of steps and max length
    128 follow Google's ``run_classifier.py``.
    """

    learning_rate: float = 2e-5
    batch_size: int = 32
    epochs: float = 3.0
    warmup_ratio: float = 0.1
    max_length: int = 128


@dataclass(frozen=True)
class TaskSpec:
    name: str  # canonical registry key, e.g. "sst2"
    display_name: str  # as the benchmark spells it, e.g. "SST-2"
    folder: str  # under the data root, e.g. "glue/SST-2"
    columns: tuple[str, ...]  # expected columns in file order (names for header-less files)
    text_a: str
    text_b: str | None  # None: single-sentence task
    label_column: str
    labels: tuple[str, ...] | None  # stored label values -> ids 0..n-1; None: regression
    label_names: tuple[str, ...] | None  # readable names, aligned with labels (also accepted)
    metrics: tuple[str, ...]
    main_metric: str
    has_header: bool
    files: dict[str, str] = field(hash=False)  # split -> file name inside folder
    quoting: str = "none"  # "none" (original GLUE) or "csv" (datasets-style export)
    score_range: tuple[float, float] | None = None  # regression targets must lie here
    bert_hparams: BertHParams = BertHParams()
    language: str = "en"  # ISO code of the texts: models with language embeddings (XLM) read it
    # The GLUE download's own header names -> this spec's (MRPC's original "Quality", "#1 String", ...);
    # a file with them is read unquoted, as GLUE's download script writes the texts.
    original_columns: dict[str, str] = field(default_factory=dict, hash=False)

    @property
    def is_regression(self) -> bool:
        return self.labels is None

    @property
    def num_labels(self) -> int:
        """Output size of the head: 1 for regression."""
        return 1 if self.labels is None else len(self.labels)

    @property
    def is_pair(self) -> bool:
        return self.text_b is not None


@dataclass(frozen=True, slots=True)
class Example:
    guid: str
    text_a: str
    text_b: str | None
    label: int | float | None  # class id, regression target, or None when unlabelled


_BINARY = ("0", "1")

TASKS: dict[str, TaskSpec] = {
    spec.name: spec
    for spec in (
        TaskSpec(
            name="sst2", display_name="SST-2", folder="glue/SST-2",
            columns=("sentence", "label"), text_a="sentence", text_b=None,
            label_column="label", labels=_BINARY, label_names=("negative", "positive"),
            metrics=("accuracy",), main_metric="accuracy", has_header=True,
            files={"train": "train.tsv", "dev": "dev.tsv"},
        ),
        TaskSpec(
            # No header; `original_mark` is the author's '*'/'?' judgement, unused.
            name="cola", display_name="CoLA", folder="glue/CoLA",
            columns=("source", "label", "original_mark", "sentence"), text_a="sentence",
            text_b=None, label_column="label", labels=_BINARY,
            label_names=("unacceptable", "acceptable"),
            metrics=("mcc",), main_metric="mcc", has_header=False,
            files={"train": "train.tsv", "dev": "dev.tsv"},
        ),
        TaskSpec(
            # GLUE scores MRPC by F1 and accuracy; BERT's paper reports F1.
            name="mrpc", display_name="MRPC", folder="glue/MRPC",
            columns=("index", "label", "sentence1", "sentence2"), text_a="sentence1",
            text_b="sentence2", label_column="label", labels=_BINARY,
            label_names=("not_equivalent", "equivalent"),
            metrics=("f1", "accuracy"), main_metric="f1", has_header=True,
            files={"train": "train.tsv", "dev": "dev.tsv", "test": "test.tsv"},
            quoting="csv",
            # GLUE's download: train/dev `Quality  #1 ID  #2 ID  #1 String  #2 String`, test the
            # same with `index` for `Quality` (no labels: GLUE keeps them private).
            original_columns={"Quality": "label", "#1 String": "sentence1", "#2 String": "sentence2"},
        ),
        TaskSpec(
            # The file stores 0/1 (0 = entailment, as in `datasets`); the original GLUE
            # strings are accepted too through label_names.
            name="rte", display_name="RTE", folder="glue/RTE",
            columns=("index", "label", "sentence1", "sentence2"), text_a="sentence1",
            text_b="sentence2", label_column="label", labels=_BINARY,
            label_names=("entailment", "not_entailment"),
            metrics=("accuracy",), main_metric="accuracy", has_header=True,
            files={"train": "train.tsv", "dev": "dev.tsv"}, quoting="csv",
        ),
        TaskSpec(
            # Ten columns; only the named ones matter. BERT's paper reports Spearman.
            name="stsb", display_name="STS-B", folder="glue/STS-B",
            columns=("index", "genre", "filename", "year", "old_index", "source1", "source2",
                     "sentence1", "sentence2", "score"),
            text_a="sentence1", text_b="sentence2", label_column="score", labels=None,
            label_names=None, metrics=("pearson", "spearman"), main_metric="spearman",
            has_header=True, files={"train": "train.tsv", "dev": "dev.tsv"},
            score_range=(0.0, 5.0),
        ),
        TaskSpec(
            name="qnli", display_name="QNLI", folder="glue/QNLI",
            columns=("index", "question", "sentence", "label"), text_a="question",
            text_b="sentence", label_column="label", labels=("entailment", "not_entailment"),
            label_names=("entailment", "not_entailment"),
            metrics=("accuracy",), main_metric="accuracy", has_header=True,
            files={"dev": "dev.tsv"},  # only dev is available here
        ),
        TaskSpec(
            # Stand-in for MNLI; no train split here (dev/test only).
            name="snli", display_name="SNLI", folder="snli",
            columns=("premise", "hypothesis", "label"), text_a="premise", text_b="hypothesis",
            label_column="label", labels=("0", "1", "2"),
            label_names=("entailment", "neutral", "contradiction"),
            metrics=("accuracy",), main_metric="accuracy", has_header=True,
            files={"dev": "dev.tsv", "test": "test.tsv"}, quoting="csv",
        ),
    )
}


def _normalize_name(name: str) -> str:
    # "SST-2", "sst_2", "Sts B" all map to the registry key.
    return "".join(ch for ch in name.lower() if ch.isalnum())


def get_task(name: str | TaskSpec) -> TaskSpec:
    """The spec for ``name`` (case-insensitive; "SST-2", "sst2", "sts-b" all work)."""
    if isinstance(name, TaskSpec):
        return name
    spec = TASKS.get(_normalize_name(str(name)))
    if spec is None:
        valid = ", ".join(s.display_name for s in TASKS.values())
        raise EmberError(f"unknown task {name!r}; valid tasks: {valid}")
    return spec


def read_examples(
    task: TaskSpec | str,
    split: str = "train",
    path: str | Path | None = None,
    data_root: str | Path | None = None,
    limit: int | None = None,
) -> list[Example]:
    """Read a labelled split of ``task`` from the data root (or from ``path``).

    Every row must carry a valid label. ``limit`` stops after that many examples (the rows
    read are still fully checked).
    """
    spec = get_task(task)
    if path is None and split not in spec.files and Path(split).is_file():
        # A split given as a file in the task's layout, e.g. a QNLI train.tsv that the data
        # folder lacks (`ember finetune --train-split FILE`, `ember glue --train-file`).
        path, split = Path(split), Path(split).stem
    if path is None:
        if split not in spec.files:
            raise EmberError(
                f"{spec.display_name} has no {split!r} split here; "
                f"available: {', '.join(spec.files)} (or give a TSV file in its layout)"
            )
        root = Path(data_root) if data_root is not None else paths.data_root()
        path = root / spec.folder / spec.files[split]
        if not path.is_file():
            raise EmberError(
                f"{spec.display_name} {split} file not found: {path}\n"
                f"ember expects it at <data root>/{spec.folder}/{spec.files[split]}; the data "
                f"root is $EMBER_DATA (now {root}). Set EMBER_DATA to the folder holding "
                "glue/ and snli/, or pass an explicit path."
            )
    return _read(Path(path), spec, prefix=split, require_label=True, limit=limit)


def read_tsv_examples(
    path: str | Path, spec: TaskSpec | str, limit: int | None = None
) -> list[Example]:
    """Read a user's TSV in ``spec``'s layout; rows may lack the label (label -> None).

    Header files are matched by column name (extra columns are fine); header-less files must
    have all of ``spec.columns`` or all but the label column.
    """
    path = Path(path)
    return _read(path, get_task(spec), prefix=path.stem, require_label=False, limit=limit)


def has_labels(task: TaskSpec | str, split: str, data_root: str | Path | None = None) -> bool:
    """Whether ``split`` of the shared data is there with a label column, by its header (header-less
    files: by the first row's field count). GLUE's own test files carry no labels, so they are not a
    further labelled split; MRPC's test (as ``datasets`` exports it, with its public labels) is."""
    spec = get_task(task)
    if split not in spec.files:
        return False
    path = (Path(data_root) if data_root is not None else paths.data_root()) / spec.folder / spec.files[split]
    if not path.is_file():
        return False
    with path.open(encoding="utf-8-sig", errors="replace") as f:
        first = f.readline().rstrip("\r\n")
    if spec.has_header:
        return spec.label_column in _header(spec, path, first)[0]
    return len(_splitter(spec, path)(first, 1)) == len(spec.columns)


# --- parsing ------------------------------------------------------------------------------


def _lines(path: Path) -> list[str]:
    """The file's lines, decoded strictly as UTF-8 (a BOM and CRLF endings are tolerated)."""
    if path.is_dir():
        raise EmberError(f"{path} is a folder; name the file to read")
    if not path.is_file():
        raise EmberError(f"file not found: {path}")
    raw = path.read_bytes()
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as err:
        line = raw.count(b"\n", 0, err.start) + 1
        bad = raw[err.start : err.start + 4]
        raise EmberError(
            f"{path}:{line}: not valid UTF-8 (bytes {bad!r}); re-save the file as UTF-8"
        ) from None
    text = text.removeprefix("\ufeff")
    lines = [ln.removesuffix("\r") for ln in text.split("\n")]
    # Trailing blank lines carry no rows; blank lines inside the file are errors below.
    while lines and not lines[-1].strip():
        lines.pop()
    if not lines:
        raise EmberError(f"{path}: file is empty")
    return lines


def _splitter(spec: TaskSpec, path: Path):
    if spec.quoting == "none":
        return lambda line, lineno: line.split("\t")
    if spec.quoting != "csv":
        raise ValueError(f"unknown quoting {spec.quoting!r} in task {spec.name}")

    def split_quoted(line: str, lineno: int) -> list[str]:
        # strict=True turns a stray quote (e.g. an unterminated field) into an error
        # instead of a silently merged field.
        try:
            return next(csv.reader([line], delimiter="\t", quotechar='"', strict=True))
        except csv.Error as err:
            raise EmberError(f"{path}:{lineno}: bad CSV-style quoting ({err})") from None

    return split_quoted


def _header(spec: TaskSpec, path: Path, line: str):
    """(column names, row splitter) of a header file: by name, so any column order reads; a header
    in the GLUE download's own names (``spec.original_columns``) is renamed and read unquoted."""
    split = _splitter(spec, path)
    columns = split(line, 1)
    if spec.original_columns and set(spec.original_columns) & set(columns):
        return [spec.original_columns.get(c, c) for c in columns], _splitter(
            dataclasses.replace(spec, quoting="none"), path)
    return columns, split


def _read(
    path: Path, spec: TaskSpec, prefix: str, require_label: bool, limit: int | None
) -> list[Example]:
    if limit is not None and limit < 0:
        raise EmberError(f"a limit of examples must be >= 0, got {limit}")
    lines = _lines(path)
    split = _splitter(spec, path)
    needed = [spec.text_a] + ([spec.text_b] if spec.text_b else [])

    start = 0
    if spec.has_header:
        columns, split = _header(spec, path, lines[0])
        start = 1
        missing = [c for c in needed + [spec.label_column] if c not in columns]
        if spec.label_column in missing and not require_label:
            missing.remove(spec.label_column)
        if missing or len(set(columns)) != len(columns):
            raise EmberError(
                f"{path}:1: header {columns} does not fit {spec.display_name}: it needs "
                f"unique columns {needed + [spec.label_column]} (missing: {missing}); "
                f"the standard header is {list(spec.columns)}"
            )
    else:
        columns = list(spec.columns)
        if not require_label:
            # Header-less predict files may drop the label column; the first row decides.
            first = split(lines[0], 1)
            if len(first) == len(columns) - 1:
                columns.remove(spec.label_column)
    idx = {c: i for i, c in enumerate(columns)}
    label_idx = idx.get(spec.label_column)

    label_ids: dict[str, int] = {}
    if spec.labels is not None:
        for names in (spec.label_names or (), spec.labels):  # stored values win on clashes
            label_ids.update({n: i for i, n in enumerate(names)})

    examples: list[Example] = []
    for lineno in range(start + 1, len(lines) + 1):
        if limit is not None and len(examples) >= limit:
            break
        line = lines[lineno - 1]
        if not line.strip():
            raise EmberError(f"{path}:{lineno}: blank line inside the file")
        fields = split(line, lineno)
        if len(fields) != len(columns):
            raise EmberError(
                f"{path}:{lineno}: expected {len(columns)} tab-separated fields "
                f"({', '.join(columns)}), found {len(fields)}"
            )
        texts = []
        for col in needed:
            value = fields[idx[col]]
            if not value.strip():
                raise EmberError(f"{path}:{lineno}: empty {col!r} field")
            texts.append(value)
        label = None
        if label_idx is not None:
            label = _parse_label(fields[label_idx].strip(), spec, label_ids, path, lineno)
        examples.append(
            Example(
                guid=f"{prefix}-{len(examples)}",
                text_a=texts[0],
                text_b=texts[1] if len(texts) > 1 else None,
                label=label,
            )
        )
    return examples


def _parse_label(
    value: str, spec: TaskSpec, label_ids: dict[str, int], path: Path, lineno: int
) -> int | float:
    if spec.labels is not None:
        if value not in label_ids:
            valid = sorted(label_ids, key=lambda n: (label_ids[n], n))
            raise EmberError(
                f"{path}:{lineno}: label {value!r} is not a {spec.display_name} label; "
                f"valid: {valid}"
            )
        return label_ids[value]
    try:
        score = float(value)
    except ValueError:
        score = math.nan
    lo, hi = spec.score_range or (-math.inf, math.inf)
    if not (math.isfinite(score) and lo <= score <= hi):
        raise EmberError(
            f"{path}:{lineno}: {spec.label_column} {value!r} is not a number in [{lo:g}, {hi:g}]"
        )
    return score
