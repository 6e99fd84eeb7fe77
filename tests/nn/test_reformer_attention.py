"""Reformer (Kitaev et al. 2020): shared-QK LSH attention (ember.nn.lsh) and reversible residual
layers (ember.nn.reversible), as the encoder's model.attention=reformer / model.reversible.
Parity with transformers' ReformerModel is in tests/interop/test_reformer_hf_parity.py; here the
paper's rules as properties, the reversible backward against ordinary autograd, memory against
depth, real text, and the one-line refusals."""

from __future__ import annotations

import pytest
import torch

from ember.config import ModelConfig
from ember.errors import EmberError
from ember.models import build_backbone
from ember.nn.lsh import LSHAttention, lsh_attention, shared_keys
from ember.nn.reversible import layer_blocks, reversible_stack


def shared_qk_softmax(q, v, real=None):
    """Dense shared-QK attention with the paper's masks: every key but the token itself (unless it is
    alone) and padding."""
    k = shared_keys(q)
    dots = q @ k.transpose(-1, -2)
    t = q.shape[-2]
    if real is not None:
        dots = dots.masked_fill(~real[:, None, None, :], -1e9)
    dots = dots.masked_fill(torch.eye(t, dtype=torch.bool), -1e5)
    return dots.softmax(-1) @ v


def rotations(h, d, rounds, buckets, seed):
    return torch.randn(h, d, rounds, buckets // 2, generator=torch.Generator().manual_seed(seed), dtype=torch.float64)


def test_lsh_attention_on_an_input_within_one_chunk_is_shared_qk_softmax_without_self():
    g = torch.Generator().manual_seed(0)
    q, v = (torch.randn(2, 3, 13, 8, generator=g, dtype=torch.float64) for _ in range(2))
    real = torch.ones(2, 13, dtype=torch.bool)
    real[1, 9:] = False
    ours = lsh_attention(q, v, rotations(3, 8, 2, 4, 0), chunk=16, real=real)
    torch.testing.assert_close(ours, shared_qk_softmax(q, v, real), atol=1e-12, rtol=0)


@pytest.mark.parametrize("t", [24, 29])  # a whole number of chunks, and one padded internally
def test_lsh_attention_reads_itself_only_when_alone_and_never_padding(t):
    g = torch.Generator().manual_seed(1)
    q, v = (torch.randn(2, 2, t, 8, generator=g, dtype=torch.float64) for _ in range(2))
    real = torch.ones(2, t, dtype=torch.bool)
    real[1, 1:] = False  # row 1: one real token, alone
    rot = rotations(2, 8, 3, 4, 2)
    out = lsh_attention(q, v, rot, chunk=4, real=real)
    torch.testing.assert_close(out[1, :, 0], v[1, :, 0])  # alone: its own value
    other = v.clone()
    other[0, :, 5] += 10.0  # a token with company does not read its own value ...
    other[1, :, 1:] = 99.0  # ... and nobody reads padding
    changed = lsh_attention(q, other, rot, chunk=4, real=real)
    torch.testing.assert_close(changed[0, :, 5], out[0, :, 5], atol=1e-12, rtol=0)
    torch.testing.assert_close(changed[1, :, 0], out[1, :, 0], atol=1e-12, rtol=0)


def real_queries(tokens: int = 128):
    """Layer-0 queries and values of all-MiniLM-L6-v2 on real Wikipedia text (MiniLM's query
    projection as the shared one), 12 heads of 32."""
    from test_performer_attention import real_hidden_states

    q, _, v = real_hidden_states(tokens)
    return q.double(), v.double()


def test_lsh_attention_approaches_full_shared_qk_attention_as_hash_rounds_grow_on_real_text():
    """§5 / Fig. 4: more hash rounds find more of the keys full attention weights, so the output
    nears full (shared-QK) attention's; on MiniLM's real layer-0 states, averaged over 3 draws."""
    q, v = real_queries(128)  # the tokenizer's truncation length
    exact = shared_qk_softmax(q, v)
    errors = []
    for rounds in (1, 2, 4, 8):
        per_draw = [(lsh_attention(q, v, rotations(q.shape[1], q.shape[-1], rounds, 16, s), chunk=8) - exact).norm()
                    / exact.norm() for s in range(3)]
        errors.append(float(torch.stack(per_draw).mean()))
    assert errors == sorted(errors, reverse=True), errors
    assert errors[-1] < 0.6 * errors[0], errors


def tiny(**kw) -> ModelConfig:
    return ModelConfig(**{"vocab_size": 60, "hidden_size": 32, "num_layers": 2, "num_heads": 4,
                          "intermediate_size": 37, "max_position": 64, "dropout": 0.0, "attention_dropout": 0.0,
                          "attention": "reformer", "attention_chunk": 8, "attention_buckets": 4,
                          "attention_hashes": 2, **kw})


def gradients(model, ids, mask, plain: bool, seed: int = 3):
    """Parameter and input-embedding gradients of one training step through the layer stack."""
    torch.manual_seed(seed)  # the same dropout masks and LSH rotations in both computations
    model.zero_grad(set_to_none=True)
    x, msk, _ = model.embed(ids, mask)
    x = x.detach().requires_grad_()
    y1, y2 = reversible_stack(x, layer_blocks(model.layer_sequence(), msk, model.config.ffn_chunk), plain=plain)
    (y1 * y2).mean().backward()  # a loss that weighs the two streams differently
    grads = {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}
    return grads, x.grad.clone()


@pytest.mark.parametrize("settings", [
    {"attention": "reformer", "ffn_chunk": 5},
    {"attention": "full", "share_layers": "all"},  # any attention; a sub-layer shared by every layer
])
def test_reversible_layers_give_the_plain_networks_gradients_with_dropout(settings):
    """The backward that reconstructs each layer's inputs from its outputs gives the gradients of
    the same network run with ordinary autograd: float64 to 1e-10 (reconstruction X = Y - F(.) is
    exact only up to rounding), float32 to 1e-4."""
    torch.manual_seed(0)
    cfg = tiny(num_layers=3, dropout=0.1, attention_dropout=0.1, reversible=True, pre_layer_norm=True, **settings)
    model = build_backbone(cfg).train()
    ids = torch.randint(5, 60, (2, 29))
    mask = torch.ones(2, 29, dtype=torch.long)
    mask[1, 21:] = 0
    for dtype, tol in ((torch.float64, 1e-10), (torch.float32, 1e-4)):
        model.to(dtype)
        (rev, rev_x), (plain, plain_x) = gradients(model, ids, mask, False), gradients(model, ids, mask, True)
        assert rev.keys() == plain.keys() and len(rev) == len([p for p in model.parameters() if p.grad is not None])
        for name in plain:
            torch.testing.assert_close(rev[name], plain[name], atol=tol, rtol=tol, msg=name)
        torch.testing.assert_close(rev_x, plain_x, atol=tol, rtol=tol)
    changed = gradients(model, ids, mask, False, seed=4)[1]  # another draw: other masks, other gradients
    assert (changed - rev_x).abs().max() > 1e-3


def test_reversible_layers_recompute_under_the_forwards_autocast():
    """A training loop calls backward outside ``torch.autocast``: the recomputation must still run
    in bf16 as the forward did (else its reconstruction and gradients are fp32's: ~5e-3 off)."""
    torch.manual_seed(0)
    model = build_backbone(tiny(num_layers=3, reversible=True, pre_layer_norm=True, attention="full")).train()
    ids = torch.randint(5, 60, (2, 29))

    def grads(plain: bool):
        model.zero_grad(set_to_none=True)
        with torch.autocast("cpu", dtype=torch.bfloat16):
            x, msk, _ = model.embed(ids)
            y1, y2 = reversible_stack(x, layer_blocks(model.layer_sequence(), msk), plain=plain)
            loss = (y1 * y2).float().mean()
        loss.backward()
        return {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}

    rev, plain = grads(False), grads(True)
    for name in plain:  # the same bf16 arithmetic; only the reconstruction's rounding differs
        assert (rev[name] - plain[name]).abs().max() <= 1e-4 * plain[name].abs().max(), name


def saved_bytes(model, ids, plain: bool) -> int:
    """Bytes of the activations autograd keeps between the forward and the backward (parameters
    excluded), counted with saved-tensor hooks, for one training forward through the stack."""
    params = {p.data_ptr() for p in model.parameters()}
    total = 0

    def pack(t):
        nonlocal total
        if t.data_ptr() not in params:
            total += t.numel() * t.element_size()
        return t

    x, msk, _ = model.embed(ids)
    x = x.detach().requires_grad_()
    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        y1, y2 = reversible_stack(x, layer_blocks(model.layer_sequence(), msk, model.config.ffn_chunk), plain=plain)
    return total


def test_reversible_layers_keep_activation_memory_flat_as_depth_grows():
    """Kitaev et al. §3: reversible layers store activations once, not once per layer. Ordinary
    autograd's saved activations grow linearly with depth; the reversible stack keeps its two
    (B, T, H) outputs whatever the depth (the backward then holds one layer's at a time)."""
    torch.manual_seed(0)
    ids = torch.randint(5, 60, (2, 64))
    rev, plain = {}, {}
    for depth in (1, 2, 4, 8):
        model = build_backbone(tiny(num_layers=depth, reversible=True, pre_layer_norm=True)).train()
        rev[depth], plain[depth] = saved_bytes(model, ids, False), saved_bytes(model, ids, True)
    assert rev[1] == rev[8] == 2 * 2 * 64 * 32 * 4  # Y1 and Y2 in fp32
    assert plain[8] > 7 * plain[1] and plain[2] > 1.9 * plain[1]  # linear in depth


def test_reformer_encoder_is_reproducible_in_eval_ignores_padding_and_trains():
    torch.manual_seed(0)
    model = build_backbone(tiny(reversible=True, pre_layer_norm=True, ffn_chunk=8)).eval()
    ids = torch.randint(5, 60, (2, 30))
    mask = torch.ones(2, 30, dtype=torch.long)
    mask[1, 20:] = 0
    with torch.no_grad():
        a, b = model(ids, mask).last_hidden_state, model(ids, mask).last_hidden_state
        other = ids.clone()
        other[1, 20:] = 7  # what the padding holds does not reach real tokens
        c = model(other, mask).last_hidden_state
        states = model(ids, mask, output_hidden_states=True)
    torch.testing.assert_close(a, b, rtol=0, atol=0)
    torch.testing.assert_close(a[1, :20], c[1, :20], atol=1e-5, rtol=0)
    assert len(states.hidden_states) == 3
    torch.testing.assert_close(states.last_hidden_state, a, atol=1e-6, rtol=0)
    model.train()
    model(ids, mask).last_hidden_state.pow(2).mean().backward()
    grads = [p.grad for p in model.parameters() if p.grad is not None]
    assert len(grads) == len(list(model.parameters())) - 2  # all but the pooler's (no loss reads it)
    assert all(torch.isfinite(g).all() for g in grads)


@pytest.mark.parametrize("settings", [{}, {"reversible": True, "pre_layer_norm": True}])
def test_reformer_encoder_runs_in_bfloat16_and_under_autocast(settings):
    torch.manual_seed(0)
    model = build_backbone(tiny(**settings)).eval()
    ids = torch.randint(5, 60, (2, 40))
    mask = torch.ones(2, 40, dtype=torch.long)
    mask[1, 30:] = 0
    with torch.no_grad():
        reference = model(ids, mask).last_hidden_state
        with torch.autocast("cpu", dtype=torch.bfloat16):
            autocast = model(ids, mask).last_hidden_state
        half = model.to(torch.bfloat16)(ids, mask).last_hidden_state
    for out in (autocast, half):
        assert torch.isfinite(out.float()).all()
        # bf16 rounding, not another function (a near-tie in argmax may move a token's bucket)
        assert (out.float() - reference)[mask.bool()].abs().mean() < 0.05


@pytest.mark.parametrize("settings, message", [
    ({"attention_buckets": 5}, "attention_buckets=5: Reformer's LSH needs an even number of buckets"),
    ({"attention_hashes": 0}, "attention_hashes=0 and model.attention_chunk=64 must be >= 1"),
    ({"family": "t5"}, "model.attention=reformer serves the bidirectional encoder families"),
    ({"family": "xlm", "causal": True}, "not a causal encoder"),
    ({"attention_global": 1}, "model.attention_global is Longformer's"),
    ({"reversible": True}, "model.reversible=true runs pre-LN blocks"),
    ({"reversible": True, "pre_layer_norm": True, "family": "gpt2"}, "model.reversible=true serves the bidirectional"),
    ({"reversible": True, "pre_layer_norm": True, "ffn_chunk": -1}, "model.ffn_chunk=-1 must be >= 0"),
])
def test_reformer_config_refuses_bad_settings_with_one_line(settings, message):
    base = {"attention_chunk": 64} if "attention_hashes" in settings else {}
    with pytest.raises(EmberError, match=message) as info:
        tiny(**{**base, **settings})
    assert "\n" not in str(info.value)


def test_reformer_layer_and_encoder_refuse_bad_inputs_with_one_line():
    with pytest.raises(EmberError, match="even number of buckets"):
        LSHAttention(32, 4, 0.0, buckets=3)
    model = build_backbone(tiny())
    ids = torch.randint(5, 60, (1, 20))
    with pytest.raises(EmberError, match="probabilities are not available with model.attention=reformer"):
        model(ids, output_attentions=True)
    with pytest.raises(EmberError, match="Reformer's tokens find each other by hashing"):
        model(ids, global_attention_mask=torch.ones(1, 20))
    reversible = build_backbone(tiny(reversible=True, pre_layer_norm=True))
    with pytest.raises(EmberError, match="model.reversible=true does not keep attention probabilities"):
        reversible(ids, output_attentions=True)


def test_reformer_pretrains_and_finetunes_from_the_cli_on_real_text(wiki_prepared, tmp_path):
    """--set model.attention=reformer (+ reversible layers) through `ember pretrain` on real
    Wikipedia shards (the MLM loss falls), then `ember finetune --init` on real RTE pairs."""
    import json

    import numpy as np

    from conftest import TINY_MODEL, real_data
    from ember.cli import main

    run = tmp_path / "run"
    sets = [*TINY_MODEL, "model.attention=reformer", "model.attention_chunk=16", "model.attention_hashes=2",
            "model.reversible=true", "model.pre_layer_norm=true", "model.ffn_chunk=32", "train.log_every=1",
            "train.eval_every=30", "train.save_every=30", "train.warmup_ratio=0.1"]
    code = main(["pretrain", "--recipe", "bert-mini", "--data", str(wiki_prepared), "--out", str(run),
                 "--max-steps", "30", "--batch-size", "16", "--grad-accum", "1", "--lr", "3e-3", "--no-progress",
                 *[a for s in sets for a in ("--set", s)]])
    assert code == 0
    records = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    losses = [r["mlm_loss"] for r in records if r["split"] == "train"]
    assert np.mean(losses[-5:]) < np.mean(losses[:5]) - 0.5
    real_data("glue", "RTE")
    out = tmp_path / "rte"
    assert main(["finetune", "--task", "rte", "--init", str(run), "--out", str(out), "--train-limit", "64",
                 "--epochs", "1", "--max-length", "64", "--no-progress"]) == 0
    result = json.loads((out / "results.json").read_text())
    assert 0.0 <= result["metrics"]["accuracy"] <= 1.0
    assert "attention: reformer" in (out / "config.yaml").read_text()
