"""Load test of `ember serve` on loopback: N concurrent clients for a bounded time.

    # start a server for a run (PyTorch fp32; or --backend onnx | int8 | onnx-int8) and drive it
    python benchmarks/speed/serve_load.py --run runs/sst2 --clients 16 --duration 30
    # drive a server that is already running
    python benchmarks/speed/serve_load.py --url http://127.0.0.1:8000 --clients 16 --duration 30
    # a few seconds, for CI (exit status 1 if any request failed)
    python benchmarks/speed/serve_load.py --run runs/sst2 --smoke

Each client is a thread with its own keep-alive HTTP connection (stdlib http.client) that
POSTs real SST-2 dev sentences (from EMBER_DATA, one per request by default) to /classify
back to back and checks every answer (status 200, a label per text). Reported: requests
and sentences per second, latency p50/p95/p99 in ms, error count, and the server's own
micro-batching counters from /healthz (requests per forward pass). A server it started is
stopped with SIGTERM at the end and must exit cleanly.
"""

from __future__ import annotations

import argparse
import http.client
import json
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path
from urllib.parse import urlparse

import numpy as np


def sst2_dev_sentences() -> list[str]:
    from ember.tasks.readers.glue import get_task, read_examples

    return [ex.text_a for ex in read_examples(get_task("sst2"), "dev")]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def get_json(host: str, port: int, path: str, timeout: float = 5.0) -> dict:
    conn = http.client.HTTPConnection(host, port, timeout=timeout)
    try:
        conn.request("GET", path)
        return json.loads(conn.getresponse().read())
    finally:
        conn.close()


def start_server(run: str, backend: str, port: int, extra: list[str], timeout: float = 300.0,
                 log=None) -> subprocess.Popen:
    """``log``: an open file for the server's output (default: a pipe, read when it stops)."""
    cmd = [sys.executable, "-m", "ember", "serve", run, "--port", str(port)] + extra
    if backend != "torch":
        cmd.append(f"--{backend}")
    proc = subprocess.Popen(cmd, stdout=log or subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            if log is not None:
                log.seek(0)
            raise SystemExit(f"server exited early ({proc.returncode}):\n{(log or proc.stdout).read()}")
        try:
            get_json("127.0.0.1", port, "/healthz", timeout=1.0)
            return proc
        except OSError:
            time.sleep(0.2)
    proc.kill()
    raise SystemExit(f"server did not answer /healthz within {timeout:.0f} s")


def stop_server(proc: subprocess.Popen, timeout: float = 60.0) -> tuple[int, str]:
    proc.send_signal(signal.SIGTERM)
    try:
        out, _ = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        proc.kill()
        out, _ = proc.communicate()
        return -9, out
    return proc.returncode, out


class Client(threading.Thread):
    def __init__(self, index: int, host: str, port: int, sentences: list[str], texts_per_request: int,
                 stop_at: float) -> None:
        super().__init__(daemon=True)
        self.index, self.host, self.port = index, host, port
        self.sentences, self.k, self.stop_at = sentences, texts_per_request, stop_at
        self.latencies: list[float] = []
        self.errors: list[str] = []

    def run(self) -> None:
        conn = None
        n = len(self.sentences)
        position = (self.index * 97) % n  # clients start at different sentences
        while time.monotonic() < self.stop_at:
            texts = [self.sentences[(position + j) % n] for j in range(self.k)]
            position = (position + self.k) % n
            body = json.dumps({"texts": texts}).encode()
            start = time.perf_counter()
            try:
                if conn is None:
                    conn = http.client.HTTPConnection(self.host, self.port, timeout=60)
                conn.request("POST", "/classify", body, {"Content-Type": "application/json"})
                response = conn.getresponse()
                data = json.loads(response.read())
                elapsed = time.perf_counter() - start
                if response.status != 200 or len(data.get("results", [])) != len(texts):
                    self.errors.append(f"{response.status}: {str(data)[:200]}")
                    continue
                self.latencies.append(elapsed)
            except (OSError, ValueError, http.client.HTTPException) as exc:
                self.errors.append(f"{type(exc).__name__}: {exc}")
                if conn is not None:
                    conn.close()
                conn = None
        if conn is not None:
            conn.close()


def drive(host: str, port: int, sentences: list[str], clients: int, duration: float,
          texts_per_request: int, warmup: float) -> dict:
    if warmup > 0:  # first requests pay for lazy initialisation; keep them out of the figures
        for c in [Client(i, host, port, sentences, texts_per_request, time.monotonic() + warmup)
                  for i in range(clients)]:
            c.start()
            c.join()
    before = get_json(host, port, "/healthz")["batching"]
    started = time.monotonic()
    workers = [Client(i, host, port, sentences, texts_per_request, started + duration) for i in range(clients)]
    for w in workers:
        w.start()
    for w in workers:
        w.join()
    wall = time.monotonic() - started
    after = get_json(host, port, "/healthz")
    lat = np.asarray([x for w in workers for x in w.latencies]) * 1000.0
    errors = [e for w in workers for e in w.errors]
    n_ok = len(lat)
    forwards = after["batching"]["forwards"] - before["forwards"]
    requests = after["batching"]["requests"] - before["requests"]
    return {
        "backend": after["backend"], "model": after["model"]["display_name"], "clients": clients,
        "duration_s": round(wall, 2), "texts_per_request": texts_per_request,
        "requests_ok": n_ok, "errors": len(errors), "error_examples": errors[:3],
        "requests_per_s": round(n_ok / wall, 1), "sentences_per_s": round(n_ok * texts_per_request / wall, 1),
        "latency_ms": {p: round(float(np.percentile(lat, q)), 1) if n_ok else None
                       for p, q in (("p50", 50), ("p95", 95), ("p99", 99))},
        "server_forward_passes": forwards,
        "requests_per_forward": round(requests / forwards, 2) if forwards else None,
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    target = parser.add_mutually_exclusive_group(required=True)
    target.add_argument("--run", help="run or export folder: start `ember serve` for it on a free port")
    target.add_argument("--url", help="a running server, e.g. http://127.0.0.1:8000")
    parser.add_argument("--backend", default="torch", choices=["torch", "onnx", "int8", "onnx-int8"],
                        help="with --run: how the server runs the model (default torch)")
    parser.add_argument("--clients", type=int, default=16, help="concurrent clients (default 16)")
    parser.add_argument("--duration", type=float, default=30.0, help="seconds of load (default 30)")
    parser.add_argument("--warmup", type=float, default=2.0, help="seconds of untimed load first (default 2)")
    parser.add_argument("--texts-per-request", type=int, default=1, help="sentences per request (default 1)")
    parser.add_argument("--server-args", default="", help="extra `ember serve` flags, e.g. '--threads 2'")
    parser.add_argument("--smoke", action="store_true", help="4 clients for 3 s (CI)")
    parser.add_argument("--json", help="also write the report to this file")
    args = parser.parse_args(argv)
    if args.smoke:
        args.clients, args.duration, args.warmup = 4, 3.0, 0.5

    sentences = sst2_dev_sentences()
    proc = None
    if args.run:
        host, port = "127.0.0.1", free_port()
        print(f"starting ember serve {args.run} ({args.backend}) on port {port} ...", flush=True)
        proc = start_server(args.run, args.backend, port, args.server_args.split())
    else:
        url = urlparse(args.url)
        host, port = url.hostname or "127.0.0.1", url.port or 80
    try:
        report = drive(host, port, sentences, args.clients, args.duration, args.texts_per_request, args.warmup)
    finally:
        if proc is not None:
            code, output = stop_server(proc)
    if proc is not None:
        report["server_exit_code"] = code
        if code != 0:
            print(output, file=sys.stderr)
    print(json.dumps(report, indent=2))
    if args.json:
        Path(args.json).write_text(json.dumps(report, indent=2) + "\n")
    failed = report["errors"] > 0 or report["requests_ok"] == 0 or report.get("server_exit_code", 0) != 0
    return 1 if failed else 0


if __name__ == "__main__":
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    sys.exit(main())
