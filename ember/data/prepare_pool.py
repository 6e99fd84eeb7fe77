"""Corpus preparation on several processes: batches of documents are split into sentences and
tokenized by worker processes while the main process reads the next ones and writes shards.

Why processes: sentence splitting and the bookkeeping around each encode call are Python
(one core, under the GIL), and while it runs the tokenizer's threads wait. With N worker
processes each batch runs ``encode_documents`` in a worker, so that Python work runs on N
cores too (the measured effect on a shared 2-core machine is in docs/performance.md).

Same output as one process, byte for byte: the batches are the same (``_batches`` in the
main process), each is encoded by the same function with the same tokenizer file, and the
results are taken back in submission order, so documents reach the shard writer in corpus
order. At most ``2 * workers`` batches (~2 MB of text each) are in flight, so memory stays
flat however large the corpus.

Workers are started with "spawn": a forked child of a process whose tokenizer has already
run its thread pool may deadlock (``tokenizers`` warns and disables parallelism then).
"""

from __future__ import annotations

import os
from collections import deque
from typing import Callable, Iterable, Iterator

_TOKENIZER = None  # the worker's tokenizer, loaded once by ``_start_worker``


def _start_worker(tokenizer_path: str) -> None:
    global _TOKENIZER
    from ember.tokenizers.train import load_tokenizer

    _TOKENIZER = load_tokenizer(tokenizer_path)


def _encode(texts: list[str], sep: str, sep_id: int, spans):
    from ember.data.prepare import encode_documents

    return encode_documents(_TOKENIZER, texts, sep, sep_id, spans)


def encoded_batches(batches: Iterable[list], encode_local: Callable, tokenizer_path, sep: str, sep_id: int,
                    spans_of: Callable | None, workers: int) -> Iterator[tuple[list, object]]:
    """(batch, EncodedBatch) for each batch of documents, in order.

    ``workers <= 1`` encodes in this process with ``encode_local(texts, spans)``; otherwise
    in a pool of ``workers`` processes (see the module docstring).
    """
    if workers <= 1:
        for batch in batches:
            spans = None if spans_of is None else [spans_of(d) for d in batch]
            yield batch, encode_local([d.text for d in batch], spans)
        return
    import multiprocessing
    from concurrent.futures import ProcessPoolExecutor
    from concurrent.futures.process import BrokenProcessPool

    from ember.errors import EmberError

    # An executor, not multiprocessing.Pool: a worker that dies (or cannot start) breaks it with
    # an error here, where a Pool would start replacements forever and leave us waiting.
    pool = ProcessPoolExecutor(workers, multiprocessing.get_context("spawn"), _start_worker, (str(tokenizer_path),))
    pending: deque = deque()
    try:
        for batch in batches:
            spans = None if spans_of is None else [spans_of(d) for d in batch]
            pending.append((batch, pool.submit(_encode, [d.text for d in batch], sep, sep_id, spans)))
            while len(pending) >= 2 * workers:  # keep the workers busy, the memory bounded
                done, result = pending.popleft()
                yield done, result.result()
        while pending:
            done, result = pending.popleft()
            yield done, result.result()
    except BrokenProcessPool as exc:
        raise EmberError(f"a preparation worker process died ({exc}); run with --workers 1 to see the "
                         "error in this process") from None
    finally:
        pool.shutdown(wait=True, cancel_futures=True)


def default_workers() -> int:
    """The cores this process may run on (``ember prepare --workers`` default)."""
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # not on Linux
        return os.cpu_count() or 1
