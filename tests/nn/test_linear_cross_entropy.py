"""ember.nn.linear_cross_entropy: the decoder product and cross-entropy in one step give the loss,
accuracy and gradients of F.linear + F.cross_entropy + argmax, with and without oneDNN, at any
upstream gradient, for large logits, without gradients and under autocast; BERT's MLM loss
through it equals the unfused loss on real text with the real MiniLM encoder."""

from __future__ import annotations

import gzip

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from conftest import real_data
from ember.nn import onednn
from ember.nn.linear_cross_entropy import ROWS_PER_CHUNK, linear_cross_entropy


@pytest.fixture(params=[True, False], ids=["onednn", "default-blas"])
def kernel(request):
    saved = dict(onednn._STATE)
    onednn.set_enabled(request.param)
    yield request.param
    onednn._STATE.update(saved)


def _inputs(n: int, k: int = 24, v: int = 500, scale: float = 1.0, bias: bool = True):
    torch.manual_seed(0)
    x = (scale * torch.randn(n, k)).requires_grad_()
    w = torch.randn(v, k).requires_grad_()
    b = torch.randn(v).requires_grad_() if bias else None
    targets = torch.randint(0, v, (n,))
    return x, w, b, targets


def _reference(x, w, b, targets):
    logits = F.linear(x, w, b)
    return F.cross_entropy(logits, targets), (logits.argmax(-1) == targets).sum()


def _grads(params):
    return [None if p is None else p.grad.clone() for p in params]


@pytest.mark.parametrize("n", [9, 2 * ROWS_PER_CHUNK + 7])  # one chunk, and several with a ragged end
@pytest.mark.parametrize("bias", [True, False])
def test_linear_cross_entropy_matches_f_cross_entropy_loss_accuracy_and_gradients(kernel, n, bias):
    x, w, b, targets = _inputs(n, bias=bias)
    targets[:3] = F.linear(x[:3], w, b).argmax(-1)  # some rows right, so accuracy is not trivially 0
    params = [p for p in (x, w, b) if p is not None]
    loss, correct = linear_cross_entropy(x, w, b, targets)
    (2.5 * loss).backward()  # an upstream gradient other than 1 (e.g. a weighted sum of losses)
    fused = _grads(params)
    for p in params:
        p.grad = None
    ref_loss, ref_correct = _reference(x, w, b, targets)
    (2.5 * ref_loss).backward()
    torch.testing.assert_close(loss, ref_loss, rtol=1e-6, atol=1e-6)
    assert int(correct) == int(ref_correct) >= 3
    for got, want in zip(fused, _grads(params)):
        torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-6)


def test_linear_cross_entropy_is_stable_for_large_logits(kernel):
    x, w, b, targets = _inputs(20, scale=100.0)  # logits in the thousands: exp would overflow
    loss, _ = linear_cross_entropy(x, w, b, targets)
    loss.backward()
    ref_loss, _ = _reference(x.detach(), w.detach(), b.detach(), targets)
    assert torch.isfinite(loss) and torch.isfinite(x.grad).all() and torch.isfinite(w.grad).all()
    torch.testing.assert_close(loss, ref_loss, rtol=1e-6, atol=1e-3)


def test_linear_cross_entropy_without_gradients_gives_the_same_loss_and_accuracy(kernel):
    x, w, b, targets = _inputs(70)
    with torch.no_grad():
        loss, correct = linear_cross_entropy(x, w, b, targets)
        ref_loss, ref_correct = _reference(x, w, b, targets)
    torch.testing.assert_close(loss, ref_loss, rtol=1e-6, atol=1e-6)
    assert int(correct) == int(ref_correct)
    assert not loss.requires_grad


def test_linear_cross_entropy_backward_twice_with_retained_graph_gives_the_same_gradients():
    x, w, b, targets = _inputs(30)
    loss, _ = linear_cross_entropy(x, w, b, targets)
    loss.backward(retain_graph=True)
    first = x.grad.clone()
    x.grad = None
    loss.backward()  # the saved gradient buffer must not have been scaled in place
    torch.testing.assert_close(x.grad, first)


def test_linear_cross_entropy_under_cpu_bf16_autocast_matches_the_ordinary_autocast_path():
    """Under CPU bf16 autocast the fused step multiplies in bf16 as autocast's F.linear would and
    normalises in fp32: loss, accuracy and the fp32 leaves' gradients equal the ordinary path's
    (F.linear under autocast, .float(), F.cross_entropy) to bf16 rounding."""
    x, w, b, targets = _inputs(2 * ROWS_PER_CHUNK + 7)
    targets[:3] = F.linear(x[:3], w, b).argmax(-1)
    params = (x, w, b)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        loss, correct = linear_cross_entropy(x, w, b, targets)
    assert type(loss.grad_fn).__name__ == "_LinearCrossEntropyBackward"  # the fused step ran
    loss.backward()
    fused = _grads(params)
    for p in params:
        p.grad = None
    with torch.autocast("cpu", dtype=torch.bfloat16):
        ref_logits = F.linear(x, w, b)  # bf16 under autocast
        ref_loss = F.cross_entropy(ref_logits.float(), targets)
    ref_loss.backward()
    assert ref_logits.dtype == torch.bfloat16
    torch.testing.assert_close(loss, ref_loss)
    assert int(correct) == int((ref_logits.argmax(-1) == targets).sum()) >= 3
    for got, want, p in zip(fused, _grads(params), params):
        assert got.dtype == p.dtype == torch.float32
        torch.testing.assert_close(got, want, rtol=2e-2, atol=2e-4)


def test_linear_cross_entropy_normalises_bf16_logits_in_fp32_as_the_ordinary_path():
    x, w, b, targets = _inputs(16)
    x, w, b = (t.detach().bfloat16() for t in (x, w, b))
    loss, _ = linear_cross_entropy(x, w, b, targets)
    assert loss.dtype == torch.float32
    torch.testing.assert_close(loss, F.cross_entropy(F.linear(x, w, b).float(), targets))


@pytest.mark.parametrize("autocast", [False, True], ids=["fp32", "bf16-autocast"])
def test_linear_cross_entropy_per_row_losses_hits_and_weighted_gradients(kernel, autocast):
    """reduction="none": each row's loss and hit as F.cross_entropy(reduction="none") and argmax
    give them, and gradients under a different upstream weight per row (a caller's weighted sum)."""
    x, w, b, targets = _inputs(2 * ROWS_PER_CHUNK + 7)
    targets[:3] = F.linear(x[:3], w, b).argmax(-1)
    weights = torch.linspace(0.2, 3.0, x.shape[0])
    params = (x, w, b)
    with torch.autocast("cpu", dtype=torch.bfloat16, enabled=autocast):
        losses, hits = linear_cross_entropy(x, w, b, targets, reduction="none")
    assert type(losses.grad_fn).__name__ == "_LinearCrossEntropyBackward"  # the fused step ran
    assert losses.shape == hits.shape == targets.shape and hits.dtype == torch.bool
    (losses * weights).sum().backward()
    fused = _grads(params)
    for p in params:
        p.grad = None
    with torch.autocast("cpu", dtype=torch.bfloat16, enabled=autocast):
        logits = F.linear(x, w, b)
    ref_losses = F.cross_entropy(logits.float(), targets, reduction="none")
    (ref_losses * weights).sum().backward()
    torch.testing.assert_close(losses, ref_losses, **(dict(rtol=1e-6, atol=1e-6) if not autocast else {}))
    assert torch.equal(hits, logits.argmax(-1) == targets) and int(hits[:3].sum()) == 3
    for got, want in zip(fused, _grads(params)):
        # bf16 rounds the logits' gradient before the per-row weight scales it (the ordinary
        # path after): products of such rows agree to bf16's precision of the largest entries
        atol = 2e-2 * float(want.abs().max()) if autocast else 1e-5
        torch.testing.assert_close(got, want, rtol=2e-2 if autocast else 1e-5, atol=atol)


def test_linear_cross_entropy_rejects_mismatched_targets():
    x, w, b, targets = _inputs(8)
    with pytest.raises(ValueError, match=r"targets \(N,\)"):
        linear_cross_entropy(x, w, b, targets[:5])
    with pytest.raises(ValueError, match="'mean' or 'none'"):
        linear_cross_entropy(x, w, b, targets, reduction="sum")


def _wiki_sentences(n: int) -> list[str]:
    with gzip.open(real_data("wiki-en", "AA", "wiki_00.gz"), "rt", encoding="utf-8") as f:
        lines = [line.strip() for line in f if not line.startswith("<") and len(line.split()) >= 12]
    return lines[:n]


def test_bert_mlm_loss_on_real_text_matches_the_unfused_loss_with_the_minilm_encoder(kernel):
    """The real 6 x 384 encoder (its trained weights, 30,522-word vocabulary) on real Wikipedia
    sentences, 15% masked: BertPretraining's fused MLM loss, accuracy and every gradient equal the
    full-vocabulary logits' cross-entropy at the masked positions."""
    from ember.config import DataConfig
    from ember.models import build_backbone
    from ember.objectives.bert import BertPretraining
    from ember.objectives.mlm import mask_tokens
    from ember.runs.init import load_init
    from ember.tokenizers import load_tokenizer, special_token_ids

    init = load_init(real_data("checkpoints", "all-MiniLM-L6-v2"))
    tok = load_tokenizer(init.tokenizer)
    special = special_token_ids(tok)
    backbone = build_backbone(init.model)
    backbone.load_state_dict(init.state, strict=False)
    torch.manual_seed(0)
    module = BertPretraining(backbone, special, DataConfig(nsp=False), "none").eval()  # no dropout
    encoded = [e.ids[:48] for e in tok.encode_batch(_wiki_sentences(12))]
    ids = np.full((len(encoded), max(map(len, encoded))), special["pad"], dtype=np.int64)
    for row, e in enumerate(encoded):
        ids[row, :len(e)] = e
    maskable = (ids != special["pad"]) & (ids != special["cls"]) & (ids != special["sep"])
    corrupted, labels = mask_tokens(ids, maskable, np.random.default_rng(0), special["mask"], tok.get_vocab_size())
    batch = {"input_ids": torch.from_numpy(corrupted), "attention_mask": torch.from_numpy((ids != special["pad"]) * 1),
             "token_type_ids": torch.zeros_like(torch.from_numpy(ids)), "labels": torch.from_numpy(labels)}
    params = list(module.parameters())
    loss, metrics = module(batch)
    grads = torch.autograd.grad(loss, params, allow_unused=True)  # the pooler is unused
    logits, _ = module.logits(batch)  # (B, T, V), the unfused head
    where = batch["labels"] != -100
    ref = F.cross_entropy(logits[where], batch["labels"][where])
    ref_grads = torch.autograd.grad(ref, params, allow_unused=True)
    assert int(where.sum()) > ROWS_PER_CHUNK  # several chunks of real rows
    torch.testing.assert_close(loss, ref, rtol=1e-5, atol=1e-5)
    assert metrics["mlm_acc"] == (int((logits[where].argmax(-1) == batch["labels"][where]).sum()), int(where.sum()))
    assert [g is None for g in grads] == [g is None for g in ref_grads]
    for got, want in zip(grads, ref_grads):
        if want is not None:
            torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-6)


def test_linear_cross_entropy_accuracy_follows_argmax_on_tied_maxima(kernel):
    """Only rows whose target reaches the row maximum are checked with argmax; with two words
    tied at the maximum, argmax (and so the accuracy) takes the first of them."""
    torch.manual_seed(0)
    w = torch.randn(50, 8)
    w[7] = w[5]  # words 5 and 7 always score alike
    x = 10 * w[5].repeat(3, 1)  # rows whose largest logit is the (5, 7) tie
    targets = torch.tensor([5, 7, 3])  # first of the tie (hit), second (miss), a low word (miss)
    loss, correct = linear_cross_entropy(x, w, None, targets)
    _, ref_correct = _reference(x, w, None, targets)
    assert int(correct) == int(ref_correct) == 1


def test_linear_cross_entropy_fuses_fp32_and_cpu_bf16_and_leaves_the_rest_to_the_ordinary_path():
    from ember.nn.linear_cross_entropy import fused_dtype

    f32, bf16, f16 = torch.ones(2, 2), torch.ones(2, 2, dtype=torch.bfloat16), torch.ones(2, 2, dtype=torch.float16)
    assert fused_dtype(f32, f32) == torch.float32 and fused_dtype(bf16, bf16) == torch.bfloat16
    assert fused_dtype(f16, f16) is None and fused_dtype(f32, bf16) is None  # fp16, mixed: ordinary
    with torch.autocast("cpu", dtype=torch.bfloat16):
        assert fused_dtype(f32, f32) == torch.bfloat16  # what autocast would give F.linear
    with torch.autocast("cpu", dtype=torch.float16):
        assert fused_dtype(f32, f32) is None
