"""ERNIE's pre-training on a knowledgeable encoder: masked LM + the denoising entity auto-encoder
(dEA) (Zhang et al. 2019, §3.4 and §4.2), as continued pre-training of an existing encoder.

Objective ``ernie`` (recipe ``ernie-dea``): ``knowledge.init`` names the encoder (an ember run or
a Hugging Face checkpoint folder, e.g. all-MiniLM-L6-v2 imported with `ember convert`),
``knowledge.entities`` the entity embeddings (``ember kg embed``), ``data.prepared`` raw text
(files, folders or globs: plain/.gz text, one document per blank-line block, or wiki dumps).
The backbone is the encoder with ERNIE's aggregators on its top layers
(``ember.knowledge.ernie.FusionEncoder``); mentions are aligned to their first token.

dEA (§3.4): some token-entity alignments are corrupted and the model predicts, from the token's
final state, which of the sentence's entities is aligned to it:

    p(e_j | w_i) = exp(linear(w_i^o) . e_j) / sum_{k=1..m} exp(linear(w_i^o) . e_k)   (eq. 7)

over the m entities of the sentence. Corruption per alignment: 5% get a random entity of the
table instead (the model must correct the wrong entity), 15% are masked (no entity: it must
recover the alignment), 80% stay. A position is scored only when its sentence has at least two
distinct entities (with one, eq. 7 is always 1). MLM is BERT's (15%, 80/10/10, token masking,
``ember.objectives.mlm``) with a fresh head when the init has none; NSP is left out, as
RoBERTa found it unhelpful. Loss = mlm_weight * MLM + dea_weight * dEA.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from ember.errors import EmberError
from ember.nn.heads import MaskedLMHead
from ember.objectives.mlm import mask_tokens, masked_lm_loss
from ember.tokenizers import role_id

RANDOM_ENTITY, MASK_ALIGNMENT = 0.05, 0.15  # §3.4's dEA corruption rates
MIN_ENTITIES = 2  # sentences with fewer distinct entities teach dEA nothing (kept for MLM only if any)
HELD_OUT_EVERY = 50  # every 50th sentence is held out


class EntityPredictionHead(nn.Module):
    """linear(w_i^o) of eq. 7: (N, H) -> (N, D), scored against candidate entities (N, C, D)."""

    def __init__(self, hidden_size: int, entity_dim: int) -> None:
        super().__init__()
        self.linear = nn.Linear(hidden_size, entity_dim)

    def forward(self, hidden: torch.Tensor, candidates: torch.Tensor, valid: torch.Tensor) -> torch.Tensor:
        """Logits (N, C): dot products with each candidate, -inf-like where ``valid`` is False."""
        scores = torch.einsum("nd,ncd->nc", self.linear(hidden), candidates)
        return scores.masked_fill(~valid, torch.finfo(scores.dtype).min)


class ErniePretraining(nn.Module):
    def __init__(self, backbone, special_ids: dict, mask_prob: float, max_predictions: int,
                 mlm_weight: float, dea_weight: float) -> None:
        super().__init__()
        cfg = backbone.config
        self.backbone = backbone
        self.mlm = MaskedLMHead(cfg.hidden_size, cfg.vocab_size, cfg.hidden_act, cfg.layer_norm_eps,
                                cfg.embedding_size or None)
        self.dea = EntityPredictionHead(cfg.hidden_size, backbone.entity_vectors.shape[1])
        for sub in (*self.mlm.modules(), *self.dea.modules()):
            if isinstance(sub, nn.Linear):
                nn.init.normal_(sub.weight, std=cfg.initializer_range)
                nn.init.zeros_(sub.bias)
        self.special_ids = dict(special_ids)
        role_id(self.special_ids, "mask", "ERNIE's masked LM")  # found now, not at the first batch
        self.mask_prob, self.max_predictions = mask_prob, max_predictions
        self.mlm_weight, self.dea_weight = mlm_weight, dea_weight

    def make_batch(self, examples: list[dict], rng: np.random.Generator) -> dict[str, torch.Tensor]:
        """examples: {"input_ids", "entity_ids"} with specials; MLM and dEA corruption drawn from rng."""
        b, t = len(examples), max(len(e["input_ids"]) for e in examples)
        ids = np.full((b, t), self.special_ids["pad"], dtype=np.int64)
        entities = np.full((b, t), -1, dtype=np.int64)
        for row, e in enumerate(examples):
            ids[row, : len(e["input_ids"])] = e["input_ids"]
            entities[row, : len(e["entity_ids"])] = e["entity_ids"]
        attention = ids != self.special_ids["pad"]
        specials = [self.special_ids[k] for k in ("cls", "sep", "pad") if k in self.special_ids]
        maskable = attention & ~np.isin(ids, specials)
        corrupted, labels = mask_tokens(ids, maskable, rng, self.special_ids["mask"], self.backbone.config.vocab_size,
                                        self.mask_prob, self.max_predictions or None)
        # dEA: candidates = each sentence's distinct entities; target = the aligned one's index
        candidates = [sorted(set(row[row >= 0].tolist())) for row in entities]
        width = max(1, max(len(c) for c in candidates))
        cand = np.full((b, width), -1, dtype=np.int64)
        targets = np.full((b, t), -100, dtype=np.int64)
        for row, c in enumerate(candidates):
            cand[row, : len(c)] = c
            if len(c) >= MIN_ENTITIES:
                where = np.nonzero(entities[row] >= 0)[0]
                targets[row, where] = [c.index(x) for x in entities[row, where]]
        aligned = entities >= 0
        draw = rng.random((b, t))
        noisy = entities.copy()
        swap = aligned & (draw < RANDOM_ENTITY)
        noisy[swap] = rng.integers(0, len(self.backbone.entity_vectors), size=int(swap.sum()))
        noisy[aligned & (draw >= RANDOM_ENTITY) & (draw < RANDOM_ENTITY + MASK_ALIGNMENT)] = -1
        return {"input_ids": torch.from_numpy(corrupted), "attention_mask": torch.from_numpy(attention.astype(np.int64)),
                "labels": torch.from_numpy(labels), "entity_ids": torch.from_numpy(noisy),
                "dea_targets": torch.from_numpy(targets), "candidates": torch.from_numpy(cand)}

    def dea_loss(self, hidden: torch.Tensor, targets: torch.Tensor, candidates: torch.Tensor):
        """Eq. 7's cross-entropy at scored positions: hidden (B, T, H), targets (B, T), candidates (B, C)."""
        rows, cols = torch.nonzero(targets >= 0, as_tuple=True)
        if len(rows) == 0:
            return hidden.sum() * 0.0, {}
        cand = candidates[rows]  # (N, C)
        vectors = F.embedding(cand.clamp(min=0), self.backbone.entity_vectors)  # (N, C, D)
        logits = self.dea(hidden[rows, cols], vectors, cand >= 0).float()
        target = targets[rows, cols]
        loss = F.cross_entropy(logits, target)
        n = len(rows)
        return loss, {"dea_loss": (loss.item() * n, n), "dea_acc": ((logits.argmax(-1) == target).sum().item(), n)}

    def forward(self, batch: dict[str, torch.Tensor]) -> tuple[torch.Tensor, dict]:
        out = self.backbone(batch["input_ids"], batch["attention_mask"], entity_ids=batch["entity_ids"])
        hidden = out.last_hidden_state
        mlm_loss, metrics = masked_lm_loss(self.mlm, hidden, self.backbone.word_embeddings, batch["labels"])
        dea_loss, dea_metrics = self.dea_loss(hidden, batch["dea_targets"], batch["candidates"])
        metrics.update(dea_metrics)
        loss = self.mlm_weight * mlm_loss + self.dea_weight * dea_loss
        n = int(batch["input_ids"].shape[0])
        metrics["loss"] = (loss.item() * n, n)
        return loss, metrics


def build(cfg, special_ids: dict) -> ErniePretraining:
    from ember.knowledge.ernie import fusion_backbone

    k = cfg.knowledge
    return ErniePretraining(fusion_backbone(cfg.model, k), special_ids, cfg.data.mask_prob, cfg.data.max_predictions,
                            k.mlm_weight, k.dea_weight)


def read_sentences(cfg, inputs, progress: bool) -> tuple[list[dict], list[dict], int]:
    """(train examples, held-out examples, sentences read) of raw text: sentences with an
    aligned entity, encoded with the init's tokenizer (``ember.knowledge.inputs``)."""
    from ember.data.readers import iter_documents
    from ember.data.sentences import split_sentences

    train, held, read = [], [], 0
    limit = cfg.knowledge.max_sentences
    for doc in iter_documents(cfg.data.prepared):
        for paragraph in doc.text.split("\n"):
            for sentence in split_sentences(paragraph):
                read += 1
                if progress and read % 20000 == 0:
                    print(f"ernie: {len(train):,} training sentences with entities from {read:,} read")
                f = inputs.encode_text(sentence, None, cfg.data.max_seq_length)
                if not any(e >= 0 for e in f["entity_ids"]):
                    continue
                (held if read % HELD_OUT_EVERY == 0 else train).append(
                    {"input_ids": f["input_ids"], "entity_ids": f["entity_ids"]})
                if limit and len(train) >= limit:
                    return train, held, read
    return train, held, read


def setup_pretraining(cfg, run_dir: Path, resume: bool, progress: bool):
    """Continue pre-training ``knowledge.init`` with MLM + dEA on raw text (module docstring)."""
    from ember.data.in_memory import InMemoryData
    from ember.data.shards import refuse_token_shards
    from ember.fileio import atomic_write_text
    from ember.knowledge.entities import load_entity_embeddings
    from ember.knowledge.ernie import check_encoder_family
    from ember.knowledge.inputs import KnowledgeInputs
    from ember.objectives.setup import PretrainingSetup, held_out_batch_size, held_out_metrics
    from ember.runs.folder import write_run_files
    from ember.runs.init import load_init
    from ember.tokenizers import load_tokenizer, special_token_ids

    k = cfg.knowledge
    if not k.init or not k.entities or not cfg.data.prepared:
        raise EmberError("objective ernie continues pre-training an encoder: give --set knowledge.init=RUN_OR_HF_FOLDER "
                         "--set knowledge.entities=DIR (ember kg embed) and --data RAW_TEXT")
    refuse_token_shards(cfg.data.prepared, "ERNIE's dEA pre-training", "../shared/data/wiki-en")
    start = load_init(k.init)
    check_encoder_family(start.model, "ERNIE's dEA pre-training")
    table = load_entity_embeddings(k.entities)
    cfg = dataclasses.replace(cfg, model=start.model, knowledge=dataclasses.replace(
        k, num_entities=len(table.names), entity_dim=table.dim))
    tokenizer = load_tokenizer(start.tokenizer)
    special = special_token_ids(tokenizer)
    module = build(cfg, special)
    if start.state is not None:
        missing, unexpected = module.backbone.load_state_dict(start.state, strict=False)
        fresh = ("pooler.",) + module.backbone.NEW_PARAMETERS
        if unexpected or [m for m in missing if not m.startswith(fresh)]:
            raise EmberError(f"{k.init}: weights do not fit the encoder (missing {missing[:3]}, unexpected {unexpected[:3]})")
    module.backbone.set_entity_vectors(table.vectors)
    inputs = KnowledgeInputs(tokenizer, entities=table.names)
    train, held, read = read_sentences(cfg, inputs, progress)
    if not train:
        raise EmberError(f"no sentence of {cfg.data.prepared} ({read:,} read) names an entity of {k.entities}; "
                         "give text in the language and domain of the entity vocabulary")

    def evaluate(m):
        return held_out_metrics(m, InMemoryData(held), cfg.data.eval_examples,
                                held_out_batch_size(cfg.data.max_seq_length), cfg.train.seed, cfg.train.device)

    def write_files(folder: Path) -> None:
        write_run_files(folder, cfg, start.tokenizer)
        atomic_write_text(folder / "entities.tsv", "".join(f"{n}\n" for n in table.names))

    params = sum(p.numel() for p in module.backbone.parameters())
    return PretrainingSetup(
        cfg, module, InMemoryData(train), evaluate if held else None, write_files,
        description=f"continued pre-training (MLM + dEA) of {k.init} on {len(train):,} sentences with entities "
                    f"({read:,} read; {inputs.stats.line()}), backbone {params / 1e6:.1f}M parameters")
