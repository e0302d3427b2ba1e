"""Mutation testing of the glue modules with mutmut 3: ``make mutate`` (``python -m tools.mutate``).

For each group of modules below, mutmut puts small bugs into the code one at a time (an operator
swapped, a constant changed, an argument dropped, a string altered, ...) and runs the fast tests
of that group that reach the mutated function; a mutant is *killed* when a test fails (or times
out). The score of a module is killed / mutants.

    python -m tools.mutate                      # every group (about 1-2 hours on 2 cores)
    python -m tools.mutate lr record            # some groups; the other groups' rows are kept
    MUTATE_JOBS=1 python -m tools.mutate hook   # fewer parallel test processes (default 2)

Each group runs in its own copy of the repository under ``results/mutation/raw/<group>/``
(gitignored, with mutmut's ``mutants/`` tree and logs), so that mutmut's config
(``[tool.mutmut]``: which files to mutate, which tests to run) can differ per group. Two things
are done to the copy, never to the repository:

- mutmut skips functions with decorators; the copy rewrites ``@d def f`` as ``def f`` followed
  by ``f = d(f)`` (the same function object), so that the data builders (``@register``) and
  the evaluations (``@torch.no_grad()``) are mutated too;
- mutmut learns which tests reach a function by tracing the test process only, so a behaviour
  tested on spawned ranks (each rank restoring its own part of a checkpoint, sums over ranks)
  is invisible to it. Every mutant that survives the fast tests is therefore run once more
  against the group's ``ranks`` tests (real gloo ranks), with mutmut's own switch
  (``MUTANT_UNDER_TEST``), which spawned ranks inherit.

Results: ``results/mutation/scores.csv`` (per module), ``survivors.csv`` (every surviving
mutant, its diff, and why it is equivalent where it is: ``tools/mutation_equivalent.csv``) and
``summary.md``, all rebuilt from the CSVs.
"""

from __future__ import annotations

import ast
import csv
import json
import os
import re
import shutil
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
OUT = ROOT / "results" / "mutation"
RAW = OUT / "raw"
EQUIVALENT = ROOT / "tests" / "mutation_equivalent.csv"
PACKAGES = ["core", "models", "data", "compression", "schedulers", "jobs", "training",
            "analysis", "benchmarks", "run.py"]
NOT_REWRITTEN = {"staticmethod", "classmethod", "property"}  # mutmut handles the first two


@dataclass
class Group:
    """Modules mutated together, the fast tests run against them, and the tests on real ranks
    run against what survives."""

    modules: list[str]
    tests: list[str]
    ranks: list[str] = field(default_factory=list)


GROUPS = {
    "hook": Group(["compression/hook.py", "compression/stats.py"],
                  ["tests/unit/test_hook_accounting.py", "tests/unit/test_faults.py",
                   "tests/unit/test_overlap.py", "tests/unit/test_observability.py"],
                  ranks=["tests/ranks/test_glue_ranks.py", "tests/ranks/test_preemption.py"]),
    "lr": Group(["core/lr.py"], ["tests/unit/test_lr.py"]),
    "record": Group(["core/record.py"], ["tests/unit/test_record.py"]),
    "checkpoint": Group(["training/checkpoint.py"],
                        ["tests/unit/test_checkpoint.py", "tests/unit/test_faults.py"],
                        ranks=["tests/ranks/test_glue_ranks.py", "tests/ranks/test_preemption.py"]),
    "tasks": Group(["training/tasks.py"],
                   ["tests/unit/test_tasks.py", "tests/ranks/test_preemption.py"],
                   ranks=["tests/ranks/test_glue_ranks.py"]),
    "schedulers": Group(["schedulers/*.py"], ["tests/unit/test_schedulers.py"]),
    "data": Group(["data/cifar.py", "data/imagenet.py"],
                  ["tests/unit/test_transforms.py", "tests/unit/test_data.py"]),
}

# mutmut's exit codes of a mutant's test run (mutmut.stats.status_by_exit_code)
KILLED = {"killed", "timeout", "segfault", "caught by type check"}
SCORE_FIELDS = ["module", "mutants", "killed", "killed_on_ranks", "survived", "no_tests",
                "equivalent", "score_pct", "score_without_equivalent_pct", "group_minutes"]
SURVIVOR_FIELDS = ["module", "mutant", "status", "line", "mutated", "equivalent_because"]


# ---- the work copy -------------------------------------------------------------------------------
def rewrite_decorators(source: str) -> str:
    """``@d1 @d2 def f(...): ...`` -> ``def f(...): ...`` + ``f = d1(d2(f))`` (same object)."""
    tree = ast.parse(source)
    lines = source.splitlines(keepends=True)
    edits = []  # (first line to drop, last line to drop, line to insert after, text)
    for node in ast.walk(tree):
        if not isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef) or not node.decorator_list:
            continue
        names = [ast.unparse(d) for d in node.decorator_list]
        if any(n in NOT_REWRITTEN for n in names):
            continue
        indent = re.match(r"\s*", lines[node.lineno - 1]).group(0)
        applied = node.name
        for name in reversed(names):
            applied = f"({name})({applied})"
        first = min(d.lineno for d in node.decorator_list)
        edits.append((first, node.lineno - 1, node.end_lineno,
                      f"{indent}{node.name} = {applied}\n"))
    for first, last, end, text in sorted(edits, reverse=True):
        lines.insert(end, text)
        del lines[first - 1:last]
    return "".join(lines)


def make_copy(name: str, group: Group) -> Path:
    """A fresh copy of the tracked files under raw/<name>/, with this group's mutmut config."""
    work = RAW / name
    if work.exists():
        shutil.rmtree(work)
    files = subprocess.run(["git", "ls-files", "--cached", "--others", "--exclude-standard"],
                           cwd=ROOT, capture_output=True, text=True, check=True).stdout.split()
    for rel in files:
        if rel.startswith("results/") or not (ROOT / rel).is_file():
            continue
        target = work / rel
        target.parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(ROOT / rel, target)
    for module in mutated_files(group, work):
        path = work / module
        path.write_text(rewrite_decorators(path.read_text()))
    config = {
        "source_paths": PACKAGES, "only_mutate": group.modules, "also_copy": ["conf"],
        "pytest_add_cli_args": ["-p", "no:cacheprovider", "-q", "-x"],
        "pytest_add_cli_args_test_selection": group.tests,
        "process_isolation": "forkserver", "use_git_change_detection": False,
    }
    with open(work / "pyproject.toml", "a") as f:
        f.write("\n[tool.mutmut]\n")
        for key, value in config.items():
            f.write(f"{key} = {json.dumps(value)}\n")
    return work


def mutated_files(group: Group, root: Path) -> list[str]:
    return sorted(str(p.relative_to(root)) for pattern in group.modules for p in root.glob(pattern))


# ---- running -------------------------------------------------------------------------------------
def env() -> dict[str, str]:
    return {**os.environ, "OMP_NUM_THREADS": "1", "WANDB_MODE": "offline", "WANDB_SILENT": "true",
            "PYTHONDONTWRITEBYTECODE": "1"}


def mutmut(work: Path, *args: str, log: Path | None = None) -> str:
    cmd = [sys.executable, "-m", "mutmut", *args]
    if log is None:
        return subprocess.run(cmd, cwd=work, env=env(), capture_output=True, text=True,
                              check=True).stdout
    with open(log, "w") as f:
        subprocess.run(cmd, cwd=work, env=env(), stdout=f, stderr=subprocess.STDOUT, check=True)
    return ""


def statuses(work: Path, module: str) -> dict[str, str]:
    """Every mutant of ``module`` and its status, from mutmut's record of the run."""
    from mutmut.stats import status_by_exit_code

    meta = json.loads((work / "mutants" / f"{module}.meta").read_text())
    return {key: status_by_exit_code[code] for key, code in meta["exit_code_by_key"].items()}


def diff_of(work: Path, mutant: str) -> tuple[str, str]:
    """The mutated line: (original, mutated), stripped (several lines joined by ' / ')."""
    text = mutmut(work, "show", mutant)
    old = [line[1:].strip() for line in text.splitlines()
           if line.startswith("-") and not line.startswith("---")]
    new = [line[1:].strip() for line in text.splitlines()
           if line.startswith("+") and not line.startswith("+++")]
    return " / ".join(old), " / ".join(new)


def killed_on_ranks(work: Path, mutant: str, tests: list[str], timeout_s: float) -> bool:
    """Whether the rank tests fail (or hang past ``timeout_s``) with ``mutant`` switched on."""
    try:
        proc = subprocess.run([sys.executable, "-m", "pytest", "-q", "-x", "-p",
                               "no:cacheprovider", *tests], cwd=work / "mutants",
                              env={**env(), "MUTANT_UNDER_TEST": mutant}, capture_output=True,
                              text=True, timeout=timeout_s)
    except subprocess.TimeoutExpired:
        return True
    return proc.returncode != 0


def run_group(name: str, group: Group, jobs: int) -> tuple[list[dict], list[dict]]:
    start = time.monotonic()
    work = make_copy(name, group)
    log = work / "mutmut-run.log"
    print(f"[{name}] mutmut run over {', '.join(group.modules)} (log: {log})", flush=True)
    mutmut(work, "run", "--max-children", str(jobs), log=log)
    equivalent = read_equivalent()
    scores, survivors = [], []
    for module in mutated_files(group, work):
        found = statuses(work, module)
        ranks_killed = 0
        for mutant, status in sorted(found.items(), key=lambda kv: _mutant_number(kv[0])):
            if status in KILLED:
                continue
            old, new = diff_of(work, mutant)
            why = equivalent.get((module, old, new), "")
            if group.ranks and not why and killed_on_ranks(work, mutant, group.ranks, 600):
                found[mutant] = "killed on ranks"
                ranks_killed += 1
                continue
            survivors.append({"module": module, "mutant": mutant, "status": status,
                              "line": old, "mutated": new, "equivalent_because": why})
        counts = {s: sum(1 for v in found.values() if v == s) for s in set(found.values())}
        killed = sum(counts.get(s, 0) for s in KILLED) + ranks_killed
        total = len(found) - counts.get("skipped", 0)
        n_equivalent = sum(1 for s in survivors if s["module"] == module and
                           s["equivalent_because"])
        scores.append({
            "module": module, "mutants": total, "killed": killed, "killed_on_ranks": ranks_killed,
            "survived": counts.get("survived", 0) + counts.get("suspicious", 0),
            "no_tests": counts.get("no tests", 0), "equivalent": n_equivalent,
            "score_pct": _pct(killed, total),
            "score_without_equivalent_pct": _pct(killed, total - n_equivalent),
        })
    minutes = round((time.monotonic() - start) / 60, 1)
    for row in scores:
        row["group_minutes"] = minutes
    print(f"[{name}] {minutes} min: " + ", ".join(f"{r['module']} {r['score_pct']}%"
                                                  for r in scores), flush=True)
    return scores, survivors


def _pct(part: int, whole: int) -> float:
    return round(100.0 * part / whole, 1) if whole else 100.0


def _mutant_number(key: str) -> tuple[str, int]:
    prefix, _, number = key.rpartition("_")
    return prefix, int(number) if number.isdigit() else 0


# ---- results -------------------------------------------------------------------------------------
def read_equivalent() -> dict[tuple[str, str, str], str]:
    """(module, original line, mutated line) -> why the mutant changes no behaviour."""
    with open(EQUIVALENT, newline="") as f:
        return {(r["module"], r["line"], r["mutated"]): r["why"] for r in csv.DictReader(f)}


def read_csv(path: Path) -> list[dict]:
    if not path.exists():
        return []
    with open(path, newline="") as f:
        return list(csv.DictReader(f))


def write_csv(path: Path, fields: list[str], rows: list[dict]) -> None:
    with open(path, "w", newline="") as f:
        writer = csv.DictWriter(f, fields, lineterminator="\n")
        writer.writeheader()
        writer.writerows(rows)


def write_results(scores: list[dict], survivors: list[dict]) -> None:
    OUT.mkdir(parents=True, exist_ok=True)
    done = {r["module"] for r in scores}
    scores = [r for r in read_csv(OUT / "scores.csv") if r["module"] not in done] + scores
    survivors = [r for r in read_csv(OUT / "survivors.csv") if r["module"] not in done] + survivors
    order = [m for g in GROUPS.values() for m in mutated_files(g, ROOT)]
    scores.sort(key=lambda r: order.index(r["module"]) if r["module"] in order else len(order))
    survivors.sort(key=lambda r: (order.index(r["module"]) if r["module"] in order else 0,
                                  _mutant_number(r["mutant"])))
    annotate(scores, survivors)
    write_csv(OUT / "scores.csv", SCORE_FIELDS, scores)
    write_csv(OUT / "survivors.csv", SURVIVOR_FIELDS, survivors)
    (OUT / "summary.md").write_text(summary(scores, survivors))


def annotate(scores: list[dict], survivors: list[dict]) -> None:
    """Mark the survivors that ``tools/mutation_equivalent.csv`` lists (as it is now) and count
    them per module."""
    equivalent = read_equivalent()
    for s in survivors:
        s["equivalent_because"] = equivalent.get((s["module"], s["line"], s["mutated"]), "")
    for row in scores:
        n = sum(1 for s in survivors if s["module"] == row["module"] and s["equivalent_because"])
        total, killed = int(row["mutants"]), int(row["killed"])
        row["equivalent"] = n
        row["score_without_equivalent_pct"] = _pct(killed, total - n)


def summary(scores: list[dict], survivors: list[dict]) -> str:
    lines = ["# Mutation testing of the glue modules", "",
             "Generated by `make mutate` (`python -m tools.mutate`, mutmut 3; see its docstring). "
             "Score = killed / mutants; killed includes timeouts and mutants killed by the tests "
             "on real ranks (`killed_on_ranks`). Target: >= 85% per module.", "",
             "| module | mutants | killed | on ranks | survived | no tests | equivalent | score "
             "| score without equivalent | group minutes |",
             "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|"]
    for r in scores:
        lines.append(f"| `{r['module']}` | {r['mutants']} | {r['killed']} | "
                     f"{r['killed_on_ranks']} | {r['survived']} | {r['no_tests']} | "
                     f"{r['equivalent']} | {r['score_pct']}% | "
                     f"{r['score_without_equivalent_pct']}% | {r['group_minutes']} |")
    lines += ["", "Tests per group (fast tests; then the rank tests against the survivors):", ""]
    for name, group in GROUPS.items():
        ranks = f"; on ranks: {', '.join(group.ranks)}" if group.ranks else ""
        lines.append(f"- {name}: {', '.join(group.modules)}: {', '.join(group.tests)}{ranks}")
    lines += ["", "## Surviving mutants", "",
              "| module | mutant | line | mutated to | equivalent because |",
              "|---|---|---|---|---|"]
    for s in survivors:
        cells = [s["module"], s["mutant"].rpartition(".")[2], f"`{s['line']}`",
                 f"`{s['mutated']}`", s["equivalent_because"] or "**not equivalent: a gap**"]
        lines.append("| " + " | ".join(c.replace("|", "\\|") for c in cells) + " |")
    return "\n".join(lines) + "\n"


def main(argv: list[str]) -> int:
    names = argv or list(GROUPS)
    unknown = [n for n in names if n not in GROUPS]
    if unknown:
        print(f"error: unknown group(s) {unknown}; choose from {list(GROUPS)}", file=sys.stderr)
        return 2
    jobs = int(os.environ.get("MUTATE_JOBS", "2"))
    for name in names:  # each group's rows are written as soon as it is done
        write_results(*run_group(name, GROUPS[name], jobs))
    print(f"results in {OUT.relative_to(ROOT)}/summary.md")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
