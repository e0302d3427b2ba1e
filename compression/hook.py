"""The DDP communication hook and its state: the plumbing every compressor shares.

For every bucket DDP hands over (while the backward pass goes on), :func:`comm_hook`

1. adds each layer's local gradient to its epoch sum Delta_e (Accordion's statistic, taken
   before any compression or error feedback) and notes the first step at which a layer's sum
   stops being finite (a NaN or inf gradient: :meth:`HookState.nonfinite`), so that the run
   stops before such a gradient reaches a saved error-feedback memory. On float32 CPU tensors
   the check is fused into the add (:mod:`compression._grad_sum_kernel`, no extra pass);
   elsewhere a float64 sum of each Delta_e is checked on the device and the checks that found
   it finite are counted there, read once at the epoch's end,
2. runs :func:`aggregate_bucket`: the tensors with ndim <= 1 (biases, norm layers) go
   uncompressed in one all-reduce, the matrix-shaped layers through the compressor, and
   On the steps that ``observe.overlap_epochs`` chooses, an :class:`~compression.overlap.
   OverlapProbe` first gathers every worker's local gradients of the bucket and measures the
   overlap of their top-k supports (Accordion's Fig. 4a; :mod:`compression.overlap`). On the
   steps a :class:`Probe` added with :meth:`HookState.add_probe` chooses, the probe sees the
   bucket before the compressor changes it and again once it holds the mean (e.g. the gradient
   noise and compression error of :mod:`compression.noise`),
3. counts the bits this worker put into its messages (in all, and for the compressed layers by
   type: conv kernels, FC/LSTM matrices) and the time spent compressing and decompressing
   (compute only, not the wait for the network). Counts a compressor keeps on the device
   (AdaComp's sent elements on CUDA) are summed there and read once, when the epoch's metrics
   are; on CUDA the time is the GPU's, between CUDA events (:class:`~compression.comm.
   CudaTimer`).

With ``compressor=none`` the whole bucket goes in one fp32 all-reduce, as DDP does without a
hook. Bits are the payload (32 per element for fp32), not the collective's wire traffic.

A bucket's collectives are started only after the previous bucket's have finished. DDP calls
the hook in the same bucket order on every rank, but a compressor starts its later collectives
from completion callbacks, whose timing differs across ranks; chaining the buckets keeps the
order of collectives identical on every rank, which gloo and NCCL require.

On CUDA the hook's work runs as PyTorch's own hooks run it: it never makes the backward pass
wait for a bucket's communication. NCCL completes a collective's future when it queues the
collective, so every step of the compressor runs inline in the hook call, queued on a CUDA
stream of the hook's own (:meth:`HookState.aggregate`), each after the collective it needs; the
backward stream waits for that stream only once, when DDP waits for the buckets' futures at the
end of backward.
"""

# No `from __future__ import annotations` here: DDP checks comm_hook's annotations at runtime.
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any, Protocol

import torch
import torch.distributed as dist
from torch import nn
from torch._utils import _flatten_dense_tensors, _unflatten_dense_tensors
from torch.distributed import ProcessGroup
from torch.futures import Future

from compression import _grad_sum_kernel
from compression.base import Compressor, Layer, Sent
from compression.comm import Comm, GroupComm, Pending, Steps, drive, timer_for
from compression.overlap import OverlapProbe
from core.errors import ConfigError

FP32_BITS = 32
LAYER_TYPES = ("conv", "fc")  # per-type accounting (AdaComp's table): ndim >= 3, ndim == 2


def layer_type(shape: torch.Size) -> str:
    """``conv`` for convolution kernels (ndim >= 3); ``fc`` for FC, embedding and LSTM weights."""
    return "conv" if len(shape) >= 3 else "fc"


def aggregate_bucket(compressor: Compressor, dense: list[torch.Tensor], layers: list[Layer],
                     grads: list[torch.Tensor], comm: Comm) -> Steps[list[Sent]]:
    """Steps that replace every gradient of a bucket by the mean over workers.

    ``dense`` tensors go uncompressed in one all-reduce (one tensor is reduced in place, several
    through a flat copy); ``layers`` (with this worker's gradients ``grads``) through
    ``compressor``. Returns what this worker sent: one entry for the dense tensors together,
    then one per layer.
    """
    world = comm.world_size
    flat, reduced = None, None
    if dense:
        flat = dense[0] if len(dense) == 1 else _flatten_dense_tensors(dense)
        reduced = comm.all_reduce(flat)  # started first: it overlaps the compressor's work
    sent = (yield from compressor.aggregate(layers, grads, comm)) if layers else []
    if flat is None:
        return sent
    mean = (yield reduced).div_(world)
    if len(dense) > 1:
        torch._foreach_copy_(dense, _unflatten_dense_tensors(mean, dense))
    bits = FP32_BITS * flat.numel()
    return [Sent(bits, bits), *sent]


@dataclass
class _FiniteChecks:
    """Checks of Delta_e of a bucket's layers (``names``), one per step from step ``first`` on:
    ``counts`` (on the device): per layer, how many found it finite."""

    names: list[str]
    first: int
    counts: torch.Tensor
    checks: int = 0


class Probe(Protocol):
    """A measurement the hook takes on the steps the probe chooses (every rank adds the same
    probes in the same order, so their collectives line up). Both calls are steps of the
    bucket's own chain (:mod:`compression.comm`): they may start collectives."""

    def active(self, epoch: int, step: int) -> bool:
        """Whether step ``step`` (0-based) of ``epoch`` is measured."""
        ...

    def before(self, state: "HookState", names: list[str], grads: list[torch.Tensor]
               ) -> Steps[None]:
        """The bucket's local gradients ``grads`` (of the parameters ``names``), before the
        compressor reads them or changes any memory; read only."""
        ...

    def after(self, state: "HookState", names: list[str], grads: list[torch.Tensor]
              ) -> Steps[None]:
        """The same tensors once they hold the mean over workers (what the optimizer applies)."""
        ...


class HookState:
    """Everything the hook keeps between steps: layers, memories, the epoch's accounting."""

    def __init__(self, compressor: Compressor, named_parameters: Iterable[tuple[str, nn.Parameter]],
                 group: ProcessGroup | None = None, comm: Comm | None = None,
                 track_norms: bool = True, overlap: OverlapProbe | None = None) -> None:
        self.compressor = compressor
        self.overlap = overlap  # the top-k support overlap, at chosen epochs (None: off)
        self.comm = comm or GroupComm(group)  # a SimComm for simulated workers
        self.world_size = self.comm.world_size
        self.track_norms = track_norms  # keep Delta_e (simulated workers: only worker 0)
        self.layers: dict[str, Layer] = {}
        self._name_of: dict[int, str] = {}
        self.device: torch.device | None = None  # the parameters' (DDP: one device per rank)
        for name, param in named_parameters:
            if not param.requires_grad:
                continue
            self.device = self.device or param.device
            level = compressor.default_level(param.shape) if param.ndim > 1 else None
            self.layers[name] = Layer(name, param.shape, level)
            self._name_of[id(param)] = name
        self._compressed = set(self.compressed_layers())
        self.probes: list[Probe] = []  # measurements on chosen steps (add_probe)
        if overlap is not None:
            overlap.expect([n for n, layer in self.layers.items() if len(layer.shape) > 1])
        self.grad_sums: dict[str, torch.Tensor] = {}
        self.epoch = 0  # the epoch being trained (reset_epoch's)
        self.device = self.device or torch.device("cpu")
        self.timer = timer_for(self.device)
        # On CUDA with a process group, the stream the compressor's work is queued on (see
        # aggregate); simulated workers complete their collectives in place, on the current one.
        self._stream = (torch.cuda.Stream(device=self.device) if self.device.type == "cuda"
                        and isinstance(self.comm, GroupComm) else None)
        self._previous: Future = Future()  # the last bucket's completion (see the module doc)
        self._previous.set_result(None)
        self.reset_epoch()

    # ---- levels (the schedulers' API) -------------------------------------------------
    def compressed_layers(self) -> list[str]:
        """Names of the layers the compressor handles (ndim > 1); the rest always go dense."""
        if not self.compressor.compresses:
            return []
        return [n for n, layer in self.layers.items() if len(layer.shape) > 1]

    def set_levels(self, levels: dict[str, Any]) -> None:
        """Set the compression level of some layers; takes effect from the next step.

        Every rank must set the same levels at the same step. A bad level or a layer that is not
        compressed raises a ConfigError naming ``level/<layer>``.
        """
        for name, level in levels.items():
            if name not in self._compressed:
                raise ConfigError(f"level/{name}: not a compressed layer; choose one of "
                                  f"{sorted(self._compressed)}")
            self.compressor.set_level(self.layers[name],
                                      self.compressor.validate_level(level, f"level/{name}"))

    def add_probe(self, make: Callable[[], Probe]) -> Probe:
        """Take the measurement ``make()`` on the steps it chooses, from the next step on;
        returns it (simulated learners: one per learner, learner 0's returned)."""
        probe = make()
        self.probes.append(probe)
        return probe

    # ---- accounting ---------------------------------------------------------------------
    def reset_epoch(self, epoch: int | None = None) -> None:
        """Start a new epoch's sums: bits, time, and each layer's Delta_e (``epoch``: the epoch
        about to be trained, for the measurements taken at chosen epochs)."""
        if epoch is not None:
            self.epoch = epoch
        if self.overlap is not None:
            self.overlap.reset()
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
        self._tally: dict[tuple[tuple[str, str], ...], torch.Tensor] = {}  # see _account
        for g in self.grad_sums.values():
            g.zero_()

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

    def epoch_stats(self) -> dict[str, float]:
        """The epoch's metrics: ``comm/*``, ``time/compress_s``, ``level/*``, ``grad_norm/*``,
        ``sent_fraction/*`` (sparsifiers: the elements sent over those offered), the
        compressor's own per-layer ``layer_stats`` and, on measured epochs, ``overlap/*`` and
        ``overlap_batch/*`` (:mod:`compression.overlap`)."""
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
        for name in self.compressed_layers():
            stats[f"level/{name}"] = self.layers[name].level
            for key, value in self.compressor.layer_stats(self.layers[name]).items():
                stats[f"{key}/{name}"] = value
        for name, (sent, offered) in self.chosen.items():
            stats[f"sent_fraction/{name}"] = sent / offered
        for name, g in self.grad_sums.items():
            stats[f"grad_norm/{name}"] = g.norm()
        stats = _floats(stats)  # one read of every value still on the device
        if self.overlap is not None:
            stats.update(self.overlap.stats())
        return stats

    def grad_norms(self) -> dict[str, float]:
        """||Delta_e|| per layer: L2 norm of the local gradient summed over the epoch so far."""
        return _floats({name: g.norm() for name, g in self.grad_sums.items()})

    # ---- checkpoint ---------------------------------------------------------------------
    def state_dict(self) -> dict[str, Any]:
        """Levels and memories of every layer (this worker's; memories differ across workers).

        Tensors are copies: training on does not change a saved state.
        """
        for layer in self.layers.values():
            self.compressor.settle(layer)
        return {"compressor": self.compressor.name,
                "layers": {name: {"level": layer.level,
                                  "memory": {k: v.clone() for k, v in layer.memory.items()}}
                           for name, layer in self.layers.items()}}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore what :meth:`state_dict` saved (from a run with the same compressor)."""
        if state["compressor"] != self.compressor.name:
            raise ConfigError(f"resume: the checkpoint was written with compressor "
                              f"{state['compressor']!r}, not {self.compressor.name!r}")
        for name, saved in state["layers"].items():
            self.layers[name].level = saved["level"]
            self.layers[name].memory = {k: v.clone() for k, v in saved["memory"].items()}

    def epoch_state_dict(self) -> dict[str, Any]:
        """This worker's sums of the epoch so far (Delta_e, bits, sent counts, compress time,
        steps, the first non-finite sum): with :meth:`state_dict`, what continues an epoch
        that stopped at a step boundary (a mid-epoch checkpoint)."""
        self._read_tally()
        return {"grad_sums": {n: g.clone() for n, g in self.grad_sums.items()},
                "bits": self.bits, "wire_bits": self.wire_bits, "bits_dense": self.bits_dense,
                "type_bits": dict(self.type_bits), "type_bits_dense": dict(self.type_bits_dense),
                "chosen": {n: list(c) for n, c in self.chosen.items()},
                "compress_s": self.timer.seconds, "step": self.step,
                "nonfinite": self.nonfinite()}

    def load_epoch_state_dict(self, state: dict[str, Any], device: torch.device) -> None:
        """Continue the epoch :meth:`epoch_state_dict` saved (after :meth:`reset_epoch`)."""
        self.grad_sums = {n: g.to(device).clone() for n, g in state["grad_sums"].items()}
        self.bits, self.wire_bits = state["bits"], state["wire_bits"]
        self.bits_dense = state["bits_dense"]
        self.type_bits = dict(state["type_bits"])
        self.type_bits_dense = dict(state["type_bits_dense"])
        self.chosen = {n: list(c) for n, c in state["chosen"].items()}
        self.timer.seconds, self.step = state["compress_s"], state["step"]
        self._nonfinite = state["nonfinite"]

    # ---- used by the hook ---------------------------------------------------------------
    def name_of(self, param: nn.Parameter) -> str:
        """The name of one of the model's parameters."""
        return self._name_of[id(param)]

    def split(self, names: list[str], grads: list[torch.Tensor], buffer: torch.Tensor
              ) -> tuple[list[torch.Tensor], list[Layer], list[torch.Tensor]]:
        """A bucket's tensors sent dense, its compressed layers and their gradients (views into
        the bucket): with ``compressor=none`` the whole buffer goes dense."""
        if not self.compressor.compresses:
            return [buffer], [], []
        compressed = [(self.layers[n], g) for n, g in zip(names, grads, strict=True) if g.ndim > 1]
        return ([g for g in grads if g.ndim <= 1], [layer for layer, _ in compressed],
                [g for _, g in compressed])

    def aggregate(self, names: list[str], grads: list[torch.Tensor], buffer: torch.Tensor
                  ) -> Future[torch.Tensor]:
        """Aggregate one bucket (``grads``: views into ``buffer`` of the parameters ``names``);
        the future completes with ``buffer`` holding the mean over workers.

        On CUDA the bucket's work is queued on this state's own stream, as PyTorch's hooks queue
        theirs off the backward stream, so that backward never waits for a collective:

        - the stream first waits for the current one, where autograd and DDP wrote the
          bucket's gradients (``Stream.wait_stream``: later work on it waits for the work
          queued on the other so far, and the other is not held; torch/cuda/streams.py);
        - NCCL queues a collective after the work of the stream current at its launch, this
          one (ProcessGroupNCCL.cpp, syncStreams), and its future is already complete when the
          call returns (ProcessGroupNCCL::collective marks it completed right after queueing),
          so :func:`~compression.comm.drive` runs every step inline, here, each queued on this
          stream after a ``Future.wait`` that orders the stream after the collective it reads
          and does not block (torch/futures/__init__.py);
        - the returned future records an event on this stream when the last step is queued;
          DDP waits on it at the end of backward (``future_work->wait()`` in
          Reducer::finalize_backward, torch/csrc/distributed/c10d/reducer.cpp), which makes
          the backward stream wait there, once, and only then DDP reads the bucket.

        No ``record_stream`` is needed (Tensor.record_stream's docs: uses off the creating
        stream must be ordered back to it before the tensor is freed): DDP frees its buckets
        only after that wait; the tensors made here (memories, messages, Delta_e) are read
        elsewhere only after it too, and every bucket's work waits for the current stream
        before it can reuse their memory.
        """
        if self._stream is None:
            return self._aggregate(names, grads, buffer)
        self._stream.wait_stream(torch.cuda.current_stream(self.device))
        with torch.cuda.stream(self._stream):
            return self._aggregate(names, grads, buffer)

    def _aggregate(self, names: list[str], grads: list[torch.Tensor], buffer: torch.Tensor
                   ) -> Future[torch.Tensor]:
        if self.track_norms:
            self._accumulate(names, grads)
        self.bits_dense += FP32_BITS * buffer.numel()
        dense, layers, compressed = self.split(names, grads, buffer)
        observe = self.overlap is not None and self.overlap.active(self.epoch, self.step)
        probes = [p for p in self.probes if p.active(self.epoch, self.step)]
        steps = self._bucket_steps(self._previous, dense, layers, compressed, buffer,
                                   (names, grads) if observe else None,
                                   (names, grads, probes) if probes else None)
        self._previous = drive(steps, self.timer, self._stream)
        return self._previous

    def _accumulate(self, names: list[str], grads: list[torch.Tensor]) -> None:
        """Delta_e += g for each layer of the bucket, noting sums that stop being finite."""
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

    def _bucket_steps(self, previous: Future, dense: list[torch.Tensor], layers: list[Layer],
                      grads: list[torch.Tensor], buffer: torch.Tensor,
                      observed: tuple[list[str], list[torch.Tensor]] | None = None,
                      probed: tuple[list[str], list[torch.Tensor], list[Probe]] | None = None
                      ) -> Steps[torch.Tensor]:
        yield Pending(previous)  # start this bucket's collectives after the previous bucket's
        if observed is not None:  # before the compressor overwrites the gradients
            assert self.overlap is not None
            yield from self.overlap.measure(*observed, self.comm)
        names, bucket, probes = probed or ([], [], [])
        for probe in probes:
            yield from probe.before(self, names, bucket)
        sent = yield from aggregate_bucket(self.compressor, dense, layers, grads, self.comm)
        for probe in probes:
            yield from probe.after(self, names, bucket)
        self._account(layers, sent)
        return buffer

    def _account(self, layers: list[Layer], sent: list[Sent]) -> None:
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


def _floats(values: dict[str, Any]) -> dict[str, Any]:
    """``values`` with every tensor among them read as a float: one read (one device sync) for
    all of them. Float32 values come out as ``float(t)`` would give them."""
    keys = [k for k, v in values.items() if isinstance(v, torch.Tensor)]
    if not keys:
        return values
    read = torch.stack([values[k].detach().double() for k in keys]).tolist()
    return {**values, **dict(zip(keys, read, strict=True))}


def comm_hook(state: HookState, bucket: dist.GradBucket) -> Future[torch.Tensor]:
    """DDP communication hook: aggregate one bucket with ``state.compressor``."""
    names = [state.name_of(p) for p in bucket.parameters()]
    future = state.aggregate(names, bucket.gradients(), bucket.buffer())
    if bucket.is_last():
        state.step += 1
    return future
