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
import sys
from collections import deque
from typing import Callable, Iterable, Iterator

_TOKENIZER = None  # the worker's tokenizer, loaded once by ``_start_worker``


def _start_worker(tokenizer_path: str) -> None:
    global _TOKENIZER
    from ember.tokenizers.train import load_tokenizer

    _die_with_parent()

    _TOKENIZER = load_tokenizer(tokenizer_path)


def _die_with_parent() -> None:
    """On Linux, ask the kernel to stop this worker when `ember prepare` dies: after a kill -9 its
    workers (~130 MB each) went on running, orphaned, on a machine shared with other jobs."""
    if not sys.platform.startswith("linux"):
        return
    import ctypes
    import signal

    try:
        ctypes.CDLL(None, use_errno=True).prctl(1, int(signal.SIGTERM))  # 1 = PR_SET_PDEATHSIG
    except (OSError, AttributeError):
        pass
    if os.getppid() == 1:  # the parent died before the request took effect
        os._exit(1)


def _encode(encode: Callable, *args):
    """In a worker: ``encode`` (pickled by name, so this module never imports it) on its tokenizer."""
    return encode(_TOKENIZER, *args)


def encoded_batches(batches: Iterable[list], encode: Callable, tokenizer, tokenizer_path, sep: str, sep_id: int,
                    spans_of: Callable | None, workers: int) -> Iterator[tuple[list, object]]:
    """(batch, ``encode(tokenizer, texts, sep, sep_id, spans)``) for each batch of documents, in
    order: in this process (``workers <= 1``) or in a pool of ``workers`` processes, each with
    its own copy of the tokenizer from ``tokenizer_path`` (see the module docstring).
    """
    if workers <= 1:
        for batch in batches:
            spans = None if spans_of is None else [spans_of(d) for d in batch]
            yield batch, encode(tokenizer, [d.text for d in batch], sep, sep_id, spans)
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
            pending.append((batch, pool.submit(_encode, encode, [d.text for d in batch], sep, sep_id, spans)))
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
