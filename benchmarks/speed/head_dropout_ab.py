"""The fused MLM head and the CPU dropout of this checkout against those of another checkout,
alternated in one process (for a change whose effect is smaller than the machine's drift
between whole-step benchmark runs).

    git worktree add /tmp/old de2d970
    PYTHONPATH=. OMP_NUM_THREADS=1 python benchmarks/speed/head_dropout_ab.py --against /tmp/old

The other checkout's ``ember/nn/linear_cross_entropy.py`` and ``ember/nn/dropout.py`` are loaded
as separate modules beside this one's. Timed, one thread, CPU seconds, the two versions in turn
(who goes first alternates), medians over --repeats:
  head        bert-mini's MLM head and loss, forward + backward: 608 masked rows x 256 -> 30,522
              words (logits at realistic scales: N(0, 1) inputs at K = 256 push exp() into
              denormals, which would time the CPU's denormal assists instead)
  head-bf16   the same under CPU bf16 autocast
  dropout     bert-mini's 13 dropouts of a step, forward + backward (9 x 32x128x256 hidden
              states, 4 x 32x4x128x128 attention probabilities), p = 0.1
  dropout-bf16  the same on bf16 tensors (what they are under CPU bf16 autocast)
"""

from __future__ import annotations

import argparse
import importlib.util
import statistics
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "common"))  # the shared helpers
from _bench import run_cli  # noqa: E402

from ember.errors import EmberError  # noqa: E402
from ember.nn import dropout as this_dropout  # noqa: E402
from ember.nn import linear_cross_entropy as this_head  # noqa: E402
from ember.host_memory import keep_freed_host_memory  # noqa: E402


def load_module(name: str, path: Path):
    if not path.is_file():
        raise EmberError(f"{path} not found: --against must be an ember checkout")
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def head_work(module, rows: int, vocab: int, autocast: bool):
    torch.manual_seed(0)
    x = (0.5 * torch.randn(rows, 256)).requires_grad_()
    w = (0.1 * torch.randn(vocab, 256)).requires_grad_()
    b = torch.zeros(vocab).requires_grad_()
    targets = torch.randint(0, vocab, (rows,))

    def run():
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=autocast):
            loss, _ = module.linear_cross_entropy(x, w, b, targets)
        loss.backward()
    return run


def dropout_work(module, batch: int, dtype: torch.dtype = torch.float32):
    shapes = [(batch, 128, 256)] * 9 + [(batch, 4, 128, 128)] * 4
    inputs = [torch.randn(s, dtype=dtype, requires_grad=True) for s in shapes]

    def run():
        for x in inputs:
            module.dropout(x, 0.1).sum().backward()
    return run


def alternate(old, new, repeats: int) -> dict:
    for _ in range(2):
        old(), new()
    pairs = []
    for i in range(repeats):
        order = (old, new) if i % 2 == 0 else (new, old)
        took = {}
        for fn in order:
            start = time.process_time()
            fn()
            took[fn] = time.process_time() - start
        pairs.append((took[old], took[new]))
    return {"before_ms": 1e3 * statistics.median(a for a, _ in pairs),
            "after_ms": 1e3 * statistics.median(b for _, b in pairs),
            "speedup": statistics.median(a / b for a, b in pairs)}


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--against", type=Path, required=True, help="the other ember checkout (the 'before')")
    parser.add_argument("--repeats", type=int, default=40)
    parser.add_argument("--smoke", action="store_true", help="tiny shapes, a few repeats (CI)")
    args = parser.parse_args(argv)
    torch.set_num_threads(1)
    keep_freed_host_memory()
    old_head = load_module("before_linear_cross_entropy", args.against / "ember/nn/linear_cross_entropy.py")
    old_dropout = load_module("before_dropout", args.against / "ember/nn/dropout.py")
    rows, vocab, batch = (16, 500, 1) if args.smoke else (608, 30522, 32)
    repeats = 3 if args.smoke else args.repeats
    work = {"head": lambda m: head_work(m, rows, vocab, False), "head-bf16": lambda m: head_work(m, rows, vocab, True)}
    result = {name: alternate(make(old_head), make(this_head), repeats) for name, make in work.items()}
    result["dropout"] = alternate(dropout_work(old_dropout, batch), dropout_work(this_dropout, batch), repeats)
    bf16 = torch.bfloat16  # the activations' dtype under CPU bf16 autocast
    result["dropout-bf16"] = alternate(dropout_work(old_dropout, batch, bf16), dropout_work(this_dropout, batch, bf16),
                                       repeats)
    for name, r in result.items():
        print(f"{name:12s} before {r['before_ms']:8.1f} ms  after {r['after_ms']:8.1f} ms  {r['speedup']:.2f}x")
    return result


if __name__ == "__main__":
    run_cli(main)
