"""TransE (Bordes et al. 2013): the margin ranking loss by hand, corruption, training lowers the
loss and improves held-out link prediction; entity embedding files and their bad input."""

from __future__ import annotations


import numpy as np
import pytest
import torch

from conftest import KG_SAMPLE
from ember.cli import main
from ember.errors import EmberError
from ember.knowledge.entities import EntityEmbeddings, load_entity_embeddings
from ember.knowledge.graph import read_triples
from ember.knowledge.transe import TransE, TransESettings, corrupt, train_transe



def hand_model(norm: int) -> TransE:
    model = TransE(3, 1, 2, norm)
    with torch.no_grad():
        model.entities.weight.copy_(torch.tensor([[0.0, 0.0], [1.0, 0.0], [0.0, 1.0]]))
        model.relations.weight.copy_(torch.tensor([[1.0, 0.0]]))
    return model


def test_transe_margin_loss_by_hand_l1_and_l2():
    pos = torch.tensor([[0, 0, 1], [2, 0, 1]])
    neg = torch.tensor([[0, 0, 2], [2, 0, 0]])
    # L1: d(pos) = |0 + 1 - 1| + |0 - 0| = 0 and |0+1-1| + |1-0| = 1; d(neg) = |1| + |-1| = 2 and 1 + 1 = 2
    l1 = hand_model(1)
    assert l1.energy(pos).tolist() == [0.0, 1.0] and l1.energy(neg).tolist() == [2.0, 2.0]
    assert float(l1.loss(pos, neg, margin=3.0).detach()) == pytest.approx((3 + 0 - 2) + (3 + 1 - 2))
    assert float(l1.loss(pos, neg, margin=1.0).detach()) == pytest.approx(0.0 + 0.0)  # both pairs beyond the margin
    # L2: d(neg) = sqrt(2) for both; with margin 1 only the second pair is inside it
    assert float(hand_model(2).loss(pos, neg, margin=1.0).detach()) == pytest.approx(1 + 1 - 2 ** 0.5, abs=1e-6)


def test_corruption_replaces_head_or_tail_never_both_nor_the_relation():
    rng = np.random.default_rng(0)
    triples = np.stack([np.arange(1000), np.zeros(1000, dtype=np.int64), np.arange(1000) + 1000], 1)
    bad = corrupt(triples, 5000, rng)
    head_changed, tail_changed = bad[:, 0] != triples[:, 0], bad[:, 2] != triples[:, 2]
    assert not (head_changed & tail_changed).any() and (bad[:, 1] == 0).all()
    assert 400 < head_changed.sum() < 600 and 400 < tail_changed.sum() < 600


def test_transe_training_lowers_the_loss_and_improves_link_prediction_on_wordnet_sample():
    torch.set_num_threads(1)
    graph = read_triples(KG_SAMPLE)
    result = train_transe(graph, TransESettings(dim=16, epochs=6, batch_size=256, held_out=300), progress=False)
    assert all(later < earlier for earlier, later in zip(result.losses, result.losses[1:]))  # every epoch
    assert result.losses[-1] < 0.97 * result.losses[0]
    assert result.held_out["after"]["mean_rank"] < result.held_out["before"]["mean_rank"]
    table = result.embeddings
    assert len(table.names) == len(graph.entities()) and table.vectors.shape == (len(table.names), 16)
    assert torch.allclose(table.vectors.norm(dim=1), torch.ones(len(table.names)), atol=1e-5)  # Algorithm 1, l. 5


def test_kg_embed_cli_round_trip_and_vocabulary_mismatch(tmp_path, capsys):
    out = tmp_path / "emb"
    assert main(["kg", "embed", str(KG_SAMPLE), "--out", str(out), "--dim", "8", "--epochs", "1",
                 "--relations", "is_a,part_of"]) == 0
    table = load_entity_embeddings(out)
    assert table.dim == 8 and table.relation_names == ["is_a", "part_of"]
    lines = (out / "entities.tsv").read_text().splitlines()
    (out / "entities.tsv").write_text("\n".join(lines + ["one more entity"]) + "\n")
    with pytest.raises(EmberError, match=rf"lists {len(lines) + 1} entities but .*has {len(lines)} rows: the vocabulary "
                                         "and the embedding file do not belong together"):
        load_entity_embeddings(out)
    (out / "entities.tsv").write_text("\n".join(lines[:2] + [lines[0]] + lines[3:]) + "\n")
    with pytest.raises(EmberError, match=r"entities.tsv:3: entity .* is listed twice \(first at line 1\)"):
        load_entity_embeddings(out)
    (out / "entities.tsv").write_text("\n".join(lines[:2] + [""] + lines[3:]) + "\n")
    with pytest.raises(EmberError, match="entities.tsv:3: empty line"):
        load_entity_embeddings(out)
    with pytest.raises(EmberError, match="no entity embeddings here"):
        load_entity_embeddings(tmp_path)


def test_openke_layout_loads_and_its_mismatches_are_refused(tmp_path):
    (tmp_path / "entity2id.txt").write_text("3\nBeijing\t0\nChina\t2\ncity\t1\n")
    (tmp_path / "entity2vec.vec").write_text("0.1 0.2\n0.3 0.4\n0.5 0.6\n")
    table = load_entity_embeddings(tmp_path)
    assert table.names == ["Beijing", "city", "China"] and table.vectors[2].tolist() == pytest.approx([0.5, 0.6])
    (tmp_path / "entity2vec.vec").write_text("0.1 0.2\n0.3 0.4\n")
    with pytest.raises(EmberError, match="names 3 entities but .*entity2vec.vec has 2 vectors"):
        load_entity_embeddings(tmp_path)
    (tmp_path / "entity2id.txt").write_text("3\nBeijing\t0\nChina\t7\ncity\t1\n")
    with pytest.raises(EmberError, match=r"entity2id.txt:3: id 7 is out of range"):
        load_entity_embeddings(tmp_path)


def test_saved_embeddings_load_back_identically(tmp_path):
    table = EntityEmbeddings(["a", "b c"], torch.randn(2, 4), ["r"], torch.randn(1, 4))
    table.save(tmp_path, {"note": 1})
    back = load_entity_embeddings(tmp_path)
    assert back.names == table.names and torch.equal(back.vectors, table.vectors)
    assert torch.equal(back.relation_vectors, table.relation_vectors)
