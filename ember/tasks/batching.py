"""Length-sorted inference batches, and the progress bar `ember evaluate` / `ember predict` show.

Every inference loop (a classifier's logits, a tagger's tags, QA spans, T5's decoding,
log-likelihood scoring, served requests, embeddings) runs its rows in batches of similar length,
so a batch pads little, and writes each output back at its row's own index. The order is a
stable sort by length: rows of equal length keep their input order, so which rows share a batch
(and so every output) is the same from run to run.

A long evaluation (SQuAD's dev questions, a T5 run decoding thousands of outputs) would sit
silent for minutes; inside ``inference_progress("...")`` these loops draw one progress bar over
the rows. Outside it (training's own evaluations under the trainer's bar, the server, tests)
they draw nothing. The setting is a context variable, so a served request on another thread
never draws a bar started by a command; and only the outermost loop on a thread draws one (a
loop whose batches run another such loop would otherwise stack a bar per batch).
"""

from __future__ import annotations

import threading
from contextlib import contextmanager
from contextvars import ContextVar
from typing import Iterator, Sequence

_PROGRESS: ContextVar[tuple[str, str] | None] = ContextVar("ember_inference_progress", default=None)
_DRAWING = threading.local()  # .bar: this thread's open bar, if any


@contextmanager
def inference_progress(description: str, enabled: bool = True, unit: str = "row"):
    """Within this block, ``length_sorted_batches`` shows a bar labelled ``description``, counting
    ``unit``s (nothing when ``enabled`` is False)."""
    token = _PROGRESS.set((description, unit) if enabled else None)
    try:
        yield
    finally:
        _PROGRESS.reset(token)


def length_sorted_batches(lengths: Sequence, batch_size: int, max_tokens: int | None = None) -> Iterator[list[int]]:
    """Row indices in chunks of at most ``batch_size``, by ascending ``lengths[i]`` (any sortable
    key: an int, or a tuple such as (input length, target length)); ties keep input order.
    ``max_tokens`` (int lengths): a chunk also ends before its rows padded to its longest would
    pass that many tokens (one row always fits), so long inputs come a few at a time."""
    if batch_size < 1:
        raise ValueError(f"batch_size must be at least 1, got {batch_size}")
    order = sorted(range(len(lengths)), key=lengths.__getitem__)
    chunks = _chunks(order, batch_size) if max_tokens is None else _token_chunks(order, lengths, batch_size, max_tokens)
    shown = _PROGRESS.get()
    bar = None
    if shown is not None and order and getattr(_DRAWING, "bar", None) is None:
        from tqdm import tqdm

        description, unit = shown
        bar = _DRAWING.bar = tqdm(total=len(order), desc=description, unit=unit, dynamic_ncols=True, leave=False)
    try:
        for chunk in chunks:
            yield chunk
            if bar is not None:
                bar.update(len(chunk))
    finally:
        if bar is not None:
            bar.close()
            _DRAWING.bar = None


def _chunks(order: list[int], size: int) -> Iterator[list[int]]:
    for first in range(0, len(order), size):
        yield order[first : first + size]


def _token_chunks(order: list[int], lengths: Sequence, size: int, max_tokens: int) -> Iterator[list[int]]:
    """``order`` (ascending lengths) in chunks of at most ``size`` rows and ``max_tokens`` padded tokens."""
    chunk: list[int] = []
    for i in order:  # ascending, so the row being added is the chunk's longest
        if chunk and (len(chunk) >= size or (len(chunk) + 1) * lengths[i] > max_tokens):
            yield chunk
            chunk = []
        chunk.append(i)
    if chunk:
        yield chunk
