"""The Accordion seed's equivalence: Accordion on the batch size vs on the compression.

    python -m analysis.claims batch [RUNS] [--out results/claims/batch]

From the runs of conf/sweep/claim_batch.yaml: two families, each a low endpoint (small batch /
Top-K 99%), a high one (large batch / Top-K 10%) and Accordion between them. Per family: test
accuracy per epoch with Accordion's critical epochs shaded; per run the final accuracy, the data
sent and the optimizer steps taken, relative to the family's low endpoint, and Accordion's
critical epochs (an epoch is critical where any layer is), compared across the two families.
"""

from __future__ import annotations

import matplotlib.pyplot as plt
import pandas as pd

from analysis.load import Frames, layer_columns
from analysis.tables import markdown

SWEEP, FIGURE = "claim_batch", "batch.png"
KEEP = ("completed", "diverged")  # a diverging method is part of the claim


def family(compressor: str) -> str:
    """``batch`` (no compression: the batch size is the knob) or ``compression``."""
    return "batch" if compressor == "none" else "compression"


def data(frames: Frames) -> pd.DataFrame:
    """One row per run and epoch: ``family``, ``method``, ``baseline``, ``seed``, ``epoch``,
    ``accuracy``, ``bits``, ``batch``, ``steps`` (this epoch's optimizer steps), ``critical``
    (any layer critical; NaN for fixed methods)."""
    epochs = frames.epochs
    runs = frames.runs.set_index("run_id")
    critical = layer_columns(epochs, "critical")
    train_size = epochs["run_id"].map(runs["dataset.train_size"])
    out = pd.DataFrame({
        "family": epochs["run_id"].map(runs["compressor.name"]).map(family),
        "method": epochs["run_id"].map(runs["method"]),
        "baseline": epochs["run_id"].map(runs["baseline"]),
        "seed": epochs["run_id"].map(runs["seed"]), "epoch": epochs["epoch"],
        "accuracy": epochs["test/accuracy"], "bits": epochs["comm/bits"],
        "batch": epochs["batch_size"], "steps": train_size // epochs["batch_size"],
        "critical": epochs[critical].max(axis=1) if critical else float("nan")})
    return out.sort_values(["family", "method", "seed", "epoch"]).reset_index(drop=True)


def critical_epochs(run: pd.DataFrame) -> list[int]:
    """The epochs Accordion marked critical in one run."""
    return [int(e) for e, c in zip(run["epoch"], run["critical"], strict=True) if c == 1]


def plot(frames: Frames) -> plt.Figure:
    """Test accuracy per epoch, a panel per family, Accordion's critical epochs shaded."""
    points = data(frames)
    families = sorted(points["family"].unique())
    fig, axes = plt.subplots(1, len(families), figsize=(5.5 * len(families), 3.8), sharey=True,
                             squeeze=False)
    for ax, fam in zip(axes[0], families, strict=True):
        for (method, _), run in points[points["family"] == fam].groupby(["method", "seed"]):
            ax.plot(run["epoch"], run["accuracy"], marker="o", ms=3, label=method)
            for e in critical_epochs(run):
                ax.axvspan(e - 0.5, e + 0.5, color="grey", alpha=0.12, lw=0)
        ax.set_title(f"Accordion on the {'batch size' if fam == 'batch' else 'compression'}"
                     " (shaded: its critical epochs)")
        ax.set_xlabel("epoch")
        ax.legend(fontsize=7, loc="lower right")
    axes[0, 0].set_ylabel("test accuracy (%)")
    fig.tight_layout()
    return fig


def table(frames: Frames) -> str:
    """Per run: final accuracy and its difference from the family's low endpoint, data sent
    and optimizer steps relative to it, Accordion's critical epochs."""
    points = data(frames)
    rows = []
    for (fam, method, seed), run in points.groupby(["family", "method", "seed"], sort=False):
        low = points[(points["family"] == fam) & (points["method"] == run["baseline"].iloc[0])
                     & (points["seed"] == seed)]
        crit = critical_epochs(run)
        final, low_final = run["accuracy"].iloc[-1], low["accuracy"].iloc[-1]
        rows.append({"family": fam, "method": method, "seed": seed,
                     "final accuracy (%)": f"{final:.1f}",
                     "vs low endpoint": f"{final - low_final:+.1f}",
                     "data vs low endpoint": f"{run['bits'].sum() / low['bits'].sum():.2f}",
                     "steps vs low endpoint": f"{run['steps'].sum() / low['steps'].sum():.2f}",
                     "critical epochs": ", ".join(map(str, crit)) if crit else "-"})
    frame = pd.DataFrame(rows)
    rank = frame["method"].map(lambda m: 2 if m.startswith("accordion") else
                               0 if (points["baseline"] == m).any() else 1)
    return markdown(frame.assign(_rank=rank).sort_values(["family", "_rank", "seed"])
                    .drop(columns="_rank"))

