"""XLNet fine-tuning (Yang et al. 2019): XLNet's input layout ``A <sep> B <sep> <cls>`` on every
task, left-padded classification batches read at the last token, SQuAD's no-answer position
at the final <cls>, learning on real SST-2, and the fine-tuned runs' inference methods,
exports and experiments (`ember glue`, `ember compare`)."""

from __future__ import annotations

import dataclasses
import json

import numpy as np
import pytest
import torch

from conftest import TINY_MODEL, make_wordpiece, real_data
from xlnet_xlm_helpers import sst2_wordpiece, task_run, xlnet_pretraining_run

from ember.cli import main
from ember.config import model_preset
from ember.models import build_backbone
from ember.tasks.base import get_adapter
from ember.tasks.families.xlnet import PAD_TYPE_ID, XLNetAdapter, XLNetClassifier, xlnet_template
from ember.runs.folder import load_run_config
from ember.tokenizers import load_tokenizer

XLNET = dataclasses.replace(model_preset("xlnet-mini"), vocab_size=100, hidden_size=32, num_layers=2, num_heads=2,
                            intermediate_size=64, max_position=64, mem_len=16, bi_data=True)


@pytest.fixture(scope="module")
def wordpiece(tmp_path_factory):
    return sst2_wordpiece(tmp_path_factory.mktemp("xlnet-tok"))


def test_xlnet_template_puts_cls_last_with_segment_types_0_1_2():
    tok = make_wordpiece(["a", "good", "film", "the", "movie"])  # BERT's [CLS] A [SEP] template
    xl = xlnet_template(tok)
    single, pair = xl.encode("a good film"), xl.encode("a good film", "the movie")
    assert single.tokens == ["a", "good", "film", "[SEP]", "[CLS]"] and single.type_ids == [0, 0, 0, 0, 2]
    assert pair.tokens == ["a", "good", "film", "[SEP]", "the", "movie", "[SEP]", "[CLS]"]
    assert pair.type_ids == [0, 0, 0, 0, 1, 1, 1, 2]
    assert xlnet_template(xl).to_str() == xl.to_str()  # idempotent: a fine-tuned run's tokenizer as is
    assert tok.encode("a good film").tokens[0] == "[CLS]"  # the caller's tokenizer is left alone


def test_xlnet_template_keeps_byte_level_offsets_trimmed(tmp_path):
    """A byte-level BPE's offsets keep excluding the leading space, so SQuAD spans map back."""
    from ember.tokenizers import train_tokenizer

    text = tmp_path / "t.txt"
    text.write_text("the cat sat on the mat . a dog ran in the park .\n" * 5)
    bpe = xlnet_template(train_tokenizer([text], kind="bpe", vocab_size=300, lowercase=False, progress=False,
                                         fmt="lines"))
    context = "the cat sat on the mat"
    enc = bpe.encode("where is the cat", context)
    words = [context[s:e] for (s, e), q in zip(enc.offsets, enc.sequence_ids) if q == 1]
    assert all(not w.startswith(" ") for w in words) and "".join(words) == context.replace(" ", "")
    assert enc.tokens[-2:] == ["</s>", "<s>"] and enc.type_ids[-1] == 2  # RoBERTa-style sep / cls


def test_xlnet_real_rte_pairs_are_laid_out_and_left_padded(wordpiece):
    real_data("glue", "RTE", "dev.tsv")
    tok = load_tokenizer(wordpiece)
    adapter = get_adapter("rte", XLNET)
    assert isinstance(adapter, XLNetAdapter) and adapter.display_name == "RTE" and adapter.main_metric == "accuracy"
    fit = adapter.model_config(XLNET)  # the task backbone: no memory, reads each text once
    assert (fit.mem_len, fit.reuse_len, fit.bi_data) == (0, 0, False)
    examples, features = adapter.load("dev", tok, 256, limit=8)  # none cut: rows of their own lengths
    sep, cls = tok.token_to_id("[SEP]"), tok.token_to_id("[CLS]")
    for ex, f in zip(examples, features):
        ids, types = f["input_ids"], f["token_type_ids"]
        assert ids[-1] == cls and types[-1] == 2 and ids.count(sep) == 2 and cls not in ids[:-1]
        first_sep = ids.index(sep)
        assert set(types[: first_sep + 1]) == {0} and set(types[first_sep + 1 : -1]) == {1}
        a = tok.encode(ex.text_a, add_special_tokens=False).ids
        assert ids[:first_sep] == a[:first_sep]  # A's own tokens (cut, if at all, from its end)
    module = adapter.build_module(build_backbone(dataclasses.replace(fit, vocab_size=tok.get_vocab_size())), 0)
    assert isinstance(module, XLNetClassifier)
    batch = module.make_batch(features)
    lengths = [len(f["input_ids"]) for f in features]
    row = int(np.argmin(lengths))
    pad = batch["input_ids"].shape[1] - lengths[row]
    assert pad > 0 and batch["attention_mask"][row, :pad].sum() == 0 and batch["attention_mask"][row, pad:].all()
    assert (batch["token_type_ids"][row, :pad] == PAD_TYPE_ID).all()
    assert (batch["input_ids"][:, -1] == cls).all()  # every row ends with its <cls>


def test_xlnet_squad2_windows_answer_with_the_final_cls(wordpiece):
    """``q <sep> c <sep> <cls>``: no [CLS] before the question, so the no-answer target (and
    s_null) is the last position of each window; answers still cover their characters."""
    real_data("squad2-dev-half", "dev-v2.0.json")
    tok = load_tokenizer(wordpiece)
    examples, features = get_adapter("squad2", XLNET).load("dev", tok, 128, limit=40)
    sep, cls = tok.token_to_id("[SEP]"), tok.token_to_id("[CLS]")
    answered = 0
    for f in features:
        ids, types = f["input_ids"], f["token_type_ids"]
        assert ids[-2:] == [sep, cls] and f["cls_index"] == len(ids) - 1
        q_end = ids.index(sep)
        assert set(types[: q_end + 1]) == {0} and set(types[q_end + 1 : -1]) == {1} and types[-1] == 2
        ex = examples[f["example_index"]]
        if f["start_position"] == f["cls_index"]:
            assert f["end_position"] == f["cls_index"]
            continue
        answered += 1
        text, start = ex.answers[0]
        s, e = f["offsets"][f["start_position"]], f["offsets"][f["end_position"]]
        assert s[0] <= start and e[1] >= start + len(text)  # the labelled span covers the answer
    assert answered > 5


def test_xlnet_finetunes_on_real_sst2_and_learns(wordpiece, tmp_path):
    """A tiny random XLNet, 250 steps on 1,000 real SST-2 sentences: well above the majority
    class (50.9% of dev), and its training loss falls."""
    import ember
    from ember.train.logging import MetricsLogger

    real_data("glue", "SST-2", "dev.tsv")
    pre = xlnet_pretraining_run(tmp_path, wordpiece)
    result = ember.finetune("sst2", tmp_path / "sst2", init=str(pre), train_limit=1000, epochs=4, batch_size=16,
                            lr=2e-3, max_length=64, progress=False)
    assert result.metrics["accuracy"] > 0.58
    losses = [r["loss"] for r in MetricsLogger.read(tmp_path / "sst2" / "metrics.jsonl") if r["split"] == "train"]
    assert np.mean(losses[-3:]) < 0.8 * np.mean(losses[:3])
    kept = load_tokenizer(tmp_path / "sst2" / "tokenizer.json")  # the run reads texts as it was trained
    assert kept.encode("a fine film").tokens[-2:] == ["[SEP]", "[CLS]"]
    # `ember predict` reads a file through the same XLNet inputs: its predictions on 200 dev
    # sentences score what `ember.evaluate` reports on that file
    from ember.tasks.readers.glue import read_examples

    dev = read_examples("sst2", "dev")[:200]
    tsv = tmp_path / "in.tsv"
    tsv.write_text("sentence\tlabel\n" + "".join(f"{ex.text_a}\t{ex.label}\n" for ex in dev))
    assert main(["predict", str(tmp_path / "sst2"), "--input", str(tsv), "--out", str(tmp_path / "p.jsonl")]) == 0
    rows = [json.loads(line) for line in (tmp_path / "p.jsonl").read_text().splitlines()]
    names = ["negative", "positive"]
    accuracy = np.mean([r["prediction"] == names[ex.label] for r, ex in zip(rows, dev, strict=True)])
    assert accuracy == pytest.approx(ember.evaluate(tmp_path / "sst2", file=tsv)["metrics"]["accuracy"])


@pytest.mark.slow  # ~30 CPU s: scoring CoNLL dev + test and the SQuAD dev windows
def test_xlnet_conll_and_squad2_finetune_through_the_encoders_token_heads(wordpiece, tmp_path):
    import ember

    real_data("conll2003", "train.txt")
    real_data("squad2-dev-half", "dev-v2.0.json")
    pre = xlnet_pretraining_run(tmp_path, wordpiece)
    ner = ember.finetune("conll2003", tmp_path / "ner", init=str(pre), train_limit=32, epochs=1, batch_size=16,
                         lr=2e-3, max_length=64, progress=False)
    assert {"precision", "recall", "f1"} <= set(ner.metrics) and "test" in ner.runs[0]["other_splits"]
    # windows of 192 tokens from a model pre-trained on 128-token segments: XLNet's relative
    # positions have no table to outgrow, so fine-tuning is not held to the segment length
    qa = ember.finetune("squad2", tmp_path / "qa", init=str(pre), train_limit=24, epochs=1, batch_size=16, lr=2e-3,
                        max_length=192, progress=False)
    assert {"exact", "f1", "tuned_f1"} <= set(qa.metrics)
    assert load_run_config(pre).model.max_position == 128 and load_run_config(tmp_path / "qa").model.max_position == 512
    # --train-limit counts questions; the windows they were cut into are reported beside them
    assert qa.runs[0]["train_examples"] == 24 and qa.runs[0]["train_windows"] > 24
    again = ember.evaluate(tmp_path / "qa")  # with the no-answer threshold tuned on dev
    assert again["metrics"]["f1"] == pytest.approx(qa.metrics["f1"], abs=1e-9)


def _predict(run, method: str, data: dict, backend: str = ""):
    from ember.serve.predictor import load_predictor
    from ember.tasks.inference.requests import Limits

    predictor = load_predictor(run, backend)
    return predictor, predictor.run(method, [predictor.parse(method, data, Limits())])[0]


def test_xlnet_runs_serve_classify_tag_answer_and_embed_as_they_evaluate(wordpiece, tmp_path):
    """The server pads on the right and reads the tokenizer the run keeps; its answers equal the
    task module's on XLNet's own left-padded batch."""
    from ember.serve.graph import describe, load_module

    real_data("glue", "SST-2", "dev.tsv")
    run = task_run(tmp_path, "sst2", wordpiece)
    predictor, got = _predict(run, "classify", {"texts": ["a fine , moving film", "dull"]})
    assert predictor.endpoints == ["/classify", "/embed"]
    info, tok = describe(run)
    module = load_module(run, info)
    features = [{"input_ids": e.ids, "token_type_ids": e.type_ids}
                for e in (tok.encode("a fine , moving film"), tok.encode("dull"))]
    with torch.no_grad():
        probs = torch.softmax(module.logits(module.make_batch(features)), -1)
    for result, p in zip(got["results"], probs):
        assert [result["probabilities"][n] for n in ("negative", "positive")] == pytest.approx(p.tolist(), abs=1e-5)

    tagged = _predict(task_run(tmp_path, "conll2003", wordpiece), "tag",
                      {"text": "EU rejects German call to boycott British lamb ."})[1]
    assert len(tagged["results"][0]["tags"]) == 9
    context = "The Normans were the people who in the 10th and 11th centuries gave their name to Normandy."
    answer = _predict(task_run(tmp_path, "squad2", wordpiece), "answer",
                      {"question": "Who gave their name to Normandy?", "context": context})[1]
    assert answer["best_span"] in context.lower() or answer["best_span"] in context
    embedded = _predict(run, "embed", {"text": "a fine film", "pooling": "mean"})[1]
    assert len(embedded["results"][0]["embedding"]) == 64


def test_xlnet_runs_export_to_onnx_int8_and_hf_and_agree_on_real_inputs(wordpiece, tmp_path):
    """ONNX (dynamic batch and length), int8, and the transformers classes (fed left-padded
    rows, as XLNet's exported tokenizer pads) against the PyTorch original."""
    pytest.importorskip("onnxruntime")
    pytest.importorskip("transformers")
    from ember.serve.export import export_run

    real_data("glue", "SST-2", "dev.tsv")
    run = task_run(tmp_path, "sst2", wordpiece)
    onnx = export_run(run, "onnx", tmp_path / "onnx", limit=200)["verification"]
    assert onnx["max_abs_diff"] < 1e-4 and onnx["prediction_agreement"] == 1.0
    int8 = export_run(run, "int8", tmp_path / "int8", limit=200)["verification"]
    assert int8["prediction_agreement"] >= 0.95
    for task, limit in (("sst2", 100), ("conll2003", 50), ("squad2", 10)):
        where = run if task == "sst2" else task_run(tmp_path, task, wordpiece)
        hf = export_run(where, "hf", tmp_path / f"hf-{task}", limit=limit)["verification"]
        assert hf["max_abs_diff"] < 1e-4, task
        # with every logit within 1e-4, a differing prediction can only be a near-tie flipped by
        # float rounding: this few-step QA model's start/end logits are nearly flat over a window
        # (one of 164 flipped in one CI run at a 7.6e-6 difference), its classifiers' are not
        assert hf["prediction_agreement"] >= (0.98 if task == "squad2" else 1.0), task


def test_xlnet_permutation_lm_run_serves_embed_only(wordpiece, tmp_path):
    from ember.serve.graph import describe

    pre = xlnet_pretraining_run(tmp_path, wordpiece)
    assert describe(pre)[0].kind == "embed"
    predictor, got = _predict(pre, "embed", {"texts": ["a fine film", "a dull one"], "pooling": "mean"})
    assert predictor.endpoints == ["/embed"] and len(got["results"]) == 2


def test_ember_glue_accepts_an_xlnet_run(wordpiece, tmp_path):
    real_data("glue", "RTE", "train.tsv")
    pre = xlnet_pretraining_run(tmp_path, wordpiece)
    out = tmp_path / "glue"
    assert main(["glue", str(pre), "--out", str(out), "--tasks", "rte", "--seeds", "1", "--train-limit", "32",
                 "--epochs", "1", "--max-length", "48", "--no-progress"]) == 0
    result = json.loads((out / "runs" / "rte-seed1" / "results.json").read_text())
    assert result["task"] == "RTE" and 0.0 <= result["metrics"]["accuracy"] <= 1.0
    assert "RTE" in (out / "glue.md").read_text()


def test_ember_compare_pretrains_and_finetunes_an_xlnet_recipe_beside_bert(wiki_prepared, tmp_path):
    real_data("glue", "SST-2")
    out = tmp_path / "compare"
    argv = ["compare", "xlnet-mini", "bert-mini", "--data", str(wiki_prepared), "--budget", "3s", "--tasks", "sst2",
            "--seeds", "1", "--train-limit", "64", "--finetune-epochs", "1", "--max-length", "48",
            "--probe-steps", "2", "--out", str(out), "--no-progress"]
    for item in TINY_MODEL + ["train.num_threads=1", "model.mem_len=16"]:
        argv += ["--set", item]
    threads = torch.get_num_threads()
    try:
        assert main(argv) == 0
    finally:
        torch.set_num_threads(threads)
    results = json.loads((out / "results.json").read_text())
    assert [m["label"] for m in results["models"]] == ["xlnet-mini", "bert-mini"]
    pretrained = json.loads((out / "runs" / "xlnet-mini" / "pretrain.json").read_text())
    assert pretrained["objective"] == "plm" and pretrained["steps"] >= 1
    ft = json.loads((out / "runs" / "xlnet-mini" / "sst2-seed1" / "results.json").read_text())
    assert 0.0 <= ft["metrics"]["accuracy"] <= 1.0
