"""Provenance in the analysis (analysis/provenance.py): which machines and commits each table
cell aggregated, and the warnings when a cell mixes them or a run moved between starts; the same
from run records and from W&B configs. Hand-written run records (tests/analysis_fixture.py)."""

from __future__ import annotations

from pathlib import Path

import pandas as pd
from omegaconf import OmegaConf

from analysis import tables
from analysis.load import frames, load_records
from analysis.provenance import STARTS
from analysis.wandb_runs import WandbRun, compare, start, to_run_data
from core.record import flatten
from tests.analysis_fixture import (
    COMMIT_2,
    MACHINE_A,
    MACHINE_B,
    epoch_row,
    provenance,
    write_record,
)

T1 = {"sweep": "table1", "baseline": "rank2"}
ROWS = [epoch_row(e, 60.0 + e) for e in range(2)]


def _write(root: Path, name: str, method: str, seed: int, prov: dict | None,
           starts: list[dict] | None = None) -> Path:
    """A run of table1; its summary's provenance as core/record.py writes it: the last start
    (with its ``epoch``) and every start."""
    starts = starts or ([{**prov, "epoch": 0}] if prov else [])
    extra = {"provenance": starts[-1], "starts": starts} if starts else {}
    return write_record(root, name, {**T1, "method": method, "seed": seed}, ROWS, **extra)


def _table(root: Path) -> pd.DataFrame:
    loaded = load_records(root)
    return tables.group_table(tables.run_stats(loaded), loaded.problems).set_index("method")


def test_each_cell_names_its_machines_and_commits_and_warns_when_it_mixes_them(tmp_path):
    a, b = provenance(MACHINE_A), provenance(MACHINE_B)
    _write(tmp_path, "r2s0", "rank2", 0, a)
    _write(tmp_path, "r2s1", "rank2", 1, a)
    _write(tmp_path, "r1s0", "rank1", 0, a)
    _write(tmp_path, "r1s1", "rank1", 1, b)                           # another machine
    _write(tmp_path, "accs0", "accordion_rank2_rank1", 0, a)
    _write(tmp_path, "accs1", "accordion_rank2_rank1", 1, provenance(MACHINE_A, COMMIT_2))
    _write(tmp_path, "r4s0", "rank4", 0, a)
    _write(tmp_path, "r4s1", "rank4", 1, provenance(MACHINE_A, dirty=True))  # uncommitted diff
    _write(tmp_path, "old0", "rank8", 0, None)                        # before provenance
    table = _table(tmp_path)
    same = table.loc["rank2"]
    assert (same["fingerprints"], same["commits"], same["provenance_warning"]) == \
        ("a1b2c3d4e5f6", "111111111111", "")
    assert same["machines"] == "a1b2c3d4e5f6: Intel Xeon (AVX512) x2, cpu"
    assert table.loc["rank1", "fingerprints"] == "0f1e2d3c4b5a, a1b2c3d4e5f6"
    assert table.loc["rank1", "provenance_warning"] == "mixes 2 machines"
    assert table.loc["accordion_rank2_rank1", "commits"] == "111111111111, 222222222222"
    assert table.loc["accordion_rank2_rank1", "provenance_warning"] == "mixes 2 commits"
    assert table.loc["rank4", "commits"] == "111111111111, 111111111111+dirty d1ffd1ff"
    assert table.loc["rank4", "provenance_warning"] == "mixes 2 commits"
    assert (table.loc["rank8", "fingerprints"], table.loc["rank8", "commits"]) == \
        ("unknown", "unknown")
    shown = tables.display(table.reset_index()).set_index("method")
    assert shown.loc["rank1", "warning"] == "mixes 2 machines"
    assert shown.loc["rank2", "warning"] == "" and shown.loc["rank2", "machines"] == "a1b2c3d4e5f6"
    assert "0f1e2d3c4b5a: AMD EPYC (AVX2) x2, cpu" in tables.machine_legend(table)


def test_a_run_resumed_on_another_machine_or_commit_warns_in_its_cell(tmp_path):
    a = provenance(MACHINE_A)
    _write(tmp_path, "s0", "rank2", 0, a)
    _write(tmp_path, "s1", "rank2", 1, a, [{**a, "epoch": 0}, {**a, "epoch": 1}])  # same: fine
    assert _table(tmp_path).loc["rank2", "provenance_warning"] == ""
    moved = provenance(MACHINE_B, COMMIT_2)
    _write(tmp_path, "s2", "rank2", 2, moved, [{**a, "epoch": 0}, {**moved, "epoch": 1}])
    cell = _table(tmp_path).loc["rank2"]
    assert cell["provenance_warning"] == \
        "mixes 2 machines; mixes 2 commits; seed 2 resumed on another machine and commit at epoch 1"


def test_wandb_configs_give_the_same_provenance_as_the_records(tmp_path):
    prov = provenance(MACHINE_B, dirty=True)
    run_dir = _write(tmp_path, "s0", "rank1", 0, prov)
    records = load_records(tmp_path)
    assert records.runs.iloc[0]["provenance.numerics.mode"] == "portable"
    assert records.runs.iloc[0]["provenance.cpu.flags"] == ("avx", "avx2")
    config = OmegaConf.to_container(OmegaConf.load(run_dir / ".hydra/config.yaml"))
    history = pd.DataFrame([{"_step": r["epoch"], **r} for r in ROWS])
    for logged in (flatten({**config, "provenance": prov}),    # run.py: the flattened config
                   {**config, "provenance": prov}):           # a nested config works the same
        run = WandbRun("s0", "team/p/s0", logged, history, "finished")
        wandb = frames([to_run_data(run)])
        wandb.runs["run_id"] = wandb.epochs["run_id"] = "s0"
        assert compare(records, wandb).empty
        assert not any(c.startswith("provenance") for c in to_run_data(run).config)
        assert wandb.runs.iloc[0][STARTS] == records.runs.iloc[0][STARTS] == \
            (("0f1e2d3c4b5a", "111111111111+dirty d1ffd1ff", 0),)
    # a W&B run without provenance (logged before it existed): the differences, not a crash
    bare = frames([to_run_data(WandbRun("s0", "p", flatten(config), history, "finished"))])
    bare.runs["run_id"] = bare.epochs["run_id"] = "s0"
    diffs = compare(records, bare).set_index("what")
    assert diffs.at["provenance.fingerprint", "b"] == "unknown"
    assert diffs.at["provenance.cpu.isa", "a"] == "AVX2"
    assert pd.isna(diffs.at["provenance.cpu.isa", "b"])
    # a resumed run's W&B files: one start each, dated by the first epoch it logged
    first = WandbRun("a", "p", flatten({**config, "provenance": provenance(MACHINE_A)}),
                     history.iloc[:1], "failed")
    second = WandbRun("b", "p", flatten({**config, "provenance": prov}), history.iloc[1:],
                      "finished")
    joined = WandbRun("s0", "p", second.config, history, "finished", 1.0,
                      [start(first), start(second)])
    cell = tables.group_table(tables.run_stats(frames([to_run_data(joined)])))
    assert cell.iloc[0]["provenance_warning"] == \
        "seed 0 resumed on another machine and commit at epoch 1"
