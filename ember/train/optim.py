"""AdamW with BERT's parameter groups, and learning-rate schedules as pure functions of step.

BERT (and its TF reference optimizer) exclude biases and LayerNorm parameters from weight
decay. The schedule is linear warm-up to the peak then linear decay to zero at ``max_steps``
(Devlin et al. 2019, App. A.2). A pure function of the step keeps resume exact.
"""

from __future__ import annotations

import torch
from torch import nn

from ember.config import TrainConfig
from ember.errors import EmberError


def parameter_groups(module: nn.Module, weight_decay: float) -> list[dict]:
    decay, no_decay = [], []
    norm_params = {
        id(p) for m in module.modules() if isinstance(m, nn.LayerNorm) for p in m.parameters(recurse=False)
    }
    for name, param in module.named_parameters():
        if not param.requires_grad:
            continue
        if name.endswith("bias") or id(param) in norm_params:
            no_decay.append(param)
        else:
            decay.append(param)
    return [
        {"params": decay, "weight_decay": weight_decay},
        {"params": no_decay, "weight_decay": 0.0},
    ]


def build_optimizer(module: nn.Module, cfg: TrainConfig) -> torch.optim.Optimizer:
    groups = parameter_groups(module, cfg.weight_decay)
    kwargs = dict(lr=cfg.lr, betas=(cfg.adam_beta1, cfg.adam_beta2), eps=cfg.adam_eps)
    # foreach kernels update all tensors of a group in a few fused ops (fewer passes over memory)
    return torch.optim.AdamW(groups, foreach=True, **kwargs)


def warmup_steps(cfg: TrainConfig) -> int:
    return cfg.warmup_steps or int(round(cfg.warmup_ratio * cfg.max_steps))


def lr_factor(step: int, cfg: TrainConfig) -> float:
    """Multiplier of the peak learning rate for the update that ends step ``step`` (0-based)."""
    warm = warmup_steps(cfg)
    if step < warm:
        return (step + 1) / warm
    if cfg.schedule == "constant":
        return 1.0
    if cfg.schedule == "linear":
        remaining = cfg.max_steps - warm
        return max(0.0, (cfg.max_steps - step) / max(1, remaining))
    raise EmberError(f"train.schedule={cfg.schedule!r}; choose 'linear' or 'constant'")


def set_lr(optimizer: torch.optim.Optimizer, lr: float) -> None:
    for group in optimizer.param_groups:
        group["lr"] = lr
