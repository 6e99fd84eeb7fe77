"""Zero-shot semantic similarity: the cosine of two sentences' embeddings against gold scores.

No training: each sentence of a pair is embedded on its own (the run's pooling), the pair's
score is the cosine of the two vectors, and the metric is the Pearson and Spearman correlation
of those cosines with the gold scores, x100 -- how sentence-transformers evaluates STS-B
(Reimers & Gurevych 2019, §4.1: "Spearman's rank correlation between the cosine-similarity of
the sentence embeddings and the gold labels"; its EmbeddingSimilarityEvaluator also reports
Pearson). Pairs come from STS-B (a split, or a file in its layout) or from any TSV whose header
names ``sentence1``, ``sentence2`` and ``score`` (any numbers: only their order and linear fit
matter).
"""

from __future__ import annotations

import numpy as np

from ember.errors import EmberError
from ember.tasks.readers.glue import Example, TaskSpec, get_task, read_examples
from ember.tasks.metrics.classification import pearson, spearman

PAIRS = TaskSpec(
    name="pairs", display_name="sentence pairs", folder="", columns=("sentence1", "sentence2", "score"),
    text_a="sentence1", text_b="sentence2", label_column="score", labels=None, label_names=None,
    metrics=("pearson", "spearman"), main_metric="spearman", has_header=True, files={},
)


def similarity_task(task: str = "", file: str | None = None) -> TaskSpec:
    """STS-B by default; a generic pair file when only ``file`` is given; any pair task with a
    similarity score otherwise (a classification task's labels are not a similarity scale)."""
    if not task:
        return PAIRS if file else get_task("stsb")
    spec = PAIRS if task.lower() == "pairs" else get_task(task)
    if not (spec.is_pair and spec.is_regression):
        raise EmberError(f"zero-shot similarity needs sentence pairs with similarity scores: --task stsb, or "
                         f"--file PAIRS.tsv with sentence1, sentence2 and score columns; {spec.display_name} "
                         "has class labels (fine-tune on it instead)")
    return spec


def read_pairs(spec: TaskSpec, split: str = "dev", file: str | None = None) -> list[Example]:
    if file is None and not spec.files:
        raise EmberError("give the pairs with --file PATH (a TSV whose header names sentence1, sentence2, score)")
    return read_examples(spec, split, path=file)


def cosine(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """Row-wise cosine of (N, H) x (N, H) -> (N,) in float64; a zero vector has cosine 0."""
    a, b = np.asarray(a, dtype=np.float64), np.asarray(b, dtype=np.float64)
    norms = np.maximum(np.linalg.norm(a, axis=1) * np.linalg.norm(b, axis=1), 1e-12)
    return (a * b).sum(1) / norms


def similarity_metrics(cosines: np.ndarray, gold: np.ndarray) -> dict[str, float]:
    """Pearson and Spearman of cosines vs gold scores, x100 (sentence-transformers' scale)."""
    from ember.errors import EmberError

    if len(gold) < 2 or np.ptp(gold) == 0:  # a correlation of one pair, or of constant scores, is undefined
        raise EmberError(f"{len(gold)} pair(s) with {'one' if len(gold) < 2 else 'the same'} gold score: a "
                         "correlation needs at least two pairs with different scores")
    return {"pearson_cosine": 100 * pearson(cosines, gold), "spearman_cosine": 100 * spearman(cosines, gold),
            "pairs": float(len(gold))}
