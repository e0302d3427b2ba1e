"""The papers' figure-level claims: each a sweep, a figure and a table from its run records.

    python -m analysis.claims NAME [RUNS] [--scale tiny] [--out results/claims/NAME]

``NAME`` is one of :data:`NAMES`; its sweep is ``conf/sweep/claim_<NAME>.yaml`` (``make
claim-<NAME>`` runs it, then this). Each claim is a module ``analysis.claims_<NAME>`` that
defines the same names:

- ``SWEEP`` (the sweep's name), ``FIGURE`` (the figure's file name), ``KEEP`` (the run statuses
  it reads: ``completed``, and ``diverged`` where a diverging method is part of the claim,
  as AdaComp's hard Local Selection is);
- ``data(frames) -> DataFrame`` (what is drawn and tabled), ``plot(frames) -> Figure`` and
  ``table(frames) -> str`` (markdown).

:func:`write` puts ``<out>/<FIGURE>``, ``<out>/table.md`` (the table, the runs left out, the
machines and commits of the runs used, :func:`made_by`) and ``<out>/table.csv`` (the data)
there. Whether each claim holds is the scorecard's business (``analysis/claims.yaml``,
:mod:`analysis.scorecard`).
"""

from __future__ import annotations

import argparse
import importlib
import sys
from collections.abc import Sequence
from pathlib import Path
from types import ModuleType

import pandas as pd

from analysis import provenance, style
from analysis.load import Frames, load_records, usable

NAMES = ("residues", "fig2b", "overlap", "batch", "learners", "minibatch")


def module(name: str) -> ModuleType:
    """The analysis module of claim ``name``."""
    if name not in NAMES:
        raise ValueError(f"claim: {name!r} is not one of {', '.join(NAMES)}")
    return importlib.import_module(f"analysis.claims_{name}")


def load_sweep(root: str | Path, sweep: str | tuple[str, ...], scale: str | None = "tiny",
               keep: Sequence[str] = ("completed",)) -> Frames:
    """The runs of ``sweep`` (or of any of several) at ``scale`` (None: any) below ``root``
    whose only problem, if any, is a status in ``keep``, with their epochs; ``problems``: the
    sweep's other runs."""
    frames = load_records(root, include_incomplete=True)
    sweeps = (sweep,) if isinstance(sweep, str) else sweep

    def of_sweep(frame: pd.DataFrame) -> pd.Series:
        mine = frame["sweep"].isin(sweeps)
        return mine & (frame["scale"] == scale) if scale is not None else mine

    runs = frames.runs[of_sweep(frames.runs)]
    runs = runs[usable(runs, keep)]
    problems = frames.problems[of_sweep(frames.problems)]
    return Frames(runs, frames.epochs[frames.epochs["run_id"].isin(runs["run_id"])],
                  problems[~problems["run_id"].isin(runs["run_id"])])


def write(name: str, frames: Frames, out: Path) -> list[Path]:
    """Claim ``name``'s figure, ``table.md`` and ``table.csv`` from ``frames`` into ``out``."""
    claim = module(name)
    out.mkdir(parents=True, exist_ok=True)
    paths = [out / claim.FIGURE, out / "table.md", out / "table.csv"]
    style.save(claim.plot(frames), paths[:1])
    left_out = len(frames.problems)
    note = f"\n{left_out} run(s) left out: see their run records.\n" if left_out else ""
    paths[1].write_text(claim.table(frames) + note + "\n" + made_by(frames.runs) + "\n")
    claim.data(frames).to_csv(paths[2], index=False)
    return paths


def made_by(runs: pd.DataFrame) -> str:
    """One sentence: the machines and commits of ``runs``, and the warning if they mix."""
    cell = provenance.cell(runs)
    text = (f"{len(runs)} runs, on {cell['machines'] or cell['fingerprints']}; "
            f"commit {cell['commits']}.")
    return text + (f" Warning: the set of runs {cell['provenance_warning']}."
                   if cell["provenance_warning"] else "")


def main(argv: Sequence[str] | None = None) -> int:
    """The command line (see the module doc); exit status 2 on bad input."""
    parser = argparse.ArgumentParser(prog="python -m analysis.claims",
                                     description="A figure-level claim's figure and table.")
    parser.add_argument("name", choices=NAMES, help="the claim (conf/sweep/claim_<name>.yaml)")
    parser.add_argument("runs", nargs="?", type=Path, default=Path("results/runs"),
                        help="directory holding run records at any depth (default results/runs)")
    parser.add_argument("--scale", default="tiny", help="the sweep's scale (default tiny)")
    parser.add_argument("--out", type=Path, help="output folder (default results/claims/<name>)")
    args = parser.parse_args(argv)
    try:
        claim = module(args.name)
        frames = load_sweep(args.runs, claim.SWEEP, args.scale, claim.KEEP)
        if frames.runs.empty:
            raise ValueError(f"runs: no usable runs of sweep {claim.SWEEP} (scale {args.scale}) "
                             f"below {args.runs}; run `make claim-{args.name}` first")
        paths = write(args.name, frames, args.out or Path("results/claims") / args.name)
    except (FileNotFoundError, ValueError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    print(f"{args.name}: {len(frames.runs)} runs -> {', '.join(map(str, paths))}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
