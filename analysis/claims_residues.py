"""AdaComp Figs. 4-6: residues under the soft threshold vs hard Local Selection, per bin size.

    python -m analysis.claims residues [RUNS] [--out results/claims/residues]

From the runs of conf/sweep/claim_residues.yaml: per run and epoch, the largest |residue| over
all compressed layers (max of |residue_min/*|, |residue_max/*|, logged at each epoch's end),
the mean fraction of elements sent (sent_fraction/*) and the test accuracy. Figure: the largest
|residue| per epoch (log scale), one panel per L_T, soft threshold vs LS; under it the accuracy.
"""

from __future__ import annotations

import matplotlib.pyplot as plt
import numpy as np
import pandas as pd

from analysis import style
from analysis.load import Frames, layer_columns
from analysis.tables import markdown

SWEEP, FIGURE = "claim_residues", "residues.png"
KEEP = ("completed", "diverged")  # a diverging method is part of the claim


def selection(soft: object) -> str:
    """The paper's names: the soft threshold (AdaComp) or hard Local Selection (LS)."""
    return "soft threshold" if bool(soft) else "hard LS"


def data(frames: Frames) -> pd.DataFrame:
    """One row per run and epoch: ``bin_size``, ``selection``, ``seed``, ``epoch``,
    ``residue_absmax``, ``residue_min``, ``residue_max``, ``sent_fraction``, ``accuracy``."""
    epochs = frames.epochs
    lows, highs = layer_columns(epochs, "residue_min"), layer_columns(epochs, "residue_max")
    sent = layer_columns(epochs, "sent_fraction")
    runs = frames.runs.set_index("run_id")
    out = pd.DataFrame({
        "run_id": epochs["run_id"],
        "bin_size": epochs["run_id"].map(runs["compressor.conv_bin_size"]).astype(int),
        "selection": epochs["run_id"].map(runs["compressor.soft_threshold"]).map(selection),
        "seed": epochs["run_id"].map(runs["seed"]),
        "epoch": epochs["epoch"],
        "residue_min": epochs[lows].min(axis=1),
        "residue_max": epochs[highs].max(axis=1),
        "sent_fraction": epochs[sent].mean(axis=1),
        "accuracy": epochs["test/accuracy"],
    })
    out["residue_absmax"] = np.maximum(out["residue_max"], -out["residue_min"])
    return out.sort_values(["bin_size", "selection", "seed", "epoch"]).reset_index(drop=True)


def largest_residue(frames: Frames) -> pd.Series:
    """Per run, the largest finite |residue| over its epochs and layers (the scorecard's
    ``residue_absmax``; a run whose residues overflowed keeps its last finite ones)."""
    epochs = frames.epochs
    columns = layer_columns(epochs, "residue_min") + layer_columns(epochs, "residue_max")
    sizes = epochs[columns].abs()
    return sizes.where(np.isfinite(sizes)).max(axis=1).groupby(epochs["run_id"]).max()


def plot(frames: Frames) -> plt.Figure:
    """Largest |residue| (log) and test accuracy per epoch, a line per run; a column per L_T."""
    points = data(frames)
    sizes = sorted(points["bin_size"].unique())
    fig, axes = style.subplots(len(sizes), rows=2, sharex=True)
    colours = dict(zip(("soft threshold", "hard LS"), style.colors(5)[::4], strict=True))
    first = points["seed"].min()
    for i, size in enumerate(sizes):
        top = axes[2 * (i // style.MAX_COLUMNS), i % style.MAX_COLUMNS]
        bottom = axes[2 * (i // style.MAX_COLUMNS) + 1, i % style.MAX_COLUMNS]
        for (kind, seed), run in points[points["bin_size"] == size].groupby(
                ["selection", "seed"]):
            label = kind if seed == first else None  # one legend entry per selection
            top.plot(run["epoch"], run["residue_absmax"], marker="o", ms=3,
                     color=colours[kind], label=label)
            bottom.plot(run["epoch"], run["accuracy"], marker="o", ms=3, color=colours[kind])
        top.set_yscale("log")
        top.set(title=f"bin size L_T = {size}", ylabel="max |residue| (all layers)")
        bottom.set(xlabel="epoch", ylabel=style.label("test/accuracy"))
        style.epoch_axis(bottom)
    fig.suptitle("AdaComp residues: soft threshold vs hard Local Selection (Chen et al. Figs. "
                 "4-6); a line per seed")
    fig.tight_layout()
    style.legend_below(fig, axes[0, 0].get_legend_handles_labels()[0])
    return fig


def table(frames: Frames) -> str:
    """Per L_T and selection: the residue range at the last epoch where it was finite, its
    growth from the first epoch, the first epoch whose residues were not finite, the mean
    fraction sent, the final accuracy and the run's status."""
    points = data(frames)
    status = frames.runs.set_index("run_id")["status"]
    rows = []
    for (size, kind, seed), run in points.groupby(["bin_size", "selection", "seed"]):
        finite = run[np.isfinite(run["residue_absmax"])]
        first, last = finite.iloc[0], finite.iloc[-1]
        broken = run.loc[~np.isfinite(run["residue_absmax"]), "epoch"]
        rows.append({
            "L_T": size, "selection": kind, "seed": seed,
            "residue range (last finite epoch)": f"[{last.residue_min:.3g}, "
                                                 f"{last.residue_max:.3g}] (epoch {last.epoch})",
            "max abs residue: epoch 0 -> last finite": f"{first.residue_absmax:.3g} -> "
                                                       f"{last.residue_absmax:.3g}",
            "growth": f"{last.residue_absmax / first.residue_absmax:.3g}x",
            "non-finite from epoch": int(broken.iloc[0]) if len(broken) else "-",
            "sent fraction (mean)": f"{run['sent_fraction'].mean():.4f}",
            "best / final accuracy (%)": f"{run['accuracy'].max():.1f} / "
                                         f"{run['accuracy'].iloc[-1]:.1f}",
            "status": status[run["run_id"].iloc[0]],
        })
    return markdown(pd.DataFrame(rows))

