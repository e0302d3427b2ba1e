"""`make stress`: back-to-back 2-rank runs through every compressor and scheduler, levels switching
every epoch; writes results/bench/stress.{csv,md}.

    .venv/bin/python -m benchmarks.stress [--runs 50] [--peer-runs 10]

Each run is a real ``torchrun --nproc-per-node 2 run.py`` job of 5 short epochs (narrow ResNet-18
on 256 digits, gloo on CPU), one after another, cycling over every (compressor, scheduler) pair
that validates: every registered compressor plus the authors' presets (``topk_authors``,
``powersgd_authors``) x static, accordion, accordion_batch, accordion_joint. Accordion checks
every epoch (``interval=1``) with ``eta`` so large that no norm is ever critical, and the LR
decays at epochs 2 and 4: epochs 0-2 and 4 are critical, 3 is not, so levels (and, for the batch
schedulers, the global batch 32 <-> 64) change at every epoch from 2 on. A run passes if it
exits 0, ``summary.json`` says ``completed`` with ``params_in_sync`` true, and its levels or
batches switched as planned; a run still going after ``--timeout-s`` is a hang.

``--peer-runs``: the same number of short 2-rank DDP jobs with PyTorch's own ``powerSGD_hook``
(its default state, rank 1, several buckets), the peer that once aborted with a gloo size
mismatch; each outcome is reported (a failure there is the peer's, not the suite's).
"""

from __future__ import annotations

import argparse
import csv
import itertools
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import compression

OUT = Path("results/bench")
PRESETS = ("topk_authors", "powersgd_authors")
SCHEDULERS = ("static", "accordion", "accordion_batch", "accordion_joint")
EPOCHS = 5
COMMON = ["model.width=8", "dataset.subset=256", "trainer.batch_size=32", "logger=none",
          "trainer.progress=false", "trainer.device=cpu", f"trainer.epochs={EPOCHS}",
          "trainer.dist_timeout_s=60", "optimizer.schedule.milestones=[2,4]",
          "optimizer.schedule.decay_factors=[0.5,0.25]"]
# Critical epochs under the plan above (LR decays at 2 and 4, eta never met, interval 1).
CRITICAL = [True, True, True, False, True]


def combos() -> list[tuple[str, str]]:
    """Every (compressor, scheduler) pair that validates (Accordion needs levels)."""
    with_levels = set(compression.with_levels())
    out = []
    for comp in [*compression.available(), *PRESETS]:
        levels = comp.removesuffix("_authors") in with_levels
        out += [(comp, s) for s in SCHEDULERS if levels or s in ("static", "accordion_batch")]
    return out


def overrides(comp: str, sched: str) -> list[str]:
    args = [f"compressor={comp}", f"scheduler={sched}"]
    if sched != "static":
        args += ["scheduler.interval=1", "scheduler.eta=1e9"]
    if sched in ("accordion_batch", "accordion_joint"):
        args += ["scheduler.batch_low=32", "scheduler.batch_high=64", "scheduler.lr_scaling=none"]
    return args


def switched_as_planned(rows: list[dict[str, Any]], sched: str) -> bool:
    """Levels (and batches) followed CRITICAL: low in critical epochs, high elsewhere."""
    if sched == "static":
        return True
    if [r.get("batch_size") for r in rows] != [32 if c else 64 for c in CRITICAL] and \
            sched != "accordion":
        return False
    if sched == "accordion_batch":
        return True
    layers = [k for k in rows[0] if k.startswith("critical/") and k != "critical/model"]
    return bool(layers) and all([r[k] for r in rows] == CRITICAL for k in layers)


def run_one(comp: str, sched: str, run_dir: Path, timeout_s: float) -> dict[str, Any]:
    """One 2-rank job; its outcome."""
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node=2",
           "run.py", *COMMON, *overrides(comp, sched), f"hydra.run.dir={run_dir}"]
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    start = time.monotonic()
    try:
        proc = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=timeout_s)
        code, tail = proc.returncode, proc.stderr[-400:]
    except subprocess.TimeoutExpired:
        code, tail = None, "hang: still running after the timeout"
    took = time.monotonic() - start
    summary = json.loads((run_dir / "summary.json").read_text()) \
        if (run_dir / "summary.json").is_file() else {}
    rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()] \
        if (run_dir / "metrics.jsonl").is_file() else []
    in_sync = summary.get("params_in_sync") is True
    planned = len(rows) == EPOCHS and switched_as_planned(rows, sched)
    ok = code == 0 and summary.get("status") == "completed" and in_sync and planned
    return {"compressor": comp, "scheduler": sched, "ok": ok, "exit": code,
            "status": summary.get("status", "-"), "params_in_sync": in_sync,
            "switched_as_planned": planned, "seconds": round(took, 1),
            "error": "" if ok else " ".join(tail.split())[-200:]}


def _peer_main(rank: int, world: int, steps: int) -> str:
    """PyTorch's powerSGD_hook on a 2-rank DDP ResNet-18 (narrow, several buckets)."""
    import torch
    from torch import nn
    from torch.distributed.algorithms.ddp_comm_hooks import powerSGD_hook as psgd
    from torch.nn.parallel import DistributedDataParallel as DDP

    import models

    torch.manual_seed(0)
    model = models.build("resnet18", num_classes=10, width=16)
    ddp = DDP(model, bucket_cap_mb=0.25)
    state = psgd.PowerSGDState(process_group=None, matrix_approximation_rank=1,
                               start_powerSGD_iter=2)
    ddp.register_comm_hook(state, psgd.powerSGD_hook)
    opt = torch.optim.SGD(model.parameters(), lr=0.05)
    gen = torch.Generator().manual_seed(rank)
    for _ in range(steps):
        x, y = torch.randn(16, 3, 32, 32, generator=gen), torch.randint(0, 10, (16,),
                                                                        generator=gen)
        opt.zero_grad()
        nn.functional.cross_entropy(ddp(x), y).backward()
        opt.step()
    return "completed"


def run_peer(steps: int, timeout_s: float) -> dict[str, Any]:
    """One peer job, in its own process (gloo aborts the process on a mismatch)."""
    start = time.monotonic()
    cmd = [sys.executable, "-m", "benchmarks.stress", "--peer-job", str(steps)]
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    try:
        proc = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=timeout_s)
        ok, text = proc.returncode == 0, proc.stderr
    except subprocess.TimeoutExpired:
        ok, text = False, "hang: still running after the timeout"
    lines = [line for line in text.splitlines() if "mismatch" in line or "enforce fail" in line]
    error = "" if ok else " ".join((lines[0] if lines else text[-200:]).split())[-200:]
    return {"compressor": "PyTorch powerSGD_hook (peer)", "scheduler": "-", "ok": ok,
            "exit": 0 if ok else 1, "status": "completed" if ok else "failed",
            "params_in_sync": "", "switched_as_planned": "", "error": error,
            "seconds": round(time.monotonic() - start, 1)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--runs", type=int, default=50)
    parser.add_argument("--peer-runs", type=int, default=10)
    parser.add_argument("--peer-steps", type=int, default=30)
    parser.add_argument("--timeout-s", type=float, default=600)
    parser.add_argument("--peer-job", type=int, help=argparse.SUPPRESS)  # one peer job's steps
    args = parser.parse_args()
    if args.peer_job is not None:
        from benchmarks.ranks import run_ranks

        run_ranks(_peer_main, 2, (args.peer_job,), timeout_s=args.timeout_s)
        return
    results = []
    started = time.monotonic()
    with tempfile.TemporaryDirectory(prefix="stress-") as tmp:
        plan = list(itertools.islice(itertools.cycle(combos()), args.runs))
        for i, (comp, sched) in enumerate(plan):
            results.append(run_one(comp, sched, Path(tmp) / f"run{i}", args.timeout_s))
            print(f"{i + 1}/{len(plan)} {comp} {sched}: "
                  f"{'ok' if results[-1]['ok'] else 'FAILED ' + results[-1]['error']} "
                  f"({results[-1]['seconds']} s)", flush=True)
    ours_s = time.monotonic() - started
    for i in range(args.peer_runs):
        results.append(run_peer(args.peer_steps, args.timeout_s))
        print(f"peer {i + 1}/{args.peer_runs}: "
              f"{'ok' if results[-1]['ok'] else 'FAILED ' + results[-1]['error']}", flush=True)
    write(results, ours_s, args)
    sys.exit(0 if all(r["ok"] for r in results[:args.runs]) else 1)


def write(results: list[dict[str, Any]], ours_s: float, args: argparse.Namespace) -> None:
    OUT.mkdir(parents=True, exist_ok=True)
    with open(OUT / "stress.csv", "w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=list(results[0]))
        writer.writeheader()
        writer.writerows(results)
    ours = results[:args.runs]
    peers = results[args.runs:]
    failed = [r for r in ours if not r["ok"]]
    lines = [f"`make stress`: {len(ours)} back-to-back 2-rank runs ({EPOCHS} epochs each, levels "
             f"or batches switching every epoch from epoch 2) in {ours_s / 60:.1f} min: "
             f"{len(ours) - len(failed)} passed, {len(failed)} failed "
             f"(hangs: {sum(r['exit'] is None for r in ours)}; "
             f"params_in_sync false: {sum(not r['params_in_sync'] for r in ours)}).", ""]
    if peers:
        bad = [r for r in peers if not r["ok"]]
        lines += [f"PyTorch's powerSGD_hook (peer), {len(peers)} 2-rank jobs of "
                  f"{args.peer_steps} steps: {len(peers) - len(bad)} completed, {len(bad)} "
                  f"failed" + (f" (first: {bad[0]['error']})" if bad else "") + ".", ""]
    header = ["compressor", "scheduler", "runs", "passed", "median s"]
    lines += ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    for (comp, sched), group in itertools.groupby(
            sorted(ours, key=lambda r: (r["compressor"], r["scheduler"])),
            key=lambda r: (r["compressor"], r["scheduler"])):
        group = list(group)
        seconds = sorted(r["seconds"] for r in group)[len(group) // 2]
        lines.append(f"| {comp} | {sched} | {len(group)} | {sum(r['ok'] for r in group)} | "
                     f"{seconds} |")
    lines += [""] + [f"- FAILED {r['compressor']} / {r['scheduler']}: {r['error']}"
                     for r in failed]
    (OUT / "stress.md").write_text("\n".join(lines).rstrip() + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
