"""Run a function on N real gloo ranks (``torch.multiprocessing``) and collect what each returns.

    results = run_ranks(fn, world_size=2, args=(x,))   # fn(rank, world_size, *args) on every rank

Each rank gets a real ``torch.distributed`` gloo process group over loopback (a FileStore in a
temp dir, so parallel tests never fight over ports); an exception on any rank fails the call
with that rank's traceback.
"""

from __future__ import annotations

import os
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
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    torch.set_num_threads(1)
    try:
        store = dist.FileStore(store_path, world_size)
        dist.init_process_group("gloo", store=store, rank=rank, world_size=world_size,
                                timeout=timedelta(seconds=120))
        result = fn(rank, world_size, *args)
        queue.put((rank, True, result))
    except BaseException:  # noqa: BLE001 (report any failure to the parent)
        queue.put((rank, False, traceback.format_exc()))
    finally:
        if dist.is_initialized():
            dist.destroy_process_group()


def run_ranks(fn: Callable[..., Any], world_size: int = 2, args: tuple[Any, ...] = (),
              timeout_s: float = 300) -> list[Any]:
    """``fn(rank, world_size, *args)`` on ``world_size`` gloo ranks; returns results by rank.

    ``fn`` must be importable (a module-level function) and its result picklable.
    """
    ctx = mp.get_context("spawn")
    queue = ctx.Queue()
    with tempfile.TemporaryDirectory() as tmp:
        store_path = os.path.join(tmp, "store")
        procs = [ctx.Process(target=_entry, args=(r, world_size, store_path, fn, args, queue))
                 for r in range(world_size)]
        for p in procs:
            p.start()
        results: dict[int, Any] = {}
        try:
            for _ in range(world_size):
                rank, ok, value = queue.get(timeout=timeout_s)
                if not ok:
                    raise RuntimeError(f"rank {rank} failed:\n{value}")
                results[rank] = value
        finally:
            for p in procs:
                p.join(timeout=30)
                if p.is_alive():
                    p.kill()
    return [results[r] for r in range(world_size)]
