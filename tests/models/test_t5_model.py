"""T5's building blocks (golden values), presets (published parameter counts) and the backbone
on real text: parity with transformers on real sentences, and a few text-to-text steps."""

from __future__ import annotations

import dataclasses

import pytest
import torch

from conftest import real_data
from hf_interop_helpers import ATOL, assert_close_where
from t5_helpers import one_thread  # noqa: F401 (fixture)

from ember.config import model_preset, run_config_from_dict
from ember.errors import EmberError
from ember.models import build_backbone
from ember.nn.relative_bias import relative_position_bucket
from ember.nn.rms_norm import RMSNorm

pytestmark = pytest.mark.usefixtures("one_thread")


def test_t5_relative_position_buckets_golden():
    """32 buckets up to distance 128 (Raffel et al. 2020, §2.1), worked out by hand:
    bidirectional: 16 per direction (keys after the query in 16..31), exact below 8, then
    8 + floor(log(d / 8) / log(128 / 8) * 8), capped at 15; causal: 32 for keys at or before
    the query, exact below 16, then 16 + floor(log(d / 16) / log(128 / 16) * 16)."""
    rel = torch.tensor([0, 1, -1, 7, -7, 8, -9, -20, 100, -100, -127, 500])
    # e.g. -20: 8 + floor(log(2.5) / log(16) * 8) = 8 + floor(2.64) = 10;
    #      100: 16 + 8 + floor(log(12.5) / log(16) * 8) = 24 + floor(7.29) = 31
    assert relative_position_bucket(rel, bidirectional=True).tolist() == \
        [0, 17, 1, 23, 7, 24, 8, 10, 31, 15, 15, 31]
    rel = torch.tensor([3, 0, -3, -15, -17, -40, -100, -127, -500])
    # -40: 16 + floor(log(2.5) / log(8) * 16) = 16 + floor(7.05) = 23; a later key (3) -> 0
    assert relative_position_bucket(rel, bidirectional=False).tolist() == [0, 0, 3, 15, 16, 23, 30, 31, 31]


def test_t5_rms_norm_scales_without_centering():
    norm = RMSNorm(4, eps=1e-6)
    with torch.no_grad():
        norm.weight.copy_(torch.tensor([1.0, 2.0, 1.0, 0.5]))
    x = torch.tensor([[1.0, 2.0, 3.0, 4.0]])
    rms = (30 / 4) ** 0.5  # sqrt(mean of squares); the mean 2.5 is not subtracted
    expected = torch.tensor([[1 / rms, 4 / rms, 3 / rms, 2 / rms]])
    torch.testing.assert_close(norm(x), expected)
    assert norm(x.to(torch.bfloat16)).dtype == torch.bfloat16  # statistic in fp32, result in bf16


def test_t5_shift_right_starts_from_pad_and_replaces_ignored_labels():
    model = build_backbone(dataclasses.replace(model_preset("t5-tiny"), vocab_size=50))
    labels = torch.tensor([[5, 6, 7, 1], [8, 1, -100, -100]])
    assert model.shift_right(labels).tolist() == [[0, 5, 6, 7], [0, 8, 1, 0]]


@pytest.mark.parametrize("preset,published", [
    ("t5-small", 60e6), ("t5-base", 220e6), ("t5-v1_1-small", None), ("t5-v1_1-base", None)])
def test_t5_preset_parameter_counts_match_transformers_and_the_paper(preset, published):
    """The same config built by transformers (on the meta device: no memory, no download) has
    as many parameters; v1.0 Small/Base are the paper's 60M / 220M (Raffel et al. 2020, §3.7)."""
    transformers = pytest.importorskip("transformers")
    from ember.interop import hf_t5

    cfg = model_preset(preset)
    with torch.device("meta"):
        ours = build_backbone(cfg)
        hf = transformers.T5ForConditionalGeneration(transformers.T5Config(**hf_t5.config_to_hf(cfg, [])))
        if not cfg.tie_word_embeddings:  # transformers 5 ties lm_head whatever the config says
            hf.lm_head.weight = torch.nn.Parameter(torch.empty(cfg.vocab_size, cfg.hidden_size))
    count = sum(p.numel() for p in ours.parameters())
    assert count == sum(p.numel() for p in hf.parameters())
    if published:
        assert abs(count - published) / published < 0.015, count  # 60.5M and 222.9M
    assert (cfg.dropout == 0.0) is (not cfg.tie_word_embeddings)  # v1.1 pre-trains without dropout


def test_t5_config_errors_say_what_to_set():
    with pytest.raises(EmberError, match="head_dim"):  # 512 / 6 is not whole without d_kv
        run_config_from_dict({"model": {"preset": "t5-v1_1-small", "head_dim": 0}})
    with pytest.raises(EmberError, match="type_vocab_size"):
        build_backbone(dataclasses.replace(model_preset("t5-tiny"), type_vocab_size=2))
    model = build_backbone(dataclasses.replace(model_preset("t5-tiny"), vocab_size=50))
    with pytest.raises(EmberError, match="cache holds"):
        cache = model.new_cache()
        enc = model.encode(torch.tensor([[5, 6, 7]])).last_hidden_state
        model.decode(torch.tensor([[0]]), enc, cache=cache)
        model.decode(torch.tensor([[9]]), enc, decoder_attention_mask=torch.ones(1, 1), cache=cache)


@pytest.fixture(scope="module")
def real_sentences():
    """SST-2 dev sentences and their labels, and a unigram tokenizer trained on Wikipedia."""
    from ember.tokenizers import train_tokenizer

    rows = [line.split("\t") for line in real_data("glue", "SST-2", "dev.tsv").read_text().splitlines()[1:17]]
    tok = train_tokenizer([real_data("wiki-en", "AA", "wiki_00.gz")], kind="unigram", vocab_size=1000,
                          max_documents=10, progress=False)
    return [r[0].strip() for r in rows], [int(r[1]) for r in rows], tok


def pad_id(tok) -> int:
    return next(tok.token_to_id(t) for t in ("<pad>", "[PAD]") if tok.token_to_id(t) is not None)


def encode(tok, texts: list[str]) -> tuple[torch.Tensor, torch.Tensor]:
    enc = [tok.encode(t).ids for t in texts]
    ids = torch.full((len(enc), max(map(len, enc))), pad_id(tok))
    mask = torch.zeros_like(ids)
    for i, e in enumerate(enc):
        ids[i, :len(e)], mask[i, :len(e)] = torch.tensor(e), 1
    return ids, mask


@pytest.mark.parametrize("version", ["v1_0", "v1_1"])
def test_t5_tiny_hf_parity_on_real_sentences(version, real_sentences):
    """t5-tiny's shape (and v1.1's feed-forward/head) on tokenized SST-2 sentences of
    different lengths: ember and transformers agree on encoder states and logits. In float64
    (the norms' mean square stays fp32 in both): at this width fp32 rounding alone moves
    v1.1's logits ~1e-4 away from the float64 values in either library, while a mapping error
    still shows at 1e-5."""
    transformers = pytest.importorskip("transformers")
    from hf_interop_helpers import perturb

    from ember.interop import hf_t5
    from ember.runs.init import backbone_weights

    texts, _, tok = real_sentences
    v1_1 = version == "v1_1"
    cfg = dataclasses.replace(model_preset("t5-tiny"), vocab_size=tok.get_vocab_size(), pad_token_id=pad_id(tok),
                              dropout=0.0, attention_dropout=0.0, hidden_act="gated-gelu_new" if v1_1 else "relu",
                              tie_word_embeddings=not v1_1)
    torch.manual_seed(0)
    ours = build_backbone(cfg).eval()
    perturb(ours)
    state = hf_t5.state_to_hf({f"backbone.{k}": v for k, v in ours.state_dict().items()}, cfg)
    hf = transformers.T5ForConditionalGeneration(transformers.T5Config(**hf_t5.config_to_hf(cfg, [])))
    if v1_1:
        hf.lm_head.weight = torch.nn.Parameter(torch.empty(cfg.vocab_size, cfg.hidden_size))
    hf.load_state_dict(state, strict=False)
    ours_back = build_backbone(cfg)
    ours_back.load_state_dict(backbone_weights(hf_t5.state_from_hf(hf.state_dict(), cfg)))  # round trip
    ours, hf, ours_back = ours.double(), hf.double(), ours_back.double()
    ids, mask = encode(tok, texts[:8])
    dec, dec_mask = encode(tok, texts[8:16])
    with torch.no_grad():
        ref = hf.eval()(input_ids=ids, attention_mask=mask, decoder_input_ids=dec, decoder_attention_mask=dec_mask)
        out = ours(ids, mask, decoder_input_ids=dec, decoder_attention_mask=dec_mask)
        back = ours_back.eval()(ids, mask, decoder_input_ids=dec, decoder_attention_mask=dec_mask)
    assert_close_where(out.encoder_last_hidden_state, ref.encoder_last_hidden_state, mask)
    assert_close_where(ours.lm_logits(out.last_hidden_state), ref.logits, dec_mask)
    torch.testing.assert_close(back.last_hidden_state, out.last_hidden_state, atol=ATOL, rtol=0)


def test_t5_tiny_learns_text_to_text_sentiment_on_real_sentences(real_sentences):
    """Sixteen SST-2 sentences as "sst2 sentence: ..." -> "positive" / "negative" (the paper's
    text-to-text format, Raffel et al. 2020, Fig. 1 / App. D): a few steps of teacher-forced
    training on them lower the loss tenfold, and cached greedy decoding then spells label words,
mostly the right ones (25 steps do not fit all sixteen)."""
    from ember.seq2seq_generation import Seq2SeqGenerationConfig, seq2seq_generate_ids
    from ember.tokenizers import end_of_text_id

    torch.manual_seed(0)
    texts, labels, tok = real_sentences
    cfg = dataclasses.replace(model_preset("t5-tiny"), vocab_size=tok.get_vocab_size(), pad_token_id=pad_id(tok),
                              dropout=0.0, attention_dropout=0.0)
    model = build_backbone(cfg)
    ids, mask = encode(tok, [f"sst2 sentence: {t}" for t in texts])
    words = ["positive" if y else "negative" for y in labels]
    eos = end_of_text_id(tok)
    expected = [tok.encode(w, add_special_tokens=False).ids for w in words]
    width = max(map(len, expected)) + 1
    target = torch.tensor([e + [eos] + [-100] * (width - len(e) - 1) for e in expected])  # (16, width)
    optimizer = torch.optim.AdamW(model.parameters(), lr=3e-3)
    losses = []
    for _ in range(25):
        logits = model.lm_logits(model(ids, mask, decoder_input_ids=model.shift_right(target)).last_hidden_state)
        loss = torch.nn.functional.cross_entropy(logits.flatten(0, 1), target.flatten(), ignore_index=-100)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        losses.append(loss.item())
    assert losses[-1] < 0.1 * losses[0], losses
    model.eval()
    inputs = [tok.encode(f"sst2 sentence: {t}").ids for t in texts]
    out = [tok.decode(o) for o in seq2seq_generate_ids(model, inputs, Seq2SeqGenerationConfig(max_new_tokens=8), eos)]
    assert set(out) <= {"positive", "negative"}, out  # every output is a label word, then </s>
    assert sum(o == w for o, w in zip(out, words)) >= 13, (out, words)  # mostly the right one


def test_t5_training_mode_uses_dropout_and_never_attends_to_padding():
    """In training mode (dropout 0.1 on CPU: the explicit attention path with an additive
    float mask) outputs vary between calls and gradients flow, yet padding keys still get no
    weight: changing padded encoder tokens changes no real position's output."""
    torch.manual_seed(0)
    model = build_backbone(dataclasses.replace(model_preset("t5-tiny"), vocab_size=60)).train()
    ids = torch.randint(3, 60, (2, 9))
    mask = torch.ones_like(ids)
    mask[0, 6:] = 0
    other = ids.clone()
    other[0, 6:] = 7  # different padding tokens
    dec = torch.randint(3, 60, (2, 4))

    def run(x):
        torch.manual_seed(1)  # the same dropout draws for both inputs
        return model(x, mask, decoder_input_ids=dec).last_hidden_state

    a, b = run(ids), run(other)
    torch.testing.assert_close(a, b)
    assert not torch.allclose(a, model(ids, mask, decoder_input_ids=dec).last_hidden_state)  # new draws
    model.lm_logits(a).sum().backward()
    assert model.encoder.position_bias.embedding.weight.grad.abs().sum() > 0
