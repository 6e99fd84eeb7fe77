"""Training precision: bf16 autocast where the device multiplies bf16 fast, fp32 elsewhere.

``train.dtype=bfloat16`` runs the forward under ``torch.autocast`` (products in bf16, softmax,
norms and the loss in fp32) and keeps fp32 master weights, gradients and optimizer state
(Micikevicius et al. 2018's mixed precision, with bf16's fp32 exponent range so no loss
scaling is needed; Kalamkar et al. 2019). Whether that is faster depends on the matmul unit:

- CUDA GPUs with bf16 tensor cores (Ampere and later): the usual choice.
- CPUs with Intel AMX (Xeon 4th generation "Sapphire Rapids" and later): oneDNN's AMX kernels
  multiply bf16 ~10x faster than fp32 on one core (measured here: 1,174 vs 108 GFLOP/s for a
  4096 x 256 x 1024 product), and a bert-mini pre-training step runs ~2x faster (BENCHMARKS.md).
- Other CPUs (AMD EPYC, older Xeons): no fast bf16 kernel; bf16 products were ~100x slower than
  fp32 on this project's AMD machines. ``check_speed`` warns there, since the user most
  likely wanted the GPU advice.
"""

from __future__ import annotations

import sys
from contextlib import nullcontext

import torch

from ember.errors import EmberError
from ember.nn.onednn import cpu_has_fast_bf16  # a fact about the CPU's kernels (also serving's)

BF16 = ("bfloat16", "bf16")


def check_dtype(dtype: str) -> None:
    if dtype not in ("float32", "fp32", *BF16):  # float16 is refused by TrainConfig (no loss scaling)
        raise EmberError(f"train.dtype={dtype!r}; choose float32 or bfloat16")


def autocast_context(device: str, dtype: str):
    """The context a training or evaluation forward runs in for ``train.dtype``."""
    check_dtype(dtype)
    if dtype in ("float32", "fp32"):
        return nullcontext()
    return torch.autocast(device_type=device.split(":")[0], dtype=torch.bfloat16)


def check_speed(device: str, dtype: str) -> str | None:
    """A warning when ``dtype`` will be slow on ``device``, or a note when a much faster one is at
    hand (float32 on an AMX CPU); else None. Printed to stderr the first time in a process."""
    if device.split(":")[0] != "cpu":
        return None
    fast_bf16 = cpu_has_fast_bf16()
    if dtype in BF16 and not fast_bf16:
        message = ("warning: train.dtype=bfloat16 on a CPU without AMX: bf16 matrix products have no "
                   "fast kernel here and run far slower than float32 (~100x on AMD EPYC); use "
                   "--dtype float32 on this machine, bfloat16 on a GPU or an AMX Xeon")
    elif dtype not in BF16 and fast_bf16:
        # measured on an AMX Xeon (BENCHMARKS.md): bert-mini 2x, bert-base 2.6-3.2x the fp32 step,
        # and a 10-minute bf16 run reached the fp32 run's final held-out loss in 0.45 of the time
        message = ("note: this CPU has AMX (fast bf16 matrix products): --dtype bfloat16 (pretrain, finetune, "
                   "distill) trains Transformers ~2-3x faster than float32 here, with fp32 master weights, and "
                   "learns alike per step")
    else:
        return None
    if message not in _SAID:  # once per process: `ember glue` or `compare` train many runs in one
        _SAID.add(message)
        print(message, file=sys.stderr)
    return message


_SAID: set[str] = set()
