"""Tables and the reference join (analysis/tables.py, analysis/reference.py): values against
numbers recomputed by hand from metrics.jsonl, and the join of every published row."""

from __future__ import annotations

import math
import statistics
from pathlib import Path

import pandas as pd
import pytest

from analysis import reference, tables
from analysis.load import IDENTITY, load_records
from tests.analysis_fixture import read_by_hand


def _by_hand(runs: Path) -> dict[tuple[str, str], dict]:
    """Per (sweep, method): the numbers a table row must show, from the raw files."""
    groups: dict[tuple[str, str], list[dict]] = {}
    for record in read_by_hand(runs):
        groups.setdefault((record["cfg"]["sweep"], record["cfg"]["method"]), []).append(record)
    out = {}
    for key, records in groups.items():
        finals = [r["rows"][-1]["test/accuracy"] for r in records]
        bests = [max(row["test/accuracy"] for row in r["rows"]) for r in records]
        bits = [sum(row["comm/bits"] for row in r["rows"]) for r in records]
        times = [sum(row["time/epoch_s"] for row in r["rows"]) for r in records]
        crit = [statistics.mean(v for row in r["rows"] for k, v in row.items()
                                if k.startswith("critical/")) for r in records
                if any(k.startswith("critical/") for k in r["rows"][0])]
        out[key] = {"seeds": len(records), "baseline": records[0]["cfg"]["baseline"],
                    "final": finals, "best": bests, "bits": bits, "times": times,
                    "critical": crit,
                    "dense": [sum(row["comm/bits_dense"] for row in r["rows"]) for r in records]}
    return out


def _std(values: list[float]) -> float:
    return statistics.stdev(values) if len(values) > 1 else math.nan


def _close(a: float, b: float) -> bool:
    return (math.isnan(a) and math.isnan(b)) or math.isclose(a, b, rel_tol=1e-9, abs_tol=1e-12)


@pytest.mark.slow
def test_table_values_match_the_metrics_recomputed_by_hand(analysis_runs, tmp_path):
    loaded = load_records(analysis_runs)
    table = tables.group_table(tables.run_stats(loaded), loaded.problems)
    tables.write(table, tables.display(table), tmp_path, "table")
    written = pd.read_csv(tmp_path / "table.csv")  # what a user reads back
    hand = _by_hand(analysis_runs)
    assert len(written) == len(hand) == 7
    for _, row in written.iterrows():
        h = hand[(row["sweep"], row["method"])]
        base = hand[(row["sweep"], h["baseline"])]
        expected = {
            "seeds": h["seeds"], "final_mean": statistics.mean(h["final"]),
            "final_std": _std(h["final"]), "best_mean": statistics.mean(h["best"]),
            "best_std": _std(h["best"]), "bits_mean": statistics.mean(h["bits"]),
            "floats_mean": statistics.mean(h["bits"]) / 32,
            "bytes_mean": statistics.mean(h["bits"]) / 8,
            "train_time_s_mean": statistics.mean(h["times"]),
            "reduction_x": statistics.mean(base["bits"]) / statistics.mean(h["bits"]),
            "speedup_x": statistics.mean(base["times"]) / statistics.mean(h["times"]),
            "compression_x": statistics.mean(h["dense"]) / statistics.mean(h["bits"]),
            "critical_mean": statistics.mean(h["critical"]) if h["critical"] else math.nan,
        }
        for column, value in expected.items():
            assert _close(float(row[column]), float(value)), (row["method"], column)
    # the fixture shows what the tables are for: Accordion between rank 1 and rank 2 in data
    t1 = written[written["sweep"] == "table1"].set_index("method")
    assert t1.at["rank1", "bits_mean"] < t1.at["accordion_rank2_rank1", "bits_mean"] \
        < t1.at["rank2", "bits_mean"]
    assert 0 < t1.at["accordion_rank2_rank1", "critical_mean"] < 1


@pytest.mark.slow
def test_adacomp_effective_compression_per_layer_type(analysis_runs):
    loaded = load_records(analysis_runs)
    run = next(r for r in read_by_hand(analysis_runs) if r["cfg"]["method"] == "adacomp")
    types = reference.attach_layer_types(tables.layer_type_table(tables.run_stats(loaded)),
                                         reference.load_reference())
    ada = types[types["method"] == "adacomp"].set_index("layer_type")
    for kind, bin_size, published in (("conv", 50, 40.0), ("fc", 500, 200.0)):
        sent = sum(r[f"comm/bits_{kind}"] for r in run["rows"])
        dense = sum(r[f"comm/bits_dense_{kind}"] for r in run["rows"])
        assert ada.at[kind, "effective_x_mean"] == pytest.approx(dense / sent, rel=1e-12)
        assert ada.at[kind, "bin_size"] == bin_size and ada.at[kind, "published"] == published
    # the conv and FC layers' bits are part of comm/bits (the rest: uncompressed 1-D tensors)
    row = run["rows"][0]
    assert row["comm/bits_conv"] + row["comm/bits_fc"] < row["comm/bits"]
    assert not types[types["method"] == "none"].shape[0]  # nothing compressed, no row


# ---- the reference join, on frames ----------------------------------------------------------
def _group_frame(reference_rows: pd.DataFrame, scale: str = "paper") -> pd.DataFrame:
    """A table with one run group per reference row (paper-scale runs of every table)."""
    rows = []
    sweeps = {str(i): f"table{i}" for i in range(1, 7)} | {"fig9": "fig9", "fig10": "fig10"}
    for _, ref in reference_rows.iterrows():
        metric = "test/perplexity" if ref["metric"].endswith("perplexity") else "test/accuracy"
        rows.append({"sweep": sweeps[ref["table"]], "scale": scale,
                     "dataset.name": ref["dataset"] if scale == "paper" else "digits",
                     "model.name": ref["model"], "compressor.name": ref["compressor"],
                     "method": ref["setting"], "variant": "authors", "metric": metric,
                     "final_mean": 50.0, "final_std": 0.5, "bits_mean": 1.0,
                     "train_time_s_mean": 1.0})
    return pd.DataFrame(rows).drop_duplicates(subset=list(IDENTITY))


def test_every_published_row_of_a_table_finds_its_run_group():
    ref = reference.load_reference()
    tabled = ref[ref["table"].isin([*map(str, range(1, 7)), "fig9", "fig10"])]
    for scale in ("paper", "tiny"):  # at tiny scale an embedded dataset stands in
        table = _group_frame(tabled, scale)
        joined, unmatched = reference.attach_published(table, ref)
        per_group = tabled[tabled["metric"].isin(list(reference.GROUP_METRICS))]
        assert unmatched.empty
        assert joined["published"].notna().sum() == len(per_group) + 1 == 57 + 3 + 1
        # fig10's gap: its sweep has no batch512 group; table5's (same model and dataset) serves
        gap = joined[joined["sweep"] == "fig10"].iloc[0]
        assert gap["published"] == 1.6 and gap["ours"] == 0.0
        for _, ref_row in per_group.iterrows():
            hit = joined[(joined["model.name"] == ref_row["model"])
                         & (joined["method"] == ref_row["setting"])
                         & (joined["sweep"].map(reference.table_label) == ref_row["table"])]
            assert len(hit) == 1 and hit.iloc[0]["published"] == ref_row["value"]
            assert hit.iloc[0]["diff"] == pytest.approx(50.0 - ref_row["value"])


def test_reference_join_rules():
    ref = reference.load_reference()
    # a paper-scale run on another dataset does not take a published number
    wrong = _group_frame(ref[(ref["table"] == "1") & (ref["model"] == "resnet18")])
    wrong["dataset.name"] = "cifar100"
    assert reference.attach_published(wrong, ref)[0]["published"].isna().all()
    # fig10's gap: the batch512 run's final accuracy minus the row's
    fig10 = pd.concat([_group_frame(ref[ref["table"] == "fig10"]),
                       _group_frame(ref[ref["table"] == "fig10"]).assign(method="batch512",
                                                                         final_mean=52.1)])
    fig10["sweep"] = "fig10"
    joined, unmatched = reference.attach_published(fig10, ref)
    row = joined.set_index("method").loc["accordion_batch512_batch16384"]
    assert unmatched.empty and row["published"] == 1.6 and row["ours"] == pytest.approx(2.1)
    # headline claims take the largest value among the matching rows of any table
    table = _group_frame(ref[ref["table"].isin(["1", "3", "5"])]).assign(
        reduction_x=1.0, speedup_x=1.0)
    acc = table["method"].str.startswith("accordion")
    table.loc[acc & (table["compressor.name"] == "topk"), "reduction_x"] = [2.0, 3.0, 2.5]
    claims = reference.headlines(table, ref).set_index("claim")
    topk = claims.loc["max_communication_reduction_x (powersgd|topk, accordion)"]
    assert topk["published"] == 3.7 and topk["ours"] == 3.0 and "googlenet" in topk["where"]
    assert reference.table_label("table4") == "4" and reference.table_label("adacomp") == \
        "adacomp-t2"


def test_a_users_reference_file_replaces_ours(tmp_path):
    mine = tmp_path / "paper.csv"
    mine.write_text("table,dataset,model,compressor,setting,metric,value,source\n"
                    "1,cifar10,resnet18,powersgd,rank2,final_test_accuracy,94.5,paper-table-1\n")
    ref = reference.load_reference(mine)
    table = _group_frame(reference.load_reference().query("table == '1' and model == "
                                                          "'resnet18'"))
    joined, unmatched = reference.attach_published(table, ref)
    assert joined.set_index("method").at["rank2", "source"] == "paper-table-1"
    assert joined["published"].notna().sum() == 1 and unmatched.empty
    (tmp_path / "bad.csv").write_text("table,model,value\n1,resnet18,3\n")
    with pytest.raises(ValueError, match=r"no column\(s\) \['dataset', 'compressor'"):
        reference.load_reference(tmp_path / "bad.csv")


def test_baseline_is_looked_up_in_the_same_variant_first():
    def group(method: str, variant: str, bits: float) -> dict:
        return {"sweep": "table3", "scale": "tiny", "dataset.name": "d", "model.name": "m",
                "compressor.name": "topk", "method": method, "variant": variant, "seed": 0,
                "baseline": "k0.99", "metric": "test/accuracy", "final": 90.0, "best": 91.0,
                "bits": bits, "bits_dense": 100.0, "train_time_s": bits, "critical": math.nan,
                "conv_x": math.nan, "fc_x": math.nan, "floats": bits / 32, "bytes": bits / 8,
                "conv_bin": math.nan, "fc_bin": math.nan}

    stats = pd.DataFrame([group("k0.99", "authors", 80.0), group("k0.99", "ours", 40.0),
                          group("k0.10", "authors", 10.0), group("k0.10", "ours", 10.0),
                          group("k0.10", "ef-off", 20.0)])
    table = tables.group_table(stats).set_index(["method", "variant"])
    assert table.at[("k0.10", "authors"), "reduction_x"] == 8.0
    assert table.at[("k0.10", "ours"), "reduction_x"] == 4.0
    # a variant without its own baseline run: the first variant that has one, named
    assert table.at[("k0.10", "ef-off"), "reduction_x"] == 4.0
    assert table.at[("k0.10", "ef-off"), "baseline_used"] == "k0.99 (authors)"
    order = list(table.index)
    assert order[:2] == [("k0.99", "authors"), ("k0.99", "ours")]


def test_markdown_and_latex_writers(tmp_path):
    shown = pd.DataFrame({"method": ["accordion_k0.99_k0.10", "k|0"],
                          "final accuracy (%)": ["94.1 ± 0.2", "—"]})
    paths = tables.write(shown, shown, tmp_path, "t", "A caption with 50% & more")
    md = paths[1].read_text().splitlines()
    assert md[2] == "| method | final accuracy (%) |" and md[5] == "| k\\|0 | — |"
    tex = paths[2].read_text()
    for line in (r"\toprule", r"\midrule", r"\bottomrule", r"\begin{tabular}{ll}",
                 r"accordion\_k0.99\_k0.10 & 94.1 $\pm$ 0.2 \\", r"final accuracy (\%)",
                 r"\caption{A caption with 50\% \& more}"):
        assert line in tex, line
    assert pd.read_csv(paths[0]).shape == (2, 2)
