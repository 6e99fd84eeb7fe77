"""Zero/one/few-shot evaluation with a causal LM (GPT-2/GPT-3 style prompting)."""

from __future__ import annotations

import json

import pytest
import torch

from conftest import real_data
from ember.tasks.inference.fewshot import (FORMATS, build_context, calibrate_scores, content_free_queries,
                                 draw_demonstrations, evaluate_fewshot, render, score_continuations)
from ember.tasks.readers.glue import Example
from gpt_helpers import make_gpt_run


def test_fewshot_scores_equal_hf_log_likelihoods():
    """Label scores are the HF model's summed log-probabilities of the verbalizer tokens."""
    transformers = pytest.importorskip("transformers")
    from hf_interop_helpers import perturb

    from ember.interop import hf_gpt2
    from ember.models import build_backbone
    from ember.objectives.clm import CausalLM

    torch.manual_seed(0)
    hf = perturb(transformers.GPT2LMHeadModel(transformers.GPT2Config(
        vocab_size=97, n_positions=64, n_embd=32, n_layer=2, n_head=4, resid_pdrop=0.0,
        embd_pdrop=0.0, attn_pdrop=0.0)), seed=1)
    cfg = hf_gpt2.config_from_hf(hf.config.to_dict())
    ours = CausalLM(build_backbone(cfg)).eval()
    ours.load_state_dict(hf_gpt2.state_from_hf(hf.state_dict(), cfg))
    contexts = [[5, 6, 7, 8, 9], [10, 11], [12, 13, 14, 15, 16, 17, 18, 19]]
    continuations = [[40], [41, 42, 43], [44, 45]]
    scores = score_continuations(ours, contexts, continuations, batch_size=4)
    for i, context in enumerate(contexts):
        for j, cont in enumerate(continuations):
            with torch.no_grad():
                logp = hf(input_ids=torch.tensor([context + cont])).logits.log_softmax(-1)[0]
            expected = sum(float(logp[len(context) + n - 1, t]) for n, t in enumerate(cont))
            assert abs(float(scores[i, j]) - expected) < 1e-4, (i, j)


def test_fewshot_demonstrations_are_seeded_distinct_and_never_the_query():
    pool = [Example(str(i), f"text {i}", None, i % 2) for i in range(20)]
    a = draw_demonstrations(pool, 8, seed=1, index=3, exclude="5")
    assert a == draw_demonstrations(pool, 8, seed=1, index=3, exclude="5")
    assert a != draw_demonstrations(pool, 8, seed=2, index=3, exclude="5")
    assert len({e.guid for e in a}) == 8 and "5" not in {e.guid for e in a}
    assert draw_demonstrations(pool, 0, 1, 0) == []


def test_fewshot_context_drops_oldest_demonstrations_to_fit(tmp_path):
    from ember.tokenizers import load_tokenizer

    tok = load_tokenizer(make_gpt_run(tmp_path) / "tokenizer.json")
    fmt = FORMATS["sst2"]
    demos = [Example(str(i), f"the film number {i} was good", None, i % 2) for i in range(8)]
    query = Example("q", "the river is long", None, 1)
    full, kept = build_context(tok, fmt, demos, query, room=10_000)
    assert kept == 8
    text = tok.decode(full)
    assert text.count("Sentiment:") == 9 and "film number 0" in text and text.rstrip().endswith("Sentiment:")
    room = len(full) // 2
    ids, kept = build_context(tok, fmt, demos, query, room=room)
    assert len(ids) <= room and 0 < kept < 8
    text = tok.decode(ids)
    assert "film number 7" in text and "film number 0" not in text  # the oldest go first
    alone, kept = build_context(tok, fmt, demos, query, room=4)
    assert kept == 0 and len(alone) == 4
    # the fewest dropped, as a scan from the oldest finds them, for every room; real SST-2 sentences
    sentences = real_data("glue", "SST-2", "train.tsv").read_text(encoding="utf-8").splitlines()[1:301]
    real = [Example(str(i), line.split("\t")[0], None, int(line.split("\t")[1])) for i, line in enumerate(sentences)]

    def scanned(room):
        for start in range(len(real) + 1):
            text = "".join(render(fmt, d, with_answer=True) + fmt.separator for d in real[start:])
            if len(tok.encode(text + render(fmt, query, with_answer=False), add_special_tokens=False).ids) <= room:
                return len(real) - start
        return 0

    for room in (16, 64, 200, 1024, 4000):
        ids, kept = build_context(tok, fmt, real, query, room=room)
        assert len(ids) <= room and kept == scanned(room), room


def test_fewshot_sst2_on_real_data_reports_accuracy_per_k(tmp_path):
    train = real_data("glue", "SST-2", "train.tsv")
    from ember.generate import load_causal_lm

    model, tok = load_causal_lm(make_gpt_run(tmp_path, max_position=128, text=train, vocab=1000))
    report = evaluate_fewshot(model, tok, "sst2", shots=[0, 1, 4], seeds=[1, 2], max_length=128, limit=24)
    assert report["examples"] == 24 and report["verbalizers"] == [" negative", " positive"]
    assert len(report["k=0"]["per_seed"]) == 1 and len(report["k=4"]["per_seed"]) == 2
    for k in (0, 1, 4):
        r = report[f"k={k}"]
        assert 0 <= r["min"] <= r["mean"] <= r["max"] <= 1
        assert r["mean_shots_used"] <= k
    assert report["k=1"]["mean_shots_used"] > 0.5  # one review mostly fits in 128 tokens ...
    assert report["k=4"]["mean_shots_used"] < 4  # ... four often do not: the oldest are dropped
    # Every prediction is the argmax of the label scores: accuracy can be recomputed by hand.
    from ember.tasks.inference.fewshot import prompt_format
    from ember.tasks.readers.glue import read_examples

    examples = read_examples("sst2", "dev", limit=24)
    conts = [tok.encode(v, add_special_tokens=False).ids for v in prompt_format("sst2").verbalizers]
    contexts = [build_context(tok, FORMATS["sst2"], [], ex, 120)[0] for ex in examples]
    predicted = score_continuations(model, contexts, conts).argmax(-1)
    expected = sum(int(p) == e.label for p, e in zip(predicted, examples)) / 24
    assert report["k=0"]["mean"] == pytest.approx(expected)
    from ember.errors import EmberError

    for shots, seeds in (([1, 1], [1, 2]), ([1], [2, 2])):  # a repeat was run and counted twice
        with pytest.raises(EmberError, match="must be distinct"):
            evaluate_fewshot(model, tok, "sst2", shots=shots, seeds=seeds, max_length=128, limit=4)


def test_fewshot_calibration_divides_out_a_label_bias():
    """Contextual calibration (Zhao et al. 2021): a bias toward one label that also shows on the
    content-free inputs is removed, and a content-free input itself becomes uniform."""
    torch.manual_seed(0)
    clean = torch.randn(50, 2, dtype=torch.float64)  # per-example evidence, in log space
    bias = torch.tensor([4.0, 0.0], dtype=torch.float64)  # the prompt's pull toward label 0
    biased = clean + bias
    assert (biased.argmax(-1) == 0).float().mean() > 0.9  # uncalibrated: nearly always label 0
    free = [bias.expand(50, 2) + c for c in (0.0, -1.0, 2.5)]  # label-independent shifts only
    calibrated = calibrate_scores(biased, free)
    assert torch.equal(calibrated.argmax(-1), clean.argmax(-1))
    uniform = calibrate_scores(free[0], free).exp()
    assert torch.allclose(uniform[:, 0], uniform[:, 1])
    # Content-free versions of a query: the paper's three strings, both texts of a pair replaced.
    pair = content_free_queries(Example("g", "a premise", "a hypothesis", 1))
    assert [(e.text_a, e.text_b) for e in pair] == [("N/A", "N/A"), ("[MASK]", "[MASK]"), ("", "")]
    assert all(e.text_b is None for e in content_free_queries(Example("g", "a review", None, 0)))


def test_fewshot_calibrated_sst2_on_real_data_matches_a_hand_computation(tmp_path):
    train = real_data("glue", "SST-2", "train.tsv")
    from ember.generate import load_causal_lm
    from ember.tasks.inference.fewshot import prompt_format
    from ember.tasks.readers.glue import read_examples

    model, tok = load_causal_lm(make_gpt_run(tmp_path, max_position=128, text=train, vocab=1000))
    report = evaluate_fewshot(model, tok, "sst2", shots=[0, 2], seeds=[1, 2], max_length=128, limit=20,
                              calibrate=True)
    assert {"k=0", "k=0 calibrated", "k=2", "k=2 calibrated"} <= set(report)
    assert len(report["k=0 calibrated"]["per_seed"]) == 1 and len(report["k=2 calibrated"]["per_seed"]) == 2
    # k = 0 by hand: each dev prompt and its three content-free twins, scored directly.
    examples = read_examples("sst2", "dev", limit=20)
    conts = [tok.encode(v, add_special_tokens=False).ids for v in prompt_format("sst2").verbalizers]
    room = 128 - max(len(c) for c in conts)
    scores = score_continuations(model, [build_context(tok, FORMATS["sst2"], [], ex, room)[0] for ex in examples], conts)
    free = [score_continuations(model, [build_context(tok, FORMATS["sst2"], [], content_free_queries(ex)[c], room)[0]
                                        for ex in examples], conts) for c in range(3)]
    predicted = calibrate_scores(scores, free).argmax(-1)
    expected = sum(int(p) == e.label for p, e in zip(predicted, examples)) / 20
    assert report["k=0 calibrated"]["mean"] == pytest.approx(expected)
    assert report["k=0"]["mean"] == pytest.approx(sum(int(p) == e.label for p, e in zip(scores.argmax(-1), examples)) / 20)


def test_fewshot_cli_writes_a_report(tmp_path):
    real_data("glue", "SST-2", "dev.tsv")
    from ember.cli import main

    run = make_gpt_run(tmp_path)
    out = tmp_path / "report.json"
    assert main(["fewshot", str(run), "--task", "sst2", "--shots", "0,1", "--seeds", "1,2",
                 "--limit", "6", "--out", str(out), "--no-progress", "--calibrate"]) == 0
    report = json.loads(out.read_text())
    assert set(report) >= {"k=0", "k=1", "k=1 calibrated", "majority"}
