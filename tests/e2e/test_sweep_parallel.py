"""The fast tiny path: a sweep's 2-worker runs as 2 simulated learners in one process each, two
runs at a time (``launcher=simulated trainer.workers=2 hydra.launcher.parallel=2``), against the
same sweep as 2-rank torchrun jobs one after another: the same records and checkpoints bit for
bit, relaunches across the two ways, a failed job and a preemption."""

from __future__ import annotations

import contextlib
import os
import re
import signal
import time
from datetime import datetime
from pathlib import Path
from typing import Any

import pytest
import torch

from tests.conftest import read_rows, same_rows
from tests.e2e.test_sweep_launch import METHODS, finish, run_dirs, summary, sweep

pytestmark = pytest.mark.slow
FAST = ["launcher=simulated", "trainer.workers=2", "hydra.launcher.parallel=2"]
RANKS = ["hydra.launcher.nproc_per_node=2"]
# A checkpoint's entries that hold no result: its config (trainer.workers tells the two ways
# apart) and the seconds the run took.
NOT_RESULTS = ("config", "elapsed_s")


@pytest.fixture(scope="module")
def ranks_sweep(tmp_path_factory) -> Path:
    """The small tiny Table 1 sweep as 2-rank torchrun jobs, one after another: its runs root."""
    root = tmp_path_factory.mktemp("ranks")
    finish(sweep([f"runs_root={root}", *RANKS]))
    return root


def same_tensors(a: Any, b: Any, where: str = "") -> None:
    """``a`` and ``b`` (nested containers of tensors and plain values) are bit for bit equal."""
    if isinstance(a, torch.Tensor):
        assert isinstance(b, torch.Tensor) and a.dtype == b.dtype and torch.equal(a, b), where
    elif isinstance(a, dict):
        assert a.keys() == b.keys(), where
        for key in a:
            same_tensors(a[key], b[key], f"{where}.{key}")
    elif isinstance(a, list | tuple):
        assert len(a) == len(b), where
        for i, (x, y) in enumerate(zip(a, b, strict=True)):
            same_tensors(x, y, f"{where}[{i}]")
    else:
        assert a == b, f"{where}: {a!r} != {b!r}"


def same_run(a: Path, b: Path) -> None:
    """Every epoch's metrics but the timings, and the final checkpoint but its config and
    seconds (weights, optimizer, scheduler, every worker's RNG streams and memories)."""
    same_rows(read_rows(a), read_rows(b))
    ca, cb = (torch.load(p / "checkpoint.pt", weights_only=True) for p in (a, b))
    for key in NOT_RESULTS:
        ca.pop(key), cb.pop(key)
    same_tensors(ca, cb)


def log_span(run_dir: Path) -> tuple[datetime, datetime]:
    """When the run's log began and ended."""
    stamps = re.findall(r"^\[(\d{4}-\d\d-\d\d \d\d:\d\d:\d\d,\d{3})\]",
                        (run_dir / "run.log").read_text(), re.MULTILINE)
    first, last = (datetime.strptime(s, "%Y-%m-%d %H:%M:%S,%f") for s in (stamps[0], stamps[-1]))
    return first, last


def kill_tree(pid: int) -> None:
    """SIGKILL ``pid`` and every process below it (torchrun starts its ranks in sessions of
    their own) at once, as the OOM killer or a lost node would: nothing of the job can write
    how it ended."""
    children: dict[int, list[int]] = {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():  # /proc/self, /proc/meminfo, ...
            continue
        try:
            ppid = int((entry / "stat").read_text().rsplit(")", 1)[1].split()[1])
        except (OSError, IndexError, ValueError):  # not a process, or gone
            continue
        children.setdefault(ppid, []).append(int(entry.name))
    tree, todo = [], [pid]
    while todo:
        tree.append(todo.pop())
        todo += children.get(tree[-1], [])
    for member in tree:
        with contextlib.suppress(ProcessLookupError):
            os.kill(member, signal.SIGKILL)


def test_parallel_learners_sweep_records_what_the_torchrun_sweep_records(tmp_path, ranks_sweep):
    out = finish(sweep([f"runs_root={tmp_path}", *FAST]))
    assert "3 runs: 0 complete, 0 to resume, 0 failed to rerun, 3 to start" in out
    fast, slow = run_dirs(tmp_path), run_dirs(ranks_sweep)
    for method in METHODS:
        done = summary(fast[method])
        assert done["status"] == "completed" and done["provenance"]["launcher"] == "simulated"
        assert done["provenance"]["world_size"] == 2
        same_run(fast[method], slow[method])
    # two at a time: the second run started before the first ended
    assert log_span(fast[METHODS[1]])[0] < log_span(fast[METHODS[0]])[1]
    # The torchrun sweep's runs are complete for the fast path too: nothing starts.
    stamps = {m: (d / "summary.json").stat().st_mtime_ns for m, d in run_dirs(ranks_sweep).items()}
    out = finish(sweep([f"runs_root={ranks_sweep}", *FAST]))
    assert "3 runs: 3 complete, 0 to resume, 0 failed to rerun, 0 to start" in out
    assert stamps == {m: (d / "summary.json").stat().st_mtime_ns
                      for m, d in run_dirs(ranks_sweep).items()}


def test_the_fast_path_resumes_a_killed_torchrun_run_and_a_failed_job_fails_alone(
        tmp_path, ranks_sweep):
    dirs = run_dirs(tmp_path)
    # 1. Kill the torchrun sweep (SIGKILL: no summary, the last epoch-end checkpoint stays)
    #    once its first run has two epochs.
    first = sweep([f"runs_root={tmp_path}", *RANKS, "method=rank2"])
    deadline = time.monotonic() + 600
    while not (dirs["rank2"] / "metrics.jsonl").exists() or len(read_rows(dirs["rank2"])) < 2:
        assert first.poll() is None and time.monotonic() < deadline, first.stdout.read()[-5000:]
        time.sleep(0.05)
    kill_tree(first.pid)
    first.communicate(timeout=120)
    assert not (dirs["rank2"] / "summary.json").exists()
    # 2. A run whose checkpoint is corrupt: its job refuses it (exit status 2), the others go on.
    dirs["rank1"].mkdir(parents=True)
    (dirs["rank1"] / "checkpoint.pt").write_bytes(b"not a checkpoint")
    # 3. Relaunch the fast way: resume the killed run, fail the corrupt one, start the third.
    proc = sweep([f"runs_root={tmp_path}", *FAST])
    out, _ = proc.communicate(timeout=600)
    assert proc.returncode == 1, out[-5000:]
    assert "3 runs: 0 complete, 2 to resume, 0 failed to rerun, 1 to start" in out
    assert "2 of 3 runs finished, 1 failed" in out and "resnet18/rank1/ours/seed0" in out
    assert "resume: " in out and "is not a readable checkpoint" in out
    for method in ("rank2", "accordion_rank2_rank1"):
        assert summary(dirs[method])["status"] == "completed"
        same_run(dirs[method], run_dirs(ranks_sweep)[method])
    launchers = [s["launcher"] for s in summary(dirs["rank2"])["starts"]]
    assert launchers == ["torchrun", "simulated"]


def test_parallel_preempted_runs_resume_to_the_straight_records(tmp_path, ranks_sweep):
    # SIGTERM to the sweep's process group (as a session's end or a scheduler sends it) while
    # two runs train side by side: each stops at a step boundary with a mid-epoch checkpoint;
    # the relaunch resumes them to the records of runs that never stopped.
    dirs = run_dirs(tmp_path)
    both = ["method=rank2,rank1"]
    proc = sweep([f"runs_root={tmp_path}", *FAST, *both], start_new_session=True)
    deadline = time.monotonic() + 600
    while not all((dirs[m] / "checkpoint.pt").exists() for m in ("rank2", "rank1")):
        assert proc.poll() is None and time.monotonic() < deadline, proc.stdout.read()[-5000:]
        time.sleep(0.02)
    os.killpg(proc.pid, signal.SIGTERM)
    proc.communicate(timeout=120)
    statuses = [summary(dirs[m])["status"] for m in ("rank2", "rank1")]
    assert any(s.startswith("preempted: SIGTERM at epoch ") for s in statuses), statuses
    finish(sweep([f"runs_root={tmp_path}", *FAST, *both]))
    for method in ("rank2", "rank1"):
        assert summary(dirs[method])["status"] == "completed"
        same_run(dirs[method], run_dirs(ranks_sweep)[method])
