"""The DDP communication hook and its state: the plumbing every compressor shares.

For every bucket DDP hands over (while the backward pass goes on), :func:`comm_hook`

1. adds each layer's local gradient to its epoch sum Delta_e (Accordion's statistic, taken
   before any compression or error feedback), noting the first step at which a layer's sum
   stops being finite (:meth:`HookState.nonfinite`),
2. runs :func:`aggregate_bucket`: the tensors with ndim <= 1 (biases, norm layers) go
   uncompressed in one all-reduce, the matrix-shaped layers through the compressor.
   On the steps that ``observe.overlap_epochs`` chooses, an :class:`~compression.overlap.
   OverlapProbe` first gathers every worker's local gradients of the bucket and measures the
   overlap of their top-k supports (Accordion's Fig. 4a; :mod:`compression.overlap`). On the
   steps a :class:`Probe` added with :meth:`HookState.add_probe` chooses, the probe sees the
   bucket before the compressor changes it and again once it holds the mean (e.g. the gradient
   noise and compression error of :mod:`compression.noise`),
3. counts the bits this worker put into its messages (in all, and for the compressed layers by
   type: conv kernels, FC/LSTM matrices) and the time spent compressing and decompressing
   (compute only, not the wait for the network).

The epoch's sums of 1 and 3 (and the step count) are an :class:`~compression.stats.EpochStats`
of their own, :attr:`HookState.stats`; :class:`HookState` implements
:class:`~compression.worker.WorkerState`, what the training loop and the schedulers see of it.

With ``compressor=none`` the whole bucket goes in one fp32 all-reduce, as DDP does without a
hook.

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
from typing import Any, Protocol

import torch
import torch.distributed as dist
from torch import nn
from torch._utils import _flatten_dense_tensors, _unflatten_dense_tensors
from torch.distributed import ProcessGroup
from torch.futures import Future

from compression.base import Compressor, Layer, Sent, divisor
from compression.comm import Comm, GroupComm, Pending, Steps, drive
from compression.overlap import OverlapProbe
from compression.stats import FP32_BITS, EpochStats
from compression.worker import WorkerState
from core.errors import ConfigError


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
    mean = (yield reduced).div_(divisor(flat, world))
    if len(dense) > 1:
        torch._foreach_copy_(dense, _unflatten_dense_tensors(mean, dense))
    bits = FP32_BITS * flat.numel()
    return [Sent(bits, bits), *sent]


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


class HookState(WorkerState):
    """Everything the hook keeps between steps: layers, memories, the epoch's sums
    (:attr:`stats`)."""

    def __init__(self, compressor: Compressor, named_parameters: Iterable[tuple[str, nn.Parameter]],
                 group: ProcessGroup | None = None, comm: Comm | None = None,
                 track_norms: bool = True, overlap: OverlapProbe | None = None) -> None:
        self.compressor = compressor
        self.overlap = overlap  # the top-k support overlap, at chosen epochs (None: off)
        self.comm = comm or GroupComm(group)  # a SimComm for simulated workers
        self.world_size = self.comm.world_size
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
        self.epoch = 0  # the epoch being trained (reset_epoch's)
        self.device = self.device or torch.device("cpu")
        # Delta_e (kept only with track_norms: simulated workers, only worker 0), bits, time,
        # steps of the epoch so far
        self.stats = EpochStats(self.device, track_norms)
        # On CUDA with a process group, the stream the compressor's work is queued on (see
        # aggregate); simulated workers complete their collectives in place, on the current one.
        self._stream = (torch.cuda.Stream(device=self.device) if self.device.type == "cuda"
                        and isinstance(self.comm, GroupComm) else None)
        self._previous: Future = Future()  # the last bucket's completion (see the module doc)
        self._previous.set_result(None)

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

    # ---- the epoch's sums (self.stats) -----------------------------------------------------
    def reset_epoch(self, epoch: int | None = None) -> None:
        """Start a new epoch's sums: bits, time, and each layer's Delta_e (``epoch``: the epoch
        about to be trained, for the measurements taken at chosen epochs)."""
        if epoch is not None:
            self.epoch = epoch
        if self.overlap is not None:
            self.overlap.reset()
        self.stats.reset()

    def nonfinite(self) -> tuple[int, list[str]] | None:
        """The first step of this epoch (0-based) after which some layers' Delta_e were no
        longer finite on this worker, and those layers; None while every sum is finite."""
        return self.stats.nonfinite()

    def epoch_stats(self) -> dict[str, float]:
        """The epoch's metrics: ``comm/*``, ``time/compress_s``, ``level/*``, ``grad_norm/*``,
        ``sent_fraction/*`` (sparsifiers: the elements sent over those offered), the
        compressor's own per-layer ``layer_stats`` and, on measured epochs, ``overlap/*`` and
        ``overlap_batch/*`` (:mod:`compression.overlap`)."""
        per_layer: dict[str, Any] = {}
        for name in self.compressed_layers():
            per_layer[f"level/{name}"] = self.layers[name].level
            for key, value in self.compressor.layer_stats(self.layers[name]).items():
                per_layer[f"{key}/{name}"] = value
        stats = self.stats.metrics(per_layer)
        if self.overlap is not None:
            stats.update(self.overlap.stats())
        return stats

    def grad_norms(self) -> dict[str, float]:
        """||Delta_e|| per layer: L2 norm of the local gradient summed over the epoch so far."""
        return self.stats.grad_norms()

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
        """This worker's sums of the epoch so far (:meth:`EpochStats.state_dict
        <compression.stats.EpochStats.state_dict>`): with :meth:`state_dict`, what continues an
        epoch that stopped at a step boundary (a mid-epoch checkpoint)."""
        return self.stats.state_dict()

    def load_epoch_state_dict(self, state: dict[str, Any], device: torch.device) -> None:
        """Continue the epoch :meth:`epoch_state_dict` saved (after :meth:`reset_epoch`)."""
        self.stats.load_state_dict(state, device)

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
        stats = self.stats
        if stats.track_norms:
            stats.accumulate(names, grads)
        stats.bits_dense += FP32_BITS * buffer.numel()
        dense, layers, compressed = self.split(names, grads, buffer)
        observe = self.overlap is not None and self.overlap.active(self.epoch, stats.step)
        probes = [p for p in self.probes if p.active(self.epoch, stats.step)]
        steps = self._bucket_steps(self._previous, dense, layers, compressed, buffer,
                                   (names, grads) if observe else None,
                                   (names, grads, probes) if probes else None)
        self._previous = drive(steps, stats.timer, self._stream)
        return self._previous

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
        self.stats.account(layers, sent)
        return buffer


def comm_hook(state: HookState, bucket: dist.GradBucket) -> Future[torch.Tensor]:
    """DDP communication hook: aggregate one bucket with ``state.compressor``."""
    names = [state.name_of(p) for p in bucket.parameters()]
    future = state.aggregate(names, bucket.gradients(), bucket.buffer())
    if bucket.is_last():
        state.stats.step += 1
    return future
