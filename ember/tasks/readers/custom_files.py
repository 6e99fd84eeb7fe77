"""What the custom tasks on a user's own files share (``ember.tasks.custom``,
``ember.tasks.text2text.custom``): the task record kept in RUN/task.json, its files (with a
warning when one changed since training) and the test split to report."""

from __future__ import annotations

import sys
from pathlib import Path

from ember.errors import EmberError
from ember.fileio import sha256_file


def content_sha256(path: Path) -> str:
    """SHA-256 of a file, or of a folder's files (a saved ``datasets`` folder): names and contents."""
    if path.is_file():
        return sha256_file(path)
    import hashlib

    digest = hashlib.sha256()
    for file in sorted(p for p in path.rglob("*") if p.is_file()):
        digest.update(f"{file.relative_to(path)}\0{sha256_file(file)}\n".encode())
    return digest.hexdigest()


class CustomFiles:
    """What every custom adapter shares: the record, its files, and ``report_splits``."""

    check_unchanged = True

    def _init_record(self, record: dict) -> None:
        self.record_data = dict(record)
        self.files = {split: Path(p) for split, p in record["files"].items()}
        self._checked: set[str] = set()
        train = self.files["train"]
        self.display = f"{record['kind']} ({train.name})"

    def record(self) -> dict:
        """What RUN/task.json keeps (``from_record`` rebuilds the adapter from it)."""
        return dict(self.record_data)

    @property
    def input_prefix(self) -> str | None:
        """The words that start this task's text-to-text inputs in a mixture (``ember.api.multitask``: by
        default the task's name); None outside a mixture (``ember.tasks.text2text.templates``)."""
        return self.record_data.get("prefix")

    @property
    def report_splits(self) -> tuple[str, ...]:
        return ("test",) if "test" in self.files else ()

    def split_file(self, split: str, path=None) -> Path:
        if path is not None:
            return Path(path)
        if split not in self.files:
            if Path(split).is_file():  # a labelled file given where a split is expected
                return Path(split)
            raise EmberError(f"this {self.record_data['kind']} task has the splits {', '.join(self.files)} "
                             f"(its files: {', '.join(str(p) for p in self.files.values())}), not {split!r}")
        file = self.files[split]
        if not file.exists():
            raise EmberError(f"the {split} file this run was trained with is gone: {file} (recorded in the run's "
                             "task.json); put it back or give a labelled file (ember evaluate RUN --file FILE)")
        digest = self.record_data.get("sha256", {}).get(split)
        if self.check_unchanged and digest and split not in self._checked:
            self._checked.add(split)
            if content_sha256(file) != digest:
                print(f"warning: {file} has changed since the run was trained (its SHA-256 differs from task.json)",
                      file=sys.stderr)
        return file

    def _unseen(self, where: str, label: str) -> EmberError:
        labels = self.record_data["labels"]
        shown = ", ".join(labels[:20]) + (", ..." if len(labels) > 20 else "")
        return EmberError(f"{where}: label {label!r} does not occur in the training file {self.files['train']} "
                          f"(its labels: {shown}); the model has no output for it: add examples of it to the "
                          "training file or drop the row")
