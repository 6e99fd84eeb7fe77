"""BART and mBART parity with Hugging Face transformers on tiny random models built locally
(padded batches, 1e-5), and `ember convert` both ways."""

from __future__ import annotations

import json

import pytest
import torch

transformers = pytest.importorskip("transformers")

from bart_helpers import EOS, PAD, VOCAB, bart_style_tokenizer, ember_from_hf, tiny_hf_bart  # noqa: E402
from hf_interop_helpers import ATOL, assert_close_where, load_hf, padded_batch  # noqa: E402
from t5_helpers import one_thread  # noqa: E402,F401

from ember.cli import main  # noqa: E402
from ember.errors import EmberError  # noqa: E402
from ember.interop import hf_bart  # noqa: E402
from ember.models import build_backbone  # noqa: E402
from ember.runs.checkpoint import load_weights  # noqa: E402
from ember.runs.folder import load_run_config  # noqa: E402
from ember.runs.init import backbone_weights  # noqa: E402

pytestmark = pytest.mark.usefixtures("one_thread")
TIED = ("model.encoder.embed_tokens.weight", "model.decoder.embed_tokens.weight", "lm_head.weight")


def batches(seed: int = 1):
    """Encoder (3 x 17) and decoder (3 x 13) inputs, row 1 of each right-padded from 11."""
    ids, mask = padded_batch(VOCAB, pad_id=PAD, seed=seed)
    dec, dec_mask = padded_batch(VOCAB, pad_id=PAD, length=13, seed=seed + 1)
    return ids, mask, dec, dec_mask


def assert_all_close(ours, ref, mask, heads: bool = False):
    assert len(ours) == len(ref)
    for a, b in zip(ours, ref):  # attentions (B, heads, T, L): compare the real query rows
        assert_close_where(a.transpose(1, 2), b.transpose(1, 2), mask) if heads else assert_close_where(a, b, mask)


@pytest.mark.parametrize("mbart", [False, True], ids=["bart", "mbart"])
def test_bart_hf_parity_padded_batch(mbart):
    """(M)BartForConditionalGeneration and ember give the same encoder and decoder states,
    attentions and logits on a padded batch; SDPA (no probabilities) as well."""
    hf = tiny_hf_bart(mbart, attn="eager")  # eager: transformers' SDPA returns no probabilities
    ours = ember_from_hf(hf)
    assert (ours.config.pre_layer_norm, ours.config.scale_embedding) == (mbart, mbart)
    ids, mask, dec, dec_mask = batches()
    with torch.no_grad():
        ref = hf(input_ids=ids, attention_mask=mask, decoder_input_ids=dec, decoder_attention_mask=dec_mask,
                 output_hidden_states=True, output_attentions=True)
        out = ours(ids, mask, decoder_input_ids=dec, decoder_attention_mask=dec_mask, output_hidden_states=True,
                   output_attentions=True)
        fast = ours(ids, mask, decoder_input_ids=dec, decoder_attention_mask=dec_mask)
    assert_close_where(out.encoder_last_hidden_state, ref.encoder_last_hidden_state, mask)
    assert_close_where(ours.lm_logits(out.last_hidden_state), ref.logits, dec_mask)
    assert_close_where(ours.lm_logits(fast.last_hidden_state), ref.logits, dec_mask)
    assert float(ref.logits.std()) > 1.0  # far from uniform: a wrongly mapped tensor shows
    assert_all_close(out.encoder_attentions, ref.encoder_attentions, mask, heads=True)
    assert_all_close(out.decoder_attentions, ref.decoder_attentions, dec_mask, heads=True)
    assert_all_close(out.cross_attentions, ref.cross_attentions, dec_mask, heads=True)
    if not mbart:  # post-LN: no final norm, so every layer's state is comparable as it is
        assert len(out.encoder_hidden_states) == 3 and len(out.decoder_hidden_states) == 4
        assert_all_close(out.encoder_hidden_states, ref.encoder_hidden_states, mask)
        assert_all_close(out.decoder_hidden_states, ref.decoder_hidden_states, dec_mask)


def test_bart_hf_parity_base_model_and_loss():
    """BartModel's weights (no logits bias) give BartModel's states; shift_right is transformers'
    shift_tokens_right (</s> first) and the teacher-forced loss is BartForConditionalGeneration's."""
    from transformers.models.bart.modeling_bart import shift_tokens_right

    from ember.nn.lm_loss import seq2seq_loss

    base = tiny_hf_bart(seed=3, cls_name="BartModel")
    ours = ember_from_hf(base)
    assert not ours.final_logits_bias.any()
    ids, mask, dec, dec_mask = batches(seed=4)
    with torch.no_grad():
        ref = base(input_ids=ids, attention_mask=mask, decoder_input_ids=dec, decoder_attention_mask=dec_mask)
        out = ours(ids, mask, decoder_input_ids=dec, decoder_attention_mask=dec_mask)
    assert_close_where(out.last_hidden_state, ref.last_hidden_state, dec_mask)

    hf = tiny_hf_bart(seed=5)
    ours = ember_from_hf(hf)
    labels = dec.masked_fill(dec_mask == 0, -100)
    assert torch.equal(ours.shift_right(labels), shift_tokens_right(labels, PAD, EOS))
    assert int(ours.shift_right(labels)[0, 0]) == EOS
    with torch.no_grad():
        ref_loss = hf(input_ids=ids, attention_mask=mask, labels=labels).loss
        loss, metrics = seq2seq_loss(ours, {"input_ids": ids, "attention_mask": mask, "labels": labels})
    torch.testing.assert_close(loss, ref_loss, atol=ATOL, rtol=0)
    assert metrics["loss"][1] == int(dec_mask.sum())


@pytest.mark.parametrize("mbart", [False, True], ids=["bart", "mbart"])
def test_bart_hf_convert_round_trip_through_the_cli(mbart, tmp_path):
    """save_pretrained folder -> `ember convert --from-hf` -> run -> `--to-hf`: transformers loads
    the export with nothing missing or left over, and all three give the same logits."""
    hf = tiny_hf_bart(mbart, seed=6)
    hf_dir = tmp_path / "hf"
    hf.save_pretrained(hf_dir)
    words = [f"w{i}" for i in range(VOCAB - 5)]
    bart_style_tokenizer(words).save(str(hf_dir / "tokenizer.json"))
    run, out = tmp_path / "run", tmp_path / "back"
    assert main(["convert", "--from-hf", str(hf_dir), "--out", str(run)]) == 0  # the CLI's own path
    cfg = load_run_config(run)
    assert (cfg.model.family, cfg.objective, cfg.model.pre_layer_norm) == ("bart", "bart", mbart)
    ours = build_backbone(cfg.model).eval()
    ours.load_state_dict(backbone_weights(load_weights(run / "model.safetensors")), strict=True)
    assert main(["convert", "--to-hf", str(run), "--out", str(out)]) == 0
    cls = transformers.MBartForConditionalGeneration if mbart else transformers.BartForConditionalGeneration
    back = load_hf(cls, out, tied=TIED)
    config = json.loads((out / "config.json").read_text())
    assert config["model_type"] == ("mbart" if mbart else "bart")
    assert (config["decoder_start_token_id"], config["eos_token_id"], config["pad_token_id"]) == (EOS, EOS, PAD)
    ids, mask, dec, dec_mask = batches(seed=7)
    with torch.no_grad():
        ref = hf(input_ids=ids, attention_mask=mask, decoder_input_ids=dec, decoder_attention_mask=dec_mask).logits
        hidden = ours(ids, mask, decoder_input_ids=dec, decoder_attention_mask=dec_mask).last_hidden_state
        assert_close_where(ours.lm_logits(hidden), ref, dec_mask)
        assert_close_where(back(input_ids=ids, attention_mask=mask, decoder_input_ids=dec,
                                decoder_attention_mask=dec_mask).logits, ref, dec_mask)
    tok = transformers.AutoTokenizer.from_pretrained(out)
    assert (tok.pad_token, tok.eos_token) == ("<pad>", "</s>")
    assert tok("w3 w17 w5")["input_ids"] == [0, 8, 22, 10, 2]


def test_bart_hf_import_refuses_odd_shapes():
    """A model whose stacks differ in width is refused with one line (ember shares one size);
    task heads are read (tests/interop/test_bart_task_heads_hf_parity.py)."""
    hf = tiny_hf_bart(seed=8)
    with pytest.raises(EmberError, match="one size for both stacks"):
        hf_bart.config_from_hf({**hf.config.to_dict(), "decoder_ffn_dim": 64})


def test_bart_positions_beyond_the_table_are_a_clear_error():
    ours = ember_from_hf(tiny_hf_bart(seed=9))
    ids = torch.full((1, 41), 7)  # 41 tokens, 40 learned positions
    with pytest.raises(EmberError, match="beyond the model's 40 learned positions"):
        ours(ids)
