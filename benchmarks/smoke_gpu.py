"""``make smoke-gpu``: does this repository train right on this machine's GPUs? (~10 minutes)

    make smoke-gpu                                   # or: .venv/bin/python -m benchmarks.smoke_gpu
    .venv/bin/python -m benchmarks.smoke_gpu --compressors topk adacomp        # a part of it
    .venv/bin/python -m benchmarks.smoke_gpu --jobs 6     # 6 compressors' runs at once (big box)

Where torch sees no CUDA device it says so in one line and exits 0. Otherwise, one rank per
local GPU (NCCL), for every compressor (under Accordion with its levels switched at every epoch
Accordion lets them switch: low, low, high, low over 4 epochs; ``none`` under the static
scheduler):

1. ``run``: run.py through torchrun completes, its ranks in sync, with the planned levels;
2. ``resume``: the same run stopped after 2 epochs and resumed ends bit for bit where the
   straight run ended (every metric but the timings, and the weights; deterministic algorithms
   on, ``CUBLAS_WORKSPACE_CONFIG=:4096:8``);
3. ``syncs``: the training step as run.py takes it (forward, backward with the hook, optimizer
   step) under ``torch.cuda.set_sync_debug_mode("warn")``, levels switched every epoch: the host
   syncs of each step are counted, by where they come from. In the steady state (an epoch's
   steps after its first two) none may come from this repository's code;
4. ``nccl-vs-gloo`` (2 GPUs or more): one bucket of the same gradients averaged by 2 NCCL ranks
   on GPUs and by 2 gloo ranks on the CPU, two steps with a level switch between: bit for bit
   for none, topk and adacomp (the same float operations, in the same order, on either device),
   within 1e-5 of the largest value for powersgd and ef_signsgd (CUDA's matmuls and sums add in
   another order); and the NCCL ranks' results bit for bit alike.

Prints a table, writes it to results/bench/smoke_gpu.md (with the machine and versions), and
exits 1 if any check failed. ``--device cpu`` runs checks 1, 2 and 4 (gloo against gloo) on 2
CPU ranks: a check of this script, not of a GPU; its table is printed, not written.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import subprocess
import sys
import tempfile
import time
import warnings
from collections import Counter
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
from torch.nn import functional as F
from torch.nn.parallel import DistributedDataParallel as DDP

import compression
import models
from benchmarks.ranks import run_ranks
from compression.hook import HookState, comm_hook
from core import provenance

ROOT = Path(__file__).resolve().parents[1]
OUT = ROOT / "results" / "bench" / "smoke_gpu.md"
EPOCHS, STOP = 4, 2  # the run, and where the resumed run stops first
# Accordion (Algorithm 1) with interval 1: epochs 0 and 1 are critical (low level), a norm change
# never is under eta = 1e9 (high), and the LR decay at epoch 3 makes epoch 3 critical again.
PLAN = ("low", "low", "high", "low")
RUN = ["model=resnet18", "model.width=8", "dataset=digits", "logger=none",
       "trainer.numerics=native",  # as paper scale runs on GPUs (conf/scale/paper.yaml)
       "trainer.progress=false", "trainer.deterministic=true", f"trainer.epochs={EPOCHS}",
       "optimizer.schedule.milestones=[3]", "optimizer.schedule.decay_factors=[0.1]"]
ACCORDION = ["scheduler=accordion", "scheduler.interval=1", "scheduler.eta=1e9"]
TIMING = {"time/epoch_s", "samples_per_s", "time/compress_s"}  # differ between equal runs
EXACT = {"none", "topk", "adacomp"}  # the same bits on CUDA as on the CPU
TOLERANCE = 1e-5  # the others: of the largest |value|
SYNC_EPOCHS, SYNC_STEPS, WARM_STEPS = 3, 6, 2
LAUNCH_TIMEOUT_S = 300


@dataclass
class Row:
    """One check of one compressor: ``status`` pass, FAIL or skip."""

    check: str
    compressor: str
    status: str
    detail: str


def _status(ok: bool) -> str:
    return "pass" if ok else "FAIL"


# ---- 1, 2: run.py through torchrun, and a resume --------------------------------------------
def launch(args: list[str], run_dir: Path, ranks: int) -> subprocess.CompletedProcess[str]:
    """run.py with ``args`` in ``run_dir`` on ``ranks`` ranks (torchrun)."""
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone",
           f"--nproc-per-node={ranks}", "run.py", *args, f"hydra.run.dir={run_dir}"]
    env = {**os.environ, "OMP_NUM_THREADS": "1", "CUBLAS_WORKSPACE_CONFIG": ":4096:8",
           "WANDB_MODE": "offline",
           "PYTHONPATH": os.pathsep.join(filter(None, (str(ROOT), os.environ.get("PYTHONPATH"))))}
    try:
        return subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True,
                              timeout=LAUNCH_TIMEOUT_S)
    except subprocess.TimeoutExpired as exc:
        return subprocess.CompletedProcess(cmd, 124, "", f"timed out after {exc.timeout} s")


def _rows(run_dir: Path) -> list[dict[str, Any]]:
    path = run_dir / "metrics.jsonl"
    return [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []


def _failure(proc: subprocess.CompletedProcess[str]) -> str:
    """The exit status and the last line that names an error (torchrun ends on a rule of '=')."""
    lines = [line.strip() for line in (proc.stderr or proc.stdout).splitlines() if line.strip()]
    errors = [line for line in lines if "Error" in line or "error:" in line]
    last = (errors or lines or ["no output"])[-1]
    return f"exit {proc.returncode}: {last}".replace("|", "/")


def planned_levels(name: str, rows: list[dict[str, Any]]) -> str | None:
    """None if every epoch ran every compressed layer at the planned level, else what did not."""
    pair = compression.create(name).accordion_levels
    if pair is None:
        return None
    for epoch, row in enumerate(rows):
        want = pair[PLAN[epoch] == "high"]
        got = {v for k, v in row.items() if k.startswith("level/")}
        if got != {want}:
            return f"epoch {epoch}: levels {sorted(got)}, planned {want}"
    return None


def first_difference(a: Path, b: Path) -> str | None:
    """None if runs ``a`` and ``b`` end bit for bit alike (metrics but timings, weights)."""
    rows_a, rows_b = _rows(a), _rows(b)
    if len(rows_a) != len(rows_b):
        return f"{len(rows_a)} vs {len(rows_b)} epochs"
    for epoch, (ra, rb) in enumerate(zip(rows_a, rows_b, strict=True)):
        for key in sorted((set(ra) | set(rb)) - TIMING):
            if ra.get(key) != rb.get(key):
                return f"epoch {epoch} {key}: {ra.get(key)!r} vs {rb.get(key)!r}"
    wa, wb = (torch.load(d / "checkpoint.pt", map_location="cpu", weights_only=True)["model"]
              for d in (a, b))
    for key, value in wa.items():
        if not torch.equal(value, wb[key]):
            return f"weights {key} differ (max {float((value - wb[key]).abs().max()):.3g})"
    return None


def run_and_resume(name: str, ranks: int, device: str, out: Path,
                   overrides: tuple[str, ...] = ()) -> list[Row]:
    """Checks 1 and 2 for compressor ``name`` (``overrides``: more of run.py's, appended)."""
    args = [*RUN, *overrides, f"compressor={name}", f"trainer.device={device}",
            f"trainer.batch_size={32 * ranks}", f"dataset.subset={max(512, 64 * ranks)}",
            *(ACCORDION if compression.create(name).accordion_levels else ["scheduler=static"])]
    straight, resumed = out / name / "straight", out / name / "resumed"
    proc = launch(args, straight, ranks)
    summary = straight / "summary.json"
    if proc.returncode != 0 or not summary.exists():
        return [Row("run", name, "FAIL", _failure(proc)),
                Row("resume", name, "skip", "the run failed")]
    record, rows = json.loads(summary.read_text()), _rows(straight)
    wrong = planned_levels(name, rows)
    ok = record["status"] == "completed" and record["params_in_sync"] and wrong is None
    levels = ", ".join(str(r.get(next((k for k in r if k.startswith("level/")), ""), "-"))
                       for r in rows)
    detail = (f"{record['status']}, {len(rows)} epochs on {ranks} rank(s), params in sync: "
              f"{record['params_in_sync']}, levels {levels}, final {record['final']:.4g}, "
              f"compress {sum(r['time/compress_s'] for r in rows):.3f} s")
    run = Row("run", name, _status(ok), detail if wrong is None else f"{wrong}; {detail}")
    for step in ([f"trainer.epochs={STOP}"], ["resume=true"]):
        proc = launch([*args, *step], resumed, ranks)
        if proc.returncode != 0:
            return [run, Row("resume", name, "FAIL", _failure(proc))]
    differs = first_difference(straight, resumed)
    return [run, Row("resume", name, _status(differs is None),
                     differs or f"stopped after epoch {STOP}, resumed: bit for bit the "
                                f"straight run (metrics, weights)")]


# ---- 3: host syncs per step ------------------------------------------------------------------
def _nccl_group(rank: int) -> Any:
    """This rank's GPU and an NCCL group over run_ranks' gloo ranks."""
    torch.cuda.set_device(rank)
    return dist.new_group(backend="nccl")


def _where(warning: warnings.WarningMessage) -> str:
    """``path:line`` of a warning, relative to the repository when it is this repository's."""
    path = Path(warning.filename).resolve()
    if path.is_relative_to(ROOT) and ".venv" not in path.parts:
        return f"{path.relative_to(ROOT)}:{warning.lineno}"
    return f"{path.name}:{warning.lineno}"


def _ours(where: str) -> bool:
    """Whether a sync comes from this repository's code (not torch's, nor this script's)."""
    return where.split("/")[0] in ("compression", "core", "training", "models", "data")


def sync_rank(rank: int, world: int, names: list[str]) -> dict[str, Any]:
    """Each compressor's training steps under sync debug mode on this rank: for every step, the
    syncs' locations (run by :func:`run_ranks`)."""
    group, device = _nccl_group(rank), torch.device("cuda", rank)
    gen = torch.Generator().manual_seed(rank)
    x = torch.randn(32, 3, 32, 32, generator=gen).to(device)
    y = torch.randint(0, 10, (32,), generator=gen).to(device)
    found: dict[str, Any] = {}
    for name in names:
        torch.manual_seed(0)
        model = models.build("resnet18", num_classes=10, width=16).to(device)
        ddp = DDP(model, device_ids=[rank], process_group=group)
        state = HookState(compression.create(name), model.named_parameters(), group=group)
        ddp.register_comm_hook(state, comm_hook)
        optimizer = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
        pair, epochs = state.compressor.accordion_levels, []
        loss_sum = torch.zeros((), dtype=torch.float64, device=device)  # as run.py sums it
        for epoch in range(SYNC_EPOCHS):
            if pair is not None:
                state.set_levels(dict.fromkeys(state.compressed_layers(), pair[epoch % 2]))
            state.reset_epoch(epoch)
            steps = []
            for _ in range(SYNC_STEPS):
                with warnings.catch_warnings(record=True) as caught:
                    warnings.simplefilter("always")
                    torch.cuda.set_sync_debug_mode("warn")
                    try:
                        optimizer.zero_grad(set_to_none=True)
                        loss = F.cross_entropy(ddp(x), y)
                        loss.backward()
                        optimizer.step()
                        loss_sum += loss.detach().double()
                    finally:
                        torch.cuda.set_sync_debug_mode("default")
                steps.append([_where(w) for w in caught if "synchroniz" in str(w.message)])
            epochs.append(steps)
            state.epoch_stats(), state.nonfinite()  # the epoch's end reads (not a step)
        found[name] = epochs
    return found


def sync_rows(names: list[str], ranks: int) -> list[Row]:
    """Check 3 for every compressor."""
    found = run_ranks(sync_rank, ranks, (names,), timeout_s=600)
    rows = []
    for name in names:
        steady, warm = Counter(), Counter()
        for mine in found:
            for steps in mine[name]:
                for step, places in enumerate(steps):
                    (warm if step < WARM_STEPS else steady).update(places)
        ours = sum(n for where, n in steady.items() if _ours(where))
        steps = ranks * SYNC_EPOCHS * (SYNC_STEPS - WARM_STEPS)
        detail = (f"steady state ({steps} rank-steps): {ours} from this repository, "
                  f"{sum(steady.values()) - ours} from torch ({_top(steady)}); an epoch's first "
                  f"{WARM_STEPS} steps: {sum(warm.values())} ({_top(warm)})")
        rows.append(Row("syncs", name, _status(ours == 0), detail))
    return rows


def _top(places: Counter) -> str:
    return ", ".join(f"{where} x{n}" for where, n in places.most_common(4)) or "none"


# ---- 4: NCCL against gloo --------------------------------------------------------------------
def bucket_rank(rank: int, world: int, names: list[str], on_gpu: bool) -> dict[str, list[Any]]:
    """Each compressor's mean of one bucket (every parameter of a narrow ResNet-18) over two
    steps, from gradients that depend on the rank and the step only; ``on_gpu``: NCCL on this
    rank's GPU, else gloo on the CPU (run by :func:`run_ranks`)."""
    group = _nccl_group(rank) if on_gpu else None
    device = torch.device("cuda", rank) if on_gpu else torch.device("cpu")
    model = models.build("resnet18", num_classes=10, width=8).to(device)
    params = [(n, p) for n, p in model.named_parameters()]
    out: dict[str, list[Any]] = {}
    for name in names:
        state = HookState(compression.create(name), params, group=group)
        pair, results = state.compressor.accordion_levels, []
        for step in range(2):
            if pair is not None:
                state.set_levels(dict.fromkeys(state.compressed_layers(), pair[step]))
            gen = torch.Generator().manual_seed(100 * rank + step)
            buffer = torch.randn(sum(p.numel() for _, p in params), generator=gen).to(device)
            views = [v.view_as(p) for v, (_, p) in
                     zip(buffer.split([p.numel() for _, p in params]), params, strict=True)]
            state.aggregate([n for n, _ in params], views, buffer).wait()
            state.stats.step += 1
            results.append(buffer.cpu())
        out[name] = results
    return out


def nccl_gloo_rows(names: list[str], gpu: bool) -> list[Row]:
    """Check 4 for every compressor (``gpu`` False: gloo against gloo, a check of the check)."""
    nccl = run_ranks(bucket_rank, 2, (names, gpu))
    gloo = run_ranks(bucket_rank, 2, (names, False))
    rows = []
    for name in names:
        alike = all(torch.equal(a, b) for a, b in zip(nccl[0][name], nccl[1][name], strict=True))
        worst = max(float((a - b).abs().max() / b.abs().max())
                    for a, b in zip(nccl[0][name], gloo[0][name], strict=True))
        exact = all(torch.equal(a.view(torch.int32), b.view(torch.int32))
                    for a, b in zip(nccl[0][name], gloo[0][name], strict=True))
        ok = alike and (exact if name in EXACT else worst <= TOLERANCE)
        want = "bit for bit" if name in EXACT else f"within {TOLERANCE:g}"
        rows.append(Row("nccl-vs-gloo", name, _status(ok),
                        f"ranks alike: {alike}; vs gloo: {'bit for bit' if exact else 'differs'}, "
                        f"max diff {worst:.2g} of the largest value (required: {want})"))
    return rows


# ---- the report ------------------------------------------------------------------------------
def machine() -> list[str]:
    """What ran the checks."""
    commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=ROOT,
                            capture_output=True, text=True).stdout.strip() or "unknown"
    commit += " with uncommitted changes" if provenance.code_changed(ROOT) else ""
    gpus = [torch.cuda.get_device_name(i) for i in range(torch.cuda.device_count())]
    nccl = ".".join(map(str, torch.cuda.nccl.version())) if gpus else "-"
    return [f"- commit {commit}, {time.strftime('%Y-%m-%d %H:%M %Z')}, {platform.node()}",
            f"- torch {torch.__version__}, CUDA {torch.version.cuda}, NCCL {nccl}, "
            f"Python {platform.python_version()}",
            f"- GPUs: {len(gpus)} x {', '.join(sorted(set(gpus))) or 'none'}"]


def table(rows: list[Row]) -> list[str]:
    lines = ["| check | compressor | result | detail |", "|---|---|---|---|"]
    return lines + [f"| {r.check} | {r.compressor} | {r.status} | {r.detail} |" for r in rows]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--compressors", nargs="+", default=compression.available(),
                        choices=compression.available())
    parser.add_argument("--device", choices=("cuda", "cpu"), default="cuda",
                        help="cpu: check this script on 2 CPU ranks (nothing is written)")
    parser.add_argument("--jobs", type=int, default=1,
                        help="compressors whose run and resume go at once (each its own "
                             "torchrun on the same GPUs; more CPU cores than ranks x jobs)")
    parser.add_argument("--override", nargs="+", default=[], metavar="KEY=VALUE",
                        help="run.py overrides for checks 1 and 2 (e.g. trainer.num_workers=0 "
                             "where /dev/shm is too small for DataLoader workers)")
    args = parser.parse_args(argv)
    gpus = torch.cuda.device_count() if torch.cuda.is_available() else 0
    if args.device == "cuda" and gpus == 0:
        print("smoke-gpu: skipped: torch sees no CUDA device here (torch.cuda.is_available() "
              "is False)")
        return 0
    on_gpu = args.device == "cuda"
    ranks = gpus if on_gpu else 2
    started, rows = time.monotonic(), []
    with tempfile.TemporaryDirectory(prefix="smoke-gpu-") as tmp, \
            ThreadPoolExecutor(args.jobs) as pool:  # each job its own torchrun processes
        for found in pool.map(lambda n: run_and_resume(n, ranks, args.device, Path(tmp),
                                                       tuple(args.override)), args.compressors):
            rows += found
            print(*table(found)[2:], sep="\n", flush=True)
    rows += sync_rows(args.compressors, ranks) if on_gpu else \
        [Row("syncs", name, "skip", "CUDA only") for name in args.compressors]
    if on_gpu and gpus < 2:
        rows += [Row("nccl-vs-gloo", name, "skip", "needs 2 GPUs") for name in args.compressors]
    else:
        rows += nccl_gloo_rows(args.compressors, on_gpu)
    failed = [r for r in rows if r.status == "FAIL"]
    lines = [f"# make smoke-gpu: {len(rows) - len(failed)} of {len(rows)} checks passed or "
             f"skipped, {len(failed)} failed ({time.monotonic() - started:.0f} s)", "",
             *machine(), f"- command: {' '.join([Path(sys.argv[0]).name, *sys.argv[1:]])}",
             "", *table(rows)]
    print("\n".join(lines))
    if on_gpu:
        OUT.parent.mkdir(parents=True, exist_ok=True)
        OUT.write_text("\n".join(lines) + "\n")
        print(f"written to {OUT.relative_to(ROOT)}")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
