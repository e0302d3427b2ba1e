"""The zoo (issue 26): every registered compressor at its light level, at its heavy level and
under Accordion between them, ranked on accuracy, data sent and time to accuracy.

    python -m analysis.zoo sweep                        # write conf/sweep/zoo.yaml (registry)
    python -m analysis.zoo report [RUNS] [--scale tiny] [--out results/zoo] [--keep DIR]

``sweep`` writes the sweep from the registry, so a new compressor joins by registering: for each
benchmark (tiny: CIFAR-10 and WikiText-2 stand-ins) and compressor with levels, three runs
(``method=zoo_light`` / ``zoo_heavy``: one level throughout, the low / high of its
``accordion_levels``, through ``scheduler=plan``; ``zoo_accordion``: Accordion between them);
one (``zoo_fixed``) for a compressor without levels; and DGC's warm-up (``method=dgc_warmup``).
The sign compressors get their own optimizer settings (:data:`SIGN_OPTIMIZER`).

``report`` reads the sweep's run records and writes to ``--out``:

- ``leaderboard.md`` / ``.csv``: per model, every method ranked by its final test metric (mean
  and std over seeds): data sent (``comm/bits`` summed: the papers' accounting; and
  ``comm/wire_bits``: our messages), measured time per epoch, and time to accuracy over a
  rate-limited link;
- ``pareto.png``: final metric against data sent, each compressor's Accordion point joined to
  its light and heavy points;
- ``recovery.md`` / ``.csv``: per compressor with levels, "does Accordion recover the light
  level's accuracy at fewer bits?" with 95% t-intervals over seeds (paired by seed).

Every row names what made it (``made``: the commits and the machines' fingerprints of its runs).
``--keep DIR`` finishes a sweep whose earlier runs' records are gone (another session, another
machine): the rows of the report in DIR for the methods (and compressors) these runs lack are
kept beside these runs' rows and ranked with them; the heading lists them, and sets these runs'
final beside the earlier report's for the methods both hold (rerun a few on purpose: equal
finals show that the two parts' numerics agree).

Time over the link. ``make bench-tta`` sets a link whose rate makes the dense (fp32) exchange of
a step take ``ratio`` = 4 times the step's compute. The zoo's runs ran on loopback, so their time
over that link is modelled, per epoch: the measured ``time/epoch_s`` plus ``ratio`` x t_0 x
wire / dense, where t_0 is the epoch time of the ``none`` run of the same model and seed (the
compute), wire the epoch's ``comm/wire_bits`` and dense its ``comm/bits_dense`` (fp32 for every
element). On 2 workers a ring all-reduce and an all-gather put the same bytes on each worker's
link, so bits are what count; nothing overlaps (an upper bound). Time to accuracy: the modelled
training time until the test metric first reaches the final value of the same compressor's
light-level run (the compressor's own final for one without levels), same model and seed.
"""

from __future__ import annotations

import argparse
import math
import re
import sys
from pathlib import Path
from typing import Any, NamedTuple

import matplotlib.pyplot as plt
import numpy as np
import pandas as pd
import yaml
from matplotlib.lines import Line2D

import compression
from analysis import provenance, style
from analysis.claims import load_sweep, made_by
from analysis.tables import markdown, mean_std, run_stats
from analysis.verdicts import load_margins

ROOT = Path(__file__).resolve().parents[1]
SWEEP = ROOT / "conf" / "sweep" / "zoo.yaml"
MODELS = {"cifar10": "resnet18", "wikitext2": "lstm"}  # benchmark: model
ROLES = ("light", "heavy", "accordion")
# Sign updates need a sign-sized step and no optimizer momentum (Signum's is the worker's):
# ours, Adam-like 1e-3 per element (not tuned); the warm-up starts at the recipe's 1/5 of it;
# no clipping (clipping a vector of signs only rescales it).
SIGN_OPTIMIZER = {"optimizer.lr": 0.001, "optimizer.momentum": 0.0,
                  "optimizer.schedule.warmup_start_lr": 0.0002, "trainer.grad_clip": "null"}
EXTRA = {"signsgd": SIGN_OPTIMIZER, "signum": SIGN_OPTIMIZER}
SEEDS = (0, 1, 2)  # the sweep's seeds
# The loss that still counts as recovered: the scorecard's margins for Accordion's "without
# accuracy degradation" (analysis/claims.yaml, each with its source in the papers' tables).
MARGINS = {"test/accuracy": "accordion_accuracy", "test/perplexity": "accordion_perplexity"}
RATIO = 4.0  # make bench-tta's link: the dense exchange takes RATIO x the compute
# Two-sided 95% quantiles of Student's t by degrees of freedom (beyond 30: the 30th).
T95 = (12.706, 4.303, 3.182, 2.776, 2.571, 2.447, 2.365, 2.306, 2.262, 2.228, 2.201, 2.179,
       2.160, 2.145, 2.131, 2.120, 2.110, 2.101, 2.093, 2.086, 2.080, 2.074, 2.069, 2.064,
       2.060, 2.056, 2.052, 2.048, 2.045, 2.042)


# ---- the sweep ------------------------------------------------------------------------------
def groups() -> list[dict[str, Any]]:
    """The sweep's run groups: per benchmark, each compressor's light / heavy / Accordion runs
    (or its one run), and DGC's warm-up."""
    out = []
    for benchmark, model in MODELS.items():
        common = {"benchmark": benchmark, "model": model, "baseline": "none"}
        for name in compression.available():
            extra = EXTRA.get(name, {})
            levels = compression.create(name).accordion_levels
            if levels is None:
                out.append({**common, "compressor": name, "method": "zoo_fixed", **extra})
                continue
            for role, level in zip(ROLES[:2], levels, strict=True):
                out.append({**common, "compressor": name, "method": f"zoo_{role}",
                            "scheduler.levels": f"[{level}]", **extra})
            out.append({**common, "compressor": name, "method": "zoo_accordion", **extra})
        out.append({**common, "method": "dgc_warmup"})
    return out


def sweep_text() -> str:
    """conf/sweep/zoo.yaml as :func:`groups` makes it."""
    head = f"""# @package _global_
# GENERATED by `python -m analysis.zoo sweep` from the compressor registry: do not edit by hand.
# The zoo (issue 26; docs/compressors.md): every compressor at its light level, its heavy level
# (the low and high of its accordion_levels) and Accordion between them; one run for a
# compressor without levels; DGC with its warm-up. Seeds 0, 1, 2.
#   make reproduce-zoo [SCALE=tiny] [ONLY=compressor=qsgd]
#   or: python run.py -m sweep=zoo scale=tiny [compressor=qsgd]
# Run groups x params, as conf/sweep_runs.yaml and the README's Sweeps section describe.
defaults:
  - /sweep_runs
  - override /benchmark: {next(iter(MODELS))}   # the sweep's own config; each run sets its own

sweep: zoo
"""
    body = {"hydra": {"sweeper": {"groups": groups(),
                                  "params": {"seed": ",".join(map(str, SEEDS)),
                                             "variant": "ours"}}}}
    return head + yaml.safe_dump(body, sort_keys=False, width=100, default_flow_style=None)


def label(group: dict[str, Any]) -> str:
    """The method label a group's runs record (``conf/method/``): ``<compressor>-<role>``, the
    compressor's name for ``zoo_fixed``, ``dgc-warmup``."""
    method = group["method"]
    if method == "zoo_fixed":
        return group["compressor"]
    if method.startswith("zoo_"):
        return f"{group['compressor']}-{method.removeprefix('zoo_')}"
    return method.replace("_", "-")


def not_run(numbers: pd.DataFrame, kept: set[tuple[str, str]] = frozenset()
            ) -> dict[str, list[str]]:
    """Per model, the sweep's runs that ``numbers`` lacks: a method label, with the seeds it
    lacks where it has some; none of the methods ``kept`` (model, method) from an earlier
    report."""
    have = set(zip(numbers["model.name"], numbers["method"], numbers["seed"], strict=True))
    out: dict[str, list[str]] = {}
    for group in groups():
        model, name = group["model"], label(group)
        if (model, name) in kept:
            continue
        seeds = [s for s in SEEDS if (model, name, s) not in have]
        if seeds:
            out.setdefault(model, []).append(
                name if len(seeds) == len(SEEDS) else
                f"{name} (seed{'s' if len(seeds) > 1 else ''} {', '.join(map(str, seeds))})")
    return out


# ---- the numbers ------------------------------------------------------------------------------
def run_numbers(frames: Any) -> pd.DataFrame:
    """One row per run: model, compressor, role, seed, metric, final, bits, wire bits, measured
    and modelled time per epoch, time to the light level's accuracy."""
    stats = run_stats(frames).set_index("run_id")
    epochs = frames.epochs.sort_values(["run_id", "epoch"])
    grouped = epochs.groupby("run_id")
    stats["wire"] = grouped["comm/wire_bits"].sum(min_count=1)
    stats["epoch_s"] = grouped["time/epoch_s"].mean()
    stats["role"] = [_role(m, c) for m, c in zip(stats["method"], stats["compressor.name"],
                                                 strict=True)]
    stats = stats.reset_index()
    compute = stats[stats["compressor.name"] == "none"].set_index(["model.name", "seed"])
    link_s, tta = [], []
    for run in stats.itertuples(index=False):
        key = (run[stats.columns.get_loc("model.name")], run.seed)
        t0 = compute["epoch_s"].get(key, np.nan)
        rows = epochs[epochs["run_id"] == run.run_id]
        modelled = rows["time/epoch_s"] + RATIO * t0 * rows["comm/wire_bits"] / rows[
            "comm/bits_dense"]
        link_s.append(float(modelled.mean()))
        tta.append(_time_to(rows[run.metric].to_numpy(), modelled.to_numpy(),
                            _target(stats, run), _lower(run.metric)))
    stats["link_epoch_s"], stats["tta_s"] = link_s, tta
    return stats


def _role(method: str, compressor: str) -> str:
    """``light`` / ``heavy`` / ``accordion`` / ``warmup`` from the method label
    (``<compressor>-<role>``); ``fixed`` for a compressor without levels."""
    return method[len(compressor) + 1:] if method.startswith(f"{compressor}-") else "fixed"


def _lower(metric: str) -> bool:
    return metric.endswith(("perplexity", "loss"))


def _target(stats: pd.DataFrame, run: Any) -> float:
    """The final metric of the same compressor's light run (same model and seed), or the run's
    own final for a compressor without levels."""
    if run.role == "fixed":
        return run.final
    light = stats[(stats["compressor.name"] == run[stats.columns.get_loc("compressor.name")])
                  & (stats["model.name"] == run[stats.columns.get_loc("model.name")])
                  & (stats["seed"] == run.seed) & (stats["role"] == "light")]
    return float(light["final"].iloc[0]) if len(light) else np.nan


def _time_to(values: np.ndarray, seconds: np.ndarray, target: float, lower: bool) -> float:
    """Seconds until ``values`` first reach ``target`` (NaN: never, or no target)."""
    if math.isnan(target):
        return np.nan
    reached = values <= target if lower else values >= target
    hits = np.flatnonzero(reached)
    return float(np.cumsum(seconds)[hits[0]]) if len(hits) else np.nan


def interval(values: pd.Series) -> tuple[float, float, float]:
    """Mean and the two ends of its 95% t-interval (NaN ends with fewer than 2 values)."""
    x = values.dropna().to_numpy(dtype=float)
    if len(x) < 2:
        return (float(x.mean()) if len(x) else np.nan), np.nan, np.nan
    half = T95[min(len(x) - 1, len(T95)) - 1] * x.std(ddof=1) / math.sqrt(len(x))
    return float(x.mean()), float(x.mean() - half), float(x.mean() + half)


# ---- the tables ------------------------------------------------------------------------------
def leaderboard(numbers: pd.DataFrame) -> pd.DataFrame:
    """Per model, per method: the means (and the final's std) over seeds, ranked by final."""
    rows = []
    for (model, method), runs in numbers.groupby(["model.name", "method"]):
        rows.append({"model": model, "method": method, "metric": runs["metric"].iloc[0],
                     "compressor": runs["compressor.name"].iloc[0], "role": runs["role"].iloc[0],
                     "final": runs["final"].mean(), "final_std": runs["final"].std(ddof=1),
                     "gbit": runs["bits"].mean() / 1e9, "wire_gbit": runs["wire"].mean() / 1e9,
                     "epoch_s": runs["epoch_s"].mean(), "link_epoch_s": runs["link_epoch_s"].mean(),
                     "tta_s": runs["tta_s"].mean(), "reached": int(runs["tta_s"].notna().sum()),
                     "seeds": len(runs), "made": made(runs)})
    return ranked(pd.DataFrame(rows))


def ranked(table: pd.DataFrame) -> pd.DataFrame:
    """``table`` sorted per model by its final metric, best first, and ``rank`` numbered."""
    score = np.where(table["metric"].map(_lower), -table["final"], table["final"])
    table = table.assign(score=score).sort_values(["model", "score"], ascending=[True, False])
    table["rank"] = table.groupby("model").cumcount() + 1
    return table.drop(columns="score")


def made(runs: pd.DataFrame) -> str:
    """What made ``runs``: their commits and machines' fingerprints (``<commits> on <fps>``)."""
    cell = provenance.cell(runs)
    return f"{cell['commits']} on {cell['fingerprints']}"


def recovery(numbers: pd.DataFrame) -> pd.DataFrame:
    """Per model and compressor with levels: Accordion (and heavy) minus light, per seed, in the
    metric's better direction; Accordion's bits over light's; the margin; the answer."""
    margins = load_margins()
    rows = []
    for (model, name), runs in numbers.groupby(["model.name", "compressor.name"]):
        by_role = {role: r.set_index("seed") for role, r in runs.groupby("role")}
        if not {"light", "accordion"} <= by_role.keys():
            continue
        metric = runs["metric"].iloc[0]
        sign = -1.0 if _lower(metric) else 1.0
        light = by_role["light"]
        gain = interval(sign * (by_role["accordion"]["final"] - light["final"]))
        heavy = interval(sign * (by_role["heavy"]["final"] - light["final"])) if (
            "heavy" in by_role) else (np.nan, np.nan, np.nan)
        bits = interval(by_role["accordion"]["bits"] / light["bits"])
        margin = margins[MARGINS[metric]]
        rows.append({"model": model, "compressor": name, "seeds": int(gain[0] == gain[0]) and
                     len((by_role["accordion"]["final"] - light["final"]).dropna()),
                     "accordion_minus_light": gain, "heavy_minus_light": heavy,
                     "bits_ratio": bits, "margin": margin, "answer": answer(gain, bits, margin),
                     "made": made(runs)})
    return pd.DataFrame(rows)


def answer(gain: tuple[float, float, float], bits: tuple[float, float, float],
           margin: float) -> str:
    """As the scorecard judges Accordion's "within the margin" (analysis/verdicts.py): ``yes``
    where Accordion sends fewer bits (the ratio's interval below 1) and the difference's interval
    lies wholly above -``margin``; ``no`` where it sends no fewer bits or the interval lies wholly
    at or below -``margin``; ``can't tell`` where it straddles; ``n/a`` with fewer than 2 seeds."""
    if math.isnan(gain[1]) or math.isnan(bits[2]):
        return "n/a (fewer than 2 seeds)"
    if bits[2] >= 1:
        return "no: not fewer bits"
    if gain[1] > -margin:
        return "yes"
    if gain[2] <= -margin:
        return "no: loses accuracy"
    return "can't tell (the interval straddles -margin)"


def _ci(values: tuple[float, float, float], digits: int = 2) -> str:
    mean, low, high = values
    if math.isnan(mean):
        return "n/a"
    if math.isnan(low):
        return f"{mean:+.{digits}f}"
    return f"{mean:+.{digits}f} [{low:+.{digits}f}, {high:+.{digits}f}]"


def leaderboard_markdown(table: pd.DataFrame) -> str:
    """The leaderboard as markdown, one section per model."""
    parts = []
    for model, rows in table.groupby("model", sort=True):
        metric = rows["metric"].iloc[0]
        shown = pd.DataFrame({
            "rank": rows["rank"], "method": rows["method"],
            metric: [mean_std(m, s) for m, s in zip(rows["final"], rows["final_std"],
                                                    strict=True)],
            "Gbit sent (paper)": rows["gbit"].map(lambda v: f"{v:.3g}"),
            "Gbit sent (wire)": rows["wire_gbit"].map(lambda v: f"{v:.3g}"),
            "s / epoch (measured)": rows["epoch_s"].map(lambda v: f"{v:.2f}"),
            f"s / epoch (link, ratio {RATIO:g})": rows["link_epoch_s"].map(
                lambda v: NO_COMPUTE if math.isnan(v) else f"{v:.2f}"),
            "s to light's accuracy (link)": [
                _time_to_text(*row) for row in zip(rows["tta_s"], rows["reached"],
                                                    rows["seeds"], rows["link_epoch_s"],
                                                    strict=True)],
            "seeds": rows["seeds"]})
        parts += [f"**{model}**", "", markdown(_with_made_column(shown, table)), ""]
    return "\n".join(parts)


NO_COMPUTE = "n/a (no none run)"  # the link's time needs the compute: the none run's epoch


def _time_to_text(seconds: float, reached: int, seeds: int, link_epoch_s: float) -> str:
    """The time to the light level's accuracy, over the seeds that reached it."""
    if math.isnan(link_epoch_s):
        return NO_COMPUTE
    if reached == 0:
        return "never"
    return f"{seconds:.1f}" + ("" if reached == seeds else f" ({reached} of {seeds} seeds)")


def recovery_markdown(table: pd.DataFrame) -> str:
    shown = pd.DataFrame({
        "model": table["model"], "compressor": table["compressor"],
        "Accordion - light (95% CI)": table["accordion_minus_light"].map(_ci),
        "heavy - light (95% CI)": table["heavy_minus_light"].map(_ci),
        "Accordion's bits / light's (95% CI)": table["bits_ratio"].map(
            lambda v: _ci(v, 3).replace("+", "")),
        "margin": table["margin"].map(lambda v: f"{v:g}"),
        "recovers the light level's accuracy at fewer bits?": table["answer"]})
    return markdown(_with_made_column(shown, table))


def _with_made_column(shown: pd.DataFrame, table: pd.DataFrame) -> pd.DataFrame:
    """``shown`` with a ``made`` column (commits on machines) where ``table``'s rows were made
    by more than one (rows kept from an earlier report)."""
    return shown.assign(made=table["made"]) if table["made"].nunique() > 1 else shown


# ---- the figure ----------------------------------------------------------------------------------
# role -> marker, fill, size and legend text; a compressor's colour is the same in every panel
ROLE_LOOKS = {"light": ("o", "full", 6, "light level"), "heavy": ("o", "none", 6, "heavy level"),
              "accordion": ("*", "full", 12, "Accordion between them"),
              "fixed": ("s", "full", 6, "no levels: one run"),
              "warmup": ("D", "none", 6, "DGC's warm-up")}
ZOO_PANEL = 1.5  # the zoo's panels: 1.5 x the suite's (up to fifteen compressors each)


def pareto(table: pd.DataFrame) -> plt.Figure:
    """Final metric (mean ± std over seeds) against bits sent, per model; each compressor's
    Accordion point joined to its light and heavy points (dashed)."""
    models = sorted(table["model"].unique())
    names = sorted(table["compressor"].unique())
    colours = dict(zip(names, style.colors(len(names)), strict=True))
    fig, axes = style.subplots(len(models), width=ZOO_PANEL * style.PANEL_WIDTH,
                               height=ZOO_PANEL * style.PANEL_HEIGHT)
    for ax, model in zip(axes.flat, models, strict=False):
        rows = table[table["model"] == model].assign(bits=lambda t: t["gbit"] * 1e9)
        for name, runs in rows.groupby("compressor"):
            points = runs.set_index("role")
            for end in ("light", "heavy"):
                if {"accordion", end} <= set(points.index):
                    ax.plot(points.loc[["accordion", end], "bits"],
                            points.loc[["accordion", end], "final"], "--", color=colours[name],
                            lw=1)
            for role, point in points.iterrows():
                marker, fill, size, _ = ROLE_LOOKS[role]
                ax.errorbar(point["bits"], point["final"], yerr=point["final_std"],
                            color=colours[name], marker=marker, fillstyle=fill, ms=size,
                            capsize=2, ls="none")
        ax.set(title=model, xlabel="data sent per worker (bits, the papers' count)",
               ylabel=style.label(rows["metric"].iloc[0], "final"))
        style.count_axis(ax, "x", rows["bits"])
    fig.tight_layout()
    roles = set(table["role"])
    handles = [Line2D([], [], color=colours[n], lw=2, label=n) for n in names]
    handles += [Line2D([], [], color="black", marker=m, fillstyle=f, ms=s, ls="none", label=t)
                for role, (m, f, s, t) in ROLE_LOOKS.items() if role in roles]
    style.legend_below(fig, handles)
    return fig


# ---- an earlier report's rows ---------------------------------------------------------------
TRIPLES = ("accordion_minus_light", "heavy_minus_light", "bits_ratio")  # recovery.csv's intervals
MADE = re.compile(r"\d+ runs, on (.+?); commit (.+?)\.(?: |$)")  # analysis.claims.made_by's


class Earlier(NamedTuple):
    """What ``--keep DIR`` takes from the report in DIR: its rows for the methods (leaderboard)
    and compressors (recovery) these runs lack, and its rows of the methods both hold."""

    folder: Path
    board: pd.DataFrame
    answers: pd.DataFrame
    both: pd.DataFrame


def earlier(folder: Path, board: pd.DataFrame) -> Earlier:
    """The rows of the report in ``folder`` (its leaderboard.csv and recovery.csv) that these
    runs lack: the methods ``board`` has no row of, the answers for the compressors it has no
    method of (an answer pairs a compressor's runs; it never mixes the two reports'); each
    names what made it (``made``: from its own column, or for a report older than that column,
    from its heading)."""
    for name in ("leaderboard.csv", "recovery.csv", "leaderboard.md"):
        if not (folder / name).is_file():
            raise ValueError(f"--keep: {folder} holds no {name}; it takes the folder of an "
                             "earlier `python -m analysis.zoo report`")
    old = _with_made(pd.read_csv(folder / "leaderboard.csv"), folder)
    old_answers = _with_made(pd.read_csv(folder / "recovery.csv",
                                         converters=dict.fromkeys(TRIPLES, _triple)), folder)
    methods = set(zip(board["model"], board["method"], strict=True))
    shared = [key in methods for key in zip(old["model"], old["method"], strict=True)]
    run = set(zip(board["model"], board["compressor"], strict=True))  # any of its methods
    answered = [key in run
                for key in zip(old_answers["model"], old_answers["compressor"], strict=True)]
    return Earlier(folder, old[[not s for s in shared]].drop(columns="rank"),
                   old_answers[[not a for a in answered]], old[shared])


def _with_made(table: pd.DataFrame, folder: Path) -> pd.DataFrame:
    """``table`` with its ``made`` column; a report older than that column says it once, in
    its heading (``N runs, on <fingerprint>: <machine>; commit <commits>.``)."""
    if "made" in table:
        return table
    match = MADE.search((folder / "leaderboard.md").read_text().split("\n")[0])
    if match is None:
        raise ValueError(f"--keep: {folder}/leaderboard.csv has no `made` column and its "
                         "heading does not say which commit and machine made it")
    fingerprints = re.findall(r"\b([0-9a-f]{12}):", match[1]) or [match[1]]
    return table.assign(made=f"{match[2]} on {', '.join(fingerprints)}")


def _triple(text: str) -> tuple[float, float, float]:
    """A recovery.csv interval, ``(mean, low, high)`` as written (``nan`` included)."""
    mean, low, high = (float(x) for x in text.strip("()").split(","))
    return mean, low, high


def with_earlier(board: pd.DataFrame, answers: pd.DataFrame, kept: Earlier
                 ) -> tuple[pd.DataFrame, pd.DataFrame]:
    """These runs' rows and the kept ones, ranked together."""
    board = ranked(pd.concat([board, kept.board], ignore_index=True))
    answers = pd.concat([answers, kept.answers], ignore_index=True)
    return board, answers.sort_values(["model", "compressor"], ignore_index=True)


def kept_text(board: pd.DataFrame, kept: Earlier) -> str:
    """The heading's sentences on the kept rows, and on the methods both reports hold: these
    runs' final beside the earlier one (equal where only the commit or the session differs and
    the numerics are portable)."""
    names = "; ".join(f"{model}: {', '.join(rows['method'])}"
                      for model, rows in kept.board.groupby("model"))
    text = (f" Kept from the earlier report in {kept.folder} (`--keep`), for the methods these "
            f"runs lack: {len(kept.board)} methods' rows ({int(kept.board['seeds'].sum())} runs, "
            f"made by {', '.join(sorted(set(kept.board['made'])))}): {names}.")
    if len(kept.both):
        now = board.set_index(["model", "method"])
        pairs = [_both_text(row, now.loc[(row.model, row.method)])
                 for row in kept.both.itertuples()]
        text += (" The methods both hold, these runs' final mean (the earlier report's, made "
                 f"by {', '.join(sorted(set(kept.both['made'])))}): {'; '.join(pairs)}.")
    return text


def _both_text(earlier_row: Any, now: pd.Series) -> str:
    """``resnet18 none 97.7333 (earlier 97.7333, equal)``; the seeds where they differ."""
    head = f"{earlier_row.model} {earlier_row.method} {now['final']:.4f}"
    if now["seeds"] != earlier_row.seeds:
        return f"{head} over {now['seeds']} seeds (earlier {earlier_row.final:.4f} over " \
               f"{earlier_row.seeds})"
    same = ", equal" if now["final"] == earlier_row.final else ""
    return f"{head} (earlier {earlier_row.final:.4f}{same})"


# ---- the command line ----------------------------------------------------------------------
def report(runs: Path, scale: str | None, out: Path, keep: Path | None = None) -> list[Path]:
    """Write the leaderboard, the recovery answers and the Pareto figure; returns the files.
    ``keep``: the folder of an earlier report whose rows for the methods these runs lack are
    kept (a sweep finished in another session, whose run records are gone)."""
    frames = load_sweep(runs, "zoo", scale, keep=("completed", "diverged"))  # a divergence ranks
    if frames.runs.empty:
        raise SystemExit(f"error: no zoo runs (sweep=zoo, scale={scale}) below {runs}")
    numbers = run_numbers(frames)
    board, answers = leaderboard(numbers), recovery(numbers)
    kept = None
    if keep is not None:
        kept = earlier(keep, board)   # read before out (maybe the same folder) is written
        board, answers = with_earlier(board, answers, kept)
    out.mkdir(parents=True, exist_ok=True)
    board.to_csv(out / "leaderboard.csv", index=False)
    answers.to_csv(out / "recovery.csv", index=False)
    head = heading(numbers, frames, runs, scale, board, kept)
    (out / "leaderboard.md").write_text(head + leaderboard_markdown(board))
    (out / "recovery.md").write_text(
        head + "Differences in the metric's better direction (accuracy points; perplexity "
        "negated), paired by seed, with 95% t-intervals. yes = fewer bits, and the interval "
        "of Accordion - light wholly above -margin (the scorecard's margin for Accordion's "
        "accuracy, analysis/claims.yaml); can't tell = the interval straddles it.\n\n"
        + recovery_markdown(answers))
    style.save(pareto(board), [out / "pareto.png"])
    return [out / f for f in ("leaderboard.md", "leaderboard.csv", "recovery.md",
                              "recovery.csv", "pareto.png")]


def heading(numbers: pd.DataFrame, frames: Any, runs: Path, scale: str | None,
            board: pd.DataFrame, kept: Earlier | None = None) -> str:
    """What the tables are of: the command, the runs present of those planned, their machines
    and commits, the rows kept from an earlier report, the failed runs and the planned runs not
    yet run."""
    planned = len(groups()) * len(SEEDS)
    command = f"python -m analysis.zoo report {runs} --scale {scale}" + (
        f" --keep {kept.folder}" if kept else "")
    text = (f"The zoo at scale {scale}: `{command}` over the runs of `make reproduce-zoo`, "
            f"{len(numbers)} of its {planned} runs "
            f"(seeds {', '.join(map(str, sorted(numbers['seed'].unique())))}): "
            f"{made_by(frames.runs)} Mean ± std over seeds; time over the link modelled as "
            "analysis/zoo.py describes.")
    if kept is not None:
        text += kept_text(board, kept)
    if len(frames.problems):
        text += f" {len(frames.problems)} run(s) failed or unfinished: see their run records."
    missing = not_run(numbers, set() if kept is None else
                      set(zip(kept.board["model"], kept.board["method"], strict=True)))
    if missing:
        text += " Not run yet: " + "; ".join(
            f"{model}: {', '.join(names)}" for model, names in missing.items()) + "."
    return text + "\n\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m analysis.zoo",
                                     description=__doc__.split("\n")[0])
    sub = parser.add_subparsers(dest="command", required=True)
    sub.add_parser("sweep", help=f"write {SWEEP.relative_to(ROOT)} from the registry")
    rep = sub.add_parser("report", help="leaderboard, recovery answers and Pareto figure")
    rep.add_argument("runs", nargs="?", type=Path, default=Path("results/runs"))
    rep.add_argument("--scale", default="tiny")
    rep.add_argument("--out", type=Path, default=Path("results/zoo"))
    rep.add_argument("--keep", type=Path, metavar="DIR",
                     help="keep the rows of the earlier report in DIR for the methods these runs "
                          "lack (its run records gone); the heading says what made each part")
    args = parser.parse_args(argv)
    if args.command == "sweep":
        SWEEP.write_text(sweep_text())
        print(f"wrote {SWEEP.relative_to(ROOT)}: {len(groups())} run groups x 3 seeds")
        return 0
    try:
        paths = report(args.runs, args.scale, args.out, args.keep)
    except ValueError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    for path in paths:
        print(path)
    return 0


if __name__ == "__main__":
    sys.exit(main())
