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
        dist.init_process_group(backend=backend)
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
