"""Entity-level precision / recall / F1 for BIO-tagged sequences (CoNLL-2003 NER).

CoNLL-2003 (Tjong Kim Sang & De Meulder, 2003, §4) scores *entities*, not tokens: a predicted
entity counts only if its type and both boundaries equal a gold entity's. Scores are micro
averages over all entities of all types, exactly as the shared task's ``conlleval`` script and
``seqeval``'s default mode compute them (the numbers papers report, e.g. BERT's 92.4 F1).

Which spans a tag sequence holds is decided by one of two chunkers:

* ``mode="conlleval"`` (default, = seqeval's default): lenient reading of ill-formed tags. An
  entity starts at every ``B-X``, at an ``I-X`` after ``O``, and at a tag whose type differs
  from the previous one (so ``O I-PER`` is one PER entity and ``B-PER I-LOC`` two entities). A
  model's raw predictions are often ill-formed; this is how the official scorer reads them.
* ``mode="strict"`` (= seqeval ``mode="strict", scheme=IOB2``): an entity must be ``B-X``
  followed by ``I-X``s; an ``I-X`` that does not continue a ``B-X``/``I-X`` run is no entity.

Either way matching is exact on (type, start, end): ``B-PER I-PER`` against a gold
``B-PER`` + ``O`` is one false positive and one false negative.
"""

from __future__ import annotations

from collections import Counter
from typing import Sequence

from ember.errors import EmberError

MODES = ("conlleval", "strict")


def _split_tag(tag: str) -> tuple[str, str]:
    """'B-PER' -> ('B', 'PER'); 'O' -> ('O', '')."""
    if tag == "O":
        return "O", ""
    prefix, sep, kind = tag.partition("-")
    if not sep or prefix not in ("B", "I") or not kind:
        raise EmberError(f"tag {tag!r} is not BIO: use O, B-TYPE or I-TYPE")
    return prefix, kind


def get_entities(tags: Sequence[str], mode: str = "conlleval") -> list[tuple[str, int, int]]:
    """Entities of one sentence as (type, first index, last index inclusive), in order."""
    if mode not in MODES:
        raise EmberError(f"unknown NER scoring mode {mode!r}; valid: {', '.join(MODES)}")
    entities: list[tuple[str, int, int]] = []
    start, kind = None, ""  # the open entity, if any
    for i, tag in enumerate(tags):
        prefix, typ = _split_tag(tag)
        # The open entity ends before token i at O, at a new B-, and at a type change.
        if start is not None and (prefix in ("O", "B") or typ != kind):
            entities.append((kind, start, i - 1))
            start = None
        # Here an I- with no open entity follows O, a sentence start, or another type:
        # conlleval starts an entity there, strict IOB2 leaves the token outside any entity.
        if prefix == "B" or (prefix == "I" and start is None and mode == "conlleval"):
            start, kind = i, typ
    if start is not None:
        entities.append((kind, start, len(tags) - 1))
    return entities


def _prf(tp: int, n_pred: int, n_gold: int) -> dict[str, float]:
    # seqeval/conlleval convention: 0 when undefined (no predictions or no gold entities).
    precision = tp / n_pred if n_pred else 0.0
    recall = tp / n_gold if n_gold else 0.0
    f1 = 2 * precision * recall / (precision + recall) if precision + recall else 0.0
    return {"precision": precision, "recall": recall, "f1": f1}


def entity_scores(gold: Sequence[Sequence[str]], pred: Sequence[Sequence[str]], mode: str = "conlleval",
                  per_type: bool = False) -> dict:
    """Micro entity P/R/F1 over sentences; ``per_type`` adds {"PER": {...}, ...} under "types".

    ``gold[i]`` and ``pred[i]`` are the tag lists of sentence i and must have equal lengths.
    """
    if len(gold) != len(pred):
        raise EmberError(f"{len(gold)} gold sentences but {len(pred)} predicted ones")
    tp, n_gold, n_pred = Counter(), Counter(), Counter()
    for i, (g, p) in enumerate(zip(gold, pred)):
        if len(g) != len(p):
            raise EmberError(f"sentence {i}: {len(g)} gold tags but {len(p)} predicted tags")
        gold_set = set(get_entities(g, mode))
        pred_set = set(get_entities(p, mode))
        n_gold.update(e[0] for e in gold_set)
        n_pred.update(e[0] for e in pred_set)
        tp.update(e[0] for e in gold_set & pred_set)
    out = _prf(sum(tp.values()), sum(n_pred.values()), sum(n_gold.values()))
    if per_type:
        out["types"] = {t: {**_prf(tp[t], n_pred[t], n_gold[t]), "support": n_gold[t]}
                        for t in sorted(set(n_gold) | set(n_pred))}
    return out
