"""Load test of `ember serve` with locust (headless): valid and invalid requests over every route
(issue 45, item 3).

    # MiniLM (embed): find where p99 doubles, 10 minutes of load there, then a SIGTERM mid-load
    python benchmarks/speed/serve_locust.py --run /work/shared/data/checkpoints/all-MiniLM-L6-v2 \\
        --duration 600 --json load.json
    # seconds (CI): two concurrency steps of 8 s, 10 s of load, the SIGTERM check
    python benchmarks/speed/serve_locust.py --run RUN --smoke

Phases, each against one `ember serve` started here (a direct child, 1 inference thread):

1. the plan: the routes come from the server's own /openapi.json. Every POST route gets the
   request bodies it answers 200 to (probed once: ``text``, ``texts``, pairs, question +
   context, prompt), built from real SST-2 dev sentences; the invalid ones every route must
   refuse with a 4xx (malformed JSON, ``{}``, a wrong type, one text too many, a GET on a POST
   route, an unknown path). GET /, /healthz, /metrics, /openapi.json answer 200. 70% of the
   requests are valid, 30% invalid. A request fails when the server answers 5xx, a valid one
   anything but 200, an invalid one anything but 4xx.
2. concurrency steps (1, 2, 4, ... users, ``--step-duration`` each, no think time): p99 at one
   user is the base; the first step whose p99 is at least twice that is the load's
   concurrency.
3. ``--duration`` seconds of locust at that concurrency while the server's resident memory
   (VmRSS, /proc) is read every 2 s; reported: the slope of a least-squares line through it
   after the first 10% (MB per minute), failures, p50/p95/p99.
4. SIGTERM mid-load: client threads send requests one connection each while the server gets
   SIGTERM. Each request ends answered (any HTTP status), refused (connect failed) or reset
   (connected and sent, no answer: its connection was still in the kernel's accept queue when
   the listener closed, so the server never read it). Every request the server read must be
   answered: dropped = read - answered, from the server's own count printed as it stops, = 0;
   and the server's access log has one line per client-side answer.

locust runs as its own process (``locust -f`` this file, headless, CSV statistics); this
process never imports it, so gevent's monkey-patching stays out of the driver.
"""

from __future__ import annotations

import argparse
import csv
import http.client
import json
import os
import random
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from serve_load import free_port, get_json, sst2_dev_sentences, start_server, stop_server  # noqa: E402

PLAN_ENV = "EMBER_LOCUST_PLAN"
VALID_SHARE = 0.7


# -- the plan -------------------------------------------------------------------------------

def _post(host: str, port: int, path: str, body: bytes, timeout: float = 60.0) -> tuple[int, bytes]:
    conn = http.client.HTTPConnection(host, port, timeout=timeout)
    try:
        conn.request("POST", path, body, {"Content-Type": "application/json"})
        response = conn.getresponse()
        return response.status, response.read()
    finally:
        conn.close()


def _candidates(a: str, b: str) -> list[dict]:
    return [{"text": a}, {"texts": [a, b]}, {"text": a, "text_pair": b}, {"texts": [[a, b]]},
            {"question": "What is it about?", "context": a}, {"prompt": a}]


def build_plan(host: str, port: int, sentences: list[str], max_texts: int) -> dict:
    """Requests (method, path, body, kind) over every route; each POST route's valid bodies are
    the candidate shapes it answers 200 to, filled with many different sentences."""
    schema = get_json(host, port, "/openapi.json")
    posts = [p for p, ops in schema["paths"].items() if "post" in ops]
    gets = sorted({p for p, ops in schema["paths"].items() if "get" in ops} | {"/metrics", "/openapi.json"})
    requests = []
    for path in posts:
        probe = _candidates(sentences[0], sentences[1])
        shapes = [k for k, body in enumerate(probe) if _post(host, port, path, json.dumps(body).encode())[0] == 200]
        if not shapes:
            raise SystemExit(f"no request shape answered 200 on POST {path}; add one to _candidates")
        for i in range(200):  # different sentences, so batching sees real variety
            a, b = sentences[(7 * i) % len(sentences)], sentences[(7 * i + 3) % len(sentences)]
            requests.append(("POST", path, json.dumps(_candidates(a, b)[shapes[i % len(shapes)]]), "valid"))
        too_many = {"texts": [sentences[0]] * (max_texts + 1)}
        for bad in ("{oops", "{}", json.dumps({"text": 5}), json.dumps(too_many)):
            requests.append(("POST", path, bad, "invalid"))
        requests.append(("GET", path, "", "invalid"))  # 405 with Allow
    for path in gets:
        requests.append(("GET", path, "", "valid"))
    requests.append(("POST", "/no-such-route", "{}", "invalid"))
    return {"requests": requests, "posts": posts, "gets": gets}


# -- locust (this file loaded by `locust -f` in its own process) -----------------------------

if os.environ.get(PLAN_ENV):
    from locust import FastHttpUser, task

    _PLAN = json.loads(Path(os.environ[PLAN_ENV]).read_text())["requests"]
    _VALID = [r for r in _PLAN if r[3] == "valid"]
    _INVALID = [r for r in _PLAN if r[3] == "invalid"]

    class EmberUser(FastHttpUser):
        """Back-to-back requests (no think time): 70% valid, 30% invalid, every route."""

        @task
        def one_request(self) -> None:
            method, path, body, kind = random.choice(_VALID if random.random() < VALID_SHARE else _INVALID)
            name = f"{method} {path} ({kind})"
            kwargs = {"data": body, "headers": {"Content-Type": "application/json"}} if method == "POST" else {}
            with self.client.request(method, path, name=name, catch_response=True, **kwargs) as response:
                status = response.status_code or 0
                if status >= 500 or status == 0:
                    response.failure(f"server error {status}")
                elif kind == "valid" and status != 200:
                    response.failure(f"valid request answered {status}")
                elif kind == "invalid" and not 400 <= status < 500:
                    response.failure(f"invalid request answered {status}")
                else:
                    response.success()


def run_locust(url: str, plan_file: Path, users: int, seconds: float, out: Path) -> dict:
    """One headless locust run; the aggregated row of its CSV statistics."""
    prefix = out / f"locust_{users}u_{int(seconds)}s"
    cmd = [sys.executable, "-m", "locust", "-f", __file__, "--headless", "--host", url, "-u", str(users),
           "-r", str(users), "-t", f"{max(1, int(seconds))}s", "--csv", str(prefix), "--only-summary",
           "--loglevel", "WARNING", "--stop-timeout", "30"]
    env = {**os.environ, PLAN_ENV: str(plan_file)}
    done = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=seconds + 300)
    rows = list(csv.DictReader(open(f"{prefix}_stats.csv")))
    total = next(r for r in rows if r["Name"] == "Aggregated")
    if int(total["Request Count"]) == 0:
        raise SystemExit(f"locust sent no request ({done.returncode}):\n{done.stdout[-2000:]}{done.stderr[-2000:]}")
    failures = list(csv.DictReader(open(f"{prefix}_failures.csv")))
    return {"users": users, "seconds": seconds, "requests": int(total["Request Count"]),
            "failures": int(total["Failure Count"]), "requests_per_s": round(float(total["Requests/s"]), 1),
            "p50_ms": float(total["50%"]), "p95_ms": float(total["95%"]), "p99_ms": float(total["99%"]),
            "failure_examples": [f"{f['Name']}: {f['Error']} x{f['Occurrences']}" for f in failures][:5],
            "locust_exit_code": done.returncode}


# -- resident memory ------------------------------------------------------------------------

def rss_mb(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024.0
    raise RuntimeError("no VmRSS")


class MemorySampler(threading.Thread):
    def __init__(self, pid: int, every: float = 2.0) -> None:
        super().__init__(daemon=True)
        self.pid, self.every, self.samples = pid, every, []
        self.stop = threading.Event()

    def run(self) -> None:
        start = time.monotonic()
        while not self.stop.is_set():
            self.samples.append((time.monotonic() - start, rss_mb(self.pid)))
            self.stop.wait(self.every)

    def slope_mb_per_min(self) -> float | None:
        import numpy as np

        kept = self.samples[len(self.samples) // 10:]  # after warm-up (allocator pools fill first)
        if len(kept) < 3:
            return None
        t, m = np.array(kept).T
        return round(float(np.polyfit(t / 60.0, m, 1)[0]), 3)


# -- SIGTERM mid-load -----------------------------------------------------------------------

def sigterm_mid_load(proc: subprocess.Popen, port: int, plan: dict, clients: int, before_s: float) -> dict:
    """Clients send one request per connection; SIGTERM after ``before_s``; count outcomes."""
    outcomes = {"answered": 0, "refused": 0, "dropped": 0}
    statuses: dict[int, int] = {}
    lock = threading.Lock()
    stop = threading.Event()
    valid = [r for r in plan["requests"] if r[3] == "valid" and r[0] == "POST"]

    def client(seed: int) -> None:
        rng = random.Random(seed)
        while not stop.is_set():
            _, path, body, _ = rng.choice(valid)
            conn = http.client.HTTPConnection("127.0.0.1", port, timeout=120)
            try:
                conn.connect()
            except OSError:
                with lock:
                    outcomes["refused"] += 1
                time.sleep(0.05)
                continue
            try:
                conn.request("POST", path, body.encode(), {"Content-Type": "application/json", "Connection": "close"})
                status = conn.getresponse().status
                with lock:
                    outcomes["answered"] += 1
                    statuses[status] = statuses.get(status, 0) + 1
            except (OSError, http.client.HTTPException):
                with lock:
                    outcomes["dropped"] += 1
            finally:
                conn.close()

    threads = [threading.Thread(target=client, args=(i,), daemon=True) for i in range(clients)]
    for t in threads:
        t.start()
    time.sleep(before_s)
    proc.send_signal(signal.SIGTERM)
    try:
        output, _ = proc.communicate(timeout=120)
    except subprocess.TimeoutExpired:
        proc.kill()
        output, _ = proc.communicate()
    time.sleep(1.0)  # clients see the closed port
    stop.set()
    for t in threads:
        t.join(timeout=130)
    # A client whose connection was still in the kernel's accept queue when the listener closed
    # sees a reset, as with any server: the server never read it. What a graceful stop owes is an
    # answer to every request it read, which the server counts itself ("server stopped: N requests
    # read, M answered"): dropped = N - M.
    counted = re.search(r"server stopped: (\d+) requests read, (\d+) answered", output)
    read, answered = (int(counted.group(1)), int(counted.group(2))) if counted else (-1, -1)
    return {"answered": outcomes["answered"], "refused": outcomes["refused"],
            "reset_unread": outcomes["dropped"], "server_read": read, "server_answered": answered,
            "dropped": read - answered if counted else outcomes["dropped"],
            "statuses": {str(k): v for k, v in sorted(statuses.items())},
            "server_exit_code": proc.returncode, "server_output_tail": output[-300:]}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--run", required=True, help="run, export or checkpoint folder to serve")
    parser.add_argument("--duration", type=float, default=600.0, help="seconds of load at the chosen concurrency")
    parser.add_argument("--step-duration", type=float, default=20.0, help="seconds per concurrency step")
    parser.add_argument("--max-users", type=int, default=64, help="largest concurrency step")
    parser.add_argument("--users", type=int, help="skip the steps: load at this concurrency")
    parser.add_argument("--sigterm-clients", type=int, default=8, help="clients during the SIGTERM phase")
    parser.add_argument("--threads", type=int, default=1, help="the server's inference threads")
    parser.add_argument("--smoke", action="store_true", help="steps 1 and 2 users x 8 s, 10 s of load (CI)")
    parser.add_argument("--json", help="also write the report to this file")
    args = parser.parse_args(argv)
    if args.smoke:
        args.duration, args.step_duration, args.max_users, args.sigterm_clients = 10.0, 8.0, 2, 4
    sentences = sst2_dev_sentences()
    out = Path(tempfile.mkdtemp(prefix="ember-locust-"))
    max_texts = 16
    server_args = ["--threads", str(args.threads), "--max-texts", str(max_texts)]
    port = free_port()
    print(f"starting ember serve {args.run} on port {port} ...", flush=True)
    proc = start_server(args.run, "torch", port, server_args, timeout=900)
    url = f"http://127.0.0.1:{port}"
    report: dict = {"run": args.run, "server_threads": args.threads}
    try:
        plan = build_plan("127.0.0.1", port, sentences, max_texts)
        plan_file = out / "plan.json"
        plan_file.write_text(json.dumps(plan))
        report["routes"] = {"post": plan["posts"], "get": plan["gets"]}
        report["steps"] = []
        users = args.users
        if users is None:
            base = None
            users = 1
            while True:
                step = run_locust(url, plan_file, users, args.step_duration, out)
                report["steps"].append(step)
                print(json.dumps(step), flush=True)
                base = base or step["p99_ms"]
                if step["p99_ms"] >= 2 * base and users > 1 or users * 2 > args.max_users:
                    break
                users *= 2
        report["load_users"] = users
        sampler = MemorySampler(proc.pid)
        sampler.start()
        load = run_locust(url, plan_file, users, args.duration, out)
        sampler.stop.set()
        sampler.join()
        load["rss_mb_first_last"] = [round(sampler.samples[0][1], 1), round(sampler.samples[-1][1], 1)]
        load["rss_slope_mb_per_min"] = sampler.slope_mb_per_min()
        every = max(1, len(sampler.samples) // 40)  # the curve, so a plateau can be told from a leak
        load["rss_mb_samples"] = [[round(t), round(m, 1)] for t, m in sampler.samples[::every]]
        report["load"] = load
        print(json.dumps(load), flush=True)
    finally:
        stop_server(proc)
    # SIGTERM phase: a fresh server with an access log, so its answers can be counted
    port, access_log = free_port(), out / "access.log"
    proc = start_server(args.run, "torch", port, server_args + ["--access-log", str(access_log)], timeout=900)
    report["sigterm"] = sigterm_mid_load(proc, port, plan, args.sigterm_clients, max(2.0, args.step_duration))
    logged = [line for line in access_log.read_text().splitlines() if "POST" in line] if access_log.exists() else []
    report["sigterm"]["access_log_answers"] = len(logged)
    print(json.dumps(report["sigterm"]), flush=True)
    failed = (report["load"]["failures"] > 0 or report["load"]["requests"] == 0
              or any(s["failures"] for s in report["steps"]) or report["sigterm"]["dropped"] != 0
              or report["sigterm"]["server_exit_code"] != 0
              or report["sigterm"]["access_log_answers"] != report["sigterm"]["answered"])
    report["ok"] = not failed
    if args.json:
        Path(args.json).write_text(json.dumps(report, indent=2) + "\n")
    print(json.dumps({k: report[k] for k in ("load_users", "ok")}), flush=True)
    shutil.rmtree(out, ignore_errors=True)  # locust's CSV files and the access log: read above
    return 1 if failed else 0


if __name__ == "__main__":
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    sys.exit(main())
