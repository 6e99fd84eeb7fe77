"""Peak memory and CPU time of a stack of Longformer layers training on one long input, with the
band's key/value windows rebuilt in the backward (ember's default) against kept from the forward
(`band_attention(..., rebuild_windows=False)`, the layout before): what a user training a long
model (ember convert --long, then ember pretrain --init / finetune) pays per step.

    python benchmarks/speed/long_stack_memory.py                        # 6 layers, H 384 and 768, 4,096 tokens
    python benchmarks/speed/long_stack_memory.py --hidden 384 --layers 12 --length 8192
    python benchmarks/speed/long_stack_memory.py --smoke                # seconds: tiny sizes

Each (mode, width) runs in its own process, one thread: a warm-up step, then one measured step
(forward through the layers with dropout 0.1, window 512, the first token global, then backward).
Its peak is the process's high-water mark over both steps (VmHWM, reset through
/proc/self/clear_refs once the layers are built) above what was resident before them: the memory a
user's run needs. (Measured over the second step alone, above what the first left resident, the
figure would leave out what the allocator kept from the first step and reused.) Its time is the
measured step's CPU time. Linux only (/proc).
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "benchmarks" / "common"))  # the shared helpers
from _bench import load, machine  # noqa: E402

CHILD = """
import functools, json, sys, time, torch
sys.path.insert(0, {root!r})
torch.set_num_threads(1)
import ember.nn.banded as banded
import ember.nn.longformer as longformer
from ember.nn.longformer import LongformerAttention, LongMask
from ember.nn.transformer import TransformerLayer
if not {rebuild}:  # the layout before: the windows kept for the backward
    longformer.band_attention = functools.partial(banded.band_attention, rebuild_windows=False)
hidden, layers, length, window = {hidden}, {layers}, {length}, {window}
torch.manual_seed(0)
stack = torch.nn.ModuleList(TransformerLayer(hidden, {heads}, 4 * hidden, "gelu", 0.1, 0.1, 1e-12,
                                             attention=LongformerAttention(hidden, {heads}, 0.1, window))
                            for _ in range(layers)).train()
x = torch.randn(1, length, hidden, requires_grad=True)
first = torch.zeros(1, length, dtype=torch.bool)
first[:, 0] = True
mask = LongMask.of(None, first, 1, length, x.device)
def step():
    y = x
    for layer in stack:
        y = layer(y, mask)[0]
    y.sum().backward()
def high_water_mb():
    return int(open("/proc/self/status").read().split("VmHWM:")[1].split()[0]) / 1024
open("/proc/self/clear_refs", "w").write("5")
before = high_water_mb()
step()
start = time.process_time()
step()
print(json.dumps({{"peak_mb": high_water_mb() - before, "cpu_s": time.process_time() - start}}))
"""


def measure(rebuild: bool, hidden: int, heads: int, layers: int, length: int, window: int) -> dict:
    code = CHILD.format(root=str(ROOT), rebuild=rebuild, hidden=hidden, heads=heads, layers=layers, length=length,
                        window=window)
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    return json.loads(out.strip().splitlines()[-1])


def main(argv: list[str] | None = None) -> list[dict]:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--hidden", type=int, nargs="+", default=[384, 768], help="widths (MiniLM's 384, BERT-base's 768)")
    p.add_argument("--heads", type=int, default=12)
    p.add_argument("--layers", type=int, default=6)
    p.add_argument("--length", type=int, default=4096)
    p.add_argument("--window", type=int, default=512)
    p.add_argument("--smoke", action="store_true", help="2 layers of 32, 256 tokens, window 32: a check, not a figure")
    p.add_argument("--json", help="write the rows here")
    args = p.parse_args(argv)
    if args.smoke:
        args.hidden, args.heads, args.layers, args.length, args.window = [32], 2, 2, 256, 32
    import torch

    torch.set_num_threads(1)  # as the measured processes (machine() reports this process's threads)
    print(f"{machine()}; {load()}; {args.layers} Longformer layers training {args.length:,} tokens, window "
          f"{args.window}, dropout 0.1, one thread\n")
    print("| width | windows kept: peak MB / CPU s | windows rebuilt: peak MB / CPU s | memory | time |")
    print("|---|---:|---:|---:|---:|")
    rows = []
    for hidden in args.hidden:
        kept, rebuilt = (measure(r, hidden, args.heads, args.layers, args.length, args.window) for r in (False, True))
        rows.append({"hidden": hidden, "kept": kept, "rebuilt": rebuilt})
        print(f"| H = {hidden} | {kept['peak_mb']:,.0f} / {kept['cpu_s']:.2f} | {rebuilt['peak_mb']:,.0f} / "
              f"{rebuilt['cpu_s']:.2f} | {rebuilt['peak_mb'] / kept['peak_mb'] - 1:+.0%} | "
              f"{kept['cpu_s'] / rebuilt['cpu_s']:.2f}x |", flush=True)
    if args.json:
        Path(args.json).write_text(json.dumps(rows, indent=2))
    return rows


if __name__ == "__main__":
    main()
