"""Where a pre-training step's time goes: a torch.profiler table by kind of work, for ember's
step and for transformers with logits only at the masked rows (see pretrain_throughput.py).

    PYTHONPATH=. OMP_NUM_THREADS=1 .venv/bin/python benchmarks/speed/pretrain_profile.py \
        --preset bert-mini [--steps 3] [--bf16] [--json out.json]

Each operator's self time (one thread; the profiler's clock is wall time, so on a loaded
machine the shares mean more than the milliseconds) is put in one bucket by its name: matmuls
(Linear layers, forward and backward, any kernel), attention (SDPA, or the batched products
and softmax of attention with dropout, and their backward), norms
(LayerNorm), dropout (mask drawing and applying), activation (GELU), embedding gradient,
head and loss (log-softmax, NLL; ember's fused softmax cross-entropy), optimizer (AdamW's
foreach ops, gradient clipping), dtype conversions (the copies inside `.to(dtype)`: autocast's
fp32 <-> bf16 casts of weights and activations with --bf16, dropout's masks) and the rest
(element-wise adds, layout copies, views). The batch is
built before timing (data: 0 here; what `ember pretrain`'s data side costs is in
prepare_throughput.py). Freed memory is kept for reuse as in `ember pretrain` (--system-malloc: not).
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import torch
from torch import nn
from torch.profiler import ProfilerActivity, profile, record_function

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "common"))  # the shared helpers
from _gpu import bf16_step  # noqa: E402
from pretrain_throughput import ember_step, make_batch, reference_step  # noqa: E402

from ember.config import TrainConfig, model_preset  # noqa: E402
from ember.nn.linear_cross_entropy import PROFILER_RANGE  # noqa: E402
from ember.host_memory import keep_freed_host_memory  # noqa: E402

WARMUP_STEPS = 6
OPTIMIZER_RANGES = ("Optimizer.",)  # torch's own range around optimizer.step, and ours around clipping
# first matching pattern wins; an operator name contains the pattern
BUCKETS = (
    ("optimizer", ("_foreach", "adam", "clip_grad", "linalg_vector_norm", "zero_")),
    ("head and loss", ("log_softmax", "nll_loss", "cross_entropy")),
    # batched products only come from attention (scores and context, with dropout in training)
    ("attention", ("scaled_dot_product", "flash_attention", "_efficient_attention", "softmax", "bmm")),
    ("matmuls", ("linear", "addmm", "::mm", "matmul", "mkldnn", "onednnlinear")),
    ("norms", ("layer_norm",)),
    ("activation", ("gelu",)),  # before dropout: "aten::gelu" contains "::ge"
    ("dropout", ("dropout", "bernoulli", "random_", "bitwise_and", "::ge")),
    ("embedding gradient", ("embedding", "index_add", "index_put", "scatter_add")),
)


CASTS = "dtype conversions"


def bucket(name: str) -> str:
    low = name.lower()
    for label, patterns in BUCKETS:
        if any(p in low for p in patterns):
            return label
    return "other (element-wise, copies)"


def _under(event, ranges: tuple[str, ...]) -> bool:
    while event is not None:
        if event.name.startswith(ranges):
            return True
        event = event.cpu_parent
    return False


def _clip_in_a_range(clip):
    def clip_grad_norm_(*args, **kwargs):
        with record_function("Optimizer.clip_grad_norm_"):
            return clip(*args, **kwargs)
    return clip_grad_norm_


def profile_step(step, batch: dict, steps: int) -> dict[str, float]:
    """Self CPU seconds per bucket, summed over ``steps`` steps. Everything inside AdamW's step
    and the gradient clipping is the optimizer's (torch's CPU foreach ops run per tensor and
    show up as plain lerp_/sqrt/addcdiv_ calls)."""
    for _ in range(WARMUP_STEPS):  # outside the profile; malloc's heap settles over the first steps
        step(batch)
    clip = nn.utils.clip_grad_norm_
    nn.utils.clip_grad_norm_ = _clip_in_a_range(clip)
    try:
        with profile(activities=[ProfilerActivity.CPU]) as prof:
            for _ in range(steps):
                step(batch)
    finally:
        nn.utils.clip_grad_norm_ = clip
    totals: dict[str, float] = {}
    for event in prof.events():
        if _under(event, OPTIMIZER_RANGES):
            key = "optimizer"
        elif _under(event, (PROFILER_RANGE,)):  # ember's fused softmax and loss (ember.nn.linear_cross_entropy)
            key = "head and loss"
        elif "aten::_to_copy" in (event.name, getattr(event.cpu_parent, "name", None)):
            key = CASTS  # a .to(dtype) and the copy inside it: autocast's fp32 <-> bf16 casts, dropout's masks
        else:
            key = bucket(event.name)
        totals[key] = totals.get(key, 0.0) + event.self_cpu_time_total / 1e6
    return totals


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--preset", default="bert-mini")
    parser.add_argument("--batch", type=int, default=32)
    parser.add_argument("--length", type=int, default=128)
    parser.add_argument("--steps", type=int, default=3)
    parser.add_argument("--json")
    parser.add_argument("--system-malloc", action="store_true",
                        help="glibc's default malloc instead of keeping freed memory (see pretrain_throughput.py)")
    parser.add_argument("--bf16", action="store_true",
                        help="both sides under CPU bf16 autocast (what --dtype bfloat16 trains with; fast with AMX); "
                             "casts between fp32 and bf16 get their own bucket")
    args = parser.parse_args(argv)
    torch.set_num_threads(1)
    if not args.system_malloc:
        keep_freed_host_memory()
    cfg = model_preset(args.preset)
    batch = make_batch(cfg, args.batch, args.length, 0.15)
    sides = {"ember": ember_step(cfg, "ember", TrainConfig()),
             "transformers (masked rows)": reference_step(cfg, masked_rows=True)}
    if args.bf16:
        sides = {name: bf16_step(step, "cpu") for name, step in sides.items()}
    table = {name: profile_step(step, batch, args.steps) for name, step in sides.items()}
    labels = [b for b, _ in BUCKETS] + [CASTS, "other (element-wise, copies)"]
    names = list(table)
    precision = "bf16 autocast" if args.bf16 else "fp32"
    print(f"{args.preset}, {args.batch}x{args.length}, {precision}, self CPU ms per step (share), 1 thread")
    print(f"{'':30s}" + "".join(f"{n:>30s}" for n in names))
    for label in labels + ["total"]:
        cells = []
        for n in names:
            total = sum(table[n].values())
            value = total if label == "total" else table[n].get(label, 0.0)
            cells.append(f"{1000 * value / args.steps:14.1f} ms ({100 * value / total:4.1f}%)")
        print(f"{label:30s}" + "".join(f"{c:>30s}" for c in cells))
    if args.json:
        Path(args.json).write_text(json.dumps(table, indent=2))
    return table


if __name__ == "__main__":
    main()
