"""Accordion Fig. 2b: high compression only early, only late, or throughout.

    python -m analysis.claims fig2b [RUNS] [--out results/claims/fig2b]

From the runs of conf/sweep/claim_fig2b.yaml (PowerSGD rank 4 = low, rank 1 = high compression;
the same epochs and examples for every run): test accuracy per epoch, the epoch k where the
planned runs switch, and per method the final and best accuracy and the data sent.
"""

from __future__ import annotations

import matplotlib.pyplot as plt
import pandas as pd

from analysis import style
from analysis.load import Frames
from analysis.tables import markdown

SWEEP, FIGURE = "claim_fig2b", "fig2b.png"
KEEP = ("completed", "diverged")  # a diverging method is part of the claim
LABELS = {"rank4": "rank 4 throughout (low)", "rank1": "rank 1 throughout (high)",
          "rank1_first_rank4": "rank 1 in the first k epochs, then rank 4",
          "rank4_first_rank1": "rank 4 in the first k epochs, then rank 1"}


def label(method: str) -> str:
    """A method's description (its name where it is not one of this claim's)."""
    return LABELS.get(method, method)


def data(frames: Frames) -> pd.DataFrame:
    """One row per run and epoch: ``method``, ``seed``, ``epoch``, ``accuracy``, ``rank``
    (the level of the first compressed layer), ``bits`` (this epoch's)."""
    epochs = frames.epochs
    runs = frames.runs.set_index("run_id")
    level = next(c for c in epochs.columns if c.startswith("level/"))
    return pd.DataFrame({
        "method": epochs["run_id"].map(runs["method"]), "seed": epochs["run_id"].map(runs["seed"]),
        "epoch": epochs["epoch"], "accuracy": epochs["test/accuracy"], "rank": epochs[level],
        "bits": epochs["comm/bits"]}).sort_values(["method", "seed", "epoch"])


def switch_epoch(frames: Frames) -> int | None:
    """k: the first epoch of the planned runs' second phase (None without planned runs)."""
    planned = frames.runs[frames.runs["scheduler.name"] == "plan"]
    if planned.empty:
        return None
    return int(planned["scheduler.epochs"].iloc[0][1])


def plot(frames: Frames) -> plt.Figure:
    """Test accuracy per epoch, a line per method (mean, ±1 std over seeds); k marked."""
    points = data(frames)
    methods = [m for m in LABELS if m in set(points["method"])]
    methods += sorted(set(points["method"]) - set(methods))
    looks = style.Looks(methods)
    fig, axes = style.subplots(1)
    ax = axes[0, 0]
    banded = False
    for method in methods:
        banded |= style.band(ax, points[points["method"] == method], "epoch", "accuracy",
                             looks.line(method))
    k = switch_epoch(frames)
    if k is not None:
        ax.axvline(k - 0.5, color="grey", ls="--", lw=1)
        ax.annotate(f"k = {k}", (k - 0.5, 1), xycoords=("data", "axes fraction"),
                    xytext=(3, -3), textcoords="offset points", va="top", color="grey")
    ax.set(title="Agarwal et al. Fig. 2b: high compression early or late", xlabel="epoch",
           ylabel=style.label("test/accuracy"))
    style.epoch_axis(ax)
    fig.tight_layout()
    handles = [looks.handle(m, text=label(m)) for m in methods]
    style.legend_below(fig, handles + ([style.band_handle()] if banded else []))
    return fig


def table(frames: Frames) -> str:
    """Per method: final and best accuracy, the data sent, as a share of rank 4 throughout."""
    points = data(frames)
    total = points.groupby("method")["bits"].sum()
    base = total.get("rank4", float("nan"))
    rows = []
    for method, run in points.groupby("method", sort=False):
        final = run.groupby("seed")["accuracy"].last()
        best = run.groupby("seed")["accuracy"].max()
        rows.append({"method": method, "plan": label(method),
                     "final accuracy (%)": " / ".join(f"{v:.1f}" for v in final),
                     "best accuracy (%)": " / ".join(f"{v:.1f}" for v in best),
                     "data sent (Gbit)": f"{total[method] / 1e9 / final.size:.3f}",
                     "data vs rank 4": f"{total[method] / base:.2f}"})
    order = [m for m in LABELS if m in set(points["method"])]
    frame = pd.DataFrame(rows).set_index("method").loc[order].reset_index()
    return markdown(frame)

