"""Helpers shared by the benchmark scripts: alternating timed repetitions, medians, a
measured fp32 matmul peak and a one-line description of the machine and its load.

Why alternate: the machine is shared, so its speed drifts over minutes. Running ember and
the reference in turn, in one process, exposes both to the same drift; the ratio of the
medians is then meaningful even when the absolute numbers are not.
"""

from __future__ import annotations

import os
import platform
import statistics
import time
from typing import Callable

import torch


_CLOCK = {"fn": time.perf_counter, "name": "wall"}


def use_cpu_time() -> None:
    """Time with the main thread's CPU seconds, on one intra-op thread.

    On a busy shared machine wall time mostly measures the scheduler; the CPU time of a
    single-threaded run measures the work itself (what a quiet single core would take).
    """
    torch.set_num_threads(1)
    _CLOCK.update(fn=time.thread_time, name="cpu (1 thread)")


def add_common_args(parser, smoke_help: str) -> None:
    """--threads, --cpu-time, --json and --smoke, shared by the timing benchmarks."""
    parser.add_argument("--threads", type=int, default=0, help="torch threads (0: default)")
    parser.add_argument("--cpu-time", action="store_true",
                        help="one thread, timed in CPU seconds (robust on a busy shared machine)")
    parser.add_argument("--json", help="also write the results here")
    parser.add_argument("--smoke", action="store_true", help=smoke_help)


def apply_common_args(args) -> None:
    """Set threads and the clock as asked, and print the machine line every report starts with."""
    if args.threads:
        torch.set_num_threads(args.threads)
    if args.cpu_time:
        use_cpu_time()
    print(f"{machine()}; clock: {clock_name()}")


def clock() -> float:
    return _CLOCK["fn"]()


def clock_name() -> str:
    return _CLOCK["name"]


def machine() -> str:
    model = platform.processor() or "unknown CPU"
    try:
        for line in open("/proc/cpuinfo", encoding="utf-8"):
            if line.startswith("model name"):
                model = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    return f"{model}, {os.cpu_count()} cores, torch {torch.__version__}, {torch.get_num_threads()} threads"


SMOKE_NOTE = ["", "(smoke run: a random small model; these are not measurements)"]  # under a smoke run's table


def pyplot():
    """matplotlib's pyplot drawing to files (the Agg backend), or None where matplotlib is missing."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return None
    return plt


def load() -> str:
    """The 1/5/15-minute load averages: other work on the machine skews absolute numbers."""
    try:
        return "load %.2f %.2f %.2f" % os.getloadavg()
    except OSError:
        return "load unknown"


def matmul_peak(n: int = 1024, seconds: float = 0.3, dtype: torch.dtype = torch.float32) -> float:
    """fp32 (or ``dtype``) matmul FLOP/s of an n x n x n product, best of repeated runs over
    ``seconds`` (of the benchmark's clock: with ``use_cpu_time`` this is the one-core peak),
    through the faster of torch's default kernel (MKL) and oneDNN's (which ember's Linear layers
    may use; for bf16 torch's own mm already goes to oneDNN, AMX where the CPU has it)."""
    a, b = torch.randn(n, n, dtype=dtype), torch.randn(n, n, dtype=dtype)
    kernels = [lambda: torch.mm(a, b)]
    onednn_linear = getattr(getattr(torch.ops, "mkldnn", None), "_linear_pointwise", None)
    if onednn_linear is not None and dtype == torch.float32:
        kernels.append(lambda: onednn_linear(a, b, None, "none", [], ""))
    best = 0.0
    for kernel in kernels:
        kernel()  # warm-up
        end = clock() + seconds
        while True:
            start = clock()
            kernel()
            best = max(best, 2 * n ** 3 / max(clock() - start, 1e-9))
            if clock() > end:
                break
    return best


def alternate(contenders: dict[str, Callable[[], float]], repeats: int,
              between: Callable[[], None] | None = None, progress: bool = True) -> dict[str, list[float]]:
    """Call each contender once per repetition, in turn; each returns a rate (higher = better).

    The order within a repetition rotates, so no contender always runs first (a cold cache
    or a neighbour's burst would otherwise favour one side).
    """
    names = list(contenders)
    rates: dict[str, list[float]] = {n: [] for n in names}
    for r in range(repeats):
        if between is not None:
            between()
        order = names[r % len(names):] + names[:r % len(names)]
        for name in order:
            rates[name].append(contenders[name]())
        if progress:
            print(f"  rep {r + 1}/{repeats}: " + ", ".join(f"{n} {_fmt(rates[n][-1])}" for n in names),
                  flush=True)
    return rates


def _fmt(value: float) -> str:
    return f"{value:,.0f}" if value >= 100 else f"{value:.3g}"


def median(values: list[float]) -> float:
    return statistics.median(values) if values else float("nan")


def sst2_dev_halves(out, limit: int = 0) -> tuple:
    """SST-2's labelled dev set split in two by a hash of each sentence: a selection half (best
    epoch, early stopping) and a held-out half scored once at the end. SST-2's test labels are
    not public, and picking the best epoch on the set that is reported would flatter it.
    Written to OUT/data/sst2-dev-select.tsv and sst2-dev-test.tsv (first ``limit`` rows of each)."""
    import hashlib
    from pathlib import Path

    from ember.fileio import atomic_write_text
    from ember.paths import data_root

    source = data_root() / "glue" / "SST-2" / "dev.tsv"
    header, *rows = source.read_text(encoding="utf-8").splitlines()
    halves: tuple[list, list] = ([], [])
    for row in rows:
        halves[hashlib.sha1(row.split("\t")[0].encode()).digest()[0] % 2].append(row)
    paths = (Path(out) / "data" / "sst2-dev-select.tsv", Path(out) / "data" / "sst2-dev-test.tsv")
    for path, half in zip(paths, halves):
        atomic_write_text(path, "\n".join([header] + (half[:limit] if limit else half)) + "\n")
    return paths


def run_cli(main: Callable[[], object]) -> None:
    """A benchmark's ``__main__``: run ``main``; ember's own errors end it with one line, not a traceback."""
    import sys

    from ember.errors import EmberError

    try:
        main()
    except EmberError as exc:
        sys.exit(f"error: {exc}")
