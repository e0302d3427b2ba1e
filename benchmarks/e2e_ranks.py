"""The ranks of ``make bench-e2e``: real DDP training steps, timed, inside the emulated link.

    ip netns exec <ns> python -m benchmarks.e2e_ranks SPEC.json OUT.json   # benchmarks.e2e does it

Starts ``world_size`` gloo ranks (:func:`benchmarks.ranks.run_ranks`; the caller sets
``GLOO_SOCKET_IFNAME=lo``). With ``RANK`` in the environment (and ``WORLD_SIZE``,
``MASTER_ADDR``, ``MASTER_PORT``: one rank per host, :func:`benchmarks.e2e.launch_hosts`), it
is that one rank instead, in a group started from the environment.

Every rank builds the model once, wraps it in DDP (25 MiB buckets, as run.py) and registers
one hook that hands each bucket to the method of the current step (:class:`Dispatch`). The
methods therefore share model, buckets and optimizer, and take turns step by step, so the
machine's noise hits them alike. Methods (``kind`` in the spec):

- ``compute``: the hook returns the bucket untouched. The same step, DDP's bucketing included,
  with no communication and the same two ranks competing for the cores: the compute-alone
  baseline (a world-size-1 run would leave the other rank's core idle and run faster than
  compute does inside the 2-rank job). Its hook calls give each bucket's ready time.
- ``ours``: ``compression.HookState`` + ``comm_hook``, exactly as run.py registers them.
- ``torch_powersgd``: PyTorch's ``powerSGD_hook`` (the peer), its buckets chained
  (:class:`ChainedTorchPowerSGD`).
- ``dense_alone``: no training step; one fp32 all-reduce per bucket, one after the other: the
  dense all-reduce alone, which calibrates the bandwidth ratio.

Per step the ranks record forward, backward (which ends when DDP has every bucket's result) and
optimizer times, each bucket's ready time, every collective the step issued (op, bytes, bucket,
time: ``torch.distributed`` calls are observed, nothing in them changes), our hook's
``wire_bits`` and compressor time, and on rank 0 the bytes the namespace's lo carried.

``"device": "cuda"`` in the spec: rank r trains on GPU r and every method communicates through
an NCCL group (the caller routes NCCL through the namespace's lo: benchmarks/e2e.py). Phases are
timed between ``torch.cuda.synchronize()`` calls, so they are the GPU's, and a bucket's ready
time is that of a CUDA event recorded on the backward stream when DDP hands the bucket over (it
completes when the bucket's gradients are written; the host gets there earlier).
"""

# No `from __future__ import annotations`: DDP checks dispatch_hook's annotations at runtime.
import functools
import json
import os
import statistics
import sys
import threading
import time
from collections.abc import Callable
from datetime import timedelta
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.algorithms.ddp_comm_hooks import powerSGD_hook as torch_psgd
from torch.futures import Future
from torch.nn.parallel import DistributedDataParallel as DDP

import compression
import models
from benchmarks.netns import lo_tx_bytes
from benchmarks.ranks import run_ranks
from compression.comm import all_gather_single
from compression.hook import comm_hook
from core.process import exit_without_teardown

BUCKET_CAP_MB = 25  # run.py's default (conf/trainer/default.yaml)
LATENCY_REPEATS = 20


# ---- the hook every step goes through -------------------------------------------------------
class Dispatch:
    """Which method handles the buckets of the current step, and what the step did (``cuda``:
    bucket ready times from CUDA events)."""

    def __init__(self, index_of: dict[int, int], cuda: bool = False) -> None:
        self.method: Callable[[dist.GradBucket], Future] | None = None
        self.index_of = index_of  # id(parameter) -> its index in model.parameters()
        self.cuda = cuda
        self._lock = threading.Lock()
        self.begin(None)
        self.recording = False

    def begin(self, method: Callable[[dist.GradBucket], Future] | None) -> None:
        """Hand the buckets of the backward pass starting now to ``method`` and record what it
        does (times from now on)."""
        self.method, self.start = method, time.perf_counter()
        self._events = [self._event()] if self.cuda else []  # backward's start, then buckets
        self.recording = True
        self.ready: list[float] = []
        self.sizes: list[int] = []
        self.params: list[list[int]] = []  # each bucket's parameters (indices)
        self.collectives: list[tuple[int, str, int, float]] = []
        self._futures: list[Future] = []
        self._calling = -1

    def hook(self, bucket: dist.GradBucket) -> Future:
        self.ready.append(time.perf_counter() - self.start)
        if self.cuda:
            self._events.append(self._event())
        self.sizes.append(bucket.buffer().numel())
        self.params.append([self.index_of[id(p)] for p in bucket.parameters()])
        with self._lock:
            self._calling = len(self._futures)
        future = self.method(bucket)
        with self._lock:
            self._futures.append(future)
        return future

    @staticmethod
    def _event() -> torch.cuda.Event:
        """A timing event recorded on the current stream now."""
        event = torch.cuda.Event(enable_timing=True)
        event.record()
        return event

    def ready_times(self) -> list[float]:
        """Seconds from backward's start to each bucket's being ready (call once the device is
        idle): on CUDA from the events, else the host's times."""
        if not self.cuda:
            return self.ready
        start, *buckets = self._events
        return [start.elapsed_time(e) / 1e3 for e in buckets]  # elapsed_time: ms

    def note(self, op: str, nbytes: int) -> None:
        """A collective was issued: it belongs to the first bucket not finished yet (buckets
        are chained: bucket b starts after bucket b - 1 has finished), else to the bucket
        whose hook is running."""
        if not self.recording:
            return
        t = time.perf_counter() - self.start
        with self._lock:
            bucket = next((b for b, f in enumerate(self._futures) if not f.done()),
                          self._calling)
            self.collectives.append((bucket, op, nbytes, t))


def dispatch_hook(state: Dispatch, bucket: dist.GradBucket) -> Future[torch.Tensor]:
    """DDP communication hook: the current method's hook."""
    return state.hook(bucket)


def observe_collectives(dispatch: Dispatch) -> None:
    """Make ``torch.distributed``'s collectives report (op, bytes) to ``dispatch`` first."""

    def observed(fn: Callable[..., Any], op: str, position: int, name: str) -> Callable[..., Any]:
        @functools.wraps(fn)
        def call(*args: Any, **kwargs: Any) -> Any:
            tensor = args[position] if len(args) > position else kwargs[name]
            dispatch.note(op, tensor.numel() * tensor.element_size())
            return fn(*args, **kwargs)
        return call

    dist.all_reduce = observed(dist.all_reduce, "all_reduce", 0, "tensor")
    if hasattr(dist, "all_gather_single"):  # torch >= 2.14 (compression.comm.all_gather_single)
        dist.all_gather_single = observed(dist.all_gather_single, "all_gather", 1, "input")
    dist.all_gather_into_tensor = observed(dist.all_gather_into_tensor, "all_gather", 1,
                                           "input_tensor")


# ---- the methods ----------------------------------------------------------------------------
def compute_only(bucket: dist.GradBucket) -> Future[torch.Tensor]:
    """No communication: the bucket's local gradient is the result."""
    done: Future[torch.Tensor] = Future()
    done.set_result(bucket.buffer())
    return done


class Ours:
    """Our hook, as run.py registers it."""

    def __init__(self, name: str, params: dict[str, Any], model: nn.Module,
                 group: dist.ProcessGroup | None = None) -> None:
        self.state = compression.HookState(compression.create(name, **params),
                                           model.named_parameters(), group)

    def __call__(self, bucket: dist.GradBucket) -> Future[torch.Tensor]:
        return comm_hook(self.state, bucket)

    def counters(self) -> tuple[float, float]:
        """Our accounting so far: (wire bits, compressor seconds)."""
        return float(self.state.stats.wire_bits), self.state.stats.timer.seconds


class ChainedTorchPowerSGD:
    """PyTorch's ``powerSGD_hook``, each bucket started after the previous one has finished.

    Unchained on gloo with several buckets it fails: the hook starts bucket b + 1's first
    all-reduce from the backward thread while bucket b's P and Q all-reduces start from
    completion callbacks on gloo's threads, so the ranks can issue collectives in different
    orders. Reproduced with ResNet-18 and 25 MiB buckets at its first compressed step: "gloo
    ... Received data size doesn't match expected size ... collective mismatch", then a
    connection reset (it hangs when the sizes happen to match). One bucket for the whole model
    avoids it but forfeits all overlap; chaining is what our hook does (see
    compression/hook.py), so both are timed alike.
    """

    def __init__(self, rank: int, group: dist.ProcessGroup | None = None,
                 device: torch.device | None = None) -> None:
        # min_compression_rate=1: compress every matrix where (n + m) r < n m, as ours does.
        self.state = torch_psgd.PowerSGDState(
            process_group=group, matrix_approximation_rank=rank, start_powerSGD_iter=2,
            min_compression_rate=1, use_error_feedback=True, warm_start=True)
        # On CUDA the future DDP waits on must name the device, or waiting on it orders no
        # stream after the hook's work (torch/futures/__init__.py, Future.__init__).
        self.devices = [device] if device is not None and device.type == "cuda" else []
        # Its plain all-reduce steps exist for DDP's bucket rebuild, which run_rank's priming
        # steps have done before any method runs: compress from the first step on.
        self.state.iter = self.state.start_powerSGD_iter
        self.previous: Future = Future()
        self.previous.set_result(None)

    def __call__(self, bucket: dist.GradBucket) -> Future[torch.Tensor]:
        done: Future[torch.Tensor] = Future(devices=self.devices)

        def finish(inner: Future) -> None:
            try:
                done.set_result(inner.value())
            except BaseException as exc:  # noqa: BLE001 (handed to DDP through `done`)
                done.set_exception(exc)

        def start(_: Future) -> None:
            try:
                torch_psgd.powerSGD_hook(self.state, bucket).add_done_callback(finish)
            except BaseException as exc:  # noqa: BLE001
                done.set_exception(exc)

        self.previous.add_done_callback(start)
        self.previous = done
        return done


def make_method(spec: dict[str, Any], model: nn.Module, group: dist.ProcessGroup | None = None
                ) -> Callable[[dist.GradBucket], Future] | None:
    """The hook callable of one method of the spec (None for ``dense_alone``); ``group``: the
    process group its collectives use (None: the default one)."""
    kind = spec["kind"]
    if kind == "compute":
        return compute_only
    if kind == "ours":
        return Ours(spec["name"], spec.get("params", {}), model, group)
    if kind == "torch_powersgd":
        return ChainedTorchPowerSGD(int(spec["params"]["rank"]), group,
                                    next(model.parameters()).device)
    if kind == "dense_alone":
        return None
    raise ValueError(f"method kind {kind!r}: expected compute, ours, torch_powersgd or "
                     f"dense_alone")


# ---- one rank -------------------------------------------------------------------------------
def make_batch(spec: dict[str, Any], rank: int) -> tuple[torch.Tensor, torch.Tensor]:
    """A fixed random batch of this rank (timing does not depend on the values)."""
    gen = torch.Generator().manual_seed(1000 + rank)
    b = int(spec["batch"])
    if spec["input"] == "tokens":
        vocab, seq = int(spec["model_kwargs"]["num_classes"]), int(spec["seq"])
        x = torch.randint(0, vocab, (b, seq), generator=gen)
        return x, torch.randint(0, vocab, (b * seq,), generator=gen)
    classes = int(spec["model_kwargs"]["num_classes"])
    return (torch.randn(b, *spec["shape"], generator=gen),
            torch.randint(0, classes, (b,), generator=gen))


def loss(model: nn.Module, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    """The training loss of ``model`` (or its DDP wrapper) on the batch (x, y)."""
    out = model(x)
    if isinstance(out, tuple):  # language models: (logits, hidden)
        out = out[0].reshape(-1, out[0].shape[-1])
    return nn.functional.cross_entropy(out, y)


def _lo_bytes() -> int:
    with open("/proc/net/dev") as f:  # this process's network namespace
        return lo_tx_bytes(f.read())


class Rank:
    """One rank's model, optimizer, methods and measurements."""

    def __init__(self, rank: int, spec: dict[str, Any]) -> None:
        torch.manual_seed(0)  # the same initial model on every rank
        self.rank, self.spec = rank, spec
        self.cuda = spec.get("device", "cpu") == "cuda"
        self.group, self.device = None, torch.device("cpu")  # None: the gloo group
        if self.cuda:  # GPU `rank`, an NCCL group beside run_ranks' gloo one
            torch.cuda.set_device(rank)
            self.group, self.device = dist.new_group(backend="nccl"), torch.device("cuda", rank)
        self.model = models.build(spec["model"], **spec["model_kwargs"]).to(self.device)
        self.ddp = DDP(self.model, bucket_cap_mb=BUCKET_CAP_MB,
                       device_ids=[rank] if self.cuda else None, process_group=self.group)
        self.dispatch = Dispatch({id(p): i for i, p in enumerate(self.model.parameters())},
                                 self.cuda)
        self.ddp.register_comm_hook(self.dispatch, dispatch_hook)
        self.optimizer = torch.optim.SGD(self.model.parameters(), lr=1e-3, momentum=0.9)
        self.x, self.y = (t.to(self.device) for t in make_batch(spec, rank))
        self.methods = {m["key"]: make_method(m, self.model, self.group)
                        for m in spec["methods"]}
        self.bucket_sizes: list[int] = []
        self.bucket_params: list[list[int]] = []

    def sync(self) -> None:
        """On CUDA, wait for the device: a phase's time is then its work, not its launches."""
        if self.cuda:
            torch.cuda.synchronize(self.device)

    def train_step(self, key: str) -> dict[str, Any]:
        """One timed training step of method ``key``."""
        method = self.methods[key]
        before = method.counters() if isinstance(method, Ours) else (0.0, 0.0)
        self.sync()
        start = time.perf_counter()
        self.optimizer.zero_grad(set_to_none=True)
        value = loss(self.ddp, self.x, self.y)
        self.sync()
        t_forward = time.perf_counter()
        self.dispatch.begin(method)  # ready times and collectives: from backward's start
        value.backward()
        self.sync()
        t_backward = time.perf_counter()
        self.optimizer.step()
        self.sync()
        end = time.perf_counter()
        self.dispatch.recording = False
        after = method.counters() if isinstance(method, Ours) else (0.0, 0.0)
        self.bucket_sizes, self.bucket_params = self.dispatch.sizes, self.dispatch.params
        return {"step": end - start, "forward": t_forward - start,
                "backward": t_backward - t_forward, "optimizer": end - t_backward,
                "ready": self.dispatch.ready_times(),
                "collectives": self.dispatch.collectives,
                "wire_bits": after[0] - before[0], "compress_s": after[1] - before[1]}

    def dense_alone(self) -> dict[str, Any]:
        """fp32 all-reduce of every bucket, one after the other, without compute."""
        buffers = [torch.ones(n, device=self.device) for n in self.bucket_sizes]
        self.sync()
        start = time.perf_counter()
        for b in buffers:
            dist.all_reduce(b, group=self.group)
        self.sync()
        return {"step": time.perf_counter() - start}

    def measure(self, key: str) -> dict[str, Any]:
        """One step of ``key`` between barriers; rank 0 adds the lo bytes it moved."""
        dist.barrier()
        lo = _lo_bytes() if self.rank == 0 else 0
        record = self.dense_alone() if self.methods[key] is None else self.train_step(key)
        dist.barrier()
        if self.rank == 0:
            record["lo_bytes"] = _lo_bytes() - lo
        return record

    def latency(self) -> dict[str, float]:
        """Median seconds of a one-float all-reduce and all-gather (alpha, measured)."""
        one = torch.ones(1, device=self.device)
        out = torch.empty(dist.get_world_size(), device=self.device)
        times: dict[str, list[float]] = {"all_reduce": [], "all_gather": []}
        for _ in range(LATENCY_REPEATS):
            for op, call in (("all_reduce", lambda: dist.all_reduce(one, group=self.group)),
                             ("all_gather", lambda: all_gather_single(
                                 out, one, group=self.group))):
                dist.barrier()
                self.sync()
                start = time.perf_counter()
                call()
                self.sync()
                times[op].append(time.perf_counter() - start)
        return {op: statistics.median(v) for op, v in times.items()}


def run_rank(rank: int, world_size: int, spec: dict[str, Any]) -> dict[str, Any]:
    """Everything one rank measures (see the module doc); run by :func:`run_ranks`."""
    me = Rank(rank, spec)
    observe_collectives(me.dispatch)
    keys = [m["key"] for m in spec["methods"]]
    train_keys = [k for k in keys if me.methods[k] is not None]
    for _ in range(2):  # DDP rebuilds its buckets after the first step
        me.measure(train_keys[0])
    steps: dict[str, list[dict[str, Any]]] = {k: [] for k in keys}
    rounds = int(spec["warmup"]) + int(spec["steps"])
    for r in range(rounds):
        order = keys[r % len(keys):] + keys[:r % len(keys)]  # rotate: no method always first
        for key in order:
            record = me.measure(key)
            if r >= int(spec["warmup"]):
                steps[key].append(record)
    return {"rank": rank, "steps": steps, "latency": me.latency(),
            "bucket_sizes": me.bucket_sizes, "bucket_params": me.bucket_params,
            "parameters": sum(p.numel() for p in me.model.parameters())}


def main() -> None:
    spec_path, out_path = Path(sys.argv[1]), Path(sys.argv[2])
    spec = json.loads(spec_path.read_text())
    if "RANK" in os.environ:  # one rank of a job over several hosts (see the module doc)
        torch.set_num_threads(1)
        dist.init_process_group("gloo", timeout=timedelta(seconds=120))
        results = [run_rank(dist.get_rank(), dist.get_world_size(), spec)]
        dist.destroy_process_group()
        out_path.write_text(json.dumps(results))
        # As run.py ends: a gloo worker frees the last collective's tensors (taking the GIL)
        # after wait() returns, and aborts the rank if the interpreter is finalizing by then
        # (a core dump of such a rank 1: ~AsyncAllgatherWork -> take_gil -> thread exit).
        exit_without_teardown(0)
    results = run_ranks(run_rank, int(spec.get("world_size", 2)), (spec,),
                        timeout_s=float(spec.get("timeout_s", 3600)))
    out_path.write_text(json.dumps(results))


if __name__ == "__main__":
    main()
