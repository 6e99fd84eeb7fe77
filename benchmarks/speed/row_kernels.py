"""One-row product kernels: how fast each streams a decoding step's weights from memory.

A decoding step at batch 1 multiplies one row by every weight, so it runs at the rate one core
reads the weights. For each of GPT-2-small's weight shapes this reads ``--layers`` copies of the
weight in 2 MiB pages (``ember.host_memory.huge_page_empty``, as ``ember.nn.onednn.row_copy``
keeps them) one after another, so none is in the caches, and reports GB/s of weight read by:

  mkl_cols       PyTorch's product (MKL) with the (K, N) copy
  mkl_rows       PyTorch's ``mv`` (MKL) over the (N, K) weight: one dot product per output
  openblas_cols  numpy's OpenBLAS on one thread (``ember.host_blas.matmul``), (K, N) copy
  openblas_rows  the same over the (N, K) weight
  sum            a plain reduction over the (K, N) copies: the ceiling of this memory

``ember.nn.onednn.row_product`` picks per weight from this table (BENCHMARKS.md, "OpenBLAS for
the layer products"). One thread, wall clock of a single-threaded loop, median of ``--repeats``.

    python benchmarks/speed/row_kernels.py            # GPT-2-small's shapes, ~1 minute
    python benchmarks/speed/row_kernels.py --smoke    # small shapes, seconds
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # this checkout's ember
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "common"))
from _bench import machine, median  # noqa: E402

from ember import host_blas  # noqa: E402
from ember.host_memory import huge_page_empty  # noqa: E402

# (K inputs, N outputs): GPT-2-small's QKV, attention output, FFN in, FFN out, LM head
SHAPES = ((768, 2304), (768, 768), (768, 3072), (3072, 768), (768, 50257))
SMOKE_SHAPES = ((64, 192), (256, 64))


def kernels(cols: list[torch.Tensor], rows: list[torch.Tensor], x: torch.Tensor) -> dict:
    """name -> a function that multiplies ``x`` by every copy once."""
    column = x.t().contiguous()
    found = {"mkl_cols": lambda: [x @ c for c in cols], "mkl_rows": lambda: [torch.mv(r, x[0]) for r in rows]}
    if host_blas.available():
        found["openblas_cols"] = lambda: [host_blas.matmul(x, c) for c in cols]
        found["openblas_rows"] = lambda: [host_blas.matmul(r, column) for r in rows]
    found["sum"] = lambda: [c.sum() for c in cols]
    return found


def measure(k: int, n: int, layers: int, repeats: int) -> dict:
    cols, rows = [], []
    for _ in range(layers):
        weight = torch.randn(n, k)
        cols.append(huge_page_empty((k, n)).copy_(weight.t()))
        rows.append(huge_page_empty((n, k)).copy_(weight))
    x = torch.randn(1, k)
    result = {"k": k, "n": n, "layers": layers, "gb_per_s": {}}
    for name, run in kernels(cols, rows, x).items():
        run()  # warm-up
        times = []
        for _ in range(repeats):
            start = time.perf_counter()
            run()
            times.append(time.perf_counter() - start)
        result["gb_per_s"][name] = layers * k * n * 4 / median(times) / 1e9
    return result


def main(argv: list[str] | None = None) -> list[dict]:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--layers", type=int, default=12, help="copies of each weight read in turn")
    p.add_argument("--repeats", type=int, default=11)
    p.add_argument("--smoke", action="store_true", help="small shapes, 2 copies (seconds; not a measurement)")
    p.add_argument("--json", help="also write the results here")
    args = p.parse_args(argv)
    torch.set_num_threads(1)
    print(machine())
    results = []
    for k, n in SMOKE_SHAPES if args.smoke else SHAPES:
        layers = 2 if args.smoke or n > 10_000 else args.layers  # the head: 2 copies of 154 MB
        result = measure(k, n, layers, 3 if args.smoke else args.repeats)
        results.append(result)
        print(f"{k:>5} -> {n:<6}", "  ".join(f"{name} {rate:5.1f}" for name, rate in result["gb_per_s"].items()), "GB/s")
    if args.json:
        Path(args.json).write_text(json.dumps(results, indent=1))
    return results


if __name__ == "__main__":
    main()
