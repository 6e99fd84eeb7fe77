"""Text generation with a causal LM (GPT-1/GPT-2 run folders): the Python API of `ember generate`.

    from ember.generate import GenerationConfig, load_causal_lm, generate_text
    model, tokenizer = load_causal_lm("runs/gpt2-tiny")
    generate_text(model, tokenizer, ["The city of"], GenerationConfig(max_new_tokens=20))

Decoding: greedy (``temperature=0``, the default) or sampling from softmax(logits / T),
optionally restricted to the ``top_k`` most likely tokens (Fan et al. 2018; GPT-2's samples)
and/or to the smallest set whose probability reaches ``top_p`` (nucleus sampling, Holtzman
et al. 2020). Generation stops per prompt at the end-of-text token, at a stop sequence or
after ``max_new_tokens``.

Batched prompts are left-padded so that every prompt's next token sits in the last column;
positions count real tokens only and padding is masked, so a prompt's continuation does not
depend on the batch it is in. A key/value cache (ember.nn.kv_cache), allocated once for prompt
+ new tokens and written in place, makes each new token cost one position: the prompt is run
once, then one token per step. At batch 1 a step is bound by reading the weights; one-row
products go through copies of them laid out for one row, layer-sized ones through numpy's
OpenBLAS (ember.nn.onednn.row_product, ember.host_blas; docs/performance.md).

TL;DR mode (Radford et al. 2019, §3.6): the article followed by "\\nTL;DR:", top-k sampling
with k = 2, 100 new tokens, of which the first three sentences are the summary.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

import torch

from ember.errors import EmberError

TLDR_SUFFIX = "\nTL;DR:"


@dataclass(frozen=True)
class GenerationConfig:
    max_new_tokens: int = 50
    temperature: float = 0.0  # 0 = greedy; > 0 samples from softmax(logits / temperature)
    top_k: int = 0  # 0 = no top-k cut
    top_p: float = 1.0  # 1 = no nucleus cut
    stop: tuple[str, ...] = ()  # cut the text before the first of these, and stop there
    seed: int = 0
    stop_at_eot: bool = True  # end-of-text ends a prompt's continuation

    def __post_init__(self) -> None:
        if self.max_new_tokens < 1:
            raise EmberError(f"max_new_tokens={self.max_new_tokens}; generate at least 1 token")
        if self.temperature < 0:
            raise EmberError(f"temperature={self.temperature} must be >= 0 (0 = greedy)")
        if self.top_k < 0:
            raise EmberError(f"top_k={self.top_k} must be >= 0 (0 = no limit)")
        if not 0 < self.top_p <= 1:
            raise EmberError(f"top_p={self.top_p} must be in (0, 1] (1 = no nucleus cut)")

    @property
    def greedy(self) -> bool:
        return self.temperature == 0


def tldr_config(**overrides) -> GenerationConfig:
    """GPT-2's summarization settings (§3.6): top-k random sampling with k = 2, 100 tokens."""
    return GenerationConfig(**{"max_new_tokens": 100, "temperature": 1.0, "top_k": 2, **overrides})


def first_sentences(text: str, n: int = 3) -> str:
    """The first ``n`` sentences of ``text`` (GPT-2 keeps three generated sentences as the summary)."""
    parts = re.split(r"(?<=[.!?])\s+", text.strip())
    return " ".join(parts[:n])


# ---- loading ---------------------------------------------------------------------------------

def read_generator_run(run_dir: str | Path, families: tuple[str, ...]):
    """(RunConfig, its ``backbone.*`` weights, tokenizer) of a run folder of one of ``families``;
    a fine-tuned run may also hold a classifier, which generation does not need."""
    from ember.runs.checkpoint import load_weights
    from ember.runs.folder import check_family, load_run_config
    from ember.tokenizers import load_tokenizer

    run_dir = Path(run_dir)
    cfg = load_run_config(run_dir)
    check_family(run_dir, cfg, families)
    weights = run_dir / "model.safetensors"
    if not weights.is_file():
        raise EmberError(f"{weights} is missing: the run has no final weights yet (finish or "
                         "resume `ember pretrain`, or import a checkpoint with `ember convert`)")
    state = {k: v for k, v in load_weights(weights).items() if k.startswith("backbone.")}
    return cfg, state, load_tokenizer(run_dir / "tokenizer.json")


def load_weights_into(model, state: dict, run_dir: str | Path) -> None:
    """Load a run's weights into ``model``; a parameter the file lacks is an EmberError."""
    missing, _ = model.load_state_dict(state, strict=False)
    if missing:
        raise EmberError(f"{Path(run_dir) / 'model.safetensors'} does not fit the model in config.yaml "
                         f"(missing {missing[:3]})")


def load_causal_lm(run_dir: str | Path, device: str = "cpu"):
    """(CausalLM in eval mode, tokenizer) from a run folder of a GPT-1/GPT-2 model."""
    from ember.config import DECODER_FAMILIES
    from ember.models import build_backbone
    from ember.models.decoder import CausalLM

    cfg, state, tokenizer = read_generator_run(run_dir, DECODER_FAMILIES)
    model = CausalLM(build_backbone(cfg.model))
    load_weights_into(model, state, run_dir)
    return model.to(device).eval(), tokenizer


# ---- decoding --------------------------------------------------------------------------------

def filter_logits(logits: torch.Tensor, top_k: int = 0, top_p: float = 1.0) -> torch.Tensor:
    """logits (B, V) with every token outside the top-k / top-p set at -inf."""
    if top_k and top_k < logits.shape[-1]:
        kth = logits.topk(top_k, dim=-1).values[:, -1:]  # (B, 1)
        logits = logits.masked_fill(logits < kth, float("-inf"))
    if top_p < 1.0:
        sorted_logits, order = logits.sort(dim=-1, descending=True)
        probs = sorted_logits.softmax(-1)
        # Drop a token when the tokens before it already reach top_p (the first always stays).
        drop = probs.cumsum(-1) - probs >= top_p
        # The first stays explicitly: a top_p below float32's smallest positive number (an HTTP
        # client may send 5e-324) rounds to 0 in the comparison, which would drop every token.
        drop[..., 0] = False
        logits = logits.masked_fill(drop.scatter(-1, order, drop), float("-inf"))
    return logits


def next_tokens(logits: torch.Tensor, cfg: GenerationConfig, generator: torch.Generator) -> torch.Tensor:
    """Choose one token per row of logits (B, V) -> (B,)."""
    if cfg.greedy:
        return logits.argmax(-1)
    logits = logits.float() if cfg.temperature == 1.0 else logits.float() / cfg.temperature  # x / 1 == x
    logits = filter_logits(logits, cfg.top_k, cfg.top_p)
    return torch.multinomial(logits.softmax(-1), 1, generator=generator).squeeze(-1)


def left_pad(prompts: list[list[int]], pad_id: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Token lists -> (input_ids, attention_mask), both (B, L), right-aligned."""
    width = max(len(p) for p in prompts)
    ids = torch.full((len(prompts), width), pad_id, dtype=torch.long)
    mask = torch.zeros((len(prompts), width), dtype=torch.long)
    for i, p in enumerate(prompts):
        if p:
            ids[i, width - len(p):] = torch.tensor(p, dtype=torch.long)
            mask[i, width - len(p):] = 1
    return ids, mask


@torch.no_grad()
def generate_ids(model, prompts: list[list[int]], cfg: GenerationConfig, eot_id: int,
                 stop_check=None) -> list[list[int]]:
    """New token ids for each prompt (without the end-of-text token that ended it).

    ``stop_check(i, ids) -> bool`` may end prompt i early (stop sequences on decoded text).
    """
    if any(len(p) == 0 for p in prompts):
        raise EmberError("an empty prompt has no token to continue from; give some text")
    device = next(model.parameters()).device
    max_position = model.backbone.config.max_position
    longest = max(len(p) for p in prompts)
    if longest + cfg.max_new_tokens > max_position:
        raise EmberError(f"a prompt of {longest} tokens plus {cfg.max_new_tokens} new tokens exceeds "
                         f"the model's {max_position} positions; shorten the prompt or --max-new-tokens")
    ids, mask = left_pad(prompts, eot_id)
    ids = ids.to(device)
    b, width = ids.shape
    cache = model.backbone.new_cache(width + cfg.max_new_tokens)
    if bool(mask.all()):  # no padding: plain causal attention, positions from the cache's length
        full_mask = positions = None
    else:  # the mask of every position there will be, written once (no growth per step), and
        # each row's next position (its real tokens count from 0, as Hugging Face's generate)
        full_mask = torch.cat([mask, mask.new_ones(b, cfg.max_new_tokens)], dim=1).to(device)
        positions = mask.sum(1, keepdim=True).to(device)  # (B, 1)

    def step(token: torch.Tensor | None) -> torch.Tensor:
        nonlocal positions
        if token is None:  # the prompt, once
            return model.logits(ids, None if full_mask is None else full_mask[:, :width], cache)[:, -1]  # (B, V)
        if full_mask is None:
            return model.logits(token[:, None], None, cache)[:, -1]
        end = cache.length + 1
        out = model.logits(token[:, None], full_mask[:, :end], cache, positions)[:, -1]
        positions = positions + 1
        return out

    return token_loop(step, b, cfg, eot_id, device, stop_check)


def token_loop(step, batch: int, cfg: GenerationConfig, eot_id: int, device, stop_check=None) -> list[list[int]]:
    """Greedy or sampled decoding of ``batch`` rows. ``step(None)`` gives the first next-token
    logits (B, V), ``step(tokens)`` those after feeding the chosen (B,) tokens. A row ends at
    end-of-text (not kept) or when ``stop_check(i, ids)`` says so; finished rows keep decoding
    (their tokens are ignored), so every step is one batched call. The chosen tokens come to
    the host once per step as one list (the end-of-text and stop checks are Python's)."""
    generator = torch.Generator(device=device).manual_seed(cfg.seed)
    out: list[list[int]] = [[] for _ in range(batch)]
    running = list(range(batch))
    logits = step(None)
    for n in range(cfg.max_new_tokens):
        token = next_tokens(logits, cfg, generator)  # (B,)
        chosen = token.tolist()
        still = []
        for i in running:
            t = chosen[i]
            if cfg.stop_at_eot and t == eot_id:
                continue
            out[i].append(t)
            if stop_check is None or not stop_check(i, out[i]):
                still.append(i)
        running = still
        if not running or n == cfg.max_new_tokens - 1:  # the last token is not fed back: no logits wanted
            break
        logits = step(token)
    return out


def cut_at_stop(text: str, stop: tuple[str, ...]) -> tuple[str, bool]:
    """(``text`` cut before the earliest stop sequence in it, whether one was found)."""
    cuts = [text.find(s) for s in stop if s and s in text]
    return (text[: min(cuts)], True) if cuts else (text, False)


def generate_text(model, tokenizer, prompts: list[str], cfg: GenerationConfig,
                  tldr: bool = False) -> list[str]:
    """The continuation of each prompt as text (stop sequences cut off). With ``tldr``, the
    prompt gets GPT-2's "\\nTL;DR:" suffix and the answer is the first three sentences."""
    from ember.tokenizers import end_of_text_id

    eot = end_of_text_id(tokenizer)
    texts = [p + TLDR_SUFFIX if tldr else p for p in prompts]
    encoded = [tokenizer.encode(t, add_special_tokens=False).ids for t in texts]
    if tldr:  # a long article keeps its end (where the TL;DR: cue is) within the context
        room = model.backbone.config.max_position - cfg.max_new_tokens
        encoded = [e[-room:] for e in encoded]

    def stop_check(i: int, ids: list[int]) -> bool:
        return bool(cfg.stop) and cut_at_stop(tokenizer.decode(ids), cfg.stop)[1]

    new_ids = generate_ids(model, encoded, cfg, eot, stop_check if cfg.stop else None)
    outputs = [cut_at_stop(tokenizer.decode(ids), cfg.stop)[0] for ids in new_ids]
    return [first_sentences(o) for o in outputs] if tldr else outputs


__all__ = ["GenerationConfig", "cut_at_stop", "first_sentences", "generate_ids", "generate_text", "load_causal_lm",
           "tldr_config"]
