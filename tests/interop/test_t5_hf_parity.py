"""T5 (v1.0 and v1.1) parity with Hugging Face transformers on tiny random models built
locally, and `ember convert` both ways."""

from __future__ import annotations

import json

import pytest
import torch

transformers = pytest.importorskip("transformers")

from hf_interop_helpers import ATOL, assert_close_where, load_hf, padded_batch, write_hf_folder  # noqa: E402
from t5_helpers import VOCAB, ember_from_hf, one_thread, t5_style_tokenizer, tiny_hf_t5  # noqa: E402,F401

from ember.errors import EmberError  # noqa: E402
from ember.interop import hf_t5  # noqa: E402
from ember.interop.convert import export_hf, import_hf  # noqa: E402
from ember.models import build_backbone  # noqa: E402
from ember.runs.checkpoint import load_weights  # noqa: E402
from ember.runs.folder import load_run_config  # noqa: E402
from ember.runs.init import backbone_weights  # noqa: E402

VERSIONS = ["v1_0", "v1_1"]
TIED = ("encoder.embed_tokens.weight", "decoder.embed_tokens.weight", "lm_head.weight")

pytestmark = pytest.mark.usefixtures("one_thread")


def batches(seed: int = 1):
    """Encoder (3 x 17) and decoder (3 x 13) inputs, row 1 of each right-padded from 11."""
    ids, mask = padded_batch(VOCAB, pad_id=0, seed=seed)
    dec, dec_mask = padded_batch(VOCAB, pad_id=0, length=13, seed=seed + 1)
    return ids, mask, dec, dec_mask


def assert_all_close(ours, ref, mask, heads: bool = False):
    assert len(ours) == len(ref)
    for a, b in zip(ours, ref):  # attentions (B, heads, T, L): compare the real query rows
        assert_close_where(a.transpose(1, 2), b.transpose(1, 2), mask) if heads else assert_close_where(a, b, mask)


@pytest.mark.parametrize("version", VERSIONS)
def test_t5_hf_parity_states_logits_and_attentions(version):
    hf = tiny_hf_t5(version, attn="eager")  # eager: transformers' SDPA returns no probabilities
    ours = ember_from_hf(hf)
    ids, mask, dec, dec_mask = batches()
    with torch.no_grad():
        ref = hf(input_ids=ids, attention_mask=mask, decoder_input_ids=dec, decoder_attention_mask=dec_mask,
                 output_hidden_states=True, output_attentions=True)
        out = ours(ids, mask, decoder_input_ids=dec, decoder_attention_mask=dec_mask, output_hidden_states=True,
                   output_attentions=True)
        fast = ours(ids, mask, decoder_input_ids=dec, decoder_attention_mask=dec_mask)  # SDPA (no probabilities)
    assert_close_where(out.encoder_last_hidden_state, ref.encoder_last_hidden_state, mask)
    assert_close_where(ours.lm_logits(out.last_hidden_state), ref.logits, dec_mask)
    assert_close_where(ours.lm_logits(fast.last_hidden_state), ref.logits, dec_mask)
    assert len(out.encoder_hidden_states) == 3 and len(out.decoder_hidden_states) == 4
    assert_all_close(out.encoder_hidden_states, ref.encoder_hidden_states, mask)
    assert_all_close(out.decoder_hidden_states, ref.decoder_hidden_states, dec_mask)
    assert_all_close(out.encoder_attentions, ref.encoder_attentions, mask, heads=True)
    assert_all_close(out.decoder_attentions, ref.decoder_attentions, dec_mask, heads=True)
    assert_all_close(out.cross_attentions, ref.cross_attentions, dec_mask, heads=True)


def test_t5_hf_parity_encoder_only_forward_and_shift_right():
    """forward() without decoder inputs is the encoder (T5EncoderModel's output), and
    shift_right builds the decoder inputs transformers builds from labels."""
    hf = tiny_hf_t5("v1_1", seed=2)
    ours = ember_from_hf(hf)
    ids, mask, labels, label_mask = batches(seed=5)
    labels = labels.masked_fill(label_mask == 0, -100)
    with torch.no_grad():
        ref = hf(input_ids=ids, attention_mask=mask, labels=labels)
        enc = ours(ids, mask)
        logits = ours.lm_logits(ours(ids, mask, decoder_input_ids=ours.shift_right(labels)).last_hidden_state)
    assert_close_where(enc.last_hidden_state, ref.encoder_last_hidden_state, mask)
    with torch.no_grad():  # the common backbone call, with all-zero segment ids, is the encoder too
        assert torch.equal(ours(ids, mask, torch.zeros_like(ids)).last_hidden_state, enc.last_hidden_state)
    with pytest.raises(EmberError, match="decoder_input_ids="):  # decoder ids passed third by mistake
        ours(ids, mask, ours.shift_right(labels))
    assert torch.equal(ours.shift_right(labels), hf._shift_right(labels))
    torch.testing.assert_close(logits, ref.logits, atol=ATOL, rtol=0)  # padding rows too: causal, pads last


@pytest.mark.parametrize("version", VERSIONS)
def test_t5_hf_convert_round_trip_through_folders(version, tmp_path):
    """save_pretrained folder -> ember run -> HF folder: transformers' model and tokenizer
    load the export, and all three models give the same logits."""
    hf = tiny_hf_t5(version, seed=4)
    hf_dir = tmp_path / "hf"
    hf.save_pretrained(hf_dir)
    t5_style_tokenizer([f"▁w{i}" for i in range(40)]).save(str(hf_dir / "tokenizer.json"))
    run = import_hf(hf_dir, tmp_path / "run")
    cfg = load_run_config(run)
    assert (cfg.model.family, cfg.objective) == ("t5", "span_corruption")
    assert cfg.model.tie_word_embeddings is (version == "v1_0")
    ours = build_backbone(cfg.model).eval()
    ours.load_state_dict(backbone_weights(load_weights(run / "model.safetensors")), strict=True)
    out = export_hf(run, tmp_path / "back")
    back = load_hf(transformers.T5ForConditionalGeneration, out, tied=TIED if version == "v1_0" else TIED[:2])
    config = json.loads((out / "config.json").read_text())
    assert (config["decoder_start_token_id"], config["eos_token_id"], config["pad_token_id"]) == (0, 1, 0)
    ids, mask, dec, dec_mask = batches(seed=6)
    with torch.no_grad():
        ref = hf(input_ids=ids, attention_mask=mask, decoder_input_ids=dec, decoder_attention_mask=dec_mask).logits
        hidden = ours(ids, mask, decoder_input_ids=dec, decoder_attention_mask=dec_mask).last_hidden_state
        assert_close_where(ours.lm_logits(hidden), ref, dec_mask)
        assert_close_where(back(input_ids=ids, attention_mask=mask, decoder_input_ids=dec,
                                decoder_attention_mask=dec_mask).logits, ref, dec_mask)
    tok = transformers.AutoTokenizer.from_pretrained(out)
    assert (tok.pad_token, tok.eos_token, tok.unk_token) == ("<pad>", "</s>", "<unk>")
    assert tok("w3 w17 w5")["input_ids"] == t5_style_tokenizer([f"▁w{i}" for i in range(40)]).encode("w3 w17 w5").ids
    assert tok("w3 w17 w5")["input_ids"][-1] == 1  # T5 appends </s>


@pytest.mark.parametrize("architecture", ["T5Model", "T5EncoderModel"])
def test_t5_hf_export_base_and_encoder_models(architecture, tmp_path):
    """T5Model (no head) and T5EncoderModel (no decoder) load ember's weights with nothing
    missing or left over, and compute ember's states."""
    hf = tiny_hf_t5("v1_1", seed=7)
    ours = ember_from_hf(hf)
    state = {f"backbone.{k}": v for k, v in ours.state_dict().items()}
    cfg = ours.config
    folder = write_hf_folder(hf_t5.state_to_hf(state, cfg, architecture),
                             hf_t5.config_to_hf(cfg, [architecture]), tmp_path / architecture)
    model = load_hf(getattr(transformers, architecture), folder, tied=TIED[:2])
    ids, mask, dec, dec_mask = batches(seed=8)
    with torch.no_grad():
        if architecture == "T5EncoderModel":
            assert_close_where(model(input_ids=ids, attention_mask=mask).last_hidden_state,
                               ours.encode(ids, mask).last_hidden_state, mask)
        else:
            ref = model(input_ids=ids, attention_mask=mask, decoder_input_ids=dec, decoder_attention_mask=dec_mask)
            hidden = ours(ids, mask, decoder_input_ids=dec, decoder_attention_mask=dec_mask).last_hidden_state
            assert_close_where(ref.last_hidden_state, hidden, dec_mask)


def test_t5_hf_import_v1_0_base_model_is_complete():
    """A v1.0 T5Model has everything: its LM head is the embedding matrix."""
    hf = tiny_hf_t5("v1_0", seed=9)
    base = transformers.T5Model(hf.config)
    base.load_state_dict({k: v for k, v in hf.state_dict().items() if k != "lm_head.weight"})
    cfg = hf_t5.config_from_hf(hf.config.to_dict())
    state = hf_t5.state_from_hf(base.state_dict(), cfg)
    assert torch.equal(state["backbone.shared.weight"], hf.shared.weight)
    assert "backbone.lm_head.weight" not in state


def test_t5_hf_import_refuses_incomplete_or_inconsistent_checkpoints():
    hf = tiny_hf_t5("v1_1", seed=10)
    cfg = hf_t5.config_from_hf(hf.config.to_dict())
    state = dict(hf.state_dict())
    with pytest.raises(EmberError, match="no decoder"):
        hf_t5.state_from_hf({k: v for k, v in state.items() if not k.startswith(("decoder.", "lm_head"))}, cfg)
    with pytest.raises(EmberError, match="no lm_head"):
        hf_t5.state_from_hf({k: v for k, v in state.items() if k != "lm_head.weight"}, cfg)
    v1_0 = hf_t5.config_from_hf(tiny_hf_t5("v1_0").config.to_dict())
    with pytest.raises(EmberError, match="not tied"):  # a v1.0 config over a separate head
        hf_t5.state_from_hf(dict(tiny_hf_t5("v1_1", seed=10, feed_forward_proj="relu").state_dict()), v1_0)
    with pytest.raises(EmberError, match="feed_forward_proj"):
        hf_t5.config_from_hf({**hf.config.to_dict(), "feed_forward_proj": "gated-gelu-extra"})


def test_t5_hf_config_versions_read_old_and_new_spellings():
    """Old config.json files mark v1.1 with tie_word_embeddings: false; transformers 5 writes
    tie_word_embeddings: true and scale_decoder_outputs: false."""
    new = tiny_hf_t5("v1_1").config.to_dict()
    assert (new["tie_word_embeddings"], new["scale_decoder_outputs"]) == (True, False)
    old = {k: v for k, v in new.items() if k != "scale_decoder_outputs"} | {"tie_word_embeddings": False}
    for hf in (new, old):
        cfg = hf_t5.config_from_hf(hf)
        assert (cfg.tie_word_embeddings, cfg.hidden_act) == (False, "gated-gelu_new")
    assert hf_t5.config_from_hf(tiny_hf_t5("v1_0").config.to_dict()).tie_word_embeddings
