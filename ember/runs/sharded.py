"""Sharded checkpoints (``torch.distributed.checkpoint``, DCP): their layout, and reading one
in a single process whatever the number of ranks that wrote it.

    RUN/checkpoints/step-00001000/
      __0_0.distcp, __1_0.distcp ...   each rank's shard of {"model": ..., "optimizer": ...}
      .metadata                        DCP's index: every tensor's global shape, dtype and chunks
      trainer_state.json
      manifest.json                    bytes + SHA-256 of every file above, written last

``ember.train.sharded_checkpoint`` writes them (every rank its own shard, into a temporary
folder renamed into place only after the manifest is written), so a folder named ``step-N``
is complete and ``ember.runs.checkpoint.verify_checkpoint`` checks it like any other: a
missing or truncated shard is named and the checkpoint skipped.

Reading without the ranks: ``.metadata`` gives every tensor's global shape, so the model's
tensors are allocated whole and DCP fills them from the shards (no process group needed).
``checkpoint_model_state`` does this for either layout; ``weights_view`` turns a checkpoint
folder - or a run folder that only has checkpoints - into a run folder with
``model.safetensors``, so `ember convert --to-hf` and `ember export` read them directly.
"""

from __future__ import annotations

import shutil
import sys
import tempfile
import warnings
from contextlib import contextmanager
from pathlib import Path

import torch

from ember.errors import EmberError
from ember.runs.checkpoint import (
    CHECKPOINT_DIR,
    list_checkpoints,
    load_weights,
    newest_checkpoint,
    save_weights,
    verify_checkpoint,
)

METADATA = ".metadata"  # DCP's index file, written by the coordinating rank
SHARD_SUFFIX = ".distcp"
MODEL_KEY, OPTIMIZER_KEY = "model", "optimizer"  # the two parts of the saved state


def is_sharded(path: Path) -> bool:
    """Whether a checkpoint folder has the sharded (DCP) layout."""
    path = Path(path)
    return (path / METADATA).is_file() or any(path.glob(f"*{SHARD_SUFFIX}"))


def rank_files(path: Path, rank: int) -> list[Path]:
    """The shard files rank ``rank`` wrote (DCP names them ``__<rank>_<n>.distcp``)."""
    return sorted(Path(path).glob(f"__{rank}_*{SHARD_SUFFIX}"))


def read_sharded_model(path: Path) -> dict[str, torch.Tensor]:
    """The full model tensors of a sharded checkpoint, on CPU, in this one process."""
    from torch.distributed.checkpoint import FileSystemReader, load
    from torch.distributed.checkpoint.metadata import TensorStorageMetadata

    reader = FileSystemReader(str(path))
    try:
        metadata = reader.read_metadata()
    except Exception as exc:
        raise EmberError(f"{path}: cannot read the sharded checkpoint's index {METADATA} ({exc})") from None
    prefix = MODEL_KEY + "."
    state = {key: torch.empty(tuple(m.size), dtype=m.properties.dtype)
             for key, m in metadata.state_dict_metadata.items()
             if key.startswith(prefix) and isinstance(m, TensorStorageMetadata)}
    if not state:
        raise EmberError(f"{path} holds no model tensors; it is not a checkpoint written by `ember pretrain`")
    try:
        with warnings.catch_warnings():  # "torch.distributed is disabled": one process is the intent
            warnings.simplefilter("ignore", UserWarning)
            load(state, storage_reader=reader, no_dist=True)
    except Exception as exc:
        raise EmberError(f"{path}: cannot read the model's shards ({exc}); the checkpoint is damaged") from None
    return {key[len(prefix):]: value for key, value in state.items()}


def checkpoint_model_state(path: Path) -> dict[str, torch.Tensor]:
    """The model weights of one checkpoint folder, either layout, after checking its manifest."""
    path = Path(path)
    problem = verify_checkpoint(path)
    if problem is not None:
        raise EmberError(f"checkpoint {path} is damaged: {problem}. Use another checkpoint of the run "
                         f"(ls {path.parent}); nothing was read from this one")
    return read_sharded_model(path) if is_sharded(path) else load_weights(path / "model.safetensors")


def _run_of(checkpoint: Path) -> Path:
    run_dir = checkpoint.parent.parent
    if checkpoint.parent.name != CHECKPOINT_DIR or not (run_dir / "config.yaml").is_file():
        raise EmberError(f"{checkpoint} is a checkpoint folder outside a run folder (RUN/{CHECKPOINT_DIR}/step-N, "
                         "next to RUN/config.yaml); its run's config and tokenizer are needed to read it")
    return run_dir


def _checkpoint_to_read(path: Path) -> Path | None:
    """The checkpoint folder ``path`` stands for, or None when it is a run folder with final weights."""
    if (path / "manifest.json").is_file() or path.name.startswith("step-"):
        return path
    if (path / "model.safetensors").is_file() or not list_checkpoints(path):
        return None
    found = newest_checkpoint(path)  # verified; damaged ones reported and skipped
    print(f"note: {path} has no model.safetensors (its training has not finished); reading its newest "
          f"intact checkpoint {found[0].name}", file=sys.stderr)
    return found[0]


@contextmanager
def weights_view(path: str | Path):
    """A run folder holding ``model.safetensors`` for ``path``: ``path`` itself when it has final
    weights; for a checkpoint folder (``RUN/checkpoints/step-N``, sharded or not) or a run folder
    with only checkpoints, a temporary folder linking the run's files beside the checkpoint's
    model weights, consolidated. The temporary folder is removed when the block ends."""
    path = Path(path)
    checkpoint = _checkpoint_to_read(path) if path.is_dir() else None
    if checkpoint is None:
        yield path
        return
    run_dir = _run_of(checkpoint)
    state = checkpoint_model_state(checkpoint)
    view = Path(tempfile.mkdtemp(prefix=f"{run_dir.name}-{checkpoint.name}."))
    try:
        for item in run_dir.iterdir():
            if item.name not in (CHECKPOINT_DIR, "model.safetensors"):
                (view / item.name).symlink_to(item.resolve(), target_is_directory=item.is_dir())
        save_weights(state, view / "model.safetensors", {"checkpoint": str(checkpoint)})
        yield view
    finally:
        shutil.rmtree(view, ignore_errors=True)
