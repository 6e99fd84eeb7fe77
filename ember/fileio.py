"""Small file helpers shared by data preparation and checkpointing: atomic writes, hashing."""

from __future__ import annotations

import hashlib
import os
import shutil
import tempfile
from contextlib import contextmanager
from pathlib import Path


def fsync_dir(path: Path) -> None:
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask


@contextmanager
def atomic_file(path: Path):
    """A temporary file beside ``path`` to write; when the block ends without an error it is
    flushed to disk, given the umask's permissions (mkstemp's 0600 would make weights, reports
    and results private on a shared file system) and renamed to ``path``; otherwise removed.
    A reader sees the old file or the complete new one, never a partial one."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, name = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    os.close(fd)
    tmp = Path(name)
    try:
        yield tmp
        with open(tmp, "rb+") as fh:
            os.fsync(fh.fileno())
        os.chmod(tmp, 0o666 & ~_umask())
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    fsync_dir(path.parent)


def atomic_write_bytes(path: Path, data: bytes) -> None:
    with atomic_file(path) as tmp:
        tmp.write_bytes(data)


def atomic_write_text(path: Path, text: str) -> None:
    atomic_write_bytes(path, text.encode("utf-8"))


def sha256_file(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as fh:
        for block in iter(lambda: fh.read(1 << 22), b""):
            digest.update(block)
    return digest.hexdigest()


@contextmanager
def atomic_folder(out: Path):
    """A temporary folder beside ``out`` to write into; when the block ends without an error it
    replaces ``out`` (with the umask's permissions, not mkdtemp's private ones), otherwise it is
    removed: a folder is either the old one or the complete new one, never half-written."""
    out = Path(out)
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{out.name}.", suffix=".tmp", dir=out.parent))
    try:
        yield tmp
        os.chmod(tmp, 0o777 & ~_umask())
        if out.exists():
            shutil.rmtree(out)
        os.replace(tmp, out)
        fsync_dir(out.parent)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise


class WriteErrorKept:
    """A writable file that keeps the OSError its ``write``/``flush``/``close`` raised (with the
    file's ``path``), and passes everything else through. torch.save's C++ writer turns a failed
    write into a RuntimeError without the errno ("unexpected pos ..."), and a full disk should be
    reported as one (``ember.runs.checkpoint.write_failure``)."""

    def __init__(self, fh, path: Path | str | None = None) -> None:
        self.fh, self.path, self.error = fh, path, None

    def __getattr__(self, name):  # tell, fileno, seek ...: the file's own
        return getattr(self.fh, name)

    def _kept(self, call, *args):
        try:
            return call(*args)
        except OSError as exc:
            self.error = exc if self.path is None else OSError(exc.errno, exc.strerror, str(self.path))
            raise self.error from None

    def write(self, data) -> int:
        return self._kept(self.fh.write, data)

    def flush(self) -> None:
        self._kept(self.fh.flush)

    def close(self) -> None:
        self._kept(self.fh.close)
