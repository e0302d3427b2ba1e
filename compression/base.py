"""The compressor interface, the per-layer record the hook keeps, and config checks."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, NamedTuple

import torch

from compression.comm import Comm, Steps
from core.errors import ConfigError


@dataclass
class Layer:
    """One parameter tensor as the hook sees it in a step.

    ``grad`` is this worker's local gradient (a view into DDP's bucket buffer) on entry; a
    compressor overwrites it with the aggregate every worker applies. ``level`` is the layer's
    compression level (PowerSGD rank, Top-K ratio, AdaComp bin size). ``memory`` holds the
    compressor's state for this layer (error feedback, residue, warm-start Q, ...), kept across
    steps and checkpointed.
    """

    name: str
    shape: torch.Size
    level: Any = None
    memory: dict[str, torch.Tensor] = field(default_factory=dict)
    grad: torch.Tensor | None = None


class Sent(NamedTuple):
    """What one worker sent for one layer in one step.

    ``bits`` is the paper's accounting of the payload; ``wire_bits`` what our own message
    format puts on the wire (they differ for AdaComp, whose paper encoding we do not implement).
    """

    bits: int
    wire_bits: int


class Compressor:
    """A layer-wise gradient compressor.

    Subclasses implement :meth:`aggregate` for a bucket's matrix-shaped layers (ndim > 1); the
    hook all-reduces everything else uncompressed. ``compresses = False`` (the ``none``
    compressor) makes the hook all-reduce the whole bucket in fp32. A compressor instance holds
    configuration only: per-layer state lives in :attr:`Layer.memory`.
    """

    name: str = "base"
    compresses: bool = True
    level_field: str = "level"  # the config key that sets every layer's default level

    def default_level(self, shape: torch.Size) -> Any:
        """The level a layer of ``shape`` starts with (e.g. the configured rank)."""
        return None

    def validate_level(self, level: Any, field: str | None = None) -> Any:
        """``level`` as the plain number :meth:`aggregate` uses, or a ConfigError naming
        ``field`` (default: ``compressor.<level_field>``) and the allowed range."""
        raise ConfigError(f"{field or 'compressor.name'}: compressor {self.name!r} has no "
                          f"levels to set")

    def settle(self, layer: Layer) -> None:
        """Bring ``layer.memory`` to its plain form (a compressor may defer part of a step's
        update to the next step); called before the memory is saved or read from outside."""

    def aggregate(self, layers: list[Layer], comm: Comm) -> Steps[list[Sent]]:
        """Steps that overwrite every ``layer.grad`` with the mean over workers of its
        (compressed) gradient; returns what this worker sent for each layer, in order."""
        raise NotImplementedError


class Scratch:
    """Reusable buffers for a compressor's large temporaries (|G|, masks, ...).

    Not state: a buffer's contents are garbage between uses, and a slot must not be taken again
    while its last view is still in use. Reusing them spares the page faults a fresh allocation
    of that size costs on every step on CPU (which outweigh the arithmetic). A buffer that must
    outlive a collective is taken per ``owner`` (the bucket's first :class:`Layer`, which is this
    worker's own): simulated workers share one compressor and interleave their steps, and a
    driver may run several buckets' steps at once.
    """

    def __init__(self) -> None:
        self._buffers: dict[tuple[str, torch.dtype, torch.device, int], torch.Tensor] = {}

    def take(self, slot: str, numel: int, like: torch.Tensor,
             dtype: torch.dtype | None = None, owner: object = None) -> torch.Tensor:
        """A 1-D tensor of ``numel`` elements (``like``'s device, ``dtype`` or ``like``'s),
        distinct for each ``owner``."""
        key = (slot, dtype or like.dtype, like.device, id(owner))
        buffer = self._buffers.get(key)
        if buffer is None or buffer.numel() < numel:
            buffer = self._buffers[key] = like.new_empty(numel, dtype=key[1])
        return buffer[:numel]
