"""Distributed scaling on this machine (gloo, CPU) and its projection to GPU nodes.

    PYTHONPATH=. OMP_NUM_THREADS=1 .venv/bin/python benchmarks/speed/distributed_scaling.py \
        --data runs/wiki-prepared [--preset bert-mini] [--steps 12] [--memory bert-base bert-large]

Three parts, all printed and written to --json:

throughput  `ember pretrain` of --preset for --steps steps at a global batch of --batch
            sequences of --length tokens, run as 1 process, 2 ranks DDP and 2 ranks FSDP
            (torchrun --standalone, gloo); tokens/s is the median of the steps' logged
            ``tokens_per_s`` (all ranks' non-padding tokens / step seconds on rank 0) after
            the first two. Each rank is one process with one thread.
memory      for each --memory preset, one MLM training step (batch 1 x 32) on 2 ranks under
            DDP and under FSDP: the bytes each rank holds in parameters, gradients and AdamW
            state (local shards, counted tensor by tensor) and its peak RSS.
projection  per-step communication volume of data parallelism for each preset, from its
            parameter count P, for W = 8 x N GPUs: DDP all-reduces the gradients (ring:
            2 (W-1)/W x P x b bytes sent per rank), FSDP all-gathers the parameters for the
            forward and again for the backward and reduce-scatters the gradients
            (3 (W-1)/W x P x b); b = 2 for bf16, 4 for fp32 (Rajbhandari et al. 2020, ZeRO
            §7: stage 3 moves 1.5x the data of DDP).

--smoke: a tiny model, 4 steps, memory of a tiny preset; seconds, for the tests.
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import resource
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "common"))  # the shared helpers
from _bench import load, machine  # noqa: E402

TINY = ["model.hidden_size=32", "model.num_layers=2", "model.num_heads=2", "model.intermediate_size=64",
        "model.max_position=64"]


def _env() -> dict:
    return {**os.environ, "OMP_NUM_THREADS": "1"}


def _launcher(ranks: int) -> list[str]:
    if ranks == 1:
        return [sys.executable, "-m", "ember"]
    return [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc_per_node={ranks}", "-m", "ember"]


def throughput(data: str, preset: str, steps: int, batch: int, length: int, extra: list[str]) -> dict:
    """tokens/s of 1 process, 2 ranks DDP, 2 ranks FSDP (see the module docstring)."""
    from ember.train.logging import MetricsLogger

    results = {}
    for name, ranks, parallel in (("1 process", 1, "ddp"), ("2 ranks DDP", 2, "ddp"), ("2 ranks FSDP", 2, "fsdp")):
        with tempfile.TemporaryDirectory() as tmp:
            run = Path(tmp) / "run"
            cmd = _launcher(ranks) + ["pretrain", "--recipe", preset, "--data", data, "--out", str(run),
                                      "--max-steps", str(steps), "--no-progress"]
            for s in [f"train.batch_size={batch}", f"train.micro_batch_size={batch // 2}",
                      "train.grad_accum=1", f"data.max_seq_length={length}", "train.log_every=1",
                      "train.eval_every=0", f"train.save_every={steps}", f"train.parallel={parallel}",
                      "train.num_threads=1", *extra]:
                cmd += ["--set", s]
            done = subprocess.run(cmd, env=_env(), capture_output=True, text=True, check=False)
            if done.returncode:
                raise SystemExit(f"{name} failed:\n{done.stderr[-3000:]}")
            rates = [r["tokens_per_s"] for r in MetricsLogger.read(run / "metrics.jsonl")
                     if r["split"] == "train" and r["step"] > 2]
            results[name] = statistics.median(rates)
            print(f"  {name:>13}: {results[name]:9.0f} tokens/s ({load()})", flush=True)
    return results


def _module(preset: str, extra: list[str]):
    import dataclasses

    from ember.config import DataConfig, model_preset
    from ember.models import build_backbone
    from ember.objectives.bert import BertPretraining

    cfg = model_preset(preset)
    for s in extra:  # model.key=value overrides (the smoke mode's tiny sizes)
        key, value = s.split("=", 1)
        field = key.split(".", 1)[1]
        cfg = dataclasses.replace(cfg, **{field: type(getattr(cfg, field))(value)})
    special = {"pad": 0, "unk": 100, "cls": 101, "sep": 102, "mask": 103}
    return cfg, BertPretraining(build_backbone(cfg), special, DataConfig(nsp=False), "none")


def _local_bytes(tensors) -> int:
    total = 0
    for t in tensors:
        if t is None or not hasattr(t, "numel"):
            continue
        t = t.to_local() if hasattr(t, "to_local") else t
        total += t.numel() * t.element_size()
    return total


def memory_worker(preset: str, parallel: str, extra: list[str]) -> None:
    """One MLM step on this rank under ``parallel``; rank 0 prints a JSON line."""
    import torch
    from torch import nn

    from ember.config import TrainConfig
    from ember.train.distributed import init_distributed
    from ember.train.fsdp import shard
    from ember.train.optim import build_optimizer

    torch.set_num_threads(1)
    info = init_distributed("cpu")
    torch.manual_seed(0)
    cfg, module = _module(preset, extra)
    train = TrainConfig(parallel=parallel)
    sharded = shard(module, train, info)
    model = module if sharded or not info.enabled else nn.parallel.DistributedDataParallel(module)
    optimizer = build_optimizer(module, train)
    g = torch.Generator().manual_seed(info.rank)
    ids = torch.randint(1000, cfg.vocab_size, (1, 32), generator=g)
    labels = torch.full_like(ids, -100)
    labels[:, ::7] = ids[:, ::7]
    batch = {"input_ids": ids, "attention_mask": torch.ones_like(ids), "token_type_ids": torch.zeros_like(ids),
             "labels": labels}
    loss, _ = model(batch)
    loss.backward()
    optimizer.step()
    params = list(module.parameters())
    state = [v for s in optimizer.state.values() for v in s.values() if hasattr(v, "numel") and v.dim() > 0]
    row = {"params": _local_bytes(params), "grads": _local_bytes(p.grad for p in params),
           "optimizer": _local_bytes(state), "peak_rss": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024,
           "num_parameters": sum(p.numel() for p in params)}
    if info.enabled:
        import torch.distributed as dist

        rows = [None] * info.world_size
        dist.all_gather_object(rows, row)
        # DDP's reducer must go before its process group: destroyed after it (at interpreter exit)
        # it aborted a rank now and then ("terminate called without an active exception")
        del model, optimizer
        gc.collect()
        dist.destroy_process_group()
    else:
        rows = [row]
    if info.is_main:
        print("MEMORY " + json.dumps(rows), flush=True)


def memory(preset: str, extra: list[str]) -> dict:
    out = {}
    for parallel in ("ddp", "fsdp"):
        cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2",
               str(Path(__file__).resolve()), "--memory-worker", preset, "--parallel", parallel]
        cmd += ["--model-set", *extra] if extra else []
        done = subprocess.run(cmd, env=_env(), capture_output=True, text=True, check=False)
        line = next((x for x in done.stdout.splitlines() if x.startswith("MEMORY ")), None)
        if done.returncode or line is None:
            raise SystemExit(f"memory {preset} {parallel} failed:\n{done.stderr[-3000:]}")
        rows = json.loads(line[len("MEMORY "):])
        out[parallel] = {k: max(r[k] for r in rows) for k in rows[0]}  # the fullest rank
        r = out[parallel]
        print(f"  {preset} {parallel.upper():>4} per rank: params {r['params'] / 2**20:7.1f} MiB, grads "
              f"{r['grads'] / 2**20:7.1f} MiB, AdamW {r['optimizer'] / 2**20:7.1f} MiB, peak RSS "
              f"{r['peak_rss'] / 2**20:7.1f} MiB ({load()})", flush=True)
    return out


def projection(num_parameters: int, nodes=(1, 2, 4, 16), gpus_per_node: int = 8) -> list[dict]:
    """Bytes each rank sends per optimizer step (module docstring), bf16 and fp32."""
    rows = []
    for n in nodes:
        w = gpus_per_node * n
        share = (w - 1) / w
        for b, dtype in ((2, "bf16"), (4, "fp32")):
            rows.append({"nodes": n, "gpus": w, "dtype": dtype,
                         "ddp_bytes": 2 * share * num_parameters * b, "fsdp_bytes": 3 * share * num_parameters * b})
    return rows


def count_parameters(preset: str, extra: list[str]) -> int:
    """Parameters of the MLM module of ``preset``, built on the meta device (no memory)."""
    import torch

    with torch.device("meta"):
        return sum(p.numel() for p in _module(preset, extra)[1].parameters())


def state_per_rank(num_parameters: int, ranks=(1, 2, 8, 64)) -> dict:
    """fp32 weights, gradients and AdamW's two moments (16 bytes a parameter): whole on every
    DDP rank, 1/W of it on each FSDP rank (ZeRO stage 3, Rajbhandari et al. 2020, §5)."""
    out = {"DDP (any W)": 16 * num_parameters}
    out.update({f"FSDP W={w}": 16 * num_parameters / w for w in ranks[1:]})
    return out


def main(argv=None) -> dict:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--data", help="a prepared corpus (ember prepare)")
    p.add_argument("--preset", default="bert-mini")
    p.add_argument("--steps", type=int, default=12)
    p.add_argument("--batch", type=int, default=16)
    p.add_argument("--length", type=int, default=128)
    p.add_argument("--memory", nargs="*", default=["bert-base"], metavar="PRESET",
                   help="presets measured on 2 ranks (bert-large under DDP needs ~2 x 7 GB)")
    p.add_argument("--project", nargs="*", default=["bert-base", "bert-large"], metavar="PRESET",
                   help="presets of the computed state-per-rank and communication tables")
    p.add_argument("--json")
    p.add_argument("--smoke", action="store_true", help="tiny model, 4 steps (for the tests)")
    p.add_argument("--memory-worker", metavar="PRESET", help=argparse.SUPPRESS)
    p.add_argument("--parallel", default="ddp", help=argparse.SUPPRESS)
    p.add_argument("--model-set", nargs="*", default=[], help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.memory_worker:
        memory_worker(args.memory_worker, args.parallel, args.model_set)
        return {}
    extra, model_set = [], []
    if not args.data:
        p.error("--data (a prepared corpus) is needed")
    if args.smoke:
        from ember.data.shards import TokenCorpus

        args.steps, args.batch, args.length, args.memory, args.project = 4, 4, 32, ["bert-tiny"], ["bert-tiny"]
        # pre-training sizes the vocabulary to the corpus itself; the memory worker builds the model alone
        extra, model_set = TINY, TINY + [f"model.vocab_size={TokenCorpus(args.data, 'train').vocab_size}"]
    if args.steps < 3:
        p.error(f"--steps {args.steps}: the first two steps are warm-up and not timed; give 3 or more")
    print(f"{machine()}; {load()}")
    print(f"throughput: {args.preset}, batch {args.batch} x {args.length}, {args.steps} steps")
    result = {"machine": machine(), "load_before": load(), "preset": args.preset, "batch": args.batch,
              "length": args.length, "steps": args.steps,
              "throughput": throughput(args.data, args.preset, args.steps, args.batch, args.length, extra)}
    result["memory"] = {}
    for preset in args.memory:
        result["memory"][preset] = memory(preset, model_set)
    result["projection"], result["state_per_rank"] = {}, {}
    for preset in args.project:
        params = count_parameters(preset, model_set)
        result["state_per_rank"][preset] = state_per_rank(params)
        print(f"{preset} ({params / 1e6:.1f}M parameters) fp32 weights + grads + AdamW per rank, GiB: " + ", ".join(
            f"{k} {v / 2**30:.2f}" for k, v in result["state_per_rank"][preset].items()))
        result["projection"][preset] = projection(params)
        print(f"projection {preset}, MB sent per rank per step:")
        for row in result["projection"][preset]:
            print(f"  {row['nodes']:>2} node(s) x 8 = {row['gpus']:>3} GPUs {row['dtype']}: DDP "
                  f"{row['ddp_bytes'] / 1e6:8.0f}  FSDP {row['fsdp_bytes'] / 1e6:8.0f}")
    result["load_after"] = load()
    if args.json:
        Path(args.json).write_text(json.dumps(result, indent=2))
    return result


if __name__ == "__main__":
    main()
