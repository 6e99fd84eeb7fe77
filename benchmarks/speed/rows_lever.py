"""The last layer at the rows a loss reads (ember.nn.query_rows), per pre-training objective, on
real batches: one training step with the encoder's last layer at the read rows against the
same step with the last layer everywhere, alternated in one process.

    PYTHONPATH=. OMP_NUM_THREADS=1 .venv/bin/python benchmarks/speed/rows_lever.py --data runs/wiki \\
        [--xlm-data runs/en-ru/prepared] --preset bert-mini --cpu-time [--repeats 9]

--data is a prepared corpus (`ember prepare`); batches are 32 segments of 128 tokens cut from
it as `ember pretrain` cuts them, masked by each objective's own scheme: BERT's random 15% of
tokens (MLM only; its rows are the masked tokens), SpanBERT's geometric whole-word spans
(Joshi et al. 2020; its rows are the masked tokens and each span's two boundary tokens, which
the span-boundary objective reads; SpanBERT also runs 'before', the step as ember ran it before
its span-boundary loss went through the fused head: last layer everywhere, (N, V) logits and
F.cross_entropy), and, with --xlm-data (a corpus prepared with language codes), XLM's MLM over
its language streams with language embeddings (Lample & Conneau 2019; its rows are the masked
tokens; 'before' is its step with the last layer everywhere and its tied head's logits handed to
F.cross_entropy, before the head was fused). A step is forward, backward, clipping and fused AdamW,
dropout 0.1, as `ember pretrain` runs it; both contenders start from the same weights and
read the same batch. The outputs, gradients and dropout masks of the two are the same
(tests/models/test_last_layer_at_rows.py); only the time differs.
"""

from __future__ import annotations

import argparse
import dataclasses
import sys
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "common"))  # the shared helpers
from _bench import add_common_args, alternate, apply_common_args, clock, load, median, run_cli  # noqa: E402
from pretrain_throughput import training_step  # noqa: E402

from ember.config import DataConfig, TrainConfig, model_preset  # noqa: E402
from ember.errors import EmberError  # noqa: E402
from ember.data.pairs import SegmentPairDataset  # noqa: E402
from ember.data.shards import TokenCorpus  # noqa: E402
from ember.models import build_backbone  # noqa: E402
from ember.objectives.bert import BertPretraining  # noqa: E402
from ember.objectives.masking import build_masker  # noqa: E402
from ember.objectives.mlm import masked_lm_loss  # noqa: E402
from ember.objectives.spanbert import SpanBertPretraining  # noqa: E402
from ember.train.optim import build_optimizer  # noqa: E402

MASKING = {"bert": "token", "spanbert": "span"}
OBJECTIVES = ("bert", "spanbert", "xlm")


class _SpanBertThroughLogits(SpanBertPretraining):
    """SpanBERT as ember ran it before the span-boundary loss was fused: the last layer everywhere,
    and the SBO's (N, V) logits made and handed to F.cross_entropy (the twin for 'before')."""

    def forward(self, batch):
        hidden = self.backbone(batch["input_ids"], batch["attention_mask"], batch["token_type_ids"]).last_hidden_state
        labels, embeddings = batch["labels"], self.backbone.word_embeddings
        mlm_loss, metrics = masked_lm_loss(self.mlm, hidden, embeddings, labels)
        where = labels != -100
        rows, cols = where.nonzero(as_tuple=True)
        start, end = batch["span_start"][where], batch["span_end"][where]
        logits = self.sbo(hidden[rows, start - 1], hidden[rows, end], cols - start, embeddings)  # (N, V)
        return mlm_loss + F.cross_entropy(logits.float(), labels[where]), metrics


def masked_objective(objective: str, corpus: TokenCorpus, args):
    """BERT or SpanBERT at ``args.preset``'s shape: (build(through_logits) -> module, batch, rows read)."""
    cfg = dataclasses.replace(model_preset(args.preset), vocab_size=corpus.vocab_size)  # as `ember pretrain` sizes it
    special = {**corpus.special_token_ids, "tokenizer_path": str(corpus.tokenizer_path)}
    data = DataConfig(masking=MASKING[objective], nsp=False, max_predictions=0)

    def build(through_logits: bool = False) -> nn.Module:
        torch.manual_seed(0)
        masker = build_masker(data, special, cfg.vocab_size, seed=0)
        if objective == "spanbert":
            cls = _SpanBertThroughLogits if through_logits else SpanBertPretraining
            return cls(build_backbone(cfg), special, data, masker)
        return BertPretraining(build_backbone(cfg), special, data, "none", masker)
    probe = build()
    segments = SegmentPairDataset(corpus, args.length, probe.pair_mode, seed=0)
    batch = probe.make_batch([segments.example(i) for i in range(args.batch)], np.random.default_rng(0))
    masked = batch["labels"] != -100
    read = masked.clone()
    if objective == "spanbert":  # the span-boundary objective also reads each span's boundaries
        rows, _ = masked.nonzero(as_tuple=True)
        read[rows, batch["span_start"][masked] - 1] = True
        read[rows, batch["span_end"][masked]] = True
    return build, batch, read


def xlm_objective(corpus: TokenCorpus, args):
    """XLM's MLM on the language streams of a multilingual corpus (--xlm-data), at the xlm preset of
    ``args.preset``'s shape (xlm-mini for bert-mini), with one language embedding per stream."""
    from ember.config import XlmConfig
    from ember.data.multilingual import corpus_streams
    from ember.objectives.xlm import XlmPretraining

    codes, _ = corpus_streams(corpus)
    shape = model_preset(args.preset)
    cfg = dataclasses.replace(model_preset("xlm-mini"), vocab_size=corpus.vocab_size, hidden_size=shape.hidden_size,
                              num_layers=shape.num_layers, num_heads=shape.num_heads,
                              intermediate_size=shape.intermediate_size, num_languages=max(len(codes), 2),
                              languages=",".join(codes) if len(codes) > 1 else "")
    data = DataConfig(max_seq_length=args.length)

    class XlmThroughLogits(XlmPretraining):
        """XLM as ember ran it before its head was fused: the last layer everywhere, the (N, V)
        logits at the masked rows, per-token F.cross_entropy and argmax (the twin for 'before')."""

        def forward(self, batch):
            where = batch["labels"] != -100
            logits = self.lm(self.hidden(batch).last_hidden_state[where], self.backbone.word_embeddings)
            targets = batch["labels"][where]
            per_token = F.cross_entropy(logits.float(), targets, reduction="none")
            return per_token.mean(), {"mlm_acc": (int((logits.argmax(-1) == targets).sum()), len(targets))}

    def build(through_logits: bool = False) -> nn.Module:
        torch.manual_seed(0)
        cls = XlmThroughLogits if through_logits else XlmPretraining
        return cls(build_backbone(cfg), corpus.special_token_ids, data, XlmConfig(), "mlm")
    examples = build().build_dataset(corpus, data, seed=0)
    batch = build().make_batch([examples.example(i) for i in range(args.batch)], np.random.default_rng(0))
    return build, batch, batch["labels"] != -100


def run_objective(objective: str, args) -> dict:
    if objective == "xlm":
        build, batch, read = xlm_objective(TokenCorpus(args.xlm_data, "train"), args)
    else:
        build, batch, read = masked_objective(objective, TokenCorpus(args.data, "train"), args)
    masked = batch["labels"] != -100
    train = TrainConfig()
    contenders = {"rows": (True, False), "everywhere": (False, False)}  # (takes_rows, head through logits)
    if objective in ("spanbert", "xlm"):
        contenders["before"] = (False, True)
    steps = {}
    for name, (at_rows, through_logits) in contenders.items():
        module = build(through_logits).train()
        module.backbone.takes_rows = at_rows
        step = training_step(module, module, build_optimizer(module, train), train.max_grad_norm)
        for _ in range(args.warmup):
            step(batch)
        steps[name] = step

    def rate(step) -> float:
        start = clock()
        step(batch)
        return batch["input_ids"].numel() / (clock() - start)
    tokens = int(batch["attention_mask"].sum())
    print(f"{objective} ({args.preset}): batch {args.batch}x{args.length}, {tokens} real tokens, "
          f"{int(masked.sum())} masked, {int(read.sum())} rows read; {load()}", flush=True)
    rates = alternate({name: (lambda s=s: rate(s)) for name, s in steps.items()}, args.repeats)
    each = [a / b for a, b in zip(rates["rows"], rates["everywhere"])]
    result = {"objective": objective, "preset": args.preset, "masked": int(masked.sum()), "read": int(read.sum()),
              "tokens_per_s": {name: median(values) for name, values in rates.items()},
              "ratio": median(rates["rows"]) / median(rates["everywhere"]), "ratio_each": each,
              "load_after": load()}
    print(f"  last layer at the read rows {result['tokens_per_s']['rows']:,.0f} tokens/s, everywhere "
          f"{result['tokens_per_s']['everywhere']:,.0f}: {result['ratio']:.2f}x (median of the per-repetition "
          f"ratios {median(each):.2f}x, spread {min(each):.2f}-{max(each):.2f})", flush=True)
    if "before" in rates:
        before = [a / b for a, b in zip(rates["rows"], rates["before"])]
        result["ratio_vs_before"], result["ratio_vs_before_each"] = median(rates["rows"]) / median(rates["before"]), before
        print(f"  against the step before (last layer everywhere, {'SBO' if objective == 'spanbert' else 'head'} "
              f"through its logits) "
              f"{result['tokens_per_s']['before']:,.0f} tokens/s: {result['ratio_vs_before']:.2f}x (median of the "
              f"per-repetition ratios {median(before):.2f}x)", flush=True)
    return result


def main(argv: list[str] | None = None) -> list[dict]:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--data", help="a prepared corpus folder (ember prepare), for bert and spanbert")
    parser.add_argument("--xlm-data", help="a prepared multilingual corpus (ember prepare --lang ...), for xlm")
    parser.add_argument("--preset", default="bert-mini", help="model shape (vocabulary from the corpus)")
    parser.add_argument("--objectives", nargs="+", choices=OBJECTIVES, default=None,
                        help="default: bert and spanbert with --data, xlm with --xlm-data")
    parser.add_argument("--batch", type=int, default=32)
    parser.add_argument("--length", type=int, default=128)
    parser.add_argument("--repeats", type=int, default=9, help="alternating one-step repetitions (medians)")
    parser.add_argument("--warmup", type=int, default=2)
    add_common_args(parser, "tiny shapes and 2 repetitions, to check the script runs")
    args = parser.parse_args(argv)
    if args.smoke:
        args.preset, args.batch, args.length, args.repeats, args.warmup = "bert-tiny", 4, 64, 2, 1
    given = ([o for o in MASKING] if args.data else []) + (["xlm"] if args.xlm_data else [])
    objectives = args.objectives or given
    missing = sorted({"--xlm-data" if o == "xlm" else "--data" for o in objectives if o not in given})
    if not objectives or missing:
        raise EmberError(f"rows_lever.py needs {' and '.join(missing) or '--data or --xlm-data'}: bert and spanbert "
                         "read a prepared corpus (--data), xlm a multilingual one (--xlm-data)")
    apply_common_args(args)
    results = [run_objective(objective, args) for objective in objectives]
    if args.json:
        import json

        Path(args.json).write_text(json.dumps(results, indent=2))
    return results


if __name__ == "__main__":
    run_cli(main)
