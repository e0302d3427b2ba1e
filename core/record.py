"""The run record rank 0 leaves in the Hydra output directory.

- ``metrics.jsonl``: one JSON object per epoch, flushed and fsync'ed as soon as it is written;
- ``summary.json``: status, final and best test metric, totals (rewritten atomically);
- ``checkpoint.pt``: everything a resumed run needs, written atomically (temp file + rename).
"""

from __future__ import annotations

import json
import math
import os
from pathlib import Path
from typing import Any

import torch

METRICS = "metrics.jsonl"
SUMMARY = "summary.json"
CHECKPOINT = "checkpoint.pt"


def atomic_write_bytes(path: Path, write: Any) -> None:
    """Call ``write(file)`` on a temp file beside ``path``, fsync it, rename it over ``path``."""
    tmp = path.with_name(f".{path.name}.tmp")
    with open(tmp, "wb") as f:
        write(f)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)


def save_checkpoint(path: Path, state: dict[str, Any]) -> None:
    """``torch.save`` that never leaves a half-written checkpoint behind."""
    atomic_write_bytes(path, lambda f: torch.save(state, f))


def load_checkpoint(path: Path) -> dict[str, Any]:
    """Load a checkpoint written by :func:`save_checkpoint` onto the CPU."""
    return torch.load(path, map_location="cpu", weights_only=False)


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
        """Append one epoch's row and make it durable."""
        self.rows.append(row)
        self._file.write(json.dumps(row) + "\n")
        self._file.flush()
        os.fsync(self._file.fileno())

    def close(self) -> None:
        """Close the file."""
        self._file.close()


def read_metrics(path: Path) -> list[dict[str, Any]]:
    """All rows of a ``metrics.jsonl`` (empty if it does not exist)."""
    if not path.exists():
        return []
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


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


def flatten(node: Any, prefix: str = "") -> dict[str, Any]:
    """A nested config as one level of dotted keys: ``{"model.name": "resnet18", ...}``."""
    if isinstance(node, dict):
        out: dict[str, Any] = {}
        for key, value in node.items():
            out.update(flatten(value, f"{prefix}{key}."))
        return out
    return {prefix[:-1]: node}


def write_summary(run_dir: Path, summary: dict[str, Any]) -> None:
    """Write ``summary.json`` atomically."""
    text = json.dumps(summary, indent=2) + "\n"
    atomic_write_bytes(run_dir / SUMMARY, lambda f: f.write(text.encode()))
