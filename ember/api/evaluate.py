"""``ember.evaluate``: a fine-tuned run's official metrics on a labelled split or file, or any
encoder run's zero-shot similarity (cosine of embeddings vs gold scores)."""

from __future__ import annotations

from pathlib import Path


def evaluate(run: str | Path, split: str = "", file: str | Path | None = None, task: str = "",
             zero_shot: bool = False, **similarity) -> dict:
    """{"task", "split", "metrics"} of ``run`` on ``split`` (default: the split it was selected
    on) or on a labelled ``file`` in the task's layout; SQuAD 2.0 uses the run's tuned threshold.

    ``zero_shot``: no head, any encoder run: the cosine similarity of the two sentences' pooled
    embeddings against the gold scores (STS-B, or a ``file`` with sentence1/sentence2/score),
    Pearson and Spearman x100; ``similarity`` takes pooling, layer, max_length, backend,
    batch_size (``ember.api.embed.evaluate_similarity``).

    >>> ember.evaluate("runs/sst2")["metrics"]["accuracy"]  # doctest: +SKIP
    >>> ember.evaluate("runs/minilm", task="stsb", zero_shot=True)["metrics"]["spearman_cosine"]  # doctest: +SKIP
    """
    if zero_shot:
        from ember.api.embed import evaluate_similarity

        return evaluate_similarity(run, task, split, file, **similarity)
    if similarity:
        from ember.errors import EmberError

        raise EmberError(f"{', '.join(sorted(similarity))}: only with zero_shot=True (--zero-shot)")
    from ember.tasks.task_model import evaluate_run

    return evaluate_run(Path(run), split, str(file) if file is not None else None, task)
