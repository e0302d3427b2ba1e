"""The zoo's compressors in ``make bench-compressors`` (benchmarks/compressors.py), each beside
its nearest peer: PyTorch's own DDP hooks for the 16-bit casts, and for the others (no package
installed here implements them) a plain torch version of the same math, named as such: the
quantization or selection and the reconstruction of one worker's gradient, without error
feedback, message packing, bit accounting or random streams.

Each of ours runs at the light and the heavy level of its ``accordion_levels`` (or its only
one); a row reports its whole step over the peer's (``x peer``). No targets: these are
measurements, not goals.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

import torch
from torch.distributed.algorithms.ddp_comm_hooks import default_hooks

import compression

Peer = Callable[[torch.Tensor], None]  # replaces one (matrix-shaped) gradient in place
ZOO = ("qsgd", "terngrad", "dgc", "randomk", "signsgd", "signum", "onebit", "natural")
HOOKS = {"fp16": default_hooks.fp16_compress_hook, "bf16": default_hooks.bf16_compress_hook}


def qsgd(levels: int, bucket: int = 512) -> Peer:
    def step(g: torch.Tensor) -> None:
        flat = g.view(-1)
        n = flat.numel()
        v = torch.nn.functional.pad(flat, (0, -n % bucket)).view(-1, bucket)
        norms = v.norm(dim=1, keepdim=True)
        ratio = v.abs() * levels / norms.clamp_min(1e-30)
        q = (ratio.floor() + (torch.rand_like(ratio) < ratio - ratio.floor())) / levels
        flat.copy_((norms * torch.sign(v) * q).view(-1)[:n])
    return step


def terngrad(block: int) -> Peer:
    def step(g: torch.Tensor) -> None:
        flat = g.view(-1)
        n = flat.numel()
        width = min(block, n)
        v = torch.nn.functional.pad(flat, (0, -n % width)).view(-1, width)
        s = v.abs().amax(1, keepdim=True)
        keep = torch.rand_like(v) < v.abs() / s.clamp_min(1e-30)
        flat.copy_((s * torch.sign(v) * keep).view(-1)[:n])
    return step


def dgc(ratio: float, sample_ratio: float = 0.01) -> Peer:
    def step(g: torch.Tensor) -> None:
        flat = g.view(-1)
        n, k = flat.numel(), max(1, math.floor(ratio * flat.numel()))
        magnitude = flat.abs()
        sample = magnitude[torch.randint(n, (max(1, math.ceil(n * sample_ratio)),))]
        threshold = torch.topk(sample, max(1, math.ceil(sample.numel() * ratio))).values.min()
        index = (magnitude >= threshold).nonzero().squeeze(1)
        if index.numel() > k:
            index = index[torch.topk(magnitude[index], k).indices]
        values = flat[index]
        flat.zero_()[index] = values
    return step


def randomk(ratio: float) -> Peer:
    def step(g: torch.Tensor) -> None:
        flat = g.view(-1)
        index = torch.randperm(flat.numel())[:max(1, math.floor(ratio * flat.numel()))]
        values = flat[index]
        flat.zero_()[index] = values
    return step


def signsgd(momentum: float = 0.0) -> Peer:
    buffers: dict[int, torch.Tensor] = {}

    def step(g: torch.Tensor) -> None:
        if momentum:
            v = buffers.setdefault(id(g), torch.zeros_like(g))
            v.mul_(momentum).add_(g, alpha=1 - momentum)
            g.copy_(v)
        torch.sign(g, out=g)
    return step


def onebit(block: int | None) -> Peer:
    def step(g: torch.Tensor) -> None:
        rows = g.view(-1, block or g[0].numel()) if g.numel() % (block or 1) == 0 else None
        rows = g.view(g.shape[0], -1) if rows is None else rows
        positive = rows >= 0
        for side in (positive, ~positive):
            mean = (rows * side).sum(1, keepdim=True) / side.sum(1, keepdim=True).clamp_min(1)
            rows.copy_(torch.where(side, mean, rows))
    return step


def natural() -> Peer:
    def step(g: torch.Tensor) -> None:
        low = torch.exp2(torch.floor(torch.log2(g.abs())))
        up = torch.rand_like(g) < (g.abs() - low) / low
        g.copy_(torch.where(g == 0, 0.0, torch.sign(g) * low * (1 + up)))
    return step


PEERS: dict[str, Callable[..., Peer]] = {"qsgd": qsgd, "terngrad": terngrad, "dgc": dgc,
                                         "randomk": randomk, "signsgd": signsgd,
                                         "signum": lambda: signsgd(0.9), "onebit": onebit,
                                         "natural": natural}


def plain_torch(name: str, level: Any, grads: list[torch.Tensor]) -> Callable[[], None]:
    """One step of the plain torch ``name`` at ``level`` over the matrix-shaped ``grads``."""
    peer = PEERS[name]() if level is None else PEERS[name](level)
    matrices = [g for g in grads if g.ndim > 1]
    return lambda: [peer(g) for g in matrices] and None


def pytorch_hook(name: str, buckets: list[Any]) -> Callable[[], None]:
    """One step of PyTorch's ``name`` (fp16 / bf16) DDP hook over every bucket."""
    hook = HOOKS[name]
    return lambda: [hook(None, b).wait() for b in buckets] and None


def levels(name: str) -> list[Any]:
    """The levels a compressor is timed at: light and heavy, or None (its only one)."""
    pair = compression.create(name).accordion_levels
    return [None] if pair is None else list(pair)


def add_zoo(methods: dict[str, Callable[[], None]], rows: list[dict[str, Any]],
            ours: Callable[..., Callable[[], None]], buckets: list[Any]) -> None:
    """Add every zoo compressor and its peer to ``methods`` and ``rows`` (the format of
    benchmarks/compressors.py); ``ours(name, **params)`` makes our method."""
    grads = [g for b in buckets for g in b.gradients()]
    for name in (*ZOO, *HOOKS):
        for level in levels(name):
            cls = type(compression.create(name))
            params = {} if level is None else {cls.level_field: level}
            shown = "-" if level is None else f"{cls.level_field} {level}"
            key = f"{name}{'' if level is None else level}"
            methods[key] = ours(name, **params)
            if name in HOOKS:
                methods[f"peer-{key}"] = pytorch_hook(name, buckets)
                label = f"PyTorch {HOOKS[name].__name__}"
            else:
                methods[f"peer-{key}"] = plain_torch(name, level, grads)
                label = f"plain torch {name} (no error feedback, no message)"
            rows.append({"key": key, "method": f"ours {name}", "level": shown,
                         "peer": f"peer-{key}", "target": ""})
            rows.append({"key": f"peer-{key}", "method": label, "level": shown, "peer": None,
                         "target": ""})
