"""The global batch across ranks: how it is cut into micro-batches, and the learning rate
that goes with a larger one.

Layout. ``train.batch_size`` is the global batch B (sequences per optimizer step, over all
ranks and accumulation steps). With ``train.micro_batch_size`` m set, each of the W ranks
accumulates A = B / (m W) micro-batches of m sequences, so the B/m micro-batches of a step
are the same on 1 rank or 8 - and since the trainer keys every random draw by (seed, step,
global micro-batch), so are the losses: a run may resume on another number of ranks and
continue the same curve. Without it the per-rank accumulation ``train.grad_accum`` is kept
and the micro-batch is B / (A W).

Learning rate for a grown batch (docs/distributed.md): with ``train.lr_scaling`` and
``train.lr_base_batch`` B0, the peak rate is lr x B/B0 ("linear": Goyal et al. 2017, §2.1,
for SGD, with a gradual warm-up) or lr x sqrt(B/B0) ("sqrt": Krizhevsky 2014; Hoffer et al.
2017; what You et al. 2019, §5, use for LAMB, with a warm-up over a fixed share of training).
"""

from __future__ import annotations

import dataclasses
import math

from ember.config import TrainConfig
from ember.errors import EmberError

LR_SCALING = ("none", "linear", "sqrt")


def world_layout(cfg: TrainConfig, world_size: int) -> TrainConfig:
    """``cfg`` with ``grad_accum`` for ``world_size`` ranks (from ``micro_batch_size`` when set);
    an EmberError when the global batch cannot be cut evenly."""
    if cfg.micro_batch_size < 0 or cfg.grad_accum < 1:
        raise EmberError(f"train.micro_batch_size={cfg.micro_batch_size} must be >= 0 and train.grad_accum="
                         f"{cfg.grad_accum} >= 1")
    if not cfg.micro_batch_size:
        per_step = cfg.grad_accum * world_size
        if cfg.batch_size % per_step:
            raise EmberError(
                f"train.batch_size={cfg.batch_size} must be divisible by grad_accum x world size "
                f"= {cfg.grad_accum} x {world_size}; change the batch, train.grad_accum or the number of "
                "ranks (or set train.micro_batch_size and let ember derive grad_accum)")
        return cfg
    per_forward = cfg.micro_batch_size * world_size
    if cfg.batch_size % per_forward:
        raise EmberError(
            f"train.batch_size={cfg.batch_size} is not a multiple of micro_batch_size x world size = "
            f"{cfg.micro_batch_size} x {world_size}: the global batch cannot be split evenly over "
            f"{world_size} rank(s). Use a world size that divides {cfg.batch_size // cfg.micro_batch_size} "
            "(the micro-batches per step), or change train.batch_size / train.micro_batch_size")
    return dataclasses.replace(cfg, grad_accum=cfg.batch_size // per_forward)


def chose_no_layout(cfg: TrainConfig) -> bool:
    """Whether the user left the micro-batch layout to ember (neither train.micro_batch_size nor
    train.grad_accum set)."""
    return not cfg.micro_batch_size and cfg.grad_accum == 1


def cpu_micro_batches(cfg: TrainConfig, world_size: int, longest: int) -> TrainConfig:
    """``cfg`` with ``micro_batch_size`` set so that no forward pass on a CPU holds more than
    ``train.micro_batch_tokens`` tokens (sequences x ``longest``, the longest example), when the
    user chose no layout (``micro_batch_size`` 0, ``grad_accum`` 1). The caller passes
    ``longest`` 0 where the cut would change the loss: only a loss that is one term per example
    has, averaged over equal micro-batches, the whole batch's gradient. Activation memory grows
    with the tokens of a forward pass while a CPU's products run as fast on 12 windows of 384 as
    on 48 (BENCHMARKS.md), so the cut costs no speed."""
    budget = cfg.micro_batch_tokens
    if budget < 0:
        raise EmberError(f"train.micro_batch_tokens={budget} must be >= 0 (0 turns CPU micro-batches off)")
    if (budget == 0 or longest <= 0 or not chose_no_layout(cfg) or not cfg.device.startswith("cpu")
            or cfg.batch_size % world_size):
        return cfg
    per_rank = cfg.batch_size // world_size
    if per_rank * longest <= budget:
        return cfg
    fitting = [m for m in range(1, per_rank + 1) if per_rank % m == 0 and m * longest <= budget]
    return dataclasses.replace(cfg, micro_batch_size=max(fitting, default=1))


def lr_scale(cfg: TrainConfig) -> float:
    """The factor ``train.lr_scaling`` applies to the peak learning rate (1 when off)."""
    if cfg.lr_scaling not in LR_SCALING:
        raise EmberError(f"train.lr_scaling={cfg.lr_scaling!r}; choose one of {', '.join(LR_SCALING)}")
    if cfg.lr_scaling == "none":
        return 1.0
    if cfg.lr_base_batch <= 0:
        raise EmberError(f"train.lr_scaling={cfg.lr_scaling} needs train.lr_base_batch: the batch size "
                         "train.lr was tuned for (e.g. 256 for BERT's lr 1e-4)")
    ratio = cfg.batch_size / cfg.lr_base_batch
    return ratio if cfg.lr_scaling == "linear" else math.sqrt(ratio)


def effective_config(cfg: TrainConfig, world_size: int) -> TrainConfig:
    """What the trainer runs with: the micro-batch layout for ``world_size`` ranks and the
    scaled learning rate. config.yaml keeps the settings as given."""
    cfg = world_layout(cfg, world_size)
    scale = lr_scale(cfg)
    return dataclasses.replace(cfg, lr=cfg.lr * scale) if scale != 1.0 else cfg
