"""``make smoke-gpu`` (benchmarks/smoke_gpu.py) here, without a GPU: it skips in one line, its
comparisons fail where runs differ, and its checks themselves run on 2 CPU ranks."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
import torch

from benchmarks import smoke_gpu
from tests.conftest import ROOT


@pytest.mark.skipif(torch.cuda.is_available(), reason="a GPU is here: it would run the smoke")
def test_without_a_gpu_it_skips_in_one_line():
    before = smoke_gpu.OUT.read_bytes() if smoke_gpu.OUT.exists() else None  # a GPU's report
    proc = subprocess.run([sys.executable, "-m", "benchmarks.smoke_gpu"], cwd=ROOT,
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0 and proc.stderr == ""
    assert proc.stdout.startswith("smoke-gpu: skipped: ") and proc.stdout.count("\n") == 1
    assert (smoke_gpu.OUT.read_bytes() if smoke_gpu.OUT.exists() else None) == before  # kept


def _run(path, rows, weights):
    path.mkdir()
    (path / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    torch.save({"model": weights}, path / "checkpoint.pt")
    return path


def test_a_resume_matches_only_bit_for_bit(tmp_path):
    rows = [{"epoch": 0, "train/loss": 1.5, "level/fc": 0.99, "time/epoch_s": 3.0}]
    weights = {"fc": torch.ones(3)}
    a = _run(tmp_path / "a", rows, weights)
    assert smoke_gpu.first_difference(a, _run(tmp_path / "b", [{**rows[0], "time/epoch_s": 9.0}],
                                                  {"fc": torch.ones(3)})) is None
    loss = _run(tmp_path / "c", [{**rows[0], "train/loss": 1.5000001}], weights)
    assert smoke_gpu.first_difference(a, loss) == "epoch 0 train/loss: 1.5 vs 1.5000001"
    moved = _run(tmp_path / "d", rows, {"fc": torch.tensor([1.0, 1.0, 1.0 + 2**-20])})
    assert smoke_gpu.first_difference(a, moved).startswith("weights fc differ")
    assert smoke_gpu.first_difference(a, _run(tmp_path / "e", rows * 2, weights)) == \
        "1 vs 2 epochs"


def test_the_levels_must_switch_as_planned():
    planned = [{"level/a": 0.99, "level/b": 0.99}, {"level/a": 0.99, "level/b": 0.99},
               {"level/a": 0.1, "level/b": 0.1}, {"level/a": 0.99, "level/b": 0.99}]
    assert smoke_gpu.planned_levels("topk", planned) is None
    stuck = [*planned[:2], {"level/a": 0.1, "level/b": 0.99}, planned[3]]
    assert smoke_gpu.planned_levels("topk", stuck) == "epoch 2: levels [0.1, 0.99], planned 0.1"
    assert smoke_gpu.planned_levels("none", [{}] * 4) is None  # no levels to plan


@pytest.mark.slow
def test_the_checks_run_on_two_cpu_ranks(capsys):
    # run, resume (bit for bit), gloo against gloo: the smoke's own plumbing (on a quarter of
    # its data: 2 steps an epoch; about a minute here)
    assert smoke_gpu.main(["--device", "cpu", "--compressors", "topk",
                           "--override", "dataset.subset=128"]) == 0
    out = capsys.readouterr().out
    for check in ("run", "resume", "nccl-vs-gloo"):
        assert f"| {check} | topk | pass |" in out
    assert "levels 0.99, 0.99, 0.1, 0.99" in out and "| syncs | topk | skip |" in out


def test_a_failed_launch_reports_its_error_not_torchruns_rule():
    stderr = ("Traceback (most recent call last):\n  File \"run.py\", line 9\n"
              "AttributeError: module 'torch.distributed' has no attribute 'x'\n"
              "[rank0]: ChildFailedError: run.py FAILED\n" + "=" * 60
              + "\nFailures:\n  <NO_OTHER_FAILURES>\n" + "=" * 60 + "\n")
    proc = subprocess.CompletedProcess([], 1, "", stderr)
    assert smoke_gpu._failure(proc) == "exit 1: [rank0]: ChildFailedError: run.py FAILED"
    bare = subprocess.CompletedProcess([], 124, "", "timed out after 300 s")
    assert smoke_gpu._failure(bare) == "exit 124: timed out after 300 s"
    assert smoke_gpu._failure(subprocess.CompletedProcess([], 1, "a | b\n", "")) == "exit 1: a / b"
