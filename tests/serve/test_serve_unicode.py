"""Malformed text through the HTTP app: a lone surrogate ("\\ud800", legal in JSON, not in UTF-8)
in any text field of any method is a 422 naming the field, never a 500; the server keeps serving."""

from __future__ import annotations

import json

import pytest

from serve_helpers import random_run

pytest.importorskip("fastapi")
pytest.importorskip("httpx")
from fastapi.testclient import TestClient  # noqa: E402

BAD = "fine \ud800 text"
OK = "a fine film"
# run kind -> endpoint -> [(body with one bad field, the field's name in the error)]
CASES = {
    "sst2": {
        "/classify": [({"text": BAD}, "'text'"), ({"texts": [OK, BAD]}, "'texts[1]'"),
                      ({"text": OK, "text_pair": BAD}, "'text_pair'"),
                      ({"texts": [OK, OK], "text_pairs": [OK, BAD]}, "'text_pairs[1]'")],
        "/embed": [({"text": BAD}, "'text'"), ({"texts": [BAD]}, "'texts[0]'"),
                   ({"text": OK, "text_pair": BAD, "pooling": "cls"}, "'text_pair'"),
                   ({"texts": [OK], "text_pairs": [BAD]}, "'text_pairs[0]'")],
    },
    "conll2003": {"/tag": [({"text": BAD}, "'text'"), ({"texts": [OK, BAD]}, "'texts[1]'"),
                           ({"words": [["EU", "rejects"], ["German", "\ud800"]]}, "'words[1][1]'")]},
    "squad2": {"/answer": [({"question": BAD, "context": OK}, "'question'"),
                           ({"question": "Who?", "context": BAD}, "'context'")]},
    "mlm": {"/fill-mask": [({"text": "a [MASK] \ud800"}, "'text'")]},
    "gpt": {"/generate": [({"prompt": BAD}, "'prompt'"), ({"prompts": [OK, BAD]}, "'prompts[1]'"),
                          ({"prompt": OK, "stop": [".", "\ud800"]}, "'stop[1]'")]},
}


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    from conftest import make_wordpiece

    root = tmp_path_factory.mktemp("unicode")
    tok = make_wordpiece([f"w{i}" for i in range(90)] + ["the", "a", "##s"])
    tok.add_special_tokens(["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"])  # "[MASK]" stays one token
    tok.save(str(root / "tokenizer.json"))
    out = {kind: random_run(root, kind, root / "tokenizer.json") for kind in ("sst2", "conll2003", "squad2", "mlm")}
    pytest.importorskip("transformers")
    from gpt_helpers import make_gpt_run

    (root / "gpt").mkdir()
    out["gpt"] = make_gpt_run(root / "gpt")
    return out


@pytest.mark.parametrize("kind", sorted(CASES))
def test_lone_surrogate_in_every_text_field_is_a_422_naming_the_field(runs, kind):
    from ember.serve.app import create_app
    from ember.serve.predictor import load_predictor

    predictor = load_predictor(runs[kind])
    assert sorted(CASES[kind]) == sorted(e for e in predictor.endpoints if e in CASES[kind])
    with TestClient(create_app(predictor), raise_server_exceptions=False) as client:
        for endpoint, cases in CASES[kind].items():
            for body, field in cases:
                raw = json.dumps(body)  # ensure_ascii: the surrogate travels as the escape \ud800
                assert "\\ud800" in raw
                response = client.post(endpoint, content=raw, headers={"Content-Type": "application/json"})
                assert response.status_code == 422, (endpoint, body, response.text)
                error = response.json()["error"]
                assert field in error and "lone surrogates" in error, (endpoint, error)
            fixed = json.dumps(cases[0][0]).replace("\\ud800", "w1")  # the same body, the surrogate replaced
            ok = client.post(endpoint, content=fixed, headers={"Content-Type": "application/json"})
            assert ok.status_code == 200, ok.text  # and it keeps serving
