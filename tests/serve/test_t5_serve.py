"""`ember serve` of T5 runs: /generate of a pre-training run against ember.seq2seq_generation
(greedy, beam, sampling, batching, truncation), /classify and /answer of text-to-text runs
against their evaluation, GPT-only and text-to-text-only fields refused with a 422 that says
so, --int8, and the ONNX export refused with its reason."""

from __future__ import annotations

import json
from concurrent.futures import ThreadPoolExecutor

import pytest
from conftest import real_data
from t5_helpers import one_thread, t5_glue_tokenizer, t5_run_folder  # noqa: F401

pytest.importorskip("fastapi")
pytest.importorskip("httpx")
from fastapi.testclient import TestClient

from ember.errors import EmberError
from ember.seq2seq_generation import (
    Seq2SeqGenerationConfig,
    load_seq2seq_lm,
    seq2seq_generate_text,
)

pytestmark = pytest.mark.usefixtures("one_thread")
DECODER_LIMIT = 64  # model.max_position of the tiny runs (t5_helpers.TINY_T5)


@pytest.fixture(scope="module")
def sentences():
    from ember.tasks.readers.glue import read_examples

    real_data("glue", "SST-2", "dev.tsv")
    return [ex.text_a.strip() for ex in read_examples("sst2", "dev", limit=12)]


@pytest.fixture(scope="module")
def pretrain_run(tmp_path_factory, t5_glue_tokenizer):
    return t5_run_folder(tmp_path_factory.mktemp("t5-pre") / "run", t5_glue_tokenizer)


@pytest.fixture(scope="module")
def sst2_run(tmp_path_factory, pretrain_run):
    """`ember finetune --task sst2 --init <the T5 pre-training run>`, 20 steps on real SST-2: enough
    for the model to answer with label words."""
    import ember

    out = tmp_path_factory.mktemp("t5-sst2") / "run"
    ember.finetune("sst2", out, init=str(pretrain_run), train_limit=640, epochs=1, lr=0.01, max_length=48,
                   progress=False)
    return out


def make_app(run_dir, backend="", max_length=None, limits=None):
    from ember.serve.app import create_app
    from ember.serve.predictor import load_predictor

    predictor = load_predictor(run_dir, backend, max_length=max_length)
    return create_app(predictor, limits), predictor


@pytest.fixture(scope="module")
def served(pretrain_run):
    app, predictor = make_app(pretrain_run)
    with TestClient(app) as client:
        yield client, predictor


def test_t5_pretraining_run_serves_generate_as_seq2seq_generate_text(served, pretrain_run, sentences):
    client, _ = served
    model, tok = load_seq2seq_lm(pretrain_run)
    texts = sentences[:5]
    for settings in ({"max_new_tokens": 7}, {"max_new_tokens": 9, "num_beams": 3, "length_penalty": 0.6},
                     {"max_new_tokens": 6, "num_beams": 2, "early_stopping": True},
                     {"max_new_tokens": 8, "temperature": 0.9, "top_k": 20, "seed": 5},
                     {"max_new_tokens": 8, "stop": ["."]}):
        got = client.post("/generate", json={"texts": texts, **settings})
        assert got.status_code == 200, got.text
        body = got.json()
        expected = seq2seq_generate_text(model, tok, texts, Seq2SeqGenerationConfig(
            **{**settings, "stop": tuple(settings.get("stop", ()))}))
        assert [r["text"] for r in body["results"]] == expected, settings
        assert all(r["input_tokens"] == len(tok.encode(t).ids) and not r["truncated"]
                   for r, t in zip(body["results"], texts))
        assert body["settings"]["num_beams"] == settings.get("num_beams", 1)
    assert len(set(expected)) > 1 and all(len(set(o.split())) > 1 for o in expected)  # not one token repeated


def test_t5_generate_requests_batched_together_answer_as_if_alone(pretrain_run, sentences):
    app, predictor = make_app(pretrain_run)
    bodies = [{"text": s, "max_new_tokens": 6, **({"num_beams": 2} if i % 2 else {})} for i, s in enumerate(sentences)]
    with TestClient(app) as client:
        alone = [client.post("/generate", json=b).json()["results"][0]["text"] for b in bodies]
        before = predictor.forwards
        with ThreadPoolExecutor(len(bodies)) as pool:
            together = list(pool.map(lambda b: client.post("/generate", json=b).json(), bodies))
        assert [t["results"][0]["text"] for t in together] == alone
        assert predictor.forwards - before < len(bodies)  # greedy ones and beam ones decoded in groups


def test_t5_generate_cuts_long_inputs_at_the_served_length_and_says_so(pretrain_run, sentences):
    app, _ = make_app(pretrain_run, max_length=12)
    long_text = " ".join(sentences)
    with TestClient(app) as client:
        body = client.post("/generate", json={"texts": [long_text, "a gem"], "max_new_tokens": 3}).json()
    assert body["truncated"] and body["results"][0]["truncated"] and body["results"][0]["input_tokens"] == 12
    assert not body["results"][1]["truncated"]


BAD = [
    ({"prompt": "a"}, "'prompt' is for causal LMs (GPT)"),
    ({"prompts": ["a"]}, "'prompts' is for causal LMs (GPT)"),
    ({"max_new_tokens": 3}, "send exactly one of 'text'"),
    ({"text": " "}, "'text' is empty"),
    ({"texts": ["a"] * 65}, "limit is 64"),
    ({"text": "a", "max_new_tokens": DECODER_LIMIT + 1}, f"'max_new_tokens' must be between 1 and {DECODER_LIMIT}"),
    ({"text": "a", "num_beams": 0}, "'num_beams' must be between 1 and 8"),
    ({"text": "a", "num_beams": 2.5}, "'num_beams' must be an integer"),
    ({"text": "a", "num_beams": 2, "temperature": 0.7}, "beam search is deterministic"),
    ({"text": "a", "length_penalty": 0.6}, "only apply to beam search"),
    ({"text": "a", "num_beams": 2, "length_penalty": 11}, "'length_penalty' must be between"),
    ({"text": "a", "num_beams": 2, "early_stopping": "yes"}, "'early_stopping' must be true or false"),
    ({"text": "a", "temperature": 0, "top_p": 0.5}, "'top_k' and 'top_p' only apply when sampling"),
    ({"text": "a", "stop": "."}, "'stop' must be a list of strings"),
    ({"text": "a", "beams": 2}, "unknown field(s) beams"),
]


@pytest.mark.parametrize("body,message", BAD)
def test_t5_bad_generate_requests_get_422_naming_the_field(served, body, message):
    client, _ = served
    response = client.post("/generate", json=body)
    assert response.status_code == 422 and message in response.json()["error"], response.text
    assert client.post("/generate", json={"text": "a gem", "max_new_tokens": 2}).status_code == 200


def test_gpt_generate_given_text_to_text_fields_says_they_are_t5s(tmp_path):
    from gpt_helpers import make_gpt_run

    app, _ = make_app(make_gpt_run(tmp_path))
    with TestClient(app) as client:
        for body, message in (({"text": "a"}, "'text' is the input of a text-to-text (encoder-decoder, T5) model"),
                              ({"prompt": "a", "num_beams": 2}, "'num_beams' is a beam-search setting of text-to-text")):
            response = client.post("/generate", json=body)
            assert response.status_code == 422 and message in response.json()["error"]


def test_t5_health_and_endpoints(served, sst2_run):
    client, _ = served
    health = client.get("/healthz").json()
    assert health["endpoints"] == ["/generate", "/score"] and health["model"]["family"] == "t5"
    assert health["model"]["task"] == "span_corruption" and health["limits"]["max_new_tokens"] == 256
    assert client.post("/classify", json={"text": "a"}).status_code == 404
    app, _ = make_app(sst2_run)
    with TestClient(app) as c:
        health = c.get("/healthz").json()
        assert health["endpoints"] == ["/classify", "/generate", "/score"] and health["model"]["kind"] == "classify"
        assert health["model"]["labels"] == ["negative", "positive"] and health["max_length"] == 48


def test_t5_sst2_run_classifies_as_its_evaluation_decodes(sst2_run, sentences):
    """/classify = the adapter's own evaluation path (same encoding, greedy decoding, parsing),
    and /generate given the same "sst2 sentence: ..." input says the same text."""
    from ember.runs.folder import load_run_config
    from ember.tasks.readers.glue import Example
    from ember.tasks.task_model import load_run_adapter, load_task_module
    from ember.tokenizers import load_tokenizer

    cfg = load_run_config(sst2_run)
    adapter = load_run_adapter(sst2_run, cfg)
    tok = load_tokenizer(sst2_run / "tokenizer.json")
    examples = [Example(str(i), s, None, None) for i, s in enumerate(sentences)]
    features, _ = adapter.encoder(tok, cfg.task.max_length)(examples)
    expected = adapter.outputs(load_task_module(sst2_run, cfg, adapter, 0), features)
    app, _ = make_app(sst2_run)
    with TestClient(app) as client:
        body = client.post("/classify", json={"texts": sentences}).json()
        generated = client.post("/generate", json={"texts": [f"sst2 sentence: {s}" for s in sentences],
                                                   "max_new_tokens": 6}).json()
        pair = client.post("/classify", json={"text": "a", "text_pair": "b"})
    results = body["results"]
    assert [r["output"] for r in results] == expected == [r["text"] for r in generated["results"]]
    assert all(r["valid"] and r["label"] in ("negative", "positive") for r in results)  # label words, learnt
    assert pair.status_code == 422 and "classifies single sentences" in pair.json()["error"]


def test_t5_classify_reports_invalid_outputs_as_such(tmp_path, t5_glue_tokenizer, sentences):
    """An untrained text-to-text STS-B run says no score: label null, valid false, the raw output."""
    run = t5_run_folder(tmp_path / "stsb", t5_glue_tokenizer, kind="finetune", task="stsb", seed=3)
    app, _ = make_app(run)
    with TestClient(app) as client:
        body = client.post("/classify", json={"texts": sentences[:3], "text_pairs": sentences[3:6]}).json()
        single = client.post("/classify", json={"text": "a"})
    assert all(r["score"] is None and r["valid"] is False and r["output"] for r in body["results"])
    assert single.status_code == 422 and "sentence pairs" in single.json()["error"]


def test_t5_squad_run_serves_answer(tmp_path, t5_glue_tokenizer):
    run = t5_run_folder(tmp_path / "squad", t5_glue_tokenizer, kind="finetune", task="squad2", seed=1)
    context = "The Normans were the people who in the 10th and 11th centuries gave their name to Normandy."
    app, predictor = make_app(run)
    with TestClient(app) as client:
        assert client.get("/healthz").json()["endpoints"] == ["/answer", "/generate", "/score"]
        body = client.post("/answer", json={"question": "Who gave their name to Normandy?", "context": context}).json()
        bad = client.post("/answer", json={"question": "Who?", "context": context, "top_k": 3})
    template = predictor.methods["answer"].template
    from ember.tasks.qa.squad import SquadExample

    parsed = template.parse(body["output"], SquadExample("q", "", "Who?", context, (), False))
    assert body["valid"] == parsed.valid and body["answer"] == (parsed.value if parsed.valid else None)
    assert bad.status_code == 422 and "unknown field(s) top_k" in bad.json()["error"]


def test_t5_int8_serving_quantizes_the_linear_layers_and_generates(sst2_run, sentences):
    from torch.ao.nn.quantized.dynamic import Linear as QLinear

    app, predictor = make_app(sst2_run, backend="int8")
    assert any(isinstance(m, QLinear) for m in predictor.model.modules())
    with TestClient(app) as client:
        assert client.get("/healthz").json()["backend"] == "int8"
        body = client.post("/classify", json={"texts": sentences[:4]}).json()
        gen = client.post("/generate", json={"text": "sst2 sentence: a gem", "num_beams": 2, "max_new_tokens": 4})
    assert all(r["label"] in ("negative", "positive", None) for r in body["results"])
    assert gen.status_code == 200 and gen.json()["results"][0]["generated_tokens"] <= 4


def test_t5_onnx_export_is_refused_with_its_reason(sst2_run, pretrain_run, tmp_path):
    from ember.serve.export import export_run
    from ember.serve.predictor import load_predictor

    for run in (sst2_run, pretrain_run):
        for fmt in ("onnx", "int8"):
            with pytest.raises(EmberError, match="no inference graph to export.*decoding token by token.*convert --to-hf"):
                export_run(run, fmt, tmp_path / f"out-{fmt}")
        with pytest.raises(EmberError, match="drop --onnx"):
            load_predictor(run, "onnx")
    assert not list(tmp_path.glob("out-*"))


def test_t5_generate_result_fields(served):
    client, _ = served
    body = client.post("/generate", json={"text": "a gem of a film", "max_new_tokens": 4}).json()
    result = body["results"][0]
    assert set(result) == {"text", "finish_reason", "input_tokens", "generated_tokens", "truncated"}
    assert result["finish_reason"] in ("length", "end_of_text", "stop")
    assert json.dumps(body["settings"]) and body["settings"]["seed"] is None
