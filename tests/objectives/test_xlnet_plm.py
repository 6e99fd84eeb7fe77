"""XLNet's permutation LM (objective plm): factorisation orders, targets and the two streams'
masks (golden, by hand and for a fixed seed), their statistics over many draws on real text,
the no-leak property through the model, the data layout with memory, and bad settings."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from conftest import TINY_MODEL
from ember.config import ModelConfig, PlmConfig, apply_overrides, load_yaml, run_config_from_dict
from ember.data.memory_pairs import MemoryPair, MemorySegmentPairs
from ember.errors import EmberError
from ember.models import build_backbone
from ember.nn.two_stream import two_stream_masks
from ember.objectives.permutation import (
    ngram_length_probs,
    order_of,
    permutation_mask,
    plan_sequence,
    sample_targets,
)
from ember.objectives.plm import PermutationLM

V = 100
CONTINUES = np.arange(V) >= 50  # toy vocabulary: ids >= 50 continue the word before them
SPECIAL = {"sep": 3, "cls": 2}


def tiny_module(seq_len: int = 12, k: float = 4.0, mem_len: int = 0, **plm) -> PermutationLM:
    cfg = ModelConfig(family="xlnet", vocab_size=V, hidden_size=16, num_layers=2, num_heads=2,
                      intermediate_size=32, max_position=seq_len, mem_len=mem_len)
    torch.manual_seed(0)
    return PermutationLM(build_backbone(cfg), PlmConfig(k=k, **plm), seq_len, SPECIAL, CONTINUES)


def test_xlnet_perm_mask_golden_by_hand():
    # "a b c <sep> d <sep> <cls>": targets b, c; order: context {a, d}, then <sep>3, <sep>5, b, <cls>, c
    ranks = np.array([-1, 2, 5, 0, -1, 1, 3])
    target = np.array([0, 1, 1, 0, 0, 0, 0], dtype=bool)
    blocked = permutation_mask(ranks, target)
    #                                        a  b  c  s  d  s  cls
    assert blocked.astype(int).tolist() == [[0, 1, 1, 1, 0, 1, 1],   # a: context sees the context only
                                            [0, 1, 1, 0, 0, 0, 1],   # b: a d <sep> <sep> - not itself
                                            [0, 0, 1, 0, 0, 0, 0],   # c: last: everything but itself
                                            [0, 1, 1, 0, 0, 1, 1],   # <sep>3: context and itself
                                            [0, 1, 1, 1, 0, 1, 1],   # d: like a
                                            [0, 1, 1, 0, 0, 0, 1],   # <sep>5: ... and <sep>3
                                            [0, 0, 1, 0, 0, 0, 0]]   # <cls>: all but c
    content, query = two_stream_masks(7, 0, torch.from_numpy(blocked)[None])
    assert torch.equal(query[0], torch.from_numpy(~blocked))
    # the content stream sees what the query stream sees, plus its own token (only b and c gain it)
    gained = (content[0] & ~query[0]).nonzero().tolist()
    assert gained == [[1, 1], [2, 2]]
    assert order_of(ranks).tolist() == [0, 4, 3, 5, 1, 6, 2]


def test_xlnet_factorization_order_targets_and_masks_golden_for_a_fixed_seed():
    ids = np.array([10, 51, 11, 12, 52, 53, 3, 13, 14, 54, 3, 2])  # words: 10 51 | 11 | 12 52 53 | 13 | 14 54
    structure = np.isin(np.arange(12), [6, 10, 11])
    plan = plan_sequence(ids, structure, 3, 4.0, ngram_length_probs(5), np.random.default_rng(0), CONTINUES)
    assert plan.positions.tolist() == [1, 8, 9]  # the word "14 54" as a span, "51" topped up
    assert plan.ranks.tolist() == [-1, 2, -1, -1, -1, -1, 1, -1, 11, 6, 9, 8]
    assert order_of(plan.ranks).tolist() == [0, 2, 3, 4, 5, 7, 6, 1, 9, 11, 10, 8]
    # worked out from the ranks: row i blocks j if j is a target/structure token not before i
    assert plan.perm_mask.astype(int).tolist() == [
        [0, 1, 0, 0, 0, 0, 1, 0, 1, 1, 1, 1],
        [0, 1, 0, 0, 0, 0, 0, 0, 1, 1, 1, 1],
        [0, 1, 0, 0, 0, 0, 1, 0, 1, 1, 1, 1],
        [0, 1, 0, 0, 0, 0, 1, 0, 1, 1, 1, 1],
        [0, 1, 0, 0, 0, 0, 1, 0, 1, 1, 1, 1],
        [0, 1, 0, 0, 0, 0, 1, 0, 1, 1, 1, 1],
        [0, 1, 0, 0, 0, 0, 0, 0, 1, 1, 1, 1],
        [0, 1, 0, 0, 0, 0, 1, 0, 1, 1, 1, 1],
        [0, 0, 0, 0, 0, 0, 0, 0, 1, 0, 0, 0],
        [0, 0, 0, 0, 0, 0, 0, 0, 1, 1, 1, 1],
        [0, 0, 0, 0, 0, 0, 0, 0, 1, 0, 0, 0],
        [0, 0, 0, 0, 0, 0, 0, 0, 1, 0, 1, 0],
    ]


def test_xlnet_plm_batch_layout_cls_at_the_end_and_one_hot_targets():
    module = tiny_module(mem_len=4)
    example = MemoryPair(np.array([20, 21, 22, 23]), np.array([10, 51, 11, 12, 52, 53]), np.array([13, 14, 54]), True)
    batch = module.make_batch([example, example], np.random.default_rng(0))
    assert batch["input_ids"][0].tolist() == [10, 51, 11, 12, 52, 53, 3, 13, 14, 54, 3, 2]
    assert batch["token_type_ids"][0].tolist() == [0] * 7 + [1] * 4 + [2]
    assert batch["memory_ids"].tolist() == [[20, 21, 22, 23]] * 2
    assert batch["perm_mask"].shape == (2, 12, 12) and batch["target_mapping"].shape == (2, 3, 12)
    mapping, labels = batch["target_mapping"], batch["target_labels"]
    assert torch.equal(mapping.sum(-1), torch.ones(2, 3))  # one position per target
    positions = mapping.argmax(-1)
    assert torch.equal(labels, batch["input_ids"].gather(1, positions))
    assert not np.isin(positions.numpy(), [6, 10, 11]).any()  # <sep>/<cls> are never predicted
    assert batch["attention_mask"].all()


def test_xlnet_query_stream_never_sees_its_own_token_or_later_targets():
    """Through the model: a target's query-stream output ignores its own token and every token
    after it in the order; the context's content stream ignores every target; earlier tokens
    and the context do reach the query stream."""
    module = tiny_module(seq_len=16, k=3.0).eval()
    rng = np.random.default_rng(5)
    example = MemoryPair(np.zeros(0, dtype=np.int64), rng.integers(5, V, 7), rng.integers(5, V, 6), True)
    batch = module.make_batch([example], np.random.default_rng(1))
    # the batch's plan, drawn again from the same generator (one sequence: the whole draw)
    ids, _, structure = module.layout(example.tokens_a, example.tokens_b)
    plan = plan_sequence(ids, structure, module.num_predict, 3.0, module.probs, np.random.default_rng(1), CONTINUES)
    assert np.array_equal(plan.perm_mask, batch["perm_mask"][0].numpy())
    positions, ranks = plan.positions.tolist(), plan.ranks
    context = np.flatnonzero(ranks < 0).tolist()

    def run(ids):
        with torch.no_grad():
            out = module.backbone(ids, None, batch["token_type_ids"], perm_mask=batch["perm_mask"],
                                  target_mapping=batch["target_mapping"])
        return out.query_hidden[0], out.last_hidden_state[0]

    query, content = run(batch["input_ids"])
    for n, p in enumerate(positions):
        later = [q for q in positions if ranks[q] >= ranks[p]]  # itself and targets after it
        changed = batch["input_ids"].clone()
        changed[0, later] = (changed[0, later] + 1) % V
        q2, c2 = run(changed)
        torch.testing.assert_close(q2[n], query[n], atol=1e-6, rtol=0)
        torch.testing.assert_close(c2[context], content[context], atol=1e-6, rtol=0)
        assert (c2[p] - content[p]).abs().max() > 1e-4  # the content stream does see its own token
    changed = batch["input_ids"].clone()
    changed[0, context[0]] = (changed[0, context[0]] + 1) % V
    assert (run(changed)[0] - query).abs().max() > 1e-4


def test_xlnet_span_lengths_are_drawn_with_probability_proportional_to_one_over_n():
    # XLNet's _sample_mask: P(n) = (1/n) / sum_m 1/m, n = 1..max_span
    harmonic = 1 + 1 / 2 + 1 / 3 + 1 / 4 + 1 / 5
    np.testing.assert_allclose(ngram_length_probs(5), [1 / harmonic, 1 / (2 * harmonic), 1 / (3 * harmonic),
                                                       1 / (4 * harmonic), 1 / (5 * harmonic)], rtol=1e-12)
    assert ngram_length_probs(1).tolist() == [1.0]


class RecordingRng:
    """A numpy Generator that records which draws sample_targets makes, in order."""

    def __init__(self, seed: int = 0):
        self.rng, self.calls = np.random.default_rng(seed), []

    def random(self):
        self.calls.append("random")
        return self.rng.random()

    def integers(self, high):
        self.calls.append(("integers", int(high)))
        return self.rng.integers(high)

    def choice(self, a, size, replace):
        self.calls.append(("choice", int(size)))
        return self.rng.choice(a, size, replace=replace)


def _one_token_words(t: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    return np.arange(t), np.arange(1, t + 1), np.ones(t, dtype=bool)


def test_xlnet_targets_stop_drawing_once_num_predict_tokens_are_taken():
    """Spans of one word (max_span 1) with K = 1.5: context int(1 * 1.5) = 1 word, so the offset
    l in [0, 1) is 0 and every span is followed by one skipped word. Three spans fill
    num_predict = 3 exactly: no further span is drawn and nothing is topped up."""
    rng = RecordingRng()
    target = sample_targets(*_one_token_words(10), 3, 1.5, ngram_length_probs(1), rng)
    assert np.flatnonzero(target).tolist() == [0, 2, 4]
    assert rng.calls == ["random", ("integers", 1)] * 3


def test_xlnet_targets_top_up_after_the_words_run_out_exactly():
    """Six one-token words, one span per two words: the spans end exactly at the last word
    (w == 6), the loop stops without another draw and two random single tokens make up the
    shortfall, drawn from the three words not yet taken."""
    rng = RecordingRng()
    target = sample_targets(*_one_token_words(6), 5, 1.5, ngram_length_probs(1), rng)
    assert rng.calls == ["random", ("integers", 1)] * 3 + [("choice", 2)]
    assert target.sum() == 5 and target[[0, 2, 4]].all()


def test_xlnet_targets_without_context_are_back_to_back_and_draw_no_offset():
    # n * K < 1 (here K = 0): no context words, so no offset is drawn and spans touch
    rng = RecordingRng()
    target = sample_targets(*_one_token_words(8), 3, 0.0, ngram_length_probs(1), rng)
    assert np.flatnonzero(target).tolist() == [0, 1, 2]
    assert rng.calls == ["random"] * 3


def test_xlnet_targets_when_exactly_num_predict_tokens_are_predictable():
    candidates = np.array([1, 1, 0, 1, 1, 1, 0], dtype=bool)  # 5 predictable tokens, 2 structure
    starts, ends = np.array([0, 1, 3, 4, 5]), np.array([1, 2, 4, 5, 6])
    target = sample_targets(starts, ends, candidates, 5, 1.5, ngram_length_probs(1), np.random.default_rng(0))
    assert target.tolist() == candidates.tolist()
    with pytest.raises(EmberError, match="5 predictable tokens, fewer than plm.num_predict=6"):
        sample_targets(starts, ends, candidates, 6, 1.5, ngram_length_probs(1), np.random.default_rng(0))


@pytest.fixture(scope="module")
def wiki_plm(wiki_prepared):
    from ember.data.shards import TokenCorpus
    from ember.objectives import build_objective

    cfg = run_config_from_dict(apply_overrides(load_yaml("ember/recipes/xlnet-mini.yaml"), TINY_MODEL + [
        "data.max_seq_length=128", "model.max_position=128", "model.mem_len=32"]))
    corpus = TokenCorpus(wiki_prepared, "train")
    special = {**corpus.special_token_ids, "tokenizer_path": str(corpus.tokenizer_path)}
    module = build_objective(cfg, special)
    return module, module.build_dataset(corpus, cfg.data, 0)


def test_xlnet_plm_predicts_one_kth_spread_over_the_sequence_in_word_spans_on_real_text(wiki_plm):
    module, data = wiki_plm
    assert module.num_predict == 21  # round(128 / 6)
    rng = np.random.default_rng(0)
    examples = [data.example(i) for i in rng.choice(len(data), 256, replace=False)]
    batch = module.make_batch(examples, np.random.default_rng(1))
    ids = batch["input_ids"].numpy()
    predicted = batch["target_mapping"].sum(1).numpy().astype(bool)  # (B, T)
    predictable = np.ones_like(predicted)  # all but <sep> (after A, before <cls>) and <cls>
    predictable[:, -2:] = False
    predictable[np.arange(len(ids)), (batch["token_type_ids"].numpy() == 0).sum(1) - 1] = False
    assert not (predicted & ~predictable).any()
    assert abs(predicted.sum() / predictable.sum() - 21 / 125) < 1e-9  # exactly num_predict per sequence
    thirds = [predicted[:, s].sum() / predictable[:, s].sum() for s in (slice(0, 43), slice(43, 86), slice(86, 128))]
    assert all(abs(f - 1 / 6) < 0.03 for f in thirds), thirds  # ~1/K everywhere, no gross drift
    # spans: runs of consecutive targets, mostly whole words, several tokens long on average
    continues = module.continues_word[ids]
    runs = np.diff(np.pad(predicted.astype(int), ((0, 0), (1, 1))), axis=1)
    starts, ends = np.nonzero(runs == 1), np.nonzero(runs == -1)
    lengths = ends[1] - starts[1]
    whole = ~continues[starts] & ~np.pad(continues, ((0, 0), (0, 1)))[ends]
    spans = lengths > 1  # single tokens are mostly the top-up
    stats = (lengths[spans].sum() / lengths.sum(), whole[spans].mean(), whole[~spans].mean())
    assert stats[0] > 0.7 and stats[1] > 0.9 > stats[2], stats


def test_xlnet_memory_pairs_tile_the_stream_with_the_text_before_as_memory(wiki_plm):
    _, data = wiki_plm
    stream, window, m = data.stream, data.window, data.mem_len
    follows = []
    for i in range(len(data)):
        ex = data.example(i, epoch=0)
        start = m + i * window
        assert np.array_equal(ex.memory, stream.slice(start - m, start))
        assert len(ex.tokens_a) + len(ex.tokens_b) == window
        seen = np.concatenate([ex.tokens_a, ex.tokens_b]) if ex.b_follows else ex.tokens_a
        assert np.array_equal(seen, stream.slice(start, start + len(seen)))
        follows.append(ex.b_follows)
    assert 0.45 < np.mean(follows) < 0.55  # random_segment_prob 0.5
    again, other = data.example(3, epoch=0), data.example(3, epoch=1)
    assert np.array_equal(again.tokens_a, data.example(3, epoch=0).tokens_a)
    cuts = {len(data.example(i, epoch=e).tokens_a) for i in range(5) for e in range(4)}
    assert len(cuts) > 5 and other.memory.tolist() == again.memory.tolist()


def test_xlnet_plm_settings_that_leave_nothing_to_predict_are_clear_errors():
    with pytest.raises(EmberError, match="leaves nothing to predict"):
        tiny_module(seq_len=12, k=30.0)
    with pytest.raises(EmberError, match="needs K > 1"):
        tiny_module(k=1.0)
    with pytest.raises(EmberError, match="only 9 predictable tokens"):
        tiny_module(seq_len=12, num_predict=10)
    cfg = ModelConfig(family="xlnet", vocab_size=V, hidden_size=16, num_layers=1, num_heads=2, mem_len=8, reuse_len=4)
    with pytest.raises(EmberError, match="reuse_len=0"):
        PermutationLM(build_backbone(cfg), PlmConfig(), 12, SPECIAL)


def test_xlnet_plm_settings_at_their_boundaries_are_accepted():
    """Each settings check's edge is allowed: K just above 1, spans of a single word, a
    setting that rounds to exactly one target, every predictable token a target (T - 3),
    a memory reused whole (reuse_len = mem_len)."""
    assert tiny_module(k=1.5).num_predict == 8  # round(12 / 1.5)
    assert tiny_module(max_span=1).probs.tolist() == [1.0]
    with pytest.raises(EmberError, match="max_span=0"):
        tiny_module(max_span=0)
    with pytest.raises(EmberError, match="num_predict=-1"):
        tiny_module(num_predict=-1)
    assert tiny_module(seq_len=12, k=8.0).num_predict == 2  # round(1.5): numpy/Python round half to even
    assert tiny_module(seq_len=12, k=12.0).num_predict == 1
    assert tiny_module(seq_len=12, num_predict=9).num_predict == 9
    cfg = ModelConfig(family="xlnet", vocab_size=V, hidden_size=16, num_layers=1, num_heads=2, mem_len=8, reuse_len=8)
    assert PermutationLM(build_backbone(cfg), PlmConfig(), 12, SPECIAL).num_predict == 2


def test_xlnet_plm_loss_is_the_mean_cross_entropy_of_the_query_stream_ignoring_minus_100():
    """forward's loss against torch's cross_entropy (ignore_index=-100) on the query stream's
    logits: with every target labelled, and with one label set to -100 (the padding
    convention), which then drops out of the mean. No memory here (mem_len 0): tests/interop
    checks the memory pass against transformers."""
    module = tiny_module(seq_len=16, k=3.0).eval()
    rng = np.random.default_rng(2)
    examples = [MemoryPair(np.zeros(0, dtype=np.int64), rng.integers(5, V, 7), rng.integers(5, V, 6), True)
                for _ in range(2)]
    batch = module.make_batch(examples, np.random.default_rng(3))
    with torch.no_grad():
        out = module.backbone(batch["input_ids"], batch["attention_mask"], batch["token_type_ids"],
                              perm_mask=batch["perm_mask"], target_mapping=batch["target_mapping"])
        logits = module.backbone.lm_logits(out.query_hidden)  # (B, N, V)
        for labels in (batch["target_labels"], batch["target_labels"].clone().index_put_(
                (torch.tensor([1]), torch.tensor([2])), torch.tensor(-100))):
            loss, metrics = module({**batch, "target_labels": labels})
            expected = torch.nn.functional.cross_entropy(logits.flatten(0, 1), labels.flatten(), ignore_index=-100)
            # the same logits, but ember's loss takes the LM head in another order (no full logits)
            torch.testing.assert_close(loss, expected, atol=1e-5, rtol=1e-5)
            assert metrics["loss"] == metrics["plm_loss"]
    assert metrics["plm_loss"][1] == 2 * module.num_predict - 1


def test_xlnet_plm_perplexity_is_exp_of_the_loss_and_absent_without_one():
    assert PermutationLM.derived_metrics({"plm_loss": 2.0}) == {"plm_ppl": pytest.approx(np.exp(2.0))}
    assert PermutationLM.derived_metrics({"loss": 2.0}) == {}
    assert np.isfinite(PermutationLM.derived_metrics({"plm_loss": 1e6})["plm_ppl"])  # a diverged run stays finite


def test_xlnet_plm_refuses_other_backbones_and_a_corpus_shorter_than_its_memory(wiki_prepared):
    from ember.data.shards import TokenCorpus
    from ember.objectives import build_objective

    bert = run_config_from_dict({"objective": "plm", "model": {"preset": "bert-tiny"}})
    with pytest.raises(EmberError, match="needs the XLNet backbone"):
        build_objective(bert, {"sep": 3, "cls": 2})
    with pytest.raises(EmberError, match="smaller model.mem_len"):
        MemorySegmentPairs(TokenCorpus(wiki_prepared, "valid"), 3, 125, 10**7)
