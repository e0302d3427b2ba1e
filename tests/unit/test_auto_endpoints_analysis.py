"""analysis/auto_endpoints.py on real run records: eight short runs of `run.py` (2 simulated
learners each) standing in for two cases of conf/sweep/auto_endpoints.yaml, read back by hand."""

from __future__ import annotations

import json
import math
import statistics
from pathlib import Path

import pandas as pd
import pytest
from scipy import stats as scipy_stats

from analysis import auto_endpoints, provenance
from analysis.claims import load_sweep
from tests.conftest import run_options
from tests.figure_checks import problems

pytestmark = pytest.mark.slow

GROUP = "auto_fixture"
COMMON = ["model.width=8", "dataset.subset=64", "dataset.test_subset=64", "trainer.batch_size=32",
          "trainer.epochs=3", "trainer.progress=false", "trainer.device=cpu", "launcher=simulated",
          "trainer.workers=2"]
POWERSGD = ("override /compressor: powersgd",)
# (method, baseline, seeds, defaults, config lines)
RUNS = [
    ("rank2", "rank2", (0, 1), POWERSGD, ["compressor:", "  rank: 2"]),
    ("accordion_rank2_rank1", "rank2", (0, 1), (*POWERSGD, "override /scheduler: accordion"),
     ["compressor:", "  rank: 2", "scheduler:", "  low: 2", "  high: 1", "  interval: 1"]),
    ("auto_rank", "rank2", (0, 1), (*POWERSGD, "override /scheduler: accordion_auto"),
     ["compressor:", "  rank: 4", "scheduler:", "  levels: [4, 2, 1]", "  interval: 1",
      "  probe_steps: 1"]),
    ("batch512", "batch512", (0,), (), []),  # trainer.batch_size 32 (COMMON)
    ("auto_batch", "batch512", (0,), ("override /scheduler: accordion_batch_auto",),
     ["scheduler:", "  batch_low: 32", "  batches: [32, 64]", "  interval: 1",
      "  probe_steps: 1"]),
]
# Runs of sweep fig9, seed 0: rank1 (ours) is one the analysis shares (SHARED, as the real fig9
# runs are); the authors' Accordion (a shared method, not the shared variant) and rank2 (not a
# shared method) are not. (method, variant, defaults, config lines)
ACCORDION = ["scheduler:", "  low: 2", "  high: 1", "  interval: 1"]
OTHER_SWEEP = [
    ("rank1", "ours", POWERSGD, ["compressor:", "  rank: 1"]),
    ("accordion_rank2_rank1", "authors", ("override /compressor: powersgd_authors",
                                          "override /scheduler: accordion"),
     ["compressor:", "  rank: 2", *ACCORDION, "variants: [ours, authors]"]),
    ("rank2", "ours", POWERSGD, ["compressor:", "  rank: 2"]),
]
SHARED = {"fig9": ("rank1", "accordion_rank2_rank1")}


@pytest.fixture(scope="module")
def runs(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("auto")
    conf = root / "conf" / GROUP
    conf.mkdir(parents=True)
    options = []
    for i, (method, baseline, seeds, defaults, lines) in enumerate(RUNS):
        for seed in seeds:
            options.append(f"g{i}_s{seed}")
            text = ["# @package _global_", "defaults:", *(f"  - {d}" for d in defaults),
                    "  - override /logger: none", "sweep: auto_endpoints", "scale: tiny",
                    "benchmark: cifar10", f"method: {method}", "variant: ours",
                    f"baseline: {baseline}", f"seed: {seed}", *lines]
            (conf / f"{options[-1]}.yaml").write_text("\n".join(text) + "\n")
    for i, (method, variant, defaults, lines) in enumerate(OTHER_SWEEP):
        options.append(f"fig9_{i}")
        text = ["# @package _global_", "defaults:", *(f"  - {d}" for d in defaults),
                "  - override /logger: none", "sweep: fig9", "scale: tiny",
                "benchmark: cifar10", f"method: {method}", f"variant: {variant}",
                "baseline: rank2", "seed: 0", *lines]
        (conf / f"{options[-1]}.yaml").write_text("\n".join(text) + "\n")
    return run_options(root / "conf", GROUP, options, COMMON, root / "runs")


def by_hand(runs: Path, sweep: str = "auto_endpoints", variant: str | None = None
            ) -> dict[tuple[str, int], dict]:
    """(method, seed) -> final accuracy, bits with the probe's, rows: read with plain json, of
    the runs of ``sweep`` (and ``variant``, if given)."""
    out = {}
    for metrics in runs.glob("*/metrics.jsonl"):
        rows = [json.loads(line) for line in metrics.read_text().splitlines()]
        cfg = (metrics.parent / ".hydra" / "config.yaml").read_text()

        def value(key: str, cfg: str = cfg) -> str:
            return next(line.split(": ")[1] for line in cfg.splitlines()
                        if line.startswith(f"{key}: "))

        if value("sweep") != sweep or variant is not None and value("variant") != variant:
            continue
        method, seed = value("method"), int(value("seed"))
        bits = sum(r["comm/bits"] + r.get("auto/probe_bits/model", 0.0) for r in rows)
        out[(method, seed)] = {"final": rows[-1]["test/accuracy"], "bits": bits, "rows": rows,
                               "dir": metrics.parent}
    return out


def test_table_verdict_and_figures(runs, tmp_path):
    hand = by_hand(runs)
    frames = load_sweep(runs, "auto_endpoints", "tiny", keep=auto_endpoints.KEPT)
    written = auto_endpoints.write(frames, tmp_path)
    names = {p.name for p in written}
    assert {"table.md", "table.csv", "verdict.md", "verdict.csv", "goal.md", "goal.csv",
            "goal_summary.md",
            "skipped.csv", "metric_vs_bits.png", "measurements.png"} <= names
    table = auto_endpoints.group_table(auto_endpoints.per_run(frames)).set_index("method")
    summary = json.loads((hand[("auto_rank", 0)]["dir"] / "summary.json").read_text())
    made_by = summary["provenance"]  # every row names the machine and commit of its runs
    assert set(table["fingerprints"]) == {made_by["fingerprint"]}
    git = made_by["git"]
    assert set(table["commits"]) == {provenance.code(git["commit"], git["dirty"],
                                                     git["diff_sha256"])}
    assert made_by["fingerprint"] in (tmp_path / "table.md").read_text()
    goal = (tmp_path / "goal.md").read_text()  # one hand-picked pair, auto_rank against it
    assert goal.count("| auto_rank |") == 1 and goal.endswith(" checks (95% Welch intervals "
                                                              "over seeds; seed spread: the "
                                                              "hand-picked pair's standard "
                                                              "deviation).\n")
    assert set(table["case"]) == {"Table 1: ResNet-18, PowerSGD",
                                  "Fig. 10: ResNet-18, batch size"}
    auto = table.loc["auto_rank"]
    finals = [hand[("auto_rank", s)]["final"] for s in (0, 1)]
    bits = [hand[("auto_rank", s)]["bits"] for s in (0, 1)]
    assert auto["seeds"] == 2 and auto["kind"] == "auto"
    assert auto["final_mean"] == pytest.approx(sum(finals) / 2)
    std = abs(finals[0] - finals[1]) / math.sqrt(2)
    assert auto["final_ci"] == pytest.approx(12.706 * std / math.sqrt(2), rel=1e-3)  # t(.975, 1)
    assert auto["bits_mean"] == pytest.approx(sum(bits) / 2)  # the probe's bits included
    handpicked = sum(hand[("accordion_rank2_rank1", s)]["bits"] for s in (0, 1)) / 2
    assert auto["bits_vs_hand"] == pytest.approx(auto["bits_mean"] / handpicked)
    verdict = auto_endpoints.verdict_table(auto_endpoints.per_run(frames),
                                           table.reset_index())
    mine = verdict[verdict["auto"] == "auto_rank"].set_index("against")
    assert set(mine.index) == {"accordion_rank2_rank1", "rank2"}  # hand-picked, best fixed
    row = mine.loc["accordion_rank2_rank1"]
    expected = auto["final_mean"] - table.loc["accordion_rank2_rank1", "final_mean"]
    assert row["diff"] == pytest.approx(expected)
    a = [hand[("auto_rank", s)]["final"] for s in (0, 1)]
    b = [hand[("accordion_rank2_rank1", s)]["final"] for s in (0, 1)]
    se = math.sqrt(statistics.variance(a) / 2 + statistics.variance(b) / 2)
    dof = se**4 / ((statistics.variance(a) / 2) ** 2 + (statistics.variance(b) / 2) ** 2)
    half = scipy_stats.t.ppf(0.975, dof) * se if se else 0.0  # Welch, by hand
    assert row["diff_ci"] == pytest.approx(half)
    reaches = expected >= -table.loc["accordion_rank2_rank1", "final_std"]
    want = ("better" if expected - half > 0 else "worse" if expected + half < 0
            else ("reaches it at no more bits" if row["bits_ratio"] <= 1
                  else "reaches it with more bits") if reaches
            else "below it by more than its spread, not significantly")
    assert row["verdict"] == want
    # the batch case: one seed, no interval; the auto run chose a B_high it logged
    assert table.loc["auto_batch", "seeds"] == 1 and math.isnan(table.loc["auto_batch",
                                                                          "final_ci"])


@pytest.mark.parametrize(("auto", "hand", "bits", "verdict"), [
    ((90, 91, 92), (95, 96, 97), 1.0, "worse"),  # the interval entirely below 0
    ((90, 95, 100), (96, 97, 98), 1.0, "below it by more than its spread, not significantly"),
    ((95, 97, 99), (96, 97, 98), 0.9, "reaches it at no more bits"),
    ((95, 97, 99), (96, 97, 98), 1.1, "reaches it with more bits"),
    ((99, 100, 101), (96, 97, 98), 2.0, "better"),
])
def test_verdict_calls_a_difference_only_where_its_interval_excludes_zero(auto, hand, bits,
                                                                          verdict):
    runs = pd.DataFrame([{"case": "c", "method": m, "final": f} for m, finals in
                         (("auto_rank", auto), ("accordion_rank2_rank1", hand)) for f in finals])
    table = pd.DataFrame([
        {"case": "c", "method": "auto_rank", "kind": "auto", "metric": "test/accuracy",
         "final_mean": statistics.mean(auto), "final_std": statistics.stdev(auto),
         "bits_mean": bits},
        {"case": "c", "method": "accordion_rank2_rank1", "kind": "hand-picked",
         "metric": "test/accuracy", "final_mean": statistics.mean(hand),
         "final_std": statistics.stdev(hand), "bits_mean": 1.0}])
    assert auto_endpoints.verdict_table(runs, table)["verdict"].tolist() == [verdict]


def test_goal_asks_more_of_the_auto_run_against_a_too_aggressive_pair():
    """Against the paper's too-aggressive pairs only 'better' meets the goal; against the
    others reaching the metric within the spread at no more bits does, whatever the call."""
    rows = [  # against, diff, spread, bits ratio, reaches, verdict, met
        ("accordion_rank4_rank1", 3.0, 1.0, 1.5, True, "better", True),
        ("accordion_rank4_rank1", 0.5, 1.0, 0.8, True, "reaches it at no more bits", False),
        ("accordion_rank4_rank2", -0.5, 1.0, 0.9, True, "reaches it at no more bits", True),
        ("accordion_rank4_rank2", 2.0, 1.0, 1.2, True, "better", False),
        ("accordion_rank4_rank2", -2.0, 1.0, 0.5, False, "worse", False),
        ("rank4", 9.0, 1.0, 0.5, True, "better", None),  # a fixed level: not a goal
    ]
    verdict = pd.DataFrame([{"case": "Fig. 9: VGG-19bn, PowerSGD", "auto": "auto_rank",
                             "against": a, "against_kind": "fixed" if met is None else
                             "hand-picked", "diff": d, "diff_ci": 1.0, "spread": s,
                             "bits_ratio": r, "reaches": reach, "verdict": v}
                            for a, d, s, r, reach, v, met in rows])
    goal = auto_endpoints.goal_table(verdict)
    assert goal["met"].tolist() == [met for *_, met in rows if met is not None]
    assert goal["goal"].iloc[0] == "better than a too-aggressive pair"
    assert auto_endpoints.goal_text(goal).endswith("met in 2 of 5 checks (95% Welch intervals "
                                                   "over seeds; seed spread: the hand-picked "
                                                   "pair's standard deviation).\n")
    assert "| Fig. 9: VGG-19bn, PowerSGD | 2 of 5 | auto_rank vs accordion_rank4_rank1; " \
        "auto_rank vs accordion_rank4_rank2; auto_rank vs accordion_rank4_rank2 |" in \
        auto_endpoints.goal_summary(goal)


def test_the_shared_runs_of_another_sweep_are_read_and_no_others(runs, monkeypatch):
    monkeypatch.setattr(auto_endpoints, "SHARED", SHARED)
    frames = auto_endpoints.load(runs, "tiny")
    assert sorted(frames.runs["sweep"]).count("auto_endpoints") == len(by_hand(runs))
    shared = frames.runs[frames.runs["sweep"] != "auto_endpoints"]
    assert shared[["sweep", "method", "variant"]].values.tolist() == [["fig9", "rank1", "ours"]]
    assert set(frames.epochs["run_id"]) == set(frames.runs["run_id"])
    table = auto_endpoints.group_table(auto_endpoints.per_run(frames)).set_index("method")
    assert table.loc["rank1", "final_mean"] == by_hand(runs, "fig9", "ours")[("rank1", 0)][
        "final"]
    assert table.loc["rank2", "final_mean"] == pytest.approx(  # auto's rank2 alone
        sum(by_hand(runs)[("rank2", s)]["final"] for s in (0, 1)) / 2)


def test_harm_is_what_the_rows_say(runs):
    hand = by_hand(runs)
    frames = load_sweep(runs, "auto_endpoints", "tiny", keep=auto_endpoints.KEPT)
    per_run = auto_endpoints.per_run(frames)
    run_id = per_run[(per_run["method"] == "auto_rank") & (per_run["seed"] == 0)]["run_id"]
    harm = auto_endpoints.harm_data(frames, run_id.iloc[0])
    rows = hand[("auto_rank", 0)]["rows"]
    layer = harm["layer"].iloc[0]
    got = harm[(harm["layer"] == layer) & (harm["level"] == "1")].sort_values("epoch")
    want = [(r[f"auto/error@1/{layer}"] / r[f"auto/corrected_sq/{layer}"])
            / (r[f"auto/noise/{layer}"] / r[f"auto/local_sq/{layer}"]) for r in rows]
    assert got["harm"].tolist() == pytest.approx(want)


def test_whatif_replays_the_run_and_another_rule(runs, capsys):
    run_dir = by_hand(runs)[("auto_rank", 0)]["dir"]
    rows = by_hand(runs)[("auto_rank", 0)]["rows"]
    assert auto_endpoints.main(["whatif", str(run_dir), "--rule", "budget", "--budget",
                                "0.05"]) == 0
    out = capsys.readouterr().out
    lines = out.splitlines()
    assert lines[0].endswith("rule noise -> budget, fractions 0.5/1.0 -> 0.5/1.0, budget None "
                             "-> 0.05")
    logged = [" ".join(f"{v}:{c}" for v, c in sorted(
        _count(r, "level/").items())) for r in rows]
    assert [line.split("->")[0].split(maxsplit=1)[1].strip() for line in lines[2:5]] == logged
    own = sum(r["comm/bits"] + r["auto/probe_bits/model"] for r in rows)
    assert f"own {own:.4e}" in out  # PowerSGD's bits follow the level: the estimate is exact
    assert auto_endpoints.main(["whatif", str(by_hand(runs)[("rank2", 0)]["dir"])]) == 2
    assert "scheduler.name: the run used 'static'" in capsys.readouterr().err


def _count(row: dict, prefix: str) -> dict:
    values = [v for k, v in row.items() if k.startswith(prefix)]
    return {v: values.count(v) for v in set(values)}


def test_no_runs_is_one_line(tmp_path, capsys):
    assert auto_endpoints.main([str(tmp_path), "--out", str(tmp_path / "out")]) == 2
    assert "no completed runs of sweep auto_endpoints" in capsys.readouterr().err


def test_the_figures_read_cleanly(runs):
    """No overlapping tick labels, no legend over a panel, human labels, whole epochs; the
    level colours the same above and below (caught: level 4 blue on top, level 1 below)."""
    frames = load_sweep(runs, auto_endpoints.SWEEP, "tiny", keep=auto_endpoints.KEPT)
    per_run = auto_endpoints.per_run(frames)
    table = auto_endpoints.group_table(per_run)
    assert problems(auto_endpoints.plot_metric_vs_bits(table)) == []
    fig = auto_endpoints.plot_measurements(frames, per_run)
    assert problems(fig) == []
    top = next(ax for ax in fig.axes if "auto_rank" in ax.get_title())
    spec = top.get_subplotspec()
    bottom = next(ax for ax in fig.axes if ax.get_subplotspec().colspan == spec.colspan
                  and ax.get_subplotspec().rowspan.start == spec.rowspan.start + 1)

    def colours(ax) -> dict[str, str]:
        return {line.get_label(): line.get_color() for line in ax.get_lines()
                if line.get_label().startswith("level ")}

    assert len(colours(top)) == 3 and colours(top) == colours(bottom)
