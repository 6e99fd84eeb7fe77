"""`ember.load`: every method answers as `ember serve` does (the same predictor, parse and run),
from strings, lists, DataFrames and datasets; score against transformers (GPT-2, T5); a Hugging
Face folder (the real all-MiniLM-L6-v2) through the conversion cache; backends, to_hf, export;
bad input."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from api_helpers import tiny_runs
from conftest import real_data

import ember
from ember.errors import EmberError


@pytest.fixture(autouse=True)
def one_thread(monkeypatch, tmp_path):
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    monkeypatch.setenv("EMBER_CACHE", str(tmp_path / "cache"))
    yield
    torch.set_num_threads(before)


@pytest.fixture(scope="module")
def runs(wiki_prepared, tmp_path_factory):
    return tiny_runs(tmp_path_factory.mktemp("api-runs"), wiki_prepared / "tokenizer.json")


@pytest.fixture(scope="module")
def sst2_dev():
    from ember.tasks.readers.glue import read_examples

    real_data("glue", "SST-2")
    return read_examples("sst2", "dev")


def served(run, name: str, body: dict, backend: str = ""):
    """What `ember serve` answers: one request through the predictor with the server's limits."""
    from ember.serve.predictor import load_predictor
    from ember.tasks.inference.requests import Limits

    predictor = load_predictor(run, backend)
    return predictor.run(name, [predictor.parse(name, body, Limits())])[0]


def assert_same(got, want, tol: float = 1e-6) -> None:
    """Equal structures; floats to ``tol`` (rows batched differently round differently)."""
    if isinstance(want, dict):
        assert isinstance(got, dict) and set(got) == set(want)
        for key in want:
            assert_same(got[key], want[key], tol)
    elif isinstance(want, list):
        assert isinstance(got, list) and len(got) == len(want)
        for g, w in zip(got, want):
            assert_same(g, w, tol)
    elif isinstance(want, float):
        assert got == pytest.approx(want, abs=tol)
    else:
        assert got == want


def test_classify_strings_lists_and_pairs_answer_as_serve_on_real_sst2(runs, sst2_dev):
    model = ember.load(runs["sst2"])
    texts = [ex.text_a for ex in sst2_dev[:45]]  # two chunks of max_batch, some truncated at 64 tokens
    got = model.classify(texts)
    want = served(runs["sst2"], "classify", {"texts": texts})["results"]
    assert len(got) == len(texts) and any(r["truncated"] for r in want)
    for g, w in zip(got, want):
        assert g["label"] == w["label"] and g["truncated"] == w["truncated"]
        assert g["probabilities"] == pytest.approx(w["probabilities"], abs=1e-6)
    one = model.classify(texts[3])
    assert isinstance(one, dict) and one["probabilities"] == pytest.approx(got[3]["probabilities"], abs=1e-6)
    pair = model.classify(texts[:2], text_pair=texts[2:4])
    want_pair = served(runs["sst2"], "classify", {"texts": texts[:2], "text_pairs": texts[2:4]})["results"]
    assert [p["probabilities"] for p in pair] == [pytest.approx(w["probabilities"], abs=1e-6) for w in want_pair]
    assert model.methods == ["classify", "embed"] and model.info["task"] == "sst2"


def test_embed_lists_dataframes_and_datasets_give_numpy_equal_to_serve(runs, sst2_dev):
    pd = pytest.importorskip("pandas")
    texts = [ex.text_a for ex in sst2_dev[:40]]
    model = ember.load(runs["sst2"])
    vectors = model.embed(texts, pooling="cls", layer=1)
    want = served(runs["sst2"], "embed", {"texts": texts, "pooling": "cls", "layer": 1})
    assert isinstance(vectors, np.ndarray) and vectors.shape == (40, 64) and vectors.dtype == np.float32
    np.testing.assert_allclose(vectors, [r["embedding"] for r in want["results"]], atol=1e-5)
    frame = pd.DataFrame({"id": range(40), "sentence": texts})
    np.testing.assert_allclose(model.embed(frame, column="sentence", pooling="cls", layer=1), vectors, atol=1e-6)
    assert model.embed(texts[0]).shape == (64,)
    tokens = model.embed(texts[:2], pooling="none")
    assert [t.shape[1] for t in tokens] == [64, 64] and tokens[0].shape[0] != tokens[1].shape[0]
    datasets = pytest.importorskip("datasets")
    dataset = datasets.Dataset.from_pandas(frame)
    np.testing.assert_allclose(model.embed(dataset, column="sentence", pooling="cls", layer=1), vectors, atol=1e-6)


def recorded_batches(model) -> list:
    """The (rows, tokens) shape of every batch the model's runner is handed from now on."""
    shapes, runner = [], model.predictor.runner

    def record(arrays, need_hidden=False):
        shapes.append(arrays["input_ids"].shape)
        return runner(arrays, need_hidden)

    model.predictor.runner = record
    return shapes


def test_embed_of_a_loaded_model_runs_the_batches_of_ember_embed_on_real_sst2(runs, sst2_dev):
    """``model.embed`` (the notebook path) runs ``embed_with`` (`ember embed`'s code): the same
    padded batches reach the model and the vectors are bit-identical. It chunked a list by
    characters before, which padded more and ran 19% slower (issue 46)."""
    from ember.api.embed import embed_with

    texts = [ex.text_a for ex in sst2_dev[:100]]
    model = ember.load(runs["sst2"], batch_size=8)
    shapes = recorded_batches(model)
    got = model.embed(texts, normalize=True)
    by_load = list(shapes)
    shapes.clear()
    want, _ = embed_with(model.predictor, texts, normalize=True)
    assert by_load == shapes and len(shapes) == 13  # ceil(100 / 8) forwards
    np.testing.assert_array_equal(got, want)


def test_classify_of_a_list_chunks_it_by_token_length_as_embed_does_on_real_sst2(runs, sst2_dev):
    """Every method's list is cut into chunks of similar token length (the order ``embed_with``
    uses), not character length: the batches of a classify call pad exactly as embed's, and
    token sorting pads less than the character key did on these sentences."""
    texts = [ex.text_a for ex in sst2_dev[:100]]
    model = ember.load(runs["sst2"], batch_size=8)
    shapes = recorded_batches(model)
    model.embed(texts)
    by_embed = list(shapes)
    shapes.clear()
    model.classify(texts)
    assert shapes == by_embed
    by_chars = sorted(range(len(texts)), key=lambda i: len(texts[i]))
    lengths = [len(ids) for ids, _, _ in model.predictor.methods["embed"].encoder(texts)]
    # both padded as the predictor pads a batch (widths in steps of 16: ember.serve.inputs.padded_width)
    from ember.serve.inputs import padded_width

    predictor = model.predictor
    char_padded = sum(len(by_chars[k:k + 8]) * padded_width(max(lengths[i] for i in by_chars[k:k + 8]),
                                                            predictor.pad_multiple, predictor.max_length)
                      for k in range(0, 100, 8))
    assert sum(b * t for b, t in shapes) < char_padded


def test_fill_mask_tag_and_answer_answer_as_serve(runs):
    mlm = ember.load(runs["mlm"])
    texts = ["the capital of france is [MASK] .", "a [MASK] of the [MASK] was built in 1900 ."]
    got = mlm.fill_mask(texts, top_k=3)
    assert_same(got, [served(runs["mlm"], "fill-mask", {"text": t, "top_k": 3}) for t in texts])
    assert len(got[1]["masks"]) == 2
    sentences = ["John Smith lives in Paris .", "The European Union met in Brussels on Monday ."]
    assert_same(ember.load(runs["conll2003"]).tag(sentences), served(runs["conll2003"], "tag", {"texts": sentences})["results"])
    context = "The Eiffel Tower is a lattice tower in Paris. It was built for the 1889 World's Fair."
    qa = ember.load(runs["squad2"])
    got = qa.answer(["Where is the tower?", "When was it built?"], context=context)
    assert_same(got, [served(runs["squad2"], "answer", {"question": q, "context": context})
                      for q in ("Where is the tower?", "When was it built?")], tol=1e-4)


def test_generate_answers_as_serve_greedy_and_seeded(runs):
    model = ember.load(runs["gpt"])
    prompts = ["The history of the city", "In 1900 the"]
    for options in ({"max_new_tokens": 8}, {"max_new_tokens": 8, "temperature": 0.8, "top_p": 0.9, "seed": 5}):
        got = model.generate(prompts, **options)
        want = served(runs["gpt"], "generate", {"prompts": prompts, **options})
        assert [g["text"] for g in got] == [w["text"] for w in want["results"]]
        assert all(g["settings"] == want["settings"] for g in got)
    assert model.methods == ["generate", "score"]


def test_gpt_score_is_the_log_likelihood_transformers_gives(runs, tmp_path):
    """Parity: the sum of log p(token | <eot>, earlier tokens) from GPT2LMHeadModel on the HF export."""
    transformers = pytest.importorskip("transformers")
    model = ember.load(runs["gpt"])
    texts = ["The river runs by the old town.", "It was the largest city of the region in 1900.",
             "Paris"]
    got = model.score(texts)
    hf = transformers.GPT2LMHeadModel.from_pretrained(str(model.to_hf(tmp_path / "hf"))).eval()
    eot = model.predictor.methods["score"].eot_id
    for text, result in zip(texts, got):
        ids = [eot] + model.tokenizer.encode(text, add_special_tokens=False).ids
        with torch.no_grad():
            logp = hf(torch.tensor([ids])).logits[0].double().log_softmax(-1)
        want = sum(float(logp[t - 1, ids[t]]) for t in range(1, len(ids)))
        assert result["tokens"] == len(ids) - 1 and not result["truncated"]
        assert result["log_likelihood"] == pytest.approx(want, abs=1e-4)
        assert result["perplexity"] == pytest.approx(np.exp(-want / (len(ids) - 1)), rel=1e-4)
    # Batching changes nothing, and a context conditions: log p(c t) = log p(c) + log p(t | c).
    assert [model.score(t)["log_likelihood"] for t in texts] == pytest.approx([r["log_likelihood"] for r in got], abs=1e-5)
    whole = model.score("The river runs by the old town.")["log_likelihood"]
    head = model.score("The river runs by the")["log_likelihood"]
    tail = model.score(" old town.", context="The river runs by the")
    assert tail["tokens"] == len(model.tokenizer.encode(" old town.", add_special_tokens=False).ids)
    assert head + tail["log_likelihood"] == pytest.approx(whole, abs=1e-4)


def test_t5_score_is_the_log_likelihood_transformers_gives():
    """Seq2SeqScoreMethod (T5's score) against T5ForConditionalGeneration, </s> included."""
    pytest.importorskip("transformers")
    from t5_helpers import ember_from_hf, t5_style_tokenizer, tiny_hf_t5

    from ember.tasks.inference.methods import InferenceContext
    from ember.tasks.inference.requests import Limits
    from ember.tasks.inference.scoring import Seq2SeqScoreMethod

    hf = tiny_hf_t5("v1_1").eval()
    pieces = [f"▁w{i}" for i in range(96)]
    tokenizer = t5_style_tokenizer(pieces)
    ctx = InferenceContext(tokenizer, 32, {"pad": 0, "eot": 1, "unk": 2}, model=ember_from_hf(hf), max_batch=2)
    method = Seq2SeqScoreMethod(ctx)
    inputs = ["w1 w2 w3 w4 w5", "w7 w8", "w9 w10 w11 w12 w13 w14 w15"]
    targets = ["w20 w21", "w22", "w23 w24 w25 w26"]
    got = method([method.parse({"texts": inputs, "targets": targets}, Limits())])[0]["results"]
    for source, target, result in zip(inputs, targets, got):
        src, tgt = tokenizer.encode(source).ids, tokenizer.encode(target).ids
        assert tgt[-1] == 1 and result["tokens"] == len(tgt)
        with torch.no_grad():
            out = hf(input_ids=torch.tensor([src]), labels=torch.tensor([tgt]))
        assert result["log_likelihood"] == pytest.approx(-float(out.loss) * len(tgt), abs=1e-4)


def test_hf_folder_loads_through_a_cache_converted_once_real_minilm(monkeypatch, sst2_dev):
    """The real all-MiniLM-L6-v2 (BertModel): mean-pooled embeddings equal transformers', and
    paraphrases are closer than unrelated sentences; the second load reuses the converted run."""
    transformers = pytest.importorskip("transformers")
    folder = real_data("checkpoints", "all-MiniLM-L6-v2")
    model = ember.load(folder)
    assert model.layout == "hf" and model.methods == ["embed"] and "hf-runs" in str(model.path)
    texts = [ex.text_a for ex in sst2_dev[:12]]
    got = model.embed(texts)
    hf = transformers.BertModel.from_pretrained(str(folder)).eval()
    tok = transformers.AutoTokenizer.from_pretrained(str(folder))
    batch = tok(texts, padding=True, truncation=True, max_length=model.info["max_length"], return_tensors="pt")
    with torch.no_grad():
        hidden = hf(**batch).last_hidden_state
    mask = batch["attention_mask"][..., None].float()
    # the folder's sentence-transformers modules (mean pooling, then Normalize) are the run's defaults
    mean = (hidden * mask).sum(1) / mask.sum(1)
    np.testing.assert_allclose(got, torch.nn.functional.normalize(mean, dim=-1).numpy(), atol=1e-5)
    e = model.embed(["A man is playing a guitar.", "Someone is playing an instrument.",
                     "The stock market fell sharply today."], normalize=True)
    sims = e @ e.T
    assert sims[0, 1] > 0.5 > sims[0, 2]

    import ember.interop.convert as convert

    monkeypatch.setattr(convert, "import_hf", lambda *a: pytest.fail("converted again"))
    again = ember.load(folder)
    assert again.path == model.path
    np.testing.assert_allclose(again.embed(texts[:2]), got[:2], atol=1e-6)
    # ember.embed takes the checkpoint folder as ember.load does (it said "not an ember run folder")
    np.testing.assert_allclose(ember.embed(folder, texts[:2]), got[:2], atol=1e-6)


def test_an_edited_sentence_transformers_pooling_converts_the_checkpoint_again(tmp_path):
    """The cache key hashed config.json, the tokenizer and the weights only: a copy of the real
    checkpoint with [CLS] pooling and 64-token inputs loaded as the mean-pooled 256-token original."""
    import json
    import shutil

    folder = real_data("checkpoints", "all-MiniLM-L6-v2")
    copy = tmp_path / "minilm-cls"
    shutil.copytree(folder, copy, ignore=shutil.ignore_patterns("model.safetensors"))
    (copy / "model.safetensors").symlink_to(folder / "model.safetensors")
    original = ember.load(copy)
    assert original.info["embedding"]["pooling"] == "mean" and original.info["max_length"] == 256
    pooling = json.loads((copy / "1_Pooling" / "config.json").read_text())
    pooling.update(pooling_mode_mean_tokens=False, pooling_mode_cls_token=True)
    (copy / "1_Pooling" / "config.json").write_text(json.dumps(pooling))
    (copy / "sentence_bert_config.json").write_text(json.dumps({"max_seq_length": 64, "do_lower_case": False}))
    edited = ember.load(copy)
    assert edited.path != original.path
    assert edited.info["embedding"]["pooling"] == "cls" and edited.info["max_length"] == 64


def test_backends_onnx_and_int8_answer_close_to_torch(runs, sst2_dev, monkeypatch, tmp_path):
    pytest.importorskip("onnxruntime")
    import tempfile

    texts = [ex.text_a for ex in sst2_dev[:20]]
    fp32 = [r["probabilities"]["positive"] for r in ember.load(runs["sst2"]).classify(texts)]
    (tmp_path / "tmp").mkdir()
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path / "tmp"))
    onnx = ember.load(runs["sst2"], backend="onnx")
    # the on-the-fly export is gone once the session holds it (a finalizer left it behind at exit)
    assert not list((tmp_path / "tmp").iterdir())
    assert onnx.backend == "onnx"
    assert [r["probabilities"]["positive"] for r in onnx.classify(texts)] == pytest.approx(fp32, abs=1e-4)
    int8 = [r["probabilities"]["positive"] for r in ember.load(runs["sst2"], backend="int8").classify(texts)]
    assert int8 == pytest.approx(fp32, abs=0.05) and int8 != fp32


def test_to_hf_and_export_write_folders_that_load_again(runs, sst2_dev, tmp_path):
    transformers = pytest.importorskip("transformers")
    pytest.importorskip("onnxruntime")
    model = ember.load(runs["sst2"])
    texts = [ex.text_a for ex in sst2_dev[:6]]
    hf = transformers.BertForSequenceClassification.from_pretrained(str(model.to_hf(tmp_path / "hf"))).eval()
    batch = transformers.AutoTokenizer.from_pretrained(str(tmp_path / "hf"))(texts, padding=True, return_tensors="pt")
    with torch.no_grad():
        probs = hf(**batch).logits.softmax(-1)[:, 1].numpy()
    assert probs == pytest.approx([r["probabilities"]["positive"] for r in model.classify(texts)], abs=1e-5)
    with pytest.raises(EmberError, match="already exists"):
        model.to_hf(tmp_path / "hf")
    report = model.export(tmp_path / "onnx", "onnx", limit=50)
    assert report["verification"]["max_abs_diff"] < 1e-3
    exported = ember.load(tmp_path / "onnx")
    assert exported.layout == "export" and exported.backend == "onnx"
    assert exported.classify(texts[0])["label"] == model.classify(texts[0])["label"]
    with pytest.raises(EmberError, match="is an `ember export` folder; convert to HF from the run folder"):
        exported.to_hf(tmp_path / "hf2")


def test_bad_input_gets_one_clear_message_each(runs, tmp_path):
    pd = pytest.importorskip("pandas")
    (tmp_path / "notes").mkdir()
    (tmp_path / "notes" / "readme.txt").write_text("hello")
    with pytest.raises(EmberError, match=r"none of the folders ember.load reads \(it holds readme.txt\)"):
        ember.load(tmp_path / "notes")
    with pytest.raises(EmberError, match="does not exist"):
        ember.load(tmp_path / "missing")
    with pytest.raises(EmberError, match="unknown backend 'gpu'"):
        ember.load(runs["sst2"], backend="gpu")
    model = ember.load(runs["sst2"])
    with pytest.raises(AttributeError, match="has no 'generate' method; it has: classify, embed"):
        model.generate("once upon a time")
    with pytest.raises(EmberError, match="is empty: pass at least one text"):
        model.classify([])
    with pytest.raises(EmberError, match="has no text column 'review'; its columns: sentence, label"):
        model.embed(pd.DataFrame({"sentence": ["a fine film"], "label": [1]}), column="review")
    with pytest.raises(EmberError, match="say which holds the texts"):
        model.embed(pd.DataFrame({"sentence": ["a fine film"], "label": [1]}))
    with pytest.raises(EmberError, match="item 1 is a int"):
        model.classify(["a fine film", 3])
    with pytest.raises(EmberError, match="'pooling' must be one of mean, cls, none"):
        model.embed("a fine film", pooling="max")
    with pytest.raises(EmberError, match=r"no \[MASK\] token"):
        ember.load(runs["mlm"]).fill_mask("no mask here")


def test_backend_and_batch_size_spelled_alike_by_load_and_embed(runs, sst2_dev):
    """One spelling per option across the API (issue 40): ember.load and ember.embed take the same
    backend names, both default to "torch", and refuse an unknown one (or the old "" default of
    ember.embed) with the same line; ember.load's rows per pass are batch_size= as in embed, and its
    old name max_batch= still works, with a DeprecationWarning."""
    texts = [ex.text_a for ex in sst2_dev[:3]]
    by_load = ember.load(runs["sst2"], backend="torch").embed(texts)
    by_embed = ember.embed(runs["sst2"], texts, backend="torch")
    # the same weights and backend; the two paths may group rows into other batches, whose
    # kernels round differently: equal to float tolerance, not bit for bit
    np.testing.assert_allclose(by_load, by_embed, atol=1e-5)
    for backend in ("", "gpu", None):
        for call in (lambda: ember.load(runs["sst2"], backend=backend),
                     lambda: ember.embed(runs["sst2"], texts, backend=backend)):
            with pytest.raises(EmberError, match=r"unknown backend .*; choose one of torch, int8, bf16, onnx"):
                call()
    assert ember.load(runs["sst2"], batch_size=2)._predictor.max_batch == 2
    with pytest.warns(DeprecationWarning, match=r"max_batch=\) is now batch_size="):
        assert ember.load(runs["sst2"], max_batch=3)._predictor.max_batch == 3
