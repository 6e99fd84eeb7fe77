"""Pre-training throughput: one full MLM training step, ember vs Hugging Face transformers.

    PYTHONPATH=. nice -n 19 .venv/bin/python benchmarks/speed/pretrain_throughput.py \
        --presets bert-mini bert-base [--repeats 7] [--variants ember ember-full-head ...]

A step is forward + backward + gradient clipping (1.0) + AdamW update on a batch of 32 x 128
tokens with 15% of each row masked (19 positions, the same positions for both sides).
  ember      the BertPretraining objective "mlm" (sparse MLM head, fused QKV, CPU-cheap
             dropout, fused AdamW with BERT's decay groups) - what `ember pretrain` runs
  reference  transformers.BertForMaskedLM, attn_implementation="sdpa", full-vocabulary head,
             torch.optim.AdamW with its defaults (what the HF Trainer behind run_mlm.py uses)
  reference-masked  the same model and optimizer, but the head and loss run only at the masked
             rows (bert -> gather labelled rows -> cls -> cross-entropy): what an informed user,
             MosaicBERT or cramming (Geiping & Goldstein, 2022, sec. 4.2) does
All have dropout 0.1 and the same shapes; the contenders run in turn in one process.

Extra ember variants (--variants) measure one lever each:
  ember-torch-dropout  torch's dropout (F.dropout, SDPA dropout_p) instead of ember.nn.dropout
  ember-full-head   logits for all 4096 positions, loss on the masked ones (no sparse head)
  ember-full-last-layer  the last layer at every position (ember runs its queries, feed-forward
             and norms only at the masked rows, the only ones the loss reads: ember.nn.query_rows)
  ember-split-qkv   three separate q/k/v matmuls instead of the fused one
  ember-loop-adam   AdamW without foreach or fused kernels (one op at a time per tensor)
  ember-foreach-adam  AdamW(foreach=True) instead of the fused kernel
  ember-compile     torch.compile(module) (slow to start: compiles forward and backward)
  ember-mkl         Linear layers through torch's default F.linear (MKL) instead of oneDNN
  ember-bf16        bf16 autocast on the CPU (train.dtype=bfloat16), fp32 master weights; brings
             the contender reference-masked-bf16 (the masked-rows loop under the same autocast).
             Fast only on CPUs with AMX (Intel Xeon 4th gen+); its utilisation is against the
             bf16 n=1024 matmul peak measured the same way

Like `ember pretrain` (train.keep_host_memory), the process keeps freed memory for reuse instead
of faulting in fresh pages for every step's large tensors; it is process-wide, so it applies
to the reference contenders too (--system-malloc: glibc's default for everyone).

Utilisation = useful FLOP/s / measured fp32 matmul peak (an n=1024 matmul, the faster of
MKL's and oneDNN's, timed in every repetition). Useful FLOPs are counted exactly per layer (all matmuls: QKV, attention scores
and context, output, feed-forward; the MLM head at masked positions only, as those are the
only rows the loss needs, and for the same reason the last layer's queries, attention, output
and feed-forward at masked positions only, its keys and values everywhere), with backward = 2 x forward. Embedding lookups, LayerNorm, GELU,
softmax and the optimizer are not counted. Both sides get the same useful count.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import sys
from pathlib import Path

import torch
import torch.nn.functional as F
from torch import nn

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "common"))  # the shared helpers
from _bench import (add_common_args, alternate, apply_common_args, clock, clock_name, load, matmul_peak,  # noqa: E402
                    median, run_cli)

from ember.errors import EmberError  # noqa: E402
from ember.config import DataConfig, ModelConfig, TrainConfig, model_preset  # noqa: E402
from ember.models import build_backbone  # noqa: E402
from ember.nn import onednn  # noqa: E402
from ember.objectives.bert import BertPretraining  # noqa: E402
from ember.host_memory import keep_freed_host_memory  # noqa: E402
from ember.train.optim import build_optimizer, parameter_groups  # noqa: E402

SPECIAL = {"pad": 0, "unk": 100, "cls": 101, "sep": 102, "mask": 103}
VARIANTS = ("ember", "ember-torch-dropout", "ember-full-head", "ember-full-last-layer", "ember-split-qkv", "ember-loop-adam", "ember-foreach-adam",
            "ember-compile", "ember-mkl", "ember-bf16")


def make_batch(cfg: ModelConfig, batch: int, length: int, mask_prob: float, seed: int = 0) -> dict:
    """Random full-length rows; round(mask_prob * length) positions per row carry labels."""
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(1000, cfg.vocab_size, (batch, length), generator=g)
    n_mask = max(1, round(mask_prob * length))
    chosen = torch.rand(batch, length, generator=g).argsort(1)[:, :n_mask]
    labels = torch.full_like(ids, -100)
    labels.scatter_(1, chosen, ids.gather(1, chosen))
    ids = ids.scatter(1, chosen, SPECIAL["mask"])
    return {"input_ids": ids, "attention_mask": torch.ones_like(ids),
            "token_type_ids": torch.zeros_like(ids), "labels": labels}


def useful_flops(cfg: ModelConfig, batch: int, length: int, n_masked: int) -> float:
    """Matmul FLOPs of one training step (forward x 3), exact per layer, head at masked rows."""
    h, i, v, tokens = cfg.hidden_size, cfg.intermediate_size, cfg.vocab_size, batch * length
    def layer(queries: int) -> int:  # keys/values at every token, the rest at ``queries`` rows
        return 2 * tokens * 2 * h * h + 2 * queries * (2 * h * h + 2 * h * i) + 2 * 2 * queries * length * h

    head = 2 * n_masked * (h * h + h * v)
    return 3 * ((cfg.num_layers - 1) * layer(tokens) + layer(n_masked) + head)


def _plain_attention_forward(attn, split_qkv: bool):
    """SelfAttention.forward with torch's SDPA dropout, optionally with three matmuls on
    slices of the fused QKV weight (lever checks)."""
    def forward(x, mask=None, need_weights=False):
        b, t, h = x.shape
        w, bias = attn.qkv.weight, attn.qkv.bias
        if split_qkv:
            q, k, v = (F.linear(x, w[j * h:(j + 1) * h], bias[j * h:(j + 1) * h])
                       .view(b, t, attn.num_heads, attn.head_dim).transpose(1, 2) for j in range(3))
        else:
            q, k, v = attn.qkv(x).view(b, t, 3, attn.num_heads, attn.head_dim).permute(2, 0, 3, 1, 4)
        p = attn.dropout_p if attn.training else 0.0
        context = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, dropout_p=p)
        return attn.out(context.transpose(1, 2).reshape(b, t, h)), None
    return forward


class _FullHead(nn.Module):
    """Wraps the ember objective so the MLM head runs on every position (no sparse gather)."""

    def __init__(self, inner: BertPretraining) -> None:
        super().__init__()
        self.inner = inner

    def forward(self, batch):
        out = self.inner.backbone(batch["input_ids"], batch["attention_mask"], batch["token_type_ids"])
        logits = self.inner.mlm(out.last_hidden_state, self.inner.backbone.word_embeddings)  # (B, T, V)
        return F.cross_entropy(logits.flatten(0, 1), batch["labels"].flatten()), {}


def training_step(model: nn.Module, module: nn.Module, optimizer, max_grad_norm: float):
    """One step as `ember pretrain` runs it: ``model(batch)`` (``module`` or a wrapper of it)
    forward and backward, ``module``'s gradients clipped, the optimizer's update."""
    def step(batch):
        loss, _ = model(batch)
        loss.backward()
        nn.utils.clip_grad_norm_(module.parameters(), max_grad_norm)
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        return loss
    return step


def ember_step(cfg: ModelConfig, variant: str, train: TrainConfig):
    torch.manual_seed(0)
    module = BertPretraining(build_backbone(cfg), SPECIAL, DataConfig(nsp=False), "none").to(train.device)
    module.train()
    model: nn.Module = module
    if variant == "ember-full-head":
        model = _FullHead(module)
    # the last layer everywhere; also for the variants whose attention takes no ``rows``
    module.backbone.takes_rows = variant not in ("ember-full-last-layer", "ember-split-qkv", "ember-torch-dropout")
    if variant == "ember-split-qkv":
        for layer in module.backbone.layers:
            layer.attention.forward = _plain_attention_forward(layer.attention, split_qkv=True)
    if variant == "ember-torch-dropout":  # torch's dropout kernels instead of ember.nn.dropout
        for layer in module.backbone.layers:
            layer.attention.forward = _plain_attention_forward(layer.attention, split_qkv=False)
            layer.dropout = nn.Dropout(layer.dropout.p)
        module.backbone.embeddings.dropout = nn.Dropout(module.backbone.embeddings.dropout.p)
    if variant == "ember-compile":
        model = torch.compile(module)
    groups = parameter_groups(module, train.weight_decay)
    adam = dict(lr=train.lr, betas=(train.adam_beta1, train.adam_beta2), eps=train.adam_eps)
    if variant == "ember-loop-adam":
        optimizer = torch.optim.AdamW(groups, foreach=False, **adam)
    elif variant == "ember-foreach-adam":
        optimizer = torch.optim.AdamW(groups, foreach=True, **adam)
    else:  # what the trainer runs: fused AdamW
        optimizer = build_optimizer(module, train)

    step = training_step(model, module, optimizer, train.max_grad_norm)
    if variant == "ember-bf16":
        import _gpu

        return _gpu.bf16_step(step, "cpu")
    if variant != "ember-mkl":
        return step

    def mkl_step(batch):  # the process-wide switch, off for this contender's steps only
        saved = onednn.enabled()
        onednn.set_enabled(False)
        try:
            return step(batch)
        finally:
            onednn.set_enabled(saved)
    return mkl_step


def _masked_rows_loss(model, batch: dict) -> torch.Tensor:
    """BertForMaskedLM's loss with the head at the labelled rows only: (N, H) -> (N, V)."""
    hidden = model.bert(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"],
                        token_type_ids=batch["token_type_ids"]).last_hidden_state  # (B, T, H)
    rows = batch["labels"] != -100  # (B, T)
    return F.cross_entropy(model.cls(hidden[rows]), batch["labels"][rows])


def reference_step(cfg: ModelConfig, masked_rows: bool = False, device: str = "cpu"):
    import transformers

    hf_cfg = transformers.BertConfig(
        vocab_size=cfg.vocab_size, hidden_size=cfg.hidden_size, num_hidden_layers=cfg.num_layers,
        num_attention_heads=cfg.num_heads, intermediate_size=cfg.intermediate_size,
        max_position_embeddings=cfg.max_position, type_vocab_size=cfg.type_vocab_size,
        hidden_act=cfg.hidden_act, layer_norm_eps=cfg.layer_norm_eps,
        hidden_dropout_prob=cfg.dropout, attention_probs_dropout_prob=cfg.attention_dropout,
        attn_implementation="sdpa",
    )
    torch.manual_seed(0)
    model = transformers.BertForMaskedLM(hf_cfg).to(device)
    model.train()
    # The HF Trainer's default optimizer: torch AdamW, decay on all but biases and LayerNorm
    # (on CUDA the informed user's fused AdamW).
    decay = [p for n, p in model.named_parameters() if "bias" not in n and "LayerNorm" not in n]
    rest = [p for n, p in model.named_parameters() if "bias" in n or "LayerNorm" in n]
    optimizer = torch.optim.AdamW([{"params": decay, "weight_decay": 0.01},
                                   {"params": rest, "weight_decay": 0.0}], lr=5e-5,
                                  fused=device.startswith("cuda"))

    def step(batch):
        loss = _masked_rows_loss(model, batch) if masked_rows else model(**batch).loss
        loss.backward()
        nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        return loss
    return step


def timed_rate(step, batch: dict, steps: int) -> float:
    """Tokens/s over ``steps`` training steps."""
    start = clock()
    for _ in range(steps):
        step(batch)
    return batch["input_ids"].numel() * steps / (clock() - start)


def run_preset(name: str, cfg: ModelConfig, args) -> dict:
    batch = make_batch(cfg, args.batch, args.length, args.mask_prob)
    n_masked = int((batch["labels"] != -100).sum())
    flops_per_token = useful_flops(cfg, args.batch, args.length, n_masked) / batch["input_ids"].numel()
    train = TrainConfig()
    contenders = {}
    for variant in args.variants:
        step = ember_step(cfg, variant, train)
        for _ in range(args.warmup + (2 if variant == "ember-compile" else 0)):
            step(batch)
        contenders[variant] = (lambda s=step: timed_rate(s, batch, args.steps))
    ref = reference_step(cfg)
    for _ in range(args.warmup):
        ref(batch)
    contenders["reference"] = lambda: timed_rate(ref, batch, args.steps)
    ref_masked = reference_step(cfg, masked_rows=True)
    for _ in range(args.warmup):
        ref_masked(batch)
    contenders["reference-masked"] = lambda: timed_rate(ref_masked, batch, args.steps)
    bf16 = "ember-bf16" in args.variants
    if bf16:
        import _gpu

        ref_bf16 = _gpu.bf16_step(reference_step(cfg, masked_rows=True), "cpu")
        for _ in range(args.warmup):
            ref_bf16(batch)
        contenders["reference-masked-bf16"] = lambda: timed_rate(ref_bf16, batch, args.steps)
    peaks: list[float] = []
    bf16_peaks: list[float] = []

    def measure_peaks() -> None:
        peaks.append(matmul_peak())
        if bf16:
            bf16_peaks.append(matmul_peak(dtype=torch.bfloat16))
    print(f"{name}: {sum(p.numel() for p in BertPretraining(build_backbone(cfg), SPECIAL, DataConfig(nsp=False), 'none').parameters()) / 1e6:.1f}M "
          f"parameters, batch {args.batch}x{args.length}, {n_masked} masked; {load()}", flush=True)
    rates = alternate(contenders, args.repeats, between=measure_peaks)
    peak = median(peaks)
    result = {"preset": name, "clock": clock_name(), "batch": args.batch, "length": args.length, "masked": n_masked,
              "peak_gflops": peak / 1e9, "useful_flops_per_token": flops_per_token,
              "load_after": load(), "tokens_per_s": {}, "utilisation": {}}
    ref_rate = median(rates["reference"])
    for variant, values in rates.items():
        rate = median(values)
        result["tokens_per_s"][variant] = rate
        result["utilisation"][variant] = rate * flops_per_token / (median(bf16_peaks) if "bf16" in variant else peak)
    if bf16:
        result["bf16_peak_gflops"] = median(bf16_peaks) / 1e9
    result["ratio"] = {v: median(rates[v]) / ref_rate for v in rates if v != "reference"}

    def masked_of(v: str) -> str:  # each ember variant against the masked loop in its own precision
        return "reference-masked-bf16" if "bf16" in v else "reference-masked"
    result["ratio_vs_masked"] = {v: median(rates[v]) / median(rates[masked_of(v)]) for v in rates
                                 if v.startswith("ember")}
    # the spread: each repetition's ratio (both contenders ran in the same repetition)
    result["ratio_vs_masked_each"] = {v: [a / b for a, b in zip(rates[v], rates[masked_of(v)])]
                                      for v in rates if v.startswith("ember")}
    return result


def run_preset_cuda(name: str, cfg: ModelConfig, args) -> dict:
    """The same step on the GPU in bf16: ember as the trainer runs it there (autocast, flash
    SDPA when the mask is all ones, fused AdamW), with and without torch.compile, against the
    masked-rows transformers loop in bf16 with fused AdamW. MFU over the measured bf16 peak."""
    import _gpu

    batch = _gpu.to_cuda(make_batch(cfg, args.batch, args.length, args.mask_prob))
    n_masked = int((batch["labels"] != -100).sum())
    flops_per_token = useful_flops(cfg, args.batch, args.length, n_masked) / batch["input_ids"].numel()
    train = TrainConfig(device="cuda", dtype="bfloat16")
    steps = {"ember-cuda": _gpu.bf16_step(ember_step(cfg, "ember", train)),
             "reference-masked-cuda": _gpu.bf16_step(reference_step(cfg, masked_rows=True, device="cuda"))}
    if not args.no_compile:
        steps["ember-cuda-compile"] = _gpu.bf16_step(ember_step(cfg, "ember-compile", train))
    for step in steps.values():
        for _ in range(args.warmup + 2):  # compile and cuBLAS autotuning happen here
            step(batch)
    kernel = _gpu.attention_kernel((args.batch, cfg.num_heads, args.length, cfg.hidden_size // cfg.num_heads))
    contenders = {n: (lambda s=s: _gpu.cuda_rate(s, batch, args.cuda_steps)) for n, s in steps.items()}
    rates = alternate(contenders, args.repeats)
    result = _gpu.report(name, rates, flops_per_token, _gpu.bf16_matmul_peak())
    result["attention_kernel"] = kernel
    print(f"  attention kernel: {kernel}")
    return result


def print_result(r: dict) -> None:
    bf16_peak = f", bf16 {r['bf16_peak_gflops']:.0f}" if "bf16_peak_gflops" in r else ""
    print(f"\n{r['preset']}  (matmul peak {r['peak_gflops']:.0f}{bf16_peak} GFLOP/s, "
          f"{r['useful_flops_per_token'] / 1e6:.1f} useful MFLOP/token, {r['load_after']})")
    print(f"{'':21s} {'tokens/s':>10s} {'vs ref':>7s} {'vs masked':>10s} {'util':>6s}  per-repetition vs masked "
          "(their median: the steadier figure when the machine's speed drifts between repetitions)")
    for v, rate in r["tokens_per_s"].items():
        ratio, masked = r["ratio"].get(v), r["ratio_vs_masked"].get(v)
        each = r["ratio_vs_masked_each"].get(v, [])
        each = " ".join(f"{x:.2f}" for x in each) + (f"  (median {median(each):.2f})" if each else "")
        print(f"{v:21s} {rate:10,.0f} {(f'{ratio:.2f}x' if ratio else ''):>7s} "
              f"{(f'{masked:.2f}x' if masked else ''):>10s} {100 * r['utilisation'][v]:5.1f}%  {each}")


def main(argv: list[str] | None = None) -> list[dict]:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--presets", nargs="+", default=["bert-mini", "bert-base"])
    parser.add_argument("--variants", nargs="+", default=["ember"], choices=VARIANTS)
    parser.add_argument("--batch", type=int, default=32)
    parser.add_argument("--length", type=int, default=128)
    parser.add_argument("--mask-prob", type=float, default=0.15)
    parser.add_argument("--repeats", type=int, default=5, help="alternating repetitions (medians)")
    parser.add_argument("--steps", type=int, default=0, help="steps per repetition (default: 3, 1 for base)")
    parser.add_argument("--warmup", type=int, default=1, help="untimed steps per contender")
    parser.add_argument("--cuda", choices=["auto", "on", "off"], default="auto",
                        help="the bf16 GPU section: auto runs it when a GPU is present and prints why not otherwise")
    parser.add_argument("--cuda-steps", type=int, default=20, help="steps per repetition on the GPU")
    parser.add_argument("--no-compile", action="store_true", help="GPU section without the torch.compile contender")
    parser.add_argument("--system-malloc", action="store_true",
                        help="leave glibc's malloc returning freed large blocks to the OS; by default the process "
                             "keeps them for reuse as `ember pretrain` does (ember.host_memory), which "
                             "applies to every contender in this process")
    add_common_args(parser, "a tiny model and batch, seconds (CI)")
    args = parser.parse_args(argv)
    apply_common_args(args)
    if not args.system_malloc:
        print(f"freed host memory kept for reuse (all contenders): {keep_freed_host_memory()}")
    if args.cuda == "on":  # fail before the CPU section, not after it
        import _gpu

        if (reason := _gpu.cuda_skip_reason()) is not None:
            raise EmberError(f"--cuda on: {reason}")
    configs = {name: model_preset(name) for name in args.presets}
    if args.smoke:
        configs = {"smoke": dataclasses.replace(model_preset("bert-tiny"), vocab_size=2000, num_layers=1)}
        args.batch, args.length, args.repeats, args.steps, args.warmup = 4, 32, 2, 1, 1
        args.cuda_steps, args.no_compile = 2, True
    results = []
    for name, cfg in configs.items():
        steps = args.steps
        if args.steps == 0:
            args.steps = 1 if cfg.hidden_size >= 768 else 3
        results.append(run_preset(name, cfg, args))
        args.steps = steps
        print_result(results[-1])
    results.extend(cuda_results(configs, args))
    if args.json:
        Path(args.json).write_text(json.dumps(results, indent=2))
    return results


def cuda_results(configs: dict, args) -> list[dict]:
    """The GPU section's results, or one record saying why it was skipped."""
    if args.cuda == "off":
        return []
    import _gpu

    reason = _gpu.cuda_skip_reason()
    if reason is not None:
        print(f"\nCUDA section skipped: {reason}")
        return [{"section": "cuda", "skipped": reason}]
    return [{"section": "cuda", **run_preset_cuda(name, cfg, args)} for name, cfg in configs.items()]


if __name__ == "__main__":
    run_cli(main)
