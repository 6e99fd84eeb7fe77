"""`ember serve` in production: Prometheus /metrics, the access log, and the OpenAPI page whose
documented request examples every method accepts."""

from __future__ import annotations

import asyncio
import logging
import signal
import subprocess
import sys
import time

import pytest

from conftest import real_data
from serve_helpers import random_run, sst2_run

pytest.importorskip("fastapi")
httpx = pytest.importorskip("httpx")
from fastapi.testclient import TestClient  # noqa: E402


@pytest.fixture(scope="module")
def run(wiki_prepared, tmp_path_factory):
    real_data("glue", "SST-2")
    return sst2_run(tmp_path_factory.mktemp("observe-runs"), wiki_prepared / "tokenizer.json")


def make_app(run_dir, **options):
    from ember.serve.app import create_app
    from ember.serve.predictor import load_predictor

    return create_app(load_predictor(run_dir, ""), **options)


def samples(text: str) -> dict:
    """{(metric sample name, sorted labels): value} of a Prometheus text exposition."""
    from prometheus_client.parser import text_string_to_metric_families

    return {(s.name, tuple(sorted(s.labels.items()))): s.value
            for family in text_string_to_metric_families(text) for s in family.samples}


def test_metrics_count_requests_errors_latency_and_batch_sizes(run):
    pytest.importorskip("prometheus_client", reason="the serve extra's prometheus_client is not installed")
    app = make_app(run, max_wait_ms=50.0)
    with TestClient(app) as client:
        async def burst():  # 4 concurrent requests: the batcher takes them in one or a few forwards
            transport = httpx.ASGITransport(app=app)
            async with httpx.AsyncClient(transport=transport, base_url="http://test") as c:
                return await asyncio.gather(*[c.post("/classify", json={"text": f"film number {i}"})
                                              for i in range(4)])

        assert all(r.status_code == 200 for r in asyncio.run(burst()))
        assert client.post("/classify", json={"text": 3}).status_code == 422
        assert client.post("/embed", json={"text": "a fine film"}).status_code == 200
        assert client.get("/no-such-page").status_code == 404
        response = client.get("/metrics")
    assert response.status_code == 200 and response.headers["content-type"].startswith("text/plain")
    got = samples(response.text)
    ok = ("endpoint", "/classify"), ("method", "POST"), ("status", "200")
    assert got[("ember_requests_total", ok)] == 4
    assert got[("ember_requests_total", (("endpoint", "/classify"), ("method", "POST"), ("status", "422")))] == 1
    assert got[("ember_request_errors_total", (("endpoint", "/classify"), ("status", "422")))] == 1
    # an unknown path is "other", so scans cannot create new time series
    assert got[("ember_request_errors_total", (("endpoint", "other"), ("status", "404")))] == 1
    assert got[("ember_request_seconds_count", (("endpoint", "/classify"),))] == 5
    assert got[("ember_request_seconds_sum", (("endpoint", "/classify"),))] > 0
    # every valid classify request went through the batcher: batch sizes sum to 4, in <= 4 batches
    assert got[("ember_batch_size_sum", (("method", "classify"),))] == 4
    assert 1 <= got[("ember_batch_size_count", (("method", "classify"),))] <= 4
    assert got[("ember_batch_size_sum", (("method", "embed"),))] == 1
    assert got[("ember_queue_depth", ())] == 0


def test_access_log_writes_one_line_per_request(run, caplog):
    app = make_app(run, metrics=False, access_log=True)
    with caplog.at_level(logging.INFO, logger="ember.serve.access"), TestClient(app) as client:
        client.post("/classify", json={"text": "a fine film"})
        client.post("/classify", content=b"{oops")
    lines = [r.getMessage() for r in caplog.records if r.name == "ember.serve.access"]
    assert len(lines) == 2
    assert '"POST /classify" 200' in lines[0] and '"POST /classify" 400' in lines[1]
    assert all(line.endswith("ms") and float(line.split()[-1][:-2]) >= 0 for line in lines)
    assert make_app(run, metrics=False).state.metrics is False  # no metrics, no /metrics route


def test_openapi_documents_each_method_and_its_example_is_a_valid_request(run, wiki_prepared, tmp_path):
    from ember.serve.predictor import load_predictor
    from ember.serve.requests import Limits

    tok = wiki_prepared / "tokenizer.json"
    runs = [run] + [random_run(tmp_path, kind, tok) for kind in ("conll2003", "squad2", "mlm")]
    seen = set()
    for run_dir in runs:
        app = make_app(run_dir, metrics=False)
        with TestClient(app) as client:
            spec = client.get("/openapi.json").json()
            docs = client.get("/docs")
        assert docs.status_code == 200 and "swagger" in docs.text.lower()
        predictor = load_predictor(run_dir, "")
        for name in predictor.methods:
            body = spec["paths"][f"/{name}"]["post"]["requestBody"]["content"]["application/json"]["schema"]
            # the forms a body may take, each closed (ember/serve/contract.py); the example fits one
            assert body["anyOf"] and all(f["additionalProperties"] is False for f in body["anyOf"])
            assert any(set(f["required"]) <= set(body["example"]) <= set(f["properties"]) for f in body["anyOf"])
            predictor.parse(name, body["example"], Limits())  # the documented example is accepted
            seen.add(name)
    assert seen == {"classify", "embed", "tag", "answer", "fill-mask"}


def test_generate_documented_example_is_a_valid_request():
    from ember.tasks.inference.generation import GenerateMethod, parse_generate
    from ember.tasks.inference.requests import Limits

    example = GenerateMethod.request_schema["example"]
    assert parse_generate(example, Limits(), context=64, vocab_size=100)["prompts"] == [example["prompt"]]


def test_real_server_writes_its_access_log_file(run, tmp_path):
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    log = tmp_path / "access.log"
    proc = subprocess.Popen([sys.executable, "-m", "ember", "serve", str(run), "--port", str(port), "--access-log",
                             str(log)], stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        deadline = time.monotonic() + 120
        while True:
            assert proc.poll() is None, proc.stdout.read()
            try:
                httpx.get(f"http://127.0.0.1:{port}/healthz", timeout=1.0)
                break
            except httpx.TransportError:
                assert time.monotonic() < deadline, "server did not start"
                time.sleep(0.2)
        assert httpx.post(f"http://127.0.0.1:{port}/classify", json={"text": "a fine film"}).status_code == 200
    finally:
        proc.send_signal(signal.SIGTERM)
        output, _ = proc.communicate(timeout=60)
    assert proc.returncode == 0, output
    assert "/docs" in output
    assert '"POST /classify" 200' in log.read_text()
