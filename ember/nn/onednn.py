"""fp32 Linear layers through oneDNN's GEMM on CPUs where it beats the default BLAS.

PyTorch's CPU ``F.linear`` calls MKL's sgemm. On some CPUs (the AMD EPYC this project was
tuned on) MKL takes a generic code path and reaches about half of what the cores do: an
n=512 x 384 x 1536 product runs at ~100 GFLOP/s on one core through MKL and at ~225 GFLOP/s
through oneDNN. How much that buys depends on the core: on a Zen 4 EPYC (family 25, AVX-512
executed in 256-bit halves) both kernels reach ~100 GFLOP/s, the core's fp32 peak, and oneDNN
leads by ~5% (issue 46; BENCHMARKS.md, "Embeddings off the tuning machine"). oneDNN ships
with PyTorch too (``torch.ops.mkldnn._linear_pointwise``,
the kernel inductor uses for frozen Linear layers). Both compute in fp32 (IEEE; no bf16 or
TF32 inside), so the results agree to float rounding (~1e-6 relative).

``dense(layer, x)`` is ``layer(x)`` for an ``nn.Linear``; ``linear(x, weight, bias)`` is
``F.linear``. Both take the oneDNN path when it is on and applies (CPU, fp32, at least
``MIN_ROWS`` rows), with an autograd function whose backward runs its two products (grad x =
grad y W, grad W = grad y^T x) through oneDNN as well.

A single row without gradient (a decoding step at batch 1) is a matrix-vector product, bound by
reading the weight from memory. There MKL reads an (N, K) weight as the transposed operand ~1.7x
slower than a (K, N) one (768 x 3072 weights that do not fit the caches, one EPYC core: 765 vs
445 us; oneDNN 585 us), which is why transformers' GPT-2 (Conv1D, weights stored (K, N)) led
ember at batch 1. ``row_product`` keeps a copy of each weight it multiplies (built on first use,
rebuilt when the weight changes, dropped with it) in the layout its kernel streams fastest: (K, N)
in general, the weight's own (N, K) when it has more inputs than outputs (an FFN's output
projection: one dot product per output, 18.7 vs 16.6 GB/s through MKL, 22.6 vs 19.4 through
OpenBLAS). Layer-sized products go through numpy's OpenBLAS on the calling thread, which streams
them 1-35% faster than MKL on the Zen 4 EPYC (``ember.host_blas``); vocabulary-sized heads stay on
MKL, which leads there. Decoding holds the layer weights twice while a model decodes one row at
a time. The copies live in 2 MiB pages (``ember.host_memory.huge_page_empty``): ~10% faster
decoding on the Zen 4 EPYC.
Products without gradient (2 rows or more: decoding with a batch or beams, a request, an
evaluation, embeddings) go through oneDNN with the weight reordered once into its kernel's blocked
layout (``packed_weight``, cached as the row copies are). Given a plain weight, oneDNN reorders it
on every call, which at a few rows costs as much as the product: 16 rows, one Zen 4 EPYC core,
256 -> 8,000 (a vocabulary head) 1.72 ms plain against 0.76 ms packed, 768 -> 3,072 1.20 against
0.74 ms; a whole decoder step's products (weights cycled, not hot) GPT-2 at 8 rows 37.2 -> 25.5
ms, T5-small 12.4 -> 7.0 ms. At hundreds of rows it saves 4-7% (MiniLM embeddings of STS-B dev
+6%). The packed kernel computes what the plain one does (the same blocked product; the results
were equal bit for bit at every shape measured). The price is a second copy of the weights while
a model runs without gradient; a weight that trains drops its packed copy at its next forward
(``release_packed``), so evaluating between training steps does not keep one.
Anything else - a quantized Linear (int8 serving), CUDA, bf16, autocast, ONNX export, tracing,
``torch.compile`` - goes the ordinary way, so modules keep plain ``nn.Linear`` children
(state dicts, quantization and export are unchanged).

Whether the paths are on: ``EMBER_ONEDNN=1`` / ``0`` forces them; otherwise the products with
gradient (training) take oneDNN on AMD (and Hygon) CPUs, where MKL's sgemm dispatches to its
generic code, and MKL elsewhere (``enabled``). The products without gradient (``packed_weight``,
``row_product``) take their paths on AMD and on Intel CPUs (``serves_rows``): on an Intel Xeon
(AMX, one core) MKL's fp32 product at 400+ rows is at its peak (150-170 GFLOP/s, oneDNN packed
within -1..+7%), but at a few rows it reads the (N, K) weight slowly: 8 x 768 -> 3,072 takes 1.10
ms through ``F.linear`` and 0.57 ms packed, 8 x 768 -> 50,257 40.9 against 16.0 ms, 32 rows 1.47
against 1.21 ms (BENCHMARKS.md, "Decoding on the Intel Xeon"); a oneDNN call costs ~15-20 us
more than MKL's there, so products of under 8 rows or of weights under a million entries stay on
MKL (``MKL_SMALL_ROWS``: a one-request bert-mini forward, 1 x 32 tokens, ran 0.91x transformers'
with every product packed, 1.25x before). One row there goes through MKL on
the (K, N) copy, not OpenBLAS (``host_blas``): 15-22 GB/s against OpenBLAS's 14-18 and the
weight as stored 13-20. The rules are a pure function of the machine, not a timing: two
processes on one machine must round alike, or a resumed run would not reproduce the
uninterrupted one bit for bit (an earlier version timed both kernels at start-up and, on a
loaded machine, two processes chose differently). ``set_enabled`` overrides both (tests,
benchmarks).
"""

from __future__ import annotations

import os
import weakref

import torch
import torch.nn.functional as F
from torch import nn
from torch.autograd.function import once_differentiable

from ember import host_blas
from ember.host_memory import huge_page_empty

# From 2 rows on oneDNN beats MKL (768 -> 3072, weights from memory: 2 rows 40 vs 67 us, 4 rows 54
# vs 52, 8 rows 1030 vs 1250 us); one row goes through ``row_product``
MIN_ROWS = 2
# Where MKL is the training kernel (Intel), a oneDNN call costs ~15-20 us more than MKL's, so small
# products stay on MKL. One core of an Intel Xeon, F.linear time / packed time, weights hot: 2 rows
# 0.28-0.88x at every shape; 8 rows 0.46x (256 -> 256) to 0.95x (256 -> 1,024), 1.13x (384 ->
# 1,536), 1.70x (512 -> 2,048), 1.92x (768 -> 3,072); 32 rows 0.83x (256 -> 256) to 1.39x (3,072 ->
# 768); 448 rows (embeddings) 0.97-1.09x. Inside a bert-mini forward of one 32-token request the
# packed 256-wide products lost (5.3 ms with every product of 2+ rows packed, 3.4-3.8 ms on MKL,
# and MKL's time again with these bounds checked before anything else), so only weights
# of a million entries or more (a 512 -> 2,048 feed-forward, a vocabulary head) are packed there,
# and only they take ``row_product`` at one row (``one_row``).
MKL_SMALL_ROWS = 8
MKL_SMALL_WEIGHT = 1 << 20  # inputs x outputs
# The reorder for ``packed_weight`` takes a row count as a hint; any count gave the same speed and
# results at 2-64 rows, so one fixed hint serves every caller.
_PACK_HINT_ROWS = 16
# CPUs on which MKL's sgemm takes its generic code path (it dispatches on the vendor string)
SLOW_MKL_VENDORS = ("AuthenticAMD", "HygonGenuine")
# CPUs on which products without gradient read packed weights and one rows read copies (the
# module docstring): MKL's generic path above, and Intel's MKL at a few rows
ROW_PATH_VENDORS = SLOW_MKL_VENDORS + ("GenuineIntel",)
_STATE: dict[str, bool | None] = {"enabled": None, "rows": None}
# id(weight) -> (its version and storage when copied, its copy for one-row products, ``row_copy``);
# an entry goes with its weight (a finalizer; a WeakKeyDictionary would compare two tensors with ==)
_COPIES: dict[int, tuple] = {}
_PACKS: dict[int, tuple] = {}  # the same for ``packed_weight``
# Up to this many outputs a one-row product goes through OpenBLAS (ember.host_blas); a wider weight
# (a vocabulary head: 50,257 outputs, MKL 25.5 vs OpenBLAS 23.1 GB/s) through MKL
HOST_BLAS_MAX_OUTPUTS = 8192


def _op():
    return getattr(getattr(torch.ops, "mkldnn", None), "_linear_pointwise", None)


def _cpu_vendor() -> str:
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as f:
            for line in f:
                if line.startswith("vendor_id"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return ""


def cpu_has_fast_bf16() -> bool:
    """Whether this CPU multiplies bf16 matrices in hardware (Intel AMX tiles): there bf16 runs
    ~10x fp32 per core, elsewhere ~100x slower (ember.train.precision, ember.serve.runners)."""
    probe = getattr(torch.cpu, "_is_amx_tile_supported", None)  # private, so asked with care
    try:
        return bool(probe()) if probe is not None else False
    except RuntimeError:
        return False


def _decide(key: str, vendors: tuple[str, ...]) -> bool:
    if _STATE[key] is None:
        forced = os.environ.get("EMBER_ONEDNN", "").strip()
        wanted = forced == "1" if forced in ("0", "1") else _cpu_vendor() in vendors
        _STATE[key] = wanted and _op() is not None and torch.backends.mkldnn.is_available()
    return bool(_STATE[key])


def enabled() -> bool:
    """Whether CPU fp32 Linear layers go through oneDNN, products with gradient included (decided
    once; see the module docstring). Where it is on, ``serves_rows`` is on too."""
    return _decide("enabled", SLOW_MKL_VENDORS)


def serves_rows() -> bool:
    """Whether products without gradient take ``packed_weight`` (2 rows or more) and
    ``row_product`` (one row): on AMD and Intel CPUs (decided once; the module docstring)."""
    return _decide("rows", ROW_PATH_VENDORS)


def set_enabled(value: bool | None) -> None:
    """Force both paths on or off (None: decide again on next use)."""
    for key in _STATE:
        _STATE[key] = None if value is None else bool(value) and _op() is not None


def _rows_through_openblas(outputs: int) -> bool:
    """Whether a one-row product goes through ``host_blas`` (OpenBLAS): layer-sized weights where
    MKL takes its generic path (``enabled``: the same machine rule), or with ``EMBER_HOST_BLAS=1``;
    on Intel MKL streams the copies faster (the module docstring)."""
    if outputs > HOST_BLAS_MAX_OUTPUTS or not host_blas.available():
        return False
    return enabled() or os.environ.get("EMBER_HOST_BLAS", "").strip() == "1"


def _onnx_export_flags():
    """() -> whether an ONNX export is running: the two flags torch.onnx.is_in_onnx_export reads,
    imported once (that function imports them on every call: half the cost of ``is_recording``,
    which every Linear of a decoding step asks); that function itself where they are not found."""
    try:
        from torch.onnx._internal.exporter import _flags
        from torch.onnx._internal.torchscript_exporter._globals import GLOBALS
    except ImportError:  # another torch layout
        return torch.onnx.is_in_onnx_export
    return lambda: GLOBALS.in_onnx_export or _flags._is_onnx_exporting


_in_onnx_export = _onnx_export_flags()


def is_recording() -> bool:
    """Whether a tracer, scripter, exporter or compiler is recording the ops, which must then be
    ordinary nodes (so it is asked before any shape test a tracer would see)."""
    return (torch.jit.is_tracing() or torch.jit.is_scripting() or _in_onnx_export()
            or torch.compiler.is_compiling())


def needs_ordinary_ops(device_type: str) -> bool:
    """Whether a custom kernel or autograd function must step aside for the plain torch ops:
    while recording (``is_recording``), and under autocast, which must see F.linear to cast it."""
    return is_recording() or torch.is_autocast_enabled(device_type)


def applies(x: torch.Tensor, weight: torch.Tensor) -> bool:
    # The cached switch first: where MKL is the fast kernel (it is off) this is every Linear's
    # only check; asking the four recorders first cost ~1% of an inference pass.
    if not enabled() or needs_ordinary_ops("cpu"):
        return False
    if x.device.type != "cpu" or x.dtype != torch.float32 or weight.dtype != torch.float32:
        return False
    return x.numel() >= MIN_ROWS * x.shape[-1]


def gemm(x: torch.Tensor, w: torch.Tensor, b: torch.Tensor | None) -> torch.Tensor:
    """x (..., K) @ w (N, K)^T + b: oneDNN's kernel, no autograd."""
    return _op()(x, w, b, "none", [], "")


def weight_gradient(grad: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
    """grad (M, N)^T @ x (M, K) -> (N, K): a Linear's weight gradient, through oneDNN."""
    if grad.shape[1] > x.shape[1]:
        # N > K (e.g. the tied MLM decoder, N = vocabulary): oneDNN runs this ~1.7x faster
        # with the wide operand as its "weight": (K, M) @ (M, N), transposed back
        return gemm(x.t(), grad.t(), None).t().contiguous()
    return gemm(grad.t(), x.t(), None)  # (N, M) @ (M, K) -> (N, K)


class _OneDnnLinear(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, weight, bias):
        ctx.save_for_backward(x, weight)
        ctx.has_bias = bias is not None
        return gemm(x, weight, bias)

    @staticmethod
    @once_differentiable  # no double backward: a create_graph=True caller gets an error, not zeros
    def backward(ctx, grad):  # grad (..., N)
        x, weight = ctx.saved_tensors
        gx = gw = gb = None
        grad = grad.contiguous()  # e.g. the zero-stride gradient of a .sum()
        g2 = grad.reshape(-1, grad.shape[-1])  # (M, N)
        if ctx.needs_input_grad[0]:
            gx = gemm(grad, weight.t(), None)  # (..., N) @ (N, K) -> (..., K); oneDNN reads the view
        if ctx.needs_input_grad[1]:
            gw = weight_gradient(g2, x.reshape(-1, x.shape[-1]))
        if ctx.has_bias and ctx.needs_input_grad[2]:
            gb = g2.sum(0)
        return gx, gw, gb


def one_row(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None) -> bool:
    """Whether ``row_product`` takes ``x @ weight.T``: one fp32 CPU row, nothing to differentiate,
    the path on (``serves_rows``: a machine rule, so two processes round alike)."""
    if x.numel() != x.shape[-1]:
        return False
    if not enabled() and weight.numel() < MKL_SMALL_WEIGHT:
        # Intel: a small weight sits in the caches, where MKL's product on the weight as stored is
        # the faster one (one core, 1,024 -> 256: 18.8 us against 31.1 on the copy)
        return False
    return _decoding_product(x, weight, bias)


def packed_rows(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None) -> bool:
    """Whether ``linear`` runs ``x @ weight.T`` on ``packed_weight``: ``MIN_ROWS`` or more fp32 CPU
    rows (on Intel: ``MKL_SMALL_ROWS`` rows or more of a weight of ``MKL_SMALL_WEIGHT`` entries or
    more), nothing to differentiate, the path on. A pure function of the shapes and the machine,
    so two processes round alike."""
    if x.numel() < MIN_ROWS * x.shape[-1]:
        return False
    # the shape bounds first: on Intel most products of a small model stop here, and a forward's
    # ~20 full checks cost 0.2 ms of a 3.5 ms one-request bert-mini forward (measured)
    if not enabled() and (weight.numel() < MKL_SMALL_WEIGHT or x.numel() < MKL_SMALL_ROWS * x.shape[-1]):
        return False
    # the switch and the grad checks before the op lookup
    return _decoding_product(x, weight, bias) and _reorder() is not None


def _decoding_product(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None) -> bool:
    if not serves_rows() or needs_ordinary_ops("cpu"):
        return False
    if x.device.type != "cpu" or x.dtype != torch.float32 or weight.dtype != torch.float32 or weight.dim() != 2:
        return False
    if weight._base is not None:
        # a view made for this call (the key and value rows of a fused QKV weight, for the last
        # layer at the rows a loss reads): a new tensor every call, so a copy or packed weight
        # cached for it would be made again every call (a 512 x 256 pack: 0.47 ms a forward)
        return False
    return not (torch.is_grad_enabled() and (x.requires_grad or weight.requires_grad
                                             or (bias is not None and bias.requires_grad)))


def reads_rows(weight: torch.Tensor) -> bool:
    """Whether a one-row product reads ``weight`` (N, K) in its own layout, one dot product per
    output (more inputs than outputs), rather than as its (K, N) transpose (the module docstring)."""
    return weight.shape[1] > weight.shape[0]


def _cached(store: dict, weight: torch.Tensor, make) -> torch.Tensor:
    """``make(weight)`` (a copy in another form), cached in ``store`` until the weight changes in
    place (its version counter) or gets new storage (``load_state_dict``, ``.data =``); the entry
    goes with its weight (a finalizer)."""
    key = (weight._version, weight.data_ptr())
    hit = store.get(id(weight))
    if hit is None or hit[0] != key:
        if hit is None:
            weakref.finalize(weight, store.pop, id(weight), None)
        with torch.no_grad():
            hit = (key, make(weight.detach()))
        store[id(weight)] = hit
    return hit[1]


def row_copy(weight: torch.Tensor) -> torch.Tensor:
    """``weight`` (N, K) as a contiguous copy in 2 MiB pages, (N, K) if ``reads_rows`` else (K, N),
    cached (``_cached``)."""
    def make(w: torch.Tensor) -> torch.Tensor:
        source = w if reads_rows(w) else w.t()
        # read once per token: 2 MiB pages stream faster (ember.host_memory)
        return huge_page_empty(tuple(source.shape), w.dtype).copy_(source)

    return _cached(_COPIES, weight, make)


def _reorder():
    return getattr(getattr(torch.ops, "mkldnn", None), "_reorder_linear_weight", None)


def packed_weight(weight: torch.Tensor) -> torch.Tensor:
    """``weight`` (N, K) in oneDNN's blocked layout for its GEMM (an opaque mkldnn tensor that
    ``gemm`` takes in place of the weight), cached (``_cached``)."""
    return _cached(_PACKS, weight, lambda w: _reorder()(w, _PACK_HINT_ROWS))


def release_packed(weight: torch.Tensor) -> None:
    """Drop ``weight``'s packed copy, if it has one: it trains, so the copy would be stale at the
    next evaluation anyway. The entry stays (emptied), so its finalizer is not registered twice."""
    hit = _PACKS.get(id(weight))
    if hit is not None and hit[1] is not None:
        _PACKS[id(weight)] = (None, None)


def row_product(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
    """(..., K) one row x (N, K) -> (..., N) through ``row_copy`` (see the module docstring)."""
    n, k = weight.shape
    row, copy, by_rows = x.reshape(1, k), row_copy(weight), reads_rows(weight)
    if _rows_through_openblas(n):
        out = host_blas.matmul(copy, row.reshape(k, 1)) if by_rows else host_blas.matmul(row, copy)
        out = out.view(1, n)
        if bias is not None:
            out.add_(bias)
    elif by_rows:
        out = torch.mv(copy, row[0]) if bias is None else torch.addmv(bias, copy, row[0])
    else:
        out = row @ copy if bias is None else torch.addmm(bias, row, copy)
    return out.view(*x.shape[:-1], n)


def linear(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None) -> torch.Tensor:
    """``F.linear(x, weight, bias)``: (..., K) x (N, K) -> (..., N), through oneDNN where it applies
    (one row without gradient: ``row_product``; 2 rows or more without gradient: ``packed_weight``)."""
    if packed_rows(x, weight, bias):
        return gemm(x, packed_weight(weight), bias)
    if _PACKS and weight.requires_grad and torch.is_grad_enabled():  # it trains: see ``release_packed``
        release_packed(weight)
    if not applies(x, weight):
        if one_row(x, weight, bias):
            return row_product(x, weight, bias)
        return F.linear(x, weight, bias)
    if torch.is_grad_enabled() and (x.requires_grad or weight.requires_grad
                                    or (bias is not None and bias.requires_grad)):
        return _OneDnnLinear.apply(x, weight, bias)
    return gemm(x, weight, bias)


def dense(layer: nn.Module, x: torch.Tensor) -> torch.Tensor:
    """``layer(x)``; a plain ``nn.Linear`` goes through ``linear`` (others, e.g. int8, as they are)."""
    if type(layer) is nn.Linear:
        return linear(x, layer.weight, layer.bias)
    return layer(x)
