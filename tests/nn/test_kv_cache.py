"""ember.nn.kv_cache: the pre-allocated cache (written in place, grown past its capacity, rows
reordered through a spare buffer) holds what concatenation held, and GPT decoding with it gives
transformers' tokens on prompts of real text; grouped cross-attention (beams sharing an encoder
row) equals attention over repeated rows."""

from __future__ import annotations

import pytest
import torch

from ember.nn.attention import MultiHeadAttention
from ember.nn.kv_cache import KVCache, LayerKV


class ConcatKV:
    """The cache as it was before pre-allocation: grown by torch.cat, rows selected by indexing."""

    def __init__(self) -> None:
        self.k = self.v = None

    def update(self, k, v):
        self.k = k if self.k is None else torch.cat([self.k, k], dim=2)
        self.v = v if self.v is None else torch.cat([self.v, v], dim=2)
        return self.k, self.v

    def select(self, rows):
        self.k, self.v = self.k[rows], self.v[rows]


@pytest.mark.parametrize("capacity", [0, 1, 3, 64])
def test_kv_cache_in_place_growth_and_beam_reorder_hold_what_concatenation_held(capacity):
    """A prompt of 3 positions, then one per step with a beam-style reorder (rows repeated and
    dropped) and, once, fewer rows: at every step the cache's keys/values equal the concatenated
    ones, also after outgrowing a small capacity (doubling keeps what was written)."""
    g = torch.Generator().manual_seed(capacity)
    ours, ref = LayerKV(capacity), ConcatKV()
    k, v = torch.randn(4, 2, 3, 5, generator=g), torch.randn(4, 2, 3, 5, generator=g)
    for got, want in zip(ours.update(k, v), ref.update(k, v)):
        assert torch.equal(got, want)
    for step in range(9):
        rows = torch.randint(0, 4, (4,), generator=g) if step != 6 else torch.tensor([0, 2])
        if step == 7:  # back to 4 rows from the 2 kept
            rows = torch.tensor([1, 1, 0, 0])
        ours.select(rows)
        ref.select(rows)
        b = rows.numel()
        k, v = torch.randn(b, 2, 1, 5, generator=g), torch.randn(b, 2, 1, 5, generator=g)
        for got, want in zip(ours.update(k, v), ref.update(k, v)):
            assert torch.equal(got, want)
    assert ours.length == 12 and ours.capacity >= 12


def test_kv_cache_writes_in_place_within_its_capacity():
    """Within the capacity no step allocates: the keys are views of one buffer (the point of it)."""
    cache = KVCache(num_layers=1, capacity=8)
    layer = cache.layers[0]
    layer.update(torch.randn(1, 2, 3, 4), torch.randn(1, 2, 3, 4))
    storage = layer.k.untyped_storage().data_ptr()
    for _ in range(5):
        k, _ = layer.update(torch.randn(1, 2, 1, 4), torch.randn(1, 2, 1, 4))
        assert k.untyped_storage().data_ptr() == storage
    assert cache.length == 8 and cache.capacity == 8


@pytest.mark.parametrize("bias,scale", [(False, 1.0), (True, None)])  # T5's and BART's attention
def test_cross_attention_of_beams_sharing_an_encoder_row_equals_attention_over_repeated_rows(bias, scale):
    torch.manual_seed(0)
    attention = MultiHeadAttention(16, 4, 6, bias=bias, scale=scale).eval()
    memory = torch.randn(2, 7, 16)
    mask = torch.ones(2, 1, 1, 7, dtype=torch.bool)
    mask[1, ..., 5:] = False  # the second input is padded
    x = torch.randn(2 * 3, 1, 16)  # 3 beams per input, rows b * 3 + beam
    with torch.no_grad():
        shared, shared_probs = attention(x, memory, mask, need_weights=True)
        repeated, repeated_probs = attention(x, memory.repeat_interleave(3, 0), mask.repeat_interleave(3, 0),
                                             need_weights=True)
        fast, _ = attention(x, memory, mask)  # SDPA
    # the same dot products, in other batched products: float rounding apart
    torch.testing.assert_close(shared, repeated, atol=1e-6, rtol=1e-5)
    torch.testing.assert_close(shared_probs, repeated_probs, atol=1e-6, rtol=1e-5)
    torch.testing.assert_close(fast, repeated, atol=1e-5, rtol=1e-5)


def test_gpt2_generation_on_real_prompts_matches_transformers_with_a_cache_that_outgrows_its_allocation(
        monkeypatch):
    """Prompts of real Wikipedia text (left-padded in one batch), greedy: ember's tokens equal
    transformers' generate, and equal them again when every cache starts at one position and has
    to grow while decoding."""
    transformers = pytest.importorskip("transformers")
    from conftest import real_data
    from ember.data.readers import iter_documents
    from ember.generate import GenerationConfig, generate_ids
    from ember.interop import hf_gpt2
    from ember.models import build_backbone
    from ember.models.decoder import CausalLM, Decoder
    from ember.tokenizers import train_tokenizer
    from hf_interop_helpers import perturb

    source = real_data("wiki-en", "AA", "wiki_00.gz")
    tok = train_tokenizer([source], kind="bpe", vocab_size=400, lowercase=False, progress=False, fmt="auto",
                          max_documents=20)
    texts = [" ".join(d.text.split()[:n]) for d, n in zip(iter_documents(source), (12, 5, 9))]
    prompts = [tok.encode(t, add_special_tokens=False).ids for t in texts]
    torch.manual_seed(0)
    hf = perturb(transformers.GPT2LMHeadModel(transformers.GPT2Config(
        vocab_size=tok.get_vocab_size(), n_positions=64, n_embd=32, n_layer=3, n_head=4, n_inner=48,
        resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0, bos_token_id=0, eos_token_id=0)), 0, scale=0.5).eval()
    cfg_e = hf_gpt2.config_from_hf(hf.config.to_dict())
    ours = CausalLM(build_backbone(cfg_e)).eval()
    ours.load_state_dict(hf_gpt2.state_from_hf(hf.state_dict(), cfg_e), strict=True)
    cfg = GenerationConfig(max_new_tokens=10, stop_at_eot=False)
    got = generate_ids(ours, prompts, cfg, eot_id=0)

    width = max(map(len, prompts))
    ids = torch.tensor([[0] * (width - len(p)) + p for p in prompts])
    mask = torch.tensor([[0] * (width - len(p)) + [1] * len(p) for p in prompts])
    with torch.no_grad():
        want = hf.generate(ids, attention_mask=mask, max_new_tokens=10, do_sample=False, eos_token_id=None,
                           pad_token_id=0)[:, width:].tolist()
    assert got == want
    assert len({tuple(r) for r in got}) == 3  # three different continuations

    new_cache = Decoder.new_cache
    monkeypatch.setattr(Decoder, "new_cache", lambda self, capacity=0: new_cache(self, 1))
    assert generate_ids(ours, prompts, cfg, eot_id=0) == want
