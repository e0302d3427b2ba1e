"""AdaComp's claims on simulated learners: accuracy and effective compression against the
number of learners (``learners``) and against the per-learner mini-batch (``minibatch``).

- ``learners`` (``conf/sweep/claim_learners.yaml``): AdaComp on 1 .. 128 simulated learners
  under momentum SGD and Adam, with the uncompressed run of each optimizer as the baseline
  ("CIFAR10-CNN (up to 128 learners) ... under both momentum SGD and Adam without noticeable
  accuracy degradation").
- ``minibatch`` (:mod:`analysis.claims_minibatch`, ``conf/sweep/claim_minibatch.yaml``):
  AdaComp's effective compression rate against the per-learner mini-batch size (AdaComp
  Fig. 7a: it falls as that batch grows).

Effective compression per layer type is AdaComp's: the compressed layers' fp32 bits over the
bits their 8/16-bit sparse ternary encoding sent, summed over the run (``comm/bits_dense_<type>``
/ ``comm/bits_<type>``, :func:`analysis.tables.run_stats`). :func:`claim_data` is what both
claims table and draw (``table.csv``).
"""

from __future__ import annotations

import matplotlib.pyplot as plt
import pandas as pd
from matplotlib.lines import Line2D

from analysis import style
from analysis.load import Frames
from analysis.tables import markdown, run_stats

SWEEP, FIGURE = "claim_learners", "figure.png"
KEEP = ("completed",)

# The seed's figures for AdaComp (analysis/reference: adacomp-t2, seed-adacomp).
PAPER_X = {"conv": 40.0, "fc": 200.0}
OPTIMIZERS = {"sgd": "momentum SGD", "adam": "Adam"}


def claim_data(frames: Frames) -> pd.DataFrame:
    """One row per setting: optimizer, compressor, learners, per-learner batch, final and best
    test accuracy and the effective compression per layer type, mean over seeds (and the final
    accuracy's standard deviation over them, ``final_std``: NaN for one seed)."""
    stats = run_stats(frames)
    runs = frames.runs.set_index("run_id")
    learners = runs["trainer.workers"].fillna(1).astype(int)
    stats["optimizer"] = stats["run_id"].map(runs["optimizer.name"])
    stats["compressor"] = stats["run_id"].map(runs["compressor.name"])
    stats["learners"] = stats["run_id"].map(learners)
    stats["global_batch"] = stats["run_id"].map(runs["trainer.batch_size"].astype(int))
    stats["per_learner_batch"] = stats["global_batch"] // stats["learners"]
    keys = ["optimizer", "compressor", "learners", "per_learner_batch", "global_batch"]
    stats["final"] = pd.to_numeric(stats["final"], errors="coerce")
    stats["counted"] = stats["final"].notna()  # seeds: the runs with a final metric
    data = stats.groupby(keys, as_index=False).agg(
        seeds=("counted", "sum"), final=("final", "mean"), final_std=("final", "std"),
        best=("best", "mean"),
        conv_x=("conv_x", "mean"), fc_x=("fc_x", "mean"))
    return data.sort_values(keys, ignore_index=True)


def compression(value: float) -> str:
    """``40.0x``, or an em dash where nothing was compressed."""
    return "—" if pd.isna(value) else f"{value:.1f}x"


def accuracy(final: float, final_std: float, seeds: int) -> str:
    """The final accuracy, mean +- std over seeds where there are several."""
    return f"{final:.2f} ± {final_std:.2f}" if seeds > 1 else f"{final:.2f}"


def learners_table(data: pd.DataFrame) -> pd.DataFrame:
    """Learners down, each optimizer's accuracy and conv / FC compression across; the
    uncompressed runs first, as the baseline."""
    rows = []
    for (compressor, learners), group in data.groupby(["compressor", "learners"], sort=False):
        row = {"compressor": compressor, "learners": learners,
               "per-learner batch": int(group["per_learner_batch"].iloc[0]),
               "seeds": int(group["seeds"].max())}
        for optimizer, label in OPTIMIZERS.items():
            mine = group[group["optimizer"] == optimizer]
            if mine.empty:
                continue
            first = mine.iloc[0]
            row[f"{label}: accuracy (%)"] = accuracy(first["final"], first["final_std"],
                                                      first["seeds"])
            row[f"{label}: conv"] = compression(first["conv_x"])
            row[f"{label}: FC"] = compression(first["fc_x"])
        rows.append(row)
    rows.sort(key=lambda r: (r["compressor"] != "none", r["compressor"], r["learners"]))
    return pd.DataFrame(rows)


def plot_learners(data: pd.DataFrame) -> plt.Figure:
    """(a) final accuracy vs learners per optimizer, the uncompressed run dashed; (b) effective
    compression per layer type vs learners, the paper's 40x / 200x dotted."""
    fig, axes = style.subplots(2)
    acc, comp = axes[0]
    colours = dict(zip(OPTIMIZERS, style.colors(len(OPTIMIZERS)), strict=True))
    ada = data[data["compressor"] != "none"]
    for optimizer, label in OPTIMIZERS.items():
        mine = ada[ada["optimizer"] == optimizer]
        if mine.empty:
            continue
        acc.errorbar(mine["learners"], mine["final"], yerr=mine["final_std"].fillna(0),
                     fmt="o-", capsize=3, color=colours[optimizer], label=f"AdaComp, {label}")
        base = data[(data["compressor"] == "none") & (data["optimizer"] == optimizer)]
        if not base.empty:
            acc.axhline(base["final"].mean(), color=colours[optimizer], ls="--",
                        label=f"no compression, {label}")
        for kind, marker in (("conv", "o"), ("fc", "s")):
            comp.plot(mine["learners"], mine[f"{kind}_x"], marker=marker,
                      ls="-" if kind == "conv" else ":", color=colours[optimizer],
                      label=f"{kind}, {label}")
    return finish(fig, acc, comp, "learners (simulated)", ada["learners"])


def finish(fig: plt.Figure, acc: plt.Axes, comp: plt.Axes, xlabel: str,
           xs: pd.Series) -> plt.Figure:
    """Both figures' axes: a tick at each x (log2), accuracy and compression y (log over a
    decade) with the paper's rates dotted, one legend under both panels."""
    for ax in (acc, comp):
        style.value_axis(ax, "x", xs)
        ax.set_xlabel(xlabel)
    acc.set_ylabel("final test accuracy (%)")
    comp.set_ylabel("effective compression (x)")
    values = [v for line in comp.get_lines() for v in line.get_ydata()]
    for value in PAPER_X.values():
        comp.axhline(value, color="grey", ls=":", lw=1)
    style.count_axis(comp, "y", [*values, *PAPER_X.values()])
    fig.tight_layout()
    handles = [h for ax in (acc, comp) for h in ax.get_legend_handles_labels()[0]]
    paper = ", ".join(f"{kind} {value:.0f}x" for kind, value in PAPER_X.items())
    handles.append(Line2D([], [], color="grey", ls=":", lw=1, label=f"the paper: {paper}"))
    style.legend_below(fig, handles)
    return fig


def data(frames: Frames) -> pd.DataFrame:
    """What the learners claim tables and draws: :func:`claim_data`."""
    return claim_data(frames)


def table(frames: Frames) -> str:
    """The learners table (markdown)."""
    return markdown(learners_table(claim_data(frames)))


def plot(frames: Frames) -> plt.Figure:
    """The learners figure."""
    return plot_learners(claim_data(frames))
