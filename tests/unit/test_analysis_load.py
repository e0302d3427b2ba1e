"""Loading run records and W&B runs into the ``runs`` / ``epochs`` frames (analysis/load.py,
analysis/wandb_runs.py), on real records of tiny runs (tests/analysis_fixture.py)."""

from __future__ import annotations

import json
import math
import shutil
from pathlib import Path

import pandas as pd
import pytest
from omegaconf import OmegaConf

from analysis import tables
from analysis.load import frames, load_records
from analysis.wandb_runs import (
    WandbRun,
    compare,
    load_wandb_files,
    read_wandb_file,
    to_run_data,
    wandb_files,
)
from core.record import flatten
from tests.analysis_fixture import epoch_row, read_by_hand, write_record


def _ids(runs: Path, records: list[dict]) -> dict[str, dict]:
    return {str(r["dir"].relative_to(runs)): r for r in records}


@pytest.mark.slow
def test_records_give_one_row_per_run_and_epoch(analysis_runs):
    loaded = load_records(analysis_runs)
    by_hand = _ids(analysis_runs, read_by_hand(analysis_runs))
    assert loaded.problems.empty
    assert set(loaded.runs["run_id"]) == set(by_hand) and len(by_hand) == 10
    assert len(loaded.epochs) == 30
    for _, run in loaded.runs.iterrows():
        record = by_hand[run["run_id"]]
        cfg, rows = record["cfg"], record["rows"]
        assert (run["sweep"], run["method"], run["seed"], run["model.name"],
                run["compressor.name"]) == (cfg["sweep"], cfg["method"], cfg["seed"],
                                            cfg["model"]["name"], cfg["compressor"]["name"])
        assert run["model.num_classes"] == 10  # interpolations resolved
        assert run["final"] == rows[-1]["test/accuracy"] == record["summary"]["final"]
        assert run["total_bits"] == sum(r["comm/bits"] for r in rows)
        epochs = loaded.epochs[loaded.epochs["run_id"] == run["run_id"]].set_index("epoch")
        for row in rows:
            for key, value in row.items():
                if key != "epoch":
                    assert epochs.at[row["epoch"], key] == float(value), key
        logged = {k for r in rows for k in r} - {"epoch"} | {"run_id"}
        assert {c for c in epochs.columns if epochs[c].notna().any()} == logged


def _corrupt(analysis_runs: Path, tmp_path: Path) -> tuple[Path, dict[str, str]]:
    """A copy of the fixture's runs with one problem per run dir named in the result."""
    runs = tmp_path / "runs"
    shutil.copytree(analysis_runs, runs, ignore=shutil.ignore_patterns("checkpoint.pt", "wandb"))
    dirs = sorted(p for p in runs.iterdir() if p.is_dir())
    truncated, no_summary, failed, no_config, empty, garbled = dirs[:6]
    text = (truncated / "metrics.jsonl").read_text()
    (truncated / "metrics.jsonl").write_text(text[:-40])  # cut inside the last row
    (no_summary / "summary.json").unlink()
    summary = json.loads((failed / "summary.json").read_text())
    (failed / "summary.json").write_text(json.dumps({**summary, "status": "failed: RuntimeError"}))
    (no_config / ".hydra" / "config.yaml").unlink()
    (empty / "metrics.jsonl").write_text("")
    (garbled / "summary.json").write_text("{not json")
    shutil.copytree(dirs[6], runs / "zz_copy")  # the same run twice: the later copy is kept
    reasons = {truncated.name: "metrics.jsonl line 3 is not JSON (truncated?)",
               no_summary.name: "no summary.json (still running, or killed before the end)",
               failed.name: "status failed: RuntimeError",
               no_config.name: "no .hydra/config.yaml",
               empty.name: "metrics.jsonl is empty",
               garbled.name: "unreadable summary.json",
               dirs[6].name: "duplicate: same identity and seed as zz_copy (kept)"}
    return runs, reasons


@pytest.mark.slow
def test_corrupt_and_incomplete_runs_are_counted_and_left_out(analysis_runs, tmp_path):
    runs, reasons = _corrupt(analysis_runs, tmp_path)
    loaded = load_records(runs)
    got = dict(zip(loaded.problems["run_id"], loaded.problems["reason"], strict=True))
    assert set(got) == set(reasons)
    for run_id, reason in reasons.items():
        assert got[run_id].startswith(reason), (run_id, got[run_id])
    assert len(loaded.runs) == 11 - len(reasons)
    assert not set(loaded.runs["run_id"]) & set(reasons)
    assert set(loaded.epochs["run_id"]) == set(loaded.runs["run_id"])
    # the tables count them per group (all but the config-less one have an identity)
    table = tables.group_table(tables.run_stats(loaded), loaded.problems)
    assert table["skipped"].sum() == len(reasons) - 1
    assert table["seeds"].sum() == len(loaded.runs)

    kept = load_records(runs, include_incomplete=True)
    assert len(kept.problems) == len(reasons)
    readable = set(reasons) - {[k for k, v in reasons.items() if v.startswith("no .hydra")][0]}
    assert set(kept.runs["run_id"]) == set(loaded.runs["run_id"]) | readable
    truncated = kept.runs.set_index("run_id").loc[
        [k for k, v in reasons.items() if "truncated" in v][0]]
    assert truncated["epochs_completed"] == 2 and truncated["problem"].startswith("metrics")


@pytest.mark.slow
def test_offline_wandb_files_agree_with_the_records(analysis_runs):
    records = load_records(analysis_runs)
    files = load_wandb_files(analysis_runs)
    assert len(files.runs) == 3  # table1, seed 0: the runs that logged to W&B
    assert set(files.runs["method"]) == {"rank2", "rank1", "accordion_rank2_rank1"}
    assert (files.problems["reason"] == "no offline W&B run (logger=none?)").sum() == 7
    ids = set(files.runs["run_id"])
    assert compare(records.only(ids), files.only(ids)).empty
    assert len(files.epochs) == 9
    assert set(files.epochs.dropna(axis=1, how="all").columns) == \
        set(records.only(ids).epochs.dropna(axis=1, how="all").columns)
    # the comparison can fail: one value changed is one difference
    changed = files.only(ids)
    changed.epochs = changed.epochs.copy()
    changed.epochs.loc[changed.epochs.index[4], "test/loss"] += 1e-9
    diffs = compare(records.only(ids), changed)
    assert len(diffs) == 1 and diffs.iloc[0]["what"].endswith("test/loss")
    # and a run missing on one side is one difference
    assert len(compare(records.only(ids), files.only(sorted(ids)[:2]))) == 1


def _history_frame(rows: list[dict]) -> pd.DataFrame:
    """What ``wandb.Api().run(...).history(pandas=True)`` returns for a run that logged ``rows``
    with ``step=epoch``: the system columns, NaN where a step did not log a key."""
    frame = pd.DataFrame([{"_step": r["epoch"], "_runtime": 1.5 * r["epoch"],
                           "_timestamp": 1.7e9 + r["epoch"], **r} for r in rows])
    return frame[sorted(frame.columns, reverse=True)]  # W&B orders columns its own way


@pytest.mark.slow
def test_a_wandb_history_frame_converts_to_the_same_frames(analysis_runs):
    records = load_records(analysis_runs)
    record = next(r for r in read_by_hand(analysis_runs)  # ratio/* only on check epochs
                  if r["cfg"]["method"] == "accordion_rank2_rank1")
    run_id = str(record["dir"].relative_to(analysis_runs))
    assert any("ratio/conv1.weight" not in r for r in record["rows"])
    resolved = OmegaConf.to_container(OmegaConf.load(record["dir"] / ".hydra/config.yaml"),
                                      resolve=True)
    start = {k: v for k, v in record["summary"]["provenance"].items() if k != "epoch"}
    config = {"_wandb": {"runtime": 3},  # what run.py gives wandb.init
              **flatten({**resolved, "provenance": start})}
    run = WandbRun("abc123", "team/project/abc123", config, _history_frame(record["rows"]),
                   "finished", 7.0)
    converted = frames([to_run_data(run)])
    converted.runs["run_id"] = converted.epochs["run_id"] = run_id
    assert compare(records.only([run_id]), converted).empty
    assert converted.runs.iloc[0]["total_time_s"] == 7.0

    diverged = _history_frame([*record["rows"][:2], {**record["rows"][2],
                                                     "train/loss": math.nan}])
    data = to_run_data(WandbRun("x", "p", config, diverged, "failed"))
    assert data.summary["status"] == "diverged" and data.problem == "status diverged"
    crashed = to_run_data(WandbRun("x", "p", config, _history_frame(record["rows"][:1]),
                                   "crashed"))
    assert crashed.problem == "status failed: W&B crashed" and crashed.summary["final"] == \
        record["rows"][0]["test/accuracy"]


@pytest.mark.slow
def test_wandb_file_reader_checks_its_input(analysis_runs, tmp_path):
    path = wandb_files(next(d for d in sorted(analysis_runs.iterdir()) if wandb_files(d)))[0]
    records = list(read_wandb_file(path))
    kinds = [r.WhichOneof("record_type") for r in records]
    assert kinds.count("history") == 3 and kinds.count("run") == 1 and "exit" in kinds
    data = bytearray(path.read_bytes())
    cut = tmp_path / "cut.wandb"
    cut.write_bytes(bytes(data[:len(data) // 2]))  # a writer killed halfway: what is there
    assert 0 < len(list(read_wandb_file(cut))) < len(records)
    flipped = tmp_path / "flipped.wandb"
    data[200] ^= 0xFF
    flipped.write_bytes(bytes(data))
    with pytest.raises(ValueError, match="checksum"):
        list(read_wandb_file(flipped))
    (tmp_path / "header.wandb").write_bytes(b"not a wandb file")
    with pytest.raises(ValueError, match="header"):
        list(read_wandb_file(tmp_path / "header.wandb"))


# ---- diverged and incomplete runs, local and W&B alike (hand-written records) ---------------
T1 = {"sweep": "table1", "baseline": "rank2"}


def _diverged_tree(root: Path) -> list[dict]:
    """rank2 seeds 0, 1 completed; seed 2 diverged in its last epoch (train/loss NaN); the rows
    of the diverged run."""
    for seed in (0, 1):
        write_record(root, f"ok{seed}", {**T1, "method": "rank2", "seed": seed},
                     [epoch_row(e, 50.0 + 10 * e + seed) for e in range(3)])
    rows = [epoch_row(0, 40.0), epoch_row(1, 30.0, loss=math.nan)]
    write_record(root, "div", {**T1, "method": "rank2", "seed": 2}, rows, "diverged",
                 reason="train/loss is nan in epoch 1")
    return rows


def test_a_diverged_run_is_never_averaged_as_completed_locally_or_from_wandb(tmp_path):
    rows = _diverged_tree(tmp_path)
    local = load_records(tmp_path)
    assert set(local.runs["run_id"]) == {"ok0", "ok1"}
    assert dict(zip(local.problems["run_id"], local.problems["reason"], strict=True)) == \
        {"div": "status diverged"}
    row = tables.group_table(tables.run_stats(local), local.problems).iloc[0]
    assert (row["seeds"], row["skipped"], row["seed_list"]) == (2, 1, "0 1")
    assert row["final_mean"] == pytest.approx(70.5)  # 70 and 71: the diverged 30 not in it
    # W&B (the run's history and a failed state) gives the same problem and the same table
    config = OmegaConf.to_container(OmegaConf.load(tmp_path / "div/.hydra/config.yaml"))
    wandb = frames([to_run_data(WandbRun("div", "p", config, _history_frame(rows), "failed"))])
    assert wandb.problems["reason"].tolist() == ["status diverged"] and wandb.runs.empty
    # --include-incomplete keeps it in both, marked, and the table says so
    for kept in (load_records(tmp_path, include_incomplete=True),
                 frames([to_run_data(WandbRun("div", "p", config, _history_frame(rows),
                                              "failed"))], include_incomplete=True)):
        div = kept.runs.set_index("run_id").loc["div"]
        assert (div["status"], div["problem"], div["final"]) == ("diverged", "status diverged",
                                                                  30.0)
    kept = load_records(tmp_path, include_incomplete=True)
    table = tables.group_table(tables.run_stats(kept), kept.problems)
    assert (table.iloc[0]["seeds"], table.iloc[0]["incomplete"], table.iloc[0]["skipped"]) == \
        (3, 1, 0)
    assert tables.display(table).iloc[0]["seeds"] == "3 (1 incomplete)"


def test_seeds_count_only_runs_with_a_final_metric(tmp_path):
    _diverged_tree(tmp_path)
    killed = write_record(tmp_path, "killed", {**T1, "method": "rank2", "seed": 3}, [])
    (killed / "summary.json").unlink()  # killed in its first epoch: no row, no summary
    kept = load_records(tmp_path, include_incomplete=True)
    assert "killed" in set(kept.runs["run_id"])  # kept (its config reads), with no final
    row = tables.group_table(tables.run_stats(kept), kept.problems).iloc[0]
    assert (row["seeds"], row["seed_list"], row["incomplete"]) == (3, "0 1 2", 1)
