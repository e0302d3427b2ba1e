"""The compressor interface and the per-layer record the hook keeps for every parameter."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import torch
from torch.distributed import ProcessGroup


@dataclass
class Layer:
    """One parameter tensor as the hook sees it in a step.

    ``grad`` is this worker's local gradient (a view into DDP's bucket buffer) on entry; a
    compressor overwrites it with the aggregate every worker applies. ``memory`` holds the
    compressor's state for this layer (error feedback, residue, warm-start Q, ...), kept across
    steps and checkpointed.
    """

    name: str
    shape: torch.Size
    level: Any = None
    memory: dict[str, torch.Tensor] = field(default_factory=dict)
    grad: torch.Tensor | None = None


class Compressor:
    """A layer-wise gradient compressor.

    Subclasses implement :meth:`reduce` for a bucket's matrix-shaped layers (ndim > 1); the hook
    all-reduces everything else uncompressed. ``compresses = False`` (the ``none`` compressor)
    makes the hook all-reduce the whole bucket in fp32.
    """

    name: str = "base"
    compresses: bool = True

    def default_level(self) -> Any:
        """The level a layer starts with (e.g. the configured rank)."""
        return None

    def reduce(self, layers: list[Layer], group: ProcessGroup | None,
               world_size: int) -> torch.futures.Future[list[int]]:
        """Aggregate ``layers``' gradients in place (the mean over workers).

        Returns a future that completes when every ``layer.grad`` holds the aggregate, with the
        number of payload bits this worker sent for each layer.
        """
        raise NotImplementedError
