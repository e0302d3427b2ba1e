"""Fixed-length messages: one per worker and bucket, all-gathered, read back layer by layer.

Compressors whose message cannot be summed on the wire (Top-K's values and indices, AdaComp's
and EF-signSGD's sign bits with their scales) lay out each layer's part of a bucket's message
end to end, all-gather the message, and decompress each layer from every worker's part::

    offsets, length = layout(sizes, header=..., align=...)
    message = outbox(scratch, owner, length, dtype, like)      # this worker's buffer
    ... compress layer i into message[offsets[i]:offsets[i] + sizes[i]] ...
    parts = yield from gather(comm, scratch, owner, message)   # (world, length), rank order

When every worker's message has the same length (sizes depend on shapes and levels only), one
all-gather suffices, with no length exchange. The buffers are kept per bucket (``owner``: the
bucket's first layer record) and reused from step to step, as large fresh allocations cost more
in page faults than the copy itself.
"""

from __future__ import annotations

from itertools import accumulate
from typing import ClassVar

import torch

from compression.base import Compressor, Layer, Scratch, Sent
from compression.comm import Comm, Steps

LANE_BITS = [1 << lane for lane in range(8)]
_LANES: dict[torch.device, torch.Tensor] = {}  # LANE_BITS as a uint8 tensor, per device


def lanes(device: torch.device) -> torch.Tensor:
    """LANE_BITS on ``device``, made once: building it from the Python list is a copy from
    host memory, which on CUDA waits for the device every time it is made."""
    table = _LANES.get(device)
    if table is None:
        table = _LANES[device] = torch.tensor(LANE_BITS, dtype=torch.uint8, device=device)
    return table


def pack_bits(mask: torch.Tensor) -> torch.Tensor:
    """The flat bool ``mask`` as bytes, 8 elements to a byte: element i is bit i % 8 of byte
    i // 8 (the last byte zero-padded)."""
    padded = mask.new_zeros(-(-mask.numel() // 8) * 8)
    padded[:mask.numel()] = mask
    return (padded.view(-1, 8) * lanes(mask.device)).sum(1, dtype=torch.uint8)


def unpack_bits(packed: torch.Tensor, n: int) -> torch.Tensor:
    """The first ``n`` elements of the bool mask that :func:`pack_bits` packed."""
    return ((packed[:, None] & lanes(packed.device)) != 0).view(-1)[:n]


def layout(sizes: list[int], header: int = 0, align: int = 1) -> tuple[list[int], int]:
    """Offsets of parts of ``sizes`` elements laid end to end after ``header`` elements, and
    the message length, rounded up to a multiple of ``align`` (the tail is padding)."""
    offsets = list(accumulate(sizes[:-1], initial=header))
    end = header + sum(sizes)
    return offsets, -(-end // align) * align


def outbox(scratch: Scratch, owner: object, length: int, dtype: torch.dtype,
           like: torch.Tensor) -> torch.Tensor:
    """This worker's message buffer for the bucket of ``owner`` (contents: garbage)."""
    return scratch.take("message", length, like, dtype, owner=owner)


def gather(comm: Comm, scratch: Scratch, owner: object, message: torch.Tensor
           ) -> Steps[torch.Tensor]:
    """Steps that all-gather every worker's ``message`` (the same length on every worker);
    returns them as the rows of a (world, length) tensor, in rank order (read-only: simulated
    workers share it)."""
    world = comm.world_size
    gathered = (None if comm.shares_gather
                else scratch.take("gathered", world * message.numel(), message, owner=owner))
    parts = yield comm.all_gather(message, gathered)
    return parts.view(world, message.numel())


class GatherCompressor(Compressor):
    """A compressor whose workers all-gather one fixed-length message per bucket.

    A subclass gives, per layer, the size of its part of the message (in ``message_dtype``
    elements; it may depend on the layer's shape and level, not on the gradient), how to write
    it (:meth:`compress`, which also updates the layer's memory) and how to read every worker's
    part back into the mean (:meth:`decompress`); :meth:`aggregate` does the rest.
    """

    message_dtype: ClassVar[torch.dtype] = torch.uint8

    def __init__(self) -> None:
        self._scratch = Scratch()

    def message_size(self, layer: Layer, numel: int) -> int:
        """Elements of ``message_dtype`` in the layer's part of this worker's message."""
        raise NotImplementedError

    def compress(self, layer: Layer, grad: torch.Tensor, message: torch.Tensor) -> int:
        """Write the layer's part of the message from its local gradient ``grad`` (flat);
        update its memory; return the payload bits (``Sent.bits``)."""
        raise NotImplementedError

    def decompress(self, layer: Layer, parts: torch.Tensor, out: torch.Tensor) -> None:
        """``out`` (flat) = the mean over workers of what their parts (the rows of ``parts``)
        encode."""
        raise NotImplementedError

    def aggregate(self, layers: list[Layer], grads: list[torch.Tensor], comm: Comm
                  ) -> Steps[list[Sent]]:
        sizes = [self.message_size(layer, g.numel()) for layer, g in zip(layers, grads,
                                                                         strict=True)]
        offsets, length = layout(sizes)
        message = outbox(self._scratch, layers[0], length, self.message_dtype, grads[0])
        bits = [self.compress(layer, g.view(-1), message[at:at + size])
                for layer, g, at, size in zip(layers, grads, offsets, sizes, strict=True)]
        parts = yield from gather(comm, self._scratch, layers[0], message)
        for layer, g, at, size in zip(layers, grads, offsets, sizes, strict=True):
            self.decompress(layer, parts[:, at:at + size], g.view(-1))
        element_bits = message.element_size() * 8
        return [Sent(b, element_bits * size) for b, size in zip(bits, sizes, strict=True)]
