"""Run a compressor on simulated workers in one process: no ``torch.distributed`` needed.

    out = compression.simulate("topk", steps, ratio=0.1)
    for aggregate, bits in out: ...   # per step: what every worker applies, bits per worker

The simulated workers run the very code of the DDP hook (:func:`~compression.hook.
aggregate_bucket` and the compressor's steps); only the collectives differ: an in-memory
:class:`~compression.comm.SimComm` instead of a process group.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch

from compression.base import Layer, Sent
from compression.comm import SimComm, drive
from compression.hook import aggregate_bucket


class Simulation:
    """``world_size`` simulated workers compressing one layer of ``shape`` with compressor
    ``name`` (its config keys as ``params``). ``layer_name`` names the layer as the model's
    parameter would be named (PowerSGD seeds the layer's initial Q with it). ``layers[w]`` is
    worker w's layer record (level, memory), as the hook would keep it; read a memory through
    :meth:`memory`."""

    def __init__(self, name: str, world_size: int, shape: Sequence[int], *,
                 layer_name: str = "layer", **params: Any) -> None:
        from compression import create  # the registry imports this module

        if world_size < 1:
            raise ValueError(f"world_size: expected >= 1, got {world_size}")
        self.compressor = create(name, **params)
        self.shape = torch.Size(shape)
        self.compressed = self.compressor.compresses and len(self.shape) > 1
        level = self.compressor.default_level(self.shape) if self.compressed else None
        self.layers = [Layer(layer_name, self.shape, level) for _ in range(world_size)]
        self.comms = SimComm.group(world_size)
        self.sent: list[list[Sent]] = []  # the last step's, per worker: dense part, then layer

    def set_level(self, level: Any) -> None:
        """Set the layer's compression level on every worker (from the next step)."""
        level = self.compressor.validate_level(level)
        for layer in self.layers:
            self.compressor.set_level(layer, level)

    def memory(self, worker: int) -> dict[str, torch.Tensor]:
        """Worker ``worker``'s compressor memory (error feedback, residue, Q), settled: any
        update the compressor deferred to the next step is applied first."""
        self.compressor.settle(self.layers[worker])
        return self.layers[worker].memory

    def step(self, grads: Sequence[torch.Tensor]) -> tuple[torch.Tensor, list[int]]:
        """One step: each worker's local gradient in; the aggregate and each worker's bits out."""
        if len(grads) != len(self.layers):
            raise ValueError(f"steps: expected one gradient per worker ({len(self.layers)}), got "
                             f"{len(grads)}")
        outputs, futures = [], []
        for layer, comm, g in zip(self.layers, self.comms, grads, strict=True):
            if g.shape != self.shape:
                raise ValueError(f"steps: every gradient must have shape {tuple(self.shape)}, got "
                                 f"{tuple(g.shape)}")
            grad = g.detach().to(torch.float32, copy=True).contiguous()
            dense, layers, grads = ([], [layer], [grad]) if self.compressed else ([grad], [], [])
            outputs.append(grad)
            futures.append(drive(aggregate_bucket(self.compressor, dense, layers, grads, comm)))
        if not all(f.done() for f in futures):
            raise RuntimeError("simulated workers did not finish the step together")
        self.sent = [f.value() for f in futures]
        return outputs[0], [sum(s.bits for s in sent) for sent in self.sent]


def simulate(name: str, steps: Sequence[Sequence[torch.Tensor]], **params: Any
             ) -> list[tuple[torch.Tensor, list[int]]]:
    """Compress one layer's gradients on simulated workers, step after step.

    ``steps[t][w]`` is worker w's gradient at step t (one shape throughout); ``params`` are the
    compressor's config keys (``rank=2``, ``ratio=0.1``, ...; bad ones raise a ConfigError).
    Returns, per step, the aggregated gradient every worker applies and the bits each worker
    sent. Memories (error feedback, residues, warm-start Q) carry over from step to step.
    """
    if not steps or not steps[0]:
        raise ValueError("steps: expected a non-empty list (over time) of non-empty lists "
                         "(over workers) of gradients")
    sim = Simulation(name, len(steps[0]), steps[0][0].shape, **params)
    return [sim.step(grads) for grads in steps]
