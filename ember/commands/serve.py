"""`ember serve`: an HTTP server for a run's model, with micro-batching."""

from __future__ import annotations

import argparse

from ember.commands.common import add_backend_options, backend_of


def register(sub) -> None:
    p = sub.add_parser(
        "serve", help="serve a model over HTTP (classify, embed, fill-mask, tag, answer, generate)",
        formatter_class=argparse.RawDescriptionHelpFormatter,
        description="Serve a fine-tuned run (GLUE-style: /classify, CoNLL-2003: /tag, SQuAD: /answer) "
        "or an MLM pre-training run (/fill-mask); these also serve /embed, as does every other encoder run "
        "(an imported BertModel or sentence-transformers checkpoint serves /embed only, with the pooling "
        "its RUN/embedding.json names). A GPT pre-training run "
        "serves /generate and /score (PyTorch fp32 or --int8; prompts longer than the context are cut "
        "from the left and flagged; --max-new-tokens caps each request). A T5 run serves /generate from "
        "input texts (beam search too) and /score (log p(target | input)), and a text-to-text fine-tuned one also /classify or /answer "
        "(docs/t5.md). Every model serves GET /healthz and, at GET /, a page to try its endpoints in a "
        "browser. "
        "Concurrent requests are micro-batched: up to --max-batch requests or --max-wait-ms "
        "milliseconds, padded per batch, one forward pass. Inputs longer than --max-length tokens are "
        "truncated and the response says so. Binds 127.0.0.1 unless --host says otherwise. "
        "RUN_DIR may also be an `ember export` folder (onnx, int8, onnx-int8), which runs its format.\n\n"
        "example:\n  ember serve runs/sst2 --port 8000\n"
        "  curl -s localhost:8000/classify -d '{\"text\": \"a gripping, beautifully acted film\"}'\n"
        "  ember serve runs/gpt2-tiny\n"
        "  curl -s localhost:8000/generate -d '{\"prompt\": \"The history of\", \"max_new_tokens\": 20}'")
    p.add_argument("run_dir", help="run folder, or an export folder written by `ember export`")
    add_backend_options(p, "exported at start-up")
    p.add_argument("--host", default="127.0.0.1", help="address to bind (default 127.0.0.1: this machine only)")
    p.add_argument("--port", type=int, default=8000, help="port (default 8000)")
    p.add_argument("--max-batch", type=int, default=32, help="requests per micro-batch (default 32)")
    p.add_argument("--max-wait-ms", type=float, default=5.0,
                   help="how long a micro-batch waits for more requests (default 5 ms)")
    p.add_argument("--max-length", type=int, help="tokens per input before truncation (default: the run's); "
                   "for a GPT run, the context that prompt + new tokens must fit (default: its training "
                   "block length)")
    p.add_argument("--max-new-tokens", type=int, default=256,
                   help="most tokens one /generate prompt may ask for (GPT and T5 runs; default 256)")
    p.add_argument("--max-texts", type=int, default=64, help="texts per request (default 64)")
    p.add_argument("--max-body-bytes", type=int, default=1_000_000, help="request body limit (default 1 MB)")
    p.add_argument("--threads", type=int, default=0, help="CPU threads for inference (default: all)")
    p.add_argument("--access-log", metavar="FILE", help="log one line per request (client, method, path, status, "
                   "milliseconds) to FILE, or - for stderr")
    p.add_argument("--no-metrics", action="store_true", help="do not serve Prometheus metrics on GET /metrics")
    p.add_argument("--graceful-timeout", type=float, default=30.0,
                   help="seconds in-flight requests get to finish on SIGTERM/SIGINT (default 30)")
    p.set_defaults(run=run)


def run(args) -> int:
    from ember.errors import EmberError
    from ember.serve.app import create_app, run_server
    from ember.serve.inputs import SERVED_WIDTH_STEP
    from ember.serve.predictor import load_predictor
    from ember.serve.requests import Limits

    for flag in ("max_batch", "max_texts", "max_body_bytes", "max_new_tokens"):
        if getattr(args, flag) < 1:
            raise EmberError(f"--{flag.replace('_', '-')} must be at least 1")
    if args.max_length is not None and args.max_length < 8:
        raise EmberError("--max-length must be at least 8 tokens")
    check_port_free(args.host, args.port)  # before the model loads and the "serving" line is printed
    predictor = load_predictor(args.run_dir, backend_of(args), args.threads, args.max_length, args.max_batch,
                               pad_multiple=SERVED_WIDTH_STEP)
    info = predictor.info
    limits = Limits(max_body_bytes=args.max_body_bytes, max_texts=args.max_texts,
                    max_new_tokens=args.max_new_tokens)
    if args.access_log:
        from ember.serve.observability import open_access_log

        open_access_log(args.access_log)
    app = create_app(predictor, limits, max_batch=args.max_batch, max_wait_ms=args.max_wait_ms,
                     metrics=False if args.no_metrics else None, access_log=bool(args.access_log))
    if args.host not in ("127.0.0.1", "localhost", "::1"):
        print(f"warning: binding {args.host}: the server is reachable from other machines "
              "and has no authentication")
    extra = ", /metrics" if app.state.metrics else ""
    print(f"serving {info.display_name} ({predictor.backend}) on http://{args.host}:{args.port} "
          f"endpoints: {', '.join(predictor.endpoints)}, /healthz{extra}, /docs", flush=True)
    if not app.state.metrics and not args.no_metrics:
        print("note: no /metrics: prometheus_client is not installed (pip install 'ember[serve]')", flush=True)
    run_server(app, args.host, args.port, args.graceful_timeout)
    counts = app.state.requests
    print(f"server stopped: {counts['received']} requests read, {counts['answered']} answered", flush=True)
    return 0


def check_port_free(host: str, port: int) -> None:
    """Refuse a port another server listens on, in one line (uvicorn would say so only after the
    model loaded and the "serving on ..." line announced a server that never started)."""
    import socket

    from ember.errors import EmberError

    if port == 0:  # the system picks a free one
        return
    try:
        infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)
    except socket.gaierror as exc:
        raise EmberError(f"--host {host}: cannot resolve it ({exc.strerror})") from None
    family, _, _, _, address = infos[0]
    with socket.socket(family, socket.SOCK_STREAM) as probe:
        probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # as uvicorn binds: TIME_WAIT is no conflict
        try:
            probe.bind(address)
        except OSError as exc:
            raise EmberError(f"cannot listen on {host}:{port}: {exc.strerror}; another server holds the port, "
                             "choose another with --port") from None
