"""Writing and resuming checkpoints from every rank: the sharded layout (``train.parallel:
fsdp``) and the resume of either layout into a sharded or a whole model.

Saving (a collective: every rank calls it). Each rank writes its shard of the model and
optimizer state with ``torch.distributed.checkpoint`` into ``checkpoints/.step-N.tmp`` and
hashes its own files; rank 0 gathers the hashes, adds DCP's index and the trainer state,
writes ``manifest.json`` last and renames the folder to ``step-N``. A rank killed at any
point leaves only the temporary folder, which is never listed as a checkpoint: the newest
``step-N`` stays the last complete one (layout: ``ember.runs.sharded``). The ranks agree
before the rename: a write that fails on one rank (a full disk, a file-size limit) reaches
every rank (DCP gathers each rank's outcome, then the hashes are gathered with a success
flag), so no rank publishes a partial checkpoint or waits in a collective for a rank that
gave up; all of them stop with the same error, naming the rank and the file, and the
temporary folder is removed. A rank that dies mid-save breaks the next collective of the
others, which stop at once with a message saying so (the launcher names the dead rank).

Resuming. Rank 0 picks the newest intact checkpoint (manifest checked, a missing shard named
and skipped) and broadcasts its path, so ranks cannot disagree. The state is addressed by
parameter name (``torch.distributed.checkpoint.state_dict``), not by rank or shard, so a
sharded checkpoint loads on any number of ranks - 2 -> 1, 1 -> 2 - and into a whole model;
a whole-model checkpoint (``model.safetensors`` + ``optimizer.pt``, DDP) loads into a whole model.
"""

from __future__ import annotations

import functools
import json
import os
import re
import shutil
import warnings
from contextlib import contextmanager, suppress
from pathlib import Path

import torch
from torch import nn

from ember.errors import EmberError
from ember.fileio import WriteErrorKept, atomic_write_text, fsync_dir, sha256_file
from ember.runs.checkpoint import (
    CHECKPOINT_DIR,
    list_checkpoints,
    newest_checkpoint,
    read_checkpoint,
    write_failure,
)
from ember.runs.sharded import MODEL_KEY, OPTIMIZER_KEY, is_sharded, rank_files
from ember.train.distributed import DistInfo, barrier, broadcast_object, gather_objects
from ember.train.fsdp import is_sharded as is_sharded_module


@contextmanager
def _quiet(info: DistInfo):
    """DCP warns that it runs in one process when there is no process group; that is intended."""
    with warnings.catch_warnings():
        if not info.enabled:
            warnings.filterwarnings("ignore", message="torch.distributed is disabled")
        yield


def _entry(path: Path) -> dict:
    return {"bytes": path.stat().st_size, "sha256": sha256_file(path)}


@functools.cache
def _storage_writer():
    """DCP's file writer, keeping each file's OSError: DCP writes tensors with torch.save, whose
    C++ writer turns a failed write (ENOSPC, EFBIG) into a RuntimeError without the errno, and
    a full disk should be reported as one, naming the file."""
    from torch.distributed.checkpoint import FileSystemWriter
    from torch.distributed.checkpoint.filesystem import FileSystem

    class KeepWriteErrors(FileSystem):
        @contextmanager
        def create_stream(self, path, mode):
            kept = WriteErrorKept(Path(path).open(mode), path)
            try:
                yield kept
                kept.close()  # the data still buffered, if DCP did not close it: its error is kept too
            except Exception:
                with suppress(OSError):  # a close that flushes into the same full disk
                    kept.fh.close()
                if kept.error is not None:
                    raise kept.error from None
                raise

    class Writer(FileSystemWriter):
        def __init__(self, path) -> None:
            super().__init__(path)
            self.fs = KeepWriteErrors()

    return Writer


def _first_failure(exc: BaseException) -> tuple[int, BaseException]:
    """(rank, error) out of DCP's CheckpointException, which carries every rank's failure of a
    save to every rank: a write error (full disk) before anything else, then the lowest rank."""
    failures = sorted(exc.failures.items(), key=lambda item: (not isinstance(item[1][0], OSError), item[0]))
    rank, (error, _trace) = failures[0]
    return rank, error


def _write_shards(tmp: Path, state: dict, info: DistInfo) -> dict:
    """Every rank writes its shard into ``tmp`` (a collective); the hashes of this rank's files."""
    import torch.distributed.checkpoint as dcp

    with _quiet(info):
        dcp.save(state, checkpoint_id=str(tmp), storage_writer=_storage_writer()(str(tmp)), no_dist=not info.enabled)
    return {p.name: _entry(p) for p in rank_files(tmp, info.rank)}


def _publish(root: Path, tmp: Path, final: Path, shards: list[dict], trainer_state: dict) -> None:
    """Rank 0: the trainer state and the manifest (last), then the rename that makes it a checkpoint."""
    manifest = {name: entry for mine in shards for name, entry in mine.items()}
    atomic_write_text(tmp / "trainer_state.json", json.dumps(trainer_state, indent=1))
    for path in sorted(tmp.iterdir()):  # DCP's index and anything a rank did not report
        if path.name not in manifest:
            manifest[path.name] = _entry(path)
    atomic_write_text(tmp / "manifest.json", json.dumps(manifest, indent=1))
    if final.exists():
        shutil.rmtree(final)
    os.replace(tmp, final)
    fsync_dir(root)


def save_sharded_checkpoint(run_dir: Path, step: int, module: nn.Module, optimizer: torch.optim.Optimizer,
                            trainer_state: dict, keep: int, info: DistInfo) -> Path:
    """Write the checkpoint of ``step`` (a collective: every rank calls it). It is published
    only when every rank's part was written: a write that fails on any rank (a full disk, a
    file-size limit) raises the same EmberError on every rank, naming the rank, the file and
    the checkpoint that stays the newest, and the temporary folder is removed."""
    from torch.distributed.checkpoint.api import CheckpointException
    from torch.distributed.checkpoint.state_dict import get_state_dict

    root = Path(run_dir) / CHECKPOINT_DIR
    final, tmp = root / f"step-{step:08d}", root / f".step-{step:08d}.tmp"
    if info.is_main:  # a leftover of a killed attempt at the same step
        root.mkdir(parents=True, exist_ok=True)
        shutil.rmtree(tmp, ignore_errors=True)
    barrier(info)
    model_state, optimizer_state = get_state_dict(module, optimizer)
    failure = None  # (rank, error) of the first rank whose part failed
    try:
        try:
            mine = _write_shards(tmp, {MODEL_KEY: model_state, OPTIMIZER_KEY: optimizer_state}, info)
        except CheckpointException as exc:  # DCP gathered each rank's outcome: the same on every rank
            mine, failure = {}, _first_failure(exc)
        except OSError as exc:  # this rank's own hashing, outside DCP
            mine, failure = {}, (info.rank, exc)
        reports = gather_objects((mine, failure), info)  # every rank learns whether all succeeded
    except RuntimeError as exc:  # a collective failed: another rank died mid-save (kill -9, OOM, lost machine)
        if not info.enabled:
            raise
        if info.is_main:
            shutil.rmtree(tmp, ignore_errors=True)
        raise _lost_rank(exc, run_dir, step) from None
    failure = next((f for _, f in reports if f is not None), None)
    if info.is_main and failure is None:
        try:
            _publish(root, tmp, final, [shards for shards, _ in reports], trainer_state)
            for old in list_checkpoints(run_dir)[:-keep] if keep > 0 else []:
                shutil.rmtree(old, ignore_errors=True)
            for stale in root.glob(".step-*.tmp"):  # left by a process killed mid-save; this save finished
                shutil.rmtree(stale, ignore_errors=True)
        except OSError as exc:
            failure = (info.rank, exc)
    if info.is_main and failure is not None:
        shutil.rmtree(tmp, ignore_errors=True)
    failure = broadcast_object(failure, info)  # rank 0's publishing, too, ends every rank alike
    if failure is None:
        return final
    rank, error = failure
    if isinstance(error, OSError):
        raise write_failure(error, run_dir, step, rank)
    raise RuntimeError(f"the checkpoint of step {step} failed on rank {rank}: {type(error).__name__}: {error}")


def _lost_rank(exc: RuntimeError, run_dir: Path, step: int) -> EmberError:
    done = list_checkpoints(run_dir)
    last = f"{done[-1].name} is the newest checkpoint" if done else "there is no earlier checkpoint"
    # gloo's text, without its source location and advice: "Connection closed by peer [127.0.0.1]:2964"
    text = re.sub(r"^\[[^\]]*\]\s*", "", str(exc).strip()).split(". ")[0]
    cause = (text.splitlines() or [type(exc).__name__])[0]
    return EmberError(f"could not finish the checkpoint of step {step} in {Path(run_dir) / CHECKPOINT_DIR}: the "
                      f"ranks lost contact mid-save ({cause}); the launcher's report names a rank that died. "
                      f"The unfinished save is never taken for a checkpoint; {last}. Continue with --resume")


def _choose(run_dir: Path, info: DistInfo) -> Path | None:
    """Rank 0's choice of checkpoint on every rank (its EmberError raised on every rank)."""
    choice = None
    if info.is_main:
        try:
            found = newest_checkpoint(run_dir)
            choice = ("found", str(found[0])) if found else ("none", "")
        except EmberError as exc:
            choice = ("error", str(exc))
    kind, value = broadcast_object(choice, info)
    if kind == "error":
        raise EmberError(value)
    return Path(value) if kind == "found" else None


def _load_sharded(path: Path, module: nn.Module, optimizer: torch.optim.Optimizer, info: DistInfo) -> None:
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.state_dict import get_state_dict, set_state_dict

    model_state, optimizer_state = get_state_dict(module, optimizer)  # the layout to fill, by name
    state = {MODEL_KEY: model_state, OPTIMIZER_KEY: optimizer_state}
    with _quiet(info):
        dcp.load(state, checkpoint_id=str(path), no_dist=not info.enabled)
    set_state_dict(module, optimizer, model_state_dict=state[MODEL_KEY], optim_state_dict=state[OPTIMIZER_KEY])


def _load_whole(path: Path, module: nn.Module, optimizer: torch.optim.Optimizer) -> dict:
    if is_sharded_module(module):  # config.yaml keeps train.parallel, so only a hand-edited run gets here
        raise EmberError(f"{path} is a whole-model checkpoint (train.parallel: ddp) and this run shards the model; "
                         "resume it with train.parallel: ddp")
    model_state, optimizer_state, trainer_state = read_checkpoint(path)
    missing, unexpected = module.load_state_dict(model_state, strict=False)
    if missing or unexpected:
        raise EmberError(f"{path}: checkpoint does not fit this model "
                         f"(missing {missing[:3]}, unexpected {unexpected[:3]})")
    optimizer.load_state_dict(optimizer_state)
    return trainer_state


def resume_checkpoint(run_dir: Path, module: nn.Module, optimizer: torch.optim.Optimizer,
                      info: DistInfo) -> tuple[Path, dict] | None:
    """Load the newest intact checkpoint of either layout into ``module`` and ``optimizer``
    (every rank calls it); (its path, its trainer state), or None when the run has none."""
    path = _choose(Path(run_dir), info)
    if path is None:
        return None
    try:
        if is_sharded(path):
            _load_sharded(path, module, optimizer, info)
            return path, json.loads((path / "trainer_state.json").read_text())
        return path, _load_whole(path, module, optimizer)
    except EmberError:
        raise
    except Exception as exc:  # a shape or name mismatch reported by torch
        raise EmberError(f"{path}: checkpoint does not fit this model ({exc}); resume with the run's own "
                         "model settings") from None


