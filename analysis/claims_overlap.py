"""Accordion Fig. 4a: the overlap of the top-10% coordinates of gradients over training.

    python -m analysis.claims overlap [RUNS] [--out results/claims/overlap]

From the runs of conf/sweep/claim_overlap.yaml (``observe.overlap_epochs``: every epoch): per
run and epoch, the overlap of the two workers' top-10% supports (``overlap/<layer>``) and of each
worker's with the global batch's (``overlap_batch/<layer>``; compression/overlap.py), as the
mean over the matrix-shaped layers, the lowest layer's, and the whole model's (one top-10% over
all its matrix-shaped layers: ``overlap_model``, ``overlap_batch_model``).
"""

from __future__ import annotations

import matplotlib.pyplot as plt
import pandas as pd

from analysis import style
from analysis.load import Frames, layer_columns
from analysis.tables import markdown

SWEEP, FIGURE = "claim_overlap", "overlap.png"
KEEP = ("completed", "diverged")  # a diverging method is part of the claim
PAPER = 0.9  # Agarwal et al. Fig. 4a: "more than 90%"
KINDS = {"overlap": "worker vs worker", "overlap_batch": "worker vs global batch"}
MODEL = "_model"  # overlap_model, overlap_batch_model: the whole model's


def data(frames: Frames) -> pd.DataFrame:
    """One row per run, epoch and kind: ``batch`` (global), ``top`` (k/n), ``kind``,
    ``mean`` and ``min`` over the layers, ``model`` (the whole model's; NaN where not logged),
    ``layers`` (how many)."""
    epochs = frames.epochs
    runs = frames.runs.set_index("run_id")
    rows = []
    for prefix, kind in KINDS.items():
        columns = layer_columns(epochs, prefix)
        measured = epochs[epochs[columns].notna().any(axis=1)] if columns else epochs.iloc[:0]
        for _, row in measured.iterrows():
            values = row[columns].dropna()
            rows.append({"run_id": row["run_id"], "batch": int(row["batch_size"]),
                         "top": runs.loc[row["run_id"], "observe.overlap_top"],
                         "seed": runs.loc[row["run_id"], "seed"], "epoch": int(row["epoch"]),
                         "kind": kind, "mean": values.mean(), "min": values.min(),
                         "model": row.get(prefix + MODEL, float("nan")),
                         "layers": len(values)})
    return pd.DataFrame(rows).sort_values(["batch", "kind", "seed", "epoch"]).reset_index(
        drop=True)


def mean_overlap(frames: Frames, prefix: str) -> pd.Series:
    """Per run, the overlap ``prefix`` (``overlap``: worker vs worker; ``overlap_batch``: worker
    vs global batch) averaged over the layers of each measured epoch, then over those epochs."""
    epochs = frames.epochs
    columns = layer_columns(epochs, prefix)
    if not columns:
        return pd.Series(dtype=float)
    return epochs[columns].mean(axis=1).groupby(epochs["run_id"]).mean()


def plot(frames: Frames) -> plt.Figure:
    """Mean over layers (line), lowest layer (dotted) and whole model (dashed) overlap per
    epoch, a line per seed; a panel per global batch."""
    points = data(frames)
    batches = sorted(points["batch"].unique())
    fig, axes = style.subplots(len(batches), sharey=True)
    colours = dict(zip(KINDS.values(), style.colors(len(KINDS)), strict=True))
    first = points["seed"].min()
    for ax, batch in zip(axes.flat, batches, strict=False):
        for (kind, seed), run in points[points["batch"] == batch].groupby(["kind", "seed"]):
            shown = seed == first  # one legend entry per kind and line, not per seed
            ax.plot(run["epoch"], run["mean"], marker="o", ms=3, color=colours[kind],
                    label=f"{kind}: layer mean" if shown else None)
            ax.plot(run["epoch"], run["min"], ls=":", color=colours[kind],
                    label=f"{kind}: lowest layer" if shown else None)
            ax.plot(run["epoch"], run["model"], ls="--", marker="s", ms=3, color=colours[kind],
                    label=f"{kind}: whole model" if shown else None)
        ax.axhline(PAPER, color="grey", ls="-", lw=1, label="paper: > 0.9")
        ax.axhline(points["top"].iloc[0], color="grey", ls="-.", lw=1,
                   label="chance (independent supports)")
        ax.set(title=f"global batch {batch} ({batch // 2} per worker)", xlabel="epoch",
               ylabel="top-10% support overlap", ylim=(0, 1.02))
        style.epoch_axis(ax)
    fig.suptitle("Top-10% coordinates of gradients: overlap over training (Agarwal et al. "
                 "Fig. 4a)")
    fig.tight_layout()
    style.legend_below(fig, axes[0, 0].get_legend_handles_labels()[0])
    return fig


def table(frames: Frames) -> str:
    """Per global batch and kind: the layer-mean overlap at the first and last measured epoch,
    its mean over epochs, the lowest layer's, the share of (layer, epoch) values > 0.9, and the
    whole model's overlap (mean over epochs)."""
    points = data(frames)
    epochs = frames.epochs
    rows = []
    for (batch, kind, seed), run in points.groupby(["batch", "kind", "seed"]):
        prefix = [p for p, k in KINDS.items() if k == kind][0]
        cells = epochs.loc[epochs["run_id"] == run["run_id"].iloc[0],
                           layer_columns(epochs, prefix)].stack()
        rows.append({"global batch": batch, "pair": kind, "seed": seed,
                     "layer mean, first epoch": f"{run['mean'].iloc[0]:.3f}",
                     "layer mean, last epoch": f"{run['mean'].iloc[-1]:.3f}",
                     "layer mean, all epochs": f"{run['mean'].mean():.3f}",
                     "lowest layer": f"{run['min'].min():.3f}",
                     "share > 0.9": f"{(cells > PAPER).mean():.2f}",
                     "whole model, all epochs": f"{run['model'].mean():.3f}",
                     "layers": int(run["layers"].iloc[0])})
    return markdown(pd.DataFrame(rows))

