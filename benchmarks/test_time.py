"""`make bench-test-time`: how long ``make test``'s two pytest parts take, and how busy they keep
the machine, at each number of pytest-xdist workers; writes results/bench/test_time.{md,csv}.

    .venv/bin/python -m benchmarks.test_time [--runs unit:2 slow:2 slow:1] [--baseline DIR]

``unit`` is ``tests/unit`` (in-process tests), ``slow`` is ``tests/ranks tests/e2e`` (tests that
start ranks, sweeps or make), each ``PART:W`` of ``--runs`` run as ``make test`` runs it
(``-n W --dist loadfile --no-loadscope-reorder``: whole files, the slowest first, as
tests/conftest.py orders them; one worker: no xdist), in the order given. Reported per run: wall
time, the machine's busy fraction over it (all CPUs, from ``/proc/stat``: what else ran counts
too, so run it on a quiet machine), the CPU time of pytest and its children, pytest's summary
line, and the 1-minute load average before and after. Every run must pass: a failing test stops
the benchmark with its output.

``--baseline DIR``: a checkout of another commit (``git worktree add --detach DIR COMMIT``, its
``.venv`` a link to this one's) whose tests run too, each part just before this tree's, so that
the two are measured side by side; the table gives each part's wall time over the baseline's.
"""

from __future__ import annotations

import argparse
import csv
import os
import re
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from benchmarks.tiny_profile import children_cpu
from core import provenance

ROOT = Path(__file__).resolve().parent.parent
OUT = ROOT / "results" / "bench"
PARTS = {"unit": ["tests/unit"], "slow": ["tests/ranks", "tests/e2e"]}
DEFAULT_RUNS = [("unit", 2), ("slow", 2), ("slow", 1)]


def run_spec(text: str) -> tuple[str, int]:
    """``PART:WORKERS`` (``slow:2``) as (part, workers); one line naming what is allowed."""
    part, _, workers = text.partition(":")
    if part not in PARTS or not workers.isdigit() or int(workers) < 1:
        raise argparse.ArgumentTypeError(
            f"{text!r}: expected PART:WORKERS, PART one of {', '.join(PARTS)}, WORKERS >= 1")
    return part, int(workers)


def cpu_ticks() -> tuple[int, int]:
    """(busy, idle) clock ticks of all CPUs since boot (the first line of ``/proc/stat``)."""
    fields = [int(x) for x in Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:]]
    idle = fields[3] + fields[4]  # idle, iowait
    return sum(fields[:8]) - idle, idle


def run_part(part: str, workers: int, root: Path = ROOT) -> dict[str, Any]:
    """One pytest run of ``part`` on ``workers`` xdist workers in the checkout ``root``,
    measured."""
    xdist = (["-n", str(workers), "--dist", "loadfile", "--no-loadscope-reorder"]
             if workers > 1 else [])
    cmd = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", *xdist, *PARTS[part]]
    load_before = os.getloadavg()[0]
    busy0, idle0 = cpu_ticks()
    cpu0, start = children_cpu(), time.perf_counter()
    done = subprocess.run(cmd, cwd=root, capture_output=True, text=True)
    wall = time.perf_counter() - start
    busy1, idle1 = cpu_ticks()
    if done.returncode != 0:
        sys.exit(f"{' '.join(cmd[2:])} failed (exit {done.returncode}):\n{done.stdout[-6000:]}")
    summary = re.findall(r"^=*\s*(\d+ passed.*?) in [\d.]+s", done.stdout, re.M)
    return {"tree": commit(root), "part": part, "workers": workers, "wall_s": round(wall, 1),
            "busy": round((busy1 - busy0) / ((busy1 - busy0) + (idle1 - idle0)), 3),
            "cpu_s": round(children_cpu() - cpu0, 1), "load_before": load_before,
            "load_after": os.getloadavg()[0], "summary": summary[-1] if summary else "",
            "command": " ".join(["pytest", *cmd[3:]])}


def commit(root: Path) -> str:
    """The checkout's commit (10 hex digits), ``+`` if its code has changes."""
    return provenance.git_state(root)["commit"][:10] + ("+" if provenance.code_changed(root)
                                                         else "")


def markdown(rows: list[dict[str, Any]], made_by: str, command: str, seconds: float) -> str:
    """The table, then for each tree and run of ``slow`` the suite's wall time: it plus the
    ``unit`` run on the most workers (and its ratio to the baseline's, with one)."""
    lines = ["# make test: wall time and how busy it keeps the machine", "",
             f"Command: `{command}` ({seconds / 60:.1f} min, one part after another). "
             f"Machine and code: {made_by}; {os.cpu_count()} CPUs. `busy`: the machine's busy "
             "fraction over the run (all CPUs); `CPU`: pytest's and its children's.", "",
             "| tree | part | workers | wall (min) | busy | CPU (min) | load before / after "
             "| tests |",
             "| --- | --- | ---: | ---: | ---: | ---: | --- | --- |"]
    for r in rows:
        lines.append(f"| {r['tree']} | {r['part']} (`{' '.join(PARTS[r['part']])}`) | "
                     f"{r['workers']} | {r['wall_s'] / 60:.1f} | {r['busy']:.2f} | "
                     f"{r['cpu_s'] / 60:.1f} | {r['load_before']:.1f} / {r['load_after']:.1f} | "
                     f"{r['summary']} |")
    totals = {}
    for tree in dict.fromkeys(r["tree"] for r in rows):
        mine = [r for r in rows if r["tree"] == tree]
        unit = {r["workers"]: r["wall_s"] for r in mine if r["part"] == "unit"}
        if unit:
            workers = max(unit)
            for r in (r for r in mine if r["part"] == "slow"):
                totals[tree, r["workers"]] = unit[workers] + r["wall_s"]
                lines += ["", f"{tree}: `tests/unit` on {workers} + `tests/ranks tests/e2e` on "
                          f"{r['workers']}: **{totals[tree, r['workers']] / 60:.1f} min** (ruff "
                          "and .venv aside)."]
    trees = list(dict.fromkeys(tree for tree, _ in totals))
    if len(trees) == 2:
        base, this = trees
        for (tree, workers), total in totals.items():
            if tree == this and (base, workers) in totals:
                lines += ["", f"{this} over {base} (the baseline), side by side: "
                          f"**{total / totals[base, workers]:.2f}x** the wall time."]
    return "\n".join(lines) + "\n"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--runs", nargs="+", type=run_spec, default=DEFAULT_RUNS,
                        help="PART:WORKERS, PART one of " + ", ".join(PARTS))
    parser.add_argument("--baseline", type=Path, default=None,
                        help="a checkout of another commit, timed part by part beside this one")
    parser.add_argument("--out", type=Path, default=OUT)
    args = parser.parse_args()
    if args.baseline is not None and not (args.baseline / "tests" / "unit").is_dir():
        parser.error(f"--baseline: {args.baseline} is not a checkout of this repository "
                     "(no tests/unit)")
    made_by, started = provenance.made_here(), time.perf_counter()
    rows = []
    trees = [ROOT] if args.baseline is None else [args.baseline.resolve(), ROOT]
    for part, workers in args.runs:
        for root in trees:
            rows.append(run_part(part, workers, root))
            print(f"{rows[-1]['tree']}: {part} on {workers}: {rows[-1]['wall_s'] / 60:.1f} min, "
                  f"busy {rows[-1]['busy']:.2f}", flush=True)
    args.out.mkdir(parents=True, exist_ok=True)
    with open(args.out / "test_time.csv", "w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=list(rows[0]))
        writer.writeheader()
        writer.writerows(rows)
    given = " ".join(f"{p}:{w}" for p, w in args.runs)
    options = (f"--runs {given}" if args.runs != DEFAULT_RUNS else "") + (
        f" --baseline {args.baseline}" if args.baseline is not None else "")
    command = "make bench-test-time" + (f' ARGS="{options.strip()}"' if options else "")
    text = markdown(rows, made_by, command, time.perf_counter() - started)
    (args.out / "test_time.md").write_text(text)
    print(text)


if __name__ == "__main__":
    main()
