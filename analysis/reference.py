"""The published numbers (``analysis/reference/``) and how they join our tables.

A reference row ``(table, dataset, model, compressor, setting, metric, value, source)`` joins a
group of runs when ``table`` is the label of the runs' sweep (:func:`table_label`) and
``dataset``, ``model``, ``compressor``, ``setting`` match ``dataset.name``, ``model.name``,
``compressor.name``, ``method`` (:func:`matches`: ``all`` matches anything, ``a|b`` either
value, the setting ``accordion`` every Accordion method). The dataset must match only at
``scale=paper``: a tiny run's embedded dataset stands in for the paper's (within a table,
model, compressor and setting identify the row). Per-group metrics
(:data:`GROUP_METRICS`, ``accuracy_gap_vs_<method>``) give the table its ``published`` column;
AdaComp's ``effective_compression_x`` joins the per-layer-type table; rows without a table
(headline claims over all sweeps) are compared with the best of a sweep by :func:`headlines`.
"""

from __future__ import annotations

from pathlib import Path

import pandas as pd

from analysis.tables import find_method

REFERENCE_DIR = Path(__file__).resolve().parent / "reference"
RESULTS = REFERENCE_DIR / "reference_results.csv"
CURVES = REFERENCE_DIR / "official_curves.csv"
COLUMNS = ("table", "dataset", "model", "compressor", "setting", "metric", "value", "source")
CURVE_COLUMNS = ("table", "dataset", "model", "compressor", "setting", "epoch", "metric",
                 "value")
# metric -> the test metric of our runs it is compared with (final epoch, mean over seeds)
GROUP_METRICS = {"final_test_accuracy": "test/accuracy",
                 "final_test_perplexity": "test/perplexity"}
GAP = "accuracy_gap_vs_"  # + a method: that method's final accuracy minus the row's
HEADLINE_COLUMNS = {"max_communication_reduction_x": "reduction_x",
                    "max_wallclock_speedup_x": "speedup_x"}
EFFECTIVE = "effective_compression_x"
PAPER_SCALE = "paper"
LAYER_TYPE_MODELS = {"conv-layers": "conv", "fc-and-lstm-layers": "fc"}


def load_reference(path: str | Path | None = None) -> pd.DataFrame:
    """The reference CSV (default: the project's copy), every column a string but ``value``.

    Raises ValueError naming the file and the missing columns.
    """
    path = Path(path) if path is not None else RESULTS
    frame = _read(path, COLUMNS)
    for column in COLUMNS:
        if column != "value":
            frame[column] = frame[column].fillna("").astype(str)
    frame["value"] = pd.to_numeric(frame["value"], errors="coerce")
    return frame


def load_curves(path: str | Path | None = None) -> pd.DataFrame:
    """The authors' per-epoch test curves (``official_curves.csv``)."""
    frame = _read(Path(path) if path is not None else CURVES, CURVE_COLUMNS)
    frame["table"] = frame["table"].astype(str)
    return frame


def _read(path: Path, columns: tuple[str, ...]) -> pd.DataFrame:
    if not path.is_file():
        raise ValueError(f"reference: {path} not found")
    frame = pd.read_csv(path, dtype={"table": str})
    missing = [c for c in columns if c not in frame.columns]
    if missing:
        raise ValueError(f"reference: {path} has no column(s) {missing}; expected {list(columns)}")
    return frame


def table_label(sweep: str) -> str:
    """The reference ``table`` of a sweep: ``table3`` -> ``3``, ``adacomp`` -> ``adacomp-t2``."""
    if sweep.startswith("table") and sweep[5:].isdigit():
        return sweep[5:]
    return "adacomp-t2" if sweep == "adacomp" else sweep


def matches(pattern: str, value: str, setting: bool = False) -> bool:
    """Does a reference cell match our value (``all``, ``a|b``, ``accordion`` for settings)?"""
    if pattern == "all":
        return True
    if setting and pattern == "accordion":
        return value.startswith("accordion")
    return value in pattern.split("|")


def dataset_matches(pattern: str, row: pd.Series) -> bool:
    """The dataset must match at paper scale; at other scales the run's (embedded) dataset
    stands in for the paper's, so any dataset matches."""
    return matches(pattern, row["dataset.name"]) or row["scale"] != PAPER_SCALE


def _row_matches(ref: pd.Series, row: pd.Series) -> bool:
    return (dataset_matches(ref["dataset"], row)
            and matches(ref["model"], row["model.name"])
            and matches(ref["compressor"], row["compressor.name"])
            and matches(ref["setting"], row["method"], setting=True))


def group_rows(reference: pd.DataFrame, sweep: str) -> pd.DataFrame:
    """The reference rows that give a group of ``sweep`` its published number."""
    per_group = reference["metric"].isin(GROUP_METRICS) | reference["metric"].str.startswith(GAP)
    return reference[(reference["table"] == table_label(sweep)) & per_group]


def ours_for(ref: pd.Series, row: pd.Series, table: pd.DataFrame) -> float | None:
    """Our number for a reference row in a table row (None: the metric does not apply)."""
    metric = ref["metric"]
    if metric in GROUP_METRICS:
        return row["final_mean"] if row["metric"] == GROUP_METRICS[metric] else None
    if metric.startswith(GAP) and row["metric"] == "test/accuracy":
        other = find_method(table, row, metric.removeprefix(GAP))
        return None if other is None else other["final_mean"] - row["final_mean"]
    return None


def attach_published(table: pd.DataFrame, reference: pd.DataFrame) -> tuple[pd.DataFrame,
                                                                               pd.DataFrame]:
    """``table`` (one row per run group, :func:`analysis.tables.group_table`) with the columns
    ``published``, ``published_metric``, ``source``, ``ours`` (our number for that metric) and
    ``diff`` (ours - published); and the reference rows of the table's sweeps that no group
    matched (with a ``why`` column)."""
    out = table.reset_index(drop=True)
    for column in ("published", "ours", "diff"):
        out[column] = float("nan")
    out["published_metric"], out["source"] = "", ""
    unmatched = []
    for sweep in table["sweep"].unique():
        for _, ref in group_rows(reference, sweep).iterrows():
            hits = [i for i, row in out[out["sweep"] == sweep].iterrows()
                    if _row_matches(ref, row) and ours_for(ref, row, out) is not None]
            if not hits:
                unmatched.append({**ref.to_dict(), "sweep": sweep,
                                  "why": "no run group of this sweep"})
            for i in hits:
                if out.at[i, "published_metric"]:
                    continue  # a second reference row for the same group: the first is kept
                ours = ours_for(ref, out.loc[i], out)
                out.loc[i, ["published", "ours", "diff"]] = [ref["value"], ours,
                                                             ours - ref["value"]]
                out.loc[i, ["published_metric", "source"]] = [ref["metric"], ref["source"]]
    return out, pd.DataFrame(unmatched, columns=[*COLUMNS, "sweep", "why"])


def attach_layer_types(types: pd.DataFrame, reference: pd.DataFrame) -> pd.DataFrame:
    """The per-layer-type table (:func:`analysis.tables.layer_type_table`) with AdaComp's
    published effective compression (``published``, ``source``, ``diff``) where the reference
    has the layer type at the run's bin size for that type."""
    out = types.reset_index(drop=True)
    out["published"], out["diff"], out["source"] = float("nan"), float("nan"), ""
    refs = reference[reference["metric"] == EFFECTIVE]
    for i, row in out.iterrows():
        for _, ref in refs.iterrows():
            if (ref["table"] == table_label(row["sweep"])
                    and LAYER_TYPE_MODELS.get(ref["model"]) == row["layer_type"]
                    and dataset_matches(ref["dataset"], row)
                    and matches(ref["compressor"], row["compressor.name"])
                    and not pd.isna(row["bin_size"])
                    and ref["setting"] == f"bin{int(row['bin_size'])}"):
                out.loc[i, ["published", "diff"]] = [ref["value"],
                                                     row["effective_x_mean"] - ref["value"]]
                out.at[i, "source"] = ref["source"]
                break
    return out


def headlines(table: pd.DataFrame, reference: pd.DataFrame) -> pd.DataFrame:
    """The reference's claims over all sweeps (empty ``table``), each next to the largest value
    of its column among the matching rows of ``table`` (and which row gave it)."""
    rows = []
    for _, ref in reference[(reference["table"] == "")
                            & reference["metric"].isin(HEADLINE_COLUMNS)].iterrows():
        column = HEADLINE_COLUMNS[ref["metric"]]
        hits = table[[_row_matches(ref, row) for _, row in table.iterrows()]]
        hits = hits[hits[column].notna()] if column in hits else hits.iloc[0:0]
        best = hits.loc[hits[column].idxmax()] if not hits.empty else None
        rows.append({"claim": f"{ref['metric']} ({ref['compressor']}, {ref['setting']})",
                     "published": ref["value"], "source": ref["source"],
                     "ours": None if best is None else best[column],
                     "where": "no matching run group" if best is None else
                     f"{best['model.name']} {best['method']} ({best['variant']})"})
    return pd.DataFrame(rows, columns=["claim", "published", "source", "ours", "where"])
