"""Checks of the library functions' path and list arguments, so that a wrong type is one
``EmberError`` naming the argument rather than a ``TypeError`` from deep inside (``Path(123)``)
or a string taken as a list of its characters (``overrides="train.lr=1e-4"`` read as 't', 'r', ...)."""

from __future__ import annotations

import os
from pathlib import Path

from ember.errors import EmberError


def folder_arg(value, name: str) -> Path:
    """``value`` as a Path: a str or an os.PathLike."""
    if isinstance(value, (str, os.PathLike)) and str(value):
        return Path(value)
    raise EmberError(f"{name}= takes a folder path (a str or pathlib.Path), not {type(value).__name__} {value!r:.60}")


def strings_arg(value, name: str) -> list[str]:
    """A list of str; one str is a list of one (``overrides="train.lr=1e-4"``), None an empty list."""
    if value is None:
        return []
    if isinstance(value, str):
        return [value]
    try:
        values = list(value)
    except TypeError:
        raise EmberError(f"{name}= takes a list of strings, not {type(value).__name__} {value!r:.60}") from None
    wrong = [v for v in values if not isinstance(v, str)]
    if wrong:
        raise EmberError(f"{name}= takes a list of strings; it holds {type(wrong[0]).__name__} {wrong[0]!r:.60}")
    return values


def backend_arg(backend, folder: Path) -> str:
    """One spelling of ``backend=`` for every public function that runs a model (``ember.load``,
    ``ember.embed``, ``ember.evaluate``'s similarity): one of ``ember.serve.BACKENDS``, "torch"
    (PyTorch fp32) by default. Returns the name the predictor takes: on an `ember export` folder
    "torch" means "as exported" ("": the folder's own format), as ``ember.load`` has always read it."""
    from ember.serve import BACKENDS

    if not isinstance(backend, str) or backend not in BACKENDS:
        raise EmberError(f"unknown backend {backend!r}; choose one of {', '.join(BACKENDS)}")
    is_export = (folder / "config.yaml").is_file() and (folder / "export.json").is_file()
    return "" if is_export and backend == "torch" else backend
