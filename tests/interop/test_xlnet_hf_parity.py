"""XLNet parity with Hugging Face transformers' XLNetLMHeadModel, on tiny random models built
locally (weights perturbed off their init): plain forward, permutation masks with target
mappings (the query stream), memory carried across two segments, bidirectional data /
clamped distances, the causal Transformer-XL variant, the permutation-LM loss, and
conversion both ways."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch

transformers = pytest.importorskip("transformers")

from hf_interop_helpers import ATOL, assert_close_where, load_hf, padded_batch, perturb, write_hf_folder  # noqa: E402

from ember.cli import main  # noqa: E402
from ember.config import PlmConfig  # noqa: E402
from ember.data.memory_pairs import MemoryPair  # noqa: E402
from ember.errors import EmberError  # noqa: E402
from ember.interop import hf_xlnet  # noqa: E402
from ember.models import build_backbone  # noqa: E402
from ember.objectives.plm import PermutationLM  # noqa: E402
from ember.runs.checkpoint import load_weights  # noqa: E402
from ember.runs.folder import load_run_config  # noqa: E402

VOCAB = 99


def tiny_hf(seed: int = 0, **options):
    torch.manual_seed(seed)
    options.setdefault("mem_len", None)  # transformers' default is 512
    config = transformers.XLNetConfig(vocab_size=VOCAB, d_model=32, n_layer=3, n_head=4, d_inner=48,
                                      dropout=0.0, pad_token_id=0, **options)
    return perturb(transformers.XLNetLMHeadModel(config), seed)


def ember_from_hf(hf):
    cfg = hf_xlnet.config_from_hf(hf.config.to_dict())
    backbone = build_backbone(cfg).eval()
    state = hf_xlnet.state_from_hf(hf.state_dict(), cfg)
    backbone.load_state_dict({k.removeprefix("backbone."): v for k, v in state.items()}, strict=True)
    return backbone


def perm_inputs(batch: int, length: int, seed: int = 3):
    """A random perm_mask (B, T, T) and a target_mapping (B, 3, T) onto positions 1, 4 and the last."""
    g = torch.Generator().manual_seed(seed)
    perm = (torch.rand(batch, length, length, generator=g) > 0.5).float()
    mapping = torch.zeros(batch, 3, length)
    for row, pos in enumerate((1, 4, length - 1)):
        mapping[:, row, pos] = 1.0
    return perm, mapping


def segments(ids: torch.Tensor) -> torch.Tensor:
    """Segment ids 0 (A), 1 (B) and 2 (the last token, <cls>), as XLNet lays them out."""
    types = torch.zeros_like(ids)
    types[:, ids.shape[1] // 2 :] = 1
    types[:, -1] = 2
    return types


def test_xlnet_hf_parity_plain_forward_with_padding_and_segments():
    hf = tiny_hf()
    ours = ember_from_hf(hf)
    ids, mask = padded_batch(VOCAB, pad_id=0)  # row 1 right-padded
    with torch.no_grad():
        ref = hf(ids, attention_mask=mask, token_type_ids=segments(ids), use_mems=False,
                 output_hidden_states=True, output_attentions=True)
        out = ours(ids, mask, segments(ids), output_hidden_states=True, output_attentions=True)
    assert_close_where(ours.lm_logits(out.last_hidden_state), ref.logits, mask)
    assert out.mems is None and out.query_hidden is None  # no memory (mem_len None), no query stream
    assert len(out.hidden_states) == len(ref.hidden_states) == 4
    for a, b in zip(out.hidden_states, ref.hidden_states):
        assert_close_where(a, b, mask)
    for a, b in zip(out.attentions, ref.attentions):  # (B, heads, T, K): real query rows
        assert_close_where(a.transpose(1, 2), b.transpose(1, 2), mask)


def test_xlnet_hf_parity_perm_mask_and_target_mapping_query_stream():
    hf = tiny_hf(seed=1)
    ours = ember_from_hf(hf)
    ids = torch.randint(0, VOCAB, (3, 11), generator=torch.Generator().manual_seed(2))
    perm, mapping = perm_inputs(3, 11)
    with torch.no_grad():
        ref = hf(ids, token_type_ids=segments(ids), perm_mask=perm, target_mapping=mapping, use_mems=False,
                 output_hidden_states=True, output_attentions=True)
        out = ours(ids, None, segments(ids), perm_mask=perm, target_mapping=mapping,
                   output_hidden_states=True, output_attentions=True)
    assert out.query_hidden.shape == (3, 3, 32)
    torch.testing.assert_close(ours.lm_logits(out.query_hidden), ref.logits, atol=ATOL, rtol=0)
    # transformers interleaves the streams: (h_0, g_0, h_1, g_1, ...); attentions as (h, g) pairs
    torch.testing.assert_close(torch.stack(out.hidden_states), torch.stack(ref.hidden_states[0::2]), atol=ATOL, rtol=0)
    torch.testing.assert_close(torch.stack(out.query_hidden_states), torch.stack(ref.hidden_states[1::2]),
                               atol=ATOL, rtol=0)
    for (a_h, a_g), p_h, p_g in zip(ref.attentions, out.attentions, out.query_attentions):
        torch.testing.assert_close(p_h, a_h, atol=ATOL, rtol=0)
        torch.testing.assert_close(p_g, a_g, atol=ATOL, rtol=0)


def test_xlnet_hf_parity_padded_one_hot_and_soft_target_mappings():
    """One-hot rows take the row-gather path, others transformers' linear placement: both
    match it, including an all-zero (padded) target row."""
    hf = tiny_hf(seed=3)
    ours = ember_from_hf(hf)
    ids = torch.randint(0, VOCAB, (2, 9), generator=torch.Generator().manual_seed(5))
    perm, mapping = perm_inputs(2, 9)
    mapping[1, 2] = 0.0  # a padded target
    soft = mapping.clone()
    soft[0, 0, :2] = 0.5  # a target spread over two positions
    for m in (mapping, soft):
        with torch.no_grad():
            ref = hf(ids, token_type_ids=segments(ids), perm_mask=perm, target_mapping=m, use_mems=False)
            fast = ours(ids, None, segments(ids), perm_mask=perm, target_mapping=m)
            full = ours(ids, None, segments(ids), perm_mask=perm, target_mapping=m, output_attentions=True)
        torch.testing.assert_close(ours.lm_logits(fast.query_hidden), ref.logits, atol=ATOL, rtol=0)
        torch.testing.assert_close(fast.query_hidden, full.query_hidden, atol=ATOL, rtol=0)


@pytest.mark.parametrize("reuse_len", [None, 4])
def test_xlnet_hf_parity_mems_across_two_segments(reuse_len):
    hf = tiny_hf(seed=2, mem_len=6, reuse_len=reuse_len)
    ours = ember_from_hf(hf)
    assert (ours.config.mem_len, ours.config.reuse_len) == (6, reuse_len or 0)
    g = torch.Generator().manual_seed(4)
    first, second = torch.randint(0, VOCAB, (2, 9), generator=g), torch.randint(0, VOCAB, (2, 7), generator=g)
    perm, mapping = perm_inputs(2, 7)
    with torch.no_grad():
        ref1 = hf(first, token_type_ids=segments(first), use_mems=True)
        out1 = ours(first, None, segments(first))
        ref2 = hf(second, token_type_ids=segments(second), mems=ref1.mems, perm_mask=perm,
                  target_mapping=mapping, use_mems=True)
        out2 = ours(second, None, segments(second), mems=out1.mems, perm_mask=perm, target_mapping=mapping)
        ref2_content = hf(second, mems=ref1.mems, use_mems=True)
        out2_content = ours(second, mems=out1.mems)
    assert out1.mems[0].shape == (2, 6 if reuse_len is None else 4, 32)
    for a, b in zip(ours.memory(first, segments(first)), out1.mems):  # the memory-only pass
        torch.testing.assert_close(a, b, atol=0, rtol=0)
    for a, b in zip(out1.mems, ref1.mems):  # transformers keeps memory as (M, B, H)
        torch.testing.assert_close(a, b.transpose(0, 1), atol=ATOL, rtol=0)
    torch.testing.assert_close(ours.lm_logits(out2.query_hidden), ref2.logits, atol=ATOL, rtol=0)
    torch.testing.assert_close(ours.lm_logits(out2_content.last_hidden_state), ref2_content.logits, atol=ATOL, rtol=0)
    for a, b in zip(out2.mems, ref2.mems):
        torch.testing.assert_close(a, b.transpose(0, 1), atol=ATOL, rtol=0)
    # the memory changes the second segment's outputs (so the comparison above is not vacuous)
    with torch.no_grad():
        alone = ours.lm_logits(ours(second).last_hidden_state)
    assert (alone - ours.lm_logits(out2_content.last_hidden_state)).abs().max() > 1e-3


def test_xlnet_hf_parity_bidirectional_data_and_clamped_distances():
    hf = tiny_hf(seed=5, bi_data=True, clamp_len=3)
    ours = ember_from_hf(hf)
    ids = torch.randint(0, VOCAB, (4, 10), generator=torch.Generator().manual_seed(6))
    perm, mapping = perm_inputs(4, 10)
    with torch.no_grad():
        ref = hf(ids, token_type_ids=segments(ids), perm_mask=perm, target_mapping=mapping, use_mems=False)
        out = ours(ids, None, segments(ids), perm_mask=perm, target_mapping=mapping)
    torch.testing.assert_close(ours.lm_logits(out.query_hidden), ref.logits, atol=ATOL, rtol=0)
    with pytest.raises(EmberError, match="even batch"):
        ours(ids[:3])


def test_xlnet_hf_parity_causal_transformer_xl_attention():
    hf = tiny_hf(seed=7, attn_type="uni", mem_len=5)
    ours = ember_from_hf(hf)
    g = torch.Generator().manual_seed(8)
    first, second = torch.randint(0, VOCAB, (2, 8), generator=g), torch.randint(0, VOCAB, (2, 6), generator=g)
    with torch.no_grad():  # transformers' "uni" path breaks with any padding/perm mask: plain inputs only
        ref1, out1 = hf(first, use_mems=True), ours(first)
        ref2, out2 = hf(second, mems=ref1.mems, use_mems=True), ours(second, mems=out1.mems)
    torch.testing.assert_close(ours.lm_logits(out1.last_hidden_state), ref1.logits, atol=ATOL, rtol=0)
    torch.testing.assert_close(ours.lm_logits(out2.last_hidden_state), ref2.logits, atol=ATOL, rtol=0)


def test_xlnet_plm_loss_matches_transformers_on_the_objectives_own_batch():
    """The objective end to end: its batch (layout, perm_mask, target_mapping, labels, memory
    pass) through transformers gives the same loss as through ember."""
    hf = tiny_hf(seed=9, mem_len=5)
    backbone = ember_from_hf(hf)
    module = PermutationLM(backbone, PlmConfig(k=4.0), 12, {"sep": 3, "cls": 2}).eval()
    rng = np.random.default_rng(0)
    examples = [MemoryPair(rng.integers(5, VOCAB, 5), rng.integers(5, VOCAB, 4), rng.integers(5, VOCAB, 5), True)
                for _ in range(2)]
    batch = module.make_batch(examples, np.random.default_rng(1))
    with torch.no_grad():
        loss, metrics = module(batch)
        mems = hf(batch["memory_ids"], token_type_ids=torch.zeros_like(batch["memory_ids"]), use_mems=True).mems
        ref = hf(batch["input_ids"], attention_mask=batch["attention_mask"], token_type_ids=batch["token_type_ids"],
                 mems=mems, perm_mask=batch["perm_mask"].float(), target_mapping=batch["target_mapping"],
                 labels=batch["target_labels"], use_mems=True)
    assert metrics["plm_loss"][1] == 2 * 3  # round(12 / 4) targets per sequence
    torch.testing.assert_close(loss, ref.loss, atol=ATOL, rtol=0)


def test_xlnet_hf_export_loads_in_transformers_with_the_same_outputs(tmp_path):
    hf = tiny_hf(seed=10, mem_len=4)
    ours = ember_from_hf(hf)
    state = {f"backbone.{k}": v for k, v in ours.state_dict().items()}
    exported = hf_xlnet.state_to_hf(state, ours.config)
    config = hf_xlnet.config_to_hf(ours.config, [hf_xlnet.hf_architecture(state)])
    folder = write_hf_folder(exported, config, tmp_path / "hf")
    back = load_hf(transformers.XLNetLMHeadModel, folder, tied=("lm_loss.weight",))
    ids = torch.randint(0, VOCAB, (2, 9), generator=torch.Generator().manual_seed(11))
    perm, mapping = perm_inputs(2, 9)
    with torch.no_grad():
        a = back(ids, token_type_ids=segments(ids), perm_mask=perm, target_mapping=mapping).logits
        b = hf(ids, token_type_ids=segments(ids), perm_mask=perm, target_mapping=mapping).logits
    torch.testing.assert_close(a, b, atol=ATOL, rtol=0)
    assert back.config.mem_len == 4 and back.config.d_head == 8


def test_xlnet_convert_cli_both_ways_through_folders(tmp_path):
    from tokenizers import Tokenizer, models, pre_tokenizers

    hf = tiny_hf(seed=12)
    state = {k: v.clone() for k, v in hf.state_dict().items() if k != "lm_loss.weight"}  # saved tied, once
    hf_dir = write_hf_folder(state, {**hf.config.to_dict(), "architectures": ["XLNetLMHeadModel"]}, tmp_path / "hf")
    # XLNet ships SentencePiece; ember reads a tokenizer.json (a Unigram model) from the folder.
    pieces = ["<unk>", "<s>", "</s>", "<cls>", "<sep>", "<pad>", "<mask>", "<eod>", "<eop>"]
    pieces += [f"\u2581w{i}" for i in range(VOCAB - len(pieces))]
    tok = Tokenizer(models.Unigram([(p, -1.0) for p in pieces], unk_id=0))
    tok.pre_tokenizer = pre_tokenizers.Metaspace()
    tok.save(str(hf_dir / "tokenizer.json"))
    assert main(["convert", "--from-hf", str(hf_dir), "--out", str(tmp_path / "run")]) == 0
    cfg = load_run_config(tmp_path / "run")
    assert (cfg.objective, cfg.model.family, cfg.model.hidden_size, cfg.model.pad_token_id) == ("plm", "xlnet", 32, 0)
    assert set(load_weights(tmp_path / "run" / "model.safetensors")) >= {"backbone.lm_bias", "backbone.mask_emb"}
    assert main(["convert", "--to-hf", str(tmp_path / "run"), "--out", str(tmp_path / "back")]) == 0
    back = load_hf(transformers.XLNetLMHeadModel, tmp_path / "back", tied=("lm_loss.weight",))
    ids = torch.randint(9, VOCAB, (2, 8), generator=torch.Generator().manual_seed(13))
    with torch.no_grad():
        torch.testing.assert_close(back(ids).logits, hf(ids).logits, atol=ATOL, rtol=0)
    settings = json.loads((tmp_path / "back" / "tokenizer_config.json").read_text())
    assert settings["padding_side"] == "left" and (settings["cls_token"], settings["sep_token"]) == ("<cls>", "<sep>")
    fast = transformers.AutoTokenizer.from_pretrained(tmp_path / "back")
    assert fast.convert_tokens_to_ids("<cls>") == 3


def test_xlnet_import_refuses_an_untied_lm_layer_and_unknown_weights():
    hf = tiny_hf(seed=14)
    cfg = hf_xlnet.config_from_hf(hf.config.to_dict())
    state = {k: v.clone() for k, v in hf.state_dict().items()}
    state["lm_loss.weight"] = state["lm_loss.weight"] + 1.0
    with pytest.raises(EmberError, match="not tied"):
        hf_xlnet.state_from_hf(state, cfg)
    extra = {**{k: v for k, v in hf.state_dict().items()}, "sequence_summary.summary.weight": torch.zeros(2, 32)}
    with pytest.raises(EmberError, match="sequence_summary"):
        hf_xlnet.state_from_hf(extra, cfg)


def test_xlnet_memory_longer_than_the_model_supports_is_a_clear_error():
    hf = tiny_hf(seed=15, mem_len=4)
    ours = ember_from_hf(hf)
    ids = torch.randint(0, VOCAB, (2, 6), generator=torch.Generator().manual_seed(16))
    long_mems = [torch.zeros(2, 5, 32) for _ in range(3)]
    with pytest.raises(EmberError, match=r"memory holds 5 positions, more than this model supports \(model.mem_len=4\)"):
        ours(ids, mems=long_mems)
    with pytest.raises(EmberError, match="one memory per layer"):
        ours(ids, mems=long_mems[:2])
    no_memory = ember_from_hf(tiny_hf(seed=15, mem_len=None))
    with pytest.raises(EmberError, match="keeps no memory"):
        no_memory(ids, mems=[m[:, :2] for m in long_mems])
