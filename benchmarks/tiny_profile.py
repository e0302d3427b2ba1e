"""`make bench-tiny-profile`: where one 2-worker tiny run's wall time goes, for each compressor,
run as 2 torchrun ranks and as 2 simulated learners in one process; writes
results/bench/tiny_profile.{md,csv}.

    .venv/bin/python -m benchmarks.tiny_profile [--epochs 16] [--compressors none,powersgd]
        [--ways ranks,learners] [--logger wandb|none] [--out results/bench]

Each job is the tiny Table 1 ResNet-18 run (scale=tiny benchmark=cifar10 model=resnet18, seed
0, the tiny recipe) with one compressor at its preset's level, run through
benchmarks/profiled_run.py: run.py itself, its phases timed on every process (the phases and
what each holds: ``PHASES`` there). Per job the table shows rank 0's seconds per phase, the
job's wall time (launch to exit, torchrun's agent included) and its CPU time (every process of
the job), and whether both ways recorded the same metrics. The ways alternate per compressor,
so that the machine's load hits both alike; the load average is recorded around every job. Run
it on a quiet machine: every number is a time on the machine it ran on.
"""

from __future__ import annotations

import argparse
import csv
import json
import os
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from benchmarks.profiled_run import PHASES
from benchmarks.smoke_gpu import TIMING  # the metrics that differ between equal runs

OUT = Path("results/bench")
SCRIPT = Path(__file__).resolve().parent / "profiled_run.py"
RUN = ["scale=tiny", "benchmark=cifar10", "model=resnet18", "seed=0", "scheduler=static",
       "trainer.progress=false"]
# Each compressor at its preset's level (conf/compressor/); PowerSGD at Table 1's rank 2.
COMPRESSORS = {"none": ["compressor=none"],
               "powersgd": ["compressor=powersgd", "compressor.rank=2"],
               "topk": ["compressor=topk"], "adacomp": ["compressor=adacomp"],
               "ef_signsgd": ["compressor=ef_signsgd"]}
WAYS = {"ranks": "2 gloo ranks (torchrun), one process each",
        "learners": "2 simulated learners in one process (launcher=simulated)"}


def command(way: str, overrides: list[str]) -> list[str]:
    """The job's command line: the profiled run.py as torchrun's 2 ranks, or as one process."""
    if way == "ranks":
        return [sys.executable, "-m", "torch.distributed.run", "--standalone",
                "--nproc-per-node=2", str(SCRIPT), *overrides]
    return [sys.executable, str(SCRIPT), *overrides, "launcher=simulated", "trainer.workers=2"]


def run_job(way: str, compressor: str, epochs: int, logger: str, tmp: Path) -> dict[str, Any]:
    """One profiled job: its phases (every process), wall and CPU time, record, load."""
    run_dir, out = tmp / f"{way}-{compressor}", tmp / f"{way}-{compressor}.profile"
    out.mkdir()
    overrides = [*RUN, *COMPRESSORS[compressor], f"trainer.epochs={epochs}", f"logger={logger}",
                 f"hydra.run.dir={run_dir}"]
    env = {**os.environ, "OMP_NUM_THREADS": "1", "WANDB_MODE": "offline", "WANDB_SILENT": "true",
           "PROFILE_OUT": str(out)}
    load_before, cpu_before = os.getloadavg()[0], children_cpu()
    env["PROFILE_T0"] = repr(time.time())
    started = time.perf_counter()
    proc = subprocess.run(command(way, overrides), capture_output=True, text=True, env=env,
                          check=False)
    wall = time.perf_counter() - started
    if proc.returncode != 0:
        raise RuntimeError(f"{way} {compressor} failed:\n{proc.stderr[-3000:]}")
    rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    summary = json.loads((run_dir / "summary.json").read_text())
    return {"way": way, "compressor": compressor, "epochs": epochs, "wall_s": wall,
            "cpu_s": children_cpu() - cpu_before, "load_before": load_before,
            "load_after": os.getloadavg()[0], "final": summary["final"],
            "compress_s": sum(r["time/compress_s"] for r in rows),
            "metrics": [{k: v for k, v in r.items() if k not in TIMING} for r in rows],
            "processes": sorted((json.loads(p.read_text()) for p in out.glob("rank*.json")),
                                key=lambda p: p["rank"]),
            "provenance": summary["provenance"]}


def children_cpu() -> float:
    """CPU seconds of every finished child process (and theirs) so far."""
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def csv_rows(jobs: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """One row per process of every job: wall and CPU seconds per phase."""
    rows = []
    for job in jobs:
        for proc in job["processes"]:
            row = {k: job[k] for k in ("way", "compressor", "epochs", "wall_s", "cpu_s",
                                       "load_before", "load_after", "final", "compress_s")}
            row.update({"rank": proc["rank"], "process_wall_s": proc["wall_s"],
                        "process_cpu_s": proc["cpu_s"]})
            row.update({f"{p} wall_s": proc["seconds"][p] for p in PHASES})
            row.update({f"{p} cpu_s": proc["cpu"][p] for p in PHASES})
            rows.append(row)
    return rows


def markdown(jobs: list[dict[str, Any]], command_line: str, seconds: float) -> str:
    """The page: rank 0's seconds per phase per job, the jobs' wall and CPU, what each phase
    holds."""
    prov = jobs[0]["provenance"]
    git = prov["git"]
    lines = ["# Where a tiny run's time goes", "",
             f"Command: `{command_line}` ({seconds / 60:.1f} min). Machine: "
             f"{prov['machine']} (fingerprint {prov['fingerprint']}), commit "
             f"{git['commit'][:10] if git['commit'] else '?'}"
             f"{' (dirty)' if git['dirty'] else ''}. Each job: the tiny Table 1 ResNet-18 run "
             f"(seed 0, {jobs[0]['epochs']} epoch(s), 2 workers), one compressor at its preset's "
             f"level (PowerSGD rank 2, Top-K 10%, AdaComp L_T 50/500, EF-signSGD one block per "
             f"layer), W&B as a sweep has it. Ways: " +
             "; ".join(f"`{w}`: {d}" for w, d in WAYS.items()) + ".", "",
             "Seconds of wall time of rank 0's process (learners: the one process) per phase; "
             "`exit` is the job's wall time after rank 0's app returned (the processes' exit, "
             "torchrun's agent). `job wall` is the launch to the last process's exit, `job CPU` "
             "the CPU seconds of all its processes; `same` says whether both ways recorded the "
             "same metrics (every epoch, timings aside). Load: the 1-minute load average before "
             "and after the job.", ""]
    phases = list(PHASES)
    lines += ["| compressor | way | " + " | ".join(phases) + " | exit | job wall | job CPU | "
              "final acc. | same | load |",
              "| --- | --- | " + " | ".join("---:" for _ in range(len(phases) + 4)) +
              " | --- | --- |"]
    for job in jobs:
        rank0 = job["processes"][0]
        others = [j for j in jobs if j["compressor"] == job["compressor"] and j is not job]
        same = "yes" if all(j["metrics"] == job["metrics"] for j in others) else "**no**"
        cells = [f"{rank0['seconds'][p]:.1f}" for p in phases]
        cells += [f"{job['wall_s'] - rank0['wall_s']:.1f}", f"{job['wall_s']:.1f}",
                  f"{job['cpu_s']:.1f}", f"{job['final']:.2f}", same if others else "-",
                  f"{job['load_before']:.1f} / {job['load_after']:.1f}"]
        lines.append(f"| {job['compressor']} | {job['way']} | " + " | ".join(cells) + " |")
    lines += ["", "Shares of the job's wall time, summed over the compressors:", "",
              "| way | " + " | ".join(phases) + " | exit |",
              "| --- | " + " | ".join("---:" for _ in range(len(phases) + 1)) + " |"]
    for way in WAYS:
        mine = [j for j in jobs if j["way"] == way]
        if not mine:
            continue
        wall = sum(j["wall_s"] for j in mine)
        shares = [sum(j["processes"][0]["seconds"][p] for j in mine) / wall for p in phases]
        shares.append(sum(j["wall_s"] - j["processes"][0]["wall_s"] for j in mine) / wall)
        lines.append(f"| {way} | " + " | ".join(f"{100 * s:.0f}%" for s in shares) + " |")
    lines += ["", "What each phase holds (benchmarks/profiled_run.py, `PHASES`):", ""]
    lines += [f"- **{name}**: {what}." for name, what in PHASES.items()]
    lines += ["- **exit**: the job's wall time after rank 0's app returned: the processes' "
              "exit and, for ranks, torchrun's agent noticing it.", ""]
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--epochs", type=int, default=16, help="the tiny recipe's 16 by default")
    parser.add_argument("--compressors", default=",".join(COMPRESSORS))
    parser.add_argument("--ways", default=",".join(WAYS))
    parser.add_argument("--logger", default="wandb", choices=("wandb", "none"))
    parser.add_argument("--out", type=Path, default=OUT)
    args = parser.parse_args()
    compressors, ways = args.compressors.split(","), args.ways.split(",")
    for name, allowed in ((compressors, COMPRESSORS), (ways, WAYS)):
        unknown = sorted(set(name) - set(allowed))
        if unknown:
            parser.error(f"unknown {unknown}; choose from {list(allowed)}")
    started = time.perf_counter()
    jobs = []
    with tempfile.TemporaryDirectory() as tmp:
        for i, compressor in enumerate(compressors):
            # alternate which way goes first, so that a trend in the load hits both
            for way in ways if i % 2 == 0 else ways[::-1]:
                jobs.append(run_job(way, compressor, args.epochs, args.logger, Path(tmp)))
                print(f"{way} {compressor}: {jobs[-1]['wall_s']:.1f} s wall, "
                      f"{jobs[-1]['cpu_s']:.1f} s CPU", flush=True)
    jobs.sort(key=lambda j: (compressors.index(j["compressor"]), ways.index(j["way"])))
    args.out.mkdir(parents=True, exist_ok=True)
    rows = csv_rows(jobs)
    with open(args.out / "tiny_profile.csv", "w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=list(rows[0]))
        writer.writeheader()
        writer.writerows(rows)
    defaults = {"epochs": 16, "compressors": ",".join(COMPRESSORS), "ways": ",".join(WAYS),
                "logger": "wandb", "out": OUT}
    given = " ".join(f"--{k} {v}" for k, v in vars(args).items() if v != defaults[k])
    line = "make bench-tiny-profile" + (f" ARGS='{given}'" if given else "")
    (args.out / "tiny_profile.md").write_text(markdown(jobs, line, time.perf_counter() - started))
    print((args.out / "tiny_profile.md").read_text())


if __name__ == "__main__":
    main()
