"""Inference: sequence classification, ember vs Hugging Face transformers on the same weights.

    PYTHONPATH=. nice -n 19 .venv/bin/python benchmarks/speed/inference.py \
        --preset bert-base --run RUNS/sst2-mini [--repeats 5]

Two parts, each alternating ember and the reference in one process:
1. Fixed shapes, random weights of ``--preset``: batch 32 x 128 (sequences/s) and 1 x 32
   (latency). Contenders: ember fp32, transformers BertForSequenceClassification fp32
   (attn_implementation="sdpa") holding the same weights (converted with ember.interop),
   ember int8 (ember.serve.quantize: dynamic int8 on every Linear, as `ember export --format int8`).
2. Real inputs, the fine-tuned SST-2 run folder ``--run`` (made by `ember finetune --task
   sst2`), on the 872 SST-2 dev sentences of mixed length: ember sorts by length and pads each
   batch to its longest (SequenceClassifier.predict); the reference as run_glue.py runs it by
   default (pad_to_max_length: every row padded to max length 128) and with dynamic padding
   (padded to each batch's longest, in file order). Reports sentences/s, accuracy, and how
   often each contender's prediction agrees with ember fp32. When onnx and onnxruntime are
   installed (`pip install 'ember[serve]'`), ember's own exports of the run join in: `ember
   export --format onnx` and `--format onnx-int8` (ONNX Runtime dynamic int8), fed the same
   length-sorted batches.
All run under torch.inference_mode.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import sys
import tempfile
from pathlib import Path

import numpy as np
import torch
from torch import nn

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "common"))  # the shared helpers
from _bench import add_common_args, alternate, apply_common_args, clock, clock_name, load, machine, median  # noqa: E402
from _predictors import onnx_predictors, rate_keeping_logits  # noqa: E402

from ember.config import ModelConfig, model_preset  # noqa: E402
from ember.serve.quantize import quantize_int8 as quantized  # noqa: E402
from ember.models import build_backbone  # noqa: E402
from ember.tasks.classification import SequenceClassifier  # noqa: E402
from ember.tasks.featurize import collate  # noqa: E402


def to_reference(module: SequenceClassifier, cfg: ModelConfig):
    """transformers.BertForSequenceClassification holding ``module``'s weights."""
    import transformers

    from ember.interop.hf_bert import config_to_hf, state_to_hf

    hf = config_to_hf(cfg, ["BertForSequenceClassification"], {"num_labels": module.num_labels})
    hf_cfg = transformers.BertConfig(**{k: v for k, v in hf.items() if k not in ("architectures", "model_type")},
                                     attn_implementation="sdpa")
    ref = transformers.BertForSequenceClassification(hf_cfg)
    missing, unexpected = ref.load_state_dict(state_to_hf(module.state_dict(), cfg), strict=False)
    missing = [m for m in missing if not m.endswith("position_ids")]
    if missing or unexpected:
        raise RuntimeError(f"weights did not map: missing {missing[:3]}, unexpected {unexpected[:3]}")
    return ref.eval()


def ember_logits(module):
    return lambda batch: module.logits(batch)


def reference_logits(model):
    return lambda batch: model(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"],
                               token_type_ids=batch["token_type_ids"]).logits


def fixed_batch(cfg: ModelConfig, batch: int, length: int) -> dict:
    g = torch.Generator().manual_seed(0)
    ids = torch.randint(1000, cfg.vocab_size, (batch, length), generator=g)
    return {"input_ids": ids, "attention_mask": torch.ones_like(ids), "token_type_ids": torch.zeros_like(ids)}


def rate(fn, batch: dict, calls: int) -> float:
    """Sequences/s over ``calls`` forward passes."""
    with torch.inference_mode():
        start = clock()
        for _ in range(calls):
            fn(batch)
        return batch["input_ids"].shape[0] * calls / (clock() - start)


def fixed_shapes(module, ref, int8, cfg, args) -> list[dict]:
    rows = []
    for b, t, calls in ((32, 128, args.calls_batch), (1, 32, args.calls_single)):
        if args.smoke:
            b, t, calls = min(b, 4), min(t, 16), 2
        batch = fixed_batch(cfg, b, t)
        fns = {"ember fp32": ember_logits(module), "reference fp32": reference_logits(ref),
               "ember int8": ember_logits(int8)}
        for fn in fns.values():
            rate(fn, batch, 1)  # warm-up
        print(f"batch {b}x{t}: {load()}", flush=True)
        rates = alternate({n: (lambda f=f: rate(f, batch, calls)) for n, f in fns.items()}, args.repeats)
        rows.append({"shape": f"{b}x{t}", "load_after": load(),
                     "sequences_per_s": {n: median(v) for n, v in rates.items()},
                     "ratio_each": {n: [a / b for a, b in zip(v, rates["reference fp32"])] for n, v in rates.items()}})
    return rows


def dev_features(run: Path, smoke: bool):
    from ember.tasks.featurize import encode_examples
    from ember.tasks.readers.glue import read_examples
    from ember.tokenizers import load_tokenizer

    examples = read_examples("sst2", "dev", limit=64 if smoke else None)
    features, _ = encode_examples(examples, load_tokenizer(run / "tokenizer.json"), 128)
    return features


def padded_batches(features: list[dict], pad_id: int, size: int, width: int | None) -> list[dict]:
    """In file order; rows padded to ``width`` (run_glue's pad_to_max_length) or to the batch's longest."""
    batches = []
    for start in range(0, len(features), size):
        chunk = [{**f, "label": None} for f in features[start:start + size]]
        batch = collate(chunk, pad_id)
        if width is not None:
            pad = width - batch["input_ids"].shape[1]
            batch = {k: nn.functional.pad(v, (0, pad), value=pad_id if k == "input_ids" else 0)
                     for k, v in batch.items()}
        batches.append(batch)
    return batches


def onnx_contenders(run: Path, features: list[dict], pad_id: int, size: int, work: Path) -> dict:
    """ember's ONNX fp32 and ONNX Runtime int8 exports of ``run`` (empty without onnxruntime)."""
    names = {"onnx fp32": "ember ONNX fp32 (length-sorted)", "onnx int8": "ember ONNX int8 (length-sorted)"}
    return {names[k]: v for k, v in onnx_predictors(run, features, pad_id, size, work).items()}


def real_inputs(module, ref, int8, features, args, extra: dict | None = None) -> dict:
    labels = np.asarray([f["label"] for f in features])
    size, pad = 32, module.pad_id
    # run_glue pads to its max length, 128, or the model's positions when fewer (the smoke model's 64)
    fixed = padded_batches(features, pad, size, min(128, module.backbone.config.max_position))
    dynamic = padded_batches(features, pad, size, None)

    def over(fn, batches):
        return lambda: np.concatenate([fn(b).float().numpy() for b in batches])

    contenders = {
        "ember fp32 (length-sorted)": lambda: module.predict(features, size),
        "ember int8 (length-sorted)": lambda: int8.predict(features, size),
        "reference fp32 (pad to 128)": over(reference_logits(ref), fixed),
        "reference fp32 (dynamic pad)": over(reference_logits(ref), dynamic),
        **(extra or {}),
    }
    logits = {}
    print(f"SST-2 dev, {len(features)} sentences, mean {np.mean([len(f['input_ids']) for f in features]):.1f} "
          f"tokens: {load()}", flush=True)
    rates = alternate({n: rate_keeping_logits(f, len(features), logits, n) for n, f in contenders.items()},
                      max(1, args.repeats - 2))
    base = logits["ember fp32 (length-sorted)"].argmax(-1)
    result = {"sentences": len(features), "load_after": load(), "rows": {}}
    for name in contenders:
        pred = logits[name].argmax(-1)
        result["rows"][name] = {"sentences_per_s": median(rates[name]),
                                "accuracy": float((pred == labels).mean()),
                                "agrees_with_ember_fp32": float((pred == base).mean())}
    return result


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--preset", default="bert-base", help="model shape for the fixed-shape part")
    parser.add_argument("--run", help="fine-tuned SST-2 run folder (ember finetune --task sst2) for part 2")
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--calls-batch", type=int, default=2, help="32x128 forward passes per repetition")
    parser.add_argument("--calls-single", type=int, default=20, help="1x32 forward passes per repetition")
    parser.add_argument("--no-fixed", action="store_true", help="skip part 1 (fixed shapes)")
    parser.add_argument("--no-onnx", action="store_true", help="skip ember's ONNX / ONNX int8 exports in part 2")
    add_common_args(parser, "tiny model, seconds (CI)")
    args = parser.parse_args(argv)
    apply_common_args(args)
    if args.smoke:
        args.repeats = 2
    cfg = model_preset(args.preset)
    if args.smoke:
        cfg = dataclasses.replace(model_preset("bert-tiny"), vocab_size=2000, num_layers=1)
    torch.manual_seed(0)
    module = SequenceClassifier(build_backbone(cfg), 2, cfg.pad_token_id).eval()
    ref = to_reference(module, cfg)
    int8 = quantized(module)
    check = fixed_batch(cfg, 2, 16)
    with torch.inference_mode():
        diff = (module.logits(check) - reference_logits(ref)(check)).abs().max().item()
    print(f"{args.preset if not args.smoke else 'smoke'}: ember vs reference logits max |diff| {diff:.2e}")
    results = {"machine": machine(), "clock": clock_name(), "preset": args.preset, "max_abs_diff": diff,
               "fixed": [] if args.no_fixed else fixed_shapes(module, ref, int8, cfg, args)}
    for row in results["fixed"]:
        r = row["sequences_per_s"]
        base = r["reference fp32"]
        print(f"\n{row['shape']} ({row['load_after']})")
        for name, value in r.items():
            latency = 1000 / value if row["shape"].startswith("1x") else None
            print(f"  {name:16s} {value:9.1f} seq/s  {value / base:5.2f}x"
                  + (f"  {latency:6.1f} ms" if latency else ""))
    if args.run:
        from ember.tasks.base import get_adapter
        from ember.tasks.task_model import load_task_module
        from ember.runs.folder import load_run_config
        from ember.tokenizers import load_tokenizer, special_token_ids

        run = Path(args.run)
        run_cfg = load_run_config(run, expect_kind="finetune")
        pad = special_token_ids(load_tokenizer(run / "tokenizer.json"))["pad"]
        tuned = load_task_module(run, run_cfg, get_adapter("sst2", run_cfg.model), pad)
        features = dev_features(run, args.smoke)
        with tempfile.TemporaryDirectory(prefix="ember-bench-onnx-") as work:
            extra = {} if args.no_onnx else onnx_contenders(run, features, pad, 32, Path(work))
            real = real_inputs(tuned, to_reference(tuned, run_cfg.model), quantized(tuned), features, args, extra)
        results["sst2_dev"] = real
        base = real["rows"]["reference fp32 (pad to 128)"]["sentences_per_s"]
        print(f"\nSST-2 dev, {run_cfg.model.num_layers} layers x {run_cfg.model.hidden_size} "
              f"({real['load_after']})")
        for name, row in real["rows"].items():
            print(f"  {name:30s} {row['sentences_per_s']:8.1f} sent/s {row['sentences_per_s'] / base:5.2f}x  "
                  f"acc {100 * row['accuracy']:5.2f}  agree {100 * row['agrees_with_ember_fp32']:6.2f}%")
    if args.json:
        Path(args.json).write_text(json.dumps(results, indent=2))
    return results


if __name__ == "__main__":
    main()
