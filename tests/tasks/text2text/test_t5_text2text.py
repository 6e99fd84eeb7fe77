"""T5 text-to-text fine-tuning (ember.tasks.text2text.task): Appendix D's formats on real GLUE / SQuAD
rows, STS-B rounding, parsing outputs back (invalid ones count as wrong, with the official
metrics), truncation, T5's fine-tuning defaults, bad input, and a tiny T5 that learns SST-2."""

from __future__ import annotations

import dataclasses
import json

import numpy as np
import pytest
import torch
from conftest import real_data
from t5_helpers import TINY_T5, one_thread, t5_glue_tokenizer  # noqa: F401

from ember.config import model_preset
from ember.errors import EmberError
from ember.tasks.base import get_adapter
from ember.tasks.text2text.templates import Parsed, input_text, stsb_target

T5 = model_preset("t5-tiny")
pytestmark = pytest.mark.usefixtures("one_thread")


@pytest.fixture(scope="module")
def tok(t5_glue_tokenizer):
    from ember.tokenizers import load_tokenizer

    return load_tokenizer(t5_glue_tokenizer)


# The first dev row of each task, written by hand in Appendix D's format (Raffel et al. 2020)
# from the TSV / JSON files; SNLI takes MNLI's "hypothesis: ... premise: ..." and prefix.
GOLDEN = {
    "sst2": ("sst2 sentence: it 's a charming and often affecting journey .", "positive"),
    "cola": ("cola sentence: The sailors rode the breeze clear of the rocks.", "acceptable"),
    "mrpc": (("mrpc sentence1: He said the foodservice pie business doesn 't fit the company 's long-term growth "
              "strategy . sentence2: \" The foodservice pie business does not fit our long-term growth strategy ."),
             "equivalent"),
    "rte": (("rte sentence1: Dana Reeve, the widow of the actor Christopher Reeve, has died of lung cancer at age 44, "
             "according to the Christopher Reeve Foundation. sentence2: Christopher Reeve had an accident."),
            "not_entailment"),
    "stsb": ("stsb sentence1: A man with a hard hat is dancing. sentence2: A man wearing a hard hat is dancing.",
             "5.0"),
    "qnli": (("qnli question: What came into force after the new constitution was herald? sentence: As of that "
              "day, the new constitution heralding the Second Republic came into force."), "entailment"),
    "snli": (("mnli hypothesis: The sisters are hugging goodbye while holding to go packages after just eating "
              "lunch. premise: Two women are embracing while holding to go packages."), "neutral"),
}


@pytest.mark.parametrize("task", sorted(GOLDEN))
def test_t5_text2text_inputs_of_real_glue_rows_follow_appendix_d(task, tok):
    real_data("glue", "SST-2", "dev.tsv")
    adapter = get_adapter(task, T5)
    examples, features = adapter.load("dev", tok, 128, limit=1)
    text, target = GOLDEN[task]
    assert input_text(adapter.template, examples[0]) == text
    assert adapter.template.target(examples[0]) == target
    # the ids are the text's (tokenized piece by piece) + </s>; the labels are the target's + </s>
    assert features[0]["input_ids"] == tok.encode(text, add_special_tokens=False).ids + [tok.token_to_id("</s>")]
    assert features[0]["labels"][-1] == tok.token_to_id("</s>") and tok.decode(features[0]["labels"]) == target
    assert not features[0]["truncated"]


def test_t5_squad_input_is_question_then_context_and_the_target_the_first_answer(tok):
    real_data("squad2-dev-half", "dev-v2.0.json")
    adapter = get_adapter("squad2", T5)
    examples, _ = adapter.load("dev", tok, 512, limit=3)
    ex = examples[0]
    assert input_text(adapter.template, ex) == f"question: {' '.join(ex.question.split())} context: {ex.context}"
    assert input_text(adapter.template, ex).startswith(
        "question: What branch of theoretical computer science deals with broadly classifying computational "
        "problems by difficulty and class of relationship? context: Computational complexity theory is a branch")
    assert adapter.template.target(ex) == "Computational complexity theory" == ex.answers[0][0]
    impossible = next(e for e in adapter.inner.read("dev") if e.is_impossible)
    assert adapter.template.target(impossible) == "unanswerable"
    assert adapter.main_metric == "f1" and adapter.hparams.max_length == 512


def test_t5_squad_predict_file_leaves_an_invalid_answer_empty_and_keeps_the_raw_output(tok, tmp_path):
    """`ember predict` wrote a rejected QA output ("sssss", no span of the context) as the prediction;
    the docs (and /answer, and the classification tasks) leave it empty, with the raw output beside it."""
    import json

    source = json.loads(real_data("squad2-dev-half", "dev-v2.0.json").read_text())
    paragraph = source["data"][0]["paragraphs"][0]
    paragraph["qas"] = paragraph["qas"][:2]
    (tmp_path / "two.json").write_text(json.dumps({"version": "v2.0", "data": [{"title": "t", "paragraphs": [paragraph]}]}))
    adapter = get_adapter("squad2", T5)
    outputs = ["sssssssssss", "France"]  # the decoder's outputs for the two questions: junk, and a span of the context
    adapter.outputs = lambda module, features, batch_size: outputs
    rows, _ = adapter.predict_file(None, tok, 512, tmp_path / "two.json", 2, "cpu")
    assert [(r["prediction"], r["valid"], r["output"]) for r in rows] == [
        (None, False, outputs[0]), ("France", True, outputs[1])]


@pytest.mark.parametrize("task,folder,text,target", [
    ("nsmc", "nsmc", "nsmc sentence: 스토리며 설정이며 결국엔 삼류 쓰레기 영화..", "negative"),
    ("rusentiment", "rusentiment", "rusentiment sentence: урря!я дождался этой овцыы)", "positive")],
    ids=["nsmc", "rusentiment"])
def test_t5_korean_and_russian_sentiment_take_the_single_sentence_pattern(task, folder, text, target):
    real_data(folder)
    adapter = get_adapter(task, T5)
    example = adapter.inner.read("dev", limit=1)[0]
    assert (input_text(adapter.template, example), adapter.template.target(example)) == (text, target)
    assert adapter.report_splits == ("test",) and adapter.label_names() == adapter.inner.label_names()


@pytest.mark.parametrize("score,text", [(2.57, "2.6"), (4.75, "4.8"), (3.9, "4.0"), (0.3, "0.4"), (0.1, "0.0"),
                                        (1.1, "1.2"), (5.0, "5.0"), (0.0, "0.0"), (3.8, "3.8")])
def test_t5_stsb_target_rounds_to_the_nearest_0_2(score, text):
    # §2.4: 2.57 -> "2.6". Halves go to the even multiple of 0.2 (tf.round's rule): 0.3 * 5 = 1.5 -> 2 -> "0.4",
    # 0.1 * 5 = 0.5 -> 0 -> "0.0", 1.1 * 5 = 5.5 -> 6 -> "1.2".
    assert stsb_target(score) == text


def test_t5_stsb_real_scores_round_and_every_target_parses_back():
    real_data("glue", "STS-B", "dev.tsv")
    adapter = get_adapter("stsb", T5)
    rows = adapter.inner.read("dev", limit=6)
    assert [r.label for r in rows[:4]] == [5.0, 4.75, 5.0, 2.4]
    assert [adapter.template.target(r) for r in rows[:4]] == ["5.0", "4.8", "5.0", "2.4"]
    targets = adapter.template.target_texts()
    assert len(targets) == 26 and targets[0] == "0.0" and targets[-1] == "5.0"
    assert all(adapter.template.parse(t) == Parsed(float(t), True) for t in targets)


@pytest.mark.parametrize("output,parsed", [
    ("positive", Parsed(1, True)), (" negative ", Parsed(0, True)), ("Positive", Parsed(None, False)),
    ("hamburger", Parsed(None, False)), ("positive negative", Parsed(None, False)), ("", Parsed(None, False))])
def test_t5_sst2_outputs_parse_to_labels_or_invalid(output, parsed):
    assert get_adapter("sst2", T5).template.parse(output) == parsed


@pytest.mark.parametrize("output,parsed", [
    ("3.8", Parsed(3.8, True)), ("0", Parsed(0.0, True)), ("5.2", Parsed(None, False)), ("-1", Parsed(None, False)),
    ("nan", Parsed(None, False)), ("three", Parsed(None, False))])
def test_t5_stsb_outputs_parse_to_scores_in_range_or_invalid(output, parsed):
    assert get_adapter("stsb", T5).template.parse(output) == parsed


def _score(task: str, examples, outputs: list[str]) -> dict:
    """The adapter's metrics for given decoded outputs (the decoding itself is stubbed)."""
    adapter = get_adapter(task, T5)
    adapter.outputs = lambda module, features, batch_size=64: outputs
    return adapter.score(None, examples, [{}] * len(examples), 64, "cpu")


def test_t5_invalid_classification_outputs_count_as_wrong_in_the_official_metrics():
    from ember.tasks.readers.glue import Example

    gold = [1, 0, 1, 0, 1, 0]
    examples = [Example(str(i), "a", "b", y) for i, y in enumerate(gold)]
    outputs = ["equivalent", "hamburger", "not_equivalent", "not_equivalent", "equivalent", "Equivalent"]
    metrics = _score("mrpc", examples, outputs)
    # predictions as the metric sees them: invalid -> the other label: [1, 1, 0, 0, 1, 1]
    # TP 2, FP 2, FN 1 -> F1 = 4 / 7; accuracy 3 / 6 (an invalid output is never right)
    assert metrics["f1"] == pytest.approx(4 / 7) and metrics["accuracy"] == pytest.approx(0.5)
    assert metrics["invalid"] == pytest.approx(2 / 6)
    sst = _score("sst2", [Example(str(i), "a", None, y) for i, y in enumerate([1, 1, 0, 0])],
                 ["positive", "yes", "negative", "negative positive"])
    assert sst == {"accuracy": 0.5, "invalid": 0.5}


def test_t5_invalid_stsb_outputs_score_minus_one():
    from ember.tasks.readers.glue import Example
    from ember.tasks.metrics.classification import pearson, spearman

    gold = [0.4, 1.6, 3.0, 4.2, 5.0]
    metrics = _score("stsb", [Example(str(i), "a", "b", y) for i, y in enumerate(gold)],
                     ["0.6", "1.4", "about three", "4.0", "5.0"])
    seen = [0.6, 1.4, -1.0, 4.0, 5.0]
    assert metrics["pearson"] == pytest.approx(pearson(seen, gold))
    assert metrics["spearman"] == pytest.approx(spearman(seen, gold)) and metrics["invalid"] == 0.2


def test_t5_squad_outputs_that_are_no_span_of_the_context_score_zero():
    from ember.tasks.qa.squad import SquadExample

    context = "The Normans were the people who in the 10th and 11th centuries gave their name to Normandy."
    examples = [SquadExample("q1", "t", "Who?", context, (("The Normans", 0),), False),
                SquadExample("q2", "t", "When?", context, (("10th and 11th centuries", 40),), False),
                SquadExample("q3", "t", "Why?", context, (), True),
                SquadExample("q4", "t", "What?", context, (), True)]
    metrics = _score("squad2", examples, ["the normans", "11th century", "unanswerable", "Paris"])
    # q1 exact (normalised); q2 overlaps "11th" but "11th century" is no run of the context: 0;
    # q3 "unanswerable" = no answer: right; q4 invalid: wrong
    assert metrics["exact"] == pytest.approx(50.0) and metrics["f1"] == pytest.approx(50.0)
    assert metrics["invalid"] == 0.5 and metrics["NoAns_exact"] == 50.0


def test_t5_text2text_truncates_the_longest_text_and_keeps_prefixes_and_eos(tok):
    from ember.tasks.readers.glue import Example

    adapter = get_adapter("rte", T5)
    long_a, short_b = " ".join(["antibiotics"] * 60), "Bacteria win."
    feature = adapter.encoder(tok, 40)([Example("x", long_a, short_b, 0)], 64).features[0]
    ids = feature["input_ids"]
    text = tok.decode(ids)
    assert len(ids) == 40 and ids[-1] == tok.token_to_id("</s>") and feature["truncated"]
    assert text.startswith("rte sentence1: antibiotics") and text.endswith("sentence2: Bacteria win.")
    untouched = adapter.encoder(tok, 128)([Example("y", "Short one.", "Also short.", 1)], 64).features[0]
    assert not untouched["truncated"] and tok.decode(untouched["input_ids"]) == \
        "rte sentence1: Short one. sentence2: Also short."


def test_t5_target_longer_than_the_decoder_limit_is_one_clear_error(tok):
    from ember.tasks.qa.squad import SquadExample

    adapter = get_adapter("squad", dataclasses.replace(T5, max_position=8))
    answer = "the theory of computation in theoretical computer science"
    ex = SquadExample("q7", "t", "What?", f"It is {answer}.", ((answer, 6),), False)
    with pytest.raises(EmberError, match=r"example q7: its target .* tokens with </s>, beyond the decoder's limit "
                                         r"of 8 \(model.max_position"):
        adapter.encoder(tok, 64)([ex], adapter.decoder_limit)


def test_t5_task_without_a_text_to_text_template_is_refused():
    with pytest.raises(EmberError, match=r"--task conll2003: CoNLL-2003 has no text-to-text template.*sst2"):
        get_adapter("conll2003", T5)


def test_t5_tokenizer_that_cannot_spell_a_label_word_is_refused(tmp_path):
    from ember.tokenizers import train_tokenizer

    real_data("glue", "RTE", "dev.tsv")  # the check runs on loading the real RTE dev file

    corpus = tmp_path / "c.txt"
    corpus.write_text("entailment is a word . so is not and a b c\n\nthe end of it all")  # no "_"
    tok = train_tokenizer([corpus], kind="unigram", vocab_size=150, lowercase=False, progress=False)
    with pytest.raises(EmberError, match="cannot spell the target 'not_entailment'"):
        get_adapter("rte", T5).load("dev", tok, 64, limit=2)


def test_t5_fine_tuning_defaults_are_constant_adafactor_and_encoders_keep_berts():
    from ember.api.finetune import finetune_config

    t5 = finetune_config("sst2", T5).train
    assert (t5.optimizer, t5.schedule, t5.lr, t5.weight_decay, t5.max_grad_norm, t5.warmup_ratio) == \
        ("adafactor", "constant", 1e-3, 0.0, 0.0, 0.0)
    assert t5.adafactor_scale_parameter and t5.batch_size == 32
    bert = finetune_config("sst2", model_preset("bert-mini")).train
    assert (bert.optimizer, bert.schedule, bert.lr, bert.weight_decay) == ("adamw", "linear", 2e-5, 0.01)
    assert finetune_config("sst2", T5, lr=3e-3, overrides=["train.optimizer=adamw"]).train.optimizer == "adamw"


def test_t5_text2text_module_is_the_backbone_with_the_pretraining_loss(tok):
    """Text2TextModel's loss is the T5 objective's loss (same function, same batch), and its
    state holds backbone weights only (what `ember convert --to-hf` exports)."""
    from ember.models import build_backbone
    from ember.nn.lm_loss import seq2seq_loss

    adapter = get_adapter("sst2", T5)
    _, features = adapter.load("dev", tok, 64, limit=4)
    torch.manual_seed(0)
    cfg = dataclasses.replace(T5, vocab_size=tok.get_vocab_size(), dropout=0.0, attention_dropout=0.0)
    module = adapter.build_module(build_backbone(cfg), 0)
    batch = module.make_batch(features)
    assert (batch["labels"][:, 0] != -100).all() and (batch["labels"] == -100).any()  # different lengths
    loss, _ = module(batch)
    assert loss.item() == pytest.approx(seq2seq_loss(module.backbone, batch)[0].item())
    assert all(k.startswith("backbone.") for k in module.state_dict())
    with pytest.raises(EmberError, match="drop --features"):
        adapter.build_module(torch.nn.Linear(2, 2), 0)


@pytest.mark.slow
def test_t5_text2text_fine_tuning_on_real_sst2_learns(tmp_path, t5_glue_tokenizer):
    """A narrow t5-tiny from random init, 3 epochs on 4000 real SST-2 training phrases (375 steps,
    T5's Adafactor at lr 0.01: T5's 1e-3 is a fine-tuning rate for a pre-trained model):
    the loss falls, outputs are valid labels, and dev accuracy on all 872 sentences is above
    the majority class (50.9%) by far more than chance allows (0.6 is 5 sigma)."""
    import ember

    result = ember.finetune("sst2", tmp_path / "run", init="random", model="t5-tiny", tokenizer=str(t5_glue_tokenizer),
                            train_limit=4000, epochs=3, lr=0.01, max_length=48, progress=False,
                            overrides=TINY_T5)
    records = [json.loads(line) for line in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    train = [r["loss"] for r in records if r["split"] == "train"]
    assert np.mean(train[-3:]) < 0.5 * train[0]
    assert result.metrics["accuracy"] > 0.6 and result.metrics["invalid"] < 0.05
    saved = json.loads((tmp_path / "run" / "results.json").read_text())
    assert saved["metrics"]["invalid"] == result.metrics["invalid"] and saved["task"] == "SST-2"


@pytest.mark.parametrize("options", [{"layer_lr_decay": 0.8}, {"ulmfit": True}])
def test_t5_layerwise_options_are_refused_before_the_run_folder_is_written(options, tmp_path, t5_glue_tokenizer):
    """--layer-lr-decay / --ulmfit on a T5 run were refused when the optimizer was built, after
    config.yaml was written: the corrected command then met "already holds a run"."""
    import ember
    from ember.errors import EmberError

    with pytest.raises(EmberError, match="no layered encoder backbone"):
        ember.finetune("sst2", tmp_path / "run", init="random", model="t5-tiny", tokenizer=str(t5_glue_tokenizer),
                       train_limit=16, epochs=1, max_length=48, progress=False, overrides=TINY_T5, **options)
    assert not (tmp_path / "run").exists()


def test_t5_generated_text_spells_its_sentinels_and_drops_the_other_special_tokens(tok):
    """A span-corruption run answers in sentinels ("<extra_id_0> capital <extra_id_1>"); decoding
    without special tokens showed " capital", or an empty line for a run of sentinels."""
    from ember.tokenizers.sentinels import decode_with_sentinels

    ids = tok.encode("<extra_id_0> capital <extra_id_1>").ids  # the template appends </s>
    assert ids[-1] == tok.token_to_id("</s>") and tok.decode(ids).strip() == "capital"
    assert decode_with_sentinels(tok, ids) == "<extra_id_0> capital <extra_id_1>"
    only = [tok.token_to_id("<extra_id_0>"), tok.token_to_id("<extra_id_5>"), tok.token_to_id("<pad>")]
    assert decode_with_sentinels(tok, only) == "<extra_id_0> <extra_id_5>"
    words = tok.encode("a gem of a film").ids
    assert decode_with_sentinels(tok, words) == tok.decode(words)  # no sentinel: decode's own text
