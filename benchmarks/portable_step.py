"""`make bench-portable-step`: where one tiny training step's time goes under portable numerics,
op by op, and what the other CPU settings would give; writes results/bench/portable_step.{csv,md}.

    .venv/bin/python -m benchmarks.portable_step [--steps 8] [--rounds 5] [--profiled 10]
        [--models resnet18,googlenet]

The step is one learner's share of a tiny CIFAR run (each model at width 8, a micro-batch of 16
generated 3x32x32 images: the tiny recipe's global batch of 32 over 2 workers): forward, loss,
backward, one thread; ResNet-18, and GoogLeNet, whose pools the C loops of core/exact_ops.py
take. Each setting runs in a process of its own, started with its environment (the knobs of
core/numerics.py must be set before torch's first operation):

- ``portable``: the suite's default for CPU runs (ATen's DEFAULT kernels, MKL's COMPATIBLE
  branch, oneDNN and NNPACK off, ReLU's backward and max pools by core/exact_ops.py's C
  loops): the same bits on every x86-64 machine;
- ``portable, ATen's own loops``: the same without core/exact_ops.py (what portable runs were
  before it): its gradients' hash must be portable's;
- ``portable, ATen AVX2``: portable's knobs but ATen's AVX2 kernels (and its own loops), a
  candidate for a faster portable mode on x86-64 machines with AVX2 (not adopted: its
  cross-vendor bits are unverified);
- ``native``: every knob left to the machine (oneDNN convolutions, MKL's own branch).

MKL's faster reproducible branches (``MKL_CBWR=AVX2``, ...) are not candidates: Intel documents
them as reproducible on Intel CPUs only (oneMKL developer guide, "Getting Started with
Conditional Numerical Reproducibility"), while the COMPATIBLE branch is the one for any x86 CPU.

The settings of a model run side by side: each one's process starts, warms up (5 steps) and
waits; then ``--rounds`` rounds time ``--steps`` steps of each setting in turn, the order
rotating from round to round (this VM's step times drift by a third within minutes: one
setting after another would compare the drift). Reported per setting: the median time per step
over all its rounds, each round's median (the spread), the ratio to portable, the share of the
profiled steps' self CPU time per kind of op (torch.profiler), and a hash of the parameters'
gradients after one step from the same initialisation, to show which settings compute other
bits. Run it on a quiet machine.
"""

from __future__ import annotations

import argparse
import csv
import hashlib
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

OUT = Path("results/bench")
# Each setting: its numerics mode (the record's label), its environment, and whether the child
# puts itself under the mode (core.numerics.apply) or only turns oneDNN and NNPACK off (the
# environment setting the rest: no core/exact_ops.py loops).
SETTINGS = {"portable": {"numerics": "portable", "env": {}, "apply": True},
            "portable, ATen's own loops": {"numerics": "portable", "apply": False,
                                           "env": {"ATEN_CPU_CAPABILITY": "default",
                                                   "MKL_CBWR": "COMPATIBLE"}},
            "portable, ATen AVX2": {"numerics": "portable", "apply": False,
                                    "env": {"ATEN_CPU_CAPABILITY": "avx2",
                                            "MKL_CBWR": "COMPATIBLE"}},
            "native": {"numerics": "native", "env": {"OMP_NUM_THREADS": "1"}, "apply": True}}
MODELS = ("resnet18", "googlenet")
# What each kind of op is (self CPU time of these aten ops; the rest is "other").
KINDS = {"convolution": ("conv", "_nnpack"),
         "ReLU backward": ("threshold_backward",),
         "ReLU": ("clamp_min", "relu"),
         "max pool": ("max_pool2d",),
         "BatchNorm": ("batch_norm",),
         "fill and copy": ("fill_", "zero_", "copy_", "empty", "resize_")}


def kind(op: str) -> str:
    """The kind of the aten op named ``op``."""
    return next((k for k, parts in KINDS.items() if any(p in op for p in parts)), "other")


def child(model_name: str, profiled: int) -> dict[str, Any]:
    """In the setting's own process: hash one step's gradients, warm up, then time the steps
    each line of stdin asks for (a line of their times, in ms, on stdout) until an empty line;
    then profile the step. Returns the setting's row but for its times."""
    from core import exact_ops, numerics
    from core.provenance import collect, made_here

    if os.environ["BENCH_APPLY"] == "1":
        numerics.apply(os.environ["BENCH_NUMERICS"])
    else:  # the environment pins ATen's kernels and MKL's branch (SETTINGS)
        import torch

        torch.backends.mkldnn.enabled = False
        torch.backends.nnpack.set_flags(False)
    import torch
    from torch.nn import functional as F

    from models import build

    torch.set_num_threads(1)
    torch.manual_seed(0)
    model = build(model_name, 10, width=8)
    x, y = torch.randn(16, 3, 32, 32), torch.randint(0, 10, (16,))

    def step() -> None:
        model.zero_grad(set_to_none=False)
        F.cross_entropy(model(x), y).backward()

    step()
    grads = hashlib.sha256(b"".join(p.grad.numpy().tobytes() for p in model.parameters()))
    for _ in range(4):
        step()
    print("ready", flush=True)
    for line in iter(sys.stdin.readline, "\n"):
        times = []
        for _ in range(int(line)):
            start = time.perf_counter()
            step()
            times.append((time.perf_counter() - start) * 1e3)
        print(json.dumps(times), flush=True)
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as prof:
        for _ in range(profiled):
            step()
    shares: dict[str, float] = {k: 0.0 for k in [*KINDS, "other"]}
    for event in prof.key_averages():
        shares[kind(event.key)] += event.self_cpu_time_total
    total = sum(shares.values())
    return {"grad_hash": grads.hexdigest()[:12],
            "capability": torch.backends.cpu.get_cpu_capability(),
            "made_here": made_here(os.environ["BENCH_NUMERICS"]),
            "fingerprint": collect(os.environ["BENCH_NUMERICS"], 1, "benchmark")["fingerprint"],
            "mkl": numerics.state()["mkl_cbwr"], "mkldnn": torch.backends.mkldnn.enabled,
            "exact_ops": exact_ops.installed(),
            **{f"share {k}": v / total for k, v in shares.items()}}


def start(model: str, name: str, profiled: int) -> subprocess.Popen:
    """The process of setting ``name`` for ``model``, warmed up and waiting for its rounds."""
    setting = SETTINGS[name]
    env = {**os.environ, **setting["env"], "BENCH_NUMERICS": setting["numerics"],
           "BENCH_APPLY": "1" if setting["apply"] else "0"}
    proc = subprocess.Popen([sys.executable, "-m", "benchmarks.portable_step", "--child",
                             "--models", model, "--profiled", str(profiled)],
                            stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, env=env)
    if proc.stdout.readline().strip() != "ready":
        raise RuntimeError(f"bench-portable-step: the {name} process for {model} failed")
    return proc


def measure(model: str, steps: int, rounds: int, profiled: int) -> list[dict[str, Any]]:
    """Every setting's row for ``model``: its processes side by side, ``rounds`` rounds of
    ``steps`` timed steps each, the order rotating."""
    names = list(SETTINGS)
    procs = {name: start(model, name, profiled) for name in names}
    times: dict[str, list[list[float]]] = {name: [] for name in names}
    for r in range(rounds):
        for name in names[r % len(names):] + names[:r % len(names)]:
            procs[name].stdin.write(f"{steps}\n")
            procs[name].stdin.flush()
            times[name].append(json.loads(procs[name].stdout.readline()))
    rows = []
    for name in names:
        out, _ = procs[name].communicate("\n")
        if procs[name].returncode != 0:
            raise RuntimeError(f"bench-portable-step: the {name} process for {model} failed")
        every = [t for one in times[name] for t in one]
        rows.append({"model": model, "setting": name,
                     "ms_per_step": statistics.median(every),
                     "ms_rounds": " / ".join(f"{statistics.median(one):.0f}"
                                             for one in times[name]),
                     **json.loads(out.strip().splitlines()[-1])})
    return rows


def markdown(rows: list[dict[str, Any]], heading: str) -> str:
    """The table: time per step (and per round), ratio to portable (the same model's), shares
    by kind of op, gradients' hash."""
    base = {r["model"]: r["ms_per_step"] for r in reversed(rows)}  # each model's first row
    kinds = [k for k in rows[0] if k.startswith("share ")]
    shares = " | ".join(k.removeprefix("share ") for k in kinds)
    lines = [heading, "", "| model | setting | ATen kernels | MKL branch | oneDNN | exact_ops | "
             f"ms per step | ms per round | x portable | {shares} | gradients' hash | "
             "fingerprint |",
             "| --- | --- | --- | --- | --- | --- | ---: | --- | ---: | "
             + "---: | " * len(kinds) + "--- | --- |"]
    for r in rows:
        lines.append(f"| {r['model']} | {r['setting']} | {r['capability']} | {r['mkl']} | "
                     f"{'on' if r['mkldnn'] else 'off'} | {'on' if r['exact_ops'] else 'off'} | "
                     f"{r['ms_per_step']:.1f} | {r['ms_rounds']} | "
                     f"{r['ms_per_step'] / base[r['model']]:.2f} | "
                     + " | ".join(f"{100 * r[k]:.0f}%" for k in kinds)
                     + f" | {r['grad_hash']} | {r['fingerprint']} |")
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--steps", type=int, default=8, help="timed steps per round")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--profiled", type=int, default=10)
    parser.add_argument("--models", default=",".join(MODELS))
    parser.add_argument("--out", type=Path, default=OUT)
    parser.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.child:
        print(json.dumps(child(args.models, args.profiled)))
        return
    started, load = time.perf_counter(), os.getloadavg()[0]
    rows = [row for model in args.models.split(",")
            for row in measure(model, args.steps, args.rounds, args.profiled)]
    args.out.mkdir(parents=True, exist_ok=True)
    with open(args.out / "portable_step.csv", "w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=list(rows[0]))
        writer.writeheader()
        writer.writerows(rows)
    options = " ".join(f"--{k} {v}" for k, v, default in (
        ("steps", args.steps, 8), ("rounds", args.rounds, 5), ("profiled", args.profiled, 10),
        ("models", args.models, ",".join(MODELS))) if v != default)
    command = "make bench-portable-step" + (f" ARGS='{options}'" if options else "")
    heading = (f"# Where a portable tiny step goes\n\nCommand: `{command}` "
               f"({time.perf_counter() - started:.0f} s; load {load:.2f} before, "
               f"{os.getloadavg()[0]:.2f} after). Machine: {rows[0]['made_here']}. Shares: "
               f"self CPU time of the profiled steps by kind of op.")
    (args.out / "portable_step.md").write_text(markdown(rows, heading))
    print((args.out / "portable_step.md").read_text())


if __name__ == "__main__":
    main()
