"""results/machines.{csv,md}: the demo's numbers per machine (analysis/machines.py), from
hand-written run records of two machines."""

from __future__ import annotations

from pathlib import Path

import pandas as pd

from analysis import machines
from tests.analysis_fixture import (
    COMMIT_1,
    MACHINE_A,
    MACHINE_B,
    epoch_row,
    provenance,
    write_record,
)

RUNS = {"rank2": ("ours", 97.5), "rank1": ("ours", 93.8), "accordion_rank2_rank1": ("ours", 96.9)}


def _demo(root: Path, machine: dict, shift: float = 0.0) -> Path:
    for method, (variant, accuracy) in RUNS.items():
        run = {"sweep": "table1", "method": method, "variant": variant}
        write_record(root, f"{machine['fingerprint']}-{method}", run,
                     [epoch_row(0, 50.0), epoch_row(1, accuracy + shift)],
                     provenance=provenance(machine))
    write_record(root, f"{machine['fingerprint']}-other", {"sweep": "table1", "method": "rank2",
                 "seed": 1}, [epoch_row(0, 1.0)], provenance=provenance(machine))
    return root


def test_each_machine_is_a_row_and_the_page_says_whether_they_agree(tmp_path):
    out = tmp_path / "out"
    assert machines.main([str(_demo(tmp_path / "a", MACHINE_A)), "--out", str(out)]) == 0
    first = pd.read_csv(out / "machines.csv", dtype={"commit": str})
    assert first[["fingerprint", "rank 2", "rank 1", "Accordion (ours)"]].values.tolist() == [
        [MACHINE_A["fingerprint"], 97.5, 93.8, 96.9]]  # seed 1 is not the demo's
    assert first["commit"].tolist() == [COMMIT_1[:12]]
    # another machine adds its row; the first one's stays
    assert machines.main([str(_demo(tmp_path / "b", MACHINE_B)), "--out", str(out)]) == 0
    table = pd.read_csv(out / "machines.csv")
    assert sorted(table["fingerprint"]) == sorted([MACHINE_A["fingerprint"],
                                                   MACHINE_B["fingerprint"]])
    assert "the same numbers on every machine" in (out / "machines.md").read_text()
    # a machine whose numbers differ makes the page say so
    machines.main([str(_demo(tmp_path / "c", MACHINE_B, shift=0.1)), "--out", str(out)])
    assert "**the machines disagree.**" in (out / "machines.md").read_text()
    assert len(pd.read_csv(out / "machines.csv")) == 2  # B's row replaced, not added


def test_the_page_says_whether_rows_of_other_commits_and_machines_agree(tmp_path):
    out = tmp_path / "out"
    machines.main([str(_demo(tmp_path / "a", MACHINE_A)), "--out", str(out)])
    assert "every portable row" not in (out / "machines.md").read_text()  # one machine
    table = pd.read_csv(out / "machines.csv", dtype={"commit": str})
    other = table.assign(fingerprint="f" * 12, commit="c" * 12, machine="Other CPU x2")
    pd.concat([table, other]).to_csv(out / "machines.csv", index=False)
    machines.main([str(tmp_path / "a"), "--out", str(out)])  # A again: the CSV rows stay
    page = (out / "machines.md").read_text()
    assert "every portable row (2 machines: " in page and "2 commits): the same numbers." in page
    other["rank 1"] += 0.1
    pd.concat([table, other]).to_csv(out / "machines.csv", index=False)
    machines.main([str(tmp_path / "a"), "--out", str(out)])  # A again: the CSV rows stay
    assert "the numbers differ between commits" in (out / "machines.md").read_text()
