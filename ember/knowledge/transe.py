"""TransE entity and relation embeddings (Bordes et al. 2013, "Translating Embeddings for
Modeling Multi-relational Data"), the knowledge embeddings ERNIE fuses (Zhang et al. 2019, §4.1).

A relation is a translation: for a true triple (h, l, t), h + l should be close to t. The energy
is d(h + l, t), the L1 or L2 distance (§2), and training minimises the margin ranking loss over
true triples S and corrupted ones S' (eq. 1):

    L = sum_{(h,l,t) in S} sum_{(h',l,t') in S'} [gamma + d(h + l, t) - d(h' + l, t')]_+

where a corrupted triple has its head or its tail (not both) replaced by a random entity
(eq. 2). Algorithm 1: entities and relations start uniform in +-6/sqrt(k), relations are
normalised once, entities are normalised to unit L2 norm at each step, and minibatch SGD
follows the gradient of the summed loss. Here the entities of each minibatch are renormalised
before their step (the others are untouched by it anyway), and the embeddings are sparse,
so a step costs the batch, not the table.
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass, field

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from ember.errors import EmberError
from ember.knowledge.entities import EntityEmbeddings
from ember.knowledge.graph import KnowledgeGraph


@dataclass(frozen=True)
class TransESettings:
    # §4.2 chose k = 20, lambda = 0.01, gamma = 2, L1 for WN18's synsets; ERNIE's table is 100-d.
    # On ember's lemma graph (490k triples, 140k lemmas) L2 with gamma = 1 learns where L1 with
    # gamma = 2 barely does: after 20 epochs held-out mean rank 5,878 and hits@10 34.6% against
    # 54,566 and 1.6% (docs/knowledge.md).
    dim: int = 100
    margin: float = 1.0  # gamma
    norm: int = 2  # d = L1 (1) or L2 (2) distance
    lr: float = 0.01  # SGD step on the summed minibatch loss
    batch_size: int = 1024
    epochs: int = 50
    seed: int = 0
    max_time: float = 0.0  # seconds; 0 = no limit
    held_out: int = 500  # triples kept out of training for link prediction


class TransE(nn.Module):
    def __init__(self, num_entities: int, num_relations: int, dim: int, norm: int = 1) -> None:
        super().__init__()
        if norm not in (1, 2):
            raise EmberError(f"TransE's distance is L1 or L2; norm={norm}")
        self.norm = norm
        self.entities = nn.Embedding(num_entities, dim, sparse=True)
        self.relations = nn.Embedding(num_relations, dim, sparse=True)
        bound = 6.0 / math.sqrt(dim)  # Algorithm 1, lines 1-3
        with torch.no_grad():
            nn.init.uniform_(self.entities.weight, -bound, bound)
            nn.init.uniform_(self.relations.weight, -bound, bound)
            self.relations.weight.div_(self.relations.weight.norm(dim=1, keepdim=True))

    def energy(self, triples: torch.Tensor) -> torch.Tensor:
        """d(h + l, t) of (B, 3) [head, relation, tail] ids -> (B,)."""
        h, r, t = self.entities(triples[:, 0]), self.relations(triples[:, 1]), self.entities(triples[:, 2])
        return (h + r - t).norm(p=self.norm, dim=-1)

    def loss(self, positive: torch.Tensor, negative: torch.Tensor, margin: float) -> torch.Tensor:
        """Eq. 1 summed over the minibatch: [gamma + d(pos) - d(neg)]_+ per (pos, neg) pair."""
        return F.relu(margin + self.energy(positive) - self.energy(negative)).sum()

    @torch.no_grad()
    def normalize_entities(self, ids: torch.Tensor) -> None:
        """Algorithm 1, line 5: e <- e / ||e|| for the entities about to be used."""
        rows = self.entities.weight[ids]
        self.entities.weight[ids] = rows / rows.norm(dim=1, keepdim=True).clamp(min=1e-12)


def corrupt(triples: np.ndarray, num_entities: int, rng: np.random.Generator) -> np.ndarray:
    """Eq. 2: each triple with its head or its tail (chosen at random) replaced by a random entity."""
    out = triples.copy()
    heads = rng.random(len(triples)) < 0.5
    replacement = rng.integers(0, num_entities, size=len(triples))
    out[heads, 0] = replacement[heads]
    out[~heads, 2] = replacement[~heads]
    return out


@torch.no_grad()
def link_prediction(model: TransE, triples: np.ndarray, batch: int = 64) -> dict[str, float]:
    """Raw tail prediction (§4.2's protocol, "raw" setting): the rank of the true tail among all
    entities by energy; mean rank and hits@10 (lower / higher is better)."""
    ranks = []
    table = model.entities.weight
    for start in range(0, len(triples), batch):
        part = torch.as_tensor(triples[start:start + batch])
        query = table[part[:, 0]] + model.relations.weight[part[:, 1]]  # (b, d)
        scores = torch.cdist(query, table, p=model.norm)  # (b, N)
        true = scores.gather(1, part[:, 2:3])  # (b, 1)
        ranks.append((scores < true).sum(1) + 1)
    ranks = torch.cat(ranks).float() if ranks else torch.zeros(0)
    return {"mean_rank": float(ranks.mean()) if len(ranks) else float("nan"),
            "hits_at_10": float((ranks <= 10).float().mean()) if len(ranks) else float("nan"),
            "triples": len(ranks)}


@dataclass
class TransEResult:
    embeddings: EntityEmbeddings
    losses: list[float] = field(default_factory=list)  # mean loss per corrupted pair, per epoch
    held_out: dict = field(default_factory=dict)  # link prediction before / after training
    seconds: float = 0.0


def train_transe(graph: KnowledgeGraph, settings: TransESettings = TransESettings(),
                 progress: bool = True) -> TransEResult:
    """TransE on ``graph`` (see the module docstring); entities = every head and tail."""
    s = settings
    if s.dim < 1 or s.batch_size < 1 or s.epochs < 1 or s.lr <= 0 or s.margin <= 0:
        raise EmberError(f"TransE settings must be positive (dim {s.dim}, batch {s.batch_size}, epochs "
                         f"{s.epochs}, lr {s.lr}, margin {s.margin})")
    names, relations = graph.entities(), graph.relations()
    entity_id = {n: i for i, n in enumerate(names)}
    relation_id = {r: i for i, r in enumerate(relations)}
    data = np.array([[entity_id[t.head], relation_id[t.relation], entity_id[t.tail]] for t in graph.triples],
                    dtype=np.int64)
    rng = np.random.default_rng(s.seed)
    torch.manual_seed(s.seed)
    order = rng.permutation(len(data))
    n_held = min(s.held_out, len(data) // 10)
    held, train = data[order[:n_held]], data[order[n_held:]]
    model = TransE(len(names), len(relations), s.dim, s.norm)
    optimizer = torch.optim.SGD(model.parameters(), lr=s.lr)
    result = TransEResult(EntityEmbeddings([], torch.zeros(0, s.dim)))
    if n_held:
        result.held_out["before"] = link_prediction(model, held)
    start = time.perf_counter()
    for epoch in range(s.epochs):
        total, seen = 0.0, 0
        perm = rng.permutation(len(train))
        for lo in range(0, len(train), s.batch_size):
            positive = train[perm[lo:lo + s.batch_size]]
            negative = corrupt(positive, len(names), rng)
            pos, neg = torch.as_tensor(positive), torch.as_tensor(negative)
            model.normalize_entities(torch.unique(torch.cat([pos[:, [0, 2]], neg[:, [0, 2]]]).flatten()))
            loss = model.loss(pos, neg, s.margin)
            optimizer.zero_grad(set_to_none=True)
            loss.backward()
            optimizer.step()
            total += float(loss.detach())
            seen += len(positive)
        result.losses.append(total / max(seen, 1))
        if progress:
            print(f"TransE epoch {epoch + 1}/{s.epochs}: loss {result.losses[-1]:.4f} per pair")
        if s.max_time and time.perf_counter() - start > s.max_time:
            break
    result.seconds = time.perf_counter() - start
    model.normalize_entities(torch.arange(len(names)))
    if n_held:
        result.held_out["after"] = link_prediction(model, held)
    result.embeddings = EntityEmbeddings(names, model.entities.weight.detach().clone(), relations,
                                         model.relations.weight.detach().clone(), source=graph.source)
    return result
