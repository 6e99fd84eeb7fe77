"""Fine-tuning XLM (Lample & Conneau 2019) with a language id per token, and the zero-shot
cross-lingual evaluation: an SST-2 head scored on Russian posts (``rusentiment-binary``) with
Russian ids. Also the generic pieces: ``collate`` padding extra per-token inputs, the heads
passing them to the backbone, and evaluating a run on another task with the same labels."""

from __future__ import annotations

import dataclasses
import json

import numpy as np
import pytest
import torch

from conftest import real_data
from xlnet_xlm_helpers import en_ru_bpe, finetune_args, task_run, xlm_pretraining_run

from ember.cli import main
from ember.config import model_preset
from ember.errors import EmberError
from ember.models import build_backbone
from ember.tasks.base import get_adapter
from ember.tasks.featurize import collate
from ember.tokenizers import load_tokenizer

XLM = dataclasses.replace(model_preset("xlm-mini"), vocab_size=120, hidden_size=32, num_layers=2, num_heads=2,
                          intermediate_size=64, max_position=64, num_languages=2, languages="en,ru")


def test_collate_pads_language_ids_like_segments_and_pads_left_on_request():
    features = [{"input_ids": [5, 6, 7], "token_type_ids": [0, 0, 1], "language_ids": [1, 1, 1], "label": 0},
                {"input_ids": [8], "token_type_ids": [0], "language_ids": [1], "label": 1}]
    right = collate(features, pad_id=9)
    assert right["language_ids"].tolist() == [[1, 1, 1], [1, 0, 0]]
    assert right["input_ids"].tolist() == [[5, 6, 7], [8, 9, 9]]
    left = collate(features, pad_id=9, left=True, pad_type_id=3)
    assert left["input_ids"].tolist() == [[5, 6, 7], [9, 9, 8]]
    assert left["attention_mask"].tolist() == [[1, 1, 1], [0, 0, 1]]
    assert left["token_type_ids"].tolist() == [[0, 0, 1], [3, 3, 0]]
    assert left["language_ids"].tolist() == [[1, 1, 1], [0, 0, 1]]
    assert "language_ids" not in collate([{"input_ids": [5], "token_type_ids": [0]}], pad_id=9)
    with pytest.raises(ValueError, match="language_ids"):
        collate([features[0], {"input_ids": [8], "token_type_ids": [0], "label": 1}], pad_id=9)


@pytest.fixture(scope="module")
def bpe(tmp_path_factory):
    return en_ru_bpe(tmp_path_factory.mktemp("xlm-tok"))


def test_xlm_features_carry_each_tasks_language(bpe):
    real_data("rusentiment", "rusentiment_test.csv")
    tok = load_tokenizer(bpe)
    model = dataclasses.replace(XLM, vocab_size=tok.get_vocab_size())
    _, en = get_adapter("sst2", model).load("dev", tok, 64, limit=4)
    _, ru = get_adapter("rusentiment-binary", model).load("test", tok, 64, limit=4)
    _, forced = get_adapter("sst2", model, language="ru").load("dev", tok, 64, limit=4)
    for features, language in ((en, 0), (ru, 1), (forced, 1)):
        assert all(f["language_ids"] == [language] * len(f["input_ids"]) for f in features)
    with pytest.raises(EmberError, match=r"NSMC is in language 'ko'.*\(en, ru\)"):
        get_adapter("nsmc", model)
    with pytest.raises(EmberError, match=r"^task.language='de': .*\(en, ru\)"):  # the user's own
        get_adapter("sst2", model, language="de")
    _, plain = get_adapter("sst2", model_preset("bert-mini")).load("dev", tok, 64, limit=2)
    assert "language_ids" not in plain[0]  # a model without language embeddings gets none


def test_xlm_heads_pass_language_ids_and_default_to_the_task_language():
    """Every head hands ``language_ids`` to the backbone; a call without them (a served row)
    reads as the task's language, never as no language; the weights' names stay HF-mappable."""
    from ember.tasks.families.feature_transfer import FeatureBackbone

    g = torch.Generator().manual_seed(0)
    ids = torch.randint(5, 120, (2, 9), generator=g)
    rows = [{"input_ids": r.tolist(), "token_type_ids": [0] * 9} for r in ids]
    # the head alone on the backbone's states: what each module must compute from Russian ids
    by_hand = {"sst2": lambda m, h: m.classifier(h[:, 0]), "conll2003": lambda m, h: m.classifier(h),
               "squad2": lambda m, h: m.qa_outputs(h).permute(2, 0, 1)}  # (2, B, T): start, end
    for task, head in by_hand.items():
        torch.manual_seed(1)
        module = get_adapter(task, XLM).build_module(build_backbone(XLM), 2).eval()
        assert all(not k.startswith("backbone.backbone") for k in module.state_dict())
        en, ru = (module.make_batch([{**r, "language_ids": [i] * 9} for r in rows]) for i in (0, 1))
        with torch.no_grad():
            out_en, out_ru, out_none = (_stacked(module.logits(b)) for b in (en, ru, module.make_batch(rows)))
            hidden = module.backbone(ids, torch.ones_like(ids), language_ids=torch.ones_like(ids)).last_hidden_state
            torch.testing.assert_close(out_ru, head(module, hidden), atol=1e-5, rtol=0)  # the ids reach the backbone
        torch.testing.assert_close(out_none, out_en, atol=0, rtol=0)  # no ids: the task's language (en)
        assert (out_en - out_ru).abs().max() > 1e-4  # and the language changes the outputs
    features = FeatureBackbone(build_backbone(XLM)).eval()
    with torch.no_grad():
        a = features(ids, language_ids=torch.zeros_like(ids)).last_hidden_state
        b = features(ids, language_ids=torch.ones_like(ids)).last_hidden_state
    assert (a - b).abs().max() > 1e-4  # feature-based transfer passes the ids on too


def _stacked(logits):
    return torch.stack(logits) if isinstance(logits, tuple) else logits  # SQuAD: (start, end)


def test_rusentiment_binary_reads_positive_and_negative_posts_with_sst2_labels(tmp_path):
    from ember.tasks.sentiment import read_file, read_split

    real_data("rusentiment", "rusentiment_test.csv")
    adapter = get_adapter("rusentiment-binary")
    assert adapter.label_names() == get_adapter("sst2").label_names() == ["negative", "positive"]
    assert adapter.language == "ru" and adapter.main_metric == "accuracy"
    test = read_split("rusentimentbinary", "test")
    assert len(test) == 794 and sum(ex.label == 0 for ex in test) == 258  # 536 positive
    dev = {ex.text_a for ex in read_split("rusentimentbinary", "dev")}
    five = {ex.text_a for ex in read_split("rusentiment", "dev") if ex.label in (0, 1)}  # positive, negative
    assert dev == five  # carved as rusentiment's dev, the same posts
    assert not dev & {ex.text_a for ex in read_split("rusentimentbinary", "train", limit=3000)}
    bad = tmp_path / "bad.csv"
    bad.write_text('label,text\nneutral,"ok"\npositive,"хорошо"\nangry,"плохо"\n', encoding="utf-8")
    with pytest.raises(EmberError, match=r"bad.csv:4: label 'angry'"):
        read_file(bad, "rusentimentbinary")
    bad.write_text('label,text\nneutral,"ok"\npositive,"хорошо"\n', encoding="utf-8")
    assert [ex.label for ex in read_file(bad, "rusentimentbinary")] == [1]  # neutral left out
    assert len(read_file(bad, "rusentimentbinary", require_label=False)) == 2  # ember predict reads all


@pytest.fixture(scope="module")
def sst2_xlm_run(bpe, tmp_path_factory):
    """A tiny random XLM fine-tuned briefly on real English SST-2 (with English ids)."""
    real_data("glue", "SST-2", "dev.tsv")
    root = tmp_path_factory.mktemp("xlm-sst2")
    pre = xlm_pretraining_run(root, bpe)
    assert main(finetune_args("sst2", pre, root / "sst2", "--train-limit", "64", "--epochs", "1")) == 0
    return root / "sst2"


def test_xlm_sst2_run_evaluates_zero_shot_on_russian_with_russian_ids(sst2_xlm_run, capsys):
    from ember.runs.folder import load_run_config
    from ember.tasks.metrics.classification import METRICS
    from ember.tasks.task_model import load_run_adapter, load_task_module

    real_data("rusentiment", "rusentiment_test.csv")
    run = sst2_xlm_run
    capsys.readouterr()
    assert main(["evaluate", str(run), "--task", "rusentiment-binary", "--split", "test"]) == 0
    result = json.loads(capsys.readouterr().out)  # the JSON result alone (notes go to stderr)
    assert result["task"] == "RuSentiment pos/neg" and set(result["metrics"]) == {"accuracy", "f1_macro"}

    cfg = load_run_config(run)
    adapter = load_run_adapter(run, cfg, "rusentiment-binary")
    assert adapter.language_id == 1 and load_run_adapter(run, cfg).language_id == 0
    tok = load_tokenizer(run / "tokenizer.json")
    module = load_task_module(run, cfg, adapter, cfg.model.pad_token_id)
    _, features = adapter.load("test", tok, cfg.task.max_length)
    labels = np.asarray([f["label"] for f in features])
    preds = module.predict(features).argmax(-1)
    assert result["metrics"]["accuracy"] == pytest.approx(METRICS["accuracy"](preds, labels))
    english = module.predict([{**f, "language_ids": [0] * len(f["input_ids"])} for f in features])
    assert np.abs(english - module.predict(features)).max() > 1e-4  # Russian ids, not English ones


def test_xlm_task_language_override_is_kept_with_the_run(sst2_xlm_run, bpe, tmp_path):
    import ember
    from ember.runs.folder import load_run_config
    from ember.tasks.task_model import load_run_adapter

    pre = xlm_pretraining_run(tmp_path, bpe)
    ember.finetune("sst2", tmp_path / "ru", init=str(pre), train_limit=16, epochs=1, batch_size=16, max_length=32,
                   overrides=["task.language=ru"], progress=False)
    cfg = load_run_config(tmp_path / "ru")
    assert cfg.task.language == "ru" and load_run_adapter(tmp_path / "ru", cfg).language_id == 1
    with pytest.raises(EmberError, match="language 'de'"):
        ember.finetune("sst2", tmp_path / "de", init=str(pre), train_limit=16, epochs=1, overrides=["task.language=de"],
                       progress=False)


def test_evaluating_a_run_on_a_task_with_other_labels_is_refused(sst2_xlm_run):
    import ember

    real_data("glue", "RTE", "dev.tsv")
    with pytest.raises(EmberError, match=r"output labels \['negative', 'positive'\].*RTE has labels"):
        ember.evaluate(sst2_xlm_run, task="rte")


def test_xlm_run_serves_and_exports_in_its_task_language(bpe, tmp_path):
    """Served rows carry token ids only: the run's task language is added (so /classify equals
    the module with English ids); ONNX traces it; the HF export gets it as ``langs``."""
    pytest.importorskip("onnxruntime")
    pytest.importorskip("transformers")
    from ember.serve.export import export_run
    from ember.serve.graph import describe, load_module
    from ember.serve.predictor import load_predictor
    from ember.tasks.inference.requests import Limits

    real_data("glue", "SST-2", "dev.tsv")
    run = task_run(tmp_path, "sst2", bpe, preset="xlm-mini", num_languages=2, languages="en,ru")
    predictor = load_predictor(run)
    got = predictor.run("classify", [predictor.parse("classify", {"text": "a fine film"}, Limits())])[0]
    info, tok = describe(run)
    module = load_module(run, info)
    enc = tok.encode("a fine film")
    batch = collate([{"input_ids": enc.ids, "token_type_ids": enc.type_ids, "language_ids": [0] * len(enc.ids)}],
                    info.pad_id)
    with torch.no_grad():
        probs = torch.softmax(module.logits(batch), -1)[0]
    assert [got["results"][0]["probabilities"][n] for n in ("negative", "positive")] == pytest.approx(
        probs.tolist(), abs=1e-5)
    for fmt in ("onnx", "hf"):
        v = export_run(run, fmt, tmp_path / fmt, limit=100)["verification"]
        assert v["max_abs_diff"] < 1e-4 and v["prediction_agreement"] == 1.0, fmt
