"""analysis/spread.py: a tiny recipe's seed spread and the effect beside it, from hand-written run
records that differ in a config key (the learning rate) and in the seed."""

from __future__ import annotations

import math
import statistics
from pathlib import Path

import pytest

from analysis import spread
from tests.analysis_fixture import MACHINE_A, epoch_row, provenance, write_record

# final accuracy by (lr, method, seed)
FINALS = {(0.1, "rank4", 0): 30.0, (0.1, "rank4", 1): 60.0, (0.1, "rank4", 2): 45.0,
          (0.1, "rank1", 0): 25.0, (0.1, "rank1", 1): 27.0, (0.1, "rank1", 2): 26.0,
          (0.02, "rank4", 0): 85.0, (0.02, "rank4", 1): 87.0, (0.02, "rank4", 2): 86.0,
          (0.02, "rank1", 0): 75.0, (0.02, "rank1", 1): 74.0, (0.02, "rank1", 2): 76.5,
          (0.005, "rank4", 0): 80.0, (0.005, "rank1", 0): 70.0}


def _runs(root: Path) -> Path:
    for (lr, method, seed), final in FINALS.items():
        write_record(root, f"lr{lr}-{method}-{seed}",
                     {"sweep": "table1", "method": method, "seed": seed,
                      "optimizer": {"lr": lr}, "model": {"name": "vgg19bn"}},
                     [epoch_row(0, 10.0), epoch_row(1, final)], provenance=provenance(MACHINE_A))
    # an earlier run of the same cell and seed (directory order: kept is the later one) and a
    # failed one: neither counts
    write_record(root, "a-early", {"sweep": "table1", "method": "rank4", "seed": 0,
                 "optimizer": {"lr": 0.02}, "model": {"name": "vgg19bn"}},
                 [epoch_row(0, 99.0)], provenance=provenance(MACHINE_A))
    write_record(root, "z-failed", {"sweep": "table1", "method": "rank4", "seed": 3,
                 "optimizer": {"lr": 0.02}, "model": {"name": "vgg19bn"}},
                 [epoch_row(0, 99.0)], status="failed", provenance=provenance(MACHINE_A))
    return root


def test_cells_split_by_the_key_and_their_spread_is_over_seeds(tmp_path):
    runs = spread.complete_runs(_runs(tmp_path), ["optimizer.lr"])
    table = spread.spread_table(runs, ["optimizer.lr"]).set_index(["optimizer.lr", "method"])
    assert len(table) == 6
    for (lr, method), row in table.drop(index=0.005).iterrows():
        finals = [FINALS[(lr, method, s)] for s in range(3)]
        assert row["seeds"] == "0 1 2" and row["n"] == 3
        assert row["mean"] == pytest.approx(statistics.mean(finals))
        assert row["std"] == pytest.approx(statistics.stdev(finals))
        assert (row["min"], row["max"]) == (min(finals), max(finals))
        assert row["machines"] == MACHINE_A["fingerprint"]


def test_the_effect_is_paired_over_seeds_and_set_against_the_spread(tmp_path):
    runs = spread.complete_runs(_runs(tmp_path), ["optimizer.lr"])
    table = spread.effect_table(runs, ["optimizer.lr"], "rank4", "rank1")
    table = table.set_index("optimizer.lr")
    for lr in (0.1, 0.02):
        diffs = [FINALS[(lr, "rank4", s)] - FINALS[(lr, "rank1", s)] for s in range(3)]
        half = 4.302653 * statistics.stdev(diffs) / math.sqrt(3)  # t(0.975, 2)
        row = table.loc[lr]
        assert row["effect"] == pytest.approx(statistics.mean(diffs))
        assert (row["low"], row["high"]) == pytest.approx(
            (statistics.mean(diffs) - half, statistics.mean(diffs) + half), rel=1e-5)
        worst = max(statistics.stdev([FINALS[(lr, m, s)] for s in range(3)])
                    for m in ("rank4", "rank1"))
        assert row["effect / spread"] == pytest.approx(abs(statistics.mean(diffs)) / worst)
    assert table.loc[0.02, "effect / spread"] > 5 > table.loc[0.1, "effect / spread"]


def test_the_command_writes_markdown_and_refuses_an_unknown_key(tmp_path, capsys):
    out = tmp_path / "spread.md"
    runs = str(_runs(tmp_path / "runs"))
    assert spread.main([runs, "--by", "optimizer.lr", "--compare", "rank4", "rank1",
                        "--out", str(out)]) == 0
    text = out.read_text()
    assert text.startswith("Command: `python -m analysis.spread ")
    assert "| 0.02 | vgg19bn | rank4 | ours | 0 1 2 | 3 | 86.00 | 1.00 |" in text
    assert "Effect rank4 - rank1" in text
    # a setting is shown as given, not rounded like a measurement (0.005 is not 0.01)
    assert "| 0.005 | vgg19bn | rank1 | ours | 0 | 1 | 70.00 | nan |" in text
    assert "| 0.005 | vgg19bn | ours | 1 | 10.00 |" in text
    assert spread.main([runs, "--by", "optimizer.momentum"]) == 2
    assert "--by: no run's config has optimizer.momentum" in capsys.readouterr().err
    (tmp_path / "empty").mkdir()
    for where, says in [("empty", "no complete run below"), ("missing", "is not a directory")]:
        assert spread.main([str(tmp_path / where)]) == 2
        assert says in capsys.readouterr().err
