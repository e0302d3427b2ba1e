"""Gradient noise and compression error, measured on chosen steps of a data-parallel run.

What ``scheduler=accordion_auto`` and ``accordion_batch_auto`` choose their endpoints from
(:mod:`schedulers.accordion_auto`). On a measured step worker w has its local gradient g_w (of
its B / W examples, before compression and error feedback) and the step computes the mean
g = (1/W) sum_w g_w. Per measured tensor (the compressed layers; every parameter where the
compressor does not compress), summed over the measured steps::

    local_sq = (1/W) sum_w ||g_w||^2
    mean_sq  = ||g||^2
    dev_sq   = sum_w ||g_w - g||^2           (W - 1) tr(Sigma_b): Sigma_b the covariance of
                                              one worker's gradient (unbiased)

and per compressed layer and candidate level c::

    corrected_sq = (1/W) sum_w ||M_w||^2           M_w = g_w + e_w, the error-corrected gradient
                                                  (e_w: the worker's error-feedback memory; 0
                                                  for a compressor without one)
    error[c] = (1/W) sum_w ||C_c(M_w) - M_w||^2
    bits[c]  = (1/W) sum_w the payload bits of C_c's message (``Sent.bits``)

C_c(M_w) is what the compressor itself applies for the layer at level c when it runs on this
worker's gradient and a copy of its memory alone (a one-worker :class:`~compression.comm.
SimComm`): PowerSGD's P Q^T of one power step from the warm-start Q, Top-K's kept entries,
AdaComp's G_q, EF-signSGD's scaled signs. Any compressor with levels works; the layer's own
memory is never touched, so measuring changes no result.

The mean g: without compression (``compressor=none``) it is the step's own aggregate, read once
the bucket holds it (free). With compression the aggregate is not the mean, so the probe
all-reduces a sample of each tensor's coordinates: k = max(``sample`` n, MIN_SAMPLE) of its n
(all of a smaller tensor), the same on every rank (a generator seeded with the epoch, the step
and the tensor's name), and scales the three sums by n / k (unbiased estimates of sums over
coordinates; ``local_sq`` comes from the same sample, so the three stay consistent).

Cost per measured step and bucket: that sample's all-reduce (32 bits a coordinate) and one
all-gather of every worker's scalars (64 bits each), counted in :attr:`NoiseProbe.bits`, and
one extra compression per candidate level (compute the hook times, in ``time/compress_s``).
Every worker's scalars are all-gathered and summed in rank order on every rank, so every rank
holds bit-identical results and the schedulers decide alike without a broadcast.
"""

from __future__ import annotations

import math
import zlib
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import torch

from compression.base import Layer
from compression.comm import SimComm, Steps, drive
from compression.stats import FP32_BITS

if TYPE_CHECKING:
    from compression.hook import HookState

MIN_SAMPLE = 256  # coordinates of a tensor the mean is sampled at, at least (all if fewer)
FP64_BITS = 64
SQUARES = 3       # local_sq, dev_sq, mean_sq


@dataclass
class TensorStats:
    """One tensor's measurements, averaged over the measured steps (see the module doc)."""

    local_sq: float
    dev_sq: float
    mean_sq: float
    corrected_sq: float = 0.0  # compressed layers measured at candidate levels only
    error: list[float] = field(default_factory=list)  # per candidate level, in probe order
    bits: list[float] = field(default_factory=list)


@dataclass
class Measurement:
    """What a probe measured over an epoch's measured steps."""

    world_size: int
    steps: int
    probe_bits: float
    tensors: dict[str, TensorStats]


def sample_index(n: int, fraction: float, epoch: int, step: int, name: str
                 ) -> torch.Tensor | None:
    """The coordinates of a tensor of ``n`` elements the mean is sampled at on this step (None:
    all of them), the same on every rank."""
    k = max(math.ceil(fraction * n), MIN_SAMPLE)
    if k >= n:
        return None
    # One 32-bit seed: torch's CPU generator (mt19937) keeps only the low 32 bits of a seed.
    generator = torch.Generator().manual_seed(zlib.crc32(f"{epoch}/{step}/{name}".encode()))
    return torch.randperm(n, generator=generator)[:k]


def squares(local: torch.Tensor, mean: torch.Tensor, scale: float) -> list[float]:
    """||g_w||^2, ||g_w - g||^2, ||g||^2 in float64, times ``scale`` (n / k of a sample)."""
    local, mean = local.double(), mean.double()
    return [scale * float(local.dot(local)), scale * float((local - mean).square().sum()),
            scale * float(mean.dot(mean))]


class NoiseProbe:
    """A :class:`~compression.hook.Probe`: the statistics of the module doc on the first
    ``steps`` steps of the epochs ``epochs(epoch)`` chooses; compression errors at ``levels``
    (none: the noise only); ``sample``: the fraction of coordinates of the mean sampled when the
    compressor compresses."""

    def __init__(self, epochs: Callable[[int], bool], steps: int, levels: Sequence[Any] = (),
                 sample: float = 1 / 16) -> None:
        self.epochs, self.steps = epochs, steps
        self.levels = list(levels)
        self.sample = sample
        self._shadows: dict[tuple[str, Any], Layer] = {}  # the scratch buffers' owners
        self._names: list[str] = []  # this bucket's measured tensors
        self._local: list[tuple[torch.Tensor, float]] = []  # their gradients (sample), n / k
        self._errors: list[float] = []
        self.reset()

    def reset(self) -> None:
        """Forget the sums."""
        self.sums: dict[str, list[float]] = {}  # name -> [3 squares, errors, bits], summed
        self.counts: dict[str, int] = {}        # name -> measured steps
        self.bits = 0.0                          # what the probe's collectives carried
        self.world_size = 0                      # the workers that measured (0: none yet)

    def active(self, epoch: int, step: int) -> bool:
        """The first ``steps`` steps of a chosen epoch."""
        return step < self.steps and self.epochs(epoch)

    def before(self, state: HookState, names: list[str], grads: list[torch.Tensor]
               ) -> Steps[None]:
        """Keep this worker's gradients of the measured tensors (a sample of their coordinates
        where the compressor compresses) and measure the compression error of every candidate
        level."""
        compresses = state.compressor.compresses
        targets = set(state.compressed_layers()) if compresses else set(names)
        chosen = [(n, g) for n, g in zip(names, grads, strict=True) if n in targets]
        self._names = [n for n, _ in chosen]
        self._local = []
        for name, grad in chosen:
            flat = grad.detach().reshape(-1)
            index = (sample_index(flat.numel(), self.sample, state.epoch, state.stats.step, name)
                     if compresses else None)
            local = flat.clone() if index is None else flat[index.to(flat.device)]
            self._local.append((local, flat.numel() / local.numel()))
        self._errors = self._compression_errors(state, chosen) if compresses else []
        yield from ()

    def after(self, state: HookState, names: list[str], grads: list[torch.Tensor]
              ) -> Steps[None]:
        """The mean (the aggregate, or the sample's all-reduce), the squares, and the all-gather
        of every worker's scalars, summed into the epoch's sums."""
        if not self._names:  # no measured tensor in this bucket
            return
        world = state.comm.world_size
        if state.compressor.compresses:
            summed = yield state.comm.all_reduce(torch.cat([x for x, _ in self._local]))
            self.bits += FP32_BITS * summed.numel()
            means = summed.div_(world).split([x.numel() for x, _ in self._local])
        else:
            mean_of = dict(zip(names, grads, strict=True))
            means = [mean_of[n].detach().reshape(-1) for n in self._names]
        scalars = []
        for (local, scale), mean in zip(self._local, means, strict=True):
            scalars += squares(local, mean, scale)
        scalars += self._errors
        mine = torch.tensor(scalars, dtype=torch.float64, device=grads[0].device)
        parts = (yield state.comm.all_gather(mine)).view(world, -1).tolist()
        self.bits += FP64_BITS * mine.numel()
        self.world_size = world
        self._add(parts)
        self._local, self._errors = [], []

    def _add(self, parts: list[list[float]]) -> None:
        """Add one bucket's gathered scalars (rows: workers, in rank order) to the sums."""
        world, per_layer = len(parts), 1 + 2 * len(self.levels)
        errors = SQUARES * len(self._names)
        for i, name in enumerate(self._names):
            column = [row[SQUARES * i:SQUARES * (i + 1)] for row in parts]
            values = [sum(c[0] for c in column) / world, sum(c[1] for c in column),
                      column[0][2]]
            if self._errors:  # corrected_sq, errors, bits: each the mean over workers
                at = errors + per_layer * i
                values += [sum(row[at + j] for row in parts) / world for j in range(per_layer)]
            sums = self.sums.setdefault(name, [0.0] * len(values))
            self.sums[name] = [s + v for s, v in zip(sums, values, strict=True)]
            self.counts[name] = self.counts.get(name, 0) + 1

    def _compression_errors(self, state: HookState, named: list[tuple[str, torch.Tensor]]
                            ) -> list[float]:
        """Per compressed layer ``named`` (name, gradient): ||M||^2, ||C_c(M) - M||^2 for each
        candidate c, then the bits of each, from copies of the layer and its memory on a
        one-worker group (nothing without candidates)."""
        compressor = state.compressor
        chosen = [(state.layers[n], g) for n, g in named]
        if not self.levels:
            return []
        errors: list[list[float]] = [[] for _ in chosen]
        bits: list[list[float]] = [[] for _ in chosen]
        corrected_sq = [0.0] * len(chosen)  # ||M||^2: the same at every level
        for level in self.levels:
            shadows = [self._shadow(compressor, layer, level) for layer, _ in chosen]
            outs = [g.detach().clone() for _, g in chosen]
            corrected = []
            for shadow, out in zip(shadows, outs, strict=True):
                memory = compressor.error(shadow)  # e, settled (None without error feedback)
                corrected.append(out.clone() if memory is None else out + memory)
            done = drive(compressor.aggregate(shadows, outs, SimComm.group(1)[0]))
            for i, (out, m, sent) in enumerate(zip(outs, corrected, done.value(), strict=True)):
                errors[i].append(float((out.double() - m.double()).square().sum()))
                corrected_sq[i] = float(m.double().square().sum())
                bits[i].append(float(sent.bits))
            for shadow in shadows:
                shadow.memory = {}
        return [x for m, layer_errors, layer_bits in zip(corrected_sq, errors, bits, strict=True)
                for x in (m, *layer_errors, *layer_bits)]

    def _shadow(self, compressor: Any, layer: Layer, level: Any) -> Layer:
        """A copy of ``layer`` (level, memory) set to ``level``; the same object each time,
        so that the compressor's scratch buffers, kept per owner, are reused."""
        shadow = self._shadows.setdefault((layer.name, level), Layer(layer.name, layer.shape))
        shadow.level = layer.level
        shadow.memory = {k: v.clone() for k, v in layer.memory.items()}
        compressor.set_level(shadow, level)
        return shadow

    def take(self) -> Measurement:
        """The sums as means over the measured steps; the probe starts over."""
        levels = len(self.levels)
        tensors = {}
        for name, sums in self.sums.items():
            mean = [s / self.counts[name] for s in sums]
            if len(mean) == SQUARES:
                tensors[name] = TensorStats(*mean)
            else:
                tensors[name] = TensorStats(*mean[:SQUARES + 1],
                                            mean[SQUARES + 1:SQUARES + 1 + levels],
                                            mean[SQUARES + 1 + levels:])
        steps = max(self.counts.values(), default=0)
        out = Measurement(self.world_size, steps, self.bits, tensors)
        self.reset()
        return out

    def state_dict(self) -> dict[str, Any]:
        """The sums so far (plain numbers): a mid-epoch checkpoint keeps them."""
        return {"sums": {n: list(s) for n, s in self.sums.items()}, "counts": dict(self.counts),
                "bits": self.bits, "world_size": self.world_size}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore :meth:`state_dict`."""
        self.sums = {n: list(s) for n, s in state["sums"].items()}
        self.counts = dict(state["counts"])
        self.bits = float(state["bits"])
        self.world_size = int(state["world_size"])
