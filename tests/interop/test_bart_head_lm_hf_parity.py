"""/score and /generate of BART head runs (Lewis et al. 2020 §3): a run fine-tuned with a
classification, span or token head still holds a whole sequence-to-sequence LM (BART's output
layer is the shared embedding table plus final_logits_bias), so it serves the methods of a
plain BART run. Checked against the imported pre-trained run (the same weights: the same
numbers, exactly) and against transformers' BartForConditionalGeneration loss on tiny random
models built locally."""

from __future__ import annotations

import pytest
import torch

transformers = pytest.importorskip("transformers")

from bart_helpers import VOCAB, bart_style_tokenizer, bart_task_run, tiny_hf_bart  # noqa: E402
from t5_helpers import one_thread  # noqa: E402,F401

import ember  # noqa: E402
from ember.cli import main  # noqa: E402
from ember.interop import hf_bart  # noqa: E402
from ember.runs.checkpoint import load_weights  # noqa: E402
from ember.runs.folder import load_run_config  # noqa: E402

pytestmark = pytest.mark.usefixtures("one_thread")
INPUTS = ["w1 w2 w3 w4 w5", "w7 w8", "w9 w10 w11 w12 w13 w14 w15"]
TARGETS = ["w20 w21", "w22", "w23 w24 w25 w26"]
# rows for a `classify` run on the tiny vocabulary (its texts only need to encode)
ROWS = [(f"w{i} w{i + 1} w{i + 2}", "odd" if i % 2 else "even") for i in range(10, 34)]
STEP = ["train.num_threads=1", "train.batch_size=8"]


def hf_log_likelihoods(hf, tokenizer) -> list[float]:
    """log p(target | input) per pair from transformers: -loss x target tokens (labels = the
    target with its template, as ember's score encodes it; decoding starts from </s>)."""
    out = []
    for source, target in zip(INPUTS, TARGETS):
        src, tgt = tokenizer.encode(source).ids, tokenizer.encode(target).ids
        with torch.no_grad():
            loss = hf(input_ids=torch.tensor([src]), labels=torch.tensor([tgt])).loss
        out.append(-float(loss) * len(tgt))
    return out


def hf_lm_of_run(run) -> transformers.BartForConditionalGeneration:
    """transformers' BartForConditionalGeneration holding a run's backbone (a head run's too:
    its head is dropped, its final_logits_bias kept)."""
    cfg = load_run_config(run).model
    state = {k: v for k, v in load_weights(run / "model.safetensors").items() if k.startswith("backbone.")}
    config = transformers.BartConfig(**hf_bart.config_to_hf(cfg, ["BartForConditionalGeneration"]))
    hf = transformers.BartForConditionalGeneration(config).eval()
    hf.load_state_dict(hf_bart.state_to_hf(state, cfg, "BartForConditionalGeneration"), strict=False)
    theirs = hf.state_dict()
    for name, tensor in hf_bart.state_to_hf(state, cfg, "BartForConditionalGeneration").items():
        torch.testing.assert_close(theirs[name], tensor, atol=0, rtol=0)  # every tensor arrived
    return hf


def scores(model) -> list[float]:
    return [r["log_likelihood"] for r in model.score(INPUTS, target=TARGETS)]


@pytest.fixture(scope="module")
def imported(tmp_path_factory):
    """A tiny random BartForConditionalGeneration (random final_logits_bias) imported with
    `ember convert --from-hf`: the pre-trained run a head run starts from."""
    root = tmp_path_factory.mktemp("bart-lm")
    hf = tiny_hf_bart(seed=21)
    hf.save_pretrained(root / "hf")
    tok = bart_style_tokenizer([f"w{i}" for i in range(VOCAB - 5)])
    tok.save(str(root / "hf" / "tokenizer.json"))
    assert main(["convert", "--from-hf", str(root / "hf"), "--out", str(root / "base")]) == 0
    return root, hf, tok


def test_bart_head_run_scores_and_generates_as_its_pretrained_run(imported, tmp_path):
    """A head freshly added to the imported BART (fine-tuned at lr 0: the backbone's tensors,
    final_logits_bias included, are the base run's) scores and generates exactly as the base
    run, whose score is transformers' loss; served over HTTP and on the ONNX backend (the
    classifier graph in ONNX Runtime, the LM in PyTorch) alike."""
    root, hf, tok = imported
    base = ember.load(root / "base")
    assert base.methods == ["generate", "score"]
    want = scores(base)
    # float32 sums over the vocabulary in another order than transformers': rounding only
    assert want == pytest.approx(hf_log_likelihoods(hf, tok), abs=1e-4)
    head_run = tmp_path / "head"
    ember.finetune("classify", head_run, init=str(root / "base"), train=ROWS, dev=ROWS[:6], lr=0.0, epochs=1,
                   max_length=32, progress=False, overrides=STEP)
    base_state, head_state = (load_weights(r / "model.safetensors") for r in (root / "base", head_run))
    assert {"dense.weight", "classifier.weight"} <= set(head_state)
    for name, tensor in base_state.items():
        assert torch.equal(head_state[name], tensor), name
    head = ember.load(head_run)
    assert head.methods == ["classify", "generate", "score", "embed"]
    assert scores(head) == want  # the same computation on the same tensors
    for options in ({"max_new_tokens": 6}, {"max_new_tokens": 6, "num_beams": 3, "length_penalty": 0.8}):
        assert [g["text"] for g in head.generate(INPUTS, **options)] == \
               [g["text"] for g in base.generate(INPUTS, **options)]
    onnx = ember.load(head_run, backend="onnx")
    assert onnx.backend == "onnx" and scores(onnx) == want

    from fastapi.testclient import TestClient

    from ember.serve.app import create_app

    with TestClient(create_app(head.predictor, max_wait_ms=0.0, metrics=False)) as client:
        got = client.post("/score", json={"texts": INPUTS, "targets": TARGETS})
        assert got.status_code == 200, got.text
        assert [r["log_likelihood"] for r in got.json()["results"]] == want
        assert client.post("/generate", json={"text": INPUTS[0], "max_new_tokens": 4}).status_code == 200
        assert client.post("/classify", json={"text": INPUTS[0]}).status_code == 200


def test_bart_fine_tuned_head_run_scores_as_transformers_on_its_backbone(imported, tmp_path):
    """After real steps the backbone moved (the scores differ from the base run's), and the
    head run's /score is transformers' BartForConditionalGeneration loss on its backbone."""
    root, _, tok = imported
    run = tmp_path / "tuned"
    ember.finetune("classify", run, init=str(root / "base"), train=ROWS, dev=ROWS[:6], lr=1e-2, epochs=2,
                   max_length=32, progress=False, overrides=STEP)
    got = scores(ember.load(run))
    assert max(abs(a - b) for a, b in zip(got, scores(ember.load(root / "base")))) > 1e-2
    assert got == pytest.approx(hf_log_likelihoods(hf_lm_of_run(run), tok), abs=1e-4)


@pytest.mark.parametrize("task", ["squad2", "conll2003"])
def test_bart_span_and_token_head_runs_score_as_transformers(task, tmp_path):
    """The span and token heads' runs serve the LM too (a random tiny BART with the head,
    zero final_logits_bias as a freshly built backbone has): transformers' loss on their backbone."""
    run = bart_task_run(tmp_path / task, task)
    model = ember.load(run)
    assert {"score", "generate", "embed", "answer" if task == "squad2" else "tag"} == set(model.methods)
    tok = model.tokenizer
    assert scores(model) == pytest.approx(hf_log_likelihoods(hf_lm_of_run(run), tok), abs=1e-4)


def test_bart_onnx_export_folder_serves_its_graph_without_the_lm(tmp_path):
    """An ONNX export holds the head's graph, not the PyTorch weights the LM runs on: it serves
    /classify and /embed, and a /score request is the 404 naming what it serves."""
    from ember.serve.export import export_run

    run = bart_task_run(tmp_path / "rte", "rte")
    export_run(run, "onnx", tmp_path / "onnx", verify=False)
    model = ember.load(tmp_path / "onnx")
    assert model.methods == ["classify", "embed"]
    with pytest.raises(AttributeError, match="has no 'score' method; it has: classify, embed"):
        model.score("w1 w2", target="w3")
