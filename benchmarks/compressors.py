"""Benchmark the compressors on ResNet-18's gradients; writes results/bench/compressors.{csv,md}.

    make bench-compressors            # or: .venv/bin/python -m benchmarks.compressors
    make bench-compressors DEVICE=cuda   # on a GPU: results/bench/compressors_cuda.{csv,md}

1. One step on one worker (a world-size-1 gloo group), for every compressor and level, side by
   side with peers in the same process: a plain ``torch.topk`` Top-K and PyTorch's
   ``powerSGD_hook``. Gradients come from one real backward pass; they are bucketed as DDP
   does (reverse order, 25 MiB). Ours runs :func:`compression.hook.aggregate_bucket`, the hook's
   path after it adds the gradients to Accordion's per-epoch sums (a memory pass, not timed).
   For ours, both the whole step and the compress + decompress work alone (the hook's
   ``time/compress_s``: without the waits for collectives, which on one worker are copies
   inside gloo) are reported; the latter as a ratio to one memory pass over the same gradients,
   ``clone`` (the issue's definition) and a copy into a buffer used before (no page faults: the
   stricter one).
2. Step time of a 2-process DDP ResNet-18 with ``compressor=none`` against DDP's built-in
   all-reduce (no hook).
3. The zoo's compressors (issue 26), each at its light and heavy level beside its nearest peer
   (:mod:`benchmarks.compressor_peers`: PyTorch's fp16 / bf16 hooks, else plain torch).

Timings are medians over repeats; the methods are interleaved within every repeat, so the
machine's noise hits them alike. Targets: AdaComp <= 3x a memory pass, our Top-K <= 1.0x the
torch.topk peer, our PowerSGD <= 1.0x PyTorch's hook, ``none`` <= 1.05x built-in DDP.

With ``--device cuda`` everything runs on GPU 0 (the one-worker group is NCCL's) and every timed
call is bracketed by ``torch.cuda.synchronize()``, so a time is the GPU's work, not its
launches; ours' compute is timed with CUDA events (the hook's ``time/compress_s``); the DDP
comparison needs 2 GPUs (skipped with fewer). Without a GPU, ``--device cuda`` says so in one
line and exits 0.
"""

from __future__ import annotations

import argparse
import csv
import math
import statistics
import time
from collections.abc import Callable
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
from compression.comm import drive, timer_for
from compression.hook import aggregate_bucket, comm_hook
from core.ranks import run_ranks

OUT = Path("results/bench")
CPU = torch.device("cpu")
BUCKET_BYTES = 25 * 2**20
POWERSGD_RANKS = (1, 2, 4)
TOPK_RATIOS = (0.99, 0.25, 0.1, 0.02)
ADACOMP_BINS = ((50, 500), (500, 5000), (5000, 50000))


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
    """ResNet-18 (CIFAR; ``keys``: other model keys, e.g. ``width``) with the gradients of one
    backward pass, bucketed like DDP."""
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


class Ours:
    """The hook's path for our compressor ``name`` (memories kept from step to step).

    Calling it runs one step, bucket after bucket (as the hook chains them); :attr:`timer` sums
    the time spent in the compressor's own steps (compress and decompress, as the hook's
    ``time/compress_s``), without the waits for the collectives (here a world-size-1 gloo group,
    which still copies the data).
    """

    def __init__(self, name: str, model: nn.Module, buckets: list[Bucket], **params: Any
                 ) -> None:
        self.state = compression.HookState(compression.create(name, **params),
                                           model.named_parameters())
        self.buckets = buckets
        self.timer = timer_for(self.state.device)

    def __call__(self) -> None:
        state = self.state
        for b in self.buckets:
            dense, layers, grads = state.split(b.names, b.gradients(), b.buffer())
            drive(aggregate_bucket(state.compressor, dense, layers, grads, state.comm),
                  self.timer).wait()


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


def time_interleaved(methods: dict[str, Callable[[], None]], buckets: list[Bucket],
                     repeats: int) -> tuple[dict[str, float], dict[str, float]]:
    """Median seconds per call of every method, and of the compute alone for :class:`Ours`
    methods; each repeat runs all methods once. On CUDA each call starts and ends with the
    device idle (``torch.cuda.synchronize``)."""
    sync = torch.cuda.synchronize if buckets[0].buffer().is_cuda else (lambda: None)
    times: dict[str, list[float]] = {k: [] for k in methods}
    compute: dict[str, list[float]] = {k: [] for k, fn in methods.items() if isinstance(fn, Ours)}
    for _ in range(repeats):
        for key, fn in methods.items():
            for b in buckets:
                b.restore()
            before = fn.timer.seconds if isinstance(fn, Ours) else 0.0
            sync()
            start = time.perf_counter()
            fn()
            sync()
            times[key].append(time.perf_counter() - start)
            if isinstance(fn, Ours):
                compute[key].append(fn.timer.seconds - before)
    return ({k: statistics.median(v) for k, v in times.items()},
            {k: statistics.median(v) for k, v in compute.items()})


# ---- 2-process DDP: none vs built-in ---------------------------------------------------------
def _ddp_steps(rank: int, world: int, steps: int, batch: int, cuda: bool = False
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
        model = models.build("resnet18", num_classes=10).to(device)
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


# ---- report ---------------------------------------------------------------------------------
def compressor_methods(model: nn.Module, buckets: list[Bucket]
                       ) -> tuple[dict[str, Callable[[], None]], list[dict[str, Any]]]:
    """Every method timed, and a row per method reported (with its peer and target)."""
    methods: dict[str, Callable[[], None]] = {"clone": clone_pass(buckets),
                                              "copy": copy_pass(buckets)}
    rows: list[dict[str, Any]] = []

    def add(key: str, method: str, level: str, peer: str | None = None, target: str = ""
            ) -> None:
        rows.append({"key": key, "method": method, "level": level, "peer": peer,
                     "target": target})

    add("clone", "memory pass (clone)", "-")
    add("copy", "memory pass (copy into a used buffer)", "-")
    add("none", "ours none (fp32 all-reduce)", "-")
    methods["none"] = Ours("none", model, buckets)
    for r in POWERSGD_RANKS:
        methods[f"psgd{r}"] = Ours("powersgd", model, buckets, rank=r)
        methods[f"torch-psgd{r}"] = torch_powersgd(r, buckets)
        add(f"psgd{r}", "ours powersgd", f"rank {r}", f"torch-psgd{r}", "<= 1.0x peer")
        add(f"torch-psgd{r}", "PyTorch powerSGD_hook", f"rank {r}")
    for ratio in TOPK_RATIOS:
        methods[f"topk{ratio}"] = Ours("topk", model, buckets, ratio=ratio)
        methods[f"torch-topk{ratio}"] = torch_topk(ratio, buckets)
        add(f"topk{ratio}", "ours topk", f"ratio {ratio}", f"torch-topk{ratio}", "<= 1.0x peer")
        add(f"torch-topk{ratio}", "plain torch.topk Top-K", f"ratio {ratio}")
    for conv, fc in ADACOMP_BINS:
        for soft in (True, False):
            key = f"adacomp{conv}/{fc}{'' if soft else '-hard'}"
            methods[key] = Ours("adacomp", model, buckets, conv_bin_size=conv,
                                fc_bin_size=fc, soft_threshold=soft)
            add(key, "ours adacomp" + ("" if soft else " (hard LS)"), f"L_T {conv}/{fc}",
                target="<= 3x clone" if soft else "")
    add_zoo(methods, rows, lambda name, **params: Ours(name, model, buckets, **params), buckets)
    return methods, rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--repeats", type=int, default=15)
    parser.add_argument("--ddp-steps", type=int, default=12)
    parser.add_argument("--device", choices=("cpu", "cuda"), default="cpu")
    args = parser.parse_args()
    cuda = args.device == "cuda"
    if cuda and not torch.cuda.is_available():
        print("bench-compressors: skipped: DEVICE=cuda but torch sees no CUDA device here")
        return
    torch.set_num_threads(1)
    device = torch.device("cuda", 0) if cuda else CPU
    if cuda:
        torch.cuda.set_device(device)
    dist.init_process_group("nccl" if cuda else "gloo", store=dist.HashStore(), rank=0,
                            world_size=1, **({"device_id": device} if cuda else {}))
    model, buckets = resnet18_buckets(device=device)
    methods, rows = compressor_methods(model, buckets)
    time_interleaved(methods, buckets, repeats=2)  # warm-up: memories, allocator
    median, compute = time_interleaved(methods, buckets, args.repeats)
    dist.destroy_process_group()

    table = []
    for row in rows:
        total = median[row["key"]]
        work = compute.get(row["key"], total)  # compress + decompress (peers: all of it)
        x_peer = total / median[row["peer"]] if row["peer"] else None
        met = ""
        if row["target"] == "<= 1.0x peer":
            met = "yes" if x_peer <= 1.0 else "no"
        elif row["target"] == "<= 3x clone":
            met = "yes" if work / median["clone"] <= 3.0 else "no"
        table.append({"method": row["method"], "level": row["level"], "ms": total * 1e3,
                      "compute_ms": compute[row["key"]] * 1e3 if row["key"] in compute else "",
                      "x_clone": work / median["clone"], "x_copy": work / median["copy"],
                      "x_peer": "" if x_peer is None else x_peer, "target": row["target"],
                      "met": met})

    blank = {"compute_ms": "", "x_clone": "", "x_copy": ""}
    if cuda and torch.cuda.device_count() < 2:
        for method in ("DDP step, built-in all-reduce", "DDP step, ours none hook"):
            table.append({"method": method, "level": "skipped: needs 2 GPUs", "ms": "", **blank,
                          "x_peer": "", "target": "", "met": ""})
    else:
        ddp = run_ranks(_ddp_steps, 2, (args.ddp_steps, 16, cuda))[0]
        ratio = ddp["none"] / ddp["builtin"]
        level = "2 GPUs" if cuda else "2 proc"
        table.append({"method": "DDP step, built-in all-reduce", "level": level, "ms":
                      ddp["builtin"] * 1e3, **blank, "x_peer": "", "target": "", "met": ""})
        table.append({"method": "DDP step, ours none hook", "level": level, "ms":
                      ddp["none"] * 1e3, **blank, "x_peer": ratio, "target": "<= 1.05x peer",
                      "met": "yes" if ratio <= 1.05 else "no"})
    write(table, args.repeats, device)


def write(table: list[dict[str, Any]], repeats: int, device: torch.device = CPU) -> None:
    OUT.mkdir(parents=True, exist_ok=True)
    stem = "compressors" if device.type == "cpu" else "compressors_cuda"
    fmt = {"ms": "{:.2f}", "compute_ms": "{:.2f}", "x_clone": "{:.2f}", "x_copy": "{:.2f}",
           "x_peer": "{:.2f}"}
    cells = [{k: (fmt[k].format(v) if k in fmt and v != "" else v) for k, v in row.items()}
             for row in table]
    with open(OUT / f"{stem}.csv", "w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=list(cells[0]))
        writer.writeheader()
        writer.writerows(cells)
    header = ["method", "level", "ms / step", "compress + decompress ms", "x clone", "x copy",
              "x peer", "target", "met"]
    where = (f"{torch.cuda.get_device_name(device)}, a world-size-1 NCCL group"
             if device.type == "cuda" else "a world-size-1 gloo group, 1 thread")
    lines = [f"ResNet-18 gradients (11.2M), 1 worker ({where}); "
             f"median of {repeats} interleaved repeats. `ms / step`: the hook's whole path, "
             f"collectives included. `compress + decompress ms`: our compressor's own work "
             f"(what `time/compress_s` counts). `x clone` / `x copy`: that work (for peers, "
             f"their whole step) over one memory pass, `clone` or a copy into a used buffer "
             f"(no page faults). `x peer`: whole step over the peer's. DDP rows: step time, "
             f"2 processes.", "",
             "| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    lines += ["| " + " | ".join(str(c) for c in row.values()) + " |" for row in cells]
    (OUT / f"{stem}.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
