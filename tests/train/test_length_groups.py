"""Length-grouped fine-tuning batches (ember.train.length_groups): every example once per epoch,
batches of similar lengths in a shuffled order, one paragraph's SQuAD windows kept apart (issue
46), and resume keeps a checkpoint's order."""

from __future__ import annotations

import csv

import numpy as np
import pytest
import torch
from torch import nn

from conftest import real_data
from ember.config import TrainConfig
from ember.data.in_memory import InMemoryData
from ember.errors import EmberError
from ember.train.length_groups import (GROUPED, POOL_BATCHES, SPREAD, feature_groups, feature_lengths, group_by_length,
                                       wants_length_groups)
from ember.train.loop import DataOrder, Trainer


def _sst2_lengths(n: int) -> np.ndarray:
    """Token counts of the first n real SST-2 training sentences under the real MiniLM tokenizer."""
    from tokenizers import Tokenizer

    tok = Tokenizer.from_file(str(real_data("checkpoints", "all-MiniLM-L6-v2", "tokenizer.json")))
    tok.no_padding()  # the checkpoint's file pads every row to 128
    with open(real_data("glue", "SST-2", "train.tsv"), encoding="utf-8") as f:
        rows = list(csv.reader(f, delimiter="\t", quoting=csv.QUOTE_NONE))[1 : n + 1]
    return np.array([len(e.ids) for e in tok.encode_batch([r[0] for r in rows])])


def _padded_tokens(order, lengths: np.ndarray, batch: int, epoch: int = 0) -> int:
    n = len(lengths)
    idx = np.array([order(epoch * n + p)[0] for p in range(n // batch * batch)]).reshape(-1, batch)
    return int((lengths[idx].max(1) * batch).sum())


def test_sst2_length_grouped_batches_visit_each_sentence_once_and_pad_far_less():
    lengths, batch = _sst2_lengths(4000), 32
    grouped, shuffled = DataOrder(len(lengths), 3, lengths, batch), DataOrder(len(lengths), seed=3)
    for epoch in (0, 1):
        seen = [grouped(epoch * len(lengths) + p) for p in range(len(lengths))]
        assert sorted(i for i, _ in seen) == list(range(len(lengths))) and {e for _, e in seen} == {epoch}
    padded_grouped, padded_shuffled = _padded_tokens(grouped, lengths, batch), _padded_tokens(shuffled, lengths, batch)
    real = int(lengths[: len(lengths) // batch * batch].sum())  # about that many real tokens
    # measured: ~1.05x the real tokens grouped against ~2.9x shuffled (SST-2's phrases are short)
    assert padded_grouped < 1.25 * real < 0.5 * padded_shuffled


def test_squad2_length_grouped_windows_pad_far_less():
    """QA fine-tuning groups its windows too (one loss term per window): real SQuAD 2.0 questions
    under the real MiniLM tokenizer, windows of up to 384 tokens as ``ember finetune`` cuts them."""
    from ember.tasks.qa.task import SquadAdapter
    from ember.tokenizers import load_tokenizer

    real_data("squad2-dev-half")
    tok = load_tokenizer(real_data("checkpoints", "all-MiniLM-L6-v2", "tokenizer.json"))
    _, features = SquadAdapter("squad2").load("train", tok, 384, limit=1500)
    lengths, batch = np.array(feature_lengths(features)), 48
    grouped, shuffled = DataOrder(len(lengths), 1, lengths, batch), DataOrder(len(lengths), seed=1)
    real = int(lengths[: len(lengths) // batch * batch].sum())
    # measured: 1.07x the real tokens grouped against 2.17x shuffled (all 4,660 windows: 1.02x, 2.02x)
    assert _padded_tokens(grouped, lengths, batch) < 1.25 * real < 0.7 * _padded_tokens(shuffled, lengths, batch)


def test_length_grouped_order_is_seeded_and_its_batches_are_not_a_length_trend():
    lengths, batch = _sst2_lengths(4000), 32
    a, b = DataOrder(len(lengths), 5, lengths, batch), DataOrder(len(lengths), 5, lengths, batch)
    assert np.array_equal(a.epoch_order(0), b.epoch_order(0))  # what exact resume rests on
    assert not np.array_equal(a.epoch_order(0), a.epoch_order(1))
    assert not np.array_equal(a.epoch_order(0), DataOrder(len(lengths), 6, lengths, batch).epoch_order(0))
    # the batches' longest rows do not rise or fall over the epoch (pools are sorted, batches shuffled)
    longest = lengths[a.epoch_order(0)[: len(lengths) // batch * batch].reshape(-1, batch)].max(1)
    trend = np.corrcoef(np.arange(len(longest)), longest)[0, 1]
    assert abs(trend) < 0.2 and len(longest) > 2 * POOL_BATCHES


def test_feature_lengths_count_inputs_and_text2text_targets_or_give_up():
    assert feature_lengths([{"input_ids": [1, 2, 3]}, {"input_ids": [1], "labels": [4, 5]}]) == [3, 3]
    assert feature_lengths([{"input_ids": [1, 2], "label": 1}]) == [2]  # a class label is no length
    assert feature_lengths([(np.zeros(3), np.zeros(3))]) is None  # not features it knows


class _Toy(nn.Module):
    """Records the lengths of the examples of every batch it is trained on."""

    loss_per_example = True

    def __init__(self):
        super().__init__()
        self.w = nn.Parameter(torch.zeros(1))
        self.seen: list[list[int]] = []

    def make_batch(self, examples, rng=None):
        self.seen.append([len(x) for x in examples])
        return {"x": torch.ones(1)}

    def forward(self, batch):
        loss = (self.w - 1.0).pow(2).sum()
        return loss, {"loss": (loss.item(), 1)}


@pytest.mark.parametrize("group", [True, False])
def test_trainer_groups_batches_when_asked_and_a_resume_keeps_the_checkpoints_order(group, tmp_path):
    rng = np.random.default_rng(0)
    examples = [[0] * int(n) for n in rng.integers(1, 60, 256)]
    data = InMemoryData(examples, [len(x) for x in examples])
    cfg = TrainConfig(batch_size=8, max_steps=6, warmup_steps=1, save_every=3, log_every=1, eval_every=0,
                      group_by_length=group)
    trainer = Trainer(_Toy(), data, cfg, tmp_path / "run", progress=False)
    assert trainer.order.name == (SPREAD if group else "shuffled")
    trainer.train()
    spread = np.mean([max(b) - min(b) for b in trainer.module.seen])
    assert (spread < 5) if group else (spread > 30)  # lengths 1-59: random batches span most of it
    # A checkpoint without "data_order" (written before grouping existed) was shuffled: resume so.
    state = trainer.trainer_state()
    assert state["data_order"] == trainer.order.name
    resumed = Trainer(_Toy(), data, cfg, tmp_path / "other", progress=False)
    resumed.keep_data_order({k: v for k, v in state.items() if k != "data_order"})
    assert resumed.order.name == "shuffled"
    # one written with the first grouping (before issue 46) resumes in that order, step for step
    resumed.keep_data_order({**state, "data_order": GROUPED})
    assert resumed.order.name == GROUPED
    perm = np.random.default_rng([cfg.seed, 0, 104729]).permutation(len(examples))
    rng = np.random.default_rng([cfg.seed, 0, 104729])
    rng.permutation(len(examples))  # the same draws DataOrder makes before grouping
    lengths = np.array([len(x) for x in examples])
    assert np.array_equal(resumed.order.epoch_order(0), group_by_length(perm, lengths, 8, rng))
    unsized = Trainer(_Toy(), InMemoryData(examples), cfg, tmp_path / "third", progress=False)
    with pytest.raises(EmberError, match="cannot reproduce"):
        unsized.keep_data_order({**state, "data_order": SPREAD})
    with pytest.raises(EmberError, match="does not know"):
        unsized.keep_data_order({**state, "data_order": "length-sorted-someday"})


def test_fine_tuning_groups_only_heads_whose_loss_is_one_term_per_example():
    """Classification, regression and QA heads average one loss per example (QA: per window), so
    grouping reweights nothing; per-token losses (tagging, text-to-text) keep shuffled batches,
    whatever train.group_by_length says. By default ("auto") these heads are shuffled too: grouped
    batches could not be shown to cost QA nothing at a short budget, and cost short SST-2 runs 0.43
    dev points (issue 46); "true" groups them, "false" groups nothing. (Task distillation, whose
    module is no fine-tuning head, stays grouped under "auto": tests/distillation/test_distill_cli.py.)"""
    from ember.tasks.classification import SequenceClassifier
    from ember.tasks.families.gpt import GptClassifier
    from ember.tasks.qa.head import QuestionAnswering
    from ember.tasks.tagging import TokenClassifier
    from ember.tasks.text2text.task import Text2TextModel
    from ember.tasks.families.xlnet import XLNetClassifier

    grouped = (SequenceClassifier, GptClassifier, XLNetClassifier, QuestionAnswering)
    assert all(getattr(c, "loss_per_example", False) for c in grouped)
    assert not any(getattr(c, "loss_per_example", False) for c in (TokenClassifier, Text2TextModel))
    wants = {setting: [c.__name__ for c in (*grouped, TokenClassifier, Text2TextModel)
                       if wants_length_groups(setting, c)] for setting in ("auto", "true", "false")}
    assert wants == {"auto": [],
                     "true": ["SequenceClassifier", "GptClassifier", "XLNetClassifier", "QuestionAnswering"],
                     "false": []}


def test_auto_groups_only_a_module_that_opts_in_as_task_distillation_does():
    """Grouping under "auto" is opt-in: a head added later with a per-example loss is shuffled
    until someone measures it; task distillation (KD, PKD), level in issue 46, opts in."""
    from ember.distillation.kd import TaskDistiller

    class NewHead(torch.nn.Module):
        loss_per_example = True

    assert not wants_length_groups("auto", NewHead) and wants_length_groups("true", NewHead)
    assert TaskDistiller.group_by_length_default is True


@pytest.mark.parametrize("given, kept", [(True, "true"), (False, "false"), ("auto", "auto"), ("AUTO", "auto"),
                                         ("off", "false"), ("yes", "true"), (1, "true"), (0, "false")])
def test_group_by_length_setting_reads_yaml_booleans_as_true_and_false(given, kept):
    """A run config saved while the setting was a bool (``group_by_length: true``) and
    ``--set train.group_by_length=false`` (YAML's false) both read as the words they meant."""
    from ember.config import apply_overrides, run_config_from_dict

    assert TrainConfig(group_by_length=given).group_by_length == kept
    cfg = run_config_from_dict(apply_overrides({}, [f"train.group_by_length={given}"]))
    assert cfg.train.group_by_length == kept and TrainConfig().group_by_length == "auto"


def test_group_by_length_setting_refuses_another_word_naming_the_choices():
    from ember.config import apply_overrides, run_config_from_dict

    with pytest.raises(EmberError, match=r"group_by_length='sometimes'; choose auto .*, true .* or false"):
        run_config_from_dict(apply_overrides({}, ["train.group_by_length=sometimes"]))


def test_resume_of_a_run_saved_with_group_by_length_true_is_not_refused_under_auto(tmp_path):
    """A run whose config.yaml says ``group_by_length: true`` (the bool default before "auto")
    resumes under today's default: the checkpoint's batch order is kept either way
    (Trainer.keep_data_order), so the change alters nothing computed; the learning rate still does."""
    from ember.config import apply_overrides, run_config_from_dict
    from ember.runs.folder import check_resume_settings

    saved = run_config_from_dict(apply_overrides({}, ["train.group_by_length=true"]))
    check_resume_settings(saved, run_config_from_dict({}), tmp_path)
    with pytest.raises(EmberError, match=r"changes \['train.lr'\]"):
        check_resume_settings(saved, run_config_from_dict(apply_overrides({}, ["train.lr=1e-3"])), tmp_path)
