"""The step every optimizer of ember's own shares: one update per tensor that has a gradient.

LAMB (a trust ratio per layer) and Adafactor (factored statistics per matrix) both work tensor by
tensor, so their ``step`` is the same loop around their own ``_update(p, group)``.
"""

from __future__ import annotations

import torch


class TensorwiseOptimizer(torch.optim.Optimizer):
    """``step`` calls ``_update(p, group)`` for each parameter with a gradient, as torch's optimizers
    do: under ``no_grad``, with an optional closure that recomputes the loss."""

    @torch.no_grad()
    def step(self, closure=None):
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        for group in self.param_groups:
            for p in group["params"]:
                if p.grad is not None:
                    self._update(p, group)
        return loss

    def _update(self, p: torch.Tensor, group: dict) -> None:
        raise NotImplementedError
