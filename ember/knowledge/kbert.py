"""K-BERT's sentence tree, flattened (Liu et al. 2020, "K-BERT: Enabling Language Representation
with Knowledge Graph", §3.2-3.3, Fig. 2-4).

K-Inject hangs up to k triples (relation, tail) of each entity found in the sentence on that
entity as branches of a *sentence tree*. The embedding layer flattens the tree: a branch's
tokens follow its entity's last token (hard positions = the order of the flat sequence),
and each token gets a *soft position*: a branch continues counting from its entity, the rest
of the sentence continues as if no branch were there (Fig. 2: "[CLS] Tim Cook CEO Apple is
visiting Beijing capital China is_a City now" has soft positions 0 1 2 3 4 3 4 5 6 7 6 7 6).
The soft positions are the position embeddings' ids.

The *visible matrix* (§3.3, eq. 4) keeps a branch from changing the meaning of the rest of
the sentence: M_ij = 0 (visible) when tokens i and j are in the same branch of the tree,
-inf otherwise. As in the released code (``add_knowledge_with_vm``):
* the sentence's own tokens (and the special tokens) all see each other;
* an entity's tokens also see every branch hung on that entity (the knowledge reaches the
  sentence only through its anchor);
* a branch's tokens see their own branch and their entity's tokens, nothing else;
so the rest of the sentence never sees a branch, and no branch sees another.

This module works on any token type (words in the tests, token ids in ``ember.knowledge.inputs``).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Generic, Sequence, TypeVar

import numpy as np

T = TypeVar("T")


@dataclass
class Mention(Generic[T]):
    """An entity's tokens [start, end) in the sentence and the branches hung on it."""

    start: int
    end: int
    branches: list[Sequence[T]] = field(default_factory=list)


@dataclass
class FlatTree(Generic[T]):
    """The flattened tree: one entry per hard position."""

    tokens: list[T]
    soft_positions: list[int]
    source: list[int]  # index in the sentence's tokens, or -1 for an injected token
    branch: list[int]  # 0 for a sentence token, else the branch's number (1, 2, ...)
    anchor: list[int]  # the number (1, 2, ...) of the entity a token belongs or hangs on, 0 for none
    dropped: int = 0  # branches left out because they did not fit max_length

    @property
    def visible(self) -> np.ndarray:
        return visible_matrix(self.branch, self.anchor)

    @property
    def injected(self) -> int:
        return sum(b > 0 for b in self.branch)


def visible_matrix(branch: Sequence[int], anchor: Sequence[int]) -> np.ndarray:
    """(n, n) bool, True where token i may attend to token j (K-BERT eq. 4; rules above)."""
    b, a = np.asarray(branch), np.asarray(anchor)
    sentence = b == 0
    visible = sentence[:, None] & sentence[None, :]  # the sentence sees itself
    visible |= (b[:, None] > 0) & (b[:, None] == b[None, :])  # a branch sees itself
    # an entity and its branches see each other (exactly one of i, j is a sentence token)
    visible |= (a[:, None] > 0) & (a[:, None] == a[None, :]) & (sentence[:, None] != sentence[None, :])
    return visible


def flatten_tree(tokens: Sequence[T], mentions: Sequence[Mention[T]], max_length: int = 0,
                 first_position: int = 0) -> FlatTree[T]:
    """Flatten a sentence tree: the sentence's ``tokens`` with each mention's branches inserted
    after its last token. ``mentions`` are non-overlapping and sorted; with ``max_length`` > 0
    a branch that would make the sequence longer than that is left out (the sentence itself
    is never cut here: truncate it first), so knowledge never pushes the text out."""
    ends = {}
    for number, m in enumerate(mentions, 1):
        if not 0 <= m.start < m.end <= len(tokens):
            raise ValueError(f"mention [{m.start}, {m.end}) outside a sentence of {len(tokens)} tokens")
        ends[m.end] = (number, m)
    member = np.zeros(len(tokens), dtype=np.int64)
    for number, m in ends.values():
        if member[m.start:m.end].any():
            raise ValueError(f"mention [{m.start}, {m.end}) overlaps another")
        member[m.start:m.end] = number
    room = max_length - len(tokens) if max_length > 0 else float("inf")
    out = FlatTree([], [], [], [], [])
    position, n_branch = first_position, 0
    for i, token in enumerate(tokens):
        out.tokens.append(token)
        out.soft_positions.append(position)
        out.source.append(i)
        out.branch.append(0)
        out.anchor.append(int(member[i]))
        position += 1
        if i + 1 not in ends:
            continue
        number, mention = ends[i + 1]
        for branch in mention.branches:
            if len(branch) > room or not branch:
                out.dropped += bool(branch)
                continue
            room -= len(branch)
            n_branch += 1
            # Soft positions continue from the entity's last token (= ``position`` now).
            out.tokens.extend(branch)
            out.soft_positions.extend(range(position, position + len(branch)))
            out.source.extend([-1] * len(branch))
            out.branch.extend([n_branch] * len(branch))
            out.anchor.extend([number] * len(branch))
    return out
