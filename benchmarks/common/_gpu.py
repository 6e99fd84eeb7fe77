"""The CUDA side of the throughput benchmarks: model FLOP utilisation (MFU) in bf16.

On a GPU the levers differ from the CPU's: bf16 autocast (tensor cores), SDPA's flash or
memory-efficient kernels, AdamW(fused=True), torch.compile. A benchmark builds its steps with
those and hands them here; utilisation is useful FLOP/s over the measured bf16 matmul peak of
the same device (a large square product, so the peak is what the tensor cores really give on
this card, not the datasheet's). Without a GPU every function here is skipped and the reason
is printed and recorded, so a CPU report says why it has no CUDA rows.

GPU timing needs ``torch.cuda.synchronize()`` around the timed region: kernels are queued
asynchronously, so a host clock read without it measures only the launch.
"""

from __future__ import annotations

import time
from typing import Callable

import torch


def cuda_skip_reason() -> str | None:
    """Why the CUDA section cannot run here (None when it can)."""
    if torch.version.cuda is None:
        return f"no CUDA device: this torch ({torch.__version__}) is a CPU build"
    if not torch.cuda.is_available():
        return "no CUDA device: torch.cuda.is_available() is False"
    if not torch.cuda.is_bf16_supported():
        return f"{torch.cuda.get_device_name()} has no bf16 support"
    return None


def device_name() -> str:
    props = torch.cuda.get_device_properties(0)
    return f"{props.name}, {props.total_memory / 2**30:.0f} GiB, torch {torch.__version__} (CUDA {torch.version.cuda})"


def bf16_matmul_peak(n: int = 8192, repeats: int = 10) -> float:
    """bf16 FLOP/s of an n x n x n product on the current GPU (best of ``repeats``)."""
    a = torch.randn(n, n, device="cuda", dtype=torch.bfloat16)
    b = torch.randn(n, n, device="cuda", dtype=torch.bfloat16)
    torch.mm(a, b)  # warm-up (cuBLAS heuristics, clocks)
    best = 0.0
    for _ in range(repeats):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        torch.mm(a, b)
        end.record()
        torch.cuda.synchronize()
        best = max(best, 2 * n ** 3 / (start.elapsed_time(end) / 1000))
    return best


def cuda_rate(step: Callable[[dict], object], batch: dict, steps: int) -> float:
    """Tokens/s of ``steps`` training steps on the GPU (synchronized before and after)."""
    torch.cuda.synchronize()
    start = time.perf_counter()
    for _ in range(steps):
        step(batch)
    torch.cuda.synchronize()
    return batch["input_ids"].numel() * steps / (time.perf_counter() - start)


def to_cuda(batch: dict) -> dict:
    return {k: v.to("cuda", non_blocking=True) for k, v in batch.items()}


def bf16_step(step: Callable[[dict], object], device: str = "cuda") -> Callable[[dict], object]:
    """``step`` under bf16 autocast (weights and optimizer state stay fp32, as ember's trainer does)."""
    def run(batch):
        with torch.autocast(device, dtype=torch.bfloat16):
            return step(batch)
    return run


def attention_kernel(q_shape: tuple[int, int, int, int]) -> str:
    """Which SDPA kernel torch picks for bf16 self-attention of this shape without a mask."""
    from torch.nn.attention import SDPBackend, sdpa_kernel

    q = torch.randn(*q_shape, device="cuda", dtype=torch.bfloat16)
    for backend, name in ((SDPBackend.FLASH_ATTENTION, "flash"), (SDPBackend.EFFICIENT_ATTENTION, "memory-efficient")):
        try:
            with sdpa_kernel(backend):
                torch.nn.functional.scaled_dot_product_attention(q, q, q)
            return name
        except RuntimeError:
            continue
    return "math"


def report(name: str, rates: dict[str, list[float]], flops_per_token: float, peak: float) -> dict:
    """Medians, MFU and the ratio of each contender to the first one named ``reference*``."""
    from _bench import median

    result = {"preset": name, "device": device_name(), "bf16_peak_tflops": peak / 1e12,
              "tokens_per_s": {}, "mfu": {}}
    for contender, values in rates.items():
        rate = median(values)
        result["tokens_per_s"][contender] = rate
        result["mfu"][contender] = rate * flops_per_token / peak
    refs = [c for c in rates if c.startswith("reference")]
    if refs:
        base = result["tokens_per_s"][refs[0]]
        result["ratio"] = {c: r / base for c, r in result["tokens_per_s"].items() if c != refs[0]}
    print(f"\n{name} on {result['device']} (bf16 matmul peak {peak / 1e12:.0f} TFLOP/s)")
    for contender, rate in result["tokens_per_s"].items():
        print(f"  {contender:24s} {rate:12,.0f} tokens/s  MFU {100 * result['mfu'][contender]:5.1f}%")
    return result
