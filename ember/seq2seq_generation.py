"""Generation with an encoder-decoder (T5 and BART run folders): greedy, sampling and beam search.

    from ember.seq2seq_generation import Seq2SeqGenerationConfig, load_seq2seq_lm, seq2seq_generate_text
    model, tokenizer = load_seq2seq_lm("runs/t5-mini")
    seq2seq_generate_text(model, tokenizer, ["sst2 sentence: a gem of a film"],
                          Seq2SeqGenerationConfig(max_new_tokens=5, num_beams=4))

The input is encoded once; the decoder starts from the start token (T5: the pad id,
Raffel et al. 2020 / the released code; BART: </s>, ``ModelConfig.decoder_start_token_id``)
and adds one token per step until </s> or
``max_new_tokens``. With a cache (ember.nn.kv_cache.EncoderDecoderCache) a step feeds only
the newest token: the decoder's self-attention keys/values grow and the encoder's
cross-attention keys/values are computed at the first step only.

- Greedy (``temperature=0``) or sampling (temperature, top-k, top-p): ember.generate's
  ``token_loop``, the same rules as the GPT path.
- Beam search (``num_beams > 1``; T5 reports greedy decoding except for its final long-output
  tasks, beam width 4 with length penalty 0.6 after Wu et al. 2016, §3.7): every step
  extends each of the K running beams by every token, keeps the 2K best by summed
  log-probability, files the ones among the best K that end (</s> or the length limit) as
  finished hypotheses scored sum / length^length_penalty, and continues with the K best that
  did not end. A batch item is done when its best running beam, length-normalised at the
  current length, cannot beat its worst of K finished hypotheses (``early_stopping=False``)
  or as soon as it has K finished (``early_stopping=True``) - the rules of transformers'
  ``generate``, so the same model gives the same tokens. The penalty is transformers'
  length^alpha, not GNMT's ((5 + length) / 6)^alpha (which ranks hypotheses differently).

Constraints on every decoding path (``constrain``; BART's summarization settings use them,
Lewis et al. 2020 §5 / the released bart-large-cnn and fairseq's sequence generator), applied to
the scores as transformers' logits processors are (to the logits when greedy or sampling, to the
log-probabilities in beam search), so the same model gives the same tokens:

- ``min_new_tokens``: </s> is forbidden until that many tokens were generated (fairseq's
  min_len; transformers' min_new_tokens, = its min_length - 1 for an encoder-decoder);
- ``no_repeat_ngram_size`` n: a token that would complete an n-gram already in the decoder's
  sequence (start token included, as transformers counts) is forbidden;
- ``forced_bos_token_id``: the first generated token (mBART's target-language code, the
  <s> bart-large-cnn starts with); ``forced_eos``: the last allowed token is </s>.

Inputs of different lengths are padded on the right and their padding is masked in the encoder
and in cross-attention: with learned absolute positions (BART) the first token must sit at
position 0, as in training; with relative positions (T5) the side does not matter.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import torch
import torch.nn.functional as F

from ember.errors import EmberError
from ember.generate import GenerationConfig, cut_at_stop, load_weights_into, read_generator_run, token_loop

_NEG = -1e9  # the score of an impossible beam (finite, so sums stay ordered)


@dataclass(frozen=True)
class Seq2SeqGenerationConfig(GenerationConfig):
    num_beams: int = 1  # 1 = greedy / sampling
    length_penalty: float = 1.0  # beam score = sum log p / length^length_penalty
    early_stopping: bool = False  # beam search: stop an input once it has num_beams finished
    min_new_tokens: int = 0  # </s> forbidden before this many new tokens
    no_repeat_ngram_size: int = 0  # 0 = off; n: no n-gram twice in the decoder's sequence
    forced_bos_token_id: int = -1  # -1 = none; else the first generated token
    forced_eos: bool = False  # the max_new_tokens-th token is </s>

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.min_new_tokens < 0 or self.no_repeat_ngram_size < 0:
            raise EmberError(f"min_new_tokens={self.min_new_tokens} and no_repeat_ngram_size="
                             f"{self.no_repeat_ngram_size} must be >= 0 (0 = off)")
        if self.min_new_tokens >= self.max_new_tokens:
            raise EmberError(f"min_new_tokens={self.min_new_tokens} leaves no room to end within max_new_tokens="
                             f"{self.max_new_tokens}; ask for fewer, or more new tokens")
        if self.num_beams < 1:
            raise EmberError(f"num_beams={self.num_beams}; use 1 (greedy or sampling) or more (beam search)")
        if self.num_beams > 1 and not self.greedy:
            raise EmberError(f"num_beams={self.num_beams} with temperature={self.temperature}: beam search "
                             "is deterministic here; set temperature=0, or num_beams=1 to sample")


# ---- loading ---------------------------------------------------------------------------------

def load_seq2seq_lm(run_dir: str | Path, device: str = "cpu"):
    """(EncoderDecoder backbone in eval mode, tokenizer) from a run folder of a T5 or BART model."""
    from ember.config import SEQ2SEQ_FAMILIES
    from ember.models import build_backbone

    cfg, state, tokenizer = read_generator_run(run_dir, SEQ2SEQ_FAMILIES)
    model = build_backbone(cfg.model)
    load_weights_into(model, {k.removeprefix("backbone."): v for k, v in state.items()}, run_dir)
    return model.to(device).eval(), tokenizer


# ---- decoding --------------------------------------------------------------------------------

class DecoderSteps:
    """Next-token logits of growing decoder sequences over a fixed encoder output, with the
    cache (only the newest token is fed) or without it (the whole prefix is recomputed, the
    reference the cache is tested against)."""

    def __init__(self, model, encoder_hidden: torch.Tensor, encoder_mask: torch.Tensor | None,
                 use_cache: bool = True, capacity: int = 0) -> None:
        self.model, self.encoder_hidden, self.encoder_mask = model, encoder_hidden, encoder_mask
        self.cache = model.new_cache(capacity) if use_cache else None  # capacity: start + new tokens

    def __call__(self, tokens: torch.Tensor) -> torch.Tensor:
        """tokens (N, t) -> logits (N, V) of token t + 1."""
        new = tokens[:, -1:] if self.cache is not None else tokens
        out = self.model.decode(new, self.encoder_hidden, self.encoder_mask, cache=self.cache)
        return self.model.lm_logits(out.last_hidden_state[:, -1]).float()

    def reorder(self, rows: torch.Tensor) -> None:
        """Beam search: row i continues from row rows[i] (always a beam of the same input,
        so the encoder's cached keys/values stay as they are)."""
        if self.cache is not None:
            self.cache.select(rows, cross=False)


def constrain_(scores: torch.Tensor, tokens: torch.Tensor, cfg: Seq2SeqGenerationConfig, eos_id: int) -> torch.Tensor:
    """scores (N, V) of the next token after ``tokens`` (N, 1 + g): the start token and g generated
    ones; forbidden tokens get -inf, a forced token is the only one left (at 0), as transformers'
    MinNewTokens/NoRepeatNGram/ForcedBOS/ForcedEOS logits processors do. In place: the callers'
    scores are fresh each step (a vocabulary-wide copy a step cost a beam-4 step of bart-mini ~2%)."""
    g = tokens.shape[1] - 1
    if g < cfg.min_new_tokens:
        scores[:, eos_id] = float("-inf")
    n = cfg.no_repeat_ngram_size
    if n and tokens.shape[1] >= n:
        scores.masked_fill_(banned_ngram_tokens(tokens, n, scores.shape[-1]), float("-inf"))
    forced = cfg.forced_bos_token_id if g == 0 and cfg.forced_bos_token_id >= 0 else None
    if cfg.forced_eos and g == cfg.max_new_tokens - 1:
        forced = eos_id
    if forced is not None:
        scores.fill_(float("-inf"))
        scores[:, forced] = 0.0
    return scores


def banned_ngram_tokens(tokens: torch.Tensor, n: int, vocab: int) -> torch.Tensor:
    """bool (N, V): True for a token that would repeat an n-gram of ``tokens`` (N, L), i.e. the last
    token of every earlier n-gram whose first n - 1 tokens equal the sequence's last n - 1."""
    windows = tokens.unfold(1, n, 1)  # (N, L - n + 1, n)
    prefix = tokens[:, tokens.shape[1] + 1 - n:]  # (N, n - 1)
    matches = (windows[..., :-1] == prefix[:, None]).all(-1)  # (N, L - n + 1)
    banned = torch.zeros(tokens.shape[0], vocab + 1, dtype=torch.bool, device=tokens.device)  # + a spare column
    return banned.scatter_(1, torch.where(matches, windows[..., -1].clamp(max=vocab), vocab), True)[:, :vocab]


def check_lengths(model, input_lengths: list[int], max_new_tokens: int) -> None:
    limit = model.config.max_position
    if max(input_lengths) > limit:
        raise EmberError(f"an input of {max(input_lengths)} tokens is longer than the model's {limit} "
                         "(model.max_position, the length it was trained on); shorten the input")
    if max_new_tokens > limit:
        raise EmberError(f"max_new_tokens={max_new_tokens} is beyond the decoder's {limit} positions "
                         "(model.max_position); ask for fewer new tokens")


@torch.no_grad()
def seq2seq_generate(model, input_ids: torch.Tensor, attention_mask: torch.Tensor | None,
                     cfg: Seq2SeqGenerationConfig, eos_id: int, use_cache: bool = True,
                     stop_check=None) -> list[list[int]]:
    """New token ids for each input row (B, S), without the </s> that ended them.
    ``stop_check(i, ids) -> bool`` may end row i early (greedy / sampling only)."""
    enc = model.encode(input_ids, attention_mask).last_hidden_state  # (B, S, H)
    if cfg.num_beams > 1:
        return beam_search(model, enc, attention_mask, cfg, eos_id, use_cache)
    steps = DecoderSteps(model, enc, attention_mask, use_cache, cfg.max_new_tokens + 1)
    # the decoder's sequences, written in place: the start token (T5: pad; BART: </s>), then one per step
    tokens = input_ids.new_full((input_ids.shape[0], cfg.max_new_tokens + 1), model.config.decoder_start_id)
    length = 1

    def step(token: torch.Tensor | None) -> torch.Tensor:
        nonlocal length
        if token is not None:
            tokens[:, length] = token
            length += 1
        return constrain_(steps(tokens[:, :length]), tokens[:, :length], cfg, eos_id)

    return token_loop(step, input_ids.shape[0], cfg, eos_id, input_ids.device, stop_check)


def beam_search(model, encoder_hidden: torch.Tensor, encoder_mask: torch.Tensor | None,
                cfg: Seq2SeqGenerationConfig, eos_id: int, use_cache: bool = True) -> list[list[int]]:
    """The best finished hypothesis of each input (see the module docstring), without </s>."""
    b, k, n = encoder_hidden.shape[0], cfg.num_beams, cfg.max_new_tokens
    device = encoder_hidden.device
    # rows b*k + beam; the K beams of input b share its encoder row (ember.nn.attention's groups)
    steps = DecoderSteps(model, encoder_hidden, encoder_mask, use_cache, n + 1)
    seqs = torch.full((b * k, 1), model.config.decoder_start_id, dtype=torch.long, device=device)
    scores = torch.zeros(b, k, device=device)  # summed log-probabilities of the running beams
    scores[:, 1:] = _NEG  # all beams start equal: expand the first only, or the K would be copies
    finished: list[list[tuple[float, list[int]]]] = [[] for _ in range(b)]  # best first, at most K
    open_ = [True] * b  # may a running beam still improve the input's finished hypotheses?
    rank = torch.arange(2 * k, device=device)
    for t in range(1, n + 1):  # t = tokens generated once this step is done
        logits = steps(seqs)  # (B*K, V), fresh: the log-softmax, constraints and sums write over it
        logp = constrain_(torch.ops.aten._log_softmax.out(logits, -1, False, out=logits), seqs, cfg, eos_id)
        v = logp.shape[-1]
        total = logp.view(b, k, v).add_(scores[..., None])
        # the best 2K of each beam, then of the input's K x 2K: the input's best 2K over K x V
        # (each is among its own beam's best 2K), for a sort of 2K per row rather than per input
        beam_best, beam_token = total.topk(2 * k, dim=-1)  # (B, K, 2K)
        cand_scores, pick = beam_best.view(b, 2 * k * k).topk(2 * k, dim=-1)  # (B, 2K): 2K so K survive K endings
        beam, token = pick // (2 * k), beam_token.view(b, 2 * k * k).gather(1, pick)
        ends = (token == eos_id) | (t == n)  # (B, 2K): at </s> or at the length limit
        cand_seqs = torch.cat([seqs.view(b, k, -1).gather(1, beam[..., None].expand(-1, -1, t)),
                               token[..., None]], dim=-1)  # (B, 2K, t + 1)
        normed = cand_scores / t ** cfg.length_penalty
        for i in range(b):  # file the best K candidates that end as finished hypotheses
            full = cfg.early_stopping and len(finished[i]) == k
            if not open_[i] or full:
                continue
            for j in torch.nonzero(ends[i] & (rank < k)).flatten().tolist():
                finished[i].append((float(normed[i, j]), cand_seqs[i, j, 1:].tolist()))
            finished[i] = sorted(finished[i], key=lambda h: -h[0])[:k]
        keep = (cand_scores + ends * _NEG).topk(k, dim=-1).indices  # (B, K): the best that go on
        scores = cand_scores.gather(1, keep) + ends.gather(1, keep) * _NEG
        seqs = cand_seqs.gather(1, keep[..., None].expand(-1, -1, t + 1)).view(b * k, t + 1)
        steps.reorder((beam.gather(1, keep) + torch.arange(b, device=device)[:, None] * k).flatten())
        for i in range(b):  # can the best running beam, scored at this length, still win?
            if len(finished[i]) == k:
                open_[i] = open_[i] and float(scores[i, 0]) / t ** cfg.length_penalty > finished[i][-1][0]
        all_full = all(len(f) == k for f in finished)
        if not any(open_) or (cfg.early_stopping and all_full) or bool(ends.all()):
            break
    return [_strip_eos(f[0][1], eos_id) for f in finished]


def _strip_eos(ids: list[int], eos_id: int) -> list[int]:
    return ids[:-1] if ids and ids[-1] == eos_id else ids


def right_pad(inputs: list[list[int]], pad_id: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Token lists -> (input_ids, attention_mask), both (B, S), left-aligned."""
    width = max(len(x) for x in inputs)
    ids = torch.full((len(inputs), width), pad_id, dtype=torch.long)
    mask = torch.zeros((len(inputs), width), dtype=torch.long)
    for i, x in enumerate(inputs):
        ids[i, : len(x)] = torch.tensor(x, dtype=torch.long)
        mask[i, : len(x)] = 1
    return ids, mask


def seq2seq_generate_ids(model, inputs: list[list[int]], cfg: Seq2SeqGenerationConfig, eos_id: int,
                         stop_check=None) -> list[list[int]]:
    """New token ids for each input token list (batched, padded, masked)."""
    if any(len(x) == 0 for x in inputs):
        raise EmberError("an empty input has nothing to encode; give some text")
    check_lengths(model, [len(x) for x in inputs], cfg.max_new_tokens)
    device = next(model.parameters()).device
    ids, mask = right_pad(inputs, model.config.pad_token_id)
    return seq2seq_generate(model, ids.to(device), mask.to(device), cfg, eos_id, stop_check=stop_check)


def seq2seq_generate_text(model, tokenizer, texts: list[str], cfg: Seq2SeqGenerationConfig) -> list[str]:
    """The output text for each input text. Inputs are encoded with the tokenizer's template
    (T5's appends </s>); outputs are decoded without special tokens but with their sentinels (a
    span-corruption run answers in them) and cut at stop sequences."""
    from ember.tokenizers import sequence_end_id
    from ember.tokenizers.sentinels import decode_with_sentinels

    encoded = [tokenizer.encode(t).ids for t in texts]

    def stop_check(i: int, ids: list[int]) -> bool:
        return cut_at_stop(tokenizer.decode(ids), cfg.stop)[1]

    new_ids = seq2seq_generate_ids(model, encoded, cfg, sequence_end_id(tokenizer),
                                   stop_check if cfg.stop and cfg.num_beams == 1 else None)
    return [cut_at_stop(decode_with_sentinels(tokenizer, ids), cfg.stop)[0] for ids in new_ids]


__all__ = ["DecoderSteps", "Seq2SeqGenerationConfig", "beam_search", "constrain", "load_seq2seq_lm", "seq2seq_generate",
           "seq2seq_generate_ids", "seq2seq_generate_text"]
