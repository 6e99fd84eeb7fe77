"""`ember serve`: every endpoint, micro-batching, bad input -> 4xx JSON, truncation flags,
graceful shutdown of a real uvicorn process, and the load-test smoke mode."""

from __future__ import annotations

import asyncio
import json
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
import torch

from conftest import real_data
from serve_helpers import assert_same_answer, random_run, sst2_run

pytest.importorskip("fastapi")
httpx = pytest.importorskip("httpx")
from fastapi.testclient import TestClient  # noqa: E402

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def run(wiki_prepared, tmp_path_factory):
    real_data("glue", "SST-2")
    return sst2_run(tmp_path_factory.mktemp("serve-runs"), wiki_prepared / "tokenizer.json")


def make_app(run_dir, backend="", max_length=None, max_wait_ms=5.0, limits=None, runner_wrapper=None):
    from ember.serve.app import create_app
    from ember.serve.predictor import Predictor
    from ember.serve.runners import load_runner

    runner, info, tok = load_runner(run_dir, backend)
    if runner_wrapper is not None:
        runner = runner_wrapper(runner)
    predictor = Predictor(runner, info, tok, max_length)
    return create_app(predictor, limits, max_wait_ms=max_wait_ms), predictor


@pytest.fixture(scope="module")
def client(run):
    app, _ = make_app(run)
    with TestClient(app) as c:
        yield c


def test_classify_single_pair_and_list_match_the_pytorch_model(run, client):
    from ember.serve.graph import describe, load_module
    from ember.serve.inputs import pad_arrays
    from ember.tasks.inference.requests import TextEncoder

    texts = ["a gripping , beautifully acted story", "a dull and lifeless mess"]
    got = client.post("/classify", json={"texts": texts}).json()
    info, tok = describe(run)
    module = load_module(run, info)
    arrays = pad_arrays([(i, t) for i, t, _ in TextEncoder(tok, info.max_length)(texts)], info.pad_id)
    with torch.no_grad():
        logits = module.logits({k: torch.from_numpy(v) for k, v in arrays.items()}).numpy()
    for result, row in zip(got["results"], logits):
        assert result["label"] == info.labels[int(row.argmax())] and result["truncated"] is False
        probs = np.exp(row - row.max()) / np.exp(row - row.max()).sum()
        assert [result["probabilities"][n] for n in info.labels] == pytest.approx(probs.tolist(), abs=1e-5)
    single = client.post("/classify", json={"text": texts[0]}).json()["results"][0]
    assert single["probabilities"] == pytest.approx(got["results"][0]["probabilities"], abs=1e-6)
    pair = client.post("/classify", json={"text": texts[0], "text_pair": texts[1]})
    assert pair.status_code == 200 and len(pair.json()["results"]) == 1


def test_health_reports_model_backend_and_endpoints(client):
    health = client.get("/healthz").json()
    assert health["status"] == "ok" and health["backend"] == "torch"
    assert health["model"]["task"] == "sst2" and health["endpoints"] == ["/classify", "/embed"]


def test_embed_pooling_and_layer_mix_follow_the_hidden_states(run, client):
    from ember.serve.graph import describe, load_module

    info, tok = describe(run)
    module = load_module(run, info)
    ids = torch.tensor([tok.encode("a fine film").ids])
    with torch.no_grad():
        states = module.backbone(ids, torch.ones_like(ids), torch.zeros_like(ids), output_hidden_states=True).hidden_states
    mean = client.post("/embed", json={"text": "a fine film"}).json()["results"][0]["embedding"]
    np.testing.assert_allclose(mean, states[-1][0].mean(0).numpy(), atol=1e-5)
    cls = client.post("/embed", json={"text": "a fine film", "pooling": "cls", "layer": 1}).json()
    np.testing.assert_allclose(cls["results"][0]["embedding"], states[1][0, 0].numpy(), atol=1e-5)
    # A one-hot-ish softmax mix picks layer 0 (the embeddings); equal weights average the layers.
    mixed = client.post("/embed", json={"text": "a fine film", "pooling": "cls",
                                        "layer_weights": [0.0] * (info.num_layers + 1)}).json()
    expected = torch.stack([s[0, 0] for s in states]).mean(0).numpy()
    np.testing.assert_allclose(mixed["results"][0]["embedding"], expected, atol=1e-5)
    tokens = client.post("/embed", json={"text": "a fine film", "pooling": "none", "normalize": True}).json()
    result = tokens["results"][0]
    assert result["tokens"][0] == "[CLS]" and len(result["embeddings"]) == len(result["tokens"]) == ids.shape[1]
    assert np.linalg.norm(result["embeddings"], axis=1) == pytest.approx(1.0, abs=1e-5)


def test_embed_requests_batched_together_read_only_their_layers(run):
    """Micro-batched /embed requests asking for different layers share one forward that returns
    only the layers they read (a scalar mix reads all), and each gets its own answer."""
    from ember.serve.predictor import load_predictor
    from ember.tasks.inference.requests import Limits

    predictor = load_predictor(run)
    asked = []
    inner = predictor.runner

    def recording(arrays, need_hidden=False):
        asked.append(need_hidden)
        return inner(arrays, need_hidden)

    predictor.runner = recording
    n = predictor.info.num_layers + 1
    bodies = [{"texts": ["a fine film", "a dull , lifeless mess"], "layer": 1, "pooling": "cls"},
              {"text": "the plot holds together", "layer": -1},
              {"text": "a fine film", "layer": n - 1, "pooling": "none"}]
    requests = [predictor.parse("embed", b, Limits()) for b in bodies]
    together = predictor.run("embed", requests)
    assert asked == [[1, n - 1]]  # two layers, once: -1 and n - 1 are the same layer
    for request, got in zip(requests, together):
        # The same answer as alone, to float rounding: alone, a request runs in a batch of its own
        # shape (other padding, other GEMM sizes), which the BLAS may sum in another order (it does
        # with AVX2 kernels or oneDNN); vectors, tokens and flags must match, the floats to 1e-5.
        assert_same_answer(got, predictor.run("embed", [request])[0])
    mixed = predictor.parse("embed", {"text": "a fine film", "layer_weights": [0.0] * n}, Limits())
    asked.clear()
    predictor.run("embed", [requests[1], mixed])
    assert asked == [True]

def test_truncation_is_flagged(run):
    app, predictor = make_app(run, max_length=8)
    long_text = "a gripping , beautifully acted story about two friends who fall out and make up"
    with TestClient(app) as c:
        got = c.post("/classify", json={"texts": [long_text, "fine"]}).json()
        assert got["truncated"] is True
        assert [r["truncated"] for r in got["results"]] == [True, False]
        assert c.post("/embed", json={"text": long_text, "pooling": "none"}).json()["results"][0]["tokens"].__len__() == 8


BAD_REQUESTS = [
    (b"", 400, "empty request body"),
    (b"{not json", 400, "malformed JSON"),
    (b"\xff\xfe", 400, "malformed JSON"),
    (b"[1, 2]", 422, "JSON object"),
    (b'{"text": 3}', 422, "must be a string"),
    (b'{"text": "   "}', 422, "is empty"),
    (b'{"texts": []}', 422, "is empty"),
    (b'{"texts": "one"}', 422, "list of strings"),
    (b'{"texts": ["ok", null]}', 422, "texts[1]"),
    (b'{"text": "a", "texts": ["b"]}', 422, "exactly one"),
    (b'{"txt": "typo"}', 422, "unknown field"),
    (b'{"texts": ["a", "b"], "text_pairs": ["c"]}', 422, "has 1 items"),
    (json.dumps({"texts": ["a"] * 65}).encode(), 422, "limit is 64"),
    (json.dumps({"text": "a" * 20_001}).encode(), 422, "20001 characters"),
]


@pytest.mark.parametrize("body,status,message", BAD_REQUESTS)
def test_bad_classify_requests_get_4xx_with_a_message(client, body, status, message):
    response = client.post("/classify", content=body, headers={"Content-Type": "application/json"})
    assert response.status_code == status
    assert message in response.json()["error"]


def test_bad_embed_options_and_wrong_endpoints_get_4xx(client):
    cases = [({"text": "a", "pooling": "max"}, 422, "pooling"), ({"text": "a", "layer": 99}, 422, "layer"),
             ({"text": "a", "layer": True}, 422, "integer"), ({"text": "a", "layer_weights": [1]}, 422, "list of 3"),
             ({"text": "a", "normalize": "yes"}, 422, "true or false")]
    for body, status, message in cases:
        response = client.post("/embed", json=body)
        assert response.status_code == status and message in response.json()["error"]
    for path in ("/tag", "/answer", "/fill-mask"):
        response = client.post(path, json={"text": "a"})
        assert response.status_code == 404 and "/classify" in response.json()["error"]
    assert client.get("/nowhere").status_code == 404 and "error" in client.get("/nowhere").json()
    assert client.get("/classify").status_code == 405
    assert client.get("/healthz").json()["status"] == "ok"  # still serving after all of that


def test_oversized_body_is_rejected_before_it_is_read(run):
    from ember.serve.requests import Limits

    app, predictor = make_app(run, limits=Limits(max_body_bytes=2000))
    with TestClient(app) as c:
        response = c.post("/classify", json={"texts": ["a fine film"] * 200})
        assert response.status_code == 413 and "exceeds the limit of 2000" in response.json()["error"]

        def chunks():  # no Content-Length: the limit applies while streaming
            for _ in range(100):
                yield b'{"text": "' + b"a" * 50
        response = c.post("/classify", content=chunks())
        assert response.status_code == 413
        assert predictor.forwards == 0


def test_concurrent_requests_are_micro_batched(run):
    class SlowRunner:  # a forward that takes 50 ms lets requests queue up behind it
        def __init__(self, inner):
            self.inner, self.backend, self.batch_sizes = inner, inner.backend, []
            self.logits_axes = inner.logits_axes

        def __call__(self, arrays, need_hidden=False):
            self.batch_sizes.append(arrays["input_ids"].shape[0])
            time.sleep(0.05)
            return self.inner(arrays, need_hidden)

    app, predictor = make_app(run, max_wait_ms=20.0, runner_wrapper=SlowRunner)
    sentences = [f"sentence number {i} is a fine film" for i in range(24)]

    async def fire():
        app.state.batcher.start()  # ASGITransport does not run the lifespan
        transport = httpx.ASGITransport(app=app)
        async with httpx.AsyncClient(transport=transport, base_url="http://test") as c:
            responses = await asyncio.gather(*[c.post("/classify", json={"text": s}) for s in sentences])
        app.state.batcher.close()
        return responses

    responses = asyncio.run(fire())
    assert all(r.status_code == 200 for r in responses)
    sizes = predictor.runner.batch_sizes
    assert sum(sizes) == 24 and len(sizes) < 24 and max(sizes) > 1
    # Each answer belongs to its own request: same as asking alone.
    with TestClient(make_app(run)[0]) as c:
        alone = c.post("/classify", json={"text": sentences[5]}).json()
    assert responses[5].json()["results"][0]["probabilities"] == pytest.approx(
        alone["results"][0]["probabilities"], abs=1e-5)


def test_batcher_answers_queued_requests_on_close_and_refuses_new_ones():
    from ember.serve.batching import MicroBatcher
    from ember.errors import RequestError

    def process(kind, requests):
        time.sleep(0.02)
        return [{"echo": r["x"]} for r in requests]

    batcher = MicroBatcher(process, max_batch=4, max_wait_ms=1)

    async def main():
        batcher.start()
        pending = [asyncio.ensure_future(batcher.submit("k", {"x": i})) for i in range(10)]
        await asyncio.sleep(0)  # all ten are queued before the stop marker
        await asyncio.get_running_loop().run_in_executor(None, batcher.close)
        results = await asyncio.gather(*pending)
        with pytest.raises(RequestError, match="shutting down"):
            await batcher.submit("k", {"x": 99})
        return results

    assert [r["echo"] for r in asyncio.run(main())] == list(range(10))
    assert batcher.stats()["largest_batch"] <= 4


def test_a_failing_model_gives_500_json_and_the_server_keeps_serving(run):
    class Flaky:
        def __init__(self, inner):
            self.inner, self.backend, self.fail = inner, inner.backend, True
            self.logits_axes = inner.logits_axes

        def __call__(self, arrays, need_hidden=False):
            if self.fail:
                self.fail = False
                raise RuntimeError("boom")
            return self.inner(arrays, need_hidden)

    app, _ = make_app(run, runner_wrapper=Flaky)
    with TestClient(app, raise_server_exceptions=False) as c:
        first = c.post("/classify", json={"text": "fine"})
        assert first.status_code == 500 and "boom" in first.json()["error"]
        assert c.post("/classify", json={"text": "fine"}).status_code == 200


def test_tag_answer_and_fill_mask_endpoints(wiki_prepared, tmp_path):
    tok_path = wiki_prepared / "tokenizer.json"
    app, _ = make_app(random_run(tmp_path, "conll2003", tok_path))
    with TestClient(app) as c:
        got = c.post("/tag", json={"texts": ["EU rejects German call to boycott British lamb."]}).json()
        result = got["results"][0]
        assert result["words"][:2] == ["EU", "rejects"] and len(result["tags"]) == len(result["words"]) == 9
        assert all(t == "O" or t[:2] in ("B-", "I-") for t in result["tags"])
        pre = c.post("/tag", json={"words": [["Peter", "Blackburn"]]}).json()["results"][0]
        assert pre["words"] == ["Peter", "Blackburn"] and len(pre["tags"]) == 2
        assert c.post("/tag", json={"words": [[]]}).status_code == 422
    app, _ = make_app(random_run(tmp_path, "squad2", tok_path))
    with TestClient(app) as c:
        context = "The Normans were the people who in the 10th and 11th centuries gave their name to Normandy."
        got = c.post("/answer", json={"question": "Who gave their name to Normandy?", "context": context}).json()
        assert got["best_span"] in context and got["best_span"]
        assert len(got["nbest"]) <= 3 and got["truncated"] is False
        assert c.post("/answer", json={"question": "Who?"}).status_code == 422
    app, _ = make_app(random_run(tmp_path, "mlm", tok_path))
    with TestClient(app) as c:
        got = c.post("/fill-mask", json={"text": "Paris is the [MASK] of [MASK] .", "top_k": 3}).json()
        assert len(got["masks"]) == 2 and all(len(m) == 3 for m in got["masks"])
        probs = [p["probability"] for p in got["masks"][0]]
        assert probs == sorted(probs, reverse=True) and 0 < sum(probs) <= 1 + 1e-6
        missing = c.post("/fill-mask", json={"text": "no mask here"})
        assert missing.status_code == 422 and "[MASK]" in missing.json()["error"]
        assert c.post("/fill-mask", json={"text": "a [MASK]", "top_k": 0}).status_code == 422


def test_onnx_backend_serves_the_same_answers(run, client):
    app, _ = make_app(run, backend="onnx")
    with TestClient(app) as c:
        assert c.get("/healthz").json()["backend"] == "onnx"
        got = c.post("/classify", json={"text": "a fine film"}).json()["results"][0]
        embed = {"text": "a fine film", "pooling": "mean", "layer_weights": [1.0, 0.0, 2.0]}
        vec = c.post("/embed", json=embed).json()["results"][0]["embedding"]
    ref = client.post("/classify", json={"text": "a fine film"}).json()["results"][0]
    assert got["probabilities"] == pytest.approx(ref["probabilities"], abs=1e-5)
    ref_vec = client.post("/embed", json=embed).json()["results"][0]["embedding"]
    np.testing.assert_allclose(vec, ref_vec, atol=1e-4)


def _free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_graceful_shutdown_finishes_the_request_in_flight(run):
    """Stopping uvicorn (what its SIGTERM/SIGINT handler does) lets a running request finish."""
    import threading

    import uvicorn

    entered = threading.Event()

    class Slow:
        def __init__(self, inner):
            self.inner, self.backend, self.logits_axes = inner, inner.backend, inner.logits_axes

        def __call__(self, arrays, need_hidden=False):
            entered.set()
            time.sleep(1.0)
            return self.inner(arrays, need_hidden)

    app, _ = make_app(run, runner_wrapper=Slow)
    port = _free_port()
    server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=port, log_level="warning",
                                           timeout_graceful_shutdown=20))
    thread = threading.Thread(target=server.run)
    thread.start()
    deadline = time.monotonic() + 60
    while not server.started:
        assert time.monotonic() < deadline and thread.is_alive(), "server did not start"
        time.sleep(0.05)
    answer = {}
    client = threading.Thread(target=lambda: answer.update(r=httpx.post(
        f"http://127.0.0.1:{port}/classify", json={"text": "a fine film"}, timeout=60)))
    client.start()
    assert entered.wait(60), "the request never reached the model"
    server.should_exit = True  # the shutdown starts while the forward pass is running
    client.join(60)
    thread.join(60)
    assert not thread.is_alive()
    assert answer["r"].status_code == 200 and answer["r"].json()["results"][0]["label"]


def test_real_server_answers_then_exits_cleanly_on_sigterm(run):
    port = _free_port()
    proc = subprocess.Popen([sys.executable, "-m", "ember", "serve", str(run), "--port", str(port)],
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, cwd=ROOT)
    try:
        deadline = time.monotonic() + 120
        while True:
            assert proc.poll() is None, proc.stdout.read()
            try:
                health = httpx.get(f"http://127.0.0.1:{port}/healthz", timeout=1.0)
                break
            except httpx.TransportError:
                assert time.monotonic() < deadline, "server did not start"
                time.sleep(0.2)
        assert health.json()["status"] == "ok"
        got = httpx.post(f"http://127.0.0.1:{port}/classify", json={"text": "a fine film"}, timeout=30)
        assert got.status_code == 200 and got.json()["results"][0]["label"] in ("negative", "positive")
        bad = httpx.post(f"http://127.0.0.1:{port}/classify", content=b"{oops", timeout=30)
        assert bad.status_code == 400
        # a second server on the same port: one line before the model loads, no "serving on" announcement
        second = subprocess.run([sys.executable, "-m", "ember", "serve", str(run), "--port", str(port)],
                                capture_output=True, text=True, cwd=ROOT, timeout=120)
        assert second.returncode == 1 and "serving" not in second.stdout, second.stdout + second.stderr
        assert f"cannot listen on 127.0.0.1:{port}" in second.stderr and "--port" in second.stderr
    finally:
        proc.send_signal(signal.SIGTERM)
        output, _ = proc.communicate(timeout=60)
    assert proc.returncode == 0, output
    assert "server stopped" in output and "127.0.0.1" in output


def test_load_test_smoke_mode_runs_without_errors(run, tmp_path):
    report_file = tmp_path / "load.json"
    done = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "speed" / "serve_load.py"), "--run", str(run),
                           "--smoke", "--json", str(report_file)], capture_output=True, text=True, cwd=ROOT,
                          timeout=300)
    assert done.returncode == 0, done.stdout + done.stderr
    report = json.loads(report_file.read_text())
    assert report["errors"] == 0 and report["requests_ok"] > 0 and report["server_exit_code"] == 0
    assert report["latency_ms"]["p50"] <= report["latency_ms"]["p95"] <= report["latency_ms"]["p99"]
