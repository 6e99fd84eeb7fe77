"""Writing and resuming checkpoints from every rank: the sharded layout (``train.parallel:
fsdp``) and the resume of either layout into a sharded or a whole model.

Saving (a collective: every rank calls it). Each rank writes its shard of the model and
optimizer state with ``torch.distributed.checkpoint`` into ``checkpoints/.step-N.tmp`` and
hashes its own files; rank 0 gathers the hashes, adds DCP's index and the trainer state,
writes ``manifest.json`` last and renames the folder to ``step-N``. A rank killed at any
point leaves only the temporary folder, which is never listed as a checkpoint: the newest
``step-N`` stays the last complete one (layout: ``ember.runs.sharded``).

Resuming. Rank 0 picks the newest intact checkpoint (manifest checked, a missing shard named
and skipped) and broadcasts its path, so ranks cannot disagree. The state is addressed by
parameter name (``torch.distributed.checkpoint.state_dict``), not by rank or shard, so a
sharded checkpoint loads on any number of ranks - 2 -> 1, 1 -> 2 - and into a whole model;
a whole-model checkpoint (``model.safetensors`` + ``optimizer.pt``, DDP) loads into a whole model.
"""

from __future__ import annotations

import json
import os
import shutil
import warnings
from contextlib import contextmanager
from pathlib import Path

import torch
from torch import nn

from ember.errors import EmberError
from ember.fileio import atomic_write_text, fsync_dir, sha256_file
from ember.runs.checkpoint import (
    CHECKPOINT_DIR,
    list_checkpoints,
    newest_checkpoint,
    read_checkpoint,
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


def save_sharded_checkpoint(run_dir: Path, step: int, module: nn.Module, optimizer: torch.optim.Optimizer,
                            trainer_state: dict, keep: int, info: DistInfo) -> Path:
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.state_dict import get_state_dict

    root = Path(run_dir) / CHECKPOINT_DIR
    final, tmp = root / f"step-{step:08d}", root / f".step-{step:08d}.tmp"
    if info.is_main:  # a leftover of a killed attempt at the same step
        root.mkdir(parents=True, exist_ok=True)
        shutil.rmtree(tmp, ignore_errors=True)
    barrier(info)
    model_state, optimizer_state = get_state_dict(module, optimizer)
    with _quiet(info):
        dcp.save({MODEL_KEY: model_state, OPTIMIZER_KEY: optimizer_state}, checkpoint_id=str(tmp),
                 no_dist=not info.enabled)
    hashes = gather_objects({p.name: _entry(p) for p in rank_files(tmp, info.rank)}, info)
    if info.is_main:
        manifest = {name: entry for mine in hashes for name, entry in mine.items()}
        atomic_write_text(tmp / "trainer_state.json", json.dumps(trainer_state, indent=1))
        for path in sorted(tmp.iterdir()):  # DCP's index and anything a rank did not report
            if path.name not in manifest:
                manifest[path.name] = _entry(path)
        atomic_write_text(tmp / "manifest.json", json.dumps(manifest, indent=1))
        if final.exists():
            shutil.rmtree(final)
        os.replace(tmp, final)
        fsync_dir(root)
        for old in list_checkpoints(run_dir)[:-keep] if keep > 0 else []:
            shutil.rmtree(old, ignore_errors=True)
    barrier(info)
    return final


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


