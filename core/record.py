"""The run record rank 0 leaves in the Hydra output directory.

- ``metrics.jsonl``: one JSON object per epoch, flushed and fsync'ed as soon as it is written;
- ``summary.json``: status, final and best test metric, totals, and the provenance of the run's
  last start and of all its starts (rewritten atomically);
- ``starts.jsonl``: one JSON object per start of the run (fresh, then each resumption): which
  machine and code ran it from which epoch (:mod:`core.provenance`);
- ``checkpoint.pt``: everything a resumed run needs, written atomically (temp file + rename).
"""

from __future__ import annotations

import contextlib
import io
import json
import math
import os
import pickle
import re
from pathlib import Path
from typing import Any

import torch

from core.errors import ConfigError

METRICS = "metrics.jsonl"
SUMMARY = "summary.json"
CHECKPOINT = "checkpoint.pt"
STARTS = "starts.jsonl"


class RecordError(OSError):
    """A file of the run record could not be written (a full disk, a quota, a read-only or
    vanished directory). The message is one line naming the file; what was written before is
    intact (appends are whole lines, rewrites atomic)."""


def atomic_write_bytes(path: Path, write: Any) -> None:
    """Call ``write(file)`` on a temp file beside ``path``, fsync it, rename it over ``path``.

    On an OSError the temp file is removed (it may fill a disk), ``path`` is left as it was, and
    a :class:`RecordError` naming ``path`` is raised.
    """
    tmp = path.with_name(f".{path.name}.tmp")
    try:
        with open(tmp, "wb") as f:
            write(f)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except OSError as exc:
        with contextlib.suppress(OSError):
            tmp.unlink()
        raise _record_error(path, exc) from exc


def _record_error(path: Path, exc: OSError) -> RecordError:
    return RecordError(exc.errno, f"cannot write {path}: {exc.strerror or exc}")


def save_checkpoint(path: Path, state: dict[str, Any]) -> None:
    """``torch.save`` that never leaves a half-written checkpoint behind.

    The state is serialized in memory first: torch's zip writer reports a full disk as a
    RuntimeError, a plain write as the OSError that becomes a one-line :class:`RecordError`.
    """
    buffer = io.BytesIO()
    torch.save(state, buffer)
    atomic_write_bytes(path, lambda f: f.write(buffer.getbuffer()))


def load_checkpoint(path: Path, mmap: bool = False) -> Any:
    """Load a checkpoint written by :func:`save_checkpoint` onto the CPU (``mmap``: tensors
    mapped, not read), as data only: ``torch.load(weights_only=True)`` unpickles tensors and
    plain containers and nothing that would run code. A file that holds anything else is
    refused with a ConfigError (one line, naming the file and what it held) before any of it
    runs."""
    try:
        return torch.load(path, map_location="cpu", weights_only=True, mmap=mmap)
    except pickle.UnpicklingError as exc:
        what = re.search(r"GLOBAL ([\w.]+)", str(exc))
        held = f"a pickled {what.group(1)}" if what else "pickled objects"
        raise ConfigError(f"resume: {path} holds {held}, which could run code when loaded; "
                          f"a checkpoint of this suite holds only tensors and plain containers, "
                          f"so it was refused unread") from exc


class MetricsLog:
    """Append-only ``metrics.jsonl``; on resume, rows after the checkpoint's epoch are dropped."""

    def __init__(self, run_dir: Path, keep_epochs: int = 0) -> None:
        self.path = run_dir / METRICS
        rows = read_metrics(self.path)[:keep_epochs] if keep_epochs else []
        self.rows: list[dict[str, Any]] = rows
        text = "".join(json.dumps(r) + "\n" for r in rows)
        atomic_write_bytes(self.path, lambda f: f.write(text.encode()))
        self._file = open(self.path, "a", encoding="utf-8")  # noqa: SIM115 (kept open all run)

    def write(self, row: dict[str, Any]) -> None:
        """Append one epoch's row and make it durable (a RecordError if it cannot be: the rows
        before it stay whole; a torn line is dropped when the file is read)."""
        try:
            self._file.write(json.dumps(row) + "\n")
            self._file.flush()
            os.fsync(self._file.fileno())
        except OSError as exc:
            raise _record_error(self.path, exc) from exc
        self.rows.append(row)

    def close(self) -> None:
        """Close the file."""
        self._file.close()


def read_metrics(path: Path) -> list[dict[str, Any]]:
    """The complete rows of a ``metrics.jsonl`` (empty if it does not exist).

    A torn last line (a write cut short by a crash or a full disk: no newline, not a whole JSON
    object) is dropped: its epoch was never checkpointed. Any other unreadable line raises a
    ConfigError naming the file and the line.
    """
    if not path.exists():
        return []
    try:
        text = path.read_bytes().decode("utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise ConfigError(f"{path}: cannot read ({exc}); the file is corrupt") from exc
    lines = text.split("\n")
    last = lines.pop()  # "" when the file ends with a newline, as every whole write does
    rows = []
    for number, line in enumerate(lines, start=1):
        if line.strip():
            row = _parse_row(line)
            if row is None:
                raise ConfigError(f"{path}:{number}: not a JSON object of one epoch; the file "
                                  f"is corrupt")
            rows.append(row)
    torn = _parse_row(last) if last.strip() else None
    return rows if torn is None else [*rows, torn]


def _parse_row(line: str) -> dict[str, Any] | None:
    try:
        row = json.loads(line)
    except ValueError:
        return None
    return row if isinstance(row, dict) else None


def summarize(rows: list[dict[str, Any]], status: str, metric: str, total_time_s: float
              ) -> dict[str, Any]:
    """``summary.json``'s content from the epoch rows; ``metric`` is the test metric's key."""
    values = [r[metric] for r in rows if metric in r and not math.isnan(r[metric])]
    lower_is_better = metric.endswith("perplexity") or metric.endswith("loss")
    best = (min if lower_is_better else max)(values) if values else None
    return {
        "status": status,
        "epochs_completed": len(rows),
        "metric": metric,
        "final": values[-1] if values else None,
        "best": best,
        "total_bits": sum(r.get("comm/bits", 0.0) for r in rows),
        "total_bits_dense": sum(r.get("comm/bits_dense", 0.0) for r in rows),
        "total_time_s": total_time_s,
    }


def flatten(node: Any, prefix: str = "", keep_empty: bool = False) -> dict[str, Any]:
    """A nested config as one level of dotted keys: ``{"model.name": "resnet18", ...}``. An
    empty mapping has no keys, so it vanishes, unless ``keep_empty`` makes it a value of its
    own (to tell ``{}`` from an absent key)."""
    if isinstance(node, dict) and (node or not keep_empty):
        out: dict[str, Any] = {}
        for key, value in node.items():
            out.update(flatten(value, f"{prefix}{key}.", keep_empty))
        return out
    return {prefix[:-1]: node}


def write_summary(run_dir: Path, summary: dict[str, Any]) -> None:
    """Write ``summary.json`` atomically, with the provenance of the run's starts
    (``starts.jsonl``): the last as ``provenance``, all as ``starts``."""
    starts = read_starts(run_dir)
    if starts:
        summary = {**summary, "provenance": starts[-1], "starts": starts}
    text = json.dumps(summary, indent=2) + "\n"
    atomic_write_bytes(run_dir / SUMMARY, lambda f: f.write(text.encode()))


def record_start(run_dir: Path, provenance: dict[str, Any], epoch: int, fresh: bool) -> None:
    """Add this start (``provenance`` from :func:`core.provenance.collect`, continuing from
    ``epoch``) to ``starts.jsonl``; a ``fresh`` run starts the file over."""
    starts = [] if fresh else read_starts(run_dir)
    starts.append({**provenance, "epoch": epoch})
    text = "".join(json.dumps(s) + "\n" for s in starts)
    atomic_write_bytes(run_dir / STARTS, lambda f: f.write(text.encode()))


def read_starts(run_dir: Path) -> list[dict[str, Any]]:
    """The run's starts (empty for a record written before provenance was kept)."""
    return read_metrics(run_dir / STARTS)
