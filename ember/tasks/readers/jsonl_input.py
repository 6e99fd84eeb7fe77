"""JSON Lines input for `ember predict` on sentence (pair) tasks.

One JSON object per line. The texts are read from the task's own column names (SST-2
``sentence``; MRPC ``sentence1``/``sentence2``; QNLI ``question``/``sentence``, ...) or from the
generic ``text`` / ``text_pair``; ``id`` (or ``guid``) names the row, else ``<file stem>-<n>``.
Other keys (a gold label, metadata) are ignored. Bad lines are errors naming ``file:line``.
"""

from __future__ import annotations

from pathlib import Path

from ember.errors import EmberError
from ember.tasks.readers.glue import Example, TaskSpec
from ember.tasks.readers.table_files import jsonl_objects


def _text(row: dict, keys: tuple[str, ...], path: Path, lineno: int) -> str:
    for key in keys:
        if key in row:
            value = row[key]
            if not isinstance(value, str) or not value.strip():
                raise EmberError(f"{path}:{lineno}: {key!r} must be a non-empty string, got {value!r}")
            return value
    raise EmberError(f"{path}:{lineno}: no {' or '.join(repr(k) for k in keys)} key in {sorted(row)}")


def read_jsonl_examples(path: str | Path, spec: TaskSpec) -> list[Example]:
    path = Path(path)
    examples = []
    for lineno, row in jsonl_objects(path):
        text_a = _text(row, (spec.text_a, "text"), path, lineno)
        text_b = _text(row, (spec.text_b, "text_pair"), path, lineno) if spec.text_b else None
        guid = str(row.get("id", row.get("guid", f"{path.stem}-{lineno - 1}")))
        examples.append(Example(guid=guid, text_a=text_a, text_b=text_b, label=None))
    return examples
