"""Longformer attention (ember.nn.banded, ember.nn.longformer) against a masked full-matrix
reference, and as the encoder's attention variant (model.attention=longformer)."""

from __future__ import annotations

import dataclasses

import pytest
import torch

from ember.config import ModelConfig
from ember.errors import EmberError
from ember.models import build_backbone
from ember.nn import banded
from ember.nn.banded import band_attention, window_bias


def reference(q, k, v, real, glob, radius, dilation):
    """Dense O(T^2) Longformer attention for the non-global queries: key j is read by query i
    when it is real and either global or within the dilated window of i."""
    t = q.shape[2]
    i, j = torch.arange(t)[:, None], torch.arange(t)[None, :]
    off = j - i
    band = (off.abs() <= radius * dilation) & (off % dilation == 0)
    allowed = (band[None] & (real & ~glob)[:, None, :]) | (real & glob)[:, None, :]  # (B, T, T)
    scores = (q @ k.transpose(-1, -2)).masked_fill(~allowed[:, None], torch.finfo(q.dtype).min)
    return scores.softmax(-1) @ v


def inputs(b=3, h=2, t=37, d=8, seed=0):
    g = torch.Generator().manual_seed(seed)
    q, k, v = (torch.randn(b, h, t, d, generator=g, dtype=torch.float64) for _ in range(3))
    real = torch.ones(b, t, dtype=torch.bool)
    real[1, 25:] = False  # a padded row
    glob = torch.zeros(b, t, dtype=torch.bool)
    glob[0, 0] = glob[2, [3, 20, 36]] = True
    glob[1, 30] = True  # a pad cannot be global
    return q, k, v, real, glob & real


def ours_banded(q, k, v, real, glob, radius, dilation):
    """band_attention on (B, h, T, d) inputs, with the global keys gathered as LongMask does."""
    g = int(glob.sum(1).max())
    index = torch.sort((~glob).to(torch.uint8), dim=1, stable=True).indices[:, :g]
    ok = torch.arange(g) < glob.sum(1, keepdim=True)
    q, k, v = (x.transpose(1, 2) for x in (q, k, v))  # (B, T, h, d)
    at = index[:, :, None, None].expand(k.shape[0], g, k.shape[2], k.shape[3])
    gk, gv = (k.gather(1, at), v.gather(1, at)) if g else (None, None)
    bias = window_bias(real & ~glob, ok, radius, dilation, q.dtype)
    return band_attention(q, k, v, bias, radius, dilation, gk, gv).transpose(1, 2)


@pytest.mark.parametrize("radius,dilation", [(1, 1), (3, 1), (4, 2), (2, 3), (16, 1)])
def test_band_attention_matches_masked_full_reference_with_padding_globals_and_dilation(radius, dilation):
    q, k, v, real, glob = inputs()
    q.requires_grad_(True)
    ours = ours_banded(q, k, v, real, glob, radius, dilation)
    ref = reference(q / 8 ** 0.5, k, v, real, glob, radius, dilation)
    keep = real & ~glob  # global rows are replaced by the global attention; pads are undefined
    torch.testing.assert_close(ours.transpose(1, 2)[keep], ref.transpose(1, 2)[keep], atol=1e-10, rtol=0)
    grad_ours, = torch.autograd.grad((ours.transpose(1, 2)[keep] ** 2).sum(), q)
    grad_ref, = torch.autograd.grad((ref.transpose(1, 2)[keep] ** 2).sum(), q)
    torch.testing.assert_close(grad_ours, grad_ref, atol=1e-10, rtol=0)


def test_band_attention_without_globals_and_all_padding_rows_stays_finite():
    q, k, v, real, _ = inputs(t=40)
    real[1, 5:] = False  # pads far from every real token: their rows read nothing
    out = ours_banded(q, k, v, real, torch.zeros_like(real), 2, 1)
    assert torch.isfinite(out).all()
    ref = reference(q / 8 ** 0.5, k, v, real, torch.zeros_like(real), 2, 1)
    torch.testing.assert_close(out.transpose(1, 2)[real], ref.transpose(1, 2)[real], atol=1e-10, rtol=0)


def tiny(**kw) -> ModelConfig:
    kw = {"max_position": 128, **kw}
    return ModelConfig(vocab_size=60, hidden_size=32, num_layers=2, num_heads=4, intermediate_size=37,
                       dropout=0.0, attention_dropout=0.0, **kw)


def test_longformer_encoder_with_window_covering_the_input_equals_full_attention():
    torch.manual_seed(0)
    full = build_backbone(tiny()).eval()
    long = build_backbone(tiny(attention="longformer", attention_window="64")).eval()
    missing, unexpected = long.load_state_dict(full.state_dict(), strict=False)
    assert not unexpected and all("_global" in k for k in missing)  # full attention's keys, unchanged
    ids = torch.randint(5, 60, (3, 29))
    mask = torch.ones(3, 29, dtype=torch.long)
    mask[1, 17:] = 0
    with torch.no_grad():
        a, b = full(ids, mask).last_hidden_state, long(ids, mask).last_hidden_state
    torch.testing.assert_close(a[mask.bool()], b[mask.bool()], atol=1e-5, rtol=0)
    with torch.no_grad():  # a narrow window does change the output (the test above can fail)
        narrow = build_backbone(tiny(attention="longformer", attention_window="4")).eval()
        narrow.load_state_dict(long.state_dict())
        assert (narrow(ids, mask).last_hidden_state - b).abs().max() > 1e-3


def test_longformer_encoder_trains_with_dropout_and_global_first_token():
    torch.manual_seed(0)
    cfg = dataclasses.replace(tiny(attention="longformer", attention_window="6,8", attention_global=1),
                              dropout=0.1, attention_dropout=0.1)
    model = build_backbone(cfg).train()
    ids = torch.randint(5, 60, (2, 50))
    out = model(ids, torch.ones(2, 50)).last_hidden_state
    out.pow(2).mean().backward()
    grads = {n: p.grad for n, p in model.named_parameters()}
    assert all(torch.isfinite(g).all() for g in grads.values() if g is not None)
    assert grads["layers.0.attention.query_global.weight"].abs().sum() > 0  # the [CLS] row's own query


def test_full_attention_config_and_state_dict_keys_are_unchanged():
    cfg = ModelConfig()
    assert cfg.attention == "full"
    keys = set(build_backbone(tiny()).state_dict())
    assert not any("_global" in k for k in keys)
    assert "layers.0.attention.qkv.weight" in keys


@pytest.mark.parametrize("settings,message", [
    ({"attention": "sparse"}, "choose one of full, longformer"),
    ({"attention": "longformer", "attention_window": "5"}, "positive even number"),
    ({"attention": "longformer", "attention_window": "4,4,4"}, "3 values for 2 layers"),
    ({"attention": "longformer", "attention_window": "4x"}, "whole numbers"),
    ({"attention": "longformer", "attention_dilation": "0"}, "must be >= 1"),
    ({"attention": "longformer", "family": "t5"}, "not family 't5'"),
    ({"attention": "longformer", "family": "xlnet"}, "not family 'xlnet'"),
    ({"attention": "longformer", "family": "gpt2"}, "not family 'gpt2'"),
    ({"attention": "longformer", "family": "xlm", "causal": True}, "not a causal encoder"),
    ({"attention": "longformer", "attention_window": "4,8", "share_layers": "all"}, "one window and dilation"),
])
def test_longformer_config_refuses_bad_settings_with_one_line(settings, message):
    with pytest.raises(EmberError, match=message):
        tiny(**settings)


def test_longformer_encoder_refuses_bad_inputs_with_one_line():
    model = build_backbone(tiny(attention="longformer", attention_window="4", attention_global=3,
                                max_position=16)).eval()
    ids = torch.randint(5, 60, (2, 10))
    with pytest.raises(EmberError, match="global positions lie beyond the input of 2 tokens"):
        model(ids[:, :2])
    with pytest.raises(EmberError, match="global_attention_mask has shape"):
        model(ids, global_attention_mask=torch.ones(2, 9))
    with pytest.raises(EmberError, match="longer than the model's 16 positions"):
        model(torch.randint(5, 60, (1, 17)))
    with pytest.raises(EmberError, match="attention probabilities are not available"):
        model(ids, output_attentions=True)
    with pytest.raises(EmberError, match="visibility mask"):
        model(ids, torch.ones(2, 10, 10))
    with pytest.raises(EmberError, match="global_attention_mask is read by model.attention=longformer"):
        build_backbone(tiny())(ids, global_attention_mask=torch.ones(2, 10))


@pytest.mark.parametrize("settings", [
    {"attention": "longformer", "attention_window": "4", "attention_global": 1, "attention_dilation": "2"},
    {"attention": "bigbird", "attention_block": 2, "attention_random_blocks": 1},
    {"attention": "performer", "attention_features": 16},
])
def test_long_attention_variants_run_in_bfloat16_and_under_autocast(settings):
    """dtype stays a parameter: masks and features follow the tensors' dtype (CUDA runs the same code)."""
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
    assert half.dtype == torch.bfloat16
    for out in (autocast, half):
        assert torch.isfinite(out.float()).all()
        assert (out.float() - reference)[mask.bool()].abs().max() < 0.25  # bf16 rounding, not another function


def _band_training_run(rebuild: bool, radius: int, dilation: int, with_globals: bool):
    torch.manual_seed(0)
    b, t, h, d = 2, 300, 4, 16
    q, k, v = (torch.randn(b, t, h, d, requires_grad=True) for _ in range(3))
    gk, gv = (torch.randn(b, 2, h, d, requires_grad=True) for _ in range(2)) if with_globals else (None, None)
    key_ok = torch.ones(b, t, dtype=torch.bool)
    key_ok[1, 250:] = False
    bias = window_bias(key_ok, torch.ones(b, 2, dtype=torch.bool) if with_globals else None, radius, dilation,
                       torch.float32)
    torch.manual_seed(5)  # the same dropout draws on both paths
    out = band_attention(q * 1.0, k, v, bias, radius, dilation, gk, gv, 0.1, rebuild_windows=rebuild)
    out.backward(torch.randn(out.shape, generator=torch.Generator().manual_seed(1)))
    return out.detach(), [t.grad for t in (q, k, v, gk, gv) if t is not None]


@pytest.mark.parametrize("rows", [10**9, 20, 3, 1])
@pytest.mark.parametrize("radius, dilation, with_globals", [(32, 1, True), (32, 2, False), (31, 1, True), (2, 2, True)])
def test_band_attention_training_rebuilds_windows_with_attends_outputs_and_gradients(radius, dilation, with_globals,
                                                                                     rows, monkeypatch):
    """Training with dropout, the band keeps the keys and values instead of their windows and
    unfolds them again in the backward (blocks of radius / 2 queries: windows of 5 blocks; odd
    radius: 3): the outputs are attend's over the windows bit for bit (the same ops and draws), the
    gradients equal to float rounding (the windows' gradients are added back by hand), whether the
    backward takes all query blocks at once, whole sequences (20 rows: 1 or 2 of these), some blocks
    of one sequence, or one block at a time (its chunks of ~16 MB on long inputs)."""
    monkeypatch.setattr(banded, "_chunk_rows", lambda probs: rows)
    out, grads = _band_training_run(True, radius, dilation, with_globals)
    reference, reference_grads = _band_training_run(False, radius, dilation, with_globals)
    # exact: both forwards call attention_scores and the softmax-dropout product on the same window
    # tensors of the same shapes (the same kernels and draws); only the backward differs
    assert torch.equal(out, reference)
    for got, want in zip(grads, reference_grads):
        # atol 1e-5: a global key's gradient sums every query's, chunk by chunk here (rounding ~1e-6)
        torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)


_RETAINED_CHILD = """
import torch
from ember.nn.banded import band_attention, window_bias
torch.manual_seed(0)
q, k, v = (torch.randn(1, 4096, 12, 64, requires_grad=True) for _ in range(3))
bias = window_bias(torch.ones(1, 4096, dtype=torch.bool), None, 256, 1, torch.float32)
def resident_mb():
    return int(open("/proc/self/status").read().split("VmRSS:")[1].split()[0]) / 1024
before = resident_mb()
out = band_attention(q * 1.0, k, v, bias, 256, 1, None, None, 0.1, rebuild_windows={rebuild})
print(resident_mb() - before)
"""


@pytest.mark.skipif(not __import__("os").path.exists("/proc/self/status"), reason="needs Linux /proc")
def test_band_attention_training_keeps_the_keys_not_their_windows():
    """What a training band attention keeps from its forward for the backward (4,096 tokens, 12 heads
    of 64, window 512): the score product copies the key windows, which hold each key 5 times
    (63 MB), and keeps the copy (the value windows are a view of the padded values here); rebuilt in
    the backward, they are not kept, and the probabilities and mask (126 + 63 MB) remain."""
    import os
    import subprocess
    import sys

    env = {**os.environ, "MALLOC_MMAP_THRESHOLD_": "131072"}  # freed buffers go back to the system at once
    kept = {rebuild: float(subprocess.run([sys.executable, "-c", _RETAINED_CHILD.replace("{rebuild}", str(rebuild))],
                                          capture_output=True, text=True, check=True, env=env).stdout)
            for rebuild in (True, False)}
    assert kept[True] <= kept[False] - 50, kept  # the key windows' copy (63 MB) is not kept (measured: 243 vs 316)
    assert kept[True] >= 126 + 63 - 10, kept  # the probabilities and the keep mask are


_PEAK_CHILD = """
import torch
from ember.nn import banded
from ember.nn.banded import band_attention, window_bias
if {whole}:
    banded._chunk_rows = lambda probs: 10**9
torch.manual_seed(0)
q, k, v = (torch.randn(1, 4096, 12, 64, requires_grad=True) for _ in range(3))
bias = window_bias(torch.ones(1, 4096, dtype=torch.bool), None, 256, 1, torch.float32)
def high_water_mb():
    return int(open("/proc/self/status").read().split("VmHWM:")[1].split()[0]) / 1024
open("/proc/self/clear_refs", "w").write("5")
before = high_water_mb()
band_attention(q * 1.0, k, v, bias, 256, 1, None, None, 0.1).sum().backward()
print(high_water_mb() - before)
"""


@pytest.mark.skipif(not __import__("os").path.exists("/proc/self/clear_refs"), reason="needs Linux /proc")
def test_band_attention_training_walks_the_blocks_in_chunks_and_peaks_lower():
    """Training forward + backward of a band attention over 4,096 tokens (12 heads of 64, window
    512): taken a few query blocks at a time, the key and value windows (63 MB each), their
    gradients and the dropped probabilities or their gradient (126 MB) never exist whole, so the
    peak is lower than with every block at once (measured: ~360 against ~590 MB)."""
    import os
    import subprocess
    import sys

    env = {**os.environ, "MALLOC_MMAP_THRESHOLD_": "131072"}  # freed buffers go back to the system at once
    peak = {whole: float(subprocess.run([sys.executable, "-c", _PEAK_CHILD.replace("{whole}", str(whole))],
                                        capture_output=True, text=True, check=True, env=env).stdout)
            for whole in (True, False)}
    assert peak[False] <= peak[True] - 150, peak
    assert peak[False] >= 126 + 63, peak  # the probabilities and the keep mask are still held whole


def test_band_attention_training_refuses_a_second_backward_with_one_line():
    """The training band lets its probabilities go in the backward, so a second backward through the
    same graph (retain_graph=True) is refused with a message, not answered with wrong gradients."""
    torch.manual_seed(0)
    q, k, v = (torch.randn(1, 64, 2, 8, requires_grad=True) for _ in range(3))
    bias = window_bias(torch.ones(1, 64, dtype=torch.bool), None, 8, 1, torch.float32)
    out = band_attention(q, k, v, bias, 8, 1, None, None, 0.1).sum()
    out.backward(retain_graph=True)
    with pytest.raises(RuntimeError, match="one backward per forward"):
        out.backward()
