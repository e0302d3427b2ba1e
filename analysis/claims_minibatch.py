"""AdaComp Fig. 7a on simulated learners: the effective compression rate falls as the
per-learner mini-batch grows (``conf/sweep/claim_minibatch.yaml``; AdaComp on 4 simulated
learners with 2 .. 128 examples each). The numbers are those of
:func:`analysis.claims_learners.claim_data`.
"""

from __future__ import annotations

import matplotlib.pyplot as plt
import pandas as pd

from analysis import style
from analysis.claims_learners import OPTIMIZERS, accuracy, claim_data, compression, finish
from analysis.load import Frames
from analysis.tables import markdown

SWEEP, FIGURE = "claim_minibatch", "figure.png"
KEEP = ("completed",)


def batch_table(data: pd.DataFrame) -> pd.DataFrame:
    """Per-learner batch down: accuracy and conv / FC compression."""
    rows = [{"optimizer": OPTIMIZERS.get(r.optimizer, r.optimizer), "learners": r.learners,
             "per-learner batch": r.per_learner_batch, "global batch": r.global_batch,
             "seeds": r.seeds, "accuracy (%)": accuracy(r.final, r.final_std, r.seeds),
             "conv": compression(r.conv_x), "FC": compression(r.fc_x)}
            for r in data[data["compressor"] != "none"].itertuples()]
    return pd.DataFrame(rows)


def plot_batch(data: pd.DataFrame) -> plt.Figure:
    """Effective compression per layer type vs the per-learner mini-batch (AdaComp Fig. 7a),
    and the final accuracy of each run beside it."""
    fig, axes = style.subplots(2)
    comp, acc = axes[0]
    ada = data[data["compressor"] != "none"]
    looks = style.Looks(["conv", "fc"])
    for kind in looks.methods:
        comp.plot(ada["per_learner_batch"], ada[f"{kind}_x"], label=kind, **looks.line(kind))
    acc.plot(ada["per_learner_batch"], ada["final"], "o-", color="0.3")
    return finish(fig, acc, comp, "per-learner mini-batch", ada["per_learner_batch"])


def data(frames: Frames) -> pd.DataFrame:
    """What the minibatch claim tables and draws: :func:`claim_data`."""
    return claim_data(frames)


def table(frames: Frames) -> str:
    """The per-learner batch table (markdown)."""
    return markdown(batch_table(claim_data(frames)))


def plot(frames: Frames) -> plt.Figure:
    """The compression vs per-learner batch figure."""
    return plot_batch(claim_data(frames))
