"""Cost of one encoder layer on long inputs: full attention vs ember's Longformer attention vs
transformers' LongformerLayer (the same weights, equal outputs checked first), forward and
forward + backward, time and peak memory, from 512 to 16,384 tokens.

    python benchmarks/speed/long_attention.py --out runs/bench-long     # ~15 min on 2 busy cores
    python benchmarks/speed/long_attention.py --smoke --out /tmp/long   # seconds: tiny sizes

Self-contained (it imports ember and transformers only). Each (implementation, length, pass) runs
in its own subprocess; its peak memory is the process's high-water mark (VmHWM, reset just
before the call through /proc/self/clear_refs) minus its resident memory before the call: what
the call itself needed, weights and input excluded. Time is
the median of ``--reps`` calls after the measured one, in CPU seconds of one thread
(time.thread_time with torch.set_num_threads(1)): on a shared machine wall time mostly measures
the scheduler. Full attention is SDPA (what ember runs in eval mode and without dropout); it is
skipped where its (T, T) scores in fp32 would pass ``--full-limit-gb`` (training with dropout on
CPU forms them). Longformer: window ``--window`` (w/2 tokens each side, Beltagy et al. 2020),
the first token global ([CLS], as for classification). Reformer (``--impls ember-reformer``):
shared-QK LSH attention, ``--hashes`` rounds over chunks of ``--chunk`` tokens (Kitaev et al.
2020), about 2 T / chunk buckets; one ordinary (not reversible) layer, like the others.

Writes RESULTS.json, a markdown table (table.md) and long_attention.png (time and memory vs
length, log-log) into --out, and prints the table with the CPU model and load.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import subprocess
import sys
import time
from pathlib import Path

IMPLS = ("full", "ember-longformer", "hf-longformer")
# --impls: BigBird (blocks of 64, 3 random), Performer (256 features), Reformer (LSH: --chunk, --hashes,
# about 2 T / chunk buckets)
EXTRA = ("ember-bigbird", "ember-performer", "ember-reformer")
PASSES = ("fwd", "fwd+bwd", "train")


def build(impl: str, hidden: int, heads: int, window: int, seed: int = 0, dropout: float = 0.0, chunk: int = 64,
          hashes: int = 2):
    """(layer, call(x) -> (B, T, H)) for one implementation, all with the same weights; ``dropout``
    on the attention probabilities and the sub-layer outputs (BERT's 0.1 when training)."""
    import torch

    from ember.nn.bigbird import BigBirdAttention
    from ember.nn.longformer import LongformerAttention, LongMask
    from ember.nn.lsh import LSHAttention
    from ember.nn.performer import PerformerAttention
    from ember.nn.transformer import TransformerLayer

    torch.manual_seed(seed)
    attention = {"full": lambda: None, "ember-bigbird": lambda: BigBirdAttention(hidden, heads, dropout, 64, 3),
                 "ember-performer": lambda: PerformerAttention(hidden, heads, dropout, 256),
                 "ember-reformer": lambda: LSHAttention(hidden, heads, dropout, 0, hashes, chunk)}.get(
        impl, lambda: LongformerAttention(hidden, heads, dropout, window))()
    layer = TransformerLayer(hidden, heads, 4 * hidden, "gelu", dropout, dropout, 1e-12, attention=attention)
    with torch.no_grad():
        for p in layer.parameters():
            p.normal_(0, 0.02)
    if impl == "full":
        return layer, lambda x: layer(x)[0]
    if impl in EXTRA:
        return layer, lambda x: layer(x, LongMask.of(None, None, x.shape[0], x.shape[1], x.device))[0]
    if impl == "ember-longformer":
        def run(x):
            glob = torch.zeros(x.shape[:2], dtype=torch.bool)
            glob[:, 0] = True
            return layer(x, LongMask.of(None, glob, x.shape[0], x.shape[1], x.device))[0]
        return layer, run
    return hf_layer(layer, hidden, heads, window, dropout)


def hf_layer(ours, hidden: int, heads: int, window: int, dropout: float = 0.0):
    """transformers' LongformerLayer with ``ours``' weights, called as LongformerModel calls it
    (input padded to a multiple of the window, the 0 / -inf / +inf mask, first token global)."""
    import torch
    import transformers
    from transformers.models.longformer.modeling_longformer import LongformerLayer

    cfg = transformers.LongformerConfig(hidden_size=hidden, num_attention_heads=heads, intermediate_size=4 * hidden,
                                        attention_window=[window], num_hidden_layers=1, hidden_dropout_prob=dropout,
                                        attention_probs_dropout_prob=dropout, layer_norm_eps=1e-12)
    layer = LongformerLayer(cfg, 0)
    att = ours.attention
    wq, wk, wv = att.qkv.weight.chunk(3)
    bq, bk, bv = att.qkv.bias.chunk(3)
    own = layer.attention.self
    with torch.no_grad():
        for lin, w, b in ((own.query, wq, bq), (own.key, wk, bk), (own.value, wv, bv)):
            lin.weight.copy_(w)
            lin.bias.copy_(b)
        for name in ("query_global", "key_global", "value_global"):
            getattr(own, name).load_state_dict(getattr(att, name).state_dict())
        layer.attention.output.dense.load_state_dict(att.out.state_dict())
        layer.attention.output.LayerNorm.load_state_dict(ours.attention_norm.state_dict())
        layer.intermediate.dense.load_state_dict(ours.ffn.up.state_dict())
        layer.output.dense.load_state_dict(ours.ffn.down.state_dict())
        layer.output.LayerNorm.load_state_dict(ours.ffn_norm.state_dict())

    def run(x):
        b, t, h = x.shape
        pad = (window - t % window) % window
        xp = torch.nn.functional.pad(x, (0, 0, 0, pad))
        mask = torch.zeros(b, t + pad)
        mask[:, t:] = torch.finfo(x.dtype).min
        mask[:, 0] = torch.finfo(x.dtype).max
        out = layer(xp, attention_mask=mask, is_index_masked=mask < 0, is_index_global_attn=mask > 0,
                    is_global_attn=True)[0]
        return out[:, :t]
    return layer, run


def measure(impl: str, length: int, kind: str, args) -> dict:
    """One subprocess's work: peak memory of the first call, then the median CPU time. ``kind``:
    "fwd" (inference), "fwd+bwd" (no dropout: SDPA's fused kernel for full attention) or "train"
    (fwd+bwd with dropout 0.1, BERT's training setting: on CPU ember's full attention then forms
    the (T, T) probabilities to drop from, as transformers' does)."""
    import torch

    torch.set_num_threads(1)
    backward = kind != "fwd"
    layer, run = build(impl, args.hidden, args.heads, args.window, dropout=0.1 if kind == "train" else 0.0,
                       chunk=args.chunk, hashes=args.hashes)
    x = torch.randn(1, length, args.hidden, requires_grad=backward)

    def call():
        if backward:
            out = run(x)
            out.pow(2).mean().backward()
            x.grad = None
            layer.zero_grad(set_to_none=True)
        else:
            with torch.no_grad():
                run(x)

    before = reset_peak()
    call()
    peak_mb = (status_kb("VmHWM") - before) / 1024
    times = []
    for _ in range(args.reps):
        t0 = time.thread_time()
        call()
        times.append(time.thread_time() - t0)
    return {"impl": impl, "length": length, "pass": kind,
            "seconds": statistics.median(times), "peak_mb": peak_mb}


def status_kb(field: str) -> int:
    """A /proc/self/status memory field (kB): VmRSS now, VmHWM the peak since the last reset."""
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1])
    raise SystemExit(f"/proc/self/status has no {field}: this benchmark measures memory on Linux")


def reset_peak() -> int:
    """Reset the process's peak RSS to its current RSS (Linux: clear_refs 5) and return that."""
    Path("/proc/self/clear_refs").write_text("5")
    return status_kb("VmRSS")


def check_equal_outputs(args) -> float:
    """Max |difference| of the three layers' outputs on one input (ember's Longformer vs
    transformers'; full attention vs ember's Longformer with a window covering the input)."""
    import torch

    t = min(1024, 2 * args.window + 37)
    x = torch.randn(2, t, args.hidden)
    with torch.no_grad():
        _, ours = build("ember-longformer", args.hidden, args.heads, args.window)
        _, ref = build("hf-longformer", args.hidden, args.heads, args.window)
        diff = (ours(x) - ref(x)).abs().max().item()
    if diff > 1e-4:
        raise SystemExit(f"ember's and transformers' Longformer layers differ by {diff}: not the same computation")
    return diff


def machine() -> str:
    model = platform.processor() or "?"
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                model = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    return f"{model}, {os.cpu_count()} cores, load average {os.getloadavg()[0]:.2f} at start"


def table(rows: list[dict]) -> str:
    lines = ["| tokens | pass | full s | ember LF s | HF LF s | full MB | ember LF MB | HF LF MB | "
             "full/ember time | full/ember mem | HF/ember time |", "|" + "---|" * 11]
    keyed = {(r["impl"], r["length"], r["pass"]): r for r in rows}
    for length in sorted({r["length"] for r in rows}):
        for kind in PASSES:
            get = lambda impl, f: keyed.get((impl, length, kind), {}).get(f)  # noqa: E731
            full, ours, hf = (get(i, "seconds") for i in IMPLS)
            fm, om, hm = (get(i, "peak_mb") for i in IMPLS)
            fmt = lambda v, p=2: "-" if v is None else f"{v:.{p}f}"  # noqa: E731
            ratio = lambda a, b: "-" if a is None or not b else f"{a / b:.2f}x"  # noqa: E731
            lines.append(f"| {length} | {kind} | {fmt(full)} | {fmt(ours)} | {fmt(hf)} | {fmt(fm, 0)} | {fmt(om, 0)} | "
                         f"{fmt(hm, 0)} | {ratio(full, ours)} | {ratio(fm, om)} | {ratio(hf, ours)} |")
    return "\n".join(lines)


def crossover(rows: list[dict], kind: str) -> int | None:
    """The shortest measured length from which ember's Longformer is faster than full attention."""
    keyed = {(r["impl"], r["length"]): r["seconds"] for r in rows if r["pass"] == kind}
    lengths = sorted(l for (i, l) in keyed if i == "full" and ("ember-longformer", l) in keyed)
    faster = [l for l in lengths if keyed[("ember-longformer", l)] < keyed[("full", l)]]
    return next((l for l in lengths if all(m in faster for m in lengths if m >= l)), None)


def plot(rows: list[dict], path: Path, title: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 2, figsize=(11, 4.2))
    for ax, field, label in ((axes[0], "seconds", "CPU seconds (1 thread)"), (axes[1], "peak_mb", "peak MB")):
        for impl, colour in zip(IMPLS, ("tab:red", "tab:blue", "tab:gray"), strict=True):
            for kind, style in (("fwd", ":"), ("fwd+bwd", "--"), ("train", "-")):
                pts = sorted((r["length"], r[field]) for r in rows if r["impl"] == impl and r["pass"] == kind)
                if pts:
                    ax.plot(*zip(*pts), style, marker="o", color=colour, label=f"{impl} {kind}")
        ax.set_xscale("log", base=2)
        ax.set_yscale("log")
        ax.set_xlabel("tokens")
        ax.set_ylabel(label)
        ax.grid(True, which="both", alpha=0.3)
    axes[0].legend(fontsize=7)
    fig.suptitle(title, fontsize=9)
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--lengths", default="512,1024,2048,4096,8192,16384")
    p.add_argument("--hidden", type=int, default=768)
    p.add_argument("--heads", type=int, default=12)
    p.add_argument("--window", type=int, default=512)
    p.add_argument("--reps", type=int, default=3)
    p.add_argument("--chunk", type=int, default=64, help="ember-reformer: tokens per LSH chunk")
    p.add_argument("--hashes", type=int, default=2, help="ember-reformer: hash rounds")
    p.add_argument("--impls", default=",".join(IMPLS), help=f"which layers; also {', '.join(EXTRA)} (in "
                   "RESULTS.json, not in the table)")
    p.add_argument("--passes", default=",".join(PASSES), help="fwd, fwd+bwd (no dropout), train (fwd+bwd, dropout 0.1)")
    p.add_argument("--full-limit-gb", type=float, default=4.0,
                   help="skip full attention where its heads x T x T fp32 scores (x4 when training) pass this many GB")
    p.add_argument("--out", default="runs/bench-long")
    p.add_argument("--smoke", action="store_true", help="tiny sizes, one repetition, in one process: checks "
                   "the script runs (its memory column is meaningless)")
    p.add_argument("--one", help=argparse.SUPPRESS)  # impl,length,pass: the subprocess's work
    args = p.parse_args()
    if args.smoke:
        args.lengths, args.hidden, args.heads, args.window, args.reps, args.chunk = "64,256", 32, 4, 16, 1, 16
    if args.one:
        impl, length, kind = args.one.split(",")
        print(json.dumps(measure(impl, int(length), kind, args)))
        return
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    header = machine()
    diff = check_equal_outputs(args)
    print(f"{header}\nember vs transformers Longformer layer: max |diff| {diff:.2e}", flush=True)
    rows = []
    for length in (int(v) for v in args.lengths.split(",")):
        for impl in args.impls.split(","):
            for kind in args.passes.split(","):
                copies = 4 if kind == "train" else 1  # scores, probabilities, dropped ones, their gradient
                if impl == "full" and copies * args.heads * length * length * 4 / 2 ** 30 > args.full_limit_gb:
                    continue  # full attention's memory explodes here
                if args.smoke:  # in this process: checks the code paths, not the memory
                    rows.append(measure(impl, length, kind, args))
                    continue
                cmd = [sys.executable, __file__, "--one", f"{impl},{length},{kind}", "--hidden", str(args.hidden),
                       "--heads", str(args.heads), "--window", str(args.window), "--reps", str(args.reps),
                       "--chunk", str(args.chunk), "--hashes", str(args.hashes)]
                done = subprocess.run(cmd, env=env, capture_output=True, text=True)
                if done.returncode:
                    print(f"{impl} {length} {kind}: failed\n{done.stderr[-2000:]}", flush=True)
                    continue
                rows.append(json.loads(done.stdout.strip().splitlines()[-1]))
                print(json.dumps(rows[-1]), flush=True)
    title = (f"one encoder layer (H={args.hidden}, {args.heads} heads, FFN {4 * args.hidden}), Longformer window "
             f"{args.window} + 1 global token; {header}")
    text = table(rows)
    summary = {"machine": header, "hidden": args.hidden, "heads": args.heads, "window": args.window,
               "max_diff_vs_transformers": diff, "crossover_fwd": crossover(rows, "fwd"),
               "crossover_fwd_bwd": crossover(rows, "fwd+bwd"), "crossover_train": crossover(rows, "train"),
               "rows": rows}
    (out / "RESULTS.json").write_text(json.dumps(summary, indent=2))
    (out / "table.md").write_text(f"{title}\n\n{text}\n")
    plot(rows, out / "long_attention.png", title)
    print(f"\n{title}\n\n{text}\n\ncrossover (ember Longformer faster from): fwd {summary['crossover_fwd']}, "
          f"fwd+bwd {summary['crossover_fwd_bwd']}, train {summary['crossover_train']} tokens\nwritten: {out}/RESULTS.json, table.md, long_attention.png")


if __name__ == "__main__":
    sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # this checkout's ember
    main()
