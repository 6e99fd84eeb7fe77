"""Training steps of the families after BERT (GPT-2, T5, BART, XLNet): ember against transformers.

    PYTHONPATH=. OMP_NUM_THREADS=1 .venv/bin/python benchmarks/speed/family_step.py --cpu-time \\
        [--families gpt2 t5 bart xlnet] [--repeats 7] [--steps 1]

One training step (forward, backward, the recipe's clipping and optimizer) at each family's recipe
shape, ember and transformers in turn in one process. Both start from the same weights: ember's
model exported through its own interop (the code `ember convert --to-hf` runs) into the
transformers class, and both read the same batch, made by ember's objective (T5's spans and
sentinels, XLNet's permutation masks, target mappings and memory: what `ember pretrain` feeds).
Before timing, the two losses with dropout off are printed side by side and must agree, so both
sides compute the same thing; then both train with the recipe's dropout (0.1).

  gpt2   recipe gpt2-mini: 32 blocks of 256 tokens, vocabulary 8,192; ember's CausalLM (the LM
         head and loss fused, never forming the (8,192 x 8,192) logits) against
         GPT2LMHeadModel(labels=ids), SDPA attention; both fused AdamW and clipping at 1.0
  t5     recipe t5-mini: 32 inputs of 128 tokens, 29-token targets, vocabulary 8,100 with 100
         sentinels; ember's span-corruption step against T5ForConditionalGeneration(labels=...);
         Adafactor on both sides (ember's; transformers' with the recipe's settings:
         lr 0.01, scale_parameter, decay 0.8, update clipping 1.0, no momentum), no gradient clipping
  bart   recipe bart-mini: micro-batches of 32 blocks of 128 tokens in 4 sentences, vocabulary
         8,000, noised by ember's BART objective (text infilling of 30% in Poisson(3) spans +
         sentence permutation, Lewis et al. 2020 §5.1); ember's seq2seq loss (fused head and
         loss) against BartForConditionalGeneration(labels=...) (spans count tokens: the ids are
         random, so there are no words); fused AdamW (betas 0.9/0.98,
         eps 1e-6) and clipping at 1.0 on both sides
  xlnet  recipe xlnet-mini: 32 sequences of 128 tokens with 96 memory tokens, 21 targets each
         (K = 6), vocabulary 30,522; ember's PermutationLM against XLNetLMHeadModel(perm_mask,
         target_mapping, labels, mems), the memory computed without gradient on both sides;
         both fused AdamW and clipping at 1.0

The reference's optimizer is the informed user's: fused AdamW (transformers' Trainer defaults to
the slower per-tensor loop on the CPU), and transformers' own Adafactor for T5. Random token ids
(the costs do not depend on them); the objectives lay them out as on real text.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import sys
from pathlib import Path
from typing import Callable

import numpy as np
import torch
from torch import nn

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "common"))  # the shared helpers
from _bench import add_common_args, alternate, apply_common_args, clock, load, median, run_cli  # noqa: E402

from ember.config import DenoisingConfig, NoisingConfig, PlmConfig, TrainConfig, model_preset  # noqa: E402
from ember.data.sentence_blocks import SentenceBlock  # noqa: E402
from ember.data.memory_pairs import MemoryPair  # noqa: E402
from ember.interop.families import interop_for_family  # noqa: E402
from ember.models import build_backbone  # noqa: E402
from ember.objectives import noise  # noqa: E402
from ember.objectives.bart import BartDenoising, BartNoise  # noqa: E402
from ember.objectives.clm import CausalLM  # noqa: E402
from ember.objectives.plm import STRUCTURE_TOKENS, PermutationLM  # noqa: E402
from ember.objectives.span_corruption import Corruption, Seq2SeqDenoising  # noqa: E402
from ember.host_memory import keep_freed_host_memory  # noqa: E402
from ember.train.optim import build_optimizer  # noqa: E402

FAMILIES = ("gpt2", "t5", "bart", "xlnet")
# family -> (preset, vocabulary, batch, sequence length, memory length)
SHAPES = {"gpt2": ("gpt2-mini", 8192, 32, 256, 0), "t5": ("t5-mini", 8100, 32, 128, 0),
          "bart": ("bart-mini", 8000, 32, 128, 0), "xlnet": ("xlnet-mini", 30522, 32, 128, 96)}
SMOKE = {"gpt2": ("gpt2-tiny", 500, 2, 32, 0), "t5": ("t5-tiny", 500, 2, 32, 0), "bart": ("bart-tiny", 500, 2, 32, 0),
         "xlnet": ("xlnet-mini", 500, 2, 32, 8)}
ADAMW = TrainConfig(lr=5e-4, weight_decay=0.01, max_grad_norm=1.0)
BART_ADAMW = TrainConfig(lr=5e-4, weight_decay=0.01, max_grad_norm=1.0, adam_beta2=0.98, adam_eps=1e-6)  # bart-mini's
ADAFACTOR = TrainConfig(optimizer="adafactor", lr=0.01, weight_decay=0.0, max_grad_norm=0.0)


@dataclasses.dataclass
class Race:
    """One family's two sides: (module, loss of a batch) each, the batch, and the recipe's optimizer."""

    family: str
    ember: nn.Module
    ember_loss: Callable[[dict], torch.Tensor]
    hf: nn.Module
    hf_loss: Callable[[dict], torch.Tensor]
    batch: dict
    train: TrainConfig
    tokens: int  # input tokens per step (what tokens/s counts)


def to_transformers(backbone: nn.Module) -> nn.Module:
    """The transformers model holding ``backbone``'s weights, through ember's interop."""
    import transformers

    cfg = backbone.config
    interop = interop_for_family(cfg.family)
    state = {f"backbone.{k}": v.detach().clone() for k, v in backbone.state_dict().items()}
    architecture = interop.hf_architecture(state)
    hf_config = interop.config_to_hf(cfg, [architecture])
    # GPT-2's config names its 50,257-word vocabulary's end-of-text; here the vocabulary is smaller
    options = {"attn_implementation": "sdpa", "bos_token_id": cfg.vocab_size - 1,
               "eos_token_id": cfg.vocab_size - 1} if cfg.family == "gpt2" else {}
    config = transformers.AutoConfig.for_model(hf_config.pop("model_type"), **hf_config, **options)
    model = getattr(transformers, architecture)(config)
    missing, unexpected = model.load_state_dict(interop.state_to_hf(state, cfg), strict=False)
    tied = {"lm_head.weight", "lm_loss.weight", "encoder.embed_tokens.weight", "decoder.embed_tokens.weight",
            "model.encoder.embed_tokens.weight", "model.decoder.embed_tokens.weight"}  # the last two: BART's
    if unexpected or set(missing) - tied:
        raise RuntimeError(f"weights not carried over: missing {missing}, unexpected {unexpected}")
    return model


def gpt2_race(preset: str, vocab: int, batch: int, length: int, _mem: int) -> Race:
    backbone = build_backbone(dataclasses.replace(model_preset(preset), vocab_size=vocab, max_position=max(length, 64)))
    module = CausalLM(backbone, eot_id=vocab - 1)
    rng = np.random.default_rng(0)
    data = module.make_batch([rng.integers(0, vocab - 1, length) for _ in range(batch)], rng)
    hf = to_transformers(backbone)
    return Race("gpt2", module, lambda b: module(b)[0], hf,
                lambda b: hf(input_ids=b["input_ids"], labels=b["input_ids"]).loss, data, ADAMW, batch * length)


def t5_race(preset: str, vocab: int, batch: int, length: int, _mem: int) -> Race:
    backbone = build_backbone(dataclasses.replace(model_preset(preset), vocab_size=vocab))
    sentinels = np.arange(vocab - 1, vocab - 101, -1, dtype=np.int64)  # T5's layout: <extra_id_0> last
    words = noise.NoiseVocab(sentinels, np.arange(3, vocab - 100, dtype=np.int64))
    corruption = Corruption("span_corruption", DenoisingConfig(), length, words, eos_id=1)
    module = Seq2SeqDenoising(backbone, corruption, pad_id=0)
    rng = np.random.default_rng(0)
    data = module.make_batch([rng.integers(3, vocab - 100, corruption.raw_length) for _ in range(batch)], rng)
    hf = to_transformers(backbone)
    return Race("t5", module, lambda b: module(b)[0], hf,
                lambda b: hf(input_ids=b["input_ids"], attention_mask=b["attention_mask"], labels=b["labels"]).loss,
                data, ADAFACTOR, int(data["input_ids"].numel()))


def bart_race(preset: str, vocab: int, batch: int, length: int, _mem: int) -> Race:
    backbone = build_backbone(dataclasses.replace(model_preset(preset), vocab_size=vocab))
    # ids 0-4: <s> <pad> </s> <unk> <mask>, as BART's byte-level BPE
    noising = BartNoise(NoisingConfig(), mask_id=4, ordinary=np.arange(5, vocab))
    module = BartDenoising(backbone, noising, bos_id=0, eos_id=2, pad_id=1, block_size=length - 2)
    rng = np.random.default_rng(0)
    n = length - 2  # <s> ... </s> around each block
    ends = np.linspace(n // 4, n, 4).astype(np.int64)  # 4 sentences a block, for the permutation
    blocks = [SentenceBlock(rng.integers(5, vocab, n), ends) for _ in range(batch)]
    data = module.make_batch(blocks, rng)
    hf = to_transformers(backbone)
    return Race("bart", module, lambda b: module(b)[0], hf,
                lambda b: hf(input_ids=b["input_ids"], attention_mask=b["attention_mask"], labels=b["labels"]).loss,
                data, BART_ADAMW, int(data["input_ids"].numel()))


def xlnet_race(preset: str, vocab: int, batch: int, length: int, mem: int) -> Race:
    cfg = dataclasses.replace(model_preset(preset), vocab_size=vocab, mem_len=mem)
    backbone = build_backbone(cfg)
    special = {"sep": 4, "cls": 3}
    module = PermutationLM(backbone, PlmConfig(), length, special)
    rng = np.random.default_rng(0)
    half = (length - STRUCTURE_TOKENS) // 2
    examples = [MemoryPair(memory=rng.integers(10, vocab, mem), tokens_a=rng.integers(10, vocab, half),
                           tokens_b=rng.integers(10, vocab, length - STRUCTURE_TOKENS - half), b_follows=True)
                for _ in range(batch)]
    data = module.make_batch(examples, rng)
    hf = to_transformers(backbone)

    def hf_loss(b):
        with torch.no_grad():  # the memory carries no gradient (Transformer-XL; ember's backbone.memory)
            memory = b["memory_ids"]
            mems = hf.transformer(memory, token_type_ids=torch.zeros_like(memory), use_mems=True).mems
        return hf(b["input_ids"], attention_mask=b["attention_mask"], token_type_ids=b["token_type_ids"], mems=mems,
                  perm_mask=b["perm_mask"].float(), target_mapping=b["target_mapping"], labels=b["target_labels"],
                  use_mems=True).loss
    return Race("xlnet", module, lambda b: module(b)[0], hf, hf_loss, data, ADAMW, batch * length)


RACES = {"gpt2": gpt2_race, "t5": t5_race, "bart": bart_race, "xlnet": xlnet_race}


def reference_optimizer(model: nn.Module, train: TrainConfig) -> torch.optim.Optimizer:
    """What an informed transformers user runs: fused AdamW with BERT-style decay groups, or
    transformers' Adafactor with T5's settings."""
    decay = [p for n, p in model.named_parameters() if p.ndim > 1]
    rest = [p for n, p in model.named_parameters() if p.ndim <= 1]
    groups = [{"params": decay, "weight_decay": train.weight_decay}, {"params": rest, "weight_decay": 0.0}]
    if train.optimizer == "adafactor":
        from transformers.optimization import Adafactor

        return Adafactor(groups, lr=train.lr, scale_parameter=train.adafactor_scale_parameter, relative_step=False,
                         warmup_init=False, decay_rate=-train.adafactor_decay_rate,
                         clip_threshold=train.adafactor_clip_threshold, beta1=None)
    return torch.optim.AdamW(groups, lr=train.lr, betas=(train.adam_beta1, train.adam_beta2), eps=train.adam_eps,
                             fused=True)


def training_step(model: nn.Module, loss_of, optimizer, max_grad_norm: float):
    def step(batch):
        loss = loss_of(batch)
        loss.backward()
        if max_grad_norm > 0:
            nn.utils.clip_grad_norm_(model.parameters(), max_grad_norm)
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        return loss
    return step


def same_loss(race: Race) -> tuple[float, float]:
    """Both losses with dropout off, before any step: the two sides must compute one thing."""
    race.ember.eval()
    race.hf.eval()
    with torch.no_grad():
        ours, theirs = float(race.ember_loss(race.batch)), float(race.hf_loss(race.batch))
    race.ember.train()
    race.hf.train()
    if abs(ours - theirs) > 1e-4 * max(1.0, abs(theirs)):
        raise RuntimeError(f"{race.family}: ember's loss {ours:.6f} and transformers' {theirs:.6f} differ: "
                           "the two sides do not compute the same step")
    return ours, theirs


def run_family(family: str, args) -> dict:
    torch.manual_seed(0)
    race = RACES[family](*(SMOKE if args.smoke else SHAPES)[family])
    ours, theirs = same_loss(race)
    steps = {
        "ember": training_step(race.ember, race.ember_loss, build_optimizer(race.ember, race.train),
                               race.train.max_grad_norm),
        "transformers": training_step(race.hf, race.hf_loss, reference_optimizer(race.hf, race.train),
                                      race.train.max_grad_norm),
    }

    def timed(step) -> Callable[[], float]:
        def run() -> float:
            step(race.batch)  # untimed: the other side ran last
            start = clock()
            for _ in range(args.steps):
                step(race.batch)
            return race.tokens * args.steps / (clock() - start)
        return run

    preset = (SMOKE if args.smoke else SHAPES)[family][0]
    print(f"{family} ({preset}, batch {tuple(race.batch['input_ids'].shape)}): loss before training, dropout off: "
          f"ember {ours:.5f}, transformers {theirs:.5f}; {load()}", flush=True)
    rates = alternate({name: timed(step) for name, step in steps.items()}, args.repeats)
    each = [a / b for a, b in zip(rates["ember"], rates["transformers"])]
    result = {"family": family, "preset": preset, "batch": list(race.batch["input_ids"].shape),
              "loss_ember": ours, "loss_transformers": theirs, "load_after": load(),
              "tokens_per_s": {k: median(v) for k, v in rates.items()}, "ratio_each": each,
              "ratio_of_medians": median(rates["ember"]) / median(rates["transformers"]),
              "median_of_ratios": float(np.median(each))}
    print(f"{family}: ember {result['tokens_per_s']['ember']:,.0f} vs transformers "
          f"{result['tokens_per_s']['transformers']:,.0f} input tokens/s: {result['ratio_of_medians']:.2f}x "
          f"(median of ratios {result['median_of_ratios']:.2f}x; each {' '.join(f'{x:.2f}' for x in each)})\n",
          flush=True)
    return result


def main(argv: list[str] | None = None) -> list[dict]:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--families", nargs="+", default=list(FAMILIES), choices=FAMILIES)
    parser.add_argument("--repeats", type=int, default=7, help="alternating repetitions (medians)")
    parser.add_argument("--steps", type=int, default=1, help="timed steps per repetition")
    add_common_args(parser, "tiny models and batches, seconds (CI)")
    args = parser.parse_args(argv)
    if args.smoke:
        args.repeats, args.steps = 2, 1
    apply_common_args(args)
    import transformers

    transformers.logging.set_verbosity_error()  # its notes on config defaults are not this report's
    keep_freed_host_memory()  # as `ember pretrain` does; process-wide, so both sides get it
    results = [run_family(family, args) for family in args.families]
    if args.json:
        Path(args.json).write_text(json.dumps(results, indent=2))
    return results


if __name__ == "__main__":
    run_cli(main)
