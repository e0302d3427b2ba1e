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
from collections.abc import Generator
from typing import Any, NamedTuple, Protocol, TypeVar

import torch
import torch.distributed as dist
from torch.distributed import ProcessGroup
from torch.futures import Future

T = TypeVar("T")


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
        work = dist.all_gather_single(out, tensor, group=self.group, async_op=True)
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
    """Seconds spent inside a compressor's steps (compute only; waiting on the wire excluded)."""

    def __init__(self) -> None:
        self.seconds = 0.0


def drive(steps: Steps[T], timer: Timer | None = None) -> Future[T]:
    """Run ``steps`` until it returns; the future completes with its return value.

    Each yielded collective resumes the generator when it completes (inline if it already has),
    so nothing here blocks. An exception in a step or a failed collective fails the returned
    future.
    """
    done: Future[T] = Future()

    def advance(ready: Pending | None) -> None:
        while True:
            try:
                value = None if ready is None else _result(ready)
            except BaseException as exc:  # noqa: BLE001 (a failed collective: fail `done`)
                steps.close()
                done.set_exception(exc)
                return
            start = time.perf_counter()
            try:
                ready = steps.send(value)
            except StopIteration as stop:
                _finish(done, timer, start, result=stop.value)
                return
            except BaseException as exc:  # noqa: BLE001 (handed to whoever waits on `done`)
                _finish(done, timer, start, error=exc)
                return
            if timer is not None:
                timer.seconds += time.perf_counter() - start
            if not ready.future.done():
                ready.future.add_done_callback(lambda _, pending=ready: advance(pending))
                return

    advance(None)
    return done


def _result(ready: Pending) -> Any:
    """A completed collective's result (``wait`` raises its error; on CUDA it also orders the
    current stream after the collective's)."""
    ready.future.wait()
    return ready.result


def _finish(done: Future, timer: Timer | None, start: float, result: Any = None,
            error: BaseException | None = None) -> None:
    # Stop the clock first: completing `done` may run the next bucket's steps inline.
    if timer is not None:
        timer.seconds += time.perf_counter() - start
    if error is not None:
        done.set_exception(error)
    else:
        done.set_result(result)
