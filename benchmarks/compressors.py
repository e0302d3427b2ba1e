"""Benchmark the compressors on ResNet-18's gradients; writes results/bench/compressors.{csv,md}.

    make bench-compressors                    # or: .venv/bin/python -m benchmarks.compressors
    make bench-compressors BASELINE=<git ref> # the same, side by side with <ref>'s compressors
    make bench-compressors DEVICE=cuda        # on a GPU: results/bench/compressors_cuda.{csv,md}

1. One step on one worker (a world-size-1 gloo group), for every compressor and level, side by
   side with peers in the same process: a plain ``torch.topk`` Top-K and PyTorch's
   ``powerSGD_hook``. Gradients come from one real backward pass; they are bucketed as DDP
   does (reverse order, 25 MiB). Ours runs :func:`compression.hook.aggregate_bucket`, the hook's
   path after it adds the gradients to Accordion's per-epoch sums (a memory pass, not timed).
   For ours, both the whole step and the compress + decompress work alone (the hook's
   ``time/compress_s``: without the waits for collectives, which on one worker are copies
   inside gloo) are reported; the latter as a ratio to one memory pass over the same gradients,
   ``clone`` (the issue's definition) and a copy into a buffer used before (no page faults: the
   stricter one), against the goals of issue 27 (:data:`GOALS`).
2. Step time of a 2-process DDP ResNet-18 with ``compressor=none`` against DDP's built-in
   all-reduce (no hook).
3. The zoo's compressors (issue 26), each at its light and heavy level beside its nearest peer
   (:mod:`benchmarks.compressor_peers`: PyTorch's fp16 / bf16 hooks, else plain torch).

Each side (this checkout's code, and with ``--baseline REF`` the code of the git commit REF,
checked out into a temporary directory) runs in a process of its own, one thread; the parent
asks them for one step of one method at a time, methods and sides interleaved within every
repeat, so the machine's noise hits them alike. Timings are medians over repeats. The machine's
load average is sampled at every repeat and reported with the table. A side times the
compressors its own code registers (a baseline from before issue 26 has no zoo); benchmark
helpers its tree lacks come from this checkout's (``benchmarks/`` is a namespace package).

With ``--device cuda`` everything runs on GPU 0 (each side's one-worker group is NCCL's) and every
timed call is bracketed by ``torch.cuda.synchronize()``, so a time is the GPU's work, not its
launches; ours' compute is timed with CUDA events (the hook's ``time/compress_s``); the DDP
comparison needs 2 GPUs (skipped with fewer). Without a GPU, ``--device cuda`` says so in one
line and exits 0.

``--programs SPEC OUT`` is ``make bench-e2e``'s use: for a model, its DDP buckets and our
methods, the compression work of each bucket alone (:func:`programs`), as
:class:`benchmarks.netmodel.Program` ops.
"""

from __future__ import annotations

import argparse
import csv
import json
import math
import os
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Generator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.algorithms.ddp_comm_hooks import powerSGD_hook as torch_psgd
from torch.nn.parallel import DistributedDataParallel as DDP

import compression
import models
from benchmarks.compressor_peers import add_zoo
from benchmarks.ranks import run_ranks
from compression.comm import Pending, Timer, drive
from compression.hook import aggregate_bucket, comm_hook
from core import provenance
from core.process import exit_without_teardown

OUT = Path("results/bench")
ROOT = Path(__file__).resolve().parents[1]
CPU = torch.device("cpu")
BUCKET_BYTES = 25 * 2**20
POWERSGD_RANKS = (1, 2, 4)
TOPK_RATIOS = (0.99, 0.25, 0.1, 0.02)
ADACOMP_BINS = ((50, 500), (500, 5000), (5000, 50000))
# Issue 27's goals, in memory passes (`clone`) of the compress + decompress work, and for
# PowerSGD rank 2 / 4 also against PyTorch's hook (whole steps).
GOALS = {"psgd1": (2.0, None), "psgd2": (3.0, 0.25), "psgd4": (3.0, 0.25),
         "topk0.99": (5.0, None), "topk0.25": (3.0, None), "topk0.1": (3.0, None),
         "topk0.02": (3.0, None), **{f"adacomp{c}/{f}": (1.8, None) for c, f in ADACOMP_BINS}}
# Each goal's floor (:func:`floor_pass`): the method key it is timed as.
FLOORS = {**{f"psgd{r}": "floor-psgd" for r in POWERSGD_RANKS},
          **{f"topk{r}": f"floor-topk{r}" for r in TOPK_RATIOS},
          **{f"adacomp{c}/{f}": "floor-adacomp" for c, f in ADACOMP_BINS}}


class Bucket:
    """What a DDP comm hook sees of a bucket (the methods both hooks call)."""

    def __init__(self, index: int, params: list[tuple[str, nn.Parameter]], last: bool) -> None:
        self._index, self._last = index, last
        self.names = [n for n, _ in params]
        self._params = [p for _, p in params]
        self._buffer = self._params[0].new_empty(sum(p.numel() for p in self._params))
        self._grads, offset = [], 0
        for p in self._params:
            self._grads.append(self._buffer[offset:offset + p.numel()].view_as(p))
            offset += p.numel()
        self.saved = torch.cat([p.grad.reshape(-1) for p in self._params])

    def index(self) -> int:
        return self._index

    def buffer(self) -> torch.Tensor:
        return self._buffer

    def gradients(self) -> list[torch.Tensor]:
        return self._grads

    def parameters(self) -> list[nn.Parameter]:
        return self._params

    def is_last(self) -> bool:
        return self._last

    def restore(self) -> None:
        """Put the original gradient back (every method overwrites it)."""
        self._buffer.copy_(self.saved)


def resnet18_buckets(batch: int = 16, device: torch.device = CPU, **keys: Any
                     ) -> tuple[nn.Module, list[Bucket]]:
    """ResNet-18 (CIFAR; ``keys``: other model keys, e.g. ``width``, its first stage's
    channels) on ``device`` with the gradients of one backward pass, bucketed like DDP."""
    torch.manual_seed(0)
    model = models.build("resnet18", num_classes=10, **keys).to(device)
    x, y = torch.randn(batch, 3, 32, 32), torch.randint(0, 10, (batch,))
    x, y = x.to(device), y.to(device)
    nn.functional.cross_entropy(model(x), y).backward()
    groups: list[list[tuple[str, nn.Parameter]]] = [[]]
    size = 0
    for name, p in reversed(list(model.named_parameters())):
        if groups[-1] and size + 4 * p.numel() > BUCKET_BYTES:
            groups.append([])
            size = 0
        groups[-1].append((name, p))
        size += 4 * p.numel()
    return model, [Bucket(i, g, i == len(groups) - 1) for i, g in enumerate(groups)]


# ---- the methods timed ---------------------------------------------------------------------
def clone_pass(buckets: list[Bucket]) -> Callable[[], None]:
    """One memory pass as the issue defines it: ``clone`` every gradient."""
    grads = [g for b in buckets for g in b.gradients()]
    return lambda: [g.clone() for g in grads] and None


def copy_pass(buckets: list[Bucket]) -> Callable[[], None]:
    """One memory pass without allocation: copy every gradient into a buffer used before."""
    grads = [g for b in buckets for g in b.gradients()]
    copies = [torch.empty_like(g) for g in grads]
    return lambda: [c.copy_(g) for c, g in zip(copies, grads, strict=True)] and None


# Each floor's passes, as the algorithm's collectives order them: a phase is what every
# compressed layer of a bucket does before the bucket's next collective can start (so a layer
# meets its M again from cache only within a phase). "add": M = g + e, into the error memory
# (reads two arrays, writes one); "read": a read of M; "message": the message written (2k
# words); "decode": the message read; "write": the output written.
FLOOR_PHASES = {
    "psgd": (("add",), ("read",), ("write",)),      # P = M Q | all-reduce | Q = M^T P | ... | out
    "topk": (("add", "read", "message"), ("decode", "write")),  # compress | all-gather | decode
    "adacomp": (("add",), ("write",)),              # compress | all-gather | decode
}


def floor_ops(buckets: list[Bucket], phases: tuple[tuple[str, ...], ...],
              ratio: float | None = None) -> list[tuple[str, Callable[[], Any]]]:
    """The floor's streaming ops in the order a step runs them: bucket after bucket, within a
    bucket phase after phase (:data:`FLOOR_PHASES`), within a phase layer after layer. Only the
    compressed (matrix-shaped) layers take part, each with an error memory (and, with a Top-K
    ``ratio``, a message) of its own. Returns (op name, op) pairs."""
    ops: list[tuple[str, Callable[[], Any]]] = []
    for bucket in buckets:
        layers = [_floor_layer(g.view(-1), ratio) for g in bucket.gradients() if g.ndim > 1]
        ops += [(name, layer[name]) for phase in phases for layer in layers for name in phase]
    return ops


def _floor_layer(g: torch.Tensor, ratio: float | None) -> dict[str, Callable[[], Any]]:
    """One layer's floor ops by name (:data:`FLOOR_PHASES`), over its flat gradient ``g``, an
    error memory and a message (2k words at a Top-K ``ratio``) of its own."""
    e = torch.zeros_like(g)
    message = g.new_empty(2 * max(1, math.floor((ratio or 0) * g.numel())))
    return {"add": lambda: e.add_(g), "read": e.sum, "message": message.zero_,
            "decode": message.sum, "write": g.zero_}


def floor_pass(buckets: list[Bucket], phases: tuple[tuple[str, ...], ...],
               ratio: float | None = None) -> Callable[[], None]:
    """The memory traffic a compressor's algorithm cannot avoid, as plain torch streaming ops
    (:func:`floor_ops`) in the order its collectives force (docs/performance.md, "How the
    compressors reach their speed")."""
    ops = [op for _, op in floor_ops(buckets, phases, ratio)]
    return lambda: [op() for op in ops] and None


def floors(buckets: list[Bucket]) -> dict[str, tuple[str, str, Callable[[], None]]]:
    """Every floor of :data:`FLOORS` by key: (its table row's method, level, step)."""
    found = {"floor-psgd": ("floor: PowerSGD's passes (M = g + e; read M; write out)", "-",
                            floor_pass(buckets, FLOOR_PHASES["psgd"])),
             "floor-adacomp": ("floor: AdaComp's passes (M = g + e; write out)", "-",
                               floor_pass(buckets, FLOOR_PHASES["adacomp"]))}
    for ratio in TOPK_RATIOS:
        found[f"floor-topk{ratio}"] = ("floor: Top-K's passes (M = g + e, read M, write the "
                                       "message; read it, write out)", f"ratio {ratio}",
                                       floor_pass(buckets, FLOOR_PHASES["topk"], ratio))
    return found


class Ours:
    """The hook's path for our compressor ``name`` (memories kept from step to step).

    Calling it runs one step, bucket after bucket (as the hook chains them); :attr:`timer` sums
    the time spent in the compressor's own steps (compress and decompress, as the hook's
    ``time/compress_s``), without the waits for the collectives (here a world-size-1 group,
    which still copies the data).
    """

    def __init__(self, name: str, model: nn.Module, buckets: list[Bucket], **params: Any
                 ) -> None:
        self.state = compression.HookState(compression.create(name, **params),
                                           model.named_parameters())
        self.buckets = buckets
        self.timer = hook_timer(buckets[0].buffer().device)

    def __call__(self) -> None:
        state = self.state
        for b in self.buckets:
            dense, layers, grads = state.split(b.names, b.gradients(), b.buffer())
            drive(aggregate_bucket(state.compressor, dense, layers, grads, state.comm),
                  self.timer).wait()


def hook_timer(device: torch.device) -> Timer:
    """The hook's timer of compressor work on ``device`` (``compression.comm.timer_for``: CUDA
    events on CUDA). A side's code from before issue 28 has none: it is timed on the CPU only."""
    if device.type == "cpu":
        return Timer()
    try:
        from compression.comm import timer_for
    except ImportError:
        raise SystemExit("--device cuda: this side's compression.comm has no timer_for (it "
                         "predates issue 28's CUDA timing); compare it with --device cpu") from None
    return timer_for(device)


def torch_powersgd(rank: int, buckets: list[Bucket]) -> Callable[[], None]:
    state = torch_psgd.PowerSGDState(
        process_group=None, matrix_approximation_rank=rank, start_powerSGD_iter=2,
        min_compression_rate=1, use_error_feedback=True, warm_start=True,
        orthogonalization_epsilon=1e-8)

    def step() -> None:
        # One bucket at a time: its callbacks wait on collectives, and with several buckets in
        # flight on gloo that can deadlock (seen here). On one worker this costs it nothing.
        for b in buckets:
            torch_psgd.powerSGD_hook(state, b).wait()

    for _ in range(3):  # past its plain all-reduce steps
        step()
    return step


def torch_topk(ratio: float, buckets: list[Bucket]) -> Callable[[], None]:
    """Top-K written plainly with torch.topk: select, then scatter back (no error feedback)."""
    grads = [g for b in buckets for g in b.gradients() if g.ndim > 1]

    def step() -> None:
        for g in grads:
            flat = g.reshape(-1)
            k = max(1, math.floor(ratio * flat.numel()))
            index = torch.topk(flat.abs(), k, sorted=False).indices
            values = flat[index]
            torch.zeros_like(flat).scatter_(0, index, values)

    return step


def compressor_methods(model: nn.Module, buckets: list[Bucket]
                       ) -> tuple[dict[str, Callable[[], None]], list[dict[str, Any]]]:
    """Every method timed, and a row per method reported (with its peer)."""
    methods: dict[str, Callable[[], None]] = {"clone": clone_pass(buckets),
                                              "copy": copy_pass(buckets)}
    rows: list[dict[str, Any]] = []

    def add(key: str, method: str, level: str, peer: str | None = None) -> None:
        rows.append({"key": key, "method": method, "level": level, "peer": peer})

    add("clone", "memory pass (clone)", "-")
    add("copy", "memory pass (copy into a used buffer)", "-")
    add("none", "ours none (fp32 all-reduce)", "-")
    for key, (method, level, step) in floors(buckets).items():
        methods[key] = step
        add(key, method, level)
    methods["none"] = Ours("none", model, buckets)
    for r in POWERSGD_RANKS:
        methods[f"psgd{r}"] = Ours("powersgd", model, buckets, rank=r)
        methods[f"torch-psgd{r}"] = torch_powersgd(r, buckets)
        add(f"psgd{r}", "ours powersgd", f"rank {r}", f"torch-psgd{r}")
        add(f"torch-psgd{r}", "PyTorch powerSGD_hook", f"rank {r}")
    for ratio in TOPK_RATIOS:
        methods[f"topk{ratio}"] = Ours("topk", model, buckets, ratio=ratio)
        methods[f"torch-topk{ratio}"] = torch_topk(ratio, buckets)
        add(f"topk{ratio}", "ours topk", f"ratio {ratio}", f"torch-topk{ratio}")
        add(f"torch-topk{ratio}", "plain torch.topk Top-K", f"ratio {ratio}")
    for conv, fc in ADACOMP_BINS:
        for soft in (True, False):
            key = f"adacomp{conv}/{fc}{'' if soft else '-hard'}"
            methods[key] = Ours("adacomp", model, buckets, conv_bin_size=conv,
                                fc_bin_size=fc, soft_threshold=soft)
            add(key, "ours adacomp" + ("" if soft else " (hard LS)"), f"L_T {conv}/{fc}")
    add_zoo(methods, rows, lambda name, **params: Ours(name, model, buckets, **params), buckets)
    return methods, rows


# ---- one side: a process timing one checkout's methods on request --------------------------
def run_step(fn: Callable[[], None], buckets: list[Bucket]) -> tuple[float, float | None]:
    """One step of method ``fn`` on the original gradients: (whole step, the compressor's own
    work for ours, else None) in seconds. On CUDA the step starts and ends with the device idle
    (``torch.cuda.synchronize``)."""
    sync = torch.cuda.synchronize if buckets[0].buffer().is_cuda else (lambda: None)
    for b in buckets:
        b.restore()
    before = fn.timer.seconds if isinstance(fn, Ours) else 0.0
    sync()
    start = time.perf_counter()
    fn()
    sync()
    total = time.perf_counter() - start
    return total, fn.timer.seconds - before if isinstance(fn, Ours) else None


def one_worker_group(device: torch.device) -> None:
    """A world-size-1 process group for ``device``: gloo on the CPU, NCCL on a GPU."""
    if device.type == "cuda":
        torch.cuda.set_device(device)
        dist.init_process_group("nccl", store=dist.HashStore(), rank=0, world_size=1,
                                device_id=device)
    else:
        dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)


def worker(width: int, device: torch.device) -> None:
    """The loop of a side's process: build the methods (ResNet-18 of ``width`` on ``device``),
    then answer one request per line of stdin (a method key: run one step of it) with a JSON
    line on stdout (:func:`run_step`'s seconds). The first line out lists the rows."""
    out = os.fdopen(os.dup(sys.stdout.fileno()), "w")
    sys.stdout = sys.stderr  # whatever else prints must not corrupt the replies
    torch.set_num_threads(1)
    one_worker_group(device)
    model, buckets = resnet18_buckets(device=device, width=width)
    methods, rows = compressor_methods(model, buckets)
    print(json.dumps(rows), file=out, flush=True)
    for line in sys.stdin:
        print(json.dumps(run_step(methods[line.strip()], buckets)), file=out, flush=True)
    dist.destroy_process_group()


class Side:
    """One checkout's code in a process of its own: ``script``'s ``--worker`` mode (this file's:
    :func:`worker`) with ``args``, on the checkout's packages. Its first line out is kept in
    :attr:`rows` (what it can time); :meth:`run` asks for one key and returns the JSON reply.
    ``label``: the make target named when the process dies."""

    def __init__(self, name: str, tree: Path, args: list[str], script: Path = Path(__file__),
                 label: str = "bench-compressors") -> None:
        self.name, self.label = name, label
        # The tree's packages first; then this checkout's, for benchmark helpers it lacks.
        path = os.pathsep.join(dict.fromkeys([str(tree), str(ROOT)]))
        env = {**os.environ, "PYTHONPATH": path, "OMP_NUM_THREADS": "1"}
        self.proc = subprocess.Popen([sys.executable, str(script.resolve()), "--worker", *args],
                                     cwd=tree, env=env, stdin=subprocess.PIPE,
                                     stdout=subprocess.PIPE, text=True)
        self.rows: list[Any] = self._reply()

    def run(self, key: str) -> Any:
        """One request: here one step of method ``key``, [whole step, compressor's own work] in
        seconds."""
        self.proc.stdin.write(key + "\n")
        self.proc.stdin.flush()
        return self._reply()

    def _reply(self) -> Any:
        line = self.proc.stdout.readline()
        if not line:
            raise RuntimeError(f"{self.label}: the {self.name} side exited "
                               f"(code {self.proc.wait()}); see its output above")
        return json.loads(line)

    def close(self) -> None:
        self.proc.stdin.close()
        self.proc.wait(timeout=120)


@contextmanager
def checkout(ref: str) -> Generator[Path, None, None]:
    """The files of git commit ``ref`` of this repository, in a temporary directory."""
    with tempfile.TemporaryDirectory(prefix="bench-baseline-") as tmp:
        archive = subprocess.run(["git", "-C", str(ROOT), "archive", "--format=tar", ref],
                                 capture_output=True, check=False)
        if archive.returncode != 0:
            raise SystemExit(f"--baseline: git cannot read {ref!r}: "
                             f"{archive.stderr.decode().strip()}")
        subprocess.run(["tar", "-x", "-C", tmp], input=archive.stdout, check=True)
        yield Path(tmp)


def alternate(plan: list[tuple[str, list[Side]]], repeats: int, warmup: int = 2
              ) -> tuple[dict[tuple[str, str], list[Any]], list[float]]:
    """Run each key of ``plan`` on each of its sides (those whose code has it), key after key,
    repeat after repeat: each key on its sides back to back, the sides taking turns going first
    (ABBA: the first meets the caches the previous key left). Returns every repeat's replies by
    (side name, key), the ``warmup`` first ones included, and the 1-minute load average at each
    measured repeat."""
    replies: dict[tuple[str, str], list[Any]] = {(s.name, k): [] for k, on in plan for s in on}
    load = []
    for repeat in range(warmup + repeats):
        if repeat >= warmup:
            load.append(os.getloadavg()[0])
        for key, on in plan:
            for side in on if repeat % 2 == 0 else on[::-1]:
                replies[(side.name, key)].append(side.run(key))
    return replies, load


def time_sides(sides: list[Side], repeats: int, warmup: int = 2
               ) -> tuple[dict[str, dict[str, dict[str, float]]], list[float]]:
    """Per side, per method key: median whole step and (ours) compressor work, seconds; and the
    1-minute load average sampled at every measured repeat."""
    keys = list(dict.fromkeys(row["key"] for s in sides for row in s.rows))
    has = {s.name: {row["key"] for row in s.rows} for s in sides}  # a side's code may lack one
    replies, load = alternate([(k, [s for s in sides if k in has[s.name]]) for k in keys],
                              repeats, warmup)
    samples = {s.name: {k: replies[(s.name, k)][warmup:] for k in has[s.name]} for s in sides}
    medians = {name: {key: {"total": statistics.median(t for t, _ in runs),
                            "work": statistics.median(w for _, w in runs) if runs[0][1]
                            is not None else None}
                      for key, runs in by_key.items()}
               for name, by_key in samples.items()}
    return medians, load


# ---- 2-process DDP: none vs built-in ---------------------------------------------------------
def _ddp_steps(rank: int, world: int, steps: int, batch: int, width: int, cuda: bool = False
               ) -> dict[str, float]:
    """Step times of DDP's built-in all-reduce and of our ``none`` hook on this rank (``cuda``:
    on GPU ``rank`` through an NCCL group over :func:`run_ranks`' gloo ranks)."""
    group, device = None, CPU
    if cuda:
        torch.cuda.set_device(rank)
        group, device = dist.new_group(backend="nccl"), torch.device("cuda", rank)
    sync = torch.cuda.synchronize if cuda else (lambda: None)
    runs = {}
    for key in ("builtin", "none"):
        torch.manual_seed(0)
        model = models.build("resnet18", num_classes=10, width=width).to(device)
        ddp = DDP(model, device_ids=[rank] if cuda else None, process_group=group)
        if key == "none":
            state = compression.HookState(compression.create("none"), model.named_parameters(),
                                          group)
            ddp.register_comm_hook(state, comm_hook)
        runs[key] = (ddp, torch.optim.SGD(model.parameters(), lr=0.01))
    gen = torch.Generator().manual_seed(rank)
    x, y = torch.randn(batch, 3, 32, 32, generator=gen), torch.randint(0, 10, (batch,),
                                                                        generator=gen)
    x, y = x.to(device), y.to(device)
    times: dict[str, list[float]] = {k: [] for k in runs}
    for step in range(steps + 2):
        for key, (ddp, opt) in runs.items():
            dist.barrier()
            sync()
            start = time.perf_counter()
            opt.zero_grad()
            nn.functional.cross_entropy(ddp(x), y).backward()
            opt.step()
            sync()
            if step >= 2:  # after DDP's bucket rebuild
                times[key].append(time.perf_counter() - start)
    return {k: statistics.median(v) for k, v in times.items()}


# ---- bench-e2e's isolated compression work -------------------------------------------------
class Recorder:
    """A :class:`~compression.comm.Comm` that notes when each collective starts, between the
    CPU work of the steps it serves (see :func:`record`). On CUDA (``sync``: waits for the
    device) that work is the GPU's: the device is idle at each lap, and a collective is over
    before the clock starts again."""

    def __init__(self, comm: Any, sync: Callable[[], None] = lambda: None) -> None:
        self.comm, self.world_size, self.shares_gather = comm, comm.world_size, comm.shares_gather
        self.sync = sync
        self.ops: list[tuple[str, float]] = []
        self.started: list[Pending] = []
        self.last = time.perf_counter()

    def lap(self) -> None:
        """The work since the last op."""
        self.sync()
        now = time.perf_counter()
        self.ops.append(("cpu", now - self.last))
        self.last = now

    def restart(self) -> None:
        """Start the clock again (with the device idle)."""
        self.sync()
        self.last = time.perf_counter()

    def _note(self, pending: Pending) -> Pending:
        self.lap()
        self.ops.append(("start", len(self.started)))
        self.started.append(pending)
        self.restart()
        return pending

    def all_reduce(self, tensor: torch.Tensor) -> Pending:
        return self._note(self.comm.all_reduce(tensor))

    def all_gather(self, tensor: torch.Tensor, out: torch.Tensor | None = None) -> Pending:
        return self._note(self.comm.all_gather(tensor, out))


def record(steps: Generator[Pending, Any, Any], recorder: Recorder) -> list[tuple[str, float]]:
    """Run a bucket's steps to the end, noting its CPU work, the starts of its collectives and
    where it waits for each (the waits themselves, copies on one worker, are not counted)."""
    recorder.ops, recorder.started = [], []
    recorder.restart()
    value = None
    while True:
        try:
            pending = steps.send(value)
        except StopIteration:
            recorder.lap()
            return recorder.ops
        recorder.lap()
        recorder.ops.append(("wait", next(i for i, p in enumerate(recorder.started)
                                          if p is pending)))
        pending.future.wait()
        value = pending.result
        recorder.restart()


def programs(spec: dict[str, Any]) -> dict[str, list[list[tuple[str, float]]]]:
    """Per method of ``spec["methods"]`` (our compressors), per DDP bucket of
    ``spec["bucket_params"]`` (parameter indices), the median program of ``spec["repeats"]``
    steps after two warm-up steps, on the gradients of one backward pass of ``spec["model"]``
    (a :mod:`benchmarks.e2e` model spec; with ``"device": "cuda"`` on GPU 0) on one worker, one
    thread."""
    from benchmarks.e2e_ranks import loss, make_batch

    torch.set_num_threads(1)
    torch.manual_seed(0)
    model_spec = spec["model"]
    cuda = model_spec.get("device", "cpu") == "cuda"
    device = torch.device("cuda", 0) if cuda else CPU
    one_worker_group(device)
    model = models.build(model_spec["model"], **model_spec["model_kwargs"]).to(device)
    loss(model, *(t.to(device) for t in make_batch(model_spec, rank=0))).backward()
    named = list(model.named_parameters())
    buckets = [Bucket(b, [named[i] for i in indices], b == len(spec["bucket_params"]) - 1)
               for b, indices in enumerate(spec["bucket_params"])]
    found = {}
    for method in spec["methods"]:
        state = compression.HookState(compression.create(method["name"], **method["params"]),
                                      model.named_parameters())
        recorder = Recorder(state.comm, torch.cuda.synchronize if cuda else lambda: None)
        runs = []
        for _ in range(2 + int(spec["repeats"])):
            step = []
            for b in buckets:
                b.restore()
                dense, layers, grads = state.split(b.names, b.gradients(), b.buffer())
                step.append(record(aggregate_bucket(state.compressor, dense, layers, grads,
                                                    recorder), recorder))
            runs.append(step)
        found[method["key"]] = [[(op, statistics.median(run[b][i][1] for run in runs[2:])
                                  if op == "cpu" else x) for i, (op, x) in enumerate(ops)]
                                for b, ops in enumerate(runs[-1])]
    dist.destroy_process_group()
    return found


# ---- report ---------------------------------------------------------------------------------
def table_rows(rows: list[dict[str, Any]], median: dict[str, dict[str, float]]
               ) -> dict[str, dict[str, Any]]:
    """One side's table by method key: times, ratios to a memory pass and to the peer, issue
    27's goal."""
    clone = median["clone"]["total"]
    table = {}
    for row in rows:
        key = row["key"]
        total, work = median[key]["total"], median[key]["work"]
        x_peer = total / median[row["peer"]]["total"] if row["peer"] else None
        x_clone = (total if work is None else work) / clone
        floor = median.get(FLOORS.get(key, ""), {}).get("total")
        goal, met = goal_of(key, x_clone, x_peer, None if floor is None else floor / clone)
        table[key] = {"method": row["method"], "level": row["level"], "ms": total * 1e3,
                      "compute_ms": "" if work is None else work * 1e3, "x_clone": x_clone,
                      "x_copy": (total if work is None else work) / median["copy"]["total"],
                      "x_peer": "" if x_peer is None else x_peer, "goal": goal, "met": met,
                      "floor_x_clone": "" if floor is None else floor / clone,
                      "x_floor": "" if floor is None else (total if work is None else work)
                      / floor}
    return table


def combine(rounds: list[dict[str, dict[str, Any]]]) -> dict[str, dict[str, Any]]:
    """One side's table from its tables of several rounds: per method, the row of its median
    round by ``x clone`` (the lower middle one for an even count), its ``x clone`` in every
    round (``x_clone_rounds``), and its goal met in every round or in none (the median round's
    own "yes" or "no"), or "in k of N rounds"."""
    table = {}
    for key in rounds[0]:
        rows = [r[key] for r in rounds]
        row = dict(sorted(rows, key=lambda r: r["x_clone"])[(len(rows) - 1) // 2])
        row["x_clone_rounds"] = " / ".join(f"{r['x_clone']:.2f}" for r in rows)
        met = sum(r["met"] == "yes" for r in rows)
        if row["goal"] and 0 < met < len(rows):
            row["met"] = f"in {met} of {len(rows)} rounds"
        table[key] = row
    return table


def goal_of(key: str, x_clone: float, x_peer: float | None, floor: float | None = None
            ) -> tuple[str, str]:
    """Issue 27's goal for method ``key`` and whether it is met; "no, below the floor" where
    the algorithm's own memory traffic (``floor``, in clone passes) already costs more."""
    if key not in GOALS:
        return "", ""
    passes, peer = GOALS[key]
    goal = f"<= {passes:g}x clone" + ("" if peer is None else f", <= {peer:g}x peer")
    if x_clone <= passes and (peer is None or x_peer <= peer):
        return goal, "yes"
    return goal, "no, below the floor" if floor is not None and floor > passes else "no"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--repeats", type=int, default=15)
    parser.add_argument("--rounds", type=int, default=1,
                        help="time everything this many times, round after round (this VM's "
                             "memory speed drifts over minutes): each method's median round, "
                             "and in how many rounds it met its goal")
    parser.add_argument("--ddp-steps", type=int, default=12)
    parser.add_argument("--baseline", metavar="REF", default=None,
                        help="also time the compressors of git commit REF, side by side")
    parser.add_argument("--out", type=Path, default=OUT)
    parser.add_argument("--width", type=int, default=64,
                        help="ResNet-18's first-stage channels (64: the real one; 8: a check)")
    parser.add_argument("--device", choices=("cpu", "cuda"), default="cpu",
                        help="cuda: every side on GPU 0 -> compressors_cuda.{csv,md}")
    parser.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--programs", nargs=2, type=Path, metavar=("SPEC", "OUT"),
                        help="bench-e2e: write the compression programs of SPEC's model")
    args = parser.parse_args(argv)
    if args.rounds < 1:
        parser.error(f"--rounds must be a whole number of 1 or more, got {args.rounds}")
    cuda = args.device == "cuda"
    if args.worker:
        worker(args.width, torch.device("cuda", 0) if cuda else CPU)
        exit_without_teardown(0)  # every reply is out; gloo's threads may abort a teardown
    if args.programs:
        spec_path, out_path = args.programs
        out_path.write_text(json.dumps(programs(json.loads(spec_path.read_text()))))
        return 0
    if cuda and not torch.cuda.is_available():
        print("bench-compressors: skipped: DEVICE=cuda but torch sees no CUDA device here")
        return 0
    load_before, started = os.getloadavg(), time.perf_counter()
    made_by = provenance.made_here()
    with checkout(args.baseline) if args.baseline else _nothing() as tree:
        width_device = ["--width", str(args.width), "--device", args.device]
        sides = [Side("this", ROOT, width_device)] + (
            [Side("baseline", tree, width_device)] if tree else [])
        try:
            rounds = [time_sides(sides, args.repeats) for _ in range(args.rounds)]
        finally:
            for side in sides:
                side.close()
    tables = {s.name: combine([table_rows(s.rows, median[s.name]) for median, _ in rounds])
              for s in sides}
    load = [x for _, loads in rounds for x in loads]
    ddp = (None if cuda and torch.cuda.device_count() < 2 else
           run_ranks(_ddp_steps, 2, (args.ddp_steps, 16, args.width, cuda))[0])
    context = {"repeats": args.repeats, "rounds": args.rounds, "width": args.width,
               "baseline": describe(args.baseline),
               "this": describe("HEAD") + (" + uncommitted changes"
                                            if provenance.code_changed() else ""),
               "device": args.device, "load_before": load_before, "made_by": made_by,
               "load_after": os.getloadavg(), "load": load,
               "minutes": (time.perf_counter() - started) / 60}
    write(tables, ddp, context, args.out)
    return 0


@contextmanager
def _nothing() -> Generator[None, None, None]:
    yield None


def describe(ref: str | None) -> str | None:
    """``ref`` as its short commit hash and commit date (None: no baseline)."""
    if ref is None:
        return None
    done = subprocess.run(["git", "-C", str(ROOT), "log", "-1", "--format=%h (%cs)", ref],
                          capture_output=True, text=True, check=False)
    return done.stdout.strip() if done.returncode == 0 else ref


# The full table's columns (row keys), in order.
COLUMNS = ["method", "level", "ms", "compute_ms", "x_clone", "x_copy", "x_peer", "goal", "met",
           "floor_x_clone", "x_floor"]
FORMATS = {"ms": "{:.2f}", "compute_ms": "{:.2f}", "x_clone": "{:.2f}", "x_copy": "{:.2f}",
           "x_peer": "{:.2f}", "floor_x_clone": "{:.2f}", "x_floor": "{:.2f}"}


def _cells(row: dict[str, Any]) -> dict[str, str]:
    return {k: (FORMATS[k].format(v) if k in FORMATS and v != "" else str(v))
            for k, v in row.items()}


def ddp_rows(ddp: dict[str, float] | None, cuda: bool) -> list[dict[str, Any]]:
    """The table's rows of the 2-process DDP comparison (``ddp`` None: skipped, fewer than 2
    GPUs)."""
    blank = {"ms": "", "compute_ms": "", "x_clone": "", "x_copy": "", "x_peer": "", "goal": "",
             "met": "", "floor_x_clone": "", "x_floor": "", "x_clone_rounds": ""}
    methods = ("DDP step, built-in all-reduce", "DDP step, ours none hook")
    if ddp is None:
        return [{"method": m, "level": "skipped: needs 2 GPUs", **blank} for m in methods]
    ratio = ddp["none"] / ddp["builtin"]
    level = "2 GPUs" if cuda else "2 proc"
    return [{"method": methods[0], "level": level, **blank, "ms": ddp["builtin"] * 1e3},
            {"method": methods[1], "level": level, **blank, "ms": ddp["none"] * 1e3,
             "x_peer": ratio, "goal": "<= 1.05x peer", "met": "yes" if ratio <= 1.05 else "no"}]


def write(tables: dict[str, dict[str, dict[str, Any]]], ddp: dict[str, float] | None,
          context: dict[str, Any], out: Path) -> None:
    """compressors.csv (every side's rows) and compressors.md (``compressors_cuda.*`` on CUDA):
    the side-by-side table of issue 27's goals (with a baseline), this side's full table, the
    DDP rows and the run's context."""
    out.mkdir(parents=True, exist_ok=True)
    cuda = context["device"] == "cuda"
    stem = "compressors_cuda" if cuda else "compressors"
    this = list(tables["this"].values())
    ddp_part = ddp_rows(ddp, cuda)
    with open(out / f"{stem}.csv", "w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=["side", *this[0]])
        writer.writeheader()
        for side, rows in tables.items():
            writer.writerows({"side": side, **_cells(row)} for row in rows.values())
        writer.writerows({"side": "this", **_cells(row)} for row in ddp_part)
    load = context["load"]
    where = (f"{torch.cuda.get_device_name(0)}, a world-size-1 NCCL group" if cuda
             else "a world-size-1 gloo group, 1 thread")
    several = context["rounds"] > 1
    fields = COLUMNS + (["x_clone_rounds"] if several else [])  # the full table's
    per_round = (f" in each of {context['rounds']} rounds, one after another; each method's row "
                 f"is its median round by `x clone`" if several else "")
    lines = [f"ResNet-18 gradients ({_size(context['width'])}), 1 worker ({where}); "
             f"median of {context['repeats']} interleaved repeats{per_round}. This side: "
             f"{context['this']}." + (f" Baseline: {context['baseline']} (each method on both "
                                      f"sides back to back, the sides taking turns going first)."
                                      if context["baseline"] else "") +
             f" Took {context['minutes']:.1f} min; load average (1 min) at the repeats: min "
             f"{min(load):.2f}, median {statistics.median(load):.2f}, max {max(load):.2f} "
             f"(1/5/15 min before: {_loads(context['load_before'])}; after: "
             f"{_loads(context['load_after'])}) on {os.cpu_count()} CPUs. Machine and code "
             f"(this side): {context['made_by']}.", ""]
    if "baseline" in tables:
        pairs = [(tables["baseline"][key], t) for key, t in tables["this"].items()
                 if t["goal"] and key in tables["baseline"]]
        lines += ["**Issue 27's goals**: the compressor's own work (compress + decompress) in "
                  "memory passes (`x clone`), baseline and this side measured in the same run; "
                  "`x peer`: whole step over PyTorch's hook.", "",
                  *_table(["method", "level", "baseline ms", "this ms", "baseline x clone",
                           "this x clone", *(["this x clone per round"] if several else []),
                           "speed-up", "this x peer", "goal", "met", "floor x clone",
                           "this x floor"],
                          [[b["method"], b["level"], _cells(b)["compute_ms"],
                            _cells(t)["compute_ms"], _cells(b)["x_clone"], _cells(t)["x_clone"],
                            *([t["x_clone_rounds"]] if several else []),
                            f"{b['compute_ms'] / t['compute_ms']:.2f}x", _cells(t)["x_peer"],
                            t["goal"], t["met"], _cells(t)["floor_x_clone"],
                            _cells(t)["x_floor"]] for b, t in pairs]), ""]
        lines += _others(tables)
    lines += ["`ms / step`: the hook's whole path, collectives included. `compress + decompress "
              "ms`: our compressor's own work (what `time/compress_s` counts). `x clone` / "
              "`x copy`: that work (for peers, their whole step) over one memory pass, `clone` "
              "or a copy into a used buffer (no page faults). `x peer`: whole step over the "
              "peer's. `floor`: the memory traffic the method's algorithm cannot avoid, timed "
              "as plain torch streaming ops on the same layers, in the order the method's "
              "collectives force (`;` between phases in the `floor:` rows; "
              "`floor x clone`: the floor in clone passes, `x floor`: the work over it); a goal "
              "below the floor is marked so. DDP rows: step time, 2 processes." + (
                  " `x clone per round`: each round's; `met`: in every round (yes), in none "
                  "(no), or in how many." if several else ""), "",
              *_table(["method", "level", "ms / step", "compress + decompress ms", "x clone",
                       "x copy", "x peer", "goal", "met", "floor x clone", "x floor",
                       *(["x clone per round"] if several else [])],
                      [[cells[field] for field in fields]
                       for cells in map(_cells, this + ddp_part)])]
    (out / f"{stem}.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))


def _others(tables: dict[str, dict[str, dict[str, Any]]]) -> list[str]:
    """The side-by-side lines of every other method both sides time (ours without a goal: the
    zoo's, where the baseline has them): its work on both sides, and the speed-up."""
    pairs = [(tables["baseline"][key], t) for key, t in tables["this"].items()
             if not t["goal"] and t["compute_ms"] != "" and key in tables["baseline"]]
    if not pairs:
        return []
    return ["**Every other method both sides time**: the compressor's own work (compress + "
            "decompress), baseline and this side in the same run.", "",
            *_table(["method", "level", "baseline ms", "this ms", "speed-up"],
                    [[b["method"], b["level"], _cells(b)["compute_ms"], _cells(t)["compute_ms"],
                      f"{b['compute_ms'] / t['compute_ms']:.2f}x"] for b, t in pairs]), ""]


def _size(width: int) -> str:
    """ResNet-18's parameter count at ``width``, as the table's heading says it."""
    count = sum(p.numel() for p in models.build("resnet18", num_classes=10,
                                                width=width).parameters())
    return f"{count / 1e6:.1f}M" + ("" if width == 64 else f", width {width}: a check only")


def _loads(values: tuple[float, ...] | list[float]) -> str:
    return ", ".join(f"{v:.2f}" for v in values)


def _table(header: list[str], body: list[list[str]]) -> list[str]:
    return ["| " + " | ".join(header) + " |", "|" + "---|" * len(header),
            *["| " + " | ".join(cells) + " |" for cells in body]]


if __name__ == "__main__":
    sys.exit(main())
