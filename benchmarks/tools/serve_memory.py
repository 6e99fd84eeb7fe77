"""Resident memory of a served model under requests of every length (issue 45, item 3).

    # the shipped MiniLM: 400 sequential /embed requests of 1-8 real Wikipedia passages of
    # 3-200 words, the server's VmRSS every 50 requests
    python benchmarks/tools/serve_memory.py --run runs/minilm --requests 400 --every 50
    # the same with ember's oneDNN path off (EMBER_ONEDNN=0 reaches the server)
    EMBER_ONEDNN=0 python benchmarks/tools/serve_memory.py --run runs/minilm

Starts `ember serve RUN --threads 1` (a direct child; its log goes to a file, never to a pipe
nobody reads), sends the requests one after another (no concurrency: every batch then has its
own length, the worst case for per-shape state) and prints the curve, the growth after the
first quarter of the requests (what a leak shows as and a cache that fills does not) and,
with --json, writes it. Before ember's fix (padded widths in steps of 16 tokens, freed heap
pages handed back: ember/serve/inputs.py, ember/host_memory.py) the served MiniLM grew
353 -> 1,170 MB over 300 requests; docs/reliability.md has the figures.
"""

from __future__ import annotations

import argparse
import gzip
import http.client
import json
import os
import random
import re
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "speed"))
from serve_load import free_port, start_server, stop_server  # noqa: E402


def wiki_words(limit: int = 300_000) -> list[str]:
    """Words of the real English Wikipedia in the data folder (WikiExtractor .gz files)."""
    root = Path(os.environ.get("EMBER_DATA", Path(__file__).resolve().parents[3] / "shared" / "data"))
    words: list[str] = []
    for path in sorted((root / "wiki-en").rglob("wiki_*.gz")):
        with gzip.open(path, "rt", encoding="utf-8") as f:
            words += re.sub(r"<[^>]*>", " ", f.read()).split()
        if len(words) >= limit:
            return words
    if not words:
        raise SystemExit(f"no wiki-en/*/wiki_*.gz under {root}: set EMBER_DATA to the data folder")
    return words


def rss_mb(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    raise RuntimeError(f"no VmRSS for process {pid}")


def embed(port: int, texts: list[str]) -> None:
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=300)
    conn.request("POST", "/embed", json.dumps({"texts": texts}), {"Content-Type": "application/json"})
    response = conn.getresponse()
    body = response.read()
    if response.status != 200:
        raise SystemExit(f"/embed answered {response.status}: {body[:300]!r}")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--run", required=True, help="a run folder with an inference graph (e.g. runs/minilm)")
    parser.add_argument("--requests", type=int, default=400)
    parser.add_argument("--every", type=int, default=50, help="read the server's memory every N requests")
    parser.add_argument("--max-texts", type=int, default=8)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--json", type=Path, help="write the curve here")
    args = parser.parse_args(argv)
    words, rng = wiki_words(), random.Random(args.seed)
    port = free_port()
    with tempfile.TemporaryFile("w+") as log:
        proc = start_server(args.run, "torch", port, ["--threads", "1"], log=log)
        curve, start = [(0, rss_mb(proc.pid))], time.monotonic()
        try:
            for i in range(1, args.requests + 1):
                texts = []
                for _ in range(rng.randint(1, args.max_texts)):
                    n = rng.randint(3, 200)
                    at = rng.randrange(len(words) - n)
                    texts.append(" ".join(words[at:at + n]))
                embed(port, texts)
                if i % args.every == 0 or i == args.requests:
                    curve.append((i, rss_mb(proc.pid)))
        finally:
            stop_server(proc)
    quarter = next(mb for i, mb in curve if i >= args.requests // 4)
    report = {"run": args.run, "requests": args.requests, "seconds": round(time.monotonic() - start, 1),
              "onednn": os.environ.get("EMBER_ONEDNN", "1") != "0",
              "rss_mb": [[i, round(mb, 1)] for i, mb in curve],
              "growth_after_first_quarter_mb": round(curve[-1][1] - quarter, 1)}
    for i, mb in curve:
        print(f"{i:6d} requests  {mb:8.1f} MB")
    print(f"growth after the first quarter: {report['growth_after_first_quarter_mb']:+.1f} MB "
          f"({report['seconds']} s)")
    if args.json:
        args.json.write_text(json.dumps(report, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
