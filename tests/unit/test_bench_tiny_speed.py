"""``make bench-tiny-speed ARGS='--baseline REF'``: a tiny sweep slice by a commit's code and by
this checkout, side by side; runs that record the same metrics are counted as such. Nothing here
asserts a time."""

from __future__ import annotations

import csv

import pytest

from benchmarks import tiny_speed

# One short run of the demo's slice: rank 2 on a small stand-in, one epoch.
SLICE = ("model=resnet18 method=rank2 dataset.train_size=64 dataset.test_size=32 "
         "trainer.progress=false")


@pytest.mark.slow
def test_a_baseline_run_side_by_side_records_the_same_metrics(tmp_path):
    tiny_speed.main(["--only", SLICE, "--epochs", "1", "--baseline", "HEAD", "--out",
                     str(tmp_path)])
    with open(tmp_path / "tiny_speed_baseline_table1.csv") as f:
        rows = list(csv.DictReader(f))
    assert [r["way"] for r in rows] == ["baseline", "this"]
    assert all(r["runs"] == "1" for r in rows)
    text = (tmp_path / "tiny_speed_baseline_table1.md").read_text()
    assert "| 1 of 1 |" in text and "| 0 of 1 |" not in text
    assert "Speed-up (median wall time, baseline / this)" in text
    assert "machine" in text and "the baseline's" in text  # both sides' run records named


def test_a_baseline_that_git_cannot_read_is_one_line(tmp_path):
    with pytest.raises(SystemExit, match="--baseline: git cannot read 'no-such-ref'"):
        tiny_speed.main(["--baseline", "no-such-ref", "--out", str(tmp_path)])
