"""The lead-generation study (issue 41, item 4): its --smoke mode builds the task from real
Wikipedia articles, held out by article, and scores the lead baseline, BART and T5 with ember's
ROUGE. The smoke's models are tiny and barely trained: it checks the study, not the figures."""

from __future__ import annotations

import json

import pytest
from benchmark_helpers import keep_torch_threads, load_benchmark  # noqa: F401 (an autouse fixture)
from conftest import real_data

from ember.data.readers import DocumentReader
from ember.data.sentences import split_sentences
from ember.errors import EmberError


def _articles(bench, files) -> dict[str, str]:
    """title -> text of every article of ``files``, read by ember's wiki reader."""
    titles = {str(f): bench.doc_titles(f) for f in files}
    return {titles[d.source][d.line]: d.text for d in DocumentReader([str(f) for f in files], fmt="wiki")}


@pytest.mark.slow
def test_lead_generation_smoke_holds_out_articles_scores_the_lead_baseline_as_rouge_score_and_resumes(tmp_path):
    pytest.importorskip("rouge_score")
    from rouge_score import rouge_scorer

    files = sorted(real_data("wiki-en", "AB").glob("wiki_*.gz"))
    bench = load_benchmark("lead_generation")
    result = bench.main(["--out", str(tmp_path), "--smoke"])
    task = tmp_path / "task"
    train, dev = (bench.read_jsonl(task / f"{split}.jsonl") for split in ("train", "dev"))
    assert len(train) == result["task"]["train_pairs"] > 0 and len(dev) == result["task"]["dev_pairs"] > 0

    # held out by article: no title on both sides, and each side is the one its title hashes to
    assert not {r["id"] for r in train} & {r["id"] for r in dev}
    assert all(bench.split_of(r["id"]) == "train" for r in train) and all(bench.split_of(r["id"]) == "dev" for r in dev)

    # the target is the article's first sentence (its text starts with it, and it is one sentence);
    # the input is text of the same article that comes after it, and never contains the target
    articles = _articles(bench, files[: bench.SMOKE["task_files"]])
    for r in train + dev:
        text = articles[r["id"]]
        assert text.startswith(r["target"]) and split_sentences(r["target"]) == [r["target"]], r["id"]
        assert r["target"] not in r["input"]
        first_input_sentence = split_sentences(r["input"])[0]
        assert text.index(first_input_sentence) >= len(r["target"]), r["id"]
        assert len(r["input"].split()) <= bench.INPUT_WORDS

    # the three rows, in both outputs
    rows = {r["system"]: r for r in result["rows"]}
    assert list(rows) == ["lead", "bart", "t5"]
    saved = json.loads((tmp_path / "table.json").read_text())
    assert [r["system"] for r in saved["rows"]] == ["lead", "bart", "t5"]
    table = (tmp_path / "table.md").read_text()
    assert all(f"| {system} |" in table for system in rows)

    # the lead baseline, recomputed here: the first sentence of each scored input, scored by rouge-score
    scored = bench.read_jsonl(task / "dev-scored.jsonl")
    assert [r["id"] for r in scored] == [r["id"] for r in dev[: len(scored)]]
    lead = [split_sentences(r["input"])[0] for r in scored]
    assert result["outputs"]["lead"] == lead
    scorer = rouge_scorer.RougeScorer(["rouge1", "rouge2", "rougeLsum"], use_stemmer=False)
    got = [scorer.score(r["target"], output) for r, output in zip(scored, lead)]
    for key in ("rouge1", "rouge2", "rougeLsum"):
        expected = 100.0 * sum(g[key].fmeasure for g in got) / len(got)
        assert rows["lead"][key] == pytest.approx(expected, abs=1e-9), key
    assert rows["lead"]["rouge1"] > 0  # the lead shares words with the first sentence on real articles
    # every row's ember ROUGE agrees with rouge-score on that row's own outputs
    assert all(r["max_gap"] < 1e-9 for r in result["rows"]), [r["max_gap"] for r in result["rows"]]
    for system in ("bart", "t5"):
        assert len(result["outputs"][system]) == len(scored)
        assert rows[system]["finetune_steps"] > 0 and rows[system]["pretrain_steps"] == bench.SMOKE["pretrain_steps"]
    assert rows["lead"]["distinct_outputs"] == len(set(lead))

    # a second call rescores the finished sides from their saved outputs: nothing is trained again
    weights = tmp_path / "bart-pretrained" / "model.safetensors"
    stamp = weights.stat().st_mtime_ns
    again = bench.main(["--out", str(tmp_path), "--smoke"])
    assert again["rows"] == result["rows"] and weights.stat().st_mtime_ns == stamp


def test_lead_pair_ends_the_first_section_at_a_heading_and_refuses_a_one_sentence_lead():
    bench = load_benchmark("lead_generation")
    text = ("Humus is dark organic matter in soil. It forms when plant matter decays over many years in the ground. "
            "Soil formation begins with the weathering of rock and the slow work of many small animals.\n"
            "History.\nThe word comes from Latin and was first used in this sense in the eighteenth century.")
    source, target = bench.lead_pair(text)
    assert target == "Humus is dark organic matter in soil."
    assert source.startswith("It forms") and "Latin" not in source  # the heading ends the first section
    assert bench.lead_pair("Humus is dark organic matter in soil.\nHistory.\nIt is old.") is None


def test_lead_generation_refuses_unknown_systems(tmp_path):
    bench = load_benchmark("lead_generation")
    with pytest.raises(EmberError, match="unknown system"):
        bench.parse_args(["--out", str(tmp_path), "--systems", "lead,pegasus"])
