"""Weights & Biases on rank 0, offline unless the user says otherwise, never fatal.

Any failure to start or to log is reported once as a warning; training goes on with the
local run record (``metrics.jsonl``), which holds the same keys. Online, a W&B server that is
down, refuses or never answers costs at most ``logger.init_timeout_s`` (plus W&B's own few
seconds of identity lookup) at the start and ``logger.finish_timeout_s`` at the end (W&B's
``init_timeout`` and ``finish_timeout``; what is not uploaded stays in ``<run dir>/wandb`` for
``wandb sync``). W&B's error reporting is off unless ``WANDB_ERROR_REPORTING`` says otherwise:
it sends to the same server and would hold the process at exit when that server is down.
"""

from __future__ import annotations

import os
import warnings
from pathlib import Path
from typing import Any

from core.errors import ConfigError, check_choice, check_number, check_str

MODES = ("offline", "online", "disabled")
MAX_TAG = 64  # W&B refuses longer tags (its run then fails to start)


def check(cfg: Any) -> None:
    """Validate the ``logger`` config node (ConfigError naming the field). The run labels a
    sweep sets (group, job_type, run_name, tags) are checked whatever the logger."""
    name = check_choice(cfg.name, "logger.name", ("wandb", "none"))
    for field in ("group", "job_type", "run_name"):
        check_str(cfg.get(field), f"logger.{field}", optional=True, max_length=128)
    tags = cfg.get("tags")
    tags = [] if tags is None else tags
    if not isinstance(tags, list | tuple) and type(tags).__name__ != "ListConfig":
        raise ConfigError(f"logger.tags: expected a list of strings, got {tags!r}")
    for tag in tags:
        if not isinstance(tag, str) or not 0 < len(tag) <= MAX_TAG:
            raise ConfigError(f"logger.tags: expected strings of 1 to {MAX_TAG} characters (W&B's "
                              f"limit), got {tag!r}")
    if name == "none":
        return
    check_choice(cfg.mode, "logger.mode", MODES)
    check_str(cfg.project, "logger.project", max_length=128)
    check_str(cfg.get("entity"), "logger.entity", optional=True, max_length=128)
    for field in ("init_timeout_s", "finish_timeout_s"):
        check_number(cfg.get(field, 1), f"logger.{field}", 0, low_open=True)


class WandbLogger:
    """Thin wrapper around a ``wandb`` run that turns every error into one warning."""

    def __init__(self, cfg: Any, run_config: dict[str, Any], run_dir: Path) -> None:
        self.run = None
        self._warned = False
        try:
            import wandb

            os.environ.setdefault("WANDB_SILENT", "true")
            os.environ.setdefault("WANDB_ERROR_REPORTING", "false")
            settings = wandb.Settings(init_timeout=float(cfg.get("init_timeout_s", 90)),
                                      finish_timeout=float(cfg.get("finish_timeout_s", 0)))
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
                settings=settings,
            )
        except Exception as exc:  # noqa: BLE001 (the logger must never end training)
            self._warn("start", exc)

    def log(self, row: dict[str, Any], step: int) -> None:
        """Log one epoch's metrics."""
        if self.run is None:
            return
        try:
            self.run.log(row, step=step)
        except Exception as exc:  # noqa: BLE001
            self._warn("log", exc)
            self.run = None

    def finish(self, exit_code: int = 0) -> None:
        """Close the run (offline, the files stay in ``<run dir>/wandb`` for `wandb sync`)."""
        if self.run is None:
            return
        try:
            self.run.finish(exit_code=exit_code)
        except Exception as exc:  # noqa: BLE001
            self._warn("finish", exc)

    def _warn(self, what: str, exc: Exception) -> None:
        if not self._warned:
            lines = str(exc).strip().splitlines() or [""]  # W&B's messages go on with advice
            warnings.warn(f"W&B failed to {what} ({type(exc).__name__}: {lines[0]}); continuing "
                          f"with the local run record only", RuntimeWarning, stacklevel=3)
            self._warned = True


class NullLogger:
    """``logger=none``."""

    def log(self, row: dict[str, Any], step: int) -> None:
        """Do nothing."""

    def finish(self, exit_code: int = 0) -> None:
        """Do nothing."""
