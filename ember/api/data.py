"""In-memory data for the library functions: texts and labelled rows from Python lists, dicts of
columns, pandas DataFrames and Hugging Face ``datasets`` objects.

Neither pandas nor ``datasets`` is imported to recognise their objects (they are optional): a
DataFrame or a ``Dataset`` is known by its type's module and its columns. A folder written by
``Dataset.save_to_disk`` is read with ``datasets.load_from_disk``, which needs the package.

    texts(data, column)                 -> (list of str, given as one string?)
    rows(data, roles, where)            -> [{role: value}], columns chosen per role

Every problem (an empty list, a missing column, a non-string text) is an ``EmberError`` that
names the columns or the row.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any, Sequence

from ember.errors import EmberError


def _kind(data: Any) -> str:
    module = type(data).__module__.split(".", 1)[0]
    name = type(data).__name__
    if module == "pandas" and name == "DataFrame":
        return "dataframe"
    if module == "pandas" and name == "Series":
        return "series"
    if module == "datasets" and name == "DatasetDict":
        return "datasetdict"
    if module == "datasets" and hasattr(data, "column_names"):
        return "dataset"
    if module == "numpy" and hasattr(data, "tolist"):
        return "array"
    if isinstance(data, dict):
        return "columns"
    if _saved_dataset(data):
        return "saved_dataset"
    return "other"


# What Dataset.save_to_disk / DatasetDict.save_to_disk write at the top of the folder.
_SAVED_DATASET_FILES = ("dataset_info.json", "state.json", "dataset_dict.json")


def _saved_dataset(data: Any) -> bool:
    """A Path to a folder, or a str naming a folder that ``save_to_disk`` wrote. A str is a text
    first: "." or "data" are words to classify unless a saved dataset is really there, and a long
    text is no path at all (the file system refuses to look it up: ENAMETOOLONG)."""
    if isinstance(data, Path):
        return data.is_dir()
    if not isinstance(data, str) or "\n" in data or not data.strip():
        return False
    try:
        folder = Path(data)
        return folder.is_dir() and any((folder / name).is_file() for name in _SAVED_DATASET_FILES)
    except (OSError, ValueError):  # too long a name, a NUL byte
        return False


def load_saved_dataset(folder: str | Path):
    """A ``datasets`` folder (``save_to_disk``), which needs the optional ``datasets`` package."""
    try:
        import datasets
    except ImportError:
        raise EmberError(f"{folder} is a folder; reading a Hugging Face dataset saved with save_to_disk "
                         "needs the optional package `datasets` (pip install datasets), or pass a list "
                         "or a pandas DataFrame") from None
    try:
        loaded = datasets.load_from_disk(str(folder))
    except FileNotFoundError as exc:  # a folder, but not one save_to_disk wrote
        raise EmberError(f"{folder} is a folder but not a saved Hugging Face dataset ({exc}); pass texts, "
                         "a list, or a DataFrame") from None
    if _kind(loaded) == "datasetdict":
        raise EmberError(f"{folder} holds a DatasetDict with splits {sorted(loaded)}; pass one split, "
                         f"e.g. datasets.load_from_disk({str(folder)!r})[{sorted(loaded)[0]!r}]")
    return loaded


def _columns(data: Any, kind: str) -> list[str]:
    if kind == "dataframe":
        return [str(c) for c in data.columns]
    if kind == "dataset":
        return list(data.column_names)
    return list(data)  # a dict of columns


def _column(data: Any, kind: str, name: str) -> list:
    values = data[name]
    return values.tolist() if hasattr(values, "tolist") else list(values)


def _table(data: Any, where: str):
    """(kind, data) with a saved dataset folder loaded and a DatasetDict refused."""
    kind = _kind(data)
    if kind == "saved_dataset":
        data = load_saved_dataset(data)
        kind = _kind(data)
    if kind == "datasetdict":
        raise EmberError(f"{where}: a DatasetDict with splits {sorted(data)}; pass one split, e.g. "
                         f"data[{sorted(data)[0]!r}]")
    return kind, data


def _pick(columns: list[str], given: str | None, candidates: Sequence[str], what: str, where: str,
          required: bool = True) -> str | None:
    """The column for one role: ``given`` (which must exist) or the first candidate present."""
    if given is not None:
        if given not in columns:
            raise EmberError(f"{where} has no {what} column {given!r}; its columns: {', '.join(columns)}")
        return given
    candidates = list(dict.fromkeys(candidates))  # "label" may be both the task's name and the default
    found = next((c for c in candidates if c in columns), None)
    if found is None and required:
        raise EmberError(f"{where}: no {what} column (looked for {', '.join(map(repr, candidates))}); its "
                         f"columns: {', '.join(columns)}. Name it with the matching keyword, e.g. column='review'")
    return found


def _check_text(value: Any, index: int, where: str) -> str:
    if not isinstance(value, str):
        raise EmberError(f"{where}: item {index} is a {type(value).__name__}, not a string ({value!r:.60})")
    if not value.strip():
        raise EmberError(f"{where}: item {index} is an empty text")
    return value


def texts(data: Any, column: str | None = None, where: str = "the input") -> tuple[list[str], bool]:
    """(texts, single): a string, a list/tuple/array of strings, a pandas Series, or one column
    of a DataFrame / ``datasets.Dataset`` / dict of columns (``column``, or its only column)."""
    if isinstance(data, str) and not _saved_dataset(data):
        return [_check_text(data, 0, where)], True
    kind, data = _table(data, where)
    if kind in ("dataframe", "dataset", "columns"):
        columns = _columns(data, kind)
        if column is None and len(columns) != 1:
            raise EmberError(f"{where} has columns {', '.join(columns)}: say which holds the texts, "
                             "e.g. column='text'")
        values = _column(data, kind, _pick(columns, column if column is not None else columns[0], (), "text", where))
    elif column is not None:
        raise EmberError(f"column={column!r} is for DataFrames, datasets and dicts of columns; {where} is a "
                         f"{type(data).__name__}")
    elif kind in ("series", "array"):
        values = data.tolist()
    elif isinstance(data, (list, tuple, Iterator)):
        values = list(data)  # a generator or map object too, as sentence-transformers' encode takes
    else:
        raise EmberError(f"{where}: expected a string, a list of strings, a pandas DataFrame or Series, or a "
                         f"datasets.Dataset, not {type(data).__name__}")
    if not values:
        raise EmberError(f"{where} is empty: pass at least one text")
    return [_check_text(v, i, where) for i, v in enumerate(values)], False


def rows(data: Any, roles: dict[str, tuple[str | None, Sequence[str], bool]], where: str) -> list[dict]:
    """Labelled rows: ``roles`` maps a role (e.g. "text", "pair", "label") to (the column the caller
    named or None, default column names to look for, required). A table (DataFrame, Dataset,
    dict of columns, list of dicts) is read by column; a list of tuples by position, in the
    roles' order (the optional roles that are absent left out)."""
    kind, data = _table(data, where)
    if kind == "other" and isinstance(data, (list, tuple)) and data and all(isinstance(r, dict) for r in data):
        keys = list(data[0])
        missing = [i for i, r in enumerate(data) if list(r) != keys and set(r) != set(keys)]
        if missing:
            raise EmberError(f"{where}: row {missing[0]} has keys {sorted(data[missing[0]])}, row 0 has {sorted(keys)}")
        data, kind = {k: [r[k] for r in data] for k in keys}, "columns"
    if kind in ("dataframe", "dataset", "columns"):
        columns = _columns(data, kind)
        chosen = {role: _pick(columns, given, candidates, role, where, required)
                  for role, (given, candidates, required) in roles.items()}
        values = {role: _column(data, kind, col) for role, col in chosen.items() if col is not None}
        n = len(next(iter(values.values())))
        if n == 0:
            raise EmberError(f"{where} has no rows")
        return [{role: vals[i] for role, vals in values.items()} for i in range(n)]
    if isinstance(data, (list, tuple)):
        if not data:
            raise EmberError(f"{where} is empty: pass at least one row")
        named = [role for role, (given, _, _) in roles.items() if given is not None]
        if named:
            raise EmberError(f"{where}: {named[0]}-column names are for tables (DataFrame, Dataset, dicts); "
                             "these rows are tuples, read by position")
        required = [role for role, (_, _, req) in roles.items() if req]
        out = []
        for i, row in enumerate(data):
            if isinstance(row, str) or not isinstance(row, (list, tuple)):
                raise EmberError(f"{where}: row {i} is {type(row).__name__}; give ({', '.join(roles)}) tuples, "
                                 "dicts, or a DataFrame")
            if len(row) == len(required):
                out.append(dict(zip(required, row)))
            elif len(row) == len(roles):
                out.append(dict(zip(roles, row)))
            else:
                raise EmberError(f"{where}: row {i} has {len(row)} fields; expected ({', '.join(required)})"
                                 + (f" or ({', '.join(roles)})" if len(roles) != len(required) else ""))
        return out
    raise EmberError(f"{where}: expected a pandas DataFrame, a datasets.Dataset, a dict of columns, or a list "
                     f"of tuples or dicts, not {type(data).__name__}")
