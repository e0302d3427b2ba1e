"""A very short end-to-end benchmark (and time-to-accuracy run) writes well-formed results.

Real ranks in a real rate-limited namespace; nothing here asserts a time. Skipped where
`ip netns` is not permitted.
"""

from __future__ import annotations

import csv
import json
import math
import re
import subprocess
import sys

import pytest

from benchmarks import netns
from benchmarks.projection import WORKERS
from tests.conftest import ROOT

REASON = netns.unavailable_reason()
pytestmark = [pytest.mark.slow,
              pytest.mark.skipif(REASON is not None, reason=f"no network namespaces: {REASON}")]

METHODS = ["powersgd1", "torch-powersgd1", "topk0.1", "adacomp"]


def run(module: str, *args: str) -> subprocess.CompletedProcess[str]:
    done = subprocess.run([sys.executable, "-m", module, *args], cwd=ROOT, capture_output=True,
                          text=True, timeout=900)
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-4000:]
    return done


def read_csv(path) -> list[dict[str, str]]:
    with open(path, newline="") as f:
        return list(csv.DictReader(f))


@pytest.fixture(scope="module")
def bench(tmp_path_factory):
    out = tmp_path_factory.mktemp("bench")
    run("benchmarks.e2e", "--tiny", "--models", "resnet18", "--ratios", "1", "--warmup", "1",
        "--steps", "1", "--methods", *METHODS, "--out", str(out))
    return out


def test_every_method_gets_a_row_with_measured_and_modelled_numbers(bench) -> None:
    rows = read_csv(bench / "e2e.csv")
    assert [r["key"] for r in rows] == ["none", *METHODS]
    for r in rows:
        assert r["model"] == "resnet18" and float(r["ratio"]) == 1.0
        for key in ("step_ms", "compute_ms", "ideal_ms", "speedup", "ideal_speedup",
                    "efficiency", "message_MB", "lo_MB", "lo_expected_MB"):
            assert math.isfinite(float(r[key])) and float(r[key]) > 0, (r["key"], key)
    none = rows[0]
    assert float(none["speedup"]) == 1.0 and float(none["ideal_speedup"]) == 1.0
    # PyTorch's hook has no accounting of ours; ours reports exactly what it issued
    for r in rows:
        if r["key"].startswith("torch-"):
            assert r["hook_wire_MB"] == "" and r["compress_ms"] == ""
        else:
            assert float(r["hook_wire_MB"]) == pytest.approx(float(r["message_MB"]), rel=1e-6)
    # what lo carried: the ring's traffic for those messages, plus headers and barriers
    for r in rows:
        expected = float(r["lo_expected_MB"])
        assert expected <= float(r["lo_MB"]) <= 1.1 * expected + 0.05, r["key"]
    # the second ideal charges our compressors their work alone (slower than the first ideal);
    # PyTorch's hook is not charged
    for r in rows:
        if r["key"].startswith("torch-"):
            assert r["charged_ms"] == r["alone_ms"] == ""
        else:
            assert float(r["charged_ms"]) > float(r["ideal_ms"]) and float(r["alone_ms"]) > 0
            assert math.isfinite(float(r["charged_efficiency"]))


def test_collectives_are_attributed_to_their_buckets(bench) -> None:
    raw = json.loads((bench / "raw" / "e2e" / "resnet18-ratio1.json").read_text())
    sizes = raw["ranks"][0]["bucket_sizes"]
    assert len(sizes) >= 1
    none = raw["ranks"][0]["steps"]["none"][-1]["collectives"]
    assert [(b, op, n) for b, op, n, _ in none] == [
        (b, "all_reduce", 4 * size) for b, size in enumerate(sizes)]
    psgd = raw["ranks"][0]["steps"]["powersgd1"][-1]["collectives"]
    # per bucket: the uncompressed tensors, then P and Q, in bucket order
    assert [b for b, *_ in psgd] == sorted(b for b, *_ in psgd)
    assert {op for _, op, _, _ in psgd} == {"all_reduce"}


def test_compression_programs_fit_the_buckets_the_ranks_ran(bench) -> None:
    raw = json.loads((bench / "raw" / "e2e" / "resnet18-ratio1.json").read_text())
    programs = json.loads((bench / "raw" / "e2e" / "programs" / "resnet18.json").read_text())
    assert set(programs) == {"none", *(m for m in METHODS if not m.startswith("torch-"))}
    for key, buckets in programs.items():
        issued = raw["ranks"][0]["steps"][key][-1]["collectives"]
        assert len(buckets) == len(raw["ranks"][0]["bucket_sizes"])
        for b, ops in enumerate(buckets):
            starts = [x for op, x in ops if op == "start"]
            assert starts == list(range(sum(1 for c in issued if c[0] == b)))
            assert {x for op, x in ops if op == "wait"} <= set(starts)
            assert all(x >= 0 for op, x in ops if op == "cpu")


def test_calibration_and_report_are_written(bench) -> None:
    text = (bench / "e2e.md").read_text()
    assert "| resnet18 | unlimited |" in text and "| resnet18 | 1 | " in text
    assert "| PowerSGD rank 1 |" in text and "| AdaComp L_T 50/500 |" in text
    assert "**Against the ideal that charges compression**" in text
    context = json.loads((bench / "raw" / "e2e" / "context.json").read_text())
    assert context["steps"] == 1 and context["minutes"] > 0
    assert re.search(r"Machine and code: .+ \(fingerprint [0-9a-f]{12}\), commit [0-9a-f]{10}",
                     text)  # the machine and the code that made the numbers


def test_projection_reads_the_records(bench) -> None:
    run("benchmarks.projection", "--raw", str(bench / "raw" / "e2e"), "--out", str(bench))
    rows = read_csv(bench / "projection.csv")
    assert {int(r["workers"]) for r in rows} == set(WORKERS)
    assert all(float(r["speedup"]) == 1.0 for r in rows if r["key"] == "none")
    topk = {int(r["workers"]): float(r["speedup"]) for r in rows
            if r["key"] == "topk0.1" and float(r["gbit_s"]) == 10.0}
    assert topk[256] < topk[4]  # its all-gather grows with N
    assert (bench / "projection.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert "Break-even" in (bench / "projection.md").read_text()


def test_time_to_accuracy_runs_run_py_jobs_in_the_namespace(tmp_path) -> None:
    jobs = tmp_path / "jobs.yaml"
    jobs.write_text("""
common: [dataset=digits, dataset.subset=64, model=resnet18, model.width=8, trainer.epochs=2,
         trainer.batch_size=32, trainer.device=cpu, trainer.progress=false, logger=none]
jobs:
  low: [compressor=powersgd, compressor.rank=2]
  accordion: [compressor=powersgd, scheduler=accordion, scheduler.interval=1]
""")
    out = tmp_path / "bench"
    run("benchmarks.tta", "--jobs", str(jobs), "--ratio", "4", "--out", str(out))
    rows = read_csv(out / "tta_jobs.csv")
    assert [r["job"] for r in rows] == ["low", "accordion"]
    for r in rows:
        assert r["status"] == "completed" and int(r["epochs"]) == 2
        assert float(r["train_s"]) > 0 and float(r["gbit_sent"]) > 0
        assert 0.0 <= float(r["final"]) <= 100.0  # test/accuracy in percent
    assert float(rows[0]["speedup"]) == 1.0
    assert rows[0]["time_to_target_s"] != ""  # the reference reaches its own final value
    assert (out / "raw" / "tta_jobs" / "accordion" / "summary.json").exists()
    assert "| accordion | completed | 2 |" in (out / "tta_jobs.md").read_text()
