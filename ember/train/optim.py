"""AdamW with BERT's parameter groups (or Adafactor), and learning-rate schedules as pure functions.

BERT (and its TF reference optimizer) exclude biases and LayerNorm parameters from weight
decay. Schedules (a pure function of the step keeps resume exact):

* ``linear``: linear warm-up to the peak then linear decay to zero at ``max_steps``
  (Devlin et al. 2019, App. A.2); ``constant``: warm-up then flat.
* ``stlr``: ULMFiT's slanted triangular learning rates (Howard & Ruder 2018, eq. 3): a short
  linear increase over the first ``cut_frac`` of the steps, then a long linear decay; the
  lowest rate is the peak / ``ratio``. It has its own warm-up, so ``warmup_*`` are ignored.

* ``inverse_sqrt``: T5's schedule (Raffel et al. 2020, §3.1.2), lr = 1/sqrt(max(n, k)) at
  step n with k = 10^4 warm-up steps: constant for k steps, then decaying as 1/sqrt(n). Here
  the peak ``lr`` times sqrt(k / max(n, k)), so T5's is lr 0.01 with ``warmup_steps`` 10000.

``train.optimizer`` picks AdamW, Adafactor (``ember.train.adafactor``; T5's optimizer) or LAMB
(``ember.train.lamb``; large batches, You et al. 2019). All take the same parameter groups
(weight decay off for biases and norms; for LAMB, the trust ratio off for them too).

Per-group learning-rate scales (discriminative fine-tuning, ULMFiT §3.2): a group may carry
``lr_scale``; ``set_lr`` gives it ``lr * lr_scale``. Groups are split by (weight decay, scale),
so weight-decay grouping is kept whatever the scales.

``time`` lays the linear warm-up/decay over the time budget ``max_time`` instead of a step
count, as cramming does (Geiping & Goldstein 2023, §3: a schedule tied to the budget, decaying
to zero when time runs out). It is a pure function of the training seconds elapsed; those are
saved in the checkpoint, so a resumed run continues the schedule where it stopped - but step
times vary, so a resumed run is sane, not bit-for-bit identical to an uninterrupted one.
"""

from __future__ import annotations

import math
from typing import Callable

import torch
from torch import nn

from ember.config import TrainConfig
from ember.errors import EmberError

SCHEDULES = ("linear", "constant", "stlr", "time", "inverse_sqrt")
OPTIMIZERS = ("adamw", "adafactor", "lamb")


def _norm_parameters(module: nn.Module) -> set[int]:
    return {id(p) for m in module.modules() if isinstance(m, nn.LayerNorm) for p in m.parameters(recurse=False)}


def without_trust_ratio(module: nn.Module, groups: list[dict]) -> list[dict]:
    """LAMB's groups: the no-decay ones (biases and norms, You et al. 2019 §3) take no trust ratio."""
    exempt = _norm_parameters(module) | {id(p) for n, p in module.named_parameters() if n.endswith("bias")}
    return [{**g, "trust_ratio": not any(id(p) in exempt for p in g["params"])} for g in groups]


def parameter_groups(module: nn.Module, weight_decay: float,
                     lr_scale: Callable[[str], float] | None = None) -> list[dict]:
    """AdamW groups: (decay, no decay) x distinct ``lr_scale(name)`` values, in a fixed order.

    Parameters with ``requires_grad=False`` are left out (a frozen encoder is not optimized).
    The order only depends on the module and the scales, so a resumed run rebuilds the same
    groups and the saved optimizer state fits them.
    """
    norm_params = _norm_parameters(module)
    groups: dict[tuple[bool, float], list] = {}
    for name, param in module.named_parameters():
        if not param.requires_grad:
            continue
        decays = not (name.endswith("bias") or id(param) in norm_params)
        scale = 1.0 if lr_scale is None else float(lr_scale(name))
        groups.setdefault((decays, scale), []).append(param)
    if lr_scale is None:  # keep BERT's two groups (even if one is empty) for old checkpoints
        return [{"params": groups.get((True, 1.0), []), "weight_decay": weight_decay},
                {"params": groups.get((False, 1.0), []), "weight_decay": 0.0}]
    order = sorted(groups, key=lambda k: (-k[1], not k[0]))  # highest lr first, decay before no-decay
    return [{"params": groups[k], "weight_decay": weight_decay if k[0] else 0.0, "lr_scale": k[1]}
            for k in order]


def check_optimizer(cfg: TrainConfig) -> None:
    if cfg.optimizer not in OPTIMIZERS:
        raise EmberError(f"train.optimizer={cfg.optimizer!r}; choose one of {', '.join(OPTIMIZERS)}")


def build_optimizer(module: nn.Module, cfg: TrainConfig,
                    lr_scale: Callable[[str], float] | None = None) -> torch.optim.Optimizer:
    groups = parameter_groups(module, cfg.weight_decay, lr_scale)
    if cfg.optimizer == "adafactor":
        from ember.train.adafactor import Adafactor

        return Adafactor(groups, lr=cfg.lr, decay_rate=cfg.adafactor_decay_rate,
                         clip_threshold=cfg.adafactor_clip_threshold,
                         scale_parameter=cfg.adafactor_scale_parameter, beta1=cfg.adafactor_beta1)
    if cfg.optimizer == "lamb":
        from ember.train.lamb import Lamb

        return Lamb(without_trust_ratio(module, groups), lr=cfg.lr, betas=(cfg.adam_beta1, cfg.adam_beta2),
                    eps=cfg.adam_eps)
    check_optimizer(cfg)
    kwargs = dict(lr=cfg.lr, betas=(cfg.adam_beta1, cfg.adam_beta2), eps=cfg.adam_eps)
    # The fused kernel does each tensor's whole update in one pass (on CUDA, one launch per group);
    # on the CPU it beats foreach's op-per-step passes by ~2% of a bert-mini step (BENCHMARKS.md,
    # measured on a quiet machine). FSDP's sharded parameters (DTensor) keep foreach on the CPU.
    if cfg.device.startswith("cuda") or not any(_is_sharded(p) for g in groups for p in g["params"]):
        return torch.optim.AdamW(groups, fused=True, **kwargs)
    return torch.optim.AdamW(groups, foreach=True, **kwargs)


def _is_sharded(param: torch.Tensor) -> bool:
    return type(param).__name__ == "DTensor"  # FSDP2's parameters (torch.distributed.tensor)


def warmup_steps(cfg: TrainConfig) -> int:
    return cfg.warmup_steps or int(round(cfg.warmup_ratio * cfg.max_steps))


def stlr_factor(step: int, total: int, cut_frac: float = 0.1, ratio: float = 32.0) -> float:
    """ULMFiT eq. 3 for iteration t = ``step`` (0-based) of T = ``total``, as a fraction of eta_max.

        cut = floor(T * cut_frac)
        p   = t / cut                                   if t < cut
              1 - (t - cut) / (cut * (1/cut_frac - 1))  otherwise
        eta_t = eta_max * (1 + p * (ratio - 1)) / ratio
    """
    if not 0.0 < cut_frac < 1.0 or ratio < 1.0:
        raise EmberError(f"STLR needs 0 < cut_frac < 1 and ratio >= 1 (got {cut_frac}, {ratio})")
    cut = max(1, math.floor(total * cut_frac))  # >= 1 so a very short run still has a peak
    if step < cut:
        p = step / cut
    else:
        p = max(0.0, 1.0 - (step - cut) / (cut * (1.0 / cut_frac - 1.0)))
    return (1.0 + p * (ratio - 1.0)) / ratio


def time_lr_factor(elapsed: float, budget: float, warmup_ratio: float) -> float:
    """Multiplier of the peak learning rate after ``elapsed`` of ``budget`` training seconds:
    linear warm-up over the first ``warmup_ratio`` of the budget, then linear decay to 0 at
    the budget (a triangle when warmup_ratio is 0.5)."""
    if budget <= 0:
        raise EmberError("train.schedule=time needs a wall-clock budget: set train.max_time "
                         "(seconds, e.g. --set train.max_time=1200)")
    progress = min(max(elapsed / budget, 0.0), 1.0)
    if progress < warmup_ratio:
        return progress / warmup_ratio
    return (1.0 - progress) / max(1.0 - warmup_ratio, 1e-12)


def lr_factor(step: int, cfg: TrainConfig, elapsed: float = 0.0) -> float:
    """Multiplier of the peak learning rate for the update that ends step ``step`` (0-based),
    ``elapsed`` training seconds into the run (only ``schedule: time`` reads it)."""
    if cfg.schedule == "time":
        return time_lr_factor(elapsed, cfg.max_time, cfg.warmup_ratio)
    if cfg.schedule == "stlr":
        return stlr_factor(step, cfg.max_steps, cfg.stlr_cut_frac, cfg.stlr_ratio)
    warm = warmup_steps(cfg)
    if cfg.schedule == "inverse_sqrt":  # T5: no ramp, the peak until step k, then 1/sqrt(step)
        return math.sqrt(max(warm, 1) / max(step, warm, 1))
    if step < warm:
        return (step + 1) / warm
    if cfg.schedule == "constant":
        return 1.0
    if cfg.schedule == "linear":
        remaining = cfg.max_steps - warm
        return max(0.0, (cfg.max_steps - step) / max(1, remaining))
    raise EmberError(f"train.schedule={cfg.schedule!r}; choose one of {', '.join(SCHEDULES)}")


def set_lr(optimizer: torch.optim.Optimizer, lr: float) -> None:
    """Every group gets ``lr`` times its ``lr_scale`` (1 when it has none)."""
    for group in optimizer.param_groups:
        group["lr"] = lr * group.get("lr_scale", 1.0)
