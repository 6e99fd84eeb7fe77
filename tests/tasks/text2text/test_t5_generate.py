"""T5 generation: greedy and beam search equal transformers' generate token for token on
tiny random models, cached decoding equals recomputation, padding and bad input."""

from __future__ import annotations

import pytest
import torch

transformers = pytest.importorskip("transformers")

from t5_helpers import VOCAB, ember_from_hf, one_thread, tiny_hf_t5  # noqa: E402,F401

from ember.errors import EmberError  # noqa: E402
from ember.seq2seq_generation import (  # noqa: E402
    DecoderSteps, Seq2SeqGenerationConfig, seq2seq_generate, seq2seq_generate_ids)

LENGTHS = [9, 14, 5, 11]  # a batch of inputs of different lengths: padding in the encoder

pytestmark = pytest.mark.usefixtures("one_thread")


def tiny(version: str, seed: int):
    """A tiny random T5 whose outputs vary. With gains near 1 on the decoder's final norm, the
    output h stays close to the current token's embedding and the tied head's logits favour
    that token: a random T5 repeats one token forever. Gains drawn from N(0, 1) (signs
    included) break that self-similarity. transformers' generate sizes its cache by the
    encoder's depth, so both stacks have two layers here (the parity tests use 2 and 3)."""
    model = tiny_hf_t5(version, seed=seed, num_decoder_layers=2)
    norm = model.decoder.final_layer_norm.weight
    with torch.no_grad():
        norm.copy_(torch.randn(norm.shape, generator=torch.Generator().manual_seed(seed)))
    return model


def inputs(seed: int = 3) -> list[list[int]]:
    g = torch.Generator().manual_seed(seed)
    return [torch.randint(3, VOCAB, (n,), generator=g).tolist() for n in LENGTHS]


def right_padded(rows: list[list[int]]) -> tuple[torch.Tensor, torch.Tensor]:
    """transformers' side of the comparison pads on the right (ember pads on the left)."""
    ids = torch.zeros(len(rows), max(map(len, rows)), dtype=torch.long)
    mask = torch.zeros_like(ids)
    for i, r in enumerate(rows):
        ids[i, :len(r)], mask[i, :len(r)] = torch.tensor(r), 1
    return ids, mask


def hf_generate(hf, rows, eos: int, **kwargs) -> list[list[int]]:
    """transformers' output ids without the start token, cut before the first eos."""
    ids, mask = right_padded(rows)
    with torch.no_grad():
        out = hf.generate(input_ids=ids, attention_mask=mask, eos_token_id=eos, pad_token_id=0,
                          decoder_start_token_id=0, **kwargs)[:, 1:].tolist()
    return [r[:r.index(eos)] if eos in r else r for r in out]


def common_eos(hf, rows) -> int:
    """A token that greedy decoding emits mid-way for some inputs, used as </s> so that outputs
    end at different steps (an untrained model rarely says </s> itself)."""
    free = hf_generate(hf, rows, eos=VOCAB + 1, max_new_tokens=8)  # an id never produced
    counts = torch.bincount(torch.tensor([t for r in free for t in r[2:6]]), minlength=VOCAB)
    return int(counts.argmax())


@pytest.mark.parametrize("version", ["v1_0", "v1_1"])
def test_t5_greedy_generation_matches_transformers(version):
    hf = tiny(version, 11)
    ours, rows = ember_from_hf(hf), inputs()
    eos = common_eos(hf, rows)
    cfg = Seq2SeqGenerationConfig(max_new_tokens=12)
    got = seq2seq_generate_ids(ours, rows, cfg, eos)
    assert got == hf_generate(hf, rows, eos, max_new_tokens=12, do_sample=False, num_beams=1)
    assert any(len(r) < 12 for r in got) and any(len(r) == 12 for r in got)  # eos stops some, not all
    assert sum(len(set(r)) for r in got) / len(got) > 2  # not one token repeated


@pytest.mark.parametrize("version,beams,length_penalty,early_stopping", [
    ("v1_0", 4, 1.0, False), ("v1_1", 3, 2.0, False), ("v1_1", 4, 0.6, True), ("v1_0", 2, 3.0, True)])
def test_t5_beam_search_matches_transformers(version, beams, length_penalty, early_stopping):
    """Seed 17 gives inputs whose best hypotheses end at different steps, so the stopping
    rules (length-normalised scores, the early-stop bound, early_stopping) decide outputs."""
    hf = tiny(version, 17)
    ours, rows = ember_from_hf(hf), inputs(seed=4)
    eos = common_eos(hf, rows)
    cfg = Seq2SeqGenerationConfig(max_new_tokens=14, num_beams=beams, length_penalty=length_penalty,
                                  early_stopping=early_stopping)
    got = seq2seq_generate_ids(ours, rows, cfg, eos)
    assert got == hf_generate(hf, rows, eos, max_new_tokens=14, do_sample=False, num_beams=beams,
                              length_penalty=length_penalty, early_stopping=early_stopping)
    assert any(len(r) < 14 for r in got)  # some input's best hypothesis ended with eos
    greedy = seq2seq_generate_ids(ours, rows, Seq2SeqGenerationConfig(max_new_tokens=14), eos)
    assert got != greedy  # the search found other outputs than greedy for some input


@pytest.mark.parametrize("version", ["v1_0", "v1_1"])
def test_t5_cached_decoding_equals_recomputation(version):
    """Each step's logits with the cache (one new token, encoder keys/values computed once)
    equal re-running the decoder on the whole prefix; so do greedy and beam outputs."""
    hf = tiny(version, 13)
    ours = ember_from_hf(hf)
    ids = torch.randint(3, VOCAB, (3, 10), generator=torch.Generator().manual_seed(1))
    mask = torch.ones_like(ids)
    mask[1, 6:] = 0
    target = torch.randint(3, VOCAB, (3, 9), generator=torch.Generator().manual_seed(2))
    with torch.no_grad():
        enc = ours.encode(ids, mask).last_hidden_state
        cached, fresh = DecoderSteps(ours, enc, mask), DecoderSteps(ours, enc, mask, use_cache=False)
        for t in range(1, target.shape[1] + 1):
            torch.testing.assert_close(cached(target[:, :t]), fresh(target[:, :t]), atol=1e-5, rtol=0)
        assert cached.cache.length == target.shape[1]
    for beams in (1, 3):
        cfg = Seq2SeqGenerationConfig(max_new_tokens=8, num_beams=beams)
        assert seq2seq_generate(ours, ids, mask, cfg, eos_id=1) == \
            seq2seq_generate(ours, ids, mask, cfg, eos_id=1, use_cache=False)


def test_t5_generation_of_an_input_does_not_depend_on_its_batch():
    ours, rows = ember_from_hf(tiny("v1_1", 14)), inputs(seed=5)
    for beams in (1, 3):
        cfg = Seq2SeqGenerationConfig(max_new_tokens=8, num_beams=beams)
        batched = seq2seq_generate_ids(ours, rows, cfg, eos_id=1)
        assert batched == [seq2seq_generate_ids(ours, [r], cfg, eos_id=1)[0] for r in rows]


def test_t5_sampling_is_seeded_and_differs_from_greedy():
    ours, rows = ember_from_hf(tiny("v1_0", 15)), inputs(seed=6)
    cfg = Seq2SeqGenerationConfig(max_new_tokens=10, temperature=1.5, seed=7)
    first = seq2seq_generate_ids(ours, rows, cfg, eos_id=1)
    assert first == seq2seq_generate_ids(ours, rows, cfg, eos_id=1)
    assert first != seq2seq_generate_ids(ours, rows, Seq2SeqGenerationConfig(max_new_tokens=10), eos_id=1)


def test_t5_generation_bad_input_is_an_ember_error():
    ours = ember_from_hf(tiny("v1_0", 0))
    with pytest.raises(EmberError, match="beam search is deterministic"):
        Seq2SeqGenerationConfig(num_beams=4, temperature=0.7)
    with pytest.raises(EmberError, match="num_beams=0"):
        Seq2SeqGenerationConfig(num_beams=0)
    with pytest.raises(EmberError, match="empty input"):
        seq2seq_generate_ids(ours, [[5, 6], []], Seq2SeqGenerationConfig(), eos_id=1)
    limit = ours.config.max_position
    with pytest.raises(EmberError, match="longer than the model's"):
        seq2seq_generate_ids(ours, [[5] * (limit + 1)], Seq2SeqGenerationConfig(), eos_id=1)
    with pytest.raises(EmberError, match="max_new_tokens"):
        seq2seq_generate_ids(ours, [[5, 6]], Seq2SeqGenerationConfig(max_new_tokens=limit + 1), eos_id=1)


def test_t5_run_folder_generates_text_as_transformers_does(tmp_path):
    """An imported T5 run folder: load_seq2seq_lm + seq2seq_generate_text give the text that
    transformers' generate + the exported tokenizer give, beam search included."""
    from t5_helpers import t5_style_tokenizer

    from ember.interop.convert import import_hf
    from ember.seq2seq_generation import load_seq2seq_lm, seq2seq_generate_text

    hf = tiny("v1_1", 17)
    hf_dir = tmp_path / "hf"
    hf.save_pretrained(hf_dir)
    t5_style_tokenizer([f"▁w{i}" for i in range(VOCAB - 3)]).save(str(hf_dir / "tokenizer.json"))
    model, tok = load_seq2seq_lm(import_hf(hf_dir, tmp_path / "run"))
    hf_tok = transformers.AutoTokenizer.from_pretrained(hf_dir, eos_token="</s>", pad_token="<pad>")
    texts = ["w5 w17 w3 w60 w2", "w8 w9", "w40 w41 w42 w43 w44 w45 w46"]
    for beams in (1, 3):
        cfg = Seq2SeqGenerationConfig(max_new_tokens=9, num_beams=beams)
        batch = hf_tok(texts, return_tensors="pt", padding=True)
        with torch.no_grad():
            ref = hf.generate(**batch, max_new_tokens=9, num_beams=beams, do_sample=False)
        assert seq2seq_generate_text(model, tok, texts, cfg) == hf_tok.batch_decode(ref, skip_special_tokens=True)


def test_t5_generation_refuses_a_run_that_is_not_seq2seq(tmp_path):
    from gpt_helpers import make_gpt_run

    from ember.seq2seq_generation import load_seq2seq_lm

    with pytest.raises(EmberError, match="'gpt2' model; this command supports t5"):
        load_seq2seq_lm(make_gpt_run(tmp_path))


def test_t5_beam_search_with_a_cache_that_outgrows_its_allocation_matches_transformers(monkeypatch):
    """Beam search reorders the pre-allocated self-attention cache every step (index_select into
    the spare buffer); with every cache started at one position it must also grow while the beams
    are reordered. Both give transformers' tokens."""
    from ember.models.encoder_decoder import EncoderDecoder

    hf = tiny("v1_0", 17)
    ours, rows = ember_from_hf(hf), inputs(seed=4)
    eos = common_eos(hf, rows)
    cfg = Seq2SeqGenerationConfig(max_new_tokens=14, num_beams=4)
    want = hf_generate(hf, rows, eos, max_new_tokens=14, do_sample=False, num_beams=4)
    assert seq2seq_generate_ids(ours, rows, cfg, eos) == want
    new_cache = EncoderDecoder.new_cache
    monkeypatch.setattr(EncoderDecoder, "new_cache", lambda self, capacity=0: new_cache(self, 1))
    assert seq2seq_generate_ids(ours, rows, cfg, eos) == want
