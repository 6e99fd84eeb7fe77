"""BERT parity with Hugging Face transformers, on tiny random models built locally."""

from __future__ import annotations

import pytest
import torch

transformers = pytest.importorskip("transformers")

from ember.config import DataConfig  # noqa: E402
from ember.interop import hf_bert  # noqa: E402
from ember.interop.convert import export_hf, import_hf  # noqa: E402
from ember.models import build_backbone  # noqa: E402
from ember.objectives.bert import BertPretraining  # noqa: E402
from hf_interop_helpers import padded_batch, perturb  # noqa: E402

SPECIAL = {"pad": 0, "unk": 1, "cls": 2, "sep": 3, "mask": 4}
ATOL = 1e-5


def tiny_hf_bert(seed: int = 0):
    torch.manual_seed(seed)
    config = transformers.BertConfig(
        vocab_size=98, hidden_size=32, num_hidden_layers=3, num_attention_heads=4,
        intermediate_size=37, max_position_embeddings=64, type_vocab_size=2,
        hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0,
    )
    return perturb(transformers.BertForPreTraining(config), seed)


def inputs(batch: int = 3, length: int = 17, seed: int = 1):
    ids, mask = padded_batch(98, SPECIAL["pad"], batch=batch, length=length, seed=seed)  # row 1 padded
    types = torch.zeros(batch, length, dtype=torch.long)
    types[:, 9:] = 1
    return ids, mask, types


def ember_from_hf(hf_model) -> BertPretraining:
    cfg = hf_bert.config_from_hf(hf_model.config.to_dict())
    module = BertPretraining(build_backbone(cfg), SPECIAL, DataConfig(nsp=True)).eval()
    module.load_state_dict(hf_bert.state_from_hf(hf_model.state_dict(), cfg), strict=True)
    return module


def test_bert_hf_parity_mlm_and_nsp_logits():
    hf = tiny_hf_bert()
    ours = ember_from_hf(hf)
    ids, mask, types = inputs()
    with torch.no_grad():
        ref = hf(input_ids=ids, attention_mask=mask, token_type_ids=types)
        mlm, nsp = ours.logits({"input_ids": ids, "attention_mask": mask, "token_type_ids": types})
    keep = mask.bool()  # padded positions are undefined in both implementations
    torch.testing.assert_close(mlm[keep], ref.prediction_logits[keep], atol=ATOL, rtol=0)
    torch.testing.assert_close(nsp, ref.seq_relationship_logits, atol=ATOL, rtol=0)


def test_bert_hf_parity_hidden_states_and_attentions():
    hf = tiny_hf_bert(seed=3)
    ours = ember_from_hf(hf)
    ids, mask, types = inputs(seed=4)
    with torch.no_grad():
        ref = hf.bert(input_ids=ids, attention_mask=mask, token_type_ids=types,
                      output_hidden_states=True, output_attentions=True)
        out = ours.backbone(ids, mask, types, output_hidden_states=True, output_attentions=True)
    keep = mask.bool()
    assert len(out.hidden_states) == len(ref.hidden_states) == 4
    for a, b in zip(out.hidden_states, ref.hidden_states):
        torch.testing.assert_close(a[keep], b[keep], atol=ATOL, rtol=0)
    for a, b in zip(out.attentions, ref.attentions):
        torch.testing.assert_close(a[keep], b[keep], atol=ATOL, rtol=0)
    torch.testing.assert_close(out.pooled, ref.pooler_output, atol=ATOL, rtol=0)


def test_bert_hf_convert_round_trip_through_folders(tmp_path, tiny_tokenizer_path):
    """HF folder -> ember run folder -> HF folder, reloaded by transformers: same logits."""
    hf = tiny_hf_bert(seed=5)
    hf_dir = tmp_path / "hf"
    hf.save_pretrained(hf_dir)
    (hf_dir / "tokenizer.json").write_bytes(tiny_tokenizer_path.read_bytes())
    run = import_hf(hf_dir, tmp_path / "run")
    out = export_hf(run, tmp_path / "exported")
    again = transformers.BertForPreTraining.from_pretrained(out).eval()
    ids, mask, types = inputs(seed=6)
    with torch.no_grad():
        a = hf(input_ids=ids, attention_mask=mask, token_type_ids=types)
        b = again(input_ids=ids, attention_mask=mask, token_type_ids=types)
    torch.testing.assert_close(b.prediction_logits, a.prediction_logits, atol=ATOL, rtol=0)
    torch.testing.assert_close(b.seq_relationship_logits, a.seq_relationship_logits, atol=ATOL, rtol=0)
    tok = transformers.AutoTokenizer.from_pretrained(out)
    assert tok("the w3")["input_ids"][0] == SPECIAL["cls"]


def test_bert_hf_import_rejects_other_families(tmp_path):
    from ember.errors import EmberError

    with pytest.raises(EmberError, match="model_type"):
        hf_bert.config_from_hf({"model_type": "gpt2"})


def test_bert_hf_import_reads_pytorch_model_bin(tmp_path, tiny_tokenizer_path):
    """Older checkpoints ship pytorch_model.bin (read with weights_only=True)."""
    hf = tiny_hf_bert(seed=7)
    hf_dir = tmp_path / "hf"
    hf.save_pretrained(hf_dir, safe_serialization=False)
    if not (hf_dir / "pytorch_model.bin").is_file():  # newer transformers may always write safetensors
        (hf_dir / "model.safetensors").unlink(missing_ok=True)
        torch.save(hf.state_dict(), hf_dir / "pytorch_model.bin")
    assert not (hf_dir / "model.safetensors").exists()
    (hf_dir / "tokenizer.json").write_bytes(tiny_tokenizer_path.read_bytes())
    from ember.runs.init import load_init

    cfg, state, _ = load_init(str(hf_dir))
    torch.testing.assert_close(state["embeddings.word.weight"], hf.bert.embeddings.word_embeddings.weight)
    torch.testing.assert_close(state["layers.0.attention.qkv.weight"][:32],
                               hf.bert.encoder.layer[0].attention.self.query.weight)
