"""`make bench-tiny-speed`: a slice of a tiny sweep, run the old way and the fast way side by side
in one invocation; writes results/bench/tiny_speed.{md,csv}.

    .venv/bin/python -m benchmarks.tiny_speed [--sweep table1] [--only model=resnet18]
        [--seeds 0] [--epochs N] [--repeats 1] [--parallel 2] [--baseline REF]

The old way is what ``make reproduce-<sweep> SCALE=tiny LAUNCHER=local WORKERS=2`` runs: each
run a 2-rank torchrun job, one after another. The fast way is the tiny default (``make
reproduce-<sweep> SCALE=tiny``): each run one process of 2 simulated learners, ``--parallel``
runs at a time. Both are the sweep command itself (``run.py -m``, W&B offline as make runs it),
into fresh run directories; the ways alternate from repeat to repeat. Reported per sweep: its
wall time, the CPU time of all its processes, the 1-minute load average before, during
(sampled every 5 s: mean and max) and after, and how many of its runs recorded exactly the
metrics (every epoch, timings aside) of the same run the other way. Run it on a quiet machine.

``--baseline REF`` compares code instead of ways: the fast way run by the code of git commit REF
(its files from ``git archive``) and by this checkout, side by side in the same way; the table
goes to results/bench/tiny_speed_baseline_<sweep>.{md,csv}, and its last column says whether
each run recorded the same metrics under both (a speed-up that changed no number).
"""

from __future__ import annotations

import argparse
import contextlib
import csv
import json
import os
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

from benchmarks.smoke_gpu import TIMING  # the metrics that differ between equal runs
from benchmarks.tiny_profile import children_cpu

OUT = Path("results/bench")
ROOT = Path(__file__).resolve().parents[1]


def ways(parallel: int) -> dict[str, list[str]]:
    """Each way's launcher overrides."""
    return {"torchrun": ["launcher=local", "hydra.launcher.nproc_per_node=2"],
            "fast": ["launcher=simulated", "trainer.workers=2",
                     f"hydra.launcher.parallel={parallel}"]}


class LoadSampler:
    """The 1-minute load average every ``every_s`` seconds, in a thread, while it is open."""

    def __init__(self, every_s: float = 5.0) -> None:
        self.every_s, self.samples = every_s, [os.getloadavg()[0]]
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        while not self._stop.wait(self.every_s):
            self.samples.append(os.getloadavg()[0])

    def __enter__(self) -> LoadSampler:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()
        self.samples.append(os.getloadavg()[0])


def run_sweep(way: str, launch: list[str], args: argparse.Namespace, root: Path,
              code: Path = ROOT) -> dict[str, Any]:
    """One sweep the given way, by the code in ``code``, into ``root``: wall, CPU, load, its
    runs' metrics."""
    cmd = [sys.executable, "run.py", "-m", f"sweep={args.sweep}", "scale=tiny",
           f"runs_root={root}", f"seed={args.seeds}", *launch, *args.only.split()]
    if args.epochs is not None:
        cmd.append(f"trainer.epochs={args.epochs}")
    env = {**os.environ, "OMP_NUM_THREADS": "1", "WANDB_MODE": "offline", "WANDB_SILENT": "true"}
    cpu_before = children_cpu()
    started = time.perf_counter()
    with LoadSampler() as load:
        proc = subprocess.run(cmd, cwd=code, capture_output=True, text=True, env=env,
                              check=False)
    wall = time.perf_counter() - started
    if proc.returncode != 0:
        raise RuntimeError(f"{way} sweep failed ({' '.join(cmd)}):\n{proc.stdout[-3000:]}\n"
                           f"{proc.stderr[-3000:]}")
    records, made = {}, set()
    for metrics in root.rglob("metrics.jsonl"):
        rows = [json.loads(line) for line in metrics.read_text().splitlines()]
        records[str(metrics.parent.relative_to(root))] = [
            {k: v for k, v in r.items() if k not in TIMING} for r in rows]
        prov = json.loads((metrics.parent / "summary.json").read_text())["provenance"]
        commit = prov["git"]["commit"]  # None: a baseline's archive (its commit is the REF)
        made.add((prov["fingerprint"], "the baseline's" if commit is None else
                  commit[:10] + (" (dirty)" if prov["git"]["dirty"] else "")))
    return {"way": way, "runs": len(records), "wall_s": wall,
            "cpu_s": children_cpu() - cpu_before,
            "load_before": load.samples[0], "load_mean": statistics.mean(load.samples),
            "load_max": max(load.samples), "load_after": load.samples[-1],
            "made_by": "; ".join(f"machine {f}, commit {c}" for f, c in sorted(made)),
            "records": records}


def markdown(sweeps: list[dict[str, Any]], args: argparse.Namespace, command: str,
             seconds: float, baseline: str | None = None) -> str:
    """The table of sweeps and the speed-up (ratio of the ways' median wall times)."""
    slow, fast = ("torchrun", "fast") if baseline is None else ("baseline", "this")
    median = {w: statistics.median(s["wall_s"] for s in sweeps if s["way"] == w)
              for w in (slow, fast)}
    launch = ways(args.parallel)
    if baseline is None:
        title, told = "the torchrun way and the fast way", "Ways: " + "; ".join(
            f"`{w}`: `{' '.join(o)}`" for w, o in launch.items())
    else:
        title = f"this checkout against {baseline}"
        told = (f"Both the fast way (`{' '.join(launch['fast'])}`): `baseline` by the code of "
                f"{baseline}, `this` by this checkout")
    lines = [f"# Tiny sweeps: {title}", "",
             f"Command: `{command}` ({seconds / 60:.1f} min). The slice: `run.py -m "
             f"sweep={args.sweep} scale=tiny seed={args.seeds} {args.only}"
             f"{'' if args.epochs is None else f' trainer.epochs={args.epochs}'}`, "
             f"{sweeps[0]['runs']} runs, W&B offline. {told}. Run records: " +
             "; ".join(sorted({s["made_by"] for s in sweeps})) + ".", "",
             "| repeat | way | runs | wall (min) | CPU (min) | load before / mean / max / after "
             "| runs identical to the other way |", "| ---: | --- | ---: | ---: | ---: | --- "
             "| --- |"]
    for i, s in enumerate(sweeps):
        other = sweeps[i ^ 1]  # the same repeat, the other way
        same = sum(1 for run, rows in s["records"].items() if other["records"].get(run) == rows)
        lines.append(f"| {i // 2} | {s['way']} | {s['runs']} | {s['wall_s'] / 60:.2f} | "
                     f"{s['cpu_s'] / 60:.2f} | {s['load_before']:.1f} / {s['load_mean']:.1f} / "
                     f"{s['load_max']:.1f} / {s['load_after']:.1f} | {same} of {s['runs']} |")
    lines += ["", f"Speed-up (median wall time, {slow} / {fast}): "
              f"**{median[slow] / median[fast]:.2f}x**.", ""]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--sweep", default="table1")
    parser.add_argument("--only", default="model=resnet18", help="filters, space-separated")
    parser.add_argument("--seeds", default="0")
    parser.add_argument("--epochs", type=int, default=None, help="default: the recipe's")
    parser.add_argument("--repeats", type=int, default=1)
    parser.add_argument("--parallel", type=int, default=2, help="the fast way's runs at once")
    parser.add_argument("--out", type=Path, default=OUT)
    parser.add_argument("--baseline", metavar="REF", default=None,
                        help="compare the fast way by this git commit's code and this checkout's")
    args = parser.parse_args(argv)
    started = time.perf_counter()
    sweeps = []
    from benchmarks.compressors import checkout, describe  # noqa: PLC0415 (torch: only here)

    with tempfile.TemporaryDirectory() as tmp, \
            checkout(args.baseline) if args.baseline else contextlib.nullcontext() as base:
        launches = ways(args.parallel)
        order = [(w, o, ROOT) for w, o in launches.items()] if base is None else [
            ("baseline", launches["fast"], base), ("this", launches["fast"], ROOT)]
        for repeat in range(args.repeats):
            for way, launch, code in order if repeat % 2 == 0 else order[::-1]:
                sweeps.append(run_sweep(way, launch, args, Path(tmp) / f"{way}{repeat}", code))
                print(f"repeat {repeat} {way}: {sweeps[-1]['wall_s'] / 60:.2f} min wall",
                      flush=True)
    name = "tiny_speed" if args.baseline is None else f"tiny_speed_baseline_{args.sweep}"
    args.out.mkdir(parents=True, exist_ok=True)
    fields = [k for k in sweeps[0] if k != "records"]
    with open(args.out / f"{name}.csv", "w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=["repeat", *fields])
        writer.writeheader()
        writer.writerows({"repeat": i // 2, **{k: s[k] for k in fields}}
                         for i, s in enumerate(sweeps))
    defaults = {"sweep": "table1", "only": "model=resnet18", "seeds": "0", "epochs": None,
                "repeats": 1, "parallel": 2, "out": OUT, "baseline": None}
    given = " ".join(f"--{k} {v!r}" if " " in str(v) else f"--{k} {v}"
                     for k, v in vars(args).items() if v != defaults[k])
    line = "make bench-tiny-speed" + (f" ARGS=\"{given}\"" if given else "")
    (args.out / f"{name}.md").write_text(markdown(sweeps, args, line,
                                                  time.perf_counter() - started,
                                                  describe(args.baseline)))
    print((args.out / f"{name}.md").read_text())


if __name__ == "__main__":
    main()
