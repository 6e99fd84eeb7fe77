"""Atomic, verifiable checkpoints.

A checkpoint is a folder ``checkpoints/step-00001000/`` holding ``model.safetensors``,
``optimizer.pt`` and ``trainer_state.json``, plus ``manifest.json`` with each file's size and
SHA-256. It is written under a temporary name, flushed to disk, and renamed into place, so a
process killed at any moment leaves either the previous checkpoints or a complete new one;
a leftover temporary folder is ignored (and removed by the next save), a file that no longer
matches its manifest is reported and skipped, and the newest good checkpoint is used.

Under ``train.parallel: fsdp`` a checkpoint folder holds each rank's shard instead of
``model.safetensors``/``optimizer.pt`` (``ember.runs.sharded``); the same manifest, listing
and verification apply to both layouts.
"""

from __future__ import annotations

import errno
import json
import os
import re
import shutil
import sys
import tempfile
from pathlib import Path
from typing import Any, Callable

import torch
from safetensors.torch import load_file, save_file

from ember.errors import EmberError
from ember.fileio import WriteErrorKept, atomic_file, atomic_write_bytes, atomic_write_text, fsync_dir, sha256_file

__all__ = ["atomic_write_bytes", "atomic_write_text", "save_weights", "load_weights", "save_checkpoint",
           "load_latest_checkpoint", "newest_checkpoint", "read_checkpoint", "list_checkpoints",
           "verify_checkpoint"]

CHECKPOINT_DIR = "checkpoints"
# A run whose checkpoints were removed once it ended (a sweep's trials) keeps its newest checkpoint's
# trainer_state.json here, in the run folder, for the report and the model card
ENDED_TRAINER_STATE = "trainer_state.json"


def save_weights(state: dict[str, torch.Tensor], path: Path, metadata: dict | None = None) -> None:
    """Write a safetensors file atomically (``ember.fileio.atomic_file``: temp file + rename)."""
    tensors = {k: v.detach().contiguous().cpu() for k, v in state.items()}
    with atomic_file(path) as tmp:
        try:
            save_file(tensors, str(tmp), metadata={k: str(v) for k, v in (metadata or {}).items()})
        except Exception as exc:  # safetensors' own error type, the OS error only in its text
            code = re.search(r"\(os error (\d+)\)", str(exc))
            if code is None:
                raise
            raise OSError(int(code.group(1)), os.strerror(int(code.group(1))), str(tmp)) from exc


def torch_save(obj, fh) -> None:
    """``torch.save(obj, fh)``, raising the OSError of a failed write (ENOSPC, EFBIG) as itself."""
    writer = WriteErrorKept(fh)
    try:
        torch.save(obj, writer)
    except RuntimeError:
        if writer.error is not None:
            raise writer.error from None
        raise


def load_weights(path: Path) -> dict[str, torch.Tensor]:
    path = Path(path)
    if not path.is_file():
        raise EmberError(f"weights not found: {path}")
    try:
        return load_file(str(path))
    except Exception as exc:  # safetensors raises its own error types for truncated files
        raise EmberError(f"{path}: cannot read weights ({exc}); the file is damaged or partial") from None


def save_checkpoint(run_dir: Path, step: int, model_state: dict, optimizer_state: dict,
                    trainer_state: dict, keep: int = 2) -> Path:
    root = Path(run_dir) / CHECKPOINT_DIR
    root.mkdir(parents=True, exist_ok=True)
    final = root / f"step-{step:08d}"
    tmp = Path(tempfile.mkdtemp(prefix=f".step-{step:08d}.", suffix=".tmp", dir=root))
    try:
        save_weights(model_state, tmp / "model.safetensors")
        with open(tmp / "optimizer.pt", "wb") as fh:
            torch_save(optimizer_state, fh)
            fh.flush()
            os.fsync(fh.fileno())
        atomic_write_text(tmp / "trainer_state.json", json.dumps(trainer_state, indent=1))
        manifest = {
            name: {"bytes": (tmp / name).stat().st_size, "sha256": sha256_file(tmp / name)}
            for name in ("model.safetensors", "optimizer.pt", "trainer_state.json")
        }
        atomic_write_text(tmp / "manifest.json", json.dumps(manifest, indent=1))
        if final.exists():
            shutil.rmtree(final)
        os.replace(tmp, final)
        fsync_dir(root)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    for old in list_checkpoints(run_dir)[:-keep] if keep > 0 else []:
        shutil.rmtree(old, ignore_errors=True)
    for stale in root.glob(".step-*.tmp"):  # half-written by a process killed mid-save; this one finished
        shutil.rmtree(stale, ignore_errors=True)
    return final


# Why a write can fail part-way through a checkpoint, in words a user can act on.
WRITE_FAILURES = {errno.ENOSPC: "the disk is full", errno.EFBIG: "a file-size limit (ulimit -f) was reached",
                  errno.EDQUOT: "the disk quota is used up"}


def write_failure(exc: OSError, run_dir: Path, step: int, rank: int | None = None) -> EmberError:
    """The error of a checkpoint that could not be written (a full disk, a file-size limit, a
    quota): what happened - on which ``rank`` and to which file, for a checkpoint written by
    several ranks - that nothing of it was kept (the save is atomic: its temporary folder is
    removed) and which checkpoint a ``--resume`` continues from."""
    reason = WRITE_FAILURES.get(exc.errno, "the file system refused a write")
    where = "" if rank is None else f" on rank {rank}" + (f", writing {exc.filename}" if exc.filename else "")
    done = list_checkpoints(run_dir)
    last = f"{done[-1].name} is intact" if done else "no earlier checkpoint exists yet"
    return EmberError(f"could not write the checkpoint of step {step} in {Path(run_dir) / CHECKPOINT_DIR}: "
                      f"{reason} ({exc.strerror or exc}){where}. Nothing of it was kept; {last}. Free some "
                      "space, then continue with --resume")


def list_checkpoints(run_dir: Path) -> list[Path]:
    """Completed checkpoint folders, oldest first (temporary folders are not listed)."""
    root = Path(run_dir) / CHECKPOINT_DIR
    if not root.is_dir():
        return []
    return sorted(p for p in root.iterdir() if p.is_dir() and p.name.startswith("step-"))


def verify_checkpoint(path: Path) -> str | None:
    """None if the checkpoint is complete and intact, else what is wrong with it."""
    manifest_path = path / "manifest.json"
    if not manifest_path.is_file():
        return "manifest.json is missing (the checkpoint was not finished)"
    try:
        manifest = json.loads(manifest_path.read_text())
    except (OSError, ValueError) as exc:
        return f"manifest.json is unreadable ({exc})"
    for name, expected in manifest.items():
        file = path / name
        if not file.is_file():
            if name.endswith(".distcp"):  # DCP names a shard __<rank>_<n>.distcp (ember.runs.sharded)
                return f"the shard {name} of rank {name[2:].split('_')[0]} is missing"
            return f"{name} is missing"
        if file.stat().st_size != expected["bytes"]:
            return f"{name} has {file.stat().st_size} bytes, the manifest says {expected['bytes']}"
        if sha256_file(file) != expected["sha256"]:
            return f"{name} does not match its SHA-256 in the manifest"
    return None


def newest_checkpoint(run_dir: Path, read: Callable[[Path], Any] = lambda path: None) -> tuple[Path, Any] | None:
    """The newest checkpoint that matches its manifest and that ``read(path)`` reads without an
    error, as (path, what ``read`` returned); None when there is no checkpoint at all.

    Damaged or partial checkpoints are reported and skipped; an EmberError when none is intact.
    """
    candidates = list_checkpoints(run_dir)
    problems = []
    for path in reversed(candidates):
        problem = verify_checkpoint(path)
        if problem is None:
            try:
                return path, read(path)
            except Exception as exc:  # verified but still unreadable: treat as damaged
                problem = f"cannot be read ({exc})"
        message = f"checkpoint {path} is damaged: {problem}; trying the previous one"
        problems.append(message)
        print(f"warning: {message}", file=sys.stderr)
    if candidates:
        raise EmberError(
            f"no intact checkpoint in {Path(run_dir) / CHECKPOINT_DIR}:\n  " + "\n  ".join(problems)
            + "\nnothing to resume from: start over with --overwrite (which deletes the run folder) or into "
              "another --out"
        )
    return None


def read_checkpoint(path: Path) -> tuple[dict, dict, dict]:
    """(model_state, optimizer_state, trainer_state) of a checkpoint written by ``save_checkpoint``."""
    model_state = load_weights(path / "model.safetensors")
    # map to CPU: a checkpoint written on a GPU must resume on a machine without one;
    # Optimizer.load_state_dict then moves each state tensor to its parameter's device
    optimizer_state = torch.load(path / "optimizer.pt", weights_only=True, map_location="cpu")
    trainer_state = json.loads((path / "trainer_state.json").read_text())
    return model_state, optimizer_state, trainer_state


def load_latest_checkpoint(run_dir: Path) -> tuple[Path, dict, dict, dict] | None:
    """The newest intact checkpoint as (path, model_state, optimizer_state, trainer_state).

    Damaged or partial checkpoints are reported and skipped; None when there is none at all.
    """
    found = newest_checkpoint(run_dir, read_checkpoint)
    return None if found is None else (found[0], *found[1])
