"""`ember serve`'s OpenAPI document is its contract (ember/serve/contract.py): every status a route
answers, with the error body's schema; the request forms and limits the server enforces; 405 with
an Allow header. Schemathesis (every check: server errors, status codes, content types, response
schemas, valid data accepted, invalid data refused, unsupported methods) runs against a server of
each kind of run, in-process (ASGI: no network at all)."""

from __future__ import annotations

import os

import pytest

from conftest import make_wordpiece
from serve_helpers import random_run
from t5_helpers import t5_glue_tokenizer, t5_run_folder  # noqa: F401  (t5_glue_tokenizer: a fixture)

pytest.importorskip("fastapi")
schemathesis = pytest.importorskip("schemathesis")
from fastapi.testclient import TestClient  # noqa: E402

from ember.serve.requests import Limits  # noqa: E402

# Small limits keep the generated bodies small (and fast to answer); 60 characters also keep any
# text within the tiny runs' 64 tokens, so a [MASK] is never cut off (a rule no schema can state).
LIMITS = Limits(max_texts=4, max_chars=60, max_new_tokens=3)
STATUSES = {"200", "400", "413", "422", "500", "503"}
PAIRED = (("texts", "text_pairs"), ("texts", "contexts"), ("texts", "targets"))
CHECKS = {"not_a_server_error", "status_code_conformance", "content_type_conformance", "response_schema_conformance",
          "positive_data_acceptance", "negative_data_rejection", "unsupported_method"}


def make_app(run_dir, limits=LIMITS):
    from ember.serve.app import create_app
    from ember.serve.predictor import load_predictor

    return create_app(load_predictor(run_dir), limits, max_wait_ms=0.0, metrics=False)


@pytest.fixture(scope="module")
def wordpiece(tmp_path_factory):
    path = tmp_path_factory.mktemp("contract-tok") / "tokenizer.json"
    tok = make_wordpiece([f"w{i}" for i in range(90)] + ["the", "a", "##s", "film", "fine", "dull"])
    tok.add_special_tokens(["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"])  # "[MASK]" in a text is one token
    tok.save(str(path))
    return path


def build_run(kind: str, root, wordpiece, t5_tokenizer):
    family, task = kind.split(":")
    if family == "minilm":  # the shipped sentence-transformers checkpoint (issue 45's fuzzing target)
        from conftest import real_data
        from ember.interop.convert import import_hf

        return import_hf(real_data("checkpoints", "all-MiniLM-L6-v2"), root / "minilm")
    if family == "encoder":
        return random_run(root, task, wordpiece)
    if family == "gpt":
        from gpt_helpers import make_gpt_run

        return make_gpt_run(root)
    if family == "bart":  # the paper's heads on the decoder's final states (ember.tasks.families.bart)
        from bart_helpers import bart_task_run

        return bart_task_run(root / "run", task)
    return t5_run_folder(root / "run", t5_tokenizer, kind="pretrain" if task == "pretrain" else "finetune",
                         task=task)


def equal_lengths(context, case):
    """JSON Schema cannot say that two lists have as many items (the forms' descriptions do): a
    positive case is cut to satisfy it; negative cases are left as generated."""
    from schemathesis import GenerationMode

    meta, body = case.meta, case.body
    if meta is None or meta.generation.mode != GenerationMode.POSITIVE or not isinstance(body, dict):
        return case
    for many, companions in PAIRED:
        if isinstance(body.get(many), list) and isinstance(body.get(companions), list):
            n = min(len(body[many]), len(body[companions]))
            body[many], body[companions] = body[many][:n], body[companions][:n]
    return case


def fuzz(app, seed: int = 1, max_examples: int = 8):
    """Schemathesis' engine over ``app``: the examples, coverage and fuzzing phases (fixed seed,
    ``max_examples`` per operation), every check on. -> (checks passed, failures, errors, routes,
    names of the checks that ran)."""
    from schemathesis.engine import Status, events, from_schema

    config = schemathesis.Config.from_dict({
        "seed": seed,
        "generation": {"mode": "all", "max-examples": max_examples},
        "phases": {"examples": {"enabled": True}, "coverage": {"enabled": True}, "fuzzing": {"enabled": True},
                   "stateful": {"enabled": False}},
        "checks": {"enabled": True},
    })
    schema = schemathesis.openapi.from_asgi("/openapi.json", app, config=config)
    schema.hook("map_case")(equal_lengths)
    passed, failures, errors, routes, ran = 0, [], [], set(), set()
    for event in from_schema(schema).execute():
        if isinstance(event, events.ScenarioFinished):
            recorder = event.recorder
            for case_id, checks in recorder.checks.items():
                case = recorder.cases[case_id].value
                routes.add(f"{case.method} {case.path}")
                for check in checks:
                    ran.add(check.name)
                    if check.status == Status.FAILURE:
                        info = check.failure_info
                        failures.append(f"{check.name}: {case.method} {case.path} {case.body!r:.300} -> "
                                        f"{str(info.failure if info else ''):.300}")
                    else:
                        passed += 1
        elif isinstance(event, (events.NonFatalError, events.FatalError)):
            errors.append(repr(getattr(event, "value", getattr(event, "exception", None)))[:500])
    return passed, failures, errors, routes, ran


KINDS = {
    "encoder:sst2": {"/classify", "/embed"},
    "encoder:mrpc": {"/classify", "/embed"},  # sentence pairs
    "encoder:stsb": {"/classify", "/embed"},  # regression
    "encoder:conll2003": {"/tag", "/embed"},
    "encoder:squad2": {"/answer", "/embed"},
    "encoder:mlm": {"/fill-mask", "/embed"},
    "minilm:embed": {"/embed"},  # its RUN/embedding.json's pooling and normalisation as defaults
    "gpt:clm": {"/generate", "/score"},
    "t5:pretrain": {"/generate", "/score"},
    "t5:sst2": {"/classify", "/generate", "/score"},
    "t5:rte": {"/classify", "/generate", "/score"},  # sentence pairs, required
    "t5:squad2": {"/answer", "/generate", "/score"},
    # BART's heads on the decoder's states; every head run also serves its backbone's LM
    "bart:rte": {"/classify", "/generate", "/score", "/embed"},  # the classifier on the final </s> state, pairs
    "bart:squad2": {"/answer", "/generate", "/score", "/embed"},  # the span layer
    "bart:conll2003": {"/tag", "/generate", "/score", "/embed"},  # the token layer
}


@pytest.mark.parametrize("kind", list(KINDS))
def test_schemathesis_finds_no_failure_against_a_server_of_each_run_kind(kind, tmp_path, wordpiece, request):
    t5_tokenizer = request.getfixturevalue("t5_glue_tokenizer") if kind.startswith("t5:") else None
    app = make_app(build_run(kind, tmp_path, wordpiece, t5_tokenizer))
    # CONTRACT_SEED / CONTRACT_EXAMPLES search wider (other seeds, more fuzzing examples per route)
    passed, failures, errors, routes, ran = fuzz(app, int(os.environ.get("CONTRACT_SEED", 1)),
                                                 int(os.environ.get("CONTRACT_EXAMPLES", 8)))
    assert not failures, "\n".join(sorted(set(failures))[:20])
    assert not errors, errors
    assert {f"POST {path}" for path in KINDS[kind]} <= routes and {"GET /", "GET /healthz"} <= routes
    assert passed > 100  # the phases did run (hundreds of requests and checks per kind)
    assert CHECKS <= ran, CHECKS - ran  # and the checks that judge the contract did judge it


@pytest.fixture(scope="module")
def sst2_run(tmp_path_factory, wordpiece):
    return random_run(tmp_path_factory.mktemp("contract-sst2"), "sst2", wordpiece)


@pytest.fixture
def sst2_app(sst2_run):  # an app per test: its batcher stops with the TestClient that started it
    return make_app(sst2_run)


def test_openapi_documents_every_error_status_with_the_error_body(sst2_app):
    with TestClient(sst2_app) as client:
        spec = client.get("/openapi.json").json()
        empty = client.post("/classify", content=b"")
        big = client.post("/classify", content=b"{" + b" " * 2_000_000 + b"}")
        unknown = client.post("/classify", json={"text": "a fine film", "label": 1})
    for path in ("/classify", "/embed"):
        responses = spec["paths"][path]["post"]["responses"]
        assert set(responses) == STATUSES, path
        answer = responses["200"]["content"]["application/json"]["schema"]  # the answer's keys, typed
        assert answer["required"] == ["results", "truncated"] + (["dimension"] if path == "/embed" else [])
        for status in STATUSES - {"200"}:
            schema = responses[status]["content"]["application/json"]["schema"]
            assert schema["required"] == ["error"] and schema["properties"]["error"]["type"] == "string"
    for response, status in ((empty, 400), (big, 413), (unknown, 422)):  # what the documented statuses mean
        assert response.status_code == status and set(response.json()) == {"error"}


def test_openapi_states_the_request_limits_and_exactly_one_of_text_or_texts(sst2_app):
    jsonschema_rs = pytest.importorskip("jsonschema_rs")
    with TestClient(sst2_app) as client:
        spec = client.get("/openapi.json").json()
        body = spec["paths"]["/classify"]["post"]["requestBody"]["content"]["application/json"]["schema"]
        valid = jsonschema_rs.validator_for(body).is_valid
        single, many = body["anyOf"]
        assert single["properties"]["text"]["maxLength"] == LIMITS.max_chars
        assert many["properties"]["texts"]["maxItems"] == LIMITS.max_texts
        assert valid(body["example"]) and client.post("/classify", json=body["example"]).status_code == 200
        refused = [{}, {"text": "a", "texts": ["b"]}, {"text": " \n"}, {"texts": []},
                   {"texts": ["a"] * (LIMITS.max_texts + 1)}, {"text": "a" * (LIMITS.max_chars + 1)},
                   {"text": "a", "text_pairs": ["b"]}, {"text": None}]
        for sent in refused:  # invalid under the schema, and refused by the server
            assert not valid(sent), sent
            assert client.post("/classify", json=sent).status_code == 422, sent


def test_a_null_field_is_refused_rather_than_read_as_a_value(sst2_app):
    with TestClient(sst2_app) as client:
        got = client.post("/embed", json={"text": "a fine film", "layer_weights": None})
    assert got.status_code == 422 and got.json() == {"error": "'layer_weights' is null; leave the field out "
                                                                "to get its default"}


@pytest.mark.parametrize("method, path, allowed", [("TRACE", "/", "GET"), ("PUT", "/healthz", "GET"),
                                                   ("GET", "/classify", "POST"), ("DELETE", "/embed", "POST")])
def test_a_wrong_method_gets_405_with_the_allow_header(sst2_app, method, path, allowed):
    with TestClient(sst2_app) as client:
        got = client.request(method, path)
    assert got.status_code == 405 and allowed in got.headers["allow"] and "error" in got.json()


def test_nucleus_sampling_below_float32s_smallest_top_p_keeps_the_most_likely_token():
    """Found by the fuzzer: top_p = 5e-324 is valid (> 0) but rounds to 0 against float32
    probabilities, which dropped every token (NaN probabilities, a 500)."""
    import torch

    from ember.generate import filter_logits

    logits = torch.tensor([[0.5, 2.0, -1.0], [3.0, 0.0, 1.0]])
    for top_p in (5e-324, 1e-300, 1e-9):
        kept = filter_logits(logits, top_p=top_p).isfinite()
        assert kept.tolist() == [[False, True, False], [True, False, False]], top_p


def test_the_documented_non_blank_pattern_is_pythons_whitespace_exactly():
    """A text is refused when str.strip() empties it; the schema's pattern must say the same on
    every code point (\\S would not: ECMA-262's \\s, which JSON Schema uses, lacks \\x1c-\\x1f and
    \\x85 and has \\ufeff; the fuzzer sent '\\x1e' as a valid text)."""
    import re

    from ember.serve.contract import NOT_BLANK

    holds_text = re.compile(NOT_BLANK).fullmatch
    assert [hex(i) for i in range(0x110000) if (holds_text(chr(i)) is None) != chr(i).isspace()] == []
    jsonschema_rs = pytest.importorskip("jsonschema_rs")  # and an ECMA-style engine reads it alike
    valid = jsonschema_rs.validator_for({"type": "string", "pattern": NOT_BLANK}).is_valid
    assert [valid(c) for c in ("\x1e", "\x85", " ", "\u3000", "\ufeff", "a")] == [False] * 4 + [True] * 2
