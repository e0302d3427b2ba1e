"""The compressor interface and the per-layer record the hook keeps between steps.

A compressor is three parts, as in GRACE (Xu et al. 2021): its math (this class's subclasses,
one file each), its memory (:class:`compression.memory.ErrorFeedback`: what a worker's message
left out, added back next step) and the exchange (:mod:`compression.comm`'s collectives and
:mod:`compression.exchange`'s fixed-length messages). A subclass declares its facts as class
attributes and methods, which the hook, the schedulers, the analysis and the tests read:

- ``level_field``: the config key of its compression level (PowerSGD ``rank``, Top-K ``ratio``,
  AdaComp ``bin_size``), set per layer at runtime by the schedulers;
- ``accordion_levels``: the (low, high) pair Accordion switches between by default;
- :meth:`step_bits`: the bits a layer of a shape sends per step at a level, where that depends
  on nothing else (None where it depends on the gradients, as AdaComp's).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, ClassVar, NamedTuple

import torch

from compression.comm import Comm, Steps
from compression.memory import ErrorFeedback
from core.errors import ConfigError


def divisor(like: torch.Tensor, value: float) -> float | torch.Tensor:
    """``value`` to divide ``like`` by, so that every device rounds the true quotient: the number
    itself on the CPU (which divides by it exactly, with no tensor made on the hook's path), a
    0-d tensor of ``like``'s dtype on its CUDA device.

    Divided by a host number, a CUDA tensor is multiplied by its reciprocal instead (ATen's
    ``div_true_kernel_cuda`` for a CPU-scalar divisor, said there to lose a bit), which is one
    ulp off the CPU's quotient unless ``value`` is a power of 2: the mean over W = 3 workers
    differed from the CPU's on an H200 (results/bench/gpu/divide.txt).
    """
    return like.new_full((), value) if like.is_cuda else value


@dataclass
class Layer:
    """One parameter tensor as the hook keeps it from step to step.

    ``level`` is the layer's compression level (PowerSGD rank, Top-K ratio, AdaComp bin size);
    ``memory`` holds the compressor's state for this layer (error feedback, residue, warm-start
    Q, ...), kept across steps and checkpointed. A step's gradients are not kept here: the
    hook hands them to :meth:`Compressor.aggregate` beside their layers.
    """

    name: str
    shape: torch.Size
    level: Any = None
    memory: dict[str, torch.Tensor] = field(default_factory=dict)


class Sent(NamedTuple):
    """What one worker sent for one layer in one step.

    ``bits`` is the paper's accounting of the payload; ``wire_bits`` what our own message
    format puts on the wire (they differ for AdaComp, whose paper encoding we do not implement);
    ``elements``: how many of the layer's elements a sparsifier chose to send (None where the
    message is not a choice of elements). A count that depends on the data may be a 0-d integer
    tensor on the device (AdaComp on CUDA), so that the step never waits to read it: the hook
    sums such counts on the device and reads them once per epoch.
    """

    bits: int | torch.Tensor
    wire_bits: int | torch.Tensor
    elements: int | torch.Tensor | None = None


class Compressor:
    """A layer-wise gradient compressor.

    Subclasses implement :meth:`aggregate` for a bucket's matrix-shaped layers (ndim > 1); the
    hook all-reduces everything else uncompressed. ``compresses = False`` (the ``none``
    compressor) makes the hook all-reduce the whole bucket in fp32. A compressor instance holds
    configuration only: per-layer state lives in :attr:`Layer.memory`.
    """

    name: ClassVar[str] = "base"
    compresses: ClassVar[bool] = True
    level_field: ClassVar[str] = "level"  # the config key that sets every layer's default level
    accordion_levels: ClassVar[tuple[Any, Any] | None] = None  # Accordion's default (low, high)
    paper: ClassVar[str] = ""  # where the algorithm is from (the Compressors table)
    wire: ClassVar[str] = ""   # our message format: collective and contents (the same table)
    memory: ErrorFeedback = ErrorFeedback(enabled=False)  # error feedback (none by default)

    def default_level(self, shape: torch.Size) -> Any:
        """The level a layer of ``shape`` starts with (e.g. the configured rank)."""
        return None

    def validate_level(self, level: Any, field: str | None = None) -> Any:
        """``level`` as the plain number :meth:`aggregate` uses, or a ConfigError naming
        ``field`` (default: ``compressor.<level_field>``) and the allowed range."""
        raise ConfigError(f"{field or 'compressor.name'}: compressor {self.name!r} has no "
                          f"levels to set")

    def set_level(self, layer: Layer, level: Any) -> None:
        """Give ``layer`` a (validated) new ``level`` from its next step on; a compressor whose
        memory depends on the level adjusts it here."""
        layer.level = level

    def step_bits(self, shape: torch.Size, level: Any) -> int | None:
        """Payload bits (``Sent.bits``) one worker sends per step for a layer of ``shape`` at
        ``level``; None where that depends on the gradients, not only on shape and level."""
        return None

    def settle(self, layer: Layer) -> None:
        """Bring ``layer.memory`` to its plain form (a compressor may defer part of a step's
        update to the next step); called before the memory is saved or read from outside."""

    def layer_stats(self, layer: Layer) -> dict[str, float | torch.Tensor]:
        """Per-layer metrics of the compressor's state, logged at each epoch's end as
        ``<key>/<layer>`` (e.g. AdaComp's residue range); cheap: once per epoch. A value may be
        a 0-d tensor on the layer's device: the hook reads all of them at once."""
        return {}

    def error(self, layer: Layer) -> torch.Tensor | None:
        """The layer's error-feedback memory, settled and shaped as the layer (None without)."""
        self.settle(layer)
        return self.memory.peek(layer)

    def aggregate(self, layers: list[Layer], grads: list[torch.Tensor], comm: Comm
                  ) -> Steps[list[Sent]]:
        """Steps that overwrite every ``grads[i]`` (this worker's gradient of ``layers[i]``, a
        view into DDP's bucket) with the mean over workers of its (compressed) gradient;
        returns what this worker sent for each layer, in order."""
        raise NotImplementedError


class Scratch:
    """Reusable buffers for a compressor's large temporaries (|G|, masks, messages, ...).

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
