"""Figures, the report CLI and the what-if over a sweep (analysis/figures.py, report.py,
whatif.sweep), on real records of tiny runs (tests/analysis_fixture.py)."""

from __future__ import annotations

import json
import re
import shutil
from pathlib import Path

import pandas as pd
import pytest

from analysis import figures, reference, tables, whatif
from analysis.load import Frames, load_records
from analysis.report import Block, data_description, main, select, to_html, with_baselines
from tests.analysis_fixture import epoch_row, read_by_hand, write_record

PNG, PDF = b"\x89PNG\r\n\x1a\n", b"%PDF"


@pytest.fixture(scope="module")
def report(analysis_runs: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """``python -m analysis.report <runs> --out <dir> --verify-wandb``, once."""
    out = tmp_path_factory.mktemp("report")
    assert main([str(analysis_runs), "--out", str(out), "--verify-wandb"]) == 0
    return out


def _hand(runs: Path, method: str, seed: int = 0) -> dict:
    return next(r for r in read_by_hand(runs)
                if r["cfg"]["method"] == method and r["cfg"]["seed"] == seed)


@pytest.mark.slow
def test_report_writes_every_file_per_sweep(report, capsys):
    assert sorted(p.name for p in report.iterdir()) == ["adacomp", "table1", "table5"]
    table1 = report / "table1"
    for name in ("report.md", "report.html", "table.csv", "table.md", "table.tex",
                 "whatif.csv", "layer_types.csv", "skipped.csv"):
        assert (table1 / name).stat().st_size > 0, name
    for name in ("curves", "levels", "ratios", "cumulative", "pareto"):
        assert (table1 / "figures" / f"{name}.png").read_bytes()[:8] == PNG
        assert (table1 / "figures" / f"{name}.pdf").read_bytes()[:4] == PDF
    assert (report / "table5" / "figures" / "batch.png").read_bytes()[:8] == PNG
    assert not (table1 / "figures" / "batch.png").exists()  # no batch-size scheduler there
    md = (table1 / "report.md").read_text()
    assert "W&B check: the offline W&B files of 3 runs agree on every value" in md
    assert "accordion_rank2_rank1" in md and "![curves](figures/curves.png)" in md
    assert re.search(r"\| resnet18 \| rank2 \| 2 \| [\d.]+ ± [\d.]+ \| .* \| 94\.49 \|", md)
    page = (table1 / "report.html").read_text()
    images = re.findall(r'<img [^>]*src="([^"]+)"', page)
    assert len(images) == 5 and all(src.startswith("data:image/png;base64,") for src in images)
    assert page.count("<table") >= 3
    ada = (report / "adacomp" / "report.md").read_text()
    assert "effective compression of the conv layers (bin 50)" in ada and "published 40x" in ada


@pytest.mark.slow
def test_report_on_a_tree_with_broken_runs_lists_them(analysis_runs, tmp_path, capsys):
    runs = tmp_path / "runs"
    shutil.copytree(analysis_runs, runs, ignore=shutil.ignore_patterns("wandb"))
    broken = sorted(p for p in runs.iterdir() if p.is_dir())
    (broken[1] / "summary.json").unlink()  # rank 2, seed 1
    (broken[2] / "metrics.jsonl").write_text('{"epoch": 0, "test/acc')  # rank 1, seed 0
    assert main([str(runs), "--out", str(tmp_path / "out"), "--sweep", "table1"]) == 0
    printed = capsys.readouterr().out
    assert "table1: 4 runs, 2 left out" in printed
    md = (tmp_path / "out" / "report.md").read_text()
    assert "## Runs left out (2)" in md and md.count("| 1 (+1 skipped) |") == 2
    assert len(pd.read_csv(tmp_path / "out" / "skipped.csv")) == 2
    for run in broken[6:8]:  # table5: every run left out, still a report
        (run / "summary.json").write_text(json.dumps({"status": "failed: SystemExit: 143"}))
    assert main([str(runs), "--out", str(tmp_path / "t5"), "--sweep", "table5"]) == 0
    assert "table5: 0 runs, 2 left out" in capsys.readouterr().out
    assert "| batch512 | 0 (+1 skipped) |" in (tmp_path / "t5" / "report.md").read_text()


def test_report_bad_input_is_one_line_and_status_2(tmp_path, capsys):
    assert main([str(tmp_path / "nowhere")]) == 2
    assert capsys.readouterr().err.strip().startswith("error: runs dir:")
    assert main([str(tmp_path)]) == 2  # no runs
    assert "no run records" in capsys.readouterr().err
    (tmp_path / "bad.csv").write_text("x\n1\n")
    assert main([str(tmp_path), "--reference", str(tmp_path / "bad.csv")]) == 2
    err = capsys.readouterr().err.strip()
    assert err.count("\n") == 0 and "bad.csv has no column(s)" in err


def test_the_report_prints_its_table_and_names_the_benchmark_its_data_stand_for(tmp_path,
                                                                               capsys):
    """make demo ends on this: the caption (benchmark cifar10, the synthetic stand-in data),
    the main columns of every row, the file with all of them."""
    for method, final in (("rank2", 80.0), ("rank1", 75.5)):
        write_record(tmp_path / "runs", method, {
            "sweep": "table1", "benchmark": "cifar10", "method": method, "baseline": "rank2",
            "model": {"name": "resnet18"}}, [epoch_row(e, final - 2 * (2 - e)) for e in range(3)])
    out = tmp_path / "out"
    assert main([str(tmp_path / "runs"), "--out", str(out)]) == 0
    printed = capsys.readouterr().out.splitlines()
    caption = ("table1: scale tiny, benchmark cifar10 (data: the synthetic stand-in), "
               "compressor powersgd; mean ± std over seeds.")
    assert printed[0].startswith("table1: 2 runs, 0 left out -> ")
    assert printed[1] == caption
    assert printed[2].split() == ["model", "method", "seeds", "final", "accuracy", "(%)",
                                  "published", "diff", "data", "sent", "(floats)", "reduction"]
    assert printed[3].split()[:4] == ["resnet18", "rank2", "1", "80.00"]
    assert printed[4].split()[:4] == ["resnet18", "rank1", "1", "75.50"]
    assert printed[5] == f"(every column: {out / 'table.md'})"
    assert (out / "table.md").read_text().startswith(caption)
    assert caption in (out / "report.html").read_text()


def test_what_the_runs_trained_on():
    runs = pd.DataFrame({"dataset.name": ["synthetic"] * 2, "benchmark": ["cifar10"] * 2})
    assert data_description(runs) == "benchmark cifar10 (data: the synthetic stand-in)"
    assert data_description(runs.assign(**{"dataset.name": "cifar10"})) == "benchmark cifar10"
    assert data_description(runs.assign(benchmark=None)) == "dataset synthetic"
    assert data_description(runs.drop(columns="benchmark")) == "dataset synthetic"
    assert data_description(runs.assign(benchmark=["cifar10", "cifar100"])) is None


def test_the_html_report_renders_code_spans():
    page = to_html([Block("h2", "What-if"), Block("p", "Files: `table.csv`, `table.md`."),
                    Block("list", items=["keeps `--include-incomplete` runs <b>"])], "t")
    assert "<p>Files: <code>table.csv</code>, <code>table.md</code>.</p>" in page
    assert "<li>keeps <code>--include-incomplete</code> runs &lt;b&gt;</li>" in page
    assert "`" not in page


# ---- each figure's data ---------------------------------------------------------------------
@pytest.fixture(scope="module")
def table1(analysis_runs: Path) -> Frames:
    return select(load_records(analysis_runs), ["table1"], None)


@pytest.mark.slow
def test_curves_data_is_the_logged_metric_and_critical_fraction(table1, analysis_runs):
    data = figures.curves_data(table1)
    assert len(data) == 18 and set(data["metric"]) == {"test/accuracy"}
    acc = _hand(analysis_runs, "accordion_rank2_rank1")
    rows = data[(data["method"] == "accordion_rank2_rank1") & (data["seed"] == 0)]
    for row in acc["rows"]:
        got = rows[rows["epoch"] == row["epoch"]].iloc[0]
        critical = [v for k, v in row.items() if k.startswith("critical/")]
        assert got["value"] == row["test/accuracy"]
        assert got["critical"] == pytest.approx(sum(critical) / len(critical))
    assert data[data["method"] == "rank2"]["critical"].isna().all()


@pytest.mark.slow
def test_levels_and_ratios_data_are_the_logged_per_layer_values(table1, analysis_runs):
    acc = _hand(analysis_runs, "accordion_rank2_rank1")
    levels = figures.levels_data(table1)
    assert set(levels["method"]) == {"accordion_rank2_rank1"}  # first seed, Accordion only
    layers = [k.removeprefix("level/") for k in acc["rows"][0] if k.startswith("level/")]
    assert len(levels) == 3 * len(layers)
    for _, point in levels.sample(10, random_state=0).iterrows():
        assert point["level"] == acc["rows"][point["epoch"]][f"level/{point['layer']}"]
    assert set(levels[levels["epoch"] < 2]["level"]) == {2}  # epochs 0..interval critical

    ratios = figures.ratios_data(table1)
    logged = [(r["epoch"], k.removeprefix("ratio/"), v) for h in (acc, _hand(
        analysis_runs, "accordion_rank2_rank1", 1)) for r in h["rows"] for k, v in r.items()
        if k.startswith("ratio/")]
    assert len(ratios) == len(logged) and set(ratios["epoch"]) == {1, 2}
    assert (ratios["eta"] == 0.5).all()
    assert (ratios["critical"] == (ratios["ratio"] >= 0.5)).all()
    # the ratio at epoch 1 decides epoch 2's level: critical <-> rank 2
    first = ratios[(ratios["seed"] == 0) & (ratios["epoch"] == 1)].set_index("layer")
    for layer in layers:
        level = acc["rows"][2][f"level/{layer}"]
        assert level == (2 if first.at[layer, "critical"] else 1), layer


@pytest.mark.slow
def test_data_volume_figures(table1, analysis_runs):
    cumulative = figures.cumulative_data(table1)
    pareto = figures.pareto_data(table1)
    assert len(cumulative) == 18 and len(pareto) == 6
    for record in read_by_hand(analysis_runs):
        if record["cfg"]["sweep"] != "table1":
            continue
        run_id = str(record["dir"].relative_to(analysis_runs))
        total = sum(r["comm/bits"] for r in record["rows"]) / 32
        last = cumulative[cumulative["run_id"] == run_id].sort_values("epoch").iloc[-1]
        assert last["floats"] == pytest.approx(total)
        point = pareto.set_index("run_id").loc[run_id]
        assert point["floats"] == pytest.approx(total)
        assert point["final"] == record["rows"][-1]["test/accuracy"]


@pytest.mark.slow
def test_batch_data_follows_the_batch_scheduler(analysis_runs):
    table5 = select(load_records(analysis_runs), ["table5"], None)
    data = figures.batch_data(table5)
    acc = _hand(analysis_runs, "accordion_batch512_batch4096")
    got = data[data["method"] == "accordion_batch512_batch4096"].sort_values("epoch")
    assert got["batch_size"].tolist() == [r["batch_size"] for r in acc["rows"]]
    assert got["lr"].tolist() == [r["lr"] for r in acc["rows"]]
    assert set(data[data["method"] == "batch512"]["batch_size"]) == {32}
    assert figures.batch_data(select(load_records(analysis_runs), ["table1"], None)).empty


@pytest.mark.slow
def test_official_data_joins_the_authors_curve_at_paper_scale(table1, tmp_path):
    official = reference.load_curves()
    assert figures.official_data(table1, official).empty  # tiny runs: no authors' curve
    runs = table1.runs.assign(scale="paper", **{"dataset.name": "cifar10"})
    data = figures.official_data(Frames(runs, table1.epochs, table1.problems), official)
    theirs = data[data["who"] == "authors' log"]
    assert set(data["panel"]) == {"resnet18 rank2", "resnet18 rank1",
                                  "resnet18 accordion_rank2_rank1"}
    assert len(theirs) == 3 * 300 and len(data) - len(theirs) == 18
    curve = official[(official["setting"] == "rank2") & (official["table"] == "1")
                     & (official["model"] == "resnet18")]
    assert theirs[theirs["panel"] == "resnet18 rank2"]["value"].iloc[-1] == \
        curve["value"].iloc[-1] == 94.49
    fig = figures.plot_official(data, figures.looks(runs))
    assert len(fig.axes) == 3


# ---- what-if over the sweep -----------------------------------------------------------------
@pytest.mark.slow
def test_whatif_over_a_sweep(table1):
    dirs = [Path(p) for p in table1.runs["path"]]
    rows = pd.DataFrame(whatif.sweep(dirs, etas=[0.3, 0.5], intervals=[1, 2]))
    assert len(rows) == 2 * 2 * 2  # the two Accordion runs; static runs are skipped
    own = rows[rows["own"]]
    assert len(own) == 2 and (own["replay_over_logged"] == 1.0).all()
    assert (own["critical_replay"] == own["critical_logged"]).all()
    # interval 2 keeps epochs 0..2 critical: rank 2 throughout, more data than logged
    longer = rows[rows["interval"] == 2]
    assert (longer["critical_replay"] == 1.0).all() and (longer["replay_over_logged"] > 1).all()
    one = rows.iloc[0]
    cfg, logged = whatif.load_run(Path(one["run_dir"]))
    epochs = whatif.whatif(Path(one["run_dir"]), cfg, logged, one["eta"], int(one["interval"]))
    assert one["bits_replay"] == pytest.approx(sum(e.bits_replay for e in epochs))


@pytest.mark.slow
def test_a_baseline_from_another_sweep_joins_the_report(analysis_runs):
    """fig10's Accordion batch run against table5's batch-512 run (relabelled fixture runs)."""
    loaded = load_records(analysis_runs)
    runs = loaded.runs.copy()
    moved = runs["method"] == "accordion_batch512_batch4096"
    runs.loc[moved, ["sweep", "method"]] = ["fig10", "accordion_batch512_batch16384"]
    part = with_baselines(Frames(runs, loaded.epochs, loaded.problems), "fig10")
    assert sorted(part.runs["method"]) == ["accordion_batch512_batch16384", "batch512"]
    table = tables.group_table(tables.run_stats(part), part.problems)
    joined, unmatched = reference.attach_published(table, reference.load_reference())
    row = joined.set_index("method").loc["accordion_batch512_batch16384"]
    base = _hand(analysis_runs, "batch512")
    acc = _hand(analysis_runs, "accordion_batch512_batch4096")
    assert row["baseline_used"] == "batch512 (table5)"
    assert row["published"] == 1.6 and row["published_metric"] == "accuracy_gap_vs_batch512"
    assert row["ours"] == pytest.approx(base["rows"][-1]["test/accuracy"]
                                        - acc["rows"][-1]["test/accuracy"])
    assert row["reduction_x"] == pytest.approx(sum(r["comm/bits"] for r in base["rows"])
                                               / sum(r["comm/bits"] for r in acc["rows"]))
    assert "accuracy_gap_vs_batch512" not in set(unmatched["metric"])
