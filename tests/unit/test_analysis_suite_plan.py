"""`make plan-all` (analysis/suite_plan.py): every sweep's plan in one table, with the suite's
time at the rates this machine's records show."""

from __future__ import annotations

import json
import re

from analysis import suite_plan as suite
from core import provenance
from jobs import runs, sweeps
from tests.conftest import ROOT


def test_the_suite_is_the_makefile_s_reproduce_all():
    line = next(t for t in (ROOT / "Makefile").read_text().splitlines()
                if t.startswith("SWEEPS := "))
    assert tuple(line.split(":= ")[1].split()) == suite.SWEEPS


def test_a_complete_run_counts_and_sets_the_measured_rate(tmp_path, capsys):
    def plan() -> sweeps.Plan:
        return suite.plans("tiny", tmp_path, "0", names=("fig10",))[0]

    first = plan()
    assert (len(first.jobs), len(first.todo())) == (3, 3)
    job = first.jobs[0]  # a complete record of it, as run.py leaves one, on this machine
    job.run_dir.mkdir(parents=True)
    runs.prepare(job.cfg, job.run_dir, runs.Action.START)
    machine = provenance.machine_label(provenance.collect("portable", 1, "test"))
    start = {"machine": machine, "launcher": "simulated", "world_size": 2}
    (job.run_dir / "summary.json").write_text(json.dumps(
        {"status": "completed", "total_time_s": 600.0, "starts": [start]}))
    (job.run_dir / "checkpoint.pt").write_bytes(b"")
    again = plan()
    rate = sweeps.run_flops(job.cfg) / 600.0
    assert again.measured is not None and again.measured.per_model == {"resnet18": (rate, 1)}
    rows = suite.table([again, again])
    assert rows[0]["sweep"] == "fig10" and (rows[0]["complete"], rows[0]["to run"]) == (1, 2)
    seconds = sum(j.flops for j in again.jobs) / rate + 3 * sweeps.START_S  # every run
    assert rows[0]["every run: min, measured rates"] == seconds / 60 / 2  # two at a time
    assert rows[-1]["sweep"] == "all" and rows[-1]["to run"] == 4
    assert rows[-1]["every run: min, measured rates"] == 2 * seconds / 60 / 2
    assert suite.main(["--runs", str(tmp_path), "--seeds", "0", "--out", str(tmp_path / "p.md")],
                      names=("fig10",)) == 0
    text = (tmp_path / "p.md").read_text()
    assert text in capsys.readouterr().out
    assert f"tiny runs recorded on this machine ({machine}; resnet18 {rate / 1e9:.1f}" in text
    assert re.search(r"\| all \| 3 \| 1 \| 2 \| \d+ \| \d+ \| \d+ \|", text), text
