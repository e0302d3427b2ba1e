"""Time to accuracy over the emulated link: whole run.py trainings, side by side at one ratio.

    sudo .venv/bin/python -m benchmarks.tta                          # the provisional pair
    sudo .venv/bin/python -m benchmarks.tta --jobs my_jobs.yaml --ratio 4

Each job is a list of run.py overrides; every job runs as a 2-rank torchrun job inside the
rate-limited namespace (:mod:`benchmarks.netns`), one after the other, all at the same link.
The link is set as in ``make bench-e2e``: the first job's model and per-rank batch are
calibrated without a limit (compute alone, dense all-reduce bytes), and the tbf rate makes the
dense all-reduce take ``--ratio`` times the compute time of a step.

A jobs file (YAML)::

    common: [dataset=digits, model=resnet18, trainer.epochs=6]   # added to every job
    jobs:
      powersgd-rank2: [compressor=powersgd, compressor.rank=2]   # the first is the reference
      accordion: [compressor=powersgd, scheduler=accordion]

Per job: training time (the epochs' ``time/epoch_s``, evaluation excluded, as the Accordion
authors timed) and wall time, final and best test metric, bits sent, and the training time until
the test metric first reached the reference job's final value (time to accuracy). Writes
results/bench/tta.{csv,md} (``tta_<name>.*`` for a jobs file ``[tta_]<name>.yaml``); the run
records stay in results/bench/raw/<that stem>/<job>/.
"""

from __future__ import annotations

import argparse
import csv
import json
import signal
import sys
import time
from pathlib import Path
from typing import Any

from hydra import compose, initialize_config_dir
from omegaconf import OmegaConf

import models
from benchmarks.e2e import OUT, WORLD, calibrate, rate_for
from benchmarks.netns import Namespace, Unavailable, rank_env, unavailable_reason
from core.record import METRICS, SUMMARY, read_metrics

ROOT = Path(__file__).resolve().parents[1]
PROVISIONAL = Path(__file__).with_name("tta_provisional.yaml")
MASTER_PORT = "29500"  # the namespace has its own ports: nothing else listens there


def read_jobs(path: Path) -> dict[str, list[str]]:
    """Job name -> run.py overrides (``common`` first) from a jobs file (module doc)."""
    spec = OmegaConf.to_container(OmegaConf.load(path)) or {}
    jobs = spec.get("jobs") or {}
    if not isinstance(jobs, dict) or not jobs:
        raise SystemExit(f"error: {path}: `jobs` must map job names to lists of overrides")
    common = [str(o) for o in spec.get("common") or []]
    return {str(name): common + [str(o) for o in overrides or []]
            for name, overrides in jobs.items()}


def rank_spec(overrides: list[str]) -> dict[str, Any]:
    """The e2e_ranks model spec of a job: its model and per-rank batch, as run.py builds them."""
    with initialize_config_dir(str(ROOT / "conf"), version_base="1.3"):
        cfg = compose("config", overrides=overrides)
    model = OmegaConf.to_container(cfg.model, resolve=True)
    name = model.pop("name")
    kind = models.input_kind(name)["kind"]
    spec: dict[str, Any] = {"model": name, "model_kwargs": model, "input": kind,
                            "batch": int(cfg.trainer.batch_size) // WORLD}
    if kind == "tokens":
        spec["seq"] = int(cfg.dataset.bptt)
    else:
        spec["shape"] = list(cfg.dataset.input_shape)
    return spec


def run_job(ns: Namespace, name: str, overrides: list[str], run_dir: Path, timeout_s: float
            ) -> dict[str, Any]:
    """One 2-rank torchrun job of run.py in ``ns``; returns its wall time and run record."""
    cmd = [sys.executable, "-m", "torch.distributed.run", "--nnodes", "1",
           "--nproc-per-node", str(WORLD), "--master-addr", "127.0.0.1", "--master-port",
           MASTER_PORT, "run.py", *overrides, f"hydra.run.dir={run_dir}"]
    started = time.perf_counter()
    done = ns.run(cmd, env={**rank_env(), "WANDB_MODE": "offline"}, timeout_s=timeout_s,
                  cwd=ROOT)
    wall = time.perf_counter() - started
    summary_path = run_dir / SUMMARY
    if done.returncode != 0 or not summary_path.exists():
        raise RuntimeError(f"job {name} failed (exit {done.returncode}):\n"
                           f"{done.stderr[-4000:]}")
    return {"wall_s": wall, "summary": json.loads(summary_path.read_text()),
            "metrics": read_metrics(run_dir / METRICS)}


def time_to(metrics: list[dict[str, Any]], metric: str, target: float) -> float | None:
    """Training seconds until ``metric`` first reached ``target`` (None: never)."""
    lower = metric.endswith("perplexity") or metric.endswith("loss")
    elapsed = 0.0
    for row in metrics:
        elapsed += row["time/epoch_s"]
        value = row.get(metric)
        if value is not None and (value <= target if lower else value >= target):
            return elapsed
    return None


def rows_of(jobs: dict[str, list[str]], results: dict[str, dict[str, Any]], ratio: float,
            rate: float) -> list[dict[str, Any]]:
    """One row per job; speed-ups and time to accuracy against the first job."""
    reference = results[next(iter(jobs))]
    metric, target = reference["summary"]["metric"], reference["summary"]["final"]
    ref_train = sum(r["time/epoch_s"] for r in reference["metrics"])
    ref_tta = time_to(reference["metrics"], metric, target)
    rows = []
    for name, overrides in jobs.items():
        res = results[name]
        train = sum(r["time/epoch_s"] for r in res["metrics"])
        tta = time_to(res["metrics"], metric, target)
        summary = res["summary"]
        rows.append({
            "job": name, "ratio": ratio, "rate_Mbit_s": 8 * rate / 1e6,
            "status": summary["status"], "epochs": summary["epochs_completed"],
            "metric": metric, "final": summary["final"], "best": summary["best"],
            "train_s": train, "wall_s": res["wall_s"], "speedup": ref_train / train,
            "gbit_sent": summary["total_bits"] / 1e9,
            "target": target, "time_to_target_s": tta,
            "tta_speedup": None if tta is None or ref_tta is None else ref_tta / tta,
            "overrides": " ".join(overrides)})
    return rows


def stem_of(jobs_file: Path) -> str:
    """Results' file stem: ``tta`` for the provisional pair, ``tta_<jobs file stem>`` else."""
    if jobs_file.resolve() == PROVISIONAL:
        return "tta"
    return f"tta_{jobs_file.stem.removeprefix('tta_')}"


def write(rows: list[dict[str, Any]], out: Path, stem: str = "tta") -> None:
    """results/bench/<stem>.csv and <stem>.md."""
    out.mkdir(parents=True, exist_ok=True)
    with open(out / f"{stem}.csv", "w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=list(rows[0]))
        writer.writeheader()
        writer.writerows(rows)
    ref = rows[0]
    lines = [f"2-rank run.py jobs in the namespace at ratio {ref['ratio']:g} (tbf "
             f"{ref['rate_Mbit_s']:.0f} Mbit/s). Training time excludes evaluation; speed-ups "
             f"are against `{ref['job']}`; time to target: training time until "
             f"{ref['metric']} first reached {ref['target']:.4g} (the reference's final).", "",
             "| job | status | epochs | final | best | train s | wall s | speed-up | Gbit sent "
             "| time to target s | speed-up to target |", "|---" * 11 + "|"]

    def num(v: Any, d: int = 2) -> str:
        return "never" if v is None else f"{v:.{d}f}" if isinstance(v, float) else str(v)

    for r in rows:
        lines.append(f"| {r['job']} | {r['status']} | {r['epochs']} | {num(r['final'], 4)} | "
                     f"{num(r['best'], 4)} | {num(r['train_s'], 1)} | {num(r['wall_s'], 1)} | "
                     f"{num(r['speedup'])}x | {num(r['gbit_sent'], 3)} | "
                     f"{num(r['time_to_target_s'], 1)} | "
                     f"{'' if r['tta_speedup'] is None else num(r['tta_speedup']) + 'x'} |")
    lines += ["", "Overrides:", ""] + [f"- `{r['job']}`: `{r['overrides']}`" for r in rows]
    (out / f"{stem}.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--jobs", type=Path, default=PROVISIONAL)
    parser.add_argument("--ratio", type=float, default=4.0)
    parser.add_argument("--out", type=Path, default=OUT)
    parser.add_argument("--timeout-min", type=float, default=120.0, help="per job")
    args = parser.parse_args(argv)
    jobs = read_jobs(args.jobs)
    signal.signal(signal.SIGTERM, lambda signum, frame: sys.exit(128 + signum))
    reason = unavailable_reason()
    if reason is not None:
        print(f"tta: skipped, no rate-limited network namespace here ({reason})")
        return 0
    stem = stem_of(args.jobs)
    raw_dir = args.out / "raw" / stem
    first = next(iter(jobs))
    results: dict[str, dict[str, Any]] = {}
    try:
        with Namespace() as ns:
            calibration = calibrate(ns, rank_spec(jobs[first]), 3,
                                    raw_dir / "calibration.json", first)
            rate = rate_for(args.ratio, calibration["dense_lo_MB"] * 1e6,
                            calibration["compute_ms"] / 1e3)
            ns.set_rate(rate)
            for name, overrides in jobs.items():
                results[name] = run_job(ns, name, overrides, (raw_dir / name).resolve(),
                                        60 * args.timeout_min)
                r = results[name]
                print(f"{name}: {r['summary']['status']}, {r['summary']['metric']} "
                      f"{r['summary']['final']}, {r['wall_s']:.0f} s", flush=True)
    except Unavailable as exc:
        print(f"tta: skipped ({exc})")
        return 0
    write(rows_of(jobs, results, args.ratio, rate), args.out, stem)
    return 0


if __name__ == "__main__":
    sys.exit(main())
