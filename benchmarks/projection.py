"""Project the end-to-end benchmark to clusters: N = 4..256 workers, 1..100 Gbit/s links.

    python -m benchmarks.projection      # after benchmarks.e2e (make bench-e2e runs both)

Feeds the ideal model (:mod:`benchmarks.netmodel`) with what ``make bench-e2e`` measured: every
method's collectives per bucket (their sizes do not depend on batch or link) and the shape of the
compute step (forward / backward / optimizer shares, bucket ready times), stretched to a GPU
step time from ``benchmarks/gpu_step_times.csv`` (edit it: the shipped values are FLOP-based
estimates, each row says how it was made). Per model, method, N and bandwidth: time per step
and per epoch (``samples_per_epoch / (batch_per_worker N)`` steps) and the speed-up over
``none``. Writes results/bench/projection.{csv,md} and projection.png (heat maps).

Top-K's and AdaComp's messages are all-gathered, so each worker receives N - 1 of them and
their cost grows with N; PowerSGD's factors are all-reduced, whose traffic per worker stays
below twice the message. The break-even table shows the N at which each method stops paying.

The model's error on the measured 2-rank steps (measured / predicted - 1, compressor work not
in the model) is reported alongside, from the same raw records.
"""

from __future__ import annotations

import argparse
import csv
import math
import statistics
from pathlib import Path
from typing import Any

import torch
from torch import nn
from torch.utils.flop_counter import FlopCounterMode

import models
from benchmarks import netmodel
from benchmarks.e2e import (
    CALIBRATION,
    MODELS,
    OUT,
    analyze,
    collectives,
    compute_profile,
    load_runs,
)
from benchmarks.e2e_ranks import make_batch

TABLE = Path(__file__).with_name("gpu_step_times.csv")
WORKERS = (4, 8, 16, 32, 64, 128, 256)
GBITS = (1.0, 2.5, 5.0, 10.0, 25.0, 50.0, 100.0)
# alpha per collective: an assumption (a small NCCL all-reduce across nodes takes tens of us)
LATENCY_S = 50e-6
SHOWN_GBITS = (10.0, 100.0)
SHOWN_WORKERS = (4, 16, 64, 256)


def read_table(path: Path = TABLE) -> dict[str, dict[str, Any]]:
    """The GPU step-time table: model -> batch_per_worker, samples_per_epoch, step_ms, source."""
    with open(path, newline="") as f:
        return {row["model"]: {"batch_per_worker": int(row["batch_per_worker"]),
                               "samples_per_epoch": int(row["samples_per_epoch"]),
                               "step_ms": float(row["step_ms"]), "source": row["source"]}
                for row in csv.DictReader(f)}


def project(runs: list[dict[str, Any]], table: dict[str, dict[str, Any]],
            workers: tuple[int, ...] = WORKERS, gbits: tuple[float, ...] = GBITS,
            latency: float = LATENCY_S) -> list[dict[str, Any]]:
    """One row per model, method, N and bandwidth (see the module doc)."""
    rows = []
    for raw in _one_run_per_model(runs):
        model = raw["model_name"]
        if model not in table:
            continue
        gpu = table[model]
        compute = compute_profile(raw).scaled(gpu["step_ms"] / 1e3)
        methods = [m for m in raw["spec"]["methods"] if m["key"] not in CALIBRATION]
        buckets = {m["key"]: collectives(raw, m["key"]) for m in methods}
        for n in workers:
            steps = gpu["samples_per_epoch"] / (gpu["batch_per_worker"] * n)
            for g in gbits:
                link = netmodel.Link(bandwidth=g * 1e9 / 8, latency=latency)
                base = netmodel.step_time(compute, buckets["none"], n, link)
                for m in methods:
                    step = netmodel.step_time(compute, buckets[m["key"]], n, link)
                    rows.append({"model": model, "method": m["label"], "key": m["key"],
                                 "workers": n, "gbit_s": g, "step_ms": 1e3 * step,
                                 "epoch_s": steps * step, "speedup": base / step,
                                 "compute_ms": gpu["step_ms"]})
    return rows


def _one_run_per_model(runs: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Per model, the rate-limited run closest to ratio 1 (message sizes are the same in all;
    the compute profile is the one measured there)."""
    best: dict[str, dict[str, Any]] = {}
    for raw in runs:
        if raw["ratio"] is None:
            continue
        old = best.get(raw["model_name"])
        if old is None or abs(math.log(raw["ratio"])) < abs(math.log(old["ratio"])):
            best[raw["model_name"]] = raw
    return list(best.values())


def break_even(rows: list[dict[str, Any]]) -> dict[tuple[str, str, float], int | None]:
    """(model, method, Gbit/s) -> the smallest N at which the method is slower than ``none``
    (None: it pays at every N projected)."""
    found: dict[tuple[str, str, float], int | None] = {}
    for r in sorted(rows, key=lambda r: r["workers"]):
        key = (r["model"], r["method"], r["gbit_s"])
        found.setdefault(key, None)
        if found[key] is None and r["speedup"] < 1.0:
            found[key] = r["workers"]
    return found


def model_error(runs: list[dict[str, Any]]) -> dict[str, float]:
    """The model's error on the 2-rank measurements: |measured / predicted - 1| over every
    (model, ratio, method), median and max, all ratios and ratios >= 1."""
    rows = [r for raw in runs if raw["ratio"] is not None for r in analyze(raw)]
    errors = [abs(r["model_error"]) for r in rows]
    high = [abs(r["model_error"]) for r in rows if r["ratio"] >= 1]
    return {"median": statistics.median(errors), "max": max(errors),
            "median_ratio_ge_1": statistics.median(high) if high else math.nan,
            "rows": len(errors)}


# ---- output ----------------------------------------------------------------------------------
def write_csv(rows: list[dict[str, Any]], path: Path) -> None:
    with open(path, "w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=list(rows[0]))
        writer.writeheader()
        for r in rows:
            writer.writerow({k: f"{v:.4g}" if isinstance(v, float) else v for k, v in r.items()})


def markdown(rows: list[dict[str, Any]], table: dict[str, dict[str, Any]],
             error: dict[str, float], latency: float) -> str:
    """Speed-up tables at the shown bandwidths and N, and the break-even N of every method."""
    lines = [
        f"Ideal alpha-beta model: ring all-reduce 2(N-1)/N S, all-gather (N-1) S, alpha = "
        f"{latency * 1e6:g} us per collective (assumed), communication overlapped with "
        f"backward as DDP does. Inputs: the message sizes measured by `make bench-e2e`, the "
        f"GPU step times of `benchmarks/gpu_step_times.csv` (estimates unless you put "
        f"measured ones there). The model's error on the 2-rank measurements (measured / "
        f"predicted step - 1, {error['rows']} rows): median |error| "
        f"{100 * error['median']:.0f}% ({100 * error['median_ratio_ge_1']:.0f}% at ratios "
        f">= 1), max {100 * error['max']:.0f}%.", ""]
    for model in dict.fromkeys(r["model"] for r in rows):
        gpu = table[model]
        mine = [r for r in rows if r["model"] == model]
        lines += [f"*{model}*: {gpu['step_ms']:g} ms compute per step, batch "
                  f"{gpu['batch_per_worker']} per worker, {gpu['samples_per_epoch']} samples "
                  f"per epoch. Speed-up over `none` (`none`: seconds per epoch).", "",
                  "| method | " + " | ".join(f"{g:g} Gbit/s N={n}" for g in SHOWN_GBITS
                                             for n in SHOWN_WORKERS) + " |",
                  "|---|" + "---|" * (len(SHOWN_GBITS) * len(SHOWN_WORKERS))]
        for method in dict.fromkeys(r["method"] for r in mine):
            cells = []
            for g in SHOWN_GBITS:
                for n in SHOWN_WORKERS:
                    r = next(r for r in mine if r["method"] == method and r["gbit_s"] == g
                             and r["workers"] == n)
                    cells.append(f"{r['epoch_s']:.1f} s" if r["key"] == "none"
                                 else f"{r['speedup']:.2f}x")
            lines.append(f"| {method} | " + " | ".join(cells) + " |")
        lines.append("")
    gbits = sorted({r["gbit_s"] for r in rows})
    lines += ["**Break-even**: the smallest N (of " + ", ".join(
        str(n) for n in sorted({r["workers"] for r in rows})) + ") at which a method is "
              "slower than `none`; `-`: it pays at every N.", "",
              "| model | method | " + " | ".join(f"{g:g} Gbit/s" for g in gbits) + " |",
              "|---|---|" + "---|" * len(gbits)]
    even = break_even(rows)
    for model, method in dict.fromkeys((r["model"], r["method"]) for r in rows
                                       if r["key"] != "none"):
        cells = [even[(model, method, g)] for g in gbits]
        lines.append(f"| {model} | {method} | " + " | ".join("-" if c is None else str(c)
                                                           for c in cells) + " |")
    return "\n".join(lines) + "\n"


def heat_map(rows: list[dict[str, Any]], path: Path) -> None:
    """One panel per model and compressor: log2 speed-up over ``none`` by N and bandwidth."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import numpy as np
    import seaborn as sns

    shown = [r for r in rows if r["key"] != "none" and not r["key"].startswith("torch-")]
    models = list(dict.fromkeys(r["model"] for r in shown))
    methods = list(dict.fromkeys(r["method"] for r in shown))
    workers = sorted({r["workers"] for r in shown})
    gbits = sorted({r["gbit_s"] for r in shown})
    fig, axes = plt.subplots(len(models), len(methods), squeeze=False, sharex=True, sharey=True,
                             figsize=(1.55 * len(methods) + 1.2, 1.5 * len(models) + 0.8))
    for i, model in enumerate(models):
        for j, method in enumerate(methods):
            grid = np.full((len(gbits), len(workers)), np.nan)
            for r in shown:
                if r["model"] == model and r["method"] == method:
                    grid[gbits.index(r["gbit_s"]), workers.index(r["workers"])] = \
                        math.log2(r["speedup"])
            ax = axes[i][j]
            sns.heatmap(grid[::-1], ax=ax, cmap="RdBu", center=0.0, vmin=-3, vmax=3, cbar=False,
                        xticklabels=workers, yticklabels=[f"{g:g}" for g in gbits[::-1]])
            ax.tick_params(labelsize=6)
            if i == 0:
                ax.set_title(method, fontsize=7)
            if j == 0:
                ax.set_ylabel(f"{model}\nGbit/s", fontsize=7)
            if i == len(models) - 1:
                ax.set_xlabel("workers N", fontsize=7)
    mappable = axes[0][0].collections[0]
    bar = fig.colorbar(mappable, ax=axes, shrink=0.8, ticks=[-3, -2, -1, 0, 1, 2, 3])
    bar.ax.set_yticklabels(["1/8x", "1/4x", "1/2x", "1x", "2x", "4x", "8x"], fontsize=7)
    bar.set_label("speed-up over none (ideal model)", fontsize=7)
    fig.savefig(path, dpi=110, bbox_inches="tight")
    plt.close(fig)


def count_flops(model: str, batch: int) -> float:
    """Forward + backward FLOPs of one step of ``model`` at ``batch`` (meta tensors: nothing
    is computed), as the shipped table's estimates were made."""
    spec = {**MODELS[model], "batch": batch, "seq": 30}
    with torch.device("meta"):
        net = models.build(spec["model"], **spec["model_kwargs"])
    x, y = (t.to("meta") for t in make_batch(spec, rank=0))
    with FlopCounterMode(display=False) as counter:
        out = net(x)
        if isinstance(out, tuple):
            out = out[0].reshape(-1, out[0].shape[-1])
        nn.functional.cross_entropy(out, y).backward()
    return float(counter.get_total_flops())


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--raw", type=Path, default=OUT / "raw" / "e2e")
    parser.add_argument("--out", type=Path, default=OUT)
    parser.add_argument("--table", type=Path, default=TABLE)
    parser.add_argument("--latency-us", type=float, default=LATENCY_S * 1e6)
    parser.add_argument("--count-flops", action="store_true",
                        help="print each model's FLOPs per step at the table's batch, and exit")
    args = parser.parse_args(argv)
    table = read_table(args.table)
    if args.count_flops:
        for model, row in table.items():
            print(f"{model}: {count_flops(model, row['batch_per_worker']) / 1e9:.0f} GFLOP "
                  f"per step at batch {row['batch_per_worker']}")
        return 0
    runs = load_runs(args.raw)
    if not runs:
        raise SystemExit(f"projection: no raw records in {args.raw}; run benchmarks.e2e first")
    latency = args.latency_us * 1e-6
    rows = project(runs, table, latency=latency)
    args.out.mkdir(parents=True, exist_ok=True)
    write_csv(rows, args.out / "projection.csv")
    text = markdown(rows, table, model_error(runs), latency)
    (args.out / "projection.md").write_text(text)
    heat_map(rows, args.out / "projection.png")
    print(text)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
