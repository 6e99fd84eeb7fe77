"""Process-group setup for `torchrun` (DDP): gloo on CPU, nccl on CUDA.

Without torchrun's environment variables everything runs as a single process (rank 0 of 1).
"""

from __future__ import annotations

import os
from dataclasses import dataclass

import torch
import torch.distributed as dist


@dataclass(frozen=True)
class DistInfo:
    rank: int = 0
    world_size: int = 1
    local_rank: int = 0

    @property
    def is_main(self) -> bool:
        return self.rank == 0

    @property
    def enabled(self) -> bool:
        return self.world_size > 1


def is_first_process() -> bool:
    """Rank 0 of a torchrun launch (or the only process): the one that prints what all ranks know."""
    return int(os.environ.get("RANK", "0")) == 0


def one_process(verb: str) -> None:
    """Refuse a verb that trains in one process when torchrun started several: each would write
    the same run folder and all but one fail with "already holds a run", leaving a half-written
    folder behind."""
    world = int(os.environ.get("WORLD_SIZE", "1"))
    if world > 1:
        from ember.errors import EmberError

        raise EmberError(f"ember {verb} trains in one process, and torchrun started {world}; run it without "
                         "torchrun (only `ember pretrain` trains across processes, docs/distributed.md)")


def init_distributed(device: str) -> DistInfo:
    world = int(os.environ.get("WORLD_SIZE", "1"))
    if world <= 1:
        return DistInfo()
    rank = int(os.environ["RANK"])
    local_rank = int(os.environ.get("LOCAL_RANK", rank))
    if not dist.is_initialized():
        backend = "nccl" if device.startswith("cuda") else "gloo"
        if device.startswith("cuda"):
            torch.cuda.set_device(local_rank)
        store = attempt_store(world)
        if store is None:
            dist.init_process_group(backend=backend)
        else:
            dist.init_process_group(backend=backend, store=store, rank=rank, world_size=world)
    return DistInfo(rank=rank, world_size=world, local_rank=local_rank)


def all_reduce_sums(values: list[float], info: DistInfo) -> list[float]:
    """Sum a list of floats over ranks (one collective for all of them)."""
    if not info.enabled:
        return values
    tensor = torch.tensor(values, dtype=torch.float64)
    dist.all_reduce(tensor)
    return tensor.tolist()


def agree(values: list[float], flags: list[bool], info: DistInfo) -> tuple[list[float], list[bool]]:
    """Rank 0's ``values`` and, per flag, whether any rank raised it: one collective, the same
    answer on every rank. Decisions taken from a rank's own clock or signals (a time budget, a
    time-based learning rate, SIGTERM) must go through here, or ranks leave the loop at
    different steps and the others hang in their next all-reduce."""
    if not info.enabled:
        return values, flags
    tensor = torch.tensor([v if info.is_main else 0.0 for v in values] + [float(f) for f in flags],
                          dtype=torch.float64)
    dist.all_reduce(tensor)
    out = tensor.tolist()
    return out[: len(values)], [x > 0 for x in out[len(values):]]


def barrier(info: DistInfo) -> None:
    if info.enabled:
        dist.barrier()


def shutdown(info: DistInfo) -> None:
    if info.enabled and dist.is_initialized():
        dist.destroy_process_group()


# -- beyond one machine (docs/distributed.md) ---------------------------------------------

def restart_count() -> int:
    """How many times ``torchrun --max-restarts`` has restarted this job's workers (0 on the
    first attempt, and outside torchrun). A restarted worker must continue the run, not
    start it again: its run folder already holds the first attempt's files."""
    return int(os.environ.get("TORCHELASTIC_RESTART_COUNT", "0") or 0)


def attempt_store(world: int):
    """The store the workers of this torchrun attempt meet in, or None for torch's default.

    With torchrun's agent store (TORCHELASTIC_USE_AGENT_STORE, e.g. ``--standalone`` and
    c10d rendezvous) every attempt's workers connect to the same TCPStore without a prefix,
    so after ``--max-restarts`` the new workers can read the killed attempt's gloo addresses
    and fail with "Connection refused". Keys are kept apart per attempt here."""
    if os.environ.get("TORCHELASTIC_USE_AGENT_STORE") != "True" or restart_count() == 0:
        return None
    from datetime import timedelta

    store = dist.TCPStore(os.environ["MASTER_ADDR"], int(os.environ["MASTER_PORT"]), world, is_master=False,
                          timeout=timedelta(minutes=10))
    return dist.PrefixStore(f"ember/attempt_{restart_count()}", store)


def broadcast_object(value, info: DistInfo):
    """Rank 0's ``value`` on every rank (any picklable object). Decisions that read files
    (which checkpoint is intact) are taken once, by rank 0, so ranks cannot disagree."""
    if not info.enabled:
        return value
    box = [value if info.is_main else None]
    dist.broadcast_object_list(box, src=0)
    return box[0]


def gather_objects(value, info: DistInfo) -> list:
    """Every rank's ``value``, in rank order, on every rank."""
    if not info.enabled:
        return [value]
    out = [None] * info.world_size
    dist.all_gather_object(out, value)
    return out


def gradient_sync(model, sync: bool):
    """A context for one micro-batch's backward: gradients are reduced across ranks only when
    ``sync`` (the last micro-batch of a step); the others accumulate locally. DDP says so
    with ``no_sync()``, FSDP with ``set_requires_gradient_sync``; one process has nothing
    to skip."""
    from contextlib import contextmanager, nullcontext

    if sync:
        return nullcontext()
    if hasattr(model, "no_sync"):  # DistributedDataParallel
        return model.no_sync()
    if not hasattr(model, "set_requires_gradient_sync"):  # a plain module (or a compiled one)
        return nullcontext()

    @contextmanager
    def unsynced():
        model.set_requires_gradient_sync(False)
        try:
            yield
        finally:
            model.set_requires_gradient_sync(True)

    return unsynced()
