"""Where ember finds the shared real data (``EMBER_DATA``)."""

from __future__ import annotations

import os
from pathlib import Path

from ember.errors import EmberError


def data_root() -> Path:
    """The data root: ``$EMBER_DATA`` if set, else ``../shared/data`` seen from the project."""
    env = os.environ.get("EMBER_DATA")
    if env:
        return Path(env)
    here = Path(__file__).resolve().parent.parent  # the project checkout
    for candidate in (here.parent / "shared" / "data", Path.cwd().parent / "shared" / "data"):
        if candidate.is_dir():
            return candidate
    return here.parent / "shared" / "data"


def data_path(*parts: str, required: bool = True) -> Path:
    """A path under the data root; with ``required``, a clear error if it is missing."""
    path = data_root().joinpath(*parts)
    if required and not path.exists():
        raise EmberError(
            f"data not found: {path}\n"
            f"ember reads real data from $EMBER_DATA (now {data_root()}); "
            "set EMBER_DATA to the folder holding glue/, wiki-en/, ... or pass explicit paths."
        )
    return path
