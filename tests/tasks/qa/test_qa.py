"""QA head: loss, n-best decoding constraints, and learning on real SQuAD text."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from conftest import real_data
from test_squad import squad_file, squad_tokenizer

from ember.config import ModelConfig, TrainConfig
from ember.models import build_backbone
from ember.tasks.qa.head import QuestionAnswering, decode_answers, window_candidates
from ember.tasks.qa.squad import featurize_squad, read_squad
from ember.tasks.qa.task import SquadAdapter


def tiny_qa(vocab_size: int = 1500, seed: int = 0) -> QuestionAnswering:
    torch.manual_seed(seed)
    cfg = ModelConfig(vocab_size=vocab_size, hidden_size=32, num_layers=2, num_heads=2,
                      intermediate_size=64, max_position=128)
    return QuestionAnswering(build_backbone(cfg), pad_id=0)


def test_bert_qa_loss_is_mean_of_start_and_end_cross_entropy():
    module = tiny_qa().eval()
    features = [{"input_ids": [2, 7, 3, 9, 10, 11, 3], "token_type_ids": [0, 0, 0, 1, 1, 1, 1],
                 "start_position": 4, "end_position": 5},
                {"input_ids": [2, 8, 3, 12, 3], "token_type_ids": [0, 0, 0, 1, 1],
                 "start_position": 0, "end_position": 0}]
    batch = module.make_batch(features, np.random.default_rng(0))
    assert batch["input_ids"].shape == (2, 7) and batch["start_positions"].tolist() == [4, 0]
    loss, metrics = module(batch)
    hidden = module.backbone(batch["input_ids"], batch["attention_mask"], batch["token_type_ids"]).last_hidden_state
    logits = module.qa_outputs(hidden)  # (B, T, 2)
    # Row 2 has two padding positions; they must not take probability mass.
    start = logits[..., 0].masked_fill(batch["attention_mask"] == 0, -1e4)
    end = logits[..., 1].masked_fill(batch["attention_mask"] == 0, -1e4)
    want = (F.cross_entropy(start, batch["start_positions"]) + F.cross_entropy(end, batch["end_positions"])) / 2
    assert loss.item() == pytest.approx(want.item(), rel=1e-6)
    assert metrics["loss"] == (pytest.approx(loss.item() * 2), 2)
    # predict() returns per-feature logits trimmed to each feature's own length.
    (s0, e0), (s1, e1) = module.predict(features, batch_size=1)
    assert s0.shape == (7,) and s1.shape == (5,)
    np.testing.assert_allclose(s0, start[0].detach().numpy(), rtol=1e-5, atol=1e-5)


def _hand_feature(example_index=0, cls_start=1.0, central=(True, True, True)):
    # [CLS] q q [SEP] "aa" "bb" "cc" [SEP] over the context "aa bb cc".
    return {"input_ids": list(range(8)), "token_type_ids": [0] * 4 + [1] * 4, "example_index": example_index,
            "cls_index": 0, "offsets": [None] * 4 + [(0, 2), (3, 5), (6, 8)] + [None],
            "max_context": [False] * 4 + list(central) + [False]}


def test_qa_decoding_skips_question_reversed_and_long_spans_by_hand():
    start = np.array([1, 10, 0, 0, 5, 4, 7, 0], dtype=np.float32)
    end = np.array([1, 0, 10, 0, 6, 4, -5, 0], dtype=np.float32)
    # Higher-scoring pairs are all invalid: (1,2) = 20 lies in the question, (1,4) = 16 starts
    # there, (6,4) = 13 and (6,5) = 11 end before they start. Valid: (4,4) "aa" = 11,
    # (4,5) "aa bb" = 9, (5,5) = 8, (6,6) = 2, (4,6) = 0, (5,6) = -1.
    (answer,) = decode_answers(["aa bb cc"], [_hand_feature()], [(start, end)], n_best=20, max_answer_length=30)
    assert answer.text == "aa" and answer.score == 11.0
    assert [t for t, _ in answer.nbest] == ["aa", "aa bb", "bb", "cc", "aa bb cc", "bb cc"]
    assert answer.null_score == 2.0 and answer.null_minus_best == -9.0
    # max_answer_length=1 keeps single tokens only; n_best=2 pairs only the top-2 starts/ends.
    (short,) = decode_answers(["aa bb cc"], [_hand_feature()], [(start, end)], n_best=20, max_answer_length=1)
    assert [t for t, _ in short.nbest] == ["aa", "bb", "cc"]
    (top2,) = decode_answers(["aa bb cc"], [_hand_feature()], [(start, end)], n_best=2, max_answer_length=30)
    assert top2.nbest == []  # starts {1, 6} x ends {2, 4}: every pair is invalid
    assert top2.text == "" and top2.null_minus_best == float("inf")


def test_qa_decoding_aggregates_windows_with_min_null_and_max_context():
    start = np.array([1, 0, 0, 0, 5, 4, 7, 0], dtype=np.float32)
    end = np.array([1, 0, 0, 0, 6, 4, -5, 0], dtype=np.float32)
    other_start, other_end = start.copy(), end.copy()
    other_start[0] = other_end[0] = -0.5  # this window's null score is lower: -1
    other_start[5] = 9.0  # "bb" would win here, but this window is not its most central view
    features = [_hand_feature(0), _hand_feature(0, central=(True, False, True))]
    (answer,) = decode_answers(["aa bb cc"], features, [(start, end), (other_start, other_end)])
    assert answer.null_score == -1.0
    assert answer.text == "aa" and answer.score == 11.0


@pytest.mark.parametrize("kind", ["wordpiece", "bpe"])
def test_qa_decoding_never_returns_question_reversed_or_overlong_spans(kind):
    tok = squad_tokenizer(kind)
    examples = read_squad(squad_file(), limit=60)
    features = featurize_squad(examples, tok, max_length=64, doc_stride=24, max_query_length=16)
    rng = np.random.default_rng(0)
    logits = [(rng.normal(size=len(f["input_ids"])).astype(np.float32) * 3,
               rng.normal(size=len(f["input_ids"])).astype(np.float32) * 3) for f in features]
    max_len = 4
    for f, (s, e) in zip(features, logits):
        first_context = next(i for i, o in enumerate(f["offsets"]) if o is not None)
        for score, i, j in zip(*window_candidates(s, e, f, n_best=10, max_answer_length=max_len)):
            assert first_context <= i <= j < first_context + sum(o is not None for o in f["offsets"])
            assert j - i + 1 <= max_len and score == pytest.approx(s[i] + e[j])
    answers = decode_answers([ex.context for ex in examples], features, logits, n_best=10, max_answer_length=max_len)
    for ex, answer in zip(examples, answers):
        assert answer.text and answer.text in ex.context
        scores = [score for _, score in answer.nbest]
        assert scores == sorted(scores, reverse=True) and len(scores) <= 10


def test_squad2_tiny_bert_finetuning_loss_goes_down_on_real_text(tmp_path):
    from ember.train.loop import Trainer

    adapter = SquadAdapter("squad2", doc_stride=48, max_query_length=24)
    tok = squad_tokenizer("wordpiece")
    examples, features = adapter.load("train", tok, max_length=96, limit=120)
    module = adapter.build_module(tiny_qa().backbone, pad_id=0)

    class Data:
        def __len__(self):
            return len(features)

        def example(self, index, epoch):
            return features[index]

    def mean_loss():
        module.eval()
        with torch.no_grad():
            loss, _ = module(module.make_batch(features[:128]))
        module.train()
        return loss.item()

    before = mean_loss()
    cfg = TrainConfig(lr=2e-3, batch_size=16, max_steps=60, warmup_steps=5, eval_every=0, save_every=0,
                      log_every=100)
    Trainer(module, Data(), cfg, tmp_path, progress=False).train()
    after = mean_loss()
    # Chance is ln(96) ~ 4.6 per end; learning [CLS] for the windows without an answer and
    # typical answer positions alone takes it well below that.
    print(f"loss before {before:.3f} after {after:.3f}")
    assert after < before - 1.0, (before, after)

    dev_examples, dev_features = adapter.load("dev", tok, max_length=96, limit=40)
    metrics = adapter.score(module, dev_examples, dev_features, batch_size=32)
    for key in ("exact", "f1", "HasAns_exact", "HasAns_f1", "NoAns_exact", "NoAns_f1",
                "best_exact", "best_f1", "best_f1_thresh"):
        assert key in metrics
    assert metrics["total"] == 40 and 0.0 <= metrics["f1"] <= 100.0
    assert metrics["best_f1"] >= 100.0 * metrics["NoAns_total"] / metrics["total"] - 1e-9


@pytest.mark.parametrize("setting, order", [("auto", "shuffled"), ("true", "length-grouped-spread"),
                                            ("false", "shuffled")])
def test_squad2_windows_train_shuffled_by_default_and_grouped_when_asked(setting, order, tmp_path):
    """Real SQuAD 2.0 windows: by default (train.group_by_length=auto) a QA run trains shuffled
    batches, since over 152 updates grouped ones could not be shown as accurate (issue 46,
    BENCHMARKS.md); =true groups them, one paragraph's windows kept apart."""
    from ember.data.in_memory import InMemoryData
    from ember.train.length_groups import feature_groups, feature_lengths
    from ember.train.loop import Trainer

    adapter = SquadAdapter("squad2", doc_stride=48, max_query_length=24)
    _, features = adapter.load("train", squad_tokenizer("wordpiece"), max_length=96, limit=120)
    data = InMemoryData(features, feature_lengths(features), feature_groups(features))
    module = adapter.build_module(tiny_qa().backbone, pad_id=0)
    cfg = TrainConfig(batch_size=16, max_steps=1, eval_every=0, save_every=0, group_by_length=setting)
    trainer = Trainer(module, data, cfg, tmp_path, progress=False)
    assert trainer.order.name == order
    lengths = np.array(feature_lengths(features))
    first = trainer.order.epoch_order(0)[: len(features) // 16 * 16]
    spans = [np.ptp(lengths[first[i:i + 16]]) for i in range(0, len(first), 16)]
    # grouped batches hold windows of near-equal length (measured: a span of 6.8 tokens on average),
    # shuffled ones span much of the real range (31.5)
    assert (np.mean(spans) < 10) if setting == "true" else (np.mean(spans) > 25), np.mean(spans)


def test_squad1_adapter_drops_unanswerable_questions():
    real_data("squad2-dev-half")
    adapter = SquadAdapter("squad")
    examples = adapter.read("dev", limit=50)
    assert len(examples) == 50 and not any(ex.is_impossible for ex in examples)
    assert adapter.main_metric == "f1" and adapter.display_name == "SQuAD 1.1" and adapter.label_names() is None
    module = tiny_qa()
    tok = squad_tokenizer("wordpiece")
    features = featurize_squad(examples, tok, 96, 48, 24)
    metrics = adapter.score(module, examples, features, batch_size=32)
    assert set(metrics) == {"exact", "f1", "total", "HasAns_exact", "HasAns_f1", "HasAns_total"}


def test_squad_adapter_reads_a_users_json_given_as_the_split(tmp_path):
    """`ember finetune --task squad2 --train MY.json --dev MY_DEV.json` (the split settings hold the
    files, as GLUE tasks take TSVs): the file's questions, not the built-in article split."""
    data = json.loads(real_data("squad2-dev-half", "dev-v2.0.json").read_text())
    mine = tmp_path / "mine.json"
    mine.write_text(json.dumps({"version": "v2.0", "data": data["data"][5:6]}))
    examples = SquadAdapter("squad2").read(str(mine))
    assert [ex.qid for ex in examples] == [ex.qid for ex in read_squad(mine)]
    assert {ex.title for ex in examples} == {data["data"][5]["title"]}
    answerable = SquadAdapter("squad").read(str(mine))
    assert 0 < len(answerable) < len(examples) and not any(ex.is_impossible for ex in answerable)
    from ember.errors import EmberError

    with pytest.raises(EmberError, match="unknown SQuAD split 'test'"):
        SquadAdapter("squad2").read("test")


def test_squad2_finetune_cli_from_a_pretraining_run_end_to_end(wiki_prepared, tmp_path):
    pytest.importorskip("ember.tasks.base")  # the task-adapter registry `ember finetune` uses
    from conftest import TINY_MODEL

    from ember.cli import main
    from ember.recipes import recipe_path
    from ember.config import apply_overrides, load_yaml, run_config_from_dict
    from ember.tasks.task_model import evaluate_run
    from ember.train.pretrain import run_pretraining

    cfg = run_config_from_dict(apply_overrides(load_yaml(recipe_path("bert-mini")), TINY_MODEL + [
        f"data.prepared={wiki_prepared}", "train.max_steps=2", "train.eval_every=0", "train.save_every=0"]))
    run_pretraining(cfg, tmp_path / "pre", progress=False)
    out = tmp_path / "squad"
    code = main(["finetune", "--task", "squad2", "--init", str(tmp_path / "pre"), "--out", str(out),
                 "--train-limit", "60", "--epochs", "1", "--max-length", "64", "--batch-size", "16",
                 "--lr", "1e-3", "--no-progress", "--set", "train.eval_every=2"])
    assert code == 0
    results = json.loads((out / "results.json").read_text())
    assert results["task"] == "SQuAD 2.0" and results["split"] == "dev"
    # The kept checkpoint is the one with the best F1 at its tuned threshold (what it is used with).
    from ember.train.logging import MetricsLogger

    evals = [r for r in MetricsLogger.read(out / "metrics.jsonl") if r["split"] == "eval"]
    assert len(evals) >= 2
    assert results["best_step"] == max(evals, key=lambda r: r["tuned_f1"])["step"]
    metrics = results["metrics"]
    assert metrics["total"] == 1478  # every question of the 4 dev articles
    assert {"exact", "f1", "HasAns_f1", "NoAns_f1", "best_f1", "best_f1_thresh"} <= set(metrics)
    # SQuAD 2.0 (BERT §4.3): the no-answer threshold maximising dev F1 is kept with the weights
    # (RUN/tuned.json) and the reported exact/f1 use it, so f1 is the threshold-0 run's tuned_f1.
    tuned = json.loads((out / "tuned.json").read_text())
    at_zero = results["metrics_untuned"]
    assert tuned["null_threshold"] == results["tuned"]["null_threshold"] == at_zero["tuned_f1_thresh"]
    # applying the tuned threshold delivers exactly the F1 the tuner promised
    assert metrics["f1"] == pytest.approx(at_zero["tuned_f1"]) and metrics["f1"] >= at_zero["f1"]
    # The saved best weights reload to the same scores, with the tuned threshold applied.
    again = evaluate_run(out)
    assert again["metrics"] == pytest.approx(metrics) and again["null_threshold"] == tuned["null_threshold"]

    # `ember predict` takes a SQuAD JSON without answers and writes one row per question.
    context = "The Normans gave their name to Normandy, a region in France."
    source = tmp_path / "questions.json"
    source.write_text(json.dumps({"version": "v2.0", "data": [{"title": "t", "paragraphs": [{
        "context": context, "qas": [{"id": "q1", "question": "Where is Normandy?"},
                                    {"id": "q2", "question": "Who gave their name to Normandy?"}]}]}]}))
    assert main(["predict", str(out), "--input", str(source), "--out", str(tmp_path / "p.jsonl")]) == 0
    rows = [json.loads(line) for line in (tmp_path / "p.jsonl").read_text().splitlines()]
    assert [r["id"] for r in rows] == ["q1", "q2"]
    for r in rows:
        assert r["best_span"] in context and r["prediction"] in ("", r["best_span"])
        assert (r["prediction"] == "") == (r["no_answer_score"] > tuned["null_threshold"])
