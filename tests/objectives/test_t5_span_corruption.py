"""T5's span corruption and the §3.3 comparison objectives (Raffel et al. 2020): golden, seeded
and distributional tests of the corruption itself (no backbone needed)."""

from __future__ import annotations

import math

import numpy as np
import pytest

from ember.config import DenoisingConfig
from ember.errors import EmberError
from ember.objectives import noise as N
from ember.objectives.span_corruption import DENOISERS, Corruption, noise_vocab

SENTINELS = np.arange(999, 899, -1)  # T5's order: <extra_id_0> has the last id
VOCAB = N.NoiseVocab(SENTINELS, np.arange(3, 900), 0.1)
EOS = 1
WIKI_SENTENCE = ("Anarchism is a political philosophy that advocates stateless societies often defined as "
                 "self-governed voluntary institutions.")


@pytest.fixture(scope="module")
def t5_tok(wiki_t5_prepared):
    from ember.tokenizers import load_tokenizer

    return load_tokenizer(wiki_t5_prepared / "tokenizer.json")


def corruption(name: str, inputs_length: int = 128, **settings) -> Corruption:
    return Corruption(name, DenoisingConfig(**settings), inputs_length, VOCAB, EOS)


# -- length arithmetic -----------------------------------------------------------------------

def test_t5_span_corruption_lengths_512_inputs_568_raw_114_targets():
    """T5's random_spans_helper: 568 raw tokens -> round(85.2) = 85 noise tokens in
    round(85 / 3) = 28 spans: inputs 483 + 28 sentinels + EOS = 512, targets 85 + 28 + EOS =
    114; 569 raw tokens would give 513 inputs (round(85.35) = 85, 484 + 28 + 1)."""
    assert N.random_spans_lengths(512, 0.15, 3.0) == (568, 114)
    assert N.random_spans_lengths(128, 0.15, 3.0) == (141, 29)  # 21 noise in 7 spans: 120+7+1, 21+7+1
    c = corruption("span_corruption", 512)
    assert (c.raw_length, c.targets_length) == (568, 114)
    tokens = np.arange(100, 668)
    for seed in range(20):
        inputs, targets = c(tokens, np.random.default_rng(seed))
        assert (len(inputs), len(targets)) == (512, 114)  # packed: never any padding


def test_t5_span_corruption_needs_enough_sentinels():
    few = N.NoiseVocab(SENTINELS[:20], np.arange(3, 900))
    with pytest.raises(EmberError, match=r"gives 28 corrupted spans.*20 sentinels.*--sentinels 28"):
        Corruption("span_corruption", DenoisingConfig(), 512, few, EOS)
    with pytest.raises(EmberError, match="denoising.noise_density"):
        corruption("span_corruption", noise_density=1.5)
    with pytest.raises(EmberError, match="denoising.mean_noise_span_length"):
        corruption("span_corruption", mean_noise_span_length=0.5)


# -- the noise mask --------------------------------------------------------------------------

def test_t5_span_corruption_noise_mask_golden_for_a_seed():
    mask = N.random_spans_noise_mask(40, 0.15, 3.0, np.random.default_rng(1234))
    # round(6.0) = 6 noise tokens in round(2.0) = 2 spans; non-noise first, noise last
    assert np.flatnonzero(mask).tolist() == [33, 34, 35, 36, 37, 39]
    mask = N.random_spans_noise_mask(568, 0.15, 3.0, np.random.default_rng(0))
    assert np.flatnonzero(mask)[:12].tolist() == [35, 65, 150, 176, 177, 180, 181, 182, 183, 184, 185, 186]


def _runs(mask: np.ndarray) -> tuple[list[int], list[int]]:
    """Lengths of the noise runs and of the non-noise runs."""
    edges = np.flatnonzero(np.diff(np.concatenate([[-1], mask.astype(int), [-1]])) != 0)
    lengths = np.diff(edges)
    values = mask[edges[:-1]]
    return lengths[values].tolist(), lengths[~values].tolist()


def test_t5_span_corruption_masks_alternate_with_exact_counts():
    rng = np.random.default_rng(7)
    for length in (2, 3, 10, 37, 141, 568, 1000):
        mask = N.random_spans_noise_mask(length, 0.15, 3.0, rng)
        num_noise, num_spans = N.span_counts(length, 0.15, 3.0)
        noise_runs, kept_runs = _runs(mask)
        assert mask.sum() == num_noise and len(noise_runs) == len(kept_runs) == num_spans
        assert not mask[0] and mask[-1]  # starts with non-noise, ends with noise
    assert not N.random_spans_noise_mask(1, 0.15, 3.0, rng).any()


def test_t5_span_lengths_follow_a_uniform_random_segmentation():
    """85 noise tokens in 28 spans, every composition equally likely: a span has length j
    with probability C(85 - j - 1, 26) / C(84, 27). Over 3000 masks the observed share of
    each length matches; the mean span length is 85 / 28 = 3.04 and the density 85 / 568."""
    rng = np.random.default_rng(0)
    lengths, densities = [], []
    for _ in range(3000):
        mask = N.random_spans_noise_mask(568, 0.15, 3.0, rng)
        lengths += _runs(mask)[0]
        densities.append(mask.mean())
    lengths = np.array(lengths)
    for j in range(1, 7):
        exact = math.comb(85 - j - 1, 26) / math.comb(84, 27)
        assert abs((lengths == j).mean() - exact) < 0.01, j
    assert lengths.mean() == pytest.approx(85 / 28)
    assert np.mean(densities) == pytest.approx(0.1496, abs=1e-4)
    # over many sequence lengths, the mean span length and density are the configured ones
    means, dens = [], []
    for length in rng.integers(100, 1000, size=500):
        mask = N.random_spans_noise_mask(int(length), 0.15, 3.0, rng)
        noise_runs = _runs(mask)[0]
        means.append(np.mean(noise_runs))
        dens.append(mask.mean())
    assert np.mean(means) == pytest.approx(3.0, abs=0.05)
    assert np.mean(dens) == pytest.approx(0.15, abs=0.002)


# -- sentinels and the text of inputs / targets -----------------------------------------------

def test_t5_span_corruption_paper_figure_2():
    """Figure 2 of the paper: "for inviting" and "last" dropped from "Thank you for inviting me
    to your party last week." -> inputs "Thank you <X> me to your party <Y> week." and targets
    "<X> for inviting <Y> last <Z>" (sentinels <extra_id_0>, <extra_id_1>, <extra_id_2>)."""
    words = "Thank you for inviting me to your party last week .".split()
    ids = np.arange(10, 10 + len(words))
    mask = np.isin(words, ["for", "inviting", "last"])
    name = {**{10 + i: w for i, w in enumerate(words)}, **{int(s): f"<extra_id_{k}>" for k, s in enumerate(SENTINELS)}}
    inputs = N.noise_span_to_unique_sentinel(ids, mask, VOCAB)
    targets = N.nonnoise_span_to_unique_sentinel(ids, mask, VOCAB)
    assert " ".join(name[int(i)] for i in inputs) == "Thank you <extra_id_0> me to your party <extra_id_1> week ."
    assert " ".join(name[int(i)] for i in targets) == "<extra_id_0> for inviting <extra_id_1> last <extra_id_2>"


def test_t5_span_corruption_sentinels_in_order_and_inputs_targets_rebuild_the_text():
    c = corruption("span_corruption", 512)
    tokens = np.random.default_rng(3).integers(3, 900, size=568)
    inputs, targets = c(tokens, np.random.default_rng(11))
    assert inputs[-1] == targets[-1] == EOS
    in_sent = [int(i) for i in inputs if i in SENTINELS]
    tg_sent = [int(i) for i in targets if i in SENTINELS]
    assert in_sent == tg_sent == SENTINELS[:28].tolist()  # <extra_id_0>, <extra_id_1>, ... in order
    assert inputs[-2] == SENTINELS[27] and targets[0] == SENTINELS[0]  # ends with noise
    # each sentinel of the inputs, replaced by what follows it in the targets, gives the text back
    spans = np.split(targets[:-1], np.flatnonzero(np.isin(targets[:-1], SENTINELS)))[1:]
    rebuilt = np.concatenate([spans[in_sent.index(int(i))][1:] if i in SENTINELS else [i] for i in inputs[:-1]])
    np.testing.assert_array_equal(rebuilt, tokens)


def test_t5_span_corruption_exact_strings_on_a_wiki_sentence(t5_tok):
    """A real sentence, the T5-layout tokenizer trained on wiki-en (tests/conftest.py), seed 5:
    39 pieces, round(5.85) = 6 noise tokens in 2 spans. Golden strings for this tokenizer."""
    ids = np.array(t5_tok.encode(WIKI_SENTENCE, add_special_tokens=False).ids)
    assert len(ids) == 39
    c = Corruption("span_corruption", DenoisingConfig(), 128, noise_vocab(t5_tok, 0.1), t5_tok.token_to_id("</s>"))
    inputs, targets = c(ids, np.random.default_rng(5))
    def decode(ids):
        return t5_tok.decode(ids.tolist(), skip_special_tokens=False)

    assert decode(inputs) == ("Anarchism is a political philosophy that advocates stateless societies often defined "
                              "as sel<extra_id_0>ned voluntary<extra_id_1></s>")
    assert decode(targets) == "<extra_id_0>f-gover<extra_id_1> institutions.</s>"


# -- the comparison objectives (§3.3, Tables 3 and 4) ------------------------------------------

def test_t5_comparison_objectives_exact_strings_on_a_wiki_sentence(t5_tok):
    ids = np.array(t5_tok.encode(WIKI_SENTENCE, add_special_tokens=False).ids)
    vocab = noise_vocab(t5_tok, 0.1)

    def decode(ids):
        return t5_tok.decode(ids.tolist(), skip_special_tokens=False)

    golden = {
        "replace_spans": ("Anarchism<extra_id_0> a political<extra_id_1> advocates stateless<extra_id_2> often "
                          "defined as<extra_id_3>self-go<extra_id_4>n<extra_id_5> voluntary institution<extra_id_6></s>",
                          "<extra_id_0> is<extra_id_1> philosophy that<extra_id_2> societies<extra_id_3> "
                          "<extra_id_4>ver<extra_id_5>ed<extra_id_6>s.</s>"),
        "drop_tokens": ("Anarchism a political advocates stateless often defined asself-gon voluntary institution</s>",
                        "is philosophy that societies vereds.</s>"),
        "prefix_lm": ("Anarchism is a political philosophy that advocates stateless societies often defined as sel</s>",
                      "f-governed voluntary institutions.</s>"),
    }
    for name, (want_in, want_out) in golden.items():
        inputs, targets = Corruption(name, DenoisingConfig(), 128, vocab, 1)(ids, np.random.default_rng(5))
        assert (decode(inputs), decode(targets)) == (want_in, want_out), name
    for name in ("bert_denoising", "mass_denoising", "deshuffle"):  # the target is the original text
        inputs, targets = Corruption(name, DenoisingConfig(), 128, vocab, 1)(ids, np.random.default_rng(5))
        assert decode(targets) == WIKI_SENTENCE + "</s>" and len(inputs) == len(ids) + 1


def test_t5_iid_objectives_corrupt_15_percent_and_bert_style_is_90_mask_10_random():
    rng = np.random.default_rng(0)
    tokens = rng.integers(3, 900, size=(400, 127))
    c = corruption("bert_denoising")
    noise_share, masked, randomized = [], 0, 0
    for row in tokens:
        inputs, targets = c(row, rng)
        np.testing.assert_array_equal(targets[:-1], row)  # the target is the original sequence
        changed = inputs[:-1] != row
        masked += int((inputs[:-1] == VOCAB.mask_id).sum())
        randomized += int((changed & (inputs[:-1] != VOCAB.mask_id)).sum())
        noise_share.append(changed.mean())
    assert np.mean(noise_share) == pytest.approx(0.15, abs=0.005)  # i.i.d. 15% (a random draw rarely repeats)
    assert randomized / (masked + randomized) == pytest.approx(0.1, abs=0.01)
    mass = corruption("mass_denoising")
    inputs, targets = mass(tokens[0], np.random.default_rng(1))
    noise = inputs[:-1] != tokens[0]
    assert (inputs[:-1][noise] == VOCAB.mask_id).all() and 0 < noise.sum() < 127


def test_t5_drop_tokens_splits_the_text_between_inputs_and_targets_in_order():
    tokens = np.arange(10, 137)
    inputs, targets = corruption("drop_tokens")(tokens, np.random.default_rng(2))
    merged = np.sort(np.concatenate([inputs[:-1], targets[:-1]]))
    np.testing.assert_array_equal(merged, tokens)  # every token once, on one side
    assert (np.diff(inputs[:-1]) > 0).all() and (np.diff(targets[:-1]) > 0).all()  # order kept
    assert not np.isin(inputs, SENTINELS).any()


def test_t5_prefix_lm_splits_at_a_uniform_point():
    c = corruption("prefix_lm")
    tokens = np.arange(10, 20)  # 10 tokens: the prefix has 1..9 of them, each equally likely
    rng = np.random.default_rng(0)
    counts = np.zeros(10, dtype=int)
    for _ in range(9000):
        inputs, targets = c(tokens, rng)
        np.testing.assert_array_equal(np.concatenate([inputs[:-1], targets[:-1]]), tokens)
        counts[len(inputs) - 1] += 1
    assert counts[0] == 0 and np.abs(counts[1:] / 9000 - 1 / 9).max() < 0.015


def test_t5_deshuffle_permutes_every_token():
    tokens = np.arange(10, 137)
    inputs, targets = corruption("deshuffle")(tokens, np.random.default_rng(4))
    np.testing.assert_array_equal(np.sort(inputs[:-1]), tokens)
    assert (inputs[:-1] != tokens).mean() > 0.9
    np.testing.assert_array_equal(targets[:-1], tokens)


def test_t5_every_objective_keeps_inputs_within_max_seq_length():
    rng = np.random.default_rng(0)
    for name in DENOISERS:
        c = corruption(name, 64)
        for _ in range(50):
            inputs, targets = c(rng.integers(3, 900, size=c.raw_length), rng)
            assert len(inputs) <= 64 and inputs[-1] == targets[-1] == EOS, name


def test_t5_settings_are_checked_at_their_exact_boundaries():
    # noise_density is a share strictly between 0 and 1 (all or nothing leaves no task);
    # mean_noise_span_length 1 (every noise token its own span) is allowed, below is not;
    # random_token_prob is a probability, 0 and 1 included.
    for density in (0.0, 1.0):
        with pytest.raises(EmberError, match="denoising.noise_density"):
            corruption("span_corruption", noise_density=density)
    corruption("span_corruption", noise_density=0.99)
    with pytest.raises(EmberError, match="denoising.mean_noise_span_length"):
        corruption("span_corruption", mean_noise_span_length=0.99)
    single = corruption("span_corruption", 64, mean_noise_span_length=1.0)
    noise, spans = N.span_counts(single.raw_length, 0.15, 1.0)
    assert noise == spans  # one token per span
    for prob in (-0.01, 1.01):
        with pytest.raises(EmberError, match="denoising.random_token_prob"):
            corruption("bert_denoising", random_token_prob=prob)
    tokens = np.arange(10, 137)
    for prob, expect_mask in ((0.0, True), (1.0, False)):
        c = Corruption("bert_denoising", DenoisingConfig(random_token_prob=prob), 128,
                       N.NoiseVocab(SENTINELS, np.arange(3, 900), prob), EOS)
        inputs = c(tokens, np.random.default_rng(0))[0][:-1]
        changed = inputs != tokens
        assert changed.any() and ((inputs[changed] == VOCAB.mask_id).all() == expect_mask)
        assert expect_mask or not (inputs == VOCAB.mask_id).any()


def test_t5_span_corruption_sentinel_count_boundary():
    # 512 inputs need exactly 28 sentinels (28 spans): 28 is enough, 27 is not
    Corruption("span_corruption", DenoisingConfig(), 512, N.NoiseVocab(SENTINELS[:28], np.arange(3, 900)), EOS)
    with pytest.raises(EmberError, match=r"gives 28 corrupted spans.*27 sentinels"):
        Corruption("span_corruption", DenoisingConfig(), 512, N.NoiseVocab(SENTINELS[:27], np.arange(3, 900)), EOS)


def test_t5_non_span_objectives_read_max_seq_length_minus_one_and_refuse_no_room():
    # room for EOS: inputs never longer than data.max_seq_length; one token leaves none
    assert corruption("bert_denoising", 64).raw_length == 63 and corruption("prefix_lm", 2).raw_length == 1
    with pytest.raises(EmberError, match="leaves no room for text"):
        corruption("deshuffle", 1)


def test_t5_objectives_cut_documents_on_their_own_only_for_prefix_lm_and_deshuffle():
    # T5's preprocessors: the span and i.i.d. objectives read one stream of concatenated
    # documents (reduce_concat_tokens + split_tokens); prefix_lm and deshuffle cut each document.
    per_document = {name: d.per_document for name, d in DENOISERS.items()}
    assert {name for name, cut in per_document.items() if cut} == {"prefix_lm", "deshuffle"}


def test_t5_objective_build_refuses_an_encoder_and_a_missing_tokenizer_before_loading_anything():
    from ember.config import RunConfig, model_preset
    from ember.objectives.span_corruption import build

    with pytest.raises(EmberError, match="needs an encoder-decoder.*t5-"):
        build(RunConfig(objective="span_corruption", model=model_preset("bert-tiny")), {"pad": 0, "sep": 1})
    with pytest.raises(EmberError, match="needs the corpus tokenizer"):
        build(RunConfig(objective="span_corruption", model=model_preset("t5-tiny")), {"pad": 0, "sep": 1})


def test_t5_perplexity_is_exp_of_the_loss_and_needs_a_loss():
    from ember.objectives.span_corruption import Seq2SeqDenoising

    assert Seq2SeqDenoising.derived_metrics({"loss": 2.0}) == {"ppl": pytest.approx(math.exp(2.0))}
    assert Seq2SeqDenoising.derived_metrics({"token_acc": 0.5}) == {}  # nothing to derive it from
    assert math.isfinite(Seq2SeqDenoising.derived_metrics({"loss": 1e4})["ppl"])  # a diverged run logs a number
