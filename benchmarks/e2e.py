"""End-to-end step time over an emulated slow link; writes results/bench/e2e.{csv,md}.

    make bench-e2e          # or: sudo .venv/bin/python -m benchmarks.e2e  (needs root: ip netns)

Real 2-rank DDP training steps (gloo, CPU) of ResNet-18, VGG-19bn and the WikiText-2 LSTM at
full width, inside a network namespace whose loopback is rate-limited (:mod:`benchmarks.netns`),
for every compressor and PyTorch's ``powerSGD_hook`` (:mod:`benchmarks.e2e_ranks` runs them).

Bandwidth is set as a ratio: per model, a first run without a limit measures the compute time of
a step (the same step with a hook that does not communicate) and the bytes the dense all-reduce
puts through lo; the tbf rate is then chosen so that the dense all-reduce alone takes 0.25x, 1x,
4x and 16x that compute time. Each of these runs measures again, side by side: compute alone,
the dense all-reduce alone (the ratio achieved), and every method's step.

Against the ideal model (:mod:`benchmarks.netmodel`, fed with the measured compute profile and
the collectives each method issued, compression free), every method gets the measured speed-up
over ``none``, the ideal one, and their quotient (target >= 0.9 at ratios >= 1). Raw records go
to results/bench/raw/e2e/ (one JSON per model and ratio); :mod:`benchmarks.projection` reads them
to project to clusters (``make bench-e2e`` runs it next).
"""

from __future__ import annotations

import argparse
import csv
import json
import math
import os
import signal
import statistics
import sys
import time
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from benchmarks import netmodel
from benchmarks.netmodel import Collective, Compute
from benchmarks.netns import Namespace, Unavailable, rank_env, unavailable_reason

OUT = Path("results/bench")
RAW = OUT / "raw" / "e2e"
RATIOS = (0.25, 1.0, 4.0, 16.0)
WORLD = 2
TARGET = 0.9  # measured / ideal speed-up, at ratios >= 1

# Full-width models (their message sizes are the real ones); per-rank batches small enough for a
# CPU step of about half a second on a quiet core.
MODELS: dict[str, dict[str, Any]] = {
    "resnet18": {"model": "resnet18", "model_kwargs": {"num_classes": 10}, "input": "image",
                 "shape": [3, 32, 32], "batch": 4},
    "vgg19bn": {"model": "vgg19bn", "model_kwargs": {"num_classes": 10}, "input": "image",
                "shape": [3, 32, 32], "batch": 4},
    "lstm": {"model": "lstm", "model_kwargs": {"num_classes": 33278}, "input": "tokens",
             "seq": 35, "batch": 2},
}
# Narrow versions, for tests and a first look (`--tiny`).
TINY: dict[str, dict[str, Any]] = {
    "resnet18": {**MODELS["resnet18"], "model_kwargs": {"num_classes": 10, "width": 8}},
    "lstm": {**MODELS["lstm"], "model_kwargs": {"num_classes": 1000, "emb_size": 64,
                                                "hidden_size": 64}, "seq": 10},
}


def _ours(key: str, label: str, name: str, **params: Any) -> dict[str, Any]:
    return {"key": key, "label": label, "kind": "ours", "name": name, "params": params}


METHODS: list[dict[str, Any]] = [
    {"key": "compute", "label": "compute alone (no communication)", "kind": "compute"},
    {"key": "dense", "label": "dense all-reduce alone (no compute)", "kind": "dense_alone"},
    _ours("none", "none (fp32 all-reduce)", "none"),
    *[_ours(f"powersgd{r}", f"PowerSGD rank {r}", "powersgd", rank=r) for r in (1, 2, 4)],
    *[{"key": f"torch-powersgd{r}", "label": f"PyTorch powerSGD_hook rank {r}",
       "kind": "torch_powersgd", "params": {"rank": r}} for r in (1, 2, 4)],
    *[_ours(f"topk{k}", f"Top-K {k}", "topk", ratio=k) for k in (0.99, 0.1, 0.02)],
    _ours("adacomp", "AdaComp L_T 50/500", "adacomp", conv_bin_size=50, fc_bin_size=500),
]
CALIBRATION = ("compute", "dense")


# ---- running the ranks -----------------------------------------------------------------------
def launch(ns: Namespace, model: dict[str, Any], methods: list[dict[str, Any]], warmup: int,
           steps: int, path: Path, extra: dict[str, Any]) -> dict[str, Any]:
    """Run :mod:`benchmarks.e2e_ranks` in ``ns`` at its current rate; returns (and saves to
    ``path``) the ranks' records with the spec and ``extra``."""
    spec = {**model, "methods": methods, "warmup": warmup, "steps": steps,
            "world_size": WORLD}
    path.parent.mkdir(parents=True, exist_ok=True)
    spec_path, out_path = path.with_suffix(".spec.json"), path.with_suffix(".ranks.json")
    spec_path.write_text(json.dumps(spec))
    qdisc = ns.qdisc_stats()
    started = time.perf_counter()
    done = ns.run([sys.executable, "-m", "benchmarks.e2e_ranks", str(spec_path), str(out_path)],
                  env=rank_env(), timeout_s=3600)
    if done.returncode != 0:
        raise RuntimeError(f"ranks failed ({path.name}):\n{done.stderr[-4000:]}")
    after = ns.qdisc_stats()
    raw = {"spec": spec, "rate": ns.rate, "wall_s": time.perf_counter() - started,
           "ranks": json.loads(out_path.read_text()),
           "qdisc": {k: after[k] - qdisc[k] for k in after}, **extra}
    path.write_text(json.dumps(raw))
    spec_path.unlink()
    out_path.unlink()
    return raw


# ---- reading a run's records -----------------------------------------------------------------
def step_records(raw: dict[str, Any], key: str) -> list[list[dict[str, Any]]]:
    """Method ``key``'s measured steps: for each step, every rank's record."""
    per_rank = [r["steps"][key] for r in raw["ranks"]]
    return [list(step) for step in zip(*per_rank, strict=True)]


def step_time(raw: dict[str, Any], key: str) -> float:
    """Median over steps of the slowest rank's step time (s)."""
    return statistics.median(max(r["step"] for r in step) for step in step_records(raw, key))


def compute_profile(raw: dict[str, Any]) -> Compute:
    """The compute-alone step's phases and bucket ready times (medians over steps of the
    slower rank's)."""
    slow = [max(step, key=lambda r: r["step"]) for step in step_records(raw, "compute")]
    ready = [statistics.median(r["ready"][b] for r in slow) for b in range(len(slow[0]["ready"]))]
    return Compute(forward=statistics.median(r["forward"] for r in slow),
                   backward=statistics.median(r["backward"] for r in slow),
                   optimizer=statistics.median(r["optimizer"] for r in slow),
                   ready=tuple(ready))


def collectives(raw: dict[str, Any], key: str) -> list[list[Collective]]:
    """The collectives of method ``key``'s last measured step on rank 0, by bucket."""
    record = raw["ranks"][0]["steps"][key][-1]
    buckets: list[list[Collective]] = [[] for _ in record["ready"]]
    for bucket, op, nbytes, _ in record["collectives"]:
        buckets[bucket].append(Collective(op, int(nbytes)))
    return buckets


def latency(raw: dict[str, Any]) -> float:
    """alpha: the median time of a one-float all-reduce on the slower rank."""
    return max(r["latency"]["all_reduce"] for r in raw["ranks"])


def namespace_link(raw: dict[str, Any]) -> netmodel.Link:
    rate = raw["rate"] if raw["rate"] is not None else math.inf
    return netmodel.link_of_namespace(rate, WORLD, latency(raw))


def _median(values: Iterable[float]) -> float:
    values = list(values)
    return statistics.median(values) if values else math.nan


# ---- one run's rows --------------------------------------------------------------------------
def analyze(raw: dict[str, Any]) -> list[dict[str, Any]]:
    """One row per method of a (model, ratio) run: measured, modelled, and the bytes."""
    compute = compute_profile(raw)
    compute_s = step_time(raw, "compute")
    link = namespace_link(raw)
    methods = [m for m in raw["spec"]["methods"] if m["key"] not in CALIBRATION]
    base_buckets = collectives(raw, "none")
    base_step = step_time(raw, "none")
    base_ideal = netmodel.step_time(compute, base_buckets, WORLD, link)
    rows = []
    for m in methods:
        key = m["key"]
        buckets = collectives(raw, key)
        flat = [c for b in buckets for c in b]
        measured = step_time(raw, key)
        ideal = netmodel.step_time(compute, buckets, WORLD, link)
        records = [r for step in step_records(raw, key) for r in step]
        compress_s = _median(r["compress_s"] for r in records) if m["kind"] == "ours" else None
        wire_bits = _median(r["wire_bits"] for r in records) if m["kind"] == "ours" else None
        speedup, ideal_speedup = base_step / measured, base_ideal / ideal
        rows.append({
            "model": raw["model_name"], "ratio": raw["ratio"], "method": m["label"],
            "key": key, "step_ms": 1e3 * measured, "compute_ms": 1e3 * compute_s,
            "ideal_ms": 1e3 * ideal,
            "model_error": measured / ideal - 1,
            "speedup": speedup, "ideal_speedup": ideal_speedup,
            "efficiency": speedup / ideal_speedup,
            "hook_wire_MB": None if wire_bits is None else wire_bits / 8e6,
            "message_MB": sum(c.nbytes for c in flat) / 1e6,
            "collectives": len(flat),
            "lo_MB": _median(s["lo_bytes"] for s in raw["ranks"][0]["steps"][key]) / 1e6,
            "lo_expected_MB": WORLD * sum(netmodel.wire_bytes(c, WORLD) for c in flat) / 1e6,
            "compress_ms": None if compress_s is None else 1e3 * compress_s,
        })
    return rows


def calibration_row(raw: dict[str, Any]) -> dict[str, Any]:
    """What a (model, ratio) run's link was: rate, dense all-reduce alone vs compute."""
    compute_s, dense_s = step_time(raw, "compute"), step_time(raw, "dense")
    return {"model": raw["model_name"], "ratio": raw["ratio"],
            "rate_Mbit_s": None if raw["rate"] is None else 8 * raw["rate"] / 1e6,
            "compute_ms": 1e3 * compute_s, "dense_ms": 1e3 * dense_s,
            "achieved_ratio": dense_s / compute_s, "alpha_ms": 1e3 * latency(raw),
            "dense_lo_MB": _median(s["lo_bytes"] for s in raw["ranks"][0]["steps"]["dense"])
            / 1e6, "tbf_dropped": raw["qdisc"]["dropped"], "wall_s": raw["wall_s"]}


# ---- the benchmark ---------------------------------------------------------------------------
def rate_for(ratio: float, calibration: dict[str, Any]) -> float:
    """tbf rate (bytes/s) at which the dense all-reduce's lo traffic takes ``ratio`` x the
    compute time (both measured in the calibration run)."""
    dense_bytes = calibration["dense_lo_MB"] * 1e6
    return dense_bytes / (ratio * calibration["compute_ms"] / 1e3)


def calibrate(ns: Namespace, model: dict[str, Any], steps: int, path: Path,
              name: str) -> dict[str, Any]:
    """Compute alone and the dense all-reduce alone, without a rate limit (saved to ``path``)."""
    ns.set_rate(None)
    raw = launch(ns, model, [m for m in METHODS if m["key"] in CALIBRATION], warmup=1,
                 steps=steps, path=path, extra={"model_name": name, "ratio": None})
    calibration = calibration_row(raw)
    print(f"{name}: compute {calibration['compute_ms']:.0f} ms, dense all-reduce "
          f"{calibration['dense_lo_MB']:.1f} MB on lo in {calibration['dense_ms']:.0f} ms "
          f"unlimited", flush=True)
    return calibration


def run_model(ns: Namespace, name: str, model: dict[str, Any], methods: list[dict[str, Any]],
              ratios: Iterable[float], warmup: int, steps: int, raw_dir: Path) -> None:
    """Calibrate one model without a limit, then run every method at every ratio."""
    calibration = calibrate(ns, model, max(steps, 3), raw_dir / f"{name}-calibration.json", name)
    for ratio in ratios:
        ns.set_rate(rate_for(ratio, calibration))
        raw = launch(ns, model, methods, warmup, steps,
                     path=raw_dir / f"{name}-ratio{ratio:g}.json",
                     extra={"model_name": name, "ratio": ratio})
        row = calibration_row(raw)
        print(f"  ratio {ratio:g}: rate {row['rate_Mbit_s']:.0f} Mbit/s, achieved "
              f"{row['achieved_ratio']:.2f}, {raw['wall_s']:.0f} s", flush=True)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--models", nargs="+", default=list(MODELS), choices=list(MODELS))
    parser.add_argument("--methods", nargs="+", default=None,
                        help="method keys (default all): " + " ".join(m["key"] for m in METHODS))
    parser.add_argument("--ratios", nargs="+", type=float, default=list(RATIOS))
    parser.add_argument("--warmup", type=int, default=1)
    parser.add_argument("--steps", type=int, default=4, help="measured steps per method")
    parser.add_argument("--tiny", action="store_true", help="narrow models (a quick check)")
    parser.add_argument("--out", type=Path, default=OUT)
    parser.add_argument("--report-only", action="store_true",
                        help="only rewrite the results from the raw records of the last run")
    args = parser.parse_args(argv)
    raw_dir = args.out / "raw" / "e2e"
    if not args.report_only:
        models = TINY if args.tiny else MODELS
        keys = set(args.methods or [m["key"] for m in METHODS]) | {"compute", "dense", "none"}
        methods = [m for m in METHODS if m["key"] in keys]
        signal.signal(signal.SIGTERM, lambda signum, frame: sys.exit(128 + signum))
        reason = unavailable_reason()
        if reason is not None:
            print(f"bench-e2e: skipped, no rate-limited network namespace here ({reason})")
            return 0
        try:
            measure({n: models[n] for n in args.models if n in models}, methods, args.ratios,
                    args.warmup, args.steps, raw_dir)
        except Unavailable as exc:
            print(f"bench-e2e: skipped ({exc})")
            return 0
    report(raw_dir, args.out)
    return 0


def measure(models: dict[str, dict[str, Any]], methods: list[dict[str, Any]],
            ratios: Iterable[float], warmup: int, steps: int, raw_dir: Path) -> None:
    """Run every model (fresh ``raw_dir``), recording the run's context there too."""
    for old in raw_dir.glob("*.json"):
        old.unlink()
    load_before, started = os.getloadavg(), time.perf_counter()
    with Namespace() as ns:
        for name, model in models.items():
            run_model(ns, name, model, methods, ratios, warmup, steps, raw_dir)
    context = {"minutes": (time.perf_counter() - started) / 60, "load_before": load_before,
               "load_after": os.getloadavg(), "warmup": warmup, "steps": steps}
    (raw_dir / "context.json").write_text(json.dumps(context))


def load_runs(raw_dir: Path) -> list[dict[str, Any]]:
    """Every run of the last benchmark, calibration runs first, in run order per model."""
    runs = [json.loads(p.read_text()) for p in sorted(raw_dir.glob("*-*.json"))]
    return sorted(runs, key=lambda r: (r["model_name"], -1 if r["ratio"] is None else r["ratio"]))


def report(raw_dir: Path, out: Path) -> None:
    """Write results/bench/e2e.{csv,md} from the raw records in ``raw_dir``."""
    runs = load_runs(raw_dir)
    if not runs:
        raise SystemExit(f"bench-e2e: no raw records in {raw_dir}; run the benchmark first")
    rows = [row for raw in runs if raw["ratio"] is not None for row in analyze(raw)]
    context = json.loads((raw_dir / "context.json").read_text())
    write(rows, [calibration_row(raw) for raw in runs], context, out)


# ---- results ---------------------------------------------------------------------------------
def _fmt(value: Any, digits: int = 2) -> str:
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return ""
    if isinstance(value, float):
        return f"{value:.{digits}f}"
    return str(value)


def write(rows: list[dict[str, Any]], calibrations: list[dict[str, Any]],
          context: dict[str, Any], out: Path) -> None:
    """results/bench/e2e.csv (every row) and e2e.md (the tables the README shows)."""
    out.mkdir(parents=True, exist_ok=True)
    with open(out / "e2e.csv", "w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=list(rows[0]))
        writer.writeheader()
        writer.writerows({k: _fmt(v, 4) for k, v in row.items()} for row in rows)
    (out / "e2e.md").write_text(markdown(rows, calibrations, context))


def markdown(rows: list[dict[str, Any]], calibrations: list[dict[str, Any]],
             context: dict[str, Any]) -> str:
    """The benchmark's report: set-up, calibration, speed-ups against the model, bytes."""
    ratios = sorted({r["ratio"] for r in rows})
    load = ", ".join(f"{a:.1f}" for a in context["load_before"])
    lines = [
        f"2 ranks (gloo, 1 thread each) in a network namespace, lo rate-limited by tbf; "
        f"{context['steps']} measured steps per method after {context['warmup']} warm-up "
        f"rounds, methods interleaved step by step; medians of the slower rank's step. "
        f"Took {context['minutes']:.1f} min; load average before {load}, after "
        + ", ".join(f"{a:.1f}" for a in context["load_after"]) + ".", "",
        "**Link calibration.** `ratio`: the dense all-reduce alone over the compute time, "
        "as aimed for (from the unlimited run) and as achieved in the run itself. alpha: a "
        "one-float all-reduce.", "",
        "| model | ratio | tbf Mbit/s | compute ms | dense all-reduce ms | achieved ratio | "
        "alpha ms | dense MB on lo | run s |", "|---|---|---|---|---|---|---|---|---|"]
    for c in calibrations:
        lines.append(f"| {c['model']} | {'unlimited' if c['ratio'] is None else _fmt(c['ratio'])}"
                     f" | {_fmt(c['rate_Mbit_s'], 0)} | {_fmt(c['compute_ms'], 0)} | "
                     f"{_fmt(c['dense_ms'], 0)} | {_fmt(c['achieved_ratio'])} | "
                     f"{_fmt(c['alpha_ms'])} | {_fmt(c['dense_lo_MB'], 1)} | "
                     f"{_fmt(c['wall_s'], 0)} |")
    lines += ["", "**Speed-up over `none`**, measured (ideal model), and measured / ideal; "
              f"target >= {TARGET} at ratios >= 1 (`*` marks a miss).", ""]
    for model in dict.fromkeys(r["model"] for r in rows):
        mine = [r for r in rows if r["model"] == model]
        lines += [f"*{model}*", "",
                  "| method | " + " | ".join(f"ratio {x:g}" for x in ratios) + " |",
                  "|---|" + "---|" * len(ratios)]
        for method in dict.fromkeys(r["method"] for r in mine):
            cells = []
            for x in ratios:
                r = next((r for r in mine if r["method"] == method and r["ratio"] == x), None)
                if r is None:
                    cells.append("")
                    continue
                miss = "*" if x >= 1 and r["key"] != "none" and r["efficiency"] < TARGET else ""
                cells.append(f"{r['speedup']:.2f}x ({r['ideal_speedup']:.2f}x) "
                             f"{r['efficiency']:.2f}{miss}")
            lines.append(f"| {method} | " + " | ".join(cells) + " |")
        lines.append("")
    lines += ["**Bytes per step** (ratio 1 run): `hook`: our hook's `comm/wire_bits` / 8 (one "
              "worker's messages); `messages`: every collective's input, as issued; `lo`: what "
              "the namespace's lo carried (both ranks, headers and barriers included) against "
              "the ring's traffic for these messages; `compress ms`: our compressor's own work "
              "per step (`time/compress_s`); model error: measured step / ideal step - 1.", "",
              "| model | method | collectives | hook MB | messages MB | lo MB | expected lo MB "
              "| compress ms | model error |", "|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        if r["ratio"] == 1.0:
            lines.append(f"| {r['model']} | {r['method']} | {r['collectives']} | "
                         f"{_fmt(r['hook_wire_MB'], 3)} | {_fmt(r['message_MB'], 3)} | "
                         f"{_fmt(r['lo_MB'], 3)} | {_fmt(r['lo_expected_MB'], 3)} | "
                         f"{_fmt(r['compress_ms'], 0)} | {r['model_error']:+.2f} |")
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    sys.exit(main())
