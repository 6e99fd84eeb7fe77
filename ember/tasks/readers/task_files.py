"""In-memory examples -> a TSV in a sentence (pair) task's own layout, which its reader reads back.

``ember.finetune(train=...)`` and ``ember.evaluate(data=...)`` hand a task rows from Python (a
list, a DataFrame, a ``datasets.Dataset``); they are written here as a file in the task's layout
(``ember.tasks.readers.glue.TaskSpec``: its columns, header and quoting) and given to the task as its
split (``--train-split FILE`` does the same from the shell). The run then reads, checks and
records its data exactly as for a file: ``config.yaml`` names the file, and ``ember evaluate
RUN`` reads it again.

Labels may be class ids (0..n-1, in the task's order), the task's label names ("positive") or
its stored values; regression targets are numbers in the task's range. The task's TSV readers
split rows at line ends and (for the original GLUE files) at tabs without quoting, so a tab or
line break inside a text becomes a space (the WordPiece tokenizers see both as whitespace).
"""

from __future__ import annotations

import csv
import io
import math

from ember.errors import EmberError
from ember.tasks.readers.glue import TaskSpec

_BREAKS = str.maketrans({"\t": " ", "\n": " ", "\r": " "})


def _label(value, spec: TaskSpec, index: int, where: str) -> str:
    """The stored label string of ``value`` (class id, label name, stored value, or a number)."""
    if hasattr(value, "item"):  # numpy / torch scalars
        value = value.item()
    if spec.labels is None:
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise EmberError(f"{where}: row {index} has label {value!r}; {spec.display_name} needs a number")
        lo, hi = spec.score_range or (-math.inf, math.inf)
        if not (math.isfinite(value) and lo <= value <= hi):
            raise EmberError(f"{where}: row {index} has label {value!r}, outside {spec.display_name}'s range "
                             f"[{lo:g}, {hi:g}]")
        return repr(float(value))
    names = list(spec.label_names or ())
    if isinstance(value, int) and not isinstance(value, bool):
        if 0 <= value < len(spec.labels):
            return spec.labels[value]
    elif isinstance(value, str):
        if value in spec.labels:
            return value
        if value in names:
            return spec.labels[names.index(value)]
    valid = [f"{i} or {n!r}" for i, n in enumerate(names or spec.labels)]
    raise EmberError(f"{where}: row {index} has label {value!r}, not a {spec.display_name} label; "
                     f"valid: {', '.join(valid)}")


def render_tsv(spec: TaskSpec, examples: list[dict], where: str) -> tuple[str, int]:
    """(file content, texts whose tabs/line breaks became spaces) for rows {"text", "pair",
    "label"} ("pair" for sentence-pair tasks only)."""
    if not examples:
        raise EmberError(f"{where} is empty: pass at least one row")
    if spec.is_pair and any(not ex.get("pair") for ex in examples):
        first = next(i for i, ex in enumerate(examples) if not ex.get("pair"))
        raise EmberError(f"{where}: row {first} has no second text; {spec.display_name} classifies sentence "
                         f"pairs ({spec.text_a}, {spec.text_b})")
    if not spec.is_pair and any(ex.get("pair") for ex in examples):
        raise EmberError(f"{where}: {spec.display_name} takes single sentences, but the rows have a second text")
    out = io.StringIO()
    writer = csv.writer(out, delimiter="\t", lineterminator="\n",
                        quoting=csv.QUOTE_MINIMAL if spec.quoting == "csv" else csv.QUOTE_NONE,
                        quotechar='"' if spec.quoting == "csv" else None, escapechar=None)
    if spec.has_header:
        writer.writerow(spec.columns)
    changed = 0
    for i, ex in enumerate(examples):
        fields = dict.fromkeys(spec.columns, "")
        texts = {spec.text_a: ex["text"], **({spec.text_b: ex["pair"]} if spec.is_pair else {})}
        for column, text in texts.items():
            if not isinstance(text, str) or not text.strip():
                raise EmberError(f"{where}: row {i} has {column} {text!r}; texts must be non-empty strings")
            flat = text.translate(_BREAKS)
            changed += flat != text
            fields[column] = flat
        if ex.get("label") is None:
            raise EmberError(f"{where}: row {i} has no label; training and evaluation need one per row")
        fields[spec.label_column] = _label(ex["label"], spec, i, where)
        writer.writerow([fields[c] for c in spec.columns])
    return out.getvalue(), changed
