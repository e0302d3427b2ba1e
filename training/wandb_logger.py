"""Weights & Biases on rank 0, offline unless the user says otherwise, never fatal.

Any failure to start or to log is reported once as a warning; training goes on with the
local run record (``metrics.jsonl``), which holds the same keys.
"""

from __future__ import annotations

import os
import warnings
from pathlib import Path
from typing import Any


class WandbLogger:
    """Thin wrapper around a ``wandb`` run that turns every error into one warning."""

    def __init__(self, cfg: Any, run_config: dict[str, Any], run_dir: Path) -> None:
        self.run = None
        self._warned = False
        try:
            import wandb

            os.environ.setdefault("WANDB_SILENT", "true")
            self.run = wandb.init(
                project=cfg.project,
                entity=cfg.get("entity"),
                mode=cfg.mode,
                group=cfg.get("group"),
                job_type=cfg.get("job_type"),
                tags=list(cfg.get("tags") or []),
                name=cfg.get("run_name"),
                config=run_config,
                dir=str(run_dir),
                reinit="finish_previous",
            )
        except Exception as exc:  # noqa: BLE001 (the logger must never end training)
            self._warn(f"W&B failed to start ({type(exc).__name__}: {exc})")

    def log(self, row: dict[str, Any], step: int) -> None:
        """Log one epoch's metrics."""
        if self.run is None:
            return
        try:
            self.run.log(row, step=step)
        except Exception as exc:  # noqa: BLE001
            self._warn(f"W&B failed to log ({type(exc).__name__}: {exc})")
            self.run = None

    def finish(self, exit_code: int = 0) -> None:
        """Close the run (offline, the files stay in ``<run dir>/wandb`` for `wandb sync`)."""
        if self.run is None:
            return
        try:
            self.run.finish(exit_code=exit_code)
        except Exception as exc:  # noqa: BLE001
            self._warn(f"W&B failed to finish ({type(exc).__name__}: {exc})")

    def _warn(self, message: str) -> None:
        if not self._warned:
            warnings.warn(f"{message}; continuing with the local run record only",
                          RuntimeWarning, stacklevel=3)
            self._warned = True


class NullLogger:
    """``logger=none``."""

    def log(self, row: dict[str, Any], step: int) -> None:
        """Do nothing."""

    def finish(self, exit_code: int = 0) -> None:
        """Do nothing."""
