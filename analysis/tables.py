"""The papers' tables from the loaded frames: one row per run group, mean +- std over seeds.

:func:`run_stats` reduces each run to its numbers; :func:`group_table` aggregates them per
group (docs/run-record.md: sweep, scale, dataset, model, compressor, method, variant);
:func:`display` turns a table into the strings the markdown / LaTeX files show, and
:func:`write` writes ``<name>.md``, ``<name>.csv`` (every number, unrounded) and ``<name>.tex``
(booktabs).

Data sent is ``comm/bits`` summed over the run's epochs: the payload one worker put into its
gradient messages under the papers' accounting (core/record.py): 32 bits per element for fp32,
PowerSGD's P and Q, Top-K's values and indices (64 bits per kept element), AdaComp's 8/16-bit
sparse ternary encoding. ``floats`` = bits / 32 (the Accordion authors count floats per worker:
Top-K's index as one float), ``bytes`` = bits / 8. ``reduction_x`` divides the data of the
group's ``baseline`` method (its config key: the low-compression or small-batch method of the
same scale, dataset and model; of the same sweep and variant where it ran in them, see
:func:`find_method`) by this group's;
``speedup_x`` does the same with the training time, the sum of ``time/epoch_s`` (validation and
checkpoints excluded, as the authors timed it). ``compression_x`` is fp32's data over ours;
``conv_x`` / ``fc_x`` are the same for the compressed conv kernels / FC and LSTM matrices alone
(AdaComp's effective compression per layer type).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from pathlib import Path

import numpy as np
import pandas as pd

from analysis import provenance
from analysis.load import IDENTITY, Frames

BITS_PER_FLOAT, BITS_PER_BYTE = 32, 8
VARIANT_ORDER = ("authors", "ours")  # published, ours-as-the-authors-ran-it, ours-with-EF
LAYER_TYPES = ("conv", "fc")
AGGREGATED = ("final", "best", "bits", "floats", "bytes", "bits_dense", "train_time_s",
              "critical", "conv_x", "fc_x")  # per run; the tables show mean and std
PROVENANCE_SHOWN = ("fingerprints", "commits", "machines", "provenance_warning")


# ---- numbers ------------------------------------------------------------------------------
def run_stats(frames: Frames) -> pd.DataFrame:
    """One row per run: identity, seed, baseline, and the numbers the tables aggregate."""
    runs, epochs = frames.runs, frames.epochs
    grouped = epochs.groupby("run_id")
    per_run = pd.DataFrame({
        "bits": grouped["comm/bits"].sum(min_count=1) if "comm/bits" in epochs else np.nan,
        "bits_dense": grouped["comm/bits_dense"].sum(min_count=1)
        if "comm/bits_dense" in epochs else np.nan,
        "train_time_s": grouped["time/epoch_s"].sum(min_count=1)
        if "time/epoch_s" in epochs else np.nan,
        "critical": _critical_fraction(epochs).groupby(epochs["run_id"]).mean(),
    })
    for kind in LAYER_TYPES:
        sent, dense = f"comm/bits_{kind}", f"comm/bits_dense_{kind}"
        if sent in epochs and dense in epochs:
            ratio = grouped[dense].sum() / grouped[sent].sum()
            per_run[f"{kind}_x"] = ratio.where(np.isfinite(ratio))
        else:
            per_run[f"{kind}_x"] = np.nan
    keys = ["run_id", *IDENTITY, "seed", "baseline", "metric", "final", "best", "problem",
            *provenance.COLUMNS]
    stats = runs[[k for k in keys if k in runs]].merge(per_run, left_on="run_id",
                                                      right_index=True, how="left")
    stats["floats"] = stats["bits"] / BITS_PER_FLOAT
    stats["bytes"] = stats["bits"] / BITS_PER_BYTE
    for kind in LAYER_TYPES:
        column = f"compressor.{kind}_bin_size"
        stats[f"{kind}_bin"] = runs[column].to_numpy() if column in runs else np.nan
    return stats


def _critical_fraction(epochs: pd.DataFrame) -> pd.Series:
    """Per epoch row, the fraction of layers (or the model) in a critical regime (NaN: none)."""
    columns = [c for c in epochs.columns if c.startswith("critical/")]
    if not columns:
        return pd.Series(np.nan, index=epochs.index)
    return epochs[columns].mean(axis=1)


def group_table(stats: pd.DataFrame, problems: pd.DataFrame | None = None) -> pd.DataFrame:
    """Mean and std (over seeds) per run group, with reduction and speed-up vs the baseline.

    ``seeds`` counts the group's runs with a final metric (``seed_list`` names their seeds);
    ``incomplete`` those of them kept with a problem (``include_incomplete``), ``skipped`` the
    left-out runs (``problems`` not in ``stats``); groups whose every run was left out get a row
    with ``seeds`` 0. ``fingerprints``, ``commits``, ``machines`` and ``provenance_warning``
    say which machines and code made the group's runs (:func:`analysis.provenance.cell`).
    """
    rows = []
    for key, runs in stats.groupby(list(IDENTITY), sort=False):
        row = dict(zip(IDENTITY, key, strict=True))
        row["baseline"] = _first(runs["baseline"])
        row["metric"] = _first(runs["metric"])
        counted = runs[pd.to_numeric(runs["final"], errors="coerce").notna()]
        row["seeds"] = len(counted)
        row["seed_list"] = " ".join(str(s) for s in sorted(counted["seed"].dropna().unique()))
        row["incomplete"] = int(counted["problem"].notna().sum()) if "problem" in counted else 0
        row.update(provenance.cell(runs))
        for column in AGGREGATED:
            row[f"{column}_mean"], row[f"{column}_std"] = _mean_std(runs[column])
        row["conv_bin"], row["fc_bin"] = _first(runs["conv_bin"]), _first(runs["fc_bin"])
        rows.append(row)
    if problems is not None and not problems.empty:
        problems = problems[~problems["run_id"].isin(stats["run_id"])]
        rows += _skipped_only(rows, problems)
    table = pd.DataFrame(rows)
    if table.empty:
        return table
    for column in ("baseline", "metric", "conv_bin", "fc_bin",
                   *(f"{c}_{s}" for c in AGGREGATED for s in ("mean", "std"))):
        if column not in table:  # only groups whose every run was left out
            table[column] = None if column in ("baseline", "metric") else math.nan
    table["skipped"] = _skipped(table, problems)
    table["compression_x"] = table["bits_dense_mean"] / table["bits_mean"]
    table = _against_baseline(table)
    return sort(table)


def _mean_std(values: pd.Series) -> tuple[float, float]:
    values = values.dropna().astype(float)
    if values.empty:
        return math.nan, math.nan
    return float(values.mean()), float(values.std(ddof=1)) if len(values) > 1 else math.nan


def _first(values: pd.Series) -> object:
    values = values.dropna()
    return values.iloc[0] if not values.empty else None


def _skipped_only(rows: list[dict], problems: pd.DataFrame) -> list[dict]:
    """Rows for groups whose every run was left out (identity known from the config)."""
    seen = {tuple(r[k] for k in IDENTITY) for r in rows}
    extra = []
    for key, _ in problems.dropna(subset=list(IDENTITY)).groupby(list(IDENTITY), sort=False):
        if key not in seen:
            extra.append({**dict(zip(IDENTITY, key, strict=True)), "seeds": 0, "seed_list": "",
                          "incomplete": 0, **dict.fromkeys(PROVENANCE_SHOWN, "")})
            seen.add(key)
    return extra


def _skipped(table: pd.DataFrame, problems: pd.DataFrame | None) -> list[int]:
    if problems is None or problems.empty:
        return [0] * len(table)
    counts = problems.dropna(subset=list(IDENTITY)).groupby(list(IDENTITY)).size()
    return [int(counts.get(tuple(r[k] for k in IDENTITY), 0)) for _, r in table.iterrows()]


def find_method(table: pd.DataFrame, row: pd.Series, method: str) -> pd.Series | None:
    """The group of ``method`` for ``row``: same scale, dataset and model; preferably the same
    sweep, then the same variant (a baseline may have run in another sweep or only once)."""
    keys = ["scale", "dataset.name", "model.name"]
    found = table[(table[keys] == row[keys]).all(axis=1) & (table["method"] == method)]
    if found.empty:
        return None
    rank = sorted(found.index, key=lambda i: (found.at[i, "sweep"] != row["sweep"],
                                              found.at[i, "variant"] != row["variant"],
                                              found.at[i, "sweep"], found.at[i, "variant"]))
    return found.loc[rank[0]]


def _against_baseline(table: pd.DataFrame) -> pd.DataFrame:
    """``reduction_x``, ``speedup_x``, ``gap`` (baseline final - final) and which baseline."""
    out = table.copy()
    for column in ("reduction_x", "speedup_x", "gap"):
        out[column] = math.nan
    out["baseline_used"] = ""
    for i, row in table.iterrows():
        b = find_method(table, row, row["baseline"]) if isinstance(row.get("baseline"), str) \
            else None
        if b is None:
            continue
        out.at[i, "reduction_x"] = b["bits_mean"] / row["bits_mean"]
        out.at[i, "speedup_x"] = b["train_time_s_mean"] / row["train_time_s_mean"]
        out.at[i, "gap"] = b["final_mean"] - row["final_mean"]
        where = [v for v, same in ((b["sweep"], b["sweep"] == row["sweep"]),
                                   (b["variant"], b["variant"] == row["variant"])) if not same]
        out.at[i, "baseline_used"] = b["method"] + (f" ({', '.join(where)})" if where else "")
    return out


def sort(table: pd.DataFrame) -> pd.DataFrame:
    """Rows in reading order: dataset, model, then the baseline, other methods, Accordion
    methods; within a method the variants (authors, ours, others)."""
    def method_rank(row: pd.Series) -> tuple[int, str]:
        if row["method"] == row.get("baseline"):
            return 0, row["method"]
        return (2 if str(row["method"]).startswith("accordion") else 1), row["method"]

    def variant_rank(v: str) -> tuple[int, str]:
        return (VARIANT_ORDER.index(v) if v in VARIANT_ORDER else len(VARIANT_ORDER)), v

    order = sorted(table.index, key=lambda i: (
        table.at[i, "sweep"], table.at[i, "scale"], table.at[i, "dataset.name"],
        table.at[i, "model.name"], method_rank(table.loc[i]), variant_rank(table.at[i, "variant"]),
        table.at[i, "compressor.name"]))
    return table.loc[order].reset_index(drop=True)


def layer_type_table(stats: pd.DataFrame) -> pd.DataFrame:
    """Effective compression per compressed layer type (conv, fc) and run group: one row per
    group and type that sent such layers, mean +- std over seeds, with the type's bin size."""
    rows = []
    for key, runs in stats.groupby(list(IDENTITY), sort=False):
        for kind in LAYER_TYPES:
            mean, std = _mean_std(runs[f"{kind}_x"])
            if math.isnan(mean):
                continue
            bins = runs[f"{kind}_bin"].dropna()
            rows.append({**dict(zip(IDENTITY, key, strict=True)), "layer_type": kind,
                         "bin_size": int(bins.iloc[0]) if not bins.empty else None,
                         "seeds": int(runs[f"{kind}_x"].notna().sum()),
                         "effective_x_mean": mean, "effective_x_std": std})
    return pd.DataFrame(rows, columns=[*IDENTITY, "layer_type", "bin_size", "seeds",
                                       "effective_x_mean", "effective_x_std"])


def whatif_table(rows: pd.DataFrame, runs: pd.DataFrame) -> pd.DataFrame:
    """:func:`analysis.whatif.sweep`'s rows per run group and (eta, interval): mean (over
    seeds) critical fraction logged and replayed, replayed / logged data (mean, std), and the
    replayed data in floats; a run that could not be replayed keeps its ``note``."""
    columns = [*IDENTITY, "eta", "interval", "own", "seeds", "critical_logged",
               "critical_replay", "replay_over_logged_mean", "replay_over_logged_std",
               "floats_replay", "note"]
    if rows.empty:
        return pd.DataFrame(columns=columns)
    for column in ("eta", "interval", "own", "critical_logged", "critical_replay",
                   "bits_replay", "replay_over_logged", "note"):
        if column not in rows:
            rows[column] = np.nan
    merged = rows.merge(runs[["path", *IDENTITY, "seed"]], left_on="run_dir", right_on="path")
    out = []
    for key, part in merged.groupby([*IDENTITY, "eta", "interval"], sort=False, dropna=False):
        ratio = pd.to_numeric(part["replay_over_logged"], errors="coerce")
        mean, std = _mean_std(ratio)
        notes = part["note"].dropna()
        out.append({**dict(zip([*IDENTITY, "eta", "interval"], key, strict=True)),
                    "own": bool(part["own"].fillna(False).any()), "seeds": len(part),
                    "critical_logged": part["critical_logged"].astype(float).mean(),
                    "critical_replay": part["critical_replay"].astype(float).mean(),
                    "replay_over_logged_mean": mean, "replay_over_logged_std": std,
                    "floats_replay": pd.to_numeric(part["bits_replay"], errors="coerce").mean()
                    / BITS_PER_FLOAT,
                    "note": notes.iloc[0] if not notes.empty else ""})
    return pd.DataFrame(out, columns=columns)


# ---- display ------------------------------------------------------------------------------
def mean_std(mean: float, std: float, digits: int = 2) -> str:
    """``94.49 ± 0.12``; the mean alone for one seed; ``n/a`` without a value."""
    if mean is None or (isinstance(mean, float) and math.isnan(mean)):
        return "n/a"
    if std is None or (isinstance(std, float) and math.isnan(std)):
        return f"{mean:.{digits}f}"
    return f"{mean:.{digits}f} ± {std:.{digits}f}"


def si(value: float, unit: str = "") -> str:
    """``123.4 M`` style: three significant digits and an SI prefix."""
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return "n/a"
    for factor, prefix in ((1e12, "T"), (1e9, "G"), (1e6, "M"), (1e3, "k")):
        if abs(value) >= factor:
            return f"{value / factor:.3g} {prefix}{unit}".strip()
    return f"{value:.3g} {unit}".strip()


def times(value: float) -> str:
    """``3.71x`` or ``n/a``."""
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return "n/a"
    return f"{value:.2f}x"


def signed(value: float, digits: int = 2) -> str:
    """``+0.12`` / ``-1.30``, or an em dash where there is nothing to compare with."""
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return "—"
    return f"{value:+.{digits}f}"


def varying(table: pd.DataFrame, columns: Sequence[str]) -> list[str]:
    """The identity columns whose value differs between rows (the others go in the caption)."""
    return [c for c in columns if c in table and table[c].nunique(dropna=False) > 1]


def _identity_columns(table: pd.DataFrame) -> pd.DataFrame:
    """The first columns of a shown table: the identity keys that vary (the others go in the
    caption), model, method, and the variant unless every row is ``ours``."""
    shown = varying(table, ("sweep", "scale", "dataset.name", "compressor.name"))
    out = pd.DataFrame({_LABELS.get(c, c): table[c] for c in shown})
    out["model"], out["method"] = table["model.name"], table["method"]
    if (table["variant"] != "ours").any():
        out["variant"] = table["variant"]
    return out


def display(table: pd.DataFrame) -> pd.DataFrame:
    """The strings of the main table: identity columns that vary, then the numbers."""
    out = _identity_columns(table)
    out["seeds"] = [seeds(s, i, k) for s, i, k in
                    zip(table["seeds"], table["incomplete"], table["skipped"], strict=True)]
    names = table["metric"].map(METRIC_NAMES).fillna("metric")
    metric = names.iloc[0] if names.nunique() == 1 else "metric"
    if metric == "metric":
        out["metric"] = names
    out[f"final {metric}"] = [mean_std(m, s) for m, s in
                              zip(table["final_mean"], table["final_std"], strict=True)]
    out[f"best {metric}"] = [mean_std(m, s) for m, s in
                             zip(table["best_mean"], table["best_std"], strict=True)]
    if "published" in table:
        out["published"] = [_published(r) for _, r in table.iterrows()]
        out["diff"] = [signed(d) for d in table["diff"]]
    out["data sent (floats)"] = [si(v) for v in table["floats_mean"]]
    out["data sent (bytes)"] = [si(v, "B") for v in table["bytes_mean"]]
    out["vs fp32"] = [times(v) for v in table["compression_x"]]
    out["reduction"] = [times(v) for v in table["reduction_x"]]
    out["train time (s)"] = [mean_std(m, s, 1) for m, s in
                             zip(table["train_time_s_mean"], table["train_time_s_std"],
                                 strict=True)]
    out["speed-up"] = [times(v) for v in table["speedup_x"]]
    if table["critical_mean"].notna().any():
        out["critical (%)"] = [mean_std(100 * m, 100 * s, 0) if not math.isnan(m) else "—"
                               for m, s in zip(table["critical_mean"], table["critical_std"],
                                               strict=True)]
    return with_provenance(out, table)


TERMINAL = ("seeds", "published", "diff", "data sent (floats)", "reduction", "critical (%)")


def terminal(shown: pd.DataFrame) -> str:
    """The main columns of a shown table (:func:`display`) as aligned text for a terminal: the
    identity columns, seeds, final metric, published number and difference, data sent,
    reduction and critical share (the files hold every column)."""
    identity = list(shown.columns[:list(shown.columns).index("seeds")])
    keep = [c for c in shown.columns
            if c in identity or c in TERMINAL or c.startswith("final ")]
    return shown[keep].to_string(index=False)


def seeds(counted: int, incomplete: int, skipped: int) -> str:
    """``3``, ``3 (1 incomplete)``, ``2 (+1 skipped)``: runs with a final metric, how many of
    them are kept incomplete (``--include-incomplete``), and the runs left out."""
    notes = [f"{incomplete} incomplete" if incomplete else "", f"+{skipped} skipped"
             if skipped else ""]
    return " ".join([str(counted), *(f"({n})" for n in notes if n)])


def with_provenance(shown: pd.DataFrame, table: pd.DataFrame) -> pd.DataFrame:
    """``shown`` with the machines (fingerprints) and commits of each row's runs, and a
    ``warning`` column where some row mixes machines or commits (or a run moved)."""
    out = shown.copy()
    out["machines"], out["commits"] = table["fingerprints"], table["commits"]
    if (table["provenance_warning"] != "").any():
        out["warning"] = table["provenance_warning"]
    return out


def machine_legend(table: pd.DataFrame) -> str:
    """One sentence naming each fingerprint of ``table``'s rows by its machine label."""
    labels = sorted({part for text in table["machines"] if text for part in text.split("; ")})
    if not labels:
        return "Machines: unknown (runs recorded without provenance)."
    return "Machines: " + "; ".join(labels) + "."


_LABELS = {"dataset.name": "dataset", "compressor.name": "compressor"}
METRIC_NAMES = {"test/accuracy": "accuracy (%)", "test/perplexity": "perplexity"}


def _published(row: pd.Series) -> str:
    if not row.get("published_metric"):
        return "none published"
    value = f"{row['published']:g}"
    if row["published_metric"].startswith("accuracy_gap_vs_"):
        value += f" (gap vs {row['published_metric'].removeprefix('accuracy_gap_vs_')})"
    if row["source"] != "official-logs":
        value += f" [{row['source']}]"
    return value


def display_layer_types(types: pd.DataFrame) -> pd.DataFrame:
    """The strings of the per-layer-type table."""
    out = _identity_columns(types)
    out["layers"] = types["layer_type"].map({"conv": "conv", "fc": "FC / LSTM"})
    out["bin size"] = [str(int(b)) if b is not None and not pd.isna(b) else "—"
                       for b in types["bin_size"]]
    out["seeds"] = types["seeds"]
    out["effective compression"] = [mean_std(m, s, 1) + "x" for m, s in
                                    zip(types["effective_x_mean"], types["effective_x_std"],
                                        strict=True)]
    if "published" in types:
        out["published"] = [f"{p:g}x" if not math.isnan(p) else "none published"
                            for p in types["published"]]
        out["diff"] = [signed(d, 1) for d in types["diff"]]
    return out


def display_whatif(table: pd.DataFrame) -> pd.DataFrame:
    """The strings of the what-if table."""
    out = _identity_columns(table)
    out["eta"] = [f"{e:g}" if not pd.isna(e) else "—" for e in table["eta"]]
    out["interval"] = [f"{int(i)}" if not pd.isna(i) else "—" for i in table["interval"]]
    out["own"] = ["yes" if own else "" for own in table["own"]]
    out["seeds"] = table["seeds"]
    out["critical logged (%)"] = [f"{100 * v:.0f}" if not pd.isna(v) else "—"
                                  for v in table["critical_logged"]]
    out["critical replayed (%)"] = [f"{100 * v:.0f}" if not pd.isna(v) else "—"
                                    for v in table["critical_replay"]]
    out["data replayed / logged"] = [mean_std(m, s, 3) for m, s in
                                     zip(table["replay_over_logged_mean"],
                                         table["replay_over_logged_std"], strict=True)]
    out["data replayed (floats)"] = [si(v) for v in table["floats_replay"]]
    if (table["note"] != "").any():
        out["note"] = table["note"]
    return out


# ---- files ----------------------------------------------------------------------------------
def markdown(frame: pd.DataFrame) -> str:
    """A GitHub markdown table of a frame of strings."""
    def cell(value: object) -> str:
        return str(value).replace("|", "\\|").replace("\n", " ")

    lines = ["| " + " | ".join(cell(c) for c in frame.columns) + " |",
             "|" + "|".join("---" for _ in frame.columns) + "|"]
    lines += ["| " + " | ".join(cell(v) for v in row) + " |"
              for row in frame.itertuples(index=False)]
    return "\n".join(lines) + "\n"


_TEX = {"\\": r"\textbackslash{}", "&": r"\&", "%": r"\%", "$": r"\$", "#": r"\#",
        "_": r"\_", "{": r"\{", "}": r"\}", "~": r"\textasciitilde{}",
        "^": r"\textasciicircum{}", "±": r"$\pm$", "—": "---", "×": r"$\times$"}


def latex(frame: pd.DataFrame, caption: str = "") -> str:
    """A booktabs ``tabular`` (in a ``table`` with ``caption``) of a frame of strings."""
    def tex(value: object) -> str:
        return "".join(_TEX.get(ch, ch) for ch in str(value))

    lines = [r"\begin{table}[t]", r"\centering"]
    if caption:
        lines.append(rf"\caption{{{tex(caption)}}}")
    lines += [r"\begin{tabular}{" + "l" * len(frame.columns) + "}", r"\toprule",
              " & ".join(tex(c) for c in frame.columns) + r" \\", r"\midrule"]
    lines += [" & ".join(tex(v) for v in row) + r" \\" for row in frame.itertuples(index=False)]
    lines += [r"\bottomrule", r"\end{tabular}", r"\end{table}"]
    return "\n".join(lines) + "\n"


def write(numbers: pd.DataFrame, shown: pd.DataFrame, out_dir: Path, name: str,
          caption: str = "") -> list[Path]:
    """``<name>.csv`` (``numbers``), ``<name>.md`` and ``<name>.tex`` (``shown``)."""
    out_dir.mkdir(parents=True, exist_ok=True)
    paths = [out_dir / f"{name}.csv", out_dir / f"{name}.md", out_dir / f"{name}.tex"]
    numbers.to_csv(paths[0], index=False)
    paths[1].write_text((f"{caption}\n\n" if caption else "") + markdown(shown))
    paths[2].write_text(latex(shown, caption))
    return paths
