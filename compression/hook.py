"""The DDP communication hook and its state: the plumbing every compressor shares.

For every bucket DDP hands over (while the backward pass goes on), :func:`comm_hook`

1. adds each layer's local gradient to its epoch sum Delta_e (Accordion's statistic, taken
   before any compression or error feedback),
2. all-reduces the tensors with ndim <= 1 (biases, norm layers) uncompressed, in one call,
3. lets the compressor aggregate the matrix-shaped layers (PowerSGD, Top-K, AdaComp), and
4. counts the bits this worker put into its messages and the time spent compressing.

With ``compressor=none`` the whole bucket goes in one fp32 all-reduce, as DDP does without a
hook. Bits are the payload (32 per element for fp32), not the collective's wire traffic.
"""


import time
from collections.abc import Iterable
from typing import Any

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed import ProcessGroup

from compression.base import Compressor, Layer

FP32_BITS = 32


class HookState:
    """Everything the hook keeps between steps: layers, memories, the epoch's accounting."""

    def __init__(self, compressor: Compressor, named_parameters: Iterable[tuple[str, nn.Parameter]],
                 group: ProcessGroup | None = None) -> None:
        self.compressor = compressor
        self.group = group
        self.world_size = dist.get_world_size(group)
        self.layers: dict[str, Layer] = {}
        self._name_of: dict[int, str] = {}
        for name, param in named_parameters:
            if not param.requires_grad:
                continue
            level = compressor.default_level() if param.ndim > 1 else None
            self.layers[name] = Layer(name, param.shape, level)
            self._name_of[id(param)] = name
        self.grad_sums: dict[str, torch.Tensor] = {}
        self.reset_epoch()

    # ---- levels (the schedulers' API) -------------------------------------------------
    def compressed_layers(self) -> list[str]:
        """Names of the layers the compressor handles (ndim > 1); the rest always go dense."""
        if not self.compressor.compresses:
            return []
        return [n for n, layer in self.layers.items() if len(layer.shape) > 1]

    def set_levels(self, levels: dict[str, Any]) -> None:
        """Set the compression level of some layers; takes effect from the next step."""
        for name, level in levels.items():
            self.layers[name].level = level

    # ---- accounting ---------------------------------------------------------------------
    def reset_epoch(self) -> None:
        """Start a new epoch's sums: bits, time, and each layer's Delta_e."""
        self.bits = 0
        self.bits_dense = 0
        self.compress_s = 0.0
        self.steps = 0
        for g in self.grad_sums.values():
            g.zero_()

    def epoch_stats(self) -> dict[str, float]:
        """The epoch's metrics (``comm/*``, ``time/compress_s``, ``level/*``, ``grad_norm/*``)."""
        stats: dict[str, float] = {
            "comm/bits": float(self.bits),
            "comm/bits_dense": float(self.bits_dense),
            "time/compress_s": self.compress_s,
        }
        for name in self.compressed_layers():
            stats[f"level/{name}"] = self.layers[name].level
        for name, g in self.grad_norms().items():
            stats[f"grad_norm/{name}"] = g
        return stats

    def grad_norms(self) -> dict[str, float]:
        """||Delta_e|| per layer: L2 norm of the local gradient summed over the epoch so far."""
        return {name: float(g.norm()) for name, g in self.grad_sums.items()}

    # ---- checkpoint ---------------------------------------------------------------------
    def state_dict(self) -> dict[str, Any]:
        """Levels and memories of every layer (this worker's; memories differ across workers)."""
        return {name: {"level": layer.level, "memory": dict(layer.memory)}
                for name, layer in self.layers.items()}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore what :meth:`state_dict` saved."""
        for name, saved in state.items():
            self.layers[name].level = saved["level"]
            self.layers[name].memory = dict(saved["memory"])

    # ---- used by the hook ---------------------------------------------------------------
    def _accumulate(self, names: list[str], grads: list[torch.Tensor]) -> None:
        for name, grad in zip(names, grads, strict=True):
            acc = self.grad_sums.get(name)
            if acc is None:
                self.grad_sums[name] = grad.detach().clone()
            else:
                acc.add_(grad)


def comm_hook(state: HookState, bucket: dist.GradBucket) -> torch.futures.Future[torch.Tensor]:
    """DDP communication hook: aggregate one bucket with ``state.compressor``."""
    buffer = bucket.buffer()
    grads = bucket.gradients()
    names = [state._name_of[id(p)] for p in bucket.parameters()]
    state._accumulate(names, grads)
    state.steps += bucket.is_last()
    state.bits_dense += FP32_BITS * buffer.numel()
    world = state.world_size

    if not state.compressor.compresses:
        state.bits += FP32_BITS * buffer.numel()
        work = dist.all_reduce(buffer, group=state.group, async_op=True)
        return work.get_future().then(lambda fut: fut.value()[0].div_(world))

    start = time.perf_counter()
    dense = [g for g in grads if g.ndim <= 1]
    layers = []
    for name, grad in zip(names, grads, strict=True):
        if grad.ndim > 1:
            layer = state.layers[name]
            layer.grad = grad
            layers.append(layer)
    futures = []
    if dense:
        flat = torch.cat([g.reshape(-1) for g in dense])
        state.bits += FP32_BITS * flat.numel()
        work = dist.all_reduce(flat, group=state.group, async_op=True)

        def unflatten(fut: torch.futures.Future) -> None:
            out = fut.value()[0].div_(world)
            offset = 0
            for g in dense:
                g.copy_(out[offset:offset + g.numel()].view_as(g))
                offset += g.numel()

        futures.append(work.get_future().then(unflatten))
    if layers:

        def count(fut: torch.futures.Future[list[int]]) -> None:
            state.bits += sum(fut.value())
            for layer in layers:
                layer.grad = None

        futures.append(state.compressor.reduce(layers, state.group, world).then(count))
    state.compress_s += time.perf_counter() - start
    return torch.futures.collect_all(futures).then(lambda _: buffer)
