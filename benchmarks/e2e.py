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
over ``none``, the ideal one, and their quotient (target >= 0.9 at ratios >= 1). A second ideal
charges our compressors their work measured alone: after calibrating a model, ``python -m
benchmarks.compressors --programs`` times each bucket's compression of each of our methods on
the model's gradients (its DDP buckets as the ranks reported them, one worker, one thread, as
the ranks run) and :func:`benchmarks.netmodel.charged_step_time` puts that work on the rank's
core. Where a method misses 0.9 of that ideal, the breakdown table says which part of the step
took the time. Raw records go to results/bench/raw/e2e/ (one JSON per model and ratio, the
programs in ``programs/``); :mod:`benchmarks.projection` reads them to project to clusters
(``make bench-e2e`` runs it next).

``--device cuda`` (``make bench-e2e DEVICE=cuda``; needs 2 GPUs, skipped in one line with fewer):
each rank trains on a GPU of its own (per-rank batches ``gpu_batch``, a GPU step being far
shorter) and communicates through NCCL, kept off NVLink, PCIe peer-to-peer and shared memory
and on TCP sockets over the namespace's lo (``NCCL_OVER_LINK``), so that the rate limit applies
to it as it does to gloo. Phases are timed on the GPU (benchmarks/e2e_ranks.py). lo then also
carries NCCL's protocol overhead (its LL protocols send flags beside the data). The second
ideal's programs are timed on GPU 0 (the device idle before and after each stretch of a
bucket's work) and charged to the GPU that runs the rank's backward. Results go to ``--out``
(the Makefile: results/bench/cuda/).
"""

from __future__ import annotations

import argparse
import csv
import json
import math
import os
import signal
import statistics
import subprocess
import sys
import time
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import torch

from benchmarks import netmodel
from benchmarks.netmodel import Collective, Compute, Program
from benchmarks.netns import Hosts, Namespace, Unavailable, rank_env, unavailable_reason
from core import provenance

OUT = Path("results/bench")
RATIOS = (0.25, 1.0, 4.0, 16.0)
WORLD = 2
TARGET = 0.9  # measured / ideal speed-up, at ratios >= 1

# Full-width models (their message sizes are the real ones); per-rank batches small enough to keep
# a CPU step near a second (0.5-3 s measured on the busy 2-core machine) and the benchmark short.
MODELS: dict[str, dict[str, Any]] = {
    "resnet18": {"model": "resnet18", "model_kwargs": {"num_classes": 10}, "input": "image",
                 "shape": [3, 32, 32], "batch": 4, "gpu_batch": 128},
    "vgg19bn": {"model": "vgg19bn", "model_kwargs": {"num_classes": 10}, "input": "image",
                "shape": [3, 32, 32], "batch": 4, "gpu_batch": 128},
    "lstm": {"model": "lstm", "model_kwargs": {"num_classes": 33278}, "input": "tokens",
             "seq": 35, "batch": 2, "gpu_batch": 32},
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
PROGRAM_REPEATS = 5  # measured steps of each method's compression alone (after 2 warm-up)
# NCCL between two GPUs of one machine on TCP over lo, as gloo's traffic goes (NCCL's
# environment variables: docs.nvidia.com/deeplearning/nccl/user-guide/docs/env.html):
# no peer-to-peer, shared-memory or InfiniBand transport, the socket network on lo.
NCCL_OVER_LINK = {"NCCL_P2P_DISABLE": "1", "NCCL_SHM_DISABLE": "1", "NCCL_IB_DISABLE": "1",
                  "NCCL_NET": "Socket", "NCCL_SOCKET_IFNAME": "lo"}


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
    env = {**rank_env(), **(NCCL_OVER_LINK if model.get("device") == "cuda" else {})}
    done = ns.run([sys.executable, "-m", "benchmarks.e2e_ranks", str(spec_path), str(out_path)],
                  env=env, timeout_s=3600)
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


def launch_hosts(hosts: Hosts, model: dict[str, Any], methods: list[dict[str, Any]], warmup: int,
                 steps: int, path: Path, extra: dict[str, Any]) -> dict[str, Any]:
    """As :func:`launch`, with one rank on each of two hosts joined by a link of ``hosts.rate``
    each way (the ranks' records say ``hosts``: :func:`namespace_link`)."""
    spec = {**model, "methods": methods, "warmup": warmup, "steps": steps, "world_size": WORLD}
    path.parent.mkdir(parents=True, exist_ok=True)
    spec_path = path.with_suffix(".spec.json")
    spec_path.write_text(json.dumps(spec))
    outs = [path.with_suffix(f".rank{k}.json") for k in range(WORLD)]
    started = time.perf_counter()
    procs = [hosts.popen(k, [sys.executable, "-m", "benchmarks.e2e_ranks", str(spec_path),
                             str(outs[k])],
                         {**rank_env(), "MASTER_ADDR": hosts.names[0], "MASTER_PORT": "29501",
                          "RANK": str(k), "WORLD_SIZE": str(WORLD),
                          "GLOO_SOCKET_IFNAME": hosts.interfaces[k]}, path.with_suffix(f".{k}.log"))
             for k in range(WORLD)]
    if any(p.wait(timeout=3600) for p in procs):
        logs = [path.with_suffix(f".{k}.log").read_text()[-2000:] for k in range(WORLD)]
        raise RuntimeError(f"ranks failed ({path.name}):\n" + "\n".join(logs))
    raw = {"spec": spec, "rate": hosts.rate, "hosts": True,
           "wall_s": time.perf_counter() - started,
           "ranks": [json.loads(out.read_text())[0] for out in outs],
           "qdisc": {"sent_bytes": 0, "dropped": 0, "overlimits": 0}, **extra}
    path.write_text(json.dumps(raw))
    for done in (spec_path, *outs, *(path.with_suffix(f".{k}.log") for k in range(WORLD))):
        done.unlink()
    return raw


# ---- reading a run's records -----------------------------------------------------------------
def step_records(raw: dict[str, Any], key: str) -> list[list[dict[str, Any]]]:
    """Method ``key``'s measured steps: for each step, every rank's record."""
    per_rank = [r["steps"][key] for r in raw["ranks"]]
    return [list(step) for step in zip(*per_rank, strict=True)]


def step_time(raw: dict[str, Any], key: str) -> float:
    """Median over steps of the slowest rank's step time (s)."""
    return statistics.median(max(r["step"] for r in step) for step in step_records(raw, key))


def profile(raw: dict[str, Any], key: str) -> Compute:
    """Method ``key``'s step phases and bucket ready times: medians over steps of the slower
    rank's (for ``compute``, the compute-alone profile the model is fed with; for others, its
    backward includes the wait for communication)."""
    slow = [max(step, key=lambda r: r["step"]) for step in step_records(raw, key)]
    ready = [statistics.median(r["ready"][b] for r in slow) for b in range(len(slow[0]["ready"]))]
    return Compute(forward=statistics.median(r["forward"] for r in slow),
                   backward=statistics.median(r["backward"] for r in slow),
                   optimizer=statistics.median(r["optimizer"] for r in slow),
                   ready=tuple(ready))


def compute_profile(raw: dict[str, Any]) -> Compute:
    """The compute-alone step's profile (see :func:`profile`)."""
    return profile(raw, "compute")


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
    """Each worker's link: the shared lo's rate over the ranks, or (ranks on two hosts,
    :func:`launch_hosts`) each host's own link's rate."""
    rate = raw["rate"] if raw["rate"] is not None else math.inf
    if raw.get("hosts"):
        return netmodel.Link(bandwidth=rate, latency=latency(raw))
    return netmodel.link_of_namespace(rate, WORLD, latency(raw))


def _median(values: Iterable[float]) -> float:
    values = list(values)
    return statistics.median(values) if values else math.nan


# ---- one run's rows --------------------------------------------------------------------------
def charged(raw: dict[str, Any], key: str, programs: dict[str, Any] | None) -> float | None:
    """The second ideal's step time of method ``key`` (its compression charged, see the module
    doc), or None without a program of it that fits the buckets it ran."""
    found = (programs or {}).get(key)
    buckets = collectives(raw, key)
    if found is None or len(found) != len(buckets) or any(
            sum(op == "start" for op, _ in ops) != len(b) for ops, b in zip(found, buckets,
                                                                          strict=True)):
        return None
    return netmodel.charged_step_time(compute_profile(raw), buckets,
                                      [Program(tuple(map(tuple, ops))) for ops in found],
                                      WORLD, namespace_link(raw))


def analyze(raw: dict[str, Any], programs: dict[str, Any] | None = None
            ) -> list[dict[str, Any]]:
    """One row per method of a (model, ratio) run: measured, modelled (``programs``: the
    model's compression programs, for the second ideal), and the bytes."""
    compute = compute_profile(raw)
    compute_s = step_time(raw, "compute")
    link = namespace_link(raw)
    methods = [m for m in raw["spec"]["methods"] if m["key"] not in CALIBRATION]
    base_buckets = collectives(raw, "none")
    base_step = step_time(raw, "none")
    base_ideal = netmodel.step_time(compute, base_buckets, WORLD, link)
    base_charged = charged(raw, "none", programs)
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
        mine = profile(raw, key)
        ideal_tail = max(0.0, netmodel.comm_end(compute, buckets, WORLD, link)
                         - compute.ready[-1])
        charged_s = charged(raw, key, programs)
        charged_speedup = (None if charged_s is None or base_charged is None
                           else base_charged / charged_s)
        alone = (programs or {}).get(key)
        rows.append({
            "model": raw["model_name"], "ratio": raw["ratio"], "method": m["label"],
            "key": key, "step_ms": 1e3 * measured, "compute_ms": 1e3 * compute_s,
            "ideal_ms": 1e3 * ideal,
            "model_error": measured / ideal - 1,
            "speedup": speedup, "ideal_speedup": ideal_speedup,
            "efficiency": speedup / ideal_speedup,
            "charged_ms": None if charged_s is None else 1e3 * charged_s,
            "charged_speedup": charged_speedup,
            "charged_efficiency": None if charged_speedup is None else speedup / charged_speedup,
            "alone_ms": None if alone is None else 1e3 * sum(Program(tuple(map(tuple, ops))).cpu
                                                            for ops in alone),
            "hook_wire_MB": None if wire_bits is None else wire_bits / 8e6,
            "message_MB": sum(c.nbytes for c in flat) / 1e6,
            "collectives": len(flat),
            "lo_MB": _median(s["lo_bytes"] for s in raw["ranks"][0]["steps"][key]) / 1e6,
            "lo_expected_MB": WORLD * sum(netmodel.wire_bytes(c, WORLD) for c in flat) / 1e6,
            "compress_ms": None if compress_s is None else 1e3 * compress_s,
            # where a step's time beyond the ideal goes (see markdown()):
            "gap_ms": 1e3 * (measured - ideal),
            "charged_gap_ms": None if charged_s is None else 1e3 * (measured - charged_s),
            "ready_shift_ms": 1e3 * (mine.ready[-1] - compute.ready[-1]),
            "tail_excess_ms": 1e3 * (mine.backward - mine.ready[-1] - ideal_tail),
            "fwd_opt_shift_ms": 1e3 * (mine.forward + mine.optimizer - compute.forward
                                       - compute.optimizer),
        })
    return rows


def calibration_row(raw: dict[str, Any]) -> dict[str, Any]:
    """What a (model, ratio) run's link was: rate, dense all-reduce alone vs compute."""
    compute_s, dense_s = step_time(raw, "compute"), step_time(raw, "dense")
    dense_bytes = _median(s["lo_bytes"] for s in raw["ranks"][0]["steps"]["dense"])
    return {"model": raw["model_name"], "ratio": raw["ratio"],
            "rate_Mbit_s": None if raw["rate"] is None else 8 * raw["rate"] / 1e6,
            "compute_ms": 1e3 * compute_s, "dense_ms": 1e3 * dense_s,
            "achieved_ratio": dense_s / compute_s, "alpha_ms": 1e3 * latency(raw),
            "dense_lo_MB": dense_bytes / 1e6,
            # the dense all-reduce alone against its bytes at the tbf rate: the link's own loss
            "link_efficiency": None if raw["rate"] is None else dense_bytes / raw["rate"]
            / dense_s, "tbf_dropped": raw["qdisc"]["dropped"], "wall_s": raw["wall_s"]}


# ---- the benchmark ---------------------------------------------------------------------------
def rate_for(ratio: float, dense_bytes: float, compute_s: float) -> float:
    """tbf rate (bytes/s) at which ``dense_bytes`` through lo (the dense all-reduce's, both
    ranks) take ``ratio`` x ``compute_s``."""
    return dense_bytes / (ratio * compute_s)


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


def measure_programs(model: dict[str, Any], methods: list[dict[str, Any]],
                     calibration: Path, path: Path) -> None:
    """Our methods' compression of each of the model's buckets, alone (``benchmarks.compressors
    --programs``, a process of its own outside the namespace), saved to ``path``."""
    raw = json.loads(calibration.read_text())
    spec = {"model": model, "methods": [m for m in methods if m["kind"] == "ours"],
            "bucket_params": raw["ranks"][0]["bucket_params"], "repeats": PROGRAM_REPEATS}
    path.parent.mkdir(parents=True, exist_ok=True)
    spec_path = path.with_suffix(".spec.json")
    spec_path.write_text(json.dumps(spec))
    done = subprocess.run([sys.executable, "-m", "benchmarks.compressors", "--programs",
                           str(spec_path), str(path)], env={**os.environ, "OMP_NUM_THREADS": "1"},
                          capture_output=True, text=True, timeout=3600)
    spec_path.unlink()
    if done.returncode != 0:
        raise RuntimeError(f"compression programs failed ({path.name}):\n{done.stderr[-4000:]}")


def rounds_for(ratio: float, warmup: int, steps: int) -> tuple[int, int]:
    """(warm-up rounds, measured steps) at ``ratio``. From ratio 8 on, steps are bound by the
    link (tbf's pace varies little) and cost the most: no warm-up round (the median of at least
    3 steps drops a first step's set-up) and at most ``steps`` - 1 measured steps."""
    if ratio < 8:
        return warmup, steps
    return 0, max(3, steps - 1)


def run_model(ns: Namespace, name: str, model: dict[str, Any], methods: list[dict[str, Any]],
              ratios: Iterable[float], warmup: int, steps: int, raw_dir: Path) -> None:
    """Calibrate one model without a limit, then run every method at every ratio.

    The compute time a rate is aimed at is the median of every compute-alone measurement of
    the model so far: on a busy machine it drifts between runs (each run reports the ratio it
    achieved, measured side by side).
    """
    calibration = calibrate(ns, model, max(steps, 3), raw_dir / f"{name}-calibration.json", name)
    measure_programs(model, methods, raw_dir / f"{name}-calibration.json",
                     raw_dir / "programs" / f"{name}.json")
    dense_bytes = calibration["dense_lo_MB"] * 1e6
    computes = [calibration["compute_ms"] / 1e3]
    for ratio in ratios:
        ns.set_rate(rate_for(ratio, dense_bytes, statistics.median(computes)))
        raw = launch(ns, model, methods, *rounds_for(ratio, warmup, steps),
                     path=raw_dir / f"{name}-ratio{ratio:g}.json",
                     extra={"model_name": name, "ratio": ratio})
        row = calibration_row(raw)
        computes.append(row["compute_ms"] / 1e3)
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
    parser.add_argument("--device", choices=("cpu", "cuda"), default="cpu",
                        help="cuda: each rank on a GPU of its own, NCCL through the link")
    parser.add_argument("--report-only", action="store_true",
                        help="only rewrite the results from the raw records of the last run")
    args = parser.parse_args(argv)
    raw_dir = args.out / "raw" / "e2e"
    if not args.report_only:
        gpus = torch.cuda.device_count() if torch.cuda.is_available() else 0
        if args.device == "cuda" and gpus < WORLD:
            print(f"bench-e2e: skipped: --device cuda needs {WORLD} GPUs, torch sees {gpus}")
            return 0
        models = on_device(TINY if args.tiny else MODELS, args.device)
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


def on_device(models: dict[str, dict[str, Any]], device: str) -> dict[str, dict[str, Any]]:
    """The model specs for ranks on ``device`` (cuda: each its ``gpu_batch`` per rank)."""
    if device == "cpu":
        return models
    return {name: {**m, "device": device, "batch": m.get("gpu_batch", m["batch"])}
            for name, m in models.items()}


def measure(models: dict[str, dict[str, Any]], methods: list[dict[str, Any]],
            ratios: Iterable[float], warmup: int, steps: int, raw_dir: Path) -> None:
    """Run every model (fresh ``raw_dir``), recording the run's context there too."""
    for old in [*raw_dir.glob("*.json"), *raw_dir.glob("programs/*.json")]:
        old.unlink()
    load_before, started = os.getloadavg(), time.perf_counter()
    made_by = provenance.made_here()
    with Namespace() as ns:
        for name, model in models.items():
            run_model(ns, name, model, methods, ratios, warmup, steps, raw_dir)
    context = {"minutes": (time.perf_counter() - started) / 60, "load_before": load_before,
               "load_after": os.getloadavg(), "warmup": warmup, "steps": steps,
               "made_by": made_by}
    (raw_dir / "context.json").write_text(json.dumps(context))


def load_runs(raw_dir: Path) -> list[dict[str, Any]]:
    """Every run of the last benchmark, calibration runs first, in run order per model."""
    runs = [json.loads(p.read_text()) for p in sorted(raw_dir.glob("*-*.json"))]
    order = {name: i for i, name in enumerate(MODELS)}
    return sorted(runs, key=lambda r: (order.get(r["model_name"], len(order)), r["model_name"],
                                       -1 if r["ratio"] is None else r["ratio"]))


def load_programs(raw_dir: Path, model: str) -> dict[str, Any] | None:
    """The model's compression programs (None where the run measured none)."""
    path = raw_dir / "programs" / f"{model}.json"
    return json.loads(path.read_text()) if path.exists() else None


def report(raw_dir: Path, out: Path) -> None:
    """Write results/bench/e2e.{csv,md} from the raw records in ``raw_dir``."""
    runs = load_runs(raw_dir)
    if not runs:
        raise SystemExit(f"bench-e2e: no raw records in {raw_dir}; run the benchmark first")
    rows = [row for raw in runs if raw["ratio"] is not None
            for row in analyze(raw, load_programs(raw_dir, raw["model_name"]))]
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


def _table(header: list[str], body: list[list[str]]) -> list[str]:
    return ["| " + " | ".join(header) + " |", "|" + "---|" * len(header),
            *["| " + " | ".join(cells) + " |" for cells in body]]


def _miss(r: dict[str, Any], key: str = "efficiency") -> bool:
    """Whether row ``r`` misses the target against the ideal of ``key`` (``efficiency``: the
    first ideal, ``charged_efficiency``: the second)."""
    return (r["ratio"] >= 1 and r["key"] != "none" and r[key] is not None
            and r[key] < TARGET)


def _speedups(rows: list[dict[str, Any]], ratios: list[float], achieved: dict[Any, float],
              model: str, ideal: str, efficiency: str) -> list[str]:
    """A model's table: per method and ratio, the measured speed-up over ``none``, the ideal's
    (row key ``ideal``) and measured / ideal (``efficiency``; `*`: a miss)."""
    mine = {(r["method"], r["ratio"]): r for r in rows if r["model"] == model}
    header = [f"ratio {x:g} ({achieved[(model, x)]:.2g})" for x in ratios]
    body = []
    for method in dict.fromkeys(m for m, _ in mine):
        cells = [method]
        for x in ratios:
            r = mine.get((method, x))
            cells.append("" if r is None or r[ideal] is None else
                         f"{r['speedup']:.2f}x ({r[ideal]:.2f}x) "
                         f"{r[efficiency]:.2f}{'*' if _miss(r, efficiency) else ''}")
        body.append(cells)
    return _table(["method", *header], body)


def markdown(rows: list[dict[str, Any]], calibrations: list[dict[str, Any]],
             context: dict[str, Any]) -> str:
    """The benchmark's report: set-up, calibration, speed-ups against the model, where the
    time of a miss goes, bytes."""
    ratios = sorted({r["ratio"] for r in rows})
    load = [", ".join(f"{a:.1f}" for a in context[k]) for k in ("load_before", "load_after")]
    errors = [abs(r["model_error"]) for r in rows if r["ratio"] >= 1]
    lines = [
        f"2 ranks (gloo, 1 thread each) in a network namespace, lo rate-limited by tbf; "
        f"methods interleaved step by step, {context['steps']} measured steps each after "
        f"{context['warmup']} warm-up round(s) (from ratio 8 on: no warm-up, "
        f"{max(3, context['steps'] - 1)} steps); medians of the slower rank's step. Took "
        f"{context['minutes']:.1f} min; load average before {load[0]}, after {load[1]}. "
        f"Machine and code: {context.get('made_by', 'not recorded')}.", "",
        "**Link calibration.** `ratio`: the dense all-reduce alone over the compute time, "
        "aimed at from the earlier runs and achieved in the run itself (both measured side by "
        "side). `link eff.`: the dense all-reduce's bytes on lo at the tbf rate over its "
        "measured time. alpha: a one-float all-reduce.", "",
        *_table(["model", "ratio", "tbf Mbit/s", "compute ms", "dense all-reduce ms",
                 "achieved ratio", "link eff.", "alpha ms", "dense MB on lo", "run s"],
                [[c["model"], "unlimited" if c["ratio"] is None else f"{c['ratio']:g}",
                  _fmt(c["rate_Mbit_s"], 0), _fmt(c["compute_ms"], 0), _fmt(c["dense_ms"], 0),
                  _fmt(c["achieved_ratio"]), _fmt(c["link_efficiency"]), _fmt(c["alpha_ms"]),
                  _fmt(c["dense_lo_MB"], 1), _fmt(c["wall_s"], 0)] for c in calibrations]),
        "", f"**Speed-up over `none`**: measured (ideal model's) and measured / ideal; target >= "
        f"{TARGET} at ratios >= 1 (`*`: missed). The ideal model predicts the measured step "
        f"times at ratios >= 1 with a median |error| of {100 * statistics.median(errors):.0f}% "
        f"(max {100 * max(errors):.0f}%).", ""]
    achieved = {(c["model"], c["ratio"]): c["achieved_ratio"] for c in calibrations}
    for model in dict.fromkeys(r["model"] for r in rows):
        lines += [f"*{model}* (ratio aimed at, and achieved)", "",
                  *_speedups(rows, ratios, achieved, model, "ideal_speedup", "efficiency"), ""]
    lines += ["**Against the ideal that charges compression** its work measured alone (`python -m "
              "benchmarks.compressors --programs`: each bucket's compression of our methods on "
              "the model's gradients and DDP buckets, one worker, one thread, put on the rank's "
              "core before, between and after the bucket's collectives). Speed-up over `none`: "
              "measured (this ideal's) and measured / ideal; target >= "
              f"{TARGET} at ratios >= 1. PyTorch's hook: not charged (its work is not "
              "measured apart from its collectives).", ""]
    for model in dict.fromkeys(r["model"] for r in rows):
        lines += [f"*{model}*", "",
                  *_speedups(rows, ratios, achieved, model, "charged_speedup",
                             "charged_efficiency"), ""]
    misses = [r for r in rows if _miss(r, "charged_efficiency")
              or (r["charged_efficiency"] is None and _miss(r))]
    lines += ["**Where a missed step's time goes** (ms per step; rows: misses of the ideal that "
              "charges compression, and where that ideal is not available, of the first): "
              "`ideal`: the first ideal's step, `charged`: the second's; `gap`: measured - "
              "charged (else - ideal); `alone`: our compression's work alone (the programs); "
              "`in step`: the same work inside the step (`time/compress_s`; not timed for "
              "PyTorch's hook): above `alone` where it competes for the core and caches with "
              "backward and the other rank; `ready`: how much later the last bucket was ready "
              "than without communication (the hook's work shares the rank's core with "
              "backward); `tail`: backward's end after the last bucket was ready, beyond the "
              "first ideal's exposed communication (serialized buckets, compression of the last "
              "bucket, decoding, gloo); `fwd+opt`: forward and optimizer slower than without "
              "communication.", "",
              *_table(["model", "ratio", "method", "measured", "ideal", "charged", "gap",
                       "alone", "in step", "ready", "tail", "fwd+opt"],
                      [[r["model"], f"{r['ratio']:g}", r["method"], _fmt(r["step_ms"], 0),
                        _fmt(r["ideal_ms"], 0), _fmt(r["charged_ms"], 0),
                        _fmt(r["gap_ms"] if r["charged_gap_ms"] is None
                             else r["charged_gap_ms"], 0),
                        _fmt(r["alone_ms"], 0), _fmt(r["compress_ms"], 0),
                        _fmt(r["ready_shift_ms"], 0), _fmt(r["tail_excess_ms"], 0),
                        _fmt(r["fwd_opt_shift_ms"], 0)] for r in misses]), "",
              "**Bytes per step** (ratio 1 runs): `hook`: our hook's `comm/wire_bits` / 8 (one "
              "worker's messages); `messages`: every collective's input, as issued; `lo`: what "
              "the namespace's lo carried (both ranks, headers and barriers included) against "
              "the ring's traffic for these messages; model error: measured / ideal step - 1.",
              "",
              *_table(["model", "method", "collectives", "hook MB", "messages MB", "lo MB",
                       "expected lo MB", "compressor ms", "model error"],
                      [[r["model"], r["method"], str(r["collectives"]),
                        _fmt(r["hook_wire_MB"], 3), _fmt(r["message_MB"], 3),
                        _fmt(r["lo_MB"], 3), _fmt(r["lo_expected_MB"], 3),
                        _fmt(r["compress_ms"], 0), f"{r['model_error']:+.2f}"]
                       for r in rows if r["ratio"] == 1.0])]
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    sys.exit(main())
