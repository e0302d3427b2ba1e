"""The papers' figures from the loaded frames: a tidy data frame and a seaborn plot for each.

Each figure is a pair: ``<name>_data(frames, ...)`` returns exactly what is drawn (one row per
point; tests check these), and ``plot_<name>(data)`` draws it in the one style of the suite
(:data:`STYLE`, methods in the same colours in every figure). :func:`make_figures` writes every
figure that has data as ``<out>/<name>.png`` and ``.pdf`` and returns them with their data.

Panels are run groups' model (and dataset where a sweep has several); colours are methods,
line styles variants. Curves are means over seeds with a +-1 std band.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import matplotlib

matplotlib.use("Agg")  # files only, no display
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402
import pandas as pd  # noqa: E402
import seaborn as sns  # noqa: E402

from analysis.load import IDENTITY, Frames  # noqa: E402
from analysis.reference import PAPER_SCALE, table_label  # noqa: E402
from analysis.tables import BITS_PER_FLOAT, sort  # noqa: E402

STYLE = {"context": "paper", "style": "whitegrid", "palette": "colorblind", "font_scale": 0.9}
PANEL_WIDTH, PANEL_HEIGHT, MAX_COLUMNS = 4.2, 3.0, 3
RATIO_CLIP = 2.0  # ratios above (inf where the previous norm was 0) are drawn at the clip
ACCORDION = "accordion"


@dataclass
class Figure:
    """A written figure: its name, caption, the data drawn, and the files."""

    name: str
    caption: str
    data: pd.DataFrame
    paths: list[Path]


# ---- shared ---------------------------------------------------------------------------------
def _panel(frame: pd.DataFrame) -> pd.Series:
    """The panel title of each row: the model (with the dataset, scale where they vary)."""
    label = frame["model.name"].astype(str)
    for column in ("dataset.name", "scale"):
        if frame[column].nunique() > 1:
            label = frame[column].astype(str) + " " + label
    return label


def _with_identity(frames: Frames, columns: list[str]) -> pd.DataFrame:
    """``frames.epochs[columns]`` joined with each run's identity, seed and baseline."""
    keep = ["run_id", *IDENTITY, "seed", "baseline"]
    runs = frames.runs[[c for c in keep if c in frames.runs]]
    present = [c for c in columns if c in frames.epochs]
    out = frames.epochs[["run_id", "epoch", *present]].merge(runs, on="run_id")
    out["panel"] = _panel(out) if not out.empty else pd.Series(dtype=str)
    return out


def method_order(frame: pd.DataFrame) -> list[str]:
    """Methods in table order: baseline, the others, Accordion's."""
    groups = frame[list(IDENTITY) + ["baseline"]].drop_duplicates()
    return list(dict.fromkeys(sort(groups)["method"]))


Palette = dict[str, tuple[float, float, float]]


def palette(methods: list[str]) -> Palette:
    """The colour of every method, the same in every figure of a report."""
    colours = sns.color_palette(STYLE["palette"], max(len(methods), 1))
    return dict(zip(methods, colours, strict=False))


def _methods(data: pd.DataFrame, colours: Palette) -> dict[str, object]:
    """Seaborn keywords: colour by method (the methods of ``data`` in palette order, so that
    every panel's legend lists the same), line style or marker by variant."""
    present = set(data["method"])
    return {"hue": "method", "hue_order": [m for m in colours if m in present],
            "palette": colours, "style": "variant"}


def _grid(panels: list[str], rows: int = 1, height: float = PANEL_HEIGHT
          ) -> tuple[plt.Figure, np.ndarray]:
    columns = min(len(panels), MAX_COLUMNS)
    lines = math.ceil(len(panels) / columns)
    fig, axes = plt.subplots(lines * rows, columns, squeeze=False,
                             figsize=(PANEL_WIDTH * columns, height * lines * rows))
    for ax in axes.flat[len(panels) * rows:]:
        ax.set_visible(False)
    return fig, axes


def _first_seeds(frame: pd.DataFrame) -> pd.DataFrame:
    """One run per group: the lowest seed's."""
    first = (frame[["run_id", *IDENTITY, "seed"]].drop_duplicates()
             .sort_values("seed").groupby(list(IDENTITY)).head(1))
    return frame[frame["run_id"].isin(first["run_id"])]


def _group_label(frame: pd.DataFrame) -> pd.Series:
    label = frame["panel"] + " " + frame["method"]
    if frame["variant"].nunique() > 1:
        label += " (" + frame["variant"] + ")"
    return label


# ---- 1. test metric vs epoch, critical regimes shaded ---------------------------------------
def curves_data(frames: Frames) -> pd.DataFrame:
    """Per run and epoch: the test metric and the fraction of layers in a critical regime."""
    critical = [c for c in frames.epochs.columns if c.startswith("critical/")]
    data = _with_identity(frames, ["test/accuracy", "test/perplexity", *critical])
    if data.empty:
        return data
    metric = np.where(data["test/perplexity"].notna(), "test/perplexity", "test/accuracy") \
        if "test/perplexity" in data else np.full(len(data), "test/accuracy")
    data["metric"] = metric
    data["value"] = [row[m] for m, (_, row) in zip(metric, data.iterrows(), strict=True)]
    data["critical"] = data[critical].mean(axis=1) if critical else np.nan
    return data[["run_id", *IDENTITY, "seed", "baseline", "panel", "epoch", "metric", "value",
                 "critical"]].dropna(subset=["value"])


def plot_curves(data: pd.DataFrame, colours: Palette) -> plt.Figure:
    """Test metric vs epoch per panel; Accordion's critical epochs shaded in its colour."""
    panels = sorted(data["panel"].unique())
    fig, axes = _grid(panels)
    for ax, panel in zip(axes.flat, panels, strict=False):
        part = data[data["panel"] == panel]
        sns.lineplot(part, x="epoch", y="value", **_methods(data, colours), errorbar="sd", ax=ax,
                     legend=panel == panels[-1])
        shaded = part[part["method"].str.startswith(ACCORDION) & part["critical"].notna()]
        for method, rows in shaded.groupby("method"):
            for epoch, fraction in rows.groupby("epoch")["critical"].mean().items():
                if fraction > 0:
                    ax.axvspan(epoch - 0.5, epoch + 0.5, color=colours[method],
                               alpha=0.18 * fraction, lw=0)
        ax.set(title=panel, ylabel=part["metric"].iloc[0])
    _legend_outside(axes.flat[len(panels) - 1])
    fig.tight_layout()
    return fig


# ---- 2. at paper scale: our curve over the authors' -----------------------------------------
def official_data(frames: Frames, official: pd.DataFrame) -> pd.DataFrame:
    """Paper-scale groups with an authors' curve: ours (per run) and theirs, per epoch."""
    data = curves_data(frames)
    if data.empty:
        return data
    data = data[data["scale"] == PAPER_SCALE]
    rows = []
    for key, ours in data.groupby(["sweep", "dataset.name", "model.name", "compressor.name",
                                   "method"]):
        sweep, dataset, model, compressor, method = key
        theirs = official[(official["table"] == table_label(sweep))
                          & (official["dataset"] == dataset) & (official["model"] == model)
                          & (official["compressor"] == compressor)
                          & (official["setting"] == method)]
        if theirs.empty:
            continue
        for _, row in ours.iterrows():
            rows.append({"panel": f"{model} {method}", "who": f"ours ({row['variant']})",
                         "seed": row["seed"], "epoch": row["epoch"], "value": row["value"],
                         "metric": row["metric"]})
        for _, row in theirs.iterrows():
            rows.append({"panel": f"{model} {method}", "who": "authors' log", "seed": None,
                         "epoch": row["epoch"], "value": row["value"],
                         "metric": "test/" + row["metric"].removeprefix("test_")})
    return pd.DataFrame(rows, columns=["panel", "who", "seed", "epoch", "value", "metric"])


def plot_official(data: pd.DataFrame, colours: Palette) -> plt.Figure:
    """Ours (mean +- std over seeds) and the authors' curve, one panel per model and method."""
    panels = sorted(data["panel"].unique())
    fig, axes = _grid(panels)
    whos = sorted(data["who"].unique(), key=lambda w: (w != "authors' log", w))
    by_who = dict(zip(whos, ["black", *sns.color_palette(STYLE["palette"], len(whos))],
                      strict=False))  # colours by who, not method: the authors' in black
    for ax, panel in zip(axes.flat, panels, strict=False):
        part = data[data["panel"] == panel]
        sns.lineplot(part, x="epoch", y="value", hue="who", hue_order=whos, palette=by_who,
                     errorbar="sd", ax=ax, legend=panel == panels[-1], lw=1)
        ax.set(title=panel, ylabel=part["metric"].iloc[0])
    _legend_outside(axes.flat[len(panels) - 1])
    fig.tight_layout()
    return fig


# ---- 3. per-layer level heat map ------------------------------------------------------------
def levels_data(frames: Frames) -> pd.DataFrame:
    """Per layer and epoch, the level (rank, ratio, bin size) of the first seed of every group
    whose levels a per-layer scheduler set (its rows log ``critical/<layer>``)."""
    columns = [c for c in frames.epochs.columns if c.startswith("level/")]
    data = _with_identity(frames, columns)
    if data.empty or not columns:
        return pd.DataFrame(columns=["group", "layer", "epoch", "level"])
    accordion = [c for c in frames.epochs.columns
                 if c.startswith("critical/") and c != "critical/model"]
    scheduled = frames.epochs.loc[frames.epochs[accordion].notna().any(axis=1), "run_id"] \
        if accordion else []
    data = _first_seeds(data[data["run_id"].isin(set(scheduled))])
    long = data.melt(id_vars=["run_id", *IDENTITY, "panel", "epoch"], value_vars=columns,
                     var_name="layer", value_name="level").dropna(subset=["level"])
    long["layer"] = long["layer"].str.removeprefix("level/")
    long["group"] = _group_label(long)
    return long[["run_id", "group", "method", "layer", "epoch", "level"]]


def plot_levels(data: pd.DataFrame, colours: Palette) -> plt.Figure:
    """Layers x epochs, coloured by level, one panel per group."""
    groups = sorted(data["group"].unique())
    layers = data["layer"].nunique()
    fig, axes = _grid(groups, height=max(PANEL_HEIGHT, 0.14 * layers + 1.0))
    for ax, group in zip(axes.flat, groups, strict=False):
        part = data[data["group"] == group]
        order = list(dict.fromkeys(part["layer"]))
        grid = part.pivot_table(index="layer", columns="epoch", values="level").loc[order]
        sns.heatmap(grid, ax=ax, cmap="viridis", cbar_kws={"label": "level"},
                    yticklabels=True, xticklabels=max(1, grid.shape[1] // 10))
        ax.tick_params(axis="y", labelsize=5)
        ax.set(title=group, ylabel="")
    fig.tight_layout()
    return fig


# ---- 4. Accordion's ratio per layer vs eta --------------------------------------------------
def ratios_data(frames: Frames) -> pd.DataFrame:
    """At every check epoch, each layer's (or the model's) ratio, the run's eta, and whether
    the ratio reached eta."""
    columns = [c for c in frames.epochs.columns if c.startswith("ratio/")]
    data = _with_identity(frames, columns)
    out_columns = ["run_id", "group", "method", "seed", "layer", "epoch", "ratio", "eta",
                   "critical"]
    if data.empty or not columns:
        return pd.DataFrame(columns=out_columns)
    long = data.melt(id_vars=["run_id", *IDENTITY, "seed", "panel", "epoch"],
                     value_vars=columns, var_name="layer", value_name="ratio")
    long = long.dropna(subset=["ratio"])
    long["layer"] = long["layer"].str.removeprefix("ratio/")
    eta = frames.runs.set_index("run_id")["scheduler.eta"] if "scheduler.eta" in frames.runs \
        else pd.Series(dtype=float)
    long["eta"] = long["run_id"].map(eta)
    long["critical"] = long["ratio"] >= long["eta"]
    long["group"] = _group_label(long)
    return long[out_columns]


def plot_ratios(data: pd.DataFrame, colours: Palette) -> plt.Figure:
    """Ratios at the check epochs against the eta line (above: the next interval is critical)."""
    groups = sorted(data["group"].unique())
    fig, axes = _grid(groups)
    for ax, group in zip(axes.flat, groups, strict=False):
        part = data[data["group"] == group].assign(
            shown=lambda d: d["ratio"].clip(upper=RATIO_CLIP))
        sns.stripplot(part, x="epoch", y="shown", hue="critical", hue_order=[False, True],
                      palette={False: "tab:blue", True: "tab:red"}, size=3, jitter=0.2,
                      ax=ax, legend=group == groups[-1], native_scale=True)
        for eta in part["eta"].dropna().unique():
            ax.axhline(eta, color="black", ls="--", lw=1, label=f"eta {eta:g}")
        ax.set(title=group, ylabel=f"ratio (clipped at {RATIO_CLIP:g})", ylim=(0, None))
    _legend_outside(axes.flat[len(groups) - 1])
    fig.tight_layout()
    return fig


# ---- 5. cumulative data sent ----------------------------------------------------------------
def cumulative_data(frames: Frames) -> pd.DataFrame:
    """Per run and epoch, the floats one worker has sent so far (``comm/bits`` / 32)."""
    data = _with_identity(frames, ["comm/bits"])
    if data.empty or "comm/bits" not in data:
        return pd.DataFrame(columns=["run_id", *IDENTITY, "panel", "epoch", "floats"])
    data = data.sort_values(["run_id", "epoch"])
    data["floats"] = data.groupby("run_id")["comm/bits"].cumsum() / BITS_PER_FLOAT
    return data[["run_id", *IDENTITY, "seed", "baseline", "panel", "epoch", "floats"]]


def plot_cumulative(data: pd.DataFrame, colours: Palette) -> plt.Figure:
    """Cumulative floats sent per worker vs epoch."""
    panels = sorted(data["panel"].unique())
    fig, axes = _grid(panels)
    for ax, panel in zip(axes.flat, panels, strict=False):
        sns.lineplot(data[data["panel"] == panel], x="epoch", y="floats",
                     **_methods(data, colours), errorbar="sd", ax=ax, legend=panel == panels[-1])
        ax.set(title=panel, ylabel="floats sent per worker (cumulative)")
    _legend_outside(axes.flat[len(panels) - 1])
    fig.tight_layout()
    return fig


# ---- 6. final metric vs total data (Pareto) -------------------------------------------------
def pareto_data(frames: Frames) -> pd.DataFrame:
    """One point per run: total floats sent per worker and the final test metric."""
    runs = frames.runs.copy()
    if runs.empty:
        return pd.DataFrame(columns=["run_id", *IDENTITY, "panel", "floats", "final", "metric"])
    runs["floats"] = runs["total_bits"].astype(float) / BITS_PER_FLOAT
    runs["panel"] = _panel(runs)
    keep = ["run_id", *IDENTITY, "seed", "baseline", "panel", "floats", "final", "metric"]
    return runs[keep].dropna(subset=["final", "floats"])


def plot_pareto(data: pd.DataFrame, colours: Palette) -> plt.Figure:
    """Final metric vs total data sent, a point per run (log x)."""
    panels = sorted(data["panel"].unique())
    fig, axes = _grid(panels)
    for ax, panel in zip(axes.flat, panels, strict=False):
        part = data[data["panel"] == panel]
        sns.scatterplot(part, x="floats", y="final", **_methods(data, colours), s=40, ax=ax,
                        legend=panel == panels[-1])
        ax.set(title=panel, xscale="log", xlabel="floats sent per worker (total)",
               ylabel=f"final {part['metric'].iloc[0]}")
    _legend_outside(axes.flat[len(panels) - 1])
    fig.tight_layout()
    return fig


# ---- 7. batch size and LR over epochs -------------------------------------------------------
def batch_data(frames: Frames) -> pd.DataFrame:
    """Per epoch, batch size and LR of the first seed of every group of a model whose batch size
    changes in some run (the batch-size scheduler's runs and their baselines)."""
    data = _with_identity(frames, ["batch_size", "lr"])
    columns = ["run_id", *IDENTITY, "seed", "baseline", "panel", "epoch", "batch_size", "lr"]
    if data.empty or "batch_size" not in data:
        return pd.DataFrame(columns=columns)
    changing = data.groupby("run_id")["batch_size"].transform("nunique") > 1
    panels = set(data.loc[changing, "panel"])
    return _first_seeds(data[data["panel"].isin(panels)])[columns]


def plot_batch(data: pd.DataFrame, colours: Palette) -> plt.Figure:
    """Batch size (top) and LR (bottom) vs epoch, per panel."""
    panels = sorted(data["panel"].unique())
    fig, axes = _grid(panels, rows=2)
    for i, panel in enumerate(panels):
        part = data[data["panel"] == panel]
        top, bottom = axes[2 * (i // MAX_COLUMNS), i % MAX_COLUMNS], \
            axes[2 * (i // MAX_COLUMNS) + 1, i % MAX_COLUMNS]
        for ax, column in ((top, "batch_size"), (bottom, "lr")):
            sns.lineplot(part, x="epoch", y=column, **_methods(data, colours),
                         drawstyle="steps-mid", ax=ax, legend=ax is top and panel == panels[-1])
        top.set(title=panel, ylabel="global batch size")
        bottom.set(ylabel="learning rate")
    _legend_outside(axes[0, min(len(panels), MAX_COLUMNS) - 1])
    fig.tight_layout()
    return fig


def _legend_outside(ax: plt.Axes) -> None:
    if ax.get_legend() is not None:
        sns.move_legend(ax, "upper left", bbox_to_anchor=(1.02, 1), frameon=False)


# ---- all of them ----------------------------------------------------------------------------
FIGURES: dict[str, tuple[str, Callable[..., pd.DataFrame],
                         Callable[[pd.DataFrame, Palette], plt.Figure]]] = {
    "curves": ("Test metric per epoch (mean ± std over seeds); shaded: epochs Accordion ran "
               "in a critical regime (darker: more layers).", curves_data, plot_curves),
    "official": ("Paper scale: our curves over the authors' logged curve of the same model and "
                 "method.", official_data, plot_official),
    "levels": ("Compression level per layer and epoch (first seed of each Accordion group).",
               levels_data, plot_levels),
    "ratios": ("Accordion's ratio | ||Δ_prev|| − ||Δ_now|| | / ||Δ_prev|| per layer at each "
               "check epoch, against eta (dashed); red: the next interval is critical.",
               ratios_data, plot_ratios),
    "cumulative": ("Floats sent per worker, cumulative over epochs (comm/bits / 32).",
                   cumulative_data, plot_cumulative),
    "pareto": ("Final test metric against the total data sent, one point per run.",
               pareto_data, plot_pareto),
    "batch": ("Global batch size and learning rate per epoch (first seed of each group).",
              batch_data, plot_batch),
}


def make_figures(frames: Frames, out_dir: Path, official: pd.DataFrame | None = None,
                 dpi: int = 110) -> list[Figure]:
    """Write every figure that has data to ``out_dir`` (PNG and PDF); return them."""
    sns.set_theme(**STYLE)
    out_dir.mkdir(parents=True, exist_ok=True)
    colours = palette(method_order(frames.runs))
    written = []
    for name, (caption, data_of, plot) in FIGURES.items():
        data = data_of(frames, official) if name == "official" else data_of(frames)
        if data.empty or (name == "official" and official is None):
            continue
        fig = plot(data, colours)
        paths = [out_dir / f"{name}.png", out_dir / f"{name}.pdf"]
        for path in paths:
            fig.savefig(path, dpi=dpi, bbox_inches="tight")
        plt.close(fig)
        written.append(Figure(name, caption, data, paths))
    return written
