"""One worker's statistics of the epoch so far, kept by the hook (:mod:`compression.hook`).

Per bucket the hook hands :class:`EpochStats`

1. the layers' local gradients: each layer's epoch sum Delta_e += g (Accordion's statistic,
   Algorithm 1: the detector compares ||Delta_e|| of consecutive checks; taken before any
   compression or error feedback) and the first step at which a layer's sum stops being finite
   (a NaN or inf gradient: :meth:`EpochStats.nonfinite`), so that the run stops before such a
   gradient reaches a saved error-feedback memory. On float32 CPU tensors the check is fused
   into the add (:mod:`compression._grad_sum_kernel`, no extra pass); elsewhere a float64 sum of
   each Delta_e is checked on the device and the checks that found it finite are counted there,
   read once at the epoch's end;
2. what this worker sent (:class:`~compression.base.Sent`): the payload bits in all, the wire
   bits, and for the compressed layers the bits by type (conv kernels, FC/LSTM matrices:
   AdaComp's table) beside the same layers in fp32, and the elements a sparsifier chose of
   those it was offered. Counts a compressor keeps on the device (AdaComp's sent elements on
   CUDA) are summed there and read once, when the epoch's metrics are.

It also holds the epoch's compress timer (compute only, not the wait for the network; on CUDA
the GPU's time between CUDA events: :class:`~compression.comm.CudaTimer`) and its step count
(synchronized steps: hook calls on a last bucket). :meth:`EpochStats.state_dict` is all of it,
what a mid-epoch checkpoint keeps (:mod:`training.progress`).

Bits are the payload (32 per element for fp32), not the collective's wire traffic.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch

from compression import _grad_sum_kernel
from compression.base import Layer, Sent
from compression.comm import timer_for

FP32_BITS = 32
LAYER_TYPES = ("conv", "fc")  # per-type accounting (AdaComp's table): ndim >= 3, ndim == 2


def layer_type(shape: torch.Size) -> str:
    """``conv`` for convolution kernels (ndim >= 3); ``fc`` for FC, embedding and LSTM weights."""
    return "conv" if len(shape) >= 3 else "fc"


@dataclass
class _FiniteChecks:
    """Checks of Delta_e of a bucket's layers (``names``), one per step from step ``first`` on:
    ``counts`` (on the device): per layer, how many found it finite."""

    names: list[str]
    first: int
    counts: torch.Tensor
    checks: int = 0


class EpochStats:
    """One worker's sums of the epoch so far (see the module doc) on ``device``;
    ``track_norms``: keep Delta_e (simulated learners: only learner 0 does)."""

    def __init__(self, device: torch.device, track_norms: bool = True) -> None:
        self.track_norms = track_norms
        self.timer = timer_for(device)
        self.grad_sums: dict[str, torch.Tensor] = {}
        self.reset()

    def reset(self) -> None:
        """Start a new epoch's sums: bits, time, steps and each layer's Delta_e."""
        self.bits = 0
        self.wire_bits = 0
        self.bits_dense = 0
        self.type_bits = dict.fromkeys(LAYER_TYPES, 0)  # compressed layers' bits, by type
        self.type_bits_dense = dict.fromkeys(LAYER_TYPES, 0)  # the same layers in fp32
        self.chosen: dict[str, list[int]] = {}  # per layer: elements a sparsifier sent, of all
        self.timer.seconds = 0.0
        self.step = 0  # synchronized steps (hook calls on a last bucket) in this epoch
        self._nonfinite: tuple[int, list[str]] | None = None  # see nonfinite()
        self._finite: list[_FiniteChecks] = []  # checks counted on the device (no kernel)
        self._checking: dict[tuple[str, ...], _FiniteChecks] = {}  # each bucket's current one
        self._tally: dict[tuple[tuple[str, str], ...], torch.Tensor] = {}  # see account
        for g in self.grad_sums.values():
            g.zero_()

    # ---- Delta_e and the non-finite checks ------------------------------------------------
    def accumulate(self, names: list[str], grads: list[torch.Tensor]) -> None:
        """Delta_e += g for each layer of a bucket, noting sums that stop being finite."""
        sums = []  # (layer, float64 sum of its Delta_e) where no kernel checks it
        for name, grad in zip(names, grads, strict=True):
            acc = self.grad_sums.get(name)
            if acc is None:
                acc = self.grad_sums[name] = torch.zeros_like(grad)
            finite = _grad_sum_kernel.add_finite(acc, grad)
            if finite is None:  # no kernel for these tensors: add, then sum (no overflow in fp64)
                acc.add_(grad)
                sums.append((name, acc.sum(dtype=torch.float64)))
            elif not finite:
                self._note_nonfinite(self.step, name)
        if sums:
            self._count_finite([n for n, _ in sums], torch.stack([t for _, t in sums]).isfinite())

    def _count_finite(self, names: list[str], finite: torch.Tensor) -> None:
        """Count, on the device, the layers whose Delta_e this step's check found finite (read
        in :meth:`nonfinite`, no sync per step). A sum that is no longer finite stays so (inf and
        NaN absorb every later add), so the checks that found it finite are its first ones."""
        checks = self._checking.get(tuple(names))
        if checks is None or checks.first + checks.checks != self.step:  # not the next step
            checks = _FiniteChecks(names, self.step, torch.zeros_like(finite, dtype=torch.int64))
            self._checking[tuple(names)] = checks
            self._finite.append(checks)
        checks.counts += finite
        checks.checks += 1

    def nonfinite(self) -> tuple[int, list[str]] | None:
        """The first step of this epoch (0-based) after which some layers' Delta_e were no
        longer finite on this worker, and those layers; None while every sum is finite."""
        if self._finite:  # one read of the epoch's counts
            counts = torch.cat([c.counts for c in self._finite]).tolist()
            for checks in self._finite:
                mine, counts = counts[:len(checks.names)], counts[len(checks.names):]
                for name, finite in zip(checks.names, mine, strict=True):
                    if finite < checks.checks:  # finite at its first `finite` checks only
                        self._note_nonfinite(checks.first + finite, name)
            self._finite, self._checking = [], {}
        return self._nonfinite

    def _note_nonfinite(self, step: int, name: str) -> None:
        if self._nonfinite is None or step < self._nonfinite[0]:
            self._nonfinite = (step, [name])
        elif step == self._nonfinite[0] and name not in self._nonfinite[1]:
            self._nonfinite[1].append(name)

    def grad_norms(self) -> dict[str, float]:
        """||Delta_e|| per layer: L2 norm of the local gradient summed over the epoch so far."""
        return _floats({name: g.norm() for name, g in self.grad_sums.items()})

    # ---- bits ---------------------------------------------------------------------------------
    def account(self, layers: list[Layer], sent: list[Sent]) -> None:
        """Add what this worker sent for a bucket (its dense part, then ``layers``) to the
        epoch's sums. Counts a compressor kept on the device (0-d integer tensors) are summed
        there, per bucket, and read with the others in :meth:`_read_tally`."""
        values: list[tuple[tuple[str, str], Any]] = [(("bits", ""), s.bits) for s in sent]
        values += [(("wire_bits", ""), s.wire_bits) for s in sent]
        for layer, s in zip(layers, sent[len(sent) - len(layers):], strict=True):
            kind = layer_type(layer.shape)
            values.append((("type_bits", kind), s.bits))
            self.type_bits_dense[kind] += FP32_BITS * layer.shape.numel()
            if s.elements is not None:
                self.chosen.setdefault(layer.name, [0, 0])[1] += layer.shape.numel()
                values.append((("chosen", layer.name), s.elements))
        on_device = [(key, v) for key, v in values if isinstance(v, torch.Tensor)]
        for key, value in values:
            if not isinstance(value, torch.Tensor):
                self._add(key, value)
        if on_device:
            keys = tuple(key for key, _ in on_device)
            counts = torch.stack([v.to(torch.int64) for _, v in on_device])
            total = self._tally.get(keys)
            self._tally[keys] = counts if total is None else total.add_(counts)

    def _add(self, key: tuple[str, str], value: int) -> None:
        what, which = key
        if what == "type_bits":
            self.type_bits[which] += value
        elif what == "chosen":
            self.chosen[which][0] += value
        else:
            setattr(self, what, getattr(self, what) + value)

    def _read_tally(self) -> None:
        """Add the counts kept on the device to the epoch's sums: one read for all of them."""
        if self._tally:
            totals = torch.cat(list(self._tally.values())).tolist()
            keys = [key for keys in self._tally for key in keys]
            for key, value in zip(keys, totals, strict=True):
                self._add(key, value)
            self._tally = {}

    # ---- the epoch's metrics and its mid-epoch state -----------------------------------------
    def metrics(self, layer_metrics: dict[str, Any]) -> dict[str, Any]:
        """The epoch's ``comm/*`` and ``time/compress_s``, then ``layer_metrics`` (the hook's
        ``level/*`` and the compressor's per-layer stats: a row keeps this key order), then
        ``sent_fraction/*`` (the elements a sparsifier sent over those offered) and
        ``grad_norm/*``; every value a plain number, read from the device at once."""
        self._read_tally()
        stats: dict[str, Any] = {
            "comm/bits": float(self.bits),
            "comm/wire_bits": float(self.wire_bits),
            "comm/bits_dense": float(self.bits_dense),
            "time/compress_s": self.timer.seconds,
        }
        for kind in LAYER_TYPES:
            stats[f"comm/bits_{kind}"] = float(self.type_bits[kind])
            stats[f"comm/bits_dense_{kind}"] = float(self.type_bits_dense[kind])
        stats.update(layer_metrics)
        for name, (sent, offered) in self.chosen.items():
            stats[f"sent_fraction/{name}"] = sent / offered
        for name, g in self.grad_sums.items():
            stats[f"grad_norm/{name}"] = g.norm()
        return _floats(stats)  # one read of every value still on the device

    def state_dict(self) -> dict[str, Any]:
        """The sums of the epoch so far (Delta_e, bits, sent counts, compress time, steps, the
        first non-finite sum): with the compressor's memories, what continues an epoch that
        stopped at a step boundary (a mid-epoch checkpoint)."""
        self._read_tally()
        return {"grad_sums": {n: g.clone() for n, g in self.grad_sums.items()},
                "bits": self.bits, "wire_bits": self.wire_bits, "bits_dense": self.bits_dense,
                "type_bits": dict(self.type_bits), "type_bits_dense": dict(self.type_bits_dense),
                "chosen": {n: list(c) for n, c in self.chosen.items()},
                "compress_s": self.timer.seconds, "step": self.step,
                "nonfinite": self.nonfinite()}

    def load_state_dict(self, state: dict[str, Any], device: torch.device) -> None:
        """Continue the epoch :meth:`state_dict` saved (after :meth:`reset`), Delta_e on
        ``device``."""
        self.grad_sums = {n: g.to(device).clone() for n, g in state["grad_sums"].items()}
        self.bits, self.wire_bits = state["bits"], state["wire_bits"]
        self.bits_dense = state["bits_dense"]
        self.type_bits = dict(state["type_bits"])
        self.type_bits_dense = dict(state["type_bits_dense"])
        self.chosen = {n: list(c) for n, c in state["chosen"].items()}
        self.timer.seconds, self.step = state["compress_s"], state["step"]
        self._nonfinite = state["nonfinite"]


def _floats(values: dict[str, Any]) -> dict[str, Any]:
    """``values`` with every tensor among them read as a float: one read (one device sync) for
    all of them. Float32 values come out as ``float(t)`` would give them."""
    keys = [k for k, v in values.items() if isinstance(v, torch.Tensor)]
    if not keys:
        return values
    read = torch.stack([values[k].detach().double() for k in keys]).tolist()
    return {**values, **dict(zip(keys, read, strict=True))}
