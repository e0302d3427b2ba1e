"""How far the seeds of a tiny recipe spread, against the effect a paper's comparison measures.

    python -m analysis.spread RUNS --by optimizer.lr --compare rank4 rank1 --out results/x.md

A recipe is decisive when the spread of its final metric over seeds is well below the effect the
paper measures (issue 25). This reads every run record below ``RUNS`` (:mod:`analysis.load`) and
groups the complete runs by model, method and variant and by each ``--by`` config key (dot keys
of the resolved config: ``optimizer.lr``, ``trainer.numerics``, ``model.width``, ...), so that
runs that differ only in such a key are cells of their own rather than duplicates of each other
(of runs alike in all of these and the seed, the last in directory order counts).

- The spread table: per cell, the seeds, the final metric's mean, standard deviation (over
  seeds, ddof 1) and range, and the machines and commits that made it.
- With ``--compare A B``: per value of the ``--by`` keys, model and variant, the effect
  ``A - B`` of the final metric over the seeds both ran (paired, with the 95% Student-t interval
  of :func:`analysis.verdicts.interval`), the spread (the larger of the two cells' standard
  deviations) and the effect in units of that spread.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from pathlib import Path

import pandas as pd

from analysis import provenance, tables, verdicts
from analysis.load import COMPLETED, load_records

CELL = ("model.name", "method", "variant")


def complete_runs(runs_dir: str | Path, by: Sequence[str]) -> pd.DataFrame:
    """The complete runs below ``runs_dir``, one per cell (``by`` keys, model, method, variant)
    and seed; a ValueError if there are none, or naming a ``by`` key that no run's config has."""
    try:
        runs = load_records(runs_dir, include_incomplete=True).runs
    except FileNotFoundError as exc:
        raise ValueError(str(exc)) from exc
    duplicate = runs["problem"].fillna("").str.startswith("duplicate")
    runs = runs[(runs["status"] == COMPLETED) & (runs["problem"].isna() | duplicate)]
    if runs.empty:
        raise ValueError(f"runs dir: no complete run below {runs_dir}")
    missing = [key for key in by if key not in runs.columns]
    if missing:
        raise ValueError(f"--by: no run's config has {', '.join(missing)}")
    return runs.drop_duplicates([*by, *CELL, "seed"], keep="last")


def spread_table(runs: pd.DataFrame, by: Sequence[str]) -> pd.DataFrame:
    """One row per cell: seeds, mean, std and range of ``final``, machines, commits."""
    rows = []
    for key, cell in runs.groupby([*by, *CELL], sort=True, dropna=False):
        made = provenance.cell(cell)
        final = cell["final"].astype(float)
        rows.append({**dict(zip([*by, *CELL], key, strict=True)),
                     "seeds": " ".join(str(s) for s in sorted(cell["seed"])),
                     "n": len(cell), "mean": final.mean(), "std": final.std(ddof=1),
                     "min": final.min(), "max": final.max(),
                     "machines": made["fingerprints"], "commits": made["commits"]})
    return pd.DataFrame(rows)


def effect_table(runs: pd.DataFrame, by: Sequence[str], a: str, b: str) -> pd.DataFrame:
    """Per ``by`` value, model and variant: method ``a`` - ``b`` over their common seeds, its 95%
    interval, the spread (the larger seed std of the two) and the effect over the spread."""
    rows = []
    for key, group in runs.groupby([*by, "model.name", "variant"], sort=True, dropna=False):
        finals = {m: group[group["method"] == m].set_index("seed")["final"].astype(float)
                  for m in (a, b)}
        seeds = sorted(set(finals[a].index) & set(finals[b].index))
        if not seeds:
            continue
        result = verdicts.interval(finals[a][seeds], finals[b][seeds], "difference")
        spread = max(finals[a][seeds].std(ddof=1), finals[b][seeds].std(ddof=1))
        rows.append({**dict(zip([*by, "model.name", "variant"], key, strict=True)),
                     "seeds": len(seeds), "effect": result.estimate, "low": result.low,
                     "high": result.high, "spread": spread,
                     "effect / spread": abs(result.estimate) / spread if spread else float("nan")})
    return pd.DataFrame(rows)


def markdown(table: pd.DataFrame, keys: Sequence[str] = ()) -> str:
    """``table`` as a markdown table: measurements to two decimals, the ``keys`` columns (the
    settings that make cells) as given, so that 0.005 and 0.01 stay two cells."""
    if table.empty:
        return "(no cell has both methods)\n"
    shown = table.astype(object)
    for column in shown.columns:
        form = "{:g}" if column in keys else "{:.2f}"
        shown[column] = shown[column].map(
            lambda v, form=form: form.format(v) if isinstance(v, float) else str(v))
    return tables.markdown(shown)


def main(argv: Sequence[str] | None = None) -> int:
    """Command line: write the spread (and effect) tables as markdown to ``--out`` or stdout."""
    parser = argparse.ArgumentParser(prog="python -m analysis.spread", description=__doc__
                                     .splitlines()[0])
    parser.add_argument("runs_dir")
    parser.add_argument("--by", nargs="*", default=[], help="config keys that make cells")
    parser.add_argument("--compare", nargs=2, metavar=("A", "B"), help="methods: A - B")
    parser.add_argument("--out", help="markdown file (default: print)")
    args = parser.parse_args(argv)
    try:
        runs = complete_runs(args.runs_dir, args.by)
    except ValueError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    command = "python -m analysis.spread " + " ".join(sys.argv[1:] if argv is None else argv)
    text = f"Command: `{command}`. Final metric over seeds.\n\n" + markdown(
        spread_table(runs, args.by), args.by)
    if args.compare:
        a, b = args.compare
        text += f"\nEffect {a} - {b} (paired over common seeds, 95% t interval):\n\n"
        text += markdown(effect_table(runs, args.by, a, b), args.by)
    if args.out:
        Path(args.out).parent.mkdir(parents=True, exist_ok=True)
        Path(args.out).write_text(text, encoding="utf-8")
    else:
        print(text, end="")
    return 0


if __name__ == "__main__":
    sys.exit(main())
