"""``make bench-compressors`` at a tiny size: both sides of a baseline comparison written, and
the compression programs ``make bench-e2e`` charges. Nothing here asserts a time."""

from __future__ import annotations

import csv
import subprocess
import sys

import pytest
import torch

from benchmarks.compressors import GOALS, Recorder, record
from compression.base import Layer
from compression.comm import SimComm
from compression.hook import aggregate_bucket
from compression.powersgd import PowerSGD
from compression.topk import TopK
from tests.conftest import ROOT


@pytest.mark.parametrize("compressor", [PowerSGD(2), TopK(0.5)])
def test_a_program_notes_every_start_and_wait_in_order(compressor: object) -> None:
    # A bucket of a bias (the hook's dense all-reduce, started first and waited for last) and
    # two matrices: PowerSGD waits for P then Q, Top-K for its one all-gather.
    comm = Recorder(SimComm.group(1)[0])
    grads = [torch.randn(7), torch.randn(12, 30), torch.randn(8, 3, 3, 3)]
    layers = [Layer(f"l{i}", g.shape, 2 if isinstance(compressor, PowerSGD) else 0.5)
              for i, g in enumerate(grads[1:])]
    ops = record(aggregate_bucket(compressor, grads[:1], layers, grads[1:], comm), comm)
    kinds = [(op, x) for op, x in ops if op != "cpu"]
    if isinstance(compressor, PowerSGD):
        assert kinds == [("start", 0), ("start", 1), ("wait", 1), ("start", 2), ("wait", 2),
                         ("wait", 0)]
    else:
        assert kinds == [("start", 0), ("start", 1), ("wait", 1), ("wait", 0)]
    assert [op for op, _ in ops][0::2] == ["cpu"] * (len(kinds) + 1)  # work between each
    assert all(x >= 0 for op, x in ops if op == "cpu")


@pytest.mark.slow
def test_a_baseline_run_writes_both_sides_and_the_goals(tmp_path) -> None:
    if subprocess.run(["git", "-C", str(ROOT), "rev-parse", "HEAD"],
                      capture_output=True).returncode != 0:
        pytest.skip("not a git checkout: no baseline to compare with")
    done = subprocess.run([sys.executable, "-m", "benchmarks.compressors", "--width", "8",
                           "--repeats", "1", "--ddp-steps", "1", "--baseline", "HEAD",
                           "--out", str(tmp_path)], cwd=ROOT, capture_output=True, text=True,
                          timeout=900)
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-4000:]
    with open(tmp_path / "compressors.csv", newline="") as f:
        rows = list(csv.DictReader(f))
    this = [r["method"] + r["level"] for r in rows if r["side"] == "this"]
    baseline = [r["method"] + r["level"] for r in rows if r["side"] == "baseline"]
    assert this[:len(baseline)] == baseline and len(this) == len(baseline) + 2  # + DDP rows
    assert all(float(r["x_clone"]) > 0 for r in rows if r["x_clone"])
    text = (tmp_path / "compressors.md").read_text()
    assert "width 8: a check only" in text and "load average (1 min) at the repeats" in text
    goals = text.split("**Issue 27's goals**")[1].split("\n\n")[1].splitlines()[2:]
    assert len(goals) == len(GOALS)
    assert all(row.endswith((" yes |", " no |")) for row in goals)
