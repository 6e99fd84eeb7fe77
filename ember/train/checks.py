"""The refusals of a training configuration that need no model and no data.

Every training verb (pretrain, finetune, distil, ELMo features) asks them before it writes its
run folder, so a mistyped setting (``--set train.parallel=zero``, ``--device cuda`` on a
CPU-only torch) costs nothing: no config.yaml left behind that a corrected command would then
refuse to overwrite. The Trainer asks them again, for callers that build it directly.
"""

from __future__ import annotations

import torch

from ember.config import TrainConfig
from ember.errors import EmberError


def check_device(device: str) -> None:
    """A device torch can put tensors on: a clear line instead of torch's CUDA assertion."""
    try:
        dev = torch.device(device)
    except (RuntimeError, ValueError):
        raise EmberError(f"train.device={device!r} is not a device name; write cpu, cuda or cuda:N") from None
    if dev.type != "cuda":
        return
    if not torch.cuda.is_available():
        build = "a CPU-only build" if torch.version.cuda is None else "a CUDA build that finds no GPU"
        raise EmberError(f"train.device={device}, but this torch ({torch.__version__}) is {build}; "
                         "train with --device cpu here (on a GPU machine, install a CUDA build of torch)")
    if dev.index is not None and dev.index >= torch.cuda.device_count():
        raise EmberError(f"train.device={device}, but there are {torch.cuda.device_count()} CUDA devices "
                         f"(cuda:0 to cuda:{torch.cuda.device_count() - 1})")


def refuse_step_budget(overrides, max_steps: int | None, where: str) -> None:
    """Runs counted in epochs (fine-tuning, task distillation) set train.max_steps from the epochs
    (``ember.train.loop.epoch_schedule``); a step budget given too was silently replaced."""
    named = [o for o in overrides if str(o).split("=", 1)[0].strip() == "train.max_steps"]
    if named or max_steps is not None:
        raise EmberError(f"{where} lasts a number of epochs, which set the steps: train.max_steps is not used "
                         "there. Pass fewer epochs (fractions work, e.g. epochs=0.1 / --epochs 0.1), or a time "
                         "budget (train.max_time / --max-time)")


def check_train_settings(cfg: TrainConfig, one_process_verb: str = "") -> None:
    """``one_process_verb``: the verb (finetune, distill, ...) trains in one process only."""
    from ember.train.distributed import one_process
    from ember.train.fsdp import check_parallel
    from ember.train.clock import step_clock
    from ember.train.optim import SCHEDULES, check_optimizer, lr_factor
    from ember.train.precision import check_dtype

    if one_process_verb:
        one_process(one_process_verb)
    check_device(cfg.device)
    check_dtype(cfg.dtype)
    check_parallel(cfg)
    check_optimizer(cfg)
    if cfg.schedule not in SCHEDULES:  # by name: lr_factor(0) answers a warm-up step before reading it, so an
        # unknown schedule passed this check and failed when warm-up ended, mid-run
        raise EmberError(f"train.schedule={cfg.schedule!r}; choose one of {', '.join(SCHEDULES)}")
    lr_factor(0, cfg, 0.0)  # "time" without max_time
    if not 0.0 <= cfg.dropout_off_fraction < 1.0:
        raise EmberError(f"train.dropout_off_fraction={cfg.dropout_off_fraction}: the share of the last steps "
                         "trained without dropout, from 0 (never) to below 1 (BART: 0.1)")
    step_clock(cfg.clock)
    from ember.train.tracking import check_trackers

    check_trackers(cfg.trackers, cfg.wandb_mode)  # an unknown tracker, or mlflow / wandb not installed
