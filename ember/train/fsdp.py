"""Fully sharded data parallelism for the Trainer (``train.parallel: fsdp``).

PyTorch FSDP (Zhao et al. 2023, "PyTorch FSDP: Experiences on Scaling Fully Sharded Data
Parallel"; the ZeRO-3 layout of Rajbhandari et al. 2020) through its second API,
``torch.distributed.fsdp.fully_shard``: every parameter becomes a DTensor sharded on dim 0
across the W ranks, so parameters, gradients and optimizer state cost 1/W per rank. Each
*unit* is all-gathered just before its forward (and again before its backward) and freed
after; gradients are reduce-scattered, so each rank only ever holds one unit in full.

Units: every block a backbone lists in ``shard_units()`` (its transformer layers; see
``ember.models.encoder.Encoder.shard_units``), then the trained module itself, which owns
what is left (embeddings, tied output matrices, heads). A module without ``shard_units`` is
sharded as one unit: still 1/W of the state at rest, the whole model gathered for a step.

Gradients are averaged over ranks as under DDP, and the micro-batches are the same, so 2
ranks under FSDP give the losses of 1 process accumulating 2 micro-batches
(tests/train/test_fsdp.py). Where the device has a fast bf16 path (CUDA) and
``train.dtype`` is bfloat16, the gathered parameters are cast to bf16 for compute and the
gradients reduced in fp32 (``MixedPrecisionPolicy``); on CPU everything stays fp32.
"""

from __future__ import annotations

import torch
from torch import nn

from ember.config import TrainConfig
from ember.errors import EmberError
from ember.train.distributed import DistInfo

PARALLEL = ("ddp", "fsdp")


def check_parallel(cfg: TrainConfig) -> None:
    if cfg.parallel not in PARALLEL:
        raise EmberError(f"train.parallel={cfg.parallel!r}; choose 'ddp' (a full replica per rank) or "
                         "'fsdp' (parameters, gradients and optimizer state sharded across ranks)")


def shard_units(module: nn.Module) -> list[nn.Module]:
    """The blocks every backbone inside ``module`` offers (``shard_units()``), each once, in
    module order. A block that holds a parameter some other block also holds is left out
    (it stays in the outer unit), so a shared weight is never split between two units."""
    units: list[nn.Module] = []
    seen: set[int] = set()
    for sub in module.modules():
        offer = getattr(sub, "shard_units", None)
        if callable(offer):
            for unit in offer():
                if id(unit) not in seen:
                    seen.add(id(unit))
                    units.append(unit)
    owners: dict[int, int] = {}  # parameter -> how many units hold it
    for unit in units:
        for p in unit.parameters():
            owners[id(p)] = owners.get(id(p), 0) + 1
    return [u for u in units if all(owners[id(p)] == 1 for p in u.parameters())]


def mixed_precision(cfg: TrainConfig):
    """bf16 compute / fp32 gradient reduction on CUDA with ``train.dtype: bfloat16``, else None."""
    from torch.distributed.fsdp import MixedPrecisionPolicy

    if cfg.device.startswith("cuda") and cfg.dtype in ("bfloat16", "bf16") and torch.cuda.is_bf16_supported():
        return MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32)
    return None


def shard(module: nn.Module, cfg: TrainConfig, info: DistInfo) -> bool:
    """Shard ``module`` in place when ``train.parallel`` is fsdp and there are several ranks;
    True if it did. Call before the optimizer is built: it replaces the parameters."""
    check_parallel(cfg)
    if cfg.parallel != "fsdp" or not info.enabled:
        return False
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard

    device_type = cfg.device.split(":")[0]
    mesh = init_device_mesh(device_type, (info.world_size,))
    kwargs = {"mesh": mesh}
    policy = mixed_precision(cfg)
    if policy is not None:
        kwargs["mp_policy"] = policy
    for unit in shard_units(module):
        fully_shard(unit, **kwargs)
    fully_shard(module, **kwargs)
    return True


def is_sharded(module: nn.Module) -> bool:
    from torch.distributed.fsdp import FSDPModule

    return isinstance(module, FSDPModule)


def full_model_state(module: nn.Module) -> dict[str, torch.Tensor]:
    """The whole model's state dict: for a sharded module a collective (every rank must call
    it) that leaves the full tensors on rank 0, on CPU, and an empty dict on the others."""
    if not is_sharded(module):
        return module.state_dict()
    from torch.distributed.checkpoint.state_dict import (
        StateDictOptions,
        get_model_state_dict,
    )

    return get_model_state_dict(module, options=StateDictOptions(full_state_dict=True, cpu_offload=True))
