"""K-BERT (Liu et al. 2020): entity matching, the sentence tree flattened with soft positions,
the visible matrix, and the encoder taking both as generic inputs."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from conftest import make_wordpiece
from ember.config import ModelConfig
from ember.knowledge.graph import KnowledgeGraph, Triple
from ember.knowledge.inputs import KnowledgeBase, KnowledgeInputs
from ember.knowledge.kbert import Mention, flatten_tree, visible_matrix
from ember.knowledge.matching import EntityIndex, base_forms
from ember.models import build_backbone
from hf_interop_helpers import perturb

FIGURE_2_TRIPLES = [Triple("Tim Cook", "CEO", "Apple"), Triple("Beijing", "capital", "China"),
                    Triple("Beijing", "is_a", "City")]

# K-BERT Fig. 2 / Fig. 4 (hard positions 0..12), worked out by hand from §3.3: the sentence
# [CLS] Tim Cook is visiting Beijing now sees itself; Tim and Cook also see their branch
# (CEO Apple), Beijing its two branches; a branch sees itself and its entity only.
FIGURE_2_VISIBLE = """
1 1 1 0 0 1 1 1 0 0 0 0 1
1 1 1 1 1 1 1 1 0 0 0 0 1
1 1 1 1 1 1 1 1 0 0 0 0 1
0 1 1 1 1 0 0 0 0 0 0 0 0
0 1 1 1 1 0 0 0 0 0 0 0 0
1 1 1 0 0 1 1 1 0 0 0 0 1
1 1 1 0 0 1 1 1 0 0 0 0 1
1 1 1 0 0 1 1 1 1 1 1 1 1
0 0 0 0 0 0 0 1 1 1 0 0 0
0 0 0 0 0 0 0 1 1 1 0 0 0
0 0 0 0 0 0 0 1 0 0 1 1 0
0 0 0 0 0 0 0 1 0 0 1 1 0
1 1 1 0 0 1 1 1 0 0 0 0 1
"""


def figure_2_tree(max_length: int = 0):
    tokens = ["[CLS]", "Tim", "Cook", "is", "visiting", "Beijing", "now"]
    mentions = [Mention(1, 3, [["CEO", "Apple"]]), Mention(5, 6, [["capital", "China"], ["is_a", "City"]])]
    return flatten_tree(tokens, mentions, max_length)


def test_kbert_figure_2_golden_token_order_soft_positions_and_visible_matrix():
    flat = figure_2_tree()
    assert flat.tokens == "[CLS] Tim Cook CEO Apple is visiting Beijing capital China is_a City now".split()
    assert flat.soft_positions == [0, 1, 2, 3, 4, 3, 4, 5, 6, 7, 6, 7, 6]  # Fig. 2's soft-position index
    assert flat.source == [0, 1, 2, -1, -1, 3, 4, 5, -1, -1, -1, -1, 6]
    expected = np.array([[int(c) for c in row.split()] for row in FIGURE_2_VISIBLE.strip().splitlines()], dtype=bool)
    assert flat.visible.shape == (13, 13)
    for i in range(13):
        for j in range(13):
            assert flat.visible[i, j] == expected[i, j], (flat.tokens[i], flat.tokens[j])


def test_kbert_figure_2_through_a_wordpiece_tokenizer_and_the_graph():
    """The same sentence from a triples graph and a tokenizer: [SEP] closes it, "is_a" is
    injected as the words "is a", soft positions continue from each entity."""
    tok = make_wordpiece("tim cook is visiting beijing now ceo apple capital china a city".split())
    inputs = KnowledgeInputs(tok, KnowledgeBase(KnowledgeGraph(FIGURE_2_TRIPLES), k=2))
    f = inputs.encode_text("Tim Cook is visiting Beijing now", None, 64)
    assert [tok.id_to_token(i) for i in f["input_ids"]] == (
        "[CLS] tim cook ceo apple is visiting beijing capital china is a city now [SEP]".split())
    assert f["position_ids"] == [0, 1, 2, 3, 4, 3, 4, 5, 6, 7, 6, 7, 8, 6, 7]
    assert f["word_starts"] == [1, 2, 5, 6, 7, 13]  # hard positions of the sentence's words
    v = f["visible"]
    assert v[7, 8:13].all() and not v[0, 3:5].any() and not v[8, 10:13].any() and v[10:13, 7].all()


def test_matching_takes_the_longest_name_and_skips_function_words():
    index = EntityIndex(["new york", "new york city", "york", "city", "film", "a", "it"])
    words = "A film about New York City and New York , it is".split()
    assert [(m.start, m.end, m.name) for m in index.match(words)] == [
        (1, 2, "film"), (3, 6, "new york city"), (7, 9, "new york")]
    # inflected words match through morphy's detachment rules
    assert [m.name for m in index.match("two films in cities".split())] == ["film", "city"]
    assert "city" in base_forms("cities") and "visit" in base_forms("visiting")


def test_at_most_k_triples_per_entity_in_file_order():
    graph = KnowledgeGraph(FIGURE_2_TRIPLES + [Triple("Beijing", "part_of", "China")])
    assert KnowledgeBase(graph, k=2).branches("beijing") == [["capital", "China"], ["is", "a", "City"]]
    assert KnowledgeBase(graph, k=1).branches("Beijing") == [["capital", "China"]]
    assert len(KnowledgeBase(graph, k=5).branches("Beijing")) == 3


def test_branches_that_do_not_fit_max_length_are_left_out_never_the_sentence():
    flat = figure_2_tree(max_length=10)  # 7 sentence tokens: room for one two-token branch
    assert flat.tokens == "[CLS] Tim Cook CEO Apple is visiting Beijing now".split()
    assert flat.dropped == 2 and flat.soft_positions == [0, 1, 2, 3, 4, 3, 4, 5, 6]
    assert flatten_tree(["a", "b"], [], max_length=2).tokens == ["a", "b"]


def test_visible_matrix_rules_hold_for_any_tree():
    rng = np.random.default_rng(0)
    for _ in range(20):
        n = int(rng.integers(3, 12))
        starts = sorted(rng.choice(n, size=min(3, n), replace=False).tolist())
        mentions = [Mention(s, s + 1, [[f"r{s}{b}", f"t{s}{b}"] for b in range(int(rng.integers(0, 3)))])
                    for s in starts]
        flat = flatten_tree([f"w{i}" for i in range(n)], mentions)
        v, b, a = flat.visible, np.array(flat.branch), np.array(flat.anchor)
        assert (v == v.T).all() and v.diagonal().all()
        sentence = b == 0
        assert v[np.ix_(sentence, sentence)].all()
        for i in np.nonzero(~sentence)[0]:  # a branch token: its branch and its entity, nothing else
            assert set(np.nonzero(v[i])[0]) == set(np.nonzero((b == b[i]) | (sentence & (a == a[i])))[0])
        # a sentence token outside every entity sees no injected token
        assert not v[np.ix_(sentence & (a == 0), ~sentence)].any()
        assert visible_matrix(flat.branch, flat.anchor).tolist() == v.tolist()


# -- the encoder takes a (B, T, T) visibility and position ids as generic inputs ------------------

def tiny_encoder(layers: int = 1) -> torch.nn.Module:
    cfg = ModelConfig(vocab_size=50, hidden_size=16, num_layers=layers, num_heads=2, intermediate_size=32,
                      max_position=32, dropout=0.0, attention_dropout=0.0)
    torch.manual_seed(0)
    return perturb(build_backbone(cfg))


def test_encoder_full_visibility_equals_the_padding_mask():
    enc = tiny_encoder(2)
    ids = torch.randint(5, 50, (2, 9))
    mask = torch.ones(2, 9, dtype=torch.long)
    mask[1, 6:] = 0
    visible = (mask[:, :, None] * mask[:, None, :]).bool()  # pads see nothing, are seen by nothing
    with torch.no_grad():
        a = enc(ids, mask).last_hidden_state
        b = enc(ids, visible).last_hidden_state
    assert torch.isfinite(b).all()  # a padding row that sees nothing does not turn into NaN
    torch.testing.assert_close(b[0], a[0], atol=1e-6, rtol=0)
    torch.testing.assert_close(b[1, :6], a[1, :6], atol=1e-6, rtol=0)


def test_encoder_visible_matrix_hides_branches_from_the_rest_of_the_sentence():
    """One layer: changing an injected token moves its entity's output and nothing else in the
    sentence ([CLS], the other words); soft positions are the position embeddings' ids."""
    enc = tiny_encoder(1)
    flat = figure_2_tree()
    ids = torch.arange(10, 23)[None]  # 13 tokens
    visible = torch.as_tensor(flat.visible)[None]
    soft = torch.tensor([flat.soft_positions])
    changed = ids.clone()
    changed[0, 4] = 40  # "Apple" -> something else
    with torch.no_grad():
        base = enc(ids, visible, position_ids=soft).last_hidden_state[0]
        other = enc(changed, visible, position_ids=soft).last_hidden_state[0]
        hard = enc(ids, visible).last_hidden_state[0]
    moved = (base - other).abs().amax(-1) > 1e-6
    assert moved[[1, 2, 3, 4]].all()  # Tim, Cook (the entity) and its branch
    assert not moved[[0, 5, 6, 7, 8, 9, 10, 11, 12]].any()  # [CLS], the rest, the other branches
    assert not torch.allclose(base, hard)  # soft positions are used


def test_sentence_without_entities_encodes_exactly_as_without_knowledge():
    from ember.tasks.featurize import encode_examples
    from ember.tasks.readers.glue import Example

    tok = make_wordpiece("a film about nothing".split())
    inputs = KnowledgeInputs(tok, KnowledgeBase(KnowledgeGraph(FIGURE_2_TRIPLES)))
    f = inputs.encode_text("a film about nothing", None, 16)
    plain = encode_examples([Example("x", "a film about nothing", None, 0)], tok, 16).features[0]
    assert f["input_ids"] == plain["input_ids"] and f["position_ids"] == list(range(len(plain["input_ids"])))
    assert f["visible"].all()


@pytest.mark.parametrize("pair", [False, True])
def test_removing_injected_tokens_gives_back_the_plain_encoding(pair):
    from ember.tasks.featurize import encode_examples
    from ember.tasks.readers.glue import Example

    tok = make_wordpiece("tim cook is visiting beijing now ceo apple capital china a city".split())
    inputs = KnowledgeInputs(tok, KnowledgeBase(KnowledgeGraph(FIGURE_2_TRIPLES)))
    text_b = "Beijing now" if pair else None
    f = inputs.encode_text("Tim Cook is visiting Beijing now", text_b, 64)
    plain = encode_examples([Example("x", "Tim Cook is visiting Beijing now", text_b, 0)], tok, 64).features[0]
    sentence = f["visible"][0]  # [CLS] sees exactly the sentence's own tokens
    assert [t for t, s in zip(f["input_ids"], sentence) if s] == plain["input_ids"]
    assert [t for t, s in zip(f["token_type_ids"], sentence) if s] == plain["token_type_ids"]
    injected_types = [t for t, s in zip(f["token_type_ids"], sentence) if not s]
    # A: ceo apple + capital china + is a city; B's Beijing gets its two branches, in segment 1
    assert injected_types == [0] * 7 + ([1] * 5 if pair else [])


def test_kg_show_prints_the_flattened_tree_with_soft_positions(capsys):
    from conftest import KG_SAMPLE
    from ember.cli import main

    assert main(["kg", "show", str(KG_SAMPLE), "--max-triples", "1", "Beijing, the capital of China."]) == 0
    assert capsys.readouterr().out.strip() == ("Beijing/0 [instance/1] [of/2] [national/3] [capital/4] ,/1 the/2 "
                                              "capital/3 of/4 China/5 [instance/6] [of/7] [asian/8] [country/9] ./6")
