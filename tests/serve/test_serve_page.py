"""`ember serve`'s page at GET /: one self-contained document per model, built from its methods'
forms; in a real headless Chromium, typing into each method's form, submitting, and reading the
result (probability bars, top-k, entities, the marked answer, continuations, similarities,
log-likelihoods) and the API's error messages."""

from __future__ import annotations

import json
import re

import pytest
import torch

from api_helpers import tiny_runs
from browser_helpers import browser_or_skip, fill, serving, submit_and_wait
from conftest import real_data

pytest.importorskip("fastapi")
pytest.importorskip("uvicorn")
from fastapi.testclient import TestClient  # noqa: E402


@pytest.fixture(scope="module")
def runs(wiki_prepared, tmp_path_factory):
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield tiny_runs(tmp_path_factory.mktemp("page-runs"), wiki_prepared / "tokenizer.json")
    torch.set_num_threads(before)


@pytest.fixture(scope="module")
def browser():
    with browser_or_skip() as driver:
        yield driver


def page_of(run) -> str:
    from ember.serve.app import create_app
    from ember.serve.predictor import load_predictor

    with TestClient(create_app(load_predictor(run))) as client:
        response = client.get("/")
    assert response.status_code == 200 and response.headers["content-type"].startswith("text/html")
    return response.text


def test_page_is_self_contained_and_lists_the_models_methods(runs):
    for kind, methods in (("sst2", ["classify", "embed"]), ("mlm", ["fill-mask", "embed"]), ("conll2003", ["tag", "embed"]),
                          ("squad2", ["answer", "embed"]), ("gpt", ["generate", "score"])):
        html = page_of(runs[kind])
        # Nothing from elsewhere: no scripts, styles, fonts or images by URL.
        assert not re.search(r"""(src|href)\s*=|@import|url\(|https?://""", html), kind
        config = json.loads(re.search(r'<script id="ember-config" type="application/json">(.*?)</script>', html,
                                      re.S).group(1))
        assert [m["name"] for m in config["methods"]] == methods
        assert all(m["form"]["fields"] for m in config["methods"])


def test_page_json_cannot_break_out_of_its_script_element():
    from ember.serve.page import _script_json

    assert "</script>" not in _script_json({"labels": ["</script><script>alert(1)</script>"]})
    assert json.loads(_script_json({"x": "</script>&"})) == {"x": "</script>&"}


def test_classify_and_embed_pages_in_chromium(runs, browser):
    from selenium.webdriver.common.by import By

    real_data("glue", "SST-2")
    with serving(runs["sst2"]) as url:
        browser.get(url + "/")
        assert browser.title == "ember · SST-2"
        assert "labels: negative, positive" in browser.find_element(By.ID, "model-summary").text
        fill(browser, "classify", "text", "an utterly charming and hilarious film that reaffirms your faith")
        text = submit_and_wait(browser, "classify")
        assert re.search(r"Label: (negative|positive)", text)
        bars = browser.find_elements(By.CSS_SELECTOR, "#result-classify .bars .fill")
        assert len(bars) == 2
        shown = sorted(float(v) for v in re.findall(r"([\d.]+)%", text))
        assert sum(shown) == pytest.approx(100, abs=0.2)
        fill(browser, "embed", "texts", "A man is playing a guitar.\nSomeone plays music.\nThe market fell today.")
        text = submit_and_wait(browser, "embed")
        assert "Cosine similarity of 3 sentences (64-dimensional vectors)" in text
        cells = browser.find_elements(By.CSS_SELECTOR, "#result-embed table.similarity td")
        assert len(cells) == 9 and [cells[i].text for i in (0, 4, 8)] == ["1.000"] * 3
        # An error of the API is shown as its message.
        fill(browser, "embed", "texts", " ")
        assert "'texts' is empty" in submit_and_wait(browser, "embed")
        assert browser.find_elements(By.CSS_SELECTOR, "#result-embed .error")


def test_fill_mask_tag_and_answer_pages_in_chromium(runs, browser):
    from selenium.webdriver.common.by import By

    with serving(runs["mlm"]) as url:
        browser.get(url + "/")
        fill(browser, "fill-mask", "text", "the capital of france is [MASK] .")
        fill(browser, "fill-mask", "top_k", "4")
        text = submit_and_wait(browser, "fill-mask")
        assert text.startswith("Mask 1:") and len(browser.find_elements(By.CSS_SELECTOR, "#result-fill-mask .fill")) == 4
        fill(browser, "fill-mask", "text", "a sentence without any mask")
        assert "no [MASK] token in 'text'" in submit_and_wait(browser, "fill-mask")
    with serving(runs["conll2003"]) as url:
        browser.get(url + "/")
        fill(browser, "tag", "text", "Angela Merkel met Emmanuel Macron in Berlin on Monday .")
        text = submit_and_wait(browser, "tag")
        assert re.search(r"\d+ entities|no entities", text) and "Angela" in text
        marks = browser.find_elements(By.CSS_SELECTOR, "#result-tag mark.ent")
        assert marks and all(m.find_element(By.TAG_NAME, "sub").text in ("PER", "LOC", "ORG", "MISC") for m in marks)
    with serving(runs["squad2"]) as url:
        browser.get(url + "/")
        context = "The Eiffel Tower is a lattice tower in Paris. It was built for the 1889 World's Fair."
        fill(browser, "answer", "question", "Where is the tower?")
        fill(browser, "answer", "context", context)
        text = submit_and_wait(browser, "answer")
        assert "Best spans:" in text and "Eiffel Tower is a lattice tower" in text
        best = browser.find_element(By.CSS_SELECTOR, "#result-answer table tr:nth-child(2) td").text
        assert browser.find_element(By.CSS_SELECTOR, "#result-answer .context mark.answer").text == best
        fill(browser, "answer", "context", "")
        assert "'context' is empty" in submit_and_wait(browser, "answer")


def test_generate_and_score_pages_in_chromium(runs, browser):
    from selenium.webdriver.common.by import By

    with serving(runs["gpt"]) as url:
        browser.get(url + "/")
        fill(browser, "generate", "prompt", "The history of the city")
        fill(browser, "generate", "max_new_tokens", "6")
        fill(browser, "generate", "temperature", "0")
        # The form's top_p 0.9 with greedy decoding: the API refuses, the page says why.
        assert "'top_k' and 'top_p' only apply when sampling" in submit_and_wait(browser, "generate")
        fill(browser, "generate", "temperature", "0.8")
        fill(browser, "generate", "seed", "7")
        text = submit_and_wait(browser, "generate")
        assert text.startswith("The history of the city") and "6 new tokens, stopped by length, seed 7" in text
        shown = browser.find_element(By.CSS_SELECTOR, "#result-generate .generated").text
        from ember.serve.predictor import load_predictor
        from ember.tasks.inference.requests import Limits

        predictor = load_predictor(runs["gpt"])
        body = {"prompt": "The history of the city", "max_new_tokens": 6, "temperature": 0.8, "top_k": 0,
                "top_p": 0.9, "seed": 7}
        want = predictor.run("generate", [predictor.parse("generate", body, Limits())])[0]["results"][0]["text"]
        assert shown == want.strip()  # the page shows what the API answered (innerText drops edge spaces)
        fill(browser, "score", "texts", "The city is on the river.\nriver the on is city The.")
        submit_and_wait(browser, "score")
        rows = browser.find_elements(By.CSS_SELECTOR, "#result-score table.scores tr")
        assert len(rows) == 3 and float(rows[1].find_elements(By.TAG_NAME, "td")[1].text) < 0
