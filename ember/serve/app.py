"""The HTTP server: a FastAPI app over a Predictor and a MicroBatcher, run by uvicorn.

    GET  /             a page to try the model in a browser (ember/serve/page: self-contained HTML)
    GET  /healthz      status, model and backend, limits, batching counters
    GET  /metrics      Prometheus metrics (with prometheus_client); GET /docs, /openapi.json: the API
    POST /classify     {"text"| "texts", optional "text_pair" | "text_pairs"}  (GLUE-style runs)
    POST /embed        texts + pooling mean|cls|none, layer or layer_weights, normalize (encoder runs)
    POST /fill-mask    {"text" with [MASK], "top_k"}                          (MLM pre-training runs)
    POST /tag          {"text" | "texts" | "words"}                            (CoNLL-2003 NER runs)
    POST /answer       {"question", "context", "top_k"}                        (SQuAD runs)
    POST /generate     {"prompt" | "prompts", max_new_tokens, temperature, top_k, top_p, stop, seed}
                                                                               (GPT pre-training runs)
    POST /score        {"text" | "texts", optional "context" | "contexts"} -> log-likelihood
                                                                               (GPT pre-training runs)

The app serves a Predictor (serve/predictor.py): one POST route per inference method the
loaded model has (``predictor.methods``, from its task or objective: ``ember.tasks.inference.methods``),
each parsing its body with the method's own ``parse`` and answering through the micro-batcher.
A new task or family serves through its methods with no change here. GPT runs serve /generate
only (no /embed: they have no inference graph).

Errors are JSON ``{"error": message}`` with a 4xx status for anything the client can fix
(see requests.py); an endpoint the loaded model does not have is a 404 saying which it has.
An unexpected failure is a 500 with a message; the server keeps running.

Shutdown: uvicorn turns SIGTERM/SIGINT into a graceful exit (stop accepting, let in-flight
requests finish, up to ``graceful_timeout`` seconds), then the lifespan hook drains the
batching queue before the process ends.
"""

# No `from __future__ import annotations`: FastAPI reads the handlers' annotations (Request) at runtime.

import asyncio
import contextlib
import logging
import time

from ember.errors import EmberError
from ember.serve.batching import MicroBatcher
from ember.serve.contract import integer_fields, prepare, request_body, route_docs
from ember.serve.observability import install as install_observability
from ember.serve.requests import Limits, RequestError, read_json
from ember.host_memory import return_freed_host_memory

log = logging.getLogger("ember.serve")


def _require_web() -> None:
    import importlib.util

    missing = [m for m in ("fastapi", "uvicorn") if importlib.util.find_spec(m) is None]
    if missing:
        raise EmberError(f"serving needs {' and '.join(missing)}; install the optional extra: "
                         "pip install 'ember[serve]'")


TRIM_EVERY_S = 1.0  # how often a busy server returns freed heap pages to the OS


def create_app(predictor, limits: Limits | None = None, max_batch: int = 32, max_wait_ms: float = 5.0,
               metrics: bool | None = None, access_log: bool = False):
    """The FastAPI app; the batcher starts and stops with the app's lifespan. ``metrics``: serve
    Prometheus /metrics (None: when prometheus_client is installed); ``access_log``: one line per
    request on the ``ember.serve.access`` logger (serve/observability.py)."""
    _require_web()
    from fastapi import FastAPI, Request
    from fastapi.exceptions import RequestValidationError
    from fastapi.responses import HTMLResponse, JSONResponse
    from starlette.exceptions import HTTPException

    limits = limits or Limits()

    last_trim = [0.0]

    def process(name: str, requests: list) -> list:
        try:
            return predictor.run(name, requests)
        finally:  # each batch frees blocks of its own shapes: hand them back (host_memory.py),
            # at most once a second: a trim costs ~7 ms (MiniLM), more than a short request
            if time.monotonic() - last_trim[0] >= TRIM_EVERY_S:
                return_freed_host_memory()
                last_trim[0] = time.monotonic()

    batcher = MicroBatcher(process, max_batch=max_batch, max_wait_ms=max_wait_ms)
    info = predictor.info

    @contextlib.asynccontextmanager
    async def lifespan(app):
        batcher.start()
        yield
        batcher.close()  # everything already queued is answered first

    # /docs (Swagger UI, whose scripts come from a CDN) and /openapi.json describe each method's body
    app = FastAPI(title="ember", description=f"{info.display_name}: {', '.join(predictor.endpoints)}",
                  lifespan=lifespan, docs_url="/docs", redoc_url=None, openapi_url="/openapi.json")
    app.state.batcher, app.state.predictor, app.state.limits = batcher, predictor, limits
    # requests the app read and answered, printed when the server stops: a graceful stop answers
    # every request it read (connections still in the kernel's queue when the listener closes were
    # never read; their clients see a reset, as with any server)
    app.state.requests = counts = {"received": 0, "answered": 0}

    @app.middleware("http")
    async def count(request, call_next):
        counts["received"] += 1
        try:
            response = await call_next(request)
        except asyncio.CancelledError:  # the graceful timeout ran out: not answered
            raise
        except Exception:  # the server-error handler answers it (500)
            counts["answered"] += 1
            raise
        counts["answered"] += 1
        return response

    @app.exception_handler(RequestError)
    async def request_error(request, exc: RequestError):
        return JSONResponse({"error": exc.message}, status_code=exc.status)

    @app.exception_handler(HTTPException)
    async def http_error(request, exc: HTTPException):  # 404 unknown path, 405 wrong method
        if exc.status_code == 404 and request.method == "POST":  # a method this model does not have
            return JSONResponse({"error": f"this model ({info.display_name}) does not serve "
                                 f"{request.url.path}; its endpoints: {', '.join(predictor.endpoints)}"},
                                status_code=404)
        # a 405 keeps Starlette's Allow header: the methods the path does serve (RFC 9110)
        return JSONResponse({"error": str(exc.detail)}, status_code=exc.status_code,
                            headers=getattr(exc, "headers", None))

    @app.exception_handler(RequestValidationError)
    async def validation_error(request, exc):
        return JSONResponse({"error": str(exc)}, status_code=422)

    @app.exception_handler(Exception)
    async def unexpected(request, exc: Exception):
        log.exception("unexpected error on %s", request.url.path)
        return JSONResponse({"error": f"internal error: {type(exc).__name__}: {exc}"}, status_code=500)

    page = None

    @app.get("/", response_class=HTMLResponse)
    async def index():  # built on first request: the methods' forms are fixed once loaded
        nonlocal page
        if page is None:
            from ember.serve.page import render_page

            page = render_page(predictor, limits)
        return HTMLResponse(page)

    @app.get("/healthz")
    async def healthz():
        served = {"max_body_bytes": limits.max_body_bytes, "max_texts": limits.max_texts,
                  "max_chars": limits.max_chars}
        for method in predictor.methods.values():  # limits only some methods use (max_new_tokens)
            served.update({name: getattr(limits, name) for name in getattr(method, "limits", ())})
        return {"status": "ok", "model": info.summary(), "backend": predictor.backend,
                "endpoints": predictor.endpoints, "max_length": predictor.max_length, "limits": served,
                "batching": {**batcher.stats(), "forwards": predictor.forwards}}

    def route(name: str, integers: frozenset):
        async def handle(request: Request):
            data = prepare(await read_json(request, limits), integers)  # as the contract reads it
            return await batcher.submit(name, predictor.parse(name, data, limits))

        return handle

    for name, method in predictor.methods.items():
        body = request_body(method, limits)  # the route's documented contract (ember/serve/contract.py)
        app.add_api_route(f"/{name}", route(name, integer_fields(body)), methods=["POST"], name=name,
                          **route_docs(method, body))

    app.state.metrics = install_observability(app, batcher, metrics, access_log)
    return app


def run_server(app, host: str = "127.0.0.1", port: int = 8000, graceful_timeout: float = 30.0,
               log_level: str = "info") -> None:
    """Serve until SIGTERM/SIGINT; in-flight requests finish before the process exits."""
    import signal
    import threading

    import uvicorn

    config = uvicorn.Config(app, host=host, port=port, log_level=log_level, access_log=False,
                            timeout_graceful_shutdown=graceful_timeout, lifespan="on")
    server = uvicorn.Server(config)
    # uvicorn handles SIGTERM/SIGINT itself and, once shut down, re-sends the signal to the
    # handler that was installed before it. A no-op one makes a graceful stop exit with 0
    # instead of dying of the re-sent signal (-15) or a KeyboardInterrupt (130).
    previous = {}
    if threading.current_thread() is threading.main_thread():
        previous = {sig: signal.signal(sig, lambda *_: None) for sig in (signal.SIGTERM, signal.SIGINT)}
    try:
        server.run()
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)
    if not server.started:
        raise EmberError(f"the server could not start on {host}:{port} (see the log above; "
                         "is the port in use? choose another with --port)")
