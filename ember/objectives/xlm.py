"""XLM pre-training: CLM, MLM and TLM with language embeddings (Lample & Conneau 2019, §3).

Objectives (``cfg.objective``), all on a corpus prepared with language codes
(``ember prepare --lang CODE=PATH ... [--parallel SRC-TGT=FILE]``, ember.data.multilingual):

- ``xlm_clm``  causal LM on monolingual streams (§3.1); the model must have ``model.causal``.
- ``xlm_mlm``  masked LM on monolingual streams (§3.2): streams of ``data.max_seq_length``
  tokens (256 in the paper) of consecutive sentences, 15% of the tokens predicted, replaced
  80% by <mask>, 10% by a random token, 10% unchanged; no next-sentence prediction.
- ``tlm``      translation LM on parallel pairs (§3.3, Fig. 2): source and target
  concatenated, positions restarted on the target side, each side with its language id,
  masks drawn over both sides so a masked word can be read off the translation.
- ``xlm_mlm_tlm``  MLM and TLM together: a share ``xlm.tlm_fraction`` of sequences are TLM
  pairs (the paper alternates the two objectives; we mix them in the stream).

The language of each sequence (and the language pair of each TLM pair) is drawn from the
multinomial q_i ~ p_i^alpha over the corpus's streams (§3.1, ``xlm.alpha`` = 0.5;
ember.data.language_mix), deterministically under the seed.

Layout (the paper's ``</s>`` markers map to the tokenizer's <s>/[CLS] at a sentence start and
</s>/[SEP] at its end, so pre-training sees the first token fine-tuning classifies from):

    stream:  <s> w w w </s> w w ... w          T tokens, positions 0..T-1, one language
    pair:    <s> src </s> <s> tgt </s>          positions 0..|src|+1, then 0..|tgt|+1

Special tokens are never masked. The head is XLM's: logits = h E^T + b with E the word
embeddings (ember.nn.heads.TiedLMHead), applied only where a prediction is made.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
import torch
from torch import nn

from ember.errors import EmberError
from ember.models.encoder import output_at_rows
from ember.nn.heads import TiedLMHead
from ember.nn.linear_cross_entropy import linear_cross_entropy
from ember.objectives.mlm import mask_tokens
from ember.tokenizers import role_id

MODES = {"xlm_clm": "clm", "xlm_mlm": "mlm", "tlm": "tlm", "xlm_mlm_tlm": "mlm_tlm"}


@dataclass
class XlmSequence:
    """One laid-out sequence, all (L,): ids, positions, language ids, which tokens may be masked."""

    input_ids: np.ndarray
    position_ids: np.ndarray
    language_ids: np.ndarray
    maskable: np.ndarray
    pair: bool = False  # a TLM pair (metrics are reported apart from MLM streams)


def lay_out_stream(block: np.ndarray, language: int, cls_id: int) -> XlmSequence:
    """<s> + a block of T-1 stream tokens (sentences joined by </s>)."""
    ids = np.concatenate([[cls_id], np.asarray(block, dtype=np.int64)])
    n = len(ids)
    maskable = np.ones(n, dtype=bool)
    maskable[0] = False
    return XlmSequence(ids, np.arange(n, dtype=np.int64), np.full(n, language, dtype=np.int64), maskable)


def lay_out_pair(source: np.ndarray, target: np.ndarray, languages: tuple[int, int], cls_id: int,
                 sep_id: int, max_length: int) -> XlmSequence:
    """<s> src </s> <s> tgt </s> with positions restarted at the target (XLM Fig. 2). Sides
    are cut so the whole fits ``max_length``: the longer side first, neither below half."""
    budget = max_length - 4
    a, b = len(source), len(target)
    if a + b > budget:
        a = min(a, max(budget - b, budget // 2))
        b = min(b, budget - a)
    sides = [np.concatenate([[cls_id], np.asarray(side[:n], dtype=np.int64), [sep_id]])
             for side, n in ((source, a), (target, b))]
    maskable = [np.concatenate([[False], np.ones(len(s) - 2, dtype=bool), [False]]) for s in sides]
    return XlmSequence(
        np.concatenate(sides),
        np.concatenate([np.arange(len(s), dtype=np.int64) for s in sides]),
        np.concatenate([np.full(len(s), lang, dtype=np.int64) for s, lang in zip(sides, languages)]),
        np.concatenate(maskable), pair=True)


class _Streams:
    """Monolingual blocks of one language, laid out as XLM streams."""

    def __init__(self, blocks, language: int, cls_id: int) -> None:
        self.blocks, self.language, self.cls_id = blocks, language, cls_id

    def __len__(self) -> int:
        return len(self.blocks)

    def example(self, index: int, epoch: int = 0) -> XlmSequence:
        return lay_out_stream(self.blocks.example(index, epoch), self.language, self.cls_id)


class _Pairs:
    """Parallel pairs of one language pair, laid out for TLM."""

    def __init__(self, pairs, languages: tuple[int, int], cls_id: int, sep_id: int, max_length: int) -> None:
        self.pairs, self.languages = pairs, languages
        self.cls_id, self.sep_id, self.max_length = cls_id, sep_id, max_length

    def __len__(self) -> int:
        return len(self.pairs)

    def example(self, index: int, epoch: int = 0) -> XlmSequence:
        source, target = self.pairs.example(index, epoch)
        return lay_out_pair(source, target, self.languages, self.cls_id, self.sep_id, self.max_length)


def build(cfg, special_ids: dict) -> "XlmPretraining":
    from ember.models import build_backbone

    mode = MODES[cfg.objective]
    model = cfg.model
    if model.family != "xlm":
        raise EmberError(f"objective {cfg.objective} trains an XLM model, not model family {model.family!r}; "
                         "use model.preset xlm-mini (or family: xlm)")
    if model.num_languages and not model.language_codes:
        raise EmberError(f"model.num_languages={model.num_languages} but model.languages is empty; name the "
                         "languages in id order, e.g. --set model.languages=en,ru (the corpus's codes)")
    if mode == "mlm_tlm" and not 0 < cfg.xlm.tlm_fraction < 1:
        raise EmberError(f"xlm.tlm_fraction={cfg.xlm.tlm_fraction}: the share of TLM pairs must be between 0 "
                         "and 1 (exclusive); for TLM or MLM alone use objective tlm or xlm_mlm")
    if (mode == "clm") != model.causal:
        raise EmberError(f"objective {cfg.objective} needs model.causal={str(mode == 'clm').lower()}: "
                         "XLM's CLM attends only to the left, MLM/TLM to both sides")
    return XlmPretraining(build_backbone(model), special_ids, cfg.data, cfg.xlm, mode)


class XlmPretraining(nn.Module):
    """An XLM encoder with its tied LM head; the module of objectives xlm_clm/xlm_mlm/tlm/xlm_mlm_tlm."""

    pair_mode = "none"

    def __init__(self, backbone: nn.Module, special_ids: dict, data, xlm, mode: str = "mlm") -> None:
        super().__init__()
        if mode not in MODES.values():
            raise EmberError(f"unknown XLM mode {mode!r}; choose one of {', '.join(MODES.values())}")
        self.backbone = backbone
        self.lm = TiedLMHead(backbone.config.vocab_size)
        self.special_ids, self.data, self.xlm, self.mode = dict(special_ids), data, xlm, mode
        for role in ("cls",) if mode == "clm" else ("cls", "mask"):  # found now, not at the first batch
            role_id(self.special_ids, role, f"XLM's {mode.upper()} objective")
        self.codes = backbone.config.language_codes  # language id -> code, for metrics

    # ---- data ------------------------------------------------------------------------------

    def language_ids(self, corpus_codes: list[str]) -> dict[str, int]:
        """Corpus language code -> this model's language id (model.languages decides)."""
        if not self.backbone.config.num_languages:  # no language embeddings: ids only name metrics
            self.codes = list(corpus_codes)
            return {c: i for i, c in enumerate(corpus_codes)}
        missing = [c for c in corpus_codes if c not in self.codes]
        if missing:
            raise EmberError(f"the corpus has language(s) {', '.join(missing)} that the model does not "
                             f"(model.languages={','.join(self.codes)}); add them there and raise "
                             "model.num_languages")
        return {c: self.backbone.config.language_id(c) for c in corpus_codes}

    def build_dataset(self, corpus, data_cfg, seed: int):
        """The language mix of ``corpus``'s streams (ember.data.language_mix.MixedDataset)."""
        from ember.data.blocks import TokenBlockDataset
        from ember.data.language_mix import MixedDataset, language_probs
        from ember.data.multilingual import SentenceView, corpus_streams
        from ember.data.parallel import ParallelPairs

        codes, streams = corpus_streams(corpus)
        ids = self.language_ids(codes)
        cls, sep, t = self.special_ids["cls"], self.special_ids["sep"], data_cfg.max_seq_length
        groups = {"mono": ([], []), "parallel": ([], [])}  # kind -> (sources, sizes)
        wanted = {"clm": ("mono",), "mlm": ("mono",), "tlm": ("parallel",), "mlm_tlm": ("mono", "parallel")}[self.mode]
        for s in streams:
            if s.kind not in wanted or len(s.docs) == 0:
                continue
            try:
                if s.kind == "mono":  # <s> + T-1 stream tokens
                    blocks = TokenBlockDataset(SentenceView(corpus, s.docs), t - 1, sep)
                    source = _Streams(blocks, ids[s.languages[0]], cls)
                else:
                    source = _Pairs(ParallelPairs(corpus, s.docs), tuple(ids[c] for c in s.languages), cls, sep, t)
            except EmberError as exc:
                if corpus.split == "train":
                    raise EmberError(f"stream {s.name}: {exc}") from None
                print(f"warning: held-out stream {s.name} left out ({exc})")
                continue
            groups[s.kind][0].append(source)
            groups[s.kind][1].append(s.num_sentences)
        missing = [k for k in wanted if not groups[k][0]]
        if missing:
            need = {"mono": "monolingual text (--lang CODE=PATH)",
                    "parallel": "parallel pairs (--parallel SRC-TGT=FILE)"}
            raise EmberError(f"objective {self.objective_name} needs {' and '.join(need[k] for k in missing)} "
                             f"in the {corpus.split} split of {corpus.prepared_dir}")
        share = {"mono": 1.0 - self.xlm.tlm_fraction, "parallel": self.xlm.tlm_fraction} \
            if len(wanted) == 2 else {wanted[0]: 1.0}
        sources, probs = [], []
        for kind in wanted:
            sources += groups[kind][0]
            probs += (share[kind] * language_probs(groups[kind][1], self.xlm.alpha)).tolist()
        return MixedDataset(sources, probs, seed)

    @property
    def objective_name(self) -> str:
        return {v: k for k, v in MODES.items()}[self.mode]

    def make_batch(self, examples: list[XlmSequence], rng: np.random.Generator) -> dict[str, torch.Tensor]:
        """Pad to the longest sequence; MLM/TLM draw masks from ``rng``, CLM shifts targets."""
        b, t = len(examples), max(len(e.input_ids) for e in examples)
        ids = np.full((b, t), self.special_ids["pad"], dtype=np.int64)
        positions, languages = np.zeros((b, t), dtype=np.int64), np.zeros((b, t), dtype=np.int64)
        maskable = np.zeros((b, t), dtype=bool)
        for i, e in enumerate(examples):
            n = len(e.input_ids)
            ids[i, :n], positions[i, :n], languages[i, :n], maskable[i, :n] = (
                e.input_ids, e.position_ids, e.language_ids, e.maskable)
        attention = (np.arange(t)[None, :] < np.array([len(e.input_ids) for e in examples])[:, None])
        if self.mode == "clm":
            labels = np.full((b, t), -100, dtype=np.int64)
            labels[:, :-1] = np.where(attention[:, 1:], ids[:, 1:], -100)  # position t predicts t + 1
        else:
            ids, labels = mask_tokens(ids, maskable, rng, self.special_ids["mask"], self.backbone.config.vocab_size,
                                      self.data.mask_prob, self.data.max_predictions or None)
        return {
            "input_ids": torch.from_numpy(ids), "attention_mask": torch.from_numpy(attention.astype(np.int64)),
            "position_ids": torch.from_numpy(positions), "language_ids": torch.from_numpy(languages),
            "labels": torch.from_numpy(labels),
            "is_pair": torch.tensor([e.pair for e in examples], dtype=torch.bool),
        }

    # ---- model -----------------------------------------------------------------------------

    def hidden(self, batch: dict[str, torch.Tensor], rows: torch.Tensor | None = None):
        """The backbone's output; language ids go in only when the model has the table. With
        ``rows`` (B, T) bool, last_hidden_state is (N, H) at those rows (``Encoder(rows=)``)."""
        languages = batch.get("language_ids") if self.backbone.config.num_languages else None
        args = (batch["input_ids"], batch.get("attention_mask"))
        kwargs = {"position_ids": batch.get("position_ids"), "language_ids": languages}
        return self.backbone(*args, **kwargs) if rows is None else output_at_rows(self.backbone, rows, *args, **kwargs)

    def logits(self, batch: dict[str, torch.Tensor]) -> torch.Tensor:
        """Full-vocabulary logits (B, T, V): for inference and parity."""
        return self.lm(self.hidden(batch).last_hidden_state, self.backbone.word_embeddings)

    def forward(self, batch: dict[str, torch.Tensor]) -> tuple[torch.Tensor, dict]:
        labels = batch["labels"]
        where = labels != -100  # (B, T)
        # the last layer at the predicted rows only (ember.nn.query_rows: MLM's and TLM's masked
        # tokens; a causal encoder without padding runs it everywhere and returns the same rows)
        at_targets = self.hidden(batch, rows=where).last_hidden_state  # (N, H)
        targets = labels[where]
        # the tied head (h E^T + b) and each predicted token's loss and hit in one fused step: the
        # (N, V) logits are never kept (ember.nn.linear_cross_entropy, per row for the metrics)
        per_token, correct = linear_cross_entropy(at_targets, self.backbone.word_embeddings, self.lm.bias,
                                                  targets, reduction="none")  # (N,) fp32, (N,) bool
        loss = per_token.mean()
        # Metric groups: CLM "lm"; MLM streams "mlm" and TLM pairs "tlm". The names are fixed
        # by the mode while training (DDP all-reduces them by name, so every rank must report
        # the same ones, a group without predictions as (0, 0)); held-out evaluation (main
        # rank, eval mode) adds one loss per language, e.g. mlm_ru_loss.
        if self.mode == "clm":
            kinds = {"lm": torch.ones_like(targets, dtype=torch.bool)}
        else:
            pair = batch["is_pair"][:, None].expand_as(labels)[where]
            kinds = {"mlm": ~pair, "tlm": pair}
            kinds = {k: v for k, v in kinds.items() if k in self.mode.split("_")}
        metrics = {}
        language = batch["language_ids"][where]
        for name, chosen in kinds.items():
            _add(metrics, name, per_token, correct, chosen)
            if not self.training:
                for lang in torch.unique(language[chosen]).tolist():
                    code = self.codes[lang] if lang < len(self.codes) else str(lang)
                    _add(metrics, f"{name}_{code}", per_token, correct, chosen & (language == lang), acc=False)
        n = int(labels.shape[0])
        metrics["loss"] = (loss.item() * n, n)
        return loss, metrics

    @staticmethod
    def derived_metrics(metrics: dict) -> dict:
        """Held-out perplexity of the causal LM, exp(mean loss per token)."""
        return {"ppl": math.exp(min(metrics["lm_loss"], 50.0))} if "lm_loss" in metrics else {}


def _add(metrics: dict, name: str, per_token: torch.Tensor, correct: torch.Tensor, chosen: torch.Tensor,
         acc: bool = True) -> None:
    """``{name}_loss`` (and ``{name}_acc``) as (sum, count) over the chosen predictions."""
    n = int(chosen.sum())
    metrics[f"{name}_loss"] = (per_token[chosen].sum().item(), n)
    if acc:
        metrics[f"{name}_acc"] = (int(correct[chosen].sum()), n)
