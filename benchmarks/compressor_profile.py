"""Where a compressor's own work goes: each pass of its kernel timed inside real steps, beside the
floor of its algorithm; writes results/bench/compressors_profile.{csv,md}.

    make bench-compressors        # runs this after the speed table
    python -m benchmarks.compressor_profile [--repeats 15]

The methods of issue 27's goals (:data:`benchmarks.compressors.GOALS`) run the hook's path on
ResNet-18's gradients as ``make bench-compressors`` runs them (one worker, one thread, methods
interleaved within every repeat). Each call of a kernel pass (:data:`PASSES`: PowerSGD's three
passes and its orthogonalization, Top-K's and AdaComp's compress and decompress, and any
``settle``), and of what every compressor's steps call besides (:data:`COMMON`: starting the
collectives, copying the dense tensors), is timed with ``time.perf_counter`` where it is made,
whichever thread makes it; ``rest`` is the rest of the work the hook's timer counted (Python
around those calls). The floor is :func:`benchmarks.compressors.floor_pass` for the
same method, timed in the same repeats. Medians over repeats; nothing here is a test.
"""

from __future__ import annotations

import argparse
import csv
import os
import statistics
import sys
import time
from collections import defaultdict
from pathlib import Path
from types import ModuleType
from typing import Any

import torch

from benchmarks.compressors import (
    FLOORS,
    GOALS,
    OUT,
    compressor_methods,
    one_worker_group,
    resnet18_buckets,
    run_step,
)
from compression import _adacomp_kernel, _powersgd_kernel, _topk_kernel, hook
from compression import powersgd as powersgd_module
from compression.comm import GroupComm
from core import provenance

# What every compressor's steps also call inside the hook's timer: the calls that start its
# collectives (the transfer itself runs on gloo's thread, untimed) and the copies of the bucket's
# dense tensors into one buffer and back (compression.hook.aggregate_bucket).
COMMON: list[tuple[ModuleType | type, str]] = [
    (GroupComm, "all_reduce"), (GroupComm, "all_gather"),
    (hook, "_flatten_dense_tensors"), (hook, "_unflatten_dense_tensors")]
LABELS = {"all_reduce": "all_reduce calls", "all_gather": "all_gather calls",
          "_flatten_dense_tensors": "flatten", "_unflatten_dense_tensors": "unflatten"}

# The passes timed, per compressor: (module, function) as the compressor calls them, then COMMON.
PASSES: dict[str, list[tuple[ModuleType | type, str]]] = {
    "powersgd": [(_powersgd_kernel, "project"), (powersgd_module, "orthogonalize"),
                 (_powersgd_kernel, "back"), (_powersgd_kernel, "expand"),
                 (_powersgd_kernel, "settle")],
    "topk": [(_topk_kernel, "compress"), (_topk_kernel, "decompress")],
    "adacomp": [(_adacomp_kernel, "compress"), (_adacomp_kernel, "decompress"),
                (_adacomp_kernel, "settle")],
}
PASSES = {name: [*passes, *COMMON] for name, passes in PASSES.items()}


class Clock:
    """Seconds per pass name since :meth:`reset`, summed over the calls of the wrapped
    functions (wrapped once, for the process)."""

    def __init__(self) -> None:
        self.seconds: dict[str, float] = defaultdict(float)

    def wrap(self, module: ModuleType | type, name: str) -> None:
        function = getattr(module, name)

        def timed(*args: Any, **kwargs: Any) -> Any:
            start = time.perf_counter()
            try:
                return function(*args, **kwargs)
            finally:
                self.seconds[name] += time.perf_counter() - start

        setattr(module, name, timed)

    def reset(self) -> None:
        self.seconds.clear()


def profile(repeats: int, warmup: int = 3, width: int = 64
            ) -> tuple[list[dict[str, Any]], list[float]]:
    """Per goal method, the median ms of each pass, the rest, the work and its floor; and the
    1-minute load average at every measured repeat (``width``: ResNet-18's first-stage
    channels; 64 is the real one)."""
    torch.set_num_threads(1)
    one_worker_group(torch.device("cpu"))
    model, buckets = resnet18_buckets(width=width)
    clock = Clock()
    for module, name in {(m, n) for passes in PASSES.values() for m, n in passes}:
        clock.wrap(module, name)
    methods, rows = compressor_methods(model, buckets)
    goals = {row["key"]: (row["method"].removeprefix("ours "), row["level"])
             for row in rows if row["key"] in GOALS}
    assert set(goals) == set(GOALS), "a goal without its method"
    samples: dict[str, list[dict[str, float]]] = defaultdict(list)
    load = []
    for repeat in range(warmup + repeats):
        if repeat >= warmup:
            load.append(os.getloadavg()[0])
        for key in goals:
            clock.reset()
            total, work = run_step(methods[key], buckets)
            if repeat >= warmup:
                samples[key].append({**clock.seconds, "work": work, "total": total})
        for key in dict.fromkeys(FLOORS.values()):
            total, _ = run_step(methods[key], buckets)
            if repeat >= warmup:
                samples[key].append({"total": total})
    found = []
    for key, (compressor, level) in goals.items():
        median = {name: statistics.median(s.get(name, 0.0) for s in samples[key]) * 1e3
                  for _, name in PASSES[compressor]}
        work = statistics.median(s["work"] for s in samples[key]) * 1e3
        floor = statistics.median(s["total"] for s in samples[FLOORS[key]]) * 1e3
        found.append({"compressor": compressor, "level": level, **median,
                      "rest": work - sum(median.values()), "work": work, "floor": floor})
    return found, load


def write(rows: list[dict[str, Any]], load: list[float], context: dict[str, Any],
          out: Path) -> None:
    """compressors_profile.csv (one row per method and pass) and .md (one row per method)."""
    out.mkdir(parents=True, exist_ok=True)
    with open(out / "compressors_profile.csv", "w", newline="") as f:
        writer = csv.writer(f)
        writer.writerow(["compressor", "level", "part", "ms"])
        for row in rows:
            for part, ms in row.items():
                if part not in ("compressor", "level"):
                    writer.writerow([row["compressor"], row["level"], part, f"{ms:.3f}"])
    lines = [f"Command: `python -m benchmarks.compressor_profile` (run by `make "
             f"bench-compressors`), {context['minutes']:.1f} min; {context['made_by']}. "
             f"ResNet-18 gradients (width {context['width']}), one worker, one thread, median of "
             f"{context['repeats']} interleaved repeats; load average (1 min) at the repeats: "
             f"min {min(load):.2f}, median {statistics.median(load):.2f}, max {max(load):.2f} "
             f"on {os.cpu_count()} CPUs.", "",
             "Milliseconds per step of each pass of the compressor's kernel (every call, "
             "whichever thread makes it), then of what every compressor's steps call besides: "
             "`all_reduce calls` / `all_gather calls`, starting the collectives (gloo's thread "
             "moves the data, untimed), and `flatten` / `unflatten`, the bucket's dense tensors "
             "copied into one buffer and back; `rest`: the rest of the work the hook's timer "
             "counts (`compress + decompress` of compressors.md: Python around the calls); "
             "`floor`: the memory traffic of the algorithm alone (compressors.md's `floor:` "
             "rows), timed in the same repeats.", "",
             "| compressor | level | passes and calls (ms) | rest | work | floor | "
             "work / floor |",
             "|---|---|---|---:|---:|---:|---:|"]
    for row in rows:
        passes = ", ".join(f"{LABELS.get(name, name)} {row[name]:.2f}"
                           for _, name in PASSES[row["compressor"]] if row[name] > 0)
        lines.append(f"| {row['compressor']} | {row['level']} | {passes} | {row['rest']:.2f} | "
                     f"{row['work']:.2f} | {row['floor']:.2f} | "
                     f"{row['work'] / row['floor']:.2f} |")
    (out / "compressors_profile.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--repeats", type=int, default=15)
    parser.add_argument("--out", type=Path, default=OUT)
    parser.add_argument("--width", type=int, default=64, help="8: a check, not a measurement")
    args = parser.parse_args(argv)
    started, made_by = time.perf_counter(), provenance.made_here()
    rows, load = profile(args.repeats, width=args.width)
    context = {"repeats": args.repeats, "width": args.width,
               "minutes": (time.perf_counter() - started) / 60,
               "made_by": made_by}
    write(rows, load, context, args.out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
