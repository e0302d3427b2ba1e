"""Random streams of the stochastic compressors, kept in each layer's memory.

A stochastic compressor (QSGD's and TernGrad's stochastic rounding, natural compression, DGC's
sampled threshold, Random-K's indices) draws a layer's random numbers from a named stream: each
step :func:`draw` hands out a fresh ``torch.Generator`` seeded from the stream's key and the
number of draws so far, both kept in ``layer.memory["rng_<name>"]`` as one int64 tensor. So
the stream is checkpointed with the layer (the memory holds tensors only: checkpoints load with
``weights_only=True``) and a resumed run draws exactly what an uninterrupted one would.

The key mixes the compressor's ``seed``, the layer's name and the worker's rank: every worker
has a stream of its own, except for a *shared* stream (Random-K's indices), whose key leaves
the rank out, so that all workers draw the same numbers.

:class:`Stochastic` is the mixin that starts a compressor's streams on a layer's first step,
where the worker's rank is known (``comm.rank``), before the aggregate of the compressor it is
mixed into.
"""

from __future__ import annotations

import zlib
from typing import TYPE_CHECKING, Any, ClassVar

import torch

from compression.comm import Comm, Steps

if TYPE_CHECKING:
    from compression.base import Layer, Sent

PREFIX = "rng_"
MASK = 2**64 - 1


def mix(x: int) -> int:
    """A well-spread 64-bit hash of the integer ``x`` (the SplitMix64 output function, Steele,
    Lea and Flood, OOPSLA 2014)."""
    x = (x + 0x9E3779B97F4A7C15) & MASK
    x = ((x ^ (x >> 30)) * 0xBF58476D1CE4E5B9) & MASK
    x = ((x ^ (x >> 27)) * 0x94D049BB133111EB) & MASK
    return x ^ (x >> 31)


def start(layer: Layer, name: str, seed: int, rank: int | None) -> None:
    """Start the layer's stream ``name`` unless it exists (``rank`` None: shared by every
    worker)."""
    if PREFIX + name not in layer.memory:
        key = mix(mix(mix(seed) ^ zlib.crc32(f"{layer.name}/{name}".encode())) ^ (
            0 if rank is None else rank + 1)) >> 1  # 63 bits: an int64
        layer.memory[PREFIX + name] = torch.tensor([key, 0], dtype=torch.int64)


def draw(layer: Layer, name: str, device: torch.device) -> torch.Generator:
    """The next generator of the layer's stream ``name`` (on ``device``); advances the stream."""
    state = layer.memory[PREFIX + name]
    key, count = state.tolist()
    state[1] += 1
    return torch.Generator(device=device).manual_seed(mix(key ^ mix(count)))


class Stochastic:
    """Mixin for a compressor with random streams: ``streams`` maps each stream's name to
    whether it is shared by every worker (default: one of its own per worker, ``rounding``, for
    stochastic rounding); ``seed`` (an instance attribute) seeds them all."""

    streams: ClassVar[dict[str, bool]] = {"rounding": False}
    seed: int

    def start_streams(self, layers: list[Layer], comm: Comm) -> None:
        """Start the layers' streams that do not exist yet (a compressor with an ``aggregate``
        of its own calls this first)."""
        for layer in layers:
            for name, shared in self.streams.items():
                start(layer, name, self.seed, None if shared else comm.rank)

    def aggregate(self, layers: list[Layer], grads: list[torch.Tensor], comm: Comm
                  ) -> Steps[list[Sent]]:
        self.start_streams(layers, comm)
        sent: Any = yield from super().aggregate(layers, grads, comm)  # type: ignore[misc]
        return sent
