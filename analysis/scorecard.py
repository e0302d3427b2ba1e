"""The scorecard: every claim of the papers that the runs below a directory can judge, with a
verdict each (``analysis/claims.yaml``, :mod:`analysis.verdicts`).

    python -m analysis.scorecard results/runs [--sweep table1] [--scale tiny] [--out results]

Writes ``<out>/scorecard.csv`` (every number, the values per seed and the run directories),
``scorecard.md`` and ``scorecard.html`` (one row per claim and scale: the published effect,
ours with its 95% interval and how it was computed, the seeds, the verdict, the machines and
commits of the runs and a warning where they mix), and prints the markdown table. Claims whose
cells have no run below the directory are left out (the count is said). Exit status 2 on bad
input (no runs, a malformed claims file).

    python -m analysis.scorecard results/runs/table4/tiny/cifar100/resnet18 --sweep table4 \
        --keep results/example/table4_scorecard/scorecard.csv --out results/example/table4_scorecard

judges the claims these runs can judge and keeps the rows of an earlier ``scorecard.csv`` for
the others (run records are not committed, so the runs of those rows may live on another
machine): one model's rows of a table judged again, with more seeds, without rerunning the rest.
A kept row keeps its machines, commits and run directories; one whose claim is no longer in the
claims file, or is stated otherwise now, is refused (judge it again).

    python -m analysis.scorecard results/example --overview [--scale tiny] [--out results/example]

counts instead the verdicts of every ``scorecard.csv`` below the folder against the claims file,
sweep by sweep (claims judged and not yet judged at the scale, seeds, machines), into
``<out>/scorecard_overview.md``: which of the papers' comparisons have a verdict so far.
"""

from __future__ import annotations

import argparse
import math
import sys
from collections.abc import Sequence
from pathlib import Path

import pandas as pd

from analysis import tables, verdicts
from analysis.load import load_records
from analysis.report import Block, to_html

FILES = ("scorecard.csv", "scorecard.md", "scorecard.html")
ABOUT = (
    "Each row is one comparison a paper makes (analysis/claims.yaml: the cells, the bound or "
    "margin and its source). Ours is the effect over seeds (a - b, or a / b for ratios) with "
    "a 95% Student-t interval: paired on per-seed differences over the seeds both cells ran (a "
    "seed only one ran is left out), Welch's when fewer than two are common, one-sample for a "
    "claim about one cell; ratios on the log scale. "
    "Reproduced: the whole interval lies on the claimed side of the bound; not reproduced: "
    "wholly on the other side; inconclusive: it straddles the bound, or one seed (no interval). "
    "Published: the paper's effect where it states one (at paper scale; at tiny scale compare "
    "the direction, not the size). Seeds for a verdict: how many seeds a paired or one-sample "
    "interval would need to clear the bound if the effect and the spread between seeds stayed "
    "as measured (an estimate for planning, not a promise; '—': Welch's or no interval).")


def number(value: float, signed: bool = False) -> str:
    """``+0.23`` (``signed``: a difference, two decimals), ``0.833`` / ``40.00`` (three
    significant digits below 1, two decimals up to 10,000), ``1.6e+07``; '—' for NaN."""
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return "—"
    if signed:
        return f"{value:+.2f}" if abs(value) >= 0.005 or value == 0 else f"{value:+.2g}"
    return f"{value:.2f}" if 1 <= abs(value) < 1e4 or value == 0 else f"{value:#.3g}"


def display(rows: pd.DataFrame) -> pd.DataFrame:
    """The strings of the scorecard's table (markdown and HTML)."""
    unsigned = (rows["effect"] == "ratio") | (rows["b"] == "")  # a ratio, or one cell's value
    out = pd.DataFrame({
        "id": rows["id"], "claim": rows["claim"], "scale": rows["scale"],
        "holds if": rows["statement"],
        "published": [number(v, signed=not u) for v, u in zip(rows["published"], unsigned,
                                                              strict=True)],
        "ours": [number(v, signed=not u) for v, u in zip(rows["ours"], unsigned, strict=True)],
        "95% interval": [f"[{number(lo, not u)}, {number(hi, not u)}]" if not math.isnan(lo)
                         else "—" for lo, hi, u in zip(rows["low"], rows["high"], unsigned,
                                                        strict=True)],
        "interval": rows["interval"], "seeds": rows["seeds"], "verdict": rows["verdict"],
        "seeds for a verdict": [_needed(v) for v in rows["seeds_needed"]],
        "machines": rows["fingerprints"], "commits": rows["commits"]})
    if (rows["warning"] != "").any():
        out["warning"] = rows["warning"]
    return out


def _needed(value: float) -> str:
    """``seeds_needed`` as shown: a count, ``> 100`` past the search, '—' where none applies."""
    if math.isnan(value):
        return "—"
    return f"> {verdicts.SEEDS_LIMIT}" if math.isinf(value) else str(int(value))


def summary(rows: pd.DataFrame, skipped: int, kept: int = 0, source: Path | None = None
            ) -> str:
    """``12 claims: 5 reproduced, 1 not reproduced, 6 inconclusive`` (and what is not shown;
    ``kept`` of the rows from the earlier scorecard ``source``)."""
    counts = rows["verdict"].value_counts()
    parts = [f"{int(counts.get(v, 0))} {v}" for v in (verdicts.REPRODUCED,
                                                     verdicts.NOT_REPRODUCED,
                                                     verdicts.INCONCLUSIVE)]
    text = f"{len(rows)} claims judged: {', '.join(parts)}."
    warned = int((rows["warning"] != "").sum())
    if warned:
        text += (f" {warned} of them {'mixes' if warned == 1 else 'mix'} machines or commits "
                 "(see `warning`).")
    if kept:
        text += (f" {kept} of them judged before, on runs not below this directory: kept from "
                 f"{source} (their machines, commits and runs as they were).")
    if skipped:
        text += f" {skipped} claims of these sweeps have no runs here (not shown)."
    return text


def write(rows: pd.DataFrame, out: Path, skipped: int = 0, kept: int = 0,
          source: Path | None = None) -> list[Path]:
    """``scorecard.{csv,md,html}`` of the judged ``rows`` into ``out`` (``kept`` of them from the
    earlier scorecard ``source``); the paths."""
    out.mkdir(parents=True, exist_ok=True)
    paths = [out / name for name in FILES]
    rows.to_csv(paths[0], index=False)
    shown = display(rows)
    legend = tables.machine_legend(rows)
    said = summary(rows, skipped, kept, source)
    paths[1].write_text(f"# Scorecard\n\n{said}\n\n{tables.markdown(shown)}\n{legend}\n\n{ABOUT}\n")
    blocks = [Block("h1", "Scorecard"), Block("p", said),
              Block("table", table=shown), Block("p", legend), Block("p", ABOUT)]
    paths[2].write_text(to_html(blocks, "accordion-bench: scorecard"))
    return paths


def scorecard(runs_dir: Path, claims_file: Path | None, sweeps: Sequence[str] | None,
              scales: Sequence[str] | None) -> tuple[pd.DataFrame, set[str]]:
    """The judged rows of the claims of ``sweeps`` (None: every sweep with runs) on the runs
    below ``runs_dir``, and the ids of those claims that had no runs."""
    claims = verdicts.load_claims(claims_file)
    frames = load_records(runs_dir, include_incomplete=True)
    found = set(frames.runs["sweep"]) if not frames.runs.empty else set()
    wanted = [c for c in claims if c.sweep in (set(sweeps) if sweeps else found)]
    if not wanted:
        raise ValueError(f"runs_dir: no run records of a sweep with claims (sweep(s) "
                         f"{', '.join(sweeps) if sweeps else 'any'}) below {runs_dir}")
    rows = verdicts.evaluate(frames, wanted, list(scales) if scales else None)
    return rows, {c.id for c in wanted} - set(rows["id"])


def read_card(path: Path) -> pd.DataFrame:
    """A scorecard.csv as text (a commit such as 75011e670879 would read as a float; empty
    cells stay '')."""
    return pd.read_csv(path, dtype=str, keep_default_na=False)


# The scorecard.csv columns that hold numbers (the rest is text: ids, seeds, commit hashes).
NUMERIC = ("published", "ours", "low", "high", "seeds_needed", "mean_a", "mean_b")
# Columns that came after the first scorecards were written: an earlier file may lack them.
LATER_COLUMNS = {"seeds_needed"}


def keep(rows: pd.DataFrame, earlier: Path, claims_file: Path | None, skipped: set[str]
         ) -> tuple[pd.DataFrame, set[str], int]:
    """``rows`` with the rows of the scorecard.csv ``earlier`` whose claim (at its scale)
    ``rows`` does not judge (no row, or one without values of a cell: say the baseline's runs
    are elsewhere), in the claims file's order; the ids of ``skipped`` (claims without runs)
    still without a row; how many rows were kept. A ValueError naming the claim where a kept
    row's claim is not in the claims file or is stated otherwise now."""
    old = read_card(earlier)
    for column in LATER_COLUMNS.difference(old.columns):
        old[column] = ""  # a scorecard from before the column: none computed ('—')
    missing = set(verdicts.COLUMNS) - set(old.columns)
    if missing:
        raise ValueError(f"keep: {earlier} is not a scorecard.csv of this version (no "
                         f"{', '.join(sorted(missing))}); judge its claims again")
    old = old[verdicts.COLUMNS]
    for column in NUMERIC:
        old[column] = [float(v) if v else math.nan for v in old[column]]
    earlier_keys = set(zip(old["id"], old["scale"], strict=True))
    rows = rows[[not (kind.startswith(verdicts.NO_VALUES) and (i, s) in earlier_keys)
                 for i, s, kind in zip(rows["id"], rows["scale"], rows["interval"], strict=True)]]
    judged = set(zip(rows["id"], rows["scale"], strict=True))
    old = old[[(i, s) not in judged for i, s in zip(old["id"], old["scale"], strict=True)]]
    claims = {c.id: c for c in verdicts.load_claims(claims_file)}
    for _, row in old.iterrows():
        claim = claims.get(row["id"])
        if claim is None or claim.statement() != row["statement"]:
            now = "is not in the claims file" if claim is None else \
                f"is now stated '{claim.statement()}'"
            raise ValueError(f"keep: claim {row['id']} of {earlier} ({row['statement']}) {now}; "
                             "judge it again")
    order = {cid: i for i, cid in enumerate(claims)}
    both = pd.concat([rows, old], ignore_index=True) if not old.empty else rows
    both = both.sort_values(["id", "scale"], key=lambda c: c.map(order) if c.name == "id"
                            else c, kind="stable").reset_index(drop=True)
    return both, skipped - set(old["id"]), len(old)


def overview(folder: Path, claims_file: Path | None, scale: str) -> pd.DataFrame:
    """Per sweep with claims at ``scale``: how many, how many the ``scorecard.csv`` files below
    ``folder`` judged and their verdicts, their seeds, machines and files. A ValueError where
    there is no such file or two of them judge the same claim."""
    files = sorted(folder.rglob("scorecard.csv")) if folder.is_dir() else []
    if not files:
        raise ValueError(f"runs_dir: no scorecard.csv below {folder}")
    judged = pd.concat([read_card(f).assign(file=str(f)) for f in files], ignore_index=True)
    judged = judged[judged["scale"] == scale]
    twice = judged[judged.duplicated("id", keep=False)]
    if not twice.empty:
        raise ValueError(f"runs_dir: claim {twice['id'].iloc[0]} is judged in "
                         f"{' and '.join(sorted(set(twice['file'])))}: keep one")
    rows = []
    for claim in verdicts.load_claims(claims_file):
        if claim.scales is None or scale in claim.scales:
            rows.append({"sweep": claim.sweep, "id": claim.id, "source": claim.source})
    claims = pd.DataFrame(rows).drop_duplicates("id").merge(
        judged.drop(columns=["sweep", "source"]), on="id", how="left")
    out = []
    for sweep, group in claims.groupby("sweep", sort=False):
        done = group[group["verdict"].notna()]
        counts = done["verdict"].value_counts()
        out.append({"sweep": sweep, "source": min(group["source"], key=len),
                    "claims": len(group), "judged": len(done),
                    **{v: int(counts.get(v, 0)) for v in (verdicts.REPRODUCED,
                                                          verdicts.NOT_REPRODUCED,
                                                          verdicts.INCONCLUSIVE)},
                    "seeds": ", ".join(sorted(set(done["n"]), key=lambda n: (len(n), n)))
                    or "—",  # n: "3", or "3 vs 2" for Welch's
                    "seeds to decide": _seeds_to_decide(done),
                    "machines": ", ".join(sorted(set(", ".join(done["fingerprints"])
                                                     .split(", ")) - {""})) or "—",
                    "scorecard": ", ".join(sorted(set(done["file"]))) or "no scorecard"})
    return pd.DataFrame(out)


def _seeds_to_decide(done: pd.DataFrame) -> str:
    """The most seeds any inconclusive claim of ``done`` would need for a verdict if its effect
    and spread stayed as measured (the scorecards' ``seeds_needed``); "?" where one has no such
    number (a Welch interval, or a scorecard written before the column), "—" with none."""
    open_ = done[done["verdict"] == verdicts.INCONCLUSIVE]
    if open_.empty:
        return "—"
    needed = pd.to_numeric(open_.get("seeds_needed", pd.Series(index=open_.index, dtype=str)),
                           errors="coerce")
    if needed.isna().any():
        return "?"
    return f"> {verdicts.SEEDS_LIMIT}" if math.isinf(needed.max()) else str(int(needed.max()))


def write_overview(table: pd.DataFrame, out: Path, command: str, scale: str) -> Path:
    """``<out>/scorecard_overview.md``: the ``table`` of :func:`overview` under its command."""
    out.mkdir(parents=True, exist_ok=True)
    path = out / "scorecard_overview.md"
    total = table[["claims", "judged", verdicts.REPRODUCED, verdicts.NOT_REPRODUCED,
                   verdicts.INCONCLUSIVE]].sum()
    path.write_text(
        f"Command: `{command}`. The papers' claims at {scale} scale (analysis/claims.yaml) per "
        f"sweep, and the verdicts of the scorecards below the folder: {total['judged']} of "
        f"{total['claims']} judged, {total[verdicts.REPRODUCED]} reproduced, "
        f"{total[verdicts.NOT_REPRODUCED]} not reproduced, {total[verdicts.INCONCLUSIVE]} "
        f"inconclusive. `seeds`: seeds per verdict; `seeds to decide`: the most seeds an "
        f"inconclusive claim of the sweep would need for a verdict, were its effect and seed "
        f"spread as measured (`?`: not computed for one of them, a Welch interval or an older "
        f"scorecard).\n\n{tables.markdown(table)}")
    return path


def main(argv: Sequence[str] | None = None) -> int:
    """The command line (see the module doc); exit status 2 on bad input."""
    parser = argparse.ArgumentParser(prog="python -m analysis.scorecard",
                                     description="Verdicts on the papers' claims.")
    parser.add_argument("runs_dir", nargs="?", type=Path, default=Path("results/runs"),
                        help="directory holding run records at any depth (default results/runs)")
    parser.add_argument("--sweep", nargs="+", help="only these sweeps' claims (default: all "
                                                   "sweeps with runs)")
    parser.add_argument("--scale", nargs="+", help="only these scales (default: all)")
    parser.add_argument("--claims", type=Path, help="the claims file (default "
                                                    "analysis/claims.yaml)")
    parser.add_argument("--out", type=Path, default=Path("results"),
                        help="output folder (default results/)")
    parser.add_argument("--keep", type=Path, metavar="CSV",
                        help="an earlier scorecard.csv: its rows of claims these runs do not "
                             "judge are kept (their runs may be on another machine)")
    parser.add_argument("--overview", action="store_true",
                        help="count the verdicts of the scorecard.csv files below runs_dir per "
                             "sweep (at the one --scale, default tiny) instead")
    args = parser.parse_args(argv)
    if args.overview:
        return _overview(args, argv)
    try:
        rows, skipped = scorecard(args.runs_dir, args.claims, args.sweep, args.scale)
        kept = 0
        if args.keep is not None:
            rows, skipped, kept = keep(rows, args.keep, args.claims, skipped)
    except (FileNotFoundError, ValueError) as exc:  # ConfigError is a ValueError
        print(f"error: {exc}", file=sys.stderr)
        return 2
    paths = write(rows, args.out, len(skipped), kept, args.keep)
    print(paths[1].read_text())
    print(" , ".join(map(str, paths)))
    return 0


def _overview(args: argparse.Namespace, argv: Sequence[str] | None) -> int:
    """``--overview``: the table of :func:`overview`, written and printed."""
    if args.scale and len(args.scale) != 1:
        print("error: scale: --overview counts one scale, got " + " ".join(args.scale),
              file=sys.stderr)
        return 2
    scale = args.scale[0] if args.scale else "tiny"
    try:
        table = overview(args.runs_dir, args.claims, scale)
    except (FileNotFoundError, ValueError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    command = "python -m analysis.scorecard " + " ".join(sys.argv[1:] if argv is None else argv)
    print(write_overview(table, args.out, command, scale).read_text())
    return 0


if __name__ == "__main__":
    sys.exit(main())
