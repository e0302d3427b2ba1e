"""Peak memory of simulated learners (``launcher=simulated``) per compressor and learner count.

    python -m benchmarks.simulated_memory          # -> results/bench/simulated_memory.{csv,md}
    make bench-simulated-memory

Every (compressor, W) pair runs in a fresh process: it builds AdaComp's CIFAR10-CNN (89,578
parameters, 350 KiB of fp32) and one optimizer, takes its resident set size after one plain
forward and backward as the baseline, restarts the kernel's peak count (``VmHWM``), trains
``STEPS`` steps of W simulated learners (one example each, random data) and reads the peak.
The growth over the baseline, divided by W and by the model's fp32 size, says how many
gradient-sized buffers each learner costs: the memory :mod:`training.simulated` documents per
compressor.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pandas as pd

from core.process import exit_without_teardown

COMPRESSORS = ("none", "powersgd", "topk", "adacomp", "ef_signsgd")
LEARNERS = (1, 8, 32, 128)
STEPS = 3
ROOT = Path(__file__).resolve().parents[1]
OUT = ROOT / "results" / "bench"


def _status_kib(field: str) -> int:
    """``VmRSS`` (resident now) or ``VmHWM`` (its peak) of this process, in KiB (Linux)."""
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(f"{field}:"):
            return int(line.split()[1])
    raise RuntimeError(f"/proc/self/status has no {field}")


def _reset_peak() -> None:
    """Start the peak (``VmHWM``) over from the resident set now (Linux: clear_refs 5)."""
    Path("/proc/self/clear_refs").write_text("5")


def measure(compressor: str, learners: int) -> dict[str, float]:
    """One pair, in this process: baseline and peak RSS (KiB), the model's fp32 KiB."""
    import torch
    import torch.distributed as dist
    from omegaconf import OmegaConf

    import models
    from training.simulated import SimulatedWorkers
    from training.tasks import FixedBatch

    torch.set_num_threads(1)
    dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
    torch.manual_seed(0)
    model = models.build("cifar10_cnn", num_classes=10)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
    x, y = torch.randn(learners, 3, 32, 32), torch.randint(0, 10, (learners,))
    torch.nn.functional.cross_entropy(model(x[:1]), y[:1]).backward()
    optimizer.step()
    base = _status_kib("VmRSS")
    _reset_peak()
    # The option file's values, the run's seed (0) where it interpolates one (PowerSGD's Q).
    cfg = OmegaConf.merge({"seed": 0}, {"c": OmegaConf.load(ROOT / "conf" / "compressor"
                                                            / f"{compressor}.yaml")})
    cfg = OmegaConf.create(OmegaConf.to_container(cfg, resolve=True)["c"])
    tasks = [FixedBatch(x[:1], y[:1])] * learners  # settles the buckets (training.buckets)
    workers = SimulatedWorkers(model, cfg, tasks, list(range(learners)),
                               bucket_cap_mb=25)
    for _ in range(STEPS):
        optimizer.zero_grad(set_to_none=True)

        def local_backward(w: int) -> None:
            loss = torch.nn.functional.cross_entropy(workers.ddp(x[w:w + 1]), y[w:w + 1])
            loss.backward()

        workers.step(local_backward)
        optimizer.step()
    model_kib = sum(p.numel() * p.element_size() for p in model.parameters()) / 1024
    dist.destroy_process_group()
    return {"compressor": compressor, "learners": learners, "base_kib": base,
            "peak_kib": _status_kib("VmHWM"), "model_kib": model_kib}


def run_all(jobs: int = 1) -> pd.DataFrame:
    """Every pair, each in a fresh process (``jobs`` at a time: a process's peak is its own);
    growth per learner in model sizes."""
    pairs = [(c, w) for c in COMPRESSORS for w in LEARNERS]
    with ThreadPoolExecutor(jobs) as pool:
        rows = list(pool.map(lambda pair: _child(*pair), pairs))
    frame = pd.DataFrame(rows)
    frame["growth_mib"] = (frame["peak_kib"] - frame["base_kib"]) / 1024
    frame["per_learner_models"] = (frame["peak_kib"] - frame["base_kib"]) / (
        frame["learners"] * frame["model_kib"])
    return frame


def _child(compressor: str, learners: int) -> dict[str, float]:
    proc = subprocess.run([sys.executable, "-m", "benchmarks.simulated_memory", "--one",
                           compressor, str(learners)], cwd=ROOT, check=True,
                          capture_output=True, text=True, env=_env())
    row = json.loads(proc.stdout.strip().splitlines()[-1])
    print(row, flush=True)
    return row


def _env() -> dict[str, str]:
    import os

    return {**os.environ, "OMP_NUM_THREADS": "1"}


def markdown(frame: pd.DataFrame) -> str:
    """Peak RSS (MiB) per compressor and W, and the growth per learner in model sizes."""
    lines = ["| compressor | " + " | ".join(f"W={w}: peak MiB (+growth)" for w in LEARNERS)
             + " | per learner at W=128 (model sizes) |",
             "|---|" + "---|" * (len(LEARNERS) + 1)]
    for compressor, rows in frame.groupby("compressor", sort=False):
        cells = [f"{r.peak_kib / 1024:.0f} (+{r.growth_mib:.1f})" for r in rows.itertuples()]
        last = rows[rows["learners"] == max(LEARNERS)].iloc[0]
        lines.append(f"| {compressor} | " + " | ".join(cells)
                     + f" | {last['per_learner_models']:.1f} |")
    model = frame["model_kib"].iloc[0]
    return (f"Simulated learners' peak resident memory, CIFAR10-CNN ({model:.0f} KiB of fp32 "
            f"parameters), one example per learner, {STEPS} steps; growth = peak minus the "
            f"peak after one plain step (`python -m benchmarks.simulated_memory`).\n\n"
            + "\n".join(lines) + "\n")


def main(argv: list[str] | None = None) -> int:
    """CLI: every pair into results/bench, or ``--one COMPRESSOR W`` (one JSON line)."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--one", nargs=2, metavar=("COMPRESSOR", "W"))
    parser.add_argument("--out", type=Path, default=OUT)
    parser.add_argument("--jobs", type=int, default=1, help="pairs measured at once")
    args = parser.parse_args(argv)
    if args.one:
        print(json.dumps(measure(args.one[0], int(args.one[1]))))
        exit_without_teardown(0)  # the line is out; gloo's threads may abort a teardown
    frame = run_all(args.jobs)
    args.out.mkdir(parents=True, exist_ok=True)
    frame.to_csv(args.out / "simulated_memory.csv", index=False)
    (args.out / "simulated_memory.md").write_text(markdown(frame))
    print(markdown(frame))
    return 0


if __name__ == "__main__":
    sys.exit(main())
