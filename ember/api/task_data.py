"""Data from Python for ``ember.finetune`` and ``ember.evaluate``: rows -> a file the task reads.

How: the rows (a DataFrame, a ``datasets.Dataset``, a dict of columns, a list of tuples or
dicts) are written as a TSV in the task's own layout (``ember.tasks.readers.task_files``) and the task
reads that file as its split, as ``ember finetune --train-split FILE`` does. Why a file rather
than an in-memory task adapter: the run's config.yaml then names real data, so the run can be
resumed, re-evaluated (``ember evaluate RUN``), exported and served like any other, and the
task's reader checks every row with the messages it gives for a file.

Where: a fine-tuning run's data goes into ``OUT/inputs/`` (``train.tsv``, ``dev.tsv``), kept with
the run(s); an evaluation's into a temporary folder that is removed afterwards.

Columns: the text is in ``column`` (default: the task's own column name, e.g. ``sentence`` for
SST-2, ``question`` for QNLI, else ``text``), the second text of a pair task in ``pair_column``
(``sentence2`` / ``hypothesis`` / ..., else ``text_pair``), the label in ``label_column`` (``label``
or ``score``). Sentence (pair) tasks only (sst2, cola, mrpc, rte, stsb, qnli, snli): tagging and
question answering read their own file formats (``train_split=FILE``).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from ember.api.data import rows
from ember.errors import EmberError


def task_spec(task: str):
    """The GLUE-style spec of ``task``, or an EmberError saying in-memory data needs one."""
    from ember.tasks.readers.glue import TASKS, get_task

    try:
        return get_task(task)
    except EmberError:
        raise EmberError(f"data from Python (train=, dev=, data=) works for the sentence (pair) tasks "
                         f"{', '.join(sorted(TASKS))}; for {task!r} write a file in its format and pass "
                         "train_split=FILE / eval_split=FILE (or file= to ember.evaluate)") from None


def task_rows(spec, data: Any, column: str | None, pair_column: str | None, label_column: str | None,
              where: str) -> list[dict]:
    roles = {"text": (column, (spec.text_a, "text"), True)}
    if spec.is_pair:
        roles["pair"] = (pair_column, (spec.text_b, "text_pair"), True)
    elif pair_column is not None:
        raise EmberError(f"pair_column={pair_column!r}: {spec.display_name} takes single sentences")
    roles["label"] = (label_column, (spec.label_column, "label"), True)
    return rows(data, roles, where)


def write_split(spec, data: Any, path: Path, where: str, column: str | None = None,
                pair_column: str | None = None, label_column: str | None = None,
                resume: bool = False) -> Path:
    """Write ``data`` as ``path`` in ``spec``'s layout; a resumed run must get the same data."""
    from ember.tasks.readers.task_files import render_tsv

    content, changed = render_tsv(spec, task_rows(spec, data, column, pair_column, label_column, where), where)
    if changed and not (resume and path.is_file()):
        print(f"{where}: {changed} text(s) held tabs or line breaks; written with spaces in their place")
    return write_input(path, content, where, resume)


def write_input(path: Path, content: str, where: str, resume: bool = False) -> Path:
    """``content`` as ``path`` (atomically); resuming, the file already there must hold it."""
    from ember.fileio import atomic_write_text

    if resume and path.is_file():
        if path.read_text(encoding="utf-8") != content:
            raise EmberError(f"{where} differs from the data the run was started with ({path}); resume with "
                             "the same data, or start a new run (overwrite=True or another folder)")
        return path
    path.parent.mkdir(parents=True, exist_ok=True)
    atomic_write_text(path, content)
    return path
