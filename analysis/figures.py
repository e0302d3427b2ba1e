"""The papers' figures from the loaded frames: a tidy data frame and a plot for each.

Each figure is a pair: ``<name>_data(frames, ...)`` returns exactly what is drawn (one row per
point; tests check these), and ``plot_<name>(data, looks)`` draws it in the suite's one style
(:mod:`analysis.style`; :func:`looks`: every run group in the same colour, marker and line style
in every figure of a report). :func:`make_figures` writes every figure that has data as
``<out>/<name>.png`` and ``.pdf`` and returns them with their data. docs/analysis.md says how to
read each one.

Panels are run groups' model (and dataset where a sweep has several); a run group is a method
and variant (the variant named where it is not ``ours``). Curves are means over seeds with a
±1 std band; one legend under the panels names every line, band and shading.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path

import matplotlib.pyplot as plt
import numpy as np
import pandas as pd
import seaborn as sns
from matplotlib.artist import Artist
from matplotlib.colors import ListedColormap
from matplotlib.lines import Line2D
from matplotlib.patches import Patch

import compression
from analysis import style
from analysis.load import IDENTITY, Frames
from analysis.reference import PAPER_SCALE, table_label
from analysis.tables import BITS_PER_FLOAT, sort

RATIO_CLIP = 2.0  # ratios above (inf where the previous norm was 0) are drawn at the clip
ACCORDION = "accordion"
AUTHORS_LOG = "authors' log"
REGIMES = {True: "ratio ≥ η: the next interval critical",
           False: "ratio < η: the next interval not critical"}
JITTER = 0.25  # epochs: the ratio points of one epoch spread over ± this


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
    return list(dict.fromkeys(m for m, _ in _group_order(frame)))


def _group_order(frame: pd.DataFrame) -> list[tuple[str, str]]:
    """(method, variant) of every run group in table order."""
    groups = sort(frame[list(IDENTITY) + ["baseline"]].drop_duplicates())
    return list(dict.fromkeys(zip(groups["method"], groups["variant"], strict=True)))


def group_name(method: str, variant: str) -> str:
    """A run group's name in legends: the method, and its variant unless ``ours``."""
    return method if variant == "ours" else f"{method} ({variant})"


def looks(runs: pd.DataFrame) -> style.Looks:
    """The look of every run group of ``runs`` (colour and marker by group in table order, line
    style by variant): the same in every figure of a report."""
    return style.Looks([group_name(m, v) for m, v in _group_order(runs)],
                       sorted(set(runs["variant"])))


def _groups(data: pd.DataFrame, colours: style.Looks
            ) -> Iterable[tuple[str, str, pd.DataFrame]]:
    """(name, variant, rows) of each run group in ``data``, in the looks' order."""
    names = data["method"].combine(data["variant"], group_name)
    for name in colours.methods:
        rows = data[names == name]
        if not rows.empty:
            yield name, rows["variant"].iloc[0], rows


def _first_seeds(frame: pd.DataFrame) -> pd.DataFrame:
    """One run per group: the lowest seed's."""
    first = (frame[["run_id", *IDENTITY, "seed"]].drop_duplicates()
             .sort_values("seed").groupby(list(IDENTITY)).head(1))
    return frame[frame["run_id"].isin(first["run_id"])]


def _group_label(frame: pd.DataFrame) -> pd.Series:
    """Panel and group name: ``resnet18 accordion_rank2_rank1 (authors)``."""
    return frame["panel"] + " " + frame["method"].combine(frame["variant"], group_name)


def _finish(fig: plt.Figure, handles: list[Artist]) -> plt.Figure:
    fig.tight_layout()
    style.legend_below(fig, handles)
    return fig


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


def plot_curves(data: pd.DataFrame, colours: style.Looks) -> plt.Figure:
    """Test metric vs epoch per panel (mean, ±1 std over seeds); under the curves, a strip per
    Accordion group marking its critical epochs, darker where more layers were critical."""
    panels = sorted(data["panel"].unique())
    fig, axes = style.subplots(len(panels))
    drawn, banded, stripped = {}, False, {}
    for ax, panel in zip(axes.flat, panels, strict=False):
        part = data[data["panel"] == panel]
        strips = []
        for name, variant, rows in _groups(part, colours):
            banded |= style.band(ax, rows, "epoch", "value", colours.line(name, variant))
            drawn[name] = variant
            if name.startswith(ACCORDION) and rows["critical"].notna().any():
                strips.append((colours.color[name], rows.groupby("epoch")["critical"].mean()))
                stripped[name] = style.strip_handle(
                    colours.color[name], f"{name}: critical epochs\n(darker: more layers)")
        style.epoch_strips(ax, strips)
        ax.set(title=panel, xlabel="epoch", ylabel=style.label(part["metric"].iloc[0]))
        style.epoch_axis(ax)
    handles = _handles(colours, drawn) + ([style.band_handle()] if banded else [])
    return _finish(fig, handles + list(stripped.values()))


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
            rows.append({"panel": f"{model} {method}", "who": group_name("ours", row["variant"]),
                         "seed": row["seed"], "epoch": row["epoch"], "value": row["value"],
                         "metric": row["metric"]})
        for _, row in theirs.iterrows():
            rows.append({"panel": f"{model} {method}", "who": AUTHORS_LOG, "seed": None,
                         "epoch": row["epoch"], "value": row["value"],
                         "metric": "test/" + row["metric"].removeprefix("test_")})
    return pd.DataFrame(rows, columns=["panel", "who", "seed", "epoch", "value", "metric"])


def plot_official(data: pd.DataFrame, colours: style.Looks) -> plt.Figure:
    """Ours (mean ± std over seeds) and the authors' curve, one panel per model and method."""
    panels = sorted(data["panel"].unique())
    fig, axes = style.subplots(len(panels))
    ours = sorted(w for w in data["who"].unique() if w != AUTHORS_LOG)
    whos = style.Looks(ours)  # colours by who, not method; the authors' in black
    banded = False
    for ax, panel in zip(axes.flat, panels, strict=False):
        part = data[data["panel"] == panel]
        theirs = part[part["who"] == AUTHORS_LOG]
        ax.plot(theirs["epoch"], theirs["value"], color="black", lw=1)
        for who in ours:
            look = {**whos.line(who), "marker": None, "lw": 1}
            banded |= style.band(ax, part[part["who"] == who], "epoch", "value", look)
        ax.set(title=panel, xlabel="epoch", ylabel=style.label(part["metric"].iloc[0]))
        style.epoch_axis(ax)
    handles = [Line2D([], [], color="black", lw=1, label=AUTHORS_LOG)]
    handles += [Line2D([], [], color=whos.color[w], lw=1, label=w) for w in ours]
    return _finish(fig, handles + ([style.band_handle()] if banded else []))


# ---- 3. per-layer level heat map ------------------------------------------------------------
def levels_data(frames: Frames) -> pd.DataFrame:
    """Per layer and epoch, the level (rank, ratio, bin size) of the first seed of every group
    whose levels a per-layer scheduler set (its rows log ``critical/<layer>``)."""
    columns = [c for c in frames.epochs.columns if c.startswith("level/")]
    data = _with_identity(frames, columns)
    out_columns = ["run_id", "group", "method", "compressor.name", "layer", "epoch", "level"]
    if data.empty or not columns:
        return pd.DataFrame(columns=out_columns)
    accordion = [c for c in frames.epochs.columns
                 if c.startswith("critical/") and c != "critical/model"]
    scheduled = frames.epochs.loc[frames.epochs[accordion].notna().any(axis=1), "run_id"] \
        if accordion else []
    data = _first_seeds(data[data["run_id"].isin(set(scheduled))])
    long = data.melt(id_vars=["run_id", *IDENTITY, "panel", "epoch"], value_vars=columns,
                     var_name="layer", value_name="level").dropna(subset=["level"])
    long["layer"] = long["layer"].str.removeprefix("level/")
    long["group"] = _group_label(long)
    return long[out_columns]


def level_name(compressor: str) -> str:
    """What a compressor's level is (``rank``, ``ratio``, ``bin size``; docs/compressors.md),
    ``level`` for a compressor outside the registry."""
    if compressor not in compression.available():
        return "level"
    return compression.create(compressor).level_field.replace("_", " ")


def plot_levels(data: pd.DataFrame, colours: style.Looks) -> plt.Figure:
    """Layers x epochs, one discrete colour per level (darker: lower), one panel per group."""
    groups = sorted(data["group"].unique())
    values = sorted(data["level"].unique())
    shades = sns.color_palette("viridis", len(values))
    layers = data.groupby("group")["layer"].nunique().max()
    fig, axes = style.subplots(len(groups), height=max(style.PANEL_HEIGHT, 0.16 * layers + 1.2))
    names = set()
    for ax, group in zip(axes.flat, groups, strict=False):
        part = data[data["group"] == group]
        order = list(dict.fromkeys(part["layer"]))
        epochs = range(int(part["epoch"].min()), int(part["epoch"].max()) + 1)
        grid = part.pivot_table(index="layer", columns="epoch", values="level") \
            .reindex(index=order, columns=epochs)
        index = grid.apply(lambda column: column.map(values.index, na_action="ignore"))
        ax.imshow(np.ma.masked_invalid(index.to_numpy(dtype=float)), aspect="auto",
                  interpolation="nearest", cmap=ListedColormap(shades), vmin=-0.5,
                  vmax=len(values) - 0.5,
                  extent=(epochs[0] - 0.5, epochs[-1] + 0.5, len(order) - 0.5, -0.5))
        ax.set_yticks(range(len(order)), [layer.removesuffix(".weight") for layer in order],
                      fontsize=6)
        ax.grid(False)
        ax.set(title=group, xlabel="epoch")
        style.epoch_axis(ax)
        names.add(level_name(part["compressor.name"].iloc[0]))
    name = names.pop() if len(names) == 1 else "level"
    handles = [Patch(color=shade, label=f"{name} {value:g}")
               for value, shade in zip(values, shades, strict=True)]
    return _finish(fig, handles)


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


def plot_ratios(data: pd.DataFrame, colours: style.Looks) -> plt.Figure:
    """Ratios at the check epochs against the eta line (above: the next interval is critical),
    every panel on the same y range."""
    groups = sorted(data["group"].unique())
    fig, axes = style.subplots(len(groups), sharey=True)
    regime = {True: style.colors(5)[4], False: style.colors(1)[0]}  # vermilion, blue
    jitter = np.random.default_rng(0).uniform(-JITTER, JITTER, len(data))
    shown = data.assign(x=data["epoch"] + jitter, y=data["ratio"].clip(upper=RATIO_CLIP))
    etas = sorted(data["eta"].dropna().unique())
    for ax, group in zip(axes.flat, groups, strict=False):
        part = shown[shown["group"] == group]
        for critical, points in part.groupby("critical"):
            ax.scatter(points["x"], points["y"], s=9, color=regime[bool(critical)], lw=0)
        for eta in part["eta"].dropna().unique():
            ax.axhline(eta, color="black", ls="--", lw=1)
        ax.set(title=group, xlabel="epoch", ylabel=f"ratio (clipped at {RATIO_CLIP:g})")
        style.epoch_axis(ax)
    axes[0, 0].set_ylim(0, min(RATIO_CLIP, shown["y"].max()) * 1.05)
    handles = [Line2D([], [], color=regime[c], marker="o", ls="none", label=REGIMES[c])
               for c in (True, False)]
    handles += [Line2D([], [], color="black", ls="--", lw=1, label=f"η = {eta:g}")
                for eta in etas]
    return _finish(fig, handles)


# ---- 5. cumulative data sent ----------------------------------------------------------------
def cumulative_data(frames: Frames) -> pd.DataFrame:
    """Per run and epoch, the floats one worker has sent so far (``comm/bits`` / 32)."""
    data = _with_identity(frames, ["comm/bits"])
    if data.empty or "comm/bits" not in data:
        return pd.DataFrame(columns=["run_id", *IDENTITY, "panel", "epoch", "floats"])
    data = data.sort_values(["run_id", "epoch"])
    data["floats"] = data.groupby("run_id")["comm/bits"].cumsum() / BITS_PER_FLOAT
    return data[["run_id", *IDENTITY, "seed", "baseline", "panel", "epoch", "floats"]]


def plot_cumulative(data: pd.DataFrame, colours: style.Looks) -> plt.Figure:
    """Cumulative floats sent per worker vs epoch (mean, ±1 std over seeds)."""
    panels = sorted(data["panel"].unique())
    fig, axes = style.subplots(len(panels))
    drawn, banded = {}, False
    for ax, panel in zip(axes.flat, panels, strict=False):
        part = data[data["panel"] == panel]
        for name, variant, rows in _groups(part, colours):
            banded |= style.band(ax, rows, "epoch", "floats", colours.line(name, variant))
            drawn[name] = variant
        ax.set(title=panel, xlabel="epoch", ylabel="floats sent per worker (cumulative)")
        style.epoch_axis(ax)
        style.count_axis(ax, "y", [])
    return _finish(fig, _handles(colours, drawn) + ([style.band_handle()] if banded else []))


def _handles(colours: style.Looks, drawn: dict[str, str], points: bool = False
             ) -> list[Artist]:
    """Legend handles of the run groups drawn (name -> variant), in the looks' order."""
    return [colours.handle(name, drawn[name], points) for name in colours.methods
            if name in drawn]


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


def plot_pareto(data: pd.DataFrame, colours: style.Looks) -> plt.Figure:
    """Final metric vs total data sent, a point per run (log x where the data span a decade)."""
    panels = sorted(data["panel"].unique())
    fig, axes = style.subplots(len(panels))
    drawn = {}
    for ax, panel in zip(axes.flat, panels, strict=False):
        part = data[data["panel"] == panel]
        for name, variant, rows in _groups(part, colours):
            ax.plot(rows["floats"], rows["final"], **colours.point(name, variant))
            drawn[name] = variant
        ax.set(title=panel, xlabel="floats sent per worker (total)",
               ylabel=style.label(part["metric"].iloc[0], "final"))
        style.count_axis(ax, "x", part["floats"])
    return _finish(fig, _handles(colours, drawn, points=True))


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


def plot_batch(data: pd.DataFrame, colours: style.Looks) -> plt.Figure:
    """Batch size (top) and LR (bottom) vs epoch, per panel (first seed)."""
    panels = sorted(data["panel"].unique())
    fig, axes = style.subplots(len(panels), rows=2)
    drawn = {}
    for i, panel in enumerate(panels):
        part = data[data["panel"] == panel]
        row, column = 2 * (i // style.MAX_COLUMNS), i % style.MAX_COLUMNS
        for ax, key in ((axes[row, column], "batch_size"), (axes[row + 1, column], "lr")):
            for name, variant, rows in _groups(part, colours):
                ax.plot(rows["epoch"], rows[key], drawstyle="steps-mid",
                        **colours.line(name, variant))
                drawn[name] = variant
            ax.set(xlabel="epoch", ylabel=style.label(key))
            style.epoch_axis(ax)
        axes[row, column].set_title(panel)
        style.value_axis(axes[row, column], "y", part["batch_size"])
    return _finish(fig, _handles(colours, drawn))


# ---- all of them ----------------------------------------------------------------------------
FIGURES: dict[str, tuple[str, Callable[..., pd.DataFrame],
                         Callable[[pd.DataFrame, style.Looks], plt.Figure]]] = {
    "curves": ("Test metric per epoch: mean over seeds, band ±1 std; the strips under the "
               "curves: the epochs an Accordion group ran in a critical regime (darker: more "
               "layers).", curves_data, plot_curves),
    "official": ("Paper scale: our curves (mean, band ±1 std over seeds) over the authors' "
                 "logged curve of the same model and method.", official_data, plot_official),
    "levels": ("Compression level per layer and epoch (first seed of each Accordion group).",
               levels_data, plot_levels),
    "ratios": ("Accordion's ratio | ||Δ_prev|| − ||Δ_now|| | / ||Δ_prev|| per layer at each "
               "check epoch (a point per layer and seed, spread sideways), against eta "
               "(dashed); at or above it, the next interval is critical.",
               ratios_data, plot_ratios),
    "cumulative": ("Floats sent per worker, cumulative over epochs (comm/bits / 32; mean, band "
                   "±1 std over seeds).", cumulative_data, plot_cumulative),
    "pareto": ("Final test metric against the total data sent, one point per run.",
               pareto_data, plot_pareto),
    "batch": ("Global batch size and learning rate per epoch (first seed of each group).",
              batch_data, plot_batch),
}


def make_figures(frames: Frames, out_dir: Path, official: pd.DataFrame | None = None
                 ) -> list[Figure]:
    """Write every figure that has data to ``out_dir`` (PNG and PDF); return them."""
    out_dir.mkdir(parents=True, exist_ok=True)
    colours = looks(frames.runs)
    written = []
    for name, (caption, data_of, plot) in FIGURES.items():
        data = data_of(frames, official) if name == "official" else data_of(frames)
        if data.empty or (name == "official" and official is None):
            continue
        paths = [out_dir / f"{name}.png", out_dir / f"{name}.pdf"]
        style.save(plot(data, colours), paths)
        written.append(Figure(name, caption, data, paths))
    return written
