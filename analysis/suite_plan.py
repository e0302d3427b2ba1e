"""Every sweep's plan in one table, with the suite's total: what ``make reproduce-all`` would run
and how long it would take here (``make plan-all``).

    python -m analysis.suite_plan [--scale tiny] [--runs results/runs] [--seeds 0,1,2] [--out FILE]

Each sweep is planned as ``make reproduce-<sweep>`` launches it (tiny: 2 simulated learners per
run, two runs at a time; paper: 4 torchrun ranks per run) and as ``make plan`` prints it
(:meth:`jobs.sweeps.Plan.describe`): its runs, how many are complete below ``--runs``, and the
time of the rest at the assumed FLOP rate and, at tiny scale, at the rates this machine's
complete runs reached (:func:`jobs.sweeps.measured_rates`). The table goes to stdout and, with
``--out``, to a markdown file under its command.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from pathlib import Path

from hydra import compose, initialize_config_dir
from hydra.core.global_hydra import GlobalHydra
from omegaconf import DictConfig

from analysis import tables
from core.errors import ConfigError
from jobs import sweeps

CONF = Path(__file__).resolve().parent.parent / "conf"
# The sweeps of `make reproduce-all` (the Makefile's SWEEPS), in its order.
SWEEPS = ("table1", "table2", "table3", "table4", "table5", "table6", "fig9", "fig10", "adacomp",
          "ablation_ef")
# As the Makefile launches each scale: overrides, processes per run, runs at once.
LAUNCH = {"tiny": (["launcher=simulated", "trainer.workers=2", "hydra.launcher.parallel=2"], 1, 2),
          "paper": (["launcher=local", "hydra.launcher.nproc_per_node=4"], 4, 1)}


def plans(scale: str, runs: Path, seeds: str | None, names: Sequence[str] = SWEEPS
          ) -> list[sweeps.Plan]:
    """The plan of each sweep of ``names`` at ``scale`` against the records below ``runs``
    (``seeds``: e.g. "0,1,2"; None: each sweep's own)."""
    overrides, workers, parallel = LAUNCH[scale]
    # tiny runs keep trainer.numerics' default, portable (conf/trainer/default.yaml)
    measured = sweeps.rates_here(runs, "portable") if scale == "tiny" else None
    out = []
    with initialize_config_dir(str(CONF), version_base="1.3"):
        group_exists = GlobalHydra.instance().config_loader().repository.group_exists

        def compose_job(job: list[str]) -> DictConfig:
            return compose("config", overrides=job, return_hydra_config=True)

        for name in names:
            arguments = [f"sweep={name}", f"scale={scale}", f"runs_root={runs}", *overrides,
                         *([f"seed={seeds}"] if seeds else [])]
            master = compose_job([f"sweep={name}", f"scale={scale}"])
            jobs = sweeps.expand(master.hydra.sweeper.groups, master.hydra.sweeper.params,
                                 arguments, scale)
            out.append(sweeps.make_plan(name, scale, workers, jobs, compose_job, group_exists,
                                        parallel=parallel, measured=measured))
    return out


def table(found: list[sweeps.Plan]) -> list[dict[str, object]]:
    """A row per plan and a total: runs, complete, to run, and at tiny scale wall minutes on
    the launch's cores: of the runs to do (at the assumed and at the measured rates) and of
    every run (the suite from scratch, at the measured rates)."""
    rows = []
    for plan in found:
        done = plan.count(sweeps.runs.Action.SKIP)
        row: dict[str, object] = {"sweep": plan.name, "runs": len(plan.jobs), "complete": done,
                                  "to run": len(plan.todo())}
        if plan.scale == "tiny":
            row["to run: min, assumed rate"] = plan.core_minutes() / plan.cores()
            row["to run: min, measured rates"] = plan.core_minutes(measured=True) / plan.cores()
            row["every run: min, measured rates"] = plan.core_minutes(
                measured=True, every=True) / plan.cores()
        rows.append(row)
    total: dict[str, object] = {"sweep": "all"}
    for key in rows[0]:
        if key != "sweep":
            total[key] = sum(float(r[key]) for r in rows)  # type: ignore[arg-type]
    return [*rows, total]


def markdown(rows: list[dict[str, object]]) -> str:
    """The table as markdown, minutes and counts as whole numbers."""
    import pandas as pd

    def cell(key: str, value: object) -> str:
        if "min" in key:
            return f"{value:.0f}" if isinstance(value, float) else str(value)
        return str(int(value)) if isinstance(value, float) else str(value)

    shown = pd.DataFrame([{k: cell(k, v) for k, v in r.items()} for r in rows])
    return tables.markdown(shown)


def main(argv: Sequence[str] | None = None, names: Sequence[str] = SWEEPS) -> int:
    """The command line (see the module doc; ``names``: the sweeps); exit status 2 on bad
    input."""
    parser = argparse.ArgumentParser(prog="python -m analysis.suite_plan",
                                     description=__doc__.split("\n")[0])
    parser.add_argument("--scale", choices=sorted(LAUNCH), default="tiny")
    parser.add_argument("--runs", type=Path, default=Path("results/runs"),
                        help="where the run directories are (make's RUNS)")
    parser.add_argument("--seeds", help="e.g. 0,1,2,3,4 (default: each sweep's own)")
    parser.add_argument("--out", type=Path, help="also write the table to this markdown file")
    args = parser.parse_args(argv)
    try:
        found = plans(args.scale, args.runs, args.seeds, names)
    except ConfigError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    rows = table(found)
    measured = found[0].measured
    shown = " ".join(sys.argv[1:] if argv is None else argv)
    lines = [f"Command: `python -m analysis.suite_plan {shown}`. Every sweep of "
             f"`make reproduce-all SCALE={args.scale}`, against the records "
             f"below {args.runs}."]
    if measured is not None:
        lines.append(f"Wall minutes of the runs to do, two at a time on 2 cores: at the assumed "
                     f"{sweeps.CPU_FLOPS / 1e9:.0f} GFLOP/s per core, and at the median rate per "
                     f"model of the {sum(n for _, n in measured.per_model.values())} complete "
                     f"tiny runs recorded on this machine ({measured.machine}; "
                     + ", ".join(f"{m} {r / 1e9:.1f}" for m, (r, _) in
                                 measured.per_model.items())
                     + f" GFLOP/s; {measured.overall / 1e9:.1f} for the other models), "
                       "start-up included.")
    if measured is not None:
        every = float(rows[-1]["every run: min, measured rates"])  # type: ignore[arg-type]
        lines.append(f"The whole suite from scratch: about {every / 60:.1f} h here.")
    text = " ".join(lines) + "\n\n" + markdown(rows)
    print(text)
    if args.out:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
