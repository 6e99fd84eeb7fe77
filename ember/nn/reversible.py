"""Reversible residual layers (Gomez et al. 2017, RevNet), as Reformer uses them (Kitaev et al.
2020, §3 "Reversible Transformer"), with a chunked feed-forward (§3 "Chunking"):

    Y1 = X1 + F(X2),   F = Drop(Attention(LN(.)))
    Y2 = X2 + G(Y1),   G = Drop(FeedForward(LN(.))), applied ``chunk`` positions at a time

A layer's inputs follow from its outputs (X2 = Y2 - G(Y1), X1 = Y1 - F(X2)), so the stack keeps
only its last outputs: the backward walks the layers in reverse, recomputing each layer's F and
G with autograd on (the same dropout masks and LSH rotations: the random generator's state
before each call is kept and restored, and the forward's autocast re-entered, as
torch.utils.checkpoint does), taking their gradients, and reconstructing the inputs.
Activation memory is then one layer's, whatever the depth (tested with saved-tensor hooks).
G is position-wise, so its backward also runs chunk by chunk: only ``chunk`` positions of the
feed-forward's 4H-wide activations exist at a time.

The stack starts from (X, X) and, since ember's heads read H-wide states, ends with the mean of
its two streams (transformers' ReformerModel concatenates them into a 2H output instead).
Parameters' gradients are returned through the autograd function (not accumulated behind its
back), so ``torch.autograd.grad``, hooks and shared (ALBERT) sub-layers work as elsewhere.

``plain=True`` computes the same function with ordinary autograd (every activation kept): the
reference the reversible backward is tested against, and what runs when hidden states are asked
for.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import torch
from torch import nn

Step = Callable[[torch.Tensor], torch.Tensor]


class Block:
    """One reversible layer: F (attention) and G (feed-forward) as callables on (B, T, H) and the
    parameters each reads."""

    def __init__(self, f: Step, g: Step, f_params: Sequence[nn.Parameter], g_params: Sequence[nn.Parameter],
                 chunk: int = 0) -> None:
        self.f, self.g, self.f_params, self.g_params, self.chunk = f, g, list(f_params), list(g_params), chunk

    def g_chunked(self, y: torch.Tensor) -> torch.Tensor:
        if not self.chunk or y.shape[1] <= self.chunk:
            return self.g(y)
        return torch.cat([self.g(part) for part in y.split(self.chunk, dim=1)], dim=1)


def _rng_state(device: torch.device):
    return torch.get_rng_state(), (torch.cuda.get_rng_state(device) if device.type == "cuda" else None)


def _set_rng_state(state, device: torch.device) -> None:
    torch.set_rng_state(state[0])
    if state[1] is not None:
        torch.cuda.set_rng_state(state[1], device)


def _grads(output: torch.Tensor, inputs: list[torch.Tensor], grad: torch.Tensor) -> list[torch.Tensor | None]:
    wanted = [i for i in inputs if i.requires_grad]
    found = iter(torch.autograd.grad(output, wanted, grad, allow_unused=True)) if wanted else iter(())
    return [next(found) if i.requires_grad else None for i in inputs]


class _Reversible(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x: torch.Tensor, blocks: list[Block], params: list[nn.Parameter], *flat):
        ctx.blocks, ctx.params, ctx.states = blocks, params, []
        kind = x.device.type  # the backward recomputes under the forward's autocast (as checkpointing does)
        ctx.autocast = (kind, torch.get_autocast_dtype(kind), torch.is_autocast_enabled(kind))
        with torch.no_grad():
            x1 = x2 = x
            for block in blocks:
                f_state = _rng_state(x.device)
                x1 = x1 + block.f(x2)
                g_state = _rng_state(x.device)
                x2 = x2 + block.g_chunked(x1)
                ctx.states.append((f_state, g_state))
        ctx.save_for_backward(x1, x2)
        return x1, x2

    @staticmethod
    def backward(ctx, dy1: torch.Tensor, dy2: torch.Tensor):
        y1, y2 = ctx.saved_tensors
        index = {id(p): i for i, p in enumerate(ctx.params)}
        grads: list[torch.Tensor | None] = [None] * len(ctx.params)

        def add(params, found) -> None:
            for p, g in zip(params, found):
                if g is not None:
                    i = index[id(p)]
                    grads[i] = g if grads[i] is None else grads[i] + g

        device = y1.device
        kind, dtype, enabled = ctx.autocast
        with torch.random.fork_rng(devices=[device] if device.type == "cuda" else []), \
                torch.autocast(kind, dtype=dtype, enabled=enabled):
            for block, (f_state, g_state) in zip(reversed(ctx.blocks), reversed(ctx.states)):
                # G: X2 = Y2 - G(Y1); dY1 += G'(Y1)^T dY2, one chunk of positions at a time
                _set_rng_state(g_state, device)
                parts = y1.split(block.chunk, dim=1) if block.chunk else (y1,)
                d_parts, g_outs = [], []
                for part, d2 in zip(parts, dy2.split(parts[0].shape[1], dim=1)):
                    with torch.enable_grad():
                        part = part.detach().requires_grad_()
                        out = block.g(part)
                        found = _grads(out, [part, *block.g_params], d2)
                    d_parts.append(found[0])
                    add(block.g_params, found[1:])
                    g_outs.append(out.detach())
                dy1 = dy1 + torch.cat(d_parts, dim=1)
                x2 = y2 - torch.cat(g_outs, dim=1)
                # F: X1 = Y1 - F(X2); dX2 = dY2 + F'(X2)^T dY1
                _set_rng_state(f_state, device)
                with torch.enable_grad():
                    x2 = x2.detach().requires_grad_()
                    out = block.f(x2)
                    found = _grads(out, [x2, *block.f_params], dy1)
                add(block.f_params, found[1:])
                y1, y2 = y1 - out.detach(), x2.detach()
                dy2 = dy2 + found[0]
        # the input fed both streams: its gradient is the sum of theirs
        return (dy1 + dy2, None, None, *grads)


def reversible_stack(x: torch.Tensor, blocks: list[Block], plain: bool = False,
                     states: list | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """(Y1, Y2) of the blocks applied to (X, X); ``plain``: ordinary autograd (see the docstring),
    appending each layer's (Y1 + Y2) / 2 to ``states`` when given."""
    if plain or not torch.is_grad_enabled():
        x1 = x2 = x
        for block in blocks:
            x1 = x1 + block.f(x2)
            x2 = x2 + block.g_chunked(x1)
            if states is not None:
                states.append((x1 + x2) / 2)
        return x1, x2
    params = list({id(p): p for b in blocks for p in (*b.f_params, *b.g_params) if p.requires_grad}.values())
    return _Reversible.apply(x, blocks, params, *params)


def layer_blocks(sequence, mask, chunk: int = 0) -> list[Block]:
    """Blocks of ember TransformerLayers (``Encoder.layer_sequence()``: (layer, donor) pairs; ALBERT's
    shared sub-layers live in the donor), run pre-LN: F = Drop(Attn(LN(x))), G = Drop(FFN(LN(x)))."""
    blocks = []
    for layer, donor in sequence:
        a = layer if layer.own_attention else donor
        f = layer if layer.own_ffn else donor

        def attend(x, layer=layer, a=a):
            return layer.dropout(a.attention(a.attention_norm(x), mask)[0])

        def feed(x, layer=layer, f=f):
            return layer.dropout(f.ffn(f.ffn_norm(x)))

        f_params = [*a.attention.parameters(), *a.attention_norm.parameters()]
        g_params = [*f.ffn.parameters(), *f.ffn_norm.parameters()]
        blocks.append(Block(attend, feed, f_params, g_params, chunk))
    return blocks
