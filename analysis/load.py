"""Run records as two tidy frames, ``runs`` and ``epochs``, and the runs left out, with reasons.

    frames = load_records("results/runs")          # every run directory below, at any depth
    frames.runs, frames.epochs, frames.problems

A run directory is one that holds ``.hydra/config.yaml`` or ``metrics.jsonl`` (core/record.py);
directory names are never parsed: what a run is comes from its resolved config.

- ``runs``: one row per run: ``run_id`` (the directory relative to the root), ``source``,
  ``path``, the resolved config flattened to dot keys (``model.name``, ``compressor.rank``, ...;
  lists become tuples), the run identity of docs/run-record.md filled in for ad-hoc runs
  (``sweep`` ``adhoc``, ``scale`` ``custom``, ``method`` the experiment ``name``, ``variant``
  ``ours``), the summary (``status``, ``epochs_completed``, ``metric``, ``final``, ``best``,
  ``total_bits``, ``total_bits_dense``, ``total_time_s``, ``params_in_sync``), the provenance
  (``provenance.fingerprint``, ``provenance.machine``, ``provenance.git.commit``, ... as
  :mod:`analysis.provenance` reads them; ``unknown`` for runs recorded before provenance) and
  ``problem`` (None, or why the run is left out).
- ``epochs``: one row per run and epoch: ``run_id``, ``epoch`` and every other key of
  ``metrics.jsonl`` as a float (``critical/*`` as 0/1; a key an epoch did not log is NaN).
- ``problems``: one row per run left out: ``path``, ``reason`` and what is known of its identity.

A run is left out (and listed in ``problems``) when its config is missing or unreadable, its
``metrics.jsonl`` is missing, empty, has a line that is not JSON (truncated) or epochs that are
not 0, 1, ..., its ``summary.json`` is missing (still running, or killed) or unreadable or
disagrees with ``metrics.jsonl``, its status is not ``completed`` (failed, diverged), its ranks
ended with different parameters (``params_in_sync`` false), or another complete run has the same
identity and seed (the last in directory order is kept). With
``include_incomplete=True`` every run whose config is readable is kept in ``runs`` and
``epochs`` (its readable rows, its ``problem`` set); ``problems`` lists them all the same.
Nothing here raises on a bad run.
"""

from __future__ import annotations

import json
import math
import os
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pandas as pd
from omegaconf import OmegaConf

from analysis import provenance
from core.record import METRICS, SUMMARY, flatten, summarize

CONFIG = Path(".hydra") / "config.yaml"
# docs/run-record.md: a table's run group, and a run within it.
IDENTITY = ("sweep", "scale", "dataset.name", "model.name", "compressor.name", "method", "variant")
RUN_KEYS = (*IDENTITY, "seed")
SUMMARY_FIELDS = ("status", "epochs_completed", "metric", "final", "best", "total_bits",
                  "total_bits_dense", "total_time_s", "params_in_sync")
COMPLETED = "completed"


@dataclass
class RunData:
    """One run as read from any source (run record, W&B), before it becomes frame rows.

    ``config`` is the resolved config (nested) or None if unreadable; ``rows`` the epoch rows that
    could be read; ``summary`` has :data:`SUMMARY_FIELDS` (None if there is none); ``problem``
    says why the run is left out (None: it is complete); ``provenance`` the run's provenance
    columns (:func:`analysis.provenance.columns`; empty: unknown).
    """

    run_id: str
    source: str
    path: str
    config: dict[str, Any] | None
    rows: list[dict[str, Any]]
    summary: dict[str, Any] | None
    problem: str | None = None
    provenance: dict[str, Any] = field(default_factory=dict)


@dataclass
class Frames:
    """The loaded runs (see the module doc)."""

    runs: pd.DataFrame
    epochs: pd.DataFrame
    problems: pd.DataFrame

    def only(self, run_ids: Iterable[str]) -> Frames:
        """Only these runs (and the left-out runs among them)."""
        ids = set(run_ids)
        return Frames(self.runs[self.runs["run_id"].isin(ids)],
                      self.epochs[self.epochs["run_id"].isin(ids)],
                      self.problems[self.problems["run_id"].isin(ids)])


# ---- run records ---------------------------------------------------------------------------
def find_run_dirs(root: Path) -> list[Path]:
    """Every directory below ``root`` (or ``root`` itself) holding a run record, sorted."""
    found = []
    for dirpath, dirnames, filenames in os.walk(root):
        here = Path(dirpath)
        if METRICS in filenames or (here / CONFIG).is_file():
            found.append(here)
            dirnames.clear()  # a run directory holds no other run (its wandb/ is not one)
        else:
            dirnames[:] = sorted(d for d in dirnames if d not in ("wandb", ".hydra"))
    return sorted(found)


def load_records(root: str | Path, include_incomplete: bool = False) -> Frames:
    """Frames of every run record below ``root`` (see the module doc)."""
    root = Path(root)
    if not root.is_dir():
        raise FileNotFoundError(f"runs dir: {root} is not a directory")
    return frames((read_record(d, root) for d in find_run_dirs(root)), include_incomplete)


def read_record(run_dir: Path, root: Path) -> RunData:
    """One run directory, read as far as it can be, with the first problem found."""
    run = RunData(str(run_dir.relative_to(root)) if run_dir != root else run_dir.name,
                  "records", str(run_dir), None, [], None)
    problems = []
    try:
        run.config = OmegaConf.to_container(OmegaConf.load(run_dir / CONFIG), resolve=True)
    except FileNotFoundError:
        problems.append(f"no {CONFIG}")
    except Exception as exc:  # noqa: BLE001 (any unreadable config is one problem, not a crash)
        problems.append(f"unreadable {CONFIG}: {type(exc).__name__}: {exc}")
    run.rows, bad = _read_metrics(run_dir / METRICS)
    if bad:
        problems.append(bad)
    summary_problem = _read_summary(run, run_dir / SUMMARY)
    if summary_problem:
        problems.append(summary_problem)
    if bad and run.summary is not None:  # the summary of the rows there are, the saved status
        run.summary = summary_from_rows(run.rows, run.summary["status"], metric_of(run.rows),
                                        run.summary["total_time_s"] or math.nan)
    run.problem = problems[0] if problems else None
    return run


def _read_metrics(path: Path) -> tuple[list[dict[str, Any]], str | None]:
    """The rows that parse, and what is wrong with the file (None if nothing)."""
    if not path.is_file():
        return [], f"no {METRICS}"
    rows = []
    for number, line in enumerate(path.read_text(errors="replace").splitlines(), 1):
        if not line.strip():
            continue
        try:
            row = json.loads(line)
        except json.JSONDecodeError:
            return rows, f"{METRICS} line {number} is not JSON (truncated?)"
        if not isinstance(row, dict):
            return rows, f"{METRICS} line {number} is not a JSON object"
        rows.append(row)
    if not rows:
        return rows, f"{METRICS} is empty"
    epochs = [r.get("epoch") for r in rows]
    if epochs != list(range(len(rows))):
        return rows, f"{METRICS} epochs are {_short(epochs)}, not 0, 1, ..."
    return rows, None


def _read_summary(run: RunData, path: Path) -> str | None:
    """Set ``run.summary`` (from the file, or recomputed from the rows); return any problem."""
    metric = metric_of(run.rows)
    if not path.is_file():
        run.summary = summary_from_rows(run.rows, "incomplete", metric)
        return f"no {SUMMARY} (still running, or killed before the end)"
    try:
        saved = json.loads(path.read_text())
        if not isinstance(saved, dict) or "status" not in saved:
            raise ValueError("no status")
    except (ValueError, UnicodeDecodeError) as exc:
        run.summary = summary_from_rows(run.rows, "incomplete", metric)
        return f"unreadable {SUMMARY}: {exc}"
    run.summary = {k: saved.get(k) for k in SUMMARY_FIELDS}
    run.provenance = provenance.from_summary(saved)
    if saved["status"] != COMPLETED:
        return f"status {saved['status']}"
    if saved.get("params_in_sync") is False:
        return "the ranks ended with different parameters (params_in_sync false)"
    if saved.get("epochs_completed") != len(run.rows):
        return (f"{SUMMARY} says {saved.get('epochs_completed')} epochs, {METRICS} has "
                f"{len(run.rows)}")
    again = summary_from_rows(run.rows, COMPLETED, saved.get("metric", metric))
    if not all(_same(saved.get(k), again[k]) for k in ("final", "best", "total_bits")):
        return f"{SUMMARY} disagrees with {METRICS} (final, best or total_bits)"
    return None


# ---- shared by every source ----------------------------------------------------------------
def usable(runs: pd.DataFrame, statuses: Iterable[str] = (COMPLETED,)) -> pd.Series:
    """Which rows of a runs frame loaded with ``include_incomplete`` are complete, or ended in
    one of ``statuses`` (``diverged``) with no other problem."""
    return runs["problem"].isna() | (runs["status"].isin(list(statuses))
                                     & (runs["problem"] == "status " + runs["status"]))


def layer_columns(epochs: pd.DataFrame, prefix: str) -> list[str]:
    """The per-layer columns ``<prefix>/<layer>`` of the epochs frame that some epoch logged."""
    return [c for c in epochs.columns if c.startswith(prefix + "/") and epochs[c].notna().any()]


def metric_of(rows: list[dict[str, Any]]) -> str:
    """The run's test metric: ``test/perplexity`` for language models, else ``test/accuracy``."""
    return "test/perplexity" if any("test/perplexity" in r for r in rows) else "test/accuracy"


def summary_from_rows(rows: list[dict[str, Any]], status: str, metric: str,
                      total_time_s: float = math.nan) -> dict[str, Any]:
    """:data:`SUMMARY_FIELDS` computed from epoch rows, as run.py computes summary.json."""
    clean = [{k: v for k, v in r.items() if not _missing(v)} for r in rows]
    summary = summarize(clean, status, metric, total_time_s)
    return {**{k: None for k in SUMMARY_FIELDS}, **summary}


def frames(runs: Iterable[RunData], include_incomplete: bool = False) -> Frames:
    """The three frames from runs read by any source."""
    read = [(run, identity(flat_config(run.config)) if run.config is not None else {})
            for run in runs]
    _mark_duplicates(read)
    run_rows, epoch_rows, problem_rows = [], [], []
    for run, flat in read:
        if run.problem is not None:
            problem_rows.append({"run_id": run.run_id, "source": run.source, "path": run.path,
                                 "reason": run.problem, **{k: flat.get(k) for k in RUN_KEYS}})
            if not include_incomplete or run.config is None:
                continue
        summary = run.summary or summary_from_rows(run.rows, "incomplete", metric_of(run.rows))
        run_rows.append({"run_id": run.run_id, "source": run.source, "path": run.path, **flat,
                         **summary, **(run.provenance or provenance.columns({})),
                         "problem": run.problem})
        for row in run.rows:
            epoch_rows.append({"run_id": run.run_id,
                               **{k: _float(v) for k, v in row.items()}})
    runs_frame = pd.DataFrame(run_rows, columns=None if run_rows else
                              ["run_id", "source", "path", *RUN_KEYS, "baseline",
                               *SUMMARY_FIELDS, *provenance.COLUMNS, "problem"])
    epochs_frame = pd.DataFrame(epoch_rows, columns=None if epoch_rows else ["run_id", "epoch"])
    if not epochs_frame.empty:
        epochs_frame["epoch"] = epochs_frame["epoch"].astype(int)
    problems = pd.DataFrame(problem_rows, columns=["run_id", "source", "path", "reason",
                                                   *RUN_KEYS])
    return Frames(runs_frame, epochs_frame, problems)


def _mark_duplicates(read: list[tuple[RunData, dict[str, Any]]]) -> None:
    """Of complete runs with the same identity and seed, keep the last (in directory order: the
    newest of Hydra's timestamped directories); the others become problems."""
    last: dict[tuple[Any, ...], RunData] = {}
    for run, flat in read:
        if run.problem is None:
            last[tuple(flat.get(k) for k in RUN_KEYS)] = run
    for run, flat in read:
        kept = last.get(tuple(flat.get(k) for k in RUN_KEYS))
        if run.problem is None and kept is not run:
            run.problem = f"duplicate: same identity and seed as {kept.run_id} (kept)"


def flat_config(config: dict[str, Any]) -> dict[str, Any]:
    """``{"model": {"name": "x"}}`` -> ``{"model.name": "x"}`` (:func:`core.record.flatten`);
    lists become tuples (a frame's cells must hash for grouping)."""
    return {k: tuple(v) if isinstance(v, list) else v for k, v in flatten(config).items()}


def identity(flat: dict[str, Any]) -> dict[str, Any]:
    """The flattened config with the run identity (docs/run-record.md) filled in for ad-hoc
    runs."""
    out = dict(flat)
    defaults = {"sweep": "adhoc", "scale": "custom", "variant": "ours",
                "method": flat.get("name") or f"{flat.get('compressor.name')}-"
                                              f"{flat.get('scheduler.name')}"}
    for key, value in defaults.items():
        if out.get(key) is None:
            out[key] = value
    out.setdefault("baseline", None)
    for key in IDENTITY:
        out[key] = str(out.get(key))
    return out


def _float(value: Any) -> float:
    if value is None:
        return math.nan
    try:
        return float(value)
    except (TypeError, ValueError):
        return math.nan


def _missing(value: Any) -> bool:
    return value is None or (isinstance(value, float) and math.isnan(value))


def _same(a: Any, b: Any) -> bool:
    if _missing(a) and _missing(b):
        return True
    if _missing(a) or _missing(b):
        return False
    return math.isclose(float(a), float(b), rel_tol=1e-9, abs_tol=1e-12)


def _short(values: list[Any]) -> str:
    return str(values) if len(values) <= 8 else f"[{', '.join(map(str, values[:8]))}, ...]"
