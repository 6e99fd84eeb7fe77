"""XLNet's permutation language model (objective ``plm``; Yang et al. 2019 §2).

    max_theta  E_{z ~ Z_T} [ sum_{t > c} log p(x_{z_t} | x_{z<t}) ]        (eq. 5)

The expectation over factorisation orders z is one sampled order per sequence and step; only
the last tokens of the order (t > c, about 1/K of them: partial prediction, §2.3) are
predicted. Orders, targets (spans of whole words) and the two attention masks are built in
``ember.objectives.permutation``; the backbone (ember.models.xlnet) runs the content stream
over the sequence and the query stream at the targets, whose states go through the tied LM
layer: p(x_{z_t} = x | ...) = softmax(e(x)^T g_{z_t}) (eq. 4). The loss is the mean
cross-entropy over targets. Inputs are never corrupted: a target's own token is hidden from
its query stream by the mask, not replaced.

Data (``build_dataset``, ember.data.memory_pairs): sequences ``A <sep> B <sep> <cls>`` of
``data.max_seq_length`` tokens - the <cls> at the end, segment ids 0 (A and its <sep>), 1 (B
and its <sep>), 2 (<cls>), compared only for equality by the relative segment encoding
(§2.5) - each with the ``model.mem_len`` tokens before it in the corpus. Those go through the
backbone first, without gradient, and their layer inputs become the memory the sequence
attends to (Transformer-XL recurrence, §2.4), so each example is two consecutive segments
and needs no state from earlier steps: resume stays exact.

<sep>/<cls> are the tokenizer's separator and classifier tokens (XLNet's <sep>/<cls>, or
[SEP]/[CLS] in a WordPiece vocabulary); documents in the stream end with its end-of-text
token (XLNet's <eod> role), which is an ordinary, predictable token.
"""

from __future__ import annotations

import math

import numpy as np
import torch
from torch import nn

from ember.errors import EmberError
from ember.nn.lm_loss import token_loss
from ember.objectives.permutation import ngram_length_probs, plan_sequence

STRUCTURE_TOKENS = 3  # <sep>, <sep>, <cls>


def build(cfg, special_ids: dict) -> PermutationLM:
    from ember.models import build_backbone

    if cfg.model.family != "xlnet":
        raise EmberError(f"objective plm needs the XLNet backbone (two-stream attention), not model family "
                         f"{cfg.model.family!r}; use an xlnet-* preset or recipe")
    continues = None
    if special_ids.get("tokenizer_path"):  # spans are whole words when word starts are known
        from ember.objectives.masking import word_continuation_table
        from ember.tokenizers import load_tokenizer

        continues = word_continuation_table(load_tokenizer(special_ids["tokenizer_path"]))
    return PermutationLM(build_backbone(cfg.model), cfg.plm, cfg.data.max_seq_length, special_ids, continues)


def prediction_count(plm_cfg, seq_len: int) -> int:
    """Targets per sequence: plm.num_predict, or round(T / K); clear errors when a setting
    leaves nothing to predict or asks for more than a sequence has."""
    if not plm_cfg.k > 1:
        raise EmberError(f"plm.k={plm_cfg.k}: partial prediction predicts 1/K of the tokens and needs "
                         "K > 1 (the paper uses 6 or 7)")
    if plm_cfg.max_span < 1:
        raise EmberError(f"plm.max_span={plm_cfg.max_span}: a predicted span has at least 1 word (XLNet: 5)")
    if plm_cfg.num_predict < 0:
        raise EmberError(f"plm.num_predict={plm_cfg.num_predict}: use 0 (= max_seq_length / k) or a positive count")
    n = plm_cfg.num_predict or round(seq_len / plm_cfg.k)
    if n < 1:
        raise EmberError(f"plm.k={plm_cfg.k} with data.max_seq_length={seq_len} leaves nothing to predict "
                         f"({seq_len}/{plm_cfg.k} rounds to 0 targets per sequence); lower plm.k or use "
                         "longer sequences")
    predictable = seq_len - STRUCTURE_TOKENS
    if n > predictable:
        raise EmberError(f"{n} targets per sequence (plm.num_predict / plm.k) but a sequence of "
                         f"data.max_seq_length={seq_len} has only {predictable} predictable tokens; "
                         "raise plm.k or lower plm.num_predict")
    return n


class PermutationLM(nn.Module):
    pair_mode = "none"  # segment pairs are built by build_dataset, without a pair loss

    def __init__(self, backbone: nn.Module, plm_cfg, seq_len: int, special_ids: dict,
                 continues_word: np.ndarray | None = None) -> None:
        super().__init__()
        mcfg = backbone.config
        if mcfg.reuse_len and mcfg.reuse_len < mcfg.mem_len:
            raise EmberError(f"model.reuse_len={mcfg.reuse_len} < model.mem_len={mcfg.mem_len}: objective "
                             "plm gives every sequence its own memory segment of mem_len tokens, all of "
                             "which is reused; set model.reuse_len=0")
        self.backbone, self.cfg, self.seq_len = backbone, plm_cfg, seq_len
        self.num_predict = prediction_count(plm_cfg, seq_len)
        self.probs = ngram_length_probs(plm_cfg.max_span)
        self.sep_id, self.cls_id = special_ids["sep"], special_ids["cls"]
        self.eot_id = special_ids.get("eot", self.sep_id)
        self.continues_word = None
        if continues_word is not None:  # pad to the model's vocabulary: unknown ids start words
            self.continues_word = np.zeros(max(mcfg.vocab_size, len(continues_word)), dtype=bool)
            self.continues_word[: len(continues_word)] = continues_word

    def build_dataset(self, corpus, data_cfg, seed: int):
        from ember.data.memory_pairs import MemorySegmentPairs

        return MemorySegmentPairs(corpus, self.eot_id, data_cfg.max_seq_length - STRUCTURE_TOKENS,
                                  self.backbone.config.mem_len, self.cfg.random_segment_prob, seed)

    def layout(self, a: np.ndarray, b: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """XLNet's input layout: ids ``A <sep> B <sep> <cls>``, segment ids 0.. 0 1.. 1 2, and
        the bool positions of the three structure tokens. All (T,)."""
        la, lb = len(a), len(b)
        ids = np.concatenate([a, [self.sep_id], b, [self.sep_id, self.cls_id]]).astype(np.int64)
        segments = np.array([0] * (la + 1) + [1] * (lb + 1) + [2], dtype=np.int64)
        structure = np.zeros(len(ids), dtype=bool)
        structure[[la, la + lb + 1, la + lb + 2]] = True
        return ids, segments, structure

    def make_batch(self, examples: list, rng: np.random.Generator) -> dict[str, torch.Tensor]:
        """``MemoryPair`` examples -> input_ids, token_type_ids, attention_mask (B, T),
        perm_mask (B, T, T) (1 = may not attend), target_mapping (B, N, T) one-hot,
        target_labels (B, N) and, with memory, memory_ids (B, M). Sequences draw their targets
        and orders in row order from ``rng``."""
        rows = [self.layout(e.tokens_a, e.tokens_b) for e in examples]
        t = len(rows[0][0])
        if any(len(r[0]) != t for r in rows):
            raise EmberError("objective plm needs sequences of one length (ember.data.memory_pairs makes them)")
        b, n = len(rows), self.num_predict
        perm = np.zeros((b, t, t), dtype=bool)
        mapping = np.zeros((b, n, t), dtype=np.float32)
        labels = np.full((b, n), -100, dtype=np.int64)
        for i, (ids, _, structure) in enumerate(rows):
            plan = plan_sequence(ids, structure, n, self.cfg.k, self.probs, rng, self.continues_word)
            perm[i] = plan.perm_mask
            mapping[i, np.arange(len(plan.positions)), plan.positions] = 1.0
            labels[i, : len(plan.positions)] = ids[plan.positions]
        ids = torch.from_numpy(np.stack([r[0] for r in rows]))
        batch = {
            "input_ids": ids, "token_type_ids": torch.from_numpy(np.stack([r[1] for r in rows])),
            "attention_mask": torch.ones_like(ids), "perm_mask": torch.from_numpy(perm),
            "target_mapping": torch.from_numpy(mapping), "target_labels": torch.from_numpy(labels),
        }
        if len(examples[0].memory):
            batch["memory_ids"] = torch.from_numpy(np.stack([e.memory for e in examples]).astype(np.int64))
        return batch

    def forward(self, batch: dict[str, torch.Tensor]) -> tuple[torch.Tensor, dict]:
        mems = None
        if "memory_ids" in batch:  # the preceding segment as one segment, no permutation, no gradient
            ids = batch["memory_ids"]
            mems = self.backbone.memory(ids, token_type_ids=torch.zeros_like(ids))
        out = self.backbone(batch["input_ids"], batch.get("attention_mask"), batch["token_type_ids"], mems=mems,
                            perm_mask=batch["perm_mask"], target_mapping=batch["target_mapping"])
        labels = batch["target_labels"]
        where = labels != -100
        # the LM head at the target positions only, without keeping their (targets x V) logits
        loss, metrics = token_loss(*self.backbone.lm_projection(out.query_hidden[where]), labels[where], "plm")
        metrics["loss"] = metrics["plm_loss"]
        return loss, metrics

    @staticmethod
    def derived_metrics(metrics: dict) -> dict:
        """Held-out perplexity of the predicted tokens, exp(mean loss)."""
        return {"plm_ppl": math.exp(min(metrics["plm_loss"], 50.0))} if "plm_loss" in metrics else {}
