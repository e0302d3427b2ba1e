"""Pluggable collectives, and the driver that runs a compressor's steps on top of them.

A compressor is written once, as a generator that *yields* each collective it starts (a
:class:`Pending`) and receives that collective's result::

    total = yield comm.all_reduce(p)          # sum over workers, in place
    parts = yield comm.all_gather(message)    # (world_size * numel,) in rank order
    parts = yield from all_gather_varlen(comm, message)

:func:`drive` runs such a generator to completion and returns a future of its return value. The
DDP hook hands it a :class:`GroupComm` (a real process group, asynchronous), and
:func:`compression.simulate` one in-memory :class:`SimComm` per simulated worker, so the hook and
the simulation run the same compressor code.
"""

from __future__ import annotations

import time
from collections import deque
from collections.abc import Generator
from contextlib import AbstractContextManager, nullcontext
from typing import Any, NamedTuple, Protocol, TypeVar

import torch
import torch.distributed as dist
from torch.distributed import ProcessGroup
from torch.futures import Future

T = TypeVar("T")


def all_gather_single(out: torch.Tensor, tensor: torch.Tensor, group: ProcessGroup | None = None,
                      async_op: bool = False) -> Any:
    """``out`` = every worker's ``tensor`` in rank order, under this torch's name for it.

    torch 2.14 names it ``all_gather_single`` and deprecates ``all_gather_into_tensor``, its name
    since torch 2.0 (the same collective); older torches, as GPU images often have (2.11 on the
    H200 of results/bench/smoke_gpu.md), know only the old name. The name is looked up at each
    call, so that whatever wraps torch.distributed's collectives (benchmarks.e2e_ranks counts
    them) sees this one too.
    """
    gather = getattr(dist, "all_gather_single", None) or dist.all_gather_into_tensor
    return gather(out, tensor, group=group, async_op=async_op)


class Pending(NamedTuple):
    """A started collective: ``future`` completes when ``result`` holds its outcome.

    The result tensor is known when the collective starts (in place, or the output buffer), so
    the driver needs no ``then`` on the future to hand it over: a callback costs about as much
    as a small layer's compression.
    """

    future: Future
    result: Any = None


Steps = Generator[Pending, Any, T]


class Comm(Protocol):
    """The two collectives compressors use. Every worker must call them in the same order."""

    world_size: int
    rank: int  # this worker's index in 0 .. world_size - 1 (its stream of random numbers)
    # True where every worker's all-gather result is one tensor (simulated workers in one
    # process): a caller then passes no output buffer of its own and only reads the result.
    shares_gather: bool

    def all_reduce(self, tensor: torch.Tensor) -> Pending:
        """Sum ``tensor`` over the workers, in place; the result is ``tensor``."""
        ...

    def all_gather(self, tensor: torch.Tensor, out: torch.Tensor | None = None) -> Pending:
        """Every worker's 1-D ``tensor`` (same length everywhere), concatenated in rank order,
        in ``out`` (``world_size * numel`` elements) if given, else in a new tensor."""
        ...


class GroupComm:
    """Collectives over a real ``torch.distributed`` process group (asynchronous)."""

    shares_gather = False

    def __init__(self, group: ProcessGroup | None = None) -> None:
        self.group = group
        self.world_size = dist.get_world_size(group)
        self.rank = dist.get_rank(group)

    def all_reduce(self, tensor: torch.Tensor) -> Pending:
        work = dist.all_reduce(tensor, group=self.group, async_op=True)
        return Pending(work.get_future(), tensor)

    def all_gather(self, tensor: torch.Tensor, out: torch.Tensor | None = None) -> Pending:
        if out is None:
            out = tensor.new_empty(self.world_size * tensor.numel())
        work = all_gather_single(out, tensor, group=self.group, async_op=True)
        return Pending(work.get_future(), out)


class _Exchange:
    """Meeting point of simulated workers: the i-th collective of every worker is matched up."""

    def __init__(self, world_size: int) -> None:
        self.world_size = world_size
        self.calls = [0] * world_size
        # collective number -> (op, inputs, futures, outputs by rank, shared all-gather result)
        self.open: dict[int, tuple[str, dict[int, torch.Tensor], dict[int, Future],
                                   dict[int, torch.Tensor], torch.Tensor | None]] = {}

    def post(self, rank: int, op: str, tensor: torch.Tensor, out: torch.Tensor | None
             ) -> Pending:
        """Worker ``rank``'s next collective; its result goes to ``out``, or (an all-gather
        without ``out``) to one tensor that every worker gets, so that W workers hold W
        messages, not W^2. The future completes when every worker has posted it."""
        seq = self.calls[rank]
        self.calls[rank] += 1
        if seq not in self.open:
            shared = (tensor.new_empty(self.world_size * tensor.numel())
                      if op == "all_gather" else None)
            self.open[seq] = (op, {}, {}, {}, shared)
        kind, inputs, futures, outs, shared = self.open[seq]
        if kind != op or any(t.shape != tensor.shape for t in inputs.values()):
            raise RuntimeError(f"simulated workers disagree on collective #{seq}: {kind} of "
                               f"{[tuple(t.shape) for t in inputs.values()]} vs {op} of "
                               f"{tuple(tensor.shape)}")
        inputs[rank], futures[rank] = tensor, Future()
        outs[rank] = shared if out is None else out
        pending = Pending(futures[rank], outs[rank])
        if len(inputs) == self.world_size:
            del self.open[seq]  # completing may post the next collectives (callbacks run inline)
            ordered = [inputs[r] for r in range(self.world_size)]
            if op == "all_reduce":
                result = torch.stack(ordered).sum(0)
            else:
                result = torch.cat(ordered, out=shared)
            for r in range(self.world_size):
                if outs[r] is not result:
                    outs[r].copy_(result)
            for r in range(self.world_size):
                futures[r].set_result(None)
        return pending


class SimComm:
    """One simulated worker's collectives, matched in memory with its peers' (no process group)."""

    shares_gather = True

    def __init__(self, exchange: _Exchange, rank: int) -> None:
        self.exchange = exchange
        self.rank = rank
        self.world_size = exchange.world_size
        self.bytes_sent = 0  # what this worker has put into its collectives so far

    @staticmethod
    def group(world_size: int) -> list[SimComm]:
        """One :class:`SimComm` per worker of a fresh simulated group."""
        exchange = _Exchange(world_size)
        return [SimComm(exchange, r) for r in range(world_size)]

    def all_reduce(self, tensor: torch.Tensor) -> Pending:
        self.bytes_sent += tensor.numel() * tensor.element_size()
        return self.exchange.post(self.rank, "all_reduce", tensor, tensor)

    def all_gather(self, tensor: torch.Tensor, out: torch.Tensor | None = None) -> Pending:
        """Without ``out``, the result is the one tensor all workers share (read it only)."""
        self.bytes_sent += tensor.numel() * tensor.element_size()
        return self.exchange.post(self.rank, "all_gather", tensor, out)


def all_gather_varlen(comm: Comm, message: torch.Tensor) -> Steps[list[torch.Tensor]]:
    """Gather 1-D messages of different lengths: exchange the lengths, then one padded gather.

    Returns every worker's message, in rank order. Costs one int32 per worker on top of the
    longest message (times the world size).
    """
    size = torch.tensor([message.numel()], dtype=torch.int32, device=message.device)
    sizes = (yield comm.all_gather(size)).tolist()
    longest = max(sizes)
    padded = message
    if message.numel() < longest:
        padded = torch.cat([message, message.new_zeros(longest - message.numel())])
    gathered = yield comm.all_gather(padded)
    return [gathered[w * longest:w * longest + n] for w, n in enumerate(sizes)]


class Timer:
    """Seconds spent inside a compressor's steps (compute only; waiting on the wire excluded),
    on the host's clock: on the CPU the work is done when its call returns."""

    def __init__(self) -> None:
        self._seconds = 0.0

    def begin(self) -> Any:
        """Mark the start of a stretch of compressor work; pass the mark to :meth:`end`."""
        return time.perf_counter()

    def end(self, mark: Any) -> None:
        """The stretch begun at ``mark`` is over: add its time."""
        self._seconds += time.perf_counter() - mark

    @property
    def seconds(self) -> float:
        """The time added so far."""
        return self._seconds

    @seconds.setter
    def seconds(self, value: float) -> None:
        self._seconds = value


class CudaTimer(Timer):
    """The same on CUDA, timed on the GPU: a kernel launch returns before the kernel has run, so
    the host's clock would time the launches. Each stretch is a pair of CUDA events recorded on
    the current stream (the stream the work is queued on); a pair is read when its events have
    completed, checked with ``Event.query`` (no wait) as later stretches end, and at the latest
    when :attr:`seconds` is read (which waits for the last one). The time between the events
    excludes the wait for a collective queued before the first event (``Future.wait`` on CUDA
    only orders the stream after it: torch/futures/__init__.py, ``Future.wait``)."""

    def __init__(self) -> None:
        super().__init__()
        self._open: deque[tuple[torch.cuda.Event, torch.cuda.Event]] = deque()
        self._spare: list[torch.cuda.Event] = []

    def begin(self) -> torch.cuda.Event:
        event = self._event()
        event.record()  # on the current stream (torch/cuda/streams.py, Event.record)
        return event

    def end(self, mark: torch.cuda.Event) -> None:
        event = self._event()
        event.record()
        self._open.append((mark, event))
        self._collect(wait=False)

    @property
    def seconds(self) -> float:
        """The time of every stretch so far (waits for the last ones to complete)."""
        self._collect(wait=True)
        return self._seconds

    @seconds.setter
    def seconds(self, value: float) -> None:
        self._open.clear()
        self._seconds = value

    def _event(self) -> torch.cuda.Event:
        return self._spare.pop() if self._spare else torch.cuda.Event(enable_timing=True)

    def _collect(self, wait: bool) -> None:
        """Add the stretches whose events have completed, in order (``wait``: all of them)."""
        while self._open and (wait or self._open[0][1].query()):
            start, stop = self._open.popleft()
            if wait:
                stop.synchronize()
            self._seconds += start.elapsed_time(stop) / 1000  # elapsed_time is in ms
            self._spare += (start, stop)


def timer_for(device: torch.device) -> Timer:
    """The timer for compressor work on ``device``: GPU time on CUDA, host time elsewhere."""
    return CudaTimer() if device.type == "cuda" else Timer()


def drive(steps: Steps[T], timer: Timer | None = None,
          stream: torch.cuda.Stream | None = None) -> Future[T]:
    """Run ``steps`` until it returns; the future completes with its return value.

    Each yielded collective resumes the generator when it completes (inline if it already has),
    so nothing here blocks. An exception in a step or a failed collective fails the returned
    future.

    ``stream`` (CUDA): every step is queued on it, after the collective it waited for, and the
    returned future carries the stream's work, so that whoever waits on it (DDP, at the end of
    backward) orders its own stream after it; see :meth:`compression.hook.HookState.aggregate`.
    Without a stream the steps run on the current stream (the CPU: no streams at all).
    """
    # A future holding CUDA tensors must name their devices to record an event on the current
    # stream when completed and make a waiter's stream wait for it; without devices it does
    # neither (torch/futures/__init__.py, Future.__init__; ATen/core/ivalue_inl.h,
    # Future::markCompleted and Future::wait).
    done: Future[T] = Future() if stream is None else Future(devices=[stream.device])

    def advance(ready: Pending | None) -> None:
        with _on(stream):
            while True:
                try:
                    value = None if ready is None else _result(ready)
                except BaseException as exc:  # noqa: BLE001 (a failed collective: fail `done`)
                    steps.close()
                    done.set_exception(exc)
                    return
                mark = timer.begin() if timer is not None else None
                try:
                    ready = steps.send(value)
                except StopIteration as stop:
                    _finish(done, timer, mark, result=stop.value)
                    return
                except BaseException as exc:  # noqa: BLE001 (handed to whoever waits on `done`)
                    _finish(done, timer, mark, error=exc)
                    return
                if timer is not None:
                    timer.end(mark)
                if not ready.future.done():
                    ready.future.add_done_callback(lambda _, pending=ready: advance(pending))
                    return

    advance(None)
    return done


def _on(stream: torch.cuda.Stream | None) -> AbstractContextManager[Any]:
    """Queue CUDA work on ``stream`` inside the block (None: leave the current stream)."""
    return nullcontext() if stream is None else torch.cuda.stream(stream)


def _result(ready: Pending) -> Any:
    """A completed collective's result. ``wait`` raises its error; on CUDA it does not block but
    makes the current stream wait for the collective (torch/futures/__init__.py, Future.wait):
    the step that reads the result is queued after it on that stream."""
    ready.future.wait()
    return ready.result


def _finish(done: Future, timer: Timer | None, mark: Any, result: Any = None,
            error: BaseException | None = None) -> None:
    # Stop the clock first: completing `done` may run the next bucket's steps inline.
    if timer is not None:
        timer.end(mark)
    if error is not None:
        done.set_exception(error)
    else:
        done.set_result(result)
