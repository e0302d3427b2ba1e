"""The demo's numbers on every machine the suite has run on: results/machines.{csv,md}.

    python -m analysis.machines [RUNS]      # make machines (make demo ends with it)

The demo is the tiny Table 1 for ResNet-18 at seed 0 (``make demo``). Each (machine fingerprint,
commit, numerics) of its runs below ``RUNS`` becomes one row: the machine's label, the numerics
mode and each method's final test accuracy. Rows of other machines already in
``results/machines.csv`` are kept (a machine adds its row by running ``make demo``; the file is
committed), so the table grows to every machine the demo ran on. Under portable numerics the
goal is one set of numbers for all rows: the page says whether the rows of each commit agree.
"""

from __future__ import annotations

import argparse
from pathlib import Path

import pandas as pd

from analysis import provenance
from analysis.load import load_records
from analysis.tables import markdown

OUT = Path("results")
DEMO = {"sweep": "table1", "scale": "tiny", "model.name": "resnet18", "seed": 0}
KEY = ["fingerprint", "commit", "numerics"]
METHODS = {("rank2", "ours"): "rank 2", ("rank1", "ours"): "rank 1",
           ("accordion_rank2_rank1", "ours"): "Accordion (ours)",
           ("accordion_rank2_rank1", "authors"): "Accordion (authors)"}


def demo_rows(runs_root: str | Path) -> pd.DataFrame:
    """One row per (fingerprint, commit, numerics) of the demo's complete runs."""
    runs = load_records(runs_root).runs
    for key, value in DEMO.items():
        runs = runs[runs[key] == value] if key in runs else runs.iloc[0:0]
    rows = []
    for (fingerprint, commit, numerics), group in runs.groupby(
            [provenance.FINGERPRINT, provenance.COMMIT, provenance.NUMERICS], dropna=False):
        row = {"fingerprint": fingerprint, "commit": str(commit)[:provenance.SHORT],
               "numerics": numerics, "machine": _machine(group)}
        for (method, variant), label in METHODS.items():
            cell = group[(group["method"] == method) & (group["variant"] == variant)]
            row[label] = float(cell["final"].iloc[-1]) if len(cell) else float("nan")
        rows.append(row)
    return pd.DataFrame(rows, columns=[*KEY, "machine", *METHODS.values()])


def merge(old: pd.DataFrame, new: pd.DataFrame) -> pd.DataFrame:
    """``old``'s rows with ``new``'s replacing those of the same key."""
    if old.empty:
        return new
    if new.empty:
        return old
    kept = old[~old.set_index(KEY).index.isin(new.set_index(KEY).index)]
    return pd.concat([kept, new], ignore_index=True)


def page(table: pd.DataFrame) -> str:
    """results/machines.md: the table, and whether each commit's portable rows agree."""
    lines = ["# The demo on every machine", "",
             "Final test accuracy (%) of the demo's runs (tiny Table 1, ResNet-18, seed 0) per "
             "machine fingerprint, commit and numerics mode (`python -m analysis.machines`, "
             "run by `make demo`; rows of other machines are kept).", ""]
    shown = table.copy()
    for label in METHODS.values():
        shown[label] = shown[label].map(lambda v: "" if pd.isna(v) else f"{v:.2f}")
    lines += [markdown(shown), ""]
    portable = table[table["numerics"] == "portable"]
    for commit, group in portable.groupby("commit"):
        same = len(group) < 2 or _agree(group)
        lines.append(f"- commit `{commit}`, portable numerics, {len(group)} machine(s): "
                     + ("the same numbers on every machine." if same else
                        "**the machines disagree.**"))
    lines += _across(portable)
    return "\n".join(lines) + "\n"


def _across(portable: pd.DataFrame) -> list[str]:
    """Whether every portable row agrees, whatever its commit (a commit may change the
    numbers on purpose: then compare within a commit, above); said where rows come from more
    than one machine and more than one commit."""
    if portable["fingerprint"].nunique() < 2 or portable["commit"].nunique() < 2:
        return []
    same = _agree(portable)
    labels = ", ".join(sorted(portable["machine"].astype(str).unique()))
    return [f"- every portable row ({portable['fingerprint'].nunique()} machines: {labels}; "
            f"{portable['commit'].nunique()} commits): "
            + ("the same numbers." if same else "the numbers differ between commits "
               "(compare the rows of one commit).")]


def _agree(rows: pd.DataFrame) -> bool:
    """Whether ``rows`` hold one value per method (a missing one counts as a value)."""
    return bool((rows[list(METHODS.values())].nunique(dropna=False) <= 1).all())


def _machine(group: pd.DataFrame) -> str:
    labels = group[provenance.MACHINE].dropna().unique()
    return str(labels[0]).rsplit(",", 1)[0] if len(labels) else provenance.UNKNOWN


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="The demo's numbers per machine.")
    parser.add_argument("runs", nargs="?", default="results/runs")
    parser.add_argument("--out", type=Path, default=OUT)
    args = parser.parse_args(argv)
    csv = args.out / "machines.csv"
    old = pd.read_csv(csv, dtype={"commit": str}) if csv.is_file() else pd.DataFrame()
    table = merge(old, demo_rows(args.runs))
    args.out.mkdir(parents=True, exist_ok=True)
    table.to_csv(csv, index=False)
    (args.out / "machines.md").write_text(page(table))
    print(page(table))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
