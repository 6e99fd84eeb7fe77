"""`ember serve` of a GPT run: /generate against ember.generate (greedy, sampling, stops),
micro-batching that changes nothing but speed, left truncation, every bad input -> 4xx JSON,
endpoints a model lacks, backends, and a real server process."""

from __future__ import annotations

import asyncio
import json
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from conftest import real_data
from gpt_helpers import make_gpt_run

pytest.importorskip("fastapi")
httpx = pytest.importorskip("httpx")
from fastapi.testclient import TestClient  # noqa: E402

from ember.generate import GenerationConfig, generate_ids, generate_text  # noqa: E402

ROOT = Path(__file__).resolve().parents[2]
CONTEXT = 64  # positions of the tiny runs = their training block length = the served context


@pytest.fixture(scope="module")
def wiki_run(tmp_path_factory):
    """A tiny random GPT-2 whose byte-level BPE (1k) is trained on 40 real Wikipedia articles."""
    source = real_data("wiki-en", "AA", "wiki_00.gz")
    return make_gpt_run(tmp_path_factory.mktemp("gpt-wiki"), max_position=CONTEXT, text=source, vocab=1000,
                        fmt="auto", max_documents=40)


@pytest.fixture(scope="module")
def wiki_prompts():
    """Openings of real articles (later ones than the tokenizer saw), a few words each."""
    from ember.data.readers import iter_documents

    prompts = []
    for doc in iter_documents(real_data("wiki-en", "AA", "wiki_01.gz")):
        words = doc.text.split()
        if len(words) > 200:
            prompts.append(" ".join(words[:6 + len(prompts)]))
        if len(prompts) == 6:
            return prompts, doc.text  # and one long article
    pytest.skip("wiki_01.gz has too few long articles")


def make_app(run_dir, max_wait_ms=5.0, limits=None, backend="", max_length=None):
    from ember.serve.app import create_app
    from ember.serve.predictor import load_predictor

    predictor = load_predictor(run_dir, backend, max_length=max_length)
    return create_app(predictor, limits, max_wait_ms=max_wait_ms), predictor


@pytest.fixture(scope="module")
def served(wiki_run):
    app, predictor = make_app(wiki_run)
    with TestClient(app) as c:
        yield c, predictor


def test_greedy_generate_equals_ember_generate_on_real_text(served, wiki_prompts):
    client, predictor = served
    prompts, _ = wiki_prompts
    for prompt in prompts[:3]:
        got = client.post("/generate", json={"prompt": prompt, "max_new_tokens": 12})
        assert got.status_code == 200, got.text
        result = got.json()["results"][0]
        cfg = GenerationConfig(max_new_tokens=12)
        assert result["text"] == generate_text(predictor.model, predictor.tokenizer, [prompt], cfg)[0]
        ids = predictor.tokenizer.encode(prompt, add_special_tokens=False).ids
        new = generate_ids(predictor.model, [ids], cfg, predictor.methods["generate"].eot_id)[0]
        assert result["prompt_tokens"] == len(ids) and result["generated_tokens"] == len(new)
        assert result["finish_reason"] == ("length" if len(new) == 12 else "end_of_text")
        assert result["truncated"] is False
    assert got.json()["settings"] == {"max_new_tokens": 12, "temperature": 0.0, "top_k": 0, "top_p": 1.0,
                                      "stop": [], "seed": None}


def test_a_list_of_prompts_answers_each_as_if_alone(served, wiki_prompts):
    client, _ = served
    prompts, _ = wiki_prompts
    together = client.post("/generate", json={"prompts": prompts, "max_new_tokens": 10}).json()["results"]
    alone = [client.post("/generate", json={"prompt": p, "max_new_tokens": 10}).json()["results"][0]
             for p in prompts]
    assert together == alone
    assert len({r["prompt_tokens"] for r in alone}) > 1  # the batch really was left-padded


def test_concurrent_requests_are_batched_and_each_gets_its_own_answer(wiki_run, wiki_prompts):
    prompts, _ = wiki_prompts
    bodies = [{"prompt": p, "max_new_tokens": 8} for p in prompts]
    bodies[1]["stop"] = ["e"]  # per-row stop sequences share a greedy batch
    bodies.append({"prompts": prompts[:2], "max_new_tokens": 8})
    bodies.append({"prompt": prompts[0], "max_new_tokens": 5})  # another budget: its own batch
    bodies.append({"prompt": prompts[2], "max_new_tokens": 8, "temperature": 0.9, "top_k": 20, "seed": 4})
    app, predictor = make_app(wiki_run, max_wait_ms=300.0)

    async def fire():
        app.state.batcher.start()  # ASGITransport does not run the lifespan
        transport = httpx.ASGITransport(app=app)
        async with httpx.AsyncClient(transport=transport, base_url="http://test") as c:
            responses = await asyncio.gather(*[c.post("/generate", json=b) for b in bodies])
        app.state.batcher.close()
        return responses

    responses = asyncio.run(fire())
    assert all(r.status_code == 200 for r in responses), [r.text for r in responses]
    assert app.state.batcher.largest_batch > 1
    assert predictor.forwards < len(bodies)  # the 7 greedy 8-token requests shared decoding loops
    with TestClient(make_app(wiki_run)[0]) as c:
        for body, response in zip(bodies, responses):
            assert response.json() == c.post("/generate", json=body).json()


def test_sampling_follows_the_seed_and_equals_ember_generate(served, wiki_prompts):
    client, predictor = served
    prompts = wiki_prompts[0][:3]
    body = {"prompts": prompts, "max_new_tokens": 15, "temperature": 0.8, "top_p": 0.95, "top_k": 50, "seed": 11}
    got = client.post("/generate", json=body).json()
    cfg = GenerationConfig(max_new_tokens=15, temperature=0.8, top_p=0.95, top_k=50, seed=11)
    assert [r["text"] for r in got["results"]] == generate_text(predictor.model, predictor.tokenizer, prompts, cfg)
    assert got["settings"]["seed"] == 11
    other = client.post("/generate", json={**body, "seed": 12}).json()
    assert [r["text"] for r in other["results"]] != [r["text"] for r in got["results"]]
    # No seed: one is drawn and returned, and sending it back reproduces the text.
    drawn = client.post("/generate", json={"prompt": prompts[0], "temperature": 1.0, "max_new_tokens": 10}).json()
    seed = drawn["settings"]["seed"]
    assert isinstance(seed, int)
    again = client.post("/generate", json={"prompt": prompts[0], "temperature": 1.0, "max_new_tokens": 10,
                                           "seed": seed}).json()
    assert again["results"] == drawn["results"]
    # top_k / top_p alone imply sampling at temperature 1, as `ember generate` does.
    implied = client.post("/generate", json={"prompt": prompts[0], "top_k": 5, "seed": 1}).json()
    assert implied["settings"]["temperature"] == 1.0


def test_stop_sequences_cut_the_text_and_say_so(served, wiki_prompts):
    client, predictor = served
    prompt = wiki_prompts[0][1]
    full = client.post("/generate", json={"prompt": prompt, "max_new_tokens": 16}).json()["results"][0]
    ids = predictor.tokenizer.encode(prompt, add_special_tokens=False).ids
    new = generate_ids(predictor.model, [ids], GenerationConfig(max_new_tokens=16), predictor.methods["generate"].eot_id)[0]
    # The text of the 4th generated token as the stop sequence: generation must end by then.
    texts = (predictor.tokenizer.decode(new[k : k + 1]).strip() for k in range(3, len(new)))
    stop = next(s for s in texts if s and "\ufffd" not in s)  # a whole printable token
    body = {"prompt": prompt, "max_new_tokens": 16, "stop": ["never in the text at all", stop]}
    got = client.post("/generate", json=body).json()["results"][0]
    cfg = GenerationConfig(max_new_tokens=16, stop=tuple(body["stop"]))
    assert got["text"] == generate_text(predictor.model, predictor.tokenizer, [prompt], cfg)[0]
    assert stop not in got["text"] and len(got["text"]) < len(full["text"])
    assert full["text"].startswith(got["text"])
    assert got["finish_reason"] == "stop" and got["generated_tokens"] < full["generated_tokens"]
    missing = client.post("/generate", json={**body, "stop": ["never in the text at all"]}).json()["results"][0]
    assert missing == full


def test_long_prompts_are_cut_from_the_left_and_flagged(served, wiki_prompts):
    client, predictor = served
    article = wiki_prompts[1][:3000]  # far more tokens than the context, within the character limit
    ids = predictor.tokenizer.encode(article, add_special_tokens=False).ids
    assert len(ids) > CONTEXT
    got = client.post("/generate", json={"prompt": article, "max_new_tokens": 10}).json()
    result = got["results"][0]
    kept = ids[-(CONTEXT - 10):]  # the end of the prompt, which the continuation follows
    new = generate_ids(predictor.model, [kept], GenerationConfig(max_new_tokens=10), predictor.methods["generate"].eot_id)[0]
    assert result["text"] == predictor.tokenizer.decode(new)
    assert result["prompt_tokens"] == CONTEXT - 10 and result["truncated"] is True and got["truncated"] is True
    short = client.post("/generate", json={"prompts": ["The river", article], "max_new_tokens": 10}).json()
    assert [r["truncated"] for r in short["results"]] == [False, True]


def test_max_length_sets_the_served_context(wiki_run):
    app, predictor = make_app(wiki_run, max_length=32)
    with TestClient(app) as c:
        assert c.get("/healthz").json()["max_length"] == 32
        got = c.post("/generate", json={"prompt": "word " * 100, "max_new_tokens": 12}).json()["results"][0]
        assert got["prompt_tokens"] == 32 - 12 and got["truncated"] is True
        too_many = c.post("/generate", json={"prompt": "a", "max_new_tokens": 32})
        assert too_many.status_code == 422 and "between 1 and 31" in too_many.json()["error"]


BAD_REQUESTS = [
    (b"", 400, "empty request body"),
    (b"{not json", 400, "malformed JSON"),
    (b'["The river"]', 422, "JSON object"),
    (b'{"max_new_tokens": 5}', 422, "'prompt'"),
    (b'{"prompt": "a", "prompts": ["b"]}', 422, "exactly one"),
    (b'{"prompt": 3}', 422, "'prompt' must be a string"),
    (b'{"prompt": ""}', 422, "'prompt' is empty"),
    (b'{"prompts": []}', 422, "'prompts' is empty"),
    (b'{"prompts": ["ok", "  "]}', 422, "'prompts[1]' is empty"),
    (json.dumps({"prompts": ["a"] * 65}).encode(), 422, "limit is 64"),
    (json.dumps({"prompt": "a" * 20_001}).encode(), 422, "20001 characters"),
    (b'{"prompt": "a", "max_new_tokens": 0}', 422, "'max_new_tokens' must be between 1 and 63"),
    (b'{"prompt": "a", "max_new_tokens": 64}', 422, "'max_new_tokens' must be between 1 and 63"),
    # what binds is named: here the context, not the server's cap (a Python caller has none)
    (b'{"prompt": "a", "max_new_tokens": 64}', 422, "63 (the model's context of 64 tokens must also hold"),
    (b'{"prompt": "a", "max_new_tokens": "5"}', 422, "'max_new_tokens' must be an integer"),
    (b'{"prompt": "a", "max_new_tokens": true}', 422, "'max_new_tokens' must be an integer"),
    (b'{"prompt": "a", "temperature": -0.5}', 422, "'temperature' must be 0 (greedy) or between"),
    (b'{"prompt": "a", "temperature": 1e-9}', 422, "'temperature' must be 0 (greedy) or between"),
    (b'{"prompt": "a", "temperature": "hot"}', 422, "'temperature' must be a number"),
    (b'{"prompt": "a", "temperature": NaN}', 422, "'temperature' must be a finite number"),
    (b'{"prompt": "a", "top_p": 0}', 422, "'top_p' must be in (0, 1]"),
    (b'{"prompt": "a", "top_p": 1.5}', 422, "'top_p' must be in (0, 1]"),
    (b'{"prompt": "a", "top_k": -1}', 422, "'top_k' must be between 0 and"),
    (b'{"prompt": "a", "top_k": 2.5}', 422, "'top_k' must be an integer"),
    (b'{"prompt": "a", "temperature": 0, "top_k": 5}', 422, "'top_k' and 'top_p' only apply when sampling"),
    (b'{"prompt": "a", "stop": "."}', 422, "'stop' must be a list of strings"),
    (b'{"prompt": "a", "stop": [1]}', 422, "'stop' must be a list of strings"),
    (b'{"prompt": "a", "stop": [""]}', 422, "'stop[0]' must have 1 to"),
    (json.dumps({"prompt": "a", "stop": ["x"] * 17}).encode(), 422, "'stop' has 17 items"),
    (b'{"prompt": "a", "seed": -1}', 422, "'seed' must be between"),
    (b'{"prompt": "a", "seed": "7"}', 422, "'seed' must be an integer"),
    (b'{"prompt": "a", "temprature": 0.7}', 422, "unknown field(s) temprature"),
]


@pytest.mark.parametrize("body,status,message", BAD_REQUESTS)
def test_bad_generate_requests_get_4xx_naming_the_field_and_the_server_keeps_answering(served, body, status,
                                                                                        message):
    client, _ = served
    response = client.post("/generate", content=body, headers={"Content-Type": "application/json"})
    assert response.status_code == status
    assert message in response.json()["error"]
    ok = client.post("/generate", json={"prompt": "The river", "max_new_tokens": 2})
    assert ok.status_code == 200 and ok.json()["results"][0]["generated_tokens"] <= 2


def test_health_lists_generate_score_and_the_limits(served):
    client, _ = served
    health = client.get("/healthz").json()
    assert health["status"] == "ok" and health["backend"] == "torch"
    assert health["endpoints"] == ["/generate", "/score"]
    assert health["model"]["kind"] == "generate" and health["model"]["family"] == "gpt2"
    assert health["max_length"] == CONTEXT and health["limits"]["max_new_tokens"] == 256


def test_endpoints_a_model_lacks_are_404_naming_the_ones_it_has(served, tiny_tokenizer_path, tmp_path):
    from serve_helpers import random_run

    client, _ = served
    for path in ("/classify", "/embed", "/fill-mask", "/tag", "/answer"):
        response = client.post(path, json={"text": "a"})
        assert response.status_code == 404 and "/generate" in response.json()["error"], path
    app, _ = _bert_app(random_run(tmp_path, "mlm", tiny_tokenizer_path))
    with TestClient(app) as c:
        response = c.post("/generate", json={"prompt": "a"})
        assert response.status_code == 404 and "/fill-mask" in response.json()["error"]
        assert "max_new_tokens" not in c.get("/healthz").json()["limits"]


def _bert_app(run_dir):
    from ember.serve.app import create_app
    from ember.serve.predictor import Predictor
    from ember.serve.runners import load_runner

    runner, info, tok = load_runner(run_dir)
    predictor = Predictor(runner, info, tok)
    return create_app(predictor), predictor


def test_a_failing_generation_gives_500_json_and_the_server_keeps_serving(wiki_run):
    app, predictor = make_app(wiki_run)
    method = predictor.methods["generate"]
    real = method._generate
    calls = []

    def flaky(*args):
        calls.append(1)
        if len(calls) == 1:
            raise RuntimeError("boom")
        return real(*args)

    method._generate = flaky
    with TestClient(app, raise_server_exceptions=False) as c:
        first = c.post("/generate", json={"prompt": "The river", "max_new_tokens": 3})
        assert first.status_code == 500 and "boom" in first.json()["error"]
        assert c.post("/generate", json={"prompt": "The river", "max_new_tokens": 3}).status_code == 200


def test_onnx_is_refused_at_startup_and_int8_generates(wiki_run, tmp_path):
    from torch.ao.nn.quantized.dynamic import Linear as QLinear

    from ember.cli import main
    from ember.errors import EmberError
    from ember.serve.export import export_run
    from ember.serve.predictor import load_predictor

    for backend in ("onnx", "onnx-int8"):
        with pytest.raises(EmberError, match=f"drop --{backend}"):
            load_predictor(wiki_run, backend)
    assert main(["serve", str(wiki_run), "--onnx"]) == 1  # fails before binding a port
    with pytest.raises(EmberError, match="no inference graph to export"):
        export_run(wiki_run, "onnx", tmp_path / "out")
    app, predictor = make_app(wiki_run, backend="int8")
    assert any(isinstance(m, QLinear) for m in predictor.model.modules())
    with TestClient(app) as c:
        assert c.get("/healthz").json()["backend"] == "int8"
        got = c.post("/generate", json={"prompt": "The river", "max_new_tokens": 4})
        assert got.status_code == 200 and 1 <= got.json()["results"][0]["generated_tokens"] <= 4


def _free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_ember_serve_process_generates_caps_max_new_tokens_and_stops_on_sigterm(wiki_run):
    port = _free_port()
    proc = subprocess.Popen([sys.executable, "-m", "ember", "serve", str(wiki_run), "--port", str(port),
                             "--max-new-tokens", "16", "--threads", "1"],
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, cwd=ROOT)
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 120
        while True:
            assert proc.poll() is None, proc.stdout.read()
            try:
                health = httpx.get(f"{url}/healthz", timeout=1.0).json()
                break
            except httpx.TransportError:
                assert time.monotonic() < deadline, "server did not start"
                time.sleep(0.2)
        assert health["endpoints"] == ["/generate", "/score"] and health["limits"]["max_new_tokens"] == 16
        got = httpx.post(f"{url}/generate", json={"prompt": "The river", "max_new_tokens": 16}, timeout=60)
        assert got.status_code == 200 and got.json()["results"][0]["generated_tokens"] <= 16
        over = httpx.post(f"{url}/generate", json={"prompt": "The river", "max_new_tokens": 17}, timeout=60)
        assert over.status_code == 422 and "between 1 and 16 (the server's cap)" in over.json()["error"]
    finally:
        proc.send_signal(signal.SIGTERM)
        output, _ = proc.communicate(timeout=60)
    assert proc.returncode == 0, output
    assert "gpt2 causal LM" in output and "/generate" in output and "server stopped" in output


def test_a_fine_tuned_gpt_classifier_is_refused_with_a_clear_message(wiki_run, tmp_path):
    import shutil

    from ember.errors import EmberError
    from ember.serve.predictor import load_predictor

    run = tmp_path / "gpt-sst2"
    shutil.copytree(wiki_run, run)
    config = (run / "config.yaml").read_text()
    assert "kind: pretrain" in config and "  name: ''" in config
    (run / "config.yaml").write_text(config.replace("kind: pretrain", "kind: finetune")
                                     .replace("  name: ''", "  name: sst2"))
    with pytest.raises(EmberError, match="fine-tuned gpt2 SST-2 model.*ember predict"):
        load_predictor(run)
