"""`make bench-numerics`: what portable numerics cost (core/numerics.py), side by side in one run;
writes results/bench/numerics.{csv,md}.

    .venv/bin/python -m benchmarks.numerics [--repeats 2] [--epochs 16]

Each repeat runs the demo's rank-2 run (tiny Table 1, ResNet-18, PowerSGD rank 2, seed 0: the
command `make demo` runs, as a single run) once under ``trainer.numerics=native`` and once under
``portable``, alternating, as the 2-rank torchrun job a sweep starts. It reports the wall time of
each job, the mean training time per epoch (``time/epoch_s``: evaluation and start-up excluded),
the final accuracy and the machine's load average before and after, and the ratio portable /
native of the medians. Run it on a quiet machine: nothing else should compete for the cores.
"""

from __future__ import annotations

import argparse
import csv
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

OUT = Path("results/bench")
RUN = ["scale=tiny", "benchmark=cifar10", "model=resnet18", "method=rank2", "seed=0",
       "logger=none", "trainer.progress=false"]
MODES = ("native", "portable")


def run_once(mode: str, epochs: int, run_dir: Path) -> dict[str, Any]:
    """One 2-rank job; its times, final accuracy and the load around it."""
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node=2",
           "run.py", *RUN, f"trainer.epochs={epochs}", f"trainer.numerics={mode}",
           f"hydra.run.dir={run_dir}"]
    load_before = os.getloadavg()[0]
    started = time.perf_counter()
    proc = subprocess.run(cmd, capture_output=True, text=True,
                          env={**os.environ, "OMP_NUM_THREADS": "1"}, check=False)
    wall = time.perf_counter() - started
    if proc.returncode != 0:
        raise RuntimeError(f"{mode} run failed:\n{proc.stderr[-3000:]}")
    rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    summary = json.loads((run_dir / "summary.json").read_text())
    return {"mode": mode, "wall_s": round(wall, 2),
            "epoch_s": round(statistics.mean(r["time/epoch_s"] for r in rows), 3),
            "final_accuracy": summary["final"], "load_before": load_before,
            "load_after": os.getloadavg()[0], "fingerprint": summary["provenance"]["fingerprint"],
            "machine": summary["provenance"]["machine"].rsplit(",", 1)[0],
            "commit": summary["provenance"]["git"]["commit"],
            "dirty": summary["provenance"]["git"]["dirty"]}


def markdown(rows: list[dict[str, Any]], command: str, seconds: float) -> str:
    """The table, the ratio of medians and how it was measured."""
    med = {m: {k: statistics.median(r[k] for r in rows if r["mode"] == m)
               for k in ("wall_s", "epoch_s")} for m in MODES}
    lines = ["# Portable numerics: what they cost", "",
             f"Command: `{command}` ({seconds / 60:.1f} min). Machine: {rows[0]['machine']} "
             f"(fingerprints {', '.join(sorted({r['fingerprint'] for r in rows}))}), commit "
             f"{rows[0]['commit'][:10]}{' (dirty)' if rows[0]['dirty'] else ''}. Load average "
             f"(1 min) before/after each job in the table.", "",
             "| mode | job wall (s) | train time per epoch (s) | final accuracy (%) | load "
             "before / after |", "| --- | ---: | ---: | ---: | --- |"]
    lines += [f"| {r['mode']} | {r['wall_s']:.1f} | {r['epoch_s']:.3f} | "
              f"{r['final_accuracy']:.2f} | {r['load_before']:.2f} / {r['load_after']:.2f} |"
              for r in rows]
    ratio = {k: med["portable"][k] / med["native"][k] for k in ("wall_s", "epoch_s")}
    lines += ["", f"Portable / native, medians: job wall {ratio['wall_s']:.2f}x, train time per "
              f"epoch {ratio['epoch_s']:.2f}x.", ""]
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--epochs", type=int, default=16)
    args = parser.parse_args()
    started = time.perf_counter()
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        for repeat in range(args.repeats):
            for mode in MODES:
                rows.append(run_once(mode, args.epochs, Path(tmp) / f"{mode}{repeat}"))
                print(rows[-1], flush=True)
    OUT.mkdir(parents=True, exist_ok=True)
    with open(OUT / "numerics.csv", "w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=list(rows[0]))
        writer.writeheader()
        writer.writerows(rows)
    command = "make bench-numerics" + (f" ARGS='--repeats {args.repeats} --epochs {args.epochs}'"
                                       if (args.repeats, args.epochs) != (2, 16) else "")
    (OUT / "numerics.md").write_text(markdown(rows, command, time.perf_counter() - started))
    print((OUT / "numerics.md").read_text())


if __name__ == "__main__":
    main()
