"""Fine-tuning Dai & Le's LSTM as a classifier: the last-state and linear-gain read-outs by hand,
learning real NSMC reviews from a pre-trained run, the CLI path (finetune, evaluate, predict,
serve's classify, int8 export), and one clear refusal for each Transformer-only use."""

from __future__ import annotations

import dataclasses
import json

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from conftest import real_data
from lstm_helpers import pretrained_lm, tiny_lstm_config


def _classifier(pooling: str, num_labels: int = 2):
    from ember.models import build_backbone
    from ember.tasks.families.lstm import LstmClassifier

    torch.manual_seed(0)
    module = LstmClassifier(build_backbone(tiny_lstm_config()), num_labels, pad_id=0, pooling=pooling)
    with torch.no_grad():
        module.classifier.weight.normal_(0.0, 1.0)  # off its near-zero init: predictions that differ
    return module.eval()


FEATURES = [{"input_ids": [1, 3, 4, 5, 2], "token_type_ids": [0] * 5, "label": 1},
            {"input_ids": [1, 6, 2], "token_type_ids": [0] * 3, "label": 0}]


def test_linear_gain_weights_rise_linearly_to_the_last_token_and_sum_to_one():
    from ember.nn.pooling import linear_gain_weights

    weights = linear_gain_weights(torch.tensor([[1, 1, 1, 0], [1, 0, 0, 0]]))
    torch.testing.assert_close(weights, torch.tensor([[1 / 6, 2 / 6, 3 / 6, 0.0], [1.0, 0.0, 0.0, 0.0]]))


def test_lstm_classifier_reads_the_last_state_whatever_the_padding():
    from ember.tasks.featurize import collate

    module = _classifier("last")
    batch = collate(FEATURES, pad_id=0)
    with torch.no_grad():
        together = module.logits(batch)
        alone = module.logits(collate(FEATURES[1:], pad_id=0))
        out = module.backbone(batch["input_ids"], batch["attention_mask"])
        at_last_token = out.last_hidden_state[torch.arange(2), torch.tensor([4, 2])]  # (B, H)
    torch.testing.assert_close(together[1:], alone, atol=1e-6, rtol=0)
    torch.testing.assert_close(together, module.classifier(at_last_token), atol=1e-6, rtol=0)


def test_lstm_linear_gain_loss_and_prediction_by_hand():
    """Loss = mean over rows of sum_t (t/n) CE(z_t, y) / sum_t (t/n); prediction sum_t w_t log p_t."""
    from ember.tasks.featurize import collate

    module = _classifier("linear_gain")
    batch = collate(FEATURES, pad_id=0)
    with torch.no_grad():
        loss, metrics = module(batch)
        logits = module.logits(batch)
        hidden = module.backbone(batch["input_ids"], batch["attention_mask"]).last_hidden_state
        losses, pooled = [], []
        for row, f in enumerate(FEATURES):
            n = len(f["input_ids"])
            steps = module.classifier(hidden[row, :n])  # (n, C): a prediction at every token
            w = torch.arange(1, n + 1, dtype=torch.float32) / sum(range(1, n + 1))
            losses.append(sum(w[t] * F.cross_entropy(steps[t], torch.tensor(f["label"])) for t in range(n)))
            pooled.append(sum(w[t] * steps[t].log_softmax(-1) for t in range(n)))
    torch.testing.assert_close(loss, torch.stack(losses).mean(), atol=1e-6, rtol=0)
    torch.testing.assert_close(logits, torch.stack(pooled), atol=1e-6, rtol=0)
    assert metrics["accuracy"] == (int((logits.argmax(-1) == batch["labels"]).sum()), 2)
    last = _classifier("last")  # same weights, another read-out, another answer
    assert not torch.allclose(last.logits(batch), logits, atol=1e-3)


def test_lstm_finetuning_from_a_pretrained_run_learns_real_nsmc_reviews(tmp_path_factory):
    """A tiny LSTM LM pre-trained on unlabeled NSMC reviews, fine-tuned by ember's Trainer on
    1,000 labelled training reviews for 6 epochs: held-out accuracy on 500 test reviews climbs from chance."""
    from ember.config import RunConfig, TrainConfig
    from ember.data.in_memory import InMemoryData
    from ember.runs.init import load_init
    from ember.tasks.base import get_adapter
    from ember.tasks.task_model import build_task_module, pad_token_id
    from ember.tokenizers import load_tokenizer
    from ember.train.loop import Trainer

    root = tmp_path_factory.mktemp("lstm")
    init = load_init(pretrained_lm(root))
    tok = load_tokenizer(init.tokenizer)
    adapter = get_adapter("nsmc", init.model)
    _, train = adapter.load("train", tok, 64, limit=1000)
    _, held = adapter.load("test", tok, 64, limit=500)
    train_cfg = TrainConfig(lr=5e-3, batch_size=32, max_steps=6 * 32, schedule="constant", warmup_steps=1,
                            eval_every=0, save_every=0, log_every=32, num_threads=1)
    module = build_task_module(RunConfig(kind="finetune", model=init.model, train=train_cfg), adapter, init.state,
                               pad_token_id(tok))
    torch.testing.assert_close(module.backbone.embeddings.weight, init.state["embeddings.weight"])  # the run's LSTM
    gold = np.array([f["label"] for f in held])
    before = float((module.predict(held).argmax(-1) == gold).mean())
    Trainer(module, InMemoryData(train), train_cfg, root / "ft", progress=False).train()
    after = float((module.predict(held).argmax(-1) == gold).mean())
    assert before < 0.56 and after > 0.64, (before, after)  # seeds 0-2 at these settings: 0.68-0.72


def test_lstm_run_refuses_tagging_and_question_answering_with_one_message():
    from ember.api.finetune import finetune_config
    from ember.errors import EmberError

    model = tiny_lstm_config()
    for task in ("conll2003", "squad2"):
        with pytest.raises(EmberError, match="per-token task.*needs a Transformer encoder.*model family lstm"):
            finetune_config(task, model)
    cfg = finetune_config("sst2", model)
    assert cfg.train.lr == 1e-3  # the LSTM's fine-tuning default, not BERT's 2e-5


# -- the CLI path on a tiny random "pre-trained" LSTM run with an SST-2 tokenizer -----------------

@pytest.fixture(scope="module")
def lstm_run(tmp_path_factory):
    """An LSTM LM pre-training run folder (random weights) whose WordPiece is trained on real SST-2."""
    from ember.config import DataConfig, RunConfig
    from ember.models import build_backbone
    from ember.objectives.dai_le import LstmLanguageModel
    from ember.runs.checkpoint import save_weights
    from ember.runs.folder import write_run_files
    from ember.tokenizers import train_tokenizer

    root = tmp_path_factory.mktemp("lstm-sst2")
    rows = real_data("glue", "SST-2", "train.tsv").read_text(encoding="utf-8").splitlines()[1:3001]
    (root / "sst2.txt").write_text("\n".join(r.split("\t")[0] for r in rows), encoding="utf-8")
    train_tokenizer([root / "sst2.txt"], vocab_size=1000, progress=False).save(str(root / "tokenizer.json"))
    model = dataclasses.replace(tiny_lstm_config(layers=1, vocab=1000), embedding_size=16, hidden_size=32)
    run = root / "lm"
    write_run_files(run, RunConfig(objective="lstm_lm", model=model, data=DataConfig(max_seq_length=64)),
                    root / "tokenizer.json")
    torch.manual_seed(0)
    save_weights(LstmLanguageModel(build_backbone(model), [2], [3], 0).state_dict(), run / "model.safetensors")
    return run


def test_lstm_finetune_evaluate_predict_serve_and_export_sst2_from_the_cli(lstm_run, tmp_path):
    from ember.cli import main
    from ember.runs.folder import load_run_config
    from ember.serve.predictor import load_predictor
    from ember.tasks.featurize import encode_examples
    from ember.tasks.readers.glue import Example
    from ember.tasks.task_model import evaluate_run, load_run_adapter, load_task_module
    from ember.tokenizers import load_tokenizer

    out = tmp_path / "sst2"
    assert main(["finetune", "--task", "sst2", "--init", str(lstm_run), "--out", str(out), "--epochs", "1",
                 "--train-limit", "256", "--batch-size", "16", "--max-length", "64", "--lr", "3e-3",
                 "--set", "model.lstm_pooling=linear_gain", "--set", "model.embedding_dropout=0.2",
                 "--no-progress"]) == 0
    saved = json.loads((out / "results.json").read_text())
    assert 0.0 <= saved["metrics"]["accuracy"] <= 1.0
    assert "lstm_pooling: linear_gain" in (out / "config.yaml").read_text()
    assert main(["evaluate", str(out)]) == 0
    tsv = tmp_path / "in.tsv"
    tsv.write_text("sentence\tlabel\na gorgeous , witty film\t1\ndull and lifeless\t0\n", encoding="utf-8")
    assert main(["predict", str(out), "--input", str(tsv), "--out", str(tmp_path / "out.tsv")]) == 0
    assert len((tmp_path / "out.tsv").read_text().splitlines()) == 3

    predictor = load_predictor(out)  # serving: the GLUE adapter's classify on the LSTM's graph
    assert predictor.endpoints[0] == "/classify"
    (served,) = predictor.run("classify", [{"texts": ["a gorgeous , witty film", "dull and lifeless"]}])
    cfg = load_run_config(out)
    module = load_task_module(out, cfg, load_run_adapter(out, cfg), 0)  # the evaluation path's model
    examples = [Example("a", "a gorgeous , witty film", None, 1), Example("b", "dull and lifeless", None, 0)]
    feats, _ = encode_examples(examples, load_tokenizer(out / "tokenizer.json"), 64)
    probs = torch.tensor(module.predict(feats)).softmax(-1)
    for row, result in zip(probs, served["results"]):
        assert result["probabilities"]["positive"] == pytest.approx(float(row[1]), abs=1e-5)
    assert evaluate_run(out)["metrics"]["accuracy"] == pytest.approx(saved["metrics"]["accuracy"])

    assert main(["export", str(out), "--format", "int8", "--out", str(tmp_path / "int8"), "--limit", "64"]) == 0
    assert main(["export", str(out), "--format", "onnx", "--out", str(tmp_path / "onnx")]) == 1
    assert not (tmp_path / "onnx").exists()


def test_lstm_runs_given_to_transformer_only_verbs_get_one_clear_message(lstm_run, tmp_path, capsys):
    from ember.cli import main

    assert main(["fill-mask", str(lstm_run), "a [MASK] film"]) == 1
    assert "holds a 'lstm' model; this command supports bert" in capsys.readouterr().err
    assert main(["distill", "--method", "kd", "--teacher", str(lstm_run), "--out", str(tmp_path / "kd")]) == 1
    assert "holds a 'lstm' model; distillation" in capsys.readouterr().err
    assert not (tmp_path / "kd").exists()
    assert main(["finetune", "--task", "conll2003", "--init", str(lstm_run), "--out", str(tmp_path / "ner")]) == 1
    assert "per-token task" in capsys.readouterr().err and not (tmp_path / "ner").exists()
    # --features (a Transformer's layer mix) reached an AttributeError at the first step
    assert main(["finetune", "--task", "sst2", "--init", str(lstm_run), "--features", "--out", str(tmp_path / "f")]) == 1
    assert "an LSTM run (Dai & Le 2015) fine-tunes whole" in capsys.readouterr().err and not (tmp_path / "f").exists()
    from ember.errors import EmberError
    from ember.serve.graph import describe

    with pytest.raises(EmberError, match="lstm_lm pre-training run .* no inference endpoint: fine-tune it"):
        describe(lstm_run)
