"""Fine-tuning with a knowledge graph: K-BERT (``knowledge.graph``) and/or ERNIE's entity fusion
(``knowledge.entities``) for the sentence (pair) classification and tagging tasks of any
encoder family (``ember finetune --knowledge FILE --entities DIR``; docs/knowledge.md).

``with_knowledge(cfg, adapter)`` turns a task's adapter into one whose features carry the
knowledge (``ember.knowledge.inputs``): the same class with its featurizing step replaced
(``encode`` for GLUE-style tasks, ``encode_words`` for tagging), so reading, scoring and
predicting files stay the task's own. The task models pass the extra inputs on to the
backbone (``ember.tasks.featurize.backbone_inputs``); the backbone is the plain encoder for
K-BERT (soft positions + visible matrix are generic encoder inputs) and an
``ember.knowledge.ernie.FusionEncoder`` for ERNIE (``knowledge_backbone``).

A run folder keeps what it was trained with: RUN/knowledge.tsv (the graph, after the relation
filter) and RUN/entities.tsv (the entity vocabulary; the vectors are in the weights), so
``ember evaluate``/``predict`` featurize exactly as training did (``run_knowledge``).
"""

from __future__ import annotations

import copy
import dataclasses
import sys
from pathlib import Path

from ember.config import RunConfig
from ember.errors import EmberError
from ember.tasks.featurize import Featurized

RUN_GRAPH, RUN_ENTITIES = "knowledge.tsv", "entities.tsv"


def uses_knowledge(cfg: RunConfig) -> bool:
    return bool(cfg.knowledge.graph or cfg.knowledge.entities)


class _WithKnowledge:
    """What every knowledge adapter adds to its task's adapter."""

    graph = None  # KnowledgeGraph (K-BERT) or None
    entity_names: list[str] | None = None  # ERNIE's vocabulary, row order
    entity_vectors = None  # (N, D) when fine-tuning starts; None when loaded from a run
    max_triples = 2
    _inputs = None
    # Not served yet: the serving methods encode plain text (ember.tasks.inference.requests.TextEncoder)
    # and would silently drop the knowledge; `ember serve` / `ember export` say so, `ember predict` works.
    inference_methods = None
    _where = ""  # the split (or file) being loaded, for the statistics line
    not_served_reason = ("its inputs carry knowledge (K-BERT's injected triples or ERNIE's entities), which the "
                         "served and exported inputs (plain text) would silently drop")

    def knowledge_inputs(self, tokenizer):
        """The featurizer for ``tokenizer`` (built once; its stats count every sentence seen)."""
        from ember.knowledge.inputs import KnowledgeBase, KnowledgeInputs

        if self._inputs is None or self._inputs[0] is not tokenizer:
            base = KnowledgeBase(self.graph, self.max_triples) if self.graph is not None else None
            self._inputs = (tokenizer, KnowledgeInputs(tokenizer, base, self.entity_names))
        return self._inputs[1]

    def load(self, split, tokenizer, max_length, limit=None, path=None):
        # Remembered so that the statistics line says which split it counts (train and dev print one each).
        self._where = f"{split if path is None else path}, "
        try:
            return super().load(split, tokenizer, max_length, limit=limit, path=path)
        finally:
            self._where = ""

    def _report(self, inputs, before, what: str) -> None:
        new = inputs.stats.since(before)
        if new.sentences:
            print(f"knowledge ({self._where}{what}): {new.line()}", file=sys.stderr)

    def build_module(self, backbone, pad_id):
        if self.entity_vectors is not None:  # fresh fine-tuning: the TransE table from its file
            backbone.set_entity_vectors(self.entity_vectors)
        return super().build_module(backbone, pad_id)

    def write_run_files(self, run_dir: Path) -> None:
        """RUN/knowledge.tsv and RUN/entities.tsv: what featurizes the run's inputs later."""
        from ember.fileio import atomic_write_text
        from ember.knowledge.graph import write_triples

        if self.graph is not None:
            write_triples(Path(run_dir) / RUN_GRAPH, self.graph.triples)
        if self.entity_names is not None:
            atomic_write_text(Path(run_dir) / RUN_ENTITIES, "".join(f"{n}\n" for n in self.entity_names))


class _SentenceKnowledge(_WithKnowledge):
    """GLUE-style tasks: text (pairs) with knowledge."""

    def encode(self, examples, tokenizer, max_length) -> Featurized:
        inputs = self.knowledge_inputs(tokenizer)
        before, features, n_truncated = dataclasses.replace(inputs.stats), [], 0
        for ex in examples:
            f = inputs.encode_text(ex.text_a, ex.text_b, max_length)
            n_truncated += f.pop("truncated")
            f.pop("word_starts")
            features.append({**f, "label": ex.label})
        self._report(inputs, before, f"{len(examples)} examples")
        return Featurized(features, n_truncated)


class _WordKnowledge(_WithKnowledge):
    """Tagging tasks: pre-split words with knowledge; labels on each word's first token only
    (injected tokens are never labelled nor scored)."""

    def encode_words(self, word_seqs, tokenizer, max_length, label_seqs=None):
        from ember.tasks.tagging import IGNORE, Tagged

        inputs = self.knowledge_inputs(tokenizer)
        before, features, n_truncated = dataclasses.replace(inputs.stats), [], 0
        for i, words in enumerate(word_seqs):
            f = inputs.encode_words(words, max_length)
            n_truncated += f.pop("truncated")
            if label_seqs is not None:
                f["labels"] = [IGNORE] * len(f["input_ids"])
                for w, position in enumerate(f["word_starts"]):
                    if position >= 0:
                        f["labels"][position] = label_seqs[i][w]
            features.append(f)
        self._report(inputs, before, f"{len(word_seqs)} sentences")
        return Tagged(features, n_truncated)


KINDS = {"classify": _SentenceKnowledge, "tag": _WordKnowledge}


def _adapt(adapter, graph, entity_names, entity_vectors, max_triples: int):
    mixin = KINDS.get(getattr(adapter, "kind", None))
    if mixin is None:
        raise EmberError(f"knowledge (--knowledge / --entities) works with sentence classification and tagging "
                         f"tasks; {adapter.display_name} is neither")
    out = copy.copy(adapter)
    out.__class__ = type(f"Knowledge{type(adapter).__name__}", (mixin, type(adapter)), {})
    out.graph, out.entity_names, out.entity_vectors, out.max_triples = graph, entity_names, entity_vectors, max_triples
    return out


def with_knowledge(cfg: RunConfig, adapter):
    """(cfg with the entity table's shape recorded, the adapter with knowledge) for a new run;
    (cfg, adapter) unchanged when the run uses no knowledge. Bad input is refused here,
    before anything is written."""
    if cfg.knowledge.relations and not cfg.knowledge.graph:
        raise EmberError("knowledge.relations filters the K-BERT graph; give the graph too (--knowledge FILE)")
    if not uses_knowledge(cfg):
        return cfg, adapter
    from ember.knowledge.ernie import check_encoder_family

    k = cfg.knowledge
    check_encoder_family(cfg.model, "knowledge (--knowledge / --entities)")
    if cfg.task.features:
        raise EmberError("--features freezes the encoder and mixes its layers for a small head; knowledge inputs "
                         "(soft positions, visible matrix, entities) need the encoder itself: drop one of them")
    if k.entities and (cfg.task.layer_lr_decay != 1.0 or cfg.task.gradual_unfreeze):
        raise EmberError("--layer-lr-decay and --gradual-unfreeze place each parameter in an encoder layer; "
                         "ERNIE's fusion layers (--entities) have no place there yet: drop one of them")
    graph = entity_names = vectors = None
    if k.graph:
        from ember.knowledge.graph import read_triples
        from ember.knowledge.inputs import KnowledgeBase

        graph = read_triples(k.graph, k.relations)
        KnowledgeBase(graph, k.max_triples)  # checks k
    if k.entities:
        from ember.knowledge.entities import load_entity_embeddings

        table = load_entity_embeddings(k.entities)
        entity_names, vectors = table.names, table.vectors
        cfg = dataclasses.replace(cfg, knowledge=dataclasses.replace(
            k, num_entities=len(table.names), entity_dim=table.dim))
    return cfg, _adapt(adapter, graph, entity_names, vectors, k.max_triples)


def run_knowledge(run_dir: str | Path, cfg: RunConfig, adapter):
    """The adapter of a fine-tuned run with the knowledge it was trained with (RUN files)."""
    if not uses_knowledge(cfg):
        return adapter
    from ember.knowledge.entities import read_names
    from ember.knowledge.graph import read_triples

    run_dir = Path(run_dir)
    needed = ([RUN_GRAPH] if cfg.knowledge.graph else []) + ([RUN_ENTITIES] if cfg.knowledge.entities else [])
    missing = [name for name in needed if not (run_dir / name).is_file()]
    if missing:
        raise EmberError(f"{run_dir} was fine-tuned with knowledge but has no {', '.join(missing)}; the run "
                         "folder is incomplete (copy the whole folder, or fine-tune again)")
    graph = read_triples(run_dir / RUN_GRAPH) if cfg.knowledge.graph else None
    names = read_names(run_dir / RUN_ENTITIES) if cfg.knowledge.entities else None
    if names is not None and len(names) != cfg.knowledge.num_entities:
        raise EmberError(f"{run_dir / RUN_ENTITIES} lists {len(names)} entities but the run's entity table has "
                         f"{cfg.knowledge.num_entities} rows (config.yaml knowledge.num_entities)")
    return _adapt(adapter, graph, names, None, cfg.knowledge.max_triples)


def knowledge_backbone(cfg: RunConfig):
    """The backbone of a knowledge run: ERNIE's FusionEncoder when it fuses entities, else None
    (K-BERT needs nothing but the plain encoder)."""
    if not cfg.knowledge.entities:
        return None
    from ember.knowledge.ernie import fusion_backbone

    return fusion_backbone(cfg.model, cfg.knowledge)
