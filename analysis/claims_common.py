"""What the claim analyses share (analysis/claims_*.py): load one claim sweep's runs, write its
figure and table, and the command line they all take.

    python -m analysis.claims_<name> [RUNS] [--scale tiny] [--out results/claims/<name>]

Each claim module defines ``SWEEP``, ``data(frames) -> DataFrame`` (what is drawn, one row per
point), ``plot(data) -> Figure`` and ``table(frames) -> str`` (markdown); :func:`main` writes
``<out>/<name>.png`` and ``<out>/table.md``. Runs that diverged are kept (a diverging method is
part of a claim, AdaComp's hard Local Selection); runs with other problems are left out.
"""

from __future__ import annotations

import argparse
from collections.abc import Callable
from pathlib import Path

import matplotlib

matplotlib.use("Agg")  # files only, no display
import matplotlib.pyplot as plt  # noqa: E402
import pandas as pd  # noqa: E402

from analysis.load import Frames, load_records  # noqa: E402

KEPT_STATUS = ("completed", "diverged")


def load_sweep(root: str | Path, sweep: str, scale: str | None = "tiny") -> Frames:
    """The runs of ``sweep`` (at ``scale``; None: any) below ``root`` that completed or
    diverged, with their epochs."""
    frames = load_records(root, include_incomplete=True)
    runs = frames.runs
    keep = (runs["sweep"] == sweep) & runs["status"].isin(KEPT_STATUS)
    if scale is not None:
        keep &= runs["scale"] == scale
    return frames.only(runs.loc[keep, "run_id"])


def layer_columns(epochs: pd.DataFrame, prefix: str) -> list[str]:
    """The per-layer columns ``<prefix>/<layer>`` that some epoch logged."""
    return [c for c in epochs.columns if c.startswith(prefix + "/") and epochs[c].notna().any()]


def markdown(frame: pd.DataFrame) -> str:
    """A plain markdown table of ``frame`` (values as they are formatted in it)."""
    head = "| " + " | ".join(map(str, frame.columns)) + " |"
    rule = "|" + "---|" * len(frame.columns)
    rows = ["| " + " | ".join(map(str, row)) + " |" for row in frame.itertuples(index=False)]
    return "\n".join([head, rule, *rows]) + "\n"


def main(name: str, sweep: str, plot: Callable[[Frames], plt.Figure],
         table: Callable[[Frames], str], argv: list[str] | None = None) -> Path:
    """The claim's command line: load ``sweep``'s runs, write ``<out>/<name>.png`` and
    ``<out>/table.md``; returns the output folder."""
    parser = argparse.ArgumentParser(prog=f"python -m analysis.claims_{name}",
                                     description=f"figure and table of conf/sweep/{sweep}.yaml")
    parser.add_argument("runs", nargs="?", default="results/runs", help="root of run records")
    parser.add_argument("--scale", default="tiny", help="the sweep's scale (default tiny)")
    parser.add_argument("--out", default=f"results/claims/{name}", help="output folder")
    args = parser.parse_args(argv)
    frames = load_sweep(args.runs, sweep, args.scale)
    out = Path(args.out)
    if frames.runs.empty:
        raise SystemExit(f"error: no completed runs of sweep {sweep} (scale {args.scale}) below "
                         f"{args.runs}; run `make claim-{name}` first")
    out.mkdir(parents=True, exist_ok=True)
    figure = plot(frames)
    figure.savefig(out / f"{name}.png", dpi=120, bbox_inches="tight")
    plt.close(figure)
    (out / "table.md").write_text(table(frames))
    print(f"{out / (name + '.png')}, {out / 'table.md'}: {len(frames.runs)} runs")
    return out
