"""BART in ember vs transformers on the same weights: a training step (forward + backward of the
reconstruction loss on a text-infilling + sentence-permutation batch) and generation (greedy and
beam 4), with the losses / tokens checked equal before any time is reported.

Self-contained (no benchmarks/ helpers): builds a random transformers BartForConditionalGeneration
of the bart-mini shape (4 + 4 layers x 256, 4 heads, FFN 1024; dropout 0 so both compute the same
loss), copies it into ember through the interop map, and times each side alternately, CPU time
of this process (``--cpu-time``, default; wall time with ``--wall``), one intra-op thread unless
``--threads``. Prints medians and the ember / transformers ratio (< 1: ember is faster).

    python benchmarks/speed/bart_step.py                    # batch 16 x 128 tokens, 20 steps
    python benchmarks/speed/bart_step.py --batch 32 --length 128 --steps 10 --threads 2
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # this checkout's ember

import numpy as np  # noqa: E402
import torch  # noqa: E402


def clock(cpu: bool) -> float:
    return time.process_time() if cpu else time.perf_counter()


def timed(fn, cpu: bool) -> tuple[float, object]:
    start = clock(cpu)
    out = fn()
    return clock(cpu) - start, out


def build(vocab: int, seed: int):
    import transformers

    from ember.interop import hf_bart
    from ember.models import build_backbone
    from ember.runs.init import backbone_weights

    torch.manual_seed(seed)
    hf_cfg = transformers.BartConfig(
        vocab_size=vocab, d_model=256, encoder_layers=4, decoder_layers=4, encoder_attention_heads=4,
        decoder_attention_heads=4, encoder_ffn_dim=1024, decoder_ffn_dim=1024, max_position_embeddings=1024,
        dropout=0.0, attention_dropout=0.0, activation_dropout=0.0, pad_token_id=1, bos_token_id=0, eos_token_id=2,
        decoder_start_token_id=2, forced_eos_token_id=None, attn_implementation="sdpa")
    hf = transformers.BartForConditionalGeneration(hf_cfg)
    cfg = hf_bart.config_from_hf(hf.config.to_dict())
    ours = build_backbone(cfg)
    ours.load_state_dict(backbone_weights(hf_bart.state_from_hf(hf.state_dict(), cfg)), strict=True)
    return hf, ours


def batch(vocab: int, b: int, length: int, seed: int) -> dict:
    """A BART batch: blocks of `length - 2` random ordinary tokens in 4 'sentences', noised with
    §5.1's infilling (30%, Poisson(3)) + permutation by ember's objective."""
    from ember.config import NoisingConfig
    from ember.data.sentence_blocks import SentenceBlock
    from ember.objectives.bart import BartDenoising, BartNoise

    rng = np.random.default_rng(seed)
    n = length - 2
    blocks = [SentenceBlock(rng.integers(5, vocab, n), np.linspace(n // 4, n, 4).astype(np.int64)) for _ in range(b)]
    noise = BartNoise(NoisingConfig(), 4, np.arange(5, vocab))
    return BartDenoising(torch.nn.Identity(), noise, 0, 2, 1, n).make_batch(blocks, rng)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--batch", type=int, default=16)
    p.add_argument("--length", type=int, default=128, help="tokens per document, <s> and </s> included")
    p.add_argument("--vocab", type=int, default=8000)
    p.add_argument("--steps", type=int, default=20)
    p.add_argument("--gen-batch", type=int, default=4)
    p.add_argument("--gen-tokens", type=int, default=32)
    p.add_argument("--gen-repeats", type=int, default=5)
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--wall", action="store_true", help="wall-clock time instead of this process's CPU time")
    p.add_argument("--cpu-time", action="store_true", help="CPU time (the default; kept for the usual spelling)")
    args = p.parse_args()
    torch.set_num_threads(args.threads)
    cpu = not args.wall

    from ember.nn.lm_loss import seq2seq_loss
    from ember.seq2seq_generation import Seq2SeqGenerationConfig, seq2seq_generate

    hf, ours = build(args.vocab, 0)
    hf.train(), ours.train()  # dropout is 0: train mode, the same arithmetic

    def ember_step(data):
        ours.zero_grad(set_to_none=True)
        loss, _ = seq2seq_loss(ours, data)
        loss.backward()
        return loss.detach()

    def hf_step(data):
        hf.zero_grad(set_to_none=True)
        loss = hf(input_ids=data["input_ids"], attention_mask=data["attention_mask"], labels=data["labels"]).loss
        loss.backward()
        return loss.detach()

    times = {"ember": [], "transformers": []}
    for step in range(args.steps + 2):  # 2 warm-up steps
        data = batch(args.vocab, args.batch, args.length, step)
        t_e, l_e = timed(lambda: ember_step(data), cpu)
        t_h, l_h = timed(lambda: hf_step(data), cpu)
        torch.testing.assert_close(l_e, l_h, atol=1e-4, rtol=0)  # same weights, same batch, same loss
        if step >= 2:
            times["ember"].append(t_e)
            times["transformers"].append(t_h)
    e, h = statistics.median(times["ember"]), statistics.median(times["transformers"])
    kind = "CPU" if cpu else "wall"
    print(f"training step, batch {args.batch} x {args.length} tokens, {args.threads} thread(s), bart-mini shape, "
          f"vocab {args.vocab}: ember {e:.3f} s, transformers {h:.3f} s median {kind} time over {args.steps} steps; "
          f"ratio ember/transformers {e / h:.3f}; losses equal (last {float(l_e):.4f})")

    hf.eval(), ours.eval()
    g = torch.Generator().manual_seed(1)
    inputs = torch.randint(5, args.vocab, (args.gen_batch, 64), generator=g)
    inputs[:, 0], inputs[:, -1] = 0, 2
    mask = torch.ones_like(inputs)
    for beams in (1, 4):
        # </s> forbidden until the last token, so every row decodes the full length on both sides
        cfg = Seq2SeqGenerationConfig(max_new_tokens=args.gen_tokens, num_beams=beams, min_new_tokens=args.gen_tokens - 1)
        te, th = [], []
        for _ in range(args.gen_repeats):
            t, got = timed(lambda: seq2seq_generate(ours, inputs, mask, cfg, 2), cpu)
            te.append(t)
            with torch.no_grad():
                t, ref = timed(lambda: hf.generate(input_ids=inputs, attention_mask=mask, do_sample=False,
                                                   max_new_tokens=args.gen_tokens, num_beams=beams,
                                                   min_new_tokens=args.gen_tokens - 1), cpu)
            th.append(t)
            ref = [r[1:][:r[1:].index(2)] if 2 in r[1:] else r[1:] for r in ref.tolist()]  # after the start </s>, up to the next
            assert got == ref, "ember and transformers generated different tokens"
        e, h = statistics.median(te), statistics.median(th)
        name = "greedy" if beams == 1 else f"beam {beams}"
        new = sum(len(r) for r in got)
        print(f"generate {name}, {args.gen_batch} inputs x 64 tokens, {new} new tokens in all: ember {e:.3f} s, "
              f"transformers {h:.3f} s median {kind} time over {args.gen_repeats}; ratio {e / h:.3f}; tokens equal")


if __name__ == "__main__":
    main()
