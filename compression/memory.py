"""Error feedback: a worker's memory of what its messages left out.

Stich, Cordonnier, Jaggi (NeurIPS 2018) and Karimireddy et al., "Error Feedback Fixes SignSGD"
(ICML 2019), Algorithm 2 (EF-SGD), per layer and per worker::

    acc = g + e          compensate: add back what earlier messages left out
    msg = C(acc)         the compressor's math
    e   = acc - D(msg)   what this message leaves out, for the next step

:meth:`ErrorFeedback.compensate` does the first line, in place in the memory (zeros at first), so
that a compressor updates ``e`` by taking off what it sent (Top-K zeroes the sent entries,
PowerSGD subtracts P Q^T, AdaComp's ``residue`` takes off G_q). With error feedback off
(``enabled=False``, e.g. the Accordion authors' Top-K) ``acc`` is the gradient itself and there
is no memory: what a message leaves out is lost.

The memory lives in :attr:`compression.base.Layer.memory` under :attr:`ErrorFeedback.key`, so
the hook checkpoints it with the layer, and is flat (the layer's elements, maybe followed by
padding a compressor needs, such as AdaComp's whole bins).
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING

import torch

if TYPE_CHECKING:
    from compression.base import Layer


class ErrorFeedback:
    """Error-feedback memory ``layer.memory[key]`` (``enabled=False``: no memory)."""

    def __init__(self, enabled: bool = True, key: str = "error") -> None:
        self.enabled, self.key = enabled, key

    def buffer(self, layer: Layer, numel: int, like: torch.Tensor) -> torch.Tensor:
        """The layer's memory e as a flat tensor of ``numel`` elements (zeros at first). If it
        has another size (a level that pads differently), it is reallocated keeping the layer's
        own elements (the padding starts at zero)."""
        e = layer.memory.get(self.key)
        if e is None or e.numel() != numel:
            fresh = like.new_zeros(numel)
            if e is not None:
                keep = min(e.numel(), numel, math.prod(layer.shape))
                fresh[:keep] = e.view(-1)[:keep]
            e = layer.memory[self.key] = fresh
        return e

    def stacked(self, layers: list[Layer], numel: int, like: torch.Tensor) -> torch.Tensor:
        """The memories of ``layers`` (``numel`` elements each) as the rows of one
        (len(layers), numel) tensor, so that one batched operation updates them all: each
        layer's memory becomes a view of its row (zeros at first; an existing memory is copied
        in once, as :meth:`buffer` keeps it)."""
        rows = [layer.memory.get(self.key) for layer in layers]
        if _rows_of_one(rows, numel):
            return rows[0].as_strided((len(rows), numel), (numel, 1))
        stack = like.new_zeros(len(layers), numel)
        for layer, e, row in zip(layers, rows, stack, strict=True):
            if e is not None:
                keep = min(e.numel(), numel, math.prod(layer.shape))
                row[:keep] = e.view(-1)[:keep]
            layer.memory[self.key] = row
        return stack

    def compensate(self, layer: Layer, grad: torch.Tensor) -> torch.Tensor:
        """acc = g + e (EF-SGD), flat, computed in place in the memory; without error feedback
        the flat gradient itself."""
        if not self.enabled:
            return grad.view(-1)
        return self.buffer(layer, grad.numel(), grad).add_(grad.view(-1))

    def drain(self, layer: Layer, grad: torch.Tensor) -> torch.Tensor:
        """acc = g + e (flat) for a message that sends acc whole: nothing is left out, so the
        memory is emptied."""
        e = layer.memory.pop(self.key, None)
        return grad.view(-1) if e is None else e.add_(grad.view(-1))

    def peek(self, layer: Layer) -> torch.Tensor | None:
        """The memory shaped as the layer (without padding), or None if there is none."""
        e = layer.memory.get(self.key) if self.enabled else None
        if e is None:
            return None
        return e.view(-1)[:math.prod(layer.shape)].view(layer.shape)


def _rows_of_one(rows: list[torch.Tensor | None], numel: int) -> bool:
    """Whether ``rows`` are consecutive flat views of ``numel`` elements into one tensor."""
    first = rows[0]
    if first is None:
        return False
    start, base = first.storage_offset(), first.untyped_storage().data_ptr()
    return all(e is not None and e.numel() == numel and e.is_contiguous()
               and e.untyped_storage().data_ptr() == base
               and e.storage_offset() == start + i * numel for i, e in enumerate(rows))
