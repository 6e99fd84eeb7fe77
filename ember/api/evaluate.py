"""``ember.evaluate``: a fine-tuned run's official metrics on a labelled split, file or data from
Python, or any encoder run's zero-shot similarity (cosine of embeddings vs gold scores)."""

from __future__ import annotations

from pathlib import Path

from ember.api.arguments import folder_arg
from ember.api.caller_state import keeps_caller_state


SIMILARITY_SETTINGS = ("pooling", "layer", "max_length", "backend", "batch_size")  # evaluate_similarity's


@keeps_caller_state
def evaluate(run: str | Path, split: str = "", file: str | Path | None = None, task: str = "", data=None,
             column: str | None = None, pair_column: str | None = None, label_column: str | None = None,
             zero_shot: bool = False, progress: bool = False, num_beams: int | None = None,
             length_penalty: float | None = None, max_new_tokens: int | None = None, **similarity) -> dict:
    """{"task", "split", "metrics"} of ``run`` on ``split`` (default: the split it was selected
    on), on a labelled ``file`` in the task's layout, or on ``data`` from Python (a DataFrame, a
    ``datasets.Dataset``, a dict of columns, a list of tuples or dicts; columns as in
    ``ember.finetune``); SQuAD 2.0 uses the run's tuned threshold. ``progress``: a progress bar
    while the model runs over the rows. A text-to-text (T5) run decodes as its ``task.num_beams``,
    ``task.length_penalty`` and ``task.max_new_tokens`` say, unless ``num_beams``,
    ``length_penalty`` or ``max_new_tokens`` are given here.
    ``max_length`` (a keyword): tokens per input instead of the run's ``task.max_length``, at
    most the model's positions, e.g. a model made long (``ember convert --long``) reading a whole
    document in one window.

    ``zero_shot``: no head, any encoder run: the cosine similarity of the two sentences' pooled
    embeddings against the gold scores (STS-B, or a ``file`` with sentence1/sentence2/score),
    Pearson and Spearman x100; ``similarity`` takes pooling, layer, max_length, backend,
    batch_size (``ember.api.embed.evaluate_similarity``).

    >>> ember.evaluate("runs/sst2")["metrics"]["accuracy"]  # doctest: +SKIP
    >>> ember.evaluate("runs/minilm", task="stsb", zero_shot=True)["metrics"]["spearman_cosine"]  # doctest: +SKIP
    """
    from ember.errors import EmberError
    from ember.tasks.task_model import evaluate_run

    run = folder_arg(run, "run")
    decoding = {"num_beams": num_beams, "length_penalty": length_penalty, "max_new_tokens": max_new_tokens}
    unknown = sorted(set(similarity) - set(SIMILARITY_SETTINGS))
    if unknown:  # a typo (splt=) was reported as a zero-shot setting, or reached a TypeError inside
        raise EmberError(f"evaluate() got unknown keyword(s) {', '.join(unknown)}; it takes split, file, task, "
                         f"data, column, pair_column, label_column, zero_shot, progress, num_beams, length_penalty, "
                         f"max_new_tokens, and with zero_shot=True {', '.join(SIMILARITY_SETTINGS)}")
    if zero_shot:
        if data is not None:
            raise EmberError("zero_shot=True reads a task's pairs or a file; data= is for fine-tuned runs")
        if any(v is not None for v in decoding.values()):
            raise EmberError("num_beams / length_penalty / max_new_tokens decode a T5 run's outputs; "
                             "zero-shot similarity decodes nothing")
        from ember.api.embed import evaluate_similarity

        return evaluate_similarity(run, task, split, file, progress=progress, **similarity)
    max_length = similarity.pop("max_length", None)  # a fine-tuned run's inputs: tokens per input
    if similarity:
        raise EmberError(f"{', '.join(sorted(similarity))}: only with zero_shot=True (--zero-shot)")
    if data is None:
        if (column, pair_column, label_column) != (None, None, None):
            raise EmberError("column= / pair_column= / label_column= name the columns of data=; pass the data too")
        return evaluate_run(Path(run), split, str(file) if file is not None else None, task, progress, decoding,
                            max_length)
    import tempfile

    from ember.api.task_data import task_spec, write_split
    from ember.runs.folder import load_run_config

    if split or file is not None:
        raise EmberError("data= replaces split= and file=; pass one of them")
    spec = task_spec(task or load_run_config(run, expect_kind="finetune").task.name)
    with tempfile.TemporaryDirectory(prefix="ember-evaluate-") as tmp:
        path = write_split(spec, data, Path(tmp) / "data.tsv", "data=", column, pair_column, label_column)
        result = evaluate_run(Path(run), "", str(path), task, progress, decoding, max_length)
        n = len(path.read_text(encoding="utf-8").splitlines()) - spec.has_header
    return {**result, "split": f"data from Python ({n} examples)"}
