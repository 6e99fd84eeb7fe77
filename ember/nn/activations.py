"""Activation functions by name, as configs spell them."""

from torch import nn

from ember.errors import EmberError

_ACTIVATIONS = {
    "gelu": lambda: nn.GELU(),  # exact erf form (original BERT, HF "gelu")
    "gelu_new": lambda: nn.GELU(approximate="tanh"),  # GPT-2's tanh approximation
    "relu": lambda: nn.ReLU(),
    "tanh": lambda: nn.Tanh(),
    "silu": lambda: nn.SiLU(),
}


def activation(name: str) -> nn.Module:
    try:
        return _ACTIVATIONS[name]()
    except KeyError:
        raise EmberError(f"unknown activation {name!r}; choose one of {sorted(_ACTIVATIONS)}") from None

