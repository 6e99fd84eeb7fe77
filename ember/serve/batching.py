"""Micro-batching: many concurrent requests, one forward pass.

Request handlers (asyncio) put (kind, request, future) on a thread-safe queue and await the
future. One worker thread takes the first waiting request, then keeps collecting until it
holds ``max_batch`` requests or ``max_wait_ms`` have passed since the first one, groups them
by endpoint, and calls ``process(kind, requests)`` once per group (the predictor pads the
group per batch and runs one forward). Results go back to the event loop with
``call_soon_threadsafe``. The model thus runs off the event loop, so the server keeps
accepting and validating requests while a batch computes, and at most one batch runs at a
time (CPU inference already uses every core).

``close()`` puts a stop marker behind whatever is queued: everything submitted before it is
still answered (graceful shutdown), anything submitted after gets a 503.
"""

from __future__ import annotations

import asyncio
import queue
import threading
import time
from typing import Callable

from ember.errors import RequestError

_STOP = object()


class MicroBatcher:
    def __init__(self, process: Callable[[str, list], list], max_batch: int = 32, max_wait_ms: float = 5.0,
                 max_queue: int = 1024) -> None:
        if max_batch < 1 or max_wait_ms < 0:
            raise ValueError("max_batch must be >= 1 and max_wait_ms >= 0")
        self.process = process
        self.max_batch, self.max_wait = max_batch, max_wait_ms / 1000.0
        self.max_queue = max_queue
        self._queue: queue.Queue = queue.Queue()
        self._thread: threading.Thread | None = None
        self._closed = False
        self.batches = 0  # process() calls
        self.requests = 0  # requests answered
        self.largest_batch = 0

    def start(self) -> None:
        if self._thread is None:
            self._thread = threading.Thread(target=self._work, name="ember-batcher", daemon=True)
            self._thread.start()

    async def submit(self, kind: str, request: dict):
        if self._closed or self._thread is None:
            raise RequestError(503, "the server is shutting down")
        if self._queue.qsize() >= self.max_queue:
            raise RequestError(503, f"the server is busy ({self.max_queue} requests queued); retry shortly")
        loop = asyncio.get_running_loop()
        future = loop.create_future()
        self._queue.put((kind, request, future, loop))
        return await future

    def close(self, timeout: float = 30.0) -> None:
        """Answer everything already queued, then stop the worker."""
        if self._closed:
            return
        self._closed = True
        self._queue.put(_STOP)
        if self._thread is not None:
            self._thread.join(timeout)

    def stats(self) -> dict:
        return {"batches": self.batches, "requests": self.requests, "largest_batch": self.largest_batch,
                "queued": self._queue.qsize(), "max_batch": self.max_batch,
                "max_wait_ms": self.max_wait * 1000.0}

    # -- worker thread -------------------------------------------------------------------------
    def _collect(self) -> tuple[list, bool]:
        first = self._queue.get()
        if first is _STOP:
            return [], True
        items, deadline = [first], time.monotonic() + self.max_wait
        while len(items) < self.max_batch:
            remaining = deadline - time.monotonic()
            try:
                item = self._queue.get(timeout=remaining) if remaining > 0 else self._queue.get_nowait()
            except queue.Empty:
                break
            if item is _STOP:
                return items, True
            items.append(item)
        return items, False

    def _work(self) -> None:
        stop = False
        while not stop:
            items, stop = self._collect()
            groups: dict[str, list] = {}
            for item in items:
                groups.setdefault(item[0], []).append(item)
            for kind, group in groups.items():
                try:
                    results = self.process(kind, [request for _, request, _, _ in group])
                except Exception as exc:  # a failed forward answers its group with a 500, not a crash
                    results = [exc] * len(group)
                self.batches += 1
                self.requests += len(group)
                self.largest_batch = max(self.largest_batch, len(group))
                for (_, _, future, loop), result in zip(group, results):
                    try:
                        loop.call_soon_threadsafe(_resolve, future, result)
                    except RuntimeError:  # that request's event loop has already closed
                        pass


def _resolve(future: asyncio.Future, result) -> None:
    if future.done():  # the client went away and the handler was cancelled
        return
    if isinstance(result, BaseException):
        future.set_exception(result)
    else:
        future.set_result(result)
