"""`make bench-test-time` (benchmarks/test_time.py): real pytest runs measured, specs checked."""

from __future__ import annotations

import argparse
import subprocess
import sys

import pytest

from benchmarks import test_time


def test_run_specs_parse_and_bad_ones_name_what_is_allowed() -> None:
    assert test_time.run_spec("slow:2") == ("slow", 2)
    for bad in ("slow", "fast:2", "unit:0", "unit:x"):
        with pytest.raises(argparse.ArgumentTypeError, match="PART one of unit, slow"):
            test_time.run_spec(bad)


def test_a_pytest_run_is_measured_and_a_failing_one_stops_the_benchmark(tmp_path, monkeypatch
                                                                        ) -> None:
    passing, failing = tmp_path / "test_ok.py", tmp_path / "test_bad.py"
    passing.write_text("def test_a():\n    assert sum(range(10**6)) > 0\n\n"
                       "def test_b():\n    pass\n")
    failing.write_text("def test_c():\n    assert 1 == 2, 'hand-made failure'\n")
    monkeypatch.setitem(test_time.PARTS, "ok", [str(passing)])
    monkeypatch.setitem(test_time.PARTS, "bad", [str(failing)])
    row = test_time.run_part("ok", 1)
    assert row["summary"] == "2 passed" and row["workers"] == 1
    assert row["wall_s"] > 0 and row["cpu_s"] > 0 and 0 < row["busy"] <= 1
    assert row["command"].startswith("pytest -q") and str(passing) in row["command"]
    with pytest.raises(SystemExit, match="hand-made failure"):
        test_time.run_part("bad", 1)


def test_the_table_adds_the_unit_part_to_each_slow_run() -> None:
    rows = [{"tree": "abc", "part": p, "workers": w, "wall_s": s, "busy": b, "cpu_s": 2 * s * b,
             "load_before": 0.1, "load_after": 1.9, "summary": "9 passed", "command": "pytest"}
            for p, w, s, b in (("unit", 2, 300.0, 0.98), ("slow", 2, 600.0, 0.98),
                               ("slow", 1, 780.0, 0.66))]
    text = test_time.markdown(rows, "a machine (fingerprint 0123456789ab), commit abc", "cmd", 1)
    assert "| abc | slow (`tests/ranks tests/e2e`) | 1 | 13.0 | 0.66 | 17.2 | 0.1 / 1.9 |" in text
    assert "abc: `tests/unit` on 2 + `tests/ranks tests/e2e` on 2: **15.0 min**" in text
    assert "abc: `tests/unit` on 2 + `tests/ranks tests/e2e` on 1: **18.0 min**" in text
    assert "fingerprint 0123456789ab" in text
    assert "baseline" not in text


def test_a_baseline_checkouts_parts_run_beside_this_ones_and_the_ratio_is_given(tmp_path) -> None:
    rows = [{"tree": t, "part": p, "workers": 2, "wall_s": s, "busy": 0.9, "cpu_s": s,
             "load_before": 0.1, "load_after": 1.9, "summary": "9 passed", "command": "pytest"}
            for t, p, s in (("old", "unit", 400.0), ("new", "unit", 300.0),
                            ("old", "slow", 800.0), ("new", "slow", 600.0))]
    text = test_time.markdown(rows, "a machine", "cmd", 1)
    assert "old: `tests/unit` on 2 + `tests/ranks tests/e2e` on 2: **20.0 min**" in text
    assert "new: `tests/unit` on 2 + `tests/ranks tests/e2e` on 2: **15.0 min**" in text
    assert "new over old (the baseline), side by side: **0.75x** the wall time." in text
    proc = subprocess.run([sys.executable, "-m", "benchmarks.test_time", "--baseline",
                           str(tmp_path)], cwd=test_time.ROOT, capture_output=True, text=True)
    assert proc.returncode == 2 and f"--baseline: {tmp_path} is not a checkout" in proc.stderr
