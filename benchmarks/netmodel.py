"""An ideal alpha-beta model of one data-parallel training step.

It predicts a step's time from the compute time measured without communication and the
collectives the gradient exchange issues, as if compression itself cost nothing
(:func:`step_time`), or charging each bucket's compression its isolated CPU time
(:func:`charged_step_time`). Used by
``make bench-e2e`` (the ideal speed-up a measured one is compared with, and the model's error
on the 2-rank measurements) and by :mod:`benchmarks.projection` (clusters of N = 4..256).

Cost of one collective on N workers, each with a full-duplex link of ``bandwidth`` B bytes/s,
alpha the latency of one collective (the bandwidth terms are the ring algorithms': Patarasuk &
Yuan 2009, Thakur et al. 2005):

- all-reduce of S bytes (reduce-scatter, then all-gather, around a ring):
  alpha + 2 (N - 1) / N * S / B
- all-gather of S bytes from every worker: alpha + (N - 1) * S / B

alpha is charged once per collective, as the ideal: a plain ring pays 2 (N - 1) hop latencies,
NCCL's trees about 2 log2 N, so for large N pass the collective latency measured at that N.

An all-reduce's traffic per worker stays below 2 S however large N grows; an all-gather's grows
with N. That is why all-gather compressors (Top-K, AdaComp) stop paying off on large clusters
while PowerSGD's all-reduced factors do not.

Overlap with the backward pass, as DDP does it (Li et al., VLDB 2020): the gradients are packed
into buckets in the order backward produces them; bucket b's collectives start when its last
gradient is ready (``ready[b]`` seconds into backward, measured) and the previous collective
has finished, one at a time over the link:

    step = forward + max(backward, end of the last collective) + optimizer

The second ideal charges compression (:class:`Program`: a bucket's CPU work between the starts
and waits of its collectives, measured alone by ``benchmarks.compressors``). The rank has one
core: compression runs as soon as it can and backward yields it the core, so every second of
compression before a bucket is ready delays that bucket (and the end of backward) by a second;
a bucket's program starts when the bucket is ready and the previous bucket's program has ended
(the hook chains them), a collective when started and the link is free, and the work after a
wait when that collective has ended.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

ALL_REDUCE = "all_reduce"
ALL_GATHER = "all_gather"


@dataclass(frozen=True)
class Link:
    """Every worker's link: ``bandwidth`` bytes/s each way, ``latency`` (alpha) s per
    collective."""

    bandwidth: float
    latency: float = 0.0


@dataclass(frozen=True)
class Collective:
    """One collective: ``op`` (all_reduce or all_gather) of ``nbytes`` per worker."""

    op: str
    nbytes: int


@dataclass(frozen=True)
class Compute:
    """A step without communication: its phases (s) and each bucket's ready time (s into
    backward, in the order DDP hands the buckets over)."""

    forward: float
    backward: float
    optimizer: float
    ready: tuple[float, ...]

    @property
    def total(self) -> float:
        return self.forward + self.backward + self.optimizer

    def scaled(self, total: float) -> Compute:
        """The same profile (phase shares, ready times) stretched to a step of ``total`` s."""
        k = total / self.total
        return Compute(self.forward * k, self.backward * k, self.optimizer * k,
                       tuple(r * k for r in self.ready))


def collective_time(c: Collective, n: int, link: Link) -> float:
    """Seconds for collective ``c`` on ``n`` workers (ring algorithms, see the module doc)."""
    if n <= 1:
        return 0.0
    return link.latency + wire_bytes(c, n) / link.bandwidth


def wire_bytes(c: Collective, n: int) -> float:
    """Bytes each worker sends for collective ``c`` on ``n`` workers (ring algorithms)."""
    if n <= 1:
        return 0.0
    if c.op == ALL_REDUCE:
        return 2 * (n - 1) / n * c.nbytes
    if c.op == ALL_GATHER:
        return (n - 1) * c.nbytes
    raise ValueError(f"unknown collective {c.op!r}; expected {ALL_REDUCE} or {ALL_GATHER}")


def comm_end(compute: Compute, buckets: Sequence[Sequence[Collective]], n: int, link: Link
             ) -> float:
    """When the last collective ends, in seconds from the start of backward: bucket b's start
    when it is ready and the link is free, in order."""
    if len(buckets) != len(compute.ready):
        raise ValueError(f"{len(buckets)} buckets of messages but {len(compute.ready)} ready "
                         f"times")
    t = 0.0
    for ready, collectives in zip(compute.ready, buckets, strict=True):
        if collectives:
            t = max(t, ready)
        for c in collectives:
            t += collective_time(c, n, link)
    return t


def step_time(compute: Compute, buckets: Sequence[Sequence[Collective]], n: int, link: Link,
              overlap: bool = True) -> float:
    """Predicted seconds per step; ``overlap=False``: communication after backward instead."""
    if not overlap:
        comm = sum(collective_time(c, n, link) for b in buckets for c in b)
        return compute.total + comm
    return (compute.forward + max(compute.backward, comm_end(compute, buckets, n, link))
            + compute.optimizer)


@dataclass(frozen=True)
class Program:
    """How a rank runs one bucket's exchange: ``ops`` in order, each ``("cpu", seconds)`` of
    compression work, ``("start", i)`` (the bucket's i-th collective starts) or ``("wait", i)``
    (the work after it needs the i-th collective's result)."""

    ops: tuple[tuple[str, float], ...]

    @property
    def cpu(self) -> float:
        """Seconds of CPU work in all."""
        return sum(x for op, x in self.ops if op == "cpu")


def charged_step_time(compute: Compute, buckets: Sequence[Sequence[Collective]],
                      programs: Sequence[Program], n: int, link: Link) -> float:
    """Predicted seconds per step with each bucket's compression charged its CPU time
    (``programs[b]`` runs bucket b's collectives ``buckets[b]``; see the module doc)."""
    if not len(buckets) == len(programs) == len(compute.ready):
        raise ValueError(f"{len(buckets)} buckets of messages, {len(programs)} programs and "
                         f"{len(compute.ready)} ready times")
    busy: list[tuple[float, float]] = []   # the core's compression work: (start, end)
    link_free = finished = 0.0
    for ready, collectives, program in zip(compute.ready, buckets, programs, strict=True):
        t = max(_backward_clock(ready, busy), finished)
        ends: dict[int, float] = {}
        for op, x in program.ops:
            if op == "cpu":
                busy.append((t, t + x))
                t += x
            elif op == "start":
                start = max(t, link_free)
                link_free = ends[int(x)] = start + collective_time(collectives[int(x)], n, link)
            elif op == "wait":
                t = max(t, ends[int(x)])
            else:
                raise ValueError(f"unknown program op {op!r}; expected cpu, start or wait")
        finished = t
    return (compute.forward + max(_backward_clock(compute.backward, busy), finished)
            + compute.optimizer)


def _backward_clock(work: float, busy: list[tuple[float, float]]) -> float:
    """When backward has done ``work`` seconds of its own, given the core's busy intervals
    (in time order, not overlapping) before then."""
    t = 0.0
    for start, end in busy:
        if start - t >= work:
            break
        work -= start - t
        t = end
    return t + work


def link_of_namespace(rate: float, n: int, latency: float = 0.0) -> Link:
    """The per-worker link equivalent to ``n`` ranks sharing one qdisc of ``rate`` bytes/s
    (:mod:`benchmarks.netns`): all N workers' traffic crosses it, so B = rate / N."""
    return Link(bandwidth=rate / n, latency=latency)
