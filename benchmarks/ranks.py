"""Run a function on N real gloo ranks (``torch.multiprocessing``) and collect what each returns.

    results = run_ranks(fn, world_size=2, args=(x,))   # fn(rank, world_size, *args) on every rank

Each rank gets a real ``torch.distributed`` gloo process group over loopback (a FileStore in a
temp dir, so parallel tests never fight over ports); an exception on any rank fails the call
with that rank's traceback.

The benchmarks start their ranks with it, and the tests their real multi-process cases; the
package itself (``core`` up to ``training``, ``run.py``) never does.
"""

from __future__ import annotations

import os
import pickle
import tempfile
import traceback
from collections.abc import Callable
from datetime import timedelta
from typing import Any

import torch
import torch.distributed as dist
import torch.multiprocessing as mp


def _entry(rank: int, world_size: int, store_path: str, fn: Callable[..., Any],
           args: tuple[Any, ...], queue: Any) -> None:
    torch.set_num_threads(1)
    try:
        store = dist.FileStore(store_path, world_size)
        dist.init_process_group("gloo", store=store, rank=rank, world_size=world_size,
                                timeout=timedelta(seconds=120))
        # Plain pickle copies tensors by value: torch's queue would share them through file
        # descriptors that die with this process before the parent reads them.
        queue.put((rank, True, pickle.dumps(fn(rank, world_size, *args))))
    except BaseException:  # noqa: BLE001 (report any failure to the parent)
        queue.put((rank, False, traceback.format_exc()))
    finally:
        if dist.is_initialized():
            dist.destroy_process_group()


def run_ranks(fn: Callable[..., Any], world_size: int = 2, args: tuple[Any, ...] = (),
              timeout_s: float = 300) -> list[Any]:
    """``fn(rank, world_size, *args)`` on ``world_size`` gloo ranks; returns results by rank.

    ``fn`` must be importable (a module-level function) and its result picklable (tensors
    included).
    """
    ctx = mp.get_context("spawn")
    queue = ctx.Queue()
    # One intra-op thread in every thread of the ranks, as torchrun sets it: a compressor's
    # completion callbacks run on gloo's threads, and a matmul split over a different number of
    # threads rounds differently, which would make ranks disagree in the last bits.
    saved = os.environ.get("OMP_NUM_THREADS")
    os.environ["OMP_NUM_THREADS"] = "1"
    with tempfile.TemporaryDirectory() as tmp:
        store_path = os.path.join(tmp, "store")
        procs = [ctx.Process(target=_entry, args=(r, world_size, store_path, fn, args, queue))
                 for r in range(world_size)]
        for p in procs:
            p.start()
        _restore("OMP_NUM_THREADS", saved)
        results: dict[int, Any] = {}
        try:
            for _ in range(world_size):
                rank, ok, value = queue.get(timeout=timeout_s)
                if not ok:
                    raise RuntimeError(f"rank {rank} failed:\n{value}")
                results[rank] = pickle.loads(value)
        finally:
            for p in procs:
                p.join(timeout=30)
                if p.is_alive():
                    p.kill()
    return [results[r] for r in range(world_size)]


def _restore(name: str, value: str | None) -> None:
    if value is None:
        os.environ.pop(name, None)
    else:
        os.environ[name] = value
