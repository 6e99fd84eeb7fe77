"""Zero-shot similarity scoring: cosine, Pearson/Spearman x100 against values worked by hand, and
which pair files and tasks it reads."""

from __future__ import annotations

import math

import numpy as np
import pytest

from conftest import real_data

from ember.errors import EmberError
from ember.tasks.inference.similarity import PAIRS, cosine, read_pairs, similarity_metrics, similarity_task


def test_cosine_and_correlations_match_hand_computed_values():
    a = np.array([[1, 0], [1, 1], [0, 1], [1, 2], [0, 0]], dtype=np.float32)
    b = np.array([[1, 0], [1, 0], [1, 0], [2, 1], [1, 1]], dtype=np.float32)
    cos = cosine(a, b)
    # 1, 1/sqrt(2), 0 (orthogonal), (2 + 2) / (sqrt(5) sqrt(5)) = 0.8, and 0 for a zero vector
    np.testing.assert_allclose(cos, [1.0, 1 / math.sqrt(2), 0.0, 0.8, 0.0], atol=1e-7)
    gold = np.array([5.0, 3.0, 0.0, 4.0])
    got = similarity_metrics(cos[:4], gold)
    # Pearson by hand: x = (1, .70711, 0, .8), mean .626777; y = (5, 3, 0, 4), mean 3;
    # sum dx dy = 2.8, sum dx^2 = .568604, sum dy^2 = 14 -> 2.8 / sqrt(7.960456) = .992405.
    # Spearman: both rank (4, 2, 1, 3) -> 1.
    assert got == pytest.approx({"pearson_cosine": 99.2405, "spearman_cosine": 100.0, "pairs": 4.0}, abs=1e-4)


def test_pair_files_and_tasks_zero_shot_reads(tmp_path):
    assert similarity_task().name == "stsb" and similarity_task("STS-B").name == "stsb"
    assert similarity_task("", "pairs.tsv") is PAIRS
    for task in ("sst2", "mrpc"):
        with pytest.raises(EmberError, match="has class labels"):
            similarity_task(task)
    file = tmp_path / "pairs.tsv"
    file.write_text("id\tsentence1\tsentence2\tscore\n1\ta cat\ta kitten\t-0.5\n2\ta car\ta tree\t7\n")
    pairs = read_pairs(PAIRS, file=str(file))  # any numbers; extra columns are fine
    assert [(p.text_a, p.text_b, p.label) for p in pairs] == [("a cat", "a kitten", -0.5), ("a car", "a tree", 7.0)]
    file.write_text("sentence1\tsentence2\tscore\na cat\ta kitten\thigh\n")
    with pytest.raises(EmberError, match="pairs.tsv:2: score 'high' is not a number"):
        read_pairs(PAIRS, file=str(file))
    with pytest.raises(EmberError, match="give the pairs with --file"):
        read_pairs(PAIRS)


def test_stsb_dev_pairs_are_read_for_zero_shot():
    real_data("glue", "STS-B")
    pairs = read_pairs(similarity_task("stsb"), "dev")
    assert len(pairs) == 1500 and pairs[0].text_a == "A man with a hard hat is dancing." and pairs[0].label == 5.0
