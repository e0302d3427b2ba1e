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

from analysis import style
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


def method_order(points: pd.DataFrame) -> list[str]:
    """The methods as the table lists them: per family the low endpoint (a baseline), the high
    one, then Accordion."""
    rank = {m: (2 if m.startswith("accordion") else 0 if (points["baseline"] == m).any() else 1)
            for m in points["method"].unique()}
    ordered = points.assign(_rank=points["method"].map(rank)).sort_values(["family", "_rank"])
    return list(dict.fromkeys(ordered["method"]))


def plot(frames: Frames) -> plt.Figure:
    """Test accuracy per epoch (mean, ±1 std over seeds), a panel per family; under the curves,
    Accordion's critical epochs (darker: more seeds)."""
    points = data(frames)
    families = sorted(points["family"].unique())
    looks = style.Looks(method_order(points))
    fig, axes = style.subplots(len(families), sharey=True)
    handles, banded = [], False
    for ax, fam in zip(axes.flat, families, strict=False):
        part = points[points["family"] == fam]
        strips = []
        for method in [m for m in looks.methods if m in set(part["method"])]:
            runs = part[part["method"] == method]
            banded |= style.band(ax, runs, "epoch", "accuracy", looks.line(method))
            handles.append(looks.handle(method))
            if runs["critical"].notna().any():
                strips.append((looks.color[method], runs.groupby("epoch")["critical"].mean()))
                handles.append(style.strip_handle(
                    looks.color[method], f"{method}: critical epochs\n(darker: more seeds)"))
        style.epoch_strips(ax, strips)
        ax.set(title=f"Accordion on the {'batch size' if fam == 'batch' else 'compression'}",
               xlabel="epoch", ylabel=style.label("test/accuracy"))
        style.epoch_axis(ax)
    fig.tight_layout()
    style.legend_below(fig, handles + ([style.band_handle()] if banded else []))
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
    rank = frame["method"].map(method_order(points).index)
    return markdown(frame.assign(_rank=rank).sort_values(["family", "_rank", "seed"])
                    .drop(columns="_rank"))

