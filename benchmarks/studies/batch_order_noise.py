"""Why do length-grouped batches cost SST-2 half a dev point (issue 46 item 4)? The gradient noise
each batch order puts into a step.

    PYTHONPATH=. OMP_NUM_THREADS=1 .venv/bin/python benchmarks/studies/batch_order_noise.py \\
        --init runs/minilm --out runs/batch-order-noise --train-limit 2000 --seeds 1,2 --at 0,30

A batch's gradient g_b estimates the full-data gradient g; what a step gets wrong is the noise
||g_b - g||^2. For random batches of B from N examples its mean is (N - B) / (N - 1) * s^2 / B
(s^2: the per-example gradient variance). A length-grouped batch holds examples of one length
stratum; where short and long sentences pull the weights differently (SST-2's training rows mix
short phrases with full sentences), each grouped batch adds its stratum's pull to the noise, as a
stratified sample with one stratum per batch would. The study measures, at the same weights:

* the noise of shuffled and of grouped batches (ember's default grouping, ``length-grouped-spread``,
  as ``train.group_by_length=true`` trains), over every full batch of epoch 0 of ``--seeds``;
* the *effective batch size* of a grouped batch: B * noise(shuffled) / noise(grouped), the random
  batch size with the same noise (noise goes as 1/B);
* the cosine of each batch gradient with g, and what a batch holds: its mean label (a binary
  task's share of label 1, a regression's mean score) and its lengths.

Weights: the init (``--at 0``: the checkpoint under a fresh seeded head), and after N shuffled
AdamW updates (``--at N``: lr ``--lr``, constant, batch B, dropout on), so the head is no longer
random. Gradients are taken in eval mode (no dropout), so the only noise measured is which
examples a batch holds. The identity sum_b n_b g_b / N = g over a whole epoch checks the sums
(result.json, ``epoch_identity``). --smoke: a random bert-mini on 96 real SST-2 rows (CI).

``--teacher RUN`` measures task distillation instead, as ``ember distill --method kd
--student-init teacher --student-layers 3 --unlabeled task`` trains it (the distillation that
groups its batches by default): a student of the teacher's layers, the teacher's soft targets at
its default temperature, the task's rows without their labels (issue 46 item 4: KD was level in
grouped batches; is its grouped step as noisy as fine-tuning's?).

    PYTHONPATH=. OMP_NUM_THREADS=1 .venv/bin/python benchmarks/studies/batch_order_noise.py \
        --teacher runs/cls-order/kd-teacher --out runs/batch-order-noise-kd --lr 5e-5 --at 0,30,60
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import sys
from pathlib import Path

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "common"))  # the shared helpers
from _bench import load, machine, pyplot, run_cli  # noqa: E402
from _checkpoint_study import smoke_tokenizer  # noqa: E402

from ember.errors import EmberError  # noqa: E402
from ember.fileio import atomic_write_text  # noqa: E402
from ember.train.length_groups import SHUFFLED, SPREAD, feature_lengths  # noqa: E402
from ember.train.loop import DataOrder  # noqa: E402

ORDERS = (SHUFFLED, SPREAD)
NAMES = {SHUFFLED: "shuffled", SPREAD: "grouped"}


def parse_args(argv):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--init", default="runs/minilm", help="an ember run folder (the imported checkpoint)")
    p.add_argument("--out", required=True)
    p.add_argument("--task", default="sst2", help="a classification task (default sst2)")
    p.add_argument("--train-limit", type=int, default=2000, help="the first N training rows (default 2000)")
    p.add_argument("--batch-size", type=int, default=32)
    p.add_argument("--max-length", type=int, default=128)
    p.add_argument("--seeds", default="1,2", help="whose epoch-0 batches are measured (default 1,2)")
    p.add_argument("--at", default="0,30", help="shuffled updates before measuring, per point (default 0,30)")
    p.add_argument("--lr", type=float, default=1e-4, help="the updates' learning rate (default 1e-4)")
    p.add_argument("--teacher", help="a fine-tuned run: measure KD from it (the task and max length are the "
                                      "teacher's; --init, --task and --max-length are not read)")
    p.add_argument("--student-layers", type=int, default=3, help="with --teacher: the student's layers (default 3)")
    p.add_argument("--smoke", action="store_true", help="a random bert-mini, 96 rows (CI)")
    args = p.parse_args(argv)
    try:
        args.seeds = [int(s) for s in args.seeds.split(",") if s.strip()]
        args.at = sorted({int(s) for s in args.at.split(",") if s.strip()})
    except ValueError:
        raise EmberError(f"--seeds and --at take comma-separated integers; got {args.seeds!r} and {args.at!r}") from None
    if not args.seeds or not args.at or min(args.at) < 0 or args.batch_size < 2:
        raise EmberError("--seeds and --at each name at least one number (--at 0 or more), --batch-size 2 or more")
    if args.smoke:
        args.train_limit = min(args.train_limit, 96)
    return args


@dataclasses.dataclass
class Setup:
    module: torch.nn.Module
    features: list
    lengths: np.ndarray
    labels: np.ndarray
    task: str
    model: str  # what the table calls the trained module


def setup(args, out: Path) -> Setup:
    if args.teacher:
        return distillation_setup(args)
    from ember.config import RunConfig, TaskConfig, TrainConfig
    from ember.runs.init import load_init
    from ember.tasks.base import get_adapter
    from ember.tasks.task_model import build_task_module, pad_token_id
    from ember.tokenizers import load_tokenizer

    start = load_init("random", "bert-mini", str(smoke_tokenizer(out))) if args.smoke else load_init(args.init)
    cfg = RunConfig(kind="finetune", model=start.model, train=TrainConfig(seed=0),
                    task=TaskConfig(name=args.task, max_length=args.max_length, init=str(args.init)))
    adapter = get_adapter(args.task, cfg.model)
    tokenizer = load_tokenizer(start.tokenizer)
    _, features = adapter.load("train", tokenizer, args.max_length, limit=args.train_limit)
    torch.manual_seed(0)  # the fresh head
    module = build_task_module(cfg, adapter, start.state, pad_token_id(tokenizer))
    if not hasattr(module, "classifier"):
        raise EmberError(f"--task {args.task} is not a classification task")
    labels = np.array([f["label"] for f in features], dtype=float)
    model = "random bert-mini (smoke)" if args.smoke else Path(args.init).name
    return Setup(module, features, np.array(feature_lengths(features)), labels, args.task, model)


def distillation_setup(args) -> Setup:
    """KD's trained module, built as ``ember distill`` builds it (ember/distillation/task_run.py):
    the student from the teacher's layers, the teacher's logits on each row, alpha 1 (no labels)."""
    from ember.config import RunConfig, TaskConfig, TrainConfig
    from ember.distillation.kd import KDSettings, TaskDistiller
    from ember.distillation.task_run import METHOD_DEFAULTS, TaskDistillOptions, _build_student, _student_start
    from ember.tasks.glue_adapter import GlueAdapter
    from ember.runs.folder import load_run_config
    from ember.tasks.base import get_adapter, read_task_record
    from ember.tasks.task_model import load_task_module, pad_token_id
    from ember.tokenizers import load_tokenizer

    teacher_dir = Path(args.teacher)
    teacher_cfg = load_run_config(teacher_dir, expect_kind="finetune")
    adapter = get_adapter(read_task_record(teacher_dir) or teacher_cfg.task.name, teacher_cfg.model)
    if not isinstance(adapter, GlueAdapter):  # the check ember distill makes
        raise EmberError(f"{teacher_dir} was fine-tuned on {adapter.display_name}; task distillation takes "
                         "sentence (pair) classification and regression teachers")
    tokenizer = load_tokenizer(teacher_dir / "tokenizer.json")
    pad = pad_token_id(tokenizer)
    teacher = load_task_module(teacher_dir, teacher_cfg, adapter, pad)
    max_length = teacher_cfg.task.max_length
    _, features = adapter.load("train", tokenizer, max_length, limit=args.train_limit)
    logits = teacher.predict(features, teacher_cfg.task.eval_batch_size, "cpu")
    labels = np.array([f["label"] for f in features], dtype=float)  # described, not trained on (alpha 1)
    features = [dict(f, label=None, teacher_logits=row) for f, row in zip(features, logits)]
    opts = TaskDistillOptions(teacher=teacher_dir, out=Path(args.out), student_layers=args.student_layers,
                              student_init="teacher")
    model_cfg, state = _student_start(opts, teacher_cfg, teacher)
    cfg = RunConfig(kind="finetune", model=model_cfg, train=TrainConfig(seed=0),
                    task=TaskConfig(name=adapter.name, max_length=max_length, init="teacher"))
    temperature, alpha = METHOD_DEFAULTS["kd"]
    module = TaskDistiller(_build_student(cfg, adapter, state, pad), KDSettings(temperature=temperature, alpha=alpha))
    model = f"KD from {teacher_dir.name} into {model_cfg.num_layers} layers" + (" (smoke)" if args.smoke else "")
    return Setup(module, features, np.array(feature_lengths(features)), labels, adapter.name, model)


def batches(s: Setup, order: str, seed: int, batch_size: int) -> list[np.ndarray]:
    """Epoch 0's batches under ``order``, as the Trainer cuts them (the last may be short)."""
    lengths = None if order == SHUFFLED else s.lengths
    epoch = DataOrder(len(s.features), seed, lengths, batch_size, None, SPREAD).epoch_order(0)
    return [epoch[i:i + batch_size] for i in range(0, len(epoch), batch_size)]


def gradient(s: Setup, idx) -> torch.Tensor:
    """The mean loss's gradient over examples ``idx``, every trainable weight in one vector."""
    s.module.zero_grad(set_to_none=True)
    loss, _ = s.module(s.module.make_batch([s.features[i] for i in idx]))
    loss.backward()
    return torch.cat([p.grad.reshape(-1) for p in s.module.parameters() if p.requires_grad and p.grad is not None])


def full_gradient(s: Setup, chunk: int = 64) -> torch.Tensor:
    """g: the mean over all examples, summed in length-sorted chunks (little padding)."""
    order = np.argsort(s.lengths, kind="stable")
    total = None
    for i in range(0, len(order), chunk):
        idx = order[i:i + chunk]
        g = gradient(s, idx) * len(idx)
        total = g if total is None else total + g
    return total / len(order)


def train_updates(s: Setup, steps: int, lr: float, batch_size: int) -> None:
    """``steps`` AdamW updates on shuffled batches (seed 0, not a measured seed), dropout on."""
    s.module.train()
    params = [p for p in s.module.parameters() if p.requires_grad]
    optimizer = torch.optim.AdamW(params, lr=lr, weight_decay=0.01)
    order = DataOrder(len(s.features), 0)
    for step in range(steps):
        idx = [order(step * batch_size + k)[0] for k in range(batch_size)]
        optimizer.zero_grad(set_to_none=True)
        loss, _ = s.module(s.module.make_batch([s.features[i] for i in idx]))
        loss.backward()
        torch.nn.utils.clip_grad_norm_(params, 1.0)
        optimizer.step()
    s.module.eval()


def measure(s: Setup, seeds: list[int], batch_size: int) -> dict:
    """Per order: the noise, cosine and contents of every full batch of epoch 0 of each seed."""
    s.module.eval()
    g = full_gradient(s)
    n = len(s.features)
    result = {"full_gradient_norm2": float(g.square().sum()), "orders": {}}
    for order in ORDERS:
        rows, worst = [], 0.0
        for seed in seeds:
            summed = torch.zeros_like(g)
            for idx in batches(s, order, seed, batch_size):
                gb = gradient(s, idx)
                summed += gb * len(idx)
                if len(idx) < batch_size:  # the short last batch: in the identity, not in the noise
                    continue
                lengths = s.lengths[idx]
                rows.append({"noise": float((gb - g).square().sum()),
                             "cosine": float(torch.nn.functional.cosine_similarity(gb, g, dim=0)),
                             "label_mean": float(s.labels[idx].mean()),
                             "mean_length": float(lengths.mean()), "length_range": int(lengths.max() - lengths.min())})
            # sum_b n_b g_b / N = g: the epoch's batches cover every example once
            worst = max(worst, float((summed / n - g).norm() / g.norm()))
        result["orders"][NAMES[order]] = {"batches": rows, "epoch_identity": worst, **summary(rows)}
    shuffled, grouped = result["orders"]["shuffled"], result["orders"]["grouped"]
    # noise of random batches goes as (N - B) / (N - 1) / B: the B with the grouped batches' noise
    fpc = (n - batch_size) / (n - 1)
    per_example = shuffled["noise"] * batch_size / fpc
    result["noise_ratio"] = grouped["noise"] / shuffled["noise"]
    # solved for B: noise = per_example * (N - B) / ((N - 1) * B)
    result["effective_batch"] = per_example * n / (grouped["noise"] * (n - 1) + per_example)
    return result


def summary(rows: list[dict]) -> dict:
    take = lambda key: np.array([r[key] for r in rows], dtype=float)  # noqa: E731
    return {"count": len(rows), "noise": float(take("noise").mean()), "noise_sd": float(take("noise").std(ddof=1)),
            "cosine": float(take("cosine").mean()), "label_mean_sd": float(take("label_mean").std(ddof=1)),
            "length_range": float(take("length_range").mean()), "mean_length_sd": float(take("mean_length").std(ddof=1))}


def render(result: dict) -> str:
    meta = result["meta"]
    lines = [f"# Gradient noise of a step, shuffled against length-grouped batches: {meta['model']}", "",
             f"{meta['machine']}; {meta['load']}. {meta['task']}, the first {meta['examples']} training rows, "
             f"batch {meta['batch_size']}, every full batch of epoch 0 of seeds {', '.join(map(str, meta['seeds']))}; "
             "gradients in eval mode at the same weights for both orders. Noise: mean ||g_b - g||^2 over batches; "
             "effective batch: the random batch size with the grouped batches' noise.", "",
             "| weights | order | batches | noise (x1e3) | cosine with g | batch mean label sd | length range in a batch | "
             "batch mean length sd | noise, grouped / shuffled | effective batch |",
             "|---|---|---:|---:|---:|---:|---:|---:|---:|---:|"]
    for point in result["points"]:
        for name, o in point["orders"].items():
            ratio = f"**{point['noise_ratio']:.2f}x**" if name == "grouped" else ""
            eff = f"{point['effective_batch']:.1f}" if name == "grouped" else ""
            lines.append(f"| after {point['updates']} updates | {name} | {o['count']} | {o['noise'] * 1e3:.3f} | "
                         f"{o['cosine']:.3f} | {o['label_mean_sd']:.3f} | {o['length_range']:.1f} | "
                         f"{o['mean_length_sd']:.1f} | {ratio} | {eff} |")
    if meta["smoke"]:
        lines += ["", "(--smoke: a random model on a few rows; the figures are not measurements.)"]
    return "\n".join(lines) + "\n"


def chart(result: dict, path: Path) -> None:
    """Each batch's noise against its mean length, per order, one panel per point."""
    plt = pyplot()
    if plt is None:
        return
    points = result["points"]
    fig, axes = plt.subplots(1, len(points), figsize=(4.2 * len(points), 3.4), squeeze=False)
    for ax, point in zip(axes[0], points):
        for name, color in (("shuffled", "tab:blue"), ("grouped", "tab:orange")):
            rows = point["orders"][name]["batches"]
            ax.scatter([r["mean_length"] for r in rows], [r["noise"] for r in rows], s=10, color=color,
                       label=f"{name} (mean {point['orders'][name]['noise']:.2e})")
        ax.set_yscale("log")
        ax.set_xlabel("batch mean length (tokens)")
        ax.set_ylabel("||g_b - g||^2")
        ax.set_title(f"after {point['updates']} updates", fontsize=9)
        ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def main(argv=None) -> dict:
    args = parse_args(argv)
    torch.set_num_threads(1)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    s = setup(args, out)
    points, done = [], 0
    for updates in args.at:
        train_updates(s, updates - done, args.lr, args.batch_size)
        done = updates
        points.append({"updates": updates, **measure(s, args.seeds, args.batch_size)})
        print(f"after {updates} updates: grouped noise {points[-1]['noise_ratio']:.2f}x shuffled", flush=True)
    meta = {"model": s.model, "machine": machine(), "load": load(), "task": s.task, "examples": len(s.features),
            "batch_size": args.batch_size, "seeds": args.seeds, "lr": args.lr, "smoke": args.smoke}
    result = {"meta": meta, "points": points}
    atomic_write_text(out / "result.json", json.dumps(result, indent=2))
    text = render(result)
    atomic_write_text(out / "table.md", text)
    chart(result, out / "noise.png")
    print(text)
    return result


if __name__ == "__main__":
    run_cli(main)
