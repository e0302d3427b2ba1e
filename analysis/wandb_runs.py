"""The same frames from W&B: a project online (``wandb.Api()``), or the offline run files.

Every run writes its W&B run next to its record (``<run dir>/wandb/offline-run-*/run-*.wandb``,
offline by default). :func:`load_wandb_files` reads those files themselves (no network, no W&B
service): the file is W&B's transaction log in LevelDB's log format (32 KiB blocks of records
with a 7-byte header: CRC-32 of type and data, length, type FULL / FIRST / MIDDLE / LAST), after
a 7-byte file header (``:W&B``, magic 0xBEE1, version 0); each record is a
``wandb_internal_pb2.Record`` protobuf (run with its config, history rows, summary, exit).
:func:`load_wandb` asks the W&B servers for ``entity/project`` (needs network and a login).

Both turn each W&B run into a :class:`WandbRun` (its config, history frame as
``Run.history(pandas=True)`` has it: one row per step, ``_step``/``_runtime``/``_timestamp``
columns, NaN where a key was not logged; and its state), and :func:`to_run_data` into the
:class:`~analysis.load.RunData` the run records give, so that the frames agree for the same runs
(:func:`compare` says where they do not). What W&B does not hold: ``summary.json``. The status
comes from the W&B state (``finished`` -> ``completed``; a run that ended with a non-finite train
loss -> ``diverged``), the summary is recomputed from the history as run.py computes it,
``total_time_s`` is W&B's runtime (which includes start-up) and ``params_in_sync`` is unknown.
The provenance comes from the config's ``provenance.*`` keys (:mod:`analysis.provenance`).
A run resumed from its checkpoint leaves one W&B run per start: the files of one run directory
are joined (later epochs win; each file is one of the run's starts); online, such runs appear
separately.
"""

from __future__ import annotations

import dataclasses
import json
import math
import struct
import zlib
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pandas as pd

from analysis import provenance
from analysis.load import (
    COMPLETED,
    RUN_KEYS,
    Frames,
    RunData,
    find_run_dirs,
    frames,
    metric_of,
    summary_from_rows,
)
from core.record import flatten

# LevelDB log format, as W&B writes it.
HEADER = struct.Struct("<4sHB")  # ident, magic, version
FILE_IDENT, FILE_MAGIC = b":W&B", 0xBEE1
RECORD = struct.Struct("<IHB")  # crc32, length, type
BLOCK = 32768
FULL, FIRST, MIDDLE, LAST = 1, 2, 3, 4
STATES = {"finished": COMPLETED}  # W&B run state -> our status; others are failures
COMPARED = ("status", "epochs_completed", "metric", "final", "best", "total_bits",
            "total_bits_dense")  # then every config key
NOT_COMPARED = {"run_id", "source", "path", "problem", "total_time_s", "params_in_sync",
                provenance.STARTS}  # a start that logged no epoch has no W&B epoch to date it


@dataclass
class WandbRun:
    """One W&B run: ``history`` is a frame like ``wandb.Api()``'s ``Run.history(pandas=True)``;
    ``starts`` the provenance of each start (:func:`start`; empty: this run is the only one)."""

    run_id: str
    path: str
    config: dict[str, Any]
    history: pd.DataFrame
    state: str
    runtime_s: float = math.nan
    starts: list[dict[str, Any]] = dataclasses.field(default_factory=list)


def start(run: WandbRun) -> dict[str, Any]:
    """One start's provenance as ``summary.json``'s ``starts`` holds it (flattened): the
    config's ``provenance.*`` keys without the prefix, and the first epoch it logged."""
    flat = flatten({k: v for k, v in run.config.items() if not k.startswith("_")})
    epochs = run.history["epoch"].dropna() if "epoch" in run.history else pd.Series()
    return {**{k.removeprefix(provenance.PREFIX): v for k, v in flat.items()
               if k.startswith(provenance.PREFIX)},
            "epoch": int(epochs.min()) if not epochs.empty else None}


# ---- conversion (the part every W&B source shares) -----------------------------------------
def to_run_data(run: WandbRun, source: str = "wandb") -> RunData:
    """A W&B run as the :class:`RunData` its run record would give."""
    flat = flatten({k: v for k, v in run.config.items() if not k.startswith("_")})
    config = {k: v for k, v in flat.items() if not k.startswith(provenance.PREFIX)}
    provenance_columns = provenance.columns(flat, run.starts or [start(run)])
    history = run.history.drop(columns=[c for c in run.history.columns if c.startswith("_")])
    if "epoch" in history:
        history = history.dropna(subset=["epoch"]).sort_values("epoch", kind="stable")
    rows = [{k: v for k, v in r.items() if not _nan(v)} for r in history.to_dict("records")]
    for row in rows:
        if "epoch" in row:
            row["epoch"] = int(row["epoch"])
    metric = metric_of(rows)
    status = STATES.get(run.state)
    if status is None:
        diverged = rows and not math.isfinite(rows[-1].get("train/loss", math.nan))
        status = "diverged" if diverged and run.state == "failed" else f"failed: W&B {run.state}"
    summary = summary_from_rows(rows, status, metric, run.runtime_s)
    problem = None
    if not rows:
        problem = "W&B run has no history"
    elif [r.get("epoch") for r in rows] != list(range(len(rows))):
        problem = "W&B history epochs are not 0, 1, ..."
    elif status != COMPLETED:
        problem = f"status {status}"
    return RunData(run.run_id, source, run.path, config, rows, summary, problem,
                   provenance_columns)


# ---- offline run files ----------------------------------------------------------------------
def read_wandb_file(path: Path) -> Iterator[Any]:
    """The ``Record`` protobufs of one ``run-*.wandb`` file, in order.

    Raises ValueError on a bad header or checksum; a record cut off at the end (the writer was
    killed) ends the iteration.
    """
    from wandb.proto import wandb_internal_pb2

    data = path.read_bytes()
    if len(data) < HEADER.size or HEADER.unpack_from(data)[:2] != (FILE_IDENT, FILE_MAGIC):
        raise ValueError(f"{path}: not a W&B run file (bad header)")
    pos, pending = HEADER.size, b""
    while True:
        if BLOCK - pos % BLOCK < RECORD.size:  # a block's trailer: too short for a header
            pos += BLOCK - pos % BLOCK
        if pos + RECORD.size > len(data):
            return
        crc, length, kind = RECORD.unpack_from(data, pos)
        body = data[pos + RECORD.size:pos + RECORD.size + length]
        if len(body) < length:
            return
        if zlib.crc32(body, zlib.crc32(bytes([kind]))) != crc:
            raise ValueError(f"{path}: checksum mismatch at byte {pos}")
        pos += RECORD.size + length
        if kind in (FULL, FIRST):
            pending = body
        elif kind in (MIDDLE, LAST):
            pending += body
        if kind in (FULL, LAST):
            yield wandb_internal_pb2.Record.FromString(pending)


def wandb_run_from_file(path: Path) -> WandbRun:
    """One offline run file as a :class:`WandbRun` (state ``running`` if it has no exit)."""
    config: dict[str, Any] = {}
    steps: dict[int, dict[str, Any]] = {}
    run_id, state, runtime = path.stem.removeprefix("run-"), "running", math.nan
    for record in read_wandb_file(path):
        kind = record.WhichOneof("record_type")
        if kind == "run":
            run_id = record.run.run_id or run_id
            _update(config, record.run.config.update)
        elif kind == "config":
            _update(config, record.config.update)
        elif kind == "history":
            row = {_key(item): json.loads(item.value_json) for item in record.history.item}
            steps.setdefault(int(row.get("_step", record.history.step.num)), {}).update(row)
        elif kind == "exit":
            state = "finished" if record.exit.exit_code == 0 else "failed"
            runtime = float(record.exit.runtime)
    history = pd.DataFrame([steps[s] for s in sorted(steps)])
    return WandbRun(run_id, str(path), config, history, state, runtime)


def wandb_files(run_dir: Path) -> list[Path]:
    """The offline W&B run files of one run directory, oldest first."""
    return sorted(run_dir.glob("wandb/offline-run-*/run-*.wandb"))


def load_wandb_files(root: str | Path, include_incomplete: bool = False) -> Frames:
    """Frames from the offline W&B files of every run directory below ``root``.

    ``run_id`` and ``path`` are the run directory's, as :func:`~analysis.load.load_records`
    gives them, so the two frames line up; a run directory without a W&B file is a problem.
    """
    root = Path(root)
    return frames((_from_run_dir(d, root) for d in find_run_dirs(root)), include_incomplete)


def _from_run_dir(run_dir: Path, root: Path) -> RunData:
    run_id = str(run_dir.relative_to(root)) if run_dir != root else run_dir.name
    files = wandb_files(run_dir)
    if not files:
        return RunData(run_id, "wandb-files", str(run_dir), None, [], None,
                       "no offline W&B run (logger=none?)")
    try:
        parts = [wandb_run_from_file(f) for f in files]
    except Exception as exc:  # noqa: BLE001 (a corrupt file is one problem, not a crash)
        return RunData(run_id, "wandb-files", str(run_dir), None, [], None,
                       f"unreadable W&B file: {type(exc).__name__}: {exc}")
    history = pd.concat([p.history for p in parts], ignore_index=True)
    if "epoch" in history:
        history = history.drop_duplicates(subset=["epoch"], keep="last")
    joined = WandbRun(run_id, str(run_dir), parts[-1].config, history, parts[-1].state,
                      sum(p.runtime_s for p in parts), [start(p) for p in parts])
    return to_run_data(joined, source="wandb-files")


def _update(config: dict[str, Any], items: Iterable[Any]) -> None:
    for item in items:
        keys = list(item.nested_key) or [item.key]
        node = config
        for key in keys[:-1]:
            node = node.setdefault(key, {})
        node[keys[-1]] = json.loads(item.value_json)


def _key(item: Any) -> str:
    return item.key or ".".join(item.nested_key)


# ---- online -------------------------------------------------------------------------------
def load_wandb(project: str, group: str | None = None, include_incomplete: bool = False
               ) -> Frames:
    """Frames from the W&B project ``entity/project`` (optionally one group) via ``wandb.Api()``.

    Needs network access and a W&B login (``WANDB_API_KEY``); every history row is read
    (``scan_history``, unsampled).
    """
    import wandb

    api = wandb.Api()
    runs = api.runs(project, filters={"group": group} if group else None)
    return frames((to_run_data(_from_api(r)) for r in runs), include_incomplete)


def _from_api(run: Any) -> WandbRun:
    history = pd.DataFrame(list(run.scan_history()))
    return WandbRun(run.id, "/".join(run.path), dict(run.config), history, run.state,
                    float(run.summary.get("_runtime", math.nan)))


# ---- agreement ------------------------------------------------------------------------------
def compare(a: Frames, b: Frames) -> pd.DataFrame:
    """Where two sources disagree on the same runs (matched by :data:`RUN_KEYS`).

    One row per difference: the run, ``what`` differs (a summary field, a config key, an epoch
    metric, or a run found in one source only) and both values. Empty: they agree on every run,
    config key, summary field (except the times, which the sources measure differently, and
    ``params_in_sync``, which only the record has) and logged value.
    """
    diffs: list[dict[str, Any]] = []
    left, right = _by_key(a.runs), _by_key(b.runs)
    fields = [*COMPARED, *sorted((set(a.runs.columns) | set(b.runs.columns)) - NOT_COMPARED
                                 - set(COMPARED))]
    for key in sorted(set(left) | set(right), key=str):
        if key not in left or key not in right:
            diffs.append({"run": key, "what": "run", "a": key in left, "b": key in right})
            continue
        ra, rb = left[key], right[key]
        for field in fields:
            if not _equal(ra.get(field), rb.get(field)):
                diffs.append({"run": key, "what": field, "a": ra.get(field),
                              "b": rb.get(field)})
        ea = a.epochs[a.epochs["run_id"] == ra["run_id"]].set_index("epoch").drop(columns="run_id")
        eb = b.epochs[b.epochs["run_id"] == rb["run_id"]].set_index("epoch").drop(columns="run_id")
        for column in sorted(set(ea.columns) | set(eb.columns)):
            va = ea[column] if column in ea else pd.Series(math.nan, index=ea.index)
            vb = eb[column] if column in eb else pd.Series(math.nan, index=eb.index)
            va, vb = va.align(vb)
            for epoch in va.index:
                if not _equal(va[epoch], vb[epoch]):
                    diffs.append({"run": key, "what": f"epoch {epoch} {column}",
                                  "a": va[epoch], "b": vb[epoch]})
    return pd.DataFrame(diffs, columns=["run", "what", "a", "b"])


def _by_key(runs: pd.DataFrame) -> dict[tuple[Any, ...], pd.Series]:
    return {tuple(r[k] for k in RUN_KEYS): r for _, r in runs.iterrows()}


def _nan(value: Any) -> bool:
    return value is None or (isinstance(value, float) and math.isnan(value))


def _equal(a: Any, b: Any) -> bool:
    return (_nan(a) and _nan(b)) or a == b
