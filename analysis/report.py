"""A report per sweep: tables, figures, the what-if and a generated summary, in markdown and HTML.

    python -m analysis.report results/runs --sweep table1 --scale tiny
    python -m analysis.report outputs/my-sweep --out results/mine
    python -m analysis.report --wandb my-team/accordion-bench --group table1

Reads every run record below the runs dir (or a W&B project, ``--wandb``), keeps the runs of the
asked sweeps and scales (by their config, never by directory names), and writes for every sweep
into ``--out`` (default ``results/<sweep>/``; ``<out>/<sweep>/`` when there are several):
``table.{md,csv,tex}``, ``layer_types.*`` (effective compression per layer type), ``whatif.*``
(Accordion's detector replayed at other eta / interval; needs run records), ``figures/*.{png,pdf}``,
``skipped.csv`` (runs left out, with reasons) and ``report.md`` / ``report.html`` (self-contained:
the figures are embedded). It prints where the reports are. Exit status 2 on bad input.
"""

from __future__ import annotations

import argparse
import base64
import html
import math
import re
import sys
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

import pandas as pd

from analysis import figures, reference, tables, whatif
from analysis.load import Frames, load_records
from analysis.wandb_runs import compare, load_wandb, load_wandb_files

ACCURACY_TOLERANCE = 0.5  # points: a paper-scale row "matches" within max(2 std, this)
PERPLEXITY_TOLERANCE = 0.02  # relative, the same for perplexity
ACCOUNTING = (
    "Data sent is `comm/bits` summed over epochs: the payload one worker put into its gradient "
    "messages, counted as the papers count it (32 bits per fp32 element; PowerSGD's P and Q; "
    "Top-K's value and index, 64 bits per kept element; AdaComp's 8- or 16-bit sparse ternary "
    "encoding). Floats = bits / 32, the unit of the Accordion authors (an index counts as one "
    "float); bytes = bits / 8. `vs fp32` is fp32's volume over ours, `reduction` the group "
    "baseline's volume over ours, `speed-up` the baseline's training time (sum of "
    "`time/epoch_s`, evaluation excluded) over ours. Final and best are the last and the best "
    "epoch's test metric, mean ± std over seeds (std with n - 1; one seed: no std).")


OUTPUTS = ("report.md", "report.html", "table.*", "layer_types.*", "whatif.*", "skipped.csv",
           "figures/*.png", "figures/*.pdf")


@dataclass
class Block:
    """One piece of a report: a heading, a paragraph, a table (of strings) or a figure."""

    kind: str  # h1 | h2 | p | list | table | figure
    text: str = ""
    items: list[str] = field(default_factory=list)
    table: pd.DataFrame | None = None
    figure: figures.Figure | None = None


# ---- one sweep ------------------------------------------------------------------------------
@dataclass
class Written:
    """A written report: its markdown and HTML pages, and its table's caption and main columns
    as terminal text ('' without runs)."""

    md: Path
    html: Path
    table: str


def sweep_report(frames: Frames, sweep: str, out: Path, ref: pd.DataFrame,
                 official: pd.DataFrame | None, etas: Sequence[float] | None = None,
                 intervals: Sequence[int] | None = None, notes: Sequence[str] = ()
                 ) -> Written:
    """Write every file of one sweep's report into ``out``; returns what :class:`Written`
    holds."""
    out.mkdir(parents=True, exist_ok=True)
    for pattern in OUTPUTS:  # a previous report's files: none may outlive it
        for stale in out.glob(pattern):
            stale.unlink()
    stats = tables.run_stats(frames)
    table, unmatched = reference.attach_published(tables.group_table(stats, frames.problems),
                                                  ref)
    scales = ", ".join(sorted(table["scale"].unique())) if not table.empty else "-"
    caption = _caption(table, frames.runs, sweep)
    types = reference.attach_layer_types(tables.layer_type_table(stats), ref)
    blocks = [Block("h1", f"{sweep} ({scales})"), Block("h2", "Summary"),
              Block("list", items=summary(table, types, frames, unmatched))]
    for note in notes:
        blocks.append(Block("p", note))
    if not table.empty:
        shown = tables.display(table)
        tables.write(table, shown, out, "table", caption)
        blocks += [Block("h2", "Table"), Block("p", caption + " Files: `table.csv` (every "
                                                "number), `table.md`, `table.tex`."),
                   Block("table", table=shown), Block("p", tables.machine_legend(table)),
                   Block("p", ACCOUNTING)]
    if not unmatched.empty:
        blocks += [Block("h2", "Published numbers without runs here"),
                   Block("table", table=unmatched[["table", "dataset", "model", "compressor",
                                                   "setting", "metric", "value", "source"]])]
    claims = reference.headlines(table, ref) if not table.empty else pd.DataFrame()
    claims = claims[claims["ours"].notna()] if not claims.empty else claims
    if not claims.empty:
        blocks += [Block("h2", "The papers' headline claims (largest in this sweep)"),
                   Block("table", table=_display_claims(claims))]
    if not types.empty:
        shown_types = tables.display_layer_types(types)
        tables.write(types, shown_types, out, "layer_types",
                     "Effective compression per compressed layer type: fp32 bits of the type's "
                     "layers over the bits sent for them.")
        blocks += [Block("h2", "Effective compression per layer type"),
                   Block("p", "fp32 bits of the layers of one type (conv kernels; FC, embedding "
                              "and LSTM matrices) over the bits sent for them "
                              "(`comm/bits_dense_<type>` / `comm/bits_<type>`)."),
                   Block("table", table=shown_types)]
    blocks += _whatif_blocks(frames, out, etas, intervals)
    written = figures.make_figures(frames, out / "figures", official)
    if written:
        blocks.append(Block("h2", "Figures"))
        blocks += [Block("figure", figure=f) for f in written]
    blocks += _skipped_blocks(frames, out)
    md, page = out / "report.md", out / "report.html"
    md.write_text(to_markdown(blocks, out))
    page.write_text(to_html(blocks, f"accordion-bench: {sweep}"))
    shown = "" if table.empty else f"{caption}\n{tables.terminal(tables.display(table))}"
    return Written(md, page, shown)


def _caption(table: pd.DataFrame, runs: pd.DataFrame, sweep: str) -> str:
    """``table1: scale tiny, benchmark cifar10 (data: the synthetic stand-in), compressor
    powersgd; mean ± std over seeds.``: what every row shares."""
    if table.empty:
        return f"{sweep}: no runs."
    parts = [f"scale {table['scale'].iloc[0]}"] if table["scale"].nunique() == 1 else []
    data = data_description(runs)
    parts += [data] if data else []
    if table["compressor.name"].nunique() == 1:
        parts.append(f"compressor {table['compressor.name'].iloc[0]}")
    return f"{sweep}: {', '.join(parts)}; mean ± std over seeds."


def data_description(runs: pd.DataFrame) -> str | None:
    """What data every run of ``runs`` trained on: ``benchmark cifar10`` (its own data),
    ``benchmark cifar10 (data: the synthetic stand-in)`` (a tiny run standing for it),
    ``dataset digits`` (a run standing for no benchmark); None where the runs differ."""
    datasets = set(runs["dataset.name"].dropna())
    benchmarks = {b if isinstance(b, str) else None
                  for b in runs.get("benchmark", pd.Series([None]))}
    if len(datasets) != 1 or len(benchmarks) != 1:
        return None
    (dataset,), (benchmark,) = datasets, benchmarks
    if benchmark is None:
        return f"dataset {dataset}"
    if dataset == benchmark:
        return f"benchmark {benchmark}"
    return f"benchmark {benchmark} (data: the {dataset} stand-in)"


def _display_claims(claims: pd.DataFrame) -> pd.DataFrame:
    return pd.DataFrame({"claim": claims["claim"],
                         "published": [f"{v:g}x" for v in claims["published"]],
                         "ours (largest here)": [tables.times(v) for v in claims["ours"]],
                         "where": claims["where"], "source": claims["source"]})


def _whatif_blocks(frames: Frames, out: Path, etas: Sequence[float] | None,
                   intervals: Sequence[int] | None) -> list[Block]:
    runs = frames.runs
    if runs.empty or "scheduler.name" not in runs:
        return []
    accordion = runs[runs["scheduler.name"].isin(whatif.LEVEL_SCHEDULERS
                                                 + whatif.BATCH_SCHEDULERS)]
    if accordion.empty:
        return []
    if (accordion["source"] != "records").any():
        return [Block("h2", "What-if"), Block("p", "The what-if replay needs run records "
                                                   "(checkpoint and config); not run for W&B "
                                                   "runs.")]
    rows = pd.DataFrame(whatif.sweep([Path(p) for p in accordion["path"]], etas, intervals))
    table = tables.whatif_table(rows, accordion)
    shown = tables.display_whatif(table)
    tables.write(table, shown, out, "whatif", "Accordion's detector replayed on the logged "
                                              "gradient norms at other eta / interval.")
    return [Block("h2", "What-if: other eta and interval"),
            Block("p", "Each Accordion run's logged per-layer norms replayed with another "
                       "detector (`python -m analysis.whatif <run dir> --eta E --interval I` "
                       "for one run): critical fraction and estimated data, relative to what the "
                       "run logged (mean over seeds; `own` marks the run's own detector, whose "
                       "replay reproduces the run). Data estimates exist for PowerSGD and "
                       "Top-K, whose bits follow from shape and level."),
            Block("table", table=shown)]


def _skipped_blocks(frames: Frames, out: Path) -> list[Block]:
    problems = frames.problems
    problems.to_csv(out / "skipped.csv", index=False)
    if problems.empty:
        return []
    shown = problems[["run_id", "reason", "method", "seed"]].fillna("?")
    return [Block("h2", f"Runs left out ({len(problems)})"),
            Block("p", "Incomplete or corrupt runs are not in the tables (`--include-incomplete` "
                       "keeps those that can be read); `skipped.csv` lists them."),
            Block("table", table=shown)]


# ---- the generated summary ------------------------------------------------------------------
def summary(table: pd.DataFrame, types: pd.DataFrame, frames: Frames, unmatched: pd.DataFrame
            ) -> list[str]:
    """Short sentences: what ran, and where we match and differ from the published numbers."""
    if table.empty:
        return ["No usable runs."]
    most = int(table["seeds"].max())
    lines = [f"{int(table['seeds'].sum())} runs in {len(table)} groups "
             f"({most} seed{'s' if most != 1 else ''} at most); {len(frames.problems)} left out"
             + (f" ({_reasons(frames.problems)})." if len(frames.problems) else ".")]
    warned = table[table["provenance_warning"] != ""]
    lines += [f"Warning: {r['model.name']} {r['method']} ({r['variant']}) "
              f"{r['provenance_warning']}: its runs are not one machine's and one commit's."
              for _, r in warned.iterrows()]
    lines += _paper_matches(table)
    if (table["scale"] != reference.PAPER_SCALE).any() and table["published"].notna().any():
        lines.append("Not at paper scale: other data, narrower models and fewer epochs than the "
                     "published runs, so absolute numbers differ by design; compare the pattern "
                     "between methods below.")
    lines += patterns(table)
    for _, row in types[types["published"].notna()].iterrows():
        lines.append(f"{row['model.name']} {row['method']} ({row['variant']}): effective "
                     f"compression of the {row['layer_type']} layers (bin {row['bin_size']}) "
                     f"{row['effective_x_mean']:.1f}x, published {row['published']:g}x.")
    if not unmatched.empty:
        lines.append(f"{len(unmatched)} published rows of this table have no run group here.")
    return lines


def _reasons(problems: pd.DataFrame) -> str:
    counts = problems["reason"].str.split(":").str[0].value_counts()
    return ", ".join(f"{n} {reason}" for reason, n in counts.items())


def _paper_matches(table: pd.DataFrame) -> list[str]:
    rows = table[(table["scale"] == reference.PAPER_SCALE) & table["published"].notna()
                 & table["published_metric"].isin(list(reference.GROUP_METRICS))]
    if rows.empty:
        return []
    within = [abs(r["diff"]) <= _tolerance(r) for _, r in rows.iterrows()]
    worst = rows.loc[rows["diff"].abs().idxmax()]
    return [f"Paper scale: {sum(within)} of {len(rows)} rows within max(2 std, "
            f"{ACCURACY_TOLERANCE} points or {PERPLEXITY_TOLERANCE:.0%} of the perplexity) of the "
            f"published number; largest difference {worst['model.name']} {worst['method']} "
            f"({worst['variant']}): {worst['diff']:+.2f}."]


def _tolerance(row: pd.Series) -> float:
    std = 0.0 if math.isnan(row["final_std"]) else row["final_std"]
    floor = (PERPLEXITY_TOLERANCE * row["published"] if row["metric"] == "test/perplexity"
             else ACCURACY_TOLERANCE)
    return max(2 * std, floor)


def patterns(table: pd.DataFrame) -> list[str]:
    """Per model and variant: Accordion against the low- and high-compression methods, ours and
    published, and whether Accordion stays within the seed spread of the baseline."""
    lines = []
    keys = ["sweep", "scale", "dataset.name", "model.name", "variant"]
    for key, group in table.groupby(keys, sort=False):
        base = group[group["method"] == group["baseline"]]
        if base.empty:
            continue
        low = base.iloc[0]
        others = group[group["method"] != low["method"]]
        lower = low["metric"] == "test/perplexity"
        for _, row in others[others["method"].str.startswith("accordion")].iterrows():
            highs = others[~others["method"].str.startswith("accordion")]
            lines.append(_pattern(key, low, row, highs, lower))
        if not others["method"].str.startswith("accordion").any():
            for _, row in others.iterrows():
                lines.append(f"{key[3]} ({key[4]}): {_fmt(row)} vs {_fmt(low)}, "
                             f"{tables.times(row['reduction_x'])} less data.")
    return lines


def _fmt(row: pd.Series) -> str:
    return f"{row['method']} {tables.mean_std(row['final_mean'], row['final_std'])}"


def _pattern(key: tuple, low: pd.Series, acc: pd.Series, highs: pd.DataFrame,
             lower: bool) -> str:
    worse = (acc["final_mean"] - low["final_mean"]) * (1 if lower else -1)
    spread = max([s for s in (low["final_std"], acc["final_std"]) if not math.isnan(s)],
                 default=0.0)
    ours_ok = worse <= 2 * spread if spread > 0 else None
    text = (f"{key[3]} ({key[4]}, {key[1]}): {_fmt(acc)} vs {_fmt(low)}"
            + "".join(f", {_fmt(h)}" for _, h in highs.iterrows())
            + f"; Accordion sends {1 / acc['reduction_x']:.2f}x the data of {low['method']}"
            + "".join(f" ({h['method']}: {1 / h['reduction_x']:.2f}x)"
                      for _, h in highs.iterrows()) + ". ")
    text += {True: "Accordion is within twice the seed spread of (or better than) the baseline",
             False: "Accordion is worse than the baseline by more than twice the seed spread",
             None: "One seed: no seed spread to judge Accordion against the baseline by"}[ours_ok]
    if not (math.isnan(acc["published"]) or math.isnan(low["published"])):
        pub_worse = (acc["published"] - low["published"]) * (1 if lower else -1)
        pub_ok = pub_worse <= (PERPLEXITY_TOLERANCE * low["published"] if lower
                               else ACCURACY_TOLERANCE)
        text += f"; published {acc['published']:g} vs {low['published']:g}"
        if ours_ok is not None:
            text += ": the same as the paper" if ours_ok == pub_ok else ": unlike the paper"
    return text + "."


# ---- rendering ------------------------------------------------------------------------------
def to_markdown(blocks: list[Block], out: Path) -> str:
    """The report as markdown; figures link their PNG and PDF beside it."""
    parts = []
    for b in blocks:
        if b.kind == "h1":
            parts.append(f"# {b.text}\n")
        elif b.kind == "h2":
            parts.append(f"## {b.text}\n")
        elif b.kind == "p":
            parts.append(b.text + "\n")
        elif b.kind == "list":
            parts.append("\n".join(f"- {item}" for item in b.items) + "\n")
        elif b.kind == "table":
            parts.append(tables.markdown(b.table))
        elif b.kind == "figure":
            png, pdf = (p.relative_to(out) for p in b.figure.paths)
            parts.append(f"![{b.figure.name}]({png})\n\n{b.figure.caption} ([PDF]({pdf}))\n")
    return "\n".join(parts)


CSS = ("body{font-family:system-ui,sans-serif;max-width:1100px;margin:2em auto;padding:0 1em;"
       "color:#222}table{border-collapse:collapse;font-size:0.85em;margin:1em 0}"
       "th,td{border-bottom:1px solid #ccc;padding:0.25em 0.6em;text-align:left}"
       "th{border-bottom:2px solid #444}img{max-width:100%}figcaption{font-size:0.9em}"
       "code{font-family:ui-monospace,monospace;font-size:0.9em;background:#f3f3f3;"
       "padding:0 0.2em}")
CODE_SPAN = re.compile(r"`([^`]+)`")


def inline(text: str) -> str:
    """``text`` as HTML: escaped, its markdown code spans (`x`) as ``<code>x</code>``."""
    return CODE_SPAN.sub(r"<code>\1</code>", html.escape(text))


def to_html(blocks: list[Block], title: str) -> str:
    """The report as one self-contained HTML page (figures embedded as data URIs)."""
    body = []
    for b in blocks:
        if b.kind in ("h1", "h2"):
            body.append(f"<{b.kind}>{inline(b.text)}</{b.kind}>")
        elif b.kind == "p":
            body.append(f"<p>{inline(b.text)}</p>")
        elif b.kind == "list":
            body.append("<ul>" + "".join(f"<li>{inline(i)}</li>" for i in b.items) + "</ul>")
        elif b.kind == "table":
            body.append(b.table.to_html(index=False, escape=True, border=0))
        elif b.kind == "figure":
            png = base64.b64encode(b.figure.paths[0].read_bytes()).decode()
            body.append(f'<figure><img alt="{b.figure.name}" src="data:image/png;base64,{png}">'
                        f"<figcaption>{inline(b.figure.caption)}</figcaption></figure>")
    return (f"<!DOCTYPE html>\n<html><head><meta charset=\"utf-8\"><title>{html.escape(title)}"
            f"</title><style>{CSS}</style></head><body>\n" + "\n".join(body)
            + "\n</body></html>\n")


# ---- command line ---------------------------------------------------------------------------
def select(frames: Frames, sweeps: Sequence[str] | None, scales: Sequence[str] | None
           ) -> Frames:
    """The runs (and left-out runs) of the given sweeps and scales (None: all)."""
    def keep(frame: pd.DataFrame) -> pd.Series:
        mask = pd.Series(True, index=frame.index)
        if sweeps:
            mask &= frame["sweep"].isin(sweeps)
        if scales:
            mask &= frame["scale"].isin(scales)
        return mask

    runs = frames.runs[keep(frames.runs)]
    return Frames(runs, frames.epochs[frames.epochs["run_id"].isin(runs["run_id"])],
                  frames.problems[keep(frames.problems)])


def with_baselines(frames: Frames, sweep: str) -> Frames:
    """The runs of ``sweep``, plus those of other sweeps that its groups name as ``baseline``
    (same scale, dataset and model) where the sweep did not run that method itself (fig10's
    batch-512 baseline may be table5's)."""
    part = select(frames, [sweep], None)
    keys = ["scale", "dataset.name", "model.name"]
    own = set(part.runs[[*keys, "method"]].itertuples(index=False, name=None))
    wanted = set(part.runs[[*keys, "baseline"]].dropna().itertuples(index=False, name=None))
    others = frames.runs[frames.runs["sweep"] != sweep]
    extra = [run_id for run_id, key in zip(
        others["run_id"], others[[*keys, "method"]].itertuples(index=False, name=None),
        strict=True) if key in wanted - own]
    runs = pd.concat([part.runs, frames.runs[frames.runs["run_id"].isin(extra)]])
    return Frames(runs, frames.epochs[frames.epochs["run_id"].isin(runs["run_id"])],
                  part.problems)


def main(argv: Sequence[str] | None = None) -> int:
    """Command line (see the module doc); exit status 2 on bad input."""
    parser = argparse.ArgumentParser(prog="python -m analysis.report",
                                     description="Tables, figures and a report per sweep.")
    parser.add_argument("runs_dir", nargs="?", type=Path,
                        help="directory holding run records at any depth")
    parser.add_argument("--out", type=Path, help="output dir (default results/<sweep>/)")
    parser.add_argument("--wandb", metavar="ENTITY/PROJECT",
                        help="read the runs from this W&B project instead (needs network)")
    parser.add_argument("--group", help="with --wandb: only this W&B group")
    parser.add_argument("--sweep", nargs="+", help="only these sweeps (default: all found)")
    parser.add_argument("--scale", nargs="+", help="only these scales (default: all)")
    parser.add_argument("--reference", type=Path,
                        help="published numbers (CSV, the columns of analysis/reference/"
                             "reference_results.csv; default: that file)")
    parser.add_argument("--include-incomplete", action="store_true",
                        help="keep incomplete and failed runs in the tables")
    parser.add_argument("--eta", type=float, nargs="+", help="what-if etas (default 0.3 0.5 "
                                                             "0.7 and the run's)")
    parser.add_argument("--interval", type=int, nargs="+",
                        help="what-if intervals (default the run's, half and double)")
    parser.add_argument("--verify-wandb", action="store_true",
                        help="check that the runs' offline W&B files hold the same numbers")
    args = parser.parse_args(argv)
    try:
        return _run(args)
    except (ValueError, FileNotFoundError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2


def _run(args: argparse.Namespace) -> int:
    if args.wandb is None and args.runs_dir is None:
        raise ValueError("runs_dir: give a directory of run records, or --wandb ENTITY/PROJECT")
    ref = reference.load_reference(args.reference)
    official = reference.load_curves()
    if args.wandb:
        frames = load_wandb(args.wandb, args.group, args.include_incomplete)
        source = f"W&B project {args.wandb}" + (f", group {args.group}" if args.group else "")
    else:
        frames = load_records(args.runs_dir, args.include_incomplete)
        source = f"run records below {args.runs_dir}"
    frames = select(frames, args.sweep, args.scale)
    sweeps = sorted(set(frames.runs["sweep"]) | set(frames.problems["sweep"].dropna()))
    if not sweeps:
        raise ValueError(f"runs_dir: no run records of sweep(s) {args.sweep or 'any'} "
                         f"(scale {args.scale or 'any'}) in {args.runs_dir or args.wandb}")
    for sweep in sweeps:
        out = (args.out / sweep if len(sweeps) > 1 else args.out) if args.out \
            else Path("results") / sweep
        part = with_baselines(frames, sweep)
        notes = [f"Source: {source}."]
        if args.verify_wandb and args.runs_dir is not None:
            notes.append(_verify(args.runs_dir, part))
        written = sweep_report(part, sweep, out, ref, official, args.eta, args.interval, notes)
        print(f"{sweep}: {len(part.runs)} runs, {len(part.problems)} left out -> "
              f"{written.md} , {written.html}")
        if written.table:
            print(f"{written.table}\n(every column: {out / 'table.md'})")
    return 0


def _verify(runs_dir: Path, frames: Frames) -> str:
    """One sentence: do the offline W&B files of ``frames``' runs hold the same numbers?"""
    files = load_wandb_files(runs_dir)
    ids = set(frames.runs["run_id"])
    checked = ids & set(files.runs["run_id"])
    diffs = compare(frames.only(checked), files.only(checked))
    if not checked:
        return f"W&B check: none of the {len(ids)} runs has an offline W&B file to check."
    verdict = "agree on every value" if diffs.empty else \
        f"differ in {len(diffs)} values (first: {diffs.iloc[0].to_dict()})"
    missing = files.problems[files.problems["run_id"].isin(ids)]
    return (f"W&B check: the offline W&B files of {len(checked)} runs {verdict} with the run "
            f"records" + (f"; not checked: {len(missing)} ({_reasons(missing)})."
                          if len(missing) else "."))


if __name__ == "__main__":
    sys.exit(main())
