"""What the ranks' preemption check costs a training step, measured side by side in one job.

    python -m torch.distributed.run --standalone --nproc-per-node 2 -m benchmarks.preempt_check

Two gloo ranks train the stress runs' model (ResNet-18 of width 8; 16 random 3x32x32 images a
rank a step, compression off) in alternating blocks of 10 steps, with and without
:class:`jobs.signals.StopCheck` after every step (``trainer.preempt_check_every=1``, its
default), and report the median step time of each and their ratio; and the check's own median
time. Prints one line per figure (nothing is written).
"""

from __future__ import annotations

import statistics
import time

import torch
import torch.distributed as dist
from torch.nn import functional as F
from torch.nn.parallel import DistributedDataParallel as DDP

import models
from core.process import exit_without_teardown
from jobs import signals

BLOCKS, BLOCK = 12, 10


def main() -> None:
    dist.init_process_group("gloo")
    torch.manual_seed(0)
    torch.set_num_threads(1)
    ddp = DDP(models.build("resnet18", num_classes=10, width=8))
    opt = torch.optim.SGD(ddp.parameters(), lr=0.01)
    gen = torch.Generator().manual_seed(dist.get_rank())
    x, y = torch.randn(16, 3, 32, 32, generator=gen), torch.randint(0, 10, (16,), generator=gen)
    check = signals.StopCheck(every=1, enabled=True)
    signals.defer(["SIGUSR1"])
    times: dict[bool, list[float]] = {True: [], False: []}
    checks: list[float] = []
    for block in range(BLOCKS + 1):
        with_check = block % 2 == 1
        for step in range(BLOCK):
            dist.barrier()
            start = time.perf_counter()
            opt.zero_grad(set_to_none=True)
            F.cross_entropy(ddp(x), y).backward()
            opt.step()
            if with_check:
                before = time.perf_counter()
                check.due(step + 1)
                checks.append(time.perf_counter() - before)
            if block:  # the first block warms up
                times[with_check].append(time.perf_counter() - start)
    signals.undefer()
    if dist.get_rank() == 0:
        on, off = statistics.median(times[True]), statistics.median(times[False])
        print(f"median step without the check: {off * 1e3:.2f} ms ({len(times[False])} steps)")
        print(f"median step with the check:    {on * 1e3:.2f} ms ({len(times[True])} steps)")
        print(f"ratio: {on / off:.3f}; the check alone: median "
              f"{statistics.median(checks) * 1e6:.0f} us")
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
    exit_without_teardown(0)  # everything is printed; gloo's threads may abort a teardown
