"""ember.nn.onednn: Linear layers through oneDNN's GEMM agree with F.linear forward and backward,
and every caller that must see an ordinary linear (int8, ONNX export, tracing, torch.compile,
autocast, tiny inputs) gets one."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from ember.nn import onednn
from ember.nn.feedforward import FeedForward

pytestmark = pytest.mark.skipif(onednn._op() is None, reason="this torch build has no oneDNN linear op")


@pytest.fixture
def forced_on():
    saved = dict(onednn._STATE)
    onednn.set_enabled(True)
    yield
    onednn._STATE.update(saved)


@pytest.fixture
def gemm_calls(monkeypatch, forced_on):
    """Counts the oneDNN kernel calls (forward and backward)."""
    calls = []
    real = onednn.gemm

    def counted(x, w, b):
        calls.append(tuple(x.shape))
        return real(x, w, b)

    monkeypatch.setattr(onednn, "gemm", counted)
    return calls


def _grads(fn, x, w, b, g):
    for t in (x, w, b):
        if t is not None:
            t.grad = None
    y = fn(x, w, b)
    y.backward(g)
    return y.detach(), [None if t is None else t.grad.clone() for t in (x, w, b)]


@pytest.mark.parametrize("shape", [(37, 24), (3, 11, 24)])  # 2-D and 3-D inputs
@pytest.mark.parametrize("with_bias", [True, False])
@pytest.mark.parametrize("out", [40, 16])  # wider and narrower than the input: both grad-W layouts
def test_onednn_linear_forward_and_backward_match_f_linear(gemm_calls, shape, with_bias, out):
    torch.manual_seed(0)
    x = torch.randn(*shape, requires_grad=True)
    w = torch.randn(out, 24, requires_grad=True)
    b = torch.randn(out, requires_grad=True) if with_bias else None
    g = torch.randn(*shape[:-1], out)
    y1, grads1 = _grads(onednn.linear, x, w, b, g)
    assert len(gemm_calls) == 3  # forward, grad x, grad W: all through oneDNN
    y0, grads0 = _grads(F.linear, x, w, b, g)
    torch.testing.assert_close(y1, y0, rtol=1e-5, atol=1e-5)
    for got, want in zip(grads1, grads0):
        if want is not None:
            torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)
    assert grads1[1].is_contiguous()  # what AccumulateGrad keeps as .grad


def test_onednn_linear_backward_takes_non_contiguous_inputs_and_expanded_gradients(gemm_calls):
    torch.manual_seed(1)
    base = torch.randn(24, 16, requires_grad=True)
    x = base.t()  # (16, 24), a transposed view, as Pooler's hidden[:, 0] or a permuted context
    w = torch.randn(8, 24, requires_grad=True)
    onednn.linear(x, w, None).sum().backward()  # .sum() sends back a zero-stride gradient
    got = base.grad.clone(), w.grad.clone()
    base.grad = w.grad = None
    F.linear(x, w, None).sum().backward()
    torch.testing.assert_close(got[0], base.grad, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(got[1], w.grad, rtol=1e-5, atol=1e-5)


def test_onednn_linear_only_needed_gradients_are_computed(gemm_calls):
    """A frozen weight costs no grad-W product; an input without grad costs no grad-x product."""
    x = torch.randn(16, 24, requires_grad=True)
    w = torch.randn(8, 24)  # frozen
    onednn.linear(x, w, None).sum().backward()
    assert len(gemm_calls) == 2 and x.grad is not None
    gemm_calls.clear()
    w.requires_grad_(True)
    onednn.linear(torch.randn(16, 24), w, None).sum().backward()
    assert len(gemm_calls) == 2 and w.grad is not None


def test_onednn_linear_without_grad_has_no_graph_and_matches(gemm_calls):
    layer = nn.Linear(24, 40)
    x = torch.randn(2, 9, 24)
    with torch.no_grad():
        y = onednn.dense(layer, x)
        want = layer(x)
    assert y.grad_fn is None and len(gemm_calls) == 1
    torch.testing.assert_close(y, want, rtol=1e-5, atol=1e-5)


def test_onednn_linear_double_backward_is_an_error_not_silent_zeros(forced_on):
    x = torch.randn(16, 24, requires_grad=True)
    w = torch.randn(8, 24, requires_grad=True)
    (gx,) = torch.autograd.grad(onednn.linear(x, w, None).pow(2).sum(), x, create_graph=True)
    with pytest.raises(RuntimeError):
        gx.sum().backward()


def test_onednn_linear_few_rows_bf16_and_autocast_take_f_linear(gemm_calls):
    layer = nn.Linear(24, 40)
    onednn.dense(layer, torch.randn(onednn.MIN_ROWS - 1, 24))  # batch-1-like: MKL's GEMV wins
    onednn.linear(torch.randn(16, 24, dtype=torch.bfloat16), layer.weight.bfloat16(), None)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        y = onednn.dense(layer, torch.randn(16, 24))
    assert y.dtype == torch.bfloat16  # autocast saw the linear and cast it
    assert gemm_calls == []
    onednn.dense(layer, torch.randn(onednn.MIN_ROWS, 24))
    assert len(gemm_calls) == 1


def test_onednn_int8_quantized_feedforward_runs_the_quantized_kernels(gemm_calls):
    from ember.serve.quantize import quantize_int8

    torch.manual_seed(0)
    ff = FeedForward(32, 64, "gelu").eval()
    x = torch.randn(2, 10, 32)
    q = quantize_int8(ff)
    assert type(q.up) is not nn.Linear  # the quantized Linear replaced it
    gemm_calls.clear()
    with torch.no_grad():
        got = q(x)
    assert gemm_calls == []  # dense() left the int8 layers to themselves
    torch.testing.assert_close(got, ff(x).detach(), rtol=0.1, atol=0.05)  # int8 rounding


def test_onednn_tracing_and_onnx_export_record_an_ordinary_linear(gemm_calls, tmp_path):
    ff = FeedForward(32, 64, "gelu").eval()
    x = torch.randn(2, 10, 32)
    traced = torch.jit.trace(ff, x, check_trace=False)  # (check_trace re-runs it eagerly)
    graph = str(traced.graph)
    assert "aten::linear" in graph and "mkldnn" not in graph and gemm_calls == []
    torch.testing.assert_close(traced(x), ff(x), rtol=1e-5, atol=1e-5)
    onnx = pytest.importorskip("onnx")
    path = tmp_path / "ff.onnx"
    torch.onnx.export(ff, (x,), str(path), dynamo=False)
    nodes = onnx.load(str(path)).graph.node  # (the exporter also runs the module eagerly once)
    assert {n.op_type for n in nodes} & {"MatMul", "Gemm"} and all(n.domain in ("", "ai.onnx") for n in nodes)


def test_onednn_recording_check_reads_the_onnx_exporters_flags(forced_on, monkeypatch):
    """``is_recording`` reads the flags torch.onnx.is_in_onnx_export reads (imported once): either
    exporter's flag set means recording, and then a linear is the ordinary op."""
    from torch.onnx._internal.exporter import _flags
    from torch.onnx._internal.torchscript_exporter._globals import GLOBALS

    assert not onednn.is_recording()
    monkeypatch.setattr(_flags, "_is_onnx_exporting", True)
    assert onednn.is_recording() and torch.onnx.is_in_onnx_export()
    monkeypatch.setattr(_flags, "_is_onnx_exporting", False)
    monkeypatch.setattr(GLOBALS, "in_onnx_export", True)
    assert onednn.is_recording() and onednn.needs_ordinary_ops("cpu")


def test_onednn_torch_compile_graph_holds_no_onednn_call(forced_on):
    ff = FeedForward(32, 64, "gelu")
    graphs = []

    def record(gm, example_inputs):  # a backend that keeps the captured FX graph and runs it eagerly
        graphs.append(gm)
        return gm.forward

    torch._dynamo.reset()
    compiled = torch.compile(ff, backend=record)
    compiled(torch.randn(2, 10, 32))
    targets = " ".join(str(node.target) for gm in graphs for node in gm.graph.nodes)
    assert graphs and "linear" in targets and "_linear_pointwise" not in targets


def test_onednn_switch_follows_ember_onednn_then_the_cpu_vendor_never_a_timing(monkeypatch):
    """Training products take oneDNN on AMD only; products without gradient take the packed
    weights and row copies on AMD and Intel (MKL reads a transposed weight slowly at a few rows)."""
    saved = dict(onednn._STATE)
    try:
        for value, want in (("0", False), ("1", True)):
            monkeypatch.setenv("EMBER_ONEDNN", value)
            onednn.set_enabled(None)  # decide again
            assert onednn.enabled() is want and onednn.serves_rows() is want
        monkeypatch.delenv("EMBER_ONEDNN")
        for vendor, training, rows in (("AuthenticAMD", True, True), ("GenuineIntel", False, True),
                                       ("", False, False)):
            monkeypatch.setattr(onednn, "_cpu_vendor", lambda v=vendor: v)
            onednn.set_enabled(None)
            assert (onednn.enabled(), onednn.serves_rows()) == (training, rows), vendor
        onednn.set_enabled(False)
        assert onednn.enabled() is False and onednn.serves_rows() is False
    finally:
        onednn._STATE.update(saved)


def test_onednn_on_intel_inference_reads_packed_weights_and_training_stays_on_f_linear(monkeypatch):
    """The Intel rule end to end: rows without gradient go to the packed weight (and match
    F.linear), a product with gradient calls neither oneDNN kernel."""
    saved = dict(onednn._STATE)
    monkeypatch.delenv("EMBER_ONEDNN", raising=False)
    monkeypatch.setattr(onednn, "_cpu_vendor", lambda: "GenuineIntel")
    calls = []
    monkeypatch.setattr(onednn, "gemm", lambda x, w, b, real=onednn.gemm: calls.append(w.is_mkldnn) or real(x, w, b))
    try:
        onednn.set_enabled(None)
        layer = nn.Linear(512, 2048)  # 8 rows of a weight of 2^20 entries
        x = torch.randn(8, 512)
        with torch.no_grad():
            torch.testing.assert_close(onednn.dense(layer, x), F.linear(x, layer.weight, layer.bias),
                                       rtol=1e-5, atol=1e-5)
            assert calls == [True]  # the packed weight
            onednn.dense(layer, x[:7])  # under MKL_SMALL_ROWS
            onednn.dense(nn.Linear(512, 2047), x)  # under MKL_SMALL_WEIGHT
        assert calls == [True]
        onednn.dense(layer, x.requires_grad_()).sum().backward()
        assert calls == [True] and layer.weight.grad is not None  # training: plain F.linear
    finally:
        onednn._STATE.update(saved)


def test_onednn_rows_without_gradient_read_the_packed_weight_and_match_f_linear(forced_on, monkeypatch):
    """A decoding step with a batch or beams, a request, an evaluation (2 rows or more, no
    gradient) runs oneDNN on the weight packed once into its kernel's layout, equal to F.linear
    within float rounding; one row goes to ``row_product``; with a gradient the weight itself is
    passed and its packed copy dropped (it trains: the copy would be stale)."""
    weights = []
    real = onednn.gemm
    monkeypatch.setattr(onednn, "gemm", lambda x, w, b: weights.append(w.is_mkldnn) or real(x, w, b))
    torch.manual_seed(0)
    layer = nn.Linear(24, 40)
    with torch.no_grad():
        for shape in ((2, 24), (4, 4, 24), (300, 1, 24)):
            x = torch.randn(*shape)
            torch.testing.assert_close(onednn.dense(layer, x), F.linear(x, layer.weight, layer.bias),
                                       rtol=1e-5, atol=1e-6)
        assert weights == [True, True, True] and onednn._PACKS[id(layer.weight)][1] is not None
        onednn.dense(layer, torch.randn(1, 24))
        assert len(weights) == 3
    y = onednn.dense(layer, torch.randn(4, 24))  # the layer's weight wants a gradient
    assert weights[-1] is False and len(weights) == 4
    assert onednn._PACKS[id(layer.weight)][1] is None  # dropped while it trains
    y.sum().backward()
    with torch.no_grad():  # and made again for the next evaluation
        x = torch.randn(8, 24)
        torch.testing.assert_close(onednn.dense(layer, x), F.linear(x, layer.weight, layer.bias),
                                   rtol=1e-5, atol=1e-6)
    assert weights[-1] is True and onednn._PACKS[id(layer.weight)][1] is not None


def test_onednn_packed_weight_follows_the_weight_and_goes_with_it(forced_on):
    """The packed form is rebuilt after an in-place change (an optimizer step) or new weights, so a
    model evaluated between training steps decodes with its current weights; it is dropped with
    the weight."""
    torch.manual_seed(0)
    layer = nn.Linear(24, 40)
    x = torch.randn(8, 24)
    with torch.no_grad():
        onednn.dense(layer, x)
        layer.weight.mul_(-2.0)
        torch.testing.assert_close(onednn.dense(layer, x), F.linear(x, layer.weight, layer.bias),
                                   rtol=1e-5, atol=1e-6)
        layer.load_state_dict({"weight": torch.randn(40, 24), "bias": torch.randn(40)})
        torch.testing.assert_close(onednn.dense(layer, x), F.linear(x, layer.weight, layer.bias),
                                   rtol=1e-5, atol=1e-6)
    key = id(layer.weight)
    del layer
    import gc

    gc.collect()
    assert key not in onednn._PACKS


def test_onednn_one_row_without_gradient_uses_a_cached_column_copy_that_follows_the_weight(forced_on):
    """A decoding step's one row goes through the (K, N) copy of the weight: equal to F.linear
    within float rounding, rebuilt after an in-place change or new weights, and only without
    gradient (training keeps the ordinary kernels)."""
    torch.manual_seed(0)
    layer = nn.Linear(24, 40)
    x = torch.randn(1, 1, 24)
    with torch.no_grad():
        y = onednn.dense(layer, x)
        assert id(layer.weight) in onednn._COPIES  # the copy was made
        torch.testing.assert_close(y, F.linear(x, layer.weight, layer.bias), rtol=1e-5, atol=1e-6)
        layer.weight.mul_(-2.0)  # an optimizer step would change it in place
        torch.testing.assert_close(onednn.dense(layer, x), F.linear(x, layer.weight, layer.bias),
                                   rtol=1e-5, atol=1e-6)
        layer.load_state_dict({"weight": torch.randn(40, 24), "bias": torch.randn(40)})
        torch.testing.assert_close(onednn.dense(layer, x), F.linear(x, layer.weight, layer.bias),
                                   rtol=1e-5, atol=1e-6)
        assert onednn.linear(torch.randn(24), layer.weight, None).shape == (40,)  # a bare vector
    assert not onednn.one_row(x, layer.weight, layer.bias)  # with gradient: the ordinary path
    key = id(layer.weight)
    del layer
    import gc

    gc.collect()
    assert key not in onednn._COPIES  # the copy went with its weight


def test_onednn_column_copy_of_a_large_weight_sits_on_huge_pages_and_equals_its_transpose(forced_on):
    """A weight of several MiB (read from memory at every decoded token) is copied into 2 MiB
    aligned memory advised for huge pages (ember.host_memory); the copy is the transpose exactly."""
    from ember.host_memory import HUGE_PAGE_BYTES

    torch.manual_seed(0)
    layer = nn.Linear(768, 3072)
    with torch.no_grad():
        onednn.dense(layer, torch.randn(1, 768))
    copy = onednn._COPIES[id(layer.weight)][1]
    assert copy.data_ptr() % HUGE_PAGE_BYTES == 0 and copy.is_contiguous()
    assert torch.equal(copy, layer.weight.t())


@pytest.mark.parametrize("inputs, outputs", [(96, 40), (40, 96)])
def test_onednn_one_row_copy_layout_follows_the_weight_shape_and_every_kernel_agrees(forced_on, monkeypatch,
                                                                                     inputs, outputs):
    """More inputs than outputs (an FFN's output projection): the copy is the weight itself, read
    one dot product per output; otherwise its transpose. OpenBLAS (ember.host_blas) and PyTorch's
    kernels give F.linear within float rounding, with and without bias."""
    torch.manual_seed(0)
    layer = nn.Linear(inputs, outputs)
    x = torch.randn(1, 1, inputs)
    expected = F.linear(x, layer.weight, layer.bias)
    for host in ("1", "0"):
        monkeypatch.setenv("EMBER_HOST_BLAS", host)
        with torch.no_grad():
            torch.testing.assert_close(onednn.dense(layer, x), expected, rtol=1e-5, atol=1e-6)
            torch.testing.assert_close(onednn.linear(x, layer.weight), x @ layer.weight.t(), rtol=1e-5, atol=1e-6)
    copy = onednn._COPIES[id(layer.weight)][1]
    # a copy, no arithmetic: exact on every CPU
    assert torch.equal(copy, layer.weight if inputs > outputs else layer.weight.t())


def test_onednn_one_row_sends_layer_products_to_openblas_on_amd_and_vocabulary_heads_to_torch(forced_on, monkeypatch):
    """On AMD a layer-sized weight goes through ember.host_blas; one wider than HOST_BLAS_MAX_OUTPUTS
    (a vocabulary head, where MKL streams faster) and everything with EMBER_HOST_BLAS=0 does not."""
    from ember import host_blas

    if not host_blas.available():
        pytest.skip("numpy's BLAS here is not an OpenBLAS whose threads ember can set")
    calls = []
    real = host_blas.matmul
    monkeypatch.setattr(host_blas, "matmul", lambda a, b: calls.append(b.shape) or real(a, b))
    layer, head = nn.Linear(64, 256), nn.Linear(64, onednn.HOST_BLAS_MAX_OUTPUTS + 1, bias=False)
    with torch.no_grad():
        onednn.dense(layer, torch.randn(1, 64))
        assert len(calls) == 1
        y = onednn.linear(torch.randn(1, 64), head.weight)
        assert len(calls) == 1 and y.shape == (1, onednn.HOST_BLAS_MAX_OUTPUTS + 1)
        monkeypatch.setenv("EMBER_HOST_BLAS", "0")
        onednn.dense(layer, torch.randn(1, 64))
        assert len(calls) == 1
        # on Intel MKL streams the (K, N) copy faster: OpenBLAS only when asked for
        onednn._STATE["enabled"] = False  # Intel's switches: training on MKL, the row paths on
        monkeypatch.delenv("EMBER_HOST_BLAS")
        layer = nn.Linear(1024, 1024)  # 2^20 entries: large enough for the row path on Intel
        x = torch.randn(1, 1024)
        torch.testing.assert_close(onednn.dense(layer, x), F.linear(x, layer.weight, layer.bias), rtol=1e-5, atol=1e-6)
        assert len(calls) == 1
        monkeypatch.setenv("EMBER_HOST_BLAS", "1")
        onednn.dense(layer, x)
        assert len(calls) == 2


def test_onednn_a_view_weight_is_neither_packed_nor_copied(forced_on):
    """A weight that is a view made for one call (the key and value rows of a fused QKV weight)
    would be packed or copied again at every call: it takes the plain product, with the same result."""
    fused = torch.randn(96, 32)
    view = fused[32:]
    before = (len(onednn._PACKS), len(onednn._COPIES))
    with torch.no_grad():
        for rows in (1, 4):
            x = torch.randn(rows, 32)
            torch.testing.assert_close(onednn.linear(x, view), F.linear(x, view), rtol=1e-5, atol=1e-6)
    assert (len(onednn._PACKS), len(onednn._COPIES)) == before
    with torch.no_grad():
        onednn.linear(torch.randn(4, 32), fused)  # the weight itself is packed
    assert len(onednn._PACKS) == before[0] + 1
