"""CoNLL-2003 NER: entity-level metrics, first-sub-token alignment, fine-tuning on real data."""

from __future__ import annotations

import json
import subprocess
import sys

import numpy as np
import pytest
import torch

from conftest import make_wordpiece, real_data
from ember.config import ModelConfig, RunConfig, TaskConfig, TrainConfig
from ember.errors import EmberError
from ember.models import build_backbone
from ember.tasks.metrics.ner import entity_scores, get_entities
from ember.tasks.tagging import IGNORE, ConllNerAdapter, TokenClassifier, encode_words, split_words, word_tags

# -- entity extraction: IOB2 boundary cases, computed by hand --------------------------------


@pytest.mark.parametrize("tags, lenient, strict", [
    (["B-PER", "I-PER", "O", "B-LOC"], [("PER", 0, 1), ("LOC", 3, 3)], [("PER", 0, 1), ("LOC", 3, 3)]),
    # B-/I- type mismatch: conlleval opens a new LOC entity, strict IOB2 drops the stray I-LOC
    (["B-PER", "I-LOC"], [("PER", 0, 0), ("LOC", 1, 1)], [("PER", 0, 0)]),
    # I- at sentence start, and after O
    (["I-ORG", "I-ORG", "O"], [("ORG", 0, 1)], []),
    (["O", "I-MISC", "B-MISC"], [("MISC", 1, 1), ("MISC", 2, 2)], [("MISC", 2, 2)]),
    # adjacent entities of one type are separated by the second B-
    (["B-PER", "B-PER", "I-PER"], [("PER", 0, 0), ("PER", 1, 2)], [("PER", 0, 0), ("PER", 1, 2)]),
    # an entity running to the end of the sentence; an all-O sentence
    (["O", "B-LOC", "I-LOC"], [("LOC", 1, 2)], [("LOC", 1, 2)]),
    (["O", "O"], [], []),
])
def test_ner_entities_iob2_boundary_cases(tags, lenient, strict):
    assert get_entities(tags) == lenient
    assert get_entities(tags, mode="strict") == strict


def test_ner_entity_scores_hand_computed():
    gold = [["B-PER", "I-PER", "O", "B-LOC"], ["B-ORG", "O"]]
    pred = [["B-PER", "I-PER", "O", "B-ORG"], ["B-ORG", "B-MISC"]]
    # gold: PER(0-1), LOC(3), ORG(0) = 3; predicted: PER(0-1), ORG(3), ORG(0), MISC(1) = 4;
    # exact matches: PER(0-1), ORG(0) -> P = 2/4, R = 2/3, F1 = 2PR/(P+R) = 4/7
    scores = entity_scores(gold, pred, per_type=True)
    assert scores["precision"] == pytest.approx(0.5)
    assert scores["recall"] == pytest.approx(2 / 3)
    assert scores["f1"] == pytest.approx(4 / 7)
    assert scores["types"]["ORG"] == pytest.approx({"precision": 0.5, "recall": 1.0, "f1": 2 / 3, "support": 1})
    assert scores["types"]["LOC"] == {"precision": 0.0, "recall": 0.0, "f1": 0.0, "support": 1}


def test_ner_partial_boundary_is_one_false_positive_and_one_false_negative():
    scores = entity_scores([["B-PER", "I-PER", "O"]], [["B-PER", "O", "O"]])
    assert scores == {"precision": 0.0, "recall": 0.0, "f1": 0.0}
    # The all-O prediction (what an untrained tagger outputs) scores 0 on every metric.
    assert entity_scores([["B-PER", "O"]], [["O", "O"]])["f1"] == 0.0


@pytest.mark.filterwarnings("ignore:.*is ill-defined")  # seqeval's warning for the 0/0 cases we test
def test_ner_scores_without_gold_or_predicted_entities_and_with_equal_precision_and_recall():
    """seqeval's conventions at the edges: no gold entity -> recall 0 (not 1), no predicted
    entity -> precision 0; and F1 = P = R when precision equals recall."""
    seqeval = pytest.importorskip("seqeval.metrics")
    cases = [([["O", "O"]], [["B-PER", "O"]]),  # nothing to find, one false positive
             ([["B-PER", "O"]], [["O", "O"]]),  # nothing predicted
             ([["B-PER", "O", "B-LOC"]], [["B-PER", "B-ORG", "O"]])]  # 1 of 2 found, 1 of 2 right
    for gold, pred in cases:
        ours = entity_scores(gold, pred, per_type=True)
        expected = {"precision": seqeval.precision_score(gold, pred), "recall": seqeval.recall_score(gold, pred),
                    "f1": seqeval.f1_score(gold, pred)}
        assert {k: ours[k] for k in expected} == pytest.approx(expected, abs=1e-12)
    assert ours["f1"] == ours["precision"] == ours["recall"] == 0.5
    assert ours["types"]["PER"] == {"precision": 1.0, "recall": 1.0, "f1": 1.0, "support": 1}
    assert entity_scores([["O", "O"]], [["B-PER", "O"]])["recall"] == 0.0


def test_ner_metrics_reject_bad_tags_and_lengths():
    with pytest.raises(EmberError, match="'X-PER' is not BIO"):
        get_entities(["X-PER"])
    with pytest.raises(EmberError, match="sentence 0: 2 gold tags but 1 predicted"):
        entity_scores([["O", "O"]], [["O"]])
    with pytest.raises(EmberError, match="unknown NER scoring mode"):
        get_entities(["O"], mode="loose")


@pytest.mark.parametrize("mode", ["conlleval", "strict"])
def test_ner_metrics_match_seqeval_on_random_ill_formed_tags(mode):
    seqeval = pytest.importorskip("seqeval.metrics")
    from seqeval.scheme import IOB2

    rng = np.random.default_rng(0)
    tags = ["O", "O", "O", "B-PER", "I-PER", "B-LOC", "I-LOC", "I-ORG"]
    gold = [list(rng.choice(tags, size=rng.integers(1, 12))) for _ in range(300)]
    pred = [[t if rng.random() < 0.7 else str(rng.choice(tags)) for t in sent] for sent in gold]
    kwargs = {"mode": "strict", "scheme": IOB2} if mode == "strict" else {}
    ours = entity_scores(gold, pred, mode=mode)
    assert ours["precision"] == pytest.approx(seqeval.precision_score(gold, pred, **kwargs))
    assert ours["recall"] == pytest.approx(seqeval.recall_score(gold, pred, **kwargs))
    assert ours["f1"] == pytest.approx(seqeval.f1_score(gold, pred, **kwargs))


# -- alignment: labels on the first sub-token of each word -------------------------------------


def test_ner_labels_first_subtoken_and_truncation():
    tok = make_wordpiece(["the", "w1", "##s", "a"])  # ids: the=5, w1=6, ##s=7, a=8
    (feat,), n_truncated = encode_words([["The", "w1s", "a"]], tok, max_length=16, label_seqs=[[0, 3, 4]])
    assert feat["input_ids"] == [2, 5, 6, 7, 8, 3]  # [CLS] the w1 ##s a [SEP]
    assert feat["word_starts"] == [1, 2, 4]
    assert feat["labels"] == [IGNORE, 0, 3, IGNORE, 4, IGNORE]
    assert n_truncated == 0
    (cut,), n_truncated = encode_words([["The", "w1s", "a"]], tok, max_length=4, label_seqs=[[0, 3, 4]])
    assert cut["input_ids"] == [2, 5, 6, 3] and cut["word_starts"] == [1, 2, -1] and n_truncated == 1
    assert word_tags([np.array([1, 0, -1])], ["O", "B-PER"]) == [["B-PER", "O", "O"]]
    with pytest.raises(EmberError, match="leaves no room"):
        encode_words([["a"]], tok, max_length=2)


def test_ner_predict_reads_first_subtoken_argmax_regardless_of_padding():
    tok = make_wordpiece(["the", "w1", "##s", "a"])
    cfg = ModelConfig(vocab_size=16, hidden_size=16, num_layers=1, num_heads=2, intermediate_size=32,
                      max_position=32)
    torch.manual_seed(0)
    module = TokenClassifier(build_backbone(cfg), 9, pad_id=0).eval()
    features = encode_words([["the", "w1s", "a"], ["a"], ["w1s", "the", "the", "a", "w1s"]], tok, 32).features
    preds = module.predict(features, batch_size=2)
    for feat, words_pred in zip(features, preds):
        alone = module.logits(module.make_batch([feat]))[0].argmax(-1)  # (T,) without padding
        assert words_pred.tolist() == alone[feat["word_starts"]].tolist()


def test_ner_split_words_keeps_abbreviations_and_splits_punctuation():
    assert split_words("U.S. troops hit Baghdad-based rebels, officials said.") == [
        "U.S.", "troops", "hit", "Baghdad-based", "rebels", ",", "officials", "said", "."]


# -- fine-tuning on real CoNLL-2003 ------------------------------------------------------------


TINY = ModelConfig(vocab_size=2000, hidden_size=64, num_layers=2, num_heads=2, intermediate_size=128,
                   max_position=128)


@pytest.fixture(scope="module")
def ner_run(wiki_prepared, tmp_path_factory):
    from ember.train.finetune import run_finetuning

    real_data("conll2003", "train.txt")
    cfg = RunConfig(kind="finetune", model=TINY,
                    task=TaskConfig(name="conll2003", max_length=128, epochs=2, init="random"),
                    train=TrainConfig(lr=3e-3, batch_size=32, warmup_ratio=0.1, eval_every=0, save_every=0,
                                      log_every=10))
    run = tmp_path_factory.mktemp("ner") / "run"
    result = run_finetuning(cfg, run, None, wiki_prepared / "tokenizer.json", train_limit=2000, progress=False)
    return run, result


def test_ner_conll2003_finetune_from_random_init_beats_all_o_baseline(ner_run):
    run, result = ner_run
    # 126 steps on 2,000 real sentences; the all-O tagger scores F1 = 0 (no entities found).
    # Measured: dev F1 0.18, test F1 0.16.
    assert result["task"] == "CoNLL-2003" and result["split"] == "dev"
    assert result["metrics"]["f1"] > 0.08
    assert result["other_splits"]["test"]["f1"] > 0.05
    records = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    losses = [r["loss"] for r in records if r["split"] == "train"]
    assert losses[-1] < 0.7 * losses[0]
    assert json.loads((run / "labels.json").read_text())[:3] == ["O", "B-PER", "I-PER"]


def test_ner_evaluate_reloads_best_weights_on_dev_and_test(ner_run):
    from ember.tasks.task_model import evaluate_run

    run, result = ner_run
    assert evaluate_run(run)["metrics"] == pytest.approx(result["metrics"])
    assert evaluate_run(run, split="test")["metrics"] == pytest.approx(result["other_splits"]["test"])


def test_ner_predict_cli_writes_word_tags_jsonl(ner_run, tmp_path):
    run, _ = ner_run
    source = tmp_path / "news.txt"
    source.write_text("EU rejects German call to boycott British lamb.\n\nPeter Blackburn\n")
    out = tmp_path / "tags.jsonl"
    done = subprocess.run([sys.executable, "-m", "ember", "predict", str(run), "--input", str(source),
                           "--out", str(out)], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    rows = [json.loads(line) for line in out.read_text().splitlines()]
    assert [r["words"] for r in rows] == [
        ["EU", "rejects", "German", "call", "to", "boycott", "British", "lamb", "."], ["Peter", "Blackburn"]]
    for r in rows:
        assert len(r["tags"]) == len(r["words"]) and set(r["tags"]) <= set(ConllNerAdapter().label_names())
        assert [(e["type"], e["start"], e["end"]) for e in r["entities"]] == [
            (t, a, b + 1) for t, a, b in get_entities(r["tags"])]
    conll_out = tmp_path / "tags.tsv"
    subprocess.run([sys.executable, "-m", "ember", "predict", str(run), "--input", str(source),
                    "--out", str(conll_out)], check=True, capture_output=True)
    assert conll_out.read_text().split("\n\n")[1].splitlines()[0].startswith("Peter\t")


def test_ner_evaluate_file_agrees_with_predict_on_the_same_conll_file(ner_run, tmp_path):
    from ember.tasks.readers.conll import read_split
    from ember.tasks.task_model import evaluate_run

    run, _ = ner_run
    sentences = read_split("dev", limit=60)
    source = tmp_path / "dev60.conll"
    source.write_text("".join("".join(f"{w} {t}\n" for w, t in zip(s.words, s.tags)) + "\n" for s in sentences))
    out = tmp_path / "dev60.jsonl"
    subprocess.run([sys.executable, "-m", "ember", "predict", str(run), "--input", str(source), "--out", str(out)],
                   check=True, capture_output=True)
    predicted = [json.loads(line)["tags"] for line in out.read_text().splitlines()]
    scored = evaluate_run(run, path=str(source))
    assert scored["split"] == str(source)
    assert scored["metrics"] == pytest.approx(entity_scores([s.tags for s in sentences], predicted))


def test_ner_conll2003_reads_a_split_given_as_a_file(tmp_path):
    """`ember finetune --task conll2003 --dev FILE` passes the file as the split (as GLUE's
    reader takes one): the first real dev sentences written out read back as they are; an
    unknown split name that is no file is still the reader's one-line error."""
    real_data("conll2003", "dev.txt")
    from ember.tasks.readers.conll import read_split

    sentences = read_split("dev", limit=5)
    path = tmp_path / "dev5.conll"
    path.write_text("".join("".join(f"{w} {t}\n" for w, t in zip(s.words, s.tags)) + "\n" for s in sentences))
    again = ConllNerAdapter().read(str(path))
    assert [(s.words, s.tags) for s in again] == [(s.words, s.tags) for s in sentences]
    with pytest.raises(EmberError, match="CoNLL-2003 has no split 'devv'"):
        ConllNerAdapter().read("devv")
