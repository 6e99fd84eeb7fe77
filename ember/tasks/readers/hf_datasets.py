"""Hugging Face ``datasets`` folders as custom-task input (optional: ``pip install datasets``).

A folder written by ``Dataset.save_to_disk`` is read with ``datasets.load_from_disk`` (local,
nothing downloaded) into the same rows as a CSV/JSONL file (``ember.tasks.readers.table_files``).
A ``DatasetDict`` folder holds one sub-folder per split: pass that, e.g. ``ds/train``.
``ClassLabel`` columns become their label names, so a run's labels read as the dataset's
(``neg``/``pos``, not 0/1); a row's place in messages is ``folder[row]``.
"""

from __future__ import annotations

from pathlib import Path

from ember.errors import EmberError


def read_dataset_folder(path: Path) -> tuple[tuple[str, ...], list[tuple[str, dict]]]:
    """(columns, rows) as ``ember.tasks.readers.table_files.Table`` holds them."""
    if not ((path / "state.json").is_file() or (path / "dataset_dict.json").is_file()):
        raise EmberError(f"{path} is a folder but not one written by datasets' save_to_disk (no state.json); "
                         "give a .csv, .tsv or .jsonl file, or a saved dataset folder")
    try:
        import datasets
    except ImportError:
        raise EmberError(f"{path} is a Hugging Face datasets folder; reading it needs the datasets package "
                         "(pip install datasets), or export it with Dataset.to_json / to_csv") from None
    loaded = datasets.load_from_disk(str(path))
    if isinstance(loaded, datasets.DatasetDict):
        raise EmberError(f"{path} holds a DatasetDict with the splits {', '.join(loaded)}; pass one split's "
                         f"folder, e.g. {path / next(iter(loaded))}")
    names = {column: feature.names for column, feature in loaded.features.items()
             if isinstance(feature, datasets.ClassLabel)}
    rows = []
    for i, row in enumerate(loaded):
        for column, labels in names.items():
            value = row[column]
            # -1 is datasets' "no label" (e.g. GLUE test splits): keep it missing, not a class
            row[column] = labels[value] if isinstance(value, int) and 0 <= value < len(labels) else None
        rows.append((f"{path}[{i}]", row))
    return tuple(loaded.column_names), rows
