"""The claims file, the verdicts and the scorecard (analysis/claims.yaml, verdicts.py,
scorecard.py): the interval arithmetic against statistics computed here by hand, every claim
against the sweeps that must run its cells, and the scorecard on hand-written run records."""

from __future__ import annotations

import json
import math
import shutil
import statistics
from pathlib import Path

import pandas as pd
import pytest
import yaml
from hydra import compose, initialize_config_dir
from omegaconf import OmegaConf

from analysis import reference, verdicts
from analysis.scorecard import main
from analysis.verdicts import (
    INCONCLUSIVE,
    NOT_REPRODUCED,
    REPRODUCED,
    SEEDS_LIMIT,
    Interval,
    load_claims,
)
from core.errors import ConfigError
from jobs import sweeps
from tests.analysis_fixture import (
    MACHINE_A,
    MACHINE_B,
    epoch_row,
    provenance,
    read_by_hand,
    write_record,
)
from tests.conftest import CONF

# Student's t, two-sided 95% (0.975 quantile), from printed tables (e.g. NIST/SEMATECH
# e-Handbook of Statistical Methods, 1.3.6.7.2)
T_TABLE = {1: 12.706, 2: 4.303, 3: 3.182, 4: 2.776, 5: 2.571, 10: 2.228, 30: 2.042,
           100: 1.984}


def test_t_quantile_matches_the_printed_table():
    for df, value in T_TABLE.items():
        assert verdicts.t_quantile(df) == pytest.approx(value, abs=5e-4), df
    assert verdicts.t_quantile(1e9) == pytest.approx(1.95996, abs=1e-5)  # the normal's


def _series(values: dict[int, float]) -> pd.Series:
    return pd.Series(values, dtype=float)


def test_paired_interval_when_the_seeds_match():
    a, b = _series({0: 97.5, 1: 96.3, 2: 97.5}), _series({2: 93.1, 0: 93.8, 1: 94.9})
    d = [97.5 - 93.8, 96.3 - 94.9, 97.5 - 93.1]  # by seed, whatever the order given
    half = T_TABLE[2] * statistics.stdev(d) / math.sqrt(3)
    got = verdicts.interval(a, b, "difference")
    assert got.kind == "paired t" and got.n == "3"
    assert (got.estimate, got.low, got.high) == pytest.approx(
        (statistics.mean(d), statistics.mean(d) - half, statistics.mean(d) + half), abs=2e-3)


def test_paired_over_the_common_seeds_when_one_cell_ran_more():
    # a ran seeds 0-3, b 0-2: seed 3 has no partner; the pairs of 0-2 give the interval
    a, b = _series({0: 97.5, 1: 96.3, 2: 97.5, 3: 90.0}), _series({2: 93.1, 0: 93.8, 1: 94.9})
    d = [97.5 - 93.8, 96.3 - 94.9, 97.5 - 93.1]
    half = T_TABLE[2] * statistics.stdev(d) / math.sqrt(3)
    got = verdicts.interval(a, b, "difference")
    assert got.kind == "paired t" and got.n == "3"
    assert (got.low, got.high) == pytest.approx(
        (statistics.mean(d) - half, statistics.mean(d) + half), abs=2e-3)
    assert verdicts._seeds(a, b) == "0 1 2 (paired; a's 3 unpaired, left out)"
    assert verdicts._seeds(b, _series({0: 1.0, 1: 1.0, 5: 1.0})) == \
        "0 1 (paired; a's 2 and b's 5 unpaired, left out)"
    assert verdicts._seeds(a, _series({0: 1.0, 7: 1.0})) == "0 1 2 3 vs 0 7"  # Welch's


def test_welch_interval_when_the_seeds_differ():
    a, b = _series({0: 10.0, 1: 12.0, 2: 14.0}), _series({0: 9.0, 3: 9.5})
    va, vb = statistics.variance(a) / 3, statistics.variance(b) / 2
    df = (va + vb) ** 2 / (va ** 2 / 2 + vb ** 2 / 1)
    got = verdicts.interval(a, b, "difference")
    assert got.kind == f"Welch t, df {df:.1f}" and got.n == "3 vs 2"
    half = verdicts.t_quantile(df) * math.sqrt(va + vb)
    assert (got.low, got.high) == pytest.approx((12.0 - 9.25 - half, 12.0 - 9.25 + half))
    assert 3.182 < verdicts.t_quantile(df) < 12.706  # 1 < df < 3 here


def test_ratio_interval_is_on_the_logs_and_one_cell_is_one_sample():
    a, b = _series({0: 2.0, 1: 4.0}), _series({0: 1.0, 1: 1.0})
    got = verdicts.interval(a, b, "ratio")
    logs = [math.log(2.0), math.log(4.0)]
    half = T_TABLE[1] * statistics.stdev(logs) / math.sqrt(2)
    assert got.estimate == pytest.approx(math.sqrt(8))  # the geometric mean of 2 and 4
    assert (got.low, got.high) == pytest.approx((math.exp(statistics.mean(logs) - half),
                                                 math.exp(statistics.mean(logs) + half)), rel=1e-3)
    alone = verdicts.interval(_series({0: 0.5, 1: 0.7, 2: 0.9}), None, "difference")
    assert alone.kind == "one-sample t" and alone.estimate == pytest.approx(0.7)
    assert alone.high - 0.7 == pytest.approx(T_TABLE[2] * 0.2 / math.sqrt(3), abs=1e-3)
    one = verdicts.interval(_series({0: 1.0}), _series({0: 2.0}), "difference")
    assert math.isnan(one.low) and one.kind == "none (one seed)"


@pytest.mark.parametrize(("low", "high", "direction", "bound", "expected"), [
    (-3.0, -1.0, "<", 0.0, REPRODUCED), (0.5, 2.0, "<", 0.0, NOT_REPRODUCED),
    (-1.0, 1.0, "<", 0.0, INCONCLUSIVE), (0.0, 1.0, "<", 0.0, NOT_REPRODUCED),
    (-1.5, 0.5, ">", -1.12, INCONCLUSIVE), (-1.0, 0.5, ">", -1.0, INCONCLUSIVE),
    (-0.9, 0.5, ">", -1.12, REPRODUCED), (-3.0, -1.2, ">", -1.12, NOT_REPRODUCED),
    (math.nan, math.nan, "<", 0.0, INCONCLUSIVE)])
def test_verdict_from_the_interval_and_the_bound(low, high, direction, bound, expected):
    assert verdicts.verdict(Interval(0.0, low, high, "paired t", "3"), direction, bound) == \
        expected


def test_seeds_needed_is_where_the_printed_t_interval_would_clear_the_bound():
    # differences by seed with mean -1 and standard deviation 1, against a bound of 0: the
    # interval clears 0 once t(m - 1) / sqrt(m) < 1, first at m = 7 (2.447 / 2.646 = 0.925;
    # m = 6: 2.571 / 2.449 = 1.05), read from the printed table (t(5) = 2.571; t(6) = 2.447)
    d = _series({0: -2.0, 1: -1.0, 2: 0.0})
    got = verdicts.interval(d, _series({0: 0.0, 1: 0.0, 2: 0.0}), "difference")
    assert verdicts.seeds_needed(got, 0.0, "difference") == 7
    assert verdicts.seeds_needed(got, -1.0, "difference") == math.inf  # the estimate sits on it
    assert verdicts.seeds_needed(got, 30.0, "difference") == 2  # far from it: any interval
    # a ratio's interval is on the logs: ratios 1/e, 1, e (log mean 0, std 1) against e^-1
    ratio = verdicts.interval(_series({0: math.exp(-1), 1: 1.0, 2: math.e}),
                              _series({0: 1.0, 1: 1.0, 2: 1.0}), "ratio")
    assert verdicts.seeds_needed(ratio, math.exp(-1), "ratio") == 7
    welch = verdicts.interval(_series({0: 1.0, 1: 2.0}), _series({3: 5.0, 4: 7.0}),
                              "difference")
    one = verdicts.interval(_series({0: 1.0}), _series({0: 2.0}), "difference")
    assert math.isnan(verdicts.seeds_needed(welch, 0.0, "difference"))
    assert math.isnan(verdicts.seeds_needed(one, 0.0, "difference"))


# ---- the claims file --------------------------------------------------------------------------
def test_the_claims_file_loads_and_every_published_effect_is_found():
    claims = verdicts.load_claims()
    assert len({c.id for c in claims}) == len(claims) > 100
    own = verdicts.own_verdicts()
    assert {c.sweep for c in claims} | set(own) == {p.stem for p in (CONF / "sweep").glob("*.yaml")}
    assert not {c.sweep for c in claims} & set(own)
    ref = reference.load_reference()
    for claim in claims:
        published, source = verdicts._published(claim, ref)
        assert (claim.published is None) == math.isnan(published), claim.id
        assert claim.published is None or source, claim.id
    within = next(c for c in claims if c.id == "table1.resnet18.accordion_within")
    assert (within.direction, within.bound) == (">", -1.12)  # a margin: at most 1.12 worse
    assert verdicts._published(within, ref)[0] == pytest.approx(94.72 - 94.49)
    ppl = next(c for c in claims if c.id == "table4.lstm.accordion_within")
    assert (ppl.direction, ppl.bound) == ("<", 0.0)


def _literal_method(option: str) -> bool:
    """Does ``conf/method/<option>.yaml`` name its method ``option`` (no interpolation)?"""
    return yaml.safe_load((CONF / "method" / f"{option}.yaml").read_text())["method"] == option


def _cells(sweep: str, scale: str) -> set[tuple[str, str, str]]:
    """(model, method, variant) of every run the sweep composes at ``scale`` (runs whose method
    label is an interpolation, of the sweep's or of the method file's, composed to find it)."""
    args = [f"sweep={sweep}", f"scale={scale}"]
    cfg = compose("config", overrides=args, return_hydra_config=True)
    jobs = sweeps.expand(cfg.hydra.sweeper.groups, cfg.hydra.sweeper.params, args, scale)
    interpolated = "${" in str(OmegaConf.to_container(cfg)["method"])
    out = set()
    for job in {tuple(o for o in j if not o.startswith("seed=")) for j in jobs}:
        keys = dict(o.split("=", 1) for o in job)
        if interpolated or not _literal_method(keys["method"]):
            c = compose("config", overrides=list(job))
            keys = {"model": c.model.name, "method": c.method, "variant": c.variant}
        out.add((keys["model"], keys["method"], keys.get("variant", "ours")))
    return out


@pytest.mark.slow
def test_every_claim_compares_cells_its_sweep_runs():
    claims = verdicts.load_claims()
    with initialize_config_dir(str(CONF), version_base="1.3"):
        runs = {(c.sweep, s): None for c in claims for s in c.scales or ("tiny",)}
        runs = {key: _cells(*key) for key in runs}
    for claim in claims:
        for scale in claim.scales or ("tiny",):
            for cell in (claim.a, claim.b):
                if cell is not None:
                    assert (claim.model, cell.method, cell.variant) in runs[claim.sweep, scale], \
                        (claim.id, scale, cell)


@pytest.mark.parametrize(("change", "message"), [
    ({"direction": "<="}, "direction: expected one of ['<', '>'], got '<='"),
    ({"margin": "accordion_accuracy"}, "give exactly one of `bound` and `margin`"),
    ({"bound": None, "margin": "nope"}, "margin: expected one of"),
    ({"metric": "accuracy"}, "metric: expected one of"),
    ({"colour": "red"}, "unknown field(s) ['colour']"),
    ({"a": {"method": "x", "seed": 1}}, "a: expected a method or {method, variant}"),
    ({"id": "t.{model}.x", "model": None}, "`model` is missing"),
    ({"id": "t.{size}.x"}, "id names {size} but there is no `size`"),
    ({"source": None}, "`source` is missing"),
    ({"effect": "ratio", "bound": 0}, "bound: expected a number in (0, inf)"),
])
def test_a_malformed_claim_is_one_line_naming_the_field(tmp_path, change, message):
    claim = {"id": "t.x", "claim": "c", "sweep": "table1", "model": "resnet18", "a": "rank1",
             "b": "rank2", "metric": "final", "effect": "difference", "direction": "<",
             "bound": 0, "source": "s"}
    claim.update(change)
    claim = {k: v for k, v in claim.items() if v is not None or k in ("model", "source")}
    margins = {"accordion_accuracy": {"value": 1.0, "unit": "points", "source": "s"}}
    path = tmp_path / "claims.yaml"
    path.write_text(yaml.safe_dump({"version": 1, "margins": margins, "claims": [claim]}))
    with pytest.raises(ConfigError, match=None) as error:
        verdicts.load_claims(path)
    assert message in str(error.value) and "\n" not in str(error.value)
    assert str(path) in str(error.value)


def test_two_claims_with_one_id_or_another_version_are_refused(tmp_path):
    claim = {"id": "t.x", "claim": "c", "sweep": "table1", "model": "resnet18", "a": "rank1",
             "metric": "final", "effect": "difference", "direction": "<", "bound": 0,
             "source": "s"}
    path = tmp_path / "claims.yaml"
    path.write_text(yaml.safe_dump({"claims": [claim, claim]}))
    with pytest.raises(ConfigError, match="id 't.x' appears twice"):
        verdicts.load_claims(path)
    path.write_text(yaml.safe_dump({"version": 2, "claims": [claim]}))
    with pytest.raises(ConfigError, match="version: expected 1 .*, got 2"):
        verdicts.load_claims(path)


# ---- the scorecard on hand-written run records ------------------------------------------------
FINALS = {"rank2": (97.5, 96.3, 97.5), "rank1": (93.8, 92.9, 93.9),
          "accordion_rank2_rank1": (96.9, 95.6, 97.1)}
BITS = {"rank2": 3e8, "rank1": 2e8, "accordion_rank2_rank1": 2.5e8}


def _table1(root: Path, seeds: tuple[int, ...] = (0, 1, 2), moved_seed: int | None = None
            ) -> None:
    for method, finals in FINALS.items():
        for seed in seeds:
            machine = MACHINE_B if seed == moved_seed and method == "rank1" else MACHINE_A
            prov = provenance(machine)
            rows = [epoch_row(0, 50.0, BITS[method] / 2),
                    epoch_row(1, finals[seed], BITS[method] / 2)]
            write_record(root, f"{method}/s{seed}", {"sweep": "table1", "baseline": "rank2",
                                                      "method": method, "seed": seed},
                         rows, provenance=prov, starts=[{**prov, "epoch": 0}])


def test_scorecard_judges_each_claim_of_the_runs_there(tmp_path, capsys):
    _table1(tmp_path / "runs", moved_seed=2)
    assert main([str(tmp_path / "runs"), "--out", str(tmp_path / "out")]) == 0
    printed = capsys.readouterr().out
    csv = pd.read_csv(tmp_path / "out" / "scorecard.csv").set_index("id")
    assert set(csv.index) == {"table1.resnet18.high_loses", "table1.resnet18.accordion_within",
                              "table1.resnet18.accordion_less_data"}
    loses = csv.loc["table1.resnet18.high_loses"]
    d = [93.8 - 97.5, 92.9 - 96.3, 93.9 - 97.5]
    assert loses["ours"] == pytest.approx(statistics.mean(d))
    assert (loses["interval"], loses["seeds"], loses["verdict"]) == ("paired t", "0 1 2",
                                                                     REPRODUCED)
    assert loses["published"] == pytest.approx(94.25 - 94.49)
    assert loses["values_a"] == "0: 93.8, 1: 92.9, 2: 93.9"
    assert loses["warning"] == "mixes 2 machines"  # rank1 seed 2 ran on machine B
    assert loses["fingerprints"] == "0f1e2d3c4b5a, a1b2c3d4e5f6"
    assert len(loses["runs"].split("; ")) == 6
    within = csv.loc["table1.resnet18.accordion_within"]  # -0.57 +- 0.38: within 1.12
    assert within["verdict"] == REPRODUCED and within["statement"] == \
        "final: accordion_rank2_rank1 - rank2 > -1.12"
    assert 2 <= loses["seeds_needed"] <= 3  # decided at three seeds: needed no more
    data = csv.loc["table1.resnet18.accordion_less_data"]
    assert data["ours"] == pytest.approx(2.5 / 3) and data["verdict"] == REPRODUCED
    assert pd.isna(data["published"]) and pd.isna(csv.loc["table1.resnet18.accordion_within",
                                                            "warning"])
    md = (tmp_path / "out" / "scorecard.md").read_text()
    assert md in printed and "3 claims judged: 3 reproduced, 0 not reproduced, 0 inconclusive" \
        in md and "10 claims of these sweeps have no runs here" in md
    assert "| table1.resnet18.high_loses |" in md and "mixes 2 machines" in md
    assert "<table" in (tmp_path / "out" / "scorecard.html").read_text()


def test_one_seed_is_inconclusive_and_a_claim_without_runs_of_one_cell_says_so(tmp_path):
    _table1(tmp_path / "runs", seeds=(0,))
    assert main([str(tmp_path / "runs"), "--out", str(tmp_path / "out")]) == 0
    csv = pd.read_csv(tmp_path / "out" / "scorecard.csv").set_index("id")
    assert set(csv["verdict"]) == {INCONCLUSIVE}
    assert set(csv["interval"]) == {"none (one seed)"}
    for path in (tmp_path / "runs" / "rank2").iterdir():  # rank 2 gone: nothing to compare
        (path / "summary.json").unlink()
    assert main([str(tmp_path / "runs"), "--out", str(tmp_path / "out2")]) == 0
    row = pd.read_csv(tmp_path / "out2" / "scorecard.csv").iloc[0]
    assert row["verdict"] == INCONCLUSIVE and row["interval"] == "none (no values of rank2)"


def test_scorecard_bad_input_is_one_line_and_status_2(tmp_path, capsys):
    assert main([str(tmp_path / "nowhere")]) == 2
    assert capsys.readouterr().err.startswith("error: runs dir:")
    assert main([str(tmp_path)]) == 2
    assert "no run records of a sweep with claims" in capsys.readouterr().err
    (tmp_path / "bad.yaml").write_text("claims: 3\n")
    _table1(tmp_path / "runs", seeds=(0,))
    assert main([str(tmp_path / "runs"), "--claims", str(tmp_path / "bad.yaml")]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "needs a list `claims`" in err


def test_keep_judges_what_the_runs_can_and_keeps_the_other_rows(tmp_path, capsys):
    _table1(tmp_path / "old", moved_seed=2)  # every cell, 3 seeds: three claims judged
    assert main([str(tmp_path / "old"), "--out", str(tmp_path / "card")]) == 0
    earlier = tmp_path / "card" / "scorecard.csv"
    before = pd.read_csv(earlier, dtype=str, keep_default_na=False)
    before.assign(commits="75011e670879").to_csv(earlier, index=False)  # reads as a float
    before = pd.read_csv(earlier, dtype=str, keep_default_na=False).set_index("id")
    _table1(tmp_path / "new", seeds=(0,))  # elsewhere, later: rank 1 and 2 only, one seed
    shutil.rmtree(tmp_path / "new" / "accordion_rank2_rank1")
    capsys.readouterr()
    out = tmp_path / "card2"
    assert main([str(tmp_path / "new"), "--keep", str(earlier), "--out", str(out)]) == 0
    after = pd.read_csv(out / "scorecard.csv", dtype=str, keep_default_na=False)
    assert list(after["id"]) == list(before.index)  # the claims file's order
    after = after.set_index("id")
    loses = after.loc["table1.resnet18.high_loses"]  # judged again on the new runs
    assert (loses["seeds"], loses["verdict"]) == ("0", INCONCLUSIVE)
    for kept in ("table1.resnet18.accordion_within", "table1.resnet18.accordion_less_data"):
        assert after.loc[kept].equals(before.loc[kept]), kept  # every column as it was
    md = (out / "scorecard.md").read_text()
    assert "3 claims judged: 2 reproduced, 0 not reproduced, 1 inconclusive" in md
    assert f"2 of them judged before, on runs not below this directory: kept from {earlier}" \
        in md and "10 claims of these sweeps have no runs here" in md
    # a kept claim stated otherwise now, or a file of another version: one line, status 2
    changed = pd.read_csv(earlier, dtype=str, keep_default_na=False)
    changed.loc[changed["id"] == "table1.resnet18.accordion_within", "statement"] = "x > 0"
    changed.to_csv(tmp_path / "changed.csv", index=False)
    changed.drop(columns="mean_a").to_csv(tmp_path / "other.csv", index=False)
    capsys.readouterr()
    for name, message in (("changed.csv", "keep: claim table1.resnet18.accordion_within of"),
                          ("other.csv", "is not a scorecard.csv of this version (no mean_a)")):
        assert main([str(tmp_path / "new"), "--keep", str(tmp_path / name), "--out",
                     str(tmp_path / "bad")]) == 2
        err = capsys.readouterr().err
        assert err.count("\n") == 1 and message in err, err
    assert not (tmp_path / "bad").exists()
    # a scorecard from before `seeds_needed`: its rows are kept without one
    before.reset_index().drop(columns="seeds_needed").to_csv(tmp_path / "older.csv", index=False)
    assert main([str(tmp_path / "new"), "--keep", str(tmp_path / "older.csv"), "--out",
                 str(tmp_path / "card3")]) == 0
    third = pd.read_csv(tmp_path / "card3" / "scorecard.csv", dtype=str, keep_default_na=False)
    assert list(third["seeds_needed"]) == ["", "", ""]  # judged again: a one-seed interval
    # a claim whose baseline has no runs here keeps its earlier row too (not 'no values of')
    _table1(tmp_path / "rank1", seeds=(0,))
    for cell in ("accordion_rank2_rank1", "rank2"):
        shutil.rmtree(tmp_path / "rank1" / cell)
    assert main([str(tmp_path / "rank1"), "--keep", str(earlier), "--out",
                 str(tmp_path / "card4")]) == 0
    fourth = pd.read_csv(tmp_path / "card4" / "scorecard.csv", dtype=str, keep_default_na=False)
    assert fourth.set_index("id").equals(before)


def test_the_overview_counts_each_sweep_s_verdicts_against_its_claims(tmp_path, capsys):
    _table1(tmp_path / "runs", moved_seed=2)
    assert main([str(tmp_path / "runs"), "--out", str(tmp_path / "cards" / "table1")]) == 0
    capsys.readouterr()
    tiny = {c.sweep: 0 for c in load_claims()}  # claims at tiny scale per sweep
    for c in load_claims():
        tiny[c.sweep] += c.scales is None or "tiny" in c.scales
    assert main([str(tmp_path / "cards"), "--overview", "--out", str(tmp_path / "o")]) == 0
    text = (tmp_path / "o" / "scorecard_overview.md").read_text()
    assert text in capsys.readouterr().out
    rows = {line.split(" | ")[0].strip("| "): line.split(" | ")[1:]
            for line in text.splitlines() if line.startswith("| ") and "---" not in line}
    assert list(rows)[1:] == [s for s, n in tiny.items() if n]  # in the claims file's order
    # claims, judged, reproduced, not reproduced, inconclusive, seeds, seeds to decide, machines
    assert rows["table1"][1:9] == [str(tiny["table1"]), "3", "3", "0", "0", "3", "—",
                                   "0f1e2d3c4b5a, a1b2c3d4e5f6"]
    assert rows["table2"][2:10] == ["0", "0", "0", "0", "—", "—", "—", "no scorecard |"]
    assert f"3 of {sum(tiny.values())} judged, 3 reproduced, 0 not reproduced" in text
    # a Welch interval's n (runs of a vs of b) is listed beside the paired ones
    card = tmp_path / "cards" / "table1" / "scorecard.csv"
    pd.read_csv(card, dtype=str).assign(n=["3", "3 vs 2", "10"]).to_csv(card, index=False)
    assert main([str(tmp_path / "cards"), "--overview", "--out", str(tmp_path / "o")]) == 0
    assert "| 3, 10, 3 vs 2 |" in (tmp_path / "o" / "scorecard_overview.md").read_text()
    # seeds to decide: the most that an inconclusive claim needs; beyond the limit; not computed
    for needed, shown in (["12", "3", "40"], "40"), (["inf", "3", "5"], f"> {SEEDS_LIMIT}"), \
            (["", "3", "5"], "?"):
        pd.read_csv(card, dtype=str).assign(verdict=[INCONCLUSIVE, REPRODUCED, INCONCLUSIVE],
                                            seeds_needed=needed).to_csv(card, index=False)
        assert main([str(tmp_path / "cards"), "--overview", "--out", str(tmp_path / "o")]) == 0
        text = (tmp_path / "o" / "scorecard_overview.md").read_text()
        assert f"| 3, 10, 3 vs 2 | {shown} |" in text, needed


def test_the_overview_refuses_a_claim_judged_twice_and_an_empty_folder(tmp_path, capsys):
    _table1(tmp_path / "runs", seeds=(0,))
    for name in ("a", "b"):
        assert main([str(tmp_path / "runs"), "--out", str(tmp_path / "cards" / name)]) == 0
    capsys.readouterr()
    assert main([str(tmp_path / "cards"), "--overview"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "is judged in" in err and "keep one" in err
    assert main([str(tmp_path / "runs"), "--overview"]) == 2
    assert "no scorecard.csv below" in capsys.readouterr().err
    assert main([str(tmp_path / "cards"), "--overview", "--scale", "tiny", "paper"]) == 2
    assert "--overview counts one scale" in capsys.readouterr().err


@pytest.mark.slow
def test_scorecard_of_real_runs_agrees_with_their_records(analysis_runs, tmp_path):
    assert main([str(analysis_runs), "--out", str(tmp_path)]) == 0
    # hashes as text: a commit such as 75011e670879 reads as a float (7.5e670879) otherwise
    csv = pd.read_csv(tmp_path / "scorecard.csv",
                      dtype={"commits": str, "fingerprints": str}).set_index("id")
    assert {"table1", "table5"} == set(csv["sweep"])  # the fixture's adacomp runs: resnet18,
    # which the AdaComp claims name only at paper scale
    finals = {(r["cfg"]["method"], r["cfg"]["seed"]): r["rows"][-1]["test/accuracy"]
              for r in read_by_hand(analysis_runs) if r["cfg"]["sweep"] == "table1"}
    loses = csv.loc["table1.resnet18.high_loses"]
    d = [finals["rank1", s] - finals["rank2", s] for s in (0, 1)]
    assert loses["ours"] == pytest.approx(statistics.mean(d))
    assert (loses["interval"], loses["seeds"]) == ("paired t", "0 1")
    half = T_TABLE[1] * statistics.stdev(d) / math.sqrt(2)
    assert (loses["low"], loses["high"]) == pytest.approx(
        (statistics.mean(d) - half, statistics.mean(d) + half), abs=1e-3 * max(1.0, half))
    summary = json.loads(next(analysis_runs.glob("*/summary.json")).read_text())
    prov = summary["provenance"]  # every run of the fixture: this machine, this checkout
    assert loses["fingerprints"] == prov["fingerprint"] and len(prov["fingerprint"]) == 12
    assert loses["commits"].startswith(prov["git"]["commit"][:12])
    assert pd.isna(loses["warning"])
    assert set(csv.loc[csv["sweep"] == "table5", "interval"]) == {"none (one seed)"}
