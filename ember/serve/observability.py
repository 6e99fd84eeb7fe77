"""What an operator watches a running `ember serve` with: Prometheus metrics, an access log,
and the OpenAPI description of the request bodies.

``GET /metrics`` (Prometheus text format, through ``prometheus_client``, part of the ``serve``
extra; without it the endpoint is absent and the server says so at start-up):

    ember_requests_total{endpoint, method, status}   requests answered, by HTTP status
    ember_request_errors_total{endpoint, status}     the 4xx/5xx among them
    ember_request_seconds{endpoint}                  latency histogram, request in -> response out
    ember_batch_size{method}                         requests per micro-batch (one forward pass)
    ember_queue_depth                                requests waiting for the batcher now

Endpoints outside the app's routes are counted as ``endpoint="other"``, so a scan of random
paths cannot grow the number of time series without bound.

The access log (``ember serve --access-log FILE``, ``-`` = stderr) writes one line per request:
client, method, path, status and milliseconds, on the logger ``ember.serve.access``.

OpenAPI: /docs and /openapi.json describe whatever methods the loaded model has; the contract
each route states (request forms and limits, every status) is built in ``ember.serve.contract``.
"""

from __future__ import annotations

import importlib.util
import logging
import time

access_log = logging.getLogger("ember.serve.access")

LATENCY_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0)
BATCH_BUCKETS = (1, 2, 4, 8, 16, 32, 64, 128, 256)


def metrics_available() -> bool:
    return importlib.util.find_spec("prometheus_client") is not None


class _Metrics:
    """The app's collectors, in a registry of its own (several apps in one process stay apart)."""

    def __init__(self, batcher) -> None:
        from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

        self.registry = CollectorRegistry()
        self.requests = Counter("ember_requests_total", "HTTP requests answered", ["endpoint", "method", "status"],
                                registry=self.registry)
        self.errors = Counter("ember_request_errors_total", "HTTP requests answered with a 4xx or 5xx status",
                              ["endpoint", "status"], registry=self.registry)
        self.latency = Histogram("ember_request_seconds", "time from request to response", ["endpoint"],
                                 buckets=LATENCY_BUCKETS, registry=self.registry)
        self.batch_size = Histogram("ember_batch_size", "requests per micro-batch (one forward pass)", ["method"],
                                    buckets=BATCH_BUCKETS, registry=self.registry)
        queue = Gauge("ember_queue_depth", "requests waiting for the micro-batcher", registry=self.registry)
        queue.set_function(lambda: batcher.stats()["queued"])
        process = batcher.process  # count every micro-batch the worker thread hands to the model

        def counted(kind, requests):
            self.batch_size.labels(kind).observe(len(requests))
            return process(kind, requests)

        batcher.process = counted

    def observe(self, endpoint: str, method: str, status: int, seconds: float) -> None:
        self.requests.labels(endpoint, method, str(status)).inc()
        self.latency.labels(endpoint).observe(seconds)
        if status >= 400:
            self.errors.labels(endpoint, str(status)).inc()


def install(app, batcher, metrics: bool | None = None, log_access: bool = False) -> bool:
    """Add /metrics (``metrics``: True = required, None = if prometheus_client is installed) and
    the timing middleware behind it and the access log. Returns whether /metrics is served."""
    from ember.errors import EmberError

    if metrics and not metrics_available():
        raise EmberError("/metrics needs prometheus_client; install the serve extra: pip install 'ember[serve]'")
    collectors = _Metrics(batcher) if (metrics is None and metrics_available()) or metrics else None
    if collectors is None and not log_access:
        return False

    @app.middleware("http")
    async def observe(request, call_next):
        started, status = time.perf_counter(), 500
        try:
            response = await call_next(request)
            status = response.status_code
            return response
        finally:
            seconds = time.perf_counter() - started
            path = request.url.path
            if collectors is not None:
                known = any(getattr(r, "path", None) == path for r in app.router.routes)
                collectors.observe(path if known else "other", request.method, status, seconds)
            if log_access:
                client = request.client.host if request.client else "-"
                access_log.info('%s "%s %s" %d %.1fms', client, request.method, path, status, seconds * 1000.0)

    if collectors is not None:
        from fastapi.responses import Response
        from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

        @app.get("/metrics", include_in_schema=False)
        async def prometheus_metrics():
            return Response(generate_latest(collectors.registry), media_type=CONTENT_TYPE_LATEST)

    return collectors is not None


def open_access_log(target: str) -> None:
    """Send the access log to ``target`` (a file, appended; ``-`` = stderr)."""
    import sys

    handler = logging.StreamHandler(sys.stderr) if target == "-" else logging.FileHandler(target, encoding="utf-8")
    handler.setFormatter(logging.Formatter("%(asctime)s %(message)s"))
    access_log.addHandler(handler)
    access_log.setLevel(logging.INFO)
    access_log.propagate = False
