"""AdaComp's claims that no table holds, from the run records of their sweeps.

    python -m analysis.claims learners results/runs/claim_learners --out results/claims/learners
    python -m analysis.claims minibatch results/runs/claim_minibatch --out results/claims/minibatch

- ``learners`` (``conf/sweep/claim_learners.yaml``): accuracy and effective compression of
  AdaComp against the number of learners (simulated, 1 .. 128) under momentum SGD and Adam, with
  the uncompressed run of each optimizer as the baseline ("CIFAR10-CNN (up to 128 learners) ...
  under both momentum SGD and Adam without noticeable accuracy degradation").
- ``minibatch`` (``conf/sweep/claim_minibatch.yaml``): AdaComp's effective compression rate
  against the per-learner mini-batch size (AdaComp Fig. 7a: it falls as that batch grows).

Effective compression per layer type is AdaComp's: the compressed layers' fp32 bits over the
bits their 8/16-bit sparse ternary encoding sent, summed over the run (``comm/bits_dense_<type>``
/ ``comm/bits_<type>``, :func:`analysis.tables.run_stats`). Each claim writes ``table.{md,csv}``
and ``figure.png`` into ``--out``; ``data`` functions return exactly what is tabled and drawn.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import matplotlib

matplotlib.use("Agg")  # files only, no display
import matplotlib.pyplot as plt  # noqa: E402
import pandas as pd  # noqa: E402
import seaborn as sns  # noqa: E402
from matplotlib.ticker import FormatStrFormatter  # noqa: E402

from analysis.figures import STYLE  # noqa: E402
from analysis.load import Frames, load_records  # noqa: E402
from analysis.tables import markdown, run_stats  # noqa: E402

# The seed's figures for AdaComp (analysis/reference: adacomp-t2, seed-adacomp).
PAPER_X = {"conv": 40.0, "fc": 200.0}
CLAIMS = ("learners", "minibatch")
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
    data = stats.groupby(keys, as_index=False).agg(
        seeds=("seed", "nunique"), final=("final", "mean"), final_std=("final", "std"),
        best=("best", "mean"),
        conv_x=("conv_x", "mean"), fc_x=("fc_x", "mean"))
    return data.sort_values(keys, ignore_index=True)


def _x(value: float) -> str:
    return "—" if pd.isna(value) else f"{value:.1f}x"


def _accuracy(final: float, final_std: float, seeds: int) -> str:
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
            row[f"{label}: accuracy (%)"] = _accuracy(first["final"], first["final_std"],
                                                      first["seeds"])
            row[f"{label}: conv"] = _x(first["conv_x"])
            row[f"{label}: FC"] = _x(first["fc_x"])
        rows.append(row)
    rows.sort(key=lambda r: (r["compressor"] != "none", r["compressor"], r["learners"]))
    return pd.DataFrame(rows)


def batch_table(data: pd.DataFrame) -> pd.DataFrame:
    """Per-learner batch down: accuracy and conv / FC compression."""
    rows = [{"optimizer": OPTIMIZERS.get(r.optimizer, r.optimizer), "learners": r.learners,
             "per-learner batch": r.per_learner_batch, "global batch": r.global_batch,
             "seeds": r.seeds, "accuracy (%)": _accuracy(r.final, r.final_std, r.seeds),
             "conv": _x(r.conv_x), "FC": _x(r.fc_x)}
            for r in data[data["compressor"] != "none"].itertuples()]
    return pd.DataFrame(rows)


def plot_learners(data: pd.DataFrame) -> plt.Figure:
    """(a) final accuracy vs learners per optimizer, the uncompressed run dashed; (b) effective
    compression per layer type vs learners, the paper's 40x / 200x dotted."""
    sns.set_theme(**STYLE)
    fig, (acc, comp) = plt.subplots(1, 2, figsize=(9.0, 3.4))
    colours = dict(zip(OPTIMIZERS, sns.color_palette(n_colors=len(OPTIMIZERS)), strict=True))
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
    for kind, value in PAPER_X.items():
        comp.axhline(value, color="grey", ls=":", lw=1)
        comp.annotate(f"paper {kind} {value:.0f}x", (1, value), fontsize=7, color="grey",
                      va="bottom")
    acc.legend(fontsize=7)
    return _finish(fig, acc, comp, "learners (simulated)")


def plot_batch(data: pd.DataFrame) -> plt.Figure:
    """Effective compression per layer type vs the per-learner mini-batch (AdaComp Fig. 7a),
    and the final accuracy of each run beside it."""
    sns.set_theme(**STYLE)
    fig, (comp, acc) = plt.subplots(1, 2, figsize=(9.0, 3.4))
    ada = data[data["compressor"] != "none"]
    for kind, marker in (("conv", "o"), ("fc", "s")):
        comp.plot(ada["per_learner_batch"], ada[f"{kind}_x"], marker=marker, label=kind)
        comp.axhline(PAPER_X[kind], color="grey", ls=":", lw=1)
    acc.plot(ada["per_learner_batch"], ada["final"], "o-")
    return _finish(fig, acc, comp, "per-learner mini-batch")


def _finish(fig: plt.Figure, acc: plt.Axes, comp: plt.Axes, xlabel: str) -> plt.Figure:
    """Both figures' axes: log2 x, accuracy and log compression y, the compression legend."""
    for ax in (acc, comp):
        ax.set_xscale("log", base=2)
        ax.xaxis.set_major_formatter(FormatStrFormatter("%g"))  # 1, 2, 4 rather than 2^k
        ax.set_xlabel(xlabel)
    acc.set_ylabel("final test accuracy (%)")
    comp.set_ylabel("effective compression (x)")
    comp.set_yscale("log")
    comp.legend(fontsize=7)
    fig.tight_layout()
    return fig


def report(claim: str, runs: Path, out: Path) -> list[Path]:
    """Write ``out/table.{md,csv}`` and ``out/figure.png`` for ``claim``; the paths."""
    frames = load_records(runs)
    if frames.runs.empty:
        raise ValueError(f"runs: no complete run record below {runs}")
    data = claim_data(frames)
    shown = learners_table(data) if claim == "learners" else batch_table(data)
    fig = plot_learners(data) if claim == "learners" else plot_batch(data)
    out.mkdir(parents=True, exist_ok=True)
    paths = [out / "table.csv", out / "table.md", out / "figure.png"]
    data.to_csv(paths[0], index=False)
    left_out = len(frames.problems)
    note = f"\n{left_out} run(s) left out: see their run records.\n" if left_out else ""
    paths[1].write_text(markdown(shown) + note)
    fig.savefig(paths[2], dpi=150, bbox_inches="tight")
    plt.close(fig)
    return paths


def main(argv: list[str] | None = None) -> int:
    """CLI: ``python -m analysis.claims {learners,minibatch} RUNS --out DIR``."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("claim", choices=CLAIMS)
    parser.add_argument("runs", type=Path, help="the claim sweep's run directories")
    parser.add_argument("--out", type=Path, default=None,
                        help="output folder (default results/claims/<claim>)")
    args = parser.parse_args(argv)
    try:
        paths = report(args.claim, args.runs, args.out or Path("results/claims") / args.claim)
    except (FileNotFoundError, ValueError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    for path in paths:
        print(path)
    return 0


if __name__ == "__main__":
    sys.exit(main())
