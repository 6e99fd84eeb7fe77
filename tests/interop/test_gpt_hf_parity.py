"""GPT-1 and GPT-2 parity with Hugging Face transformers, on tiny random models built locally."""

from __future__ import annotations

import pytest
import torch

transformers = pytest.importorskip("transformers")

from hf_interop_helpers import ATOL, assert_close_where, load_hf, padded_batch, perturb, write_hf_folder  # noqa: E402

from ember.interop import hf_gpt1, hf_gpt2  # noqa: E402
from ember.interop.convert import export_hf, import_hf  # noqa: E402
from ember.models import build_backbone  # noqa: E402
from ember.objectives.clm import CausalLM  # noqa: E402
from ember.runs.checkpoint import load_weights  # noqa: E402
from ember.runs.folder import load_run_config  # noqa: E402

VOCAB = 99
FAMILIES = {
    "gpt2": (hf_gpt2, lambda: transformers.GPT2LMHeadModel(transformers.GPT2Config(
        vocab_size=VOCAB, n_positions=40, n_embd=32, n_layer=3, n_head=4, n_inner=48,
        resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0, bos_token_id=5, eos_token_id=5,
        attn_implementation="eager"))),  # sdpa returns no attention probabilities
    "gpt1": (hf_gpt1, lambda: transformers.OpenAIGPTLMHeadModel(transformers.OpenAIGPTConfig(
        vocab_size=VOCAB, n_positions=40, n_embd=32, n_layer=3, n_head=4,
        resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0))),
}


def tiny_hf(name: str, seed: int = 0):
    torch.manual_seed(seed)
    return perturb(FAMILIES[name][1](), seed)


def ember_from_hf(name: str, hf_model) -> CausalLM:
    interop = FAMILIES[name][0]
    cfg = interop.config_from_hf(hf_model.config.to_dict())
    module = CausalLM(build_backbone(cfg)).eval()
    module.load_state_dict(interop.state_from_hf(hf_model.state_dict(), cfg), strict=True)
    return module


@pytest.mark.parametrize("name", ["gpt2", "gpt1"])
def test_gpt_hf_parity_logits_hidden_states_and_attentions(name):
    hf = tiny_hf(name)
    ours = ember_from_hf(name, hf)
    ids, mask = padded_batch(VOCAB, pad_id=0)  # row 1 right-padded
    with torch.no_grad():
        ref = hf(input_ids=ids, attention_mask=mask, output_hidden_states=True, output_attentions=True)
        logits = ours.logits(ids, mask)
        out = ours.backbone(ids, mask, output_hidden_states=True, output_attentions=True)
    assert_close_where(logits, ref.logits, mask)
    assert len(out.hidden_states) == len(ref.hidden_states) == 4
    for a, b in zip(out.hidden_states, ref.hidden_states):
        assert_close_where(a, b, mask)
    assert len(out.attentions) == len(ref.attentions) == 3
    for a, b in zip(out.attentions, ref.attentions):  # (B, heads, T, T): compare real query rows
        assert_close_where(a.transpose(1, 2), b.transpose(1, 2), mask)


@pytest.mark.parametrize("name", ["gpt2", "gpt1"])
def test_gpt_hf_parity_without_mask_uses_plain_causal_attention(name):
    hf = tiny_hf(name, seed=2)
    ours = ember_from_hf(name, hf)
    ids = torch.randint(0, VOCAB, (2, 23), generator=torch.Generator().manual_seed(3))
    with torch.no_grad():
        torch.testing.assert_close(ours.logits(ids), hf(input_ids=ids).logits, atol=ATOL, rtol=0)


@pytest.mark.parametrize("name,cls", [("gpt2", "GPT2LMHeadModel"), ("gpt1", "OpenAIGPTLMHeadModel")])
def test_gpt_hf_convert_round_trip_through_folders(name, cls, tmp_path, tiny_tokenizer_path):
    hf = tiny_hf(name, seed=4)
    # transformers saves the tied head once (no lm_head.weight); a copy is accepted too.
    state = {k: v.clone() for k, v in hf.state_dict().items() if name == "gpt1" or k != "lm_head.weight"}
    hf_dir = write_hf_folder(state, {**hf.config.to_dict(), "architectures": [cls]}, tmp_path / "hf")
    (hf_dir / "tokenizer.json").write_bytes(tiny_tokenizer_path.read_bytes())
    run = import_hf(hf_dir, tmp_path / "run")
    cfg = load_run_config(run)
    assert cfg.objective == "clm" and cfg.model.family == {"gpt2": "gpt2", "gpt1": "gpt"}[name]
    module = CausalLM(build_backbone(cfg.model)).eval()
    module.load_state_dict(load_weights(run / "model.safetensors"), strict=True)
    back = load_hf(getattr(transformers, cls), export_hf(run, tmp_path / "hf-back"), tied=("lm_head.weight",))
    ids, mask = padded_batch(VOCAB, pad_id=0, seed=5)
    with torch.no_grad():
        ref = hf(input_ids=ids, attention_mask=mask).logits
        assert_close_where(module.logits(ids, mask), ref, mask)
        assert_close_where(back(input_ids=ids, attention_mask=mask).logits, ref, mask)


def test_gpt2_import_refuses_untied_head():
    from ember.errors import EmberError

    hf = tiny_hf("gpt2")
    state = dict(hf.state_dict())
    state["lm_head.weight"] = state["lm_head.weight"] + 1.0
    with pytest.raises(EmberError, match="not tied"):
        hf_gpt2.state_from_hf(state, hf_gpt2.config_from_hf(hf.config.to_dict()))


def test_gpt2_export_refuses_a_post_ln_model():
    from ember.config import model_preset
    from ember.errors import EmberError

    cfg = model_preset("gpt1")
    with pytest.raises(EmberError, match="pre-LayerNorm"):
        hf_gpt2.state_to_hf({}, cfg)


def test_gpt2_import_builds_gpt2_tokenizer_from_vocab_and_merges(tmp_path):
    """A GPT-2 folder with only vocab.json + merges.txt (no <s>): ember's tokenizer gives
    transformers' GPT2Tokenizer ids on real text, and <|endoftext|> is one token."""
    from tokenizers import Tokenizer, models, pre_tokenizers, trainers

    from conftest import real_data
    from ember.tokenizers import end_of_text_id, load_tokenizer

    sentences = [line.split("\t")[0] for line in
                 real_data("glue", "SST-2", "dev.tsv").read_text().splitlines()[1:200]]
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.train_from_iterator(sentences, trainers.BpeTrainer(
        vocab_size=400, special_tokens=["<|endoftext|>"], initial_alphabet=pre_tokenizers.ByteLevel.alphabet()))
    hf = tiny_hf("gpt2", seed=6)
    hf_dir = write_hf_folder({k: v for k, v in hf.state_dict().items() if k != "lm_head.weight"},
                             {**hf.config.to_dict(), "architectures": ["GPT2LMHeadModel"]}, tmp_path / "hf")
    tok.model.save(str(hf_dir))
    ours = load_tokenizer(import_hf(hf_dir, tmp_path / "run") / "tokenizer.json")
    ref = transformers.GPT2Tokenizer.from_pretrained(hf_dir)
    for text in sentences[:50] + ["two  spaces\tand a tab", "end<|endoftext|>start"]:
        assert ours.encode(text).ids == ref(text)["input_ids"], text
    assert end_of_text_id(ours) == ref.convert_tokens_to_ids("<|endoftext|>")


def test_gpt2_run_exports_to_transformers_with_its_tokenizer(tmp_path):
    """An ember GPT-2 run (byte-level BPE with <|endoftext|>) exports to a folder that
    GPT2LMHeadModel + AutoTokenizer load: same token ids (no <s> template) and same logits."""
    from gpt_helpers import make_gpt_run

    from ember.generate import load_causal_lm

    run = make_gpt_run(tmp_path)
    ours, tok = load_causal_lm(run)
    out = export_hf(run, tmp_path / "hf")
    model = load_hf(transformers.GPT2LMHeadModel, out, tied=("lm_head.weight",))
    hf_tok = transformers.AutoTokenizer.from_pretrained(out)
    text = "The river runs by the old town."
    ids = tok.encode(text, add_special_tokens=False).ids
    assert hf_tok(text)["input_ids"] == ids
    assert model.config.eos_token_id == tok.token_to_id("<|endoftext|>")
    # the tokenizer names the same roles as config.json (GPT-2's: <|endoftext|> begins and ends)
    assert hf_tok.eos_token == hf_tok.bos_token == "<|endoftext|>" == tok.id_to_token(model.config.bos_token_id)
    with torch.no_grad():
        torch.testing.assert_close(model(input_ids=torch.tensor([ids])).logits,
                                   ours.logits(torch.tensor([ids])), atol=ATOL, rtol=0)
