"""int8 dynamic quantization of a task model's Linear layers (PyTorch), saved as safetensors.

Dynamic quantization (the recipe PyTorch's BERT tutorial and Zafrir et al. 2019 "Q8BERT"
build on) stores each ``nn.Linear`` weight as int8 with one fp32 scale and zero point per
tensor, and quantizes activations on the fly per batch; embeddings, LayerNorm and the
tied MLM decoder stay fp32. On CPU the int8 GEMMs (fbgemm/oneDNN) are what makes it faster.

Saved without pickle: for each quantized Linear ``name``, ``name.weight_int8`` (out, in) int8,
``name.weight_scale`` / ``name.weight_zero_point`` (scalars) and ``name.bias``; every other
parameter and buffer under its usual name. Loading rebuilds the fp32 module, quantizes it
(which creates the quantized Linear modules) and puts the stored int8 weights back, so the
reloaded model computes exactly what was saved.
"""

from __future__ import annotations

import warnings
from pathlib import Path

import torch
from torch import nn

from ember.errors import EmberError

INT8_FILE = "model-int8.safetensors"


def _quantize_dynamic(module: nn.Module) -> nn.Module:
    with warnings.catch_warnings():  # torch.ao.quantization is deprecated in favour of torchao
        warnings.simplefilter("ignore")
        from torch.ao.quantization import quantize_dynamic

        return quantize_dynamic(module, {nn.Linear}, dtype=torch.qint8)


def _quantized_linears(module: nn.Module) -> dict[str, nn.Module]:
    from torch.ao.nn.quantized.dynamic import Linear as QLinear

    return {name: m for name, m in module.named_modules() if isinstance(m, QLinear)}


def quantize_int8(module: nn.Module) -> nn.Module:
    """A quantized copy of ``module`` (eval mode); the original is left fp32."""
    import copy

    return _quantize_dynamic(copy.deepcopy(module).eval()).eval()


def int8_state(qmodule: nn.Module) -> dict[str, torch.Tensor]:
    """Plain tensors describing a quantized module (see the module docstring)."""
    state = {k: v.detach() for k, v in qmodule.named_parameters()}
    state.update({k: v.detach() for k, v in qmodule.named_buffers()})
    for name, lin in _quantized_linears(qmodule).items():
        weight, bias = lin._packed_params._weight_bias()
        if weight.qscheme() != torch.per_tensor_affine:
            raise EmberError(f"{name}: only per-tensor int8 weights can be saved (got {weight.qscheme()})")
        state[f"{name}.weight_int8"] = weight.int_repr()
        state[f"{name}.weight_scale"] = torch.tensor(weight.q_scale(), dtype=torch.float64)
        state[f"{name}.weight_zero_point"] = torch.tensor(weight.q_zero_point(), dtype=torch.int64)
        if bias is not None:
            state[f"{name}.bias"] = bias.detach()
    return state


def save_int8(qmodule: nn.Module, path: Path) -> None:
    from ember.runs.checkpoint import save_weights

    save_weights(int8_state(qmodule), path, {"format": "ember-int8-dynamic", "dtype": "qint8"})


def load_int8(fp32_structure: nn.Module, path: Path) -> nn.Module:
    """Quantize ``fp32_structure`` (weights irrelevant) and load the int8 weights of ``path``."""
    from ember.runs.checkpoint import load_weights

    state = load_weights(path)
    qmodule = _quantize_dynamic(fp32_structure.eval())
    linears = _quantized_linears(qmodule)
    plain = {k: v for k, v in state.items()
             if not any(k.startswith(f"{name}.") for name in linears)}
    # Copied tensor by tensor: quantized Linear modules expect scale/zero_point entries in a
    # state dict, which this format keeps with their int8 weights instead.
    own = dict(qmodule.named_parameters())
    own.update(qmodule.named_buffers())
    missing, unexpected = sorted(set(own) - set(plain)), sorted(set(plain) - set(own))
    if missing or unexpected or any(own[k].shape != v.shape for k, v in plain.items()):
        raise EmberError(f"{path} does not fit the model in config.yaml "
                         f"(missing {missing[:3]}, unexpected {unexpected[:3]}, or shapes differ)")
    with torch.no_grad():
        for k, v in plain.items():
            own[k].copy_(v)
    for name, lin in linears.items():
        try:
            ints = state[f"{name}.weight_int8"]
            scale = float(state[f"{name}.weight_scale"])
            zero = int(state[f"{name}.weight_zero_point"])
        except KeyError as exc:
            raise EmberError(f"{path}: int8 weights of {name} are missing ({exc})") from None
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            weight = torch._make_per_tensor_quantized_tensor(ints, scale, zero)
        lin.set_weight_bias(weight, state.get(f"{name}.bias"))
    return qmodule.eval()
